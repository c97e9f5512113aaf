//! Modes: how a service forwards ([`Mode`]), how the XDP program is attached ([`XdpMode`]),
//! how AF_XDP sockets bind ([`ZeroCopy`]).

/// Forwarding mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum Mode {
    /// DNAT only: replies must route back through xvs.
    Nat,
    /// DNAT + SNAT to a node address: replies always come back.
    #[default]
    Fullnat,
}

impl Mode {
    /// The name used in the config file.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Nat => "nat",
            Mode::Fullnat => "fullnat",
        }
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
