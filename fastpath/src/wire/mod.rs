//! Zero-copy packet views for the per-packet hot path, in the style of smoltcp's `wire`.
//!
//! Every protocol has a view `XxxPacket<T: AsRef<[u8]>>` over a caller-owned buffer:
//!
//! - `new_checked(buf)` is for untrusted bytes: it runs `check_len()` and returns a
//!   [`Error`] when the buffer or a length field is inconsistent. **After `check_len()` has
//!   succeeded, no accessor of that view panics, whatever the bytes are.** Setters keep that
//!   promise too, except the ones that change a length field (`set_header_len`,
//!   `set_total_len`, ...), after which `check_len()` must be run again.
//! - `new_unchecked(buf)` is for building packets in a buffer that is known to be large
//!   enough; accessors may panic if it is not.
//! - Getters live in `impl<T: AsRef<[u8]>>`, setters in `impl<T: AsRef<[u8]> + AsMut<[u8]>>`,
//!   so one type is both the read-only and the mutable view.
//! - Protocol numbers are enums with an `Unknown` variant, so conversion never fails.
//! - Nothing here allocates. Payload accessors are bounded by the protocol's own length field
//!   (IPv4 total length, IPv6 payload length, UDP length), never by the buffer, because
//!   Ethernet pads short frames.
//!
//! Checksums: [`checksum`] has the full RFC 1071 sum and the RFC 1624 incremental updates.
//! Views offer `*_incremental` setters that rewrite a field *and* patch the checksum that covers
//! it; [`l4_update_for_addr_change`] patches a TCP/UDP/ICMPv6 checksum after an L3 address
//! rewrite (the pseudo-header). SCTP's CRC32c cannot be updated incrementally: call
//! [`SctpPacket::fill_checksum`] after rewriting ports.
//!
//! [`parse_frame`] walks an Ethernet frame down to L4 and reports the offsets the pipeline
//! needs.

pub mod checksum;
pub mod ethernet;
pub mod frame;
pub mod icmpv4;
pub mod icmpv6;
pub mod ip;
pub mod ipv4;
pub mod ipv6;
pub mod sctp;
pub mod tcp;
pub mod udp;

pub use ethernet::{EtherType, EthernetAddress, EthernetFrame};
pub use frame::{FrameInfo, L3Info, parse_frame};
pub use icmpv4::{Icmpv4DstUnreachable, Icmpv4Message, Icmpv4Packet};
pub use icmpv6::{Icmpv6Message, Icmpv6Packet};
pub use ip::{IpProtocol, l4_update_for_addr_change};
pub use ipv4::Ipv4Packet;
pub use ipv6::{Ipv6ExtInfo, Ipv6FragmentInfo, Ipv6Packet};
pub use sctp::{SctpChunkType, SctpPacket};
pub use tcp::{TcpFlags, TcpPacket};
pub use udp::UdpPacket;

/// A byte range of a header field.
pub(crate) type Field = core::ops::Range<usize>;

/// Why a buffer is not a valid packet of the expected protocol. Cheap and `Copy`: the
/// pipeline maps each variant to a drop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Error {
    /// The buffer is shorter than the header, or than a length field says it should be.
    #[error("packet truncated")]
    Truncated,
    /// IPv4 IHL below 5 (20 bytes).
    #[error("bad IPv4 header length (IHL)")]
    BadIhl,
    /// A length field is inconsistent with the header (IPv4 total length shorter than its
    /// header, UDP length below 8 or beyond the IP payload).
    #[error("bad length field")]
    BadLength,
    /// The IP version nibble does not match the view.
    #[error("bad IP version")]
    BadVersion,
    /// TCP data offset below 5 or beyond the segment.
    #[error("bad TCP data offset")]
    BadDataOffset,
    /// More IPv6 extension headers than [`ipv6::EXT_HEADERS_MAX`].
    #[error("too many IPv6 extension headers")]
    TooManyExtHeaders,
    /// A header the fastpath does not handle (e.g. ARP with unusual address sizes).
    #[error("malformed header")]
    Malformed,
}

/// Result of parsing a view.
pub type Result<T> = core::result::Result<T, Error>;

/// Reads a big-endian `u16` at `at`. Panics only if out of bounds; callers have checked.
#[inline(always)]
pub(crate) fn read_u16(data: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([data[at], data[at + 1]])
}

/// Reads a big-endian `u32` at `at`.
#[inline(always)]
pub(crate) fn read_u32(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

/// Writes a big-endian `u16` at `at`.
#[inline(always)]
pub(crate) fn write_u16(data: &mut [u8], at: usize, value: u16) {
    data[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

/// Writes a big-endian `u32` at `at`.
#[inline(always)]
pub(crate) fn write_u32(data: &mut [u8], at: usize, value: u32) {
    data[at..at + 4].copy_from_slice(&value.to_be_bytes());
}
