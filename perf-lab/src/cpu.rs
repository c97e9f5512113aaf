//! CPU per forwarded packet, measured over a window.
//!
//! The two cores are measured from what each is known to do:
//! - A core's busy time is the window's wall time minus the core's idle and iowait time from
//!   /proc/stat. The kernel accounts idle time exactly (NOHZ keeps it in ns); the busy columns
//!   are tick samples, which on this VM miss about half the ticks of a core that keeps
//!   waking up for softirqs, so they are not used.
//! - A kernel target (nft, iptables) forwards in softirq on the LB core (RPS), so its cost is
//!   the LB core's busy time.
//! - A busy-polling target (xvs, l2fwd) keeps its core 100% busy whatever the load; its cost
//!   is the time its poll loop spent in polls that moved frames (xvs:
//!   `xvs_worker_busy_seconds_total` from its metrics; l2fwd: the same count in its stats
//!   file), plus the LB core's irq and softirq ticks (near zero: the LB's receive NAPI runs on
//!   the rig core).
//!
//! `rig_core_busy_ratio` tells which side bounded a run: when the rig (generator) core is
//! saturated, the forwarded rate is a lower bound of the target's capacity.

use crate::sys::{core_times, mono_ns, proc_cpu_ns};
use crate::target::Running;

/// How `cpu_ns_per_pkt` is measured (written into every result).
pub const METHOD: &str = "kernel targets: LB core busy time (wall - idle - iowait from \
    /proc/stat) per forwarded packet; busy-polling targets (xvs, l2fwd): the poll loop's busy \
    time (polls that moved frames, self-reported) + LB core irq/softirq, per forwarded packet";

/// One reading of everything the window needs.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    wall_ns: u64,
    lb_idle_ns: u64,
    lb_irq_ns: u64,
    rig_idle_ns: u64,
    proc_ns: Option<u64>,
    /// The target busy-polls (its core is never idle).
    busy_polls: bool,
    target_busy_ns: Option<u64>,
}

/// Reads the sample now.
pub fn sample(target: &Running, lb_core: usize, rig_core: usize) -> Sample {
    let lb = core_times(lb_core);
    let rig = core_times(rig_core);
    Sample {
        wall_ns: mono_ns(),
        lb_idle_ns: lb.idle_ns,
        lb_irq_ns: lb.irq_ns,
        rig_idle_ns: rig.idle_ns,
        proc_ns: target.pid().and_then(proc_cpu_ns),
        busy_polls: target.busy_polls(),
        target_busy_ns: target.busy_ns(),
    }
}

impl Sample {
    /// When it was read (CLOCK_MONOTONIC ns).
    pub fn wall_ns(&self) -> u64 {
        self.wall_ns
    }
}

/// The CPU figures of a window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    /// CPU ns per forwarded packet (see [`METHOD`]).
    pub ns_per_pkt: Option<f64>,
    /// LB process CPU (utime+stime), ns.
    pub proc_ns: Option<u64>,
    /// LB core irq+softirq ticks, ns.
    pub irq_ns: u64,
    /// Share of the window the target was busy: LB core busy share for kernel targets, the
    /// poll loop's busy share for busy-polling ones (`None` when it could not be read).
    pub target_busy_ratio: Option<f64>,
    /// Share of the window the LB core was not idle (1.0 for a busy-polling target).
    pub lb_core_busy_ratio: f64,
    /// Share of the window the rig (generator) core was busy.
    pub rig_busy_ratio: f64,
}

/// The figures between `a` and `b` for `pkts` forwarded packets. A busy-polling target whose
/// busy time could not be read gets no `ns_per_pkt` (its core time would say nothing).
pub fn between(a: &Sample, b: &Sample, pkts: u64) -> Figures {
    let wall = b.wall_ns.saturating_sub(a.wall_ns).max(1);
    let busy_of = |idle: u64| wall.saturating_sub(idle) as f64 / wall as f64;
    let irq_ns = b.lb_irq_ns.saturating_sub(a.lb_irq_ns);
    let lb_busy = wall.saturating_sub(b.lb_idle_ns.saturating_sub(a.lb_idle_ns));
    let target_busy = match (b.busy_polls, a.target_busy_ns, b.target_busy_ns) {
        (false, _, _) => Some(lb_busy),
        (true, Some(x), Some(y)) => Some(y.saturating_sub(x) + irq_ns),
        (true, _, _) => None,
    };
    Figures {
        ns_per_pkt: target_busy
            .filter(|_| pkts > 0)
            .map(|t| t as f64 / pkts as f64),
        proc_ns: match (a.proc_ns, b.proc_ns) {
            (Some(x), Some(y)) => Some(y.saturating_sub(x)),
            _ => None,
        },
        irq_ns,
        target_busy_ratio: target_busy.map(|t| (t as f64 / wall as f64).min(1.0)),
        lb_core_busy_ratio: lb_busy as f64 / wall as f64,
        rig_busy_ratio: busy_of(b.rig_idle_ns.saturating_sub(a.rig_idle_ns)).clamp(0.0, 1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(wall: u64, lb_idle: u64, irq: u64, rig_idle: u64, busy: Option<u64>) -> Sample {
        Sample {
            busy_polls: busy.is_some(),
            wall_ns: wall,
            lb_idle_ns: lb_idle,
            lb_irq_ns: irq,
            rig_idle_ns: rig_idle,
            proc_ns: None,
            target_busy_ns: busy,
        }
    }

    #[test]
    fn kernel_target_costs_the_lb_cores_busy_time() {
        // 1 s window, LB core idle 400 ms: 600 ms busy over 1,000 packets.
        let f = between(
            &s(0, 0, 0, 0, None),
            &s(1_000_000_000, 400_000_000, 0, 900_000_000, None),
            1000,
        );
        assert_eq!(f.ns_per_pkt, Some(600_000.0));
        assert!((f.target_busy_ratio.unwrap() - 0.6).abs() < 1e-9);
        assert!((f.lb_core_busy_ratio - 0.6).abs() < 1e-9);
        assert!((f.rig_busy_ratio - 0.1).abs() < 1e-9);
    }

    #[test]
    fn busy_polling_target_costs_its_reported_busy_time() {
        // The core never idles, but the loop moved frames for 250 ms plus 10 ms of softirq.
        let f = between(
            &s(0, 0, 0, 0, Some(1_000)),
            &s(1_000_000_000, 0, 10_000_000, 0, Some(250_001_000)),
            1000,
        );
        assert_eq!(f.ns_per_pkt, Some(260_000.0));
        assert!((f.target_busy_ratio.unwrap() - 0.26).abs() < 1e-9);
        assert_eq!(f.lb_core_busy_ratio, 1.0);
        assert_eq!(f.rig_busy_ratio, 1.0);
    }

    #[test]
    fn busy_polling_target_without_its_busy_time_has_no_cost() {
        let mut b = s(1_000_000_000, 0, 0, 0, None);
        b.busy_polls = true;
        let f = between(&s(0, 0, 0, 0, None), &b, 1000);
        assert_eq!(f.ns_per_pkt, None);
        assert_eq!(f.target_busy_ratio, None);
    }

    #[test]
    fn no_packets_no_cost() {
        let f = between(&s(0, 0, 0, 0, None), &s(10, 0, 0, 0, None), 0);
        assert_eq!(f.ns_per_pkt, None);
    }
}
