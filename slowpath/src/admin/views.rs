//! The JSON API's types. Field names and meanings are stable: `xvs status` and outside tools
//! parse them. Add fields, never rename or repurpose one; every new field is
//! `#[serde(default)]` so an older daemon's answers still parse.
//!
//! The `from_*` helpers build views from the daemon's own types, so the daemon's
//! [`AdminSource`](super::AdminSource) is a few lines of glue.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use fastpath::pipeline::{DropReason, HoldReason, RejectReason};
use fastpath::snapshot::{ServiceEntry, Snapshot};
use fastpath::steer::SteerCounters;
use fastpath::worker::WorkerCounters;
use flowtable::{FlowState, FlowTable, FlowTableStats, FlowView};
use lb_algos::ConnCounts;
use serde::{Deserialize, Serialize};

pub use super::histogram::HistogramView;

/// `GET /v1/services`: `{"services": [ServiceView...], "refused": [RefusedView...]}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServicesResponse {
    /// Every service of the current snapshot, in snapshot order.
    pub services: Vec<ServiceView>,
    /// What the source or the snapshot builder refused, now: objects or parts of objects
    /// that are not programmed (or only as they were before), each with its reason.
    #[serde(default)]
    pub refused: Vec<RefusedView>,
}

/// One refusal in effect: an object (or part of one) a source or the snapshot builder did
/// not program as it says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedView {
    /// What: `Service ns/name`, `EndpointSlice ns/name`, or `service NAME` (a service of
    /// the snapshot the builder refused).
    pub object: String,
    /// The kind of refusal, as the `kind` label of `xvs_refused` (`service_refused`,
    /// `endpoint_special`, `snapshot_build`...).
    pub kind: String,
    /// What was wrong and what was done instead.
    pub reason: String,
}

/// Refusals by kind (`/v1/stats`' `refused`, the `xvs_refused` metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedStats {
    /// Refusals in effect now, by kind.
    pub current: BTreeMap<String, u64>,
    /// Refusals reported since the start, by kind: each counted once, when it appeared.
    pub total: BTreeMap<String, u64>,
}

/// One service of the current snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceView {
    /// Unique name (`namespace/name:port` for Kubernetes services).
    pub name: String,
    /// Every address:port/protocol that reaches this service.
    pub frontends: Vec<FrontendView>,
    /// Scheduler name as in the config (`rr`, `wrr`, `mh`...).
    pub scheduler: String,
    /// Forwarding mode: `nat` or `fullnat`.
    pub mode: String,
    /// ClientIP session affinity timeout in seconds; absent without affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_s: Option<u64>,
    /// Backends, in the source's order.
    pub backends: Vec<BackendView>,
    /// New flows refused: this service is frozen, or the whole node is.
    #[serde(default)]
    pub frozen: bool,
    /// The new-connection rate limit, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitView>,
    /// New flows refused by the rate limit (since this service's last change).
    #[serde(default)]
    pub rate_limited: u64,
    /// Traffic since the service appeared (`ipvsadm -Ln --stats`): its backends', plus what
    /// backends that left it counted.
    #[serde(default)]
    pub stats: TrafficView,
    /// Rates over the last sampling period (`ipvsadm -Ln --rate`).
    #[serde(default)]
    pub rate: RateView,
}

/// Connections, packets and bytes (IP length) of a service or backend; `in`: client to
/// backend, `out`: backend to client (`ipvsadm --stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficView {
    /// Connections (flows) created.
    pub conns: u64,
    /// Packets client → backend.
    pub in_pkts: u64,
    /// Packets backend → client.
    pub out_pkts: u64,
    /// Bytes client → backend.
    pub in_bytes: u64,
    /// Bytes backend → client.
    pub out_bytes: u64,
}

impl From<&fastpath::traffic::TrafficCounts> for TrafficView {
    fn from(c: &fastpath::traffic::TrafficCounts) -> TrafficView {
        TrafficView {
            conns: c.conns,
            in_pkts: c.in_pkts,
            out_pkts: c.out_pkts,
            in_bytes: c.in_bytes,
            out_bytes: c.out_bytes,
        }
    }
}

/// [`TrafficView`] per second, over the last sampling period
/// ([`crate::traffic::SAMPLE_PERIOD`]; `ipvsadm --rate`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RateView {
    /// Connections a second.
    pub cps: f64,
    /// Packets a second, client → backend.
    pub in_pps: f64,
    /// Packets a second, backend → client.
    pub out_pps: f64,
    /// Bytes a second, client → backend.
    pub in_bps: f64,
    /// Bytes a second, backend → client.
    pub out_bps: f64,
}

impl From<&crate::traffic::Rates> for RateView {
    fn from(r: &crate::traffic::Rates) -> RateView {
        RateView {
            cps: r.cps,
            in_pps: r.in_pps,
            out_pps: r.out_pps,
            in_bps: r.in_bps,
            out_bps: r.out_bps,
        }
    }
}

/// A service's new-connection token bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitView {
    /// New connections per second, sustained.
    pub rate: u32,
    /// Bucket size.
    pub burst: u32,
}

/// A frontend: what clients address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontendView {
    /// Virtual IP.
    pub vip: IpAddr,
    /// Port.
    pub port: u16,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
}

/// A backend of a service, with its connection counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendView {
    /// Address and port.
    pub addr: SocketAddr,
    /// Configured weight (0: draining).
    pub weight: u32,
    /// Whether it takes new flows: ready and not judged down by health checks.
    pub usable: bool,
    /// What active health checks judged, when they probe it: `unknown` (no probe has passed
    /// yet: it takes new flows, but does not make its VIP announced), `up` or `down`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// TCP connections in ESTABLISHED.
    pub active: u32,
    /// Every other live flow (handshake, closing, UDP, SCTP...).
    pub inactive: u32,
    /// Traffic since it joined its service.
    #[serde(default)]
    pub stats: TrafficView,
    /// Rates over the last sampling period.
    #[serde(default)]
    pub rate: RateView,
}

impl ServiceView {
    /// The view of one snapshot service, with connection counts from `counts` (the flow table).
    pub fn from_entry(s: &ServiceEntry, counts: &dyn ConnCounts) -> ServiceView {
        ServiceView {
            frozen: s.frozen,
            rate_limit: s.limiter.as_ref().map(|b| RateLimitView {
                rate: b.limit().rate,
                burst: b.limit().burst,
            }),
            rate_limited: s.rate_limited.load(std::sync::atomic::Ordering::Relaxed),
            name: s.name.clone(),
            frontends: s
                .frontends
                .iter()
                .map(|f| FrontendView {
                    vip: f.vip,
                    port: f.port,
                    protocol: f.protocol.name().to_owned(),
                })
                .collect(),
            scheduler: s.scheduler.kind().name().to_owned(),
            mode: s.mode.name().to_owned(),
            affinity_timeout_s: s.affinity_timeout.map(|d| d.as_secs()),
            backends: s
                .backends
                .iter()
                .map(|b| BackendView {
                    addr: b.addr,
                    weight: b.weight,
                    usable: b.usable,
                    health: None,
                    active: counts.active(b.id),
                    inactive: counts.inactive(b.id),
                    stats: TrafficView::default(),
                    rate: RateView::default(),
                })
                .collect(),
            stats: TrafficView::default(),
            rate: RateView::default(),
        }
    }

    /// Fills in each backend's health-check judgement from `judged` (the ones this
    /// service's check probes).
    pub fn set_health(&mut self, judged: &crate::health::Judged) {
        for b in &mut self.backends {
            b.health = judged.get(&self.name, b.addr).map(|j| j.name().to_owned());
        }
    }

    /// Fills in the traffic statistics of this view of `s` from `meter`.
    pub fn set_traffic(&mut self, s: &ServiceEntry, meter: &crate::traffic::TrafficMeter) {
        let t = meter.service(s);
        self.stats = TrafficView::from(&t.total.counts);
        self.rate = RateView::from(&t.total.rate);
        for (b, m) in self.backends.iter_mut().zip(&t.backends) {
            b.stats = TrafficView::from(&m.counts);
            b.rate = RateView::from(&m.rate);
        }
    }

    /// Every service of `snap`.
    pub fn from_snapshot(snap: &Snapshot, counts: &dyn ConnCounts) -> Vec<ServiceView> {
        Self::from_snapshot_with(snap, counts, None)
    }

    /// [`from_snapshot`](Self::from_snapshot), with traffic statistics from `meter`.
    pub fn from_snapshot_with(
        snap: &Snapshot,
        counts: &dyn ConnCounts,
        meter: Option<&crate::traffic::TrafficMeter>,
    ) -> Vec<ServiceView> {
        snap.services
            .iter()
            .map(|s| {
                let mut v = ServiceView::from_entry(s, counts);
                v.frozen |= snap.frozen;
                if let Some(m) = meter {
                    v.set_traffic(s, m);
                }
                v
            })
            .collect()
    }
}

/// `GET /v1/flows?limit=N[&service=NAME][&backend=IP[:PORT]][&client=IP[/PREFIX]][&vip=IP[:PORT]]`:
/// `{"limit": N, "flows": [FlowViewJson...], "total_matched": M, "truncated": M > N}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowsResponse {
    /// The limit applied (the request's, clamped to 1..=10000).
    pub limit: usize,
    /// At most `limit` flows that match the filters, in table order (not sorted).
    pub flows: Vec<FlowViewJson>,
    /// How many flows of the table matched the filters (all flows without one), counted in
    /// the same pass over the table (which workers change meanwhile: not a snapshot).
    #[serde(default)]
    pub total_matched: u64,
    /// More flows matched than `flows` holds: raise `limit` or narrow the filters.
    #[serde(default)]
    pub truncated: bool,
}

/// What an [`AdminSource`](super::AdminSource) returns for `/v1/flows`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlowsPage {
    /// At most `limit` matching flows.
    pub flows: Vec<FlowViewJson>,
    /// Every matching flow, those in `flows` included.
    pub total_matched: u64,
}

/// One flow of the flow table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowViewJson {
    /// `tcp`, `udp`, `icmp` or `sctp`.
    pub protocol: String,
    /// Client address (source of the original direction).
    pub client: SocketAddr,
    /// The VIP and port the client addressed.
    pub vip: SocketAddr,
    /// The backend the flow goes to.
    pub backend: SocketAddr,
    /// The source the backend sees: the SNAT address (fullnat) or the client (nat).
    pub snat: SocketAddr,
    /// The service's name; empty when the service is no longer in the snapshot.
    pub service: String,
    /// Protocol state, IPVS style: `ESTABLISHED`, `SYN_RECV`, `TIME_WAIT`..., `UDP`, `ICMP`,
    /// `SCTP_ESTABLISHED`...
    pub state: String,
    /// Seconds since the flow's last packet (100 ms resolution).
    pub idle_s: f64,
    /// A copy of a peer's flow, installed by flow sync (`[sync]`).
    #[serde(default)]
    pub peer: bool,
}

impl FlowViewJson {
    /// The view of one flow; `service` is the name of its service, when known.
    pub fn from_view(v: &FlowView, now: Instant, service: Option<&str>) -> FlowViewJson {
        let d = &v.data;
        FlowViewJson {
            protocol: format!("{:?}", d.proto).to_lowercase(),
            client: d.client,
            vip: d.vip,
            backend: d.backend,
            snat: d.snat,
            service: service.unwrap_or_default().to_owned(),
            state: state_name(v.state),
            idle_s: now.saturating_duration_since(v.last_seen).as_secs_f64(),
            peer: d.flags & fastpath::pipeline::FLAG_PEER != 0,
        }
    }

    /// Up to `limit` flows of `table` that match `filter`, named after `snap`'s services,
    /// and how many matched. Reads the whole table once, in bounded chunks (the count needs
    /// every flow); only the flows returned are turned into views.
    pub fn collect(
        table: &FlowTable,
        snap: &Snapshot,
        filter: &super::FlowFilter,
        limit: usize,
        now: Instant,
    ) -> FlowsPage {
        const CHUNK: usize = 4096;
        let mut page = FlowsPage {
            flows: Vec::with_capacity(limit.min(1024)),
            total_matched: 0,
        };
        let cap = table.capacity();
        let mut start = 0;
        while start < cap {
            table.scan(start, CHUNK.min(cap - start), |v| {
                let name = snap
                    .services
                    .get(v.data.service_id as usize)
                    .map(|s| s.name.as_str());
                let d = &v.data;
                if !filter.matches(d.client, d.vip, d.backend, name) {
                    return;
                }
                page.total_matched += 1;
                if page.flows.len() < limit {
                    page.flows.push(FlowViewJson::from_view(&v, now, name));
                }
            });
            start += CHUNK;
        }
        page
    }
}

/// `FlowState` as IPVS prints it (`ESTABLISHED`, `SYN_RECV`...).
fn state_name(s: FlowState) -> String {
    let screaming = |camel: String| {
        let mut out = String::with_capacity(camel.len() + 4);
        for (i, c) in camel.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        out
    };
    match s {
        FlowState::Tcp(t) => screaming(format!("{t:?}")),
        FlowState::Sctp(t) => format!("SCTP_{}", screaming(format!("{t:?}"))),
        other => screaming(format!("{other:?}")),
    }
}

/// `GET /v1/stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsView {
    /// Generation of the published snapshot.
    pub generation: u64,
    /// One entry per fastpath worker, by index.
    pub workers: Vec<WorkerView>,
    /// The flow table.
    pub flowtable: FlowTableView,
    /// The XDP steering program, per interface.
    pub steering: Vec<SteerView>,
    /// The AF_XDP sockets: the kernel's statistics and the rings' state.
    #[serde(default)]
    pub sockets: Vec<super::sockets::SocketView>,
    /// The slowpath's sync loop.
    pub sync: SyncView,
    /// Freeze, drain and what happened to the flows of removed backends.
    #[serde(default)]
    pub governance: GovernanceView,
    /// Flow sync with the peers of a tier (`[sync]`), when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_sync: Option<PeerSyncView>,
    /// VIP announcement through BIRD (`[bgp]`), when enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpView>,
    /// What the sources and the snapshot builder refused.
    #[serde(default)]
    pub refused: RefusedStats,
    /// What was refused of the state files at start-up.
    #[serde(default)]
    pub state: StateView,
}

/// What the start-up refused of the state files under `[dataplane] state_dir` (see
/// docs/operations.md, "Flows across restarts").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateView {
    /// Refusals by file and kind.
    pub refused: Vec<StateRefusal>,
}

/// Refusals of one kind in one state file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRefusal {
    /// The file's name (`flows`, `flows.export`, `affinity`, `synproxy.key`, a temporary).
    pub file: String,
    /// `file`: the file set aside; `flow`: flows or records dropped; `index`: the flow
    /// table's index rebuilt.
    pub kind: String,
    /// How many.
    pub count: u64,
}

/// Flow sync's counters (see `slowpath::flowsync`), totals since start-up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerSyncView {
    /// The start-up dumps are in (the node may be announced).
    pub ready: bool,
    /// Peers heard from within the last 3 s.
    pub peers_up: u64,
    /// Datagrams sent (one per peer).
    pub messages_sent: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Flow records sent (one per peer).
    pub flows_sent: u64,
    /// End records sent (one per peer).
    pub ends_sent: u64,
    /// Datagrams accepted from peers.
    pub messages_received: u64,
    /// Peers' flows installed.
    pub flows_installed: u64,
    /// Peers' flows that updated a copy in place.
    pub flows_updated: u64,
    /// Copies removed by peers' ends.
    pub flows_removed: u64,
    /// Peers' flows refused, by reason (`unknown`: no such service or backend here;
    /// `conflict`: an own flow holds the tuple; `malformed`: the record does not decode;
    /// `invalid`: inconsistent, e.g. a SNAT address that is not the peer's; `other`: full
    /// table, reply tuple taken).
    pub flows_refused: std::collections::BTreeMap<String, u64>,
    /// Datagrams refused, by reason (`unknown_peer`, `malformed`, `version`, `auth`,
    /// `reflected`, `wrong_receiver`, `wrong_sender`, `stale_session`, `replay`; see
    /// `flowsync::wire::Refused`).
    pub messages_rejected: std::collections::BTreeMap<String, u64>,
    /// Datagrams dropped because the send queue was full.
    pub queue_dropped: u64,
    /// Datagrams whose send failed.
    pub send_errors: u64,
    /// Datagrams waiting to be sent.
    pub queued: u64,
    /// Workers' flow events dropped because their log was full.
    pub log_dropped: u64,
    /// Dumps sent to peers.
    pub dumps_sent: u64,
    /// Dumps received from peers.
    pub dumps_received: u64,
    /// Age of the last flow datagram when it arrived (µs; the sender's clock).
    pub lag_us: u64,
}

/// VIP announcement through BIRD (see `crate::bgp`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpView {
    /// The liveness device is open: BIRD's routes for this node are live.
    pub live: bool,
    /// BIRD has taken the latest include file.
    pub in_sync: bool,
    /// VIPs announced (in the file BIRD last took).
    pub vips: u64,
    /// This node's SNAT addresses announced.
    pub snat: u64,
    /// Peers' SNAT addresses announced as backups.
    pub backups: u64,
    /// Include files written.
    pub writes: u64,
    /// `configure`s BIRD accepted.
    pub reconfigures: u64,
    /// Failures (writing the file, reaching BIRD, BIRD refusing it, the device), retries
    /// included.
    pub errors: u64,
    /// The latest attempt's failure, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl BgpView {
    /// The speaker's counters.
    pub fn from_stats(s: &crate::bgp::BgpStats) -> BgpView {
        use std::sync::atomic::Ordering::Relaxed;
        BgpView {
            live: s.live.load(Relaxed),
            in_sync: s.in_sync.load(Relaxed),
            vips: s.vips.load(Relaxed),
            snat: s.snat.load(Relaxed),
            backups: s.backups.load(Relaxed),
            writes: s.writes.load(Relaxed),
            reconfigures: s.reconfigures.load(Relaxed),
            errors: s.errors.load(Relaxed),
            last_error: s.last_error(),
        }
    }
}

/// Governance state and the endpoint-removal policy's work.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GovernanceView {
    /// Every new flow is refused (`POST /v1/freeze`).
    pub frozen: bool,
    /// Services frozen one by one (`POST /v1/freeze?service=NAME`).
    #[serde(default)]
    pub frozen_services: Vec<String>,
    /// The node is draining: `/healthz` answers 503 so upstream load balancers move away
    /// (`POST /v1/drain`, or a stop signal while established flows finish).
    pub draining: bool,
    /// UDP flows of removed or unusable backends removed so their next packet is
    /// re-scheduled.
    pub flows_resteered: u64,
    /// TCP/SCTP flows of removed backends ended (`[flowtable] removed_backend_tcp = "expire"`).
    pub flows_ended: u64,
}

/// Counters of one fastpath worker since start-up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerView {
    /// Worker index.
    pub index: usize,
    /// The queue it serves on each of its interfaces.
    #[serde(default)]
    pub queue: u32,
    /// The interfaces it serves (its queue on each), in port order.
    #[serde(default)]
    pub interfaces: Vec<String>,
    /// Frames received.
    pub rx: u64,
    /// Frames transmitted.
    pub tx: u64,
    /// Frames dropped because the TX ring was full.
    pub tx_ring_full: u64,
    /// Frames dropped because their transmit port has no socket on this worker.
    pub tx_no_port: u64,
    /// Frames steered to xvs that it does not own (`Pass`).
    pub pass: u64,
    /// `Pass` frames handed to the kernel through the exception device (the rest were
    /// dropped: no device, or its queue was full).
    #[serde(default)]
    pub pass_injected: u64,
    /// Frames sent to the slowpath.
    pub slow: u64,
    /// Flows created.
    pub new_flows: u64,
    /// Flows in TIME_WAIT or CLOSE ended by a new SYN of their tuple, which was scheduled
    /// afresh (IPVS's `conn_reuse_mode`).
    #[serde(default)]
    pub reused_flows: u64,
    /// SYN proxy: SYN-ACKs with a cookie sent.
    #[serde(default)]
    pub synproxy_syns: u64,
    /// SYN proxy: client ACKs with a valid cookie that opened a backend connection.
    #[serde(default)]
    pub synproxy_acks: u64,
    /// Flows expired by this worker's sweeps.
    pub expired_flows: u64,
    /// Nanoseconds spent in polls that moved frames (busy time; the rest is empty polls).
    #[serde(default)]
    pub busy_ns: u64,
    /// The snapshot generation the worker last loaded.
    pub generation: u64,
    /// Drops by reason (`DropReason::name()`, and `tx_ring_full`, `tx_no_port`,
    /// `next_hop_unresolved`, `pass_not_injected`), every reason present.
    pub drops: BTreeMap<String, u64>,
    /// Packets of known flows forwarded without the state change they asked for (the
    /// pipeline's state guard), by reason (`HoldReason::name()`), every reason present.
    #[serde(default)]
    pub held: BTreeMap<String, u64>,
    /// Rejects sent (RSTs, ICMP port unreachable), by reason (`RejectReason::name()`),
    /// every reason present.
    #[serde(default)]
    pub rejects: BTreeMap<String, u64>,
}

impl WorkerView {
    /// The view of one worker's counters (`queue` and `interfaces` left empty: see
    /// [`WorkerView::serving`]).
    pub fn from_counters(index: usize, c: &WorkerCounters) -> WorkerView {
        WorkerView {
            index,
            queue: 0,
            interfaces: Vec::new(),
            rx: c.rx,
            tx: c.tx,
            tx_ring_full: c.tx_ring_full,
            tx_no_port: c.tx_no_port,
            pass: c.pass,
            pass_injected: c.pass_injected,
            slow: c.slow,
            new_flows: c.new_flows,
            reused_flows: c.reused,
            synproxy_syns: c.synproxy_syns,
            synproxy_acks: c.synproxy_acks,
            expired_flows: c.expired,
            busy_ns: c.busy_ns,
            generation: c.generation,
            // Every loss: the pipeline's reasons, the frames the worker could not transmit
            // (a full tx ring, no socket on the port), the frames held back for a next hop
            // the kernel has not resolved (`Slow`: recycled, a later frame goes through),
            // and the frames for the kernel that did not reach it (no exception device, or
            // its queue was full).
            held: HoldReason::ALL
                .iter()
                .map(|r| (r.name().to_owned(), c.held[*r as usize]))
                .collect(),
            rejects: RejectReason::ALL
                .iter()
                .map(|r| (r.name().to_owned(), c.rejects[*r as usize]))
                .collect(),
            drops: DropReason::ALL
                .iter()
                .map(|r| (r.name().to_owned(), c.dropped(*r)))
                .chain([
                    ("tx_ring_full".to_owned(), c.tx_ring_full),
                    ("tx_no_port".to_owned(), c.tx_no_port),
                    ("next_hop_unresolved".to_owned(), c.slow),
                    (
                        "pass_not_injected".to_owned(),
                        c.pass.saturating_sub(c.pass_injected),
                    ),
                ])
                .collect(),
        }
    }

    /// This view for a worker serving `queue` on `interfaces`.
    pub fn serving(mut self, queue: u32, interfaces: &[String]) -> WorkerView {
        self.queue = queue;
        self.interfaces = interfaces.to_vec();
        self
    }
}

/// Flow table use and counters since start-up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowTableView {
    /// Live flows.
    pub flows: u64,
    /// Most flows.
    pub capacity: u64,
    /// Memory per flow slot (entry + index), bytes.
    pub bytes_per_flow: f64,
    /// Flows inserted.
    pub inserted: u64,
    /// Inserts refused: table full.
    pub full: u64,
    /// Inserts that found the flow already there (two workers racing).
    pub exists: u64,
    /// Inserts refused: reply tuple in use.
    pub reply_in_use: u64,
    /// Inserts refused: no index slot.
    pub index_full: u64,
    /// Embryonic or expired flows recycled by inserts into a full table.
    pub recycled: u64,
    /// Flows expired by sweeps.
    pub expired: u64,
    /// Flows removed explicitly.
    pub removed: u64,
    /// Half-open TCP flows ended early under pressure: given way to a new flow for their
    /// SNAT port, or expired after `tcp_syn_pressure`.
    #[serde(default)]
    pub gave_way: u64,
    /// The table is under pressure now (7/8 full, or half-open flows gave way within the
    /// last 10 s): half-open flows expire after `tcp_syn_pressure`.
    #[serde(default)]
    pub under_pressure: bool,
    /// Live TCP flows whose handshake has not completed (the SYN proxy's `auto` looks at it).
    #[serde(default)]
    pub embryonic: u64,
    /// Entries in use: one a flow, two an IPv6 flow (the table is full at `capacity`).
    #[serde(default)]
    pub entries: u64,
}

impl FlowTableView {
    /// The view of a flow table, now.
    pub fn from_table(t: &FlowTable) -> FlowTableView {
        FlowTableView {
            under_pressure: t.under_pressure(t.tick(std::time::Instant::now())),
            ..FlowTableView::from_stats(&t.stats(), t.bytes_per_flow())
        }
    }

    /// The view of a flow table's stats.
    pub fn from_stats(s: &FlowTableStats, bytes_per_flow: f64) -> FlowTableView {
        FlowTableView {
            flows: s.len as u64,
            entries: s.entries as u64,
            capacity: s.capacity as u64,
            bytes_per_flow,
            inserted: s.inserted,
            full: s.full,
            exists: s.exists,
            reply_in_use: s.reply_in_use,
            index_full: s.index_full,
            recycled: s.recycled,
            expired: s.expired,
            embryonic: s.embryonic,
            removed: s.removed,
            gave_way: s.gave_way,
            under_pressure: false,
        }
    }
}

/// The steering program's counters on one interface.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteerView {
    /// Interface name.
    pub interface: String,
    /// Frames handed to an AF_XDP socket.
    pub redirected: u64,
    /// Frames left to the kernel, every reason.
    pub passed: u64,
    /// Frame counts by class: `pass_not_ip`, `pass_malformed`, `pass_not_ours`, `pass_icmp`,
    /// `match_frontend`, `match_snat`, `match_backend`, `match_fragment`, `match_icmp_error`,
    /// `match_ipv6_ext`, `match_cluster_ip`, `match_service_cidr`, `no_socket`, `held`
    /// (dropped during a restart hold).
    pub counters: BTreeMap<String, u64>,
}

impl SteerView {
    /// The view of one interface's steering counters.
    pub fn from_counters(interface: &str, c: &SteerCounters) -> SteerView {
        let counters = [
            ("pass_not_ip", c.pass_not_ip),
            ("pass_malformed", c.pass_malformed),
            ("pass_not_ours", c.pass_not_ours),
            ("pass_icmp", c.pass_icmp),
            ("match_frontend", c.match_frontend),
            ("match_snat", c.match_snat),
            ("match_backend", c.match_backend),
            ("match_fragment", c.match_fragment),
            ("match_icmp_error", c.match_icmp_error),
            ("match_ipv6_ext", c.match_ipv6_ext),
            ("match_cluster_ip", c.match_cluster_ip),
            ("match_service_cidr", c.match_service_cidr),
            ("no_socket", c.no_socket),
            ("held", c.held),
        ];
        SteerView {
            interface: interface.to_owned(),
            redirected: c.redirected,
            passed: c.passed(),
            counters: counters
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        }
    }
}

/// The slowpath's sync loop: how fresh the published state is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SyncView {
    /// Unix time (seconds) of the last successful sync; absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_unix_s: Option<f64>,
    /// How long the last sync took (build + publish), seconds.
    pub last_duration_s: f64,
    /// Every sync's duration (build + publish), kube-proxy's
    /// `sync_proxy_rules_duration_seconds` buckets.
    #[serde(default)]
    pub duration: HistogramView,
    /// Network programming latency: from the `endpoints.kubernetes.io/last-change-trigger-time`
    /// of each changed EndpointSlice to the publish of the snapshot that has the change,
    /// kube-proxy's `network_programming_duration_seconds` buckets (Kubernetes source only).
    #[serde(default)]
    pub network_programming: HistogramView,
    /// Service changes received from the API server not yet in a model handed to the
    /// controller (distinct Services).
    #[serde(default)]
    pub service_changes_pending: u64,
    /// EndpointSlice changes received not yet in a model (distinct EndpointSlices).
    #[serde(default)]
    pub endpoint_changes_pending: u64,
    /// Service changes received since start-up.
    #[serde(default)]
    pub service_changes: u64,
    /// EndpointSlice changes received since start-up.
    #[serde(default)]
    pub endpoint_changes: u64,
    /// Snapshots published since start-up.
    #[serde(default)]
    pub syncs: u64,
    /// Config reloads (SIGHUP) applied.
    pub reloads_ok: u64,
    /// Config reloads rejected (the running config stayed).
    pub reloads_failed: u64,
}

/// `SystemTime` as Unix seconds (0 before the epoch).
pub fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// What `/healthz` and `/livez` decide from. Not part of the JSON API (the endpoints answer
/// with [`HealthzBody`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HealthView {
    /// When the slowpath last completed a sync: published a snapshot, or found nothing to
    /// publish on a periodic pass (kube-proxy's `lastUpdated`). `None` before the first.
    pub last_updated: Option<SystemTime>,
    /// When the oldest change not yet published was queued (kube-proxy's
    /// `oldestPendingQueued`); `None` when everything is published.
    pub oldest_pending: Option<SystemTime>,
    /// How stale `last_updated` (or a pending change) may be: kube-proxy uses
    /// 2 × `syncPeriod`.
    pub timeout: Duration,
    /// Every fastpath worker thread is running.
    pub fastpath_running: bool,
    /// False while the Node is being deleted: `/healthz` fails so that load balancers drain
    /// this node; `/livez` ignores it.
    pub node_eligible: bool,
    /// `Some(reason)` while the daemon is not ready to serve at all (e.g. "waiting for the
    /// first sync of the Kubernetes source"): `/healthz` and `/livez` both fail with it.
    pub not_ready: Option<String>,
}

impl HealthView {
    /// This view with the Kubernetes source's own queue: its oldest change not yet handed to
    /// the controller counts as pending, and its last model as a sync (the older of the
    /// source's and the controller's is `last_updated`). A change is pending from when the
    /// source received it to the publish of its snapshot, in whichever stage it waits.
    pub fn with_source(mut self, source: &crate::k8s::SourceStats) -> HealthView {
        self.oldest_pending = match (self.oldest_pending, source.pending_since()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let (Some(ours), Some(theirs)) = (self.last_updated, source.last_model()) {
            self.last_updated = Some(ours.min(theirs));
        }
        self
    }
}

/// The body of `/healthz` and `/livez`, as kube-proxy answers (same field names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthzBody {
    /// RFC 3339 time of the last sync (`""` before the first).
    pub last_updated: String,
    /// RFC 3339 time of this answer.
    pub current_time: String,
    /// Whether the node may take load-balancer traffic (`/healthz` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_eligible: Option<bool>,
    /// Whether the fastpath workers are running (xvs addition).
    #[serde(default)]
    pub fastpath_running: bool,
    /// Why the answer is 503; absent on 200 (xvs addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
