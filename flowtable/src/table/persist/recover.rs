//! The recovery pass of an adoption, and the reading of a state file's entries (adoption and
//! [`FlowTable::import_state`]): single-threaded, before any worker uses the table.
//!
//! 1. **Entries.** A LIVE entry is kept only when [`FlowTable::entry_flow`] finds it valid
//!    (its protocol, state and meta bits, [`flow_refusal`], its stored checksum adjustment
//!    against its addresses, a last-seen time not in the future) and the caller's
//!    [`FlowCheck`] takes it; then one address per backend id across the kept flows
//!    ([`BackendAddrs`]). Everything else is freed: INSERTING or DYING entries a dead worker
//!    left are torn down, invalid LIVE ones counted as refused.
//! 2. **Index.** Words of freed entries become tombstones, frozen slots empty. Then the
//!    index must agree with the entries under the header's seed: every kept flow's two
//!    words where a lookup of its tuples reaches them (collected during the entries pass,
//!    probed in the order of their home slots: [`Probes`]), and no other live word. If it does not (a
//!    changed seed, a zeroed or scribbled index, two flows with one tuple) it is rebuilt
//!    from the kept entries and the fault is reported ([`Recovery::index`]); a flow that
//!    cannot be indexed (a duplicate tuple) is refused.
//! 3. **Derived state.** The free list, the per-backend counts, the size and the counters
//!    are rebuilt from the kept entries; none of the file's values for them is read.

use std::time::Instant;

use shm::Refusal;

use super::super::FlowTable;
use super::super::entry::{
    GEN_MASK, ST_FREE, ST_LIVE, W_ADDR, W_CTL, W_EXT, W_IDS, W_META, W_PORTS, W_V4_CSUM, ctl,
    ctl_gen, ctl_ls, ctl_state, ctl_status,
};
use super::super::v4::v4_csum_deltas;
use super::Recovery;
use super::valid::{BackendAddrs, FlowCheck, flow_refusal, state_of};
use crate::index::{self, Claim, EMPTY, FROZEN, TOMB, word_entry};
use crate::key::{FlowData, FlowKey};
use crate::state::FlowState;
use crate::sync::Ordering;

/// How far in the future a stored last-seen time may be (ticks: 60 s): the clocks of two
/// processes of one boot agree, so more is a damaged entry (a flow that would never expire).
pub(super) const FUTURE_TICKS: u32 = 600;

impl FlowTable {
    /// Entry `e`'s flow and state, if it is a flow any table may take and `check` takes it
    /// (see the module doc); `c` is its control word, `now` the time in this table's ticks,
    /// `backends_max` the taker's.
    pub(super) fn entry_flow(
        &self,
        e: u32,
        c: u64,
        now: u32,
        backends_max: usize,
        check: &dyn FlowCheck,
    ) -> Result<(FlowData, FlowState), Refusal> {
        let meta = self.word(e, W_META);
        // gen:32 | proto:8 | v6:1 | (7 unused) | flags:8 | (8 unused)
        if meta & 0xff00_fe00_0000_0000 != 0 {
            return Err(Refusal::new(
                "meta",
                format!("{meta:#018x} (unused bits set)"),
            ));
        }
        if (meta >> 40) & 1 == 1
            && let Some(r) = self.ext_refusal(e)
        {
            return Err(r);
        }
        let d = self.read_data(e).ok_or_else(|| {
            Refusal::new(
                "protocol",
                format!("{} (no such protocol)", (meta >> 32) as u8),
            )
        })?;
        let state = state_of(ctl_state(c), d.proto)?;
        if let Some(r) = flow_refusal(&d, backends_max) {
            return Err(r);
        }
        if !d.client.is_ipv6() {
            let stored = self.word(e, W_V4_CSUM);
            let want = v4_csum_word(
                self.word(e, W_ADDR),
                self.word(e, W_ADDR + 1),
                self.word(e, W_PORTS),
            );
            if stored != want {
                return Err(Refusal::new(
                    "checksum",
                    format!("{stored:#018x} (its addresses and ports make {want:#018x})"),
                ));
            }
        }
        if ctl_ls(c) > now.saturating_add(FUTURE_TICKS) {
            return Err(Refusal::new(
                "last_seen",
                format!("tick {} (now {now}: in the future)", ctl_ls(c)),
            ));
        }
        check.check(&d, state)?;
        Ok((d, state))
    }

    /// What is wrong with IPv6 entry `e`'s extension number, if anything: it must name
    /// another entry, one that is FREE (an extension's control word never leaves FREE). That
    /// no two flows name one extension is the caller's to check ([`Extensions`]).
    fn ext_refusal(&self, e: u32) -> Option<Refusal> {
        let x = self.word(e, W_EXT);
        let why = match self.ext_of(e) {
            None => "no such entry",
            Some(x) if x == e => "the flow's own entry",
            Some(x)
                if ctl_status(self.entries[x as usize].w[W_CTL].load(Ordering::Relaxed))
                    != ST_FREE =>
            {
                "an entry in use"
            }
            Some(_) => return None,
        };
        Some(Refusal::new("extension", format!("{x} ({why})")))
    }

    /// The recovery pass of an adoption (see the module doc), at `now`.
    pub(crate) fn recover(
        &self,
        clean: bool,
        previous_pid: u32,
        now: Instant,
        check: &dyn FlowCheck,
    ) -> Recovery {
        let t0 = Instant::now();
        let now_ticks = self.ticks(now);
        let mut keep = vec![false; self.entries.len()];
        let mut out = Recovery {
            clean,
            previous_pid,
            ..Recovery::default()
        };
        let mut taken = Taken::for_table(self);
        self.recover_entries(now_ticks, check, &mut keep, &mut out, &mut taken);
        let Taken {
            addrs,
            probes,
            flows,
        } = taken;
        let mut found = probes.finish(self);
        if addrs.any() {
            for e in 0..keep.len() as u32 {
                let id = (self.word(e, W_IDS) >> 32) as u32;
                if let Some(r) = addrs.conflict(id).filter(|_| keep[e as usize]) {
                    self.free_refused(e, &mut keep, &mut out, r);
                }
            }
            // The flows just dropped were probed too: probe the rest again (a rare path).
            let mut again = Probes::new();
            for e in (0..keep.len() as u32).filter(|e| keep[*e as usize]) {
                if let Some(d) = self.read_data(e) {
                    again.push(self, e, false, d.original_key());
                    again.push(self, e, true, d.reply_key());
                }
            }
            found = again.finish(self);
        }
        let live = self.clear_index_words(&keep, &mut out);
        let kept = keep.iter().filter(|k| **k).count();
        if let Some(fault) = self.index_fault(kept, live, found) {
            out.index = Some(fault);
            self.rebuild_index(&mut keep, &mut out);
        }
        self.rebuild_derived(&flows, &keep, &mut out);
        crate::sync::fence(Ordering::SeqCst);
        out.took = t0.elapsed();
        out
    }

    /// Step 1 of the pass (see the module doc), in one walk of the entries: the IPv6
    /// extensions' claims are counted during the walk ([`Extensions::count`]), so an IPv6
    /// flow is taken (its backend address noted, its tuples queued for the probes) after
    /// it, once every claim is known.
    fn recover_entries(
        &self,
        now_ticks: u32,
        check: &dyn FlowCheck,
        keep: &mut [bool],
        out: &mut Recovery,
        taken: &mut Taken,
    ) {
        let mut exts = Extensions(vec![0; self.entries.len()]);
        let mut v6 = Vec::new();
        let limit = self.backends.len();
        for (e, entry) in self.entries.iter().enumerate() {
            let c = entry.w[W_CTL].load(Ordering::Relaxed);
            match ctl_status(c) {
                ST_FREE => continue,
                ST_LIVE => {
                    exts.count(self, e as u32);
                    // The many IPv4 flows: the table's checks on the words as they are.
                    if let Some(f) = self.v4_flow(e as u32, c, now_ticks, limit) {
                        match check.check(&f.data, f.state) {
                            Ok(()) => {
                                keep[e] = true;
                                taken.flow(e as u32, c, &f.data, None);
                                taken.tuples(self, e as u32, f.original, f.reply);
                                continue;
                            }
                            Err(r) => out.refuse(r),
                        }
                    } else {
                        match self.entry_flow(e as u32, c, now_ticks, limit, check) {
                            Ok((d, _)) => {
                                keep[e] = true;
                                let ext = self.ext_of(e as u32).filter(|_| d.client.is_ipv6());
                                taken.flow(e as u32, c, &d, ext);
                                if d.client.is_ipv6() {
                                    v6.push(e as u32);
                                } else {
                                    taken.tuples(self, e as u32, d.original_key(), d.reply_key());
                                }
                                continue;
                            }
                            Err(r) => out.refuse(r),
                        }
                    }
                }
                _ => out.torn_down += 1,
            }
            let gen_ = (ctl_gen(c) + 1) & GEN_MASK;
            entry.w[W_CTL].store(ctl(gen_, ST_FREE, 0, ctl_ls(c)), Ordering::Relaxed);
        }
        for e in v6 {
            let d = exts.claim_at(self, e).and_then(|()| {
                // Valid in the walk, not now: someone writes the file against its lock.
                self.read_data(e)
                    .ok_or_else(|| Refusal::new("entry", "changed meanwhile"))
            });
            match d {
                Ok(d) => {
                    taken.addrs.note(d.backend_id.0, d.backend);
                    taken.tuples(self, e, d.original_key(), d.reply_key());
                }
                Err(r) => self.free_refused(e, keep, out, r),
            }
        }
    }

    /// Tombstones the words of entries not kept (and words that are no word at all),
    /// empties frozen slots; returns the live words left.
    fn clear_index_words(&self, keep: &[bool], out: &mut Recovery) -> usize {
        let mut live = 0;
        for slot in self.index.slots.iter() {
            let w = slot.load(Ordering::Relaxed);
            let reset = match w {
                EMPTY | TOMB => None,
                FROZEN => Some(EMPTY),
                w => {
                    let (e, _) = word_entry(w);
                    let kept = index::is_live(w) && keep.get(e as usize).copied().unwrap_or(false);
                    live += usize::from(kept);
                    (!kept).then_some(TOMB)
                }
            };
            if let Some(v) = reset {
                slot.store(v, Ordering::Relaxed);
                out.words_reset += 1;
            }
        }
        live
    }

    /// What is wrong with the index, if anything: `found` of the `kept` flows' tuples have
    /// their word where a lookup reaches it ([`Probes`]), and the index holds `live` words
    /// of kept flows, which must be exactly those.
    fn index_fault(&self, kept: usize, live: usize, found: usize) -> Option<Refusal> {
        let tuples = 2 * kept;
        if found == tuples && live == tuples {
            return None;
        }
        Some(if live == 0 && kept > 0 {
            Refusal::new("index", format!("empty, for {kept} flows"))
        } else if found == 0 && live == tuples {
            Refusal::new(
                "seed",
                format!(
                    "{:#018x}: none of the {tuples} tuples of {kept} flows is found through it ({live} index words)",
                    self.seeds_origin(),
                ),
            )
        } else {
            Refusal::new(
                "index",
                format!("{found} of the {tuples} tuples of {kept} flows found, {live} index words"),
            )
        })
    }

    /// Whether the index holds `want` (a kept flow's word for one of its tuples) where a
    /// lookup of that tuple reaches it: in its probe window, before any empty slot, and
    /// after no word of another LIVE flow of the same tuple (an INSERTING one a dead worker
    /// left is torn down: it shadows nothing).
    fn word_found(&self, want: u64) -> bool {
        let (e, reply) = word_entry(want);
        let mut key: Option<Option<FlowKey>> = None;
        // A word's tag is its tuple's hash's: its window is the tuple's.
        for slot in self.index.window(want) {
            let w = slot.load(Ordering::Relaxed);
            if w == want {
                return true;
            }
            if w == EMPTY || w == FROZEN {
                return false;
            }
            if index::is_live(w) && index::tag_matches(w, want) {
                let (oe, oreply) = word_entry(w);
                let live = self
                    .entries
                    .get(oe as usize)
                    .is_some_and(|x| ctl_status(x.w[W_CTL].load(Ordering::Relaxed)) == ST_LIVE);
                let key = key.get_or_insert_with(|| {
                    let d = self.read_data(e)?;
                    Some(if reply {
                        d.reply_key()
                    } else {
                        d.original_key()
                    })
                });
                if live && key.is_some_and(|k| self.matches(oe, oreply, &k).is_some()) {
                    return false;
                }
            }
        }
        false
    }

    /// Empties the index and indexes every kept flow again; a flow that cannot be indexed
    /// (its tuple is another kept flow's, or its probe window is full) is freed, refused.
    fn rebuild_index(&self, keep: &mut [bool], out: &mut Recovery) {
        for slot in self.index.slots.iter() {
            slot.store(EMPTY, Ordering::Relaxed);
        }
        for e in 0..keep.len() as u32 {
            if !keep[e as usize] {
                continue;
            }
            let Some(d) = self.read_data(e) else {
                // Valid before, not now: someone writes the file against its lock.
                self.free_refused(e, keep, out, Refusal::new("entry", "changed meanwhile"));
                continue;
            };
            let (okey, rkey) = (d.original_key(), d.reply_key());
            let (oh, rh) = (self.hash(&okey), self.hash(&rkey));
            let oword = index::make_word(oh, false, e);
            let claim = match self.index.insert(oh, oword, |w| self.same_key(w, &okey)) {
                Claim::Done => {
                    let c = self.index.insert(rh, index::make_word(rh, true, e), |w| {
                        self.same_key(w, &rkey)
                    });
                    if !matches!(c, Claim::Done) {
                        self.index.remove(oh, oword);
                    }
                    c
                }
                c => c,
            };
            let why = match claim {
                Claim::Done => continue,
                Claim::Conflict(..) => {
                    Refusal::new("tuple", format!("{} -> {} of two flows", d.client, d.vip))
                }
                Claim::Full => Refusal::new(
                    "index",
                    format!("{} -> {}: probe window full", d.client, d.vip),
                ),
            };
            self.free_refused(e, keep, out, why);
        }
    }

    /// Frees kept entry `e`, refused for `why`.
    fn free_refused(&self, e: u32, keep: &mut [bool], out: &mut Recovery, why: Refusal) {
        keep[e as usize] = false;
        out.refuse(why);
        let entry = &self.entries[e as usize];
        let c = entry.w[W_CTL].load(Ordering::Relaxed);
        let gen_ = (ctl_gen(c) + 1) & GEN_MASK;
        entry.w[W_CTL].store(ctl(gen_, ST_FREE, 0, ctl_ls(c)), Ordering::Relaxed);
    }

    /// The free list, the per-backend counts, the size and the counters, from the kept
    /// entries: `flows`, what the walk took of them (those freed since are no longer in
    /// `keep`), so that no entry is read again.
    fn rebuild_derived(&self, flows: &[TakenFlow], keep: &[bool], out: &mut Recovery) {
        for b in self.backends.iter() {
            b.0.store(0, Ordering::Relaxed);
        }
        self.counters.0.embryonic.store(0, Ordering::Relaxed);
        self.counters.0.extensions.store(0, Ordering::Relaxed);
        // The free list: every entry neither kept nor a kept flow's extension, in order.
        let mut ext = vec![false; keep.len()];
        for f in flows.iter().filter(|f| keep[f.entry as usize]) {
            out.flows += 1;
            self.saw_flags(f.flags);
            self.count(f.backend, FlowState::from_u8(f.state), 1);
            if f.ext != NO_EXT {
                ext[f.ext as usize] = true;
                self.counters.0.extensions.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut head = 0u64;
        for e in (0..keep.len()).rev() {
            if !keep[e] && !ext[e] {
                self.entries[e].w[W_IDS].store(head, Ordering::Relaxed);
                head = e as u64 + 1;
            }
        }
        self.free.0.store(head, Ordering::Relaxed);
        self.departed.0.store(0, Ordering::Relaxed);
        self.sweep_cursor.0.store(0, Ordering::Relaxed);
        let c = &self.counters.0;
        for a in [
            &c.full,
            &c.exists,
            &c.reply_in_use,
            &c.index_full,
            &c.recycled,
            &c.expired,
            &c.removed,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        c.inserted.store(out.flows as u64, Ordering::Relaxed);
    }

    /// The header's seed (a file-backed table), for a log line.
    fn seeds_origin(&self) -> u64 {
        self.header
            .as_ref()
            .map_or(0, |h| h.seed.load(Ordering::Relaxed))
    }
}

/// What the entries pass takes: the backend addresses, the tuples to probe, and the flows
/// kept (what the derived state is rebuilt from).
struct Taken {
    addrs: BackendAddrs,
    probes: Probes,
    flows: Vec<TakenFlow>,
}

/// A flow the entries pass kept: what the derived state needs of it.
struct TakenFlow {
    entry: u32,
    backend: u32,
    /// Its extension entry ([`NO_EXT`] for none: an IPv4 flow).
    ext: u32,
    state: u8,
    flags: u8,
}

const NO_EXT: u32 = u32::MAX;

impl Taken {
    fn for_table(t: &FlowTable) -> Taken {
        // Two words per flow at most: no growth (and copy) of the queue during the walk.
        let n = t.entries.len();
        Taken {
            addrs: BackendAddrs::default(),
            probes: Probes::with_capacity((2 * n).min(CHUNK)),
            flows: Vec::with_capacity(n.min(CHUNK)),
        }
    }

    /// Flow `d` of entry `e` (control word `c`), kept; `ext` its extension (IPv6). Its
    /// backend address is noted unless it is IPv6 (noted once its extension's claim is).
    fn flow(&mut self, e: u32, c: u64, d: &FlowData, ext: Option<u32>) {
        if !d.client.is_ipv6() {
            self.addrs.note(d.backend_id.0, d.backend);
        }
        self.flows.push(TakenFlow {
            entry: e,
            backend: d.backend_id.0,
            ext: ext.unwrap_or(NO_EXT),
            state: ctl_state(c),
            flags: d.flags,
        });
    }

    /// Queues kept flow `e`'s tuples for the index checks.
    fn tuples(&mut self, t: &FlowTable, e: u32, original: FlowKey, reply: FlowKey) {
        self.probes.push(t, e, false, original);
        self.probes.push(t, e, true, reply);
    }
}

/// The index checks of the entries pass: each kept flow's two expected words are
/// collected, and probed in the order of their home slots, a chunk at a time ([`CHUNK`]
/// words, so memory stays bounded): the probes then walk the index forward instead of
/// jumping about it (a random access per tuple costs a TLB miss on 4 KiB pages).
struct Probes {
    words: Vec<u64>,
    /// `words` ordered by home slot (scratch).
    sorted: Vec<u64>,
    found: usize,
}

/// Words probed together (a few in the unit tests, so that they cross chunks).
const CHUNK: usize = if cfg!(test) { 7 } else { 1 << 20 };

impl Probes {
    fn new() -> Probes {
        Probes::with_capacity(0)
    }

    fn with_capacity(n: usize) -> Probes {
        Probes {
            words: Vec::with_capacity(n),
            sorted: Vec::new(),
            found: 0,
        }
    }

    /// Queues entry `e`'s tuple `key` (direction `reply`).
    fn push(&mut self, t: &FlowTable, e: u32, reply: bool, key: FlowKey) {
        self.words.push(index::make_word(t.hash(&key), reply, e));
        if self.words.len() == CHUNK {
            self.flush(t);
        }
    }

    fn flush(&mut self, t: &FlowTable) {
        // Home slots grow with the tag, the word's top bits: one counting-sort pass on the
        // top BITS orders the probes to within 1/4096 of the index (a few pages), which is
        // all the walk needs, at a fraction of a full sort's cost.
        const BITS: u32 = 12;
        let bucket = |w: u64| (w >> (64 - BITS)) as usize;
        let mut starts = vec![0usize; (1 << BITS) + 1];
        for w in &self.words {
            starts[bucket(*w) + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        self.sorted.clear();
        self.sorted.resize(self.words.len(), 0);
        for w in &self.words {
            let at = &mut starts[bucket(*w)];
            self.sorted[*at] = *w;
            *at += 1;
        }
        self.found += self.sorted.iter().filter(|w| t.word_found(**w)).count();
        self.words.clear();
    }

    /// Probes what is still queued; returns how many tuples were found.
    fn finish(mut self, t: &FlowTable) -> usize {
        self.flush(t);
        self.found
    }
}

/// How many LIVE IPv6 flows of a state file name each entry as their extension: one that
/// two name is refused for both (which of them it belongs to cannot be told, and both
/// would free it).
pub(super) struct Extensions(Vec<u8>);

impl Extensions {
    /// The claims in `t`'s entries (read once, before any is freed).
    pub(super) fn of(t: &FlowTable) -> Extensions {
        let mut n = Extensions(vec![0u8; t.entries.len()]);
        for (e, entry) in t.entries.iter().enumerate() {
            if ctl_status(entry.w[W_CTL].load(Ordering::Relaxed)) == ST_LIVE {
                n.count(t, e as u32);
            }
        }
        n
    }

    /// Counts the claim of LIVE entry `e`, if it is an IPv6 flow naming an entry.
    fn count(&mut self, t: &FlowTable, e: u32) {
        if (t.word(e, W_META) >> 40) & 1 == 1
            && let Some(x) = t.ext_of(e)
        {
            self.0[x as usize] = self.0[x as usize].saturating_add(1);
        }
    }

    /// Whether flow `d` (in entry `e`, its extension number checked by `entry_flow`) has
    /// its extension to itself, if it is IPv6.
    pub(super) fn claim(&self, t: &FlowTable, e: u32, d: &FlowData) -> Result<(), Refusal> {
        if !d.client.is_ipv6() {
            return Ok(());
        }
        self.claim_at(t, e)
    }

    /// Whether IPv6 flow `e` has its extension to itself.
    fn claim_at(&self, t: &FlowTable, e: u32) -> Result<(), Refusal> {
        match t.ext_of(e) {
            Some(x) if self.0[x as usize] == 1 => Ok(()),
            Some(x) => Err(Refusal::new(
                "extension",
                format!("{x} (named by {} flows)", self.0[x as usize]),
            )),
            None => Err(Refusal::new("extension", "no such entry")),
        }
    }
}

impl Recovery {
    /// Counts a refused flow (keeping the first reason).
    fn refuse(&mut self, r: Refusal) {
        self.refused += 1;
        self.refusal.get_or_insert(r);
    }
}

/// The checksum-adjustment word an IPv4 entry stores for address words `cv` (client | vip)
/// and `bs` (backend | snat) and port word `ports`, as stored (network order; as
/// `write_entry` computes it: [`v4_csum_deltas`]).
pub(super) fn v4_csum_word(cv: u64, bs: u64, ports: u64) -> u64 {
    v4_csum_deltas((cv, ports as u32), (bs, (ports >> 32) as u32))
}

#[cfg(test)]
pub(super) mod tests {
    use std::net::SocketAddr;

    use lb_algos::BackendId;

    use super::super::AnyFlow;
    use super::*;
    use crate::key::Protocol;
    use crate::state::TcpFlags;
    use crate::{ConnCounts, Direction, FlowTableConfig};

    fn flow(i: u16) -> FlowData {
        flow_of(i, 2)
    }

    /// Flow `i` of a TCP service: client port 1000 + i, SNAT port 2000 + i, backend id
    /// i modulo `ids` (one backend address for all).
    pub(in super::super) fn flow_of(i: u16, ids: u16) -> FlowData {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        FlowData {
            proto: Protocol::Tcp,
            client: SocketAddr::new(sa("198.18.0.1:0").ip(), 1000 + i),
            vip: sa("198.18.100.1:80"),
            backend: sa("198.18.1.1:8080"),
            snat: SocketAddr::new(sa("198.18.0.254:0").ip(), 2000 + i),
            service_id: 1,
            backend_id: BackendId(u32::from(i % ids)),
            snapshot_gen: 1,
            flags: 0,
        }
    }

    /// Every torn state a dead owner can leave, made by hand: an entry INSERTING with its
    /// words published, one DYING halfway through its tombstones, a FROZEN slot, counts that
    /// missed a decrement, a free list through a live entry.
    #[test]
    fn recovery_tears_down_what_a_dead_owner_left_half_done() {
        let now = Instant::now();
        // A fixed hash seed: which flow the last insert recycles depends on where the hash
        // puts it (with a random seed, about one run in fifty it recycles flow 0).
        let mut cfg = FlowTableConfig::new(64, 4);
        cfg.hash_seed = 0x0123_4567_89ab_cdef;
        let t = FlowTable::new(cfg, now).unwrap();
        let handles: Vec<_> = (0..10)
            .map(|i| t.insert(&flow(i), TcpFlags::SYN, t.tick(now)).unwrap())
            .collect();
        let set_status = |h: crate::FlowHandle, st: u64| {
            let w = &t.entries[h.entry() as usize].w[W_CTL];
            let c = w.load(Ordering::Relaxed);
            w.store(
                ctl(ctl_gen(c), st, ctl_state(c), ctl_ls(c)),
                Ordering::Relaxed,
            );
        };
        // Flow 3: its inserter died after publishing both words, before LIVE.
        set_status(handles[3], crate::table::entry::ST_INSERTING);
        // Flow 5: its remover won the CAS to DYING and tombed one word, then died.
        set_status(handles[5], crate::table::entry::ST_DYING);
        let reply = t.index.window(t.hash(&flow(5).reply_key()));
        let slot = reply
            .iter()
            .find(|s| {
                let w = s.load(Ordering::Relaxed);
                w != EMPTY && w != TOMB && w != FROZEN && word_entry(w).0 == handles[5].entry()
            })
            .expect("flow 5's reply word");
        slot.store(TOMB, Ordering::Relaxed);
        // A cleanup died with a slot frozen.
        let frozen = t
            .index
            .slots
            .iter()
            .position(|s| s.load(Ordering::Relaxed) == EMPTY)
            .unwrap();
        t.index.slots[frozen].store(FROZEN, Ordering::Relaxed);
        // Counts a dead remover half-updated, and a free list that points at live entries.
        t.backends[0].0.fetch_add(5, Ordering::Relaxed);
        t.free.0.store(1, Ordering::Relaxed);

        let r = t.recover(false, 42, now, &AnyFlow);
        assert_eq!(r.flows, 8);
        assert_eq!(r.torn_down, 2);
        // Flow 3's two words and flow 5's remaining one are tombed; the frozen slot emptied.
        assert_eq!(r.words_reset, 4);
        assert_eq!(t.index.slots[frozen].load(Ordering::Relaxed), EMPTY);
        for (i, h) in handles.iter().enumerate() {
            let d = flow(i as u16);
            let found = t.lookup(&d.original_key()).map(|(h, _)| h);
            if i == 3 || i == 5 {
                assert_eq!(found, None, "flow {i} was torn down");
                assert_eq!(t.lookup(&d.reply_key()), None);
                assert_eq!(t.get(*h), None, "its old handle is stale");
            } else {
                assert_eq!(found, Some(*h), "flow {i}");
                assert_eq!(t.lookup(&d.reply_key()), Some((*h, Direction::Reply)));
            }
        }
        // Recounted: four flows per backend left (0,2,4,6,8 minus nothing on 0; 1,7,9 on 1...).
        let on = |b: u32| {
            (0..10u32)
                .filter(|i| i % 2 == b && *i != 3 && *i != 5)
                .count() as u32
        };
        assert_eq!(t.inactive(BackendId(0)), on(0));
        assert_eq!(t.inactive(BackendId(1)), on(1));
        assert_eq!(t.len(), 8);
        // The free list holds exactly the other 56 entries: 56 more inserts take free
        // entries, the next one has to recycle an embryonic flow.
        for i in 100..156 {
            t.insert(&flow(i), TcpFlags::SYN, t.tick(now)).unwrap();
        }
        assert_eq!((t.len(), t.stats().recycled), (64, 0));
        t.insert(&flow(200), TcpFlags::SYN, t.tick(now)).unwrap();
        assert_eq!(t.stats().recycled, 1);
        // Torn-down flows insert again.
        assert!(t.remove(handles[0]).is_some());
        t.insert(&flow(3), TcpFlags::SYN, t.tick(now)).unwrap();
    }
}
