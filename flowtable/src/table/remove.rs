//! Flows leaving the table (see the crate docs' "Removal"): the one winner of LIVE → DYING
//! unindexes both tuples, fixes the counts and frees the entry. Removal by handle, giving way
//! under pressure, the incremental sweep, and the bounded scan.

use super::FlowTable;
use super::entry::debug_transition;
use super::entry::{
    GEN_MASK, ST_DYING, ST_LIVE, W_CTL, ctl_gen, ctl_ls, ctl_readable, ctl_state, ctl_status,
};
use super::handle::{ExpiredFlow, FlowHandle, FlowView, Tick};
use super::stats::SweepStats;
use crate::index::{self};
use crate::state::FlowState;
use crate::sync::Ordering;

impl FlowTable {
    /// How long live flow `h` has been idle at `now`, in ticks, if it is an embryonic TCP flow
    /// (its handshake has not completed); `None` otherwise (or if `h` is stale).
    pub fn embryonic_idle(&self, h: FlowHandle, now: Tick) -> Option<u32> {
        let entry = self.entries.get(h.entry() as usize)?;
        let c = entry.w[W_CTL].load(Ordering::Acquire);
        (ctl_status(c) == ST_LIVE
            && ctl_gen(c) == h.gen_() & GEN_MASK
            && FlowState::from_u8(ctl_state(c)).is_embryonic())
        .then(|| now.0.saturating_sub(ctl_ls(c)))
    }

    /// Ends flow `h` if it is still an embryonic TCP flow, so that a new flow may take what
    /// it holds (a SNAT port towards its backend) when there is none left: half-open flows
    /// give way first under pressure. Counted in `gave_way`, and the table is under pressure
    /// from `now` on for 10 s (see [`under_pressure`](Self::under_pressure)).
    pub fn give_way(&self, h: FlowHandle, now: Tick) -> Option<ExpiredFlow> {
        if h.entry() as usize >= self.entries.len() {
            return None;
        }
        let embryonic = |c: u64| FlowState::from_u8(ctl_state(c)).is_embryonic();
        let f = self.take(h.entry(), h.gen_() & GEN_MASK, embryonic, true)?;
        self.counters.0.gave_way.fetch_add(1, Ordering::Relaxed);
        self.note_pressure(now.0);
        Some(f)
    }

    /// Take LIVE entry `e` of generation `gen_` out of the table if `cond(ctl)` holds: CAS it to
    /// DYING (the one winner among removers), unindex both tuples, fix the counts, mark it FREE,
    /// and (if `to_free_list`) return it to the free list.
    pub(super) fn take(
        &self,
        e: u32,
        gen_: u64,
        cond: impl Fn(u64) -> bool,
        to_free_list: bool,
    ) -> Option<ExpiredFlow> {
        let entry = &self.entries[e as usize];
        let mut c = entry.w[W_CTL].load(Ordering::Acquire);
        loop {
            if ctl_status(c) != ST_LIVE || ctl_gen(c) != gen_ || !cond(c) {
                return None;
            }
            let dying = c & !(3 << 40) | ST_DYING << 40;
            debug_transition!(c, dying);
            match entry.w[W_CTL].compare_exchange_weak(
                c,
                dying,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(a) => c = a,
            }
        }
        // We own the entry now; its data words are stable.
        let data = self.read_data(e).expect("live entry has a valid protocol");
        let state = FlowState::from_u8(ctl_state(c));
        let ok = data.original_key();
        let rk = data.reply_key();
        let oh = self.hash(&ok);
        let rh = self.hash(&rk);
        self.index.remove(oh, index::make_word(oh, false, e));
        self.index.remove(rh, index::make_word(rh, true, e));
        self.count(data.backend_id.0, state, -1);
        let flow = ExpiredFlow {
            handle: FlowHandle::new(e, gen_),
            data,
            state,
            last_seen: self.instant(ctl_ls(c)),
        };
        self.departed.0.fetch_add(1, Ordering::Relaxed);
        if to_free_list {
            self.release(e, gen_);
        } else if let Some(x) = self.mark_free(e, gen_) {
            // The entry goes to the caller; an IPv6 flow's extension back to the free list.
            self.free_extension(x);
        }
        Some(flow)
    }

    /// Remove flow `h` now (e.g. its backend was removed); returns it, or `None` if the handle
    /// is stale or the flow is still being inserted.
    pub fn remove(&self, h: FlowHandle) -> Option<ExpiredFlow> {
        if h.entry() as usize >= self.entries.len() {
            return None;
        }
        let f = self.take(h.entry(), h.gen_(), |_| true, true)?;
        self.counters.0.removed.fetch_add(1, Ordering::Relaxed);
        Some(f)
    }

    /// Examine the next `budget` entries (a chunk claimed from a shared cursor, so any number of
    /// workers may sweep at once without overlapping) and expire the flows idle at `now`,
    /// passing each to `out`. Also clears index tombstones in the matching share of the index.
    /// Call it every batch with a small budget; a full round takes `capacity / budget` calls.
    pub fn sweep(&self, now: Tick, budget: usize, out: impl FnMut(ExpiredFlow)) -> SweepStats {
        let cap = self.entries.len();
        let budget = budget.min(cap);
        let start = self.sweep_cursor.0.fetch_add(budget, Ordering::Relaxed) % cap;
        self.sweep_range(now, start, budget, out)
    }

    /// Sweep entries `start..start+len` (wrapping).
    fn sweep_range(
        &self,
        now: Tick,
        start: usize,
        len: usize,
        mut out: impl FnMut(ExpiredFlow),
    ) -> SweepStats {
        let cap = self.entries.len();
        let len = len.min(cap);
        let t = now.0;
        let mut st = SweepStats {
            visited: len,
            ..SweepStats::default()
        };
        let pressure = self.pressure_at(t);
        let limits = if pressure {
            &self.pressure_ticks
        } else {
            &self.timeout_ticks
        };
        let mut early = 0;
        for i in 0..len {
            let e = ((start + i) % cap) as u32;
            let c = self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed);
            if ctl_status(c) == ST_LIVE
                && Self::expired_by(limits, c, t)
                && let Some(f) = self.take(e, ctl_gen(c), |c| Self::expired_by(limits, c, t), true)
            {
                st.expired += 1;
                early += u64::from(pressure && !self.expired(c, t));
                out(f);
            }
        }
        self.counters
            .0
            .expired
            .fetch_add(st.expired as u64, Ordering::Relaxed);
        if early > 0 {
            self.counters.0.gave_way.fetch_add(early, Ordering::Relaxed);
        }
        // The index share that corresponds to this entry range.
        let n = self.index.len();
        let istart = ((start % cap) as u128 * n as u128 / cap as u128) as usize;
        let ilen = (len as u128 * n as u128).div_ceil(cap as u128) as usize;
        st.tombs_cleared = self.index.cleanup(istart, ilen);
        st
    }

    /// Visit every readable flow in entries `start..start+len` (wrapping), e.g. to find the
    /// flows of a removed backend or to list flows. Bounded like a sweep; `f` sees copies.
    pub fn scan(&self, start: usize, len: usize, mut f: impl FnMut(FlowView)) {
        let cap = self.entries.len();
        for i in 0..len.min(cap) {
            let e = ((start + i) % cap) as u32;
            let c = self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed);
            if ctl_readable(c)
                && let Some(v) = self.get(FlowHandle::new(e, ctl_gen(c)))
            {
                f(v);
            }
        }
    }
}
