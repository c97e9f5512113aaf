//! Modes: how a service forwards ([`Mode`], and a DSR service's [`Encap`]), how the XDP
//! program is attached ([`XdpMode`]), how AF_XDP sockets bind ([`ZeroCopy`]).

/// Forwarding mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// DNAT only: replies must route back through xvs.
    Nat,
    /// DNAT + SNAT to a node address: replies always come back.
    #[default]
    Fullnat,
    /// Direct server return: the client's packets reach the backend unchanged (addresses,
    /// ports, TTL), encapsulated as the [`Encap`] says; the backend answers the client
    /// directly, so nothing comes back through xvs.
    Dsr(Encap),
}

impl Mode {
    /// Every name [`Mode::from_name`] takes.
    pub const NAMES: &'static [&'static str] = &["nat", "fullnat", "dsr"];

    /// The name used in the config file (`"dsr"` whatever the encapsulation).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Nat => "nat",
            Mode::Fullnat => "fullnat",
            Mode::Dsr(_) => "dsr",
        }
    }

    /// The mode of a name (`"dsr"`: with the default encapsulation, [`Encap::Ipip`]).
    pub fn from_name(name: &str) -> Option<Mode> {
        match name {
            "nat" => Some(Mode::Nat),
            "fullnat" => Some(Mode::Fullnat),
            "dsr" => Some(Mode::Dsr(Encap::default())),
            _ => None,
        }
    }

    /// A DSR mode's encapsulation.
    pub fn encap(self) -> Option<Encap> {
        match self {
            Mode::Dsr(e) => Some(e),
            _ => None,
        }
    }
}

// By name, as `from_name` reads it (a DSR mode's encapsulation is a key of its own).
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Mode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Mode::from_name(&name).ok_or_else(|| serde::de::Error::unknown_variant(&name, Mode::NAMES))
    }
}

/// How a DSR service's packets reach its backends (`encap`, `xvs.io/encap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum Encap {
    /// IP in IP: IPv4 in IPv4 (protocol 4), IPv6 in IPv6 (next header 41), to the backend's
    /// address.
    #[default]
    Ipip,
    /// GUE variant 1 (Katran's layout): the packet directly in UDP to the GUE port.
    Gue,
    /// IPVS's DR: only the destination MAC changes (the backend is on the same segment).
    L2,
}

impl Encap {
    /// Every encapsulation, in [`Encap::code`] order.
    pub const ALL: [Encap; 3] = [Encap::Ipip, Encap::Gue, Encap::L2];

    /// The name used in the config file and the `xvs.io/encap` annotation.
    pub fn name(self) -> &'static str {
        match self {
            Encap::Ipip => "ipip",
            Encap::Gue => "gue",
            Encap::L2 => "l2",
        }
    }

    /// The encapsulation of a name.
    pub fn from_name(name: &str) -> Option<Encap> {
        Encap::ALL.into_iter().find(|e| e.name() == name)
    }

    /// A small number for each (0, 1, 2), as a flow stores it.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The encapsulation of [`Encap::code`] `code`.
    pub fn from_code(code: u8) -> Option<Encap> {
        Encap::ALL.get(usize::from(code)).copied()
    }
}

/// How the XDP program is attached (`[dataplane] xdp_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum XdpMode {
    /// Native when the driver offers it, generic otherwise.
    #[default]
    Auto,
    /// Driver (native) XDP; fail if the driver lacks it.
    Native,
    /// Generic (skb) XDP.
    Generic,
}

/// Whether AF_XDP sockets bind in zero-copy mode (`[dataplane] zero_copy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum ZeroCopy {
    /// Zero-copy when the driver offers it, copy otherwise.
    #[default]
    Auto,
    /// Zero-copy; fail if the driver lacks it.
    On,
    /// Copy mode.
    Off,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        for name in Mode::NAMES {
            assert_eq!(Mode::from_name(name).map(Mode::name), Some(*name));
        }
        assert_eq!(Mode::from_name("dsr"), Some(Mode::Dsr(Encap::Ipip)));
        assert_eq!(Mode::from_name("tunnel"), None);
        for e in Encap::ALL {
            assert_eq!(Encap::from_name(e.name()), Some(e));
            assert_eq!(Encap::from_code(e.code()), Some(e));
            assert_eq!(Mode::Dsr(e).encap(), Some(e));
        }
        assert_eq!(Encap::from_code(3), None);
        assert_eq!(Mode::Nat.encap(), None);
    }
}
