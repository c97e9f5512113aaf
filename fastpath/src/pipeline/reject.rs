//! Rejects: the answer a client gets, instead of silence, when its new flow cannot be served
//! (kube-proxy's `reject`, IPVS's `ip_vs_leave`), so that it fails at once rather than
//! after its timeouts.
//!
//! # Contract
//!
//! - **When** ([`RejectReason`]): a new flow for a frontend whose service has no usable
//!   backend and says so ([`NoEndpoints::Reject`](crate::snapshot::NoEndpoints): a
//!   Kubernetes Service without endpoints, a static service without a usable backend), and a
//!   packet to a ClusterIP on a port or protocol none of its frontends serves. Decided in
//!   `schedule`, after the source checks (`hygiene`: a martian or spoofed source is dropped,
//!   never answered), the TTL and, for a service, its admission (source ranges, freeze,
//!   rate limit drop silently). Only the miss path gets here.
//! - **What.** TCP: an RST (RFC 9293 3.10.7.1, a segment to a closed port): to a segment
//!   with ACK, `seq = SEG.ACK` and RST alone; else `seq = 0`, `ack = SEG.SEQ + SEG.LEN`
//!   (the data, plus one for SYN and for FIN) and RST|ACK; no options, window 0. An RST
//!   is never answered (`Drop(NoFlow)`), nor is a TCP segment or UDP datagram whose checksum
//!   is wrong (`Drop(BadTcpChecksum)`, `Drop(BadUdpChecksum)`: the kernel verifies before
//!   it rejects, `nf_reject`). UDP, SCTP and a fragment of anything: ICMP
//!   destination unreachable, port unreachable (type 3 code 3; ICMPv6 type 1 code 4) quoting
//!   the offending packet from its IP header as it arrived, as much as fits in 576 bytes
//!   (RFC 1812 4.3.2.3; at least the IP header and 8 bytes, RFC 792) or, for IPv6, in 1280
//!   (RFC 4443 2.4). The reply is a fresh IP header (IPv4 without options, TTL 64; IPv6
//!   without extension headers, hop limit 64) from the address the client addressed to the
//!   client, leaving towards the client's next hop (its MACs, its port), as the SYN proxy
//!   answers; a VLAN tag stays.
//! - **Room.** An RST always fits in the frame. An ICMP error is 28 (IPv6: 48) bytes longer
//!   than what it quotes: it needs the frame's buffer ([`FrameBatch::buffer`],
//!   `process_frame`). Without room ([`Pipeline::process`]) it quotes what fits, and when
//!   that is less than the minimum the packet is `Drop(RejectNoRoom)`; callers with room
//!   build it again with room (the drop is then not counted). Never in the workers (UMEM
//!   frames have room).
//! - **Rate.** Each worker sends at most `[dataplane] reject_rate` rejects a second, in
//!   bursts of `reject_burst` (the kernel's `icmp_msgs_per_sec` and `icmp_msgs_burst`:
//!   1000 and 50): a token bucket on the batch's `now` ([`WorkerBucket`]); over it the
//!   packet is `Drop(RejectRateLimited)`. A flood of spoofed packets to an empty service
//!   cannot be reflected at more than that rate, per worker.
//! - **Order.** The packet's checksum, then room, then the client's next hop (unknown:
//!   `Slow`, no token taken), then a token, then the frame is rewritten. Counted in
//!   `Counters::rejects`, not in `drops`.
//! - **Packet too big** ([`RejectReason::PacketTooBig`], `dsr`): a DSR packet too big for
//!   its encapsulation gets the same ICMP error built here (the one builder of ICMP errors,
//!   [`IcmpError`]) with another type: fragmentation needed (type 3 code 4) / packet too big
//!   (ICMPv6 type 2), the MTU left for it in the header (RFC 1191, RFC 4443 3.2), whatever
//!   its protocol (a TCP segment included), from the address it was sent to. As a router
//!   does, its checksum is not verified first; the same room, next hop and rate limit
//!   apply.
//!
//! [`FrameBatch::buffer`]: super::FrameBatch::buffer
//! [`WorkerBucket`]: crate::limit::WorkerBucket

use std::net::IpAddr;
use std::time::Instant;

use vocab::TcpFlags;

use super::classify::{self, Frag, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP, Packet};
use super::synproxy::{self, Seg};
use super::{DropReason, FrameBatch, Pipeline, Verdict};
use crate::limit::{RateLimit, WorkerBucket};
use crate::wire::{TcpPacket, checksum};

/// Why a packet was rejected; indexes `Counters::rejects`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RejectReason {
    /// The frontend's service has no usable endpoint (kube-proxy's "no endpoints", IPVS
    /// with no destination).
    NoEndpoints,
    /// A port or protocol a ClusterIP does not serve.
    UnservedPort,
    /// A DSR packet too big once encapsulated (`[dataplane] dsr_mtu`): ICMP fragmentation
    /// needed, ICMPv6 packet too big.
    PacketTooBig,
}

impl RejectReason {
    /// Every reason, in counter-index order.
    pub const ALL: &'static [RejectReason] = &[
        RejectReason::NoEndpoints,
        RejectReason::UnservedPort,
        RejectReason::PacketTooBig,
    ];
    /// Number of reasons (size of the counter array).
    pub const COUNT: usize = Self::ALL.len();

    /// A stable snake_case name (metrics label, `xvs sim`, `xvs pcap`'s report).
    pub const fn name(self) -> &'static str {
        match self {
            RejectReason::NoEndpoints => "no_endpoints",
            RejectReason::UnservedPort => "unserved_port",
            RejectReason::PacketTooBig => "packet_too_big",
        }
    }
}

/// The port of a reject `schedule` decided but nobody built yet (see [`pending`]).
const PENDING: u16 = u16::MAX;

/// What `schedule` answers for a packet to reject: its callers build the reject
/// ([`Pipeline::reject_in`], [`Pipeline::reject_room`]); it never leaves the pipeline.
#[inline]
pub(super) const fn pending(reason: RejectReason) -> Verdict {
    Verdict::Reject {
        reason,
        port: PENDING,
    }
}

/// The reason of a [`pending`] verdict.
#[inline]
pub(super) fn pending_reason(v: Verdict) -> Option<RejectReason> {
    match v {
        Verdict::Reject { reason, port } if port == PENDING => Some(reason),
        _ => None,
    }
}

/// What a reject without room answers (see the module doc): callers with room build it
/// again ([`Pipeline::reject_again`]).
pub(super) const NO_ROOM: Verdict = Verdict::Drop(DropReason::RejectNoRoom);

/// Largest ICMP error about IPv4, IP header included (RFC 1812 4.3.2.3).
const ICMP4_MAX: usize = 576;
/// Largest ICMPv6 error, IPv6 header included: the minimum MTU (RFC 4443 2.4).
const ICMP6_MAX: usize = 1280;
/// ICMP and ICMPv6 header: type, code, checksum, 4 unused bytes.
const ICMP_HDR: usize = 8;
/// TTL and hop limit of a reject.
const TTL: u8 = 64;
/// IPv4 TOS of an ICMP error (Linux's `IPTOS_PREC_INTERNETCONTROL`).
const TOS_INTERNETCONTROL: u8 = 0xc0;

/// A pipeline's rejects: its rate limit, and what a caller that builds or sizes a reject
/// after the fact needs.
#[derive(Debug)]
pub(super) struct RejectState {
    /// This worker's reject rate limit.
    limit: WorkerBucket,
    /// The reason of the last reject that found no room ([`NO_ROOM`]), for the caller that
    /// builds it again with room.
    no_room_reason: RejectReason,
    /// The length of the last reject built (a frame's new length: its caller sets it).
    pub(super) len: usize,
    /// The MTU a [`RejectReason::PacketTooBig`] answer carries (set before asking for it).
    pub(super) too_big_mtu: u16,
}

impl RejectState {
    pub(super) fn new(limit: RateLimit, epoch: Instant) -> Self {
        RejectState {
            limit: WorkerBucket::new(limit, epoch),
            no_room_reason: RejectReason::NoEndpoints,
            len: 0,
            too_big_mtu: 0,
        }
    }
}

/// The answer to one packet.
enum Reply {
    /// An RST (or RST|ACK) segment.
    Rst(Seg),
    /// An ICMP error quoting `quote` bytes of the packet.
    Icmp { kind: IcmpError, quote: usize },
}

/// An ICMP error xvs builds about a packet ([`write_icmp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IcmpError {
    /// Destination unreachable, port unreachable (ICMP 3/3, ICMPv6 1/4).
    PortUnreachable,
    /// Fragmentation needed (ICMP 3/4, the MTU in the low half of the second word) /
    /// packet too big (ICMPv6 2/0, the MTU in the second word).
    TooBig(u16),
}

impl IcmpError {
    /// The ICMP (`v6`: ICMPv6) header's first 8 bytes, checksum zero.
    fn header(self, v6: bool) -> [u8; ICMP_HDR] {
        match (self, v6) {
            (IcmpError::PortUnreachable, false) => [3, 3, 0, 0, 0, 0, 0, 0],
            (IcmpError::PortUnreachable, true) => [1, 4, 0, 0, 0, 0, 0, 0],
            (IcmpError::TooBig(mtu), false) => {
                let [a, b] = mtu.to_be_bytes();
                [3, 4, 0, 0, 0, 0, a, b]
            }
            (IcmpError::TooBig(mtu), true) => {
                let [a, b] = mtu.to_be_bytes();
                [2, 0, 0, 0, 0, 0, a, b]
            }
        }
    }
}

impl Pipeline {
    /// The [`pending`] reject of `frame`, built in the frame itself (no room to grow): the
    /// verdict, uncounted. A `Reject`'s length (the frame keeps its own, the rest zeroed) is
    /// left in `reject_len` for a caller that can set it.
    #[cold]
    #[inline(never)]
    pub(super) fn reject_in(
        &mut self,
        frame: &mut [u8],
        reason: RejectReason,
        now: Instant,
    ) -> Verdict {
        let len = frame.len();
        self.reject_grow(frame, len, reason, now).0
    }

    /// The [`pending`] reject of frame `i` of a batch, with its buffer's room (its length set
    /// when it changed): the verdict, uncounted.
    #[cold]
    #[inline(never)]
    pub(super) fn reject_room<B: FrameBatch + ?Sized>(
        &mut self,
        frames: &mut B,
        i: usize,
        reason: RejectReason,
        now: Instant,
    ) -> Verdict {
        let len = frames.frame(i).len();
        let buf = frames.buffer(i);
        let (v, n) = self.reject_grow(buf, len, reason, now);
        if matches!(v, Verdict::Reject { .. }) && n != len {
            frames.set_len(i, n);
        }
        v
    }

    /// After a call without room answered [`NO_ROOM`] for the frame `buf[..len]` (left as
    /// it arrived): the reject again, with the room of `buf`; the verdict (uncounted) and the
    /// frame's new length.
    #[cold]
    #[inline(never)]
    pub(super) fn reject_again(
        &mut self,
        buf: &mut [u8],
        len: usize,
        now: Instant,
    ) -> (Verdict, usize) {
        let reason = self.rejects.no_room_reason;
        self.reject_grow(buf, len, reason, now)
    }

    /// The reject, for `reason`, of the frame `buf[..len]` (the rest of `buf` is room): the
    /// verdict, uncounted, and for a `Reject` the frame's new length. Anything but a
    /// `Reject` leaves the frame as it came.
    pub(super) fn reject_grow(
        &mut self,
        buf: &mut [u8],
        len: usize,
        reason: RejectReason,
        now: Instant,
    ) -> (Verdict, usize) {
        let Some(frame) = buf.get(..len) else {
            return (Verdict::Drop(DropReason::Truncated), len);
        };
        let p = match classify::classify(frame) {
            Ok(p) => p,
            Err(v) => return (v, len),
        };
        let too_big = (reason == RejectReason::PacketTooBig).then_some(self.rejects.too_big_mtu);
        let reply = match reply_of(frame, &p, buf.len(), too_big) {
            Ok(r) => r,
            Err(v) => {
                if v == NO_ROOM {
                    self.rejects.no_room_reason = reason;
                }
                return (v, len);
            }
        };
        let Some(nh) = self.next_hop(p.src) else {
            return (Verdict::Slow, len);
        };
        if !self.rejects.limit.admit(now) {
            return (Verdict::Drop(DropReason::RejectRateLimited), len);
        }
        let end = match reply {
            Reply::Rst(seg) => {
                let end = p.l3 + ip_hdr_len(p.v6) + seg.len();
                if synproxy::emit(&mut buf[..len], p.l3, p.dst, p.src, &seg).is_none() {
                    // (Not reached: `reply_of` checked the room.)
                    return (Verdict::Drop(DropReason::Truncated), len);
                }
                end
            }
            Reply::Icmp { kind, quote } => write_icmp(buf, len, &p, kind, quote),
        };
        buf[..6].copy_from_slice(&nh.dst_mac);
        buf[6..12].copy_from_slice(&nh.src_mac.unwrap_or(self.config.mac));
        self.rejects.len = end;
        (
            Verdict::Reject {
                reason,
                port: nh.port,
            },
            end,
        )
    }
}

fn ip_hdr_len(v6: bool) -> usize {
    if v6 { 40 } else { 20 }
}

/// Whether `p`'s TCP or UDP checksum verifies (as the kernel checks before it rejects:
/// `nf_reject`): true for anything else (SCTP's CRC32c was verified before the flow
/// lookup), for a first fragment (its checksum covers bytes not here) and for an IPv4 UDP
/// datagram without a checksum.
fn l4_checksum_ok(frame: &[u8], p: &Packet) -> bool {
    if !matches!(p.proto, PROTO_TCP | PROTO_UDP) || p.frag != Frag::No {
        return true;
    }
    let Some(l4) = frame.get(p.l4..p.l4 + p.l4_len) else {
        return false;
    };
    match (p.src, p.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            (p.proto == PROTO_UDP && l4.get(6..8) == Some(&[0, 0]))
                || checksum::l4_checksum_v4(&s.octets(), &d.octets(), p.proto, l4) == 0
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            checksum::l4_checksum_v6(&s.octets(), &d.octets(), p.proto, l4) == 0
        }
        _ => false,
    }
}

/// What to answer to `p` (in `frame`), in a buffer of `room` bytes; with `too_big`, the
/// packet-too-big error carrying that MTU; `Err`: the packet's verdict instead (an RST is
/// not answered, nor is a segment or datagram whose checksum is wrong; [`NO_ROOM`]).
fn reply_of(frame: &[u8], p: &Packet, room: usize, too_big: Option<u16>) -> Result<Reply, Verdict> {
    if let Some(mtu) = too_big {
        if p.proto == PROTO_ICMP || p.proto == PROTO_ICMPV6 {
            // (Not reached: `dsr` drops those. An ICMP error is never answered with one.)
            return Err(Verdict::Drop(DropReason::TooBig));
        }
        return icmp_reply(p, room, IcmpError::TooBig(mtu));
    }
    if !l4_checksum_ok(frame, p) {
        let r = if p.proto == PROTO_TCP {
            DropReason::BadTcpChecksum
        } else {
            DropReason::BadUdpChecksum
        };
        return Err(Verdict::Drop(r));
    }
    if p.proto == PROTO_TCP && p.frag == Frag::No {
        // (classify checked the TCP header lies within the frame.)
        let t = TcpPacket::new_unchecked(&frame[p.l4..p.l4 + p.l4_len]);
        let flags = TcpFlags(p.flags);
        if flags.contains(TcpFlags::RST) {
            return Err(Verdict::Drop(DropReason::NoFlow));
        }
        let data = p.l4_len.saturating_sub(t.header_len()) as u32;
        let (seq, ack, out) = if flags.contains(TcpFlags::ACK) {
            (t.ack_number(), 0, TcpFlags::RST)
        } else {
            let len = data
                + u32::from(flags.contains(TcpFlags::SYN))
                + u32::from(flags.contains(TcpFlags::FIN));
            (
                0,
                t.seq_number().wrapping_add(len),
                TcpFlags::RST | TcpFlags::ACK,
            )
        };
        let seg = Seg {
            sport: p.dport,
            dport: p.sport,
            seq,
            ack,
            flags: out.bits(),
            window: 0,
            opts: Default::default(),
        };
        // An RST is never longer than the segment it answers (its headers have no options).
        return Ok(Reply::Rst(seg));
    }
    if p.proto == PROTO_ICMP || p.proto == PROTO_ICMPV6 {
        // (Not reached: ICMP opens no flow. An ICMP error is never answered with one.)
        return Err(Verdict::Pass);
    }
    icmp_reply(p, room, IcmpError::PortUnreachable)
}

/// The ICMP error `kind` about `p`, quoting as much of it as RFC 1812 / RFC 4443 allow and
/// `room` holds; [`NO_ROOM`] when that is less than the IP header(s) and 8 bytes.
fn icmp_reply(p: &Packet, room: usize, kind: IcmpError) -> Result<Reply, Verdict> {
    let hdr = ip_hdr_len(p.v6);
    let max = if p.v6 { ICMP6_MAX } else { ICMP4_MAX };
    let at = p.l3 + hdr + ICMP_HDR;
    let want = p.ip_len().min(max - hdr - ICMP_HDR);
    let quote = want.min(room.saturating_sub(at));
    // At least the IP header(s) and 8 bytes: the ports the client matches the error by.
    let least = (p.l4 - p.l3 + 8).min(p.ip_len());
    if quote < least {
        return Err(NO_ROOM);
    }
    Ok(Reply::Icmp { kind, quote })
}

/// Writes the ICMP error `kind` about `p` (the frame `buf[..len]`) quoting `quote` bytes:
/// the quote moved into place first, then the IP and ICMP headers; returns the new length.
fn write_icmp(buf: &mut [u8], len: usize, p: &Packet, kind: IcmpError, quote: usize) -> usize {
    let hdr = ip_hdr_len(p.v6);
    let icmp = p.l3 + hdr;
    let end = icmp + ICMP_HDR + quote;
    buf.copy_within(p.l3..p.l3 + quote, icmp + ICMP_HDR);
    match (p.dst, p.src) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut buf[p.l3..icmp];
            let total = (hdr + ICMP_HDR + quote) as u16;
            h[..12].copy_from_slice(&[0x45, TOS_INTERNETCONTROL, 0, 0, 0, 0, 0, 0, TTL, 1, 0, 0]);
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let c = checksum::checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            buf[icmp..icmp + ICMP_HDR].copy_from_slice(&kind.header(false));
            let c = checksum::checksum(&buf[icmp..end]);
            buf[icmp + 2..icmp + 4].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let h = &mut buf[p.l3..icmp];
            let plen = (ICMP_HDR + quote) as u16;
            h[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, PROTO_ICMPV6, TTL]);
            h[4..6].copy_from_slice(&plen.to_be_bytes());
            h[8..24].copy_from_slice(&s.octets());
            h[24..40].copy_from_slice(&d.octets());
            buf[icmp..icmp + ICMP_HDR].copy_from_slice(&kind.header(true));
            let c =
                checksum::l4_checksum_v6(&s.octets(), &d.octets(), PROTO_ICMPV6, &buf[icmp..end]);
            buf[icmp + 2..icmp + 4].copy_from_slice(&c.to_be_bytes());
        }
        // (classify gives one family per packet.)
        _ => {}
    }
    if end < len {
        // What the quote left out of a longer packet: padding now.
        buf[end..len].fill(0);
    }
    end
}
