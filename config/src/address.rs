//! Addresses no service may have as a frontend or a backend, whatever its source (the
//! config's `[[services]]`, the Kubernetes source): the checks the API server makes of
//! endpoint addresses and externalIPs (`ValidateNonSpecialIP`), plus multicast and broadcast.

use std::net::IpAddr;

use crate::schema::Config;
use crate::span::KeyPath;

/// Why `ip` cannot be a service's address (a frontend or a backend), or None: unspecified,
/// loopback, multicast, broadcast, link-local (169.254/16, fe80::/10), or an IPv4-mapped
/// IPv6 address (a v4 address in disguise, which would slip past the other checks). The
/// answer is a phrase: `"a loopback address"`.
pub fn special_address(ip: IpAddr) -> Option<&'static str> {
    Some(match ip {
        _ if ip.is_unspecified() => "the unspecified address",
        _ if ip.is_loopback() => "a loopback address",
        _ if ip.is_multicast() => "a multicast address",
        IpAddr::V4(v4) if v4.is_broadcast() => "the broadcast address",
        IpAddr::V4(v4) if v4.is_link_local() => "a link-local address (169.254.0.0/16)",
        IpAddr::V6(v6) if v6.is_unicast_link_local() => "a link-local address (fe80::/10)",
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => "an IPv4-mapped IPv6 address",
        _ => return None,
    })
}

/// `[node] addresses` that are special addresses: NodePort frontends listen on the node's
/// addresses, so an address no service may take cannot be one (`0.0.0.0` would make every
/// NodePort a frontend of the unspecified address).
pub(crate) fn node_addresses(c: &Config) -> Vec<(KeyPath, String)> {
    c.node
        .addresses
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let why = special_address(*a)?;
            Some((
                KeyPath::of(&["node", "addresses"]).index(i),
                format!(
                    "{a} cannot be a node address: it is {why}, and NodePort frontends listen on the node's addresses"
                ),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_addresses() {
        let why = |s: &str| special_address(s.parse().unwrap());
        for s in [
            "0.0.0.0",
            "::",
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "224.0.0.1",
            "239.1.2.3",
            "ff02::1",
            "255.255.255.255",
            "169.254.1.1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:198.18.1.1",
        ] {
            assert!(why(s).is_some(), "{s}");
        }
        for s in [
            "198.18.1.1",
            "10.0.0.1",
            "2001:2::1",
            "fd00::1",
            "192.0.2.255",
        ] {
            assert_eq!(why(s), None, "{s}");
        }
        assert_eq!(why("::1"), Some("a loopback address"));
    }

    #[test]
    fn node_addresses_are_not_special() {
        let e = crate::parse(
            "[node]\naddresses = [\"198.18.0.1\", \"0.0.0.0\", \"::1\"]\n",
            "t.toml",
        )
        .unwrap_err();
        let p = e.problems();
        assert_eq!(p.len(), 2, "{e}");
        assert_eq!(p[0].key, "node.addresses[1]");
        assert!(
            p[0].message
                .starts_with("0.0.0.0 cannot be a node address: it is the unspecified address"),
            "{}",
            p[0].message
        );
        assert_eq!(p[1].key, "node.addresses[2]");
        crate::parse(
            "[node]\naddresses = [\"198.18.0.1\", \"2001:2::1\"]\n",
            "t.toml",
        )
        .unwrap();
    }
}
