//! `/metrics`: Prometheus text exposition format 0.0.4.
//!
//! Every family is written once with its `# HELP` and `# TYPE` lines, then its samples;
//! label values are escaped (`\\`, `\"`, `\n`). Counters end in `_total`. Histograms are
//! cumulative `_bucket{le}` samples ending with `+Inf`, then `_sum` and `_count` (equal to
//! the `+Inf` bucket). Families whose source is empty (no workers yet) still get their
//! HELP/TYPE lines. `promtool check metrics` and the Python client's parser read the result
//! in the tests (`tests/admin_metrics_parsers.rs`); the `process_*` families and
//! `xvs_build_info` are [`super::process`]'s.

use std::fmt::Write;

use super::views::{BackendView, ServiceView, StatsView};

/// Counts of `/healthz` and `/livez` answers, like kube-proxy's `proxy_healthz_total` and
/// `proxy_livez_total`.
#[derive(Debug, Default)]
pub struct ProbeCounts {
    /// `/healthz` answered 200.
    pub healthz_ok: u64,
    /// `/healthz` answered 503.
    pub healthz_fail: u64,
    /// `/livez` answered 200.
    pub livez_ok: u64,
    /// `/livez` answered 503.
    pub livez_fail: u64,
}

/// Escapes a label value.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The exposition being written (shared with [`super::process`]).
pub(super) struct Out(pub(super) String);

impl Out {
    pub(super) fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    pub(super) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Into<f64>) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape_label(v));
            }
            self.0.push('}');
        }
        let v: f64 = value.into();
        if v.is_nan() {
            self.0.push_str(" NaN\n");
        } else if v.is_infinite() {
            self.0.push_str(if v > 0.0 { " +Inf\n" } else { " -Inf\n" });
        } else {
            let _ = writeln!(self.0, " {v}");
        }
    }

    /// One family with one unlabelled sample.
    pub(super) fn single(&mut self, name: &str, kind: &str, help: &str, value: impl Into<f64>) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A histogram family: its cumulative `_bucket{le}` samples (`+Inf` last), `_sum` and
    /// `_count`.
    fn histogram(&mut self, name: &str, help: &str, h: &super::views::HistogramView) {
        self.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        for (le, n) in &h.buckets {
            self.sample(&bucket, &[("le", &le.to_string())], f(*n));
        }
        self.sample(&bucket, &[("le", "+Inf")], f(h.count));
        self.sample(&format!("{name}_sum"), &[], h.sum);
        self.sample(&format!("{name}_count"), &[], f(h.count));
    }
}

/// u64 counters as f64 samples (exact below 2^53).
/// Flow sync with the tier's peers (`[sync]`).
fn peer_sync(o: &mut Out, p: &super::views::PeerSyncView) {
    let counters: [(&str, &str, u64); 12] = [
        (
            "xvs_peer_sync_messages_sent_total",
            "Flow sync datagrams sent (once per peer).",
            p.messages_sent,
        ),
        (
            "xvs_peer_sync_bytes_sent_total",
            "Flow sync bytes sent.",
            p.bytes_sent,
        ),
        (
            "xvs_peer_sync_flows_sent_total",
            "Flow records sent to peers (once per peer).",
            p.flows_sent,
        ),
        (
            "xvs_peer_sync_ends_sent_total",
            "Ended-flow records sent to peers (once per peer).",
            p.ends_sent,
        ),
        (
            "xvs_peer_sync_messages_received_total",
            "Flow sync datagrams accepted from peers.",
            p.messages_received,
        ),
        (
            "xvs_peer_sync_flows_installed_total",
            "Peers' flows installed into this node's flow table.",
            p.flows_installed,
        ),
        (
            "xvs_peer_sync_flows_updated_total",
            "Peers' flows that updated a copy already here.",
            p.flows_updated,
        ),
        (
            "xvs_peer_sync_flows_removed_total",
            "Copies of peers' flows removed by their ends.",
            p.flows_removed,
        ),
        (
            "xvs_peer_sync_queue_dropped_total",
            "Flow sync datagrams dropped because the send queue was full.",
            p.queue_dropped,
        ),
        (
            "xvs_peer_sync_send_errors_total",
            "Flow sync datagrams whose send failed.",
            p.send_errors,
        ),
        (
            "xvs_peer_sync_log_dropped_total",
            "Workers' flow events dropped because their log was full (the refresh sends the flows later).",
            p.log_dropped,
        ),
        (
            "xvs_peer_sync_dumps_received_total",
            "Full dumps received from peers.",
            p.dumps_received,
        ),
    ];
    for (name, help, v) in counters {
        o.single(name, "counter", help, f(v));
    }
    o.single(
        "xvs_peer_sync_dumps_sent_total",
        "counter",
        "Full dumps sent to peers.",
        f(p.dumps_sent),
    );
    o.family(
        "xvs_peer_sync_flows_refused_total",
        "counter",
        "Peers' flows refused, by reason (unknown: no such service or backend here; conflict: a flow of this node holds the tuple; malformed: the record does not decode; invalid: inconsistent, e.g. a SNAT address not the peer's; other: full table).",
    );
    for (reason, n) in &p.flows_refused {
        o.sample(
            "xvs_peer_sync_flows_refused_total",
            &[("reason", reason)],
            f(*n),
        );
    }
    o.family(
        "xvs_peer_sync_messages_rejected_total",
        "counter",
        "Flow sync datagrams rejected, by reason (unknown_peer: not from a listed peer; malformed; version: another wire version; auth: forged or another key; reflected: names this node as sender; wrong_receiver: meant for another node; wrong_sender: another node than the peer it came from; stale_session: made before this node or the peer restarted; replay: seen, below the window, or more than 60 s from this clock).",
    );
    for (reason, n) in &p.messages_rejected {
        o.sample(
            "xvs_peer_sync_messages_rejected_total",
            &[("reason", reason)],
            f(*n),
        );
    }
    o.single(
        "xvs_peer_sync_lag_seconds",
        "gauge",
        "Age of the last flow datagram from a peer when it arrived (by the sender's clock).",
        p.lag_us as f64 / 1e6,
    );
    o.single(
        "xvs_peer_sync_queued",
        "gauge",
        "Flow sync datagrams waiting to be sent.",
        f(p.queued),
    );
    o.single(
        "xvs_peer_sync_peers_up",
        "gauge",
        "Peers heard from within the last 3 s.",
        f(p.peers_up),
    );
    o.single(
        "xvs_peer_sync_ready",
        "gauge",
        "1 once the start-up dumps from the peers are in.",
        f(u64::from(p.ready)),
    );
}

fn f(v: u64) -> f64 {
    v as f64
}

/// A worker's labels: `worker` (its index), `interface` (the interfaces it serves, joined
/// by `,`; usually one) and `queue` (the queue it serves on each).
struct WorkerLabels {
    worker: String,
    interface: String,
    queue: String,
}

impl WorkerLabels {
    fn of(w: &super::views::WorkerView) -> WorkerLabels {
        WorkerLabels {
            worker: w.index.to_string(),
            interface: w.interfaces.join(","),
            queue: w.queue.to_string(),
        }
    }

    fn get(&self) -> [(&str, &str); 3] {
        [
            ("worker", &self.worker),
            ("interface", &self.interface),
            ("queue", &self.queue),
        ]
    }
}

/// A gauge family with one sample per backend, labelled by service and backend.
fn backend_gauge(
    o: &mut Out,
    services: &[ServiceView],
    (name, help): (&str, &str),
    value: impl Fn(&BackendView) -> f64,
) {
    o.family(name, "gauge", help);
    for s in services {
        for b in &s.backends {
            let addr = b.addr.to_string();
            o.sample(name, &[("service", &s.name), ("backend", &addr)], value(b));
        }
    }
}

/// The sync loop's families, kube-proxy's `kubeproxy_sync_proxy_rules_*` and
/// `kubeproxy_network_programming_duration_seconds` under xvs's names.
fn sync(o: &mut Out, s: &super::views::SyncView) {
    use super::histogram::{NETWORK_PROGRAMMING_BUCKETS, SYNC_DURATION_BUCKETS};
    use super::views::HistogramView;
    // A source that reports no histogram (an older daemon's view) shows kube-proxy's
    // buckets, empty: the families and their `le` sets never depend on the traffic.
    let or_empty = |h: &HistogramView, bounds: &[f64]| {
        if h.buckets.is_empty() && h.count == 0 {
            HistogramView::empty(bounds)
        } else {
            h.clone()
        }
    };
    o.histogram(
        "xvs_sync_duration_seconds",
        "Duration of each sync: from the start of the snapshot build to its publish to the workers (stored where they load it at their next poll, steering written).",
        &or_empty(&s.duration, &SYNC_DURATION_BUCKETS),
    );
    o.single(
        "xvs_sync_last_duration_seconds",
        "gauge",
        "Duration of the last sync (snapshot build and publish).",
        s.last_duration_s,
    );
    o.histogram(
        "xvs_network_programming_duration_seconds",
        "Network programming latency: from an EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time to the publish of the snapshot that has its change (one observation per change; Kubernetes source).",
        &or_empty(&s.network_programming, &NETWORK_PROGRAMMING_BUCKETS),
    );
    o.single(
        "xvs_last_sync_timestamp_seconds",
        "gauge",
        "Unix time of the last successful sync (0 before the first).",
        s.last_sync_unix_s.unwrap_or(0.0),
    );
    o.single(
        "xvs_sync_service_changes_pending",
        "gauge",
        "Services changed in the API server whose change is not yet in a model handed to the controller (Kubernetes source).",
        f(s.service_changes_pending),
    );
    o.single(
        "xvs_sync_endpoint_changes_pending",
        "gauge",
        "EndpointSlices changed in the API server whose change is not yet in a model handed to the controller (Kubernetes source).",
        f(s.endpoint_changes_pending),
    );
    o.single(
        "xvs_sync_service_changes_total",
        "counter",
        "Service changes (adds, updates, deletes) received from the API server (Kubernetes source).",
        f(s.service_changes),
    );
    o.single(
        "xvs_sync_endpoint_changes_total",
        "counter",
        "EndpointSlice changes (adds, updates, deletes) received from the API server (Kubernetes source).",
        f(s.endpoint_changes),
    );
}

/// Renders every metric.
pub fn render(stats: &StatsView, services: &[ServiceView], probes: &ProbeCounts) -> String {
    let mut o = Out(String::with_capacity(8192));

    // Fastpath workers.
    o.family(
        "xvs_drops_total",
        "counter",
        "Frames lost, by reason: the fastpath's drops and the frames it could not transmit or hand to the kernel (summed over workers), and the steering program's drops during a restart hold (restart_hold).",
    );
    let mut drops: std::collections::BTreeMap<&str, u64> = Default::default();
    for w in &stats.workers {
        for (reason, n) in &w.drops {
            *drops.entry(reason).or_default() += n;
        }
    }
    // Frames for xvs that the steering program dropped while a restart hold ran (no socket
    // on their queue yet): lost before any worker saw them.
    if !stats.steering.is_empty() {
        let held = stats
            .steering
            .iter()
            .filter_map(|s| s.counters.get("held"))
            .sum::<u64>();
        *drops.entry("restart_hold").or_default() += held;
    }
    for (reason, n) in &drops {
        o.sample("xvs_drops_total", &[("reason", reason)], f(*n));
    }
    o.family(
        "xvs_held_state_changes_total",
        "counter",
        "Packets of known flows (SYN, FIN, RST) forwarded without the state change they asked for, by reason: the state guard's refusals (summed over workers).",
    );
    let mut held: std::collections::BTreeMap<&str, u64> = Default::default();
    for w in &stats.workers {
        for (reason, n) in &w.held {
            *held.entry(reason).or_default() += n;
        }
    }
    for (reason, n) in &held {
        o.sample("xvs_held_state_changes_total", &[("reason", reason)], f(*n));
    }
    o.family(
        "xvs_rejects_total",
        "counter",
        "New flows answered with a reject (a TCP RST, an ICMP or ICMPv6 port unreachable) instead of silence, by reason: no_endpoints (the service has no usable endpoint), unserved_port (a port or protocol a ClusterIP does not serve); summed over workers. Rejects over the rate limit are drops (reject_rate_limited).",
    );
    let mut rejects: std::collections::BTreeMap<&str, u64> = Default::default();
    for w in &stats.workers {
        for (reason, n) in &w.rejects {
            *rejects.entry(reason).or_default() += n;
        }
    }
    for (reason, n) in &rejects {
        o.sample("xvs_rejects_total", &[("reason", reason)], f(*n));
    }
    type Field = fn(&super::views::WorkerView) -> u64;
    let per_worker: [(&str, &str, Field); 12] = [
        (
            "xvs_rx_packets_total",
            "Frames received, per worker.",
            |w| w.rx,
        ),
        (
            "xvs_tx_packets_total",
            "Frames transmitted, per worker.",
            |w| w.tx,
        ),
        (
            "xvs_tx_ring_full_total",
            "Frames dropped because the TX ring was full, per worker.",
            |w| w.tx_ring_full,
        ),
        (
            "xvs_tx_no_port_total",
            "Frames dropped because their transmit port has no socket on the worker.",
            |w| w.tx_no_port,
        ),
        (
            "xvs_pass_packets_total",
            "Frames steered to xvs that it does not own (Pass), per worker.",
            |w| w.pass,
        ),
        (
            "xvs_pass_injected_total",
            "Pass frames handed to the kernel through the exception device, per worker.",
            |w| w.pass_injected,
        ),
        (
            "xvs_slow_packets_total",
            "Frames sent to the slowpath, per worker.",
            |w| w.slow,
        ),
        ("xvs_new_flows_total", "Flows created, per worker.", |w| {
            w.new_flows
        }),
        (
            "xvs_reused_flows_total",
            "Flows in TIME_WAIT or CLOSE ended by a new SYN of their tuple (scheduled afresh).",
            |w| w.reused_flows,
        ),
        (
            "xvs_synproxy_syns_total",
            "SYN proxy: SYN-ACKs with a SYN cookie sent to clients, per worker.",
            |w| w.synproxy_syns,
        ),
        (
            "xvs_synproxy_acks_total",
            "SYN proxy: client ACKs with a valid cookie that opened a backend connection, per worker.",
            |w| w.synproxy_acks,
        ),
        (
            "xvs_expired_flows_total",
            "Flows expired by the worker's sweeps.",
            |w| w.expired_flows,
        ),
    ];
    let labels: Vec<WorkerLabels> = stats.workers.iter().map(WorkerLabels::of).collect();
    for (name, help, get) in per_worker {
        o.family(name, "counter", help);
        for (w, l) in stats.workers.iter().zip(&labels) {
            o.sample(name, &l.get(), f(get(w)));
        }
    }
    o.family(
        "xvs_worker_busy_seconds_total",
        "counter",
        "Time the worker spent in polls that moved frames; the rest of its (busy-polling) \
         core's time found empty rings.",
    );
    for (w, l) in stats.workers.iter().zip(&labels) {
        o.sample(
            "xvs_worker_busy_seconds_total",
            &l.get(),
            w.busy_ns as f64 / 1e9,
        );
    }
    o.family(
        "xvs_worker_snapshot_generation",
        "gauge",
        "Snapshot generation each worker last loaded.",
    );
    for (w, l) in stats.workers.iter().zip(&labels) {
        o.sample("xvs_worker_snapshot_generation", &l.get(), f(w.generation));
    }

    // Services and backends.
    o.family(
        "xvs_backend_connections",
        "gauge",
        "Live flows per backend: active = TCP ESTABLISHED, inactive = every other state.",
    );
    for s in services {
        for b in &s.backends {
            let addr = b.addr.to_string();
            for (state, n) in [("active", b.active), ("inactive", b.inactive)] {
                o.sample(
                    "xvs_backend_connections",
                    &[("service", &s.name), ("backend", &addr), ("state", state)],
                    n,
                );
            }
        }
    }
    backend_gauge(
        &mut o,
        services,
        (
            "xvs_backend_usable",
            "1 when the backend takes new flows (ready and healthy), else 0.",
        ),
        |b| u8::from(b.usable).into(),
    );
    backend_gauge(
        &mut o,
        services,
        (
            "xvs_backend_weight",
            "Configured backend weight (0: draining).",
        ),
        |b| b.weight.into(),
    );
    o.single(
        "xvs_services",
        "gauge",
        "Services in the published snapshot.",
        f(services.len() as u64),
    );
    o.family(
        "xvs_service_frozen",
        "gauge",
        "1 when the service refuses new flows (frozen, or the node is).",
    );
    for s in services {
        o.sample(
            "xvs_service_frozen",
            &[("service", &s.name)],
            u8::from(s.frozen),
        );
    }
    o.family(
        "xvs_service_rate_limited_total",
        "counter",
        "New flows refused by the service's new-connection rate limit (services with one).",
    );
    for s in services.iter().filter(|s| s.rate_limit.is_some()) {
        o.sample(
            "xvs_service_rate_limited_total",
            &[("service", &s.name)],
            f(s.rate_limited),
        );
    }
    super::traffic_metrics::render(&mut o, services);

    // Governance.
    let g = &stats.governance;
    o.single(
        "xvs_frozen",
        "gauge",
        "1 while every new flow is refused (the freeze switch).",
        u8::from(g.frozen),
    );
    o.single(
        "xvs_draining",
        "gauge",
        "1 while the node drains (/healthz answers 503).",
        u8::from(g.draining),
    );
    o.family(
        "xvs_removed_backend_flows_total",
        "counter",
        "Flows of removed or unusable backends acted on: resteered = UDP flows removed so their next packet is scheduled again; ended = TCP/SCTP flows of removed backends ended.",
    );
    o.sample(
        "xvs_removed_backend_flows_total",
        &[("action", "resteered")],
        f(g.flows_resteered),
    );
    o.sample(
        "xvs_removed_backend_flows_total",
        &[("action", "ended")],
        f(g.flows_ended),
    );

    // Flow table.
    let t = &stats.flowtable;
    o.single("xvs_flowtable_flows", "gauge", "Live flows.", f(t.flows));
    o.single(
        "xvs_flowtable_embryonic_flows",
        "gauge",
        "Live TCP flows whose handshake has not completed (the SYN proxy's auto threshold applies to it).",
        f(t.embryonic),
    );
    o.single(
        "xvs_flowtable_capacity",
        "gauge",
        "Most flows the table holds.",
        f(t.capacity),
    );
    o.single(
        "xvs_flowtable_bytes_per_flow",
        "gauge",
        "Memory per flow slot (entry and index), bytes.",
        t.bytes_per_flow,
    );
    o.single(
        "xvs_flowtable_inserts_total",
        "counter",
        "Flows inserted.",
        f(t.inserted),
    );
    o.family(
        "xvs_flowtable_insert_failures_total",
        "counter",
        "Inserts refused, by reason.",
    );
    for (reason, n) in [
        ("full", t.full),
        ("exists", t.exists),
        ("reply_in_use", t.reply_in_use),
        ("index_full", t.index_full),
    ] {
        o.sample(
            "xvs_flowtable_insert_failures_total",
            &[("reason", reason)],
            f(n),
        );
    }
    o.single(
        "xvs_flowtable_recycled_total",
        "counter",
        "Embryonic or expired flows recycled by inserts into a full table.",
        f(t.recycled),
    );
    o.single(
        "xvs_flowtable_gave_way_total",
        "counter",
        "Half-open TCP flows ended early under pressure: given way to a new flow for their SNAT port, or expired after tcp_syn_pressure.",
        f(t.gave_way),
    );
    o.single(
        "xvs_flowtable_under_pressure",
        "gauge",
        "1 while the flow table is under pressure (7/8 full, or half-open flows gave way within the last 10 s).",
        f(u64::from(t.under_pressure)),
    );
    o.single(
        "xvs_flowtable_expired_total",
        "counter",
        "Flows expired by sweeps.",
        f(t.expired),
    );
    o.single(
        "xvs_flowtable_removed_total",
        "counter",
        "Flows removed explicitly.",
        f(t.removed),
    );
    if let Some(p) = &stats.peer_sync {
        peer_sync(&mut o, p);
    }

    // Steering.
    o.family(
        "xvs_steer_frames_total",
        "counter",
        "Frames seen by the XDP steering program, by interface and class.",
    );
    for s in &stats.steering {
        for (class, n) in &s.counters {
            o.sample(
                "xvs_steer_frames_total",
                &[("interface", &s.interface), ("class", class)],
                f(*n),
            );
        }
    }
    o.family(
        "xvs_steer_redirected_total",
        "counter",
        "Frames the steering program handed to an AF_XDP socket.",
    );
    for s in &stats.steering {
        o.sample(
            "xvs_steer_redirected_total",
            &[("interface", &s.interface)],
            f(s.redirected),
        );
    }

    // Sync loop.
    o.single(
        "xvs_snapshot_generation",
        "gauge",
        "Generation of the published snapshot.",
        f(stats.generation),
    );
    sync(&mut o, &stats.sync);
    o.single(
        "xvs_syncs_total",
        "counter",
        "Snapshots published.",
        f(stats.sync.syncs),
    );
    o.family(
        "xvs_config_reloads_total",
        "counter",
        "Config reloads, by result (failed: the running config stayed).",
    );
    o.sample(
        "xvs_config_reloads_total",
        &[("result", "ok")],
        f(stats.sync.reloads_ok),
    );
    o.sample(
        "xvs_config_reloads_total",
        &[("result", "failed")],
        f(stats.sync.reloads_failed),
    );

    o.family(
        "xvs_refused",
        "gauge",
        "Objects or parts of objects refused now (not programmed, or only as they were before), by kind: the Kubernetes source's problems and the snapshot builder's refusals (snapshot_build).",
    );
    for (kind, n) in &stats.refused.current {
        o.sample("xvs_refused", &[("kind", kind)], f(*n));
    }
    o.family(
        "xvs_refused_total",
        "counter",
        "Refusals reported, by kind: each counted once, when the change that brings it is first seen.",
    );
    for (kind, n) in &stats.refused.total {
        o.sample("xvs_refused_total", &[("kind", kind)], f(*n));
    }

    if let Some(b) = &stats.bgp {
        o.single(
            "xvs_bgp_live",
            "gauge",
            "1 while the liveness device is open: BIRD's routes for this node are live.",
            u8::from(b.live),
        );
        o.single(
            "xvs_bgp_in_sync",
            "gauge",
            "1 when BIRD has taken the latest include file.",
            u8::from(b.in_sync),
        );
        o.family(
            "xvs_bgp_routes",
            "gauge",
            "Host routes announced through BIRD, by kind: vip, snat (this node's), backup (peers' SNAT addresses).",
        );
        for (kind, n) in [("vip", b.vips), ("snat", b.snat), ("backup", b.backups)] {
            o.sample("xvs_bgp_routes", &[("kind", kind)], f(n));
        }
        o.single(
            "xvs_bgp_reconfigures_total",
            "counter",
            "BIRD configure commands accepted.",
            f(b.reconfigures),
        );
        o.single(
            "xvs_bgp_errors_total",
            "counter",
            "BGP announcement failures (writing the include file, reaching BIRD, BIRD refusing it, the liveness device), retries included.",
            f(b.errors),
        );
    }

    // The health endpoints themselves, like kube-proxy's proxy_healthz_total.
    o.family(
        "xvs_healthz_total",
        "counter",
        "/healthz answers, by HTTP code.",
    );
    o.sample(
        "xvs_healthz_total",
        &[("code", "200")],
        f(probes.healthz_ok),
    );
    o.sample(
        "xvs_healthz_total",
        &[("code", "503")],
        f(probes.healthz_fail),
    );
    o.family(
        "xvs_livez_total",
        "counter",
        "/livez answers, by HTTP code.",
    );
    o.sample("xvs_livez_total", &[("code", "200")], f(probes.livez_ok));
    o.sample("xvs_livez_total", &[("code", "503")], f(probes.livez_fail));
    o.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::views::WorkerView;
    use fastpath::worker::WorkerCounters;

    #[test]
    fn frames_that_could_not_be_transmitted_are_drops() {
        let c = WorkerCounters {
            tx_ring_full: 2757,
            tx_no_port: 3,
            ..WorkerCounters::default()
        };
        let stats = StatsView {
            workers: vec![WorkerView::from_counters(0, &c)],
            ..StatsView::default()
        };
        let text = render(&stats, &[], &ProbeCounts::default());
        assert!(
            text.contains("xvs_drops_total{reason=\"tx_ring_full\"} 2757"),
            "{text}"
        );
        assert!(text.contains("xvs_drops_total{reason=\"tx_no_port\"} 3"));
    }

    #[test]
    fn unresolved_next_hops_uninjected_pass_frames_and_held_frames_are_drops() {
        let c = WorkerCounters {
            slow: 4,
            pass: 10,
            pass_injected: 7,
            ..WorkerCounters::default()
        };
        let mut held = crate::admin::views::SteerView::default();
        held.counters.insert("held".to_owned(), 5);
        let stats = StatsView {
            workers: vec![
                WorkerView::from_counters(0, &c),
                WorkerView::from_counters(1, &c),
            ],
            steering: vec![held.clone(), held],
            ..StatsView::default()
        };
        let text = render(&stats, &[], &ProbeCounts::default());
        for line in [
            "xvs_drops_total{reason=\"next_hop_unresolved\"} 8\n",
            "xvs_drops_total{reason=\"pass_not_injected\"} 6\n",
            "xvs_drops_total{reason=\"restart_hold\"} 10\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
