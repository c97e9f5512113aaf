//! Weighted round robin with IPVS's interleaved sequence (`ip_vs_wrr.c`).
//!
//! IPVS keeps a current weight `cw` that starts at `mw = max - (gcd - 1)` and steps down by
//! `di = gcd` (wrapping to `mw` below 1); at each `cw` it walks the list and emits every
//! backend whose weight is `>= cw`. Weights 4, 3, 2 give `a a b a b c a b c`, then repeat.
//!
//! That sequence has period `sum(weights) / gcd`. We precompute one period at build and consume
//! it with an atomic cursor, so `pick` is O(1) and lock-free; the picks are exactly the ones
//! IPVS makes from a fresh service (its `dest_changed` keeps `cw` across updates; a rebuilt
//! scheduler restarts the period). The period is capped at [`SEQUENCE_MAX`]; wider weight
//! spreads are refused at build ([`BuildError::WrrSequenceTooLong`]).

use crate::rr::Cycle;
use crate::{Backend, BuildError, gcd};

/// Longest precomputed period (entries of 4 bytes: 4 MiB).
pub const SEQUENCE_MAX: u64 = 1 << 20;

/// Weighted round-robin scheduler.
#[derive(Debug)]
pub struct Wrr {
    cycle: Cycle,
}

impl Wrr {
    /// Builds the IPVS sequence for `backends`' weights in list order.
    pub fn build(backends: &[Backend]) -> Result<Wrr, BuildError> {
        let weights: Vec<u64> = backends.iter().map(|b| u64::from(b.weight)).collect();
        Ok(Wrr {
            cycle: Cycle::new(sequence(&weights)?),
        })
    }

    /// The next backend in the weighted sequence.
    #[inline]
    pub fn pick(&self) -> Option<usize> {
        self.cycle.next()
    }

    #[cfg(test)]
    fn sequence(&self) -> &[u32] {
        self.cycle.sequence()
    }
}

/// One period of IPVS's wrr order.
fn sequence(weights: &[u64]) -> Result<Vec<u32>, BuildError> {
    let di = weights
        .iter()
        .filter(|&&w| w > 0)
        .fold(0, |g, &w| gcd(g, w));
    if di == 0 {
        return Ok(Vec::new());
    }
    let len: u64 = weights.iter().map(|w| w / di).sum();
    if len > SEQUENCE_MAX {
        return Err(BuildError::WrrSequenceTooLong {
            len,
            max: SEQUENCE_MAX,
        });
    }
    let max = weights.iter().copied().max().unwrap_or(0);
    // Backends sorted by weight, heaviest first: as `cw` falls they join `eligible`, which is
    // kept in list order. Work is O(len + n^2) rather than O(levels * n).
    let mut by_weight: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0).collect();
    by_weight.sort_by(|&a, &b| weights[b].cmp(&weights[a]).then(a.cmp(&b)));
    let mut joined = 0;
    let mut eligible: Vec<u32> = Vec::with_capacity(by_weight.len());
    let mut seq = Vec::with_capacity(len as usize);
    let mut cw = max - (di - 1);
    while cw > 0 {
        while joined < by_weight.len() && weights[by_weight[joined]] >= cw {
            let i = by_weight[joined] as u32;
            let at = eligible.partition_point(|&e| e < i);
            eligible.insert(at, i);
            joined += 1;
        }
        seq.extend_from_slice(&eligible);
        cw = cw.saturating_sub(di);
    }
    debug_assert_eq!(seq.len() as u64, len);
    Ok(seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::backends;

    /// A line-by-line port of IPVS's stateful `ip_vs_wrr_schedule` (static weights, no
    /// overload flag): the oracle the precomputed sequence must match.
    struct IpvsWrr {
        weights: Vec<i64>,
        cl: Option<usize>, // None = list head
        cw: i64,
        mw: i64,
        di: i64,
    }

    impl IpvsWrr {
        fn new(weights: &[u32]) -> IpvsWrr {
            let weights: Vec<i64> = weights.iter().map(|&w| i64::from(w)).collect();
            let g = weights.iter().filter(|&&w| w > 0).fold(0i64, |g, &w| {
                if g > 0 {
                    gcd(g as u64, w as u64) as i64
                } else {
                    w
                }
            });
            let di = if g > 0 { g } else { 1 };
            let mw = weights.iter().copied().max().unwrap_or(0) - (di - 1);
            IpvsWrr {
                weights,
                cl: None,
                cw: mw,
                mw,
                di,
            }
        }

        fn schedule(&mut self) -> Option<usize> {
            if self.mw == 0 {
                return None;
            }
            let mut dest = self.cl;
            let last = dest;
            let mut stop = None;
            let (mut last_pass, mut restarted) = (false, false);
            loop {
                let start = dest.map_or(0, |d| d + 1);
                for i in start..self.weights.len() {
                    if self.weights[i] >= self.cw {
                        self.cl = Some(i);
                        return Some(i);
                    }
                    if Some(i) == stop {
                        return None;
                    }
                }
                dest = None;
                self.cw -= self.di;
                if self.cw <= 0 {
                    self.cw = self.mw;
                    if last_pass || last.is_none() {
                        return None;
                    }
                    restarted = true;
                }
                last_pass = self.cw <= self.di;
                if last_pass && restarted && last.is_some() {
                    stop = last;
                }
            }
        }
    }

    fn check_against_ipvs(weights: &[u32]) {
        let s = Wrr::build(&backends(weights)).unwrap();
        let mut oracle = IpvsWrr::new(weights);
        let period = s.sequence().len().max(1);
        for n in 0..3 * period + 5 {
            assert_eq!(s.pick(), oracle.schedule(), "weights {weights:?}, pick {n}");
        }
    }

    #[test]
    fn documented_example() {
        let s = Wrr::build(&backends(&[4, 3, 2])).unwrap();
        assert_eq!(s.sequence(), [0, 0, 1, 0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn matches_ipvs_schedule() {
        for w in [
            &[4, 3, 2][..],
            &[1, 1, 1],
            &[5],
            &[2, 4, 6],    // gcd 2
            &[6, 9, 3],    // gcd 3, heaviest in the middle
            &[0, 3, 0, 1], // drained entries
            &[1, 0, 7, 2, 7],
            &[100, 1],
            &[0, 0],
            &[],
        ] {
            check_against_ipvs(w);
        }
    }

    #[test]
    fn gcd_reduces_the_period_and_shares_follow_weights() {
        let s = Wrr::build(&backends(&[20, 30, 0, 10])).unwrap();
        assert_eq!(s.sequence(), [1, 0, 1, 0, 1, 3]);
        let mut counts = [0; 4];
        for _ in 0..600 {
            counts[s.pick().unwrap()] += 1;
        }
        assert_eq!(counts, [200, 300, 0, 100]);
    }

    #[test]
    fn single_backend() {
        let s = Wrr::build(&backends(&[7])).unwrap();
        assert_eq!(s.sequence(), [0]);
        assert_eq!((0..3).map(|_| s.pick()).collect::<Vec<_>>(), [Some(0); 3]);
    }

    #[test]
    fn too_long_a_period_is_refused() {
        let err = Wrr::build(&backends(&[1 << 20, 1])).unwrap_err();
        assert_eq!(
            err,
            BuildError::WrrSequenceTooLong {
                len: (1 << 20) + 1,
                max: SEQUENCE_MAX
            }
        );
        // Same spread with a common factor is fine: the period is sum / gcd.
        assert!(Wrr::build(&backends(&[1 << 20, 1 << 19])).is_ok());
    }
}
