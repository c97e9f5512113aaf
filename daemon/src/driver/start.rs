//! The driver's middle phases: the services that feed the controller, the first snapshot
//! (published and steered before any worker runs), the workers, the tier's services (flow
//! sync, BGP) and, last, the admin servers.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::Context;
use arc_swap::ArcSwap;
use config::Config;
use fastpath::flowlog::{self, FlowLog};
use fastpath::pipeline::{Pipeline, PipelineConfig};
use fastpath::snapshot::{L2Table, Snapshot, SnapshotBuilder};
use fastpath::steer::Steering;
use fastpath::traffic::Traffic;
use fastpath::worker::WorkerSpec;
use fastpath::worker::{WorkerStats, spawn_worker};
use fastpath::xsk::XskSet;
use fastpath::xsk::gap::GapStats;
use fastpath::xsk::stats::StatsReader;
use slowpath::admin::{AdminConfig, AdminServer};
use slowpath::bgp::{BgpStats, SpeakerService};
use slowpath::flowsync::{FlowSync, FlowSyncConfig, FlowSyncService};
use slowpath::health::{HealthChecker, HealthService};
use slowpath::k8s::hcnp::HealthCheckNodePortService;
use slowpath::k8s::{SourceStats, WatchService};
use slowpath::neigh::{NeighbourService, NeighbourWatcher};
use slowpath::traffic::TrafficMeter;
use tokio::sync::mpsc;

use super::Slowpath;
use super::open::State;
use super::serve::Io;
use crate::admin::{CommandMsg, DaemonState};
use crate::controller::{Controller, Event, Sample};

/// The services whose events feed the controller, and their handles.
pub(super) struct Services {
    pub health: HealthChecker,
    pub neighbours: NeighbourWatcher,
    /// The healthCheckNodePort servers' port lists (`[kubernetes]` set).
    pub hcnp: Option<mpsc::UnboundedSender<Vec<slowpath::k8s::HealthCheckNodePort>>>,
    /// The Kubernetes source's stats (`[kubernetes]` set).
    pub k8s: Option<Arc<SourceStats>>,
}

/// The health checker, the neighbour watcher, the healthCheckNodePort servers and the
/// Kubernetes source, their events sent to `events` (dropped here: once they end, the
/// channel closes).
pub(super) fn services(
    cfg: &Config,
    slow: &mut Slowpath,
    events: mpsc::UnboundedSender<Event>,
    ifnames: &[String],
    k8s: Option<slowpath::k8s::Client>,
) -> anyhow::Result<Services> {
    let tx = events.clone();
    let health = slow.start(HealthService {
        on_change: move |states| {
            let _ = tx.send(Event::Health(states));
        },
    })?;
    let tx = events.clone();
    let neighbours = slow.start(NeighbourService {
        interfaces: ifnames.to_vec(),
        period: NeighbourWatcher::DEFAULT_PERIOD,
        on_change: move |l2| {
            let _ = tx.send(Event::L2(l2));
        },
    })?;
    let hcnp = match &cfg.kubernetes {
        Some(_) => Some(slow.start(HealthCheckNodePortService)?),
        None => None,
    };
    let k8s = match k8s {
        Some(client) => Some(slow.start(WatchService {
            client,
            cfg: cfg.clone(),
            on_model: move |model| {
                let _ = events.send(Event::Model(Box::new(model)));
            },
        })?),
        None => None,
    };
    Ok(Services {
        health,
        neighbours,
        hcnp,
        k8s,
    })
}

/// The first snapshot, built from the config alone, published and steered (the controller's
/// first tick) before any worker runs; `io` holds what the controller's actions need from now
/// on. Returns it, and the Kubernetes source's stats.
pub(super) fn first_publish<'a>(
    cfg: &Config,
    ctl: &mut Controller,
    services: Services,
    steers: Vec<Steering>,
    path: Option<&'a Path>,
) -> anyhow::Result<(Io<'a>, Option<Arc<SourceStats>>)> {
    if cfg.bgp.enable {
        match slowpath::bgp::interface_addresses() {
            Ok(addrs) => ctl.set_node_addresses(addrs),
            Err(e) => {
                tracing::warn!(error = %e, "reading the interfaces' addresses: NodePort frontends on them may be announced")
            }
        }
    }
    let initial = SnapshotBuilder::from_config(cfg).build(&[], &L2Table::default())?;
    let mut io = Io::new(
        initial,
        steers,
        services.health,
        services.neighbours,
        services.hcnp,
        path,
        cfg.dataplane.restart_hold.get(),
    );
    let now = Instant::now();
    ctl.tick(
        now,
        Sample {
            tx_frames: 0,
            workers_running: true,
        },
    );
    io.perform(ctl, now);
    Ok((io, services.k8s))
}

/// A takeover's pause (nobody polls), from the switch until the workers run, in parts, for
/// its log line: where the time goes is what an upgrade's packet loss depends on.
pub(super) struct Pause {
    at: Instant,
    last: Instant,
    parts: Vec<(&'static str, f64)>,
    /// What the thread that kept the sockets receiving did.
    kept: GapStats,
}

impl Pause {
    /// The pause that began at `at` (the switch sent), the frame states in at `resumed`.
    pub fn new(at: Instant, resumed: Instant) -> Pause {
        let mut p = Pause {
            at,
            last: at,
            parts: Vec::new(),
            kept: GapStats::default(),
        };
        p.mark_at("frame_states", resumed);
        p
    }

    /// The part `what` of `pause`, if there is one, ends now.
    pub fn mark_in(pause: &mut Option<Pause>, what: &'static str) {
        if let Some(p) = pause.as_mut() {
            p.mark(what);
        }
    }

    /// The sockets are back from their keeper, which did `kept`.
    pub fn kept_in(pause: &mut Option<Pause>, kept: GapStats) {
        if let Some(p) = pause.as_mut() {
            p.kept = kept;
            p.mark("kept");
        }
    }

    /// The part `what` ends now.
    pub fn mark(&mut self, what: &'static str) {
        self.mark_at(what, Instant::now());
    }

    fn mark_at(&mut self, what: &'static str, now: Instant) {
        self.parts
            .push((what, now.duration_since(self.last).as_secs_f64() * 1e3));
        self.last = now;
    }

    /// The workers are started: the pause's end, logged (`parts_ms` last: perf-lab reads
    /// the parts to the line's end).
    pub fn workers_started(mut self) {
        self.mark("workers");
        let parts: Vec<String> = (self.parts.iter())
            .map(|(what, ms)| format!("{what}={ms:.2}"))
            .collect();
        tracing::info!(target: "xvs", pause_ms = self.at.elapsed().as_secs_f64() * 1e3, held_frames = self.kept.held, keeper_rounds = self.kept.rounds, parts_ms = %parts.join(" "), "takeover: the workers poll again");
    }
}

/// The running workers and what the rest of the daemon reads of them.
pub(super) struct Workers {
    pub handles: Vec<JoinHandle<Option<XskSet>>>,
    pub stats: Vec<Arc<WorkerStats>>,
    pub traffic: Vec<Arc<Traffic>>,
    /// The interfaces each worker has a socket on (an interface with fewer queues has none).
    pub serving: Vec<(u32, Vec<String>)>,
    /// The kernel's statistics of every socket, read by the admin API (dropped when the
    /// workers stop, so that the sockets close with them).
    pub xsk_stats: Vec<StatsReader>,
    /// Flow sync's logs, one per worker (none without `[sync]`).
    pub logs: Vec<Arc<FlowLog>>,
    /// Set to stop them.
    pub stop: Arc<AtomicBool>,
}

/// The workers made, not yet running: [`Unstarted::start`] starts their threads (a
/// takeover makes them in its pause on the borrowed core, and starts them from it).
pub(super) struct Unstarted {
    workers: Workers,
    made: Vec<(WorkerSpec, XskSet, Pipeline)>,
    current: Arc<ArcSwap<Snapshot>>,
}

impl Unstarted {
    /// One thread per worker, pinned by itself to its core.
    pub fn start(self) -> anyhow::Result<Workers> {
        let Unstarted {
            mut workers,
            made,
            current,
        } = self;
        for (spec, set, pipeline) in made {
            let (h, s) = spawn_worker(
                spec,
                set,
                pipeline,
                Arc::clone(&current),
                Arc::clone(&workers.stop),
            )
            .context("starting a worker thread")?;
            workers.handles.push(h);
            workers.stats.push(s);
        }
        Ok(workers)
    }
}

/// One pinned worker per queue, each with its pipeline over the shared tables, made
/// (pipelines, statistics) but not started.
pub(super) fn make_workers(
    cfg: &Config,
    st: &State,
    sockets: Vec<(WorkerSpec, XskSet)>,
    current: &Arc<ArcSwap<Snapshot>>,
    sync: bool,
) -> Unstarted {
    let n = sockets.len();
    let mut w = Workers {
        handles: Vec::with_capacity(n),
        stats: Vec::with_capacity(n),
        traffic: Vec::with_capacity(n),
        serving: serving(&sockets),
        xsk_stats: Vec::new(),
        logs: if sync {
            (0..n)
                .map(|_| Arc::new(FlowLog::new(flowlog::DEFAULT_CAPACITY)))
                .collect()
        } else {
            Vec::new()
        },
        stop: Arc::new(AtomicBool::new(false)),
    };
    let dsr_mtu = dsr_mtu(cfg);
    let mut made = Vec::with_capacity(n);
    for (spec, set) in sockets {
        match set.stats_readers() {
            Ok(r) => w.xsk_stats.extend(r),
            Err(e) => {
                tracing::warn!(queue = spec.queue, error = %e, "AF_XDP socket statistics will not be exported")
            }
        }
        let base = PipelineConfig::from_config(cfg, spec.index, n);
        let dsr = fastpath::pipeline::DsrSettings {
            mtu: dsr_mtu,
            ..base.dsr.clone()
        };
        let mut pipeline = Pipeline::new(
            PipelineConfig {
                synproxy_key: st.cookie_key,
                dsr,
                ..base
            }
            .with_random_snat_start(),
            Arc::clone(&st.flows),
            Arc::clone(&st.affinity),
            current.load_full(),
        );
        pipeline.set_syn_watch(Arc::clone(&st.syn_watch));
        if let Some(log) = w.logs.get(spec.index) {
            pipeline.set_flow_log(Arc::clone(log));
        }
        w.traffic.push(Arc::clone(pipeline.traffic()));
        made.push((spec, set, pipeline));
    }
    Unstarted {
        workers: w,
        made,
        current: Arc::clone(current),
    }
}

/// What this process offers a newer one taking it over (`xvs run --takeover`): every
/// worker's sockets and the state files. `None` when the UMEM cannot be passed (said: an
/// upgrade is then a restart).
pub(super) fn takeover_offer(
    sockets: &[(WorkerSpec, XskSet)],
    st: &State,
) -> Option<crate::takeover::Offered> {
    let mut exports = Vec::with_capacity(sockets.len());
    for (spec, set) in sockets {
        match set.export() {
            Ok(e) => exports.push(e),
            Err(e) => {
                tracing::warn!(queue = spec.queue, error = %e, "the AF_XDP sockets cannot be handed over: an upgrade will be a restart");
                return None;
            }
        }
    }
    // The tables live as long as this process: their descriptors stay open for the hand-over.
    let state = [
        (crate::takeover::STATE_FILES[0], st.flows.state_file()),
        (crate::takeover::STATE_FILES[1], st.affinity.state_file()),
    ]
    .into_iter()
    .filter_map(|(name, f)| f.map(|f| (name, std::os::fd::AsRawFd::as_raw_fd(f))))
    .collect();
    Some(crate::takeover::Offered { exports, state })
}

/// Listens for a newer process taking `offered` over, on a thread of its own; a connection
/// that reaches the switch goes to `switch`. Returns whether it listens.
pub(super) fn takeover_listener(
    cfg: &Config,
    offered: crate::takeover::Offered,
    switch: tokio::sync::mpsc::UnboundedSender<crate::takeover::Switching>,
) -> bool {
    let path = crate::takeover::socket_path(&cfg.dataplane.state_dir);
    crate::takeover::listen(&path, offered, switch).is_some()
}

/// The interfaces each worker has a socket on.
fn serving(sockets: &[(WorkerSpec, XskSet)]) -> Vec<(u32, Vec<String>)> {
    sockets
        .iter()
        .map(|(spec, set)| {
            let names = set
                .fds()
                .into_iter()
                .filter_map(|(port, _)| spec.interfaces.get(port).cloned())
                .collect();
            (spec.queue, names)
        })
        .collect()
}

/// The tier's services: flow sync and the BGP speaker.
#[derive(Default)]
pub(super) struct Tier {
    pub peer_sync: Option<(FlowSync, Vec<Arc<FlowLog>>)>,
    pub bgp: Option<Arc<BgpStats>>,
}

/// Flow sync over the workers' logs, and the BGP speaker: the node announces once its
/// workers run (the controller emits nothing before its first snapshot is published; what
/// it emitted meanwhile waited in `io`).
pub(super) fn tier(
    cfg: &Config,
    slow: &mut Slowpath,
    sync: Option<FlowSyncConfig>,
    st: &State,
    io: &mut Io,
    logs: Vec<Arc<FlowLog>>,
) -> anyhow::Result<Tier> {
    let mut tier = Tier::default();
    if let Some(c) = sync {
        let fs = slow.start(FlowSyncService {
            cfg: c,
            flows: Arc::clone(&st.flows),
            snapshot: Arc::clone(&io.current),
            logs: logs.clone(),
        })?;
        tier.peer_sync = Some((fs, logs));
    }
    if cfg.bgp.enable {
        let stats = Arc::new(BgpStats::default());
        let speaker = slow.start(SpeakerService {
            socket: cfg.bgp.socket.clone(),
            device: cfg.bgp.liveness_device.clone(),
            stats: Arc::clone(&stats),
        })?;
        io.bgp.start(speaker);
        tier.bgp = Some(stats);
    }
    Ok(tier)
}

/// What the admin API reads: everything started so far.
pub(super) fn daemon_state(
    st: &State,
    io: &Io,
    w: &mut Workers,
    k8s: Option<Arc<SourceStats>>,
    tier: Tier,
    commands: mpsc::UnboundedSender<CommandMsg>,
) -> DaemonState {
    DaemonState {
        snapshot: Arc::clone(&io.current),
        flows: Arc::clone(&st.flows),
        workers: w.stats.clone(),
        serving: std::mem::take(&mut w.serving),
        k8s,
        steer: Mutex::new(Vec::new()),
        sockets: Mutex::new(std::mem::take(&mut w.xsk_stats)),
        sync: Arc::clone(&io.sync),
        fastpath_running: AtomicBool::new(true),
        healthz_timeout: 2 * st.ctl.sync_period(),
        status: Arc::clone(&io.status),
        commands,
        peer_sync: tier.peer_sync,
        bgp: tier.bgp,
        traffic: Mutex::new(TrafficMeter::new(std::mem::take(&mut w.traffic))),
        health: Some(io.health.reader()),
        state_refused: st.refused.view(),
    }
}

/// The admin servers, last, so that `/healthz` never answers before there is something to
/// be healthy about; then the "ready" line.
pub(super) fn admin(
    cfg: &Config,
    slow: &mut Slowpath,
    state: &Arc<DaemonState>,
    ifnames: &[String],
) -> anyhow::Result<()> {
    let admin_cfg = AdminConfig {
        listen: cfg.admin.listen,
        healthz_listen: Some(cfg.admin.healthz_listen()),
        metrics_listen: cfg.admin.metrics_listen,
        socket: Some(cfg.admin_socket()),
        control_enabled: cfg.admin.enable_control,
    };
    let admin = AdminServer::bind(&admin_cfg, Arc::clone(state) as _)?;
    let (admin_addr, healthz_addr, metrics_addr) = (
        admin.local_addr(),
        admin.healthz_addr(),
        admin.metrics_addr(),
    );
    slow.start(admin)?;
    tracing::info!(
        target: "xvs",
        services = state.snapshot.load().services.len(),
        workers = state.workers.len(),
        interfaces = %ifnames.join(", "),
        admin = %format!("http://{admin_addr}"),
        healthz = %healthz_addr.map_or_else(String::new, |a| format!("http://{a}")),
        metrics = %metrics_addr.map_or_else(String::new, |a| format!("http://{a}/metrics")),
        socket = %cfg.admin_socket().display(),
        "ready"
    );
    Ok(())
}

/// `[dataplane] dsr_mtu`, else the smallest MTU of the interfaces (read once: a changed MTU
/// needs a restart; see `fastpath::settings::dsr_mtu_of`).
fn dsr_mtu(cfg: &Config) -> u16 {
    if let Some(m) = cfg.dataplane.dsr_mtu {
        return m.min(u32::from(u16::MAX)) as u16;
    }
    let mtus: Vec<_> = (cfg.dataplane.interfaces.iter())
        .map(|i| {
            let path = format!("/sys/class/net/{}/mtu", i.name);
            (i.name.clone(), std::fs::read_to_string(path))
        })
        .collect();
    fastpath::settings::dsr_mtu_of(&mtus)
}
