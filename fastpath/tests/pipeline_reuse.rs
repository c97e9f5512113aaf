//! Port reuse (IPVS `conn_reuse_mode = 1`) through `Pipeline::process`: a client's SYN on a
//! flow in TIME_WAIT or CLOSE (an INIT on a closing SCTP association) ends that flow and is
//! scheduled afresh, so a backend drained to weight 0 meanwhile gets no new connection; every
//! other SYN on a flow follows it. Services with `rr` over two backends, built through
//! `config::parse` → `SnapshotBuilder` (the drain too); a client connects, closes, the
//! backend it got is drained, and the same client port connects again. Forwarded frames are
//! compared byte for byte and their checksums recomputed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use fastpath::pipeline::{DropReason, Pipeline, Verdict};
use fastpath::snapshot::{ServiceSpec, SnapshotBuilder};
use fastpath::testing::*;
use flowtable::{ConnCounts, FlowKey, FlowState, Protocol, SctpState, TcpState};

/// Two-backend services beside the fixture's "two" (fullnat, IPv4): nat, ClientIP affinity,
/// IPv6 (the general path) and SCTP.
const EXTRA: &str = r#"
[[services]]
name = "twonat"
vip = "198.18.100.21"
port = 80
protocol = "tcp"
scheduler = "rr"
mode = "nat"
backends = [{ addr = "198.18.1.1:81" }, { addr = "198.18.1.2:81" }]

[[services]]
name = "sticky"
vip = "198.18.100.22"
port = 80
protocol = "tcp"
scheduler = "rr"
session_affinity_timeout = "3h"
backends = [{ addr = "198.18.1.1:82" }, { addr = "198.18.1.2:82" }]

[[services]]
name = "two6"
vip = "2001:2:0:100::20"
port = 80
protocol = "tcp"
scheduler = "rr"
backends = [{ addr = "[2001:2:0:1::1]:80" }, { addr = "[2001:2:0:1::2]:80" }]

[[services]]
name = "sctp2"
vip = "198.18.100.23"
port = 3868
protocol = "sctp"
scheduler = "rr"
backends = [{ addr = "198.18.1.1:3870" }, { addr = "198.18.1.2:3870" }]

[[neighbours]]
ip = "2001:2:0:1::2"
mac = "02:00:00:00:06:02"
"#;

const B62_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x06, 0x02];

fn toml() -> String {
    CONFIG.to_string() + EXTRA
}

/// A service of the test config and a client of it.
#[derive(Clone, Copy)]
struct Case {
    service: &'static str,
    vip: &'static str,
    client: &'static str,
    /// The SNAT address (fullnat), or `None` (nat: the client's address stays).
    snat: Option<&'static str>,
    proto: Protocol,
}

const FULLNAT: Case = Case {
    service: "two",
    vip: "198.18.100.20:80",
    client: "198.18.0.1:1000",
    snat: Some("198.18.1.254"),
    proto: Protocol::Tcp,
};
const NAT: Case = Case {
    service: "twonat",
    vip: "198.18.100.21:80",
    client: "198.18.0.1:1000",
    snat: None,
    proto: Protocol::Tcp,
};
const FULLNAT6: Case = Case {
    service: "two6",
    vip: "[2001:2:0:100::20]:80",
    client: "[2001:2::1]:1000",
    snat: Some("2001:2:0:1::fe"),
    proto: Protocol::Tcp,
};
const STICKY: Case = Case {
    service: "sticky",
    vip: "198.18.100.22:80",
    client: "198.18.0.1:1000",
    snat: Some("198.18.1.254"),
    proto: Protocol::Tcp,
};
const SCTP: Case = Case {
    service: "sctp2",
    vip: "198.18.100.23:3868",
    client: "198.18.0.1:5000",
    snat: Some("198.18.1.254"),
    proto: Protocol::Sctp,
};

fn mac_of(backend: SocketAddr) -> [u8; 6] {
    match backend.ip().to_string().as_str() {
        "198.18.1.1" => B1_MAC,
        "198.18.1.2" => B2_MAC,
        "2001:2:0:1::1" => B61_MAC,
        "2001:2:0:1::2" => B62_MAC,
        other => panic!("no MAC for {other}"),
    }
}

/// Source and destination of an Ethernet frame (IPv4 or IPv6, ports of TCP/UDP/SCTP alike).
fn endpoints(f: &[u8]) -> (SocketAddr, SocketAddr) {
    let ip = &f[14..];
    let (src, dst, l4): (std::net::IpAddr, std::net::IpAddr, usize) = if ip[0] >> 4 == 4 {
        let a: [u8; 4] = ip[12..16].try_into().unwrap();
        let b: [u8; 4] = ip[16..20].try_into().unwrap();
        (a.into(), b.into(), usize::from(ip[0] & 15) * 4)
    } else {
        let a: [u8; 16] = ip[8..24].try_into().unwrap();
        let b: [u8; 16] = ip[24..40].try_into().unwrap();
        (a.into(), b.into(), 40)
    };
    let port = |at: usize| u16::from_be_bytes([ip[l4 + at], ip[l4 + at + 1]]);
    (SocketAddr::new(src, port(0)), SocketAddr::new(dst, port(2)))
}

/// One pipeline over the test config, with the fake clock's origin.
struct Lab {
    p: Pipeline,
    epoch: Instant,
    ms: u64,
}

impl Lab {
    fn new() -> Lab {
        let epoch = Instant::now();
        Lab {
            p: pipeline_from(&toml(), epoch),
            epoch,
            ms: 0,
        }
    }

    /// `frame` through `process` 10 ms after the previous one: its verdict and the frame.
    fn send(&mut self, frame: Vec<u8>) -> (Verdict, Vec<u8>) {
        self.ms += 10;
        let mut f = frame;
        let v = self.p.process(&mut f, at(self.epoch, self.ms));
        if let Verdict::Tx(_) = v {
            verify_checksums(&f, "forwarded frame");
        }
        (v, f)
    }

    /// A client → VIP frame of `c` with `l4`, forwarded: where it went (the flow's backend and
    /// the source it left with, SNAT address or client).
    fn client(&mut self, c: Case, l4: L4) -> (SocketAddr, SocketAddr) {
        let (v, f) = self.send(frame(CLIENT_MAC, XVS_MAC, sa(c.client), sa(c.vip), 64, l4));
        assert_eq!(v, Verdict::Tx(0), "{}: client {l4:?}", c.service);
        let (src, dst) = endpoints(&f);
        (dst, src)
    }

    /// A backend → (SNAT or client) frame of the flow `(backend, src)` with `l4`, which must
    /// reach the client from the VIP.
    fn backend(&mut self, c: Case, (backend, src): (SocketAddr, SocketAddr), l4: L4) {
        let input = frame(mac_of(backend), XVS_MAC, backend, src, 64, l4);
        let (v, f) = self.send(input);
        assert_eq!(v, Verdict::Tx(0), "{}: backend {l4:?}", c.service);
        let want = frame(XVS_MAC, CLIENT_MAC, sa(c.vip), sa(c.client), 63, l4);
        assert_eq!(f, want, "{}: backend {l4:?} to the client", c.service);
    }

    /// The flow of `c`'s client tuple: its backend and state.
    fn flow(&self, c: Case) -> Option<(SocketAddr, FlowState)> {
        let key = FlowKey::new(c.proto, sa(c.client), sa(c.vip)).unwrap();
        let flows = self.p.flows();
        let (h, _) = flows.lookup(&key)?;
        flows.get(h).map(|v| (v.data.backend, v.state))
    }

    /// The handshake (TCP: SYN, SYN-ACK, ACK; SCTP: INIT, INIT ACK, DATA): the flow's
    /// `(backend, source)`.
    fn connect(&mut self, c: Case) -> (SocketAddr, SocketAddr) {
        let (open, answer, next) = match c.proto {
            Protocol::Sctp => (L4::Sctp(1), L4::Sctp(2), L4::Sctp(0)),
            _ => (SYN, SYNACK, ACK),
        };
        let flow = self.client(c, open);
        self.backend(c, flow, answer);
        assert_eq!(self.client(c, next), flow, "{}: same flow", c.service);
        flow
    }

    /// The TCP close that leaves the flow in TIME_WAIT: the client's FIN, the backend's ACK
    /// and FIN, the client's last ACK.
    fn close(&mut self, c: Case, flow: (SocketAddr, SocketAddr)) {
        assert_eq!(self.client(c, FIN), flow);
        self.backend(c, flow, ACK);
        self.backend(c, flow, FIN);
        assert_eq!(self.client(c, ACK), flow);
        assert_eq!(
            self.flow(c),
            Some((flow.0, FlowState::Tcp(TcpState::TimeWait))),
            "{}: closed",
            c.service
        );
    }

    /// Sets `backend`'s weight in `service` to 0 (a new snapshot from the config).
    fn drain(&mut self, service: &str, backend: SocketAddr) {
        let text = toml();
        let mut cfg = config::parse(&text, "fixture.toml").unwrap();
        let svc = cfg.services.iter_mut().find(|s| s.name == service).unwrap();
        svc.backends
            .iter_mut()
            .find(|b| b.addr == backend)
            .unwrap()
            .weight = 0;
        let snap = SnapshotBuilder::from_config(&cfg)
            .build_config(&cfg)
            .unwrap();
        self.p.set_snapshot(Arc::new(snap));
    }

    /// The other backend of `service`.
    fn other(&self, service: &str, backend: SocketAddr) -> SocketAddr {
        let snap = self.p.snapshot();
        let svc = snap.services.iter().find(|s| s.name == service).unwrap();
        let others: Vec<_> = svc.backends.iter().filter(|b| b.addr != backend).collect();
        assert_eq!(others.len(), 1);
        others[0].addr
    }

    /// `(active, inactive)` flows of `backend` in `service`, as the flow table counts them.
    fn counts(&self, service: &str, backend: SocketAddr) -> (u32, u32) {
        let snap = self.p.snapshot();
        let svc = snap.services.iter().find(|s| s.name == service).unwrap();
        let id = svc.backends.iter().find(|b| b.addr == backend).unwrap().id;
        (self.p.flows().active(id), self.p.flows().inactive(id))
    }

    /// The same client port opens again (SYN, or INIT): it must leave, as a new flow, for
    /// `backend` from `src` (the next SNAT port, or the client), byte for byte.
    fn reopen(&mut self, c: Case, backend: SocketAddr, src: SocketAddr) {
        let open = if c.proto == Protocol::Sctp {
            L4::Sctp(1)
        } else {
            SYN
        };
        let (v, f) = self.send(frame(
            CLIENT_MAC,
            XVS_MAC,
            sa(c.client),
            sa(c.vip),
            64,
            open,
        ));
        assert_eq!(v, Verdict::Tx(0), "{}: reopened", c.service);
        let want = frame(XVS_MAC, mac_of(backend), src, backend, 63, open);
        assert_eq!(f, want, "{}: the new flow's frame", c.service);
    }
}

/// The source a new flow's frame leaves with: the SNAT address with port `port`, or the
/// client.
fn source(c: Case, port: u16) -> SocketAddr {
    match c.snat {
        Some(a) => SocketAddr::new(a.parse().unwrap(), port),
        None => sa(c.client),
    }
}

/// Connect, close to TIME_WAIT, drain the backend, connect again from the same port.
fn time_wait_reuse_goes_to_the_other_backend(c: Case) {
    let mut lab = Lab::new();
    let (old, src) = lab.connect(c);
    lab.close(c, (old, src));
    assert_eq!(lab.counts(c.service, old), (0, 1), "a TIME_WAIT flow");
    lab.drain(c.service, old);
    let new = lab.other(c.service, old);
    // fullnat: the next SNAT port of the worker's cursor (the old one is free again, but the
    // cursor has moved on).
    let fresh = source(c, src.port().wrapping_add(1));
    lab.reopen(c, new, fresh);
    // The old flow is gone, with its counts; its reply tuple no longer leads anywhere.
    assert_eq!(
        lab.flow(c),
        Some((new, FlowState::Tcp(TcpState::SynRecv))),
        "{}",
        c.service
    );
    assert_eq!(lab.p.flows().len(), 1, "{}: one flow left", c.service);
    assert_eq!(lab.counts(c.service, old), (0, 0), "{}", c.service);
    assert_eq!(lab.counts(c.service, new), (0, 1), "{}", c.service);
    let stale = frame(mac_of(old), XVS_MAC, old, src, 64, ACK);
    let (v, _) = lab.send(stale);
    assert!(
        !matches!(v, Verdict::Tx(_)),
        "{}: the old backend's packets are not forwarded: {v:?}",
        c.service
    );
    // The new flow works both ways.
    lab.backend(c, (new, fresh), SYNACK);
    assert_eq!(lab.client(c, ACK), (new, fresh));
    assert_eq!(lab.counts(c.service, new), (1, 0), "{}", c.service);
    let counters = lab.p.counters();
    assert_eq!(counters.reused, 1, "{}", c.service);
    assert_eq!(counters.new_flows, 2, "{}", c.service);
}

#[test]
fn time_wait_reuse_with_the_old_backend_at_weight_0_goes_to_another_backend() {
    // IPv4 through the fast path, in both modes; IPv6 through the general path.
    time_wait_reuse_goes_to_the_other_backend(FULLNAT);
    time_wait_reuse_goes_to_the_other_backend(NAT);
    time_wait_reuse_goes_to_the_other_backend(FULLNAT6);
}

#[test]
fn a_syn_after_a_reset_reuses_the_closed_flow() {
    for c in [FULLNAT, NAT, FULLNAT6] {
        let mut lab = Lab::new();
        let (old, src) = lab.connect(c);
        assert_eq!(lab.client(c, L4::Tcp(0x04)), (old, src), "RST");
        assert_eq!(
            lab.flow(c),
            Some((old, FlowState::Tcp(TcpState::Close))),
            "{}",
            c.service
        );
        lab.drain(c.service, old);
        let new = lab.other(c.service, old);
        lab.reopen(c, new, source(c, src.port().wrapping_add(1)));
        assert_eq!(lab.p.flows().len(), 1, "{}", c.service);
        assert_eq!(lab.p.counters().reused, 1, "{}", c.service);
    }
}

#[test]
fn other_syns_on_a_flow_keep_its_backend() {
    for c in [FULLNAT, NAT, FULLNAT6] {
        // A retransmitted SYN (SYN_RECV) and a SYN on an ESTABLISHED flow: same backend, same
        // source, though the backend is drained.
        let mut lab = Lab::new();
        let flow = lab.client(c, SYN);
        lab.drain(c.service, flow.0);
        assert_eq!(lab.client(c, SYN), flow, "{}: retransmitted SYN", c.service);
        lab.backend(c, flow, SYNACK);
        assert_eq!(lab.client(c, ACK), flow);
        assert_eq!(
            lab.client(c, SYN),
            flow,
            "{}: SYN when established",
            c.service
        );
        assert_eq!(
            lab.flow(c),
            Some((flow.0, FlowState::Tcp(TcpState::Established)))
        );

        // On a TIME_WAIT flow: a client SYN-ACK, SYN|FIN, and a backend's SYN (the reply
        // direction) are no new connection: forwarded on the old flow.
        for (from_client, l4) in [(true, SYNACK), (true, L4::Tcp(0x03)), (false, SYN)] {
            let mut lab = Lab::new();
            let flow = lab.connect(c);
            lab.close(c, flow);
            lab.drain(c.service, flow.0);
            if from_client {
                assert_eq!(lab.client(c, l4), flow, "{}: client {l4:?}", c.service);
            } else {
                lab.backend(c, flow, l4);
            }
            assert_eq!(lab.flow(c).map(|f| f.0), Some(flow.0), "{}", c.service);
            assert_eq!(lab.p.counters().reused, 0, "{}: {l4:?}", c.service);
            assert_eq!(lab.p.counters().new_flows, 1, "{}: {l4:?}", c.service);
        }
    }
}

#[test]
fn reuse_keeps_client_ip_affinity_while_its_backend_is_usable() {
    let c = STICKY;
    let mut lab = Lab::new();
    let (first, src) = lab.connect(c);
    lab.close(c, (first, src));
    // Still usable: the new flow goes back to it (rr alone would pick the other), on a new
    // SNAT port: a new flow.
    let again = source(c, src.port() + 1);
    lab.reopen(c, first, again);
    assert_eq!(lab.p.counters().reused, 1);
    lab.backend(c, (first, again), SYNACK);
    assert_eq!(lab.client(c, ACK), (first, again));
    lab.close(c, (first, again));
    // Drained: the affinity entry no longer holds.
    lab.drain(c.service, first);
    let other = lab.other(c.service, first);
    lab.reopen(c, other, source(c, src.port() + 2));
    assert_eq!(lab.p.counters().reused, 2);
    assert_eq!(lab.p.flows().len(), 1);
}

#[test]
fn a_refused_reuse_is_dropped_as_a_new_flow_and_the_ended_flow_is_gone() {
    let c = FULLNAT;
    let mut lab = Lab::new();
    let flow = lab.connect(c);
    lab.close(c, flow);
    // Freeze the service: new flows are refused, the reusing SYN too.
    let text = toml();
    let cfg = config::parse(&text, "fixture.toml").unwrap();
    let mut specs = ServiceSpec::from_config(&cfg);
    specs
        .iter_mut()
        .filter(|s| s.name == c.service)
        .for_each(|s| s.frozen = true);
    let snap = SnapshotBuilder::from_config(&cfg)
        .build(&specs, &fastpath::snapshot::L2Table::from_config(&cfg))
        .unwrap();
    lab.p.set_snapshot(Arc::new(snap));
    let syn = frame(CLIENT_MAC, XVS_MAC, sa(c.client), sa(c.vip), 64, SYN);
    let (v, f) = lab.send(syn.clone());
    assert_eq!(v, Verdict::Drop(DropReason::Frozen));
    assert_eq!(f, syn, "a dropped frame is left as it came");
    assert_eq!(lab.flow(c), None);
    assert_eq!(lab.p.counters().reused, 1);
}

#[test]
fn an_init_on_a_closing_sctp_association_is_scheduled_afresh() {
    let c = SCTP;
    let mut lab = Lab::new();
    let (old, src) = lab.connect(c);
    lab.drain(c.service, old);
    // An INIT on the live association follows it.
    assert_eq!(
        lab.client(c, L4::Sctp(1)),
        (old, src),
        "INIT when established"
    );
    assert_eq!(lab.p.counters().reused, 0);
    // ABORT: closing; then an INIT is a new association.
    assert_eq!(lab.client(c, L4::Sctp(6)), (old, src), "ABORT");
    assert_eq!(
        lab.flow(c),
        Some((old, FlowState::Sctp(SctpState::Closing)))
    );
    let new = lab.other(c.service, old);
    lab.reopen(c, new, source(c, src.port() + 1));
    assert_eq!(
        lab.flow(c),
        Some((new, FlowState::Sctp(SctpState::Established)))
    );
    assert_eq!(lab.p.counters().reused, 1);
    assert_eq!(lab.p.flows().len(), 1);
}
