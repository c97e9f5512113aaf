//! [`Pipeline::process_batch`]: a receive batch as a software pipeline, so that the flow
//! table's cache misses overlap instead of following one another. Each frame goes through
//! three stages, a block of [`STAGE_DISTANCE`] frames apart (while a block is processed, the
//! next has its entries requested and the one after is parsed):
//!
//! 1. the frame is parsed ([`fast::parse`]), its key hashed and its index slot requested;
//! 2. the entry its home slot points to is requested;
//! 3. the frame is processed: a known flow's frame is forwarded; a new flow (or a client's
//!    SYN on a flow that has ended, which is removed first: port reuse) is scheduled and
//!    half inserted ([`FlowTable::insert_v4_begin`]: indexed by its original tuple, its
//!    reply tuple's slot requested), and its frame waits;
//!
//! and a waiting new flow is finished (reply tuple indexed, frame rewritten) when a new flow
//! comes with [`WAITING_MAX`] waiting (before that one is scheduled), or at the end of the
//! batch, by when its reply slot has arrived. The waiting flows are kept apart from the
//! pipeline for the batch's duration (a ring of frame indices and half inserts in the
//! pipeline, each flow written once, in place, in a stack array of `process_batch`): a new
//! flow is never copied in or out.
//!
//! The result is what [`Pipeline::process`] gives frame by frame in order, with one
//! exception (below): a new flow's side effects (scheduler, rate limit, SNAT port cursor,
//! counts) happen at its turn in stage 3, and the waiting flows are finished before any frame
//! could tell the difference: a hit on a flow still being inserted, a SYN, FIN or RST that
//! finds a flow (the state guard's packets, `guard`; a pure SYN may end the flow for port
//! reuse, and the removal frees the flow's reply tuple, which a waiting flow may want), a
//! frame whose tuple is a waiting flow's reply tuple, and any
//! frame the general path takes (IPv6, VLAN, IP options, ICMP errors...) first finish them,
//! then look again. So a SYN never reuses, nor races, a half-inserted flow of its own batch:
//! by the time it decides, every flow before it is finished (or torn down) as `process`
//! would have it; a flow another worker is still inserting cannot be removed, and the SYN
//! is forwarded on it, as `process` does.
//!
//! The exception: when a waiting fullnat flow's reply tuple turns out to be taken (its SNAT
//! port, towards that backend) when it is finished, it tries the next SNAT ports then, after
//! the new flows behind it took theirs: it may get another free port than frame-by-frame
//! processing would give it (same verdict, same backend). Ports are taken only when the
//! cursor comes round the worker's port range again.
//!
//! [`FlowTable::insert_v4_begin`]: flowtable::FlowTable::insert_v4_begin

use std::time::Instant;

use flowtable::{PendingV4, V4Key};

use super::create::{Begun, NewV4};
use super::{Pipeline, Verdict, dsr, fast, guard, reject};

/// Frames between the stages of one frame in [`Pipeline::process_batch`]: the prefetch
/// distance.
pub const STAGE_DISTANCE: usize = 16;

/// Parsed frames kept between their first and last stage (three blocks).
const RING: usize = 64;
const _: () = assert!(RING.is_power_of_two() && RING >= 3 * STAGE_DISTANCE);

/// Most new flows waiting (half inserted) in [`Pipeline::process_batch`]: one more finishes
/// the oldest.
pub const WAITING_MAX: usize = 8;

/// Slots of the waiting flows' ring.
const WAITING_SLOTS: usize = 16;
const _: () = assert!(WAITING_SLOTS.is_power_of_two() && WAITING_SLOTS >= WAITING_MAX);
// (`Waiting::reply_counts` counts at most `WAITING_SLOTS` flows in a `u8`.)
const _: () = assert!(WAITING_SLOTS < u8::MAX as usize);

/// A batch of frames for [`Pipeline::process_batch`]: indexable mutable byte slices. Each
/// frame is asked for more than once (parse, then process) and must be the same bytes each
/// time.
pub trait FrameBatch {
    /// Frames in the batch.
    fn frames_len(&self) -> usize;
    /// Frame `i` (`i < frames_len()`).
    fn frame(&mut self, i: usize) -> &mut [u8];

    /// Frame `i`'s whole buffer: the frame at its start, and room after it for a frame the
    /// pipeline makes longer (the SYN proxy's SYN to a backend). Default: the frame itself,
    /// no room.
    fn buffer(&mut self, i: usize) -> &mut [u8] {
        self.frame(i)
    }

    /// Sets frame `i`'s length (at most `buffer(i).len()`), for a frame to transmit. Called
    /// only when the pipeline changed it; the default does nothing (the bytes past a
    /// shortened frame are zeroed, Ethernet padding to the receiver).
    fn set_len(&mut self, i: usize, len: usize) {
        let _ = (i, len);
    }
}

impl FrameBatch for [&mut [u8]] {
    #[inline]
    fn frames_len(&self) -> usize {
        self.len()
    }
    #[inline]
    fn frame(&mut self, i: usize) -> &mut [u8] {
        self[i]
    }
}

impl<const N: usize> FrameBatch for [&mut [u8]; N] {
    #[inline]
    fn frames_len(&self) -> usize {
        N
    }
    #[inline]
    fn frame(&mut self, i: usize) -> &mut [u8] {
        self[i]
    }
}

/// A frame after stage 1: its key, and the rest of its [`fast::V4`].
#[derive(Clone, Copy)]
struct Parsed {
    key: V4Key,
    flags: u8,
    ttl: u8,
}

impl Parsed {
    /// The frame's [`fast::V4`] (`frame` is the frame `parse` read this from).
    #[inline(always)]
    fn v4(&self, frame: &[u8]) -> fast::V4 {
        let protocol = self.key.proto();
        fast::V4 {
            addrs: self.key.addrs(),
            ports: self.key.ports(),
            proto: protocol as u8,
            protocol,
            flags: self.flags,
            ttl: self.ttl,
            csum_at: super::nat::l4_csum_at(fast::L4, protocol as u8) as u8,
            ip_len: fast::ip_len(frame),
        }
    }
}

/// The new flows waiting to be finished, oldest first: frame index and half insert (each
/// flow's [`NewV4`] is in the batch's [`Staged`] at the same ring position). Kept in the
/// [`Pipeline`] (empty between calls), so a batch does not initialise it.
pub(super) struct Waiting {
    flows: [Option<(usize, PendingV4)>; WAITING_SLOTS],
    /// Ring position of the oldest.
    head: usize,
    len: usize,
    /// Bit `hash >> 58` of each waiting reply tuple's hash, and no other: most misses need
    /// no search. (Cleared as flows finish: in a batch of new flows the ring never empties,
    /// and bits left set until it did filled the word.)
    reply_bits: u64,
    /// How many waiting reply tuples have each bit of `reply_bits`.
    reply_counts: [u8; 64],
}

impl Waiting {
    pub(super) fn new() -> Self {
        Waiting {
            flows: [const { None }; WAITING_SLOTS],
            head: 0,
            len: 0,
            reply_bits: 0,
            reply_counts: [0; 64],
        }
    }

    /// Whether a waiting flow's reply tuple hashes to `hash` (a hash match: maybe the same
    /// tuple).
    #[inline]
    fn reply_clash(&self, hash: u64) -> bool {
        self.reply_bits & 1 << (hash >> 58) != 0
            && (0..self.len).any(|k| {
                self.flows[(self.head + k) % WAITING_SLOTS]
                    .as_ref()
                    .is_some_and(|(_, p)| p.reply_hash() == hash)
            })
    }

    /// The ring position the next waiting flow takes (its [`Staged`] slot).
    #[inline(always)]
    fn tail(&self) -> usize {
        (self.head + self.len) % WAITING_SLOTS
    }

    /// A flow waits at [`tail`](Self::tail), its [`NewV4`] written there in [`Staged`].
    fn push(&mut self, w: (usize, PendingV4)) {
        let bit = (w.1.reply_hash() >> 58) as usize;
        self.reply_bits |= 1 << bit;
        self.reply_counts[bit] += 1;
        self.flows[self.tail()] = Some(w);
        self.len += 1;
    }

    /// The oldest waiting flow: its frame index, half insert and ring position.
    fn pop(&mut self) -> Option<(usize, PendingV4, usize)> {
        if self.len == 0 {
            return None;
        }
        let at = self.head;
        let w = self.flows[at].take();
        self.head = (self.head + 1) % WAITING_SLOTS;
        self.len -= 1;
        let (i, p) = w?;
        let bit = (p.reply_hash() >> 58) as usize;
        self.reply_counts[bit] -= 1;
        if self.reply_counts[bit] == 0 {
            self.reply_bits &= !(1 << bit);
        }
        Some((i, p, at))
    }
}

/// The waiting flows' [`NewV4`]s, by ring position: [`Pipeline::prepare_v4`] writes a new
/// flow's in place at [`Waiting::tail`] and finishing reads it there, so the flow is never
/// copied in or out. On the stack of one `process_batch` (it borrows apart from the
/// pipeline, which `prepare_v4` takes `&mut`).
type Staged = [Option<NewV4>; WAITING_SLOTS];

impl Pipeline {
    /// Processes a batch of frames in place: `verdicts[i]` is `frames[i]`'s verdict, as if
    /// `process` had been called on each frame in order, with one exception: a new fullnat
    /// flow whose SNAT port turns out to be taken (towards its backend) may get another free
    /// port than `process` would give it. `verdicts` must be at least as long as `frames`
    /// (extra entries are left alone); allocates nothing.
    ///
    /// The frames go through a software pipeline (parse and hash, request the index slot;
    /// request the entry; process) with [`STAGE_DISTANCE`] frames between stages, and new
    /// flows are inserted in two steps ([`WAITING_MAX`] of them half inserted at most), so
    /// that the flow table's cache misses overlap.
    pub fn process_batch<B: FrameBatch + ?Sized>(
        &mut self,
        frames: &mut B,
        now: Instant,
        verdicts: &mut [Verdict],
    ) {
        let n = frames.frames_len().min(verdicts.len());
        #[cfg(debug_assertions)]
        let counted = super::invariants::counted(&self.counters);
        // Blocks of D = STAGE_DISTANCE frames: in round k, block k is parsed, block k - 1 has
        // its entries requested and block k - 2 is processed, so each request has a block's
        // work (D to 2D frames) to arrive.
        let d = STAGE_DISTANCE;
        let block = |k: usize| (k * d).min(n)..((k + 1) * d).min(n);
        let mut parsed: [Option<Parsed>; RING] = [None; RING];
        // The flow table's time, once for the batch (its clock reading is one).
        let tick = self.tick(now);
        let mut staged: Staged = [const { None }; WAITING_SLOTS];
        let st = &mut staged;
        for k in 0..n.div_ceil(d) + 2 {
            for i in block(k) {
                parsed[i % RING] = self.parse_staged(frames.frame(i));
            }
            if k < 1 {
                continue;
            }
            for i in block(k - 1) {
                if let Some(p) = &parsed[i % RING] {
                    self.flows.prefetch_entry_v4(&p.key);
                }
            }
            if k < 2 {
                continue;
            }
            for i in block(k - 2) {
                let verdict = match &parsed[i % RING] {
                    Some(p) => match self.flows.lookup_v4(&p.key) {
                        Some(hit)
                            if (self.waiting.len == 0 || !hit.is_inserting())
                                && !guard::guarded(p.flags) =>
                        {
                            let frame = frames.frame(i);
                            let v = p.v4(frame);
                            self.forward_v4::<true>(frame, &v, &hit, tick)
                        }
                        hit => {
                            let found = (p, hit.is_some());
                            match self.miss_staged(frames, st, i, found, now, verdicts) {
                                Some(verdict) => verdict,
                                None => continue,
                            }
                        }
                    },
                    None => self.general_staged(frames, st, i, now, verdicts),
                };
                verdicts[i] = verdict;
            }
        }
        self.finish_waiting(frames, st, verdicts);
        #[cfg(debug_assertions)]
        self.debug_check_batch(frames, counted, n, verdicts);
    }

    /// Stage 1 for one frame: parsed, its key hashed and its index slot requested (`None`:
    /// the general path's).
    #[inline(always)]
    fn parse_staged(&self, frame: &[u8]) -> Option<Parsed> {
        fast::parse(frame).map(|v| {
            let key = self.flows.v4_key(v.protocol, v.addrs, v.ports);
            self.flows.prefetch_index_v4(&key);
            Parsed {
                key,
                flags: v.flags,
                ttl: v.ttl,
            }
        })
    }

    /// The invariants of a batch of `n` frames, `counted` before it.
    #[cfg(debug_assertions)]
    fn debug_check_batch<B: FrameBatch + ?Sized>(
        &self,
        frames: &mut B,
        counted: u64,
        n: usize,
        verdicts: &[Verdict],
    ) {
        debug_assert!(self.waiting.len == 0, "no new flow waits between batches");
        debug_assert_eq!(
            super::invariants::counted(&self.counters),
            counted + n as u64,
            "every frame of the batch is counted once"
        );
        for (i, &v) in verdicts[..n].iter().enumerate() {
            debug_assert!(
                super::invariants::verdict_ok(frames.frame(i), v),
                "a transmitted frame parses: frame {i}, {v:?}"
            );
        }
    }

    /// Stage 3 for frame `i` (parsed as `p`) when its lookup missed, or (`found`)
    /// found a flow still being inserted while flows wait, or found a flow and the frame is
    /// a SYN, FIN or RST (the state guard's; a SYN may reopen it, port reuse): the frame's
    /// counted verdict, or `None` when it waits as a new flow. (Out of line, with the finish
    /// of the oldest waiting flow and the flow table's insert, both its halves and their
    /// index inserts, inlined into it: inlined into the batch's loop, the new-flow code cost
    /// the loop's established packets about 9 instructions each, its registers; and the
    /// insert inlined saves a new flow more than the call costs. `benches/callgrind.sh
    /// --batch 64`: established 342.5 to 333.7, SYN 1,168.3 to 1,153.3.)
    #[inline(never)]
    fn miss_staged<B: FrameBatch + ?Sized>(
        &mut self,
        frames: &mut B,
        st: &mut Staged,
        i: usize,
        (p, found): (&Parsed, bool),
        now: Instant,
        verdicts: &mut [Verdict],
    ) -> Option<Verdict> {
        let key = &p.key;
        if found || self.waiting.reply_clash(key.hash()) {
            // The flow found may be a waiting one (whose insert may yet fail), or one this
            // SYN ends (its removal frees its reply tuple, which a waiting flow may want), or
            // this frame's tuple may be a waiting flow's reply tuple: finish them and look
            // again, as `process` would see them; then a SYN reopens the flow found as
            // `process` does.
            self.finish_waiting(frames, st, verdicts);
            if let Some(hit) = self.flows.lookup_v4(key) {
                let frame = frames.frame(i);
                // (Its own copy of the frame's fields: the one below stays in registers.)
                let v = p.v4(frame);
                if let Some(verdict) = self.known_v4(frame, &v, &hit, now) {
                    return Some(verdict);
                }
            }
        }
        let v = &p.v4(frames.frame(i));
        if self.proxied_miss(v, key) {
            // A flow the SYN proxy opened (the shortcut skips those): the general path.
            return Some(self.general_staged(frames, st, i, now, verdicts));
        }
        if self.waiting.len == WAITING_MAX {
            // (Before this flow's scheduling, as `process` would have finished it.)
            self.finish_oldest(frames, st, verdicts);
        }
        let nv = match self.prepare_v4(v, key, now, &mut st[self.waiting.tail()]) {
            Ok(nv) => nv,
            Err(super::SYNPROXY) => {
                // The SYN proxy's (it may insert a flow: the waiting ones first).
                self.finish_waiting(frames, st, verdicts);
                let verdict = self.synproxy_room(frames, i, now);
                return Some(self.count(verdict));
            }
            // A DSR service's: the general path's (the waiting ones first, there).
            Err(dsr::GENERAL) => return Some(self.general_staged(frames, st, i, now, verdicts)),
            Err(verdict) => {
                let verdict = match reject::pending_reason(verdict) {
                    Some(reason) => self.reject_room(frames, i, reason, now),
                    None => verdict,
                };
                return Some(self.count(verdict));
            }
        };
        match self.begin_v4(nv) {
            Begun::Pending(p) => {
                self.waiting.push((i, p));
                None
            }
            Begun::Done(out) => {
                let verdict = self.complete_v4(frames.frame(i), nv, out);
                Some(self.count(verdict))
            }
        }
    }

    /// Frame `i` through the general path (the waiting flows finished first), counted; an
    /// ACK that the SYN proxy turns into a SYN, a reject's ICMP error and a DSR packet's
    /// encapsulation get the buffer's room.
    #[inline(never)]
    fn general_staged<B: FrameBatch + ?Sized>(
        &mut self,
        frames: &mut B,
        st: &mut Staged,
        i: usize,
        now: Instant,
        verdicts: &mut [Verdict],
    ) -> Verdict {
        self.finish_waiting(frames, st, verdicts);
        let mut v = self.run_general(frames.frame(i), now);
        if v == super::SYNPROXY {
            v = self.synproxy_room(frames, i, now);
        }
        let len = frames.frame(i).len();
        if v == dsr::ENCAP {
            let (r, n) = self.encap_room(frames.buffer(i), len);
            if r.tx_port().is_some() && n != len {
                frames.set_len(i, n);
            }
            v = r;
        } else if v == reject::NO_ROOM {
            // A reject's ICMP error: again, with the buffer's room.
            let (r, n) = self.reject_again(frames.buffer(i), len, now);
            if r.tx_port().is_some() && n != len {
                frames.set_len(i, n);
            }
            v = r;
        } else if matches!(v, Verdict::Reject { .. }) && self.rejects.len != len {
            // Built in the frame (an RST): its length.
            frames.set_len(i, self.rejects.len);
        }
        self.count(v)
    }

    /// Finishes the waiting new flows, oldest first, and sets their frames' verdicts.
    #[inline]
    fn finish_waiting<B: FrameBatch + ?Sized>(
        &mut self,
        frames: &mut B,
        st: &mut Staged,
        verdicts: &mut [Verdict],
    ) {
        if self.waiting.len != 0 {
            self.finish_all(frames, st, verdicts);
        }
    }

    /// [`finish_waiting`](Self::finish_waiting)'s loop, out of line (one copy of the finish
    /// besides the one inlined into [`miss_staged`](Self::miss_staged), where a batch of new
    /// flows finishes most of them).
    #[inline(never)]
    fn finish_all<B: FrameBatch + ?Sized>(
        &mut self,
        frames: &mut B,
        st: &mut Staged,
        verdicts: &mut [Verdict],
    ) {
        while self.waiting.len != 0 {
            self.finish_oldest(frames, st, verdicts);
        }
    }

    /// Finishes the oldest waiting new flow and sets its frame's verdict.
    #[inline(always)]
    fn finish_oldest<B: FrameBatch + ?Sized>(
        &mut self,
        frames: &mut B,
        st: &mut Staged,
        verdicts: &mut [Verdict],
    ) {
        if let Some((i, p, at)) = self.waiting.pop() {
            // A waiting flow's slot holds its flow (written before it waited).
            let Some(nv) = st[at].as_mut() else {
                debug_assert!(false, "waiting flow {i} without its staged flow");
                return;
            };
            let out = self.finish_v4(nv, p);
            let verdict = self.complete_v4(frames.frame(i), nv, out);
            verdicts[i] = self.count(verdict);
        }
    }
}
