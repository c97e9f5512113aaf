//! The per-flow sequence word the pipeline's SYN proxy owns: tagged with the entry's
//! generation so that a word of an earlier flow of the entry is never read as this flow's.

use super::FlowTable;
use super::entry::{W_CTL, W_META, W_V4_SEQ, ctl_gen, ctl_readable};
use super::handle::FlowHandle;
use crate::sync::{AtomicU64, Ordering, fence};

/// Bits of a flow's sequence word that belong to its owner (the pipeline's SYN proxy); the
/// bits above tag the word with the low bits of the entry's generation, so that a word left
/// by an earlier flow of the entry (or stored for one that is gone) is never read as this
/// flow's.
pub const SEQ_BITS: u32 = 53;
pub(super) const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// A sequence word as stored for generation `gen_`.
#[inline]
pub(super) fn seq_stamp(gen_: u64, v: u64) -> u64 {
    gen_ << SEQ_BITS | (v & SEQ_MASK)
}

impl FlowTable {
    /// Where entry `e`'s sequence word is.
    #[inline]
    pub(super) fn seq_slot(&self, e: u32, v6: bool) -> Option<&AtomicU64> {
        if v6 {
            self.seq6.get(e as usize)
        } else {
            self.entries.get(e as usize).map(|x| &x.w[W_V4_SEQ])
        }
    }

    /// The generation bits a sequence word of flow `h` carries.
    #[inline]
    pub(super) fn seq_gen(h: FlowHandle) -> u64 {
        h.gen_() & ((1 << (64 - SEQ_BITS)) - 1)
    }

    /// Flow `h`'s sequence word (`SEQ_BITS` bits): a word per flow that its owner (the
    /// pipeline's SYN proxy: the handshake's state, then the sequence-number delta) sets
    /// after the insert with [`set_seq`](Self::set_seq) and changes with
    /// [`update_seq`](Self::update_seq). `None` when the handle is stale or no word was
    /// stored for this flow. Lock-free; one more load than the lookup for an IPv4 flow (the
    /// word is in its hot line), one more line for an IPv6 flow.
    #[inline]
    pub fn seq(&self, h: FlowHandle) -> Option<u64> {
        let e = h.entry();
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) || ctl_gen(c1) != h.gen_() {
            return None;
        }
        let v6 = (self.word(e, W_META) >> 40) & 1 == 1;
        let w = self.seq_slot(e, v6)?.load(Ordering::Acquire);
        fence(Ordering::Acquire);
        let c2 = entry.w[W_CTL].load(Ordering::Relaxed);
        if !ctl_readable(c2) || ctl_gen(c2) != h.gen_() || w >> SEQ_BITS != Self::seq_gen(h) {
            return None;
        }
        Some(w & SEQ_MASK)
    }

    /// Stores flow `h`'s sequence word (the low `SEQ_BITS` bits of `v`); `false` when the
    /// handle is stale. For the flow's inserter, before anyone else may read the word.
    pub fn set_seq(&self, h: FlowHandle, v: u64) -> bool {
        let e = h.entry();
        let Some(entry) = self.entries.get(e as usize) else {
            return false;
        };
        let c = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c) || ctl_gen(c) != h.gen_() {
            return false;
        }
        let v6 = (self.word(e, W_META) >> 40) & 1 == 1;
        let Some(slot) = self.seq_slot(e, v6) else {
            return false;
        };
        slot.store(seq_stamp(Self::seq_gen(h), v), Ordering::Release);
        true
    }

    /// Replaces flow `h`'s sequence word `old` by `new` (compare-and-swap: a word that is
    /// not `old`, of another flow of the entry included, stays); whether it did.
    pub fn update_seq(&self, h: FlowHandle, old: u64, new: u64) -> bool {
        let e = h.entry();
        let Some(v6) = self
            .entries
            .get(e as usize)
            .map(|_| (self.word(e, W_META) >> 40) & 1 == 1)
        else {
            return false;
        };
        let Some(slot) = self.seq_slot(e, v6) else {
            return false;
        };
        let g = Self::seq_gen(h);
        slot.compare_exchange(
            seq_stamp(g, old),
            seq_stamp(g, new),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    }
}
