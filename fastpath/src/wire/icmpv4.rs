//! ICMPv4 messages: echo (the identifier is NATed like a port) and errors that embed the
//! original packet (destination unreachable incl. fragmentation needed, time exceeded,
//! parameter problem, redirect).
//!
//! The ICMPv4 checksum covers the whole message and no pseudo-header, so L3 address rewrites
//! of the outer header leave it alone. After translating an embedded packet, call
//! [`Icmpv4Packet::fill_checksum`] (errors are small and rare).

use super::{Error, Field, Result, checksum, read_u16, write_u16};

mod field {
    use super::Field;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Field = 2..4;
    pub const ECHO_IDENT: Field = 4..6;
    pub const ECHO_SEQNO: Field = 6..8;
    pub const NEXT_HOP_MTU: Field = 6..8;
}

/// Length of the header (type, code, checksum and the 4-byte rest-of-header).
pub const HEADER_LEN: usize = 8;

/// ICMPv4 message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv4Message {
    /// 0
    EchoReply,
    /// 3
    DstUnreachable,
    /// 4 (deprecated by RFC 6633, still quoted by old routers)
    SourceQuench,
    /// 5
    Redirect,
    /// 8
    EchoRequest,
    /// 11
    TimeExceeded,
    /// 12
    ParamProblem,
    /// 13
    Timestamp,
    /// 14
    TimestampReply,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for Icmpv4Message {
    #[inline]
    fn from(value: u8) -> Self {
        match value {
            0 => Icmpv4Message::EchoReply,
            3 => Icmpv4Message::DstUnreachable,
            4 => Icmpv4Message::SourceQuench,
            5 => Icmpv4Message::Redirect,
            8 => Icmpv4Message::EchoRequest,
            11 => Icmpv4Message::TimeExceeded,
            12 => Icmpv4Message::ParamProblem,
            13 => Icmpv4Message::Timestamp,
            14 => Icmpv4Message::TimestampReply,
            other => Icmpv4Message::Unknown(other),
        }
    }
}

impl From<Icmpv4Message> for u8 {
    #[inline]
    fn from(value: Icmpv4Message) -> Self {
        match value {
            Icmpv4Message::EchoReply => 0,
            Icmpv4Message::DstUnreachable => 3,
            Icmpv4Message::SourceQuench => 4,
            Icmpv4Message::Redirect => 5,
            Icmpv4Message::EchoRequest => 8,
            Icmpv4Message::TimeExceeded => 11,
            Icmpv4Message::ParamProblem => 12,
            Icmpv4Message::Timestamp => 13,
            Icmpv4Message::TimestampReply => 14,
            Icmpv4Message::Unknown(other) => other,
        }
    }
}

impl Icmpv4Message {
    /// Error messages, which embed the offending packet's IP header and at least 8 bytes of
    /// its payload.
    #[inline]
    pub fn is_error(self) -> bool {
        matches!(
            self,
            Icmpv4Message::DstUnreachable
                | Icmpv4Message::SourceQuench
                | Icmpv4Message::Redirect
                | Icmpv4Message::TimeExceeded
                | Icmpv4Message::ParamProblem
        )
    }
}

/// Codes of destination-unreachable messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv4DstUnreachable {
    /// 0
    NetUnreachable,
    /// 1
    HostUnreachable,
    /// 2
    ProtoUnreachable,
    /// 3
    PortUnreachable,
    /// 4, "fragmentation needed and DF set": carries the next-hop MTU (RFC 1191).
    FragRequired,
    /// 5
    SrcRouteFailed,
    /// 13
    AdminProhibited,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for Icmpv4DstUnreachable {
    #[inline]
    fn from(value: u8) -> Self {
        match value {
            0 => Icmpv4DstUnreachable::NetUnreachable,
            1 => Icmpv4DstUnreachable::HostUnreachable,
            2 => Icmpv4DstUnreachable::ProtoUnreachable,
            3 => Icmpv4DstUnreachable::PortUnreachable,
            4 => Icmpv4DstUnreachable::FragRequired,
            5 => Icmpv4DstUnreachable::SrcRouteFailed,
            13 => Icmpv4DstUnreachable::AdminProhibited,
            other => Icmpv4DstUnreachable::Unknown(other),
        }
    }
}

impl From<Icmpv4DstUnreachable> for u8 {
    #[inline]
    fn from(value: Icmpv4DstUnreachable) -> Self {
        match value {
            Icmpv4DstUnreachable::NetUnreachable => 0,
            Icmpv4DstUnreachable::HostUnreachable => 1,
            Icmpv4DstUnreachable::ProtoUnreachable => 2,
            Icmpv4DstUnreachable::PortUnreachable => 3,
            Icmpv4DstUnreachable::FragRequired => 4,
            Icmpv4DstUnreachable::SrcRouteFailed => 5,
            Icmpv4DstUnreachable::AdminProhibited => 13,
            Icmpv4DstUnreachable::Unknown(other) => other,
        }
    }
}

/// A view of an ICMPv4 message.
#[derive(Debug, Clone)]
pub struct Icmpv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    /// Wraps a buffer without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Icmpv4Packet { buffer }
    }

    /// Wraps untrusted bytes and runs [`Self::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the 8-byte header. The embedded packet of an error is checked by parsing it
    /// with [`super::Ipv4Packet`] (which may see only a prefix of the original datagram).
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
    pub fn msg_type(&self) -> Icmpv4Message {
        Icmpv4Message::from(self.buffer.as_ref()[field::TYPE])
    }

    /// Message code.
    #[inline]
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    /// The code as a destination-unreachable reason, for that message type only.
    #[inline]
    pub fn dst_unreachable(&self) -> Option<Icmpv4DstUnreachable> {
        (self.msg_type() == Icmpv4Message::DstUnreachable)
            .then(|| Icmpv4DstUnreachable::from(self.msg_code()))
    }

    /// Checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// Echo identifier (meaningful for echo request/reply).
    #[inline]
    pub fn echo_ident(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::ECHO_IDENT.start)
    }

    /// Echo sequence number.
    #[inline]
    pub fn echo_seq_no(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::ECHO_SEQNO.start)
    }

    /// Next-hop MTU of a fragmentation-needed message; `None` for other messages.
    #[inline]
    pub fn next_hop_mtu(&self) -> Option<u16> {
        (self.dst_unreachable() == Some(Icmpv4DstUnreachable::FragRequired))
            .then(|| read_u16(self.buffer.as_ref(), field::NEXT_HOP_MTU.start))
    }

    /// Whether this is an error message that embeds the original packet.
    #[inline]
    pub fn is_error(&self) -> bool {
        self.msg_type().is_error()
    }

    /// Everything after the 8-byte header: the echo data, or for errors the original IPv4
    /// header and the start of its payload. Parse it with `Ipv4Packet::new_quoted`: the
    /// embedded total length usually exceeds what was quoted.
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// The embedded original packet of an error message; `None` for other messages.
    #[inline]
    pub fn embedded(&self) -> Option<&[u8]> {
        self.is_error().then(|| self.data())
    }

    /// Whether the checksum over the whole message is right.
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum::checksum(self.buffer.as_ref()) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv4Packet<T> {
    /// Sets the type.
    #[inline]
    pub fn set_msg_type(&mut self, value: Icmpv4Message) {
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

    /// Sets the next-hop MTU field (bytes 6..8) without touching the checksum.
    #[inline]
    pub fn set_next_hop_mtu(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::NEXT_HOP_MTU.start, value);
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

    /// Recomputes the checksum over the whole message.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }

    /// The mutable data after the header (embedded packet of an error).
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{IpProtocol, Ipv4Packet, UdpPacket};
    use core::net::Ipv4Addr;

    /// Frag-needed (MTU 1400) quoting a UDP packet 198.18.0.1:5000 -> 198.18.100.1:53.
    fn frag_needed() -> Vec<u8> {
        let mut b = vec![3, 4, 0, 0, 0, 0, 0x05, 0x78];
        let mut inner = vec![
            0x45, 0, 0x05, 0xdc, 0, 1, 0x40, 0, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 100, 1,
        ];
        let c = checksum::checksum(&inner);
        inner[10..12].copy_from_slice(&c.to_be_bytes());
        inner.extend_from_slice(&[0x13, 0x88, 0, 53, 0x05, 0xc8, 0x12, 0x34]);
        b.extend_from_slice(&inner);
        let c = checksum::checksum(&b);
        b[2..4].copy_from_slice(&c.to_be_bytes());
        b
    }

    #[test]
    fn frag_needed_and_embedded_packet() {
        let b = frag_needed();
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(p.msg_type(), Icmpv4Message::DstUnreachable);
        assert_eq!(
            p.dst_unreachable(),
            Some(Icmpv4DstUnreachable::FragRequired)
        );
        assert_eq!(p.next_hop_mtu(), Some(1400));
        let inner = p.embedded().unwrap();
        // The quoted total length (1500) exceeds the quote: a strict parse says Truncated,
        // the quoted parse reads the header and what is left of the payload.
        assert_eq!(
            Ipv4Packet::new_checked(inner).unwrap_err(),
            Error::Truncated
        );
        let ip = Ipv4Packet::new_quoted(inner).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.protocol(), IpProtocol::Udp);
        assert_eq!(ip.dst_addr(), Ipv4Addr::new(198, 18, 100, 1));
        assert_eq!(ip.payload_quoted().len(), 8);
        // Only 8 bytes of the L4 header are quoted: enough for ports (and UDP's checksum).
        let udp = UdpPacket::new_unchecked(ip.payload_quoted());
        assert_eq!((udp.src_port(), udp.dst_port()), (5000, 53));
    }

    #[test]
    fn echo_ident_incremental() {
        let mut b = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1, b'h', b'i', b'!'];
        let mut p = Icmpv4Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum();
        assert!(p.verify_checksum());
        assert_eq!(p.msg_type(), Icmpv4Message::EchoRequest);
        assert_eq!(p.embedded(), None);
        assert_eq!(p.next_hop_mtu(), None);
        assert_eq!(p.set_echo_ident_incremental(0xfffe), 0x1234);
        assert!(p.verify_checksum());
        assert_eq!((p.echo_ident(), p.echo_seq_no()), (0xfffe, 1));
        assert_eq!(p.data(), b"hi!");
    }

    #[test]
    fn short_and_enums() {
        let b = frag_needed();
        for n in 0..HEADER_LEN {
            assert_eq!(
                Icmpv4Packet::new_checked(&b[..n]).unwrap_err(),
                Error::Truncated
            );
        }
        for v in 0..=255u8 {
            assert_eq!(u8::from(Icmpv4Message::from(v)), v);
            assert_eq!(u8::from(Icmpv4DstUnreachable::from(v)), v);
        }
    }
}
