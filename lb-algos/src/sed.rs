//! Shortest expected delay (IPVS `ip_vs_sed.c`): the backend minimising
//! `(active + 1) / weight`. IPVS's sed counts *active* connections only (inactive ones are
//! ignored, unlike wlc's overhead), compared by multiplication like wlc; ties go to the
//! earlier backend, weight 0 never wins. O(n) per pick.

use crate::wlc::weighted_least;
use crate::{Backend, ConnCounts, Dest, dests};

/// Shortest-expected-delay scheduler.
#[derive(Debug)]
pub struct Sed {
    dests: Box<[Dest]>,
    /// Bulk fast path when the ids are contiguous (see [`crate::run`]).
    run: Option<crate::run::Run>,
}

impl Sed {
    /// Builds over `backends`.
    pub fn build(backends: &[Backend]) -> Sed {
        let dests = dests(backends);
        Sed {
            run: crate::run::Run::new(&dests),
            dests,
        }
    }

    /// The backend with the least `(active + 1) / weight`.
    #[inline]
    pub fn pick<C: ConnCounts + ?Sized>(&self, counts: &C) -> Option<usize> {
        if let Some(run) = &self.run
            && let Some(r) = run.weighted_least(counts, |c| (c >> 32) + 1)
        {
            return r;
        }
        weighted_least(&self.dests, counts, |c, id| u64::from(c.active(id)) + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Counts, backends};

    #[test]
    fn expected_delay_uses_active_plus_one_over_weight() {
        let s = Sed::build(&backends(&[1, 2]));
        // Both idle: 1/1 vs 1/2 → the heavier weight, unlike wlc which would tie at 0 and
        // keep the first.
        assert_eq!(s.pick(&Counts::new(&[(0, 0), (0, 0)])), Some(1));
        // (0+1)/1 vs (2+1)/2: backend 0.
        assert_eq!(s.pick(&Counts::new(&[(0, 0), (2, 0)])), Some(0));
        // Tie (0+1)/1 == (1+1)/2 keeps the earlier.
        assert_eq!(s.pick(&Counts::new(&[(0, 0), (1, 0)])), Some(0));
    }

    #[test]
    fn inactive_connections_are_ignored() {
        let s = Sed::build(&backends(&[1, 1]));
        assert_eq!(s.pick(&Counts::new(&[(1, 0), (0, 1000)])), Some(1));
    }
}
