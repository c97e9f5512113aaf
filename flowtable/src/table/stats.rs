//! Counters since start-up ([`FlowTableStats`]), what a sweep did ([`SweepStats`]) and the
//! index census for tests.

use super::FlowTable;
use crate::sync::{AtomicU64, Ordering};

/// Counters since start-up, plus the current size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowTableStats {
    /// Entries allocated.
    pub capacity: usize,
    /// Live flows now.
    pub len: usize,
    /// Entries in use now: one a flow, two an IPv6 flow (against `capacity`).
    pub entries: usize,
    /// Flows inserted.
    pub inserted: u64,
    /// Inserts refused because the table was full.
    pub full: u64,
    /// Inserts that found the flow already present.
    pub exists: u64,
    /// Inserts refused because the reply tuple was taken.
    pub reply_in_use: u64,
    /// Inserts refused for lack of an index slot.
    pub index_full: u64,
    /// Embryonic or expired flows recycled by inserts into a full table.
    pub recycled: u64,
    /// Flows expired by sweeps.
    pub expired: u64,
    /// Flows removed by `remove`.
    pub removed: u64,
    /// Embryonic flows ended to make room under pressure: by [`FlowTable::give_way`] (a
    /// SNAT port), or expired by a sweep with the shortened pressure timeout.
    pub gave_way: u64,
    /// Live TCP flows whose handshake has not completed ([`FlowState::is_embryonic`](crate::FlowState::is_embryonic)) now
    /// (approximate while flows change state).
    pub embryonic: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) inserted: AtomicU64,
    pub(super) full: AtomicU64,
    pub(super) exists: AtomicU64,
    pub(super) reply_in_use: AtomicU64,
    pub(super) index_full: AtomicU64,
    pub(super) recycled: AtomicU64,
    pub(super) expired: AtomicU64,
    pub(super) removed: AtomicU64,
    /// Lives in what was the padding of `Padded<Counters>` (layout version 1 files hold 0
    /// there), so the header's offsets are unchanged.
    pub(super) gave_way: AtomicU64,
    /// Live embryonic flows: a gauge of wrapping signed updates (a decrement may overtake its
    /// increment for a moment).
    pub(super) embryonic: AtomicU64,
    /// Extensions taken (an IPv6 flow's second entry): a gauge as `embryonic`, so that the
    /// entries in use are the flows plus these ([`FlowTable::entries_used`]).
    pub(super) extensions: AtomicU64,
}

/// What a sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Entries examined.
    pub visited: usize,
    /// Flows expired (each passed to the callback).
    pub expired: usize,
    /// Index tombstones cleared.
    pub tombs_cleared: usize,
}

impl FlowTable {
    /// Counters and current size.
    pub fn stats(&self) -> FlowTableStats {
        let c = &self.counters.0;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FlowTableStats {
            capacity: self.capacity(),
            len: self.len(),
            entries: self.entries_used(),
            inserted: r(&c.inserted),
            full: r(&c.full),
            exists: r(&c.exists),
            reply_in_use: r(&c.reply_in_use),
            index_full: r(&c.index_full),
            recycled: r(&c.recycled),
            expired: r(&c.expired),
            removed: r(&c.removed),
            gave_way: r(&c.gave_way),
            embryonic: self.embryonic(),
        }
    }
}

impl FlowTable {
    /// Index census `(live, tombstones, empty, max displacement)`, for tests (racy while in
    /// use).
    #[cfg(any(test, feature = "testing"))]
    pub fn index_census(&self) -> (usize, usize, usize, usize) {
        let (mut live, mut tomb, mut empty, mut displacement) = (0, 0, 0, 0);
        for (pos, s) in self.index.slots.iter().enumerate() {
            match s.load(Ordering::Relaxed) {
                crate::index::EMPTY | crate::index::FROZEN => empty += 1,
                crate::index::TOMB => tomb += 1,
                w => {
                    live += 1;
                    displacement = displacement.max(pos.saturating_sub(self.index.home(w)));
                }
            }
        }
        (live, tomb, empty, displacement)
    }
}
