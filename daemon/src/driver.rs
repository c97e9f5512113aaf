//! The driver: everything the controller does not do. It owns the I/O and performs the
//! controller's actions.
//!
//! - **Threads.** The fastpath workers, pinned, one per queue (AF_XDP sockets, the flow
//!   table, the published snapshot). The slowpath is ONE tokio runtime ([`RUNTIME_THREADS`]
//!   threads, named `xvs-slow`, pinned to `[dataplane] slowpath_core` when set) running every
//!   background service: the Kubernetes watchers, the health checker, the neighbour watcher,
//!   the healthCheckNodePort servers, the admin servers, and signal handling. One
//!   [`CancellationToken`] stops them all. The calling thread runs the controller loop.
//! - **Start-up order** matters for "nothing is lost": the flow and affinity tables (adopted
//!   from the previous process of the boot, see [`crate::state`]), the AF_XDP sockets, then
//!   the steering program (a pinned one adopted in place: while the new program has no socket
//!   yet it holds xvs's frames rather than passing them), the first snapshot, the workers;
//!   the admin servers come last, so `/healthz` never answers before there is something to
//!   be healthy about.
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

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use arc_swap::ArcSwap;
use config::Config;
use fastpath::flowlog::{self, FlowLog};
use fastpath::passive::SynWatch;
use fastpath::pipeline::{Pipeline, PipelineConfig};
use fastpath::settings::worker_specs;
use fastpath::snapshot::{L2Table, Snapshot, SnapshotBuilder};
use fastpath::steer::{self, SteerCounters, Steering};
use fastpath::worker::{WorkerCounters, WorkerStats, spawn_worker};
use fastpath::xsk::napi::NapiDefer;
use fastpath::xsk::{XskSet, XskSettings};
use slowpath::admin::{AdminConfig, AdminServer};
use slowpath::bgp::{BgpStats, Include, Speaker};
use slowpath::flowsync::{FlowSync, FlowSyncConfig};
use slowpath::health::HealthChecker;
use slowpath::k8s::HealthCheckNodePort;
use slowpath::k8s::hcnp::HealthCheckServers;
use slowpath::neigh::{NeighbourWatcher, read_l2};
use slowpath::repeat::RepeatLog;
use slowpath::traffic::{self, TrafficMeter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::admin::{CommandMsg, DaemonState, StatusView, SyncStats};
use crate::controller::{Action, Controller, Event, Reload, Sample, Signal, SteerSet, StopReason};
use crate::watch::{FileWatch, Stamp};
use crate::{hold, state};

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
/// config) until a stop signal, a drain, or a failure. `Err` is a start-up failure, with
/// context naming what could not be set up.
pub fn run(mut cfg: Config, path: Option<&Path>) -> anyhow::Result<Outcome> {
    // In a DaemonSet the downward API gives the node's name (see deploy/daemonset.yaml).
    if cfg.node.name.is_none()
        && let Ok(name) = std::env::var("NODE_NAME")
    {
        cfg.node.name = Some(name);
    }
    // The cores come from the cpuset this process was given (a Guaranteed pod's exclusive
    // CPUs), read before any thread is pinned: `cores = "auto"` takes it, and a listed core
    // outside it is refused here rather than left unpinned.
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
    let slowpath_core = cores.slowpath;
    if let Some(id) = slowpath_core
        && !core_affinity::set_for_current(core_affinity::CoreId { id })
    {
        anyhow::bail!(
            "could not pin the slowpath to core {id} (the cpuset this process may run on: {})",
            config::cpu_list(&cpuset)
        );
    }
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
    // Whatever happens below, the slowpath's services stop with the runtime.
    let _cancel_on_exit = shutdown.clone().drop_guard();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel::<Event>();
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel::<CommandMsg>();
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    tasks.push(spawn_signals(&rt, ev_tx.clone(), shutdown.clone())?);

    // The API client is built (kubeconfig or in-cluster config read) before anything of the
    // node is touched, so a bad one fails fast; reaching the API server is the watchers'
    // business, retried for ever.
    let k8s_client = match &cfg.kubernetes {
        Some(_) => Some(
            rt.block_on(slowpath::k8s::connect(&cfg))
                .context("starting the Kubernetes source")?,
        ),
        None => None,
    };

    // Flow sync's key and socket address are checked before anything of the node is
    // touched.
    let sync_cfg = if cfg.sync.enable {
        Some(FlowSyncConfig::from_config(&cfg).map_err(anyhow::Error::msg)?)
    } else {
        None
    };

    let epoch = Instant::now();
    // The flow and affinity tables: adopted from the previous process of this boot, or new.
    let tables = state::open(&cfg, epoch)?;
    let cookie_key = tables.cookie_key;
    let state_refused = tables.refused;
    let flows = Arc::new(tables.flows);
    let affinity = Arc::new(tables.affinity);
    let syn_watch = Arc::new(SynWatch::new(cfg.flowtable.backends_max as usize));
    let ifnames: Vec<String> = cfg
        .dataplane
        .interfaces
        .iter()
        .map(|i| i.name.clone())
        .collect();
    let l2 = read_l2(&ifnames).context("reading routes and neighbours")?;
    let mut ctl = Controller::adopting(
        cfg.clone(),
        Arc::clone(&flows),
        Arc::clone(&syn_watch),
        l2,
        epoch,
        tables.adopted.as_ref(),
    );

    // Busy polling needs the interfaces' NAPI deferral; put back when xvs returns.
    let _napi_defer = if cfg.dataplane.napi_busy_poll {
        let names: Vec<&str> = ifnames.iter().map(String::as_str).collect();
        Some(NapiDefer::apply(&names).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    // Sockets first, then the program that feeds them.
    let workers = cfg.dataplane.workers();
    let mut sockets = Vec::with_capacity(workers);
    let xsk = XskSettings::from_config(&cfg.dataplane);
    for spec in worker_specs(&cfg.dataplane, &cores.workers) {
        let mut set = open_sockets(&xsk, spec.queue)
            .with_context(|| format!("opening AF_XDP sockets for queue {}", spec.queue))?;
        if cfg.dataplane.pass_to_kernel {
            for (interface, e) in set.open_pass() {
                tracing::warn!(%interface, queue = spec.queue, error = %e, "no exception device: frames steered to xvs that it does not own are dropped instead of reaching the kernel ([dataplane] pass_to_kernel)");
            }
        }
        sockets.push((spec, set));
    }
    // The steering programs stay attached across restarts (pinned); an earlier process's
    // are adopted in place, with no moment in which the kernel sees xvs's frames.
    let pins = steer::pin_dir_in(&cfg.dataplane.bpf_pin_root).with_context(|| {
        format!(
            "[dataplane] bpf_pin_root {}",
            cfg.dataplane.bpf_pin_root.display()
        )
    })?;
    let mut steers = Vec::with_capacity(ifnames.len());
    for name in &ifnames {
        let (st, adopted) = Steering::attach_pinned(name, cfg.dataplane.xdp_mode, &pins)?;
        tracing::info!(interface = %name, adopted, pins = %pins.display(), "steering program pinned");
        steers.push(st);
    }
    let restart_hold = cfg.dataplane.restart_hold.get();
    hold::refresh(&mut steers, restart_hold).map_err(anyhow::Error::msg)?;
    match std::env::current_exe() {
        Ok(exe) => {
            if let Err(e) = hold::spawn_watchdog(&exe, &pins) {
                tracing::warn!(error = %e, "could not start the restart-hold watchdog: if xvs does not come back, remove the steering with `xvs cleanup`");
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not start the restart-hold watchdog"),
    }
    for (spec, set) in &sockets {
        for (port, fd) in set.fds() {
            steers[port].register_socket(spec.queue, fd)?;
        }
    }

    // The slowpath's services, on the runtime.
    let health = {
        let tx = ev_tx.clone();
        HealthChecker::spawn(
            rt.handle(),
            move |states| {
                let _ = tx.send(Event::Health(states));
            },
            shutdown.clone(),
        )
    };
    let neighbours = {
        let tx = ev_tx.clone();
        NeighbourWatcher::spawn(
            rt.handle(),
            ifnames.clone(),
            NeighbourWatcher::DEFAULT_PERIOD,
            move |l2| {
                let _ = tx.send(Event::L2(l2));
            },
            shutdown.clone(),
        )
        .context("starting the neighbour watcher")?
    };
    let hcnp = match &cfg.kubernetes {
        Some(_) => {
            let (tx, task) = spawn_hcnp(&rt, shutdown.clone());
            tasks.push(task);
            Some(tx)
        }
        None => None,
    };
    let mut k8s_stats = None;
    if let Some(client) = k8s_client {
        let (tx, stop, source_cfg) = (ev_tx.clone(), shutdown.clone(), cfg.clone());
        let stats = Arc::new(slowpath::k8s::SourceStats::default());
        k8s_stats = Some(Arc::clone(&stats));
        tasks.push(rt.spawn(async move {
            slowpath::k8s::watch(
                client,
                &source_cfg,
                stats,
                move |model| {
                    let _ = tx.send(Event::Model(Box::new(model)));
                },
                stop,
            )
            .await;
        }));
    }
    drop(ev_tx);

    if cfg.bgp.enable {
        match slowpath::bgp::interface_addresses() {
            Ok(addrs) => ctl.set_node_addresses(addrs),
            Err(e) => {
                tracing::warn!(error = %e, "reading the interfaces' addresses: NodePort frontends on them may be announced")
            }
        }
    }

    // The first snapshot, published and steered before any worker runs.
    let initial = SnapshotBuilder::from_config(&cfg).build(&[], &L2Table::default())?;
    let mut io = Io {
        current: Arc::new(ArcSwap::from_pointee(initial)),
        steers,
        sync: Arc::new(SyncStats::default()),
        status: Arc::new(ArcSwap::from_pointee(StatusView::default())),
        health: &health,
        neighbours: &neighbours,
        hcnp,
        path,
        watch: FileWatch::new(path.and_then(Stamp::of)),
        stop: None,
        restart_hold,
        bgp: Bgp::default(),
    };
    let now = Instant::now();
    ctl.tick(
        now,
        Sample {
            tx_frames: 0,
            workers_running: true,
        },
    );
    io.perform(&mut ctl, now);

    // Flow sync: one log per worker.
    let flow_logs: Vec<Arc<FlowLog>> = match &sync_cfg {
        Some(_) => (0..workers)
            .map(|_| Arc::new(FlowLog::new(flowlog::DEFAULT_CAPACITY)))
            .collect(),
        None => Vec::new(),
    };
    let stop_workers = Arc::new(AtomicBool::new(false));
    let mut handles: Vec<JoinHandle<()>> = Vec::with_capacity(workers);
    let mut stats: Vec<Arc<WorkerStats>> = Vec::with_capacity(workers);
    let mut traffic = Vec::with_capacity(workers);
    // The interfaces each worker has a socket on (an interface with fewer queues has none).
    let serving: Vec<(u32, Vec<String>)> = sockets
        .iter()
        .map(|(spec, set)| {
            let names = set
                .fds()
                .into_iter()
                .filter_map(|(port, _)| spec.interfaces.get(port).cloned())
                .collect();
            (spec.queue, names)
        })
        .collect();
    // The kernel's statistics of every socket, read by the admin API (dropped when the
    // workers stop, so that the sockets close with them).
    let mut xsk_stats = Vec::new();
    for (spec, set) in sockets {
        match set.stats_readers() {
            Ok(r) => xsk_stats.extend(r),
            Err(e) => {
                tracing::warn!(queue = spec.queue, error = %e, "AF_XDP socket statistics will not be exported")
            }
        }
        let mut pipeline = Pipeline::new(
            PipelineConfig {
                synproxy_key: cookie_key,
                ..PipelineConfig::from_config(&cfg, spec.index, workers)
            }
            .with_random_snat_start(),
            Arc::clone(&flows),
            Arc::clone(&affinity),
            io.current.load_full(),
        );
        pipeline.set_syn_watch(Arc::clone(&syn_watch));
        if let Some(log) = flow_logs.get(spec.index) {
            pipeline.set_flow_log(Arc::clone(log));
        }
        traffic.push(Arc::clone(pipeline.traffic()));
        let (h, s) = spawn_worker(
            spec,
            set,
            pipeline,
            Arc::clone(&io.current),
            Arc::clone(&stop_workers),
        )
        .context("starting a worker thread")?;
        handles.push(h);
        stats.push(s);
    }

    let peer_sync = match sync_cfg {
        Some(c) => {
            let (fs, task) = FlowSync::spawn(
                rt.handle(),
                c,
                Arc::clone(&flows),
                Arc::clone(&io.current),
                flow_logs.clone(),
                shutdown.clone(),
            )
            .context("starting flow sync")?;
            tasks.push(task);
            Some((fs, flow_logs))
        }
        None => None,
    };
    // The node announces once its workers run (the controller emits nothing before its first
    // snapshot is published; what it emitted meanwhile waits here).
    let bgp_stats = cfg.bgp.enable.then(|| {
        let stats = Arc::new(BgpStats::default());
        let speaker = Speaker::spawn(
            rt.handle(),
            cfg.bgp.socket.clone(),
            cfg.bgp.liveness_device.clone(),
            Arc::clone(&stats),
            &shutdown,
        );
        io.bgp.start(speaker);
        stats
    });

    let sync_period = ctl.sync_period();
    let state = Arc::new(DaemonState {
        snapshot: Arc::clone(&io.current),
        flows: Arc::clone(&flows),
        workers: stats.clone(),
        serving,
        k8s: k8s_stats,
        steer: Mutex::new(Vec::new()),
        sockets: Mutex::new(xsk_stats),
        sync: Arc::clone(&io.sync),
        fastpath_running: AtomicBool::new(true),
        healthz_timeout: 2 * sync_period,
        status: Arc::clone(&io.status),
        commands: cmd_tx,
        peer_sync,
        bgp: bgp_stats,
        traffic: Mutex::new(TrafficMeter::new(traffic)),
        health: Some(health.reader()),
        state_refused: state_refused.view(),
    });
    let admin_cfg = AdminConfig {
        listen: cfg.admin.listen,
        healthz_listen: Some(cfg.admin.healthz_listen()),
        metrics_listen: cfg.admin.metrics_listen,
        socket: Some(cfg.admin_socket()),
        control_enabled: cfg.admin.enable_control,
    };
    let admin = AdminServer::bind(&admin_cfg, Arc::clone(&state) as _)?;
    let (admin_addr, healthz_addr, metrics_addr) = (
        admin.local_addr(),
        admin.healthz_addr(),
        admin.metrics_addr(),
    );
    tasks.push(rt.spawn(admin.run(shutdown.clone())));
    tracing::info!(
        target: "xvs",
        services = io.current.load().services.len(),
        workers,
        interfaces = %ifnames.join(", "),
        admin = %format!("http://{admin_addr}"),
        healthz = %healthz_addr.map_or_else(String::new, |a| format!("http://{a}")),
        metrics = %metrics_addr.map_or_else(String::new, |a| format!("http://{a}/metrics")),
        socket = %cfg.admin_socket().display(),
        "ready"
    );

    let stopped = rt.block_on(io.run(&mut ctl, ev_rx, cmd_rx, &state, &handles));
    // The liveness device closed at the stop action; BIRD gets the empty file too.
    if let Bgp::On(speaker) = std::mem::take(&mut io.bgp)
        && !rt.block_on(speaker.finish(BGP_FINISH))
    {
        tracing::warn!(
            "BGP: BIRD did not take the final (empty) file within {BGP_FINISH:?}; the routes are withdrawn anyway (the liveness device is gone)"
        );
    }

    // The steering stays attached for the next process: from the last refresh of the hold,
    // frames xvs owns are dropped (not answered by the kernel) for `restart_hold`, then the
    // watchdog removes the programs if no xvs came back.
    let steer: Vec<_> = io
        .steers
        .iter()
        .map(|s| (s.ifname().to_owned(), s.counters().ok()))
        .collect();
    if let Err(e) = hold::refresh(&mut io.steers, restart_hold) {
        tracing::warn!(error = %e, "refreshing the restart hold at the stop");
    }
    for st in std::mem::take(&mut io.steers) {
        st.release();
    }
    stop_workers.store(true, Ordering::SeqCst);
    for h in handles {
        let _ = h.join();
    }
    if let Ok(mut readers) = state.sockets.lock() {
        readers.clear();
    }
    state.fastpath_running.store(false, Ordering::Relaxed);
    // The flows stay in the state file for the next process; a graceful stop also exports
    // them for one with another layout.
    crate::state::close(&flows, &cfg, stopped != StopReason::WorkerExited);
    drop(io);
    shutdown.cancel();
    rt.block_on(async {
        let all = async {
            for t in tasks {
                let _ = t.await;
            }
            health.join().await;
            neighbours.join().await;
        };
        if tokio::time::timeout(SERVICES_STOP, all).await.is_err() {
            tracing::warn!("slowpath services did not stop within {SERVICES_STOP:?}");
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    let mut counters = WorkerCounters::default();
    for s in &stats {
        counters.add(&s.read());
    }
    tracing::info!(target: "xvs", "stopped");
    Ok(Outcome {
        counters,
        flows_live: flows.len(),
        steer,
        failure: match stopped {
            StopReason::WorkerExited => Some(anyhow::anyhow!("a worker thread ended unexpectedly")),
            _ => None,
        },
    })
}

/// The I/O the controller's actions need, and the loop around it.
struct Io<'a> {
    current: Arc<ArcSwap<Snapshot>>,
    steers: Vec<Steering>,
    sync: Arc<SyncStats>,
    status: Arc<ArcSwap<StatusView>>,
    health: &'a HealthChecker,
    neighbours: &'a NeighbourWatcher,
    hcnp: Option<mpsc::UnboundedSender<Vec<HealthCheckNodePort>>>,
    path: Option<&'a Path>,
    watch: FileWatch,
    stop: Option<StopReason>,
    restart_hold: Duration,
    bgp: Bgp,
}

/// The BGP speaker ([`Speaker`]), started once the workers run.
#[derive(Default)]
enum Bgp {
    /// `[bgp]` off, or nothing announced yet.
    #[default]
    Off,
    /// The workers do not run yet: the last include file the controller emitted.
    Waiting(Include),
    /// Started.
    On(Speaker),
}

impl Bgp {
    fn announce(&mut self, include: Include) {
        match self {
            Bgp::On(s) => s.announce(include),
            other => *other = Bgp::Waiting(include),
        }
    }

    fn start(&mut self, mut speaker: Speaker) {
        if let Bgp::Waiting(include) = std::mem::take(self) {
            speaker.announce(include);
        }
        *self = Bgp::On(speaker);
    }

    fn withdraw(&self) {
        if let Bgp::On(s) = self {
            s.withdraw();
        }
    }
}

impl Io<'_> {
    /// Feeds the controller until it stops; returns why.
    async fn run(
        &mut self,
        ctl: &mut Controller,
        mut events: mpsc::UnboundedReceiver<Event>,
        mut commands: mpsc::UnboundedReceiver<CommandMsg>,
        state: &DaemonState,
        workers: &[JoinHandle<()>],
    ) -> StopReason {
        let mut next_second = Instant::now();
        let mut next_traffic = Instant::now();
        loop {
            // A change an action brought in (a reloaded config) is published at once.
            let wait = if ctl.publish_due() {
                Duration::ZERO
            } else {
                TICK
            };
            tokio::select! {
                Some(ev) = events.recv() => ctl.handle(Instant::now(), ev),
                Some((cmd, reply)) = commands.recv() => {
                    let _ = reply.send(ctl.command(Instant::now(), cmd));
                }
                () = tokio::time::sleep(wait) => {}
            }
            // Everything else that is queued goes into the same tick.
            while let Ok(ev) = events.try_recv() {
                ctl.handle(Instant::now(), ev);
            }
            while let Ok((cmd, reply)) = commands.try_recv() {
                let _ = reply.send(ctl.command(Instant::now(), cmd));
            }
            let now = Instant::now();
            if let Some(p) = self.path
                && self.watch.observe(now, Stamp::of(p))
            {
                ctl.handle(now, Event::Signal(Signal::Reload));
            }
            if now >= next_traffic {
                next_traffic = now + traffic::SAMPLE_PERIOD;
                if let Ok(mut m) = state.traffic.lock() {
                    m.sample(&state.snapshot.load(), now);
                }
            }
            if now >= next_second {
                next_second = now + Duration::from_secs(1);
                if let Ok(mut s) = state.steer.lock() {
                    *s = self
                        .steers
                        .iter()
                        .filter_map(|st| Some((st.ifname().to_owned(), st.counters().ok()?)))
                        .collect();
                }
                if let Err(e) = hold::refresh(&mut self.steers, self.restart_hold) {
                    tracing::warn!(error = %e, "refreshing the restart hold");
                }
            }
            let running = !workers.iter().any(JoinHandle::is_finished);
            if !running {
                state.fastpath_running.store(false, Ordering::Relaxed);
            }
            let tx_frames = state.workers.iter().map(|w| w.read().tx).sum();
            if let Some((fs, _)) = &state.peer_sync {
                ctl.set_peers_ready(fs.ready());
            }
            ctl.tick(
                now,
                Sample {
                    tx_frames,
                    workers_running: running,
                },
            );
            self.perform(ctl, now);
            if let Some(why) = self.stop.take() {
                return why;
            }
        }
    }

    /// Performs the controller's queued actions; `t0` is when this round of work began (a
    /// publish's sync duration counts from there).
    fn perform(&mut self, ctl: &mut Controller, t0: Instant) {
        while let Some(action) = ctl.poll_action() {
            match action {
                Action::Publish {
                    snapshot,
                    steering,
                    trigger_times,
                } => {
                    let generation = snapshot.generation;
                    // New frontends are steered after the snapshot that knows them is
                    // published; gone ones stop being steered at the same moment (their
                    // flows would be refused anyway).
                    self.current.store(snapshot);
                    let steer_error = steer_all(&mut self.steers, &steering)
                        .err()
                        .map(|e| format!("{e:#}"));
                    self.sync.synced(Some(t0.elapsed()));
                    // Live: the workers load it at their next poll.
                    self.sync.programmed(&trigger_times, SystemTime::now());
                    ctl.handle(
                        Instant::now(),
                        Event::Published {
                            generation,
                            steer_error,
                        },
                    );
                }
                Action::Synced => self.sync.synced(None),
                Action::HealthTargets(plan) => self.health.set_plan(plan),
                Action::HealthFailure(addr) => self.health.report_failure(addr),
                Action::Solicit(ip) => self.neighbours.request(ip),
                Action::HealthCheckNodePorts(ports) => {
                    if let Some(tx) = &self.hcnp {
                        let _ = tx.send(ports);
                    }
                }
                Action::LoadConfig => {
                    let reload = match self.path {
                        None => Reload::NoFile,
                        Some(p) => {
                            // The file as this reload reads it: a later change reloads again.
                            self.watch.read(Stamp::of(p));
                            match config::load_written(p) {
                                Ok((c, written)) => Reload::Loaded(Box::new(c), written),
                                Err(e) => Reload::Invalid(e.to_string()),
                            }
                        }
                    };
                    ctl.handle(Instant::now(), Event::Reload(reload));
                }
                Action::Status(s) => {
                    let view = StatusView::new(s, Instant::now(), SystemTime::now());
                    self.status.store(Arc::new(view));
                }
                Action::Announce(include) => self.bgp.announce(include),
                Action::Stop(why) => {
                    // First of all: BIRD withdraws every route of this node.
                    self.bgp.withdraw();
                    match &why {
                        StopReason::Drained(_) => {}
                        StopReason::Signal => tracing::info!(target: "xvs", "stopping"),
                        StopReason::WorkerExited => {
                            tracing::error!("a worker thread ended unexpectedly; stopping")
                        }
                    }
                    self.stop = Some(why);
                }
            }
        }
    }
}

/// How long a restart waits for a dead process's AF_XDP sockets to be released.
const SOCKETS_BUSY_MAX: Duration = Duration::from_secs(3);

/// The AF_XDP sockets of `queue`, waiting (up to [`SOCKETS_BUSY_MAX`]) while the queue is
/// still bound: the kernel releases a killed process's sockets asynchronously, and a restart
/// that raced it would otherwise fail and wait for its supervisor's back-off.
fn open_sockets(dp: &XskSettings, queue: u32) -> Result<XskSet, fastpath::xsk::XskError> {
    let deadline = Instant::now() + SOCKETS_BUSY_MAX;
    loop {
        match XskSet::open(dp, queue) {
            Err(e) if e.is_busy() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// Points every steering program at `set`.
fn steer_all(steers: &mut [Steering], set: &SteerSet) -> anyhow::Result<()> {
    for st in steers.iter_mut() {
        st.set_frontends(&set.frontends, &set.cluster_ips)?;
        st.set_service_cidrs(&set.service_cidrs)?;
        st.set_backends(&set.backends)?;
        st.set_snat(&set.snat_addresses, set.snat_ports)?;
    }
    Ok(())
}

/// SIGTERM and SIGINT (stop; the second stops at once) and SIGHUP (reload), as events.
fn spawn_signals(
    rt: &tokio::runtime::Runtime,
    tx: mpsc::UnboundedSender<Event>,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let _enter = rt.enter();
    let mut term = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut hup = signal(SignalKind::hangup()).context("handling SIGHUP")?;
    Ok(rt.spawn(async move {
        loop {
            let sig = tokio::select! {
                _ = term.recv() => Signal::Stop,
                _ = int.recv() => Signal::Stop,
                _ = hup.recv() => Signal::Reload,
                () = shutdown.cancelled() => return,
            };
            if tx.send(Event::Signal(sig)).is_err() {
                return;
            }
        }
    }))
}

/// The healthCheckNodePort servers of `externalTrafficPolicy: Local` Services, following
/// the latest list of ports.
fn spawn_hcnp(
    rt: &tokio::runtime::Runtime,
    shutdown: CancellationToken,
) -> (
    mpsc::UnboundedSender<Vec<HealthCheckNodePort>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<HealthCheckNodePort>>();
    let task = rt.spawn(async move {
        // kube-proxy binds these on every address of the node.
        let mut servers = HealthCheckServers::new(Ipv6Addr::UNSPECIFIED.into());
        // A port that cannot be bound fails again at every model: logged with backoff.
        let mut failing: HashMap<u16, RepeatLog> = HashMap::new();
        loop {
            let ports = tokio::select! {
                p = rx.recv() => match p {
                    Some(p) => p,
                    None => return,
                },
                () = shutdown.cancelled() => return,
            };
            let failed = servers.update(&ports).await;
            let now = Instant::now();
            for (port, e) in &failed {
                if let Some(errors) = failing.entry(*port).or_default().failed(now) {
                    tracing::warn!(port, errors, error = %e, "healthCheckNodePort not served (retried at the next sync)");
                }
            }
            failing.retain(|port, log| {
                if failed.iter().any(|(p, _)| p == port) {
                    return true;
                }
                if let Some(errors) = log.recovered()
                    && servers.ports().contains(port)
                {
                    tracing::info!(port, errors, "healthCheckNodePort served");
                }
                false
            });
        }
    });
    (tx, task)
}

/// The path a daemon was started with, for messages.
pub fn describe(path: Option<&PathBuf>) -> String {
    path.map_or_else(
        || "the embedded lab config (config/examples/lab.toml)".to_owned(),
        |p| p.display().to_string(),
    )
}
