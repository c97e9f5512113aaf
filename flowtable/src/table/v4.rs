//! The IPv4 per-packet API: packed keys ([`V4Key`]), hits ([`V4Hit`]) and inserts
//! ([`V4Flow`]), the same flows as the generic [`FlowKey`]/[`FlowData`](crate::FlowData) API
//! builds, without 128-bit addresses or `SocketAddr`s.

use super::FlowTable;
use super::entry::debug_transition;
use super::entry::{
    GEN_MASK, SLOW_FLAGS, ST_INSERTING, W_ADDR, W_CTL, W_IDS, W_META, W_PORTS, W_V4_CSUM, ctl,
    ctl_gen, ctl_readable, ctl_status,
};
use super::error::InsertError;
use super::handle::{FlowHandle, Tick};
use crate::index::{self};
use crate::key::{Direction, FlowKey, Protocol};
use crate::state::{FlowState, TcpFlags};
use crate::sync::{Ordering, fence};
use lb_algos::BackendId;

/// An IPv4 tuple packed the way the per-packet path reads it, with its hash in one table,
/// from [`FlowTable::v4_key`]: the same flow as the [`FlowKey`] [`V4Key::key`] gives, without
/// its 128-bit addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V4Key {
    /// Source | destination << 32, each in network byte order ([`v4_addrs_be`]).
    addrs: u64,
    /// Source port | destination port << 16, each in network byte order ([`v4_ports_be`]).
    ports: u32,
    proto: Protocol,
    hash: u64,
}

impl V4Key {
    /// The key as a [`FlowKey`] (for the paths beyond a hit).
    #[inline]
    pub fn key(&self) -> FlowKey {
        let (addrs, ports) = (v4_addrs_be(self.addrs), v4_ports_be(self.ports));
        FlowKey::v4_bits(
            self.proto,
            addrs as u32,
            ports as u16,
            (addrs >> 32) as u32,
            (ports >> 16) as u16,
        )
    }

    /// Source | destination << 32, each in network byte order ([`v4_addrs_be`]).
    #[inline]
    pub fn addrs(&self) -> u64 {
        self.addrs
    }

    /// Source port | destination port << 16, each in network byte order ([`v4_ports_be`]).
    #[inline]
    pub fn ports(&self) -> u32 {
        self.ports
    }

    /// The protocol.
    #[inline]
    pub fn proto(&self) -> Protocol {
        self.proto
    }

    /// The key's hash in its table: equal keys have equal hashes.
    #[inline]
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// [`FlowKey::misc`] of the key.
    #[inline(always)]
    fn misc(&self) -> u64 {
        u64::from(self.ports) | u64::from(self.proto as u8) << 32
    }
}

/// A word of two IPv4 addresses (`a | b << 32`) with each address converted between host
/// order (`Ipv4Addr::to_bits`) and network byte order (`u32::to_be`), either way (the
/// conversion is its own inverse). Network order is how the per-packet path and the entries
/// hold IPv4 tuples: a frame's source and destination loaded as one word (`u64::from_ne_bytes`
/// on a little-endian machine; see [`v4_wire_word`]) and stored back with no byte swap.
#[inline(always)]
pub fn v4_addrs_be(w: u64) -> u64 {
    if cfg!(target_endian = "little") {
        w.swap_bytes().rotate_left(32)
    } else {
        w
    }
}

/// [`v4_addrs_be`] for a word of two ports (`a | b << 16`).
#[inline(always)]
pub fn v4_ports_be(w: u32) -> u32 {
    if cfg!(target_endian = "little") {
        w.swap_bytes().rotate_left(16)
    } else {
        w
    }
}

/// [`v4_ports_be`] for an entry's word of four ports (`a | b << 16 | c << 32 | d << 48`).
#[inline(always)]
pub(super) fn ports4_be(w: u64) -> u64 {
    const LO: u64 = 0x00ff_00ff_00ff_00ff;
    if cfg!(target_endian = "little") {
        (w & LO) << 8 | (w >> 8) & LO
    } else {
        w
    }
}

/// The packed word of a frame's two adjacent fields of `half` bytes each (`2 * half` bytes
/// loaded with `from_ne_bytes`), the first in the low half: on a little-endian machine the
/// load itself; on a big-endian one its halves swapped. Its own inverse: a word to store with
/// `to_ne_bytes`. So `v4_wire_word(u64::from_ne_bytes(wire[26..34]), 32)` is the packed
/// `src | dst << 32` in network order.
#[inline(always)]
pub fn v4_wire_word(w: u64, half: u32) -> u64 {
    if cfg!(target_endian = "little") {
        w
    } else {
        w.rotate_left(half)
    }
}

/// How the checksums of an IPv4 packet change when its tuple does: a packet arriving with
/// addresses `from.0` (source | destination << 32, `Ipv4Addr::to_bits` values) and ports
/// `from.1` (source | destination << 16) and leaving with `to`'s has its IPv4 header checksum
/// change by the low half and its TCP/UDP checksum (pseudo-header and ports) by the high half:
/// one's complement sums (big-endian arithmetic) of `!old + new` over the changed 16-bit
/// words, the inner sum of RFC 1624 eq. 3 (`HC' = ~(~HC + delta)`). An address that does not
/// change adds nothing; the ports always add their words. Each half is 0 only when its sum
/// is, so updates come out exactly as adding the words one by one does.
///
/// Each half is in network byte order (`u16::to_be`), as a checksum field read with
/// `u16::from_ne_bytes` is: a one's complement sum is byte-order independent (RFC 1071
/// §2(B)), so a rewrite adds it to the field as loaded, with no byte swap per packet.
#[inline]
pub fn v4_csum_delta(from: (u64, u32), to: (u64, u32)) -> u32 {
    let be = |(a, p): (u64, u32)| (v4_addrs_be(a), v4_ports_be(p));
    v4_csum_delta_be(be(from), be(to))
}

/// [`v4_csum_delta`] of tuples in network byte order ([`v4_addrs_be`], [`v4_ports_be`]), as
/// [`V4Key`]s and entries hold them: the same result. Each 16-bit word summed with its bytes
/// swapped is the one's complement sum with its bytes swapped (RFC 1071 §2(B): a rotation by
/// 8 bits, multiplication by 2^8 modulo 0xffff, which maps 0 to 0 and 0xffff to 0xffff), and
/// an unchanged word still adds nothing; so the halves come out in network order as they are.
#[inline]
pub fn v4_csum_delta_be(from: (u64, u32), to: (u64, u32)) -> u32 {
    // Branch-free: the sum masked to zero when the word did not change.
    let term = |o: u32, n: u32| (u64::from(!o) + u64::from(n)) & u64::from(o != n).wrapping_neg();
    let ip = term(from.0 as u32, to.0 as u32) + term((from.0 >> 32) as u32, (to.0 >> 32) as u32);
    let l4 = ip + u64::from(!from.1) + u64::from(to.1);
    u32::from(fold16(ip)) | u32::from(fold16(l4)) << 16
}

/// The IPv4 header checksum's term for the TTL's decrement by one: the (TTL, protocol)
/// word `w` becomes `w - 0x100`, and `!w + (w - 0x100)` is 0xfeff in big-endian
/// arithmetic; in network byte order, as the deltas' halves are.
const TTL_TERM: u16 = u16::from_ne_bytes([0xfe, 0xff]);

/// A [`v4_csum_delta`] or [`v4_csum_delta_be`] (halves in network byte order) for a packet
/// that is forwarded as well: its IPv4 header half with the TTL's decrement by one added
/// (`delta + 0xfeff` folded, in big-endian arithmetic), so that a rewrite which decrements the TTL adds one term to the header
/// checksum, not two. The entries store their deltas this way, and [`V4Hit::csum_delta`] and
/// [`PendingV4::csum_delta`] give them so.
///
/// The header checksum comes out as adding the two terms one by one gives it
/// (`~(~HC + delta + 0xfeff)`, RFC 1624 eq. 3): a one's complement sum with a non-zero term
/// is the non-zero representative of its residue, however it is grouped.
#[inline]
pub fn v4_forward_delta(delta: u32) -> u32 {
    // The 16-bit sum with its end-around carry (with a carry, the sum is at most 0xfffe).
    let (ip, c) = (delta as u16).overflowing_add(TTL_TERM);
    delta & 0xffff_0000 | u32::from(ip + u16::from(c))
}

/// Both directions' checksum adjustments of a flow whose original tuple is `o` (addresses,
/// ports, packed as [`V4Key`]'s, in network order) and reply tuple `r`, as the entry stores them
/// (forwarded, [`v4_forward_delta`]): the original direction's in the low half, the reply
/// direction's in the high half. Exactly the two deltas, at the cost of about one: the reply
/// direction changes the same words the other way (its addresses swapped by the rotation,
/// its ports' halves too, which a one's complement sum does not see), so each half of its
/// [`v4_csum_delta`] is the one's complement negation of the original's, `!h`, for every `h`
/// but the two representations of zero (0 and 0xffff), which depend on more than the residue
/// and are computed in full. The TTL's term goes in after.
#[inline(always)]
pub(crate) fn v4_csum_deltas((oa, op): (u64, u32), (ra, rp): (u64, u32)) -> u64 {
    let original = v4_csum_delta_be((oa, op), (ra.rotate_left(32), rp.rotate_left(16)));
    let negated = |h: u32| {
        let h = h as u16;
        (h != 0 && h != 0xffff).then_some(!h)
    };
    let reply = match (negated(original), negated(original >> 16)) {
        (Some(ip), Some(l4)) => u32::from(ip) | u32::from(l4) << 16,
        _ => v4_csum_reply((oa, op), (ra, rp)),
    };
    u64::from(v4_forward_delta(original)) | u64::from(v4_forward_delta(reply)) << 32
}

/// The reply direction's [`v4_csum_delta`] in full (see [`v4_csum_deltas`]).
#[cold]
#[inline(never)]
fn v4_csum_reply((oa, op): (u64, u32), (ra, rp): (u64, u32)) -> u32 {
    v4_csum_delta_be((ra, rp), (oa.rotate_left(32), op.rotate_left(16)))
}

/// A one's complement sum folded to 16 bits: the same residue modulo 0xffff, 0 only for 0.
#[inline(always)]
fn fold16(s: u64) -> u16 {
    let (x, c) = (s as u32).overflowing_add((s >> 32) as u32);
    // With a carry, x <= 2^32 - 2.
    let x = x + u32::from(c);
    let (y, c) = (x as u16).overflowing_add((x >> 16) as u16);
    y + u16::from(c)
}

/// What `hit_v4` compares of `meta >> 32`: protocol, family, and the flags byte's
/// [`FLAG_SLOW`](super::FLAG_SLOW) and [`FLAG_ONE_WAY`](super::FLAG_ONE_WAY) bits.
const SHORTCUT_MASK: u64 = 0xffff | (SLOW_FLAGS as u64) << 16;

/// [`FlowHit`](crate::FlowHit) for an IPv4 flow, from [`FlowTable::lookup_v4`](crate::FlowTable::lookup_v4): the outgoing endpoints packed
/// like a [`V4Key`]'s and the checksum adjustment, 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V4Hit {
    /// The way out's addresses as the entry stores them: new destination | new source << 32
    /// (network byte order): [`addrs`](Self::addrs) rotated, so that [`dst`](Self::dst) is
    /// its low half as loaded (no shift), and the rotation is made where the frame is written.
    out: u64,
    /// New source port | new destination port << 16, each in network byte order.
    pub ports: u32,
    /// What the packet's checksums change by when it is forwarded: [`v4_csum_delta_be`] from
    /// the tuple it matched to `(addrs, ports)`, with the TTL's decrement
    /// ([`v4_forward_delta`]).
    pub csum_delta: u32,
    /// The flow's pipeline flags byte ([`FlowData::flags`](crate::FlowData::flags)).
    pub flags: u8,
    reply: bool,
    entry: u32,
    backend: u32,
    ctl: u64,
}

impl V4Hit {
    /// Whether the flow was still being inserted when found (its reply tuple possibly not
    /// indexed yet, the insert possibly about to fail).
    #[inline]
    pub fn is_inserting(&self) -> bool {
        ctl_status(self.ctl) == ST_INSERTING
    }

    /// The flow.
    #[inline]
    pub fn handle(&self) -> FlowHandle {
        FlowHandle::new(self.entry, ctl_gen(self.ctl))
    }

    /// Which tuple the packet matched.
    #[inline]
    pub fn dir(&self) -> Direction {
        if self.reply {
            Direction::Reply
        } else {
            Direction::Original
        }
    }

    /// New source address | new destination address << 32, each in network byte order
    /// ([`v4_addrs_be`]): as a frame carries them.
    #[inline(always)]
    pub fn addrs(&self) -> u64 {
        self.out.rotate_left(32)
    }

    /// New destination address, in network byte order (`u32::to_be` of `Ipv4Addr::to_bits`).
    #[inline(always)]
    pub fn dst(&self) -> u32 {
        self.out as u32
    }

    /// The backend the flow was scheduled to.
    #[inline]
    pub fn backend_id(&self) -> BackendId {
        BackendId(self.backend)
    }
}

/// A new IPv4 flow for [`FlowTable::insert_v4`]: its two tuples as keys of this table (from
/// [`FlowTable::v4_key`](crate::FlowTable::v4_key)) and the rest of its [`FlowData`](crate::FlowData). The same flow as the `FlowData`
/// with `client → vip` = `original` and `backend → snat` = `reply`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V4Flow {
    /// Client → VIP.
    pub original: V4Key,
    /// Backend → SNAT address (or client in nat mode).
    pub reply: V4Key,
    /// [`FlowData::service_id`](crate::FlowData::service_id).
    pub service_id: u32,
    /// [`FlowData::backend_id`](crate::FlowData::backend_id).
    pub backend_id: BackendId,
    /// [`FlowData::snapshot_gen`](crate::FlowData::snapshot_gen).
    pub snapshot_gen: u32,
    /// [`FlowData::flags`](crate::FlowData::flags).
    pub flags: u8,
}

/// An IPv4 insert between [`FlowTable::insert_v4_begin`] and [`FlowTable::insert_v4_finish`]:
/// an entry indexed by its original tuple only, that no one else can remove. Finish it.
#[must_use = "a begun insert holds an entry until insert_v4_finish"]
#[derive(Debug, PartialEq, Eq)]
pub struct PendingV4 {
    entry: u32,
    backend: u32,
    /// The entry's generation | the original direction's checksum delta << 32 (a
    /// generation fits in 22 bits): one word, so the pending insert stays 32 bytes.
    gen_csum: u64,
    original_hash: u64,
    // The reply tuple itself is in the entry (ours until the insert ends): 32 bytes to move
    // about instead of 56.
    reply_hash: u64,
}

impl PendingV4 {
    /// The hash of the reply tuple this insert will index: equal for equal tuples (a worker
    /// compares it with the tuples of its later packets).
    #[inline]
    pub fn reply_hash(&self) -> u64 {
        self.reply_hash
    }

    /// What the original direction's packets' checksums change by when forwarded,
    /// [`v4_csum_delta`] from the original tuple to the reply tuple reversed (the way out of
    /// a flow this insert creates) with the TTL's decrement ([`v4_forward_delta`]): computed
    /// once for the entry, so the first packet's rewrite need not.
    #[inline]
    pub fn csum_delta(&self) -> u32 {
        (self.gen_csum >> 32) as u32
    }

    #[inline(always)]
    fn gen_(&self) -> u64 {
        self.gen_csum & GEN_MASK
    }
}

impl FlowTable {
    /// An IPv4 TCP/UDP/SCTP key from packed fields in network byte order (`src | dst << 32`
    /// as [`v4_addrs_be`] gives them, `src_port | dst_port << 16` as [`v4_ports_be`] does;
    /// a frame's bytes as loaded, see [`v4_wire_word`]), hashed for this table: the same flow
    /// and hash as the [`FlowKey`] `FlowKey::v4_bits(..)` of the host-order values gives. (A `V4Key` of another table only
    /// gives wrong misses.)
    #[inline(always)]
    pub fn v4_key(&self, proto: Protocol, addrs: u64, ports: u32) -> V4Key {
        let misc = u64::from(ports) | u64::from(proto as u8) << 32;
        V4Key {
            addrs,
            ports,
            proto,
            hash: self.hash_v4(addrs, misc),
        }
    }

    /// [`v4_key`](Self::v4_key) for TCP: the same key, the protocol's term of the hash in a
    /// key of its own (for a caller whose protocol is a constant; `v4_key` with a protocol
    /// only known at run time does not test it).
    #[inline(always)]
    pub fn v4_key_tcp(&self, addrs: u64, ports: u32) -> V4Key {
        V4Key {
            addrs,
            ports,
            proto: Protocol::Tcp,
            hash: self.hash_v4_proto(addrs, Protocol::Tcp, ports),
        }
    }

    /// [`v4_key_tcp`](Self::v4_key_tcp) for UDP.
    #[inline(always)]
    pub fn v4_key_udp(&self, addrs: u64, ports: u32) -> V4Key {
        V4Key {
            addrs,
            ports,
            proto: Protocol::Udp,
            hash: self.hash_v4_proto(addrs, Protocol::Udp, ports),
        }
    }

    /// Asks the CPU for `k`'s home index slot (a hint: no effect on results).
    #[inline]
    pub fn prefetch_index_v4(&self, k: &V4Key) {
        self.index.prefetch(k.hash);
    }

    /// Asks the CPU for the entry `k`'s home index slot points to; call it some time after
    /// [`prefetch_index_v4`](Self::prefetch_index_v4) so the slot is there. A hint only.
    #[inline]
    pub fn prefetch_entry_v4(&self, k: &V4Key) {
        self.prefetch_entry_word(self.index.home_word(k.hash));
    }

    /// [`lookup_hit`](Self::lookup_hit) for an IPv4 key: the same flow, answered as a
    /// [`V4Hit`], unless it is a [`FLAG_SLOW`](super::FLAG_SLOW) one (`None`: see
    /// [`has_slow_flows`](Self::has_slow_flows)). Wait-free like [`lookup`](Self::lookup).
    #[inline(always)]
    pub fn lookup_v4(&self, k: &V4Key) -> Option<V4Hit> {
        // `Index::probe` spelled out over the probe window.
        for w in self.index.window(k.hash) {
            let w = w.load(Ordering::Acquire);
            // The tag first (the home slot's word usually is the flow's). A match is a live
            // word, or for a key whose tag is all zeros or all ones an EMPTY, TOMB or FROZEN
            // one, whose entry field `hit_v4`'s bounds check refuses: the probe goes on.
            if index::tag_matches(w, k.hash) {
                let (e, reply) = index::word_entry(w);
                if let Some(hit) = self.hit_v4(e, reply, k) {
                    return Some(hit);
                }
            } else if w == index::EMPTY || w == index::FROZEN {
                return None;
            }
        }
        None
    }

    /// [`hit`](Self::hit) for an IPv4 key.
    #[inline(always)]
    fn hit_v4(&self, e: u32, reply: bool, k: &V4Key) -> Option<V4Hit> {
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) {
            return None;
        }
        let r = usize::from(reply);
        let meta = entry.w[W_META].load(Ordering::Relaxed);
        let ids = entry.w[W_IDS].load(Ordering::Relaxed);
        // IPv4: client | vip << 32, backend | snat << 32 (an IPv6 entry fails the meta test).
        // Original: matched client -> vip, leaves as snat -> backend; reply: matched
        // backend -> snat, leaves as vip -> client.
        let key_addrs = entry.w[W_ADDR + r].load(Ordering::Relaxed);
        let out_addrs = entry.w[W_ADDR + 1 - r].load(Ordering::Relaxed);
        // Ports: the matched pair in the low half, the way out's in the high half.
        let ports = entry.w[W_PORTS]
            .load(Ordering::Relaxed)
            .rotate_left(32 * r as u32);
        let csum = entry.w[W_V4_CSUM].load(Ordering::Relaxed) >> (32 * r);
        // One test for the protocol and family, the ports and the addresses; and that the
        // flow is no `FLAG_SLOW` or `FLAG_ONE_WAY` one (meta bits 55 and 50, which no key
        // has).
        let differ = ((meta >> 32) & SHORTCUT_MASK ^ k.misc() >> 32)
            | u64::from(ports as u32 ^ k.ports)
            | (key_addrs ^ k.addrs);
        if differ != 0 {
            return None;
        }
        fence(Ordering::Acquire);
        let c2 = entry.w[W_CTL].load(Ordering::Relaxed);
        // Usually the same generation and status as `c1` (readable): one test then.
        if (c1 ^ c2) >> 40 != 0 && !(ctl_readable(c2) && ctl_gen(c2) == ctl_gen(c1)) {
            return None;
        }
        Some(V4Hit {
            // The stored pair is (destination, source) of the way out.
            out: out_addrs,
            ports: ((ports >> 32) as u32).rotate_left(16),
            csum_delta: csum as u32,
            flags: (meta >> 48) as u8,
            reply,
            entry: e,
            backend: (ids >> 32) as u32,
            ctl: c2,
        })
    }
    /// [`touch`](Self::touch) for a flow found by [`lookup_v4`](Self::lookup_v4).
    #[inline]
    pub fn touch_v4(
        &self,
        hit: &V4Hit,
        tcp_flags: TcpFlags,
        now: Tick,
        seq: impl FnOnce() -> u32,
    ) -> Option<FlowState> {
        // (A `FLAG_ONE_WAY` flow is never a `V4Hit`: its direction's rows are the usual.)
        self.touch_ctl(
            hit.entry,
            usize::from(hit.reply),
            hit.backend,
            hit.ctl,
            tcp_flags,
            now,
            seq,
        )
    }

    /// [`insert`](Self::insert) for an IPv4 flow, for a worker whose [`lookup_v4`]
    /// of `flow.original` just missed: the same entry, index words, counts and errors, but
    /// without building `FlowKey`s and without looking the original tuple up again first (a
    /// flow inserted meanwhile is still found, as [`InsertError::Exists`], by the index
    /// insert). [`insert_v4_begin`](Self::insert_v4_begin) then
    /// [`insert_v4_finish`](Self::insert_v4_finish).
    ///
    /// [`lookup_v4`]: Self::lookup_v4
    #[inline]
    pub fn insert_v4(
        &self,
        flow: &V4Flow,
        tcp_flags: TcpFlags,
        now: Tick,
    ) -> Result<FlowHandle, InsertError> {
        let p = self.insert_v4_begin(flow, tcp_flags, now)?;
        self.insert_v4_finish(p)
    }

    /// The first half of [`insert_v4`](Self::insert_v4): takes an entry, writes the flow and
    /// indexes its original tuple, and asks the CPU for the reply tuple's index slot. The
    /// flow is visible to lookups of its original tuple from here on (INSERTING, like any
    /// flow being inserted by another worker), not yet to its reply tuple, and no one can
    /// remove it: the caller must pass the [`PendingV4`] to
    /// [`insert_v4_finish`](Self::insert_v4_finish), soon (a worker does before its batch
    /// ends). In between it may do anything else, other inserts included: meanwhile the
    /// reply slot's cache miss resolves.
    ///
    /// Errors: [`InsertError::Exists`] (the original tuple is taken), `Full`, `IndexFull`,
    /// `Invalid`; never `ReplyInUse` (that is `insert_v4_finish`'s to say).
    ///
    /// Inlined into its caller (a worker's new-flow stage), with its index insert: called, its
    /// arguments, the pending insert it returns and its spills went through memory (with
    /// the index inserts inlined: `benches/callgrind.sh --mix syn` 1,041.2 to 964.7
    /// instructions a SYN frame by frame).
    #[inline(always)]
    pub fn insert_v4_begin(
        &self,
        flow: &V4Flow,
        tcp_flags: TcpFlags,
        now: Tick,
    ) -> Result<PendingV4, InsertError> {
        let (o, r) = (&flow.original, &flow.reply);
        self.index.prefetch(r.hash);
        if flow.backend_id.0 as usize >= self.backends.len() {
            return Err(InsertError::Invalid("backend id >= backends_max"));
        }
        if o.proto != r.proto {
            return Err(InsertError::Invalid("tuples of different protocols"));
        }
        if o.addrs == r.addrs && o.ports == r.ports {
            return Err(InsertError::Invalid("original and reply tuples are equal"));
        }
        let Some(e) = self.alloc(o.hash, now.0, |_| {}) else {
            self.counters.0.full.fetch_add(1, Ordering::Relaxed);
            return Err(InsertError::Full);
        };
        let code = self.initial_code(o.proto, tcp_flags);
        let (gen_, csum) = self.write_entry_v4(e, flow, code, now.0);
        // Same-key tests only run on tag matches (rare): the generic comparison will do.
        self.publish_original(
            e,
            flow.backend_id.0,
            code,
            (o.hash, |w| self.same_key(w, &o.key())),
        )?;
        Ok(PendingV4 {
            entry: e,
            backend: flow.backend_id.0,
            gen_csum: gen_ | u64::from(csum) << 32,
            original_hash: o.hash,
            reply_hash: r.hash,
        })
    }

    /// The second half of [`insert_v4`](Self::insert_v4): indexes the reply tuple and makes
    /// the flow LIVE, or (with [`InsertError::ReplyInUse`] or `IndexFull`) withdraws and
    /// frees it.
    #[inline]
    pub fn insert_v4_finish(&self, p: PendingV4) -> Result<FlowHandle, InsertError> {
        self.publish_reply(
            p.entry,
            p.gen_(),
            p.backend,
            p.original_hash,
            (p.reply_hash, |w| {
                self.same_key(w, &self.reply_key_v4(p.entry))
            }),
        )
    }

    /// The reply tuple of IPv4 entry `e`, which the caller owns (INSERTING, its insert's):
    /// its data words do not change.
    #[cold]
    fn reply_key_v4(&self, e: u32) -> FlowKey {
        let addrs = v4_addrs_be(self.word(e, W_ADDR + 1));
        let ports = ports4_be(self.word(e, W_PORTS)) >> 32;
        let proto = Protocol::from_ip_proto((self.word(e, W_META) >> 32) as u8);
        FlowKey::v4_bits(
            proto.unwrap_or(Protocol::Tcp),
            addrs as u32,
            ports as u16,
            (addrs >> 32) as u32,
            (ports >> 16) as u16,
        )
    }

    /// [`write_entry`](Self::write_entry) for a [`V4Flow`]: the same words. Returns the
    /// generation and the original direction's checksum delta.
    #[inline(always)]
    fn write_entry_v4(&self, e: u32, f: &V4Flow, state: u8, t: u32) -> (u64, u32) {
        self.saw_flags(f.flags);
        let entry = &self.entries[e as usize];
        let old = entry.w[W_CTL].load(Ordering::Relaxed);
        let gen_ = (ctl_gen(old) + 1) & GEN_MASK;
        // As in `write_entry`: readers that see a store below see the old FREE word too.
        fence(Ordering::Release);
        let (o, r) = (&f.original, &f.reply);
        let set = |w: usize, v: u64| entry.w[w].store(v, Ordering::Relaxed);
        // client | vip << 32 and backend | snat << 32: the keys' own packing (network order).
        set(W_ADDR, o.addrs);
        set(W_ADDR + 1, r.addrs);
        let csum = v4_csum_deltas((o.addrs, o.ports), (r.addrs, r.ports));
        set(W_V4_CSUM, csum);
        set(W_PORTS, u64::from(o.ports) | u64::from(r.ports) << 32);
        set(
            W_IDS,
            u64::from(f.service_id) | u64::from(f.backend_id.0) << 32,
        );
        set(
            W_META,
            u64::from(f.snapshot_gen) | u64::from(o.proto as u8) << 32 | u64::from(f.flags) << 48,
        );
        let new = ctl(gen_, ST_INSERTING, state, t);
        debug_transition!(old, new);
        entry.w[W_CTL].store(new, Ordering::Release);
        (gen_, csum as u32)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Both deltas, each in full and forwarded: what `v4_csum_deltas` must equal.
    fn full((oa, op): (u64, u32), (ra, rp): (u64, u32)) -> u64 {
        let original = v4_csum_delta_be((oa, op), (ra.rotate_left(32), rp.rotate_left(16)));
        let reply = v4_csum_delta_be((ra, rp), (oa.rotate_left(32), op.rotate_left(16)));
        u64::from(v4_forward_delta(original)) | u64::from(v4_forward_delta(reply)) << 32
    }

    /// The checksum adjustment as computed on host-order words (the definition before the
    /// entries held network order): the one `v4_csum_delta_be` must equal, byte-swapped words
    /// in, network-order halves out.
    fn host_order_delta(from: (u64, u32), to: (u64, u32)) -> u32 {
        let term =
            |o: u32, n: u32| (u64::from(!o) + u64::from(n)) & u64::from(o != n).wrapping_neg();
        let ip =
            term(from.0 as u32, to.0 as u32) + term((from.0 >> 32) as u32, (to.0 >> 32) as u32);
        let l4 = ip + u64::from(!from.1) + u64::from(to.1);
        u32::from(fold16(ip).to_be()) | u32::from(fold16(l4).to_be()) << 16
    }

    #[test]
    fn network_order_words_are_the_frame_bytes() {
        let mut frame = [0u8; 12];
        frame[..8].copy_from_slice(&[198, 18, 0, 1, 198, 18, 100, 1]);
        frame[8..].copy_from_slice(&[0x04, 0x00, 0x00, 0x50]);
        let host = u64::from(u32::from_be_bytes([198, 18, 0, 1]))
            | u64::from(u32::from_be_bytes([198, 18, 100, 1])) << 32;
        let addrs = v4_wire_word(u64::from_ne_bytes(frame[..8].try_into().unwrap()), 32);
        assert_eq!(addrs, v4_addrs_be(host));
        assert_eq!(v4_addrs_be(addrs), host);
        let ports = u32::from_ne_bytes(frame[8..].try_into().unwrap());
        let ports = v4_wire_word(u64::from(ports), 16) as u32;
        assert_eq!(v4_ports_be(ports), 1024 | 80 << 16);
        assert_eq!(
            ports4_be(u64::from(ports) | u64::from(ports) << 32),
            (1024 | 80 << 16) * 0x1_0000_0001
        );
    }

    /// The checksums' edge words (the zeros' two representations) through both orders.
    #[test]
    fn the_network_order_delta_is_the_host_order_one_at_the_edges() {
        for &a in &EDGES {
            for &b in &EDGES {
                for &p in &EDGES {
                    let (from, to) = ((u64::from(a) | u64::from(b) << 32, p), (u64::from(b), a));
                    let be = |(x, y): (u64, u32)| (v4_addrs_be(x), v4_ports_be(y));
                    assert_eq!(
                        v4_csum_delta_be(be(from), be(to)),
                        host_order_delta(from, to)
                    );
                    assert_eq!(v4_csum_delta(from, to), host_order_delta(from, to));
                }
            }
        }
    }

    /// The words whose sums land on the two zeros: all-zero and all-one addresses and
    /// ports, and words that differ by one.
    const EDGES: [u32; 6] = [0, 0xffff_ffff, 1, 0xffff_fffe, 0xffff, 0xffff_0000];

    #[test]
    fn the_derived_reply_delta_is_the_full_one_at_the_edges() {
        let mut zeros = 0;
        for &a in &EDGES {
            for &b in &EDGES {
                for &p in &EDGES {
                    for &q in &EDGES {
                        let o = (u64::from(a) | u64::from(b) << 32, p);
                        let r = (u64::from(b) | u64::from(a) << 32, q);
                        let want = full(o, r);
                        // (The tuple's adjustment, before the TTL's term: the negation's edge.)
                        let tuple = v4_csum_delta_be(o, (r.0.rotate_left(32), r.1.rotate_left(16)));
                        zeros += usize::from(matches!(tuple as u16, 0 | 0xffff));
                        assert_eq!(v4_csum_deltas(o, r), want, "{o:x?} {r:x?}");
                        let r = (u64::from(a) | u64::from(a) << 32, q);
                        assert_eq!(v4_csum_deltas(o, r), full(o, r), "{o:x?} {r:x?}");
                    }
                }
            }
        }
        assert!(zeros > 0, "the edges reach the zeros");
    }

    /// Layout 5 leaves tags as the hash gives them: a key's tag may be all zeros (`EMPTY`'s)
    /// or all ones (`TOMB`'s and `FROZEN`'s). The shortcut still finds such keys' flows,
    /// and misses absent ones, with those special words in their windows, reading no entry
    /// out of bounds.
    #[test]
    fn keys_whose_tags_are_all_zeros_or_all_ones() {
        use crate::index::{FROZEN, TOMB};
        let now = std::time::Instant::now();
        let t = FlowTable::new(crate::FlowTableConfig::new(64, 2), now).unwrap();
        let forged = |k: V4Key, hash: u64| V4Key { hash, ..k };
        let (zero, ones) = (0x1_2345_6789, u64::MAX ^ 0x55);
        assert_eq!((zero >> 33, ones >> 33), (0, u64::MAX >> 33));
        let original = forged(t.v4_key_tcp(0x0100_12c6_0200_12c6, 0x5000_0004), zero);
        let reply = forged(t.v4_key_tcp(0x0300_12c6_0100_12c6, 0x0004_5000), ones);
        let absent = t.v4_key_tcp(0x0900_12c6_0200_12c6, 0x5000_0008);
        // A tombstone where the all-ones key's window starts (the insert reuses it).
        let last = t.index.len() - crate::index::MAX_PROBE - 1;
        assert_eq!((t.index.home(zero), t.index.home(ones)), (0, last));
        t.index.slots[last].store(TOMB, Ordering::SeqCst);
        let flow = V4Flow {
            original,
            reply,
            service_id: 1,
            backend_id: BackendId(1),
            snapshot_gen: 1,
            flags: 0,
        };
        let tick = t.tick(now);
        t.insert_v4(&flow, TcpFlags(TcpFlags::SYN.0), tick).unwrap();
        // Then a cleanup's frozen slot and a tombstone behind the flow's word.
        t.index.slots[last + 1].store(FROZEN, Ordering::SeqCst);
        t.index.slots[last + 2].store(TOMB, Ordering::SeqCst);
        let hit = t.lookup_v4(&original).expect("the all-zeros tag's flow");
        assert!(!hit.reply);
        let hit = t.lookup_v4(&reply).expect("the all-ones tag's flow");
        assert!(hit.reply);
        assert_eq!(t.lookup_v4(&forged(absent, zero ^ 1 << 20)), None);
        assert_eq!(t.lookup_v4(&forged(absent, ones ^ 1 << 20)), None);
    }

    proptest! {
        /// The protocol-constant keys are `v4_key`'s: the same tuple, protocol and hash
        /// (the hash's protocol term folded into a key of its own), under any seed.
        #[test]
        fn the_protocol_constant_keys_are_v4_keys(
            seed in any::<u64>(), addrs in any::<u64>(), ports in any::<u32>(),
        ) {
            let mut cfg = crate::FlowTableConfig::new(8, 2);
            cfg.hash_seed = seed;
            let t = FlowTable::new(cfg, std::time::Instant::now()).unwrap();
            prop_assert_eq!(t.v4_key_tcp(addrs, ports), t.v4_key(Protocol::Tcp, addrs, ports));
            prop_assert_eq!(t.v4_key_udp(addrs, ports), t.v4_key(Protocol::Udp, addrs, ports));
            prop_assert_ne!(
                t.v4_key_tcp(addrs, ports).hash(),
                t.v4_key_udp(addrs, ports).hash(),
                "the protocol is hashed"
            );
        }

        #[test]
        fn the_network_order_delta_is_the_host_order_one(
            fa in any::<u64>(), fp in any::<u32>(), ta in any::<u64>(), tp in any::<u32>(),
            same in 0..4u8,
        ) {
            // Unchanged addresses (no term) and ports as well as changed ones.
            let ta = match same {
                1 => fa,
                2 => fa & 0xffff_ffff | ta << 32,
                3 => ta & 0xffff_ffff | fa & !0xffff_ffff,
                _ => ta,
            };
            let (from, to) = ((fa, fp), (ta, tp));
            let be = |(x, y): (u64, u32)| (v4_addrs_be(x), v4_ports_be(y));
            prop_assert_eq!(v4_csum_delta_be(be(from), be(to)), host_order_delta(from, to));
            prop_assert_eq!(v4_csum_delta(from, to), host_order_delta(from, to));
        }

        #[test]
        fn the_derived_reply_delta_is_the_full_one(
            oa in any::<u64>(), op in any::<u32>(), ra in any::<u64>(), rp in any::<u32>(),
        ) {
            prop_assert_eq!(v4_csum_deltas((oa, op), (ra, rp)), full((oa, op), (ra, rp)));
        }
    }
}
