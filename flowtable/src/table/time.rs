//! Time in the table's unit (100 ms ticks since the epoch), the per-state idle timeouts in
//! ticks (normal and under pressure), and expiry tests on a control word.

use super::FlowTable;
use super::entry::{ctl_ls, ctl_state};
use super::handle::Tick;
use crate::state::{FlowState, STATE_CODES, Timeouts};
use crate::sync::Ordering;
use std::time::{Duration, Instant};

/// Time unit of the stored last-seen time: 100 ms (u32 ticks last 13.6 years from `epoch`).
pub(super) const TICK_MS: u64 = 100;

/// How long the table stays under pressure after embryonic flows last had to give way:
/// 10 s, in ticks. (Public to the crate's tests only, with the `testing` feature.)
pub const PRESSURE_HOLD_TICKS: u64 = 100;

/// Idle timeouts per state code, in ticks.
pub(super) fn timeout_ticks(t: &Timeouts) -> [u32; STATE_CODES] {
    let mut ticks = [0; STATE_CODES];
    for (code, v) in ticks.iter_mut().enumerate() {
        *v = ticks_of(t.for_state(FlowState::from_u8(code as u8)));
    }
    ticks
}

/// [`timeout_ticks`] with every embryonic state capped at `tcp_syn_pressure`.
pub(super) fn pressure_ticks(t: &Timeouts) -> [u32; STATE_CODES] {
    let mut ticks = timeout_ticks(t);
    let cap = ticks_of(t.tcp_syn_pressure);
    for (code, v) in ticks.iter_mut().enumerate() {
        if FlowState::from_u8(code as u8).is_embryonic() {
            *v = (*v).min(cap);
        }
    }
    ticks
}

pub(super) fn ticks_of(d: Duration) -> u32 {
    let ms = d.as_millis();
    ms.div_ceil(u128::from(TICK_MS)).min(u128::from(u32::MAX)) as u32
}

impl FlowTable {
    #[inline]
    pub(super) fn ticks(&self, now: Instant) -> u32 {
        let d = now.saturating_duration_since(self.epoch);
        let t = d.as_secs() * (1000 / TICK_MS) + u64::from(d.subsec_millis()) / TICK_MS;
        t.min(u64::from(u32::MAX)) as u32
    }

    pub(super) fn instant(&self, ticks: u32) -> Instant {
        self.epoch + Duration::from_millis(u64::from(ticks) * TICK_MS)
    }

    /// `now` in the table's compact time unit, for [`touch`](Self::touch). A worker computes
    /// it once per batch.
    #[inline]
    pub fn tick(&self, now: Instant) -> Tick {
        Tick(self.ticks(now))
    }

    #[inline]
    pub(super) fn expired(&self, c: u64, now_t: u32) -> bool {
        Self::expired_by(&self.timeout_ticks, c, now_t)
    }

    #[inline]
    pub(super) fn expired_by(limits: &[u32; STATE_CODES], c: u64, now_t: u32) -> bool {
        let idle = now_t.saturating_sub(ctl_ls(c));
        idle >= limits[usize::from(ctl_state(c)).min(STATE_CODES - 1)]
    }

    /// Whether the table is under pressure at tick `now_t`: nearly full (7/8), or embryonic
    /// flows gave way within the last [`PRESSURE_HOLD_TICKS`].
    pub(super) fn pressure_at(&self, now_t: u32) -> bool {
        u64::from(now_t) < self.pressure_until.0.load(Ordering::Relaxed)
            || self.entries_used() * 8 >= self.entries.len() * 7
    }

    /// Whether the table is under pressure at `now`: embryonic TCP flows then expire after
    /// `tcp_syn_pressure` instead of their usual timeouts.
    pub fn under_pressure(&self, now: Tick) -> bool {
        self.pressure_at(now.0)
    }

    /// Records that embryonic flows had to give way at tick `now_t` (the pressure lasts
    /// [`PRESSURE_HOLD_TICKS`] from the last such event).
    pub(super) fn note_pressure(&self, now_t: u32) {
        let until = u64::from(now_t) + PRESSURE_HOLD_TICKS;
        if self.pressure_until.0.load(Ordering::Relaxed) < until {
            self.pressure_until.0.store(until, Ordering::Relaxed);
        }
    }
}
