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
//! Errors that match no flow, or quote too little to hold the ports, are passed to the kernel.
//! Quoted IPv6 packets must carry the L4 header right after the fixed header.

use std::net::{IpAddr, SocketAddr};

use flowtable::{Direction, FlowData, FlowTable, Protocol};

use super::classify::{PROTO_ICMP, PROTO_ICMPV6, PROTO_SCTP, PROTO_TCP, PROTO_UDP, Packet};
use super::nat::{AddrBytes, Endpoints, after};
use super::{DropReason, FLAG_FULLNAT};
use crate::wire::checksum::{self, Delta};
use crate::wire::{Ipv4Packet, Ipv6Packet, read_u16, write_u16};

/// A matched error and how to translate it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IcmpMatch {
    /// New outer source and destination (ports unused).
    pub outer: Endpoints,
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

fn is_error(v6: bool, ty: u8) -> bool {
    if v6 {
        matches!(ty, 1..=4)
    } else {
        matches!(ty, 3 | 4 | 11 | 12)
    }
}

/// Finds the flow an ICMP error is about.
pub(crate) fn match_error(frame: &[u8], p: &Packet, flows: &FlowTable) -> Option<IcmpMatch> {
    if (p.proto == PROTO_ICMP) == p.v6 {
        return None; // ICMPv4 in IPv6 or ICMPv6 in IPv4: not an error we translate.
    }
    let msg = frame.get(p.l4..p.l4 + p.l4_len)?;
    if msg.len() < 8 || !is_error(p.v6, msg[0]) {
        return None;
    }
    let emb = p.l4 + 8;
    let q = &msg[8..];
    // The quoted packet: its header whole, its length usually beyond the quote.
    let (emb_hlen, emb_proto, emb_src, emb_dst) = if p.v6 {
        let ip = Ipv6Packet::new_quoted(q).ok()?;
        let (s, d) = (ip.src_addr(), ip.dst_addr());
        (40, u8::from(ip.next_header()), IpAddr::V6(s), IpAddr::V6(d))
    } else {
        let ip = Ipv4Packet::new_quoted(q).ok()?;
        if ip.frag_offset() != 0 {
            return None; // a later fragment: no ports
        }
        let (s, d) = (ip.src_addr(), ip.dst_addr());
        (
            ip.header_len(),
            u8::from(ip.protocol()),
            IpAddr::V4(s),
            IpAddr::V4(d),
        )
    };
    let proto = match emb_proto {
        PROTO_TCP => Protocol::Tcp,
        PROTO_UDP => Protocol::Udp,
        PROTO_SCTP => Protocol::Sctp,
        _ => return None,
    };
    if q.len() < emb_hlen + 4 {
        return None;
    }
    let emb_sport = read_u16(q, emb_hlen);
    let emb_dport = read_u16(q, emb_hlen + 2);
    let key = super::key_of(proto, emb_dst, emb_dport, emb_src, emb_sport);
    let (view, dir) = flows.lookup_view(&key)?;
    let data: FlowData = view.data;
    let fullnat = data.flags & FLAG_FULLNAT != 0;
    let out = after(&data, dir);
    let outer_src = if fullnat || dir == Direction::Reply {
        out.src.ip()
    } else {
        p.src
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
    Some(IcmpMatch {
        outer,
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
        e + 40 + usize::from(read_u16(frame, e + 4))
    } else {
        e + usize::from(read_u16(frame, e + 2))
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
    let c = match (p.src, p.dst) {
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            checksum::l4_checksum_v6(&s.octets(), &d.octets(), PROTO_ICMPV6, msg)
        }
        _ => checksum::checksum(msg),
    };
    if c != 0 {
        return Err(DropReason::BadIcmpChecksum);
    }
    if let Some(r) = quoted_sctp(frame, p, m) {
        let ok = frame
            .get(r)
            .and_then(|seg| crate::wire::SctpPacket::new_checked(seg).ok())
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
    // The quoted L4 header.
    let l4 = m.emb + m.emb_hlen;
    let l4_avail = m.emb_len - m.emb_hlen;
    let (os, od) = (AddrBytes::new(m.emb_src), AddrBytes::new(m.emb_dst));
    let (ns, nd) = (
        AddrBytes::new(m.inner.src.ip()),
        AddrBytes::new(m.inner.dst.ip()),
    );
    write_u16(frame, l4, m.inner.src.port());
    write_u16(frame, l4 + 2, m.inner.dst.port());
    let csum_at = match m.emb_proto {
        PROTO_TCP if l4_avail >= 18 => Some(16),
        PROTO_UDP if l4_avail >= 8 => Some(6),
        _ => None,
    };
    if let Some(at) = csum_at {
        let old = read_u16(frame, l4 + at);
        if !(m.emb_proto == PROTO_UDP && old == 0) {
            let mut d = Delta::new();
            d.bytes(os.as_slice(), ns.as_slice());
            d.bytes(od.as_slice(), nd.as_slice());
            d.word(m.emb_sport, m.inner.src.port());
            d.word(m.emb_dport, m.inner.dst.port());
            let mut c = d.apply(old);
            if m.emb_proto == PROTO_UDP {
                c = checksum::udp_nonzero(c);
            }
            write_u16(frame, l4 + at, c);
        }
    }
    // The quoted IP header.
    let e = m.emb;
    let alen = os.as_slice().len();
    let (sa, da) = if p.v6 {
        (e + 8, e + 24)
    } else {
        (e + 12, e + 16)
    };
    frame[sa..sa + alen].copy_from_slice(ns.as_slice());
    frame[da..da + alen].copy_from_slice(nd.as_slice());
    if !p.v6 {
        // Incrementally: a quoted header that came with a wrong checksum keeps it wrong.
        let mut d = Delta::new();
        d.bytes(os.as_slice(), ns.as_slice());
        d.bytes(od.as_slice(), nd.as_slice());
        let c = d.apply(read_u16(frame, e + 10));
        write_u16(frame, e + 10, c);
    }
    if let Some(r) = quoted_sctp(frame, p, m) {
        // (`verify` checked its CRC32c.)
        let seg = &mut frame[r];
        seg[8..12].fill(0);
        let crc = crc32c::crc32c(seg);
        seg[8..12].copy_from_slice(&crc.to_le_bytes());
    }
    // The outer headers.
    frame[0..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&src_mac);
    let l3 = p.l3;
    let (ons, ond) = (
        AddrBytes::new(m.outer.src.ip()),
        AddrBytes::new(m.outer.dst.ip()),
    );
    if p.v6 {
        frame[l3 + 7] = p.ttl - 1;
        frame[l3 + 8..l3 + 24].copy_from_slice(ons.as_slice());
        frame[l3 + 24..l3 + 40].copy_from_slice(ond.as_slice());
    } else {
        frame[l3 + 8] = p.ttl - 1;
        frame[l3 + 12..l3 + 16].copy_from_slice(ons.as_slice());
        frame[l3 + 16..l3 + 20].copy_from_slice(ond.as_slice());
        let hlen = p.l4 - l3;
        write_u16(frame, l3 + 10, 0);
        let c = checksum::checksum(&frame[l3..l3 + hlen]);
        write_u16(frame, l3 + 10, c);
    }
    // The ICMP checksum over the whole message.
    let msg = &mut frame[p.l4..p.l4 + p.l4_len];
    write_u16(msg, 2, 0);
    let c = if p.v6 {
        let s: [u8; 16] = ons.as_slice().try_into().unwrap_or([0; 16]);
        let d: [u8; 16] = ond.as_slice().try_into().unwrap_or([0; 16]);
        checksum::l4_checksum_v6(&s, &d, PROTO_ICMPV6, msg)
    } else {
        checksum::checksum(msg)
    };
    write_u16(msg, 2, c);
}
