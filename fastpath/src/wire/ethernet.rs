//! Ethernet II frames with at most one 802.1Q VLAN tag.
//!
//! A frame whose outer EtherType is 802.1Q must hold the 4-byte tag; [`EthernetFrame::header_len`]
//! is then 18 and is the L3 offset. A second tag (QinQ) is not unwrapped: it shows up as
//! [`EtherType::Vlan`] or [`EtherType::QinQ`] from [`EthernetFrame::inner_ethertype`].

use super::{Error, Field, Result, read_u16, write_u16};
use core::fmt;

mod field {
    use super::Field;
    pub const DESTINATION: Field = 0..6;
    pub const SOURCE: Field = 6..12;
    pub const ETHERTYPE: Field = 12..14;
    /// Inside the 802.1Q tag, relative to the frame start.
    pub const VLAN_TCI: Field = 14..16;
    pub const VLAN_ETHERTYPE: Field = 16..18;
}

/// Length of an untagged Ethernet II header.
pub const HEADER_LEN: usize = 14;
/// Length of an Ethernet II header with one 802.1Q tag.
pub const VLAN_HEADER_LEN: usize = 18;

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// The broadcast address.
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    /// Copies an address out of a 6-byte slice; `None` when the length differs.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(EthernetAddress)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }

    /// Group bit set (multicast or broadcast).
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// All ones.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// EtherType values the fastpath distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    /// 0x0800
    Ipv4,
    /// 0x0806
    Arp,
    /// 0x8100, an 802.1Q tag
    Vlan,
    /// 0x88a8, an 802.1ad service tag
    QinQ,
    /// 0x86dd
    Ipv6,
    /// Anything else.
    Unknown(u16),
}

impl From<u16> for EtherType {
    #[inline]
    fn from(value: u16) -> Self {
        match value {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            0x8100 => EtherType::Vlan,
            0x88a8 => EtherType::QinQ,
            0x86dd => EtherType::Ipv6,
            other => EtherType::Unknown(other),
        }
    }
}

impl From<EtherType> for u16 {
    #[inline]
    fn from(value: EtherType) -> Self {
        match value {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Vlan => 0x8100,
            EtherType::QinQ => 0x88a8,
            EtherType::Ipv6 => 0x86dd,
            EtherType::Unknown(other) => other,
        }
    }
}

/// A view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps untrusted bytes and runs [`Self::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// Checks that the buffer holds the header, including the VLAN tag when there is one.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let data = self.buffer.as_ref();
        if data.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.ethertype() == EtherType::Vlan && data.len() < VLAN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination MAC.
    #[inline]
    pub fn dst_addr(&self) -> EthernetAddress {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::DESTINATION]);
        EthernetAddress(a)
    }

    /// Source MAC.
    #[inline]
    pub fn src_addr(&self) -> EthernetAddress {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SOURCE]);
        EthernetAddress(a)
    }

    /// The outer EtherType (0x8100 for a tagged frame).
    #[inline]
    pub fn ethertype(&self) -> EtherType {
        EtherType::from(read_u16(self.buffer.as_ref(), field::ETHERTYPE.start))
    }

    /// Whether the frame carries an 802.1Q tag.
    #[inline]
    pub fn has_vlan(&self) -> bool {
        self.ethertype() == EtherType::Vlan
    }

    /// The 802.1Q tag control information (PCP, DEI, VID), if tagged.
    #[inline]
    pub fn vlan_tci(&self) -> Option<u16> {
        self.has_vlan()
            .then(|| read_u16(self.buffer.as_ref(), field::VLAN_TCI.start))
    }

    /// The 12-bit VLAN id, if tagged.
    #[inline]
    pub fn vlan_id(&self) -> Option<u16> {
        self.vlan_tci().map(|tci| tci & 0x0fff)
    }

    /// The EtherType of the payload: after the VLAN tag if there is one.
    #[inline]
    pub fn inner_ethertype(&self) -> EtherType {
        if self.has_vlan() {
            EtherType::from(read_u16(self.buffer.as_ref(), field::VLAN_ETHERTYPE.start))
        } else {
            self.ethertype()
        }
    }

    /// Header length, which is the L3 offset: 14, or 18 with a VLAN tag.
    #[inline]
    pub fn header_len(&self) -> usize {
        if self.has_vlan() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// The L3 packet (to the end of the buffer, Ethernet padding included).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination MAC.
    #[inline]
    pub fn set_dst_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&addr.0);
    }

    /// Sets the source MAC.
    #[inline]
    pub fn set_src_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&addr.0);
    }

    /// Sets the outer EtherType. Setting [`EtherType::Vlan`] on a short buffer breaks the
    /// `check_len` promise.
    #[inline]
    pub fn set_ethertype(&mut self, value: EtherType) {
        write_u16(self.buffer.as_mut(), field::ETHERTYPE.start, value.into());
    }

    /// Sets the TCI of an existing tag; does nothing on an untagged frame.
    #[inline]
    pub fn set_vlan_tci(&mut self, tci: u16) {
        if self.has_vlan() {
            write_u16(self.buffer.as_mut(), field::VLAN_TCI.start, tci);
        }
    }

    /// Sets the payload EtherType (after the tag if tagged, else the outer one).
    #[inline]
    pub fn set_inner_ethertype(&mut self, value: EtherType) {
        if self.has_vlan() {
            write_u16(
                self.buffer.as_mut(),
                field::VLAN_ETHERTYPE.start,
                value.into(),
            );
        } else {
            self.set_ethertype(value);
        }
    }

    /// The mutable L3 packet.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        &mut self.buffer.as_mut()[start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNTAGGED: [u8; 18] = [
        0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02, 0x08, 0x00, 0xaa, 0xbb, 0xcc, 0xdd,
    ];
    const TAGGED: [u8; 20] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 0x02, 0x81, 0x00, 0xa0, 0x64, 0x86,
        0xdd, 0xaa, 0xbb,
    ];

    #[test]
    fn untagged_fixture() {
        let f = EthernetFrame::new_checked(&UNTAGGED[..]).unwrap();
        assert_eq!(f.dst_addr(), EthernetAddress([2, 0, 0, 0, 0, 1]));
        assert_eq!(f.src_addr().to_string(), "02:00:00:00:00:02");
        assert_eq!(f.ethertype(), EtherType::Ipv4);
        assert_eq!(f.inner_ethertype(), EtherType::Ipv4);
        assert_eq!(f.vlan_id(), None);
        assert_eq!(f.header_len(), 14);
        assert_eq!(f.payload(), &[0xaa, 0xbb, 0xcc, 0xdd]);
    }

    #[test]
    fn tagged_fixture() {
        let f = EthernetFrame::new_checked(&TAGGED[..]).unwrap();
        assert!(f.dst_addr().is_broadcast());
        assert_eq!(f.ethertype(), EtherType::Vlan);
        assert_eq!(f.vlan_tci(), Some(0xa064));
        assert_eq!(f.vlan_id(), Some(100));
        assert_eq!(f.inner_ethertype(), EtherType::Ipv6);
        assert_eq!(f.header_len(), 18);
        assert_eq!(f.payload(), &[0xaa, 0xbb]);
    }

    #[test]
    fn truncated_headers() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                EthernetFrame::new_checked(&UNTAGGED[..n]).unwrap_err(),
                Error::Truncated
            );
        }
        for n in 0..VLAN_HEADER_LEN {
            assert_eq!(
                EthernetFrame::new_checked(&TAGGED[..n]).unwrap_err(),
                Error::Truncated
            );
        }
        assert!(EthernetFrame::new_checked(&TAGGED[..18]).is_ok());
    }

    #[test]
    fn round_trip_setters() {
        let mut buf = TAGGED;
        let mut f = EthernetFrame::new_checked(&mut buf[..]).unwrap();
        f.set_dst_addr(EthernetAddress([1, 2, 3, 4, 5, 6]));
        f.set_src_addr(EthernetAddress([7, 8, 9, 10, 11, 12]));
        f.set_vlan_tci(0x0fff);
        f.set_inner_ethertype(EtherType::Ipv4);
        assert_eq!(f.dst_addr().0, [1, 2, 3, 4, 5, 6]);
        assert_eq!(f.src_addr().0, [7, 8, 9, 10, 11, 12]);
        assert_eq!(f.vlan_id(), Some(0x0fff));
        assert_eq!(f.inner_ethertype(), EtherType::Ipv4);
        assert_eq!(&buf[12..18], &[0x81, 0x00, 0x0f, 0xff, 0x08, 0x00]);
    }

    #[test]
    fn ethertype_round_trip() {
        for v in [0x0800u16, 0x0806, 0x8100, 0x88a8, 0x86dd, 0x1234] {
            assert_eq!(u16::from(EtherType::from(v)), v);
        }
        assert_eq!(EtherType::from(0x1234), EtherType::Unknown(0x1234));
    }
}
