//! Weighted least connections (IPVS `ip_vs_wlc.c`, the IPVS default): the backend minimising
//! `overhead / weight`, compared as `loh * dw > doh * lw` (no division, `u128` so nothing
//! overflows). The first backend with weight > 0 seeds the search and later ones replace it only
//! when strictly lighter, so ties go to the earlier backend; a weight-0 backend can never be
//! strictly lighter (`loh * 0 > ..` is false), which is how IPVS drains it. O(n) per pick.

use crate::{Backend, BackendId, ConnCounts, Dest, dests, heavier};

/// Weighted least-connection scheduler.
#[derive(Debug)]
pub struct Wlc {
    dests: Box<[Dest]>,
    /// Bulk fast path when the ids are contiguous (see [`crate::run`]).
    run: Option<crate::run::Run>,
}

impl Wlc {
    /// Builds over `backends`.
    pub fn build(backends: &[Backend]) -> Wlc {
        let dests = dests(backends);
        Wlc {
            run: crate::run::Run::new(&dests),
            dests,
        }
    }

    /// The backend with the least overhead per unit of weight.
    #[inline]
    pub fn pick<C: ConnCounts + ?Sized>(&self, counts: &C) -> Option<usize> {
        if let Some(run) = &self.run
            && let Some(r) = run.weighted_least(counts, |c| (c >> 32) * 256 + (c & 0xffff_ffff))
        {
            return r;
        }
        weighted_least(&self.dests, counts, |c, id| c.overhead(id))
    }
}

/// IPVS's weighted-least scan with a pluggable load (`overhead` for wlc/lblc/lblcr,
/// `active + 1` for sed).
#[inline]
pub(crate) fn weighted_least<C: ConnCounts + ?Sized>(
    dests: &[Dest],
    counts: &C,
    load: impl Fn(&C, BackendId) -> u64,
) -> Option<usize> {
    let first = dests.iter().position(|d| d.weight > 0)?;
    let (mut least, mut lw, mut loh) = (first, dests[first].weight, load(counts, dests[first].id));
    for (i, d) in dests.iter().enumerate().skip(first + 1) {
        let doh = load(counts, d.id);
        if heavier(loh, lw, doh, d.weight) {
            (least, lw, loh) = (i, d.weight, doh);
        }
    }
    Some(least)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Counts, backends};

    #[test]
    fn load_is_overhead_over_weight() {
        let s = Wlc::build(&backends(&[1, 3, 0]));
        // 256/1 vs 512/3: the heavier-weighted backend is lighter.
        assert_eq!(s.pick(&Counts::new(&[(1, 0), (2, 0), (0, 0)])), Some(1));
        // 256/1 vs 1024/3: backend 0 is lighter.
        assert_eq!(s.pick(&Counts::new(&[(1, 0), (4, 0), (0, 0)])), Some(0));
        // Exact tie 256/1 == 768/3: the earlier backend keeps it.
        assert_eq!(s.pick(&Counts::new(&[(1, 0), (3, 0), (0, 0)])), Some(0));
        // Inactive connections weigh 1/256.
        assert_eq!(s.pick(&Counts::new(&[(1, 1), (3, 0), (0, 0)])), Some(1));
    }

    #[test]
    fn drained_backend_never_wins_even_when_idle_or_first() {
        let s = Wlc::build(&backends(&[0, 2, 1]));
        assert_eq!(s.pick(&Counts::new(&[(0, 0), (10, 0), (6, 0)])), Some(1));
        assert_eq!(s.pick(&Counts::new(&[(0, 0), (10, 0), (4, 0)])), Some(2));
    }

    #[test]
    fn huge_counts_and_weights_do_not_overflow() {
        let s = Wlc::build(&backends(&[u32::MAX, 1]));
        let c = Counts::new(&[(u32::MAX, u32::MAX), (u32::MAX, 0)]);
        assert_eq!(s.pick(&c), Some(0));
    }
}
