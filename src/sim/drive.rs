//! The pipeline behind `xvs sim`: each flow line becomes packets (see `frames`) through one
//! real [`Pipeline`] (worker 0 of 1), as `xvs pcap` replays frames, so that every rule the
//! pipeline has (hygiene, admission, the SYN proxy, rejects, Service CIDRs, affinity, the
//! schedulers over the flow table's connection counts) is the simulation's too.
//!
//! An `open` sends the connection's opening (TCP SYN, UDP datagram, SCTP INIT) and, when the
//! pipeline made a new flow of it, plays the rest of the handshake both ways (the backend's
//! SYN-ACK to what the pipeline sent it, the client's ACK; with the SYN proxy, the client's
//! ACK to its cookie first; SCTP: INIT-ACK, COOKIE-ECHO, COOKIE-ACK), so that the flow is
//! established and counted active as a real connection is. A `close` sends the client's
//! RST (SCTP: ABORT); a UDP flow, which no packet closes, is removed from the table.
//!
//! Next hops: the snapshot gets default routes (IPv4 and IPv6) through gateways of its own,
//! so every destination resolves. A family without a `[dataplane] snat_addresses` entry gets
//! a placeholder SNAT address ([`SNAT_PLACEHOLDER_V4`], [`SNAT_PLACEHOLDER_V6`]: reserved
//! ranges no client uses), so a `fullnat` simulation does not need one to schedule.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use config::{Config, Protocol};
use fastpath::pipeline::{Pipeline, PipelineConfig, Verdict};
use fastpath::settings::flow_table_config;
use fastpath::snapshot::{L2Table, Neighbour, Route, Snapshot};
use flowtable::{FlowKey, FlowTable};
use lb_algos::AffinityTable;
use vocab::{TcpFlags, sctp};

use super::frames::{self, Seg, Sent};

/// Affinity entries the simulation can hold.
const AFFINITY_CAPACITY: usize = 1 << 16;
/// Room after each frame (for the SYN proxy's SYN, a reject's ICMP error).
const ROOM: usize = 1536;
/// The simulated routes' gateways (never on a wire).
const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 254);
const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0xfe);
/// The SNAT address of a family the config has none of (240/4, reserved).
pub const SNAT_PLACEHOLDER_V4: Ipv4Addr = Ipv4Addr::new(240, 0, 0, 1);
/// The same for IPv6 (the discard prefix, 100::/64).
pub const SNAT_PLACEHOLDER_V6: Ipv6Addr = Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 1);
/// A simulated client's and backend's initial sequence numbers.
const CLIENT_ISN: u32 = 0x1000_0000;
const BACKEND_ISN: u32 = 0x7000_0000;

/// `l2` with the simulation's default routes and their gateways.
pub fn with_default_routes(mut l2: L2Table) -> L2Table {
    for (prefix, gw) in [
        ("0.0.0.0/0", IpAddr::V4(GATEWAY_V4)),
        ("::/0", IpAddr::V6(GATEWAY_V6)),
    ] {
        l2.routes.push(Route {
            prefix: prefix.parse().expect("a CIDR"),
            port: 0,
            gateway: Some(gw),
        });
        l2.neighbours.push(Neighbour {
            ip: gw,
            mac: [0x02, 0, 0, 0, 0x9a, 0x01],
            port: None,
        });
    }
    l2
}

/// What the pipeline did with one flow line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// Forwarded to this backend, or the verdict of the line's first packet (a reject, a
    /// drop, a pass) or of the client's answer to the SYN proxy.
    pub result: Result<SocketAddr, Verdict>,
    /// The pipeline made a new flow for it (a new connection, not a packet of an open one).
    pub new_flow: bool,
}

impl Step {
    fn forward(backend: SocketAddr, new_flow: bool) -> Step {
        Step {
            result: Ok(backend),
            new_flow,
        }
    }

    fn other(v: Verdict) -> Step {
        Step {
            result: Err(v),
            new_flow: false,
        }
    }
}

/// The pipeline and its tables.
pub struct Driver {
    pipeline: Pipeline,
    buf: Vec<u8>,
    /// `[dataplane] gue_port`: DSR frames to it carry the client's packet.
    gue_port: u16,
}

impl Driver {
    /// A pipeline over `snapshot` (built with [`with_default_routes`]) and fresh tables
    /// sized by `cfg`, its clock starting at `epoch`.
    pub fn new(cfg: &Config, snapshot: Snapshot, epoch: Instant) -> Result<Driver, String> {
        let flows = FlowTable::new(flow_table_config(cfg), epoch)
            .map_err(|e| format!("the flow table: {e}"))?;
        let mut pc = PipelineConfig::from_config(cfg, 0, 1);
        pc.snat_v4.get_or_insert(SNAT_PLACEHOLDER_V4);
        pc.snat_v6.get_or_insert(SNAT_PLACEHOLDER_V6);
        // DSR's outer source, where the config gives none, as the SNAT address.
        pc.dsr.source_v4.get_or_insert(SNAT_PLACEHOLDER_V4);
        pc.dsr.source_v6.get_or_insert(SNAT_PLACEHOLDER_V6);
        let gue_port = pc.dsr.gue_port;
        let pipeline = Pipeline::new(
            pc,
            Arc::new(flows),
            Arc::new(AffinityTable::new(AFFINITY_CAPACITY, epoch)),
            Arc::new(snapshot),
        );
        Ok(Driver {
            pipeline,
            buf: Vec::with_capacity(4096),
            gue_port,
        })
    }

    /// The snapshot the pipeline runs.
    pub fn snapshot(&self) -> &Arc<Snapshot> {
        self.pipeline.snapshot()
    }

    /// `s` through the pipeline at `now`: the verdict and, when transmitted, what it sent.
    fn send(&mut self, s: &Seg, now: Instant) -> (Verdict, Option<Sent>) {
        frames::build(&mut self.buf, s);
        let mut len = self.buf.len();
        self.buf.resize(len + ROOM, 0);
        let v = self.pipeline.process_frame(&mut self.buf, &mut len, now);
        let mut sent = v
            .tx_port()
            .and_then(|_| frames::read(&self.buf[..len], self.gue_port));
        // A DSR packet goes to its backend unchanged: the backend is the flow's (its port
        // the configured one, which the backend's decapsulation serves).
        let flows = self.pipeline.flows();
        let key = FlowKey::new(s.proto, s.src, s.dst);
        let flow = key
            .and_then(|k| flows.lookup(&k))
            .and_then(|(h, _)| flows.get(h));
        if let (Some(out), Some(f)) = (&mut sent, flow)
            && f.data.flags & fastpath::pipeline::FLAG_DSR != 0
        {
            out.dst = f.data.backend;
        }
        (v, sent)
    }

    /// Opens the connection `src` → `dst` at `now` (see the module doc).
    pub fn open(
        &mut self,
        proto: Protocol,
        src: SocketAddr,
        dst: SocketAddr,
        now: Instant,
    ) -> Step {
        let c = self.pipeline.counters();
        let (flows, cookies) = (c.new_flows, c.synproxy_syns);
        let first = Seg {
            flags: TcpFlags::SYN.bits(),
            seq: CLIENT_ISN,
            chunk: sctp::INIT,
            ..Seg::new(proto, src, dst)
        };
        let (v, sent) = self.send(&first, now);
        let Verdict::Tx(_) = v else {
            return Step::other(v);
        };
        let Some(mut out) = sent else {
            return Step::other(v);
        };
        let c = self.pipeline.counters();
        let proxied = c.synproxy_syns != cookies;
        if proto == Protocol::Tcp && proxied {
            // The SYN proxy answered: the client's ACK to its cookie opens the backend's side.
            let ack = Seg {
                flags: TcpFlags::ACK.bits(),
                seq: CLIENT_ISN.wrapping_add(1),
                ack: out.seq.wrapping_add(1),
                ..Seg::new(proto, src, dst)
            };
            match self.send(&ack, now) {
                (Verdict::Tx(_), Some(s)) => out = s,
                (v, _) => return Step::other(v),
            }
        } else if self.pipeline.counters().new_flows == flows {
            // A flow that was open already: the packet followed it.
            return Step::forward(out.dst, false);
        }
        let backend = out.dst;
        match proto {
            Protocol::Tcp => self.tcp_handshake(src, dst, out, proxied, now),
            Protocol::Sctp => self.sctp_handshake(src, dst, out, now),
            _ => {}
        }
        Step::forward(backend, true)
    }

    /// The rest of a TCP handshake whose SYN reached the backend as `syn`.
    fn tcp_handshake(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        syn: Sent,
        proxied: bool,
        now: Instant,
    ) {
        let synack = Seg {
            flags: (TcpFlags::SYN | TcpFlags::ACK).bits(),
            seq: BACKEND_ISN,
            ack: syn.seq.wrapping_add(1),
            ..Seg::new(Protocol::Tcp, syn.dst, syn.src)
        };
        let (_, to_client) = self.send(&synack, now);
        if proxied {
            // The proxy acknowledged the backend itself.
            return;
        }
        if let Some(to_client) = to_client {
            let ack = Seg {
                flags: TcpFlags::ACK.bits(),
                seq: CLIENT_ISN.wrapping_add(1),
                ack: to_client.seq.wrapping_add(1),
                ..Seg::new(Protocol::Tcp, src, dst)
            };
            self.send(&ack, now);
        }
    }

    /// The rest of an SCTP handshake whose INIT reached the backend as `init`.
    fn sctp_handshake(&mut self, src: SocketAddr, dst: SocketAddr, init: Sent, now: Instant) {
        let chunk = |c: u8, from: SocketAddr, to: SocketAddr| Seg {
            chunk: c,
            ..Seg::new(Protocol::Sctp, from, to)
        };
        self.send(&chunk(sctp::INIT_ACK, init.dst, init.src), now);
        self.send(&chunk(sctp::COOKIE_ECHO, src, dst), now);
        self.send(&chunk(sctp::COOKIE_ACK, init.dst, init.src), now);
    }

    /// Closes the connection `src` → `dst` at `now` (see the module doc): its verdict.
    pub fn close(
        &mut self,
        proto: Protocol,
        src: SocketAddr,
        dst: SocketAddr,
        now: Instant,
    ) -> Step {
        let seg = match proto {
            Protocol::Udp => return self.forget_udp(src, dst),
            Protocol::Tcp => Seg {
                flags: TcpFlags::RST.bits(),
                seq: CLIENT_ISN.wrapping_add(1),
                ..Seg::new(proto, src, dst)
            },
            _ => Seg {
                chunk: sctp::ABORT,
                ..Seg::new(proto, src, dst)
            },
        };
        match self.send(&seg, now) {
            (Verdict::Tx(_), Some(out)) => Step::forward(out.dst, false),
            (v, _) => Step::other(v),
        }
    }

    /// A UDP flow removed from the table (no packet closes one).
    fn forget_udp(&mut self, src: SocketAddr, dst: SocketAddr) -> Step {
        let none = Step::other(Verdict::Drop(fastpath::pipeline::DropReason::NoFlow));
        let Some(key) = FlowKey::new(Protocol::Udp, src, dst) else {
            return none;
        };
        let flows = self.pipeline.flows();
        let Some((h, _)) = flows.lookup(&key) else {
            return none;
        };
        match flows.remove(h) {
            Some(gone) => Step::forward(gone.data.backend, false),
            None => none,
        }
    }
}
