//! ICMP and ICMPv6 errors about NATed flows (destination unreachable incl. fragmentation
//! needed, packet too big, time exceeded, parameter problem; ICMPv4 source quench).
//!
//! An error quotes the packet it is about: a packet xvs already translated, travelling in the
//! direction opposite to the error. The quoted tuple, reversed, is the tuple of a packet in the
//! error's direction, so it finds the flow and the error's direction `D` in the flow table.
//! Then, as Linux IPVS does (`ip_vs_nat_icmp`):
//!
//! - the outer header is translated like a packet of direction `D` (destination always; source
//!   too in fullnat, and to the VIP for errors going to the client, whoever sent them);
//! - the quoted packet is put back to what it was before xvs translated it: addresses, ports,
//!   its IPv4 header checksum and its TCP/UDP checksum (incrementally, RFC 1624, the latter
//!   when the quote holds the checksum field; a zero UDP checksum stays zero), its SCTP
//!   CRC32c (recomputed, only when the quote holds the whole packet);
//! - the ICMP checksum is recomputed over the message (ICMPv6: with the new pseudo-header).
//!
//! What is recomputed is verified first ([`verify`]): an error whose ICMP checksum, or whose
//! whole quoted SCTP packet's CRC32c, is wrong is dropped, never sent on with a valid one.
//! The incremental updates keep a wrong checksum wrong.
//!
//! Errors about a DSR flow are not translated: they go to its backend as they are
//! (`dsr`). Errors that match no flow, or quote too little to hold the ports, are passed to
//! the kernel.
//! Quoted IPv6 packets must carry the L4 header right after the fixed header.

use std::net::{IpAddr, SocketAddr};

use flowtable::{Direction, FlowData, FlowTable, Protocol};

use super::classify::{PROTO_ICMP, PROTO_SCTP, PROTO_TCP, PROTO_UDP, Packet};
use super::nat::{AddrBytes, Endpoints, after};
use super::{DropReason, FLAG_FULLNAT};
use crate::wire::checksum::{self, Delta};
use crate::wire::{
    EthernetAddress, EthernetFrame, Icmpv4Message, Icmpv4Packet, Icmpv6Message, Icmpv6Packet,
    Ipv4Packet, Ipv6Packet, SctpPacket, TcpPacket, UdpPacket, icmpv4, icmpv6, ipv6, udp,
};

/// A matched error and how to translate it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IcmpMatch {
    /// New outer source and destination (ports unused).
    pub outer: Endpoints,
    /// The flow is a DSR flow with this encapsulation, matched in its original direction:
    /// the error goes to its backend (`outer.dst`) unchanged, encapsulated.
    pub dsr: Option<vocab::Encap>,
    /// New quoted source and destination.
    pub inner: Endpoints,
    /// Offset of the quoted IP header.
    emb: usize,
    /// Its header length.
    emb_hlen: usize,
    /// Bytes quoted from the IP header on.
    emb_len: usize,
    /// Quoted L4 protocol.
    emb_proto: u8,
    emb_src: IpAddr,
    emb_dst: IpAddr,
    emb_sport: u16,
    emb_dport: u16,
}

/// Whether xvs translates an error of this type (Linux IPVS's set): destination
/// unreachable (fragmentation needed included), source quench, time exceeded, parameter
/// problem; ICMPv6 also packet too big. Redirects and informational messages are passed.
fn translated(v6: bool, ty: u8) -> bool {
    if v6 {
        matches!(
            Icmpv6Message::from(ty),
            Icmpv6Message::DstUnreachable
                | Icmpv6Message::PktTooBig
                | Icmpv6Message::TimeExceeded
                | Icmpv6Message::ParamProblem
        )
    } else {
        matches!(
            Icmpv4Message::from(ty),
            Icmpv4Message::DstUnreachable
                | Icmpv4Message::SourceQuench
                | Icmpv4Message::TimeExceeded
                | Icmpv4Message::ParamProblem
        )
    }
}

/// The source and destination ports of the L4 header at the start of `l4` (at least 4
/// bytes), read through the protocol's view.
fn ports(proto: u8, l4: &[u8]) -> (u16, u16) {
    match proto {
        PROTO_TCP => {
            let t = TcpPacket::new_unchecked(l4);
            (t.src_port(), t.dst_port())
        }
        PROTO_UDP => {
            let u = UdpPacket::new_unchecked(l4);
            (u.src_port(), u.dst_port())
        }
        _ => {
            let s = SctpPacket::new_unchecked(l4);
            (s.src_port(), s.dst_port())
        }
    }
}

/// Finds the flow an ICMP error is about.
pub(crate) fn match_error(frame: &[u8], p: &Packet, flows: &FlowTable) -> Option<IcmpMatch> {
    if (p.proto == PROTO_ICMP) == p.v6 {
        return None; // ICMPv4 in IPv6 or ICMPv6 in IPv4: not an error we translate.
    }
    let msg = frame.get(p.l4..p.l4 + p.l4_len)?;
    let ty = if p.v6 {
        u8::from(Icmpv6Packet::new_checked(msg).ok()?.msg_type())
    } else {
        u8::from(Icmpv4Packet::new_checked(msg).ok()?.msg_type())
    };
    if !translated(p.v6, ty) {
        return None;
    }
    // (The quote follows the 8-byte header of both.)
    const _: () = assert!(icmpv4::HEADER_LEN == icmpv6::HEADER_LEN);
    let emb = p.l4 + icmpv4::HEADER_LEN;
    let q = &msg[icmpv4::HEADER_LEN..];
    let (emb_hlen, emb_proto, emb_src, emb_dst) = quoted_header(q, p.v6)?;
    let proto = match emb_proto {
        PROTO_TCP => Protocol::Tcp,
        PROTO_UDP => Protocol::Udp,
        PROTO_SCTP => Protocol::Sctp,
        _ => return None,
    };
    if q.len() < emb_hlen + 4 {
        return None;
    }
    let (emb_sport, emb_dport) = ports(emb_proto, &q[emb_hlen..]);
    let key = super::key_of(proto, emb_dst, emb_dport, emb_src, emb_sport);
    let (h, dir) = flows.lookup(&key)?;
    let data: FlowData = flows.get(h)?.data;
    let dsr = super::dsr::encap_of(data.flags);
    if dsr.is_some() && dir == Direction::Reply {
        return None; // a DSR flow's reply tuple is no one's (see `dsr`)
    }
    let (outer, inner) = endpoints(&data, dir, p.src);
    Some(IcmpMatch {
        outer,
        dsr,
        inner,
        emb,
        emb_hlen,
        emb_len: q.len(),
        emb_proto,
        emb_src,
        emb_dst,
        emb_sport,
        emb_dport,
    })
}

/// The quoted packet's IP header at the start of `q` (whole; its length usually beyond the
/// quote): header length, L4 protocol, source and destination; `None` for a later fragment
/// (no ports) or a header cut short.
fn quoted_header(q: &[u8], v6: bool) -> Option<(usize, u8, IpAddr, IpAddr)> {
    if v6 {
        let ip = Ipv6Packet::new_quoted(q).ok()?;
        let (s, d) = (ip.src_addr(), ip.dst_addr());
        return Some((40, u8::from(ip.next_header()), IpAddr::V6(s), IpAddr::V6(d)));
    }
    let ip = Ipv4Packet::new_quoted(q).ok()?;
    if ip.frag_offset() != 0 {
        return None; // a later fragment: no ports
    }
    let (s, d) = (ip.src_addr(), ip.dst_addr());
    Some((
        ip.header_len(),
        u8::from(ip.protocol()),
        IpAddr::V4(s),
        IpAddr::V4(d),
    ))
}

/// An error of direction `dir` about flow `data`, from `src`: its new outer endpoints (the
/// destination always; the source too in fullnat, and the VIP for errors to the client)
/// and the quoted packet's (as it was before xvs translated it).
fn endpoints(data: &FlowData, dir: Direction, src: IpAddr) -> (Endpoints, Endpoints) {
    let fullnat = data.flags & FLAG_FULLNAT != 0;
    let out = after(data, dir);
    let outer_src = if fullnat || dir == Direction::Reply {
        out.src.ip()
    } else {
        src
    };
    let outer = Endpoints {
        src: SocketAddr::new(outer_src, 0),
        dst: out.dst,
    };
    let inner = match dir {
        Direction::Reply => Endpoints {
            src: data.client,
            dst: data.vip,
        },
        Direction::Original => Endpoints {
            src: data.backend,
            dst: data.snat,
        },
    };
    (outer, inner)
}

impl IcmpMatch {
    /// The quoted packet's tuple reversed (its destination, then its source): for an error
    /// in a flow's original direction, its client and VIP endpoints.
    pub(crate) fn quoted_reversed(&self) -> (SocketAddr, SocketAddr) {
        (
            SocketAddr::new(self.emb_dst, self.emb_dport),
            SocketAddr::new(self.emb_src, self.emb_sport),
        )
    }

    /// The quoted packet's L4 protocol number.
    pub(crate) fn quoted_proto(&self) -> u8 {
        self.emb_proto
    }
}

/// Where the quoted SCTP packet of a matched error lies in the frame, when the quote holds
/// all of it (its CRC32c is then recomputed): from its common header to the quoted IP
/// length's end.
fn quoted_sctp(frame: &[u8], p: &Packet, m: &IcmpMatch) -> Option<std::ops::Range<usize>> {
    let l4 = m.emb + m.emb_hlen;
    if m.emb_proto != PROTO_SCTP || m.emb_len - m.emb_hlen < 12 {
        return None;
    }
    let e = m.emb;
    let end = if p.v6 {
        e + ipv6::HEADER_LEN + usize::from(Ipv6Packet::new_unchecked(&frame[e..]).payload_len())
    } else {
        e + usize::from(Ipv4Packet::new_unchecked(&frame[e..]).total_len())
    };
    // Whole: the quoted length ends within the quote (and past the common header).
    (end <= e + m.emb_len).then_some(l4..end.max(l4 + 12))
}

/// Checks what [`translate`] would recompute from scratch: the ICMP checksum (ICMPv6: with
/// the pseudo-header of the frame's addresses) and the CRC32c of an SCTP packet quoted
/// whole.
pub(crate) fn verify(frame: &[u8], p: &Packet, m: &IcmpMatch) -> Result<(), DropReason> {
    let msg = frame
        .get(p.l4..p.l4 + p.l4_len)
        .ok_or(DropReason::Truncated)?;
    let ok = match (p.src, p.dst) {
        (IpAddr::V6(s), IpAddr::V6(d)) => Icmpv6Packet::new_unchecked(msg).verify_checksum(s, d),
        _ => Icmpv4Packet::new_unchecked(msg).verify_checksum(),
    };
    if !ok {
        return Err(DropReason::BadIcmpChecksum);
    }
    if let Some(r) = quoted_sctp(frame, p, m) {
        let ok = frame
            .get(r)
            .and_then(|seg| SctpPacket::new_checked(seg).ok())
            .is_some_and(|s| s.verify_checksum());
        if !ok {
            return Err(DropReason::BadSctpChecksum);
        }
    }
    Ok(())
}

/// Translates a matched error in place. The caller checked `p.ttl > 1`.
pub(crate) fn translate(
    frame: &mut [u8],
    p: &Packet,
    m: &IcmpMatch,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
) {
    // The quoted L4 header: ports, and the checksum when the quote holds it.
    let (os, od) = (AddrBytes::new(m.emb_src), AddrBytes::new(m.emb_dst));
    let (ns, nd) = (
        AddrBytes::new(m.inner.src.ip()),
        AddrBytes::new(m.inner.dst.ip()),
    );
    let mut d = Delta::new();
    d.bytes(os.as_slice(), ns.as_slice());
    d.bytes(od.as_slice(), nd.as_slice());
    translate_quoted_l4(frame, m, d);
    // The quoted IP header: addresses, and (IPv4) its checksum, incrementally, so that a
    // quoted header that came with a wrong checksum keeps it wrong.
    match (m.inner.src.ip(), m.inner.dst.ip()) {
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut ip = Ipv6Packet::new_unchecked(&mut frame[m.emb..]);
            ip.set_src_addr(s);
            ip.set_dst_addr(d);
        }
        (IpAddr::V4(s), IpAddr::V4(dst)) => {
            let mut ip = Ipv4Packet::new_unchecked(&mut frame[m.emb..]);
            ip.set_src_addr(s);
            ip.set_dst_addr(dst);
            ip.set_checksum(d.apply(ip.checksum()));
        }
        // (Not reached: a flow's endpoints are of one family.)
        _ => return,
    }
    if let Some(r) = quoted_sctp(frame, p, m) {
        // (`verify` checked its CRC32c.)
        SctpPacket::new_unchecked(&mut frame[r]).fill_checksum();
    }
    translate_outer(frame, p, m, src_mac, dst_mac);
}

/// [`translate`]'s quoted L4 header: its ports, and its TCP/UDP checksum (incrementally,
/// with `addrs`, the quoted addresses' delta) when the quote holds it.
fn translate_quoted_l4(frame: &mut [u8], m: &IcmpMatch, addrs: Delta) {
    let l4 = m.emb + m.emb_hlen;
    let l4_avail = m.emb_len - m.emb_hlen;
    let (sport, dport) = (m.inner.src.port(), m.inner.dst.port());
    let mut l4_delta = addrs;
    l4_delta.word(m.emb_sport, sport);
    l4_delta.word(m.emb_dport, dport);
    let seg = &mut frame[l4..l4 + l4_avail];
    match m.emb_proto {
        PROTO_TCP => {
            let mut t = TcpPacket::new_unchecked(seg);
            t.set_src_port(sport);
            t.set_dst_port(dport);
            // (The checksum field ends 18 bytes in.)
            if l4_avail >= 18 {
                t.set_checksum(l4_delta.apply(t.checksum()));
            }
        }
        PROTO_UDP => {
            let mut u = UdpPacket::new_unchecked(seg);
            u.set_src_port(sport);
            u.set_dst_port(dport);
            // A zero UDP checksum stays zero.
            if l4_avail >= udp::HEADER_LEN && u.checksum() != 0 {
                u.set_checksum(checksum::udp_nonzero(l4_delta.apply(u.checksum())));
            }
        }
        _ => {
            let mut s = SctpPacket::new_unchecked(seg);
            s.set_src_port(sport);
            s.set_dst_port(dport);
        }
    }
}

/// [`translate`]'s outer headers: MACs, TTL − 1, the outer addresses, and the ICMP checksum
/// recomputed over the whole message (ICMPv6: with the new pseudo-header).
fn translate_outer(
    frame: &mut [u8],
    p: &Packet,
    m: &IcmpMatch,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
) {
    let mut eth = EthernetFrame::new_unchecked(&mut *frame);
    eth.set_dst_addr(EthernetAddress(dst_mac));
    eth.set_src_addr(EthernetAddress(src_mac));
    match (m.outer.src.ip(), m.outer.dst.ip()) {
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut ip = Ipv6Packet::new_unchecked(&mut frame[p.l3..]);
            ip.set_hop_limit(p.ttl - 1);
            ip.set_src_addr(s);
            ip.set_dst_addr(d);
            Icmpv6Packet::new_unchecked(&mut frame[p.l4..p.l4 + p.l4_len]).fill_checksum(s, d);
        }
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut ip = Ipv4Packet::new_unchecked(&mut frame[p.l3..]);
            ip.set_ttl(p.ttl - 1);
            ip.set_src_addr(s);
            ip.set_dst_addr(d);
            ip.fill_checksum();
            Icmpv4Packet::new_unchecked(&mut frame[p.l4..p.l4 + p.l4_len]).fill_checksum();
        }
        _ => {}
    }
}
