//! Direct server return: a DSR service's packets reach the backend unchanged (addresses,
//! ports, TTL: the client's packet to the VIP), encapsulated, and the backend answers the
//! client directly, so nothing comes back through xvs.
//!
//! # Contract
//!
//! - **Flows.** A DSR flow is a nat flow (its reply tuple backend → client, which never
//!   matches) marked [`FLAG_DSR`] (the flow table's `FLAG_ONE_WAY`: its TCP state follows
//!   IPVS's input-only rows, and the IPv4 shortcut's lookup leaves it to the general path)
//!   with its encapsulation in two more bits ([`flags`], [`encap_of`]): the flow keeps the
//!   encapsulation it was made with, through reloads, restarts and flow sync. The SYN proxy
//!   never takes a DSR service (it needs the replies).
//! - **Encapsulations** ([`Encap`]), the outer header's source from [`DsrSettings`], its
//!   destination the backend's address, its TTL (hop limit) 64, IPv4 DF copied from the inner packet and id 0, the
//!   inner TOS (traffic class) copied:
//!   - `ipip`: IPv4 in IPv4 (protocol 4), IPv6 in IPv6 (next header 41); 20 / 40 bytes;
//!   - `gue`: outer IP, then UDP to `gue_port` whose payload is the inner packet (GUE
//!     variant 1, Katran's layout); UDP source port from the flow's hash (49152-65535); UDP
//!     checksum 0 over IPv4 (RFC 768; Linux's fou/gue receive takes it), computed over IPv6
//!     (RFC 8200: a zero checksum is dropped by default); 28 / 48 bytes;
//!   - `l2` (IPVS's DR): only the MACs change (the backend's, the port's); the backend must
//!     be on the link: reached through a gateway, the packet is dropped
//!     (`DsrNotOnLink`).
//!
//!   The outer source: an address of `[dataplane] ipip_source_prefix` from the flow's hash
//!   (for flows of its family), else the node's address of the family. The flow's hash
//!   ([`flow_hash`]) is its original tuple's, the same on every node of a tier, so a flow keeps
//!   its outer source and port when it moves; its IPv6 flow label is the hash too.
//! - **Room.** `ipip` and `gue` make the frame longer: the packet's way out is decided, its
//!   flow touched, and the outer header kept ([`Pending`]); a caller with room
//!   (`process_frame`, `process_batch`) then writes it ([`Pipeline::encap_apply`]); without
//!   room (`process`) the packet is `Drop(EncapNoRoom)`. The Ethernet padding of a short
//!   frame is not carried.
//! - **MTU.** A packet longer than `[dataplane] dsr_mtu` once encapsulated is not
//!   forwarded: an IPv4 packet with DF and any IPv6 packet is answered with ICMP
//!   fragmentation needed (type 3 code 4) / ICMPv6 packet too big carrying `dsr_mtu` minus
//!   the encapsulation, built and rate-limited as the rejects are (`reject`,
//!   `RejectReason::PacketTooBig`); an IPv4 packet without DF, and an ICMP error xvs would
//!   forward, is dropped (`TooBig`). Checked before the flow is touched or made.
//! - **MSS clamp** (`[dataplane] dsr_mss_clamp`): a client SYN's MSS option above `dsr_mtu`
//!   minus the IP and TCP headers (20 + 20, IPv6 40 + 20) and the encapsulation is lowered
//!   to it, the TCP checksum updated. (It bounds the segments the backend sends the client,
//!   which do not pass here; the client's own segments are bounded by the backend's SYN-ACK,
//!   which xvs never sees: those that do not fit get the ICMP error above.)
//! - **ICMP errors** about a DSR flow (a router on the backend's way to the client telling
//!   the VIP a reply was too big, or the client unreachable) are sent on to the flow's
//!   backend unchanged, encapsulated as its packets (its stack, which sent the reply, is
//!   whom they concern), after the usual hygiene. **Later fragments** follow their first
//!   fragment's encapsulation (`frag`).
//! - **Passive health.** SYN-ACKs are never seen, so the SYN watch (SYNs sent without a
//!   SYN-ACK back, `passive`) cannot judge a DSR flow: its SYNs are not counted, and a DSR
//!   backend is judged by the active probes alone (and by the SYN watch through the
//!   non-DSR services it also serves).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use flowtable::{FLAG_ONE_WAY, FlowHit};
use vocab::{Encap, TcpFlags};

use super::classify::{Frag, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP, Packet};
use super::{DropReason, Pipeline, RejectReason, Verdict, frag, nat};
use crate::snapshot::NextHop;
use crate::wire::checksum;

/// Bit in `FlowData::flags`: a DSR flow (the flow table's `FLAG_ONE_WAY`).
pub const FLAG_DSR: u8 = FLAG_ONE_WAY;
/// Where a DSR flow's [`Encap::code`] sits in its flags.
const ENCAP_SHIFT: u32 = 3;
/// The flag bits of a DSR flow's encapsulation.
const ENCAP_BITS: u8 = 0b11 << ENCAP_SHIFT;
/// Every flag bit a DSR flow may carry.
pub const DSR_FLAGS: u8 = FLAG_DSR | ENCAP_BITS;

/// The flag bits of a DSR flow with `encap`.
#[inline]
pub fn flags(encap: Encap) -> u8 {
    FLAG_DSR | encap.code() << ENCAP_SHIFT
}

/// A flow's encapsulation, when its flags make it a DSR flow with a known one.
#[inline]
pub fn encap_of(flags: u8) -> Option<Encap> {
    if flags & FLAG_DSR == 0 {
        return None;
    }
    Encap::from_code((flags & ENCAP_BITS) >> ENCAP_SHIFT)
}

/// Bytes the encapsulation adds to a packet of the family (`v6`).
#[inline]
pub fn overhead(encap: Encap, v6: bool) -> usize {
    let ip = if v6 { 40 } else { 20 };
    match encap {
        Encap::Ipip => ip,
        Encap::Gue => ip + UDP_HDR,
        Encap::L2 => 0,
    }
}

/// The largest overhead: the outer header's buffer.
const HDR_MAX: usize = 48;
const UDP_HDR: usize = 8;
/// Outer TTL / hop limit.
const TTL: u8 = 64;
/// IP protocol numbers of the outer header.
const PROTO_IPIP: u8 = 4;
const PROTO_IPV6: u8 = 41;

/// The DSR settings of a pipeline (from `[dataplane]`; see [`crate::settings`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsrSettings {
    /// `gue_port`.
    pub gue_port: u16,
    /// The largest IP packet on the way to the backends, encapsulation included (`dsr_mtu`,
    /// or the interfaces').
    pub mtu: u16,
    /// `dsr_mss_clamp`.
    pub mss_clamp: bool,
    /// The outer source of IPv4 packets without a prefix (the node's address).
    pub source_v4: Option<Ipv4Addr>,
    /// The outer source of IPv6 packets without a prefix.
    pub source_v6: Option<Ipv6Addr>,
    /// `ipip_source_prefix`, when IPv4: network and length.
    pub prefix_v4: Option<(Ipv4Addr, u8)>,
    /// `ipip_source_prefix`, when IPv6.
    pub prefix_v6: Option<(Ipv6Addr, u8)>,
}

impl Default for DsrSettings {
    fn default() -> Self {
        DsrSettings {
            gue_port: config::DEFAULT_GUE_PORT,
            mtu: 1500,
            mss_clamp: true,
            source_v4: None,
            source_v6: None,
            prefix_v4: None,
            prefix_v6: None,
        }
    }
}

impl DsrSettings {
    /// The outer source address of a flow of the family (`v6`) whose hash is `hash`.
    pub fn outer_source(&self, v6: bool, hash: u32) -> Option<IpAddr> {
        if v6 {
            if let Some((net, len)) = self.prefix_v6 {
                let host = u128::MAX.checked_shr(u32::from(len)).unwrap_or(0);
                return Some(IpAddr::V6(Ipv6Addr::from_bits(
                    net.to_bits() | u128::from(hash) & host,
                )));
            }
            self.source_v6.map(IpAddr::V6)
        } else {
            if let Some((net, len)) = self.prefix_v4 {
                let host = u32::MAX.checked_shr(u32::from(len)).unwrap_or(0);
                return Some(IpAddr::V4(Ipv4Addr::from_bits(net.to_bits() | hash & host)));
            }
            self.source_v4.map(IpAddr::V4)
        }
    }
}

/// A flow's hash for its encapsulation (outer source in the prefix, GUE source port, IPv6
/// flow label): of its original tuple (client, client port, VIP, port, protocol), with no
/// per-node seed, so every node of a tier gives a flow the same.
pub fn flow_hash(client: IpAddr, client_port: u16, vip: IpAddr, port: u16, proto: u8) -> u32 {
    let fold = |a: IpAddr| match a {
        IpAddr::V4(a) => u64::from(a.to_bits()),
        IpAddr::V6(a) => {
            let b = a.to_bits();
            (b as u64) ^ ((b >> 64) as u64).rotate_left(29)
        }
    };
    let mut h = fold(client)
        ^ fold(vip).rotate_left(23)
        ^ u64::from(client_port) << 40
        ^ u64::from(port) << 24
        ^ u64::from(proto) << 56;
    // fmix64
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h as u32
}

/// The hash of packet `p` of a flow's original direction (client → VIP).
#[inline]
fn packet_hash(p: &Packet) -> u32 {
    flow_hash(p.src, p.sport, p.dst, p.dport, p.proto)
}

/// An encapsulation decided for a frame, for a caller with room to write
/// ([`Pipeline::encap_apply`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    /// Where the inner IP packet starts (the L2 header, VLAN tags included, stays).
    at: usize,
    /// Its length (Ethernet padding excluded).
    inner_len: usize,
    /// The outer header, `hdr_len` bytes of it.
    hdr: [u8; HDR_MAX],
    hdr_len: usize,
    /// The next hop's MACs, as the frame takes them.
    macs: [u8; 12],
    port: u16,
    /// A SYN's MSS to clamp: its TCP header's offset and the largest MSS.
    mss: Option<(usize, u16)>,
    /// IPv6 GUE: the UDP checksum to compute once the packet is in place.
    udp6: bool,
}

impl Pending {
    pub(super) const NONE: Pending = Pending {
        at: 0,
        inner_len: 0,
        hdr: [0; HDR_MAX],
        hdr_len: 0,
        macs: [0; 12],
        port: 0,
        mss: None,
        udp6: false,
    };
}

/// What a packet with an encapsulation [`Pending`] answers (callers with room write it;
/// without room it is the verdict).
pub(super) const ENCAP: Verdict = Verdict::Drop(DropReason::EncapNoRoom);

/// What `prepare_v4` answers the IPv4 shortcut for a DSR service, before any check or side
/// effect: the frame takes the general path from the start. (Never a verdict of
/// `schedule` otherwise: it transmits nothing.)
pub(super) const GENERAL: Verdict = Verdict::Tx(u16::MAX);

/// A DSR packet's way out, decided before its flow is touched or made.
#[derive(Clone, Copy, Debug)]
pub(super) struct Way {
    pub encap: Encap,
    pub backend: IpAddr,
    /// The outer source (unused for `l2`).
    src: IpAddr,
    nh: NextHop,
    /// The flow's hash ([`flow_hash`]).
    pub hash: u32,
}

impl Pipeline {
    /// The way out of packet `p` (in `frame`) of a DSR flow with `encap` to `backend`, whose
    /// hash is `hash`: `Err` is the packet's verdict (a too-big answer or drop, no outer
    /// source, no next hop, a backend off the link for `l2`).
    pub(super) fn dsr_way(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        (encap, backend): (Encap, IpAddr),
        hash: u32,
        now: Instant,
    ) -> Result<Way, Verdict> {
        let over = overhead(encap, p.v6);
        let mtu = usize::from(self.config.dsr.mtu);
        if p.ip_len() + over > mtu {
            return Err(self.too_big(frame, p, mtu.saturating_sub(over), now));
        }
        let src = match encap {
            Encap::L2 => backend,
            _ => self
                .config
                .dsr
                .outer_source(p.v6, hash)
                .ok_or(Verdict::Drop(DropReason::NoEncapSource))?,
        };
        let nh = self.next_hop(backend).ok_or(Verdict::Slow)?;
        if encap == Encap::L2 && !self.snapshot.on_link(backend) {
            return Err(Verdict::Drop(DropReason::DsrNotOnLink));
        }
        Ok(Way {
            encap,
            backend,
            src,
            nh,
            hash,
        })
    }

    /// A packet too big for the encapsulation (`mtu` left for it): a fragmentation-needed
    /// or packet-too-big answer (a reject), or a drop when none may be sent.
    #[cold]
    #[inline(never)]
    fn too_big(&mut self, frame: &mut [u8], p: &Packet, mtu: usize, now: Instant) -> Verdict {
        let df = p.v6 || frame.get(p.l3 + 6).is_some_and(|b| b & 0x40 != 0);
        if !df || p.proto == PROTO_ICMP || p.proto == PROTO_ICMPV6 {
            return Verdict::Drop(DropReason::TooBig);
        }
        self.rejects.too_big_mtu = mtu.min(usize::from(u16::MAX)) as u16;
        self.reject_in(frame, RejectReason::PacketTooBig, now)
    }

    /// A packet of a known DSR flow (`hit`, original direction); `touch`: its state change
    /// and time are recorded (not for a packet the state guard holds).
    pub(super) fn dsr_forward(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        hit: &FlowHit,
        now: Instant,
        touch: bool,
    ) -> Verdict {
        if p.ttl <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        let Some(encap) = encap_of(hit.flags) else {
            return Verdict::Drop(DropReason::NoBackend);
        };
        let way = match self.dsr_way(frame, p, (encap, hit.dst_ip()), packet_hash(p), now) {
            Ok(w) => w,
            Err(v) => return v,
        };
        if touch {
            let tick = self.tick(now);
            self.flows.touch(hit, TcpFlags(p.flags), tick, || {
                super::guard::word_at(frame, p.l4 + 4)
            });
        }
        self.traffic.packet(hit.backend_id(), false, p.ip_len());
        if let Frag::First(id) = p.frag {
            let key = frag::FragKey::new(p, id);
            self.frags
                .insert_dsr(key, way.backend, (encap, way.hash), now);
        }
        self.dsr_emit(frame, p, &way)
    }

    /// A later fragment whose first fragment went out by DSR (`encap`, `hash`) to `backend`.
    pub(super) fn dsr_fragment(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        backend: IpAddr,
        (encap, hash): (Encap, u32),
        now: Instant,
    ) -> Verdict {
        if p.ttl <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        let way = match self.dsr_way(frame, p, (encap, backend), hash, now) {
            Ok(w) => w,
            Err(v) => return v,
        };
        self.counters.fragments_forwarded += 1;
        self.dsr_emit(frame, p, &way)
    }

    /// The frame of packet `p` on its `way`: the MACs (and a SYN's MSS) in place for `l2`
    /// (`Tx`), else the outer header kept for [`encap_apply`](Self::encap_apply)
    /// ([`ENCAP`]).
    pub(super) fn dsr_emit(&mut self, frame: &mut [u8], p: &Packet, way: &Way) -> Verdict {
        let macs = nat::macs(way.nh.dst_mac, way.nh.src_mac.unwrap_or(self.config.mac));
        let mss = self.mss_target(p, way.encap);
        if way.encap == Encap::L2 {
            frame[..12].copy_from_slice(&macs);
            if let Some(m) = mss {
                clamp_mss(frame, m);
            }
            return Verdict::Tx(way.nh.port);
        }
        let e = &mut self.dsr.pending;
        *e = Pending {
            at: p.l3,
            inner_len: p.ip_len(),
            macs,
            port: way.nh.port,
            mss,
            ..Pending::NONE
        };
        e.hdr_len = outer_header(&mut e.hdr, frame, p, way, self.config.dsr.gue_port);
        e.udp6 = p.v6 && way.encap == Encap::Gue;
        ENCAP
    }

    /// A SYN's MSS clamp for `encap`, when `dsr_mss_clamp` is on: its TCP header's offset
    /// and the largest MSS that fits.
    fn mss_target(&self, p: &Packet, encap: Encap) -> Option<(usize, u16)> {
        let syn = TcpFlags(p.flags).contains(TcpFlags::SYN);
        if !self.config.dsr.mss_clamp || p.proto != PROTO_TCP || !syn || p.frag != Frag::No {
            return None;
        }
        let headers = if p.v6 { 40 + 20 } else { 20 + 20 };
        let mss = usize::from(self.config.dsr.mtu).checked_sub(headers + overhead(encap, p.v6))?;
        Some((p.l4, mss.min(usize::from(u16::MAX)) as u16))
    }

    /// Writes the [`Pending`] encapsulation into the frame `buf[..len]` (the rest of `buf`
    /// is room): its new length, or `None` when it does not fit (the frame is left as it
    /// came).
    pub(super) fn encap_apply(&mut self, buf: &mut [u8], len: usize) -> Option<usize> {
        let e = self.dsr.pending;
        let end = e.at + e.hdr_len + e.inner_len;
        if end > buf.len() || e.at + e.inner_len > len || e.at < 12 {
            return None;
        }
        if let Some(m) = e.mss {
            clamp_mss(&mut buf[..len], m);
        }
        buf.copy_within(e.at..e.at + e.inner_len, e.at + e.hdr_len);
        buf[e.at..e.at + e.hdr_len].copy_from_slice(&e.hdr[..e.hdr_len]);
        buf[..12].copy_from_slice(&e.macs);
        if e.udp6 {
            let ip = e.at;
            let udp = ip + 40;
            let (mut s, mut d) = ([0u8; 16], [0u8; 16]);
            s.copy_from_slice(&buf[ip + 8..ip + 24]);
            d.copy_from_slice(&buf[ip + 24..ip + 40]);
            let c = checksum::l4_checksum_v6(&s, &d, PROTO_UDP, &buf[udp..end]);
            buf[udp + 6..udp + 8].copy_from_slice(&checksum::udp_nonzero(c).to_be_bytes());
        }
        Some(end)
    }
}

/// Writes the outer header of packet `p` (in `frame`) on `way` into `hdr`; its length.
fn outer_header(
    hdr: &mut [u8; HDR_MAX],
    frame: &[u8],
    p: &Packet,
    way: &Way,
    gue_port: u16,
) -> usize {
    let gue = way.encap == Encap::Gue;
    let inner = p.ip_len();
    let udp_at;
    let len = match (way.src, way.backend) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let tos = frame.get(p.l3 + 1).copied().unwrap_or(0);
            let total = (20 + if gue { UDP_HDR } else { 0 } + inner) as u16;
            let proto = if gue { PROTO_UDP } else { PROTO_IPIP };
            let h = &mut hdr[..20];
            // DF as the inner packet has it (RFC 2003 3.1): path MTU discovery works end to end.
            let df = frame.get(p.l3 + 6).copied().unwrap_or(0) & 0x40;
            h.copy_from_slice(&[
                0x45, tos, 0, 0, 0, 0, df, 0, TTL, proto, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ]);
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let c = checksum::checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            udp_at = 20;
            20
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let b = |i: usize| frame.get(p.l3 + i).copied().unwrap_or(0);
            let tc = (b(0) & 0x0f) << 4 | b(1) >> 4;
            let label = way.hash & 0x000f_ffff;
            let plen = (if gue { UDP_HDR } else { 0 } + inner) as u16;
            let next = if gue { PROTO_UDP } else { PROTO_IPV6 };
            let h = &mut hdr[..40];
            h[0] = 0x60 | tc >> 4;
            h[1] = (tc & 0x0f) << 4 | (label >> 16) as u8;
            h[2..4].copy_from_slice(&(label as u16).to_be_bytes());
            h[4..6].copy_from_slice(&plen.to_be_bytes());
            h[6] = next;
            h[7] = TTL;
            h[8..24].copy_from_slice(&s.octets());
            h[24..40].copy_from_slice(&d.octets());
            udp_at = 40;
            40
        }
        // (A flow's addresses, and its family's outer source, are of one family.)
        _ => return 0,
    };
    if !gue {
        return len;
    }
    let sport = 0xc000 | (way.hash >> 16) as u16 & 0x3fff;
    let u = &mut hdr[udp_at..udp_at + UDP_HDR];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&gue_port.to_be_bytes());
    u[4..6].copy_from_slice(&((UDP_HDR + inner) as u16).to_be_bytes());
    u[6..8].fill(0);
    len + UDP_HDR
}

/// Lowers the MSS option of the TCP segment at `l4` of `frame` to `max` when it is above,
/// keeping the TCP checksum valid (RFC 1624); options are walked as the receiver would, and
/// a malformed list is left alone.
fn clamp_mss(frame: &mut [u8], (l4, max): (usize, u16)) {
    let Some(&off) = frame.get(l4 + 12) else {
        return;
    };
    let end = l4 + usize::from(off >> 4) * 4;
    if end > frame.len() {
        return;
    }
    let mut i = l4 + 20;
    while i < end {
        match frame[i] {
            0 => return,
            1 => i += 1,
            kind => {
                let Some(&n) = frame.get(i + 1) else { return };
                let n = usize::from(n);
                if n < 2 || i + n > end {
                    return;
                }
                if kind == 2 && n == 4 {
                    let old = u16::from_be_bytes([frame[i + 2], frame[i + 3]]);
                    if old <= max {
                        return;
                    }
                    frame[i + 2..i + 4].copy_from_slice(&max.to_be_bytes());
                    // An option at an odd offset from the header sums byte-swapped.
                    let (o, m) = if (i + 2 - l4) % 2 == 0 {
                        (old, max)
                    } else {
                        (old.swap_bytes(), max.swap_bytes())
                    };
                    let c = u16::from_be_bytes([frame[l4 + 16], frame[l4 + 17]]);
                    let c = checksum::update_u16(c, o, m);
                    frame[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
                    return;
                }
                i += n;
            }
        }
    }
}

/// The DSR state of a pipeline: the encapsulation last decided.
#[derive(Debug)]
pub(super) struct DsrState {
    pub(super) pending: Pending,
}

impl DsrState {
    pub(super) fn new() -> Self {
        DsrState {
            pending: Pending::NONE,
        }
    }

    /// The transmit port of the pending encapsulation.
    pub(super) fn pending_port(&self) -> u16 {
        self.pending.port
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_bits_round_trip() {
        for e in Encap::ALL {
            let f = flags(e);
            assert_eq!(f & !DSR_FLAGS, 0);
            assert_eq!(encap_of(f), Some(e));
            assert_eq!(encap_of(f | super::super::FLAG_PEER), Some(e));
        }
        assert_eq!(encap_of(0), None);
        assert_eq!(encap_of(ENCAP_BITS), None, "encap bits without the DSR bit");
        assert_eq!(encap_of(DSR_FLAGS), None, "code 3 is no encapsulation");
    }

    #[test]
    fn outer_sources_spread_over_the_prefix() {
        let mut s = DsrSettings {
            source_v4: Some(Ipv4Addr::new(198, 18, 0, 1)),
            ..DsrSettings::default()
        };
        assert_eq!(
            s.outer_source(false, 7),
            Some("198.18.0.1".parse().unwrap())
        );
        assert_eq!(s.outer_source(true, 7), None);
        s.prefix_v4 = Some((Ipv4Addr::new(198, 18, 200, 0), 24));
        s.prefix_v6 = Some(("2001:2:0:ff::".parse().unwrap(), 64));
        assert_eq!(
            s.outer_source(false, 0x1234_5678),
            Some("198.18.200.120".parse().unwrap())
        );
        assert_eq!(
            s.outer_source(true, 0x1234_5678),
            Some("2001:2:0:ff::1234:5678".parse().unwrap())
        );
        s.prefix_v4 = Some((Ipv4Addr::new(198, 18, 200, 7), 32));
        assert_eq!(
            s.outer_source(false, u32::MAX),
            Some("198.18.200.7".parse().unwrap())
        );
        let c: IpAddr = "198.18.0.9".parse().unwrap();
        let v: IpAddr = "198.18.100.1".parse().unwrap();
        let hashes: std::collections::HashSet<u32> = (0..256)
            .map(|p| flow_hash(c, 40000 + p, v, 80, 6))
            .collect();
        assert_eq!(hashes.len(), 256, "client ports give distinct hashes");
        assert_eq!(flow_hash(c, 1, v, 80, 6), flow_hash(c, 1, v, 80, 6));
    }

    /// A SYN's MSS option, at an even and an odd offset: clamped, checksum kept valid
    /// (recomputed from scratch), others left alone.
    #[test]
    fn mss_clamp_keeps_the_checksum() {
        let src = [198, 18, 0, 9];
        let dst = [198, 18, 100, 1];
        for options in [
            vec![2u8, 4, 0x05, 0xb4, 1, 3, 3, 7], // MSS 1460, NOP, WS
            vec![1, 2, 4, 0x05, 0xb4, 3, 3, 7],   // NOP, MSS at an odd offset, WS
            vec![3, 3, 7, 2, 4, 0x23, 0x28, 0],   // WS, MSS 9000 at an odd offset
        ] {
            let mut tcp = vec![0u8; 20];
            tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
            tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
            tcp[12] = (((20 + options.len()) / 4) << 4) as u8;
            tcp[13] = 0x02;
            tcp.extend_from_slice(&options);
            let c = checksum::l4_checksum_v4(&src, &dst, 6, &tcp);
            tcp[16..18].copy_from_slice(&c.to_be_bytes());
            let mut f = tcp.clone();
            clamp_mss(&mut f, (0, 1400));
            assert_eq!(
                checksum::l4_checksum_v4(&src, &dst, 6, &f),
                0,
                "{options:?}"
            );
            let at = f[20..].windows(2).position(|w| w == [2, 4]).unwrap() + 22;
            assert_eq!(u16::from_be_bytes([f[at], f[at + 1]]), 1400, "{options:?}");
            // Below the clamp: untouched.
            let mut g = tcp.clone();
            clamp_mss(&mut g, (0, 9500));
            assert_eq!(g, tcp);
        }
        // A malformed list (length 0) is left alone.
        let mut bad = vec![0u8; 24];
        bad[12] = 6 << 4;
        bad[20..24].copy_from_slice(&[2, 0, 5, 0xb4]);
        let copy = bad.clone();
        clamp_mss(&mut bad, (0, 100));
        assert_eq!(bad, copy);
    }
}
