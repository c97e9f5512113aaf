//! Inserts (see the crate docs' "Publishing"): validate, allocate, write the entry INSERTING,
//! index the original then the reply tuple, then LIVE; a conflict tears the entry down.

use super::FlowTable;
use super::entry::{
    ST_DYING, ST_INSERTING, ST_LIVE, W_CTL, ctl_gen, ctl_state, ctl_status, state_fits,
};
use super::error::InsertError;
use super::handle::{ExpiredFlow, FlowHandle, Tick};
use crate::index::{self, Claim};
use crate::key::{Direction, FlowData, FlowKey};
use crate::state::{FlowState, TcpFlags};
use crate::sync::Ordering;

impl FlowTable {
    /// Insert a new flow at `now` (a worker's tick for the batch), in the state its first
    /// packet (`tcp_flags`, original direction) gives, indexed by both tuples. When the table
    /// is full, an embryonic or expired flow near the new one's hash is recycled to make room
    /// (see the crate docs).
    pub fn insert(
        &self,
        data: &FlowData,
        tcp_flags: TcpFlags,
        now: Tick,
    ) -> Result<FlowHandle, InsertError> {
        self.insert_ticks(data, tcp_flags, now.0, |_| {})
    }

    /// [`insert`](Self::insert) at tick `t`, passing any flow recycled to make room to
    /// `on_evict`.
    pub(super) fn insert_ticks(
        &self,
        data: &FlowData,
        tcp_flags: TcpFlags,
        t: u32,
        on_evict: impl FnMut(ExpiredFlow),
    ) -> Result<FlowHandle, InsertError> {
        self.insert_state(data, FlowState::initial(data.proto, tcp_flags), t, on_evict)
    }

    /// Insert a flow that already has a life: in `state`, last seen at `last_seen` (a flow
    /// read back from an export, another table, or a peer), then store its sequence word `seq`
    /// ([`seq`](Self::seq); 0: none). Like [`insert`](Self::insert) in every other way,
    /// including [`InsertError::Exists`] for a tuple that is already here.
    pub fn restore(
        &self,
        data: &FlowData,
        state: FlowState,
        last_seen: Tick,
        seq: u64,
    ) -> Result<FlowHandle, InsertError> {
        if !state_fits(state, data.proto) {
            return Err(InsertError::Invalid("state of another protocol"));
        }
        let h = self.insert_state(data, state, last_seen.0, |_| {})?;
        if seq != 0 {
            self.set_seq(h, seq);
        }
        Ok(h)
    }

    pub(super) fn insert_state(
        &self,
        data: &FlowData,
        state: FlowState,
        t: u32,
        on_evict: impl FnMut(ExpiredFlow),
    ) -> Result<FlowHandle, InsertError> {
        if !data.same_family() {
            return Err(InsertError::Invalid("addresses of different families"));
        }
        if data.backend_id.0 as usize >= self.backends.len() {
            return Err(InsertError::Invalid("backend id >= backends_max"));
        }
        let okey = data.original_key();
        let rkey = data.reply_key();
        if okey == rkey {
            return Err(InsertError::Invalid("original and reply tuples are equal"));
        }
        let oh = self.hash(&okey);
        // Common race loser fast path, and no slot churn for retransmitted SYNs.
        if let Some((h, Direction::Original)) = self.lookup(&okey) {
            self.counters.0.exists.fetch_add(1, Ordering::Relaxed);
            return Err(InsertError::Exists(h));
        }
        let rh = self.hash(&rkey);
        let Some((e, ext)) = self.alloc_flow(okey.v6, oh, t, on_evict) else {
            self.counters.0.full.fetch_add(1, Ordering::Relaxed);
            return Err(InsertError::Full);
        };
        let gen_ = self.write_entry(e, ext, data, state, t);
        self.publish(
            e,
            gen_,
            data.backend_id.0,
            state,
            (oh, |w| self.same_key(w, &okey)),
            (rh, |w| self.same_key(w, &rkey)),
        )
    }

    /// The rest of an insert once entry `e` (generation `gen_`) is written and INSERTING:
    /// [`publish_original`](Self::publish_original) then
    /// [`publish_reply`](Self::publish_reply).
    #[inline(always)]
    pub(super) fn publish(
        &self,
        e: u32,
        gen_: u64,
        backend: u32,
        state: FlowState,
        original: (u64, impl Fn(u64) -> bool),
        reply: (u64, impl Fn(u64) -> bool),
    ) -> Result<FlowHandle, InsertError> {
        let oh = original.0;
        self.publish_original(e, backend, state.to_u8(), original)?;
        self.publish_reply(e, gen_, backend, oh, reply)
    }

    /// First half of publishing entry `e` (in state `code`, [`FlowState::to_u8`]): count it
    /// and index its original tuple (its hash
    /// and a same-key test for [`Index::insert`](crate::index::Index::insert)). On a conflict the entry is torn down. The
    /// entry stays INSERTING: readable by lookups of the original tuple, removable by no one,
    /// until [`publish_reply`](Self::publish_reply).
    #[inline(always)]
    pub(super) fn publish_original(
        &self,
        e: u32,
        backend: u32,
        code: u8,
        (oh, same_original): (u64, impl Fn(u64) -> bool),
    ) -> Result<(), InsertError> {
        self.count_code(backend, code, 1);
        match self
            .index
            .insert(oh, index::make_word(oh, false, e), same_original)
        {
            Claim::Done => Ok(()),
            claim => Err(self.tear_down(e, backend, claim, false)),
        }
    }

    /// Second half: index the reply tuple and make the entry LIVE; on a conflict withdraw the
    /// original tuple's word (hash `oh`) and tear the entry down.
    #[inline(always)]
    pub(super) fn publish_reply(
        &self,
        e: u32,
        gen_: u64,
        backend: u32,
        oh: u64,
        (rh, same_reply): (u64, impl Fn(u64) -> bool),
    ) -> Result<FlowHandle, InsertError> {
        match self
            .index
            .insert(rh, index::make_word(rh, true, e), same_reply)
        {
            Claim::Done => {
                // Counted before the entry is LIVE (removable): its departure is counted after.
                self.counters.0.inserted.fetch_add(1, Ordering::Relaxed);
                // INSERTING -> LIVE. Only `on_packet`/`touch` write an INSERTING control word
                // besides us, and never its status bits: one atomic XOR flips 01 to 10.
                let flip = (ST_INSERTING ^ ST_LIVE) << 40;
                let prev = self.entries[e as usize].w[W_CTL].fetch_xor(flip, Ordering::Release);
                debug_assert_eq!(ctl_status(prev), ST_INSERTING, "publishing entry {e}");
                debug_assert_eq!(ctl_gen(prev), gen_, "publishing entry {e}");
                Ok(FlowHandle::new(e, gen_))
            }
            claim => {
                self.index.remove(oh, index::make_word(oh, false, e));
                Err(self.tear_down(e, backend, claim, true))
            }
        }
    }

    /// Free our never-fully-published entry `e` (nobody else may remove it) after `claim`
    /// failed for its original or (`reply`) reply tuple; the error to report.
    #[cold]
    pub(super) fn tear_down(&self, e: u32, backend: u32, claim: Claim, reply: bool) -> InsertError {
        let entry = &self.entries[e as usize];
        let c = entry.w[W_CTL].fetch_or(ST_DYING << 40, Ordering::AcqRel);
        // Nobody else removes an entry before it is LIVE: ours is still INSERTING.
        debug_assert_eq!(ctl_status(c), ST_INSERTING, "tearing down entry {e}");
        self.count(backend, FlowState::from_u8(ctl_state(c)), -1);
        self.release(e, ctl_gen(c));
        match claim {
            Claim::Conflict(oe, od) => {
                let g = ctl_gen(self.entries[oe as usize].w[W_CTL].load(Ordering::Relaxed));
                let h = FlowHandle::new(oe, g);
                debug_assert_eq!(od, reply);
                if reply {
                    self.counters.0.reply_in_use.fetch_add(1, Ordering::Relaxed);
                    InsertError::ReplyInUse(h)
                } else {
                    self.counters.0.exists.fetch_add(1, Ordering::Relaxed);
                    InsertError::Exists(h)
                }
            }
            _ => {
                self.counters.0.index_full.fetch_add(1, Ordering::Relaxed);
                InsertError::IndexFull
            }
        }
    }

    pub(super) fn same_key(&self, w: u64, key: &FlowKey) -> bool {
        let (e, reply) = index::word_entry(w);
        self.matches(e, reply, key).is_some()
    }
}
