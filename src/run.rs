//! `xvs run`: the daemon. Refuses clearly when it cannot work: a bad config (exit 2), not
//! root, a configured interface that does not exist, or a full-NAT port range the kernel also
//! uses (exit 1).
//!
//! Start-up order matters for "nothing is lost": the flow table, the first snapshot (static
//! services + the kernel's routes and neighbours) and the AF_XDP sockets exist before the
//! steering program redirects anything to them. Shutdown reverses it: the steering program
//! is detached first (traffic falls back to the kernel), then the workers stop. The program
//! is attached through a bpf_link, so even a crash leaves no XDP program behind.
//!
//! Signals: SIGTERM/SIGINT start a graceful drain (`[dataplane] drain_timeout`: `/healthz`
//! turns 503 so upstream load balancers move away, traffic keeps flowing, and xvs stops once
//! no established flow is left and nothing was forwarded for a second, or at the timeout); a
//! second signal stops at once. SIGHUP, or a change of the file's modification time (checked
//! once a second), reloads it (services and neighbours; a file that does not validate is
//! reported with key and line, counted, and the running config stays). On exit the final
//! counters are printed to stdout as `key=value` lines.
//!
//! After every publish the endpoint-removal policy runs over the flow table, and once a
//! second the passive health check samples SYNs without SYN-ACKs: see [`crate::policy`].

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use arc_swap::ArcSwap;
use config::{Config, Mode, Protocol};
use fastpath::pipeline::{DropReason, Pipeline, PipelineConfig, flow_table_config};
use fastpath::snapshot::{L2Table, Neighbour, ServiceSpec, Snapshot, SnapshotBuilder};
use fastpath::steer::Steering;
use fastpath::worker::{WorkerCounters, WorkerStats, spawn_worker, worker_specs};
use fastpath::xsk::napi::NapiDefer;
use fastpath::xsk::{XskSet, worker_count};
use flowtable::FlowTable;
use lb_algos::AffinityTable;
use slowpath::health::HealthChecker;
use slowpath::neigh::{NeighbourWatcher, read_l2};

use crate::admin_source::{Control, DaemonState, SyncStats};
use crate::policy::{PassiveHealth, end_removed_flows, reclaim_ids};
use fastpath::passive::SynWatch;

/// ClientIP affinity entries shared by all workers.
const AFFINITY_CAPACITY: usize = 1 << 16;
/// How often the main loop looks at signals and unresolved next hops.
const TICK: Duration = Duration::from_millis(100);
/// Periodic resync of the static source (kube-proxy's default `--sync-period`).
const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);

/// Stop signals received: the first drains, the second stops at once.
static STOPS: AtomicU32 = AtomicU32::new(0);
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOPS.fetch_add(1, Ordering::SeqCst);
}

extern "C" fn on_hup(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

pub fn main(path: Option<&PathBuf>) -> ExitCode {
    let Some(cfg) = crate::load_config(path) else {
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    };
    if let Err(why) = preflight(&cfg) {
        eprintln!("xvs run: {why}");
        return ExitCode::FAILURE;
    }
    match daemon(cfg, path.map(PathBuf::as_path)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xvs run: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Checks that need the machine: root, every configured interface present, and a full-NAT
/// port range that the kernel does not also hand out on the same addresses.
fn preflight(cfg: &Config) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(format!(
            "must run as root (or with CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF, CAP_SYS_ADMIN, CAP_IPC_LOCK); running as uid {euid}"
        ));
    }
    if cfg.dataplane.interfaces.is_empty() {
        return Err("no [dataplane] interfaces configured: nothing to forward on".into());
    }
    for ifc in &cfg.dataplane.interfaces {
        if !Path::new("/sys/class/net").join(&ifc.name).exists() {
            return Err(format!(
                "interface {} (dataplane.interfaces) does not exist in this network namespace",
                ifc.name
            ));
        }
    }
    let local = local_addresses();
    let snat_local = cfg
        .dataplane
        .snat_addresses
        .iter()
        .any(|a| local.contains(a));
    if snat_local && let Some((lo, hi)) = kernel_port_range() {
        let r = cfg.dataplane.snat_port_range;
        if u32::from(r.first) <= hi && lo <= u32::from(r.last) {
            return Err(format!(
                "dataplane.snat_port_range {r} overlaps the kernel's ephemeral ports {lo}-{hi} on a SNAT address this node also uses: replies to the kernel's own connections would be taken by xvs; choose a range outside {lo}-{hi} (or set net.ipv4.ip_local_port_range)"
            ));
        }
    }
    Ok(())
}

fn kernel_port_range() -> Option<(u32, u32)> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<u32>().ok());
    Some((it.next()??, it.next()??))
}

/// The addresses configured on this namespace's interfaces (from /proc, no netlink needed).
fn local_addresses() -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    // SAFETY: getifaddrs fills a list we free with freeifaddrs; we only read it in between.
    unsafe {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let sa = (*cur).ifa_addr;
            if !sa.is_null() {
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(sa as *const libc::sockaddr_in);
                        out.insert(IpAddr::from(
                            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                        ));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(sa as *const libc::sockaddr_in6);
                        out.insert(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}

/// The kernel's view merged with the config's pinned `[[neighbours]]`: a pin overrides the
/// MAC the kernel has and keeps the port the kernel learnt it on.
fn merge_pins(mut l2: L2Table, cfg: &Config) -> L2Table {
    for pin in &cfg.neighbours {
        match l2.neighbours.iter_mut().find(|n| n.ip == pin.ip) {
            Some(n) => n.mac = pin.mac.0,
            None => l2.neighbours.push(Neighbour {
                ip: pin.ip,
                mac: pin.mac.0,
                port: None,
            }),
        }
    }
    l2
}

fn ip_proto(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// Points every steering program at what `snap` owns.
fn steer_to(steers: &mut [Steering], snap: &Snapshot, cfg: &Config) -> anyhow::Result<()> {
    let mut frontends = Vec::new();
    let mut backends = Vec::new();
    for s in &snap.services {
        for f in &s.frontends {
            frontends.push((f.vip, ip_proto(f.protocol), f.port));
            if s.mode == Mode::Nat {
                for b in &s.backends {
                    backends.push((b.addr.ip(), ip_proto(f.protocol), b.addr.port()));
                }
            }
        }
    }
    frontends.sort_unstable();
    frontends.dedup();
    backends.sort_unstable();
    backends.dedup();
    let r = cfg.dataplane.snat_port_range;
    for st in steers.iter_mut() {
        st.set_frontends(&frontends)?;
        st.set_backends(&backends)?;
        st.set_snat(&cfg.dataplane.snat_addresses, (r.first, r.last))?;
    }
    Ok(())
}

/// Next hops the fastpath will need that the kernel has not resolved yet: every backend and
/// every gateway of the configured interfaces' routes (clients off-link are behind one).
fn unresolved(snap: &Snapshot, l2: &L2Table) -> Vec<IpAddr> {
    let gateways = l2.routes.iter().filter_map(|r| r.gateway);
    let mut v: Vec<IpAddr> = snap
        .services
        .iter()
        .flat_map(|s| s.backends.iter().map(|b| b.addr.ip()))
        .chain(gateways)
        .filter(|ip| snap.next_hop(*ip, 0).is_none())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

struct Running {
    builder: SnapshotBuilder,
    /// Services as the source describes them, before health is applied.
    specs: Vec<ServiceSpec>,
    /// Backends the health checker has marked down.
    down: HashSet<SocketAddr>,
    l2: L2Table,
    current: Arc<ArcSwap<Snapshot>>,
    flows: Arc<FlowTable>,
    control: Arc<Control>,
    /// When the endpoint-removal policy runs its second pass (and ids are reclaimed).
    second_pass: Option<Instant>,
}

impl Running {
    /// Builds and publishes a snapshot of the current specs, health and neighbours.
    fn publish(
        &mut self,
        cfg: &Config,
        steers: &mut [Steering],
        sync: &SyncStats,
    ) -> anyhow::Result<()> {
        let t0 = Instant::now();
        // Health and per-service freezes are applied to a copy, made only when there is
        // something to apply (10,000 Services: the copy alone would cost milliseconds).
        let frozen_any = !self
            .control
            .frozen_services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        let adjusted;
        let specs: &[ServiceSpec] = if self.down.is_empty() && !frozen_any {
            &self.specs
        } else {
            let mut v = self.specs.clone();
            for s in &mut v {
                // Health applies to what the source says is usable (readiness stays).
                for b in &mut s.backends {
                    b.usable &= !self.down.contains(&b.addr);
                }
                s.frozen |= self.control.service_frozen(&s.name);
            }
            adjusted = v;
            &adjusted
        };
        self.builder
            .set_frozen(self.control.frozen.load(Ordering::Relaxed));
        let l2 = merge_pins(self.l2.clone(), cfg);
        let snap = Arc::new(self.builder.build(specs, &l2)?);
        // New frontends are steered after the snapshot that knows them is published; gone
        // ones stop being steered at the same moment (their flows would be refused anyway).
        self.current.store(Arc::clone(&snap));
        steer_to(steers, &snap, cfg)?;
        sync.synced(t0.elapsed());
        self.end_removed_flows(cfg);
        self.second_pass = Some(Instant::now() + Duration::from_secs(1));
        Ok(())
    }

    /// The endpoint-removal policy over the flow table (see [`crate::policy`]).
    fn end_removed_flows(&mut self, cfg: &Config) {
        let r = end_removed_flows(
            &self.flows,
            &self.builder,
            &self.current.load(),
            cfg.flowtable.removed_backend_tcp,
        );
        let c = &self.control;
        c.flows_resteered.fetch_add(r.resteered, Ordering::Relaxed);
        c.flows_ended.fetch_add(r.ended, Ordering::Relaxed);
        if r.resteered + r.ended > 0 {
            eprintln!(
                "xvs: removed backends: {} UDP flows re-steered, {} TCP/SCTP flows ended",
                r.resteered, r.ended
            );
        }
    }

    /// The second pass, a second after a publish: catches flows inserted with the previous
    /// snapshot meanwhile, then frees the retired ids nothing holds.
    fn second_pass(&mut self, cfg: &Config) {
        if self.second_pass.is_some_and(|t| Instant::now() >= t) {
            self.second_pass = None;
            self.end_removed_flows(cfg);
            reclaim_ids(&self.flows, &mut self.builder);
        }
    }
}

/// Every static backend address, for the health checker.
fn health_targets(specs: &[ServiceSpec]) -> Vec<SocketAddr> {
    let mut v: Vec<SocketAddr> = specs
        .iter()
        .flat_map(|s| s.backends.iter().map(|b| b.addr))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn daemon(mut cfg: Config, path: Option<&Path>) -> anyhow::Result<()> {
    // In a DaemonSet the downward API gives the node's name (see deploy/daemonset.yaml).
    if cfg.node.name.is_none()
        && let Ok(name) = std::env::var("NODE_NAME")
    {
        cfg.node.name = Some(name);
    }
    // SAFETY: the handlers only store to atomics, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_hup as *const () as libc::sighandler_t);
    }
    let epoch = Instant::now();
    let flows = Arc::new(
        FlowTable::new(flow_table_config(&cfg), epoch).context("allocating the flow table")?,
    );
    let affinity = Arc::new(AffinityTable::new(AFFINITY_CAPACITY, epoch));
    let ifnames: Vec<String> = cfg
        .dataplane
        .interfaces
        .iter()
        .map(|i| i.name.clone())
        .collect();
    let l2 = read_l2(&ifnames).context("reading routes and neighbours")?;
    let control = Arc::new(Control::default());
    let mut run = Running {
        builder: SnapshotBuilder::from_config(&cfg),
        specs: ServiceSpec::from_config(&cfg),
        down: HashSet::new(),
        l2,
        current: Arc::new(ArcSwap::from_pointee(empty_snapshot(&cfg)?)),
        flows: Arc::clone(&flows),
        control: Arc::clone(&control),
        second_pass: None,
    };
    let syn_watch = Arc::new(SynWatch::new(cfg.flowtable.backends_max as usize));
    let sync_stats = SyncStats::default();
    // Busy polling needs the interfaces' NAPI deferral; put back when xvs returns.
    let _napi_defer = if cfg.dataplane.napi_busy_poll {
        let names: Vec<&str> = ifnames.iter().map(String::as_str).collect();
        Some(NapiDefer::apply(&names).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    // Sockets first, then the program that feeds them.
    let workers = worker_count(&cfg.dataplane);
    let mut sockets = Vec::with_capacity(workers);
    for spec in worker_specs(&cfg.dataplane) {
        let set = XskSet::open(&cfg.dataplane, spec.queue)
            .with_context(|| format!("opening AF_XDP sockets for queue {}", spec.queue))?;
        eprintln!(
            "xvs: worker {} queue {}: AF_XDP {}",
            spec.index,
            spec.queue,
            set.mode()
        );
        sockets.push((spec, set));
    }
    let mut steers = Vec::with_capacity(ifnames.len());
    for name in &ifnames {
        let st = Steering::attach(name, cfg.dataplane.xdp_mode)?;
        eprintln!("xvs: {name}: XDP attached ({:?})", st.attached());
        steers.push(st);
    }
    for (spec, set) in &sockets {
        for (port, fd) in set.fds() {
            steers[port].register_socket(spec.queue, fd)?;
        }
    }
    run.publish(&cfg, &mut steers, &sync_stats)?;

    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::with_capacity(workers);
    let mut stats: Vec<Arc<WorkerStats>> = Vec::with_capacity(workers);
    for (spec, set) in sockets {
        let mut pipeline = Pipeline::new(
            PipelineConfig::from_config(&cfg, spec.index, workers),
            Arc::clone(&flows),
            Arc::clone(&affinity),
            run.current.load_full(),
        );
        pipeline.set_syn_watch(Arc::clone(&syn_watch));
        let (h, s) = spawn_worker(
            spec,
            set,
            pipeline,
            Arc::clone(&run.current),
            Arc::clone(&stop),
        )
        .context("starting a worker thread")?;
        handles.push(h);
        stats.push(s);
    }

    let sync_period = cfg
        .kubernetes
        .as_ref()
        .map_or(DEFAULT_SYNC_PERIOD, |k| k.sync_period.get());
    let state = Arc::new(DaemonState {
        snapshot: Arc::clone(&run.current),
        flows: Arc::clone(&flows),
        workers: stats.clone(),
        steer: Mutex::new(Vec::new()),
        sync: sync_stats,
        fastpath_running: AtomicBool::new(true),
        healthz_timeout: 2 * sync_period,
        control: Arc::clone(&control),
    });
    let admin = slowpath::admin::serve(
        cfg.admin.listen,
        Arc::clone(&state) as Arc<dyn slowpath::admin::AdminSource>,
        cfg.admin.enable_control,
    )
    .with_context(|| {
        format!(
            "binding the admin API at {} ([admin] listen)",
            cfg.admin.listen
        )
    })?;

    // The Kubernetes source, when configured: whole models, batched by min_sync_period.
    // Until its first model (every watcher listed), the node is not healthy.
    // Everything the slowpath threads hand the main loop arrives on one channel, so the loop
    // wakes (and publishes) as soon as a change arrives instead of at its next tick.
    let (ev_tx, ev_rx) = mpsc::channel::<Event>();
    let model_tx = ev_tx.clone();
    let k8s = match &cfg.kubernetes {
        Some(_) => {
            state.sync.last_unix_ms.store(0, Ordering::Relaxed);
            Some(
                slowpath::k8s::spawn(&cfg, move |model| {
                    let _ = model_tx.send(Event::Model(model));
                })
                .context("starting the Kubernetes source")?,
            )
        }
        None => None,
    };
    let hcnp = match &cfg.kubernetes {
        Some(_) => Some(hcnp::spawn().context("starting the healthCheckNodePort servers")?),
        None => None,
    };

    let health_tx = ev_tx.clone();
    let health = HealthChecker::spawn(&cfg.health, move |states| {
        let _ = health_tx.send(Event::Health(states));
    })
    .context("starting the health checker")?;
    health.set_targets(health_targets(&run.specs));

    let l2_tx = ev_tx;
    let watcher = NeighbourWatcher::spawn(
        ifnames.clone(),
        NeighbourWatcher::DEFAULT_PERIOD,
        move |l2| {
            let _ = l2_tx.send(Event::L2(l2));
        },
    )
    .context("starting the neighbour watcher")?;
    eprintln!(
        "xvs: ready: {} services, {} workers, interfaces {}, admin http://{}",
        run.current.load().services.len(),
        workers,
        ifnames.join(", "),
        admin.local_addr()
    );

    let mut last_solicit = Instant::now() - Duration::from_secs(10);
    // A change of the file reloads it like SIGHUP (checked once a second).
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut seen_mtime = path.and_then(mtime);
    let mut last_resync = Instant::now();
    let mut passive = PassiveHealth::default();
    let mut drain: Option<Drain> = None;
    let mut woken: Option<Event> = None;
    let result = loop {
        match STOPS.load(Ordering::SeqCst) {
            0 => {}
            1 if !cfg.dataplane.drain_timeout.get().is_zero() => {
                let d = drain.get_or_insert_with(|| {
                    state.control.draining.store(true, Ordering::Relaxed);
                    eprintln!(
                        "xvs: draining: /healthz answers 503; stopping when established flows end and traffic stops, within {:?} (signal again to stop now)",
                        cfg.dataplane.drain_timeout.get()
                    );
                    Drain::new(&stats)
                });
                if let Some(why) = d.done(&stats, &flows, &run.current.load(), &cfg) {
                    eprintln!("xvs: drain finished: {why}");
                    break Ok(());
                }
            }
            _ => break Ok(()),
        }
        if handles.iter().any(|h| h.is_finished()) {
            state.fastpath_running.store(false, Ordering::Relaxed);
            break Err(anyhow::anyhow!("a worker thread ended unexpectedly"));
        }
        let mut changed = false;
        for ev in woken
            .take()
            .into_iter()
            .chain(std::iter::from_fn(|| ev_rx.try_recv().ok()))
        {
            changed = true;
            match ev {
                Event::L2(l2) => run.l2 = l2,
                // The source logs each problem once itself.
                Event::Model(model) => {
                    if let Some(h) = &hcnp {
                        h.update(model.health_check_node_ports.clone());
                    }
                    run.specs = model.specs;
                }
                Event::Health(states) => {
                    run.down = states
                        .into_iter()
                        .filter(|(_, up)| !up)
                        .map(|(a, _)| a)
                        .collect();
                }
            }
        }
        if RELOAD.swap(false, Ordering::SeqCst) {
            // The file as this reload reads it: a later change of it reloads again.
            seen_mtime = path.and_then(mtime);
            if reload(&mut cfg, path, &mut run) {
                state.sync.reloads_ok.fetch_add(1, Ordering::Relaxed);
                health.set_targets(health_targets(&run.specs));
                changed = true;
            } else {
                state.sync.reloads_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if state.control.changed.swap(false, Ordering::Relaxed) {
            changed = true;
        }
        if changed {
            if let Err(e) = run.publish(&cfg, &mut steers, &state.sync) {
                eprintln!("xvs: publishing a new snapshot failed, keeping the old one: {e:#}");
            }
            last_resync = Instant::now();
        } else if last_resync.elapsed() >= sync_period
            && k8s
                .as_ref()
                .is_none_or(|k| k.stats().synced.load(Ordering::Relaxed))
        {
            // A periodic pass that finds nothing to publish still counts as a sync
            // (kube-proxy's lastUpdated), so an idle node stays healthy.
            state.sync.synced(Duration::ZERO);
            last_resync = Instant::now();
        }
        run.second_pass(&cfg);
        if last_solicit.elapsed() >= Duration::from_secs(1) {
            for ip in unresolved(&run.current.load(), &run.l2) {
                watcher.request(ip);
            }
            if cfg.health.probe != config::ProbeKind::None {
                for addr in passive.sample(&syn_watch, &run.current.load()) {
                    health.report_failure(addr);
                }
            }
            if let Some(p) = path
                && let Some(m) = mtime(p)
                && Some(m) != seen_mtime
            {
                seen_mtime = Some(m);
                RELOAD.store(true, Ordering::SeqCst);
            }
            if let Ok(mut s) = state.steer.lock() {
                *s = steers
                    .iter()
                    .filter_map(|st| Some((st.ifname().to_owned(), st.counters().ok()?)))
                    .collect();
            }
            last_solicit = Instant::now();
        }
        woken = ev_rx.recv_timeout(TICK).ok();
    };

    // Detach first: from here on the kernel sees every frame, then the workers stop.
    let steer_counters: Vec<_> = steers
        .iter()
        .map(|s| (s.ifname().to_owned(), s.counters().ok()))
        .collect();
    for st in steers {
        if let Err(e) = st.detach() {
            eprintln!("xvs: {e}");
        }
    }
    stop.store(true, Ordering::SeqCst);
    for h in handles {
        let _ = h.join();
    }
    state.fastpath_running.store(false, Ordering::Relaxed);
    admin.stop();
    health.stop();
    if let Some(k) = k8s {
        k.stop();
    }
    watcher.stop();
    print_counters(&stats, &steer_counters, &flows);
    eprintln!("xvs: stopped");
    result
}

/// What the slowpath's threads hand the main loop.
enum Event {
    /// A new model from the Kubernetes source.
    Model(slowpath::k8s::K8sModel),
    /// The health checker's view changed: every target, up or not.
    Health(std::collections::HashMap<SocketAddr, bool>),
    /// Routes and neighbours changed.
    L2(L2Table),
}

/// A graceful drain in progress (after the first stop signal).
struct Drain {
    started: Instant,
    /// Frames transmitted by all workers when last seen changing, and when.
    tx: u64,
    tx_changed: Instant,
}

impl Drain {
    fn new(stats: &[Arc<WorkerStats>]) -> Drain {
        Drain {
            started: Instant::now(),
            tx: total_tx(stats),
            tx_changed: Instant::now(),
        }
    }

    /// Why the drain is over, if it is: no established flow and no frame forwarded for a
    /// second, or the timeout.
    fn done(
        &mut self,
        stats: &[Arc<WorkerStats>],
        flows: &FlowTable,
        snap: &Snapshot,
        cfg: &Config,
    ) -> Option<String> {
        use lb_algos::ConnCounts;
        let tx = total_tx(stats);
        if tx != self.tx {
            self.tx = tx;
            self.tx_changed = Instant::now();
        }
        let established: u64 = snap
            .services
            .iter()
            .flat_map(|s| s.backends.iter())
            .map(|b| u64::from(flows.active(b.id)))
            .sum();
        let timeout = cfg.dataplane.drain_timeout.get();
        if self.started.elapsed() >= timeout {
            return Some(format!(
                "timeout ({timeout:?}) with {established} established flows left"
            ));
        }
        if established == 0 && self.tx_changed.elapsed() >= Duration::from_secs(1) {
            return Some(format!(
                "idle after {:.1}s",
                self.started.elapsed().as_secs_f64()
            ));
        }
        None
    }
}

fn total_tx(stats: &[Arc<WorkerStats>]) -> u64 {
    stats.iter().map(|s| s.read().tx).sum()
}

/// The healthCheckNodePort servers of `externalTrafficPolicy: Local` Services: a thread with
/// its own small tokio runtime that follows the latest list of ports.
mod hcnp {
    use slowpath::k8s::HealthCheckNodePort;
    use slowpath::k8s::hcnp::HealthCheckServers;

    pub struct Hcnp {
        tx: tokio::sync::mpsc::UnboundedSender<Vec<HealthCheckNodePort>>,
    }

    impl Hcnp {
        pub fn update(&self, ports: Vec<HealthCheckNodePort>) {
            let _ = self.tx.send(ports);
        }
    }

    pub fn spawn() -> std::io::Result<Hcnp> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<HealthCheckNodePort>>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("xvs-hcnp".into())
            .spawn(move || {
                rt.block_on(async move {
                    // kube-proxy binds these on every address of the node.
                    let mut servers =
                        HealthCheckServers::new(std::net::Ipv6Addr::UNSPECIFIED.into());
                    while let Some(ports) = rx.recv().await {
                        for (port, e) in servers.update(&ports).await {
                            eprintln!("xvs: healthCheckNodePort {port}: {e}");
                        }
                    }
                });
            })?;
        Ok(Hcnp { tx })
    }
}

/// An empty snapshot to hold the place until the first real one is published.
fn empty_snapshot(cfg: &Config) -> anyhow::Result<Snapshot> {
    Ok(SnapshotBuilder::from_config(cfg).build(&[], &L2Table::default())?)
}

/// Re-reads the config file after SIGHUP. Only services and pinned neighbours change at
/// run time; a changed `[dataplane]` needs a restart and is reported as such.
fn reload(cfg: &mut Config, path: Option<&Path>, run: &mut Running) -> bool {
    let Some(path) = path else {
        eprintln!("xvs: SIGHUP: running on the embedded config, nothing to reload");
        return false;
    };
    match config::load(path) {
        Ok(new) => {
            if format!("{:?}", new.dataplane) != format!("{:?}", cfg.dataplane) {
                eprintln!("xvs: reload: [dataplane] changed; it takes effect at the next restart");
            }
            run.specs = ServiceSpec::from_config(&new);
            let dataplane = cfg.dataplane.clone();
            *cfg = new;
            cfg.dataplane = dataplane;
            eprintln!(
                "xvs: reloaded {} ({} services)",
                path.display(),
                cfg.services.len()
            );
            true
        }
        Err(e) => {
            eprintln!("xvs: reload rejected, the running config stays:\n{e}");
            false
        }
    }
}

fn print_counters(
    stats: &[Arc<WorkerStats>],
    steer: &[(String, Option<fastpath::steer::SteerCounters>)],
    flows: &FlowTable,
) {
    let mut total = WorkerCounters::default();
    for s in stats {
        let c = s.read();
        total.rx += c.rx;
        total.tx += c.tx;
        total.tx_ring_full += c.tx_ring_full;
        total.tx_no_port += c.tx_no_port;
        total.pass += c.pass;
        total.slow += c.slow;
        total.new_flows += c.new_flows;
        total.expired += c.expired;
        total.busy_ns += c.busy_ns;
        for (t, d) in total.drops.iter_mut().zip(c.drops) {
            *t += d;
        }
    }
    println!("rx={}", total.rx);
    println!("tx={}", total.tx);
    println!("tx_ring_full={}", total.tx_ring_full);
    println!("tx_no_port={}", total.tx_no_port);
    println!("pass={}", total.pass);
    println!("slow={}", total.slow);
    println!("new_flows={}", total.new_flows);
    println!("expired_flows={}", total.expired);
    println!("busy_ns={}", total.busy_ns);
    println!("flows_live={}", flows.len());
    for r in DropReason::ALL {
        let n = total.dropped(*r);
        if n > 0 {
            println!("drop_{}={n}", r.name());
        }
    }
    for (name, c) in steer {
        if let Some(c) = c {
            println!("steer_{name}_redirected={}", c.redirected);
            println!("steer_{name}_passed={}", c.passed());
        }
    }
}
