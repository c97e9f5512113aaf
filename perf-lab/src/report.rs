//! `perf-lab report`: JSON results -> `report.md` (one table per scenario and mode, targets
//! as rows, with xvs/nft and xvs/l2fwd ratios) and hand-written SVG plots per scenario:
//! `<scenario>-<mode>-rate.svg` (forwarded vs offered rate per target, from the main run and
//! the NDR trials) and `<scenario>-<mode>-latency.svg` (p50/p99/p99.9 bars per target).
//!
//! Several results of one target in one scenario and mode (`campaign.sh` with `REPEATS`)
//! make one row: the median of each figure over the runs (the worst for a swap's loss),
//! with the runs' spread of forwarded rates under the table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::bench::{Latency, Mode, RunResult};
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
        let rate = out.join(format!("{stem}-rate.svg"));
        std::fs::write(&rate, rate_svg(&format!("{scenario} ({mode})"), &rs))?;
        let lat = out.join(format!("{stem}-latency.svg"));
        std::fs::write(&lat, latency_svg(&format!("{scenario} ({mode})"), &rs))?;
        let _ = writeln!(
            md,
            "\n![rate]({stem}-rate.svg) ![latency]({stem}-latency.svg)"
        );
        written.svgs.push(rate);
        written.svgs.push(lat);
    }
    let md_path = out.join("report.md");
    std::fs::write(&md_path, md)?;
    written.markdown = md_path;
    Ok(written)
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
        for signal in ["kill", "term"] {
            let xs: Vec<&Restart> = all
                .iter()
                .filter_map(|r| match signal {
                    "kill" => Some(&r.kill),
                    _ => r.term.as_ref(),
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
         drain_timeout 0s, its exit awaited, then a new xvs). Gap: the longest run of lost \
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
const T: f64 = 40.0;
const B: f64 = 50.0;

fn svg_open(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
        W / 2.0,
        esc(title)
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

fn axes(s: &mut String, xmax: f64, ymax: f64, xlabel: &str, ylabel: &str, xticks: bool) {
    let (x0, y0, x1, y1) = (L, H - B, W - R, T);
    let _ = writeln!(
        s,
        "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>"
    );
    let _ = writeln!(
        s,
        "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"black\"/>"
    );
    for i in 0..=5 {
        let f = f64::from(i) / 5.0;
        let y = y0 - f * (y0 - y1);
        let _ = writeln!(
            s,
            "<line x1=\"{x0}\" y1=\"{y}\" x2=\"{x1}\" y2=\"{y}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            x0 - 4.0,
            y + 4.0,
            short(ymax * f)
        );
        if xticks {
            let x = x0 + f * (x1 - x0);
            let _ = writeln!(
                s,
                "<text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                y0 + 16.0,
                short(xmax * f)
            );
        }
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        (x0 + x1) / 2.0,
        H - 12.0,
        esc(xlabel)
    );
    let _ = writeln!(
        s,
        "<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}</text>",
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0,
        esc(ylabel)
    );
}

fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.1}")
    }
}

fn legend(s: &mut String, i: usize, name: &str) {
    let y = T + 10.0 + 18.0 * i as f64;
    let x = W - R + 15.0;
    let _ = writeln!(
        s,
        "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>",
        y - 10.0,
        COLORS[i % COLORS.len()],
        x + 18.0,
        y,
        esc(name)
    );
}

/// Forwarded vs offered rate, one series per target (the main run and its NDR trials;
/// saturation runs, which have no offered rate, are drawn at x = forwarded).
pub fn rate_svg(title: &str, rs: &[&RunResult]) -> String {
    let series: Vec<(String, Vec<(f64, f64)>)> = rs
        .iter()
        .map(|r| {
            let mut pts: Vec<(f64, f64)> = r
                .ndr_trials
                .iter()
                .map(|t| (t.offered_pps, t.forwarded_pps))
                .collect();
            pts.push((r.offered_pps.unwrap_or(r.forwarded_pps), r.forwarded_pps));
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (r.target.name().to_owned(), pts)
        })
        .collect();
    let m = series
        .iter()
        .flat_map(|(_, p)| p.iter().flat_map(|&(a, b)| [a, b]))
        .fold(0.0, f64::max);
    let m = nice_max(m);
    let mut s = svg_open(title);
    axes(&mut s, m, m, "offered (pps)", "forwarded (pps)", true);
    let px = |v: f64| L + v / m * (W - R - L);
    let py = |v: f64| H - B - v / m * (H - B - T);
    let _ = writeln!(
        s,
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\" stroke-dasharray=\"4 4\"/>",
        px(0.0),
        py(0.0),
        px(m),
        py(m)
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
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
                py(y)
            );
        }
        legend(&mut s, i, name);
    }
    s.push_str("</svg>\n");
    s
}

/// p50/p99/p99.9 bars per target.
pub fn latency_svg(title: &str, rs: &[&RunResult]) -> String {
    let vals: Vec<(String, [f64; 3])> = rs
        .iter()
        .map(|r| {
            // The common-rate trial when there is one: the main run's latency at the rig's
            // limit is mostly queueing.
            let l = r
                .latency_at_rate
                .as_ref()
                .map_or(&r.latency_us, |l| &l.latency_us);
            (
                r.target.name().to_owned(),
                [
                    l.p50.unwrap_or(0.0),
                    l.p99.unwrap_or(0.0),
                    l.p999.unwrap_or(0.0),
                ],
            )
        })
        .collect();
    let m = nice_max(vals.iter().flat_map(|(_, v)| *v).fold(0.0, f64::max));
    let mut s = svg_open(title);
    axes(&mut s, 0.0, m, "target", "latency (µs)", false);
    let groups = vals.len().max(1) as f64;
    let gw = (W - R - L) / groups;
    let bw = gw / 4.0;
    let py = |v: f64| H - B - v / m * (H - B - T);
    for (g, (name, v)) in vals.iter().enumerate() {
        let gx = L + gw * g as f64;
        for (k, val) in v.iter().enumerate() {
            let x = gx + bw * (k as f64 + 0.5);
            let y = py(*val);
            let _ = writeln!(
                s,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{} {}: {val:.1} µs</title></rect>",
                bw * 0.9,
                (H - B - y).max(0.0),
                COLORS[k],
                esc(name),
                ["p50", "p99", "p99.9"][k]
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            gx + gw / 2.0,
            H - B + 16.0,
            esc(name)
        );
    }
    for (k, n) in ["p50", "p99", "p99.9"].iter().enumerate() {
        legend(&mut s, k, n);
    }
    s.push_str("</svg>\n");
    s
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

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
