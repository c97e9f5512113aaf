//! Passive health signals: per backend, how many TCP connections the fastpath opened (SYNs
//! forwarded to it) and how many it saw answered (SYN-ACKs coming back from it).
//!
//! Workers count with one relaxed atomic add per new TCP flow and per SYN-ACK, on a
//! per-backend word shared by all workers (only connection set-up pays; established packets
//! never touch it). The slowpath samples the words periodically: SYNs that had time to be
//! answered and were not mean the backend does not accept connections, whatever the active
//! probes last said ([`SynWatch::sample`] and [`Passive`]).

use std::sync::atomic::{AtomicU64, Ordering};

use lb_algos::BackendId;

/// Per-backend SYN / SYN-ACK counters, indexed by [`BackendId`] (wrapping `u32` halves of
/// one word: SYNs in the low half, SYN-ACKs in the high half).
#[derive(Debug)]
pub struct SynWatch {
    words: Box<[AtomicU64]>,
}

/// One backend's counters as sampled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynCounts {
    /// SYNs forwarded (new TCP flows), wrapping.
    pub syns: u32,
    /// SYN-ACKs seen from the backend, wrapping.
    pub answered: u32,
}

impl SynWatch {
    /// Counters for backend ids `0..backends`.
    pub fn new(backends: usize) -> SynWatch {
        SynWatch {
            words: (0..backends).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A new TCP flow was sent to `id`.
    #[inline]
    pub fn syn(&self, id: BackendId) {
        if let Some(w) = self.words.get(id.0 as usize) {
            // The low half wraps into the high one only after 2^32 SYNs without a carry
            // guard; a carry there shifts `answered` by one, which one sample absorbs.
            w.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A SYN-ACK came back from `id`.
    #[inline]
    pub fn answered(&self, id: BackendId) {
        if let Some(w) = self.words.get(id.0 as usize) {
            w.fetch_add(1 << 32, Ordering::Relaxed);
        }
    }

    /// The counters of `id` now (zeros for an id out of range).
    pub fn sample(&self, id: BackendId) -> SynCounts {
        let w = self
            .words
            .get(id.0 as usize)
            .map_or(0, |w| w.load(Ordering::Relaxed));
        SynCounts {
            syns: w as u32,
            answered: (w >> 32) as u32,
        }
    }
}

/// The passive check of one backend, fed one sample per period (e.g. every second).
///
/// A period counts as failed when the SYNs sent during the *previous* period (so each had at
/// least one whole period to be answered) number at least `min_syns` and no SYN-ACK at all
/// came back during the last two periods. One failed period is one failed check for the
/// health checker's `fall` threshold.
#[derive(Clone, Copy, Debug, Default)]
pub struct Passive {
    /// The last two samples, oldest first.
    prev: [Option<SynCounts>; 2],
}

impl Passive {
    /// Feeds the sample of this period; `true` when the period counts as failed.
    pub fn observe(&mut self, now: SynCounts, min_syns: u32) -> bool {
        let failed = match self.prev {
            [Some(a), Some(b)] => {
                b.syns.wrapping_sub(a.syns) >= min_syns.max(1)
                    && now.answered.wrapping_sub(a.answered) == 0
            }
            _ => false,
        };
        self.prev = [self.prev[1], Some(now)];
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_backend_and_ignores_ids_out_of_range() {
        let w = SynWatch::new(4);
        w.syn(BackendId(1));
        w.syn(BackendId(1));
        w.answered(BackendId(1));
        w.syn(BackendId(9));
        w.answered(BackendId(9));
        assert_eq!(
            w.sample(BackendId(1)),
            SynCounts {
                syns: 2,
                answered: 1
            }
        );
        assert_eq!(w.sample(BackendId(0)), SynCounts::default());
        assert_eq!(w.sample(BackendId(9)), SynCounts::default());
    }

    fn c(syns: u32, answered: u32) -> SynCounts {
        SynCounts { syns, answered }
    }

    #[test]
    fn unanswered_syns_fail_a_period_only_after_they_had_time() {
        let mut p = Passive::default();
        assert!(!p.observe(c(0, 0), 3));
        // 5 SYNs this period: too young to judge.
        assert!(!p.observe(c(5, 0), 3));
        // A period later still no SYN-ACK: failed, and again while it lasts.
        assert!(p.observe(c(5, 0), 3));
        assert!(!p.observe(c(5, 0), 3), "no new SYNs in the judged period");
        assert!(!p.observe(c(9, 0), 3));
        assert!(p.observe(c(20, 0), 3));
        // One SYN-ACK in the window clears it.
        assert!(!p.observe(c(30, 1), 3));
    }

    #[test]
    fn answered_backends_and_few_syns_never_fail() {
        let mut p = Passive::default();
        let mut syns = 0;
        let mut acks = 0;
        for _ in 0..10 {
            syns += 100;
            acks += 97; // a few lost
            assert!(!p.observe(c(syns, acks), 3));
        }
        let mut q = Passive::default();
        for i in 0..10 {
            assert!(!q.observe(c(i * 2, 0), 3), "2 SYNs per period < min 3");
        }
    }

    #[test]
    fn counters_wrap() {
        let mut p = Passive::default();
        p.observe(c(u32::MAX - 1, 7), 3);
        p.observe(c(4, 7), 3);
        assert!(p.observe(c(4, 7), 3));
    }
}
