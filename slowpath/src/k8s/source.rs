//! The watcher side: one thread with a current-thread tokio runtime running four kube-rs
//! watchers (Services, EndpointSlices, this Node, ServiceCIDRs) feeding an
//! [`IncrementalModel`], and a loop that publishes its models.
//!
//! Contract:
//! - Nothing is published until the Service, EndpointSlice and Node watchers have completed
//!   their initial list. The ServiceCIDR watcher does not hold the source back (a cluster
//!   before v1.33, or RBAC without the new rule, would otherwise never be served): until it
//!   lists, only `[kubernetes] service_cidrs` apply, and when the API server does not serve
//!   the resource at all (404) it is logged once and not watched again.
//! - After a change, the next model is built no sooner than `min_sync_period` after the
//!   previous one (changes in between are batched); with no change, a full rebuild is
//!   published every `sync_period`.
//! - API server outages publish nothing: the model keeps the last listed state, the
//!   watchers retry with kube's default backoff, and a 410 Gone makes them relist (the
//!   model's objects are replaced only once the relist is complete).
//! - Only the Services whose objects changed are translated again; every `sync_period` all
//!   of them are (a safety net; unchanged results cost no further work).
//! - Problems are logged the first time they appear, not at every sync; a failing watch is
//!   logged with backoff and a count ([`RepeatLog`]), and once more when it recovers.
//! - [`SourceStats::pending_since`] is when the oldest change not yet handed over in a model
//!   arrived (kube-proxy's `QueuedUpdate`), and [`SourceStats::last_model`] when the last
//!   model was handed over: `/healthz` fails when either is older than its timeout, so a
//!   source that stops handing over changes, whatever the cause, is seen
//!   ([`crate::admin::HealthView::with_source`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use config::{Config, Kubernetes};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::translate::NodeInfo;
use super::{
    IncrementalModel, K8sError, K8sModel, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, Problem,
};
use crate::repeat::RepeatLog;

/// Counters of the source, readable from any thread.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Models published.
    pub syncs: AtomicU64,
    /// Wall-clock time of the last publish, milliseconds since the Unix epoch (0: never).
    pub last_sync_unix_ms: AtomicU64,
    /// How long the last translation took, microseconds.
    pub last_sync_duration_us: AtomicU64,
    /// Services held at the last sync.
    pub services: AtomicU64,
    /// EndpointSlices held at the last sync (those naming a Service, IPv4 or IPv6).
    pub endpoint_slices: AtomicU64,
    /// Specs in the last model.
    pub specs: AtomicU64,
    /// Backends across the specs of the last model.
    pub backends: AtomicU64,
    /// Problems in the last model.
    pub problems: AtomicU64,
    /// Watch errors seen (connection failures, 410 Gone...), all watchers together.
    pub watch_errors: AtomicU64,
    /// Whether every watcher has completed its initial list at least once.
    pub synced: AtomicBool,
    /// Services changed since the last model (kube-proxy's
    /// `sync_proxy_rules_service_changes_pending`).
    pub service_changes_pending: AtomicU64,
    /// EndpointSlices changed since the last model (`..._endpoint_changes_pending`).
    pub endpoint_changes_pending: AtomicU64,
    /// Service changes since the start (`..._service_changes_total`).
    pub service_changes: AtomicU64,
    /// EndpointSlice changes since the start (`..._endpoint_changes_total`).
    pub endpoint_changes: AtomicU64,
    /// Wall-clock time, milliseconds since the Unix epoch, of the oldest change received and
    /// not yet in a model handed over (0: none).
    pub pending_since_unix_ms: AtomicU64,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
        .max(1)
}

fn from_unix_ms(ms: u64) -> Option<SystemTime> {
    (ms != 0).then(|| UNIX_EPOCH + Duration::from_millis(ms))
}

impl SourceStats {
    /// When the oldest change not yet handed over in a model arrived.
    pub fn pending_since(&self) -> Option<SystemTime> {
        from_unix_ms(self.pending_since_unix_ms.load(Ordering::Relaxed))
    }

    /// When the last model was handed over (None: no model yet).
    pub fn last_model(&self) -> Option<SystemTime> {
        from_unix_ms(self.last_sync_unix_ms.load(Ordering::Relaxed))
    }

    /// A change arrived at `now`: the oldest pending one, unless one is pending already.
    pub fn queued(&self, now: SystemTime) {
        let _ = self.pending_since_unix_ms.compare_exchange(
            0,
            unix_ms(now),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Every change received so far is in a model handed over.
    pub fn handed_over(&self) {
        self.pending_since_unix_ms.store(0, Ordering::Relaxed);
    }

    /// Stores `model`'s change counts.
    fn changes(&self, model: &IncrementalModel) {
        let n = |x: usize| u64::try_from(x).unwrap_or(u64::MAX);
        let (services, slices) = model.pending_changes();
        let (services_total, slices_total) = model.changes_total();
        self.service_changes_pending
            .store(n(services), Ordering::Relaxed);
        self.endpoint_changes_pending
            .store(n(slices), Ordering::Relaxed);
        self.service_changes
            .store(services_total, Ordering::Relaxed);
        self.endpoint_changes.store(slices_total, Ordering::Relaxed);
    }
}

/// The running source. Dropping it stops the thread (and waits for it).
#[derive(Debug)]
pub struct SourceHandle {
    stats: Arc<SourceStats>,
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl SourceHandle {
    /// The source's counters.
    pub fn stats(&self) -> &Arc<SourceStats> {
        &self.stats
    }

    /// Stops the watchers and waits for the thread to end.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SourceHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the Kubernetes source of `cfg` (which must have a `[kubernetes]` table) on a thread
/// of its own with its own runtime: for tests and tools. The daemon runs [`connect`] and
/// [`watch`] on its slowpath runtime instead. `on_model` is called on that thread with every
/// model. Returns once the client is built (the kubeconfig or in-cluster configuration was
/// readable); connection problems after that are retried, never returned.
pub fn spawn(
    cfg: &Config,
    on_model: impl FnMut(K8sModel) + Send + 'static,
) -> Result<SourceHandle, K8sError> {
    let cfg = cfg.clone();
    let stats = Arc::new(SourceStats::default());
    let stop = CancellationToken::new();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), K8sError>>();
    let (thread_stats, thread_stop) = (stats.clone(), stop.clone());
    let thread = std::thread::Builder::new()
        .name("xvs-k8s".to_owned())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(K8sError::Runtime(e)));
                    return;
                }
            };
            rt.block_on(async move {
                let client = match connect(&cfg).await {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                watch(client, &cfg, thread_stats, on_model, thread_stop).await;
            });
        })?;
    let started = ready_rx.recv();
    let handle = SourceHandle {
        stats,
        stop,
        thread: Some(thread),
    };
    match started {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(K8sError::Runtime(std::io::Error::other(
            "the kubernetes source thread ended before starting",
        ))),
    }
}

/// Largest kubeconfig read (certificates inline included, they are a few KiB).
const KUBECONFIG_MAX: u64 = 1 << 20;

/// Builds the API client of `cfg`'s `[kubernetes]` table: the kubeconfig it names, else the
/// in-cluster configuration. Fails at once when neither is usable; reaching the API server
/// is [`watch`]'s business.
pub async fn connect(cfg: &Config) -> Result<Client, K8sError> {
    let k8s = cfg.kubernetes.as_ref().ok_or(K8sError::NotConfigured)?;
    client(k8s).await
}

async fn client(k: &Kubernetes) -> Result<Client, K8sError> {
    let config = match &k.kubeconfig {
        Some(path) => {
            let err = |source| K8sError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            // Read whole by kube: a device or a huge file would be read for ever.
            let file = |why: String| K8sError::KubeconfigFile {
                path: path.display().to_string(),
                why,
            };
            match std::fs::metadata(path) {
                Ok(m) if !m.is_file() => return Err(file("not a regular file".to_owned())),
                Ok(m) if m.len() > KUBECONFIG_MAX => {
                    return Err(file(format!("larger than {KUBECONFIG_MAX} bytes")));
                }
                // A missing file is kube's to say.
                _ => {}
            }
            let kc = Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::incluster()?,
    };
    Ok(Client::try_from(config)?)
}

/// The node name: `[node] name`, else the host name.
pub fn node_name(cfg: &Config) -> String {
    cfg.node
        .name
        .clone()
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// The label selector of the Service and EndpointSlice watches, as kube-proxy builds it.
pub(crate) fn label_selector(service_proxy_name: Option<&str>) -> String {
    match service_proxy_name {
        Some(name) => format!("{LABEL_SERVICE_PROXY_NAME}={name},!{LABEL_HEADLESS}"),
        None => format!("!{LABEL_SERVICE_PROXY_NAME},!{LABEL_HEADLESS}"),
    }
}

type Events<K> = BoxStream<'static, Result<Event<K>, watcher::Error>>;

/// A watcher with kube's default backoff. Its events carry the objects: the loop feeds them
/// to the [`IncrementalModel`], which is the only copy of the cluster state kept.
fn watcher_of<K>(api: Api<K>, wc: watcher::Config) -> Events<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    watcher::watcher(api, wc).default_backoff().boxed()
}

/// The objects of a (re)list in progress: applied as a whole at `InitDone`, so a relist
/// after an outage or a 410 Gone replaces the state at once, deleting what vanished meanwhile
/// (what kube's reflector store does).
struct Relist<K>(Option<Vec<K>>);

impl<K> Relist<K> {
    /// Handles a list event; returns the whole list at `InitDone`.
    fn on(&mut self, e: Event<K>) -> Option<Vec<K>> {
        match e {
            Event::Init => self.0 = Some(Vec::new()),
            Event::InitApply(o) => self.0.get_or_insert_with(Vec::new).push(o),
            Event::InitDone => return Some(self.0.take().unwrap_or_default()),
            Event::Apply(_) | Event::Delete(_) => {}
        }
        None
    }
}

fn ns_name(m: &ObjectMeta) -> (&str, &str) {
    (
        m.namespace.as_deref().unwrap_or("default"),
        m.name.as_deref().unwrap_or(""),
    )
}

/// An event of one of the watchers (boxed: the objects are large).
enum Change {
    Service(Box<Event<Service>>),
    Slice(Box<Event<EndpointSlice>>),
    Node(Box<Event<Node>>),
    Cidr(Box<Event<ServiceCIDR>>),
}

/// Watchers whose first list the source waits for (Services, EndpointSlices, the Node); the
/// fourth (ServiceCIDRs) is not waited for.
const GATING: usize = 3;

/// Whether a watch error says the API server does not serve the resource (404).
fn not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        watcher::Error::WatchError(s) => s.code == 404,
        _ => false,
    }
}

/// The Kubernetes source as a [`crate::service::Service`] on the caller's runtime: [`watch`]
/// with `client` (from [`connect`]), `cfg` and `on_model`; its handle is the source's stats.
pub struct WatchService<F> {
    /// The API client, built before anything of the node is touched.
    pub client: Client,
    /// The config whose `[kubernetes]` the source follows.
    pub cfg: Config,
    /// Gets every model.
    pub on_model: F,
}

impl<F> crate::service::Service for WatchService<F>
where
    F: FnMut(K8sModel) + Send + 'static,
{
    type Handle = Arc<SourceStats>;
    type Error = std::convert::Infallible;
    const NAME: &'static str = "the Kubernetes source";

    fn start(
        self,
        rt: &tokio::runtime::Handle,
        shutdown: &CancellationToken,
    ) -> Result<crate::service::Running<Arc<SourceStats>>, Self::Error> {
        let stats = Arc::new(SourceStats::default());
        let (task_stats, stop) = (Arc::clone(&stats), shutdown.clone());
        let WatchService {
            client,
            cfg,
            on_model,
        } = self;
        let task = rt.spawn(async move {
            watch(client, &cfg, task_stats, on_model, stop).await;
        });
        Ok(crate::service::Running {
            handle: stats,
            task,
        })
    }
}

/// Runs the watchers until `stop` is cancelled (see the module doc): `on_model` gets every
/// model, `stats` is kept current.
pub async fn watch(
    client: Client,
    cfg: &Config,
    stats: Arc<SourceStats>,
    mut on_model: impl FnMut(K8sModel),
    stop: CancellationToken,
) {
    let Some(k8s) = cfg.kubernetes.as_ref() else {
        return;
    };
    let mut st = Watched::new(cfg);
    let selector = label_selector(k8s.service_proxy_name.as_deref());
    let mut svc_events = watcher_of(
        Api::<Service>::all(client.clone()),
        watcher::Config::default().labels(&selector),
    );
    let mut slice_events = watcher_of(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default().labels(&selector),
    );
    let mut node_events = watcher_of(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", st.node_name)),
    );
    let mut cidr_events = watcher_of(Api::<ServiceCIDR>::all(client), watcher::Config::default());
    let mut health = WatchHealth::default();
    let min_sync = k8s.min_sync_period.0;
    let sync_period = k8s.sync_period.0.max(min_sync);
    let mut last_build: Option<Instant> = None;
    loop {
        let wake = health.all_synced().then(|| match last_build {
            None => Instant::now(),
            Some(t) if st.model.is_dirty() => t + min_sync,
            Some(t) => t + sync_period,
        });
        let sleep = async {
            match wake {
                Some(w) => tokio::time::sleep_until(w.into()).await,
                None => std::future::pending().await,
            }
        };
        let ended = health.ended;
        let (i, ev) = tokio::select! {
            () = stop.cancelled() => return,
            ev = svc_events.next(), if !ended[0] => (0, ev.map(|r| r.map(|e| Change::Service(Box::new(e))))),
            ev = slice_events.next(), if !ended[1] => (1, ev.map(|r| r.map(|e| Change::Slice(Box::new(e))))),
            ev = node_events.next(), if !ended[2] => (2, ev.map(|r| r.map(|e| Change::Node(Box::new(e))))),
            ev = cidr_events.next(), if !ended[3] => (3, ev.map(|r| r.map(|e| Change::Cidr(Box::new(e))))),
            () = sleep => {
                st.hand_over(&stats, &mut on_model);
                last_build = Some(Instant::now());
                continue;
            }
        };
        let Some(change) = health.outcome(i, ev, &stats) else {
            continue;
        };
        let init_done = change.is_init_done();
        st.apply(change);
        stats.changes(&st.model);
        if st.model.is_dirty() {
            stats.queued(SystemTime::now());
        }
        if init_done {
            health.synced[i] = true;
            if health.all_synced() {
                stats.synced.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// The four watches' state: listed, ended, failing (logged with backoff and a count: an API
/// server outage fails every watch at each retry; once more when it recovers).
#[derive(Default)]
struct WatchHealth {
    failing: [RepeatLog; 4],
    synced: [bool; 4],
    ended: [bool; 4],
}

/// The watches' resources, by index.
const WATCHED: [&str; 4] = ["Service", "EndpointSlice", "Node", "ServiceCIDR"];

impl WatchHealth {
    /// Whether the watches the source waits for have listed.
    fn all_synced(&self) -> bool {
        self.synced[..GATING].iter().all(|s| *s)
    }

    /// What watch `i` yielded: its change, or `None` (an error logged and counted, or the
    /// watch ended).
    fn outcome(
        &mut self,
        i: usize,
        ev: Option<Result<Change, watcher::Error>>,
        stats: &SourceStats,
    ) -> Option<Change> {
        match ev {
            Some(Ok(c)) => {
                if let Some(errors) = self.failing[i].recovered() {
                    tracing::info!(watch = WATCHED[i], errors, "watch recovered");
                }
                Some(c)
            }
            Some(Err(e)) if i == 3 && not_served(&e) => {
                tracing::warn!(
                    watch = WATCHED[i],
                    "the API server does not serve networking.k8s.io/v1 ServiceCIDRs (before v1.33, or the feature is off): only [kubernetes] service_cidrs apply"
                );
                self.ended[i] = true;
                None
            }
            Some(Err(e)) => {
                stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                if let Some(errors) = self.failing[i].failed(Instant::now()) {
                    tracing::warn!(watch = WATCHED[i], errors, error = %e, "watch failing, retrying with backoff");
                }
                None
            }
            None => {
                self.ended[i] = true;
                None
            }
        }
    }
}

impl Change {
    fn is_init_done(&self) -> bool {
        match self {
            Change::Service(e) => matches!(**e, Event::InitDone),
            Change::Slice(e) => matches!(**e, Event::InitDone),
            Change::Node(e) => matches!(**e, Event::InitDone),
            Change::Cidr(e) => matches!(**e, Event::InitDone),
        }
    }
}

/// What the watches built: the model, this node, the lists being relisted.
struct Watched<'c> {
    cfg: &'c Config,
    node_name: String,
    model: IncrementalModel,
    node: Option<Node>,
    svc_list: Relist<Service>,
    slice_list: Relist<EndpointSlice>,
    node_list: Relist<Node>,
    cidr_list: Relist<ServiceCIDR>,
    /// Problems already logged.
    logged: HashSet<Problem>,
}

impl<'c> Watched<'c> {
    fn new(cfg: &'c Config) -> Watched<'c> {
        let node_name = node_name(cfg);
        let mut model = IncrementalModel::new(cfg, NodeInfo::resolve(cfg, &node_name, None));
        // Network programming latency counts from changes made after the source started.
        model.record_trigger_times_since(SystemTime::now());
        Watched {
            cfg,
            node_name,
            model,
            node: None,
            svc_list: Relist(None),
            slice_list: Relist(None),
            node_list: Relist(None),
            cidr_list: Relist(None),
            logged: HashSet::new(),
        }
    }

    /// Builds the model (the periodic full resync when nothing changed: every Service
    /// translated again, those that come out the same cost nothing further) and hands it
    /// over.
    fn hand_over(&mut self, stats: &SourceStats, on_model: &mut impl FnMut(K8sModel)) {
        let t0 = Instant::now();
        let model = &mut self.model;
        if !model.is_dirty() {
            model.mark_all_dirty();
        }
        let mut m = model.model().clone();
        m.trigger_times = model.take_trigger_times();
        stats.changes(model);
        let (services, slices) = (model.services(), model.endpoint_slices());
        publish_stats(stats, &m, services, slices, t0.elapsed());
        log_problems(&m.problems, &mut self.logged);
        on_model(m);
        stats.handed_over();
    }

    /// Applies one watch event to the model.
    fn apply(&mut self, change: Change) {
        let model = &mut self.model;
        match change {
            Change::Service(e) => match *e {
                Event::Apply(s) => model.apply_service(Arc::new(s)),
                Event::Delete(s) => {
                    let (ns, name) = ns_name(&s.metadata);
                    model.delete_service(ns, name);
                }
                e => {
                    if let Some(all) = self.svc_list.on(e) {
                        model.replace_services(all.into_iter().map(Arc::new));
                    }
                }
            },
            Change::Slice(e) => match *e {
                Event::Apply(s) => model.apply_slice(Arc::new(s)),
                Event::Delete(s) => {
                    let (ns, name) = ns_name(&s.metadata);
                    model.delete_slice(ns, name);
                }
                e => {
                    if let Some(all) = self.slice_list.on(e) {
                        model.replace_slices(all.into_iter().map(Arc::new));
                    }
                }
            },
            Change::Node(e) => self.apply_node(*e),
            Change::Cidr(e) => match *e {
                Event::Apply(c) => model.apply_service_cidr(Arc::new(c)),
                Event::Delete(c) => {
                    model.delete_service_cidr(c.metadata.name.as_deref().unwrap_or(""));
                }
                e => {
                    if let Some(all) = self.cidr_list.on(e) {
                        model.replace_service_cidrs(all.into_iter().map(Arc::new));
                    }
                }
            },
        }
    }

    /// This node changed: the model's view of it follows.
    fn apply_node(&mut self, e: Event<Node>) {
        match e {
            Event::Apply(n) => self.node = Some(n),
            Event::Delete(_) => self.node = None,
            e => {
                if let Some(all) = self.node_list.on(e) {
                    let name = self.node_name.as_str();
                    self.node = all
                        .into_iter()
                        .find(|n| n.metadata.name.as_deref() == Some(name));
                }
            }
        }
        let node = NodeInfo::resolve(self.cfg, &self.node_name, self.node.as_ref());
        self.model.set_node(node);
    }
}

fn publish_stats(
    stats: &SourceStats,
    model: &K8sModel,
    services: usize,
    slices: usize,
    took: Duration,
) {
    let n = |x: usize| u64::try_from(x).unwrap_or(u64::MAX);
    let backends: usize = model.specs.iter().map(|s| s.backends.len()).sum();
    let now_ms = unix_ms(SystemTime::now());
    stats.services.store(n(services), Ordering::Relaxed);
    stats.endpoint_slices.store(n(slices), Ordering::Relaxed);
    stats.specs.store(n(model.specs.len()), Ordering::Relaxed);
    stats.backends.store(n(backends), Ordering::Relaxed);
    stats
        .problems
        .store(n(model.problems.len()), Ordering::Relaxed);
    stats.last_sync_duration_us.store(
        u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    stats.last_sync_unix_ms.store(now_ms, Ordering::Relaxed);
    stats.syncs.fetch_add(1, Ordering::Relaxed);
}

fn log_problems(problems: &[Problem], logged: &mut HashSet<Problem>) {
    let now: HashSet<Problem> = problems.iter().cloned().collect();
    for p in problems.iter().filter(|p| !logged.contains(*p)) {
        p.log();
    }
    *logged = now;
}
