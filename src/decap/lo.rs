//! The VIPs on `lo`: a decapsulated packet is addressed to the VIP, and the kernel delivers it
//! to a socket only when the VIP is local. `xvs decap --vips-on-lo` adds each VIP to `lo` (as
//! /32 or /128) marked with the address protocol [`PROTO_XVS_DECAP`] (`ip -d addr` shows
//! `proto 0x58`, Linux 6.1 or later keeps it), so that `--detach`, or a run with fewer
//! VIPs, removes exactly the addresses it added and never one the operator put there.
//! Without the option it only checks that each VIP is local (`ip route get` says `local`).
//!
//! Blocking rtnetlink requests over one NETLINK_ROUTE socket; every answer is checked.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressProtocol};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// The `ifa_proto` that marks the addresses `xvs decap` added ('X').
pub const PROTO_XVS_DECAP: u8 = 0x58;

/// A NETLINK_ROUTE socket.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
}

impl Rtnl {
    pub fn open() -> io::Result<Rtnl> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Rtnl { sock, seq: 0 })
    }

    /// Whether the kernel routes `ip` locally (`ip route get IP` answers `local`).
    pub fn is_local(&mut self, ip: IpAddr) -> io::Result<bool> {
        let mut m = RouteMessage::default();
        m.header.address_family = family(ip);
        m.header.destination_prefix_length = if ip.is_ipv4() { 32 } else { 128 };
        m.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(ip)));
        let answers = self.request(RouteNetlinkMessage::GetRoute(m), 0)?;
        Ok(answers.iter().any(
            |a| matches!(a, RouteNetlinkMessage::NewRoute(r) if r.header.kind == RouteType::Local),
        ))
    }

    /// Adds `ip` to `lo`, marked as ours; `Ok(false)` when `lo` has it already.
    pub fn add(&mut self, ip: IpAddr) -> io::Result<bool> {
        let m = lo_address(ip, lo_index()?);
        match self.request(
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_CREATE | NLM_F_EXCL,
        ) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes `ip` from `lo`.
    pub fn remove(&mut self, ip: IpAddr) -> io::Result<()> {
        let m = lo_address(ip, lo_index()?);
        self.request(RouteNetlinkMessage::DelAddress(m), 0)
            .map(drop)
    }

    /// The addresses of `lo` marked as ours.
    pub fn ours(&mut self) -> io::Result<Vec<IpAddr>> {
        let lo = lo_index()?;
        let answers = self.request(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for a in answers {
            let RouteNetlinkMessage::NewAddress(m) = a else {
                continue;
            };
            let marked = m.attributes.iter().any(
                |at| matches!(at, AddressAttribute::Protocol(p) if u8::from(*p) == PROTO_XVS_DECAP),
            );
            if m.header.index != lo || !marked {
                continue;
            }
            out.extend(m.attributes.iter().find_map(|at| match at {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            }));
        }
        Ok(out)
    }

    /// Sends `msg` and collects the answers up to the ACK (or the end of a dump).
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = seq;
        let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        loop {
            let (datagram, _) = self.sock.recv_from_full()?;
            let mut rest = datagram.as_slice();
            while !rest.is_empty() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest)
                    .map_err(|e| io::Error::other(format!("rtnetlink: {e}")))?;
                let len = (m.header.length as usize).next_multiple_of(4);
                if len == 0 {
                    return Err(io::Error::other("rtnetlink: a zero-length message"));
                }
                rest = rest.get(len..).unwrap_or_default();
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => match e.code {
                        Some(code) => return Err(io::Error::from_raw_os_error(-code.get())),
                        // The ACK: a dump goes on to its Done.
                        None if !dump => return Ok(out),
                        None => {}
                    },
                    NetlinkPayload::InnerMessage(inner) => out.push(inner),
                    _ => {}
                }
            }
        }
    }
}

fn family(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// The `lo` address message of `ip`: /32 or /128, marked as ours.
fn lo_address(ip: IpAddr, lo: u32) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.family = family(ip);
    m.header.prefix_len = if ip.is_ipv4() { 32 } else { 128 };
    m.header.index = lo;
    if ip.is_ipv4() {
        m.attributes.push(AddressAttribute::Local(ip));
    }
    m.attributes.push(AddressAttribute::Address(ip));
    m.attributes
        .push(AddressAttribute::Protocol(AddressProtocol::from(
            PROTO_XVS_DECAP,
        )));
    m
}

fn lo_index() -> io::Result<u32> {
    // SAFETY: a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(index)
}
