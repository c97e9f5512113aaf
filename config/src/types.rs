//! Value types that TOML carries as strings: durations ("900s", "1h30m"), MAC addresses and
//! port ranges ("32768-60999"). CIDR prefixes ("198.18.0.0/15"), which the data plane uses
//! too, are `vocab::Cidr`.
//!
//! Each parses with `FromStr` (the error is a plain sentence) and deserializes from a TOML
//! string, so a bad value is reported by serde with the key and position it came from.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Implements `Deserialize` from a TOML string through the type's `FromStr`.
macro_rules! deserialize_from_str {
    ($ty:ty, $what:literal) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)
                    .map_err(|_| serde::de::Error::custom(concat!("expected ", $what)))?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A duration written as a string of `<integer><unit>` parts: `"900s"`, `"5m"`, `"3h"`,
/// `"1h30m"`, `"250ms"`, `"1d"`. Units: ms, s, m, h, d. A bare number is rejected, because
/// nobody can tell whether `30` meant seconds or milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dur(pub Duration);

impl Dur {
    /// Whole seconds, for constructors that take them.
    pub const fn from_secs(s: u64) -> Dur {
        Dur(Duration::from_secs(s))
    }
    /// Milliseconds.
    pub const fn from_millis(ms: u64) -> Dur {
        Dur(Duration::from_millis(ms))
    }
    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("invalid duration {s:?}: expected e.g. \"900s\", \"5m\", \"1h30m\", \"250ms\"")
        };
        if s.is_empty() {
            return Err(bad());
        }
        let mut total = Duration::ZERO;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(bad());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
            let part = match &rest[..unit_len] {
                "ms" => Duration::from_millis(n),
                "s" => Duration::from_secs(n),
                "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
                "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
                "d" => Duration::from_secs(n.checked_mul(86400).ok_or_else(bad)?),
                _ => return Err(bad()),
            };
            total = total.checked_add(part).ok_or_else(bad)?;
            rest = &rest[unit_len..];
        }
        Ok(Dur(total))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_millis() != 0 || d.is_zero() {
            write!(f, "{}ms", d.as_millis())
        } else {
            write!(f, "{}s", d.as_secs())
        }
    }
}

deserialize_from_str!(Dur, "a duration string such as \"900s\"");

/// An Ethernet MAC address, written `02:00:00:00:01:01`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("invalid MAC address {s:?}: expected six hex bytes like 02:00:00:00:01:01");
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != 2 {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Mac(out))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

deserialize_from_str!(Mac, "a MAC address string");

/// An inclusive port range, written `"32768-60999"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// First port of the range.
    pub first: u16,
    /// Last port of the range (inclusive).
    pub last: u16,
}

impl PortRange {
    /// How many ports the range holds.
    pub fn len(&self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }
    /// Never true for a parsed range; here for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl FromStr for PortRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("invalid port range {s:?}: expected \"FIRST-LAST\" like \"32768-60999\"");
        let (a, b) = s.split_once('-').ok_or_else(bad)?;
        let first: u16 = a.trim().parse().map_err(|_| bad())?;
        let last: u16 = b.trim().parse().map_err(|_| bad())?;
        if first == 0 || first > last {
            return Err(format!(
                "invalid port range {s:?}: the first port must be between 1 and the last port"
            ));
        }
        Ok(PortRange { first, last })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

deserialize_from_str!(PortRange, "a port range string such as \"32768-60999\"");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_units_and_sums() {
        assert_eq!(
            "900s".parse::<Dur>().unwrap().get(),
            Duration::from_secs(900)
        );
        assert_eq!("5m".parse::<Dur>().unwrap().get(), Duration::from_secs(300));
        assert_eq!(
            "3h".parse::<Dur>().unwrap().get(),
            Duration::from_secs(10800)
        );
        assert_eq!(
            "1h30m".parse::<Dur>().unwrap().get(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            "250ms".parse::<Dur>().unwrap().get(),
            Duration::from_millis(250)
        );
        assert_eq!(
            "1d".parse::<Dur>().unwrap().get(),
            Duration::from_secs(86400)
        );
        for bad in [
            "",
            "30",
            "s",
            "5x",
            "1.5s",
            "-1s",
            "5 m",
            "99999999999999999999s",
        ] {
            assert!(bad.parse::<Dur>().is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(Dur::from_secs(900).to_string(), "900s");
    }

    #[test]
    fn macs_round_trip_and_reject_garbage() {
        let m: Mac = "02:00:00:00:01:0a".parse().unwrap();
        assert_eq!(m.0, [2, 0, 0, 0, 1, 10]);
        assert_eq!(m.to_string(), "02:00:00:00:01:0a");
        for bad in [
            "",
            "02:00:00:00:01",
            "02:00:00:00:01:01:01",
            "2:0:0:0:1:1",
            "zz:00:00:00:01:01",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn port_ranges() {
        let r: PortRange = "32768-60999".parse().unwrap();
        assert_eq!((r.first, r.last, r.len()), (32768, 60999, 28232));
        for bad in ["", "5", "0-10", "10-5", "1-70000", "a-b"] {
            assert!(
                bad.parse::<PortRange>().is_err(),
                "{bad:?} should be rejected"
            );
        }
    }
}
