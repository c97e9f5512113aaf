//! The `restart` scenario's figures: xvs restarted under a fixed offered load, once killed
//! (SIGKILL, a new xvs at once) and once stopped gracefully (SIGTERM with `drain_timeout =
//! "0s"`, its exit awaited, then a new xvs), with the same config and state directory.
//!
//! Measured from the sinks' sequence bitmap (every packet has a sequence number; the
//! generator sends them in order at a fixed rate, so a sequence number is a send time):
//!
//! - `gap_ms`: the longest run of consecutive lost packets from 100 ms before the signal to
//!   the end of the trial, as sending time (its length / the offered rate): how long packets
//!   sent to the node were not forwarded. `signal_to_forward_ms`: from the signal to the send
//!   time of the first packet forwarded after that run.
//! - `lost_pkts`: sent − distinct received over the trial; `restart_lost_pkts`: that minus
//!   the loss of the scenario's run without a restart (same rate and duration).
//! - `flows_seen`: flows with a packet forwarded before the signal; `flows_checked`: those
//!   with a packet sent after the gap; `flows_lost`: those of them none of whose packets sent
//!   after the gap was forwarded (xvs drops a non-SYN packet that has no flow, so a flow
//!   the new process did not adopt gets nothing through).
//!
//! And from xvs: `flows_before` / `established_before` (`xvs_flowtable_flows` and the active
//! `xvs_backend_connections` just before the signal), `established_after` (the same right
//! after the new process is ready), and from the new process's log: `flows_adopted`,
//! `torn_down`, `adoption_ms` (the recovery pass, `took_ms`), `phases_ms`, the time from
//! the signal to each start-up step it logs (its log timestamps against the wall clock at
//! the signal), and for a takeover `pause_ms` and `pause_parts_ms`, the pause in which
//! nobody polls and its parts (its "takeover: the workers poll again" line).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::bench::{Ctx, Event, Mode, RunOpts, Scenario, Trial, trial};
use crate::sink::SeqBitmap;
use crate::sys::metric_sum;
use crate::target::{Placement, Restarted, Running, Stop, Target};

/// Offered rate of the restart scenario when `--rate` is not given.
pub const RESTART_RATE_PPS: u64 = 100_000;

/// The restarts of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Restarts {
    /// Packets sent in the run without a restart (the scenario's main run).
    pub baseline_sent: u64,
    /// Packets lost in it.
    pub baseline_lost_pkts: u64,
    /// The SIGKILL restart.
    pub kill: Restart,
    /// The SIGTERM restart.
    pub term: Option<Restart>,
    /// The upgrade by `xvs run --takeover` (`--takeover`; null otherwise and in results
    /// from before it).
    #[serde(default)]
    pub takeover: Option<Restart>,
}

/// One restart under load (see the module doc for each figure).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Restart {
    /// `kill`, `term` or `takeover`.
    pub signal: String,
    /// Seconds into the trial the signal was sent.
    pub at_s: f64,
    /// Offered rate of the trial.
    pub offered_pps: f64,
    /// Packets sent in the trial.
    pub sent: u64,
    /// Packets lost in the trial.
    pub lost_pkts: u64,
    /// `lost_pkts` minus the loss of the run without a restart.
    pub restart_lost_pkts: u64,
    /// Longest run of lost packets around the restart, ms of sending time.
    pub gap_ms: f64,
    /// Its length in packets.
    pub gap_pkts: u64,
    /// Signal to the send time of the first packet forwarded after the gap (null: none was).
    pub signal_to_forward_ms: Option<f64>,
    /// Signal to the old process reaped.
    pub exit_ms: f64,
    /// Signal to the new process's `xvs: ready` line, as perf-lab read it.
    pub ready_ms: f64,
    /// xvs processes started until one was ready (a failed start is retried after 100 ms,
    /// as systemd's default `RestartSec`).
    pub start_attempts: u32,
    /// Why each failed start failed (the last line of its log).
    pub start_failures: Vec<String>,
    /// Signal to each start-up step of the new process, from its log.
    pub phases_ms: BTreeMap<String, f64>,
    /// Live flows just before the signal.
    pub flows_before: Option<u64>,
    /// Established TCP flows just before the signal.
    pub established_before: Option<u64>,
    /// Flows the new process adopted (its log).
    pub flows_adopted: Option<u64>,
    /// Half-done entries its recovery pass tore down.
    pub torn_down: Option<u64>,
    /// Its recovery pass, ms.
    pub adoption_ms: Option<f64>,
    /// A takeover's pause (nobody polls: from the switch to the new workers started), ms,
    /// from the new process's "takeover: the workers poll again" line (`pause_ms`); null
    /// for a restart and in results from before it.
    #[serde(default)]
    pub pause_ms: Option<f64>,
    /// That pause's parts in the order logged (`parts_ms`: name, ms).
    #[serde(default)]
    pub pause_parts_ms: Vec<(String, f64)>,
    /// Frames the new process held for its workers during that pause (`held_frames`: what
    /// arrived while no worker polled, kept in the UMEM's free frames); null for a restart
    /// and in results from before it.
    #[serde(default)]
    pub held_frames: Option<u64>,
    /// Established TCP flows right after the new process was ready.
    pub established_after: Option<u64>,
    /// Flows forwarded before the signal.
    pub flows_seen: u64,
    /// Of those, flows with packets sent after the gap.
    pub flows_checked: u64,
    /// Of those, flows none of whose packets after the gap was forwarded.
    pub flows_lost: u64,
}

/// What the sinks' bitmap says about a trial with a restart.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dataplane {
    /// Longest run of lost packets from 100 ms before the signal on: first, length.
    pub gap: (u64, u64),
    /// The run as sending time, ms.
    pub gap_ms: f64,
    /// Signal to the first packet forwarded after the run, ms (None: nothing came back).
    pub signal_to_forward_ms: Option<f64>,
    /// See [`Restart`].
    pub flows_seen: u64,
    /// See [`Restart`].
    pub flows_checked: u64,
    /// See [`Restart`].
    pub flows_lost: u64,
}

/// Reads the bitmap of a trial of `sent` packets at `pps` over `flows` flows (packet `i`
/// belongs to flow `i % flows`) in which the signal went out when `at` packets were sent.
pub fn dataplane(bitmap: &SeqBitmap, sent: u64, pps: f64, flows: u32, at: u64) -> Dataplane {
    let pps = pps.max(1.0);
    let from = at.saturating_sub((pps * 0.1) as u64).min(sent);
    let gap = bitmap.longest_missing(from, sent - from);
    let end = gap.0 + gap.1;
    let signal_to_forward_ms = (end < sent).then(|| (end as f64 - at as f64) / pps * 1e3);
    let flows = u64::from(flows.max(1));
    // Per flow: 1 forwarded before the signal, 2 sent after the gap, 4 forwarded after it.
    let mut seen = vec![0u8; flows as usize];
    for i in 0..at.min(sent) {
        if bitmap.received(i) {
            seen[(i % flows) as usize] |= 1;
        }
    }
    for i in end..sent {
        let f = &mut seen[(i % flows) as usize];
        *f |= 2;
        if bitmap.received(i) {
            *f |= 4;
        }
    }
    let count = |m: u8, v: u8| seen.iter().filter(|&&s| s & m == v).count() as u64;
    Dataplane {
        gap,
        gap_ms: gap.1 as f64 / pps * 1e3,
        signal_to_forward_ms,
        flows_seen: count(1, 1),
        flows_checked: count(3, 3),
        flows_lost: count(7, 3),
    }
}

/// What the new process's log says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogFigures {
    /// Signal to each start-up step, ms.
    pub phases_ms: BTreeMap<String, f64>,
    /// `flows` of the adoption line.
    pub flows_adopted: Option<u64>,
    /// `torn_down` of the adoption line.
    pub torn_down: Option<u64>,
    /// `took_ms` of the adoption line.
    pub adoption_ms: Option<f64>,
    /// `pause_ms` of a takeover's "the workers poll again" line.
    pub pause_ms: Option<f64>,
    /// Its `parts_ms`, in order.
    pub pause_parts_ms: Vec<(String, f64)>,
    /// Its `held_frames`.
    pub held_frames: Option<u64>,
}

/// Start-up steps xvs logs, by a piece of their message: the step's name is the time of the
/// last line that matches (a step per interface or queue ends with its last line).
const STEPS: &[(&str, &str)] = &[
    ("adopted the flow table", "state_open"),
    ("imported the flows", "state_open"),
    ("AF_XDP sockets open", "sockets_open"),
    ("steering program pinned", "steering_attached"),
    (" xvs: ready", "ready"),
];

/// Reads xvs' text log (`TIMESTAMP LEVEL target: message fields`, timestamps in UTC) against
/// the wall clock at the signal (ns since the epoch): `first_log` is its first line.
pub fn parse_log(text: &str, signal_wall_ns: u64) -> LogFigures {
    let mut out = LogFigures::default();
    for raw in text.lines() {
        let line = strip_ansi(raw);
        let Some(ts) = line.split_whitespace().next().and_then(rfc3339_ns) else {
            continue;
        };
        let ms = (ts as f64 - signal_wall_ns as f64) / 1e6;
        out.phases_ms.entry("first_log".to_owned()).or_insert(ms);
        for (piece, step) in STEPS {
            if line.contains(piece) {
                out.phases_ms.insert((*step).to_owned(), ms);
            }
        }
        if line.contains("adopted the flow table") {
            out.flows_adopted = field(&line, "flows").and_then(|v| v.parse().ok());
            out.torn_down = field(&line, "torn_down").and_then(|v| v.parse().ok());
            out.adoption_ms = field(&line, "took_ms").and_then(|v| v.parse().ok());
        }
        if line.contains("takeover: the workers poll again") {
            out.pause_ms = field(&line, "pause_ms").and_then(|v| v.parse().ok());
            out.pause_parts_ms = pause_parts(&line);
            out.held_frames = field(&line, "held_frames").and_then(|v| v.parse().ok());
        }
    }
    out
}

/// The parts of a pause line: `parts_ms=` is the line's last field, `name=ms` pairs
/// separated by spaces; the reading stops at the first token that is none.
fn pause_parts(line: &str) -> Vec<(String, f64)> {
    let Some(at) = line.find(" parts_ms=") else {
        return Vec::new();
    };
    (line[at + " parts_ms=".len()..].split_whitespace())
        .map_while(|t| {
            let (name, ms) = t.split_once('=')?;
            Some((name.to_owned(), ms.parse().ok()?))
        })
        .collect()
}

/// The value of ` name=value` in a log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split_whitespace().next()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` as ns since the epoch.
fn rfc3339_ns(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<u64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let frac_ns = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().take(9).collect();
        digits.parse::<u64>().ok()? * 10u64.pow(9 - digits.len() as u32)
    };
    let days = days_from_civil(y, m, day);
    let secs = u64::try_from(days).ok()? * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(secs * 1_000_000_000 + frac_ns)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The figures as `key=value` lines: the SIGKILL restart's unprefixed, the SIGTERM
/// restart's prefixed `graceful_`, the takeover's `takeover_`.
pub fn key_values(r: &Restarts) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "baseline_lost_pkts={}", r.baseline_lost_pkts);
    let all = [
        ("", Some(&r.kill)),
        ("graceful_", r.term.as_ref()),
        ("takeover_", r.takeover.as_ref()),
    ];
    for (prefix, x) in all {
        let Some(x) = x else { continue };
        let opt = |v: Option<f64>| v.map_or("null".to_owned(), |v| format!("{v:.1}"));
        let int = |v: Option<u64>| v.map_or("null".to_owned(), |v| v.to_string());
        let lines = [
            ("restart_gap_ms", format!("{:.1}", x.gap_ms)),
            ("restart_signal_to_forward_ms", opt(x.signal_to_forward_ms)),
            ("restart_lost_pkts", x.restart_lost_pkts.to_string()),
            ("restart_ready_ms", format!("{:.1}", x.ready_ms)),
            ("restart_start_attempts", x.start_attempts.to_string()),
            ("flows_before", int(x.flows_before)),
            ("established_before", int(x.established_before)),
            ("flows_adopted", int(x.flows_adopted)),
            ("established_after", int(x.established_after)),
            ("flows_seen", x.flows_seen.to_string()),
            ("flows_lost", x.flows_lost.to_string()),
            ("adoption_ms", opt(x.adoption_ms)),
        ];
        for (k, v) in lines {
            let _ = writeln!(s, "{prefix}{k}={v}");
        }
        for (k, v) in &x.phases_ms {
            let _ = writeln!(s, "{prefix}restart_phase_{k}_ms={v:.1}");
        }
        if x.pause_ms.is_some() {
            // The recovery pass inside the pause: its part if logged, else the adoption's.
            let part = |name: &str| x.pause_parts_ms.iter().find(|(k, _)| k == name);
            let recovery = part("recovery").map(|(_, v)| *v).or(x.adoption_ms);
            let _ = writeln!(s, "{prefix}pause_ms={}", opt(x.pause_ms));
            let _ = writeln!(s, "{prefix}recovery_ms={}", opt(recovery));
            let held = x
                .held_frames
                .map_or_else(|| "null".to_owned(), |n| n.to_string());
            let _ = writeln!(s, "{prefix}held_frames={held}");
            for (k, v) in &x.pause_parts_ms {
                let _ = writeln!(s, "{prefix}pause_part_{k}_ms={v:.1}");
            }
        }
    }
    s
}

/// For the restart scenario: refuses what it cannot measure and returns its offered rate;
/// `None` for every other scenario.
pub fn check(opts: &RunOpts) -> anyhow::Result<Option<u64>> {
    if opts.scenario != Scenario::Restart {
        if opts.takeover {
            bail!("--takeover is a trial of the restart scenario (--scenario restart)");
        }
        return Ok(None);
    }
    if opts.target != Target::Xvs {
        bail!(
            "the restart scenario restarts the load balancer under load and counts the flows \
             that survive: only --target xvs (flows in a state file adopted by the next \
             process) has such a restart; {} has none",
            opts.target.name()
        );
    }
    if opts.mode != Mode::Generator {
        bail!("the restart scenario needs --mode generator (the sinks count every packet)");
    }
    let rate = if opts.rate_pps > 0 {
        opts.rate_pps
    } else {
        RESTART_RATE_PPS
    };
    let flows = opts.flows.unwrap_or(100_000);
    // Every flow must have been forwarded before the signal, halfway through.
    let round_s = f64::from(flows) / rate as f64;
    if opts.duration_s / 2.0 < round_s + 0.5 {
        bail!(
            "restart: --duration {} is too short for {flows} flows at {rate} pps: the restart \
             comes halfway, after every flow was forwarded ({round_s:.1} s) and 0.5 s more; \
             give at least --duration {:.0}",
            opts.duration_s,
            (2.0 * (round_s + 0.5)).ceil()
        );
    }
    Ok(Some(rate))
}

/// Removes a directory when dropped.
pub struct RemoveDir(Option<PathBuf>);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The placement of the run: for the restart scenario, xvs' state on tmpfs (`/dev/shm`, as
/// `/run/xvs` is in production; the directory goes when the guard is dropped) and
/// `drain_timeout = "0s"`.
pub fn placement(opts: &RunOpts) -> (Placement, RemoveDir) {
    let mut p = opts.placement.clone();
    if opts.scenario != Scenario::Restart {
        return (p, RemoveDir(None));
    }
    p.drain_timeout_s = Some(0);
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return (p, RemoveDir(None));
    }
    let dir = shm.join(format!("perf-lab-{}", opts.prefix));
    p.state_dir = Some(dir.join("state"));
    (p, RemoveDir(Some(dir)))
}

/// The note the restart scenario adds to its result.
pub fn note(rate: u64, p: &Placement) -> String {
    format!(
        "restart: the main run ({rate} pps) has no restart and is the baseline; the runs with \
         a SIGKILL and a SIGTERM restart halfway are in `restart`; xvs state_dir {}, \
         drain_timeout 0s",
        p.xvs_state_dir().display()
    )
}

/// A restart done halfway through a trial, waiting for the trial's end.
pub struct Pending {
    how: Stop,
    at: u64,
    restarted: Restarted,
    before: Option<String>,
    after: Option<String>,
}

/// Restarts `target` now (see [`Running::restart`]), noting the packets sent so far and its
/// metrics just before the signal and right after the new process is ready.
pub fn during(
    target: &mut Running,
    how: Stop,
    progress: &AtomicU64,
    dir: &Path,
) -> anyhow::Result<Pending> {
    let before = target.xvs_metrics();
    let at = progress.load(Ordering::Relaxed);
    let restarted = target.restart(how, dir)?;
    let after = target.xvs_metrics();
    Ok(Pending {
        how,
        at,
        restarted,
        before,
        after,
    })
}

/// The figures of a trial with a restart, once its traffic is over: `sent` packets from
/// `start_ns` at `pps` over `flows` flows, `unique` of them received.
pub fn finish(
    p: Pending,
    bitmap: &SeqBitmap,
    sent: u64,
    start_ns: u64,
    pps: f64,
    flows: u32,
    unique: u64,
) -> Restart {
    let d = dataplane(bitmap, sent, pps, flows, p.at);
    let r = &p.restarted;
    let log = std::fs::read_to_string(&r.log).unwrap_or_default();
    let mut lf = parse_log(&log, r.signal_wall_ns);
    let ms = |ns: u64| ns.saturating_sub(r.signal_ns) as f64 / 1e6;
    lf.phases_ms.insert("old_exited".into(), ms(r.exited_ns));
    lf.phases_ms.insert("spawned".into(), ms(r.started_ns));
    let flows_now = |m: &Option<String>| {
        m.as_deref()
            .and_then(|t| metric_sum(t, "xvs_flowtable_flows"))
            .map(|v| v as u64)
    };
    Restart {
        signal: p.how.name().to_owned(),
        at_s: r.signal_ns.saturating_sub(start_ns) as f64 / 1e9,
        offered_pps: pps,
        sent,
        lost_pkts: sent.saturating_sub(unique),
        restart_lost_pkts: 0,
        gap_ms: d.gap_ms,
        gap_pkts: d.gap.1,
        signal_to_forward_ms: d.signal_to_forward_ms,
        exit_ms: ms(r.exited_ns),
        ready_ms: ms(r.ready_ns),
        start_attempts: r.attempts,
        start_failures: r.failures.clone(),
        phases_ms: lf.phases_ms,
        flows_before: flows_now(&p.before),
        established_before: p.before.as_deref().and_then(active),
        flows_adopted: lf.flows_adopted,
        torn_down: lf.torn_down,
        adoption_ms: lf.adoption_ms,
        pause_ms: lf.pause_ms,
        pause_parts_ms: lf.pause_parts_ms,
        held_frames: lf.held_frames,
        established_after: p.after.as_deref().and_then(active),
        flows_seen: d.flows_seen,
        flows_checked: d.flows_checked,
        flows_lost: d.flows_lost,
    }
}

/// The restart scenario after its run without a restart (`baseline`): a trial with a SIGKILL
/// restart, then one with a SIGTERM restart, then (`--takeover`) one with an upgrade by
/// `xvs run --takeover`, at the same rate and duration.
pub(crate) fn run(
    ctx: &mut Ctx<'_>,
    target: &mut Running,
    rate: u64,
    baseline: &Trial,
) -> anyhow::Result<Restarts> {
    let secs = ctx.opts.duration_s;
    let baseline_lost_pkts = baseline.sent.saturating_sub(baseline.unique);
    let upgrade = ctx.opts.takeover;
    let mut one = |how: Stop| -> anyhow::Result<Restart> {
        let t = trial(ctx, target, rate, secs, Event::Restart(how))?;
        let mut r = t.restart.context("the trial did not restart xvs")?;
        r.restart_lost_pkts = r.lost_pkts.saturating_sub(baseline_lost_pkts);
        eprintln!("perf-lab: {}", summary(&r));
        Ok(r)
    };
    let kill = one(Stop::Kill)?;
    let term = one(Stop::Term)?;
    let takeover = if upgrade {
        Some(one(Stop::Takeover)?)
    } else {
        None
    };
    Ok(Restarts {
        baseline_sent: baseline.sent,
        baseline_lost_pkts,
        kill,
        term: Some(term),
        takeover,
    })
}

/// Established TCP flows: the active samples of `xvs_backend_connections`.
fn active(metrics: &str) -> Option<u64> {
    let mut found = None;
    for line in metrics.lines() {
        if line.starts_with("xvs_backend_connections{") && line.contains("state=\"active\"") {
            let v: f64 = line.rsplit(' ').next()?.parse().ok()?;
            *found.get_or_insert(0) += v as u64;
        }
    }
    found
}

/// One line for the run's log.
pub fn summary(r: &Restart) -> String {
    format!(
        "restart ({}): gap {:.1} ms, signal to forwarding {} ms, ready after {:.1} ms ({} \
         start(s)), {} packets lost by the restart, {} flows adopted of {} ({} established \
         before), {} of {} flows lost",
        r.signal,
        r.gap_ms,
        r.signal_to_forward_ms
            .map_or("-".to_owned(), |v| format!("{v:.1}")),
        r.ready_ms,
        r.start_attempts,
        r.restart_lost_pkts,
        r.flows_adopted.map_or("-".to_owned(), |v| v.to_string()),
        r.flows_before.map_or("-".to_owned(), |v| v.to_string()),
        r.established_before
            .map_or("-".to_owned(), |v| v.to_string()),
        r.flows_lost,
        r.flows_checked,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_and_the_flows_that_never_came_back() {
        // 10 flows, 100 packets at 1,000 pps, signal at packet 40. Packets 42..=61 lost
        // (the gap), and flow 3 gets nothing through after it.
        let b = SeqBitmap::new(100, 7);
        for i in 0..100u64 {
            let gap = (42..=61).contains(&i);
            let flow3_after = i > 61 && i % 10 == 3;
            if !gap && !flow3_after && i != 5 {
                b.mark(7 + i as u32);
            }
        }
        let d = dataplane(&b, 100, 1000.0, 10, 40);
        assert_eq!(d.gap, (42, 20));
        assert_eq!(d.gap_ms, 20.0);
        assert_eq!(d.signal_to_forward_ms, Some(22.0));
        assert_eq!((d.flows_seen, d.flows_checked, d.flows_lost), (10, 10, 1));
    }

    #[test]
    fn nothing_back_after_the_signal() {
        let b = SeqBitmap::new(100, 0);
        for i in 0..50u32 {
            b.mark(i);
        }
        let d = dataplane(&b, 100, 1000.0, 10, 50);
        assert_eq!(d.gap, (50, 50));
        assert_eq!(d.signal_to_forward_ms, None);
        // No packet after the gap: no flow could be checked.
        assert_eq!((d.flows_seen, d.flows_checked, d.flows_lost), (10, 0, 0));
    }

    #[test]
    fn the_log_gives_steps_since_the_signal_and_the_adoption() {
        let signal = rfc3339_ns("2026-11-23T23:59:59.900000Z").unwrap();
        let log = "\u{1b}[2m2026-11-23T23:59:59.950000Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m xvs: starting\n\
                   2026-11-24T00:00:00.000500Z  INFO xvs: adopted the flow table of the previous process flows=100000 torn_down=2 index_words_reset=4 previous_pid=7 clean_stop=false took_ms=12.5\n\
                   2026-11-24T00:00:00.010000Z  INFO fastpath::xsk: AF_XDP sockets open (need_wakeup) queue=0\n\
                   2026-11-24T00:00:00.020000Z  INFO daemon: steering program pinned interface=a\n\
                   2026-11-24T00:00:00.030000Z  INFO daemon: steering program pinned interface=b\n\
                   2026-11-24T00:00:00.040000Z  INFO xvs: ready services=1 workers=1\n";
        let f = parse_log(log, signal);
        let ms = |k: &str| (f.phases_ms[k] * 1000.0).round() / 1000.0;
        assert_eq!(ms("first_log"), 50.0);
        assert_eq!(ms("state_open"), 100.5);
        assert_eq!(ms("sockets_open"), 110.0);
        assert_eq!(ms("steering_attached"), 130.0);
        assert_eq!(ms("ready"), 140.0);
        assert_eq!(f.flows_adopted, Some(100_000));
        assert_eq!(f.torn_down, Some(2));
        assert_eq!(f.adoption_ms, Some(12.5));
    }

    #[test]
    fn a_takeovers_pause_and_its_parts_are_read_from_its_log_line() {
        let signal = rfc3339_ns("2026-11-24T00:00:00.000000Z").unwrap();
        let log = "2026-11-24T00:00:00.100000Z  INFO xvs: adopted the flow table of the previous process flows=100000 torn_down=0 took_ms=9.25\n\
                   2026-11-24T00:00:00.110000Z  INFO xvs: takeover: the workers poll again pause_ms=14.5 held_frames=1450 keeper_rounds=60 parts_ms=frame_states=1.50 recovery=9.50 state=0.25 workers=3.50\n";
        let f = parse_log(log, signal);
        assert_eq!(f.pause_ms, Some(14.5));
        assert_eq!(f.held_frames, Some(1450));
        let parts: Vec<(&str, f64)> = (f.pause_parts_ms.iter())
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(
            parts,
            [
                ("frame_states", 1.5),
                ("recovery", 9.5),
                ("state", 0.25),
                ("workers", 3.5)
            ]
        );
        // A restart's log has no pause.
        let restart = parse_log(log.lines().next().unwrap(), signal);
        assert_eq!((restart.pause_ms, restart.pause_parts_ms.len()), (None, 0));
        let takeover = Restart {
            signal: "takeover".into(),
            adoption_ms: f.adoption_ms,
            pause_ms: f.pause_ms,
            pause_parts_ms: f.pause_parts_ms,
            ..Restart::default()
        };
        let r = Restarts {
            baseline_sent: 1,
            baseline_lost_pkts: 0,
            kill: Restart::default(),
            term: None,
            takeover: Some(takeover),
        };
        let kv = key_values(&r);
        assert!(kv.contains("\ntakeover_pause_ms=14.5\n"), "{kv}");
        assert!(kv.contains("\ntakeover_recovery_ms=9.5\n"), "{kv}");
        assert!(
            kv.contains("\ntakeover_pause_part_frame_states_ms=1.5\n"),
            "{kv}"
        );
        assert!(
            !kv.contains("\npause_ms="),
            "the kill restart has no pause: {kv}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["takeover"]["pause_ms"], 14.5);
        assert_eq!(json["takeover"]["pause_parts_ms"][1][0], "recovery");
    }

    #[test]
    fn the_takeover_trial_has_its_own_prefix() {
        let kill = Restart {
            signal: "kill".into(),
            restart_lost_pkts: 20_000,
            ..Restart::default()
        };
        let mut r = Restarts {
            baseline_sent: 1,
            baseline_lost_pkts: 0,
            kill: kill.clone(),
            term: None,
            takeover: None,
        };
        assert!(!key_values(&r).contains("takeover_"));
        r.takeover = Some(Restart {
            signal: "takeover".into(),
            restart_lost_pkts: 7,
            flows_lost: 0,
            ..kill
        });
        let kv = key_values(&r);
        assert!(kv.contains("\nrestart_lost_pkts=20000\n"), "{kv}");
        assert!(kv.contains("\ntakeover_restart_lost_pkts=7\n"), "{kv}");
        assert!(kv.contains("\ntakeover_flows_lost=0\n"), "{kv}");
        // Results from before the trial existed still read.
        let old = r#"{"baseline_sent":1,"baseline_lost_pkts":0,"kill":{"signal":"kill","at_s":0,"offered_pps":0,"sent":0,"lost_pkts":0,"restart_lost_pkts":0,"gap_ms":0,"gap_pkts":0,"signal_to_forward_ms":null,"exit_ms":0,"ready_ms":0,"start_attempts":1,"start_failures":[],"phases_ms":{},"flows_before":null,"established_before":null,"flows_adopted":null,"torn_down":null,"adoption_ms":null,"established_after":null,"flows_seen":0,"flows_checked":0,"flows_lost":0},"term":null}"#;
        let back: Restarts = serde_json::from_str(old).unwrap();
        assert!(back.takeover.is_none());
    }

    #[test]
    fn active_connections_only() {
        let m = "xvs_backend_connections{service=\"s\",backend=\"a\",state=\"active\"} 7\n\
                 xvs_backend_connections{service=\"s\",backend=\"a\",state=\"inactive\"} 3\n\
                 xvs_backend_connections{service=\"s\",backend=\"b\",state=\"active\"} 5\n";
        assert_eq!(active(m), Some(12));
        assert_eq!(active("xvs_flowtable_flows 3\n"), None);
    }

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(
            rfc3339_ns("1970-01-02T00:00:01.5Z"),
            Some(86_401_500_000_000)
        );
    }
}
