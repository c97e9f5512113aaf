//! Least connections (IPVS `ip_vs_lc.c`): the backend with the smallest overhead
//! (`active * 256 + inactive`), weight ignored except that weight 0 is skipped; ties go to the
//! earlier backend in list order. O(n) per pick, like IPVS.

use crate::{Backend, ConnCounts, Dest, dests};

/// Least-connection scheduler.
#[derive(Debug)]
pub struct Lc {
    dests: Box<[Dest]>,
    /// Bulk fast path when the ids are contiguous (see [`crate::run`]).
    run: Option<crate::run::Run>,
}

impl Lc {
    /// Builds over `backends`.
    pub fn build(backends: &[Backend]) -> Lc {
        let dests = dests(backends);
        Lc {
            run: crate::run::Run::new(&dests),
            dests,
        }
    }

    /// The least-loaded backend with weight > 0.
    #[inline]
    pub fn pick<C: ConnCounts + ?Sized>(&self, counts: &C) -> Option<usize> {
        if let Some(run) = &self.run
            && let Some(r) = run.least_overhead(counts)
        {
            return r;
        }
        let mut least: Option<(usize, u64)> = None;
        for (i, d) in self.dests.iter().enumerate() {
            if d.weight == 0 {
                continue;
            }
            let doh = counts.overhead(d.id);
            if least.is_none_or(|(_, loh)| doh < loh) {
                least = Some((i, doh));
            }
        }
        least.map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Counts, backends};

    #[test]
    fn picks_least_overhead_first_on_ties_skipping_drained() {
        let s = Lc::build(&backends(&[1, 9, 1, 0]));
        // overheads: 2*256+0=512, 1*256+300=556, 512+0=512 (tie with 0), drained has 0.
        let c = Counts::new(&[(2, 0), (1, 300), (2, 0), (0, 0)]);
        assert_eq!(s.pick(&c), Some(0));
        // An inactive connection counts 1/256 of an active one.
        let c = Counts::new(&[(2, 1), (1, 255), (2, 0), (0, 0)]);
        assert_eq!(s.pick(&c), Some(1));
        // Weight does not matter to lc (only 0 = drain).
        let c = Counts::new(&[(3, 0), (4, 0), (5, 0), (0, 0)]);
        assert_eq!(s.pick(&c), Some(0));
    }
}
