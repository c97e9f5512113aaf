//! `/metrics`: Prometheus text exposition format 0.0.4.
//!
//! The families are one table, [`FAMILIES`] (name, type, help, and what writes the samples;
//! a few groups are written by their own modules, [`super::sync_metrics`],
//! [`super::traffic_metrics`], [`super::sockets`], or only when their feature is on), in the
//! order they are written. Every family is written once with its `# HELP` and `# TYPE`
//! lines, then its samples;
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
    pub(super) fn histogram(&mut self, name: &str, help: &str, h: &super::views::HistogramView) {
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
pub(super) fn f(v: u64) -> f64 {
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

/// What the families are rendered from.
struct Input<'a> {
    stats: &'a StatsView,
    services: &'a [ServiceView],
    probes: &'a ProbeCounts,
}

/// Writes a family's samples under its name.
type Samples = fn(&mut Out, &str, &Input<'_>);

/// A row of the table: one family (name, type, help, its samples), or a group of families
/// rendered elsewhere (a module of their own, or families present only with a feature on).
enum Row {
    Family {
        name: &'static str,
        kind: &'static str,
        help: &'static str,
        samples: Samples,
    },
    Group(fn(&mut Out, &Input<'_>)),
}

/// A family of the table.
const fn fam(name: &'static str, kind: &'static str, help: &'static str, samples: Samples) -> Row {
    Row::Family {
        name,
        kind,
        help,
        samples,
    }
}

/// Renders every metric: the rows of [`FAMILIES`], in order.
pub fn render(stats: &StatsView, services: &[ServiceView], probes: &ProbeCounts) -> String {
    let input = Input {
        stats,
        services,
        probes,
    };
    let mut o = Out(String::with_capacity(8192));
    for row in FAMILIES {
        match row {
            Row::Family {
                name,
                kind,
                help,
                samples,
            } => {
                o.family(name, kind, help);
                samples(&mut o, name, &input);
            }
            Row::Group(group) => group(&mut o, &input),
        }
    }
    o.0
}

/// Counts by reason summed over the workers (`field` picks a worker's counts).
fn by_reason(
    workers: &[super::views::WorkerView],
    field: fn(&super::views::WorkerView) -> &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<&str, u64> {
    let mut sum: std::collections::BTreeMap<&str, u64> = Default::default();
    for w in workers {
        for (reason, n) in field(w) {
            *sum.entry(reason).or_default() += n;
        }
    }
    sum
}

/// One sample per worker of `get`.
fn per_worker(
    o: &mut Out,
    name: &str,
    i: &Input<'_>,
    get: impl Fn(&super::views::WorkerView) -> f64,
) {
    for w in &i.stats.workers {
        o.sample(name, &WorkerLabels::of(w).get(), get(w));
    }
}

/// `xvs_drops_total`: the workers' drops, the frames the steering program dropped while a
/// restart hold ran (no socket on their queue yet: lost before any worker saw them), and
/// the sockets' kernel drops.
fn drops(o: &mut Out, name: &str, i: &Input<'_>) {
    let stats = i.stats;
    let mut drops = by_reason(&stats.workers, |w| &w.drops);
    if !stats.steering.is_empty() {
        let held = stats
            .steering
            .iter()
            .filter_map(|s| s.counters.get("held"))
            .sum::<u64>();
        *drops.entry("restart_hold").or_default() += held;
    }
    for (reason, n) in super::sockets::drops(&stats.sockets) {
        *drops.entry(reason).or_default() += n;
    }
    for (reason, n) in &drops {
        o.sample(name, &[("reason", reason)], f(*n));
    }
}

/// `xvs_backend_connections`: active and inactive flows per backend.
fn backend_connections(o: &mut Out, name: &str, i: &Input<'_>) {
    for s in i.services {
        for b in &s.backends {
            let addr = b.addr.to_string();
            for (state, n) in [("active", b.active), ("inactive", b.inactive)] {
                o.sample(
                    name,
                    &[("service", &s.name), ("backend", &addr), ("state", state)],
                    n,
                );
            }
        }
    }
}

/// One sample per backend, labelled by service and backend.
fn per_backend(o: &mut Out, name: &str, i: &Input<'_>, value: impl Fn(&BackendView) -> f64) {
    for s in i.services {
        for b in &s.backends {
            let addr = b.addr.to_string();
            o.sample(name, &[("service", &s.name), ("backend", &addr)], value(b));
        }
    }
}

/// Samples labelled `label`, one per (value, count).
fn labelled<'a>(
    o: &mut Out,
    name: &str,
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, u64)>,
) {
    for (value, n) in samples {
        o.sample(name, &[(label, value)], f(n));
    }
}

/// The BGP speaker's families (`[bgp]` on).
fn bgp(o: &mut Out, i: &Input<'_>) {
    let Some(b) = &i.stats.bgp else {
        return;
    };
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
    labelled(
        o,
        "xvs_bgp_routes",
        "kind",
        [("vip", b.vips), ("snat", b.snat), ("backup", b.backups)],
    );
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

/// Every family xvs exports besides the process's, in the order they are written.
const FAMILIES: &[Row] = &[
    // Fastpath workers.
    fam(
        "xvs_drops_total",
        "counter",
        "Frames lost, by reason: the fastpath's drops and the frames it could not transmit or hand to the kernel (summed over workers), the AF_XDP sockets' kernel drops (xsk_*), and the steering program's drops during a restart hold (restart_hold).",
        drops,
    ),
    fam(
        "xvs_held_state_changes_total",
        "counter",
        "Packets of known flows (SYN, FIN, RST) forwarded without the state change they asked for, by reason: the state guard's refusals (summed over workers).",
        |o, name, i| {
            let held = by_reason(&i.stats.workers, |w| &w.held);
            labelled(o, name, "reason", held.iter().map(|(r, n)| (*r, *n)));
        },
    ),
    fam(
        "xvs_rejects_total",
        "counter",
        "New flows answered with a reject (a TCP RST, an ICMP or ICMPv6 port unreachable) instead of silence, by reason: no_endpoints (the service has no usable endpoint), unserved_port (a port or protocol a ClusterIP does not serve); summed over workers. Rejects over the rate limit are drops (reject_rate_limited).",
        |o, name, i| {
            let rejects = by_reason(&i.stats.workers, |w| &w.rejects);
            labelled(o, name, "reason", rejects.iter().map(|(r, n)| (*r, *n)));
        },
    ),
    fam(
        "xvs_rx_packets_total",
        "counter",
        "Frames received, per worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.rx)),
    ),
    fam(
        "xvs_tx_packets_total",
        "counter",
        "Frames transmitted, per worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.tx)),
    ),
    fam(
        "xvs_tx_ring_full_total",
        "counter",
        "Frames dropped because the TX ring was full, per worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.tx_ring_full)),
    ),
    fam(
        "xvs_tx_no_port_total",
        "counter",
        "Frames dropped because their transmit port has no socket on the worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.tx_no_port)),
    ),
    fam(
        "xvs_pass_packets_total",
        "counter",
        "Frames steered to xvs that it does not own (Pass), per worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.pass)),
    ),
    fam(
        "xvs_pass_injected_total",
        "counter",
        "Pass frames handed to the kernel through the exception device, per worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.pass_injected)),
    ),
    fam(
        "xvs_slow_packets_total",
        "counter",
        "Frames sent to the slowpath, per worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.slow)),
    ),
    fam(
        "xvs_new_flows_total",
        "counter",
        "Flows created, per worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.new_flows)),
    ),
    fam(
        "xvs_reused_flows_total",
        "counter",
        "Flows in TIME_WAIT or CLOSE ended by a new SYN of their tuple (scheduled afresh).",
        |o, n, i| per_worker(o, n, i, |w| f(w.reused_flows)),
    ),
    fam(
        "xvs_synproxy_syns_total",
        "counter",
        "SYN proxy: SYN-ACKs with a SYN cookie sent to clients, per worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.synproxy_syns)),
    ),
    fam(
        "xvs_synproxy_acks_total",
        "counter",
        "SYN proxy: client ACKs with a valid cookie that opened a backend connection, per worker.",
        |o, n, i| per_worker(o, n, i, |w| f(w.synproxy_acks)),
    ),
    fam(
        "xvs_expired_flows_total",
        "counter",
        "Flows expired by the worker's sweeps.",
        |o, n, i| per_worker(o, n, i, |w| f(w.expired_flows)),
    ),
    fam(
        "xvs_worker_busy_seconds_total",
        "counter",
        "Time the worker spent in polls that moved frames; the rest of its (busy-polling) \
         core's time found empty rings.",
        |o, n, i| per_worker(o, n, i, |w| w.busy_ns as f64 / 1e9),
    ),
    fam(
        "xvs_worker_snapshot_generation",
        "gauge",
        "Snapshot generation each worker last loaded.",
        |o, n, i| per_worker(o, n, i, |w| f(w.generation)),
    ),
    Row::Group(|o, i| super::sockets::render(o, &i.stats.sockets)),
    // Services and backends.
    fam(
        "xvs_backend_connections",
        "gauge",
        "Live flows per backend: active = TCP ESTABLISHED, inactive = every other state.",
        backend_connections,
    ),
    fam(
        "xvs_backend_usable",
        "gauge",
        "1 when the backend takes new flows (ready and healthy), else 0.",
        |o, n, i| per_backend(o, n, i, |b| u8::from(b.usable).into()),
    ),
    fam(
        "xvs_backend_weight",
        "gauge",
        "Configured backend weight (0: draining).",
        |o, n, i| per_backend(o, n, i, |b| b.weight.into()),
    ),
    fam(
        "xvs_services",
        "gauge",
        "Services in the published snapshot.",
        |o, n, i| o.sample(n, &[], f(i.services.len() as u64)),
    ),
    fam(
        "xvs_service_frozen",
        "gauge",
        "1 when the service refuses new flows (frozen, or the node is).",
        |o, n, i| {
            for s in i.services {
                o.sample(n, &[("service", &s.name)], u8::from(s.frozen));
            }
        },
    ),
    fam(
        "xvs_service_rate_limited_total",
        "counter",
        "New flows refused by the service's new-connection rate limit (services with one).",
        |o, n, i| {
            for s in i.services.iter().filter(|s| s.rate_limit.is_some()) {
                o.sample(n, &[("service", &s.name)], f(s.rate_limited));
            }
        },
    ),
    Row::Group(|o, i| super::traffic_metrics::render(o, i.services)),
    // Governance.
    fam(
        "xvs_frozen",
        "gauge",
        "1 while every new flow is refused (the freeze switch).",
        |o, n, i| o.sample(n, &[], u8::from(i.stats.governance.frozen)),
    ),
    fam(
        "xvs_draining",
        "gauge",
        "1 while the node drains (/healthz answers 503).",
        |o, n, i| o.sample(n, &[], u8::from(i.stats.governance.draining)),
    ),
    fam(
        "xvs_removed_backend_flows_total",
        "counter",
        "Flows of removed or unusable backends acted on: resteered = UDP flows removed so their next packet is scheduled again; ended = TCP/SCTP flows of removed backends ended.",
        |o, n, i| {
            let g = &i.stats.governance;
            labelled(
                o,
                n,
                "action",
                [("resteered", g.flows_resteered), ("ended", g.flows_ended)],
            );
        },
    ),
    // State files refused at start-up.
    fam(
        "xvs_state_refused_total",
        "counter",
        "What the start-up refused of the state files, by file and kind: file = the file set aside (a link, a directory, a file others could write, a damaged header or export); flow = flows or records dropped (invalid, or not this config's); index = the flow table's index rebuilt.",
        |o, n, i| {
            for r in &i.stats.state.refused {
                o.sample(n, &[("file", &r.file), ("kind", &r.kind)], f(r.count));
            }
        },
    ),
    // Flow table.
    fam("xvs_flowtable_flows", "gauge", "Live flows.", |o, n, i| {
        o.sample(n, &[], f(i.stats.flowtable.flows));
    }),
    fam(
        "xvs_flowtable_embryonic_flows",
        "gauge",
        "Live TCP flows whose handshake has not completed (the SYN proxy's auto threshold applies to it).",
        |o, n, i| o.sample(n, &[], f(i.stats.flowtable.embryonic)),
    ),
    fam(
        "xvs_flowtable_entries",
        "gauge",
        "Entries in use: one a flow, two an IPv6 flow (against xvs_flowtable_capacity).",
        |o, n, i| o.sample(n, &[], f(i.stats.flowtable.entries)),
    ),
    fam(
        "xvs_flowtable_capacity",
        "gauge",
        "Entries of the table: the most IPv4 flows it holds (an IPv6 flow takes two).",
        |o, n, i| o.sample(n, &[], f(i.stats.flowtable.capacity)),
    ),
    fam(
        "xvs_flowtable_bytes_per_flow",
        "gauge",
        "Memory per flow slot (entry and index), bytes.",
        |o, n, i| o.sample(n, &[], i.stats.flowtable.bytes_per_flow),
    ),
    fam(
        "xvs_flowtable_inserts_total",
        "counter",
        "Flows inserted.",
        |o, n, i| o.sample(n, &[], f(i.stats.flowtable.inserted)),
    ),
    fam(
        "xvs_flowtable_insert_failures_total",
        "counter",
        "Inserts refused, by reason.",
        |o, n, i| {
            let t = &i.stats.flowtable;
            let reasons = [
                ("full", t.full),
                ("exists", t.exists),
                ("reply_in_use", t.reply_in_use),
                ("index_full", t.index_full),
            ];
            labelled(o, n, "reason", reasons);
        },
    ),
    fam(
        "xvs_flowtable_recycled_total",
        "counter",
        "Embryonic or expired flows recycled by inserts into a full table.",
        |o, n, i| o.sample(n, &[], f(i.stats.flowtable.recycled)),
    ),
    fam(
        "xvs_flowtable_gave_way_total",
        "counter",
        "Half-open TCP flows ended early under pressure: given way to a new flow for their SNAT port, or expired after tcp_syn_pressure.",
        |o, n, i| o.sample(n, &[], f(i.stats.flowtable.gave_way)),
    ),
    fam(
        "xvs_flowtable_under_pressure",
        "gauge",
        "1 while the flow table is under pressure (7/8 full, or half-open flows gave way within the last 10 s).",
        |o, n, i| o.sample(n, &[], f(u64::from(i.stats.flowtable.under_pressure))),
    ),
    fam(
        "xvs_flowtable_expired_total",
        "counter",
        "Flows expired by sweeps.",
        |o, n, i| o.sample(n, &[], f(i.stats.flowtable.expired)),
    ),
    fam(
        "xvs_flowtable_removed_total",
        "counter",
        "Flows removed explicitly.",
        |o, n, i| o.sample(n, &[], f(i.stats.flowtable.removed)),
    ),
    Row::Group(|o, i| {
        if let Some(p) = &i.stats.peer_sync {
            super::sync_metrics::peer_sync(o, p);
        }
    }),
    // Steering.
    fam(
        "xvs_steer_frames_total",
        "counter",
        "Frames seen by the XDP steering program, by interface and class.",
        |o, n, i| {
            for s in &i.stats.steering {
                for (class, c) in &s.counters {
                    o.sample(n, &[("interface", &s.interface), ("class", class)], f(*c));
                }
            }
        },
    ),
    fam(
        "xvs_steer_redirected_total",
        "counter",
        "Frames the steering program handed to an AF_XDP socket.",
        |o, n, i| {
            for s in &i.stats.steering {
                o.sample(n, &[("interface", &s.interface)], f(s.redirected));
            }
        },
    ),
    // Sync loop.
    fam(
        "xvs_snapshot_generation",
        "gauge",
        "Generation of the published snapshot.",
        |o, n, i| o.sample(n, &[], f(i.stats.generation)),
    ),
    Row::Group(|o, i| super::sync_metrics::sync(o, &i.stats.sync)),
    fam(
        "xvs_syncs_total",
        "counter",
        "Snapshots published.",
        |o, n, i| o.sample(n, &[], f(i.stats.sync.syncs)),
    ),
    fam(
        "xvs_config_reloads_total",
        "counter",
        "Config reloads, by result (failed: the running config stayed).",
        |o, n, i| {
            let s = &i.stats.sync;
            labelled(
                o,
                n,
                "result",
                [("ok", s.reloads_ok), ("failed", s.reloads_failed)],
            );
        },
    ),
    fam(
        "xvs_refused",
        "gauge",
        "Objects or parts of objects refused now (not programmed, or only as they were before), by kind: the Kubernetes source's problems and the snapshot builder's refusals (snapshot_build).",
        |o, n, i| {
            for (kind, c) in &i.stats.refused.current {
                o.sample(n, &[("kind", kind)], f(*c));
            }
        },
    ),
    fam(
        "xvs_refused_total",
        "counter",
        "Refusals reported, by kind: each counted once, when the change that brings it is first seen.",
        |o, n, i| {
            for (kind, c) in &i.stats.refused.total {
                o.sample(n, &[("kind", kind)], f(*c));
            }
        },
    ),
    Row::Group(bgp),
    // The health endpoints themselves, like kube-proxy's proxy_healthz_total.
    fam(
        "xvs_healthz_total",
        "counter",
        "/healthz answers, by HTTP code.",
        |o, n, i| {
            let p = i.probes;
            labelled(
                o,
                n,
                "code",
                [("200", p.healthz_ok), ("503", p.healthz_fail)],
            );
        },
    ),
    fam(
        "xvs_livez_total",
        "counter",
        "/livez answers, by HTTP code.",
        |o, n, i| {
            let p = i.probes;
            labelled(o, n, "code", [("200", p.livez_ok), ("503", p.livez_fail)]);
        },
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::views::WorkerView;
    use fastpath::worker::WorkerCounters;

    #[test]
    fn state_refusals_are_counted_by_file_and_kind() {
        let stats = StatsView {
            state: crate::admin::views::StateView {
                refused: vec![crate::admin::views::StateRefusal {
                    file: "flows".into(),
                    kind: "flow".into(),
                    count: 3,
                }],
            },
            ..StatsView::default()
        };
        let text = render(&stats, &[], &ProbeCounts::default());
        assert!(
            text.contains("xvs_state_refused_total{file=\"flows\",kind=\"flow\"} 3\n"),
            "{text}"
        );
    }

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
