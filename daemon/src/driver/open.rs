//! The driver's first phases: the slowpath runtime (and the signals, handled from the
//! start), the inputs checked before anything of the node is touched, the state that
//! outlives a process, and the dataplane (AF_XDP sockets, then the steering programs).

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use config::{Config, CorePlan};
use fastpath::passive::SynWatch;
use fastpath::pipeline::CookieKey;
use fastpath::settings::worker_specs;
use fastpath::snapshot::L2Table;
use fastpath::steer::{self, Steering};
use fastpath::worker::WorkerSpec;
use fastpath::xsk::gap::{GapKeeper, GapStats};
use fastpath::xsk::napi::NapiDefer;
use fastpath::xsk::{XskSet, XskSettings};
use flowtable::FlowTable;
use lb_algos::AffinityTable;
use slowpath::flowsync::FlowSyncConfig;
use slowpath::neigh::read_l2;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::signals::Signals;
use super::{RUNTIME_THREADS, Slowpath};
use crate::controller::{Controller, Event};
use crate::hold;
use crate::state::{self, Refusals};

/// The cores, the slowpath runtime on its core, and the signal handler: SIGTERM during the
/// rest of the start-up is an event the loop handles, not the default death.
pub(super) fn slowpath(
    cfg: &mut Config,
    events: mpsc::UnboundedSender<Event>,
) -> anyhow::Result<(Slowpath, CorePlan)> {
    // In a DaemonSet the downward API gives the node's name (see deploy/daemonset.yaml).
    if cfg.node.name.is_none()
        && let Ok(name) = std::env::var("NODE_NAME")
    {
        cfg.node.name = Some(name);
    }
    let cores = place(cfg)?;
    let slowpath_core = cores.slowpath;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_THREADS)
        .thread_name("xvs-slow")
        .on_thread_start(move || {
            if let Some(id) = slowpath_core {
                core_affinity::set_for_current(core_affinity::CoreId { id });
            }
        })
        .enable_all()
        .build()
        .context("starting the slowpath runtime")?;
    let shutdown = CancellationToken::new();
    let mut slow = Slowpath {
        // Whatever happens below, the slowpath's services stop with the runtime.
        cancel_on_exit: shutdown.clone().drop_guard(),
        shutdown,
        tasks: Vec::new(),
        rt,
    };
    slow.start(Signals { events })?;
    Ok((slow, cores))
}

/// The cores from the cpuset this process was given (a Guaranteed pod's exclusive CPUs),
/// read before any thread is pinned: `cores = "auto"` takes it, and a listed core outside
/// it is refused here rather than left unpinned. Pins the calling thread to the slowpath's.
fn place(cfg: &Config) -> anyhow::Result<CorePlan> {
    let cpuset = crate::preflight::cpuset().map_err(anyhow::Error::msg)?;
    let cores = cfg
        .dataplane
        .cores
        .resolve(cfg.dataplane.slowpath_core, &cpuset)
        .context("placing the workers and the slowpath on cores")?;
    tracing::info!(
        cpuset = %config::cpu_list(&cpuset),
        workers = ?cores.workers,
        slowpath = ?cores.slowpath,
        "cores"
    );
    if let Some(id) = cores.slowpath
        && !core_affinity::set_for_current(core_affinity::CoreId { id })
    {
        anyhow::bail!(
            "could not pin the slowpath to core {id} (the cpuset this process may run on: {})",
            config::cpu_list(&cpuset)
        );
    }
    Ok(cores)
}

/// What is checked of the config's inputs before anything of the node is touched.
pub(super) struct Inputs {
    /// The API client (`[kubernetes]` set).
    pub k8s: Option<slowpath::k8s::Client>,
    /// Flow sync's checked settings (`[sync] enable`).
    pub sync: Option<FlowSyncConfig>,
}

/// The API client is built (kubeconfig or in-cluster config read) so that a bad one fails
/// fast; reaching the API server is the watchers' business, retried for ever. Flow sync's
/// key and socket address are checked.
pub(super) fn inputs(cfg: &Config, slow: &Slowpath) -> anyhow::Result<Inputs> {
    let k8s = match &cfg.kubernetes {
        Some(_) => Some(
            slow.rt
                .block_on(slowpath::k8s::connect(cfg))
                .context("starting the Kubernetes source")?,
        ),
        None => None,
    };
    let sync = if cfg.sync.enable {
        Some(FlowSyncConfig::from_config(cfg).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    Ok(Inputs { k8s, sync })
}

/// The state a restart keeps, and the controller over it.
pub(super) struct State {
    pub flows: Arc<FlowTable>,
    pub affinity: Arc<AffinityTable>,
    pub syn_watch: Arc<SynWatch>,
    pub cookie_key: CookieKey,
    /// What was refused of the state files.
    pub refused: Refusals,
    /// The configured interfaces, in order.
    pub ifnames: Vec<String>,
    pub ctl: Controller,
}

/// The flow and affinity tables (adopted from the previous process of this boot, or new),
/// the routes and neighbours (`l2`, when already read: a takeover reads them before the
/// switch), and the controller that adopts the tables' ids. `handed`: the state files a
/// takeover received, adopted in place of their paths. `mark` is called as each step ends
/// (a takeover's pause is logged in parts).
pub(super) fn state(
    cfg: &Config,
    l2: Option<L2Table>,
    handed: state::Handed,
    mark: &mut dyn FnMut(&'static str),
) -> anyhow::Result<State> {
    let epoch = Instant::now();
    let tables = state::open(cfg, epoch, handed, mark)?;
    let flows = Arc::new(tables.flows);
    let syn_watch = Arc::new(SynWatch::new(cfg.flowtable.backends_max as usize));
    let ifnames = ifnames(cfg);
    let l2 = match l2 {
        Some(l2) => l2,
        None => read_l2(&ifnames).context("reading routes and neighbours")?,
    };
    let ctl = Controller::adopting(
        cfg.clone(),
        Arc::clone(&flows),
        Arc::clone(&syn_watch),
        l2,
        epoch,
        tables.adopted.as_ref(),
    );
    mark("controller");
    Ok(State {
        flows,
        affinity: Arc::new(tables.affinity),
        syn_watch,
        cookie_key: tables.cookie_key,
        refused: tables.refused,
        ifnames,
        ctl,
    })
}

/// The configured interfaces, in order.
pub(super) fn ifnames(cfg: &Config) -> Vec<String> {
    (cfg.dataplane.interfaces.iter())
        .map(|i| i.name.clone())
        .collect()
}

/// The AF_XDP sockets and the steering programs that feed them.
pub(super) struct Dataplane {
    /// Every worker's spec and sockets.
    pub sockets: Vec<(WorkerSpec, XskSet)>,
    pub steers: Vec<Steering>,
    /// Put back when xvs returns (busy polling needs the interfaces' NAPI deferral).
    pub napi_defer: Option<NapiDefer>,
    /// A takeover that reached its switch.
    pub taken: Option<Taken>,
}

/// What a takeover's switch leaves to the rest of the start-up.
pub(super) struct Taken {
    /// The state files handed over, for [`state`].
    pub state: state::Handed,
    /// The process taken over (exiting on its own).
    pub old: crate::takeover::OldProcess,
    /// When the switch was sent: the start of the pause in which nobody polls.
    pub at: Instant,
    /// When the frame states were in.
    pub resumed: Instant,
    /// The first worker's core, lent to this thread for the pause (see [`BorrowedCore`]).
    pub core: Option<BorrowedCore>,
    /// The adopted sockets, kept receiving until the workers are made
    /// ([`Taken::sockets`]), with their workers' specs.
    pub kept: Option<(Vec<WorkerSpec>, GapKeeper)>,
}

impl Taken {
    /// The adopted sockets, each with its worker's spec, from the keeper that held them
    /// since the switch, and what it did (`None`: taken already).
    pub fn sockets(&mut self) -> Option<(Vec<(WorkerSpec, XskSet)>, GapStats)> {
        let (specs, kept) = self.kept.take()?;
        let (sets, stats) = kept.stop();
        Some((specs.into_iter().zip(sets).collect(), stats))
    }
}

/// The calling thread moved to a worker's core, at the highest CFS priority (nice -20), for
/// a takeover's pause: from the switch on that core is idle (the old workers stopped; the
/// new ones do not run yet), while the slowpath's core is shared (with the other services,
/// and on a small node with other work), and the pause's work (the flow table's recovery
/// pass, the first snapshot) is what the kernel's fill rings must outlast: where other
/// threads share the core, a thread of nice 0 gets only its share of it. The old worker's
/// caches hold the table, too. Both are put back when the workers run.
pub(super) struct BorrowedCore {
    mask: libc::cpu_set_t,
    nice: Option<i32>,
}

impl BorrowedCore {
    /// Moves the calling thread to `core` (`None`: it cannot be moved; it stays).
    pub fn take(core: usize) -> Option<BorrowedCore> {
        // SAFETY: plain data; zero is a valid value.
        let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `mask` is writable for `size` bytes; 0 is the calling thread.
        if unsafe { libc::sched_getaffinity(0, size, &mut mask) } != 0 {
            return None;
        }
        if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
            return None;
        }
        Some(BorrowedCore {
            mask,
            nice: nice_set(-20),
        })
    }

    /// Puts the calling thread back at the priority it ran at before
    /// [`BorrowedCore::take`], still on the borrowed core (threads it spawns now start
    /// there, at that priority).
    pub fn nice_back(mut self) -> BorrowedCore {
        if let Some(n) = self.nice.take() {
            nice_set(n);
        }
        self
    }

    /// Puts the calling thread back where and at the priority it ran before
    /// [`BorrowedCore::take`] (before any other thread is spawned from it: they inherit
    /// both).
    pub fn give_back(self) {
        // SAFETY: `mask` is the set read from this thread.
        let r = unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.mask)
        };
        if r != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "could not put the start-up thread back on the slowpath's core");
        }
        if let Some(n) = self.nice {
            nice_set(n);
        }
    }
}

/// Sets the calling thread's nice value to `n` (on Linux a thread's own); returns the one
/// it had, or `None` when it cannot (no CAP_SYS_NICE: the pause then runs at nice 0).
fn nice_set(n: i32) -> Option<i32> {
    // SAFETY: gettid cannot fail.
    let tid = unsafe { libc::gettid() } as libc::id_t;
    // getpriority returns -1 both as a value and as an error: errno tells them apart.
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: reads the priority of this thread.
    let was = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    // SAFETY: as above.
    if was == -1 && unsafe { *libc::__errno_location() } != 0 {
        return None;
    }
    // SAFETY: sets the priority of this thread only.
    (unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, n) } == 0).then_some(was)
}

/// `xvs run --takeover` up to the switch: the running xvs's sockets adopted, the old
/// process still forwarding (see [`crate::takeover`]).
pub(super) fn take_over(cfg: &Config) -> Option<crate::takeover::Pending> {
    let xsk = XskSettings::from_config(&cfg.dataplane);
    crate::takeover::connect(&xsk, &cfg.dataplane.state_dir)
}

/// Sockets first (`pending`'s, adopted from a running xvs, or opened), then the program
/// that feeds them. The steering programs stay attached across restarts (pinned); an
/// earlier process's are adopted in place, with no moment in which the kernel sees xvs's
/// frames. With `pending`, everything here happens before the switch, while the old
/// process still forwards: the adopted sockets are in the new programs' XSK maps before
/// they take the links; the switch (the pause in which nobody polls) comes last.
pub(super) fn dataplane(
    cfg: &Config,
    cores: &CorePlan,
    ifnames: &[String],
    pending: Option<crate::takeover::Pending>,
) -> anyhow::Result<Dataplane> {
    let napi = || -> anyhow::Result<Option<NapiDefer>> {
        if !cfg.dataplane.napi_busy_poll {
            return Ok(None);
        }
        let names: Vec<&str> = ifnames.iter().map(String::as_str).collect();
        Ok(Some(NapiDefer::apply(&names).map_err(anyhow::Error::msg)?))
    };
    let (steers, sockets, napi_defer, taken) = match pending {
        Some(pending) => {
            let specs = worker_specs(&cfg.dataplane, &cores.workers);
            let adopted: Vec<(u32, Vec<(usize, RawFd)>)> = (specs.iter().zip(pending.sets()))
                .map(|(spec, set)| (spec.queue, set.fds()))
                .collect();
            let steers = steering(cfg, ifnames, &adopted)?;
            let core = cores.workers.first().and_then(|&c| BorrowedCore::take(c));
            let (sockets, taken) = match pending.switch() {
                Some(sw) => {
                    sw.kept.with(|sets| open_pass(cfg, specs.iter().zip(sets)));
                    let taken = Taken {
                        state: sw.state,
                        old: sw.old,
                        at: sw.at,
                        resumed: sw.resumed,
                        core,
                        kept: Some((specs, sw.kept)),
                    };
                    (Vec::new(), Some(taken))
                }
                // The switch failed and the old process is gone: a restart.
                None => {
                    if let Some(core) = core {
                        core.give_back();
                    }
                    (open_all_sockets(cfg, cores)?, None)
                }
            };
            // After the switch: the old process put back the NAPI settings it changed
            // before it sent the frame states, so that this one changes them again and puts
            // them back at its end.
            let napi_defer = napi()?;
            (steers, sockets, napi_defer, taken)
        }
        None => {
            let napi_defer = napi()?;
            let sockets = open_all_sockets(cfg, cores)?;
            (steering(cfg, ifnames, &[])?, sockets, napi_defer, None)
        }
    };
    let mut steers = steers;
    // (A takeover's sockets are kept apart until the workers start, and in the XSK maps
    // already: `steering` put them there.)
    for (spec, set) in &sockets {
        for (port, fd) in set.fds() {
            steers[port].register_socket(spec.queue, fd)?;
        }
    }
    Ok(Dataplane {
        sockets,
        steers,
        napi_defer,
        taken,
    })
}

/// The steering programs, pinned (an earlier process's adopted in place), with `adopted`
/// (`(queue, [(port, socket)])`: a takeover's sockets) in their XSK maps before they take
/// the links; the restart hold and its watchdog.
fn steering(
    cfg: &Config,
    ifnames: &[String],
    adopted: &[(u32, Vec<(usize, RawFd)>)],
) -> anyhow::Result<Vec<Steering>> {
    let pins = steer::pin_dir_in(&cfg.dataplane.bpf_pin_root).with_context(|| {
        format!(
            "[dataplane] bpf_pin_root {}",
            cfg.dataplane.bpf_pin_root.display()
        )
    })?;
    let mut steers = Vec::with_capacity(ifnames.len());
    for (i, name) in ifnames.iter().enumerate() {
        let sockets: Vec<(u32, RawFd)> = (adopted.iter())
            .flat_map(|(queue, fds)| {
                fds.iter()
                    .filter(|(port, _)| *port == i)
                    .map(|&(_, fd)| (*queue, fd))
            })
            .collect();
        let (st, adopted) =
            Steering::attach_pinned_with(name, cfg.dataplane.xdp_mode, &pins, &sockets)?;
        tracing::info!(interface = %name, adopted, sockets = sockets.len(), pins = %pins.display(), "steering program pinned");
        steers.push(st);
    }
    hold::refresh(&mut steers, cfg.dataplane.restart_hold.get()).map_err(anyhow::Error::msg)?;
    match std::env::current_exe() {
        Ok(exe) => {
            if let Err(e) = hold::spawn_watchdog(&exe, &pins) {
                tracing::warn!(error = %e, "could not start the restart-hold watchdog: if xvs does not come back, remove the steering with `xvs cleanup`");
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not start the restart-hold watchdog"),
    }
    Ok(steers)
}

/// The sockets' exception devices (`pass_to_kernel`).
fn open_pass<'a>(cfg: &Config, sockets: impl Iterator<Item = (&'a WorkerSpec, &'a mut XskSet)>) {
    if cfg.dataplane.pass_to_kernel {
        for (spec, set) in sockets {
            for (interface, e) in set.open_pass() {
                tracing::warn!(%interface, queue = spec.queue, error = %e, "no exception device: frames steered to xvs that it does not own are dropped instead of reaching the kernel ([dataplane] pass_to_kernel)");
            }
        }
    }
}

/// Every worker's AF_XDP sockets.
fn open_all_sockets(cfg: &Config, cores: &CorePlan) -> anyhow::Result<Vec<(WorkerSpec, XskSet)>> {
    let mut sockets = Vec::with_capacity(cfg.dataplane.workers());
    let xsk = XskSettings::from_config(&cfg.dataplane);
    for spec in worker_specs(&cfg.dataplane, &cores.workers) {
        let mut set = open_sockets(&xsk, spec.queue)
            .with_context(|| format!("opening AF_XDP sockets for queue {}", spec.queue))?;
        open_pass(cfg, std::iter::once((&spec, &mut set)));
        sockets.push((spec, set));
    }
    Ok(sockets)
}

/// How long a restart waits for a dead process's AF_XDP sockets to be released.
const SOCKETS_BUSY_MAX: std::time::Duration = std::time::Duration::from_secs(3);

/// The AF_XDP sockets of `queue`, waiting (up to [`SOCKETS_BUSY_MAX`]) while the queue is
/// still bound: the kernel releases a killed process's sockets asynchronously, and a restart
/// that raced it would otherwise fail and wait for its supervisor's back-off.
fn open_sockets(dp: &XskSettings, queue: u32) -> Result<XskSet, fastpath::xsk::XskError> {
    let deadline = Instant::now() + SOCKETS_BUSY_MAX;
    loop {
        match XskSet::open(dp, queue) {
            Err(e) if e.is_busy() && Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r,
        }
    }
}
