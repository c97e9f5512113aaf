//! The driver: everything the controller does not do. It owns the I/O and performs the
//! controller's actions.
//!
//! - **Threads.** The fastpath workers, pinned, one per queue (AF_XDP sockets, the flow
//!   table, the published snapshot). The slowpath is ONE tokio runtime ([`RUNTIME_THREADS`]
//!   threads, named `xvs-slow`, pinned to `[dataplane] slowpath_core` when set) running every
//!   background service: signal handling, the health checker, the neighbour watcher, the
//!   healthCheckNodePort servers, the Kubernetes watchers, flow sync, the BGP speaker and
//!   the admin servers. Each is a [`slowpath::service::Service`], started the same way
//!   ([`Slowpath::start`]); one [`CancellationToken`] stops them all and the shut-down awaits
//!   every task. The calling thread runs the controller loop.
//! - **Start-up order** matters for "nothing is lost": the flow and affinity tables (adopted
//!   from the previous process of the boot, see [`crate::state`]), the AF_XDP sockets, then
//!   the steering program (a pinned one adopted in place: while the new program has no socket
//!   yet it holds xvs's frames rather than passing them), the first snapshot, the workers;
//!   the admin servers come last, so `/healthz` never answers before there is something to
//!   be healthy about. [`run`] is that order as named phases, one function each:
//!   1. the slowpath runtime and signal handling ([`open::slowpath`]), then what is checked
//!      before anything of the node is touched: the API client, flow sync's key and address
//!      ([`open::inputs`]);
//!   2. open state: the tables and the controller ([`open::state`]);
//!   3. open dataplane: sockets, steering programs, restart hold ([`open::dataplane`]);
//!      a takeover ([`crate::takeover`]) swaps 2 and 3: its sockets are adopted and the
//!      steering attached while the old process still forwards, the switch is the end of
//!      3, and the state (locked until the old process is gone) is opened after it;
//!   4. start services: health, neighbours, healthCheckNodePorts, Kubernetes
//!      ([`start::services`]), and the first snapshot, published and steered
//!      ([`start::first_publish`]);
//!   5. start workers ([`start::make_workers`]), then the tier's flow sync and BGP speaker
//!      ([`start::tier`]), then the admin servers ([`start::admin`]);
//!   6. serve: the loop ([`serve::serve`]);
//!   7. shut down ([`stop::shut_down`]).
//! - **The loop** wakes on an event (a model, a health or neighbour change, a signal, an
//!   admin command), every [`TICK`], or at once when a change waits to be published (the
//!   config a reload read), hands everything queued to the controller, ticks it
//!   with the workers' counters, and performs its actions. Every tick it stats the config
//!   file: a change reloads it like SIGHUP once the file has been stable for
//!   [`crate::watch::SETTLE`]. Once a second it refreshes the steering counters and the
//!   restart hold ([`crate::hold`]).
//! - **Shutdown**: the steering programs stay attached and pinned, holding xvs's frames for
//!   `restart_hold` (the next process adopts them, or the watchdog removes them); the workers
//!   stop; the flow table is marked clean (and exported at a graceful stop); the slowpath
//!   services stop; the final counters are returned to the caller.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use config::Config;
use fastpath::steer::SteerCounters;
use fastpath::worker::WorkerCounters;
use slowpath::service::Service;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::admin::CommandMsg;
use crate::controller::Event;

mod open;
mod serve;
mod signals;
mod start;
mod stop;

/// How often the loop ticks the controller without an event.
pub const TICK: Duration = Duration::from_millis(100);
/// Threads of the slowpath runtime.
pub const RUNTIME_THREADS: usize = 2;
/// How long the slowpath services get to end after the shutdown signal.
const SERVICES_STOP: Duration = Duration::from_secs(5);
/// How long a stopping daemon waits for BIRD to take the file that announces nothing (the
/// liveness device is already gone, so BIRD has withdrawn the routes anyway).
const BGP_FINISH: Duration = Duration::from_secs(2);

/// What a run leaves: the final counters, and why it failed, if it did.
pub struct Outcome {
    /// Every worker's counters, summed.
    pub counters: WorkerCounters,
    /// Flows in the table at the end.
    pub flows_live: usize,
    /// Steering counters per interface (`None` when they could not be read).
    pub steer: Vec<(String, Option<SteerCounters>)>,
    /// A runtime failure (a worker ended), after which the daemon stopped.
    pub failure: Option<anyhow::Error>,
}

/// Runs the daemon with `cfg` (read from `path`, which SIGHUP reloads; `None`: the embedded
/// config) until a stop signal, a drain, a takeover by a newer process, or a failure. With
/// `takeover`, the AF_XDP sockets of the xvs running on this state directory are taken
/// over before the state is opened ([`crate::takeover`]). `Err` is a start-up failure,
/// with context naming what could not be set up. The phases are the module doc's start-up
/// order.
pub fn run(mut cfg: Config, path: Option<&Path>, takeover: bool) -> anyhow::Result<Outcome> {
    let (ev_tx, ev_rx) = mpsc::unbounded_channel::<Event>();
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel::<CommandMsg>();
    let (mut slow, cores) = open::slowpath(&mut cfg, ev_tx.clone())?;
    let inputs = open::inputs(&cfg, &slow)?;
    let pending = takeover.then(|| open::take_over(&cfg)).flatten();

    // A takeover opens the dataplane first: all of it but the switch happens while the
    // old process forwards, and the state files are locked until it is gone.
    let mut pause: Option<start::Pause> = None;
    let (mut st, mut dp) = if pending.is_some() {
        let ifnames = open::ifnames(&cfg);
        let l2 = slowpath::neigh::read_l2(&ifnames).context("reading routes and neighbours")?;
        let mut dp = open::dataplane(&cfg, &cores, &ifnames, pending)?;
        pause = dp
            .taken
            .as_ref()
            .map(|t| start::Pause::new(t.at, t.resumed));
        let handed =
            (dp.taken.as_mut()).map_or_else(Default::default, |t| std::mem::take(&mut t.state));
        let mut mark = |what| start::Pause::mark_in(&mut pause, what);
        (open::state(&cfg, Some(l2), handed, &mut mark)?, dp)
    } else {
        let st = open::state(&cfg, None, Default::default(), &mut |_| {})?;
        let dp = open::dataplane(&cfg, &cores, &st.ifnames, None)?;
        (st, dp)
    };
    let napi_defer = dp.napi_defer;

    let services = start::services(&cfg, &mut slow, ev_tx, &st.ifnames, inputs.k8s)?;
    start::Pause::mark_in(&mut pause, "services");
    let (mut io, k8s) = start::first_publish(&cfg, &mut st.ctl, services, dp.steers, path)?;
    start::Pause::mark_in(&mut pause, "publish");

    let sync = inputs.sync.is_some();
    let (switch_tx, switch_rx) = mpsc::unbounded_channel();
    // The pause's last part: the adopted sockets back from the thread that kept them
    // receiving (`fastpath::xsk::gap`), for the workers.
    if let Some((sockets, kept)) = dp.taken.as_mut().and_then(open::Taken::sockets) {
        dp.sockets = sockets;
        start::Pause::kept_in(&mut pause, kept);
    }
    let offered = start::takeover_offer(&dp.sockets, &st);
    start::Pause::mark_in(&mut pause, "offer");
    let made = start::make_workers(&cfg, &st, dp.sockets, &io.current, sync);
    // A takeover's pause thread makes the workers on the borrowed core and starts them
    // from it at its own priority again: their threads (which inherit both) start on the
    // idle core, not queued behind the shared slowpath core's work, and pin themselves.
    // Then it goes back to the slowpath's core, before any later thread is spawned.
    let core = (dp.taken.as_mut())
        .and_then(|t| t.core.take())
        .map(open::BorrowedCore::nice_back);
    let workers = made.start();
    if let Some(core) = core {
        core.give_back();
    }
    let mut workers = workers?;
    if let (Some(p), Some(t)) = (pause, &dp.taken) {
        p.workers_started();
        // What the old process still held (its listening sockets, the BGP liveness
        // device) is free once it is gone: the tier and the admin servers bind them.
        t.old.wait();
    }
    let listener = offered.is_some_and(|o| start::takeover_listener(&cfg, o, switch_tx));
    let logs = std::mem::take(&mut workers.logs);
    let tier = start::tier(&cfg, &mut slow, inputs.sync, &st, &mut io, logs)?;
    let state = start::daemon_state(&st, &io, &mut workers, k8s, tier, cmd_tx);
    let state = Arc::new(state);
    start::admin(&cfg, &mut slow, &state, &st.ifnames)?;

    let handles = &workers.handles;
    let channels = serve::Channels {
        events: ev_rx,
        commands: cmd_rx,
        takeover: switch_rx,
    };
    let stopped = serve::serve(&slow, &mut io, &mut st.ctl, channels, &state, handles);
    let outcome = stop::shut_down(slow, io, workers, &state, &cfg, stopped, napi_defer);
    if listener {
        let _ = std::fs::remove_file(crate::takeover::socket_path(&cfg.dataplane.state_dir));
    }
    Ok(outcome)
}

/// The slowpath runtime and what stops its services. Fields drop in order: the guard
/// cancels the services before the runtime goes.
struct Slowpath {
    /// Whatever happens, the slowpath's services stop with the runtime.
    cancel_on_exit: DropGuard,
    shutdown: CancellationToken,
    /// Every started service's task, by name.
    tasks: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    rt: tokio::runtime::Runtime,
}

impl Slowpath {
    /// Starts `service` on the runtime (its error names it); its task is awaited at the
    /// shut-down.
    fn start<S: Service>(&mut self, service: S) -> anyhow::Result<S::Handle> {
        let running = service
            .start(self.rt.handle(), &self.shutdown)
            .with_context(|| format!("starting {}", S::NAME))?;
        self.tasks.push((S::NAME, running.task));
        Ok(running.handle)
    }
}

/// The path a daemon was started with, for messages.
pub fn describe(path: Option<&PathBuf>) -> String {
    path.map_or_else(
        || "the embedded lab config (config/examples/lab.toml)".to_owned(),
        |p| p.display().to_string(),
    )
}
