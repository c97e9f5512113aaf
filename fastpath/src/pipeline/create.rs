//! Stage 2 for a packet without a flow: the frontend's service admits and schedules it, the
//! flow is inserted (fullnat: with a SNAT port), and the packet leaves rewritten like the
//! flow's later packets.
//!
//! Two drivers share [`Pipeline::schedule_in`] (every check, in one order, and the
//! scheduler): [`Pipeline::new_flow`] for any classified packet (its frontend found by
//! [`Pipeline::schedule`]), and [`Pipeline::new_flow_v4`] for the fast path's IPv4 TCP/UDP
//! frames (its frontend found by one packed word, `Snapshot::service_for_v4`), which inserts
//! a [`V4Flow`] and rewrites with [`nat::rewrite_v4`]: the same flow, verdict and bytes,
//! without `SocketAddr`s or `FlowKey`s. A DSR service's packets are handed from the fast path to the general one
//! before anything is decided ([`dsr::GENERAL`]); their flows are nat flows marked
//! [`dsr::flags`], whose packets leave through `dsr`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use flowtable::{
    Direction, FlowData, FlowHandle, FlowKey, InsertError, PendingV4, Protocol, TcpFlags, Tick,
    V4Flow, V4Key, v4_addrs_be, v4_ports_be,
};
use lb_algos::{BackendId, FlowTuple, Scheduler};
use vocab::{Mode, sctp, sctp_events};

use super::classify::{PROTO_TCP, Packet};
use super::{
    DropReason, FLAG_DSR, FLAG_FULLNAT, FLAG_SYNPROXY, Pipeline, RejectReason, SNAT_TRIES,
    SYNPROXY, Verdict, dsr, fast, l4_protocol, nat, reject,
};
use crate::snapshot::{Frontend, NoBackend, NoEndpoints, ServiceEntry};

/// What [`Pipeline::schedule`] decided for a new flow.
#[derive(Clone, Copy, Debug)]
pub(super) struct Scheduled {
    /// The backend picked.
    pub backend: SocketAddr,
    pub backend_id: BackendId,
    pub service_id: u32,
    pub snapshot_gen: u32,
    pub mode: Mode,
    /// The packet opens a connection (TCP SYN, SCTP INIT; always for UDP).
    pub opens: bool,
}

impl Pipeline {
    /// Everything before the insert of a new flow for `t` (a packet of protocol `protocol`,
    /// TCP flags or SCTP chunk type `flags`, TTL `ttl`): the frontend's service (none: see
    /// [`unserved`](Self::unserved)), then [`schedule_in`](Self::schedule_in) (when
    /// `synproxy`, the SYN proxy may take the packet). `Err` is the packet's verdict, or a
    /// [`reject::pending`] one that the caller builds.
    #[inline]
    pub(super) fn schedule(
        &self,
        t: &FlowTuple,
        (protocol, flags, ttl): (Protocol, u8, u8),
        synproxy: bool,
        now: Instant,
    ) -> Result<Scheduled, Verdict> {
        let fe = Frontend {
            vip: t.dst,
            protocol,
            port: t.dst_port,
        };
        let Some(svc) = self.snapshot.service_for(&fe) else {
            return Err(self.unserved(t.src, t.dst, ttl));
        };
        self.source_check(t.src).map_err(Verdict::Drop)?;
        self.schedule_in(svc, t, (protocol, flags, ttl), synproxy, now)
    }

    /// The checks and the scheduler of a new flow for `t` at service `svc`, in one order for
    /// every path: the source (martian or xvs's own: `hygiene`; checked by the callers
    /// just before, `source_check` or `source_check_v4`), the TTL, whether the SYN
    /// proxy takes the packet (when `synproxy`: then `Err(SYNPROXY)`, and the caller hands
    /// it the frame), whether the packet may open a flow, source ranges, the freeze
    /// switches, the rate limit, then the scheduler; a service without a usable backend
    /// rejects or drops as it says (`NoEndpoints`).
    #[inline(always)]
    fn schedule_in(
        &self,
        svc: &ServiceEntry,
        t: &FlowTuple,
        (protocol, flags, ttl): (Protocol, u8, u8),
        synproxy: bool,
        now: Instant,
    ) -> Result<Scheduled, Verdict> {
        let snapshot = &*self.snapshot;
        if ttl <= 1 {
            return Err(Verdict::Drop(DropReason::TtlExceeded));
        }
        if snapshot.synproxy_any
            && synproxy
            && protocol == Protocol::Tcp
            && self.synproxy_takes(svc.synproxy, flags)
        {
            return Err(SYNPROXY);
        }
        let opens = match protocol {
            Protocol::Tcp => TcpFlags(flags).handshake() == TcpFlags::SYN,
            Protocol::Sctp => TcpFlags(flags) == sctp_events(sctp::INIT),
            _ => true,
        };
        if !opens && !matches!(svc.scheduler, Scheduler::Mh(_)) {
            return Err(Verdict::Drop(DropReason::NoFlow));
        }
        svc.admit_new_flow(snapshot.frozen, t.src, now)
            .map_err(Verdict::Drop)?;
        let i = match svc.schedule(t, &*self.flows, &self.affinity, now) {
            Ok(i) => i,
            Err(NoBackend::Empty | NoBackend::AllDrained) => return Err(no_endpoints(svc)),
            Err(NoBackend::Refused) => return Err(Verdict::Drop(DropReason::NoBackend)),
        };
        match svc.backends.get(i) {
            Some(b) if b.addr.is_ipv6() == t.src.is_ipv6() => Ok(Scheduled {
                backend: b.addr,
                backend_id: b.id,
                service_id: svc.id,
                snapshot_gen: snapshot.generation as u32,
                mode: svc.mode,
                opens,
            }),
            _ => Err(Verdict::Drop(DropReason::NoBackend)),
        }
    }

    /// A packet (from `src` to `dst`, TTL `ttl`) for no frontend: rejected when `dst` is a
    /// ClusterIP (a port or protocol it does not serve), dropped when it lies inside a
    /// Service CIDR (an address no Service has), else passed to the kernel; the source
    /// checks and the TTL first, as for a frontend (a martian source is never answered).
    #[cold]
    #[inline(never)]
    fn unserved(&self, src: IpAddr, dst: IpAddr, ttl: u8) -> Verdict {
        let snapshot = &*self.snapshot;
        let reject = snapshot.is_cluster_ip(dst);
        if !reject && !snapshot.in_service_cidr(dst) {
            return Verdict::Pass;
        }
        if let Err(r) = self.source_check(src) {
            return Verdict::Drop(r);
        }
        if ttl <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        if reject {
            reject::pending(RejectReason::UnservedPort)
        } else {
            Verdict::Drop(DropReason::ServiceCidr)
        }
    }

    /// A packet that matched no flow: a new flow if it is for a frontend.
    pub(super) fn new_flow(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        key: FlowKey,
        now: Instant,
    ) -> Verdict {
        self.new_flow_as(frame, p, key, now, Proxy::May)
    }

    /// [`new_flow`](Self::new_flow), with the SYN proxy's part said by `proxy`.
    pub(super) fn new_flow_as(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        key: FlowKey,
        now: Instant,
        proxy: Proxy,
    ) -> Verdict {
        let tuple = FlowTuple {
            src: p.src,
            src_port: p.sport,
            dst: p.dst,
            dst_port: p.dport,
        };
        let may = matches!(proxy, Proxy::May);
        let s = match self.schedule(&tuple, (l4_protocol(p), p.flags, p.ttl), may, now) {
            Ok(s) => s,
            Err(SYNPROXY) if may => return self.synproxy_miss(frame, now),
            Err(v) => match reject::pending_reason(v) {
                // (Proxied: the SYN proxy's SYN to a backend, which answers the client's ACK.)
                Some(_) if matches!(proxy, Proxy::Proxied(_)) => return v,
                Some(reason) => return self.reject_in(frame, reason, now),
                None => return v,
            },
        };
        let way = match s.mode {
            Mode::Dsr(encap) => {
                let hash = dsr::flow_hash(p.src, p.sport, p.dst, p.dport, p.proto);
                match self.dsr_way(frame, p, (encap, s.backend.ip()), hash, now) {
                    Ok(w) => Some(w),
                    Err(v) => return v,
                }
            }
            _ => None,
        };
        let Some(mut nh) = self.next_hop(s.backend.ip()) else {
            return Verdict::Slow;
        };
        let mut data = flow_data(p, &key, &s, proxy);
        let flags = flowtable::TcpFlags(p.flags);
        let tick = self.tick(now);
        let new_flows_before = self.counters.new_flows;
        let created = match self.insert_new(&mut data, s.mode == Mode::Fullnat, flags, tick) {
            Ok(created) => created,
            Err(r) => return Verdict::Drop(r),
        };
        if let (Proxy::Proxied(word), Some(h)) = (proxy, created) {
            // Before the SYN leaves: nothing of the backend's can be here yet.
            self.flows.set_seq(h, word);
        }
        if data.backend != s.backend {
            // Another worker's flow was adopted: its backend's next hop.
            match self.next_hop(data.backend.ip()) {
                Some(n) => nh = n,
                None => return Verdict::Slow,
            }
        }
        self.watch_syn(&s, p.proto, new_flows_before);
        if self.counters.new_flows != new_flows_before {
            self.traffic.connection(data.backend_id);
        }
        self.traffic.packet(data.backend_id, false, p.ip_len());
        if let Some(way) = way {
            return self.dsr_created(frame, p, &data, way, nh, now);
        }
        let to = nat::after(&data, Direction::Original);
        self.send(frame, p, &to, nh, now)
    }

    /// Inserts the new flow `data` (`fullnat`: with the next free SNAT port of its family,
    /// at most [`SNAT_TRIES`], then the port of an embryonic flow that gives way); on a lost
    /// race `data` becomes the winner's flow. `Ok`: the handle when this pipeline inserted
    /// it.
    fn insert_new(
        &mut self,
        data: &mut FlowData,
        fullnat: bool,
        flags: flowtable::TcpFlags,
        tick: Tick,
    ) -> Result<Option<FlowHandle>, DropReason> {
        if !fullnat {
            return match self.flows.insert(data, flags, tick) {
                Err(InsertError::ReplyInUse(_)) => Err(DropReason::ReplyTupleInUse),
                r => {
                    let created = r.ok();
                    self.inserted(r, data).map(|()| created)
                }
            };
        }
        data.flags |= FLAG_FULLNAT;
        let snat_ip = match data.client.ip() {
            IpAddr::V4(_) => self.config.snat_v4.map(IpAddr::V4),
            IpAddr::V6(_) => self.config.snat_v6.map(IpAddr::V6),
        };
        let snat_ip = snat_ip.ok_or(DropReason::NoSnatAddress)?;
        let mut oldest = GiveWay::default();
        for _ in 0..SNAT_TRIES.min(self.snat.len()) {
            data.snat = SocketAddr::new(snat_ip, self.snat.next_port());
            match self.flows.insert(data, flags, tick) {
                Err(InsertError::ReplyInUse(h)) => {
                    oldest.consider(&self.flows, h, tick, data.snat.port());
                }
                r => {
                    let created = r.ok();
                    return self.inserted(r, data).map(|()| created);
                }
            }
        }
        let port = self
            .give_way(&oldest, tick)
            .ok_or(DropReason::SnatPortsExhausted)?;
        data.snat = SocketAddr::new(snat_ip, port);
        // The handle too, as above: a SYN-proxied flow needs it for its sequence word.
        let r = self.flows.insert(data, flags, tick);
        let created = r.ok();
        self.inserted(r, data).map(|()| created)
    }

    /// The first packet of a new DSR flow on its `way` out (another worker's flow, adopted
    /// on a lost race, on its own way: its backend's next hop `nh`).
    #[cold]
    #[inline(never)]
    fn dsr_created(
        &mut self,
        frame: &mut [u8],
        p: &Packet,
        data: &FlowData,
        mut way: dsr::Way,
        nh: crate::snapshot::NextHop,
        now: Instant,
    ) -> Verdict {
        match dsr::encap_of(data.flags) {
            Some(encap) if data.flags & FLAG_DSR != 0 => {
                if data.backend.ip() != way.backend || encap != way.encap {
                    let hash = dsr::flow_hash(p.src, p.sport, p.dst, p.dport, p.proto);
                    match self.dsr_way(frame, p, (encap, data.backend.ip()), hash, now) {
                        Ok(w) => way = w,
                        Err(v) => return v,
                    }
                }
                if let super::classify::Frag::First(id) = p.frag {
                    let key = super::frag::FragKey::new(p, id);
                    self.frags
                        .insert_dsr(key, way.backend, (way.encap, way.hash), now);
                }
                self.dsr_emit(frame, p, &way)
            }
            // (The winner of the race made the flow another way: its way out.)
            _ => {
                let to = nat::after(data, Direction::Original);
                self.send(frame, p, &to, nh, now)
            }
        }
    }

    /// Every SNAT port tried was taken: ends the oldest embryonic flow among their holders
    /// (it gives way, as half-open flows do under pressure) and returns its port.
    #[cold]
    #[inline(never)]
    fn give_way(&mut self, oldest: &GiveWay, tick: Tick) -> Option<u16> {
        let (h, port) = oldest.flow?;
        self.flows.give_way(h, tick)?;
        Some(port)
    }

    /// Maps an insert result; on a lost race adopts the winner's flow.
    fn inserted(
        &mut self,
        r: Result<FlowHandle, InsertError>,
        data: &mut FlowData,
    ) -> Result<(), DropReason> {
        match r {
            Ok(h) => {
                self.counters.new_flows += 1;
                self.log_created(h);
                Ok(())
            }
            Err(InsertError::Exists(h)) => match self.flows.get(h) {
                Some(v) => {
                    *data = v.data;
                    Ok(())
                }
                None => Err(DropReason::FlowTableFull),
            },
            Err(e) => Err(insert_drop(e)),
        }
    }

    /// A connection-opening packet made a new flow: passive health counts a SYN sent (not
    /// for DSR, whose SYN-ACKs never come by: `dsr`).
    #[inline]
    fn watch_syn(&self, s: &Scheduled, proto: u8, new_flows_before: u64) {
        if s.opens
            && proto == PROTO_TCP
            && s.mode.encap().is_none()
            && self.counters.new_flows != new_flows_before
            && let Some(w) = &self.syn_watch
        {
            w.syn(s.backend_id);
        }
    }

    /// [`new_flow`](Self::new_flow) for a fast-path frame `v` whose flow key `key` just
    /// missed: the same decisions, flow, verdict and bytes, in one go.
    #[inline]
    pub(super) fn new_flow_v4(
        &mut self,
        frame: &mut [u8],
        v: &fast::V4,
        key: &V4Key,
        now: Instant,
    ) -> Verdict {
        let mut slot = None;
        let nv = match self.prepare_v4(v, key, now, &mut slot) {
            Ok(nv) => nv,
            Err(SYNPROXY) => return self.synproxy_miss(frame, now),
            Err(dsr::GENERAL) => return self.run_general(frame, now),
            Err(verdict) => match reject::pending_reason(verdict) {
                Some(reason) => return self.reject_in(frame, reason, now),
                None => return verdict,
            },
        };
        let out = match self.begin_v4(nv) {
            Begun::Pending(p) => self.finish_v4(nv, p),
            Begun::Done(out) => out,
        };
        self.complete_v4(frame, nv, out)
    }

    /// The first step of a new IPv4 flow: everything up to its insert (the checks and the
    /// scheduler, the next hop, the first SNAT port), as [`new_flow`](Self::new_flow) does
    /// it, written into `out`. `Err` is the frame's verdict. (Inlined into its two callers,
    /// and written in place: returned by value, the ~110-byte flow was copied out of the
    /// `Result`, and again into the batch's waiting ring.)
    #[inline(always)]
    pub(super) fn prepare_v4<'s>(
        &mut self,
        v: &fast::V4,
        key: &V4Key,
        now: Instant,
        out: &'s mut Option<NewV4>,
    ) -> Result<&'s mut NewV4, Verdict> {
        let v4 = |a: u32| IpAddr::V4(Ipv4Addr::from_bits(a));
        // The frontend by its packed word; a DSR service's packet goes to the general path
        // before anything is decided.
        let Some(svc) = self.snapshot.service_for_v4(v.dst(), v.protocol, v.dport()) else {
            return Err(self.unserved(v4(v.src()), v4(v.dst()), v.ttl));
        };
        if matches!(svc.mode, Mode::Dsr(_)) {
            return Err(dsr::GENERAL);
        }
        self.source_check_v4(v.src()).map_err(Verdict::Drop)?;
        // (Made once the frontend is known, in one place: made first, its addresses were
        // built apart and copied in piece by piece.)
        let tuple = FlowTuple {
            src: v4(v.src()),
            src_port: v.sport(),
            dst: v4(v.dst()),
            dst_port: v.dport(),
        };
        let s = self.schedule_in(svc, &tuple, (v.protocol, v.flags, v.ttl), true, now)?;
        let SocketAddr::V4(backend) = s.backend else {
            return Err(Verdict::Drop(DropReason::NoBackend));
        };
        // Network order from here on, as the flow's tuples and the frame hold addresses.
        let backend_ip = backend.ip().to_bits().to_be();
        let Some(slot) = self.next_hop_v4(backend_ip) else {
            return Err(Verdict::Slow);
        };
        let (port, macs) = (slot.nh.port, slot.macs);
        let tick = self.tick(now);
        let fullnat = s.mode == Mode::Fullnat;
        let snat = match (fullnat, self.config.snat_v4) {
            (false, _) => None,
            (true, Some(a)) => Some(a.to_bits().to_be()),
            (true, None) => return Err(Verdict::Drop(DropReason::NoSnatAddress)),
        };
        let backend = (backend_ip, backend.port().to_be());
        let client = (v.addrs as u32, v.ports as u16);
        let (reply, tries) = self.first_reply_v4(v.protocol, snat, backend, client);
        let nv = out.insert(NewV4 {
            flow: V4Flow {
                original: *key,
                reply,
                service_id: s.service_id,
                backend_id: s.backend_id,
                snapshot_gen: s.snapshot_gen,
                flags: if fullnat { FLAG_FULLNAT } else { 0 },
            },
            tcp_flags: TcpFlags(v.flags),
            protocol: v.protocol,
            snat,
            tries,
            backend,
            port,
            macs,
            opens: s.opens,
            tick,
        });
        Ok(nv)
    }

    /// A new flow's first reply tuple, backend -> the next SNAT port (fullnat: `snat`) or
    /// the client, and the SNAT ports left to try after it (addresses and ports in network
    /// byte order). (Before the flow is written, so that its reply key is stored once.)
    #[inline(always)]
    fn first_reply_v4(
        &mut self,
        protocol: Protocol,
        snat: Option<u32>,
        backend: (u32, u16),
        client: (u32, u16),
    ) -> (V4Key, usize) {
        let tries = SNAT_TRIES.min(self.snat.len());
        let (to, to_port, tries) = match snat {
            Some(a) => (a, self.snat.next_port().to_be(), tries.saturating_sub(1)),
            None => (client.0, client.1, tries),
        };
        let reply = self.flows.v4_key(
            protocol,
            nat::pack_addrs(backend.0, to),
            nat::pack_ports(backend.1, to_port),
        );
        (reply, tries)
    }

    /// Sets fullnat flow `nv`'s reply tuple to backend -> the next SNAT port.
    fn next_reply_v4(&mut self, nv: &mut NewV4) {
        nv.tries = nv.tries.saturating_sub(1);
        let port = self.snat.next_port();
        self.reply_v4(nv, port);
    }

    /// Sets `nv`'s reply tuple (fullnat) to backend -> SNAT address:`port` (host order).
    fn reply_v4(&mut self, nv: &mut NewV4, port: u16) {
        let to = nv.snat.unwrap_or_default();
        nv.flow.reply = self.flows.v4_key(
            nv.protocol,
            nat::pack_addrs(nv.backend.0, to),
            nat::pack_ports(nv.backend.1, port.to_be()),
        );
    }

    /// The second step: the insert's first half ([`FlowTable::insert_v4_begin`]).
    /// [`Begun::Done`] when it already decided (the flow existed, the table is full).
    ///
    /// [`FlowTable::insert_v4_begin`]: flowtable::FlowTable::insert_v4_begin
    #[inline(always)]
    pub(super) fn begin_v4(&mut self, nv: &NewV4) -> Begun {
        match self.flows.insert_v4_begin(&nv.flow, nv.tcp_flags, nv.tick) {
            Ok(p) => Begun::Pending(p),
            Err(e) => Begun::Done(self.begin_failed(nv, e)),
        }
    }

    /// [`begin_v4`](Self::begin_v4)'s insert made no flow (it existed: adopted; the table is
    /// full...): out of line, so that [`inserted_v4`](Self::inserted_v4) is inlined once,
    /// into the finish.
    #[cold]
    #[inline(never)]
    fn begin_failed(&mut self, nv: &NewV4, e: InsertError) -> Result<Out, DropReason> {
        self.inserted_v4(nv, Err(e), 0)
    }

    /// The third step: the insert's second half; when the reply tuple is taken, the next
    /// SNAT ports (fullnat, [`next_snat_ports`](Self::next_snat_ports)).
    #[inline(always)]
    pub(super) fn finish_v4(&mut self, nv: &mut NewV4, p: PendingV4) -> Result<Out, DropReason> {
        let csum = p.csum_delta();
        match self.flows.insert_v4_finish(p) {
            Err(InsertError::ReplyInUse(h)) if nv.snat.is_some() => self.next_snat_ports(nv, h),
            r => self.inserted_v4(nv, r, csum),
        }
    }

    /// A fullnat flow whose reply tuple was taken (by flow `h`): the next SNAT ports, each
    /// inserted in one go, as `new_flow` tries them, then the port of an embryonic flow that
    /// gives way.
    #[cold]
    #[inline(never)]
    fn next_snat_ports(&mut self, nv: &mut NewV4, h: FlowHandle) -> Result<Out, DropReason> {
        let mut r = Err(InsertError::ReplyInUse(h));
        let mut oldest = GiveWay::default();
        while let Err(InsertError::ReplyInUse(h)) = r {
            oldest.consider(
                &self.flows,
                h,
                nv.tick,
                u16::from_be((nv.flow.reply.ports() >> 16) as u16),
            );
            if nv.tries == 0 {
                if let Some(port) = self.give_way(&oldest, nv.tick) {
                    self.reply_v4(nv, port);
                    r = self.flows.insert_v4(&nv.flow, nv.tcp_flags, nv.tick);
                }
                break;
            }
            self.next_reply_v4(nv);
            r = self.flows.insert_v4(&nv.flow, nv.tcp_flags, nv.tick);
        }
        let (o, reply) = (&nv.flow.original, &nv.flow.reply);
        let to = (reply.addrs().rotate_left(32), reply.ports().rotate_left(16));
        let csum = flowtable::v4_csum_delta_be((o.addrs(), o.ports()), to);
        self.inserted_v4(nv, r, flowtable::v4_forward_delta(csum))
    }

    /// [`inserted`](Self::inserted) for a [`NewV4`]: the way out of the flow inserted
    /// (whose original direction's checksum delta, as its entry stores it, is `csum`), or
    /// adopted on a lost race.
    #[inline(always)]
    fn inserted_v4(
        &mut self,
        nv: &NewV4,
        r: Result<FlowHandle, InsertError>,
        csum: u32,
    ) -> Result<Out, DropReason> {
        match r {
            Ok(h) => {
                self.counters.new_flows += 1;
                self.log_created(h);
                // The reply tuple (backend -> snat) reversed.
                let reply = &nv.flow.reply;
                Ok(Out {
                    addrs: reply.addrs().rotate_left(32),
                    ports: reply.ports().rotate_left(16),
                    csum_delta: csum,
                    created: true,
                    backend: nv.flow.backend_id,
                })
            }
            Err(InsertError::Exists(h)) => self.adopted_v4(h, &nv.flow.original),
            Err(InsertError::ReplyInUse(_)) if nv.snat.is_some() => {
                Err(DropReason::SnatPortsExhausted)
            }
            Err(e) => Err(insert_drop(e)),
        }
    }

    /// The way out of another worker's flow `h` (the race's winner) for a frame of its
    /// original tuple `original`.
    #[cold]
    #[inline(never)]
    fn adopted_v4(&self, h: FlowHandle, original: &V4Key) -> Result<Out, DropReason> {
        let v = self.flows.get(h).ok_or(DropReason::FlowTableFull)?;
        let to = nat::after(&v.data, Direction::Original);
        match (to.src.ip(), to.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let addrs = v4_addrs_be(nat::pack_addrs(s.to_bits(), d.to_bits()));
                let ports = v4_ports_be(nat::pack_ports(to.src.port(), to.dst.port()));
                let from = (original.addrs(), original.ports());
                Ok(Out {
                    addrs,
                    ports,
                    csum_delta: flowtable::v4_forward_delta(flowtable::v4_csum_delta_be(
                        from,
                        (addrs, ports),
                    )),
                    created: false,
                    backend: v.data.backend_id,
                })
            }
            // An IPv4 tuple's flow is IPv4.
            _ => Err(DropReason::FlowTableFull),
        }
    }

    /// The last step: the frame's verdict, and its rewrite for the flow's way out.
    #[inline(always)]
    pub(super) fn complete_v4(
        &mut self,
        frame: &mut [u8],
        nv: &NewV4,
        out: Result<Out, DropReason>,
    ) -> Verdict {
        let out = match out {
            Ok(out) => out,
            Err(r) => return Verdict::Drop(r),
        };
        let (mut port, mut macs) = (nv.port, nv.macs);
        let dst = (out.addrs >> 32) as u32;
        if dst != nv.backend.0 {
            // Another worker's flow was adopted: its backend's next hop.
            let Some(slot) = self.next_hop_v4(dst) else {
                return Verdict::Slow;
            };
            (port, macs) = (slot.nh.port, slot.macs);
        }
        if out.created {
            self.traffic.connection(out.backend);
            if nv.opens
                && nv.protocol == Protocol::Tcp
                && let Some(w) = &self.syn_watch
            {
                w.syn(nv.flow.backend_id);
            }
        }
        frame[..12].copy_from_slice(&macs);
        nat::rewrite_v4_delta(
            frame,
            fast::L3,
            fast::L4,
            nat::l4_csum_at(fast::L4, nv.protocol as u8),
            out.addrs,
            out.ports,
            out.csum_delta,
        );
        self.traffic
            .packet(out.backend, false, usize::from(fast::ip_len(frame)));
        Verdict::Tx(port)
    }
}

/// A new IPv4 flow from its scheduling to its verdict: [`Pipeline::prepare_v4`],
/// [`Pipeline::begin_v4`], [`Pipeline::finish_v4`], [`Pipeline::complete_v4`].
#[derive(Debug)]
pub(super) struct NewV4 {
    /// The flow; its reply tuple is the one being (or last) tried.
    pub flow: V4Flow,
    tcp_flags: TcpFlags,
    protocol: Protocol,
    /// fullnat: the SNAT address (network byte order); nat: `None`.
    snat: Option<u32>,
    /// SNAT ports left to try.
    tries: usize,
    /// The backend's address and port, in network byte order.
    backend: (u32, u16),
    /// The backend's next hop: port, then destination and source MACs.
    port: u16,
    macs: [u8; 12],
    opens: bool,
    tick: Tick,
}

/// The way out of a new flow: source | destination << 32 and the ports likewise, in network
/// byte order; `created`
/// when this pipeline inserted it (rather than adopting another worker's).
#[derive(Clone, Copy, Debug)]
pub(super) struct Out {
    addrs: u64,
    ports: u32,
    /// What the frame's checksums change by when forwarded, from its tuple (the flow's
    /// original one) to `addrs`/`ports`: [`flowtable::v4_csum_delta_be`] with the TTL's
    /// decrement ([`flowtable::v4_forward_delta`]), as the flow table computed it at the
    /// insert.
    csum_delta: u32,
    created: bool,
    /// The flow's backend (another worker's, when adopted).
    backend: BackendId,
}

/// The flow a new flow's packet `p` (tuple `key`, scheduled as `s`) makes, before its
/// insert (its SNAT address is the client's until then).
#[inline]
fn flow_data(p: &Packet, key: &FlowKey, s: &Scheduled, proxy: Proxy) -> FlowData {
    let client = SocketAddr::new(p.src, p.sport);
    FlowData {
        proto: key.proto(),
        client,
        vip: SocketAddr::new(p.dst, p.dport),
        backend: s.backend,
        snat: client,
        service_id: s.service_id,
        backend_id: s.backend_id,
        snapshot_gen: s.snapshot_gen,
        flags: match (proxy, s.mode) {
            (Proxy::Proxied(_), _) => FLAG_SYNPROXY,
            (_, Mode::Dsr(encap)) => dsr::flags(encap),
            _ => 0,
        },
    }
}

/// The SYN proxy's part in a new flow.
#[derive(Clone, Copy, Debug)]
pub(super) enum Proxy {
    /// `schedule` may give the packet to the SYN proxy.
    May,
    /// The SYN proxy passed it on: the usual new flow.
    Never,
    /// The SYN proxy's SYN to the backend: the flow is marked, its sequence word this.
    Proxied(u64),
}

/// What [`Pipeline::begin_v4`] did.
pub(super) enum Begun {
    /// Half inserted: finish it with [`Pipeline::finish_v4`].
    Pending(PendingV4),
    /// Decided already.
    Done(Result<Out, DropReason>),
}

/// The oldest embryonic flow holding one of the SNAT ports a new flow tried: the one that
/// gives way if none was free. Only a flow idle for at least [`GIVE_WAY_IDLE`] ticks
/// qualifies: a handshake is not cut short by a SYN that arrived within the same 100 ms
/// (and flows of one burst do not evict each other).
#[derive(Default)]
struct GiveWay {
    /// Its handle and port, and how long it has been idle (ticks).
    flow: Option<(FlowHandle, u16)>,
    idle: u32,
}

impl GiveWay {
    /// Port `port` was taken by flow `h`: remember it if it is embryonic and idle longer
    /// than the oldest seen so far.
    #[inline]
    fn consider(&mut self, flows: &flowtable::FlowTable, h: FlowHandle, now: Tick, port: u16) {
        if let Some(idle) = flows.embryonic_idle(h, now)
            && idle >= GIVE_WAY_IDLE
            && (self.flow.is_none() || idle > self.idle)
        {
            self.flow = Some((h, port));
            self.idle = idle;
        }
    }
}

/// Flow-table ticks (100 ms) a half-open flow must have been idle to give way.
const GIVE_WAY_IDLE: u32 = 1;

/// The verdict of a new flow for `svc`, which has no usable backend: a reject, unless the
/// service drops (a traffic policy `Local` without local endpoints).
#[cold]
fn no_endpoints(svc: &ServiceEntry) -> Verdict {
    match svc.no_endpoints {
        NoEndpoints::Reject => reject::pending(RejectReason::NoEndpoints),
        NoEndpoints::Drop => Verdict::Drop(DropReason::NoBackend),
    }
}

/// The drop reason for an insert that made no flow (`Exists` aside).
fn insert_drop(e: InsertError) -> DropReason {
    match e {
        InsertError::Full | InsertError::IndexFull | InsertError::Exists(_) => {
            DropReason::FlowTableFull
        }
        InsertError::ReplyInUse(_) => DropReason::ReplyTupleInUse,
        InsertError::Invalid(_) => DropReason::NoBackend,
    }
}
