//! The common case with fixed offsets: an untagged Ethernet frame carrying an unfragmented
//! IPv4 TCP or UDP packet without IP options, whose TTL allows forwarding it, of at least 40
//! bytes in a frame of at least 54 (a TCP header's room: shorter ones, UDP too, take the
//! general path).
//!
//! [`parse`] reads such a frame straight into a [`V4`] (addresses and ports packed the way a
//! [`flowtable::V4Key`] takes them, in network byte order: loaded as they are, flags, TTL) and answers `None` for everything else,
//! including every frame the general [`classify`](super::classify) would drop and every frame
//! with a TTL of 1 or 0: the pipeline then runs the general path, which gives the verdict. So for a frame `parse` accepts, `classify` would have produced the same
//! fields (`l3 = 14`, `l4 = 34`, `Frag::No`), and the fast path's output is byte for byte the
//! general path's. A `debug_assert!` checks the first claim on every frame `parse` accepts
//! (`invariants`); `tests/pipeline_equiv.rs` checks the second, running random frame
//! sequences through `process_frame`, `process_batch` and the general path alone
//! (`Pipeline::process_frame_general`) and comparing verdicts, bytes, counters and flows.
//!
//! After `parse` returns `Some`, the frame holds at least `34 + l4_len` bytes and the L4
//! header's fixed part lies within them.
//!
//! **The one fixed-offset exception.** Everywhere else the pipeline reads and writes frames
//! through the wire views (`crate::wire`). This file, and the rewrite it feeds
//! (`nat::rewrite_v4_delta`, which stores both addresses and both ports as one word each),
//! read fixed offsets with whole-word loads instead, because measured they are what makes
//! the common packet cheap: `benches/callgrind.sh` counted 248.5 instructions for an
//! established packet through this path against 949 through the general path (`--general`),
//! and 1,400 against 2,235 for a new flow's SYN (`--mix syn`), when both were measured
//! (docs/benchmarks.md; the shortcut is at 219.6 and 946.2 since).

use flowtable::{Protocol, v4_wire_word};

use super::classify::{PROTO_TCP, PROTO_UDP};
use crate::wire::checksum::add1c;
use crate::wire::read_u16;

/// Offset of the IPv4 header in an untagged frame.
pub(crate) const L3: usize = 14;
/// Offset of the L4 header behind an option-less IPv4 header.
pub(crate) const L4: usize = L3 + 20;
/// [`V4::csum_at`] of a TCP segment.
pub(crate) const TCP_CSUM_AT: u8 = (L4 + 16) as u8;
/// [`V4::csum_at`] of a UDP datagram.
pub(crate) const UDP_CSUM_AT: u8 = (L4 + 6) as u8;

/// What the fast path needs of a frame.
#[derive(Clone, Copy, Debug)]
pub(crate) struct V4 {
    /// Source | destination address << 32, each in network byte order
    /// ([`flowtable::v4_addrs_be`]), as a [`flowtable::V4Key`] packs them: the frame's bytes
    /// as loaded, compared with the flow's entry and written back without a byte swap.
    pub addrs: u64,
    /// Source port | destination port << 16, each in network byte order.
    pub ports: u32,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub proto: u8,
    /// The same, as the flow table's protocol.
    pub protocol: Protocol,
    /// TCP flags byte (0 for UDP).
    pub flags: u8,
    /// TTL (above 1).
    pub ttl: u8,
    /// Offset of the TCP/UDP checksum in the frame.
    pub csum_at: u8,
    /// The IPv4 total length (the packet's bytes, Ethernet padding excluded).
    pub ip_len: u16,
}

#[inline(always)]
fn bytes<const N: usize>(d: &[u8], at: usize) -> [u8; N] {
    let mut b = [0u8; N];
    b.copy_from_slice(&d[at..at + N]);
    b
}

/// Whether the 20-byte IPv4 header at [`L3`] sums to 0xffff (its checksum verifies): what
/// `checksum::checksum(header) == 0` says.
///
/// Sums the header as native-endian words (a one's complement sum does not depend on byte
/// order, and 0xffff reads the same both ways) in 64-bit one's complement, which keeps the
/// sum modulo 2^64 − 1, a multiple of 0xffff; and a 64-bit word is its four 16-bit words'
/// sum modulo 0xffff (2^16 ≡ 1). The folded 16-bit sum is 0xffff exactly when that sum is
/// a non-zero multiple of 0xffff; it is never zero (the first word holds the version), so
/// the test is divisibility, which compiles to one multiplication and one comparison
/// instead of the folds (`tests::checksum_test_is_the_fold`).
#[inline(always)]
fn header_checksum_ok(h: &[u8]) -> bool {
    let a = u64::from_ne_bytes(bytes(h, L3));
    let b = u64::from_ne_bytes(bytes(h, L3 + 8));
    let c = u32::from_ne_bytes(bytes(h, L3 + 16));
    add1c(add1c(a, b), u64::from(c)).is_multiple_of(0xffff)
}

/// The frame as a [`V4`], or `None` when it is anything but the common case (the general
/// path decides then).
#[inline(always)]
pub(crate) fn parse(frame: &[u8]) -> Option<V4> {
    // Room for a TCP header's fixed part, so that its data offset is read unchecked (a
    // shorter frame, a UDP one, takes the general path: the same verdict).
    if frame.len() < L4 + 20 {
        return None;
    }
    let h = &frame[..L4];
    // EtherType IPv4, version 4, IHL 5.
    if u16::from_be_bytes(bytes(h, 12)) != 0x0800 || h[L3] != 0x45 {
        return None;
    }
    let total = usize::from(read_u16(h, L3 + 2));
    // Not fragmented: MF clear, offset 0 (DF may be set).
    // (At least a TCP header's room behind the IP header: shorter packets, UDP or not, take
    // the general path, the same verdict.)
    if total < 40 || L3 + total > frame.len() || read_u16(h, L3 + 6) & 0x3fff != 0 {
        return None;
    }
    // TTL 1 or 0: the general path decides between passing and dropping it.
    if h[L3 + 8] <= 1 || !header_checksum_ok(h) {
        return None;
    }
    let l4_len = total - 20;
    let proto = h[L3 + 9];
    let (flags, protocol, csum_at) = match proto {
        PROTO_TCP => {
            // `off >= 20` and `off <= l4_len`, one unsigned comparison as `l4_len >= 20`.
            let off = usize::from(frame[L4 + 12] >> 4) * 4;
            if off.wrapping_sub(20) > l4_len.wrapping_sub(20) {
                return None;
            }
            (frame[L4 + 13], Protocol::Tcp, TCP_CSUM_AT)
        }
        PROTO_UDP => {
            let len = usize::from(read_u16(frame, L4 + 4));
            if len < 8 || len > l4_len {
                return None;
            }
            (0, Protocol::Udp, UDP_CSUM_AT)
        }
        _ => return None,
    };
    let v = V4 {
        // The frame's bytes as they are: a plain load on a little-endian machine.
        addrs: v4_wire_word(u64::from_ne_bytes(bytes(h, L3 + 12)), 32),
        ports: v4_wire_word(u64::from(u32::from_ne_bytes(bytes(frame, L4))), 16) as u32,
        proto,
        protocol,
        flags,
        ttl: h[L3 + 8],
        csum_at,
        ip_len: total as u16,
    };
    debug_assert!(
        super::invariants::parse_agrees(frame, &v),
        "fast::parse and classify disagree: {v:?} {frame:02x?}"
    );
    Some(v)
}

/// The IPv4 total length of a frame `parse` accepted: the packet's bytes (Ethernet padding
/// excluded); 0 for a frame too short to hold it.
#[inline(always)]
pub(crate) fn ip_len(frame: &[u8]) -> u16 {
    match frame.get(L3 + 2..L3 + 4) {
        Some(b) => u16::from_be_bytes([b[0], b[1]]),
        None => 0,
    }
}

impl V4 {
    /// The `V4` [`parse`] gave for `frame` (unchanged since), from its packed tuple and the
    /// other fields' fixed offsets.
    #[inline]
    pub(crate) fn reread(frame: &[u8], addrs: u64, ports: u32) -> V4 {
        let at = |i: usize| frame.get(i).copied().unwrap_or(0);
        let proto = at(L3 + 9);
        let (flags, protocol) = if proto == PROTO_TCP {
            (at(L4 + 13), Protocol::Tcp)
        } else {
            (0, Protocol::Udp)
        };
        V4 {
            addrs,
            ports,
            proto,
            protocol,
            flags,
            ttl: at(L3 + 8),
            csum_at: super::nat::l4_csum_at(L4, proto) as u8,
            ip_len: u16::from_be_bytes([at(L3 + 2), at(L3 + 3)]),
        }
    }

    /// Source address (`Ipv4Addr::to_bits`: host order).
    #[inline(always)]
    pub(crate) fn src(&self) -> u32 {
        u32::from_be(self.addrs as u32)
    }

    /// Destination address (host order).
    #[inline(always)]
    pub(crate) fn dst(&self) -> u32 {
        u32::from_be((self.addrs >> 32) as u32)
    }

    /// Source port (host order).
    #[inline(always)]
    pub(crate) fn sport(&self) -> u16 {
        u16::from_be(self.ports as u16)
    }

    /// Destination port (host order).
    #[inline(always)]
    pub(crate) fn dport(&self) -> u16 {
        u16::from_be((self.ports >> 16) as u16)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::wire::checksum;

    /// A TCP segment takes the fast path exactly when its packet holds a TCP header's room
    /// (40 bytes) and its data offset is at least 20 and within the packet (one unsigned
    /// comparison tests both): every total length and data offset around the edges.
    #[test]
    fn tcp_lengths_and_data_offsets_at_the_edges() {
        for total in 20..=70usize {
            for doff in 0..16u8 {
                let mut f = [0u8; 90];
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[L3] = 0x45;
                f[L3 + 2..L3 + 4].copy_from_slice(&(total as u16).to_be_bytes());
                f[L3 + 8] = 64;
                f[L3 + 9] = PROTO_TCP;
                f[L3 + 12..L3 + 20].copy_from_slice(&[198, 18, 0, 1, 198, 18, 100, 1]);
                let c = checksum::checksum(&f[L3..L4]);
                f[L3 + 10..L3 + 12].copy_from_slice(&c.to_be_bytes());
                f[L4 + 12] = doff << 4;
                let off = usize::from(doff) * 4;
                let want = total >= 40 && off >= 20 && off <= total - 20;
                assert_eq!(
                    parse(&f[..L3 + total.max(40)]).is_some(),
                    want,
                    "total {total}, data offset {doff}"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(50_000))]

        /// `header_checksum_ok` agrees with the RFC 1071 sum on any header with version 4 and
        /// IHL 5 (what `parse` calls it on), the checksum field set right, wrong, or to an
        /// edge value.
        #[test]
        fn checksum_test_is_the_fold(
            mut header in any::<[u8; 20]>(),
            fix in any::<bool>(),
            edge in prop_oneof![Just(None), Just(Some(0u16)), Just(Some(0xffff)), Just(Some(1))],
        ) {
            header[0] = 0x45;
            if fix {
                header[10..12].fill(0);
                let c = checksum::checksum(&header);
                header[10..12].copy_from_slice(&c.to_be_bytes());
            }
            if let Some(e) = edge {
                header[10..12].copy_from_slice(&e.to_be_bytes());
            }
            let mut frame = [0u8; L4];
            frame[L3..].copy_from_slice(&header);
            prop_assert_eq!(header_checksum_ok(&frame), checksum::checksum(&header) == 0);
        }
    }
}
