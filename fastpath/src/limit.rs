//! The per-service new-connection rate limit: a token bucket shared by every worker.
//!
//! Implemented as GCRA (the generic cell rate algorithm, the token bucket's equivalent
//! "virtual scheduling" form): one atomic holds the theoretical arrival time (TAT) of the next
//! conforming connection, in nanoseconds since the bucket's epoch. A new connection at `now`
//! conforms when `max(TAT, now) + T − now ≤ burst · T` (with `T = 1 s / rate`); it then
//! advances TAT by `T`. That admits `burst` connections at once from a full bucket and `rate`
//! per second sustained, exactly like a bucket of `burst` tokens refilled at `rate`/s.
//!
//! One CAS per admitted connection and one load per refused one: lock-free, no allocation, no
//! clock read (the caller passes the batch's `now`). Only new flows pay for it; packets of
//! established flows never reach it.
//!
//! [`WorkerBucket`] is the same algorithm without atomics, for a limit each worker keeps
//! alone (the pipeline's rejects).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A new-connection rate limit: `rate` per second sustained, bursts of up to `burst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// Sustained new connections per second (> 0).
    pub rate: u32,
    /// Connections admitted at once from a full bucket (≥ 1).
    pub burst: u32,
}

/// A shared token bucket (see the module docs).
#[derive(Debug)]
pub struct TokenBucket {
    epoch: Instant,
    /// Nanoseconds per token (`1e9 / rate`, at least 1).
    interval: u64,
    /// `burst · interval`.
    tolerance: u64,
    /// Theoretical arrival time, ns since `epoch`.
    tat: AtomicU64,
    limit: RateLimit,
}

impl TokenBucket {
    /// A full bucket for `limit`; times before `epoch` count as `epoch`.
    pub fn new(limit: RateLimit, epoch: Instant) -> TokenBucket {
        let interval = (1_000_000_000 / u64::from(limit.rate.max(1))).max(1);
        TokenBucket {
            epoch,
            interval,
            tolerance: interval.saturating_mul(u64::from(limit.burst.max(1))),
            tat: AtomicU64::new(0),
            limit,
        }
    }

    /// The limit this bucket enforces.
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Takes a token for a new connection at `now`: `true` if it conforms.
    #[inline]
    pub fn admit(&self, now: Instant) -> bool {
        let now = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now) + self.interval;
            if next - now > self.tolerance {
                return false;
            }
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(t) => tat = t,
            }
        }
    }
}

/// One worker's token bucket (the same GCRA without atomics: its owner alone uses it), for
/// the pipeline's reject rate limit. `rate` 0 admits nothing.
#[derive(Clone, Debug)]
pub struct WorkerBucket {
    epoch: Instant,
    /// Nanoseconds per token; 0: admits nothing.
    interval: u64,
    /// `burst · interval`.
    tolerance: u64,
    /// Theoretical arrival time, ns since `epoch`.
    tat: u64,
}

impl WorkerBucket {
    /// A full bucket for `limit`; times before `epoch` count as `epoch`.
    pub fn new(limit: RateLimit, epoch: Instant) -> WorkerBucket {
        let interval = match limit.rate {
            0 => 0,
            r => (1_000_000_000 / u64::from(r)).max(1),
        };
        WorkerBucket {
            epoch,
            interval,
            tolerance: interval.saturating_mul(u64::from(limit.burst.max(1))),
            tat: 0,
        }
    }

    /// Takes a token at `now`: `true` if it conforms.
    #[inline]
    pub fn admit(&mut self, now: Instant) -> bool {
        if self.interval == 0 {
            return false;
        }
        let now = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        let next = self.tat.max(now).saturating_add(self.interval);
        if next - now > self.tolerance {
            return false;
        }
        self.tat = next;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn admitted(b: &TokenBucket, at: Instant, n: usize) -> usize {
        (0..n).filter(|_| b.admit(at)).count()
    }

    #[test]
    fn a_full_bucket_admits_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let b = TokenBucket::new(
            RateLimit {
                rate: 100,
                burst: 10,
            },
            t0,
        );
        // A full bucket: exactly `burst` at once.
        assert_eq!(admitted(&b, t0, 50), 10);
        // 10 ms later one token has come back (100/s).
        assert_eq!(admitted(&b, t0 + Duration::from_millis(10), 50), 1);
        // Over one idle second the bucket refills to `burst`, not beyond.
        assert_eq!(admitted(&b, t0 + Duration::from_secs(5), 50), 10);
        // Sustained: one attempt per ms for a second admits about `rate`.
        let start = t0 + Duration::from_secs(10);
        let n = (0..1000)
            .filter(|i| b.admit(start + Duration::from_millis(*i)))
            .count();
        assert!(
            (100..=111).contains(&n),
            "admitted {n} in one second at 100/s burst 10"
        );
    }

    #[test]
    fn times_before_the_epoch_and_extreme_limits_do_not_panic() {
        let t0 = Instant::now();
        let b = TokenBucket::new(
            RateLimit {
                rate: u32::MAX,
                burst: u32::MAX,
            },
            t0 + Duration::from_secs(1),
        );
        assert!(b.admit(t0));
        let z = TokenBucket::new(RateLimit { rate: 0, burst: 0 }, t0);
        // Treated as 1/s with a burst of 1.
        assert_eq!(admitted(&z, t0, 5), 1);
        assert_eq!(admitted(&z, t0 + Duration::from_secs(1), 5), 1);
    }

    #[test]
    fn a_worker_bucket_admits_a_burst_then_the_rate_and_rate_0_nothing() {
        let t0 = Instant::now();
        let mut b = WorkerBucket::new(
            RateLimit {
                rate: 1000,
                burst: 50,
            },
            t0,
        );
        assert_eq!((0..200).filter(|_| b.admit(t0)).count(), 50);
        // 10 ms later 10 tokens have come back (1000/s).
        let t = t0 + Duration::from_millis(10);
        assert_eq!((0..200).filter(|_| b.admit(t)).count(), 10);
        // Idle: refilled to the burst, not beyond.
        let t = t0 + Duration::from_secs(5);
        assert_eq!((0..200).filter(|_| b.admit(t)).count(), 50);
        let mut off = WorkerBucket::new(RateLimit { rate: 0, burst: 50 }, t0);
        assert!(!off.admit(t0 + Duration::from_secs(9)));
    }

    #[test]
    fn workers_sharing_a_bucket_admit_exactly_the_burst() {
        let t0 = Instant::now();
        let b = std::sync::Arc::new(TokenBucket::new(
            RateLimit {
                rate: 1,
                burst: 1000,
            },
            t0,
        ));
        let total: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| admitted(&b, t0, 10_000)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(total, 1000);
    }
}
