//! The neighbour resolver: the kernel's routes, neighbours and port MACs for the configured
//! interfaces, read over rtnetlink and published as a [`fastpath::snapshot::L2Table`].
//!
//! Contract:
//! - [`read_l2`] dumps links, main-table routes and neighbours of the calling thread's network
//!   namespace and keeps what concerns `interfaces`: a port is an interface's index in that
//!   slice. Its output is sorted, so two reads of an unchanged kernel state compare equal.
//! - [`solicit`] makes the kernel resolve one next hop by its own ARP / neighbour discovery:
//!   it sends one empty UDP datagram to the discard port through a socket bound to the
//!   interface. It must only be given on-link next hops (a route's gateway, or an address
//!   inside a connected prefix), so nothing leaves for any other address.
//! - [`NeighbourWatcher`] re-reads on netlink events and every `period`, calls back only when
//!   the table changed, and turns the fastpath's reports of unresolved next hops into
//!   rate-limited solicitations. It is a task on the slowpath's tokio runtime; the sockets
//!   it uses are all opened when it starts, in the caller's network namespace (see its
//!   module doc).
//!
//! [`read_l2`] and [`solicit`] are synchronous and off the hot path: plain sockets, opened
//! per call in the calling thread's network namespace.

mod dump;
mod watcher;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

use fastpath::snapshot::{L2Table, Neighbour, Route};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType, RouteVia,
};

pub use watcher::{NeighbourRequester, NeighbourService, NeighbourWatcher};

/// The UDP discard port (RFC 863): where [`solicit`] sends its empty datagram.
const DISCARD_PORT: u16 = 9;

/// Why the kernel's tables could not be read, or a next hop not solicited.
#[derive(Debug, thiserror::Error)]
pub enum NeighError {
    /// A NETLINK_ROUTE socket could not be opened or bound.
    #[error("cannot open a NETLINK_ROUTE socket: {0}")]
    Socket(#[source] std::io::Error),
    /// Sending a dump request, receiving its answer, or the kernel's answer itself failed.
    #[error("netlink {what} dump failed: {source}")]
    Dump {
        /// What was dumped: `links`, `routes` or `neighbours`.
        what: &'static str,
        /// The I/O error, or the kernel's error code.
        source: std::io::Error,
    },
    /// The kernel kept changing the table while it was dumped.
    #[error("netlink {what} dump kept being interrupted by changes")]
    Interrupted {
        /// What was dumped.
        what: &'static str,
    },
    /// A message of a dump could not be decoded.
    #[error("cannot decode a netlink {what} message: {message}")]
    Decode {
        /// What was dumped.
        what: &'static str,
        /// The decoder's complaint.
        message: String,
    },
    /// A configured interface does not exist in this network namespace.
    #[error("interface {name} does not exist")]
    NoSuchInterface {
        /// The interface.
        name: String,
    },
    /// A configured interface has no Ethernet (6-byte) address.
    #[error("interface {name} has no Ethernet address")]
    NotEthernet {
        /// The interface.
        name: String,
    },
    /// More interfaces than ports fit in a `u16`.
    #[error("{count} interfaces configured; ports are numbered by u16")]
    TooManyInterfaces {
        /// How many were given.
        count: usize,
    },
    /// The datagram that triggers resolution could not be sent.
    #[error("cannot solicit {ip} on interface {interface}: {source}")]
    Solicit {
        /// The next hop.
        ip: IpAddr,
        /// The interface.
        interface: String,
        /// The socket error.
        source: std::io::Error,
    },
}

/// Reads the kernel's view of `interfaces` (port `i` is `interfaces[i]`): each one's MAC,
/// the main table's unicast routes leaving through them (IPv4 and IPv6, connected and
/// default routes included), and their neighbours in a usable state with a MAC.
///
/// Works in the calling thread's network namespace. A multipath route contributes its
/// first next hop on a configured interface.
pub fn read_l2(interfaces: &[String]) -> Result<L2Table, NeighError> {
    read_l2_on(&mut dump::Dumper::open()?, interfaces)
}

/// [`read_l2`] over an open dump socket: the namespace read is the socket's, whichever
/// thread calls.
fn read_l2_on(sock: &mut dump::Dumper, interfaces: &[String]) -> Result<L2Table, NeighError> {
    if interfaces.len() > usize::from(u16::MAX) + 1 {
        return Err(NeighError::TooManyInterfaces {
            count: interfaces.len(),
        });
    }
    let links = sock.links()?;
    let mut ifindex_port: Vec<(u32, u16)> = Vec::with_capacity(interfaces.len());
    let mut port_macs = Vec::with_capacity(interfaces.len());
    for (port, name) in interfaces.iter().enumerate() {
        let link = links
            .iter()
            .find(|l| link_name(l) == Some(name.as_str()))
            .ok_or_else(|| NeighError::NoSuchInterface { name: name.clone() })?;
        let mac = link_mac(link).ok_or_else(|| NeighError::NotEthernet { name: name.clone() })?;
        // Checked above: at most u16::MAX + 1 interfaces.
        ifindex_port.push((link.header.index, port as u16));
        port_macs.push(mac);
    }
    let port_of = |ifindex: u32| {
        ifindex_port
            .iter()
            .find(|&&(i, _)| i == ifindex)
            .map(|&(_, p)| p)
    };

    let mut routes: Vec<Route> = sock
        .routes()?
        .iter()
        .filter_map(|r| route(r, port_of))
        .collect();
    routes.sort_by_key(|r| (r.port, r.prefix.addr, r.prefix.prefix, r.gateway));
    routes.dedup();

    let mut neighbours: Vec<Neighbour> = sock
        .neighbours()?
        .iter()
        .filter_map(|n| neighbour(n, port_of))
        .collect();
    neighbours.sort_by_key(|n| (n.ip, n.port, n.mac));
    neighbours.dedup();

    Ok(L2Table {
        routes,
        neighbours,
        port_macs,
    })
}

/// Asks the kernel to resolve `ip` on `interface` (ARP for IPv4, neighbour discovery for
/// IPv6) by sending one empty UDP datagram to `ip`'s discard port through a socket bound
/// to `interface`. `ip` must be an on-link next hop: the datagram goes to it alone.
///
/// Works in the calling thread's network namespace.
pub fn solicit(ip: IpAddr, interface: &str) -> Result<(), NeighError> {
    let sock = solicit_socket(ip.is_ipv6()).map_err(|e| solicit_error(ip, interface, e))?;
    solicit_on(&sock, ip, interface)
}

/// A non-blocking UDP socket of one family for [`solicit_on`], bound to no device yet. It
/// stays in the network namespace it was opened in, whichever thread uses it later.
fn solicit_socket(ipv6: bool) -> std::io::Result<UdpSocket> {
    let any: SocketAddr = if ipv6 {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(any)?;
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// [`solicit`] through `sock` (of `ip`'s family): binds it to `interface` (rebinding it if
/// an earlier call bound it elsewhere) and sends. Interface names are resolved in the
/// socket's namespace.
fn solicit_on(sock: &UdpSocket, ip: IpAddr, interface: &str) -> Result<(), NeighError> {
    let err = |source| solicit_error(ip, interface, source);
    bind_to_device(sock, interface).map_err(err)?;
    let dst: SocketAddr = match ip {
        IpAddr::V4(v4) => (v4, DISCARD_PORT).into(),
        IpAddr::V6(v6) => {
            // A link-local address means nothing without its link.
            let scope_id = if v6.is_unicast_link_local() {
                ifindex(sock, interface).map_err(err)?
            } else {
                0
            };
            SocketAddrV6::new(v6, DISCARD_PORT, 0, scope_id).into()
        }
    };
    sock.send_to(&[], dst).map_err(err)?;
    Ok(())
}

fn solicit_error(ip: IpAddr, interface: &str, source: std::io::Error) -> NeighError {
    NeighError::Solicit {
        ip,
        interface: interface.to_owned(),
        source,
    }
}

/// `interface`'s index in `sock`'s network namespace (`SIOCGIFINDEX`; `if_nametoindex`
/// would ask the calling thread's).
fn ifindex(sock: &UdpSocket, interface: &str) -> std::io::Result<u32> {
    check_ifname(interface)?;
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(interface.as_bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: `req` is a live ifreq whose name is NUL-terminated (checked length, zeroed).
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFINDEX as _, &raw mut req) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFINDEX succeeded, so the kernel wrote the index member.
    let index = unsafe { req.ifr_ifru.ifru_ifindex };
    u32::try_from(index).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))
}

/// An interface name the kernel could accept: non-empty, shorter than `IFNAMSIZ`, no NUL.
fn check_ifname(interface: &str) -> std::io::Result<()> {
    if interface.is_empty() || interface.len() >= libc::IFNAMSIZ || interface.contains('\0') {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    Ok(())
}

fn bind_to_device(sock: &UdpSocket, interface: &str) -> std::io::Result<()> {
    check_ifname(interface)?;
    // SAFETY: the option value is `interface`'s bytes, valid for the length passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            interface.as_ptr().cast(),
            interface.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn link_name(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.as_str()),
        _ => None,
    })
}

fn link_mac(link: &LinkMessage) -> Option<[u8; 6]> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(mac) => mac.as_slice().try_into().ok(),
        _ => None,
    })
}

/// A main-table unicast route through a configured interface, as the fastpath sees it.
fn route(r: &RouteMessage, port_of: impl Fn(u32) -> Option<u16>) -> Option<Route> {
    // Tables above 255 are only in RTA_TABLE; the header then says RT_TABLE_COMPAT.
    let table = r
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(r.header.table));
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) || r.header.kind != RouteType::Unicast {
        return None;
    }
    let unspecified = match r.header.address_family {
        netlink_packet_route::AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        netlink_packet_route::AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    let mut dst = unspecified;
    let mut oif = None;
    let mut gateway = None;
    let mut hop = None;
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = route_addr(d)?,
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Gateway(g) => gateway = route_addr(g),
            RouteAttribute::Via(v) => gateway = via_addr(v),
            RouteAttribute::MultiPath(hops) => {
                hop = hops.iter().find_map(|h| {
                    let port = port_of(h.interface_index)?;
                    let gw = h.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Gateway(g) => route_addr(g),
                        RouteAttribute::Via(v) => via_addr(v),
                        _ => None,
                    });
                    Some((port, gw))
                })
            }
            _ => {}
        }
    }
    let (port, gateway) = match oif {
        Some(i) => (port_of(i)?, gateway),
        None => hop?,
    };
    Some(Route {
        prefix: config::Cidr {
            addr: dst,
            prefix: r.header.destination_prefix_length,
        },
        port,
        gateway,
    })
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn via_addr(v: &RouteVia) -> Option<IpAddr> {
    match v {
        RouteVia::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteVia::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// A neighbour on a configured interface whose MAC may be used now.
fn neighbour(n: &NeighbourMessage, port_of: impl Fn(u32) -> Option<u16>) -> Option<Neighbour> {
    let usable = matches!(
        n.header.state,
        NeighbourState::Reachable
            | NeighbourState::Stale
            | NeighbourState::Delay
            | NeighbourState::Probe
            | NeighbourState::Permanent
            | NeighbourState::Noarp
    );
    if !usable {
        return None;
    }
    let port = port_of(n.header.ifindex)?;
    let mut ip = None;
    let mut mac = None;
    for a in &n.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                ip = Some(IpAddr::V4(*v4))
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                ip = Some(IpAddr::V6(*v6))
            }
            NeighbourAttribute::LinkLayerAddress(l) => mac = <[u8; 6]>::try_from(l.as_slice()).ok(),
            _ => {}
        }
    }
    let mac = mac.filter(|m| *m != [0; 6])?;
    // Multicast and broadcast entries (MLD/IGMP groups the kernel joins on its own, at any
    // moment) are never a next hop; leaving them out also keeps the table stable.
    let ip =
        ip.filter(|ip| !ip.is_multicast() && *ip != IpAddr::V4(std::net::Ipv4Addr::BROADCAST))?;
    Some(Neighbour {
        ip,
        mac,
        port: Some(port),
    })
}
