//! The network view a snapshot is built with ([`L2Table`]: routes, neighbours, each port's
//! MAC) and what [`Snapshot::next_hop`](super::Snapshot::next_hop) answers from it
//! ([`NextHop`]).

use std::net::IpAddr;

use vocab::Cidr;

/// Where a frame to some destination leaves: the fastpath port (index of the interface in
/// `[dataplane] interfaces`) and the Ethernet addresses to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHop {
    /// Transmit port.
    pub port: u16,
    /// The next hop's MAC.
    pub dst_mac: [u8; 6],
    /// The transmit port's own MAC (`None`: the caller's default for that port).
    pub src_mac: Option<[u8; 6]>,
}

/// A route: destinations inside `prefix` leave on `port`, through `gateway` (none: the
/// destination is on the link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Destination prefix.
    pub prefix: Cidr,
    /// Transmit port.
    pub port: u16,
    /// Next-hop router, when not directly connected.
    pub gateway: Option<IpAddr>,
}

/// A resolved neighbour: `ip` has `mac`, on `port` when known (static `[[neighbours]]`
/// entries do not say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// Its address.
    pub ip: IpAddr,
    /// Its MAC.
    pub mac: [u8; 6],
    /// The port it was learnt on.
    pub port: Option<u16>,
}

/// The kernel's view of the network that the fastpath needs: routes, neighbours and each
/// port's own MAC. Empty for configs replayed offline (`xvs pcap`, tests): then every frame
/// leaves on the port it came in on, towards the `[[neighbours]]` MAC of its destination.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct L2Table {
    /// Routes, any order (the builder sorts them longest prefix first).
    pub routes: Vec<Route>,
    /// Neighbours.
    pub neighbours: Vec<Neighbour>,
    /// MAC of each port, by port index.
    pub port_macs: Vec<[u8; 6]>,
}
