//! An entry's layout: the hot line's eight words (and an IPv6 flow's extension entry), the
//! control word (`gen:22 | status:2 | state:8 | last_seen:32`) and its statuses, and the reads
//! and writes of an entry's data words (see the crate docs' memory layout and life cycle).
//!
//! An IPv6 flow's addresses do not fit one line: it takes a second entry from the free list,
//! its **extension**, which holds its VIP, backend and SNAT addresses (words 1..=6) and whose
//! control word stays FREE (so sweeps, scans, lookups and recycling pass it by; a stale
//! handle of its last flow stays stale). The flow's hot line names it (`W_EXT`). The
//! extension belongs to the flow: written with it by its inserter, before the INSERTING
//! store, and returned to the free list by whoever frees the flow, after its FREE store. A
//! reader that followed `W_EXT` validates the flow's control word after reading it, as for
//! any data word: a recycled extension was written after a release fence that follows the
//! flow's FREE store. IPv4 flows, the many, keep one line and cost nothing of this.
//!
//! Statuses move FREE → INSERTING → LIVE → DYING → FREE (a torn-down insert goes INSERTING →
//! DYING → FREE, and a state file's recovery frees INSERTING/DYING entries a dead process left);
//! data words are written only by the owner of a FREE entry, before it stores INSERTING.

use super::FlowTable;
use super::v4::{ports4_be, v4_addrs_be, v4_csum_deltas};
use crate::key::{FlowData, FlowKey, Protocol, bits_addr};
use crate::state::FlowState;
#[cfg(doc)]
use crate::state::TcpFlags;
use crate::sync::{AtomicU64, Ordering, fence};
use lb_algos::BackendId;
use std::net::SocketAddr;

// Entry words: 0..8 in the hot line (`Entry`).
pub(super) const W_CTL: usize = 0;
/// client port | vip port << 16 | backend port << 32 | snat port << 48, each in network
/// byte order ([`ports4_be`] converts).
pub(super) const W_PORTS: usize = 1;
/// service id | backend id << 32; while the entry is free: the free-list link (entry + 1).
pub(super) const W_IDS: usize = 2;
/// snapshot gen | proto << 32 | v6 << 40 | flags << 48.
pub(super) const W_META: usize = 3;
/// Addresses. IPv4: word 4 = client | vip << 32, word 5 = backend | snat << 32 (so an IPv4
/// flow lives in one cache line), each address in network byte order ([`v4_addrs_be`]
/// converts), as a frame carries it. IPv6: client (4, 5) as (lo, hi); the rest in the extension.
pub(super) const W_ADDR: usize = 4;
/// IPv4 only: the checksum adjustments of forwarded packets ([`v4_csum_deltas`]: the tuple's
/// and the TTL's decrement) of the original direction | the reply direction's << 32.
pub(super) const W_V4_CSUM: usize = 6;
/// IPv6 only (the word IPv4 uses for [`W_V4_CSUM`]): the extension entry's number.
pub(super) const W_EXT: usize = 6;
/// The flow's sequence word (see [`FlowTable::seq`]), of either family.
pub(super) const W_SEQ: usize = 7;
pub(super) const HOT_WORDS: usize = 8;
/// Where an extension entry keeps an IPv6 flow's address `slot` (`A_VIP`, `A_BACKEND`,
/// `A_SNAT`): words `x_word(slot)` (lo) and the next (hi), between the control word (the
/// extension's own, FREE) and the sequence word (left alone: a stale handle of the entry's
/// last flow may still compare-and-swap it, harmlessly, until the entry's next flow bumps the
/// generation).
#[inline(always)]
pub(super) const fn x_word(slot: usize) -> usize {
    1 + 2 * (slot - 1)
}
const _: () = assert!(x_word(A_SNAT) + 1 < W_SEQ && x_word(A_VIP) > W_CTL);

/// Address slots, in word order.
pub(super) const A_CLIENT: usize = 0;
pub(super) const A_VIP: usize = 1;
pub(super) const A_BACKEND: usize = 2;
pub(super) const A_SNAT: usize = 3;

/// One flow's hot line: 8 atomic words, 64 bytes, cache-line aligned: the control word
/// `gen:22 | status:2 | state:8 | last_seen:32`, ports, ids, meta and the addresses (all of
/// them for IPv4; for IPv6 the client and the extension's number). The rest are immutable
/// while the entry is INSERTING or LIVE. Atomics (not plain fields) so readers may race with a recycler without
/// UB: they validate with the control word instead.
#[repr(C, align(64))]
pub(super) struct Entry {
    pub(super) w: [AtomicU64; HOT_WORDS],
}

const _: () = assert!(std::mem::size_of::<Entry>() == 64 || cfg!(loom));

/// A bit of [`FlowData::flags`] that the table reads: [`FlowTable::lookup_v4`] (the IPv4
/// per-packet shortcut) does not return such a flow, while every other lookup, the inserts
/// and the rest treat it as any flow. For flows whose packets need more than the shortcut's
/// rewrite (the SYN proxy's): they cost the shortcut's hits nothing, not even a test. A
/// table that ever held one says so ([`FlowTable::has_slow_flows`]).
pub const FLAG_SLOW: u8 = 0x80;

/// A bit of [`FlowData::flags`] that the table reads: a flow whose replies never pass
/// through here (direct server return: the backend answers the client directly), so that
/// only its original direction is ever seen. Its TCP state follows IPVS's input-only rows
/// ([`FlowState::next_one_way`]) in [`FlowTable::touch`] and [`FlowTable::on_packet`]; and,
/// as a [`FLAG_SLOW`] flow, [`FlowTable::lookup_v4`] does not return it (its packets need
/// more than the shortcut's rewrite: an encapsulation) and a table that ever held one says
/// so ([`FlowTable::has_slow_flows`]).
pub const FLAG_ONE_WAY: u8 = 0x04;

/// The flag bits that keep a flow from [`FlowTable::lookup_v4`].
pub(super) const SLOW_FLAGS: u8 = FLAG_SLOW | FLAG_ONE_WAY;

pub(super) const ST_FREE: u64 = 0;
pub(super) const ST_INSERTING: u64 = 1;
pub(super) const ST_LIVE: u64 = 2;
pub(super) const ST_DYING: u64 = 3;
pub(super) const GEN_MASK: u64 = (1 << 22) - 1;

#[inline]
/// Whether `state` is a state of protocol `proto`.
pub(super) fn state_fits(state: FlowState, proto: Protocol) -> bool {
    matches!(
        (state, proto),
        (FlowState::Tcp(_), Protocol::Tcp)
            | (FlowState::Udp, Protocol::Udp)
            | (FlowState::Icmp, Protocol::Icmp | Protocol::Icmpv6)
            | (FlowState::Sctp(_), Protocol::Sctp)
    )
}

pub(super) fn ctl(gen_: u64, status: u64, state: u8, ls: u32) -> u64 {
    (gen_ & GEN_MASK) << 42 | status << 40 | u64::from(state) << 32 | u64::from(ls)
}
#[inline]
pub(super) fn ctl_gen(c: u64) -> u64 {
    c >> 42
}
#[inline]
pub(super) fn ctl_status(c: u64) -> u64 {
    (c >> 40) & 3
}
#[inline]
pub(super) fn ctl_state(c: u64) -> u8 {
    (c >> 32) as u8
}
#[inline]
pub(super) fn ctl_ls(c: u64) -> u32 {
    c as u32
}
/// Readable (lookups, `get`, `on_packet`): data complete and not being torn down.
#[inline]
pub(super) fn ctl_readable(c: u64) -> bool {
    // Status + 1 is 2 or 3 (bit 1 set) exactly for INSERTING and LIVE: FREE gives 1, DYING 4
    // (a carry into the generation, which is not read back).
    (c.wrapping_add(1 << 40) >> 41) & 1 != 0
}
const _: () = assert!(ST_FREE == 0 && ST_INSERTING == 1 && ST_LIVE == 2 && ST_DYING == 3);

/// Whether a control-word change from `old` to `new` is one the entry life cycle allows:
/// FREE → INSERTING with the generation bumped (reuse), INSERTING → LIVE, INSERTING → DYING
/// (a torn-down insert), LIVE → DYING, DYING → FREE in one generation, and INSERTING/LIVE to
/// themselves (state and last-seen changes). For `debug_assert!`s at every store and CAS of a
/// control word, except a state file's single-threaded recovery (which frees what a dead
/// process left in any status).
pub(super) fn transition_ok(old: u64, new: u64) -> bool {
    let same_gen = ctl_gen(old) == ctl_gen(new);
    match (ctl_status(old), ctl_status(new)) {
        (ST_FREE, ST_INSERTING) => ctl_gen(new) == (ctl_gen(old) + 1) & GEN_MASK,
        (ST_INSERTING, ST_INSERTING | ST_LIVE | ST_DYING)
        | (ST_LIVE, ST_LIVE | ST_DYING)
        | (ST_DYING, ST_FREE) => same_gen,
        _ => false,
    }
}

/// `debug_assert!` that `old` → `new` is a life-cycle transition ([`transition_ok`]).
macro_rules! debug_transition {
    ($old:expr, $new:expr) => {
        debug_assert!(
            $crate::table::entry::transition_ok($old, $new),
            "flow entry control word: status {} gen {} -> status {} gen {}",
            $crate::table::entry::ctl_status($old),
            $crate::table::entry::ctl_gen($old),
            $crate::table::entry::ctl_status($new),
            $crate::table::entry::ctl_gen($new),
        )
    };
}
pub(super) use debug_transition;

/// The two IPv4 addresses of an address word, `(high half, low half)`, as key bits.
#[inline(always)]
pub(super) fn v4_halves(w: u64) -> (u128, u128) {
    let m = |x: u64| crate::key::V4_MAPPED | u128::from(x as u32);
    (m(w >> 32), m(w))
}

impl FlowTable {
    /// Whether a [`FLAG_SLOW`] (or [`FLAG_ONE_WAY`]) flow was ever in this table (inserted, imported or adopted by
    /// this process): [`lookup_v4`](Self::lookup_v4)'s misses need a second look then. One
    /// relaxed load.
    #[inline]
    pub fn has_slow_flows(&self) -> bool {
        self.slow_seen.load(Ordering::Relaxed) != 0
    }

    /// Notes a [`FLAG_SLOW`] or [`FLAG_ONE_WAY`] flow.
    #[inline]
    pub(super) fn saw_flags(&self, flags: u8) {
        if flags & SLOW_FLAGS != 0 && self.slow_seen.load(Ordering::Relaxed) == 0 {
            self.slow_seen.store(1, Ordering::Relaxed);
        }
    }

    #[inline(always)]
    pub(super) fn word(&self, e: u32, w: usize) -> u64 {
        self.entries[e as usize].w[w].load(Ordering::Relaxed)
    }

    /// Entry `e`'s ports word in host order (`client | vip << 16 | backend << 32 | snat << 48`).
    #[inline(always)]
    pub(super) fn ports_host(&self, e: u32) -> u64 {
        ports4_be(self.word(e, W_PORTS))
    }

    /// IPv4 entry `e`'s address word `W_ADDR + i` in host order (`Ipv4Addr::to_bits` halves).
    #[inline(always)]
    pub(super) fn v4_addrs_host(&self, e: u32, i: usize) -> u64 {
        v4_addrs_be(self.word(e, W_ADDR + i))
    }

    #[inline(always)]
    pub(super) fn set_word(&self, e: u32, w: usize, v: u64) {
        self.entries[e as usize].w[w].store(v, Ordering::Relaxed)
    }

    /// The extension entry an IPv6 entry `e` names, if that is an entry at all (a torn read
    /// of a recycled entry, or a damaged state file, may name none: readers validate after).
    #[inline(always)]
    pub(super) fn ext_of(&self, e: u32) -> Option<u32> {
        let x = self.word(e, W_EXT);
        (x < self.entries.len() as u64).then_some(x as u32)
    }

    /// Address `slot` (`A_*`) of entry `e`, as the key stores it (IPv4 v4-mapped). An IPv6
    /// address in an extension that is no entry reads as 0 (see [`ext_of`](Self::ext_of)).
    #[inline(always)]
    pub(super) fn addr(&self, e: u32, slot: usize, v6: bool) -> u128 {
        if v6 {
            let (at, w) = if slot == A_CLIENT {
                (Some(e), W_ADDR)
            } else {
                (self.ext_of(e), x_word(slot))
            };
            at.map_or(0, |x| {
                u128::from(self.word(x, w)) | u128::from(self.word(x, w + 1)) << 64
            })
        } else {
            let w = self.v4_addrs_host(e, slot / 2);
            crate::key::V4_MAPPED | u128::from((w >> (32 * (slot % 2))) as u32)
        }
    }

    /// Whether entry `e`'s addresses for the pair (`slot`, `slot + 1`) are `src`, `dst`.
    #[inline(always)]
    pub(super) fn addrs_match(&self, e: u32, slot: usize, key: &FlowKey) -> bool {
        if key.v6 {
            self.addr(e, slot, true) == key.src && self.addr(e, slot + 1, true) == key.dst
        } else {
            // Both IPv4 addresses of the pair share one word.
            self.v4_addrs_host(e, slot / 2)
                == u64::from(key.src as u32) | u64::from(key.dst as u32) << 32
        }
    }

    /// Decode entry `e`'s data (possibly torn if racing a recycler: callers validate after).
    pub(super) fn read_data(&self, e: u32) -> Option<FlowData> {
        let meta = self.word(e, W_META);
        let ports = self.ports_host(e);
        let ids = self.word(e, W_IDS);
        let v6 = (meta >> 40) & 1 == 1;
        let sa = |a: usize, p: u64| SocketAddr::new(bits_addr(self.addr(e, a, v6), v6), p as u16);
        Some(FlowData {
            proto: Protocol::from_ip_proto((meta >> 32) as u8)?,
            client: sa(A_CLIENT, ports),
            vip: sa(A_VIP, ports >> 16),
            backend: sa(A_BACKEND, ports >> 32),
            snat: sa(A_SNAT, ports >> 48),
            service_id: ids as u32,
            backend_id: BackendId((ids >> 32) as u32),
            snapshot_gen: meta as u32,
            flags: (meta >> 48) as u8,
        })
    }

    /// Write a popped (exclusively owned, FREE) entry, and for an IPv6 flow its extension
    /// `ext` (popped too), and make the entry INSERTING. Returns its gen.
    pub(super) fn write_entry(
        &self,
        e: u32,
        ext: Option<u32>,
        d: &FlowData,
        state: FlowState,
        t: u32,
    ) -> u64 {
        self.saw_flags(d.flags);
        let entry = &self.entries[e as usize];
        let old = entry.w[W_CTL].load(Ordering::Relaxed);
        let gen_ = (ctl_gen(old) + 1) & GEN_MASK;
        // Pairs with readers' acquire fence: a reader that sees any of the stores below also
        // sees the FREE/DYING control word stored before, so its validation fails.
        fence(Ordering::Release);
        let set = |w: usize, v: u64| self.set_word(e, w, v);
        let v6 = d.client.is_ipv6();
        let bits = [d.client, d.vip, d.backend, d.snat].map(|sa| crate::key::addr_bits(sa.ip()).0);
        if v6 {
            let x = ext.expect("an IPv6 flow's inserter took an extension");
            set(W_ADDR, bits[A_CLIENT] as u64);
            set(W_ADDR + 1, (bits[A_CLIENT] >> 64) as u64);
            set(W_EXT, u64::from(x));
            for slot in [A_VIP, A_BACKEND, A_SNAT] {
                self.set_word(x, x_word(slot), bits[slot] as u64);
                self.set_word(x, x_word(slot) + 1, (bits[slot] >> 64) as u64);
            }
        } else {
            let pair =
                |a: u128, b: u128| v4_addrs_be(u64::from(a as u32) | u64::from(b as u32) << 32);
            let (cv, bs) = (
                pair(bits[A_CLIENT], bits[A_VIP]),
                pair(bits[A_BACKEND], bits[A_SNAT]),
            );
            set(W_ADDR, cv);
            set(W_ADDR + 1, bs);
            // Both directions' checksum adjustments (the word an IPv6 VIP would use).
            let ports = |a: SocketAddr, b: SocketAddr| {
                u32::from(a.port().to_be()) | u32::from(b.port().to_be()) << 16
            };
            let (p_cv, p_bs) = (ports(d.client, d.vip), ports(d.backend, d.snat));
            set(W_V4_CSUM, v4_csum_deltas((cv, p_cv), (bs, p_bs)));
        }
        set(
            W_PORTS,
            ports4_be(
                u64::from(d.client.port())
                    | u64::from(d.vip.port()) << 16
                    | u64::from(d.backend.port()) << 32
                    | u64::from(d.snat.port()) << 48,
            ),
        );
        set(
            W_IDS,
            u64::from(d.service_id) | u64::from(d.backend_id.0) << 32,
        );
        set(
            W_META,
            u64::from(d.snapshot_gen)
                | u64::from(d.proto as u8) << 32
                | u64::from(v6) << 40
                | u64::from(d.flags) << 48,
        );
        let new = ctl(gen_, ST_INSERTING, state.to_u8(), t);
        debug_transition!(old, new);
        entry.w[W_CTL].store(new, Ordering::Release);
        gen_
    }
}
