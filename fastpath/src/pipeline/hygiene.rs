//! Router hygiene: what a router would not forward, checked where xvs would otherwise
//! forward it, each with its own [`DropReason`].
//!
//! - **Martian sources** ([`martian`]): IPv4 0.0.0.0/8, 127.0.0.0/8, 224.0.0.0/4
//!   (multicast) and 240.0.0.0/4 (with 255.255.255.255); IPv6 `::`, `::1`, ff00::/8 and the
//!   IPv4-mapped ::ffff:0:0/96 → `MartianSource`.
//! - **Own sources**: a VIP of the snapshot or one of this pipeline's SNAT addresses →
//!   `OwnAddressSource`: such a frame is spoofed (xvs would answer itself).
//! - **Martian destinations** of ICMP errors xvs would translate (the outer destination is
//!   not what matched the flow; the same addresses) → `MartianDestination`.
//!
//! Where: the source checks run on the new-flow path (`schedule`, after the frontend matched,
//! before any side effect) and on ICMP errors that matched a flow. A flow hit needs none: its
//! tuple's source is a client that passed them when the flow was made, or a backend. So the
//! established fast path pays nothing. Frames for no frontend stay `Pass` (the kernel
//! decides), except at a ClusterIP or inside a Service CIDR (`reject`), where the same
//! source checks come first.
//!
//! - **Checksums** that xvs would recompute from scratch are verified first, so a corrupt
//!   input is dropped, never sent with a valid checksum: the SCTP CRC32c ([`sctp_crc_ok`],
//!   before the flow lookup; `BadSctpChecksum`), an ICMP/ICMPv6 error's checksum and the
//!   CRC32c of an SCTP packet it quotes whole (see `icmp::verify`). Everything else is updated
//!   incrementally (RFC 1624: TCP/UDP checksums, IPv4 header checksums, the quoted IPv4
//!   header and TCP/UDP checksums of ICMP errors), which keeps a wrong checksum wrong; the
//!   outer IPv4 header checksum was verified by `classify`.
//! - **Oversized fragments**: a later fragment whose datagram would reach past 65,535 bytes
//!   (IPv4: offset + total length; IPv6: the reassembled payload length) →
//!   `OversizedFragment`, before the fragment table is asked.

use std::net::IpAddr;

use super::classify::Packet;
use crate::wire::SctpPacket;

/// Largest IPv4 datagram (total length) and IPv6 payload.
pub(crate) const DATAGRAM_MAX: u32 = 65_535;

/// Whether an IPv4 source (`Ipv4Addr::to_bits`) is martian: 0/8, 127/8, 224/4 or 240/4.
#[inline(always)]
pub(crate) fn martian_v4(a: u32) -> bool {
    let top = a >> 24;
    top == 0 || top == 127 || top >= 224
}

/// Whether an IPv6 source (`Ipv6Addr::to_bits`) is martian: `::`, `::1`, ff00::/8 or
/// ::ffff:0:0/96.
#[inline(always)]
pub(crate) fn martian_v6(a: u128) -> bool {
    a <= 1 || a >> 120 == 0xff || a >> 32 == 0xffff
}

/// Whether `ip` may be neither the source of a forwarded packet nor the destination of a
/// forwarded unicast one ([`martian_v4`], [`martian_v6`]).
#[inline]
pub(crate) fn martian(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => martian_v4(a.to_bits()),
        IpAddr::V6(a) => martian_v6(a.to_bits()),
    }
}

/// Whether the SCTP packet of `p` (not fragmented, its common header present, as `classify`
/// checked) carries a correct CRC32c.
#[inline]
pub(crate) fn sctp_crc_ok(frame: &[u8], p: &Packet) -> bool {
    frame
        .get(p.l4..p.l4 + p.l4_len)
        .and_then(|seg| SctpPacket::new_checked(seg).ok())
        .is_some_and(|s| s.verify_checksum())
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn martian_addresses() {
        for s in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.255.255",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "ff02::1",
            "ff0e::1",
            "::ffff:198.18.0.1",
            "::ffff:0.0.0.0",
        ] {
            assert!(martian(s.parse().unwrap()), "{s}");
        }
        for s in [
            "1.0.0.0",
            "10.0.0.1",
            "126.255.255.255",
            "128.0.0.0",
            "198.18.0.1",
            "223.255.255.255",
            "::2",
            "2001:db8::1",
            "fe80::1",
            "fe00::1",
            "::fffe:1:1",
            "1::ffff:0:1",
            "64:ff9b::198.18.0.1",
        ] {
            assert!(!martian(s.parse().unwrap()), "{s}");
        }
        assert!(martian(IpAddr::V4(Ipv4Addr::BROADCAST)));
        assert!(martian(IpAddr::V6(Ipv6Addr::UNSPECIFIED)));
        assert!(martian(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    }
}
