//! The daemon's side of the admin API: what `/v1/*`, `/metrics` and `/healthz` read. Every
//! answer is computed from shared state on the admin server's threads; nothing here blocks the
//! fastpath (snapshots are loaded, counters read relaxed, the flow table scanned lock-free).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use fastpath::snapshot::Snapshot;
use fastpath::steer::SteerCounters;
use fastpath::worker::WorkerStats;
use flowtable::FlowTable;
use slowpath::admin::{
    AdminSource, FlowTableView, FlowViewJson, HealthView, ServiceView, StatsView, SteerView,
    SyncView, WorkerView,
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
        }
    }

    fn health(&self) -> HealthView {
        let last = self.sync.last_unix_ms.load(Ordering::Relaxed);
        HealthView {
            last_updated: (last != 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(last)),
            oldest_pending: None,
            timeout: self.healthz_timeout,
            fastpath_running: self.fastpath_running.load(Ordering::Relaxed),
            node_eligible: true,
        }
    }
}
