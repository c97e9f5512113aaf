//! The common case with fixed offsets: an untagged Ethernet frame carrying an unfragmented
//! IPv4 TCP or UDP packet without IP options.
//!
//! [`parse`] reads such a frame straight into a [`V4`] (raw `u32` addresses, ports, flags,
//! TTL) and answers `None` for everything else, including every frame the general
//! [`classify`](super::classify) would drop: the pipeline then runs the general path, which
//! gives the verdict. So for a frame `parse` accepts, `classify` would have produced the same
//! fields (`l3 = 14`, `l4 = 34`, `Frag::No`), and the fast path's output is byte for byte the
//! general path's.
//!
//! After `parse` returns `Some`, the frame holds at least `34 + l4_len` bytes and the L4
//! header's fixed part lies within them.

use std::net::{IpAddr, Ipv4Addr};

use flowtable::{FlowKey, Protocol};

use super::classify::{Frag, PROTO_TCP, PROTO_UDP, Packet};

/// Offset of the IPv4 header in an untagged frame.
pub(crate) const L3: usize = 14;
/// Offset of the L4 header behind an option-less IPv4 header.
pub(crate) const L4: usize = L3 + 20;

/// What the fast path needs of a frame.
#[derive(Clone, Copy, Debug)]
pub(crate) struct V4 {
    /// Source address (`Ipv4Addr::to_bits` order).
    pub src: u32,
    /// Destination address.
    pub dst: u32,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// L4 bytes (IP total length − 20).
    pub l4_len: u16,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub proto: u8,
    /// TCP flags byte (0 for UDP).
    pub flags: u8,
    /// TTL.
    pub ttl: u8,
}

#[inline(always)]
fn be16(d: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([d[at], d[at + 1]])
}

#[inline(always)]
fn be32(d: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]])
}

/// Whether the 20-byte IPv4 header at [`L3`] sums to 0xffff (its checksum verifies): what
/// `checksum::checksum(header) == 0` says, from five 32-bit words with a fixed number of
/// folds (any positive total folds to the same 16-bit value however it was grouped).
#[inline(always)]
fn header_checksum_ok(h: &[u8]) -> bool {
    let mut acc = 0u64;
    for i in 0..5 {
        acc += u64::from(be32(h, L3 + 4 * i));
    }
    // acc < 5 * 2^32.
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc == 0xffff
}

/// The frame as a [`V4`], or `None` when it is anything but the common case (the general
/// path decides then).
#[inline(always)]
pub(crate) fn parse(frame: &[u8]) -> Option<V4> {
    if frame.len() < L4 + 8 {
        return None;
    }
    let h = &frame[..L4];
    // EtherType IPv4, version 4, IHL 5.
    if h[12] != 0x08 || h[13] != 0x00 || h[L3] != 0x45 {
        return None;
    }
    let total = usize::from(be16(h, L3 + 2));
    // Not fragmented: MF clear, offset 0 (DF may be set).
    if total < 20 || L3 + total > frame.len() || be16(h, L3 + 6) & 0x3fff != 0 {
        return None;
    }
    if !header_checksum_ok(h) {
        return None;
    }
    let l4_len = total - 20;
    let proto = h[L3 + 9];
    let flags = match proto {
        PROTO_TCP => {
            if l4_len < 20 {
                return None;
            }
            let off = usize::from(frame[L4 + 12] >> 4) * 4;
            if off < 20 || off > l4_len {
                return None;
            }
            frame[L4 + 13]
        }
        PROTO_UDP => {
            let len = usize::from(be16(frame, L4 + 4));
            if l4_len < 8 || len < 8 || len > l4_len {
                return None;
            }
            0
        }
        _ => return None,
    };
    Some(V4 {
        src: be32(h, L3 + 12),
        dst: be32(h, L3 + 16),
        sport: be16(frame, L4),
        dport: be16(frame, L4 + 2),
        l4_len: l4_len as u16,
        proto,
        flags,
        ttl: h[L3 + 8],
    })
}

impl V4 {
    /// The packet's own tuple.
    #[inline(always)]
    pub(crate) fn key(&self) -> FlowKey {
        let proto = if self.proto == PROTO_TCP {
            Protocol::Tcp
        } else {
            Protocol::Udp
        };
        FlowKey::v4_bits(proto, self.src, self.sport, self.dst, self.dport)
    }

    /// What [`classify`](super::classify::classify) gives for this frame (for the paths
    /// beyond the established one).
    #[inline]
    pub(crate) fn packet(&self) -> Packet {
        Packet {
            l3: L3,
            l4: L4,
            l4_len: usize::from(self.l4_len),
            v6: false,
            proto: self.proto,
            src: IpAddr::V4(Ipv4Addr::from_bits(self.src)),
            dst: IpAddr::V4(Ipv4Addr::from_bits(self.dst)),
            sport: self.sport,
            dport: self.dport,
            flags: self.flags,
            ttl: self.ttl,
            frag: Frag::No,
        }
    }
}
