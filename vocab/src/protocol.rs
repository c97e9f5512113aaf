//! The L4 protocol of a flow or a frontend.

use crate::ip_proto;

/// The L4 protocols xvs tracks: a flow's (every variant) and a frontend's (TCP, UDP, SCTP).
/// The values are the IP protocol numbers, so `p as u8` is the number on the wire.
///
/// A service's `protocol` in the config file is `tcp`, `udp` or `sctp` (lower case); the
/// ICMP variants cannot be named there (a service has no ICMP frontend).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "lowercase")
)]
#[repr(u8)]
pub enum Protocol {
    /// ICMP (echo; the identifier is the port).
    #[cfg_attr(feature = "serde", serde(skip_deserializing))]
    Icmp = ip_proto::ICMP,
    /// TCP.
    Tcp = ip_proto::TCP,
    /// UDP.
    Udp = ip_proto::UDP,
    /// ICMPv6 (echo; the identifier is the port).
    #[cfg_attr(feature = "serde", serde(skip_deserializing))]
    Icmpv6 = ip_proto::ICMPV6,
    /// SCTP.
    Sctp = ip_proto::SCTP,
}

impl Protocol {
    /// From an IP protocol / IPv6 next-header number; `None` for protocols xvs does not track.
    #[inline]
    pub const fn from_ip_proto(n: u8) -> Option<Protocol> {
        Some(match n {
            ip_proto::ICMP => Protocol::Icmp,
            ip_proto::TCP => Protocol::Tcp,
            ip_proto::UDP => Protocol::Udp,
            ip_proto::ICMPV6 => Protocol::Icmpv6,
            ip_proto::SCTP => Protocol::Sctp,
            _ => return None,
        })
    }

    /// The IP protocol number.
    #[inline]
    pub const fn ip_proto(self) -> u8 {
        self as u8
    }

    /// The lower-case name (the config file's, for TCP, UDP and SCTP).
    pub const fn name(self) -> &'static str {
        match self {
            Protocol::Icmp => "icmp",
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Icmpv6 => "icmpv6",
            Protocol::Sctp => "sctp",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Protocol; 5] = [
        Protocol::Icmp,
        Protocol::Tcp,
        Protocol::Udp,
        Protocol::Icmpv6,
        Protocol::Sctp,
    ];

    #[test]
    fn numbers_round_trip() {
        for p in ALL {
            assert_eq!(Protocol::from_ip_proto(p.ip_proto()), Some(p));
        }
        assert_eq!(Protocol::Tcp as u8, 6);
        assert_eq!(Protocol::Udp as u8, 17);
        assert_eq!(Protocol::Sctp as u8, 132);
        assert_eq!(Protocol::Icmp as u8, 1);
        assert_eq!(Protocol::Icmpv6 as u8, 58);
        for n in [0, 2, 41, 47, 50, 255] {
            assert_eq!(Protocol::from_ip_proto(n), None);
        }
    }

    #[test]
    fn frontends_sort_tcp_udp_sctp() {
        assert!(Protocol::Tcp < Protocol::Udp && Protocol::Udp < Protocol::Sctp);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn the_config_names_tcp_udp_and_sctp_only() {
        use serde::Deserialize;
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};
        let de = |s: &'static str| {
            let d: StrDeserializer<'_, Error> = s.into_deserializer();
            Protocol::deserialize(d).map_err(|e| e.to_string())
        };
        assert_eq!(de("tcp"), Ok(Protocol::Tcp));
        assert_eq!(de("udp"), Ok(Protocol::Udp));
        assert_eq!(de("sctp"), Ok(Protocol::Sctp));
        for bad in ["icmp", "icmpv6", "TCP"] {
            assert_eq!(
                de(bad).unwrap_err(),
                format!("unknown variant `{bad}`, expected one of `tcp`, `udp`, `sctp`")
            );
        }
    }
}
