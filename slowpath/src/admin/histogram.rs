//! Prometheus histograms of the slowpath's sync loop, kube-proxy's buckets.
//!
//! [`Histogram`] is written by one thread (the daemon's loop) and read by the admin server's:
//! relaxed atomics, no lock. A reader may see an observation in a bucket before it sees it in
//! the sum; the count is derived from the buckets, so `_count` always equals the `+Inf`
//! bucket and the buckets are always cumulative and monotonic, as a Prometheus parser
//! requires.
//!
//! Not for the fastpath: an observation is a handful of atomic operations (a search over
//! the bounds and two stores), fine once per sync, too much per packet.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// kube-proxy's `sync_proxy_rules_duration_seconds` buckets: `ExponentialBuckets(0.001, 2,
/// 15)`, 1 ms to 16.384 s.
pub const SYNC_DURATION_BUCKETS: [f64; 15] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
    8.192, 16.384,
];

/// kube-proxy's `network_programming_duration_seconds` buckets: 0, 0.25 s, 0.5 s, 1 s to
/// 59 s by 1 s, 60 s to 115 s by 5 s, 120 s to 300 s by 30 s (its `merge` starts with a 0).
pub const NETWORK_PROGRAMMING_BUCKETS: [f64; 81] = network_programming_buckets();

const fn network_programming_buckets() -> [f64; 81] {
    let mut b = [0.0; 81];
    b[1] = 0.25;
    b[2] = 0.5;
    let mut i = 0;
    while i < 59 {
        b[3 + i] = (i + 1) as f64;
        i += 1;
    }
    i = 0;
    while i < 12 {
        b[62 + i] = 60.0 + 5.0 * i as f64;
        i += 1;
    }
    i = 0;
    while i < 7 {
        b[74 + i] = 120.0 + 30.0 * i as f64;
        i += 1;
    }
    b
}

/// A histogram with fixed upper bounds (plus `+Inf`), observed in seconds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket, not cumulative; the last one is `+Inf`.
    counts: Box<[AtomicU64]>,
    /// Sum of the observations, `f64` bits.
    sum: AtomicU64,
}

impl Histogram {
    /// An empty histogram with upper bounds `bounds` (strictly increasing, finite).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Records one observation of `v` seconds. A negative value (a clock that went back) is
    /// recorded as 0; NaN is ignored.
    pub fn observe(&self, v: f64) {
        if v.is_nan() {
            return;
        }
        let v = v.max(0.0);
        // Prometheus buckets are `le`: a value on a bound belongs to that bucket.
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    /// The histogram as it is now.
    pub fn view(&self) -> HistogramView {
        let mut cumulative = 0u64;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (le, n) in self.bounds.iter().zip(self.counts.iter()) {
            cumulative += n.load(Ordering::Relaxed);
            buckets.push((*le, cumulative));
        }
        let inf = self.counts[self.bounds.len()].load(Ordering::Relaxed);
        HistogramView {
            buckets,
            count: cumulative + inf,
            sum: f64::from_bits(self.sum.load(Ordering::Relaxed)),
        }
    }
}

/// A histogram's state: cumulative counts by upper bound, the `+Inf` count and the sum.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistogramView {
    /// `(le, observations ≤ le)`, by increasing `le`; the `+Inf` bucket is `count`.
    pub buckets: Vec<(f64, u64)>,
    /// Every observation.
    pub count: u64,
    /// Sum of the observations, seconds.
    pub sum: f64,
}

impl HistogramView {
    /// An empty histogram with these bounds (what a daemon shows before its first sync).
    pub fn empty(bounds: &[f64]) -> HistogramView {
        HistogramView {
            buckets: bounds.iter().map(|b| (*b, 0)).collect(),
            count: 0,
            sum: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxys_buckets() {
        assert_eq!(SYNC_DURATION_BUCKETS[0], 0.001);
        assert_eq!(SYNC_DURATION_BUCKETS[14], 16.384);
        let np = &NETWORK_PROGRAMMING_BUCKETS;
        assert_eq!(&np[..5], &[0.0, 0.25, 0.5, 1.0, 2.0]);
        assert_eq!(np[61], 59.0);
        assert_eq!(&np[62..64], &[60.0, 65.0]);
        assert_eq!(np[73], 115.0);
        assert_eq!(
            &np[74..],
            &[120.0, 150.0, 180.0, 210.0, 240.0, 270.0, 300.0]
        );
        assert!(np.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn observations_land_in_cumulative_le_buckets() {
        static B: [f64; 3] = [0.1, 1.0, 10.0];
        let h = Histogram::new(&B);
        for v in [0.05, 0.1, 0.5, 1.0, 20.0, -3.0, f64::NAN] {
            h.observe(v);
        }
        let v = h.view();
        // 0.05, 0.1 and the negative (as 0) are ≤ 0.1; 0.5 and 1.0 add to ≤ 1; 20 is +Inf.
        assert_eq!(v.buckets, vec![(0.1, 3), (1.0, 5), (10.0, 5)]);
        assert_eq!(v.count, 6);
        assert!((v.sum - 21.65).abs() < 1e-9, "{}", v.sum);
    }
}
