//! The tables of `xvs status`, `xvs services` and `xvs flows`, and how their numbers read:
//! scaled with SI prefixes (`1.2M` packets, `96.1 kB`, `3.4 Gbit/s`: traffic rates in bits
//! per second, as links are counted, where the API gives bytes per second as IPVS does),
//! or exactly as the API gave them (`--exact`; rates to two decimals). Headers name the unit
//! where the column's name does not (`INBIT/S`).

use std::fmt::Write as _;
use std::time::SystemTime;

use slowpath::admin::{
    FlowsResponse, HealthzBody, RateView, ServiceView, ServicesResponse, StatsView, TrafficView,
};

use super::{Endpoint, ServicesShow};

/// SI prefixes, by powers of 1000.
const PREFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];

/// `v` with an SI prefix: `(number, prefix)`, the number below 1000 with one decimal below
/// 100 (`1.2`, `12.3`, `123`) and none without a prefix unless it has a fraction below 10
/// (`2.5` connections a second, `40` packets).
fn si(v: f64) -> (String, &'static str) {
    if !v.is_finite() || v <= 0.0 {
        return ("0".to_owned(), "");
    }
    let (mut x, mut i) = (v, 0);
    // 999.5 would print as "1000": it is 1.0 of the next prefix.
    while x >= 999.5 && i + 1 < PREFIXES.len() {
        x /= 1000.0;
        i += 1;
    }
    let n = match i {
        0 if x.fract() == 0.0 || x >= 9.95 => format!("{x:.0}"),
        0 => format!("{x:.1}"),
        _ if x < 99.95 => format!("{x:.1}"),
        _ => format!("{x:.0}"),
    };
    (n, PREFIXES[i])
}

/// A rate as the API gave it: whole, or to two decimals without trailing zeros.
fn exact_f64(v: f64) -> String {
    if v.fract() == 0.0 {
        return format!("{v:.0}");
    }
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// How a table prints numbers: scaled, or exact (`--exact`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Num {
    /// `--exact`.
    pub exact: bool,
}

impl Num {
    /// A count (packets, frames, flows, connections): `1.2M`.
    pub fn count(self, n: u64) -> String {
        if self.exact {
            return n.to_string();
        }
        let (x, p) = si(n as f64);
        format!("{x}{p}")
    }

    /// A count per second: `2.5`, `1.2M`.
    pub fn per_s(self, v: f64) -> String {
        if self.exact {
            return exact_f64(v);
        }
        let (x, p) = si(v);
        format!("{x}{p}")
    }

    /// Bytes: `96.1 kB`.
    pub fn bytes(self, n: u64) -> String {
        if self.exact {
            return n.to_string();
        }
        let (x, p) = si(n as f64);
        format!("{x} {p}B")
    }

    /// A rate of bytes per second, in bits per second: `3.4 Gbit/s`.
    pub fn bits_per_s(self, bytes_per_s: f64) -> String {
        let bits = bytes_per_s * 8.0;
        if self.exact {
            return exact_f64(bits);
        }
        let (x, p) = si(bits);
        format!("{x} {p}bit/s")
    }
}

/// Left-aligned columns, two spaces apart, each line indented by `indent`.
pub(super) fn table(indent: &str, header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::from(indent);
        for (i, (c, w)) in cells.zip(&width).enumerate() {
            if i + 1 == width.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

pub(super) fn render_status(
    admin: &Endpoint,
    code: u16,
    h: &HealthzBody,
    s: &StatsView,
    now: SystemTime,
    exact: bool,
) -> String {
    let num = Num { exact };
    let mut o = String::new();
    let state = if code == 200 {
        "healthy".to_owned()
    } else {
        format!(
            "UNHEALTHY ({code}): {}",
            h.reason.as_deref().unwrap_or("no reason given")
        )
    };
    let _ = writeln!(o, "xvs at {admin}: {state}");
    let fastpath = if h.fastpath_running {
        "running"
    } else {
        "NOT running"
    };
    let _ = writeln!(o, "fastpath:   {fastpath}, {} workers", s.workers.len());
    let last = match s.sync.last_sync_unix_s {
        Some(t) => {
            let now_s = slowpath::admin::unix_s(now);
            format!(
                "last {} ({:.1}s ago), took {:.1} ms",
                if h.last_updated.is_empty() {
                    "?"
                } else {
                    &h.last_updated
                },
                (now_s - t).max(0.0),
                s.sync.last_duration_s * 1e3
            )
        }
        None => "never".to_owned(),
    };
    let _ = writeln!(
        o,
        "sync:       generation {}, {last}; {} syncs; reloads {} ok, {} failed",
        s.generation, s.sync.syncs, s.sync.reloads_ok, s.sync.reloads_failed
    );
    if let Some(b) = &s.bgp {
        bgp_line(&mut o, b);
    }
    let t = &s.flowtable;
    // How full: entries, since an IPv6 flow takes two (an older xvs reports none: its flows).
    let used = t.entries.max(t.flows);
    let pct = if t.capacity == 0 {
        0.0
    } else {
        used as f64 * 100.0 / t.capacity as f64
    };
    let ipv6 = if used > t.flows {
        format!(", {} entries with IPv6 flows' second", num.count(used))
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "flow table: {} / {} flows ({pct:.1}%{ipv6}), {:.0} bytes per flow; inserted {}, refused full {}, recycled {}, expired {}",
        num.count(t.flows),
        num.count(t.capacity),
        t.bytes_per_flow,
        num.count(t.inserted),
        num.count(t.full),
        num.count(t.recycled),
        num.count(t.expired)
    );
    o.push_str(&frames(s, num));
    o
}

/// The BGP line of `xvs status` (`[bgp]` on).
fn bgp_line(o: &mut String, b: &slowpath::admin::BgpView) {
    let _ = writeln!(
        o,
        "bgp:        {}, BIRD {}; announcing {} VIPs, {} SNAT, {} backups; {} reconfigures, {} errors{}",
        if b.live { "live" } else { "NOT live" },
        if b.in_sync { "in sync" } else { "NOT in sync" },
        b.vips,
        b.snat,
        b.backups,
        b.reconfigures,
        b.errors,
        b.last_error
            .as_deref()
            .map_or_else(String::new, |e| format!("; last error: {e}"))
    );
}

/// The workers', drops' and steering's tables of `xvs status` (frames, unless named).
fn frames(s: &StatsView, num: Num) -> String {
    let mut o = String::new();
    if !s.workers.is_empty() {
        o.push_str("\nworkers (frames):\n");
        let rows: Vec<Vec<String>> = s
            .workers
            .iter()
            .map(|w| {
                vec![
                    w.index.to_string(),
                    num.count(w.rx),
                    num.count(w.tx),
                    num.count(w.pass),
                    num.count(w.slow),
                    num.count(w.drops.values().sum::<u64>()),
                    num.count(w.new_flows),
                    w.generation.to_string(),
                ]
            })
            .collect();
        o.push_str(&table(
            "  ",
            &[
                "WORKER",
                "RX",
                "TX",
                "PASS",
                "SLOW",
                "DROPS",
                "NEW_FLOWS",
                "GEN",
            ],
            &rows,
        ));
    }
    let nonzero = by_reason(s, |w| &w.drops, num);
    if !nonzero.is_empty() {
        o.push_str("\ndrops:\n");
        o.push_str(&table("  ", &["REASON", "FRAMES"], &nonzero));
    }
    let nonzero = by_reason(s, |w| &w.rejects, num);
    if !nonzero.is_empty() {
        o.push_str("\nrejects (answered with an RST or a port unreachable):\n");
        o.push_str(&table("  ", &["REASON", "FRAMES"], &nonzero));
    }
    if !s.steering.is_empty() {
        o.push_str("\nsteering (frames):\n");
        let rows: Vec<Vec<String>> = s
            .steering
            .iter()
            .map(|x| {
                vec![
                    x.interface.clone(),
                    num.count(x.redirected),
                    num.count(x.passed),
                ]
            })
            .collect();
        o.push_str(&table("  ", &["INTERFACE", "REDIRECTED", "PASSED"], &rows));
    }
    o
}

/// The reasons with frames, summed over the workers (`field` picks a worker's counts).
fn by_reason(
    s: &StatsView,
    field: fn(&slowpath::admin::WorkerView) -> &std::collections::BTreeMap<String, u64>,
    num: Num,
) -> Vec<Vec<String>> {
    let mut sum: std::collections::BTreeMap<&str, u64> = Default::default();
    for w in &s.workers {
        for (r, n) in field(w) {
            *sum.entry(r).or_default() += n;
        }
    }
    sum.iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| vec![(*r).to_owned(), num.count(*n)])
        .collect()
}

/// A service's backends and its total (`(service)`), with their traffic
/// (`ipvsadm -Ln --stats`) or its rates (`--rate`).
fn traffic_table(s: &ServiceView, rates: bool, num: Num) -> String {
    let cells = |t: &TrafficView, r: &RateView| -> [String; 5] {
        if rates {
            [
                num.per_s(r.cps),
                num.per_s(r.in_pps),
                num.per_s(r.out_pps),
                num.bits_per_s(r.in_bps),
                num.bits_per_s(r.out_bps),
            ]
        } else {
            [
                num.count(t.conns),
                num.count(t.in_pkts),
                num.count(t.out_pkts),
                num.bytes(t.in_bytes),
                num.bytes(t.out_bytes),
            ]
        }
    };
    let row = |name: String, t: &TrafficView, r: &RateView| {
        std::iter::once(name).chain(cells(t, r)).collect::<Vec<_>>()
    };
    let mut rows: Vec<Vec<String>> = s
        .backends
        .iter()
        .map(|b| row(b.addr.to_string(), &b.stats, &b.rate))
        .collect();
    rows.push(row("(service)".to_owned(), &s.stats, &s.rate));
    let head: &[&str] = if rates {
        &[
            "BACKEND",
            "CONNS/S",
            "INPKTS/S",
            "OUTPKTS/S",
            "INBIT/S",
            "OUTBIT/S",
        ]
    } else {
        &[
            "BACKEND", "CONNS", "INPKTS", "OUTPKTS", "INBYTES", "OUTBYTES",
        ]
    };
    table("  ", head, &rows)
}

pub(super) fn render_services(r: &ServicesResponse, show: ServicesShow, exact: bool) -> String {
    let num = Num { exact };
    if r.services.is_empty() {
        return "no services\n".to_owned();
    }
    let mut o = String::new();
    for (i, s) in r.services.iter().enumerate() {
        if i > 0 {
            o.push('\n');
        }
        service_line(&mut o, s);
        if s.backends.is_empty() {
            o.push_str("  (no backends)\n");
            continue;
        }
        match show {
            ServicesShow::Connections => {
                let rows: Vec<Vec<String>> = s
                    .backends
                    .iter()
                    .map(|b| {
                        vec![
                            b.addr.to_string(),
                            b.weight.to_string(),
                            if b.usable { "yes" } else { "no" }.to_owned(),
                            num.count(u64::from(b.active)),
                            num.count(u64::from(b.inactive)),
                        ]
                    })
                    .collect();
                o.push_str(&table(
                    "  ",
                    &["BACKEND", "WEIGHT", "USABLE", "ACTIVE", "INACTIVE"],
                    &rows,
                ));
            }
            ServicesShow::Stats => o.push_str(&traffic_table(s, false, num)),
            ServicesShow::Rate => o.push_str(&traffic_table(s, true, num)),
        }
    }
    o
}

/// A service's line of `xvs services`: name, frontends, scheduler and mode, and what
/// limits it.
fn service_line(o: &mut String, s: &ServiceView) {
    let frontends: Vec<String> = s
        .frontends
        .iter()
        .map(|f| {
            let ip = match f.vip {
                std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                v4 => v4.to_string(),
            };
            format!("{ip}:{}/{}", f.port, f.protocol)
        })
        .collect();
    let _ = write!(
        o,
        "{}  {}  {} {}",
        s.name,
        frontends.join(" "),
        s.scheduler,
        s.mode
    );
    if let Some(t) = s.affinity_timeout_s {
        let _ = write!(o, "  affinity {t}s");
    }
    if let Some(l) = s.rate_limit {
        let _ = write!(
            o,
            "  limit {}/s burst {} ({} refused)",
            l.rate, l.burst, s.rate_limited
        );
    }
    if s.frozen {
        o.push_str("  FROZEN");
    }
    o.push('\n');
}

pub(super) fn render_flows(r: &FlowsResponse) -> String {
    let rows: Vec<Vec<String>> = r
        .flows
        .iter()
        .map(|f| {
            vec![
                f.protocol.clone(),
                f.client.to_string(),
                f.vip.to_string(),
                f.backend.to_string(),
                f.snat.to_string(),
                f.state.clone(),
                format!("{:.1}s", f.idle_s),
                f.service.clone(),
            ]
        })
        .collect();
    let mut o = table(
        "",
        &[
            "PROTO", "CLIENT", "VIP", "BACKEND", "SNAT", "STATE", "IDLE", "SERVICE",
        ],
        &rows,
    );
    if r.truncated {
        let _ = writeln!(
            o,
            "showing {} of {} flows; use --limit (at most 10000) or narrow the filters",
            r.flows.len(),
            r.total_matched
        );
    } else if r.total_matched > 0 || r.flows.is_empty() {
        let _ = writeln!(o, "{} flows shown (all that matched)", r.flows.len());
    } else {
        // An older xvs, which does not count.
        let _ = writeln!(
            o,
            "{} flows shown (limit {}{})",
            r.flows.len(),
            r.limit,
            if r.flows.len() >= r.limit {
                "; there may be more"
            } else {
                ""
            }
        );
    }
    o
}
