//! UDP datagrams. `check_len` enforces `8 <= length <= buffer`; the payload is bounded by
//! the UDP length.
//!
//! Checksum rules: over IPv4 a checksum of 0 means "none" (it stays 0 through NAT rewrites);
//! a computed 0 is sent as 0xffff; over IPv6 a 0 checksum is invalid
//! ([`UdpPacket::verify_checksum_v6`] rejects it).

use super::{Error, Field, Result, checksum, ip::udp_update_u16, read_u16, write_u16};
use core::net::{Ipv4Addr, Ipv6Addr};

mod field {
    use super::Field;
    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const LENGTH: Field = 4..6;
    pub const CHECKSUM: Field = 6..8;
}

/// Length of the header.
pub const HEADER_LEN: usize = 8;
/// Offset of the checksum field.
pub(crate) const CHECKSUM_AT: usize = field::CHECKSUM.start;

/// A view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a buffer without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps untrusted bytes and runs [`Self::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the header and `8 <= length <= buffer`.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let udp_len = usize::from(self.len());
        if udp_len < HEADER_LEN || udp_len > len {
            return Err(Error::BadLength);
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::SRC_PORT.start)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::DST_PORT.start)
    }

    /// Length field (header + payload).
    #[inline]
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// The datagram bytes covered by the length field.
    #[inline]
    pub fn datagram(&self) -> &[u8] {
        &self.buffer.as_ref()[..usize::from(self.len())]
    }

    /// Payload, bounded by the length field.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }

    /// Over IPv4: true when the checksum is 0 ("none") or correct.
    #[inline]
    pub fn verify_checksum_v4(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        self.checksum() == 0
            || checksum::l4_checksum_v4(&src.octets(), &dst.octets(), 17, self.datagram()) == 0
    }

    /// Over IPv6: true only when the checksum is non-zero and correct.
    #[inline]
    pub fn verify_checksum_v6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        self.checksum() != 0
            && checksum::l4_checksum_v6(&src.octets(), &dst.octets(), 17, self.datagram()) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Sets the source port without touching the checksum.
    #[inline]
    pub fn set_src_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::SRC_PORT.start, value);
    }

    /// Sets the destination port without touching the checksum.
    #[inline]
    pub fn set_dst_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::DST_PORT.start, value);
    }

    /// Sets the length field.
    #[inline]
    pub fn set_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH.start, value);
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM.start, value);
    }

    /// Sets the source port and patches the checksum (a zero checksum stays zero); returns
    /// the old port.
    #[inline]
    pub fn set_src_port_incremental(&mut self, port: u16) -> u16 {
        let old = self.src_port();
        let csum = udp_update_u16(self.checksum(), old, port);
        self.set_src_port(port);
        self.set_checksum(csum);
        old
    }

    /// Sets the destination port and patches the checksum; returns the old port.
    #[inline]
    pub fn set_dst_port_incremental(&mut self, port: u16) -> u16 {
        let old = self.dst_port();
        let csum = udp_update_u16(self.checksum(), old, port);
        self.set_dst_port(port);
        self.set_checksum(csum);
        old
    }

    /// Computes the checksum with an IPv4 pseudo-header (a computed 0 becomes 0xffff).
    #[inline]
    pub fn fill_checksum_v4(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let c = checksum::l4_checksum_v4(&src.octets(), &dst.octets(), 17, self.datagram());
        self.set_checksum(checksum::udp_nonzero(c));
    }

    /// Computes the checksum with an IPv6 pseudo-header (a computed 0 becomes 0xffff).
    #[inline]
    pub fn fill_checksum_v6(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let c = checksum::l4_checksum_v6(&src.octets(), &dst.octets(), 17, self.datagram());
        self.set_checksum(checksum::udp_nonzero(c));
    }

    /// The mutable payload, bounded by the length field.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DGRAM: [u8; 14] = [
        0x30, 0x39, 0x00, 0x35, 0x00, 0x0c, 0, 0, 1, 2, 3, 4, 0xee, 0xee,
    ];
    const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 1);

    #[test]
    fn parse_fixture() {
        let p = UdpPacket::new_checked(&DGRAM[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.len()), (12345, 53, 12));
        assert_eq!(p.payload(), &[1, 2, 3, 4], "trailing bytes excluded");
        assert!(p.verify_checksum_v4(SRC, DST), "zero means none over IPv4");
        let v6: Ipv6Addr = "2001:2::1".parse().unwrap();
        assert!(!p.verify_checksum_v6(v6, v6), "zero is invalid over IPv6");
    }

    #[test]
    fn length_errors() {
        for n in 0..8 {
            assert_eq!(
                UdpPacket::new_checked(&DGRAM[..n]).unwrap_err(),
                Error::Truncated
            );
        }
        for n in 8..12 {
            assert_eq!(
                UdpPacket::new_checked(&DGRAM[..n]).unwrap_err(),
                Error::BadLength
            );
        }
        let mut bad = DGRAM;
        bad[5] = 7;
        assert_eq!(
            UdpPacket::new_checked(&bad[..]).unwrap_err(),
            Error::BadLength
        );
    }

    #[test]
    fn zero_checksum_rule() {
        let mut buf = DGRAM;
        let mut p = UdpPacket::new_checked(&mut buf[..]).unwrap();
        p.set_dst_port_incremental(5353);
        assert_eq!(p.checksum(), 0, "no checksum stays no checksum");
        p.fill_checksum_v4(SRC, DST);
        assert_ne!(p.checksum(), 0);
        assert!(p.verify_checksum_v4(SRC, DST));
        p.set_src_port_incremental(1);
        assert!(p.verify_checksum_v4(SRC, DST));
    }

    #[test]
    fn computed_zero_is_sent_as_ffff() {
        // Choose the payload so that the full sum is 0xffff, i.e. the checksum computes to 0.
        let mut buf = [0u8; 10];
        buf[..8].copy_from_slice(&[0, 1, 0, 2, 0, 10, 0, 0]);
        let partial = checksum::add(
            checksum::pseudo_header_v4(&SRC.octets(), &DST.octets(), 17, 10),
            checksum::sum(&buf),
        );
        buf[8..10].copy_from_slice(&(!partial).to_be_bytes());
        let mut p = UdpPacket::new_checked(&mut buf[..]).unwrap();
        p.fill_checksum_v4(SRC, DST);
        assert_eq!(p.checksum(), 0xffff);
        assert!(p.verify_checksum_v4(SRC, DST));
    }
}
