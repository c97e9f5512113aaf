//! IPv4 headers with options.
//!
//! `check_len` enforces `20 <= IHL*4 <= total length <= buffer`, so [`Ipv4Packet::payload`] is
//! bounded by the total length (Ethernet padding after short packets is excluded).

use super::{Error, Field, IpProtocol, Result, checksum, read_u16, write_u16};
use core::net::Ipv4Addr;

mod field {
    use super::Field;
    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Field = 2..4;
    pub const IDENT: Field = 4..6;
    pub const FLG_OFF: Field = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    /// TTL and protocol as one 16-bit checksum word.
    pub const TTL_PROTO: Field = 8..10;
    pub const CHECKSUM: Field = 10..12;
    pub const SRC_ADDR: Field = 12..16;
    pub const DST_ADDR: Field = 16..20;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wraps untrusted bytes and runs [`Self::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks version 4, IHL >= 5, header <= total length <= buffer.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 4 {
            return Err(Error::BadVersion);
        }
        let header_len = self.header_len();
        if header_len < HEADER_LEN {
            return Err(Error::BadIhl);
        }
        if header_len > len {
            return Err(Error::Truncated);
        }
        let total_len = usize::from(self.total_len());
        if total_len < header_len {
            return Err(Error::BadLength);
        }
        if total_len > len {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Wraps the packet quoted inside an ICMP error, whose total length usually exceeds the
    /// quote, and runs [`Self::check_header_len`].
    #[inline]
    pub fn new_quoted(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_header_len()?;
        Ok(p)
    }

    /// The weaker check for quoted packets: version 4, IHL >= 5 and the header fits in the
    /// buffer; the total length is not checked. Afterwards every accessor is safe except
    /// [`Self::payload`] and [`Self::payload_mut`]: use [`Self::payload_quoted`] instead.
    #[inline]
    pub fn check_header_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 4 {
            return Err(Error::BadVersion);
        }
        let header_len = self.header_len();
        if header_len < HEADER_LEN {
            return Err(Error::BadIhl);
        }
        if header_len > len {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Version nibble.
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL * 4), options included; the L4 offset.
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// DSCP (upper six bits of the former TOS).
    #[inline]
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    /// ECN (lower two bits).
    #[inline]
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] & 0x03
    }

    /// Total length field (header + payload).
    #[inline]
    pub fn total_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Identification.
    #[inline]
    pub fn ident(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::IDENT.start)
    }

    /// Don't-fragment flag.
    #[inline]
    pub fn dont_frag(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLG_OFF.start) & FLAG_DF != 0
    }

    /// More-fragments flag.
    #[inline]
    pub fn more_frags(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLG_OFF.start) & FLAG_MF != 0
    }

    /// Fragment offset in bytes (the field times 8).
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        (read_u16(self.buffer.as_ref(), field::FLG_OFF.start) & OFFSET_MASK) << 3
    }

    /// Part of a fragmented datagram (MF set or non-zero offset).
    #[inline]
    pub fn is_fragment(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLG_OFF.start) & (FLAG_MF | OFFSET_MASK) != 0
    }

    /// A fragment other than the first: it carries no L4 header.
    #[inline]
    pub fn is_later_fragment(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLG_OFF.start) & OFFSET_MASK != 0
    }

    /// Time to live.
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// TTL and protocol as the one 16-bit word the header checksum covers them in.
    #[inline]
    pub fn ttl_protocol(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::TTL_PROTO.start)
    }

    /// The L4 protocol.
    #[inline]
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::PROTOCOL])
    }

    /// Header checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        let d = self.buffer.as_ref();
        Ipv4Addr::new(d[12], d[13], d[14], d[15])
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        let d = self.buffer.as_ref();
        Ipv4Addr::new(d[16], d[17], d[18], d[19])
    }

    /// The header (options included).
    #[inline]
    pub fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.header_len()]
    }

    /// Options bytes (empty for IHL 5).
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    /// Whether the header checksum is correct.
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum::checksum(self.header()) == 0
    }

    /// The L4 bytes, bounded by the total length.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }

    /// The L4 bytes bounded by both the total length and the buffer: what is left of the
    /// payload in a quoted packet. Safe after [`Self::check_header_len`].
    #[inline]
    pub fn payload_quoted(&self) -> &[u8] {
        let (start, end) = self.quoted_range();
        &self.buffer.as_ref()[start..end]
    }

    #[inline]
    fn quoted_range(&self) -> (usize, usize) {
        let start = self.header_len();
        let end = usize::from(self.total_len()).min(self.buffer.as_ref().len());
        (start, end.max(start))
    }

    /// Sum of this packet's pseudo-header for an L4 checksum over [`Self::payload`].
    #[inline]
    pub fn pseudo_header_sum(&self) -> u16 {
        let l4_len = self.total_len().saturating_sub(self.header_len() as u16);
        checksum::pseudo_header_v4(
            &self.src_addr().octets(),
            &self.dst_addr().octets(),
            self.buffer.as_ref()[field::PROTOCOL],
            l4_len,
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Sets version 4 and the header length in bytes (a multiple of 4, 20..=60).
    #[inline]
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets DSCP and ECN.
    #[inline]
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = (dscp << 2) | (ecn & 0x03);
    }

    /// Sets the total length.
    #[inline]
    pub fn set_total_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH.start, value);
    }

    /// Sets the identification.
    #[inline]
    pub fn set_ident(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::IDENT.start, value);
    }

    /// Sets DF, MF and the fragment offset in bytes (rounded down to a multiple of 8).
    #[inline]
    pub fn set_frag(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let mut v = (offset >> 3) & OFFSET_MASK;
        if dont_frag {
            v |= FLAG_DF;
        }
        if more_frags {
            v |= FLAG_MF;
        }
        write_u16(self.buffer.as_mut(), field::FLG_OFF.start, v);
    }

    /// Sets the TTL without touching the checksum.
    #[inline]
    pub fn set_ttl(&mut self, value: u8) {
        self.buffer.as_mut()[field::TTL] = value;
    }

    /// Sets the protocol.
    #[inline]
    pub fn set_protocol(&mut self, value: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = value.into();
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM.start, value);
    }

    /// Sets the source address without touching any checksum.
    #[inline]
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address without touching any checksum.
    #[inline]
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&addr.octets());
    }

    /// Recomputes the header checksum from scratch.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let csum = checksum::checksum(self.header());
        self.set_checksum(csum);
    }

    /// Sets the source address and patches the header checksum. The L4 checksum still needs
    /// [`super::l4_update_for_addr_change`] with the returned old address.
    #[inline]
    pub fn set_src_addr_incremental(&mut self, addr: Ipv4Addr) -> Ipv4Addr {
        let old = self.src_addr();
        let csum = checksum::update_addr(self.checksum(), &old.octets(), &addr.octets());
        self.set_src_addr(addr);
        self.set_checksum(csum);
        old
    }

    /// Sets the destination address and patches the header checksum; returns the old one.
    #[inline]
    pub fn set_dst_addr_incremental(&mut self, addr: Ipv4Addr) -> Ipv4Addr {
        let old = self.dst_addr();
        let csum = checksum::update_addr(self.checksum(), &old.octets(), &addr.octets());
        self.set_dst_addr(addr);
        self.set_checksum(csum);
        old
    }

    /// Sets the TTL and patches the header checksum.
    #[inline]
    pub fn set_ttl_incremental(&mut self, ttl: u8) {
        let old = self.ttl_protocol();
        let new = (u16::from(ttl) << 8) | u16::from(self.buffer.as_ref()[field::PROTOCOL]);
        let csum = checksum::update_u16(self.checksum(), old, new);
        self.set_ttl(ttl);
        self.set_checksum(csum);
    }

    /// Decrements the TTL (not below 0) with a checksum patch; returns the new TTL. Callers
    /// that forward should drop (or answer time-exceeded) when the old TTL was <= 1.
    #[inline]
    pub fn decrement_ttl(&mut self) -> u8 {
        let ttl = self.ttl().saturating_sub(1);
        if ttl != self.ttl() {
            self.set_ttl_incremental(ttl);
        }
        ttl
    }

    /// The mutable options bytes.
    #[inline]
    pub fn options_mut(&mut self) -> &mut [u8] {
        let end = self.header_len();
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }

    /// The mutable L4 bytes, bounded by the total length.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (start, end) = (self.header_len(), usize::from(self.total_len()));
        &mut self.buffer.as_mut()[start..end]
    }

    /// The mutable [`Self::payload_quoted`].
    #[inline]
    pub fn payload_quoted_mut(&mut self) -> &mut [u8] {
        let (start, end) = self.quoted_range();
        &mut self.buffer.as_mut()[start..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 198.18.0.1 -> 198.18.0.2, UDP, one 4-byte option (NOP x3 + EOL), 4 bytes of payload and
    /// 2 bytes of Ethernet-style padding after the total length.
    fn fixture() -> Vec<u8> {
        let mut b = vec![
            0x46, 0x00, 0x00, 28, 0x12, 0x34, 0x20, 0x03, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 0,
            2, 1, 1, 1, 0, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x00,
        ];
        let csum = checksum::checksum(&b[..24]);
        b[10..12].copy_from_slice(&csum.to_be_bytes());
        b
    }

    #[test]
    fn parse_fixture() {
        let b = fixture();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.total_len(), 28);
        assert_eq!(p.ident(), 0x1234);
        assert!(p.more_frags());
        assert!(!p.dont_frag());
        assert_eq!(p.frag_offset(), 24);
        assert!(p.is_fragment() && p.is_later_fragment());
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), IpProtocol::Udp);
        assert_eq!(p.src_addr(), Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(p.dst_addr(), Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(p.options(), &[1, 1, 1, 0]);
        assert_eq!(p.payload(), &[0xde, 0xad, 0xbe, 0xef], "padding excluded");
        assert!(p.verify_checksum());
    }

    #[test]
    fn length_errors() {
        let b = fixture();
        for n in 0..28 {
            assert_eq!(
                Ipv4Packet::new_checked(&b[..n]).unwrap_err(),
                Error::Truncated,
                "{n}"
            );
        }
        let mut bad = b.clone();
        bad[0] = 0x44;
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::BadIhl
        );
        bad[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::BadVersion
        );
        bad[0] = 0x4f; // 60-byte header in a 30-byte buffer
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::Truncated
        );
        let mut bad = b.clone();
        bad[3] = 23; // total length below the 24-byte header
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::BadLength
        );
        bad[3] = 31; // beyond the buffer
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    fn build_round_trip() {
        let mut buf = [0u8; 24];
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..]);
        p.set_version_and_header_len(20);
        p.set_dscp_ecn(46, 1);
        p.set_total_len(24);
        p.set_ident(7);
        p.set_frag(true, false, 0);
        p.set_ttl(3);
        p.set_protocol(IpProtocol::Tcp);
        p.set_src_addr(Ipv4Addr::new(10, 0, 0, 1));
        p.set_dst_addr(Ipv4Addr::new(10, 0, 0, 2));
        p.fill_checksum();
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert_eq!((p.dscp(), p.ecn(), p.ident(), p.ttl()), (46, 1, 7, 3));
        assert!(p.dont_frag() && !p.is_fragment());
        assert_eq!(p.protocol(), IpProtocol::Tcp);
        assert!(p.verify_checksum());
        assert_eq!(p.payload().len(), 4);
    }

    #[test]
    fn incremental_setters_keep_checksum_valid() {
        let mut b = fixture();
        let mut p = Ipv4Packet::new_checked(&mut b[..]).unwrap();
        let old = p.set_src_addr_incremental(Ipv4Addr::new(203, 0, 113, 9));
        assert_eq!(old, Ipv4Addr::new(198, 18, 0, 1));
        assert!(p.verify_checksum());
        p.set_dst_addr_incremental(Ipv4Addr::new(255, 255, 255, 255));
        assert!(p.verify_checksum());
        assert_eq!(p.decrement_ttl(), 63);
        assert!(p.verify_checksum());
        p.set_ttl_incremental(1);
        assert_eq!(p.decrement_ttl(), 0);
        assert_eq!(p.decrement_ttl(), 0);
        assert!(p.verify_checksum());
        let after = p.checksum();
        p.fill_checksum();
        assert_eq!(p.checksum(), after, "incremental equals full recomputation");
    }
}
