//! Logging a failure that repeats: the first occurrence at once, then with exponential
//! backoff and a count, and a single line when it stops. An API server that is down fails
//! every watch at every retry (about once a second each); without this the log says the same
//! thing thousands of times and buries everything else.
//!
//! Sans-IO: the caller passes `now` and does the logging; [`RepeatLog`] only decides when.

use std::time::{Duration, Instant};

/// The first repeat is logged this long after the first failure; each later one twice as
/// long after the previous.
pub const FIRST_INTERVAL: Duration = Duration::from_secs(1);
/// Repeats are logged at least this often while the failure lasts.
pub const MAX_INTERVAL: Duration = Duration::from_secs(300);

/// One repeating failure's log schedule.
#[derive(Clone, Debug, Default)]
pub struct RepeatLog {
    /// Failures since the last success.
    errors: u64,
    /// When the next failure may be logged, and the interval after that.
    next: Option<(Instant, Duration)>,
}

impl RepeatLog {
    /// Records a failure at `now`; returns the count of failures so far (this one included)
    /// when it should be logged: the first, then at 1 s, 2 s, 4 s... up to every
    /// [`MAX_INTERVAL`].
    pub fn failed(&mut self, now: Instant) -> Option<u64> {
        self.errors += 1;
        match self.next {
            Some((at, _)) if now < at => None,
            Some((_, interval)) => {
                self.next = Some((now + interval, (interval * 2).min(MAX_INTERVAL)));
                Some(self.errors)
            }
            None => {
                self.next = Some((now + FIRST_INTERVAL, FIRST_INTERVAL * 2));
                Some(self.errors)
            }
        }
    }

    /// Records a success; returns how many failures preceded it, if any (log that it
    /// recovered), and resets the schedule.
    pub fn recovered(&mut self) -> Option<u64> {
        let errors = std::mem::take(&mut self.errors);
        self.next = None;
        (errors > 0).then_some(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_first_then_backs_off_then_reports_recovery() {
        let t0 = Instant::now();
        let mut r = RepeatLog::default();
        assert_eq!(r.recovered(), None, "nothing failed yet");
        // A failure every 100 ms for 20 s: logged at 0, 1, 3, 7, 15 s.
        let logged: Vec<(u64, u64)> = (0..200)
            .filter_map(|i| {
                let at = t0 + Duration::from_millis(100 * i);
                r.failed(at).map(|n| (i / 10, n))
            })
            .collect();
        assert_eq!(logged, vec![(0, 1), (1, 11), (3, 31), (7, 71), (15, 151)]);
        assert_eq!(r.recovered(), Some(200));
        assert_eq!(r.recovered(), None);
        // A new outage starts the schedule again.
        assert_eq!(r.failed(t0 + Duration::from_secs(30)), Some(1));
    }

    #[test]
    fn interval_is_capped() {
        let t0 = Instant::now();
        let mut r = RepeatLog::default();
        let mut last = None;
        let mut gaps = Vec::new();
        for s in 0..3000u64 {
            let now = t0 + Duration::from_secs(s);
            if r.failed(now).is_some() {
                if let Some(prev) = last {
                    gaps.push(s - prev);
                }
                last = Some(s);
            }
        }
        assert_eq!(gaps.iter().max(), Some(&MAX_INTERVAL.as_secs()));
        assert!(gaps.windows(2).all(|w| w[0] <= w[1]), "{gaps:?}");
    }
}
