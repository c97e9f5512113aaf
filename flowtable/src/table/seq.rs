//! The per-flow sequence word the pipeline's SYN proxy owns: tagged with the entry's
//! generation so that a word of an earlier flow of the entry is never read as this flow's.

use super::FlowTable;
use super::entry::{W_CTL, W_SEQ, ctl_gen, ctl_readable};
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
    /// Entry `e`'s sequence word (in its hot line, of either family).
    #[inline]
    pub(super) fn seq_slot(&self, e: u32) -> Option<&AtomicU64> {
        self.entries.get(e as usize).map(|x| &x.w[W_SEQ])
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
    /// word is in its hot line), for an IPv6 flow too.
    #[inline]
    pub fn seq(&self, h: FlowHandle) -> Option<u64> {
        let e = h.entry();
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) || ctl_gen(c1) != h.gen_() {
            return None;
        }
        let w = entry.w[W_SEQ].load(Ordering::Acquire);
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
        entry.w[W_SEQ].store(seq_stamp(Self::seq_gen(h), v), Ordering::Release);
        true
    }

    /// Replaces flow `h`'s sequence word `old` by `new` (compare-and-swap: a word that is
    /// not `old`, of another flow of the entry included, stays); whether it did.
    pub fn update_seq(&self, h: FlowHandle, old: u64, new: u64) -> bool {
        let e = h.entry();
        let Some(slot) = self.seq_slot(e) else {
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

/// Sequence samples (see [`FlowTable::rst_window`]): each direction's sequence number in
/// units of 2^`SAMPLE_SHIFT` bytes, `SAMPLE_BITS` bits each, and a bit per direction saying
/// it was taken. A flow's sequence word holds them unless the flow is [`FLAG_SLOW`] (then
/// the word is the SYN proxy's).
///
/// [`FLAG_SLOW`]: super::FLAG_SLOW
const SAMPLE_SHIFT: u32 = 7;
const SAMPLE_BITS: u32 = 32 - SAMPLE_SHIFT;
const SAMPLE_MASK: u64 = (1 << SAMPLE_BITS) - 1;
/// Bit of the sample word: the original direction's sample was taken.
const ORIG_TAKEN: u64 = 1 << (2 * SAMPLE_BITS);
/// Bit of the sample word: the reply direction's sample was taken.
const REPLY_TAKEN: u64 = 1 << (2 * SAMPLE_BITS + 1);
const _: () = assert!(2 * SAMPLE_BITS + 2 <= SEQ_BITS);

/// How far before a direction's last sample an RST's sequence number may be: 1 MiB (a
/// sample may come from a segment sent ahead of what the receiver has taken, and an RST
/// answering a segment carries the receiver's position).
pub const RST_BEHIND_BYTES: u32 = 1 << 20;
/// How far past a direction's last sample an RST's sequence number may be: 16 MiB (what a
/// sender may have sent since the sample, at most one 100 ms tick of traffic earlier, plus
/// its window).
pub const RST_AHEAD_BYTES: u32 = 1 << 24;

/// What [`FlowTable::rst_window`] found for an RST.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RstWindow {
    /// Its sequence number (or, before the direction's first sample, its acknowledgment)
    /// is where the last sample says that direction is.
    Inside,
    /// It is not: a receiver would not take it.
    Outside,
    /// The flow has no sample to judge by (the SYN proxy's flows, flows restored without
    /// one, a direction not sampled yet whose RST carries no ACK to check instead).
    Unknown,
}

/// Whether `at` (in sample units) lies within the RST window of `sample`.
#[inline]
fn sample_near(sample: u64, at: u32) -> bool {
    let d = (u64::from(at >> SAMPLE_SHIFT).wrapping_sub(sample)) & SAMPLE_MASK;
    // `d` as a signed SAMPLE_BITS-bit distance: ahead when small, behind when near 2^BITS.
    d <= u64::from(RST_AHEAD_BYTES >> SAMPLE_SHIFT)
        || d >= (1 << SAMPLE_BITS) - u64::from(RST_BEHIND_BYTES >> SAMPLE_SHIFT)
}

impl FlowTable {
    /// Records `seq`, a TCP segment's sequence number in direction `reply`, as the sample of
    /// that direction of the flow in entry `e` (generation `gen_`). For the writer of a
    /// state change or a new tick (so at most once per tick per flow on the packet path);
    /// nothing for a flow that is not TCP or is [`FLAG_SLOW`](super::FLAG_SLOW). A race
    /// with the other direction's sample retries; a sample of an entry's later flow is
    /// never taken for this one (the generation tag).
    #[inline(never)]
    pub(super) fn take_sample(&self, e: u32, gen_: u64, reply: bool, seq: u32) {
        let meta = self.word(e, super::entry::W_META);
        let flags = (meta >> 48) as u8;
        if (meta >> 32) as u8 != vocab::ip_proto::TCP || flags & super::FLAG_SLOW != 0 {
            return;
        }
        let Some(slot) = self.seq_slot(e) else {
            return;
        };
        let tag = gen_ & ((1 << (64 - SEQ_BITS)) - 1);
        let s = u64::from(seq >> SAMPLE_SHIFT);
        let mut w = slot.load(Ordering::Relaxed);
        loop {
            let old = if w >> SEQ_BITS == tag {
                w & SEQ_MASK
            } else {
                0
            };
            let new = if reply {
                old & !(SAMPLE_MASK << SAMPLE_BITS) | s << SAMPLE_BITS | REPLY_TAKEN
            } else {
                old & !SAMPLE_MASK | s | ORIG_TAKEN
            };
            let stamped = seq_stamp(tag, new);
            if stamped == w {
                return;
            }
            match slot.compare_exchange_weak(w, stamped, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(a) => w = a,
            }
        }
    }

    /// Whether an RST of flow `h` travelling in `dir` with sequence number `seq` (and
    /// acknowledgment `ack` when its ACK flag is set) is one its receiver would take, judged
    /// from the last sequence sample of that direction ([`RST_BEHIND_BYTES`] before it to
    /// [`RST_AHEAD_BYTES`] past it), the way RFC 5961 and Linux conntrack keep blind resets
    /// from ending connections. Before the reply direction's first sample (a backend
    /// refusing the connection), its ACK must acknowledge about where the client's sample
    /// is, as RFC 793 asks of a reset in SYN-SENT. Reads only.
    pub fn rst_window(
        &self,
        h: FlowHandle,
        dir: crate::key::Direction,
        seq: u32,
        ack: Option<u32>,
    ) -> RstWindow {
        let e = h.entry();
        if self.entries.get(e as usize).is_none()
            || (self.word(e, super::entry::W_META) >> 48) as u8 & super::FLAG_SLOW != 0
        {
            return RstWindow::Unknown;
        }
        let Some(w) = self.seq(h) else {
            return RstWindow::Unknown;
        };
        let (orig, reply) = (w & SAMPLE_MASK, (w >> SAMPLE_BITS) & SAMPLE_MASK);
        let near = |ok: bool| {
            if ok {
                RstWindow::Inside
            } else {
                RstWindow::Outside
            }
        };
        match dir {
            crate::key::Direction::Original if w & ORIG_TAKEN != 0 => near(sample_near(orig, seq)),
            crate::key::Direction::Reply if w & REPLY_TAKEN != 0 => near(sample_near(reply, seq)),
            crate::key::Direction::Reply if w & ORIG_TAKEN != 0 => match ack {
                Some(a) => near(sample_near(orig, a)),
                None => RstWindow::Outside,
            },
            _ => RstWindow::Unknown,
        }
    }
}
