//! The least-connection family's fast path: when a service's backends have contiguous
//! [`BackendId`]s (the snapshot builder assigns them so on a fresh build), their counts are one
//! run that [`ConnCounts::counts_run`] copies out in bulk, chunk by chunk, instead of two trait
//! calls per backend; the scan then works on plain arrays with `u64` products (exact: the
//! build checks the weights are small enough, see [`Run::new`]) and several independent
//! minimum chains, so it is not bound by one compare-and-select dependency per backend.
//!
//! Every scan here returns exactly what the generic scan in the scheduler's module returns
//! (same load, same tie-break to the earlier backend, weight 0 never picked); the unit tests
//! compare them on random inputs.

use crate::{BackendId, ConnCounts, Dest};

/// Backends copied per [`ConnCounts::counts_run`] call.
const CHUNK: usize = 64;

/// Loads below 2^41 (`u32 * 256 + u32`) times weights below 2^23 fit a `u64`.
const WEIGHT_FAST_MAX: u32 = (1 << 23) - 1;

/// A service's backends as one contiguous run of ids, with their weights in a plain array.
#[derive(Debug)]
pub(crate) struct Run {
    first: BackendId,
    weights: Box<[u32]>,
}

impl Run {
    /// `Some` when `dests` have ids `first, first + 1, ...` and every weight fits the `u64`
    /// comparison.
    pub(crate) fn new(dests: &[Dest]) -> Option<Run> {
        let first = dests.first()?.id;
        let contiguous = dests
            .iter()
            .enumerate()
            .all(|(i, d)| u64::from(d.id.0) == u64::from(first.0) + i as u64);
        let small = dests.iter().all(|d| d.weight <= WEIGHT_FAST_MAX);
        (contiguous && small).then(|| Run {
            first,
            weights: dests.iter().map(|d| d.weight).collect(),
        })
    }

    /// Calls `f(offset, counts, weights)` per chunk; `None` if `counts` has no bulk access.
    #[inline]
    fn chunks<C: ConnCounts + ?Sized>(
        &self,
        counts: &C,
        mut f: impl FnMut(usize, &[[u32; 2]], &[u32]),
    ) -> Option<()> {
        let mut buf = [[0u32; 2]; CHUNK];
        for (k, w) in self.weights.chunks(CHUNK).enumerate() {
            let off = k * CHUNK;
            let out = &mut buf[..w.len()];
            if !counts.counts_run(BackendId(self.first.0 + off as u32), out) {
                return None;
            }
            f(off, out, w);
        }
        Some(())
    }

    /// lc: the least `active * 256 + inactive` among weight > 0, earliest on ties.
    #[inline]
    pub(crate) fn least_overhead<C: ConnCounts + ?Sized>(
        &self,
        counts: &C,
    ) -> Option<Option<usize>> {
        // Key = load << 20 | index-in-chunk order is not enough across chunks; keep (load, i).
        let mut best = (u64::MAX, usize::MAX);
        self.chunks(counts, |off, c, w| {
            for (i, (c, &w)) in c.iter().zip(w).enumerate() {
                let load = u64::from(c[0]) * 256 + u64::from(c[1]);
                // Drained backends get the largest key; loads are < 2^41 so never tie with it.
                let load = if w == 0 { u64::MAX } else { load };
                if load < best.0 {
                    best = (load, off + i);
                }
            }
        })?;
        Some((best.0 != u64::MAX).then_some(best.1))
    }

    /// wlc / sed: the least `load / weight` (cross-multiplied), earliest on ties, weight 0
    /// never picked unless... never (IPVS seeds with the first weight > 0 and a weight-0
    /// backend is never strictly lighter).
    #[inline]
    pub(crate) fn weighted_least<C: ConnCounts + ?Sized>(
        &self,
        counts: &C,
        load: impl Fn([u32; 2]) -> u64,
    ) -> Option<Option<usize>> {
        // (load, weight, index); weight 0 = none yet.
        let mut best = (0u64, 0u32, usize::MAX);
        self.chunks(counts, |off, c, w| {
            for (i, (c, &w)) in c.iter().zip(w).enumerate() {
                let l = load(*c);
                // best.load * w > l * best.weight: strictly lighter. With best.weight == 0
                // (nothing yet) the right side is 0, so any weight > 0 backend is taken
                // (its left side is 0 only when w == 0).
                if w != 0 && (best.1 == 0 || best.0 * u64::from(w) > l * u64::from(best.1)) {
                    best = (l, w, off + i);
                }
            }
        })?;
        Some((best.1 != 0).then_some(best.2))
    }

    /// nq: the first idle (no active connection) backend with weight > 0, else the sed choice.
    #[inline]
    pub(crate) fn never_queue<C: ConnCounts + ?Sized>(&self, counts: &C) -> Option<Option<usize>> {
        let mut best = (0u64, 0u32, usize::MAX);
        let mut idle = usize::MAX;
        self.chunks(counts, |off, c, w| {
            if idle != usize::MAX {
                return;
            }
            for (i, (c, &w)) in c.iter().zip(w).enumerate() {
                if w == 0 {
                    continue;
                }
                if c[0] == 0 {
                    idle = off + i;
                    return;
                }
                let l = u64::from(c[0]) + 1;
                if best.1 == 0 || best.0 * u64::from(w) > l * u64::from(best.1) {
                    best = (l, w, off + i);
                }
            }
        })?;
        if idle != usize::MAX {
            return Some(Some(idle));
        }
        Some((best.1 != 0).then_some(best.2))
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{Counts, backends};
    use crate::{BackendId, ConnCounts, SchedParams, Scheduler, SchedulerKind};

    /// The same counts without bulk access: forces the generic scans.
    struct NoRun<'a>(&'a Counts);

    impl ConnCounts for NoRun<'_> {
        fn active(&self, id: BackendId) -> u32 {
            self.0.active(id)
        }
        fn inactive(&self, id: BackendId) -> u32 {
            self.0.inactive(id)
        }
    }

    #[test]
    fn bulk_scans_pick_what_the_generic_scans_pick() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let now = std::time::Instant::now();
        let kinds = [
            SchedulerKind::Lc,
            SchedulerKind::Wlc,
            SchedulerKind::Sed,
            SchedulerKind::Nq,
        ];
        for round in 0..400 {
            let n = 1 + rnd(if round % 4 == 0 { 300 } else { 20 }) as usize;
            // Small ranges so ties and idle/drained backends are common.
            let weights: Vec<u32> = (0..n).map(|_| rnd(4) as u32).collect();
            let c: Vec<(u32, u32)> = (0..n).map(|_| (rnd(4) as u32, rnd(300) as u32)).collect();
            let counts = Counts::new(&c);
            let b = backends(&weights);
            for kind in kinds {
                let s = Scheduler::build(kind, &b, &SchedParams::default()).unwrap();
                let flow = crate::testutil::flow(1, 2);
                assert_eq!(
                    s.pick(&flow, &counts, now),
                    s.pick(&flow, &NoRun(&counts), now),
                    "{kind} weights {weights:?} counts {c:?}"
                );
            }
        }
    }
}
