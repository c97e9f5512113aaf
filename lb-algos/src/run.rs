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

/// Backends copied per [`ConnCounts::packed_run`] call.
const CHUNK: usize = 256;
/// The buffer of runs of at most this many backends.
const SMALL: usize = 32;

/// Loads below 2^41 (`u32 * 256 + u32`) times weights below 2^23 fit a `u64`.
const WEIGHT_FAST_MAX: u32 = (1 << 23) - 1;

/// Bits of a backend's position in an lc key (`crate::BACKENDS_MAX` = 2^20 positions).
const INDEX_BITS: u32 = 20;
const _: () = assert!(crate::BACKENDS_MAX <= 1 << INDEX_BITS);
// lc keys: load (< 2^41) << 20 stays below 2^61, so no key reaches the drained tag.
const _: () = assert!(41 + INDEX_BITS < 64);

/// A service's backends as one contiguous run of ids, with their weights in a plain array.
#[derive(Debug)]
pub(crate) struct Run {
    first: BackendId,
    weights: Box<[u32]>,
    /// Per backend: its position, or `u64::MAX` when drained (weight 0). OR-ed into the lc
    /// key `load << 20`, it makes the key order "least load, then earliest", and a drained
    /// backend's key the largest of all.
    lc_tags: Box<[u64]>,
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
        let fits = dests.len() <= crate::BACKENDS_MAX;
        (contiguous && small && fits).then(|| Run {
            first,
            weights: dests.iter().map(|d| d.weight).collect(),
            lc_tags: dests
                .iter()
                .enumerate()
                .map(|(i, d)| if d.weight == 0 { u64::MAX } else { i as u64 })
                .collect(),
        })
    }

    /// Calls `f(offset, packed counts, range)` per chunk of up to [`CHUNK`] backends, the
    /// counts packed `active << 32 | inactive`; `None` if `counts` has no bulk access.
    #[inline]
    fn chunks<C: ConnCounts + ?Sized>(
        &self,
        counts: &C,
        f: impl FnMut(usize, &[u64]),
    ) -> Option<()> {
        // A small service should not pay for zeroing a large buffer.
        if self.weights.len() <= SMALL {
            self.chunks_in(&mut [0u64; SMALL], counts, f)
        } else {
            self.chunks_in(&mut [0u64; CHUNK], counts, f)
        }
    }

    #[inline(always)]
    fn chunks_in<C: ConnCounts + ?Sized>(
        &self,
        buf: &mut [u64],
        counts: &C,
        mut f: impl FnMut(usize, &[u64]),
    ) -> Option<()> {
        let n = self.weights.len();
        let chunk = buf.len();
        let mut off = 0;
        while off < n {
            let out = &mut buf[..(n - off).min(chunk)];
            if !counts.packed_run(BackendId(self.first.0 + off as u32), out) {
                return None;
            }
            f(off, out);
            off += chunk;
        }
        Some(())
    }

    /// lc: the least `active * 256 + inactive` among weight > 0, earliest on ties: the
    /// minimum of the keys `load << 20 | position` (drained: `u64::MAX`), a plain
    /// min-reduction the compiler vectorises.
    #[inline]
    pub(crate) fn least_overhead<C: ConnCounts + ?Sized>(
        &self,
        counts: &C,
    ) -> Option<Option<usize>> {
        let mut best = u64::MAX;
        self.chunks(counts, |off, c| {
            best = best.min(min_lc_key(c, &self.lc_tags[off..off + c.len()]));
        })?;
        Some((best != u64::MAX).then_some((best & ((1 << INDEX_BITS) - 1)) as usize))
    }

    /// wlc / sed: the least `load / weight` (cross-multiplied), earliest on ties, weight 0
    /// never picked unless... never (IPVS seeds with the first weight > 0 and a weight-0
    /// backend is never strictly lighter).
    #[inline]
    pub(crate) fn weighted_least<C: ConnCounts + ?Sized>(
        &self,
        counts: &C,
        load: impl Fn(u64) -> u64,
    ) -> Option<Option<usize>> {
        // (load, weight, index); weight 0 = none yet.
        let mut best = (0u64, 0u32, usize::MAX);
        self.chunks(counts, |off, c| {
            let w = &self.weights[off..off + c.len()];
            for (i, (&c, &w)) in c.iter().zip(w).enumerate() {
                let l = load(c);
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
        self.chunks(counts, |off, c| {
            if idle != usize::MAX {
                return;
            }
            let w = &self.weights[off..off + c.len()];
            for (i, (&c, &w)) in c.iter().zip(w).enumerate() {
                if w == 0 {
                    continue;
                }
                let active = c >> 32;
                if active == 0 {
                    idle = off + i;
                    return;
                }
                let l = active + 1;
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

/// The least lc key of a chunk: `packed[i]` are counts (`active << 32 | inactive`),
/// `tags[i]` the positions (or `u64::MAX`). Dispatches to a wider-vector build when the CPU
/// has one (same arithmetic, same result).
#[inline]
fn min_lc_key(packed: &[u64], tags: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if packed.len() > SMALL {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F.
            return unsafe { min_lc_key_avx512(packed, tags) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2.
            return unsafe { min_lc_key_avx2(packed, tags) };
        }
    }
    min_lc_key_scalar(packed, tags)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn min_lc_key_avx512(packed: &[u64], tags: &[u64]) -> u64 {
    min_lc_key_scalar(packed, tags)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn min_lc_key_avx2(packed: &[u64], tags: &[u64]) -> u64 {
    min_lc_key_scalar(packed, tags)
}

#[inline(always)]
fn min_lc_key_scalar(packed: &[u64], tags: &[u64]) -> u64 {
    packed
        .iter()
        .zip(tags)
        .map(|(&c, &t)| {
            let load = (c >> 32) * 256 + (c & 0xffff_ffff);
            load << INDEX_BITS | t
        })
        .fold(u64::MAX, u64::min)
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
