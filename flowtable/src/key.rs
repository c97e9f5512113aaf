//! Flow keys (the 5-tuple of one direction) and the data a flow entry holds.
//!
//! Addresses are kept as 128-bit values: IPv6 as is, IPv4 as the v4-mapped IPv6 address
//! `::ffff:a.b.c.d`, plus a family bit so that a real IPv6 packet carrying a v4-mapped address is
//! a different flow from the IPv4 one. For ICMP echo the identifier stands in for both ports.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use lb_algos::BackendId;

pub use vocab::Protocol;

/// Which of a flow's two tuples a packet matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client → VIP (IPVS "input").
    Original,
    /// Backend → SNAT address (or client in nat mode) (IPVS "output").
    Reply,
}

pub(crate) const V4_MAPPED: u128 = 0xffff << 32;

pub(crate) fn addr_bits(a: IpAddr) -> (u128, bool) {
    match a {
        IpAddr::V4(v4) => (V4_MAPPED | u128::from(v4.to_bits()), false),
        IpAddr::V6(v6) => (v6.to_bits(), true),
    }
}

pub(crate) fn bits_addr(bits: u128, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from_bits(bits))
    } else {
        IpAddr::V4(Ipv4Addr::from_bits(bits as u32))
    }
}

/// One direction's tuple: protocol, source and destination address and port.
///
/// Built per packet by the pipeline; cheap to build and hash. Both addresses are of the same
/// family by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub(crate) src: u128,
    pub(crate) dst: u128,
    pub(crate) src_port: u16,
    pub(crate) dst_port: u16,
    pub(crate) proto: Protocol,
    pub(crate) v6: bool,
}

impl FlowKey {
    /// An IPv4 tuple.
    pub fn v4(proto: Protocol, src: Ipv4Addr, src_port: u16, dst: Ipv4Addr, dst_port: u16) -> Self {
        FlowKey {
            src: V4_MAPPED | u128::from(src.to_bits()),
            dst: V4_MAPPED | u128::from(dst.to_bits()),
            src_port,
            dst_port,
            proto,
            v6: false,
        }
    }

    /// An IPv4 tuple from raw addresses (`Ipv4Addr::to_bits` order): what a packet parser
    /// reads with fixed offsets, without building `Ipv4Addr`s. Same key as [`FlowKey::v4`].
    #[inline]
    pub fn v4_bits(proto: Protocol, src: u32, src_port: u16, dst: u32, dst_port: u16) -> Self {
        FlowKey {
            src: V4_MAPPED | u128::from(src),
            dst: V4_MAPPED | u128::from(dst),
            src_port,
            dst_port,
            proto,
            v6: false,
        }
    }

    /// An IPv6 tuple.
    pub fn v6(proto: Protocol, src: Ipv6Addr, src_port: u16, dst: Ipv6Addr, dst_port: u16) -> Self {
        FlowKey {
            src: src.to_bits(),
            dst: dst.to_bits(),
            src_port,
            dst_port,
            proto,
            v6: true,
        }
    }

    /// A tuple from socket addresses; `None` if the families differ. IPv6 flow info and scope
    /// ids are not part of a flow.
    pub fn new(proto: Protocol, src: SocketAddr, dst: SocketAddr) -> Option<Self> {
        let (s, s6) = addr_bits(src.ip());
        let (d, d6) = addr_bits(dst.ip());
        (s6 == d6).then_some(FlowKey {
            src: s,
            dst: d,
            src_port: src.port(),
            dst_port: dst.port(),
            proto,
            v6: s6,
        })
    }

    /// The protocol.
    pub fn proto(&self) -> Protocol {
        self.proto
    }

    /// Source address and port.
    pub fn src(&self) -> SocketAddr {
        SocketAddr::new(bits_addr(self.src, self.v6), self.src_port)
    }

    /// Destination address and port.
    pub fn dst(&self) -> SocketAddr {
        SocketAddr::new(bits_addr(self.dst, self.v6), self.dst_port)
    }

    /// Whether this is an IPv6 tuple.
    pub fn is_ipv6(&self) -> bool {
        self.v6
    }

    /// Ports in the low 32 bits, protocol and family above: the key's non-address part.
    #[inline]
    pub(crate) fn misc(&self) -> u64 {
        u64::from(self.src_port)
            | u64::from(self.dst_port) << 16
            | u64::from(self.proto as u8) << 32
            | u64::from(self.v6) << 40
    }
}

/// Everything the pipeline needs to rewrite both directions of a flow; immutable for the life
/// of the entry. All four addresses must be of the same family.
///
/// In `nat` mode `snat` equals `client`. The original tuple is `client → vip`, the reply tuple
/// `backend → snat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowData {
    /// Transport protocol.
    pub proto: Protocol,
    /// Client address and port (source of the original direction).
    pub client: SocketAddr,
    /// Virtual IP and port the client addressed.
    pub vip: SocketAddr,
    /// Backend (real server) address and port.
    pub backend: SocketAddr,
    /// Source the backend sees: the SNAT address and port (full-NAT) or the client (nat).
    pub snat: SocketAddr,
    /// Service the flow was scheduled for.
    pub service_id: u32,
    /// Backend the flow was scheduled to; indexes the per-backend connection counts.
    pub backend_id: BackendId,
    /// Snapshot generation the flow was scheduled in.
    pub snapshot_gen: u32,
    /// Mode and flags byte, owned by the pipeline (e.g. nat vs full-NAT).
    pub flags: u8,
}

impl FlowData {
    /// The original-direction tuple (client → VIP).
    pub fn original_key(&self) -> FlowKey {
        FlowKey::new(self.proto, self.client, self.vip).expect("client and VIP of one family")
    }

    /// The reply-direction tuple (backend → SNAT address). A one-way flow's
    /// ([`FLAG_ONE_WAY`](crate::FLAG_ONE_WAY), direct server return) is the tuple its
    /// backend's replies carry, VIP → client, which never comes through xvs: backend → client
    /// would be the same for one client's flows to two VIPs that share a backend (common with
    /// DSR, whose backends hold every VIP), and the second could not be inserted. No lookup
    /// ever matches it (entries compare the backend's address for the reply direction).
    pub fn reply_key(&self) -> FlowKey {
        if self.flags & crate::FLAG_ONE_WAY != 0 {
            return FlowKey::new(self.proto, self.vip, self.client)
                .expect("VIP and client of one family");
        }
        FlowKey::new(self.proto, self.backend, self.snat).expect("backend and SNAT of one family")
    }

    pub(crate) fn same_family(&self) -> bool {
        let v6 = self.client.is_ipv6();
        self.vip.is_ipv6() == v6 && self.backend.is_ipv6() == v6 && self.snat.is_ipv6() == v6
    }
}
