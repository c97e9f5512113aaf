//! `perf-lab report`: JSON results -> `report.md` (one table per scenario and mode, targets
//! as rows, with xvs/nft and xvs/l2fwd ratios) and hand-written SVG plots per scenario:
//!
//! - generator mode: `<scenario>-generator-rate.svg`, forwarded (y) vs offered (x) rate per
//!   target from the main run and the NDR trials; `<scenario>-generator-latency.svg`,
//!   p50/p99/p99.9 per target on a log axis (at the common latency rate when every run has
//!   that trial).
//! - saturation mode: `<scenario>-saturation-rate.svg`, the forwarded rate per target (there
//!   is no offered rate, and no latency, so no latency plot).
//! - bulk-tcp: `bulk-tcp-generator-rate.svg`, iperf3 goodput per target, 1 and 8 streams;
//!   conn-rate: `conn-rate-generator-rate.svg` (connections/s) and
//!   `conn-rate-generator-latency.svg` (ab's request times, log axis).
//!
//! Several results of one target in one scenario and mode (`campaign.sh` with `REPEATS`)
//! make one row: the median of each figure over the runs (the worst for a swap's loss),
//! with the runs' spread of forwarded rates under the table; the charts draw the median
//! with whiskers from the lowest to the highest run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::bench::{Latency, Mode, RunResult, Scenario};
use crate::restart::{Restart, Restarts};
use crate::target::Target;

/// Files written.
#[derive(Debug, Default)]
pub struct Written {
    /// The Markdown file.
    pub markdown: PathBuf,
    /// The SVG files.
    pub svgs: Vec<PathBuf>,
}

/// Reads the results and writes the report into `out`.
pub fn report(inputs: &[PathBuf], out: &Path) -> anyhow::Result<Written> {
    let mut results = Vec::new();
    for p in inputs {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let r: RunResult =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
        results.push(r);
    }
    std::fs::create_dir_all(out)?;
    let mut groups: BTreeMap<(String, &'static str), Vec<&RunResult>> = BTreeMap::new();
    for r in &results {
        let mode = match r.mode {
            Mode::Generator => "generator",
            Mode::Saturation => "saturation",
            Mode::Dsr => "dsr",
        };
        groups
            .entry((serde_plain(&r.scenario), mode))
            .or_default()
            .push(r);
    }
    let mut md = String::from(
        "# perf-lab results\n\nRates in packets/s, latency one-way in µs (the main table's: at \
         the run's rate, which at the rig's limit is mostly queueing; the latency table and \
         plot: at one rate every target carries), CPU in ns per forwarded \
         packet (kernel targets: the LB core's busy time; busy-polling targets: the time of \
         their polls that moved frames). Loss ratio in %. NDR: highest offered rate with loss \
         ≤ 0.1%. Busy %: the target's and the rig (generator) core's share of the window; a \
         rig at ~100% bounded the run, so that forwarded rate is a lower bound of the \
         target's.\n",
    );
    let mut written = Written::default();
    for ((scenario, mode), all) in groups {
        let mut by_target: BTreeMap<Target, Vec<&RunResult>> = BTreeMap::new();
        for r in all {
            by_target.entry(r.target).or_default().push(r);
        }
        let real = by_target
            .values()
            .next()
            .and_then(|v| v.first())
            .map(|r| r.scenario)
            .filter(|s| s.real_client());
        if let Some(sc) = real {
            let targets: Vec<(Target, Vec<&RunResult>)> = by_target.into_iter().collect();
            match sc {
                Scenario::BulkTcp => bulk_section(&mut md, out, &targets, &mut written)?,
                _ => conn_section(&mut md, out, &targets, &mut written)?,
            }
            continue;
        }
        let combined: Vec<(RunResult, usize, f64, f64)> = by_target
            .values()
            .map(|runs| {
                let fwd = runs.iter().map(|r| r.forwarded_pps);
                let (lo, hi) = (
                    fwd.clone().fold(f64::MAX, f64::min),
                    fwd.fold(0.0, f64::max),
                );
                (combine(runs), runs.len(), lo, hi)
            })
            .collect();
        let rs: Vec<&RunResult> = combined.iter().map(|c| &c.0).collect();
        let _ = writeln!(md, "\n## {scenario} ({mode} mode)\n");
        let first = rs[0];
        let _ = writeln!(
            md,
            "{} flows, {} services, {} backends, {} queue(s), kind {}, size {}, {} s.\n",
            first.flows,
            first.services,
            first.backends,
            first.queues,
            serde_plain(&first.kind),
            first.size,
            first.duration_s
        );
        let busy_poll: Vec<String> = rs
            .iter()
            .filter_map(|r| {
                let b = r.napi_busy_poll?;
                Some(format!(
                    "{} {}",
                    r.target.name(),
                    if b { "on" } else { "off" }
                ))
            })
            .collect();
        if !busy_poll.is_empty() {
            let _ = writeln!(md, "NAPI busy polling: {}.\n", busy_poll.join(", "));
        }
        md.push_str("| target | offered pps | forwarded pps | loss % | p50 µs | p99 µs | p99.9 µs | ns/pkt | busy % target / rig | NDR pps |\n");
        md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for r in &rs {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} |",
                r.target.name(),
                opt(r.offered_pps, 0),
                num(r.forwarded_pps, 0),
                opt(r.loss_ratio.map(|l| l * 100.0), 3),
                opt(r.latency_us.p50, 1),
                opt(r.latency_us.p99, 1),
                opt(r.latency_us.p999, 1),
                opt(r.cpu_ns_per_pkt, 0),
                opt(r.target_busy_ratio.map(|b| b * 100.0), 0),
                num(r.rig_core_busy_ratio * 100.0, 0),
                opt(r.ndr_pps, 0),
            );
        }
        if combined.iter().any(|c| c.1 > 1) {
            let spread: Vec<String> = combined
                .iter()
                .map(|(r, n, lo, hi)| {
                    format!("{} {n} ({}–{})", r.target.name(), num(*lo, 0), num(*hi, 0))
                })
                .collect();
            let _ = writeln!(
                md,
                "\nMedians of the runs; runs per target (forwarded pps, lowest–highest): {}.",
                spread.join(", ")
            );
        }
        let get = |t: Target| rs.iter().find(|r| r.target == t);
        if let Some(x) = get(Target::Xvs) {
            for (other, name) in [(Target::Nft, "nft"), (Target::L2fwd, "l2fwd")] {
                if let Some(o) = get(other) {
                    let _ = writeln!(
                        md,
                        "\nxvs/{name}: forwarded ×{}, ns/pkt ×{}, NDR ×{}",
                        ratio(Some(x.forwarded_pps), Some(o.forwarded_pps)),
                        ratio(x.cpu_ns_per_pkt, o.cpu_ns_per_pkt),
                        ratio(x.ndr_pps, o.ndr_pps),
                    );
                }
            }
        }
        latency_table(&mut md, &rs);
        restart_table(&mut md, &by_target);
        for r in &rs {
            if let Some(s) = &r.swap {
                let _ = writeln!(
                    md,
                    "\n{}: change at {:.2} s lost {} of {} packets in the window (-100 ms..+1 s){}.",
                    r.target.name(),
                    s.at_s,
                    s.loss_pkts,
                    s.window_pkts,
                    s.before_loss_pkts
                        .map(|b| format!("; {b} in as many packets just before it"))
                        .unwrap_or_default()
                );
            }
        }
        let stem = format!("{scenario}-{mode}");
        let targets: Vec<(Target, Vec<&RunResult>)> = by_target.into_iter().collect();
        let mut files = Vec::new();
        if mode == "generator" {
            files.push((
                "rate",
                format!("{stem}-rate.svg"),
                rate_svg(
                    &format!("{scenario} (generator): forwarded vs offered rate"),
                    &rs,
                ),
            ));
            if let Some(c) = latency_chart(&scenario, &targets) {
                files.push(("latency", format!("{stem}-latency.svg"), c.svg()));
            }
        } else {
            // No offered rate and no latency in saturation mode: the forwarded rate per target.
            let chart = Chart {
                title: format!("{scenario} (saturation): forwarded rate"),
                ylabel: "forwarded (pps)".into(),
                series: vec!["forwarded".into()],
                groups: targets
                    .iter()
                    .map(|(t, runs)| {
                        let v = Stat::of(runs.iter().map(|r| Some(r.forwarded_pps)));
                        (t.name().to_owned(), vec![v])
                    })
                    .collect(),
                log: false,
                digits: 0,
            };
            files.push(("rate", format!("{stem}-rate.svg"), chart.svg()));
        }
        write_svgs(&mut md, out, files, &mut written)?;
    }
    let md_path = out.join("report.md");
    std::fs::write(&md_path, md)?;
    written.markdown = md_path;
    Ok(written)
}

/// Writes the SVGs into `out` and links them from the Markdown.
fn write_svgs(
    md: &mut String,
    out: &Path,
    files: Vec<(&str, String, String)>,
    written: &mut Written,
) -> anyhow::Result<()> {
    let mut links = Vec::new();
    for (alt, name, svg) in files {
        let p = out.join(&name);
        std::fs::write(&p, svg).with_context(|| format!("writing {}", p.display()))?;
        links.push(format!("![{alt}]({name})"));
        written.svgs.push(p);
    }
    if !links.is_empty() {
        let _ = writeln!(md, "\n{}", links.join(" "));
    }
    Ok(())
}

/// xvs's figure over nft's, of the medians.
fn ratio_line(targets: &[(Target, Vec<Option<Stat>>)], what: &[&str]) -> Option<String> {
    let get = |t: Target| targets.iter().find(|(x, _)| *x == t).map(|(_, v)| v);
    let (x, n) = (get(Target::Xvs)?, get(Target::Nft)?);
    let parts: Vec<String> = what
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let r = ratio(x[i].map(|s| s.med), n[i].map(|s| s.med));
            format!("{w} ×{r}")
        })
        .collect();
    Some(format!("\nxvs/nft: {}\n", parts.join(", ")))
}

/// bulk-tcp: goodput of 1 and 8 streams per target, table and chart.
fn bulk_section(
    md: &mut String,
    out: &Path,
    targets: &[(Target, Vec<&RunResult>)],
    written: &mut Written,
) -> anyhow::Result<()> {
    let secs = targets[0].1[0].duration_s;
    let _ = writeln!(
        md,
        "\n## bulk-tcp (real clients)\n\niperf3 through the VIP to one backend, {secs} s per run \
         (1 stream, then 8), DNAT; goodput at the receiver in Gbit/s. Busy %: the target's and \
         the rig core's (iperf3 client and server, the veths' receive) share of the run.\n\n\
         | target | runs | streams | Gbit/s | retransmits | busy % target / rig | ns/pkt target / rig | xvs tx_ring_full |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut medians = Vec::new();
    let mut groups = Vec::new();
    for (t, runs) in targets {
        let mut per = Vec::new();
        for (k, streams) in crate::realclient::IPERF_STREAMS.iter().enumerate() {
            let b: Vec<&crate::realclient::BulkRun> = runs
                .iter()
                .filter_map(|r| r.bulk_tcp.as_ref()?.get(k))
                .filter(|b| b.streams == *streams)
                .collect();
            let gbit = Stat::of(b.iter().map(|b| Some(b.gbit_s)));
            let _ = writeln!(
                md,
                "| {} | {} | {streams} | {} | {} | {} / {} | {} / {} | {} |",
                t.name(),
                b.len(),
                stat_text(gbit, 2),
                stat_text(
                    Stat::of(b.iter().map(|b| b.retransmits.map(|n| n as f64))),
                    0
                ),
                stat_text(
                    Stat::of(b.iter().map(|b| b.target_busy_ratio.map(|v| v * 100.0))),
                    0
                ),
                stat_text(
                    Stat::of(b.iter().map(|b| Some(b.rig_core_busy_ratio * 100.0))),
                    0
                ),
                stat_text(Stat::of(b.iter().map(|b| b.cpu_ns_per_pkt)), 0),
                stat_text(Stat::of(b.iter().map(|b| b.rig_ns_per_pkt)), 0),
                stat_text(
                    Stat::of(
                        b.iter()
                            .map(|b| b.target_metrics.get("tx_ring_full").copied())
                    ),
                    0
                ),
            );
            per.push(gbit);
        }
        medians.push((*t, per.clone()));
        groups.push((t.name().to_owned(), per));
    }
    if let Some(l) = ratio_line(&medians, &["1 stream", "8 streams"]) {
        md.push_str(&l);
    }
    let chart = Chart {
        title: "bulk-tcp: iperf3 goodput through the VIP".into(),
        ylabel: "goodput (Gbit/s)".into(),
        series: vec!["1 stream".into(), "8 streams".into()],
        groups,
        log: false,
        digits: 2,
    };
    write_svgs(
        md,
        out,
        vec![(
            "bulk-tcp",
            "bulk-tcp-generator-rate.svg".into(),
            chart.svg(),
        )],
        written,
    )
}

/// conn-rate: connections per second and request times per target, table and charts.
fn conn_section(
    md: &mut String,
    out: &Path,
    targets: &[(Target, Vec<&RunResult>)],
    written: &mut Written,
) -> anyhow::Result<()> {
    let first = targets[0].1[0];
    let conc = first.conn_rate.as_ref().map_or(0, |c| c.concurrency);
    let _ = writeln!(
        md,
        "\n## conn-rate (real clients)\n\nab (HTTP/1.0, a new TCP connection per request, \
         concurrency {conc}) through the VIP to {} backends for {} s, DNAT. Request time: \
         connect to close, ms. Busy %: the target's and the rig core's (ab, the servers, the \
         veths' receive) share of the run.\n\n\
         | target | runs | connections/s | failed | p50 ms | p99 ms | max ms | CPU µs/conn target / rig | busy % target / rig |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|",
        first.backends, first.duration_s
    );
    let mut medians = Vec::new();
    let (mut rate_groups, mut lat_groups) = (Vec::new(), Vec::new());
    for (t, runs) in targets {
        let c: Vec<&crate::realclient::ConnRate> =
            runs.iter().filter_map(|r| r.conn_rate.as_ref()).collect();
        let rate = Stat::of(c.iter().map(|c| Some(c.conn_per_s)));
        let (p50, p99, max) = (
            Stat::of(c.iter().map(|c| c.latency_ms.p50)),
            Stat::of(c.iter().map(|c| c.latency_ms.p99)),
            Stat::of(c.iter().map(|c| c.latency_ms.max)),
        );
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} |",
            t.name(),
            c.len(),
            stat_text(rate, 0),
            c.iter().map(|c| c.failed).max().unwrap_or(0),
            stat_text(p50, 3),
            stat_text(p99, 3),
            stat_text(max, 3),
            stat_text(Stat::of(c.iter().map(|c| c.cpu_us_per_conn)), 1),
            stat_text(Stat::of(c.iter().map(|c| c.rig_us_per_conn)), 1),
            stat_text(
                Stat::of(c.iter().map(|c| c.target_busy_ratio.map(|v| v * 100.0))),
                0
            ),
            stat_text(
                Stat::of(c.iter().map(|c| Some(c.rig_core_busy_ratio * 100.0))),
                0
            ),
        );
        medians.push((*t, vec![rate, p99]));
        rate_groups.push((t.name().to_owned(), vec![rate]));
        lat_groups.push((t.name().to_owned(), vec![p50, p99, max]));
    }
    md.push_str("\nfailed: the worst run's.\n");
    if let Some(l) = ratio_line(&medians, &["connections/s", "p99"]) {
        md.push_str(&l);
    }
    let rate = Chart {
        title: format!("conn-rate: short TCP connections through the VIP (ab -c {conc})"),
        ylabel: "connections per second".into(),
        series: vec!["connections/s".into()],
        groups: rate_groups,
        log: false,
        digits: 0,
    };
    let lat = Chart {
        title: "conn-rate: request time, connect to close".into(),
        ylabel: "request time (ms, log scale)".into(),
        series: vec!["p50".into(), "p99".into(), "max".into()],
        groups: lat_groups,
        log: true,
        digits: 2,
    };
    write_svgs(
        md,
        out,
        vec![
            (
                "conn-rate",
                "conn-rate-generator-rate.svg".into(),
                rate.svg(),
            ),
            (
                "request time",
                "conn-rate-generator-latency.svg".into(),
                lat.svg(),
            ),
        ],
        written,
    )
}

/// The median of `v` (the mean of the middle two for an even count); `None` when empty.
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The per-figure median of one target's runs. What is not a figure (per-backend counts, the
/// NDR trials the rate plot draws, counters, notes) comes from the run whose forwarded rate
/// is the median; a swap reports the worst run's loss.
fn combine(runs: &[&RunResult]) -> RunResult {
    let mut by_fwd = runs.to_vec();
    by_fwd.sort_by(|a, b| a.forwarded_pps.total_cmp(&b.forwarded_pps));
    let mut m = by_fwd[(by_fwd.len() - 1) / 2].clone();
    if runs.len() == 1 {
        return m;
    }
    let med =
        |f: &dyn Fn(&RunResult) -> Option<f64>| median(runs.iter().filter_map(|r| f(r)).collect());
    let lat = |f: &dyn Fn(&RunResult) -> Option<&Latency>| Latency {
        p50: med(&|r| f(r)?.p50),
        p99: med(&|r| f(r)?.p99),
        p999: med(&|r| f(r)?.p999),
        max: med(&|r| f(r)?.max),
    };
    m.offered_pps = med(&|r| r.offered_pps);
    m.forwarded_pps = med(&|r| Some(r.forwarded_pps)).unwrap_or_default();
    m.loss_ratio = med(&|r| r.loss_ratio);
    m.latency_us = lat(&|r| Some(&r.latency_us));
    m.cpu_ns_per_pkt = med(&|r| r.cpu_ns_per_pkt);
    m.target_busy_ratio = med(&|r| r.target_busy_ratio);
    m.rig_core_busy_ratio = med(&|r| Some(r.rig_core_busy_ratio)).unwrap_or_default();
    m.ndr_pps = med(&|r| r.ndr_pps);
    if let Some(at) = m.latency_at_rate.as_mut() {
        let trial = |r: &RunResult| r.latency_at_rate.as_ref().map(|l| l.trial.clone());
        at.trial.offered_pps = med(&|r| Some(trial(r)?.offered_pps)).unwrap_or_default();
        at.trial.forwarded_pps = med(&|r| Some(trial(r)?.forwarded_pps)).unwrap_or_default();
        at.trial.loss_ratio = med(&|r| Some(trial(r)?.loss_ratio)).unwrap_or_default();
        at.latency_us = lat(&|r| r.latency_at_rate.as_ref().map(|l| &l.latency_us));
    }
    if let Some(swap) = m.swap.as_mut() {
        for r in runs {
            if let Some(s) = &r.swap {
                swap.loss_pkts = swap.loss_pkts.max(s.loss_pkts);
                swap.before_loss_pkts = swap.before_loss_pkts.max(s.before_loss_pkts);
            }
        }
    }
    m
}

/// The latency trial at one rate (`latency_at_rate`), when the runs have one: the table and
/// what xvs adds over l2fwd.
fn latency_table(md: &mut String, rs: &[&RunResult]) {
    let at: Vec<_> = rs
        .iter()
        .filter_map(|r| r.latency_at_rate.as_ref().map(|l| (r.target, l)))
        .collect();
    if at.is_empty() {
        return;
    }
    md.push_str(
        "\nLatency at one offered rate for every target (a load they all carry):\n\n\
         | target | rate pps | forwarded pps | loss % | p50 µs | p99 µs | p99.9 µs | max µs |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (t, l) in &at {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            t.name(),
            l.trial.rate_pps,
            num(l.trial.forwarded_pps, 0),
            num(l.trial.loss_ratio * 100.0, 3),
            opt(l.latency_us.p50, 1),
            opt(l.latency_us.p99, 1),
            opt(l.latency_us.p999, 1),
            opt(l.latency_us.max, 1),
        );
    }
    let p99 = |t: Target| {
        at.iter()
            .find(|(x, _)| *x == t)
            .and_then(|(_, l)| l.latency_us.p99)
    };
    if let (Some(x), Some(l)) = (p99(Target::Xvs), p99(Target::L2fwd)) {
        let _ = writeln!(md, "\nxvs p99 − l2fwd p99 at that rate: {:+.1} µs", x - l);
    }
}

/// The restarts of the restart scenario: one row per target and signal, each figure the
/// median of the runs with the lowest and highest, flows lost the worst run's.
fn restart_table(md: &mut String, by_target: &BTreeMap<Target, Vec<&RunResult>>) {
    let mut rows = Vec::new();
    for (t, runs) in by_target {
        let all: Vec<&Restarts> = runs.iter().filter_map(|r| r.restart.as_ref()).collect();
        for signal in ["kill", "term", "takeover"] {
            let xs: Vec<&Restart> = all
                .iter()
                .filter_map(|r| match signal {
                    "kill" => Some(&r.kill),
                    "term" => r.term.as_ref(),
                    _ => r.takeover.as_ref(),
                })
                .collect();
            if !xs.is_empty() {
                rows.push((*t, signal, xs));
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    md.push_str(
        "
Restarts under load (kill: SIGKILL, then a new xvs at once; term: SIGTERM with \
         drain_timeout 0s, its exit awaited, then a new xvs; takeover: `xvs run --takeover` \
         beside the running xvs, which hands its sockets over and exits). Gap: the longest run of lost \
         packets around the restart as sending time; lost: packets lost minus those of the \
         run without a restart; flows lost: flows forwarded before the signal none of whose \
         packets after the gap was (the worst run); phases: from the signal. Medians of the \
         runs, lowest–highest in brackets:\n\n\
         | target | restart | runs | gap ms | signal to forwarding ms | packets lost | flows \
         adopted / before | flows lost | adoption ms | ready ms | starts |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (t, signal, xs) in rows {
        let spread = |f: &dyn Fn(&Restart) -> Option<f64>, digits: usize| {
            let v: Vec<f64> = xs.iter().filter_map(|x| f(x)).collect();
            let (lo, hi) = (
                v.iter().copied().fold(f64::MAX, f64::min),
                v.iter().copied().fold(f64::MIN, f64::max),
            );
            match median(v.clone()) {
                Some(m) if v.len() > 1 && lo < hi => {
                    format!(
                        "{} ({}–{})",
                        num(m, digits),
                        num(lo, digits),
                        num(hi, digits)
                    )
                }
                Some(m) => num(m, digits),
                None => "–".to_owned(),
            }
        };
        let adopted = |x: &Restart| x.flows_adopted.map(|v| v as f64);
        let before = |x: &Restart| x.flows_before.map(|v| v as f64);
        let _ = writeln!(
            md,
            "| {} | {signal} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |",
            t.name(),
            xs.len(),
            spread(&|x| Some(x.gap_ms), 1),
            spread(&|x| x.signal_to_forward_ms, 1),
            spread(&|x| Some(x.restart_lost_pkts as f64), 0),
            spread(&adopted, 0),
            spread(&before, 0),
            xs.iter().map(|x| x.flows_lost).max().unwrap_or(0),
            spread(&|x| x.adoption_ms, 1),
            spread(&|x| Some(x.ready_ms), 1),
            xs.iter().map(|x| x.start_attempts).max().unwrap_or(0),
        );
    }
}

fn serde_plain<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn num(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |v| num(v, digits))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "–".to_owned(),
    }
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];
const W: f64 = 640.0;
const H: f64 = 400.0;
const L: f64 = 70.0;
const R: f64 = 150.0;
const T: f64 = 48.0;
const B: f64 = 50.0;

fn svg_open(title: &str, subtitle: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text class=\"title\" x=\"{x}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n\
         <text class=\"subtitle\" x=\"{x}\" y=\"36\" text-anchor=\"middle\" font-size=\"11\" fill=\"#555\">{}</text>\n",
        esc(title),
        esc(subtitle),
        x = (L + W - R) / 2.0,
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

/// A y axis: linear from 0 to `max`, or logarithmic over whole decades.
#[derive(Clone, Copy, Debug)]
enum Scale {
    Linear { max: f64 },
    Log { lo_exp: i32, hi_exp: i32 },
}

impl Scale {
    fn linear(max: f64) -> Scale {
        Scale::Linear { max: nice_max(max) }
    }

    /// Whole decades around `lo..=hi` (positive values).
    fn log(lo: f64, hi: f64) -> Scale {
        let lo = lo.max(1e-3);
        let lo_exp = lo.log10().floor() as i32;
        let hi_exp = (hi.max(lo).log10().ceil() as i32).max(lo_exp + 1);
        Scale::Log { lo_exp, hi_exp }
    }

    /// Plot y of value `v`.
    fn y(self, v: f64) -> f64 {
        let f = match self {
            Scale::Linear { max } => v / max,
            Scale::Log { lo_exp, hi_exp } => {
                (v.max(10f64.powi(lo_exp)).log10() - f64::from(lo_exp)) / f64::from(hi_exp - lo_exp)
            }
        };
        H - B - f.clamp(0.0, 1.0) * (H - B - T)
    }

    /// Grid values and whether each is labelled.
    fn ticks(self) -> Vec<(f64, bool)> {
        match self {
            Scale::Linear { max } => (0..=5).map(|i| (max * f64::from(i) / 5.0, true)).collect(),
            Scale::Log { lo_exp, hi_exp } => {
                let few = hi_exp - lo_exp <= 2;
                let mut v = Vec::new();
                for e in lo_exp..=hi_exp {
                    let d = 10f64.powi(e);
                    v.push((d, true));
                    if e < hi_exp {
                        v.push((2.0 * d, few));
                        v.push((5.0 * d, few));
                    }
                }
                v
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Scale::Linear { .. } => "linear",
            Scale::Log { .. } => "log",
        }
    }
}

/// The y axis (grid, labelled ticks, label) and the x axis line and label.
fn axes_y(s: &mut String, scale: Scale, xlabel: &str, ylabel: &str) {
    let (x0, y0, x1) = (L, H - B, W - R);
    let _ = writeln!(s, "<g class=\"y-axis\" data-scale=\"{}\">", scale.name());
    for (v, labelled) in scale.ticks() {
        let y = scale.y(v);
        let _ = writeln!(
            s,
            "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"{}\"/>",
            if labelled { "#ccc" } else { "#eee" }
        );
        if labelled {
            let _ = writeln!(
                s,
                "<text class=\"y-tick\" data-value=\"{v}\" x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                x0 - 4.0,
                y + 4.0,
                short(v)
            );
        }
    }
    let _ = writeln!(
        s,
        "<text class=\"y-label\" x=\"16\" y=\"{m}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {m})\">{}</text>\n</g>",
        esc(ylabel),
        m = (y0 + T) / 2.0,
    );
    let _ = writeln!(
        s,
        "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>\n\
         <line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{T}\" stroke=\"black\"/>\n\
         <text class=\"x-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        (x0 + x1) / 2.0,
        H - 12.0,
        esc(xlabel)
    );
}

fn short(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        }
    };
    if v >= 1e6 {
        format!("{}M", trim(format!("{:.2}", v / 1e6)))
    } else if v >= 1e3 {
        format!("{}k", trim(format!("{:.1}", v / 1e3)))
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        trim(format!("{v:.2}"))
    }
}

fn legend(s: &mut String, i: usize, name: &str) {
    let y = T + 10.0 + 18.0 * i as f64;
    let x = W - R + 15.0;
    let _ = writeln!(
        s,
        "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text class=\"legend\" x=\"{}\" y=\"{}\">{}</text>",
        y - 10.0,
        COLORS[i % COLORS.len()],
        x + 18.0,
        y,
        esc(name)
    );
}

/// The median and the extremes of one figure over a target's runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stat {
    /// Median.
    pub med: f64,
    /// Lowest.
    pub lo: f64,
    /// Highest.
    pub hi: f64,
    /// Runs with the figure.
    pub n: usize,
}

impl Stat {
    /// Over the values present; `None` when there are none.
    pub fn of(v: impl IntoIterator<Item = Option<f64>>) -> Option<Stat> {
        let v: Vec<f64> = v.into_iter().flatten().collect();
        let n = v.len();
        Some(Stat {
            lo: v.iter().copied().fold(f64::MAX, f64::min),
            hi: v.iter().copied().fold(f64::MIN, f64::max),
            med: median(v)?,
            n,
        })
    }

    /// `med` with `(lo–hi)` when the runs differ.
    fn text(self, digits: usize) -> String {
        if self.n > 1 && self.lo < self.hi {
            format!(
                "{} ({}–{})",
                num(self.med, digits),
                num(self.lo, digits),
                num(self.hi, digits)
            )
        } else {
            num(self.med, digits)
        }
    }
}

fn stat_text(s: Option<Stat>, digits: usize) -> String {
    s.map_or_else(|| "–".to_owned(), |s| s.text(digits))
}

/// A chart of one figure per target (x: the targets) and series (e.g. p50/p99/p99.9): bars
/// on a linear axis, points on a log axis; whiskers from the lowest to the highest run when
/// a target has several.
pub struct Chart {
    /// Title.
    pub title: String,
    /// y axis label.
    pub ylabel: String,
    /// The series' names (legend).
    pub series: Vec<String>,
    /// Per target: its name and one figure per series.
    pub groups: Vec<(String, Vec<Option<Stat>>)>,
    /// Log y axis.
    pub log: bool,
    /// Digits of the value labels.
    pub digits: usize,
}

impl Chart {
    /// The SVG.
    pub fn svg(&self) -> String {
        let all: Vec<Stat> = self
            .groups
            .iter()
            .flat_map(|(_, v)| v.iter().flatten().copied())
            .collect();
        let runs = all.iter().map(|s| s.n).max().unwrap_or(0);
        let subtitle = if runs > 1 {
            format!("median of up to {runs} runs per target; whiskers: lowest to highest run")
        } else {
            "one run per target".to_owned()
        };
        let mut s = svg_open(&self.title, &subtitle);
        let scale = if self.log {
            let lo = all
                .iter()
                .map(|s| s.lo)
                .filter(|v| *v > 0.0)
                .fold(f64::MAX, f64::min);
            let hi = all.iter().map(|s| s.hi).fold(0.0, f64::max);
            if lo == f64::MAX {
                Scale::log(1.0, 10.0)
            } else {
                Scale::log(lo, hi)
            }
        } else {
            Scale::linear(all.iter().map(|s| s.hi).fold(0.0, f64::max))
        };
        axes_y(&mut s, scale, "target", &self.ylabel);
        let groups = self.groups.len().max(1) as f64;
        let gw = (W - R - L) / groups;
        let k = self.series.len().max(1) as f64;
        let bw = gw * 0.8 / k;
        for (g, (name, vals)) in self.groups.iter().enumerate() {
            let gx = L + gw * g as f64 + gw * 0.1;
            for (i, v) in vals.iter().enumerate() {
                let Some(v) = v else { continue };
                let c = COLORS[i % COLORS.len()];
                let cx = gx + bw * (i as f64 + 0.5);
                let y = scale.y(v.med);
                let tip = format!("{} {}: {}", name, self.series[i], v.text(self.digits));
                if self.log {
                    let _ = writeln!(
                        s,
                        "<circle class=\"point\" cx=\"{cx:.1}\" cy=\"{y:.1}\" r=\"4.5\" fill=\"{c}\"><title>{}</title></circle>",
                        esc(&tip)
                    );
                } else {
                    let _ = writeln!(
                        s,
                        "<rect class=\"bar\" x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{c}\"><title>{}</title></rect>",
                        cx - bw * 0.45,
                        bw * 0.9,
                        (H - B - y).max(0.0),
                        esc(&tip)
                    );
                }
                if v.n > 1 {
                    let (ylo, yhi) = (scale.y(v.lo), scale.y(v.hi));
                    let _ = writeln!(
                        s,
                        "<g class=\"error-bar\" data-lo=\"{}\" data-hi=\"{}\" stroke=\"black\" stroke-width=\"1.2\">\
                         <line x1=\"{cx:.1}\" y1=\"{ylo:.1}\" x2=\"{cx:.1}\" y2=\"{yhi:.1}\"/>\
                         <line x1=\"{:.1}\" y1=\"{ylo:.1}\" x2=\"{:.1}\" y2=\"{ylo:.1}\"/>\
                         <line x1=\"{:.1}\" y1=\"{yhi:.1}\" x2=\"{:.1}\" y2=\"{yhi:.1}\"/></g>",
                        v.lo,
                        v.hi,
                        cx - 4.0,
                        cx + 4.0,
                        cx - 4.0,
                        cx + 4.0
                    );
                }
                let ly = if v.n > 1 { scale.y(v.hi) } else { y };
                let _ = writeln!(
                    s,
                    "<text class=\"value\" x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
                    ly - 6.0,
                    if v.med >= 1e4 {
                        short(v.med)
                    } else {
                        num(v.med, self.digits)
                    }
                );
            }
            let _ = writeln!(
                s,
                "<text class=\"x-tick\" x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                L + gw * (g as f64 + 0.5),
                H - B + 16.0,
                esc(name)
            );
        }
        for (i, n) in self.series.iter().enumerate() {
            legend(&mut s, i, n);
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Forwarded vs offered rate in generator mode, one series per target (the main run and
/// its NDR trials, of the run whose forwarded rate is the median), with the line where
/// forwarded = offered.
pub fn rate_svg(title: &str, rs: &[&RunResult]) -> String {
    let series: Vec<(String, Vec<(f64, f64)>)> = rs
        .iter()
        .filter_map(|r| {
            let mut pts: Vec<(f64, f64)> = r
                .ndr_trials
                .iter()
                .map(|t| (t.offered_pps, t.forwarded_pps))
                .collect();
            pts.push((r.offered_pps?, r.forwarded_pps));
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            Some((r.target.name().to_owned(), pts))
        })
        .collect();
    let m = series
        .iter()
        .flat_map(|(_, p)| p.iter().flat_map(|&(a, b)| [a, b]))
        .fold(0.0, f64::max);
    let scale = Scale::linear(m);
    let Scale::Linear { max: m } = scale else {
        unreachable!()
    };
    let mut s = svg_open(
        title,
        "the main run and the NDR trials; dashed: forwarded = offered",
    );
    axes_y(&mut s, scale, "offered (pps)", "forwarded (pps)");
    let px = |v: f64| L + v / m * (W - R - L);
    for i in 0..=5 {
        let v = m * f64::from(i) / 5.0;
        let _ = writeln!(
            s,
            "<text class=\"x-tick\" x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            px(v),
            H - B + 16.0,
            short(v)
        );
    }
    let _ = writeln!(
        s,
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\" stroke-dasharray=\"4 4\"/>",
        px(0.0),
        scale.y(0.0),
        px(m),
        scale.y(m)
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), scale.y(y)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for &(x, y) in pts {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{c}\"/>",
                px(x),
                scale.y(y)
            );
        }
        legend(&mut s, i, name);
    }
    s.push_str("</svg>\n");
    s
}

/// The latency chart of a packet scenario in generator mode: p50/p99/p99.9 per target on a
/// log axis, from the trial at the common rate when every target has one (else the main
/// run's), median and spread over the runs. `None` when no run has a latency.
pub fn latency_chart(scenario: &str, by_target: &[(Target, Vec<&RunResult>)]) -> Option<Chart> {
    let common = by_target
        .iter()
        .all(|(_, runs)| runs.iter().all(|r| r.latency_at_rate.is_some()));
    let lat = |r: &RunResult| -> Latency {
        match (&r.latency_at_rate, common) {
            (Some(l), true) => l.latency_us.clone(),
            _ => r.latency_us.clone(),
        }
    };
    let groups: Vec<(String, Vec<Option<Stat>>)> = by_target
        .iter()
        .map(|(t, runs)| {
            let l: Vec<Latency> = runs.iter().map(|r| lat(r)).collect();
            (
                t.name().to_owned(),
                vec![
                    Stat::of(l.iter().map(|l| l.p50)),
                    Stat::of(l.iter().map(|l| l.p99)),
                    Stat::of(l.iter().map(|l| l.p999)),
                ],
            )
        })
        .collect();
    if groups.iter().all(|(_, v)| v.iter().all(Option::is_none)) {
        return None;
    }
    let rate = by_target
        .first()
        .and_then(|(_, r)| r.first())
        .and_then(|r| r.latency_at_rate.as_ref())
        .map(|l| l.trial.rate_pps);
    let title = match (common, rate) {
        (true, Some(rate)) => format!("{scenario}: one-way latency at {} pps", short(rate as f64)),
        _ => format!("{scenario}: one-way latency at each run's rate"),
    };
    Some(Chart {
        title,
        ylabel: "latency (µs, log scale)".into(),
        series: vec!["p50".into(), "p99".into(), "p99.9".into()],
        groups,
        log: true,
        digits: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change-under-load result of `target` with the given figures.
    fn result(target: &str, fwd: f64, p99: f64, swap_loss: u64) -> serde_json::Value {
        serde_json::json!({
            "scenario": "change-under-load", "target": target, "mode": "generator",
            "duration_s": 4.0, "kind": "udp", "size": "64", "flows": 1000, "services": 1,
            "backends": 3, "queues": 1, "rate_pps": 0, "offered_pps": fwd + 10.0,
            "forwarded_pps": fwd, "sent": 100, "received": 100, "lost": 0, "loss_ratio": 0.0,
            "duplicates": 0, "other_frames": 0, "bad_checksums": 0,
            "per_backend": [fwd as u64, 0, 0],
            "latency_us": {"p50": 1.0, "p99": p99, "p999": p99, "max": p99},
            "cpu_ns_per_pkt": fwd / 10.0, "lb_process_cpu_ns": null, "lb_core_softirq_ns": 0,
            "lb_core_busy_ratio": 1.0, "target_busy_ratio": 0.5, "rig_core_busy_ratio": 0.9,
            "cpu_method": "test", "ndr_pps": fwd, "ndr_trials": [],
            "latency_at_rate": {"rate_pps": 1000, "offered_pps": 1000.0,
                "forwarded_pps": 1000.0, "loss_ratio": 0.0,
                "latency_us": {"p50": 1.0, "p99": p99, "p999": p99, "max": p99}},
            "swap": {"loss_pkts": swap_loss, "window_pkts": 1000, "before_loss_pkts": 0,
                "at_s": 2.0},
            "target_counters": {}, "notes": []
        })
    }

    #[test]
    fn repeated_runs_make_one_row_of_medians_and_the_worst_swap() {
        let dir = std::env::temp_dir().join(format!("perf-lab-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let runs = [
            ("xvs", 100.0, 10.0, 0),
            ("xvs", 300.0, 30.0, 7),
            ("xvs", 200.0, 20.0, 0),
            ("nft", 400.0, 40.0, 0),
        ];
        let mut inputs = Vec::new();
        for (i, (t, fwd, p99, loss)) in runs.iter().enumerate() {
            let p = dir.join(format!("{i}.json"));
            std::fs::write(&p, result(t, *fwd, *p99, *loss).to_string()).unwrap();
            inputs.push(p);
        }
        let w = report(&inputs, &dir.join("out")).unwrap();
        let md = std::fs::read_to_string(&w.markdown).unwrap();
        // One xvs row, with the medians (forwarded 200, p99 20, ns/pkt 20, NDR 200).
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| xvs |")).collect();
        assert_eq!(rows.len(), 2, "main and latency tables:\n{md}");
        assert!(
            rows[0].starts_with("| xvs | 210 | 200 | 0.000 | 1.0 | 20.0 | 20.0 | 20 |"),
            "{}",
            rows[0]
        );
        assert!(rows[0].ends_with("| 200 |"), "{}", rows[0]);
        assert!(rows[1].contains("| 20.0 |"), "{}", rows[1]);
        assert!(md.contains("xvs/nft: forwarded ×0.50"), "{md}");
        assert!(md.contains("xvs 3 (100–300), nft 1 (400–400)"), "{md}");
        // A swap reports the worst run's loss.
        assert!(md.contains("xvs: change at 2.00 s lost 7 of 1000"), "{md}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn restarts_make_one_row_per_signal_of_medians_and_the_worst_flow_loss() {
        let dir = std::env::temp_dir().join(format!("perf-lab-report-rs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut inputs = Vec::new();
        for (i, (gap, lost)) in [(200.0, 0), (300.0, 2), (250.0, 0)].iter().enumerate() {
            let kill = Restart {
                signal: "kill".into(),
                gap_ms: *gap,
                signal_to_forward_ms: Some(*gap),
                restart_lost_pkts: (*gap as u64) * 100,
                flows_before: Some(100_000),
                flows_adopted: Some(100_000),
                flows_lost: *lost,
                adoption_ms: Some(10.0),
                ready_ms: gap + 5.0,
                start_attempts: 1,
                ..Restart::default()
            };
            let restarts = Restarts {
                baseline_sent: 1000,
                baseline_lost_pkts: 0,
                term: Some(Restart {
                    signal: "term".into(),
                    ..kill.clone()
                }),
                takeover: None,
                kill,
            };
            let mut v = result("xvs", 100.0, 10.0, 0);
            v["scenario"] = "restart".into();
            v["swap"] = serde_json::Value::Null;
            v["restart"] = serde_json::to_value(&restarts).unwrap();
            let p = dir.join(format!("{i}.json"));
            std::fs::write(&p, v.to_string()).unwrap();
            inputs.push(p);
        }
        let w = report(&inputs, &dir.join("out")).unwrap();
        let md = std::fs::read_to_string(&w.markdown).unwrap();
        assert!(md.contains("## restart (generator mode)"), "{md}");
        let row = md
            .lines()
            .find(|l| l.starts_with("| xvs | kill |"))
            .unwrap_or_else(|| panic!("{md}"));
        assert_eq!(
            row,
            "| xvs | kill | 3 | 250.0 (200.0–300.0) | 250.0 (200.0–300.0) | 25000 \
             (20000–30000) | 100000 / 100000 | 2 | 10.0 | 255.0 (205.0–305.0) | 1 |"
        );
        assert!(md.contains("| xvs | term | 3 |"), "{md}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The `<text class="CLASS" ...>LABEL</text>` labels of an SVG.
    fn texts<'a>(svg: &'a str, class: &str) -> Vec<&'a str> {
        svg.split(&format!("class=\"{class}\""))
            .skip(1)
            .filter_map(|rest| rest.split_once('>')?.1.split_once("</text>").map(|t| t.0))
            .collect()
    }

    /// The y of each labelled tick, by its value.
    fn ticks(svg: &str) -> Vec<(f64, f64)> {
        svg.split("class=\"y-tick\" data-value=\"")
            .skip(1)
            .map(|rest| {
                let v: f64 = rest.split('"').next().unwrap().parse().unwrap();
                let y: f64 = rest
                    .split(" y=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                (v, y)
            })
            .collect()
    }

    /// (lo, hi) of every error bar.
    fn error_bars(svg: &str) -> Vec<(f64, f64)> {
        svg.split("class=\"error-bar\" data-lo=\"")
            .skip(1)
            .map(|rest| {
                let lo = rest.split('"').next().unwrap().parse().unwrap();
                let hi = rest
                    .split("data-hi=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                (lo, hi)
            })
            .collect()
    }

    /// Renders `svg` to PNG with rsvg-convert (librsvg2-bin, scripts/deps) when installed: a
    /// malformed SVG fails.
    fn renders(svg: &str, name: &str) {
        let ok = std::process::Command::new("sh")
            .args(["-c", "command -v rsvg-convert >/dev/null"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("rsvg-convert not installed (scripts/deps): {name} not rendered");
            return;
        }
        let dir = std::env::temp_dir().join(format!("perf-lab-svg-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, png) = (
            dir.join(format!("{name}.svg")),
            dir.join(format!("{name}.png")),
        );
        std::fs::write(&src, svg).unwrap();
        let out = std::process::Command::new("rsvg-convert")
            .arg("-o")
            .arg(&png)
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(std::fs::metadata(&png).unwrap().len() > 1000, "{name}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn from_json(v: serde_json::Value) -> RunResult {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn latency_is_on_a_log_axis_with_error_bars_from_repeats() {
        // xvs three runs (p99 10, 30, 20), nft one run (p99 40).
        let runs: Vec<RunResult> = [("xvs", 10.0), ("xvs", 30.0), ("xvs", 20.0), ("nft", 40.0)]
            .iter()
            .map(|(t, p99)| from_json(result(t, 100.0, *p99, 0)))
            .collect();
        let by_target = vec![
            (Target::Xvs, runs[..3].iter().collect::<Vec<_>>()),
            (Target::Nft, vec![&runs[3]]),
        ];
        let c = latency_chart("change-under-load", &by_target).unwrap();
        let svg = c.svg();
        renders(&svg, "latency");
        assert!(svg.contains("class=\"y-axis\" data-scale=\"log\""), "{svg}");
        assert_eq!(texts(&svg, "y-label"), ["latency (µs, log scale)"]);
        assert!(texts(&svg, "title")[0].contains("at 1k pps"), "{svg}");
        // Decades equally spaced: a log axis.
        let t = ticks(&svg);
        let y = |v: f64| t.iter().find(|x| x.0 == v).unwrap().1;
        assert!(
            ((y(1.0) - y(10.0)) - (y(10.0) - y(100.0))).abs() < 0.2,
            "{t:?}"
        );
        // Error bars: xvs's p50, p99, p99.9 (3 runs), lowest to highest; none for nft's
        // single run.
        let bars = error_bars(&svg);
        assert_eq!(bars, [(1.0, 1.0), (10.0, 30.0), (10.0, 30.0)]);
        assert!(texts(&svg, "subtitle")[0].contains("whiskers"), "{svg}");
        // One run per target: no whiskers at all.
        let single = vec![(Target::Nft, vec![&runs[3]])];
        let svg = latency_chart("x", &single).unwrap().svg();
        assert!(error_bars(&svg).is_empty());
        assert_eq!(texts(&svg, "subtitle"), ["one run per target"]);
    }

    #[test]
    fn rate_axes_say_what_is_drawn_and_saturation_has_no_latency_plot() {
        let dir = std::env::temp_dir().join(format!("perf-lab-report-sat-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut inputs = Vec::new();
        for (i, (t, mode, fwd)) in [
            ("xvs", "saturation", 1.4e6),
            ("xvs", "saturation", 1.5e6),
            ("nft", "saturation", 1.3e6),
            ("xvs", "generator", 3.0e5),
        ]
        .iter()
        .enumerate()
        {
            let mut v = result(t, *fwd, 20.0, 0);
            v["scenario"] = "one-service".into();
            v["swap"] = serde_json::Value::Null;
            v["mode"] = (*mode).into();
            if *mode == "saturation" {
                v["offered_pps"] = serde_json::Value::Null;
                v["latency_at_rate"] = serde_json::Value::Null;
                v["latency_us"] =
                    serde_json::json!({"p50": null, "p99": null, "p999": null, "max": null});
            }
            let p = dir.join(format!("{i}.json"));
            std::fs::write(&p, v.to_string()).unwrap();
            inputs.push(p);
        }
        let out = dir.join("out");
        let w = report(&inputs, &out).unwrap();
        let names: Vec<String> = w
            .svgs
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "one-service-generator-rate.svg",
                "one-service-generator-latency.svg",
                "one-service-saturation-rate.svg"
            ]
        );
        let sat = std::fs::read_to_string(out.join("one-service-saturation-rate.svg")).unwrap();
        renders(&sat, "saturation");
        assert_eq!(texts(&sat, "y-label"), ["forwarded (pps)"]);
        assert_eq!(texts(&sat, "x-label"), ["target"]);
        assert!(!sat.contains("offered"), "{sat}");
        assert_eq!(error_bars(&sat), [(1.4e6, 1.5e6)]);
        let gen_rate = std::fs::read_to_string(out.join("one-service-generator-rate.svg")).unwrap();
        renders(&gen_rate, "generator-rate");
        assert_eq!(texts(&gen_rate, "x-label"), ["offered (pps)"]);
        assert_eq!(texts(&gen_rate, "y-label"), ["forwarded (pps)"]);
        let md = std::fs::read_to_string(&w.markdown).unwrap();
        assert!(!md.contains("saturation-latency"), "{md}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn real_client_sections() {
        let dir = std::env::temp_dir().join(format!("perf-lab-report-rc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let bulk = |g1: f64, g8: f64| {
            serde_json::json!([1, 8].iter().zip([g1, g8]).map(|(s, g)| serde_json::json!({
                "streams": s, "seconds": 2.0, "gbit_s": g, "sender_gbit_s": g,
                "retransmits": 0, "client_packets": 1000, "backend_packets": 1000,
                "target_busy_ratio": 0.5, "lb_core_busy_ratio": 1.0, "rig_core_busy_ratio": 1.0,
                "cpu_ns_per_pkt": 500.0, "rig_ns_per_pkt": 900.0,
                "target_metrics": {"tx_ring_full": 0.0}
            })).collect::<Vec<_>>())
        };
        let conn = |rate: f64| {
            serde_json::json!({"client": "ab", "concurrency": 16, "seconds": 2.0,
                "response_bytes": 100, "completed": (rate * 2.0) as u64, "failed": 0,
                "non_2xx": 0, "conn_per_s": rate,
                "latency_ms": {"p50": 1.0, "p99": 3.0, "p999": null, "max": 9.0},
                "target_busy_ratio": 0.9, "lb_core_busy_ratio": 1.0, "rig_core_busy_ratio": 1.0,
                "cpu_us_per_conn": 50.0, "rig_us_per_conn": 60.0, "target_metrics": {}})
        };
        let mut inputs = Vec::new();
        let cases = [
            ("xvs", "bulk-tcp", 1.5, 1.6),
            ("xvs", "bulk-tcp", 1.7, 1.4),
            ("nft", "bulk-tcp", 3.0, 3.2),
            ("xvs", "conn-rate", 9000.0, 0.0),
            ("nft", "conn-rate", 10000.0, 0.0),
        ];
        for (i, (t, sc, a, b)) in cases.iter().enumerate() {
            let mut v = result(t, 1000.0, 1.0, 0);
            v["scenario"] = (*sc).into();
            v["swap"] = serde_json::Value::Null;
            v["latency_at_rate"] = serde_json::Value::Null;
            if *sc == "bulk-tcp" {
                v["bulk_tcp"] = bulk(*a, *b);
            } else {
                v["conn_rate"] = conn(*a);
            }
            let p = dir.join(format!("{i}.json"));
            std::fs::write(&p, v.to_string()).unwrap();
            inputs.push(p);
        }
        let out = dir.join("out");
        let w = report(&inputs, &out).unwrap();
        let md = std::fs::read_to_string(&w.markdown).unwrap();
        assert!(
            md.contains("| xvs | 2 | 1 | 1.60 (1.50–1.70) | 0 | 50 / 100 | 500 / 900 | 0 |"),
            "{md}"
        );
        assert!(md.contains("| nft | 1 | 8 | 3.20 | "), "{md}");
        assert!(
            md.contains("xvs/nft: 1 stream ×0.53, 8 streams ×0.47"),
            "{md}"
        );
        assert!(
            md.contains("| xvs | 1 | 9000 | 0 | 1.000 | 3.000 | 9.000 | 50.0 / 60.0 | 90 / 100 |"),
            "{md}"
        );
        assert!(md.contains("xvs/nft: connections/s ×0.90"), "{md}");
        let b = std::fs::read_to_string(out.join("bulk-tcp-generator-rate.svg")).unwrap();
        renders(&b, "bulk");
        assert_eq!(texts(&b, "y-label"), ["goodput (Gbit/s)"]);
        assert_eq!(texts(&b, "legend"), ["1 stream", "8 streams"]);
        assert_eq!(error_bars(&b), [(1.5, 1.7), (1.4, 1.6)]);
        let l = std::fs::read_to_string(out.join("conn-rate-generator-latency.svg")).unwrap();
        renders(&l, "conn-latency");
        assert!(l.contains("data-scale=\"log\""), "{l}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
