//! The daemon's side of the admin API: what `/v1/*`, `/metrics` and `/healthz` read. Every
//! answer is computed from shared state on the admin server's threads; nothing here blocks the
//! fastpath (snapshots are loaded, counters read relaxed, the flow table scanned lock-free).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use fastpath::snapshot::Snapshot;
use fastpath::steer::SteerCounters;
use fastpath::worker::WorkerStats;
use flowtable::FlowTable;
use slowpath::admin::{
    AdminSource, FlowTableView, FlowViewJson, GovernanceView, HealthView, ServiceView, StatsView,
    SteerView, SyncView, WorkerView,
};

/// Sync bookkeeping the main loop updates and the admin API reads.
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Unix time of the last completed sync, in milliseconds (0: none yet).
    pub last_unix_ms: AtomicU64,
    /// Duration of the last snapshot build and publish, in microseconds.
    pub last_duration_us: AtomicU64,
    /// Snapshots published.
    pub syncs: AtomicU64,
    /// Config reloads accepted.
    pub reloads_ok: AtomicU64,
    /// Config reloads rejected (the old config kept running).
    pub reloads_failed: AtomicU64,
}

impl SyncStats {
    /// Records a completed sync that took `took`.
    pub fn synced(&self, took: Duration) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_unix_ms
            .store(now.as_millis() as u64, Ordering::Relaxed);
        self.last_duration_us
            .store(took.as_micros() as u64, Ordering::Relaxed);
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }
}

/// The governance switches the admin API flips and the main loop applies (in the next
/// snapshot, within one tick), plus what the endpoint-removal policy did.
#[derive(Debug, Default)]
pub struct Control {
    /// Every new flow refused.
    pub frozen: AtomicBool,
    /// Services refused new flows, by name (a Kubernetes `namespace/name` covers all of
    /// the Service's ports and families).
    pub frozen_services: Mutex<BTreeSet<String>>,
    /// `/healthz` answers 503 (upstream load balancers move away); traffic still flows.
    pub draining: AtomicBool,
    /// Set when a switch changed; the main loop rebuilds the snapshot.
    pub changed: AtomicBool,
    /// UDP flows removed so they are scheduled again.
    pub flows_resteered: AtomicU64,
    /// TCP/SCTP flows of removed backends ended.
    pub flows_ended: AtomicU64,
}

impl Control {
    /// Whether service `name` is frozen on its own: listed by its name, or (Kubernetes) by
    /// the `namespace/name` before its `:port`.
    pub fn service_frozen(&self, name: &str) -> bool {
        let set = self
            .frozen_services
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        set.iter().any(|f| names(f, name))
    }
}

/// Whether `filter` names service `name`: the name itself, or (Kubernetes) the
/// `namespace/name` before its `:port`.
fn names(filter: &str, name: &str) -> bool {
    name == filter || name.split_once(':').is_some_and(|(svc, _)| svc == filter)
}

/// Everything the admin API shows about a running daemon.
pub struct DaemonState {
    /// The published snapshot.
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// The flow table.
    pub flows: Arc<FlowTable>,
    /// Per-worker counters.
    pub workers: Vec<Arc<WorkerStats>>,
    /// Steering counters per interface, refreshed by the main loop.
    pub steer: Mutex<Vec<(String, SteerCounters)>>,
    /// Sync bookkeeping.
    pub sync: SyncStats,
    /// False once a worker thread has ended.
    pub fastpath_running: AtomicBool,
    /// `/healthz` fails when the last sync is older than this (kube-proxy: 2 × sync period).
    pub healthz_timeout: Duration,
    /// Freeze and drain.
    pub control: Arc<Control>,
}

impl AdminSource for DaemonState {
    fn services(&self) -> Vec<ServiceView> {
        ServiceView::from_snapshot(&self.snapshot.load(), &*self.flows)
    }

    fn flows(&self, limit: usize) -> Vec<FlowViewJson> {
        FlowViewJson::collect(&self.flows, &self.snapshot.load(), limit, Instant::now())
    }

    fn stats(&self) -> StatsView {
        let steer = self.steer.lock().map(|s| s.clone()).unwrap_or_default();
        let last = self.sync.last_unix_ms.load(Ordering::Relaxed);
        StatsView {
            generation: self.snapshot.load().generation,
            workers: self
                .workers
                .iter()
                .enumerate()
                .map(|(i, w)| WorkerView::from_counters(i, &w.read()))
                .collect(),
            flowtable: FlowTableView::from_table(&self.flows),
            steering: steer
                .iter()
                .map(|(name, c)| SteerView::from_counters(name, c))
                .collect(),
            sync: SyncView {
                last_sync_unix_s: (last != 0).then(|| last as f64 / 1000.0),
                last_duration_s: self.sync.last_duration_us.load(Ordering::Relaxed) as f64 / 1e6,
                syncs: self.sync.syncs.load(Ordering::Relaxed),
                reloads_ok: self.sync.reloads_ok.load(Ordering::Relaxed),
                reloads_failed: self.sync.reloads_failed.load(Ordering::Relaxed),
            },
            governance: GovernanceView {
                frozen: self.control.frozen.load(Ordering::Relaxed),
                frozen_services: self
                    .control
                    .frozen_services
                    .lock()
                    .map(|s| s.iter().cloned().collect())
                    .unwrap_or_default(),
                draining: self.control.draining.load(Ordering::Relaxed),
                flows_resteered: self.control.flows_resteered.load(Ordering::Relaxed),
                flows_ended: self.control.flows_ended.load(Ordering::Relaxed),
            },
        }
    }

    fn health(&self) -> HealthView {
        let last = self.sync.last_unix_ms.load(Ordering::Relaxed);
        HealthView {
            last_updated: (last != 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(last)),
            oldest_pending: None,
            timeout: self.healthz_timeout,
            fastpath_running: self.fastpath_running.load(Ordering::Relaxed),
            // A draining node answers 503 on /healthz (like a node being deleted) so
            // upstream load balancers stop sending; /livez ignores it.
            node_eligible: !self.control.draining.load(Ordering::Relaxed),
        }
    }

    fn control(&self, action: &str, service: Option<&str>) -> Result<(), String> {
        let c = &self.control;
        match (action, service) {
            ("freeze", None) => c.frozen.store(true, Ordering::Relaxed),
            ("unfreeze", None) => c.frozen.store(false, Ordering::Relaxed),
            ("freeze" | "unfreeze", Some(name)) => {
                let snap = self.snapshot.load();
                let known = snap.services.iter().any(|s| names(name, &s.name));
                let mut set = c.frozen_services.lock().unwrap_or_else(|e| e.into_inner());
                if action == "freeze" {
                    if !known {
                        return Err(format!("no service named {name:?}"));
                    }
                    set.insert(name.to_owned());
                } else if !set.remove(name) {
                    return Err(format!("service {name:?} is not frozen"));
                }
            }
            ("drain", None) => c.draining.store(true, Ordering::Relaxed),
            ("undrain", None) => c.draining.store(false, Ordering::Relaxed),
            (a, Some(_)) => return Err(format!("{a} applies to the whole node, not a service")),
            (a, None) => return Err(format!("unknown action {a}")),
        }
        c.changed.store(true, Ordering::Relaxed);
        Ok(())
    }
}
