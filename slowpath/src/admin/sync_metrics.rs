//! The `/metrics` families of synchronisation: flow sync with the tier's peers (`[sync]`)
//! and the sync loop's (kube-proxy's `sync_proxy_rules_*` under xvs's names). Rows of
//! [`super::metrics`]'s table, written as groups.

use super::metrics::{Out, f};

/// Reads one counter of flow sync's view.
type PeerSyncField = fn(&super::views::PeerSyncView) -> u64;

/// Flow sync's counters that have no labels: name, help, value.
const PEER_SYNC_COUNTERS: [(&str, &str, PeerSyncField); 12] = [
    (
        "xvs_peer_sync_messages_sent_total",
        "Flow sync datagrams sent (once per peer).",
        |p| p.messages_sent,
    ),
    (
        "xvs_peer_sync_bytes_sent_total",
        "Flow sync bytes sent.",
        |p| p.bytes_sent,
    ),
    (
        "xvs_peer_sync_flows_sent_total",
        "Flow records sent to peers (once per peer).",
        |p| p.flows_sent,
    ),
    (
        "xvs_peer_sync_ends_sent_total",
        "Ended-flow records sent to peers (once per peer).",
        |p| p.ends_sent,
    ),
    (
        "xvs_peer_sync_messages_received_total",
        "Flow sync datagrams accepted from peers.",
        |p| p.messages_received,
    ),
    (
        "xvs_peer_sync_flows_installed_total",
        "Peers' flows installed into this node's flow table.",
        |p| p.flows_installed,
    ),
    (
        "xvs_peer_sync_flows_updated_total",
        "Peers' flows that updated a copy already here.",
        |p| p.flows_updated,
    ),
    (
        "xvs_peer_sync_flows_removed_total",
        "Copies of peers' flows removed by their ends.",
        |p| p.flows_removed,
    ),
    (
        "xvs_peer_sync_queue_dropped_total",
        "Flow sync datagrams dropped because the send queue was full.",
        |p| p.queue_dropped,
    ),
    (
        "xvs_peer_sync_send_errors_total",
        "Flow sync datagrams whose send failed.",
        |p| p.send_errors,
    ),
    (
        "xvs_peer_sync_log_dropped_total",
        "Workers' flow events dropped because their log was full (the refresh sends the flows later).",
        |p| p.log_dropped,
    ),
    (
        "xvs_peer_sync_dumps_received_total",
        "Full dumps received from peers.",
        |p| p.dumps_received,
    ),
];

/// Flow sync with the tier's peers (`[sync]`).
pub(super) fn peer_sync(o: &mut Out, p: &super::views::PeerSyncView) {
    for (name, help, get) in PEER_SYNC_COUNTERS {
        o.single(name, "counter", help, f(get(p)));
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

/// The sync loop's families, kube-proxy's `kubeproxy_sync_proxy_rules_*` and
/// `kubeproxy_network_programming_duration_seconds` under xvs's names.
pub(super) fn sync(o: &mut Out, s: &super::views::SyncView) {
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
