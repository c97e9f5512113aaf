//! Entry allocation: the free list (a Treiber stack with an ABA tag, linked through the free
//! entries' id words) and, when it is empty, recycling an embryonic or expired flow near the new
//! flow's hash.

use super::FlowTable;
use super::entry::debug_transition;
use super::entry::{ST_FREE, ST_LIVE, W_CTL, W_IDS, ctl, ctl_gen, ctl_state, ctl_status};
use super::handle::ExpiredFlow;
use crate::state::FlowState;
use crate::sync::Ordering;

/// Entries probed for an embryonic or expired victim when the free list is empty.
pub(super) const VICTIM_PROBE: usize = 32;

impl FlowTable {
    /// Pop a free entry, or recycle an embryonic/expired one near `hash`.
    pub(super) fn alloc(
        &self,
        hash: u64,
        now_t: u32,
        mut on_evict: impl FnMut(ExpiredFlow),
    ) -> Option<u32> {
        if let Some(e) = self.pop_free() {
            return Some(e);
        }
        let cap = self.entries.len();
        // Low hash bits: independent of the index home (top bits), so recycled flows do not
        // all land in one index region.
        let start = (((hash & 0xffff_ffff) * cap as u64) >> 32) as usize;
        for i in 0..VICTIM_PROBE.min(cap) {
            let e = ((start + i) % cap) as u32;
            let c = self.entries[e as usize].w[W_CTL].load(Ordering::Acquire);
            if ctl_status(c) != ST_LIVE {
                continue;
            }
            let state = FlowState::from_u8(ctl_state(c));
            if !state.is_embryonic() && !self.expired(c, now_t) {
                continue;
            }
            let victim = |c: u64| {
                let s = FlowState::from_u8(ctl_state(c));
                s.is_embryonic() || self.expired(c, now_t)
            };
            if let Some(f) = self.take(e, ctl_gen(c), victim, false) {
                self.counters.0.recycled.fetch_add(1, Ordering::Relaxed);
                self.note_pressure(now_t);
                on_evict(f);
                return Some(e);
            }
        }
        // A sweep may have freed something meanwhile.
        self.pop_free()
    }

    pub(super) fn pop_free(&self) -> Option<u32> {
        let mut head = self.free.0.load(Ordering::Acquire);
        loop {
            let idx = head as u32;
            if idx == 0 {
                return None;
            }
            let e = idx - 1;
            let next = self.entries[e as usize].w[W_IDS].load(Ordering::Relaxed) as u32;
            let new = ((head >> 32) + 1) << 32 | u64::from(next);
            match self
                .free
                .0
                .compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // A free-list entry is FREE; its link is an entry + 1, or 0 at the end.
                    debug_assert_eq!(
                        ctl_status(self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed)),
                        ST_FREE,
                        "popped entry {e}"
                    );
                    debug_assert!(next as usize <= self.entries.len(), "free link {next}");
                    // The next insert takes the new head: start fetching its line now (a
                    // hint; on a shuffled free list it would be a cache miss later).
                    if let Some(n) = (next as usize)
                        .checked_sub(1)
                        .and_then(|n| self.entries.get(n))
                    {
                        crate::sync::prefetch(n);
                    }
                    return Some(e);
                }
                Err(h) => head = h,
            }
        }
    }

    pub(super) fn push_free(&self, e: u32) {
        let link = &self.entries[e as usize].w[W_IDS];
        debug_assert_eq!(
            ctl_status(self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed)),
            ST_FREE,
            "pushing entry {e}"
        );
        let mut head = self.free.0.load(Ordering::Relaxed);
        loop {
            link.store(head & 0xffff_ffff, Ordering::Relaxed);
            let new = ((head >> 32) + 1) << 32 | (u64::from(e) + 1);
            match self
                .free
                .0
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Mark an owned entry FREE and push it on the free list.
    pub(super) fn release(&self, e: u32, gen_: u64) {
        let new = ctl(gen_, ST_FREE, 0, 0);
        // Ours (DYING, by the one winner of the removal or a torn-down insert): stable.
        debug_transition!(
            self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed),
            new
        );
        self.entries[e as usize].w[W_CTL].store(new, Ordering::Release);
        self.push_free(e);
    }
}
