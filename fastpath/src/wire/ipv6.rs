//! IPv6 headers and a bounded walk over extension headers to the L4 header.
//!
//! `check_len` enforces `40 + payload length <= buffer`; [`Ipv6Packet::payload`] is bounded by
//! the payload length. A payload length of 0 (jumbograms) is taken literally: empty payload.
//!
//! [`Ipv6Packet::walk_ext_headers`] skips at most [`EXT_HEADERS_MAX`] headers of the kinds
//! hop-by-hop, routing, destination options, fragment and AH, and stops at the first other
//! next-header value (TCP, UDP, ICMPv6, SCTP, ESP, no-next-header, unknown).

use super::{Error, Field, IpProtocol, Result, checksum, read_u16, read_u32, write_u16};
use core::net::Ipv6Addr;

mod field {
    use super::Field;
    pub const VER_TC_FLOW: Field = 0..4;
    pub const LENGTH: Field = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Field = 8..24;
    pub const DST_ADDR: Field = 24..40;
}

/// Length of the fixed header.
pub const HEADER_LEN: usize = 40;
/// The most extension headers [`Ipv6Packet::walk_ext_headers`] skips before giving up.
pub const EXT_HEADERS_MAX: usize = 8;
/// Length of a fragment extension header.
pub const FRAG_HEADER_LEN: usize = 8;

/// The fields of a fragment extension header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6FragmentInfo {
    /// Fragment offset in bytes.
    pub offset: u16,
    /// More-fragments flag.
    pub more_frags: bool,
    /// Identification.
    pub ident: u32,
    /// Offset of the fragment header from the start of the IPv6 header.
    pub header_offset: usize,
}

/// Result of walking the extension headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6ExtInfo {
    /// The first next-header value that is not a walked extension header.
    pub protocol: IpProtocol,
    /// Offset of that header from the start of the IPv6 header (40 without extensions).
    pub l4_offset: usize,
    /// The fragment header, if one was crossed. When its offset is non-zero, no L4 header
    /// follows.
    pub fragment: Option<Ipv6FragmentInfo>,
    /// How many extension headers were skipped.
    pub ext_count: u8,
}

/// A view of an IPv6 packet.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps a buffer without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Wraps untrusted bytes and runs [`Self::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks version 6 and that the payload length fits in the buffer.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 6 {
            return Err(Error::BadVersion);
        }
        if HEADER_LEN + usize::from(self.payload_len()) > len {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Wraps the packet quoted inside an ICMPv6 error, whose payload length usually exceeds
    /// the quote, and runs [`Self::check_header_len`].
    #[inline]
    pub fn new_quoted(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_header_len()?;
        Ok(p)
    }

    /// The weaker check for quoted packets: the fixed header fits and the version is 6.
    /// Afterwards every accessor is safe except [`Self::payload`] and [`Self::payload_mut`]:
    /// use [`Self::payload_quoted`]. [`Self::walk_ext_headers`] stays within the buffer.
    #[inline]
    pub fn check_header_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 6 {
            return Err(Error::BadVersion);
        }
        Ok(())
    }

    /// The payload bounded by both the payload length and the buffer.
    #[inline]
    pub fn payload_quoted(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.quoted_end()]
    }

    #[inline]
    fn quoted_end(&self) -> usize {
        (HEADER_LEN + usize::from(self.payload_len())).min(self.buffer.as_ref().len())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Version nibble.
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// Traffic class.
    #[inline]
    pub fn traffic_class(&self) -> u8 {
        (read_u16(self.buffer.as_ref(), 0) >> 4) as u8
    }

    /// Flow label (20 bits).
    #[inline]
    pub fn flow_label(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::VER_TC_FLOW.start) & 0x000f_ffff
    }

    /// Payload length (extension headers included).
    #[inline]
    pub fn payload_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// The next header of the fixed header.
    #[inline]
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::NXT_HDR])
    }

    /// Hop limit.
    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC_ADDR]);
        Ipv6Addr::from(a)
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST_ADDR]);
        Ipv6Addr::from(a)
    }

    /// Everything after the fixed header, bounded by the payload length.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + usize::from(self.payload_len())]
    }

    /// Walks the extension headers to the L4 header. Errors: [`Error::Truncated`] when an
    /// extension header runs past the payload length (or the buffer), [`Error::TooManyExtHeaders`] past
    /// [`EXT_HEADERS_MAX`].
    #[inline]
    pub fn walk_ext_headers(&self) -> Result<Ipv6ExtInfo> {
        let data = self.buffer.as_ref();
        // Bounded by the buffer too, so that quoted packets can be walked.
        let end = self.quoted_end();
        let mut protocol = self.next_header();
        let mut offset = HEADER_LEN;
        let mut fragment = None;
        let mut count = 0u8;
        loop {
            let is_ext = matches!(
                protocol,
                IpProtocol::HopByHop
                    | IpProtocol::Ipv6Route
                    | IpProtocol::Ipv6Opts
                    | IpProtocol::Ah
                    | IpProtocol::Ipv6Frag
            );
            if is_ext && usize::from(count) >= EXT_HEADERS_MAX {
                return Err(Error::TooManyExtHeaders);
            }
            let len = match protocol {
                IpProtocol::HopByHop | IpProtocol::Ipv6Route | IpProtocol::Ipv6Opts => {
                    if offset + 2 > end {
                        return Err(Error::Truncated);
                    }
                    (usize::from(data[offset + 1]) + 1) * 8
                }
                IpProtocol::Ah => {
                    if offset + 2 > end {
                        return Err(Error::Truncated);
                    }
                    // RFC 4302: length in 4-byte units, minus 2.
                    (usize::from(data[offset + 1]) + 2) * 4
                }
                IpProtocol::Ipv6Frag => FRAG_HEADER_LEN,
                _ => {
                    return Ok(Ipv6ExtInfo {
                        protocol,
                        l4_offset: offset,
                        fragment,
                        ext_count: count,
                    });
                }
            };
            if offset + len > end {
                return Err(Error::Truncated);
            }
            if protocol == IpProtocol::Ipv6Frag {
                let off_flags = read_u16(data, offset + 2);
                fragment = Some(Ipv6FragmentInfo {
                    offset: off_flags & 0xfff8,
                    more_frags: off_flags & 1 != 0,
                    ident: read_u32(data, offset + 4),
                    header_offset: offset,
                });
            }
            protocol = IpProtocol::from(data[offset]);
            offset += len;
            count += 1;
        }
    }

    /// Sum of the pseudo-header for an L4 checksum over `l4_len` bytes of `protocol`.
    #[inline]
    pub fn pseudo_header_sum(&self, protocol: IpProtocol, l4_len: u32) -> u16 {
        checksum::pseudo_header_v6(
            &self.src_addr().octets(),
            &self.dst_addr().octets(),
            protocol.into(),
            l4_len,
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Sets version 6, the traffic class and the flow label.
    #[inline]
    pub fn set_version_tc_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let v = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0x000f_ffff);
        self.buffer.as_mut()[field::VER_TC_FLOW].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the payload length.
    #[inline]
    pub fn set_payload_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH.start, value);
    }

    /// Sets the next header.
    #[inline]
    pub fn set_next_header(&mut self, value: IpProtocol) {
        self.buffer.as_mut()[field::NXT_HDR] = value.into();
    }

    /// Sets the hop limit (IPv6 has no header checksum).
    #[inline]
    pub fn set_hop_limit(&mut self, value: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = value;
    }

    /// Decrements the hop limit (not below 0); returns the new value.
    #[inline]
    pub fn decrement_hop_limit(&mut self) -> u8 {
        let h = self.hop_limit().saturating_sub(1);
        self.set_hop_limit(h);
        h
    }

    /// Sets the source address; returns the old one for [`super::l4_update_for_addr_change`].
    #[inline]
    pub fn set_src_addr(&mut self, addr: Ipv6Addr) -> Ipv6Addr {
        let old = self.src_addr();
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&addr.octets());
        old
    }

    /// Sets the destination address; returns the old one.
    #[inline]
    pub fn set_dst_addr(&mut self, addr: Ipv6Addr) -> Ipv6Addr {
        let old = self.dst_addr();
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&addr.octets());
        old
    }

    /// The mutable payload, bounded by the payload length.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }

    /// The mutable [`Self::payload_quoted`].
    #[inline]
    pub fn payload_quoted_mut(&mut self) -> &mut [u8] {
        let end = self.quoted_end();
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(next: u8, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0x60, 0x12, 0x34, 0x56, 0, 0, next, 64];
        b[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        b.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        b.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn fixed_header_fixture() {
        let mut b = header(17, &[1, 2, 3, 4, 5, 6, 7, 8]);
        b.extend_from_slice(&[0, 0]); // padding
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!(p.traffic_class(), 0x01);
        assert_eq!(p.flow_label(), 0x23456);
        assert_eq!(p.payload_len(), 8);
        assert_eq!(p.next_header(), IpProtocol::Udp);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.src_addr(), "2001:2::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.dst_addr(), "2001:2::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.payload(), &[1, 2, 3, 4, 5, 6, 7, 8]);
        let ext = p.walk_ext_headers().unwrap();
        assert_eq!(
            (ext.protocol, ext.l4_offset, ext.ext_count),
            (IpProtocol::Udp, 40, 0)
        );
        assert_eq!(ext.fragment, None);
    }

    #[test]
    fn hop_by_hop_routing_fragment_ah_tcp() {
        let mut ext = vec![43, 0, 1, 4, 0, 0, 0, 0]; // hop-by-hop (8 bytes) -> routing
        ext.extend_from_slice(&[44, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // routing 16
        ext.extend_from_slice(&[51, 0, 0x05, 0x09, 0xde, 0xad, 0xbe, 0xef]); // frag: off 0x508, M=1
        ext.extend_from_slice(&[60, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // AH, (1+2)*4 = 12
        ext.extend_from_slice(&[6, 0, 1, 4, 0, 0, 0, 0]); // destination options -> TCP
        ext.extend_from_slice(&[0u8; 20]);
        let b = header(0, &ext);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        let info = p.walk_ext_headers().unwrap();
        assert_eq!(info.protocol, IpProtocol::Tcp);
        assert_eq!(info.l4_offset, 40 + 8 + 16 + 8 + 12 + 8);
        assert_eq!(info.ext_count, 5);
        let frag = info.fragment.unwrap();
        assert_eq!(frag.offset, 0x0508);
        assert!(frag.more_frags);
        assert_eq!(frag.ident, 0xdeadbeef);
        assert_eq!(frag.header_offset, 64);
    }

    #[test]
    fn walk_errors() {
        // Hop-by-hop claims 16 bytes but only 8 are in the payload.
        let b = header(0, &[6, 1, 0, 0, 0, 0, 0, 0]);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.walk_ext_headers(), Err(Error::Truncated));
        // Nine destination-options headers in a row.
        let mut ext = Vec::new();
        for _ in 0..9 {
            ext.extend_from_slice(&[60, 0, 0, 0, 0, 0, 0, 0]);
        }
        let b = header(60, &ext);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.walk_ext_headers(), Err(Error::TooManyExtHeaders));
        // Eight are fine.
        let mut ext = ext[..64].to_vec();
        ext[56] = 17;
        ext.extend_from_slice(&[0u8; 8]);
        let b = header(60, &ext);
        let info = Ipv6Packet::new_checked(&b[..])
            .unwrap()
            .walk_ext_headers()
            .unwrap();
        assert_eq!((info.protocol, info.l4_offset), (IpProtocol::Udp, 104));
        // Payload ends exactly where the fixed header ends: the walk stops at an empty header.
        let b = header(44, &[]);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.walk_ext_headers(), Err(Error::Truncated));
    }

    #[test]
    fn length_errors_and_setters() {
        let b = header(6, &[0; 20]);
        for n in 0..b.len() {
            assert_eq!(
                Ipv6Packet::new_checked(&b[..n]).unwrap_err(),
                Error::Truncated
            );
        }
        let mut bad = b.clone();
        bad[0] = 0x40;
        assert_eq!(
            Ipv6Packet::new_checked(&bad[..]).unwrap_err(),
            Error::BadVersion
        );

        let mut b = b;
        let mut p = Ipv6Packet::new_checked(&mut b[..]).unwrap();
        p.set_version_tc_flow(0xb8, 0xfffff);
        let new: Ipv6Addr = "2001:2::99".parse().unwrap();
        let old = p.set_dst_addr(new);
        assert_eq!(old, "2001:2::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.decrement_hop_limit(), 63);
        p.set_next_header(IpProtocol::Udp);
        assert_eq!(p.dst_addr(), new);
        assert_eq!((p.traffic_class(), p.flow_label()), (0xb8, 0xfffff));
        assert_eq!(p.next_header(), IpProtocol::Udp);
    }
}
