//! Link types a replay accepts, and how each becomes the Ethernet frame the pipeline takes.
//!
//! - Ethernet (1): as captured.
//! - Linux cooked captures, SLL (113, `tcpdump -i any` before libpcap 1.10) and SLL2 (276,
//!   today's `tcpdump -i any`): the cooked header's protocol becomes the EtherType; the
//!   destination MAC is the pipeline's own (the pipeline does not check it, and a frame for
//!   the NIC carries it); the source MAC is the cooked header's link-layer address when it is
//!   6 bytes long, else 00:00:00:00:00:00. Packets of every direction are kept (a client's
//!   own capture holds its requests as outgoing packets).
//! - Raw IP (101, by the version nibble; 228 IPv4; 229 IPv6): the same MACs (source zero).
//!
//! A packet that carries neither IP nor ARP (nor a VLAN tag, which libpcap puts back into a
//! cooked capture's payload) is skipped with [`Skip::NotIp`]; one shorter than its cooked
//! header with [`Skip::Truncated`].

/// `LINKTYPE_ETHERNET`.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// `LINKTYPE_RAW`: raw IPv4 or IPv6, told apart by the version nibble.
pub const LINKTYPE_RAW: u32 = 101;
/// `LINKTYPE_LINUX_SLL`: Linux cooked capture v1.
pub const LINKTYPE_LINUX_SLL: u32 = 113;
/// `LINKTYPE_IPV4`: raw IPv4.
pub const LINKTYPE_IPV4: u32 = 228;
/// `LINKTYPE_IPV6`: raw IPv6.
pub const LINKTYPE_IPV6: u32 = 229;
/// `LINKTYPE_LINUX_SLL2`: Linux cooked capture v2.
pub const LINKTYPE_LINUX_SLL2: u32 = 276;

/// The supported link types, for error messages.
pub const SUPPORTED: &str = "1 (Ethernet), 101 (raw IP), 113 (Linux cooked v1, SLL), \
    228 (raw IPv4), 229 (raw IPv6), 276 (Linux cooked v2, SLL2)";

const SLL_HEADER_LEN: usize = 16;
const SLL2_HEADER_LEN: usize = 20;
/// `ARPHRD_NETLINK`: the cooked protocol field then holds a netlink family.
const ARPHRD_NETLINK: u16 = 824;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_QINQ: u16 = 0x88a8;

/// Whether a replay can read packets of `linktype`.
pub fn supported(linktype: u32) -> bool {
    matches!(
        linktype,
        LINKTYPE_ETHERNET
            | LINKTYPE_RAW
            | LINKTYPE_LINUX_SLL
            | LINKTYPE_IPV4
            | LINKTYPE_IPV6
            | LINKTYPE_LINUX_SLL2
    )
}

/// Why a captured packet is not replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    /// Neither IP nor ARP (nor VLAN-tagged).
    NotIp,
    /// Shorter than its link type's header.
    Truncated,
}

impl Skip {
    /// The reason's name in the replay's report.
    pub const fn name(self) -> &'static str {
        match self {
            Skip::NotIp => "not_ip",
            Skip::Truncated => "truncated_link_header",
        }
    }
}

/// Writes into `out` the Ethernet frame for `data` captured with `linktype` (one of the
/// [`supported`] ones; any other is [`Skip::NotIp`]), `dst_mac` as its destination unless
/// the capture is Ethernet already.
pub fn to_ethernet(
    linktype: u32,
    data: &[u8],
    dst_mac: [u8; 6],
    out: &mut Vec<u8>,
) -> Result<(), Skip> {
    out.clear();
    let (ethertype, src, payload) = match linktype {
        LINKTYPE_ETHERNET => {
            out.extend_from_slice(data);
            return Ok(());
        }
        LINKTYPE_RAW => match data.first().map(|b| b >> 4) {
            Some(4) => (ETHERTYPE_IPV4, &[][..], data),
            Some(6) => (ETHERTYPE_IPV6, &[][..], data),
            _ => return Err(Skip::NotIp),
        },
        LINKTYPE_IPV4 => (ETHERTYPE_IPV4, &[][..], data),
        LINKTYPE_IPV6 => (ETHERTYPE_IPV6, &[][..], data),
        LINKTYPE_LINUX_SLL => {
            // packet type, ARPHRD type, address length, address (8), protocol.
            let h = data.get(..SLL_HEADER_LEN).ok_or(Skip::Truncated)?;
            let hatype = u16::from_be_bytes([h[2], h[3]]);
            let halen = u16::from_be_bytes([h[4], h[5]]);
            let proto = u16::from_be_bytes([h[14], h[15]]);
            (
                cooked_ethertype(hatype, proto)?,
                cooked_mac(&h[6..14], usize::from(halen)),
                &data[SLL_HEADER_LEN..],
            )
        }
        LINKTYPE_LINUX_SLL2 => {
            // protocol, reserved, interface index (4), ARPHRD type, packet type, address
            // length, address (8).
            let h = data.get(..SLL2_HEADER_LEN).ok_or(Skip::Truncated)?;
            let proto = u16::from_be_bytes([h[0], h[1]]);
            let hatype = u16::from_be_bytes([h[8], h[9]]);
            (
                cooked_ethertype(hatype, proto)?,
                cooked_mac(&h[12..20], usize::from(h[11])),
                &data[SLL2_HEADER_LEN..],
            )
        }
        _ => return Err(Skip::NotIp),
    };
    out.extend_from_slice(&dst_mac);
    if src.len() == 6 {
        out.extend_from_slice(src);
    } else {
        out.extend_from_slice(&[0; 6]);
    }
    out.extend_from_slice(&ethertype.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

fn cooked_ethertype(hatype: u16, proto: u16) -> Result<u16, Skip> {
    match proto {
        _ if hatype == ARPHRD_NETLINK => Err(Skip::NotIp),
        ETHERTYPE_IPV4 | ETHERTYPE_IPV6 | ETHERTYPE_ARP | ETHERTYPE_VLAN | ETHERTYPE_QINQ => {
            Ok(proto)
        }
        _ => Err(Skip::NotIp),
    }
}

/// The cooked header's address when it is a 6-byte MAC, else nothing.
fn cooked_mac(addr: &[u8], len: usize) -> &[u8] {
    if len == 6 { &addr[..6] } else { &[] }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DST: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const SRC: [u8; 6] = [2, 0, 0, 0, 0xcc, 1];

    fn ipv4() -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0];
        p.extend_from_slice(&[198, 18, 0, 1, 198, 18, 100, 53]);
        p
    }

    fn eth(src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = DST.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn sll(pkttype: u16, hatype: u16, addr: &[u8], proto: u16, payload: &[u8]) -> Vec<u8> {
        let mut h = pkttype.to_be_bytes().to_vec();
        h.extend_from_slice(&hatype.to_be_bytes());
        h.extend_from_slice(&(addr.len() as u16).to_be_bytes());
        let mut a = [0u8; 8];
        a[..addr.len()].copy_from_slice(addr);
        h.extend_from_slice(&a);
        h.extend_from_slice(&proto.to_be_bytes());
        h.extend_from_slice(payload);
        h
    }

    fn sll2(hatype: u16, addr: &[u8], proto: u16, payload: &[u8]) -> Vec<u8> {
        let mut h = proto.to_be_bytes().to_vec();
        h.extend_from_slice(&[0, 0, 0, 0, 0, 7]);
        h.extend_from_slice(&hatype.to_be_bytes());
        h.push(0);
        h.push(addr.len() as u8);
        let mut a = [0u8; 8];
        a[..addr.len()].copy_from_slice(addr);
        h.extend_from_slice(&a);
        h.extend_from_slice(payload);
        h
    }

    fn convert(lt: u32, data: &[u8]) -> Result<Vec<u8>, Skip> {
        let mut out = vec![9; 3];
        to_ethernet(lt, data, DST, &mut out).map(|()| out)
    }

    #[test]
    fn cooked_frames_become_ethernet() {
        let ip = ipv4();
        assert_eq!(
            convert(LINKTYPE_LINUX_SLL, &sll(0, 1, &SRC, 0x0800, &ip)),
            Ok(eth(SRC, 0x0800, &ip))
        );
        assert_eq!(
            convert(LINKTYPE_LINUX_SLL2, &sll2(1, &SRC, 0x0800, &ip)),
            Ok(eth(SRC, 0x0800, &ip))
        );
        // Loopback (no address) and a tunnel with a 4-byte address: source MAC zero.
        assert_eq!(
            convert(LINKTYPE_LINUX_SLL2, &sll2(772, &[], 0x86dd, &ip)),
            Ok(eth([0; 6], 0x86dd, &ip))
        );
        assert_eq!(
            convert(
                LINKTYPE_LINUX_SLL,
                &sll(4, 778, &[198, 18, 0, 1], 0x0800, &ip)
            ),
            Ok(eth([0; 6], 0x0800, &ip))
        );
        assert_eq!(
            convert(LINKTYPE_LINUX_SLL2, &sll2(1, &SRC, 0x8100, &ip)),
            Ok(eth(SRC, 0x8100, &ip))
        );
    }

    #[test]
    fn raw_ip_becomes_ethernet() {
        let ip = ipv4();
        assert_eq!(convert(LINKTYPE_RAW, &ip), Ok(eth([0; 6], 0x0800, &ip)));
        let mut ip6 = vec![0x60];
        ip6.extend_from_slice(&[0; 39]);
        assert_eq!(convert(LINKTYPE_RAW, &ip6), Ok(eth([0; 6], 0x86dd, &ip6)));
        assert_eq!(convert(LINKTYPE_IPV4, &ip), Ok(eth([0; 6], 0x0800, &ip)));
        assert_eq!(convert(LINKTYPE_IPV6, &ip6), Ok(eth([0; 6], 0x86dd, &ip6)));
        assert_eq!(convert(LINKTYPE_RAW, &[0x15, 0]), Err(Skip::NotIp));
        assert_eq!(convert(LINKTYPE_RAW, &[]), Err(Skip::NotIp));
        assert_eq!(convert(LINKTYPE_ETHERNET, &[1, 2, 3]), Ok(vec![1, 2, 3]));
    }

    #[test]
    fn other_protocols_are_skipped() {
        let ip = ipv4();
        // 802.2 LLC, a netlink capture, a short header.
        assert_eq!(
            convert(LINKTYPE_LINUX_SLL, &sll(0, 1, &SRC, 0x0004, &ip)),
            Err(Skip::NotIp)
        );
        assert_eq!(
            convert(LINKTYPE_LINUX_SLL2, &sll2(824, &[], 0x0800, &ip)),
            Err(Skip::NotIp)
        );
        assert_eq!(
            convert(LINKTYPE_LINUX_SLL2, &sll2(1, &SRC, 0x0800, &[])[..19]),
            Err(Skip::Truncated)
        );
        assert_eq!(convert(LINKTYPE_LINUX_SLL, &[0; 15]), Err(Skip::Truncated));
        assert!(!supported(105) && supported(276) && supported(113));
    }
}
