//! What IPv4 and IPv6 share: protocol numbers and the L4 checksum fix-up after an address
//! rewrite.

use vocab::ip_proto;

use super::{Error, Result, checksum, read_u16, write_u16};

/// IP protocol / IPv6 next-header numbers (`vocab::ip_proto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpProtocol {
    /// 0, IPv6 hop-by-hop options
    HopByHop,
    /// 1
    Icmp,
    /// 2
    Igmp,
    /// 6
    Tcp,
    /// 17
    Udp,
    /// 43, IPv6 routing header
    Ipv6Route,
    /// 44, IPv6 fragment header
    Ipv6Frag,
    /// 50
    Esp,
    /// 51, authentication header
    Ah,
    /// 58
    Icmpv6,
    /// 59, IPv6 no next header
    Ipv6NoNxt,
    /// 60, IPv6 destination options
    Ipv6Opts,
    /// 132
    Sctp,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for IpProtocol {
    #[inline]
    fn from(value: u8) -> Self {
        match value {
            ip_proto::HOPOPT => IpProtocol::HopByHop,
            ip_proto::ICMP => IpProtocol::Icmp,
            ip_proto::IGMP => IpProtocol::Igmp,
            ip_proto::TCP => IpProtocol::Tcp,
            ip_proto::UDP => IpProtocol::Udp,
            ip_proto::IPV6_ROUTE => IpProtocol::Ipv6Route,
            ip_proto::IPV6_FRAG => IpProtocol::Ipv6Frag,
            ip_proto::ESP => IpProtocol::Esp,
            ip_proto::AH => IpProtocol::Ah,
            ip_proto::ICMPV6 => IpProtocol::Icmpv6,
            ip_proto::IPV6_NONXT => IpProtocol::Ipv6NoNxt,
            ip_proto::IPV6_OPTS => IpProtocol::Ipv6Opts,
            ip_proto::SCTP => IpProtocol::Sctp,
            other => IpProtocol::Unknown(other),
        }
    }
}

impl From<IpProtocol> for u8 {
    #[inline]
    fn from(value: IpProtocol) -> Self {
        match value {
            IpProtocol::HopByHop => ip_proto::HOPOPT,
            IpProtocol::Icmp => ip_proto::ICMP,
            IpProtocol::Igmp => ip_proto::IGMP,
            IpProtocol::Tcp => ip_proto::TCP,
            IpProtocol::Udp => ip_proto::UDP,
            IpProtocol::Ipv6Route => ip_proto::IPV6_ROUTE,
            IpProtocol::Ipv6Frag => ip_proto::IPV6_FRAG,
            IpProtocol::Esp => ip_proto::ESP,
            IpProtocol::Ah => ip_proto::AH,
            IpProtocol::Icmpv6 => ip_proto::ICMPV6,
            IpProtocol::Ipv6NoNxt => ip_proto::IPV6_NONXT,
            IpProtocol::Ipv6Opts => ip_proto::IPV6_OPTS,
            IpProtocol::Sctp => ip_proto::SCTP,
            IpProtocol::Unknown(other) => other,
        }
    }
}

/// Patches the L4 checksum in `l4` (the L4 header onwards) after the IP source or destination
/// address changed from `old` to `new` (4 or 16 bytes each), because TCP, UDP and ICMPv6
/// checksums cover the pseudo-header.
///
/// - TCP, ICMPv6: RFC 1624 update of the checksum.
/// - UDP: a zero checksum stays zero ("none" over IPv4; over IPv6 it is invalid and the packet
///   should have been dropped before), a result of zero is stored as 0xffff.
/// - SCTP (CRC32c has no pseudo-header), ICMPv4 and anything else: nothing to do.
///
/// Errors with [`Error::Truncated`] when `l4` is too short to hold the checksum field; call it
/// only on the first fragment (later fragments carry no L4 header).
#[inline]
pub fn l4_update_for_addr_change(
    protocol: IpProtocol,
    l4: &mut [u8],
    old: &[u8],
    new: &[u8],
) -> Result<()> {
    let (at, udp) = match protocol {
        IpProtocol::Tcp => (super::tcp::CHECKSUM_AT, false),
        IpProtocol::Udp => (super::udp::CHECKSUM_AT, true),
        IpProtocol::Icmpv6 => (super::icmpv6::CHECKSUM_AT, false),
        _ => return Ok(()),
    };
    if l4.len() < at + 2 {
        return Err(Error::Truncated);
    }
    let csum = read_u16(l4, at);
    if udp && csum == 0 {
        return Ok(());
    }
    let mut updated = checksum::update_addr(csum, old, new);
    if udp {
        updated = checksum::udp_nonzero(updated);
    }
    write_u16(l4, at, updated);
    Ok(())
}

/// Patches a UDP checksum after a 16-bit word it covers changed, keeping the zero rule.
#[inline(always)]
pub(crate) fn udp_update_u16(csum: u16, old: u16, new: u16) -> u16 {
    if csum == 0 {
        0
    } else {
        checksum::udp_nonzero(checksum::update_u16(csum, old, new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_round_trip() {
        for v in 0..=255u8 {
            assert_eq!(u8::from(IpProtocol::from(v)), v);
        }
        assert_eq!(IpProtocol::from(6), IpProtocol::Tcp);
        assert_eq!(IpProtocol::from(200), IpProtocol::Unknown(200));
    }

    #[test]
    fn short_l4_is_an_error_and_sctp_untouched() {
        let mut short = [0u8; 10];
        assert_eq!(
            l4_update_for_addr_change(IpProtocol::Tcp, &mut short, &[1; 4], &[2; 4]),
            Err(Error::Truncated)
        );
        let mut sctp = [0xaau8; 16];
        l4_update_for_addr_change(IpProtocol::Sctp, &mut sctp, &[1; 4], &[2; 4]).unwrap();
        assert_eq!(sctp, [0xaa; 16]);
        let mut udp = [0u8; 8];
        l4_update_for_addr_change(IpProtocol::Udp, &mut udp, &[1; 4], &[2; 4]).unwrap();
        assert_eq!(udp, [0; 8], "zero UDP checksum stays zero");
    }
}
