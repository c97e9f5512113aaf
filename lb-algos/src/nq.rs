//! Never queue (IPVS `ip_vs_nq.c`): the first backend (list order, weight > 0) with no active
//! connections; if every backend is busy, shortest expected delay (`(active + 1) / weight`,
//! ties to the earlier backend). O(n) per pick.

use crate::{Backend, ConnCounts, Dest, dests, heavier};

/// Never-queue scheduler.
#[derive(Debug)]
pub struct Nq {
    dests: Box<[Dest]>,
    /// Bulk fast path when the ids are contiguous (see [`crate::run`]).
    run: Option<crate::run::Run>,
}

impl Nq {
    /// Builds over `backends`.
    pub fn build(backends: &[Backend]) -> Nq {
        let dests = dests(backends);
        Nq {
            run: crate::run::Run::new(&dests),
            dests,
        }
    }

    /// An idle backend if there is one, else the sed choice.
    #[inline]
    pub fn pick<C: ConnCounts + ?Sized>(&self, counts: &C) -> Option<usize> {
        if let Some(run) = &self.run
            && let Some(r) = run.never_queue(counts)
        {
            return r;
        }
        let mut least: Option<(usize, u32, u64)> = None;
        for (i, d) in self.dests.iter().enumerate() {
            if d.weight == 0 {
                continue;
            }
            let active = counts.active(d.id);
            if active == 0 {
                return Some(i);
            }
            let doh = u64::from(active) + 1;
            if least.is_none_or(|(_, lw, loh)| heavier(loh, lw, doh, d.weight)) {
                least = Some((i, d.weight, doh));
            }
        }
        least.map(|(i, _, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Counts, backends};

    #[test]
    fn idle_backend_first_even_if_lightly_weighted() {
        let s = Nq::build(&backends(&[10, 1, 1]));
        // Backend 1 is idle (inactive conns do not count): it wins over the weight-10 one.
        assert_eq!(s.pick(&Counts::new(&[(1, 0), (0, 50), (0, 0)])), Some(1));
    }

    #[test]
    fn all_busy_falls_back_to_sed() {
        let s = Nq::build(&backends(&[10, 1, 0]));
        // (1+1)/10 vs (1+1)/1: backend 0.
        assert_eq!(s.pick(&Counts::new(&[(1, 0), (1, 0), (0, 0)])), Some(0));
        // (30+1)/10 vs (2+1)/1 = 3.1 vs 3: backend 1.
        assert_eq!(s.pick(&Counts::new(&[(30, 0), (2, 0), (0, 0)])), Some(1));
    }

    #[test]
    fn drained_idle_backend_is_not_chosen() {
        let s = Nq::build(&backends(&[0, 1]));
        assert_eq!(s.pick(&Counts::new(&[(0, 0), (5, 0)])), Some(1));
    }
}
