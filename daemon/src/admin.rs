//! The daemon's side of the admin API: what `/v1/*`, `/metrics`, `/healthz` read, and where
//! control commands go. Reads come from shared state (snapshots loaded, counters read
//! relaxed, the flow table scanned lock-free), on the admin server's blocking pool; nothing
//! here blocks the fastpath. Commands are sent to the driver's loop, which hands them to the
//! controller and answers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use fastpath::snapshot::Snapshot;
use fastpath::steer::SteerCounters;
use fastpath::worker::WorkerStats;
use fastpath::xsk::stats::StatsReader;
use flowtable::FlowTable;
use slowpath::admin::histogram::{Histogram, NETWORK_PROGRAMMING_BUCKETS, SYNC_DURATION_BUCKETS};
use slowpath::admin::{
    AdminSource, BgpView, ControlAction, ControlFuture, FlowFilter, FlowTableView, FlowViewJson,
    FlowsPage, GovernanceView, HealthView, RefusedStats, RefusedView, ServiceView, SocketView,
    StatsView, SteerView, SyncView, WorkerView,
};
use tokio::sync::{mpsc, oneshot};

use crate::controller::{Command, Status, refused};

/// Sync bookkeeping the driver updates and the admin API reads.
#[derive(Debug)]
pub struct SyncStats {
    /// Unix time of the last completed sync, in milliseconds (0: none yet).
    pub last_unix_ms: AtomicU64,
    /// Duration of the last snapshot build and publish, in microseconds.
    pub last_duration_us: AtomicU64,
    /// Snapshots published.
    pub syncs: AtomicU64,
    /// Every publish's duration (kube-proxy's `sync_proxy_rules_duration_seconds`).
    pub duration: Histogram,
    /// Network programming latency (kube-proxy's `network_programming_duration_seconds`).
    pub network_programming: Histogram,
}

impl Default for SyncStats {
    fn default() -> SyncStats {
        SyncStats {
            last_unix_ms: AtomicU64::new(0),
            last_duration_us: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            duration: Histogram::new(&SYNC_DURATION_BUCKETS),
            network_programming: Histogram::new(&NETWORK_PROGRAMMING_BUCKETS),
        }
    }
}

impl SyncStats {
    /// Records a completed sync that took `took` (`None`: a periodic pass with nothing to
    /// publish, which keeps the last duration).
    pub fn synced(&self, took: Option<Duration>) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_unix_ms
            .store(now.as_millis() as u64, Ordering::Relaxed);
        if let Some(took) = took {
            self.last_duration_us
                .store(took.as_micros() as u64, Ordering::Relaxed);
            self.duration.observe(took.as_secs_f64());
            self.syncs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records the network programming latency of the changes triggered at `triggers`,
    /// live at `now` (a trigger time ahead of this node's clock counts as 0).
    pub fn programmed(&self, triggers: &[SystemTime], now: SystemTime) {
        for t in triggers {
            let latency = now.duration_since(*t).unwrap_or_default();
            self.network_programming.observe(latency.as_secs_f64());
        }
    }
}

/// The controller's status as the admin API shows it: its [`Status`] with the pending
/// change's age turned into wall-clock time.
#[derive(Clone, Debug, Default)]
pub struct StatusView {
    /// The controller's status.
    pub status: Status,
    /// When the oldest unpublished change arrived.
    pub pending_since: Option<SystemTime>,
}

impl StatusView {
    /// `status` as of `now` (its `Instant`s become `SystemTime`s against `wall_now`).
    pub fn new(status: Status, now: Instant, wall_now: SystemTime) -> StatusView {
        let pending_since = status
            .pending_since
            .map(|t| wall_now - now.saturating_duration_since(t));
        StatusView {
            status,
            pending_since,
        }
    }
}

/// `/v1/services`' `refused`: the refusals `status` lists.
pub fn refused_views(status: &Status) -> Vec<RefusedView> {
    status
        .refused
        .iter()
        .map(|r| RefusedView {
            object: r.object.clone(),
            kind: r.kind.to_owned(),
            reason: r.reason.clone(),
        })
        .collect()
}

/// `/v1/stats`' `refused` (and the `xvs_refused` metrics): every kind, zero included.
pub fn refused_stats(status: &Status) -> RefusedStats {
    let mut out = RefusedStats::default();
    for kind in refused::kinds() {
        out.current.insert(kind.to_owned(), 0);
        let total = status.refused_total.get(kind).copied().unwrap_or(0);
        out.total.insert(kind.to_owned(), total);
    }
    for r in status.refused.iter() {
        *out.current.entry(r.kind.to_owned()).or_default() += 1;
    }
    // Hand-over requests and messages refused (`crate::takeover`): counted, never current.
    out.current
        .insert(crate::takeover::REFUSED_KIND.to_owned(), 0);
    out.total.insert(
        crate::takeover::REFUSED_KIND.to_owned(),
        crate::takeover::REFUSED.load(std::sync::atomic::Ordering::Relaxed),
    );
    out
}

/// What `/healthz` decides from: the controller's status and last sync, the Kubernetes
/// source's queue (`k8s`), as of `status`.
pub fn health_view(
    status: &StatusView,
    last_sync_unix_ms: u64,
    k8s: Option<&slowpath::k8s::SourceStats>,
    timeout: Duration,
    fastpath_running: bool,
) -> HealthView {
    let view = HealthView {
        last_updated: (last_sync_unix_ms != 0)
            .then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(last_sync_unix_ms)),
        oldest_pending: status.pending_since,
        timeout,
        fastpath_running,
        // A draining node answers 503 on /healthz (like a node being deleted) so
        // upstream load balancers stop sending; /livez ignores it.
        node_eligible: !status.status.draining,
        not_ready: status.status.not_ready.clone(),
    };
    match k8s {
        Some(k) => view.with_source(k),
        None => view,
    }
}

/// A command from the admin API with the channel its answer goes back on.
pub type CommandMsg = (Command, oneshot::Sender<Result<(), String>>);

/// Everything the admin API shows about a running daemon.
pub struct DaemonState {
    /// The published snapshot.
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// The flow table.
    pub flows: Arc<FlowTable>,
    /// Per-worker counters.
    pub workers: Vec<Arc<WorkerStats>>,
    /// What each worker serves, by index: its queue and interfaces.
    pub serving: Vec<(u32, Vec<String>)>,
    /// The Kubernetes source's counters, with that source.
    pub k8s: Option<Arc<slowpath::k8s::SourceStats>>,
    /// Steering counters per interface, refreshed by the driver once a second.
    pub steer: Mutex<Vec<(String, SteerCounters)>>,
    /// The kernel's statistics of every AF_XDP socket, read at each request; emptied by the
    /// driver when the workers stop.
    pub sockets: Mutex<Vec<StatsReader>>,
    /// Sync bookkeeping.
    pub sync: Arc<SyncStats>,
    /// False once a worker thread has ended.
    pub fastpath_running: AtomicBool,
    /// `/healthz` fails when the last sync is older than this (kube-proxy: 2 × sync period).
    pub healthz_timeout: Duration,
    /// The controller's status, as last emitted.
    pub status: Arc<ArcSwap<StatusView>>,
    /// Where commands go.
    pub commands: mpsc::UnboundedSender<CommandMsg>,
    /// Flow sync and the workers' flow logs, when `[sync]` is on.
    pub peer_sync: Option<(
        slowpath::flowsync::FlowSync,
        Vec<Arc<fastpath::flowlog::FlowLog>>,
    )>,
    /// The BGP speaker's counters, when `[bgp]` is on.
    pub bgp: Option<Arc<slowpath::bgp::BgpStats>>,
    /// Per-service and per-backend traffic, sampled by the driver every
    /// [`slowpath::traffic::SAMPLE_PERIOD`].
    pub traffic: Mutex<slowpath::traffic::TrafficMeter>,
    /// The health checker's judgements (`health` of `/v1/services`).
    pub health: Option<slowpath::health::HealthReader>,
    /// What the start-up refused of the state files (`crate::state::Refusals`).
    pub state_refused: slowpath::admin::StateView,
}

impl DaemonState {
    /// Every worker's sockets: the rings as the worker published them, the kernel's
    /// statistics as they are now.
    fn sockets(&self) -> Vec<SocketView> {
        let readers = self.sockets.lock();
        let readers = readers.as_deref().map_or(&[][..], |r| r.as_slice());
        let mut out = Vec::new();
        for (i, w) in self.workers.iter().enumerate() {
            let queue = self.serving.get(i).map_or(i as u32, |s| s.0);
            for ring in w.rings.iter().flatten() {
                let r = ring.read();
                let k = readers
                    .iter()
                    .find(|x| x.interface == ring.interface && x.queue == queue)
                    .and_then(|x| x.read().ok())
                    .unwrap_or_default();
                out.push(SocketView {
                    interface: ring.interface.clone(),
                    queue,
                    rx_dropped: k.rx_dropped,
                    rx_invalid_descs: k.rx_invalid_descs,
                    tx_invalid_descs: k.tx_invalid_descs,
                    rx_ring_full: k.rx_ring_full,
                    rx_fill_ring_empty_descs: k.rx_fill_ring_empty_descs,
                    tx_ring_empty_descs: k.tx_ring_empty_descs,
                    filled: r.filled,
                    received: r.received,
                    transmitted: r.transmitted,
                    completed: r.completed,
                });
            }
        }
        out
    }
}

/// The controller's command for an admin action; `Err` when it does not apply.
pub fn command(action: ControlAction, service: Option<String>) -> Result<Command, String> {
    Ok(match (action, service) {
        (ControlAction::Freeze, s) => Command::Freeze(s),
        (ControlAction::Unfreeze, s) => Command::Unfreeze(s),
        (ControlAction::Drain, None) => Command::Drain,
        (ControlAction::Undrain, None) => Command::Undrain,
        (a, Some(_)) => {
            return Err(format!(
                "{} applies to the whole node, not a service",
                a.name()
            ));
        }
    })
}

impl AdminSource for DaemonState {
    fn services(&self) -> Vec<ServiceView> {
        let snap = self.snapshot.load();
        let mut views = match self.traffic.lock() {
            Ok(m) => ServiceView::from_snapshot_with(&snap, &*self.flows, Some(&m)),
            Err(_) => ServiceView::from_snapshot(&snap, &*self.flows),
        };
        let judged = self
            .health
            .as_ref()
            .map(|h| h.judgements())
            .unwrap_or_default();
        if !judged.plan.is_empty() {
            for v in &mut views {
                v.set_health(&judged);
            }
        }
        views
    }

    fn refused(&self) -> Vec<RefusedView> {
        refused_views(&self.status.load().status)
    }

    fn flows(&self, filter: &FlowFilter, limit: usize) -> FlowsPage {
        FlowViewJson::collect(
            &self.flows,
            &self.snapshot.load(),
            filter,
            limit,
            Instant::now(),
        )
    }

    fn stats(&self) -> StatsView {
        let steer = self.steer.lock().map(|s| s.clone()).unwrap_or_default();
        let last = self.sync.last_unix_ms.load(Ordering::Relaxed);
        let st = self.status.load();
        let s = &st.status;
        let k8s = |field: fn(&slowpath::k8s::SourceStats) -> &AtomicU64| {
            self.k8s
                .as_deref()
                .map_or(0, |k| field(k).load(Ordering::Relaxed))
        };
        StatsView {
            generation: self.snapshot.load().generation,
            workers: self
                .workers
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let view = WorkerView::from_counters(i, &w.read());
                    match self.serving.get(i) {
                        Some((queue, interfaces)) => view.serving(*queue, interfaces),
                        None => view,
                    }
                })
                .collect(),
            flowtable: FlowTableView::from_table(&self.flows),
            steering: steer
                .iter()
                .map(|(name, c)| SteerView::from_counters(name, c))
                .collect(),
            sockets: self.sockets(),
            sync: SyncView {
                last_sync_unix_s: (last != 0).then(|| last as f64 / 1000.0),
                last_duration_s: self.sync.last_duration_us.load(Ordering::Relaxed) as f64 / 1e6,
                syncs: self.sync.syncs.load(Ordering::Relaxed),
                reloads_ok: s.reloads_ok,
                reloads_failed: s.reloads_failed,
                duration: self.sync.duration.view(),
                network_programming: self.sync.network_programming.view(),
                service_changes_pending: k8s(|k| &k.service_changes_pending),
                endpoint_changes_pending: k8s(|k| &k.endpoint_changes_pending),
                service_changes: k8s(|k| &k.service_changes),
                endpoint_changes: k8s(|k| &k.endpoint_changes),
            },
            governance: GovernanceView {
                frozen: s.frozen,
                frozen_services: s.frozen_services.clone(),
                draining: s.draining,
                flows_resteered: s.flows_resteered,
                flows_ended: s.flows_ended,
            },
            peer_sync: self.peer_sync.as_ref().map(|(fs, logs)| fs.view(logs)),
            bgp: self.bgp.as_deref().map(BgpView::from_stats),
            refused: refused_stats(s),
            state: self.state_refused.clone(),
        }
    }

    fn health(&self) -> HealthView {
        health_view(
            &self.status.load(),
            self.sync.last_unix_ms.load(Ordering::Relaxed),
            self.k8s.as_deref(),
            self.healthz_timeout,
            self.fastpath_running.load(Ordering::Relaxed),
        )
    }

    fn control(&self, action: ControlAction, service: Option<String>) -> ControlFuture {
        let commands = self.commands.clone();
        Box::pin(async move {
            let cmd = command(action, service)?;
            let (tx, rx) = oneshot::channel();
            commands
                .send((cmd, tx))
                .map_err(|_| "xvs is stopping".to_owned())?;
            rx.await.map_err(|_| "xvs is stopping".to_owned())?
        })
    }
}

#[cfg(test)]
mod tests {
    use slowpath::admin::evaluate;
    use slowpath::k8s::SourceStats;

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(60);

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    fn ms(t: SystemTime) -> u64 {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }

    /// A change the Kubernetes source received and has not handed to the controller (its
    /// loop stuck) turns `/healthz` 503 once the health timeout has passed, though the
    /// controller itself syncs every period and has nothing pending; once the source hands a
    /// model over again, 200 (fake clock: every time is given).
    #[test]
    fn a_change_stuck_in_the_source_turns_healthz_503_until_a_sync() {
        let status = StatusView::default();
        let source = SourceStats::default();
        // The source handed its last model at 0.
        source.last_sync_unix_ms.store(ms(at(0)), Ordering::Relaxed);
        let view = |source: &SourceStats, last_sync: SystemTime| {
            health_view(&status, ms(last_sync), Some(source), TIMEOUT, true)
        };
        assert_eq!(evaluate(&view(&source, at(0)), at(1), true), Ok(()));
        // A change arrives at 10 and stays in the source, while the controller's periodic
        // syncs keep its own last sync fresh.
        source.queued(at(10));
        source.queued(at(20)); // not the oldest
        assert_eq!(source.pending_since(), Some(at(10)));
        let v = view(&source, at(50));
        assert_eq!(v.oldest_pending, Some(at(10)));
        assert_eq!(v.last_updated, Some(at(0)), "the older of the two stages");
        assert_eq!(evaluate(&v, at(59), true), Ok(()));
        assert!(evaluate(&v, at(60), true).is_err());
        assert!(evaluate(&v, at(60), false).is_err(), "livez too");
        // The rule on a waiting change holds on its own too (kube-proxy's): with the
        // source's last model fresh, the change waiting since 10 fails it at 70.
        source
            .last_sync_unix_ms
            .store(ms(at(65)), Ordering::Relaxed);
        let v = view(&source, at(65));
        assert_eq!(evaluate(&v, at(69), true), Ok(()));
        let e = evaluate(&v, at(70), true).unwrap_err();
        assert!(e.contains("a change has waited 60.0s"), "{e}");
        // A model carries it: 200 again.
        source
            .last_sync_unix_ms
            .store(ms(at(71)), Ordering::Relaxed);
        source.handed_over();
        assert_eq!(evaluate(&view(&source, at(71)), at(72), true), Ok(()));
        // The static source has no such stage.
        source.queued(at(80));
        let static_view = health_view(&status, ms(at(150)), None, TIMEOUT, true);
        assert_eq!(evaluate(&static_view, at(150), true), Ok(()));
        assert!(evaluate(&view(&source, at(150)), at(150), true).is_err());
    }

    /// A source that hands over no model at all (its loop stuck: it hands one every
    /// `sync_period` otherwise) is a stale sync, whatever the controller's own syncs say.
    #[test]
    fn a_silent_source_is_a_stale_sync() {
        let status = StatusView::default();
        let source = SourceStats::default();
        source.last_sync_unix_ms.store(ms(at(0)), Ordering::Relaxed);
        let v = health_view(&status, ms(at(100)), Some(&source), TIMEOUT, true);
        assert_eq!(v.last_updated, Some(at(0)));
        let e = evaluate(&v, at(100), true).unwrap_err();
        assert!(e.contains("last sync 100.0s ago"), "{e}");
        // A change the controller has waited on counts as well (the driver never
        // acknowledged its publish, say).
        let pending = StatusView {
            pending_since: Some(at(30)),
            ..StatusView::default()
        };
        let v = health_view(&pending, ms(at(95)), None, TIMEOUT, true);
        assert_eq!(v.oldest_pending, Some(at(30)));
        assert!(evaluate(&v, at(95), true).is_err());
    }

    #[test]
    fn refusals_by_kind_list_every_kind() {
        let status = Status {
            refused: Arc::new(vec![
                crate::controller::Refusal {
                    object: "Service ns/a".to_owned(),
                    kind: "service_refused",
                    reason: "x".to_owned(),
                },
                crate::controller::Refusal {
                    object: "service ns/b:http".to_owned(),
                    kind: refused::KIND_SNAPSHOT_BUILD,
                    reason: "y".to_owned(),
                },
            ]),
            refused_total: [("service_refused", 3)].into(),
            ..Status::default()
        };
        let r = refused_stats(&status);
        assert_eq!(r.current["service_refused"], 1);
        assert_eq!(r.current["snapshot_build"], 1);
        assert_eq!(r.current["endpoint_special"], 0);
        assert_eq!(r.total["service_refused"], 3);
        assert_eq!(r.total["snapshot_build"], 0);
        // Every kind, and the takeover's refusals (counted only).
        assert_eq!(r.current.len(), 12);
        assert_eq!(r.current["takeover"], 0);
        assert!(r.total.contains_key("takeover"));
        let v = refused_views(&status);
        assert_eq!(v[1].object, "service ns/b:http");
        assert_eq!(v[1].kind, "snapshot_build");
    }

    #[test]
    fn publishes_and_trigger_times_are_observed() {
        let s = SyncStats::default();
        s.synced(Some(Duration::from_millis(5)));
        // A periodic pass with nothing to publish is no sync duration.
        s.synced(None);
        let d = s.duration.view();
        assert_eq!(d.count, 1);
        assert_eq!(d.buckets[2], (0.004, 0));
        assert_eq!(d.buckets[3], (0.008, 1));
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        // Two seconds ago, and one ahead of this node's clock (counted as 0).
        s.programmed(
            &[now - Duration::from_secs(2), now + Duration::from_secs(1)],
            now,
        );
        let p = s.network_programming.view();
        assert_eq!(p.count, 2);
        assert_eq!(p.buckets[0], (0.0, 1));
        assert_eq!(p.buckets[3], (1.0, 1));
        assert_eq!(p.buckets[4], (2.0, 2));
        assert_eq!(p.sum, 2.0);
    }
}
