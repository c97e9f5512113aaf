//! The graceful drain after the first stop signal: `/healthz` answers 503 (upstream load
//! balancers move away) while traffic keeps flowing; the drain ends when no established flow
//! is left and nothing was forwarded for [`QUIET`], or at `[dataplane] drain_timeout`.

use std::time::{Duration, Instant};

/// How long nothing may be forwarded before an idle node counts as drained.
pub const QUIET: Duration = Duration::from_secs(1);

/// A drain in progress.
#[derive(Clone, Debug)]
pub struct Drain {
    started: Instant,
    timeout: Duration,
    /// Frames transmitted by all workers when last seen changing, and when.
    tx: Option<u64>,
    tx_changed: Instant,
}

impl Drain {
    /// A drain started at `now` that gives up after `timeout`.
    pub fn new(now: Instant, timeout: Duration) -> Drain {
        Drain {
            started: now,
            timeout,
            tx: None,
            tx_changed: now,
        }
    }

    /// Why the drain is over at `now`, if it is, given the workers' transmitted-frame total
    /// and the established flows left.
    pub fn done(&mut self, now: Instant, tx_frames: u64, established: u64) -> Option<String> {
        match self.tx {
            Some(tx) if tx == tx_frames => {}
            Some(_) => {
                self.tx = Some(tx_frames);
                self.tx_changed = now;
            }
            // The first sample: traffic is measured from the start of the drain.
            None => self.tx = Some(tx_frames),
        }
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed >= self.timeout {
            return Some(format!(
                "timeout ({:?}) with {established} established flows left",
                self.timeout
            ));
        }
        if established == 0 && now.saturating_duration_since(self.tx_changed) >= QUIET {
            return Some(format!("idle after {:.1}s", elapsed.as_secs_f64()));
        }
        None
    }
}
