//! TCP segments. The view covers the L4 bytes as bounded by the IP length field (pass
//! `Ipv4Packet::payload()` or the IPv6 payload from the L4 offset), so the payload ends
//! where the segment ends.

use super::{Error, Field, Result, checksum, read_u16, read_u32, write_u16, write_u32};
use core::net::{Ipv4Addr, Ipv6Addr};

mod field {
    use super::Field;
    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const SEQ_NUM: Field = 4..8;
    pub const ACK_NUM: Field = 8..12;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WIN_SIZE: Field = 14..16;
    pub const CHECKSUM: Field = 16..18;
    pub const URGENT: Field = 18..20;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;
/// Offset of the checksum field.
pub(crate) const CHECKSUM_AT: usize = field::CHECKSUM.start;

/// The TCP flags byte: the flow table's type, one definition for the views and the state
/// machine.
pub use vocab::TcpFlags;

/// A view of a TCP segment.
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Wraps a buffer without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        TcpPacket { buffer }
    }

    /// Wraps untrusted bytes and runs [`Self::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the fixed header and `20 <= data offset * 4 <= segment length`.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let header_len = self.header_len();
        if header_len < HEADER_LEN || header_len > len {
            return Err(Error::BadDataOffset);
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

    /// Sequence number.
    #[inline]
    pub fn seq_number(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SEQ_NUM.start)
    }

    /// Acknowledgement number.
    #[inline]
    pub fn ack_number(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::ACK_NUM.start)
    }

    /// Header length in bytes (data offset * 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::DATA_OFF] >> 4) * 4
    }

    /// The flags byte.
    #[inline]
    pub fn flags(&self) -> TcpFlags {
        TcpFlags(self.buffer.as_ref()[field::FLAGS])
    }

    /// Window size.
    #[inline]
    pub fn window_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::WIN_SIZE.start)
    }

    /// Checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// Urgent pointer.
    #[inline]
    pub fn urgent_at(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::URGENT.start)
    }

    /// Option bytes.
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    /// Segment data.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// Whether the checksum is right for an IPv4 pseudo-header.
    #[inline]
    pub fn verify_checksum_v4(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        checksum::l4_checksum_v4(&src.octets(), &dst.octets(), 6, self.buffer.as_ref()) == 0
    }

    /// Whether the checksum is right for an IPv6 pseudo-header.
    #[inline]
    pub fn verify_checksum_v6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        checksum::l4_checksum_v6(&src.octets(), &dst.octets(), 6, self.buffer.as_ref()) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
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

    /// Sets the sequence number.
    #[inline]
    pub fn set_seq_number(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::SEQ_NUM.start, value);
    }

    /// Sets the acknowledgement number.
    #[inline]
    pub fn set_ack_number(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::ACK_NUM.start, value);
    }

    /// Sets the header length in bytes (a multiple of 4, 20..=60), keeping the reserved bits.
    #[inline]
    pub fn set_header_len(&mut self, value: usize) {
        let b = &mut self.buffer.as_mut()[field::DATA_OFF];
        *b = (*b & 0x0f) | ((((value / 4) as u8) & 0x0f) << 4);
    }

    /// Sets the flags byte.
    #[inline]
    pub fn set_flags(&mut self, flags: TcpFlags) {
        self.buffer.as_mut()[field::FLAGS] = flags.0;
    }

    /// Sets the window size.
    #[inline]
    pub fn set_window_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::WIN_SIZE.start, value);
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM.start, value);
    }

    /// Sets the urgent pointer.
    #[inline]
    pub fn set_urgent_at(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::URGENT.start, value);
    }

    /// Sets the source port and patches the checksum; returns the old port.
    #[inline]
    pub fn set_src_port_incremental(&mut self, port: u16) -> u16 {
        let old = self.src_port();
        let csum = checksum::update_u16(self.checksum(), old, port);
        self.set_src_port(port);
        self.set_checksum(csum);
        old
    }

    /// Sets the destination port and patches the checksum; returns the old port.
    #[inline]
    pub fn set_dst_port_incremental(&mut self, port: u16) -> u16 {
        let old = self.dst_port();
        let csum = checksum::update_u16(self.checksum(), old, port);
        self.set_dst_port(port);
        self.set_checksum(csum);
        old
    }

    /// Recomputes the checksum with an IPv4 pseudo-header.
    #[inline]
    pub fn fill_checksum_v4(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let c = checksum::l4_checksum_v4(&src.octets(), &dst.octets(), 6, self.buffer.as_ref());
        self.set_checksum(c);
    }

    /// Recomputes the checksum with an IPv6 pseudo-header.
    #[inline]
    pub fn fill_checksum_v6(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let c = checksum::l4_checksum_v6(&src.octets(), &dst.octets(), 6, self.buffer.as_ref());
        self.set_checksum(c);
    }

    /// The mutable segment data.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        &mut self.buffer.as_mut()[start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SYN 40000 -> 80, seq 1, window 64240, MSS option 1460, 2 data bytes.
    const SYN: [u8; 26] = [
        0x9c, 0x40, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x60, 0x02, 0xfa, 0xf0, 0, 0, 0, 0, 2, 4,
        0x05, 0xb4, 0xab, 0xcd,
    ];
    const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 1);

    #[test]
    fn parse_fixture() {
        let p = TcpPacket::new_checked(&SYN[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port()), (40000, 80));
        assert_eq!((p.seq_number(), p.ack_number()), (1, 0));
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.flags(), TcpFlags::SYN);
        assert!(!p.flags().contains(TcpFlags::SYN | TcpFlags::ACK));
        assert!(p.flags().intersects(TcpFlags::SYN | TcpFlags::ACK));
        assert_eq!(p.window_len(), 64240);
        assert_eq!(p.options(), &[2, 4, 0x05, 0xb4]);
        assert_eq!(p.payload(), &[0xab, 0xcd]);
    }

    #[test]
    fn data_offset_errors() {
        for n in 0..20 {
            assert_eq!(
                TcpPacket::new_checked(&SYN[..n]).unwrap_err(),
                Error::Truncated
            );
        }
        for n in 20..24 {
            assert_eq!(
                TcpPacket::new_checked(&SYN[..n]).unwrap_err(),
                Error::BadDataOffset
            );
        }
        let mut bad = SYN;
        bad[12] = 0x40;
        assert_eq!(
            TcpPacket::new_checked(&bad[..]).unwrap_err(),
            Error::BadDataOffset
        );
        bad[12] = 0xf0;
        assert_eq!(
            TcpPacket::new_checked(&bad[..]).unwrap_err(),
            Error::BadDataOffset
        );
    }

    #[test]
    fn checksum_and_incremental_ports() {
        let mut buf = SYN;
        let mut p = TcpPacket::new_checked(&mut buf[..]).unwrap();
        p.fill_checksum_v4(SRC, DST);
        assert!(p.verify_checksum_v4(SRC, DST));
        assert!(!p.verify_checksum_v4(SRC, Ipv4Addr::new(198, 18, 100, 2)));
        assert_eq!(p.set_dst_port_incremental(8080), 80);
        p.set_src_port_incremental(1);
        assert!(p.verify_checksum_v4(SRC, DST));
        let inc = p.checksum();
        p.fill_checksum_v4(SRC, DST);
        assert_eq!(p.checksum(), inc);
    }

    #[test]
    fn build_round_trip() {
        let mut buf = [0u8; 20];
        let mut p = TcpPacket::new_unchecked(&mut buf[..]);
        p.set_src_port(1);
        p.set_dst_port(2);
        p.set_seq_number(0xdeadbeef);
        p.set_ack_number(0x01020304);
        p.set_header_len(20);
        p.set_flags(TcpFlags::ACK | TcpFlags::FIN);
        p.set_window_len(512);
        p.set_urgent_at(9);
        let p = TcpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(
            (p.src_port(), p.dst_port(), p.seq_number()),
            (1, 2, 0xdeadbeef)
        );
        assert_eq!(
            (p.ack_number(), p.window_len(), p.urgent_at()),
            (0x01020304, 512, 9)
        );
        assert_eq!(p.flags().bits(), 0x11);
        assert!(p.payload().is_empty());
    }
}
