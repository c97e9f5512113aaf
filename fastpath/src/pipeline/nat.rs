//! Stage 3: the header rewrite, both directions, with incremental checksums (RFC 1624).
//!
//! A flow has four endpoints (client, VIP, backend, SNAT; in `nat` mode SNAT = client). A
//! packet in the original direction arrives as client → VIP and leaves as SNAT → backend; a
//! reply arrives as backend → SNAT and leaves as VIP → client. [`after`] gives the outgoing
//! endpoints, [`rewrite`] applies them: MACs, TTL, addresses, ports, and every checksum that
//! covers a changed field (IPv4 header; TCP/UDP through the pseudo-header and ports; SCTP's
//! CRC32c recomputed). Only fields that change are touched.

use std::net::{IpAddr, SocketAddr};

use flowtable::{Direction, FlowData};

use super::classify::{Frag, PROTO_SCTP, PROTO_TCP, PROTO_UDP, Packet};
use crate::wire::checksum;

/// Where a packet goes after translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Endpoints {
    /// New source address and port.
    pub src: SocketAddr,
    /// New destination address and port.
    pub dst: SocketAddr,
}

/// The outgoing endpoints of a packet of `flow` travelling in `dir`.
#[inline]
pub(crate) fn after(flow: &FlowData, dir: Direction) -> Endpoints {
    match dir {
        Direction::Original => Endpoints {
            src: flow.snat,
            dst: flow.backend,
        },
        Direction::Reply => Endpoints {
            src: flow.vip,
            dst: flow.client,
        },
    }
}

/// Address bytes (4 or 16) in a stack buffer.
#[derive(Clone, Copy)]
pub(crate) struct AddrBytes {
    buf: [u8; 16],
    len: usize,
}

impl AddrBytes {
    #[inline]
    pub fn new(ip: IpAddr) -> Self {
        let mut buf = [0u8; 16];
        let len = match ip {
            IpAddr::V4(v4) => {
                buf[..4].copy_from_slice(&v4.octets());
                4
            }
            IpAddr::V6(v6) => {
                buf = v6.octets();
                16
            }
        };
        AddrBytes { buf, len }
    }

    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A one's-complement accumulator for an incremental checksum update (RFC 1624 eq. 3):
/// start from the old checksum, feed every changed 16-bit word, finish.
#[derive(Clone, Copy)]
pub(crate) struct Delta(u64);

impl Delta {
    #[inline]
    pub fn new() -> Self {
        Delta(0)
    }

    #[inline]
    pub fn word(&mut self, old: u16, new: u16) {
        self.0 += u64::from(!old) + u64::from(new);
    }

    #[inline]
    pub fn bytes(&mut self, old: &[u8], new: &[u8]) {
        for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
            self.word(
                u16::from_be_bytes([o[0], o[1]]),
                u16::from_be_bytes([n[0], n[1]]),
            );
        }
    }

    /// The updated checksum.
    #[inline]
    pub fn apply(self, csum: u16) -> u16 {
        // The sums here stay far below 2^48 (a few dozen 17-bit terms); four folds then
        // reach 16 bits for any such value, the same result as folding until it fits.
        let mut acc = u64::from(!csum) + self.0;
        debug_assert!(acc < 1 << 48);
        acc = (acc & 0xffff_ffff) + (acc >> 32);
        acc = (acc & 0xffff) + (acc >> 16);
        acc = (acc & 0xffff) + (acc >> 16);
        acc = (acc & 0xffff) + (acc >> 16);
        !(acc as u16)
    }
}

#[inline(always)]
pub(crate) fn be16(d: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([d[at], d[at + 1]])
}

#[inline(always)]
pub(crate) fn put16(d: &mut [u8], at: usize, v: u16) {
    d[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes an address with a fixed-size copy (a variable-length one becomes a `memcpy` call).
#[inline(always)]
pub(crate) fn write_addr(frame: &mut [u8], at: usize, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => frame[at..at + 4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => frame[at..at + 16].copy_from_slice(&v6.octets()),
    }
}

/// Rewrites `frame` (classified as `p`) to leave as `to`: MACs, TTL − 1, addresses, and (when
/// the packet carries its L4 header) ports, with every checksum kept valid. Ports of `to` are
/// ignored for later fragments. The caller checked `p.ttl > 1`.
#[inline]
pub(crate) fn rewrite(
    frame: &mut [u8],
    p: &Packet,
    to: &Endpoints,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
) {
    frame[0..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&src_mac);
    let l3 = p.l3;
    let old_src = AddrBytes::new(p.src);
    let old_dst = AddrBytes::new(p.dst);
    let new_src = AddrBytes::new(to.src.ip());
    let new_dst = AddrBytes::new(to.dst.ip());
    let src_changed = p.src != to.src.ip();
    let dst_changed = p.dst != to.dst.ip();
    let (src_at, dst_at) = if p.v6 {
        frame[l3 + 7] = p.ttl - 1;
        (l3 + 8, l3 + 24)
    } else {
        let mut ip = Delta::new();
        let old_word = be16(frame, l3 + 8);
        frame[l3 + 8] = p.ttl - 1;
        ip.word(old_word, be16(frame, l3 + 8));
        if src_changed {
            ip.bytes(old_src.as_slice(), new_src.as_slice());
        }
        if dst_changed {
            ip.bytes(old_dst.as_slice(), new_dst.as_slice());
        }
        let c = ip.apply(be16(frame, l3 + 10));
        put16(frame, l3 + 10, c);
        (l3 + 12, l3 + 16)
    };
    if src_changed {
        write_addr(frame, src_at, to.src.ip());
    }
    if dst_changed {
        write_addr(frame, dst_at, to.dst.ip());
    }
    if !p.has_l4() {
        return;
    }
    let l4 = p.l4;
    let csum_at = match p.proto {
        PROTO_TCP => l4 + 16,
        PROTO_UDP => l4 + 6,
        PROTO_SCTP => {
            put16(frame, l4, to.src.port());
            put16(frame, l4 + 2, to.dst.port());
            if p.frag == Frag::No {
                let seg = &mut frame[l4..l4 + p.l4_len];
                seg[8..12].fill(0);
                let crc = crc32c::crc32c(seg);
                seg[8..12].copy_from_slice(&crc.to_le_bytes());
            }
            return;
        }
        _ => return,
    };
    let mut d = Delta::new();
    if src_changed {
        d.bytes(old_src.as_slice(), new_src.as_slice());
    }
    if dst_changed {
        d.bytes(old_dst.as_slice(), new_dst.as_slice());
    }
    d.word(p.sport, to.src.port());
    d.word(p.dport, to.dst.port());
    put16(frame, l4, to.src.port());
    put16(frame, l4 + 2, to.dst.port());
    let old = be16(frame, csum_at);
    let new = if p.proto == PROTO_UDP {
        // A zero UDP checksum (IPv4: "none") stays zero; a computed zero is sent as 0xffff.
        if old == 0 {
            0
        } else {
            checksum::udp_nonzero(d.apply(old))
        }
    } else {
        d.apply(old)
    };
    put16(frame, csum_at, new);
}

/// The fields of an unfragmented IPv4 TCP/UDP packet that [`rewrite_v4`] needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct V4Header {
    /// Offset of the IPv4 header.
    pub l3: usize,
    /// Offset of the L4 header.
    pub l4: usize,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub proto: u8,
    /// TTL (> 1).
    pub ttl: u8,
    /// Source address and port as received.
    pub src: (u32, u16),
    /// Destination address and port as received.
    pub dst: (u32, u16),
}

impl V4Header {
    /// From a classified packet (`p.v6` false, `p.frag == Frag::No`, TCP or UDP).
    #[inline(always)]
    pub fn of(p: &Packet, src: u32, dst: u32) -> Self {
        debug_assert!(
            !p.v6 && p.frag == Frag::No && (p.proto == PROTO_TCP || p.proto == PROTO_UDP)
        );
        V4Header {
            l3: p.l3,
            l4: p.l4,
            proto: p.proto,
            ttl: p.ttl,
            src: (src, p.sport),
            dst: (dst, p.dport),
        }
    }
}

/// [`rewrite`] for the common case, an unfragmented IPv4 TCP or UDP packet, from raw IPv4
/// addresses. Byte for byte the same result as `rewrite` (the same words enter the same
/// checksum sums), without building `IpAddr`s.
#[inline(always)]
pub(crate) fn rewrite_v4(
    frame: &mut [u8],
    h: &V4Header,
    (src, sport): (u32, u16),
    (dst, dport): (u32, u16),
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
) {
    frame[0..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&src_mac);
    let l3 = h.l3;
    let (old_src, old_sport) = h.src;
    let (old_dst, old_dport) = h.dst;
    let src_changed = old_src != src;
    let dst_changed = old_dst != dst;
    // The address words both checksums take.
    let mut addrs = Delta::new();
    if src_changed {
        addrs.word((old_src >> 16) as u16, (src >> 16) as u16);
        addrs.word(old_src as u16, src as u16);
    }
    if dst_changed {
        addrs.word((old_dst >> 16) as u16, (dst >> 16) as u16);
        addrs.word(old_dst as u16, dst as u16);
    }
    let mut ip = addrs;
    // The TTL/protocol word loses 0x100.
    let old_word = u16::from(h.ttl) << 8 | u16::from(h.proto);
    frame[l3 + 8] = h.ttl - 1;
    ip.word(old_word, old_word - 0x100);
    let c = ip.apply(be16(frame, l3 + 10));
    put16(frame, l3 + 10, c);
    if src_changed {
        frame[l3 + 12..l3 + 16].copy_from_slice(&src.to_be_bytes());
    }
    if dst_changed {
        frame[l3 + 16..l3 + 20].copy_from_slice(&dst.to_be_bytes());
    }
    let l4 = h.l4;
    let csum_at = if h.proto == PROTO_TCP {
        l4 + 16
    } else {
        l4 + 6
    };
    let mut d = addrs;
    d.word(old_sport, sport);
    d.word(old_dport, dport);
    put16(frame, l4, sport);
    put16(frame, l4 + 2, dport);
    let old = be16(frame, csum_at);
    let new = if h.proto == PROTO_UDP {
        if old == 0 {
            0
        } else {
            checksum::udp_nonzero(d.apply(old))
        }
    } else {
        d.apply(old)
    };
    put16(frame, csum_at, new);
}
