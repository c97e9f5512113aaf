//! Round robin (IPVS `ip_vs_rr.c`): backends with weight > 0 in list order, over and over.
//!
//! IPVS walks its list from the last pick under a spinlock. Here the eligible indices are
//! precomputed at build and a shared atomic cursor picks the next one, so `pick` is O(1),
//! lock-free, and concurrent workers together still walk the exact sequence (each pick takes
//! the next position; which worker gets which position is up to the race).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Backend, Padded};

/// A fixed sequence of backend indices consumed by an atomic cursor; shared by rr and wrr.
#[derive(Debug)]
pub(crate) struct Cycle {
    seq: Box<[u32]>,
    cursor: Padded<AtomicU64>,
}

impl Cycle {
    pub(crate) fn new(seq: Vec<u32>) -> Cycle {
        Cycle {
            seq: seq.into_boxed_slice(),
            cursor: Padded(AtomicU64::new(0)),
        }
    }

    #[inline]
    pub(crate) fn next(&self) -> Option<usize> {
        if self.seq.is_empty() {
            return None;
        }
        // A u64 cursor does not wrap in practice, so the sequence never skips a phase.
        let c = self.cursor.0.fetch_add(1, Ordering::Relaxed);
        Some(self.seq[(c % self.seq.len() as u64) as usize] as usize)
    }

    #[cfg(test)]
    pub(crate) fn sequence(&self) -> &[u32] {
        &self.seq
    }
}

/// Round-robin scheduler.
#[derive(Debug)]
pub struct Rr {
    cycle: Cycle,
}

impl Rr {
    /// Builds over `backends`; weight-0 backends are left out.
    pub fn build(backends: &[Backend]) -> Rr {
        let seq = (0..backends.len() as u32)
            .filter(|&i| backends[i as usize].weight > 0)
            .collect();
        Rr {
            cycle: Cycle::new(seq),
        }
    }

    /// The next backend in the cycle.
    #[inline]
    pub fn pick(&self) -> Option<usize> {
        self.cycle.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::backends;

    fn picks(s: &Rr, n: usize) -> Vec<usize> {
        (0..n).map(|_| s.pick().unwrap()).collect()
    }

    #[test]
    fn cycles_in_list_order_skipping_drained() {
        let s = Rr::build(&backends(&[1, 5, 0, 1]));
        assert_eq!(picks(&s, 7), [0, 1, 3, 0, 1, 3, 0]);
    }

    #[test]
    fn single_backend_and_empty() {
        assert_eq!(picks(&Rr::build(&backends(&[3])), 3), [0, 0, 0]);
        assert_eq!(Rr::build(&backends(&[0])).pick(), None);
        assert_eq!(Rr::build(&[]).pick(), None);
    }

    #[test]
    fn concurrent_pickers_share_one_sequence() {
        let s = Rr::build(&backends(&[1, 1, 1, 1]));
        let mut counts = [0usize; 4];
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4).map(|_| sc.spawn(|| picks(&s, 1000))).collect();
            for h in hs {
                for i in h.join().unwrap() {
                    counts[i] += 1;
                }
            }
        });
        // 4000 picks from one cursor: exactly 1000 each, whatever the interleaving.
        assert_eq!(counts, [1000; 4]);
    }
}
