//! One call from an Ethernet frame to the L4 offset: the pipeline's first stage.
//!
//! [`parse_frame`] checks Ethernet (one optional VLAN tag) and the IPv4 or IPv6 header
//! (walking IPv6 extension headers) and reports where the L4 bytes are. It does not check the
//! L4 header: wrap `&frame[info.l4_range()]` with `TcpPacket::new_checked` etc., which see
//! exactly the L4 bytes (Ethernet padding excluded).

use super::{
    EtherType, EthernetFrame, IpProtocol, Ipv4Packet, Ipv6FragmentInfo, Ipv6Packet, Result,
};
use core::ops::Range;

/// What the L3 header said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum L3Info {
    /// A valid IPv4 header.
    Ipv4 {
        /// The L4 protocol.
        protocol: IpProtocol,
        /// MF set or non-zero offset.
        fragment: bool,
        /// Non-zero offset: no L4 header in this packet.
        later_fragment: bool,
    },
    /// A valid IPv6 header; extension headers walked.
    Ipv6 {
        /// The first non-extension next header.
        protocol: IpProtocol,
        /// The fragment header, if any.
        fragment: Option<Ipv6FragmentInfo>,
    },
    /// ARP (always for the kernel).
    Arp,
    /// Any other EtherType; `l4_*` are zero.
    Other,
}

/// Offsets (from the frame start) and classification of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameInfo {
    /// The 802.1Q TCI, if tagged.
    pub vlan_tci: Option<u16>,
    /// The EtherType after the VLAN tag.
    pub ethertype: EtherType,
    /// Start of the L3 header (14 or 18).
    pub l3_offset: usize,
    /// L3 classification.
    pub l3: L3Info,
    /// Start of the L4 header (after IPv4 options / IPv6 extension headers).
    pub l4_offset: usize,
    /// L4 bytes up to the end given by the IP length field.
    pub l4_len: usize,
}

impl FrameInfo {
    /// The L4 bytes within the frame.
    #[inline]
    pub fn l4_range(&self) -> Range<usize> {
        self.l4_offset..self.l4_offset + self.l4_len
    }

    /// The L4 protocol for IP frames.
    #[inline]
    pub fn protocol(&self) -> Option<IpProtocol> {
        match self.l3 {
            L3Info::Ipv4 { protocol, .. } | L3Info::Ipv6 { protocol, .. } => Some(protocol),
            _ => None,
        }
    }

    /// Whether an L4 header is expected at `l4_offset` (not a later fragment).
    #[inline]
    pub fn has_l4_header(&self) -> bool {
        match self.l3 {
            L3Info::Ipv4 { later_fragment, .. } => !later_fragment,
            L3Info::Ipv6 { fragment, .. } => fragment.is_none_or(|f| f.offset == 0),
            _ => false,
        }
    }
}

/// Parses a frame down to the L4 offset. Errors come from the Ethernet, IPv4 or IPv6 checks
/// (see [`super::Error`]); non-IP frames are not errors.
#[inline]
pub fn parse_frame(frame: &[u8]) -> Result<FrameInfo> {
    let eth = EthernetFrame::new_checked(frame)?;
    let l3_offset = eth.header_len();
    let ethertype = eth.inner_ethertype();
    let mut info = FrameInfo {
        vlan_tci: eth.vlan_tci(),
        ethertype,
        l3_offset,
        l3: L3Info::Other,
        l4_offset: 0,
        l4_len: 0,
    };
    let l3 = eth.payload();
    match ethertype {
        EtherType::Ipv4 => {
            let ip = Ipv4Packet::new_checked(l3)?;
            info.l3 = L3Info::Ipv4 {
                protocol: ip.protocol(),
                fragment: ip.is_fragment(),
                later_fragment: ip.is_later_fragment(),
            };
            info.l4_offset = l3_offset + ip.header_len();
            info.l4_len = usize::from(ip.total_len()) - ip.header_len();
        }
        EtherType::Ipv6 => {
            let ip = Ipv6Packet::new_checked(l3)?;
            let ext = ip.walk_ext_headers()?;
            info.l3 = L3Info::Ipv6 {
                protocol: ext.protocol,
                fragment: ext.fragment,
            };
            info.l4_offset = l3_offset + ext.l4_offset;
            info.l4_len = super::ipv6::HEADER_LEN + usize::from(ip.payload_len()) - ext.l4_offset;
        }
        EtherType::Arp => info.l3 = L3Info::Arp,
        _ => {}
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Error, checksum};

    fn ipv4_udp_frame(vlan: bool) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = vec![
            0x45, 0, 0, 30, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = checksum::checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0, 1, 0, 2, 0, 10, 0, 0, 0xaa, 0xbb]);
        f.resize(f.len() + 16, 0); // Ethernet padding
        f
    }

    #[test]
    fn ipv4_offsets_with_and_without_vlan() {
        for vlan in [false, true] {
            let f = ipv4_udp_frame(vlan);
            let info = parse_frame(&f).unwrap();
            let base = if vlan { 18 } else { 14 };
            assert_eq!(info.vlan_tci, vlan.then_some(42));
            assert_eq!(info.ethertype, EtherType::Ipv4);
            assert_eq!(info.l3_offset, base);
            assert_eq!(info.protocol(), Some(IpProtocol::Udp));
            assert_eq!(info.l4_range(), base + 20..base + 30);
            assert!(info.has_l4_header());
        }
    }

    #[test]
    fn errors_and_non_ip() {
        let f = ipv4_udp_frame(false);
        assert_eq!(parse_frame(&f[..20]), Err(Error::Truncated));
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(parse_frame(&arp).unwrap().l3, L3Info::Arp);
        arp[12..14].copy_from_slice(&[0x88, 0xcc]);
        let info = parse_frame(&arp).unwrap();
        assert_eq!(
            (info.l3, info.protocol(), info.has_l4_header()),
            (L3Info::Other, None, false)
        );
    }
}
