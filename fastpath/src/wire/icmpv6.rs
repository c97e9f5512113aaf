//! ICMPv6 messages: echo, and errors (types below 128) that embed the original packet:
//! destination unreachable, packet too big (with its MTU), time exceeded, parameter problem.
//!
//! Unlike ICMPv4, the checksum covers the IPv6 pseudo-header, so outer address rewrites
//! need [`super::l4_update_for_addr_change`] with [`super::IpProtocol::Icmpv6`].

use super::{Error, Field, Result, checksum, read_u16, read_u32, write_u16, write_u32};
use core::net::Ipv6Addr;

mod field {
    use super::Field;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Field = 2..4;
    pub const ECHO_IDENT: Field = 4..6;
    pub const ECHO_SEQNO: Field = 6..8;
    pub const MTU: Field = 4..8;
}

/// Length of the header (type, code, checksum and the 4-byte rest-of-header).
pub const HEADER_LEN: usize = 8;
/// Offset of the checksum field.
pub(crate) const CHECKSUM_AT: usize = field::CHECKSUM.start;
const NEXT_HEADER: u8 = 58;

/// ICMPv6 message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv6Message {
    /// 1
    DstUnreachable,
    /// 2
    PktTooBig,
    /// 3
    TimeExceeded,
    /// 4
    ParamProblem,
    /// 128
    EchoRequest,
    /// 129
    EchoReply,
    /// 133
    RouterSolicit,
    /// 134
    RouterAdvert,
    /// 135
    NeighborSolicit,
    /// 136
    NeighborAdvert,
    /// 137
    Redirect,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for Icmpv6Message {
    #[inline]
    fn from(value: u8) -> Self {
        match value {
            1 => Icmpv6Message::DstUnreachable,
            2 => Icmpv6Message::PktTooBig,
            3 => Icmpv6Message::TimeExceeded,
            4 => Icmpv6Message::ParamProblem,
            128 => Icmpv6Message::EchoRequest,
            129 => Icmpv6Message::EchoReply,
            133 => Icmpv6Message::RouterSolicit,
            134 => Icmpv6Message::RouterAdvert,
            135 => Icmpv6Message::NeighborSolicit,
            136 => Icmpv6Message::NeighborAdvert,
            137 => Icmpv6Message::Redirect,
            other => Icmpv6Message::Unknown(other),
        }
    }
}

impl From<Icmpv6Message> for u8 {
    #[inline]
    fn from(value: Icmpv6Message) -> Self {
        match value {
            Icmpv6Message::DstUnreachable => 1,
            Icmpv6Message::PktTooBig => 2,
            Icmpv6Message::TimeExceeded => 3,
            Icmpv6Message::ParamProblem => 4,
            Icmpv6Message::EchoRequest => 128,
            Icmpv6Message::EchoReply => 129,
            Icmpv6Message::RouterSolicit => 133,
            Icmpv6Message::RouterAdvert => 134,
            Icmpv6Message::NeighborSolicit => 135,
            Icmpv6Message::NeighborAdvert => 136,
            Icmpv6Message::Redirect => 137,
            Icmpv6Message::Unknown(other) => other,
        }
    }
}

impl Icmpv6Message {
    /// Error messages (types 0..=127), which embed as much of the offending packet as fits.
    #[inline]
    pub fn is_error(self) -> bool {
        u8::from(self) < 128
    }
}

/// A view of an ICMPv6 message.
#[derive(Debug, Clone)]
pub struct Icmpv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Icmpv6Packet<T> {
    /// Wraps a buffer without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Icmpv6Packet { buffer }
    }

    /// Wraps untrusted bytes and runs [`Self::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the 8-byte header.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Message type.
    #[inline]
    pub fn msg_type(&self) -> Icmpv6Message {
        Icmpv6Message::from(self.buffer.as_ref()[field::TYPE])
    }

    /// Message code.
    #[inline]
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    /// Checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// Echo identifier.
    #[inline]
    pub fn echo_ident(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::ECHO_IDENT.start)
    }

    /// Echo sequence number.
    #[inline]
    pub fn echo_seq_no(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::ECHO_SEQNO.start)
    }

    /// MTU of a packet-too-big message; `None` for other messages.
    #[inline]
    pub fn mtu(&self) -> Option<u32> {
        (self.msg_type() == Icmpv6Message::PktTooBig)
            .then(|| read_u32(self.buffer.as_ref(), field::MTU.start))
    }

    /// Whether this is an error message that embeds the original packet.
    #[inline]
    pub fn is_error(&self) -> bool {
        self.msg_type().is_error()
    }

    /// Everything after the 8-byte header.
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// The embedded original packet of an error message (parse it with
    /// `Ipv6Packet::new_quoted`); `None` for other messages.
    #[inline]
    pub fn embedded(&self) -> Option<&[u8]> {
        self.is_error().then(|| self.data())
    }

    /// Whether the checksum is right for this pseudo-header.
    #[inline]
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        let d = self.buffer.as_ref();
        checksum::l4_checksum_v6(&src.octets(), &dst.octets(), NEXT_HEADER, d) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv6Packet<T> {
    /// Sets the type.
    #[inline]
    pub fn set_msg_type(&mut self, value: Icmpv6Message) {
        self.buffer.as_mut()[field::TYPE] = value.into();
    }

    /// Sets the code.
    #[inline]
    pub fn set_msg_code(&mut self, value: u8) {
        self.buffer.as_mut()[field::CODE] = value;
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM.start, value);
    }

    /// Sets the echo identifier without touching the checksum.
    #[inline]
    pub fn set_echo_ident(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::ECHO_IDENT.start, value);
    }

    /// Sets the echo sequence number.
    #[inline]
    pub fn set_echo_seq_no(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::ECHO_SEQNO.start, value);
    }

    /// Sets the MTU field (bytes 4..8) without touching the checksum.
    #[inline]
    pub fn set_mtu(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::MTU.start, value);
    }

    /// Sets the echo identifier and patches the checksum; returns the old identifier.
    #[inline]
    pub fn set_echo_ident_incremental(&mut self, ident: u16) -> u16 {
        let old = self.echo_ident();
        let csum = checksum::update_u16(self.checksum(), old, ident);
        self.set_echo_ident(ident);
        self.set_checksum(csum);
        old
    }

    /// Recomputes the checksum for this pseudo-header.
    #[inline]
    pub fn fill_checksum(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let d = self.buffer.as_ref();
        let c = checksum::l4_checksum_v6(&src.octets(), &dst.octets(), NEXT_HEADER, d);
        self.set_checksum(c);
    }

    /// The mutable data after the header.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{IpProtocol, Ipv6Packet, l4_update_for_addr_change};

    fn addr(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn packet_too_big_with_embedded_tcp() {
        let mut b = vec![2, 0, 0, 0, 0, 0, 0x05, 0x00];
        // Quoted IPv6 header claiming 1400 bytes of TCP, then 8 bytes of the TCP header.
        let mut inner = vec![0x60, 0, 0, 0, 0x05, 0x78, 6, 64];
        inner.extend_from_slice(&addr("2001:2::1").octets());
        inner.extend_from_slice(&addr("2001:2::100").octets());
        inner.extend_from_slice(&[0x9c, 0x40, 0x01, 0xbb, 0, 0, 0, 1]);
        b.extend_from_slice(&inner);
        let (src, dst) = (addr("2001:2::fe"), addr("2001:2::1"));
        let mut p = Icmpv6Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum(src, dst);
        assert!(p.verify_checksum(src, dst));
        assert_eq!(p.msg_type(), Icmpv6Message::PktTooBig);
        assert_eq!(p.mtu(), Some(1280));
        let quoted = Ipv6Packet::new_quoted(p.embedded().unwrap()).unwrap();
        assert_eq!(
            Ipv6Packet::new_checked(p.embedded().unwrap()).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(quoted.dst_addr(), addr("2001:2::100"));
        let ext = quoted.walk_ext_headers().unwrap();
        assert_eq!((ext.protocol, ext.l4_offset), (IpProtocol::Tcp, 40));
        assert_eq!(&quoted.payload_quoted()[..4], &[0x9c, 0x40, 0x01, 0xbb]);
    }

    #[test]
    fn echo_and_addr_change() {
        let (src, dst) = (addr("2001:2::1"), addr("2001:2::100"));
        let mut b = vec![128, 0, 0, 0, 0x00, 0x07, 0x00, 0x09, 1, 2, 3];
        let mut p = Icmpv6Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum(src, dst);
        assert_eq!(p.embedded(), None);
        assert_eq!(p.mtu(), None);
        assert_eq!(p.set_echo_ident_incremental(4242), 7);
        assert!(p.verify_checksum(src, dst));
        let new_dst = addr("2001:2::beef");
        l4_update_for_addr_change(IpProtocol::Icmpv6, &mut b, &dst.octets(), &new_dst.octets())
            .unwrap();
        let p = Icmpv6Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum(src, new_dst));
        assert!(!p.verify_checksum(src, dst));
    }

    #[test]
    fn short_and_enums() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                Icmpv6Packet::new_checked(&[1u8; 8][..n]).unwrap_err(),
                Error::Truncated
            );
        }
        for v in 0..=255u8 {
            assert_eq!(u8::from(Icmpv6Message::from(v)), v);
        }
        assert!(Icmpv6Message::TimeExceeded.is_error());
        assert!(!Icmpv6Message::NeighborSolicit.is_error());
    }
}
