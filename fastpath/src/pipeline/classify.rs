//! Stage 1: from raw bytes to a [`Packet`] summary (offsets, addresses, ports, flags), or an
//! early verdict (malformed → drop, not IP → pass).
//!
//! Only reads the frame. Everything later stages index into the frame was bounds-checked here:
//! `l4 + l4_len <= frame.len()`, and for a packet with an L4 header, the header's fixed part
//! (ports, checksum) lies within `l4_len`.

use std::net::IpAddr;

use crate::wire::{
    self, IpProtocol, Ipv4Packet, Ipv6Packet, L3Info, SctpPacket, TcpPacket, UdpPacket,
};

use super::{DropReason, Verdict};

/// IP protocol numbers the pipeline handles itself.
pub(crate) use vocab::ip_proto::{
    ICMP as PROTO_ICMP, ICMPV6 as PROTO_ICMPV6, SCTP as PROTO_SCTP, TCP as PROTO_TCP,
    UDP as PROTO_UDP,
};

/// Where this packet sits in a fragmented datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frag {
    /// Not fragmented.
    No,
    /// Offset 0 with more fragments: carries the L4 header.
    First(u32),
    /// Non-zero offset: no L4 header.
    Later(u32),
}

/// What the later stages need to know about a frame.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packet {
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the L4 header.
    pub l4: usize,
    /// L4 bytes (bounded by the IP length field, so Ethernet padding is excluded).
    pub l4_len: usize,
    /// IPv6?
    pub v6: bool,
    /// L4 protocol number.
    pub proto: u8,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port (0 without an L4 header).
    pub sport: u16,
    /// Destination port (0 without an L4 header).
    pub dport: u16,
    /// TCP flags byte; for SCTP the flags the flow table's state machine takes
    /// ([`vocab::sctp_events`] of the first chunk's type).
    pub flags: u8,
    /// TTL or hop limit.
    pub ttl: u8,
    /// Fragment position.
    pub frag: Frag,
    /// For a later fragment, where its datagram would end: IPv4 the total length up to this
    /// fragment's end, IPv6 the reassembled payload length (above 65,535: oversized);
    /// otherwise 0.
    pub frag_end: u32,
}

impl Packet {
    /// Whether an L4 header is present (and its ports were read).
    #[inline]
    pub fn has_l4(&self) -> bool {
        !matches!(self.frag, Frag::Later(_))
    }

    /// The IP packet's length: its headers (extension headers included) and L4 bytes.
    #[inline]
    pub fn ip_len(&self) -> usize {
        self.l4 - self.l3 + self.l4_len
    }
}

impl From<wire::Error> for DropReason {
    fn from(e: wire::Error) -> Self {
        match e {
            wire::Error::Truncated => DropReason::Truncated,
            wire::Error::BadIhl => DropReason::BadIhl,
            wire::Error::BadLength => DropReason::BadLength,
            wire::Error::BadVersion => DropReason::BadVersion,
            wire::Error::BadDataOffset => DropReason::BadL4Header,
            wire::Error::TooManyExtHeaders => DropReason::TooManyExtHeaders,
            wire::Error::Malformed => DropReason::Malformed,
        }
    }
}

/// Parses `frame`; `Err` is the verdict for frames the pipeline does not go further with.
#[inline]
pub(crate) fn classify(frame: &[u8]) -> Result<Packet, Verdict> {
    let info = wire::parse_frame(frame).map_err(|e| Verdict::Drop(e.into()))?;
    let at = (info.l3_offset, info.l4_offset, info.l4_len);
    let (mut p, protocol) = match info.l3 {
        L3Info::Ipv4 {
            protocol,
            fragment,
            later_fragment,
        } => (
            ipv4(frame, at, protocol, (fragment, later_fragment))?,
            protocol,
        ),
        L3Info::Ipv6 { protocol, fragment } => (ipv6(frame, at, protocol, fragment), protocol),
        L3Info::Arp | L3Info::Other => return Err(Verdict::Pass),
    };
    if p.l4 + p.l4_len > frame.len() {
        return Err(Verdict::Drop(DropReason::Truncated));
    }
    if p.has_l4() {
        l4_header(&frame[p.l4..p.l4 + p.l4_len], protocol, &mut p)?;
    }
    Ok(p)
}

/// The packet whose IPv4 header is at `l3` and L4 bytes at `l4..l4 + l4_len`
/// (`parse_frame` checked 20 <= IHL*4 <= total length <= buffer), ports and flags not yet
/// read; a drop for a wrong header checksum.
#[inline(always)]
fn ipv4(
    frame: &[u8],
    (l3, l4, l4_len): (usize, usize, usize),
    protocol: IpProtocol,
    (fragment, later_fragment): (bool, bool),
) -> Result<Packet, Verdict> {
    let ip = Ipv4Packet::new_unchecked(&frame[l3..]);
    if !ip.verify_checksum() {
        return Err(Verdict::Drop(DropReason::BadIpChecksum));
    }
    let id = u32::from(ip.ident());
    let frag = match (fragment, later_fragment) {
        (false, _) => Frag::No,
        (true, false) => Frag::First(id),
        (true, true) => Frag::Later(id),
    };
    Ok(Packet {
        l3,
        l4,
        l4_len,
        v6: false,
        proto: u8::from(protocol),
        src: IpAddr::V4(ip.src_addr()),
        dst: IpAddr::V4(ip.dst_addr()),
        sport: 0,
        dport: 0,
        flags: 0,
        ttl: ip.ttl(),
        frag,
        // Offset + total length.
        frag_end: if matches!(frag, Frag::Later(_)) {
            u32::from(ip.frag_offset()) + u32::from(ip.total_len())
        } else {
            0
        },
    })
}

/// [`ipv4`] for an IPv6 header at `l3` (`parse_frame` checked the fixed header and the
/// payload length) and its fragment header's part, `fragment`.
#[inline(always)]
fn ipv6(
    frame: &[u8],
    (l3, l4, l4_len): (usize, usize, usize),
    protocol: IpProtocol,
    fragment: Option<wire::Ipv6FragmentInfo>,
) -> Packet {
    let frag = match fragment {
        None => Frag::No,
        Some(f) if f.offset == 0 && f.more_frags => Frag::First(f.ident),
        // An atomic fragment (offset 0, no MF) is a whole datagram.
        Some(f) if f.offset == 0 => Frag::No,
        Some(f) => Frag::Later(f.ident),
    };
    let ip = Ipv6Packet::new_unchecked(&frame[l3..]);
    // The reassembled payload: this payload without the fragment header, moved by the offset
    // (the unfragmentable part is in both).
    let frag_end = match (frag, fragment) {
        (Frag::Later(_), Some(f)) => {
            (u32::from(ip.payload_len()) + u32::from(f.offset)).saturating_sub(8)
        }
        _ => 0,
    };
    Packet {
        l3,
        l4,
        l4_len,
        v6: true,
        proto: u8::from(protocol),
        src: IpAddr::V6(ip.src_addr()),
        dst: IpAddr::V6(ip.dst_addr()),
        sport: 0,
        dport: 0,
        flags: 0,
        ttl: ip.hop_limit(),
        frag,
        frag_end,
    }
}

/// The L4 header `seg` of a packet that carries one: checked, its ports and flags into `p`
/// (an ICMP header is only checked for length; other protocols are left as they are).
#[inline(always)]
fn l4_header(seg: &[u8], protocol: IpProtocol, p: &mut Packet) -> Result<(), Verdict> {
    let whole = p.frag == Frag::No;
    let (sport, dport) = match protocol {
        IpProtocol::Tcp => {
            // Only the first fragment may be shorter than its header says; the fixed header
            // must be there.
            if seg.len() < wire::tcp::HEADER_LEN {
                return Err(Verdict::Drop(DropReason::Truncated));
            }
            let tcp = TcpPacket::new_unchecked(seg);
            let off = tcp.header_len();
            if off < wire::tcp::HEADER_LEN || (whole && off > seg.len()) {
                return Err(Verdict::Drop(DropReason::BadL4Header));
            }
            p.flags = tcp.flags().0;
            (tcp.src_port(), tcp.dst_port())
        }
        IpProtocol::Udp => {
            if seg.len() < wire::udp::HEADER_LEN {
                return Err(Verdict::Drop(DropReason::Truncated));
            }
            let udp = UdpPacket::new_unchecked(seg);
            let len = usize::from(udp.len());
            if whole && (len < wire::udp::HEADER_LEN || len > seg.len()) {
                return Err(Verdict::Drop(DropReason::BadLength));
            }
            if p.v6 && udp.checksum() == 0 {
                // RFC 8200: a zero UDP checksum is invalid over IPv6.
                return Err(Verdict::Drop(DropReason::UdpZeroChecksumV6));
            }
            (udp.src_port(), udp.dst_port())
        }
        IpProtocol::Sctp => {
            let sctp = SctpPacket::new_unchecked(seg);
            let Some(chunk) = sctp.first_chunk_type() else {
                return Err(Verdict::Drop(DropReason::Truncated));
            };
            p.flags = vocab::sctp_events(u8::from(chunk)).bits();
            (sctp.src_port(), sctp.dst_port())
        }
        IpProtocol::Icmp | IpProtocol::Icmpv6 if seg.len() < 8 => {
            return Err(Verdict::Drop(DropReason::Truncated));
        }
        _ => return Ok(()),
    };
    p.sport = sport;
    p.dport = dport;
    Ok(())
}
