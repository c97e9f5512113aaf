//! The general path: a frame [`classify`] accepted, looked up by its [`FlowKey`], then
//! `forward` (a known flow; a DSR flow's by [`dsr`]), `new_flow` (`create`),
//! `later_fragment` ([`frag`]) or `icmp` (an ICMP error about a flow, [`icmp`]); and a
//! packet's tuple (`flow_key`, `key_of`).
//! The IPv4 shortcut ([`fast`](super::fast)) sends here every frame it does not take.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use flowtable::{Direction, FlowHit, FlowKey, Protocol};

use super::classify::{
    self, Frag, PROTO_ICMP, PROTO_ICMPV6, PROTO_SCTP, PROTO_TCP, PROTO_UDP, Packet,
};
use super::nat::{self, Endpoints};
use super::{
    DropReason, FLAG_DSR, FLAG_SYNPROXY, Pipeline, Verdict, dsr, frag, guard, hygiene, icmp, reuse,
};
use crate::snapshot::NextHop;

impl Pipeline {
    #[inline]
    pub(super) fn run_general(&mut self, frame: &mut [u8], now: Instant) -> Verdict {
        let p = match classify::classify(frame) {
            Ok(p) => p,
            Err(v) => return v,
        };
        match p.proto {
            PROTO_TCP | PROTO_UDP | PROTO_SCTP => {}
            PROTO_ICMP | PROTO_ICMPV6 if p.has_l4() => return self.icmp(frame, &p, now),
            _ => return Verdict::Pass,
        }
        if let Frag::Later(id) = p.frag {
            return self.later_fragment(frame, &p, id, now);
        }
        if p.proto == PROTO_SCTP && p.frag != Frag::No {
            return Verdict::Drop(DropReason::SctpFragment);
        }
        let key = flow_key(&p);
        // Its CRC32c is recomputed when it is forwarded: checked before anything is decided
        // (a port-reusing INIT ends a flow).
        if p.proto == PROTO_SCTP && !hygiene::sctp_crc_ok(frame, &p) {
            return self.corrupt_sctp(&p, &key);
        }
        if let Some(hit) = self.flows.lookup_hit(&key) {
            // (A packet whose TTL expires is dropped by `forward`, leaving the flow as it is.)
            if p.proto == PROTO_TCP && p.ttl > 1 && guard::guarded(p.flags) {
                let s = guard::Segment {
                    l3: p.l3,
                    l4: p.l4,
                    l4_len: p.l4_len,
                    v6: p.v6,
                    fragment: p.frag != Frag::No,
                };
                if let Some(r) = self.guard(frame, &s, p.flags, hit.handle, hit.dir) {
                    return self.forward_held(frame, &p, &hit, r, now);
                }
            }
            if !(reuse::reopens(p.flags) && p.ttl > 1 && self.reopen(hit.handle, hit.dir)) {
                return self.forward(frame, &p, &hit, now, true);
            }
        }
        self.new_flow(frame, &p, key, now)
    }

    /// A packet of a known flow that the state guard holds for `reason`: forwarded without
    /// its state change and counted; but a SYN-ACK of a flow the SYN proxy opened is the
    /// proxy's to answer, and a receiver drops a segment it cannot verify.
    #[cold]
    #[inline(never)]
    fn forward_held(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        hit: &FlowHit,
        reason: guard::HoldReason,
        now: Instant,
    ) -> Verdict {
        let synack = vocab::TcpFlags::SYN.bits() | vocab::TcpFlags::ACK.bits();
        if hit.flags & FLAG_SYNPROXY != 0
            && hit.dir == Direction::Reply
            && vocab::TcpFlags(p.flags).handshake().bits() == synack
        {
            return Verdict::Drop(DropReason::BadTcpChecksum);
        }
        self.counters.held[reason as usize] += 1;
        self.forward(frame, p, hit, now, false)
    }

    /// An SCTP packet with a wrong CRC32c: dropped if xvs would have handled it (a flow or a
    /// frontend has it, or its destination is a ClusterIP or inside a Service CIDR), else
    /// passed as any frame for no frontend.
    #[cold]
    #[inline(never)]
    fn corrupt_sctp(&self, p: &Packet, key: &FlowKey) -> Verdict {
        let fe = crate::snapshot::Frontend {
            vip: p.dst,
            protocol: Protocol::Sctp,
            port: p.dport,
        };
        let s = &*self.snapshot;
        if self.flows.lookup_hit(key).is_some()
            || s.service_for(&fe).is_some()
            || s.is_cluster_ip(p.dst)
            || s.in_service_cidr(p.dst)
        {
            Verdict::Drop(DropReason::BadSctpChecksum)
        } else {
            Verdict::Pass
        }
    }

    /// Why a packet from `src` must not open a flow (or have its ICMP error translated):
    /// a martian source, or one of xvs's own addresses (see [`hygiene`]).
    #[inline]
    pub(super) fn source_check(&self, src: IpAddr) -> Result<(), DropReason> {
        if hygiene::martian(src) {
            return Err(DropReason::MartianSource);
        }
        let own = match src {
            IpAddr::V4(a) => self.config.snat_v4 == Some(a),
            IpAddr::V6(a) => self.config.snat_v6 == Some(a),
        };
        if own || self.snapshot.is_vip(src) {
            return Err(DropReason::OwnAddressSource);
        }
        Ok(())
    }

    /// [`source_check`](Self::source_check) for an IPv4 source (`Ipv4Addr::to_bits`): the
    /// same answer, without an `IpAddr` (the IPv4 shortcut's new flows).
    #[inline(always)]
    pub(super) fn source_check_v4(&self, src: u32) -> Result<(), DropReason> {
        if hygiene::martian_v4(src) {
            return Err(DropReason::MartianSource);
        }
        let own = self.config.snat_v4.is_some_and(|a| a.to_bits() == src);
        if own || self.snapshot.is_vip_v4(src) {
            return Err(DropReason::OwnAddressSource);
        }
        Ok(())
    }

    /// A packet of a known flow; `touch`: its state change and time are recorded (not for a
    /// packet the state guard holds).
    #[inline]
    fn forward(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        hit: &FlowHit,
        now: Instant,
        touch: bool,
    ) -> Verdict {
        if hit.flags & FLAG_DSR != 0 {
            return self.dsr_known(frame, p, hit, now, touch);
        }
        if hit.flags & FLAG_SYNPROXY != 0 {
            return self.proxied(frame, p, hit, now, touch);
        }
        self.forward_plain(frame, p, hit, now, touch)
    }

    /// [`forward`](Self::forward) without the SYN proxy's translation.
    #[inline]
    pub(super) fn forward_plain(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        hit: &FlowHit,
        now: Instant,
        touch: bool,
    ) -> Verdict {
        if p.ttl <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        let dst = hit.dst_ip();
        let Some(nh) = self.next_hop(dst) else {
            return Verdict::Slow;
        };
        if touch {
            self.touch(hit, p.flags, frame, p.l4, now);
        }
        self.traffic
            .packet(hit.backend_id(), hit.dir == Direction::Reply, p.ip_len());
        let src_mac = nh.src_mac.unwrap_or(self.config.mac);
        if let (false, Frag::No, PROTO_TCP | PROTO_UDP) = (p.v6, p.frag, p.proto) {
            frame[..6].copy_from_slice(&nh.dst_mac);
            frame[6..12].copy_from_slice(&src_mac);
            nat::rewrite_v4(
                frame,
                p.l3,
                p.l4,
                p.proto,
                nat::pack_addrs(hit.src_bits() as u32, hit.dst_bits() as u32),
                nat::pack_ports(hit.src_port, hit.dst_port),
            );
            return Verdict::Tx(nh.port);
        }
        let to = Endpoints {
            src: SocketAddr::new(hit.src_ip(), hit.src_port),
            dst: SocketAddr::new(dst, hit.dst_port),
        };
        self.send(frame, p, &to, nh, now)
    }

    /// Rewrites and records the first fragment's translation.
    #[inline]
    pub(super) fn send(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        to: &Endpoints,
        nh: NextHop,
        now: Instant,
    ) -> Verdict {
        nat::rewrite(
            frame,
            p,
            to,
            nh.src_mac.unwrap_or(self.config.mac),
            nh.dst_mac,
        );
        if let Frag::First(id) = p.frag {
            self.frags
                .insert(frag::FragKey::new(p, id), to.src.ip(), to.dst.ip(), now);
        }
        Verdict::Tx(nh.port)
    }

    /// A packet of a known DSR flow: the original direction's (the reply tuple of a DSR flow
    /// is never anyone's: a packet matching it is not the flow's, and goes to the kernel).
    #[cold]
    #[inline(never)]
    fn dsr_known(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        hit: &FlowHit,
        now: Instant,
        touch: bool,
    ) -> Verdict {
        if hit.dir == Direction::Reply {
            return Verdict::Pass;
        }
        self.dsr_forward(frame, p, hit, now, touch)
    }

    /// A non-first fragment: follows its first fragment's translation, or is dropped.
    fn later_fragment(&mut self, frame: &mut [u8], p: &Packet, id: u32, now: Instant) -> Verdict {
        if p.frag_end > hygiene::DATAGRAM_MAX {
            return Verdict::Drop(DropReason::OversizedFragment);
        }
        let (src, dst) = match self.frags.lookup(&frag::FragKey::new(p, id), now) {
            Some(frag::FragTo::Nat(src, dst)) => (src, dst),
            Some(frag::FragTo::Dsr(backend, encap, hash)) => {
                return self.dsr_fragment(frame, p, backend, (encap, hash), now);
            }
            None => return Verdict::Drop(DropReason::FragmentNoMatch),
        };
        if p.ttl <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        let Some(nh) = self.next_hop(dst) else {
            return Verdict::Slow;
        };
        let to = Endpoints {
            src: SocketAddr::new(src, 0),
            dst: SocketAddr::new(dst, 0),
        };
        nat::rewrite(
            frame,
            p,
            &to,
            nh.src_mac.unwrap_or(self.config.mac),
            nh.dst_mac,
        );
        self.counters.fragments_forwarded += 1;
        Verdict::Tx(nh.port)
    }

    fn icmp(&mut self, frame: &mut [u8], p: &Packet, now: Instant) -> Verdict {
        let Some(m) = icmp::match_error(frame, p, &self.flows) else {
            return Verdict::Pass;
        };
        if let Err(r) = self.icmp_hygiene(frame, p, &m) {
            return Verdict::Drop(r);
        }
        if p.ttl <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        if let Some(encap) = m.dsr {
            return self.dsr_icmp(frame, p, &m, encap, now);
        }
        let Some(nh) = self.next_hop(m.outer.dst.ip()) else {
            return Verdict::Slow;
        };
        icmp::translate(
            frame,
            p,
            &m,
            nh.src_mac.unwrap_or(self.config.mac),
            nh.dst_mac,
        );
        self.counters.icmp_translated += 1;
        Verdict::Tx(nh.port)
    }

    /// An ICMP error about a DSR flow (matched `m`): sent on to the flow's backend unchanged,
    /// encapsulated as the flow's packets are.
    #[cold]
    #[inline(never)]
    fn dsr_icmp(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        m: &icmp::IcmpMatch,
        encap: vocab::Encap,
        now: Instant,
    ) -> Verdict {
        let (client, vip) = m.quoted_reversed();
        let hash = dsr::flow_hash(
            client.ip(),
            client.port(),
            vip.ip(),
            vip.port(),
            m.quoted_proto(),
        );
        let way = match self.dsr_way(frame, p, (encap, m.outer.dst.ip()), hash, now) {
            Ok(w) => w,
            Err(v) => return v,
        };
        self.counters.icmp_translated += 1;
        self.dsr_emit(frame, p, &way)
    }

    /// Why a matched ICMP error must not be translated: its addresses, then its checksums
    /// (the translation recomputes them).
    fn icmp_hygiene(
        &self,
        frame: &[u8],
        p: &Packet,
        m: &icmp::IcmpMatch,
    ) -> Result<(), DropReason> {
        self.source_check(p.src)?;
        if hygiene::martian(p.dst) {
            return Err(DropReason::MartianDestination);
        }
        icmp::verify(frame, p, m)
    }
}

/// The protocol of a packet the general path forwards or schedules: TCP, UDP or SCTP
/// (`run_general` passed every other protocol before).
#[inline]
pub(super) fn l4_protocol(p: &Packet) -> Protocol {
    match p.proto {
        PROTO_TCP => Protocol::Tcp,
        PROTO_UDP => Protocol::Udp,
        _ => Protocol::Sctp,
    }
}

/// The packet's own tuple.
#[inline]
pub(crate) fn flow_key(p: &Packet) -> FlowKey {
    key_of(l4_protocol(p), p.src, p.sport, p.dst, p.dport)
}

#[inline]
pub(crate) fn key_of(proto: Protocol, src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> FlowKey {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => FlowKey::v4(proto, s, sport, d, dport),
        (IpAddr::V6(s), IpAddr::V6(d)) => FlowKey::v6(proto, s, sport, d, dport),
        // Not produced by classify (one header, one family); a key that matches nothing.
        (s, _) => FlowKey::new(proto, SocketAddr::new(s, sport), SocketAddr::new(s, sport))
            .unwrap_or_else(|| {
                FlowKey::v4(proto, Ipv4Addr::UNSPECIFIED, 0, Ipv4Addr::UNSPECIFIED, 0)
            }),
    }
}
