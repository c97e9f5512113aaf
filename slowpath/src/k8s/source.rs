//! The watcher side: one thread with a current-thread tokio runtime running three kube-rs
//! watchers (Services, EndpointSlices, this Node) into reflector stores, and a loop that
//! turns their changes into models.
//!
//! Contract:
//! - Nothing is published until every watcher has completed its initial list.
//! - After a change, the next model is built no sooner than `min_sync_period` after the
//!   previous one (changes in between are batched); with no change, a full rebuild is
//!   published every `sync_period`.
//! - API server outages publish nothing: the stores keep the last listed state, the
//!   watchers retry with kube's default backoff, and a 410 Gone makes them relist (the store
//!   is swapped only once the relist is complete).
//! - Problems are logged to stderr the first time they appear, not at every sync.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use config::{Config, Kubernetes};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

use super::translate::{NodeInfo, build_model_refs};
use super::{K8sError, K8sModel, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, Problem};

/// Counters of the source, readable from any thread.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Models published.
    pub syncs: AtomicU64,
    /// Wall-clock time of the last publish, milliseconds since the Unix epoch (0: never).
    pub last_sync_unix_ms: AtomicU64,
    /// How long the last translation took, microseconds.
    pub last_sync_duration_us: AtomicU64,
    /// Services in the store at the last sync.
    pub services: AtomicU64,
    /// EndpointSlices in the store at the last sync.
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
}

/// The running source. Dropping it stops the thread (and waits for it).
#[derive(Debug)]
pub struct SourceHandle {
    stats: Arc<SourceStats>,
    stop: tokio::sync::watch::Sender<bool>,
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
        let _ = self.stop.send(true);
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
/// of its own. `on_model` is called on that thread with every model. Returns once the client
/// is built (the kubeconfig or in-cluster configuration was readable); connection problems
/// after that are retried, never returned.
pub fn spawn(
    cfg: &Config,
    on_model: impl FnMut(K8sModel) + Send + 'static,
) -> Result<SourceHandle, K8sError> {
    let k8s = cfg.kubernetes.clone().ok_or(K8sError::NotConfigured)?;
    let cfg = cfg.clone();
    let stats = Arc::new(SourceStats::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), K8sError>>();
    let thread_stats = stats.clone();
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
                let client = match client(&k8s).await {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                run(client, &cfg, thread_stats, stop_rx, on_model).await;
            });
        })?;
    let started = ready_rx.recv();
    let handle = SourceHandle {
        stats,
        stop: stop_tx,
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

async fn client(k: &Kubernetes) -> Result<Client, K8sError> {
    let config = match &k.kubeconfig {
        Some(path) => {
            let err = |source| K8sError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
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
pub(crate) fn node_name(cfg: &Config) -> String {
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

type Events = BoxStream<'static, Result<Event<()>, watcher::Error>>;

/// A watcher feeding a store; its events lose their objects (the loop only needs to know
/// that something changed, the store has the state).
fn watch<K>(api: Api<K>, wc: watcher::Config) -> (Store<K>, Events)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = watcher::watcher(api, wc)
        .default_backoff()
        .reflect(writer)
        .map(|r| r.map(strip));
    (store, boxed(stream))
}

fn strip<K>(e: Event<K>) -> Event<()> {
    match e {
        Event::Apply(_) => Event::Apply(()),
        Event::Delete(_) => Event::Delete(()),
        Event::Init => Event::Init,
        Event::InitApply(_) => Event::InitApply(()),
        Event::InitDone => Event::InitDone,
    }
}

fn boxed(s: impl Stream<Item = Result<Event<()>, watcher::Error>> + Send + 'static) -> Events {
    s.boxed()
}

async fn run(
    client: Client,
    cfg: &Config,
    stats: Arc<SourceStats>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut on_model: impl FnMut(K8sModel),
) {
    let Some(k8s) = cfg.kubernetes.as_ref() else {
        return;
    };
    let node_name = node_name(cfg);
    let selector = label_selector(k8s.service_proxy_name.as_deref());
    let (services, svc_events) = watch(
        Api::<Service>::all(client.clone()),
        watcher::Config::default().labels(&selector),
    );
    let (slices, slice_events) = watch(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default().labels(&selector),
    );
    let (nodes, node_events) = watch(
        Api::<Node>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={node_name}")),
    );
    let mut streams = [svc_events, slice_events, node_events];
    let names = ["Service", "EndpointSlice", "Node"];
    let mut synced = [false; 3];
    let mut ended = [false; 3];
    let min_sync = k8s.min_sync_period.0;
    let sync_period = k8s.sync_period.0.max(min_sync);
    let mut dirty = false;
    let mut last_build: Option<Instant> = None;
    let mut logged: HashSet<Problem> = HashSet::new();

    loop {
        let wake = if synced.iter().all(|s| *s) {
            Some(match last_build {
                None => Instant::now(),
                Some(t) if dirty => t + min_sync,
                Some(t) => t + sync_period,
            })
        } else {
            None
        };
        let sleep = async {
            match wake {
                Some(w) => tokio::time::sleep_until(w.into()).await,
                None => std::future::pending().await,
            }
        };
        let [s0, s1, s2] = &mut streams;
        let (i, ev) = tokio::select! {
            _ = stop.changed() => return,
            ev = s0.next(), if !ended[0] => (0, ev),
            ev = s1.next(), if !ended[1] => (1, ev),
            ev = s2.next(), if !ended[2] => (2, ev),
            () = sleep => {
                let t0 = Instant::now();
                let model = build(&services, &slices, &nodes, &node_name, cfg);
                publish_stats(&stats, &model, services.len(), slices.len(), t0.elapsed());
                log_problems(&model.problems, &mut logged);
                on_model(model);
                last_build = Some(Instant::now());
                dirty = false;
                continue;
            }
        };
        match ev {
            Some(Ok(Event::InitDone)) => {
                synced[i] = true;
                dirty = true;
                if synced.iter().all(|s| *s) {
                    stats.synced.store(true, Ordering::Relaxed);
                }
            }
            Some(Ok(Event::Apply(()) | Event::Delete(()))) => dirty = true,
            Some(Ok(Event::Init | Event::InitApply(()))) => {}
            Some(Err(e)) => {
                stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("xvs k8s: {} watch: {e} (retrying)", names[i]);
            }
            None => ended[i] = true,
        }
    }
}

fn build(
    services: &Store<Service>,
    slices: &Store<EndpointSlice>,
    nodes: &Store<Node>,
    node_name: &str,
    cfg: &Config,
) -> K8sModel {
    let services = services.state();
    let slices = slices.state();
    let nodes = nodes.state();
    let node = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node_name))
        .map(|n| &**n);
    let node = NodeInfo::resolve(cfg, node_name, node);
    let services: Vec<&Service> = services.iter().map(|s| &**s).collect();
    let slices: Vec<&EndpointSlice> = slices.iter().map(|s| &**s).collect();
    build_model_refs(&services, &slices, &node, cfg)
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
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
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
    for p in problems {
        if !logged.contains(p) {
            eprintln!("xvs k8s: ignored: {p}");
        }
    }
    *logged = now;
}
