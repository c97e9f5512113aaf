//! IP prefixes.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IP prefix, written `"198.18.0.0/15"` or `"2001:2::/48"`. Host bits must be zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    /// The network address.
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// Whether `ip` lies inside this prefix (never across address families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid CIDR {s:?}: expected ADDRESS/PREFIX like \"198.18.0.0/15\"");
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let prefix: u8 = p.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(format!("invalid CIDR {s:?}: prefix longer than {max} bits"));
        }
        let cidr = Cidr { addr, prefix };
        let host_bits_zero = match addr {
            IpAddr::V4(n) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                u32::from(n) & !mask == 0
            }
            IpAddr::V6(n) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                u128::from(n) & !mask == 0
            }
        };
        if !host_bits_zero {
            return Err(format!(
                "invalid CIDR {s:?}: address has bits set past the prefix"
            ));
        }
        Ok(cidr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Cidr {
    /// From a string, through [`FromStr`] (its error is the message).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a CIDR string such as \"198.18.0.0/15\"")
        })?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_contain_and_reject_host_bits() {
        let c: Cidr = "198.18.0.0/15".parse().unwrap();
        assert!(c.contains("198.19.255.255".parse().unwrap()));
        assert!(!c.contains("198.20.0.0".parse().unwrap()));
        assert!(!c.contains("2001:2::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        let v6: Cidr = "2001:2::/48".parse().unwrap();
        assert!(v6.contains("2001:2:0:ffff::1".parse().unwrap()));
        assert!(!v6.contains("2001:3::1".parse().unwrap()));
        for bad in ["198.18.0.1/15", "198.18.0.0/33", "198.18.0.0", "x/8"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn cidrs_display_as_written() {
        for s in ["198.18.0.0/15", "0.0.0.0/0", "2001:2::/48", "10.0.0.1/32"] {
            assert_eq!(s.parse::<Cidr>().unwrap().to_string(), s);
        }
        assert_eq!(
            "198.18.0.1/15".parse::<Cidr>().unwrap_err(),
            "invalid CIDR \"198.18.0.1/15\": address has bits set past the prefix"
        );
    }
}
