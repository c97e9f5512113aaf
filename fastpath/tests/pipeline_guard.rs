//! The state guard (`fastpath/src/pipeline/guard.rs`): a SYN, FIN or RST of a known flow moves
//! its state only when its TCP checksum verifies and, for an RST, its sequence number lies in
//! the window of its direction's last sample; otherwise it is forwarded unchanged in meaning
//! (the receiver drops it) and counted as held. Every case runs through the IPv4 shortcut
//! (`process`), the batch pipeline (`process_batch`), the general path alone
//! (`process_general`) and IPv6 (the general path), on a full-NAT service built from the
//! fixture config.

use std::net::SocketAddr;
use std::time::Instant;

use etherparse::{PacketBuilder, TcpHeader};
use fastpath::pipeline::{HoldReason, Pipeline, Verdict};
use fastpath::testing::*;
use flowtable::{FlowKey, FlowState, Protocol, RST_AHEAD_BYTES, TcpState};

const FIN_: u8 = 0x01;
const SYN_: u8 = 0x02;
const RST_: u8 = 0x04;
const PSH_: u8 = 0x08;
const ACK_: u8 = 0x10;

/// Client and backend initial sequence numbers.
const C0: u32 = 0x7000_0000;
const B0: u32 = 0x1234_5678;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// `process`: the IPv4 shortcut for IPv4 frames.
    Frame,
    /// `process_batch`, one frame a batch.
    Batch,
    /// `process_general`: the general path only.
    General,
}

const PATHS: [Path; 3] = [Path::Frame, Path::Batch, Path::General];

/// One client of the fixture's full-NAT services, v4 ("two", two backends) or v6 ("web6").
#[derive(Clone, Copy, Debug)]
struct Case {
    client: &'static str,
    vip: &'static str,
}

const V4: Case = Case {
    client: "198.18.0.1:1000",
    vip: "198.18.100.20:80",
};
const V6: Case = Case {
    client: "[2001:2::1]:1000",
    vip: "[2001:2:0:100::1]:80",
};

/// A TCP segment src → dst with these flags, sequence and acknowledgment numbers and
/// payload; `corrupt`: its TCP checksum is off by one bit.
fn segment(
    src: SocketAddr,
    dst: SocketAddr,
    flags: u8,
    seq: u32,
    ack: u32,
    payload: &[u8],
    corrupt: bool,
) -> Vec<u8> {
    let mut h = TcpHeader::new(src.port(), dst.port(), seq, 64240);
    h.fin = flags & FIN_ != 0;
    h.syn = flags & SYN_ != 0;
    h.rst = flags & RST_ != 0;
    h.psh = flags & PSH_ != 0;
    h.ack = flags & ACK_ != 0;
    h.acknowledgment_number = ack;
    let eth = PacketBuilder::ethernet2(CLIENT_MAC, XVS_MAC);
    let mut out = Vec::new();
    let l4 = match (src.ip(), dst.ip()) {
        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => {
            eth.ipv4(s.octets(), d.octets(), 64)
                .tcp_header(h)
                .write(&mut out, payload)
                .unwrap();
            34
        }
        (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => {
            eth.ipv6(s.octets(), d.octets(), 64)
                .tcp_header(h)
                .write(&mut out, payload)
                .unwrap();
            54
        }
        _ => panic!("mixed families"),
    };
    if corrupt {
        out[l4 + 17] ^= 1;
    }
    out
}

/// Source and destination of a forwarded frame.
fn endpoints(f: &[u8]) -> (SocketAddr, SocketAddr) {
    let ip = &f[14..];
    let (src, dst, l4): (std::net::IpAddr, std::net::IpAddr, usize) = if ip[0] >> 4 == 4 {
        let a: [u8; 4] = ip[12..16].try_into().unwrap();
        let b: [u8; 4] = ip[16..20].try_into().unwrap();
        (a.into(), b.into(), 20)
    } else {
        let a: [u8; 16] = ip[8..24].try_into().unwrap();
        let b: [u8; 16] = ip[24..40].try_into().unwrap();
        (a.into(), b.into(), 40)
    };
    let port = |at: usize| u16::from_be_bytes([ip[l4 + at], ip[l4 + at + 1]]);
    (SocketAddr::new(src, port(0)), SocketAddr::new(dst, port(2)))
}

struct Lab {
    p: Pipeline,
    path: Path,
    case: Case,
    epoch: Instant,
    ms: u64,
    /// The flow's backend and the source it sees (SNAT address:port), once connected.
    flow: Option<(SocketAddr, SocketAddr)>,
}

impl Lab {
    fn new(path: Path, case: Case) -> Lab {
        let epoch = Instant::now();
        Lab {
            p: pipeline(epoch),
            path,
            case,
            epoch,
            ms: 0,
            flow: None,
        }
    }

    /// `f` through the lab's path `ms` after the previous frame: verdict and frame.
    fn send_after(&mut self, ms: u64, mut f: Vec<u8>) -> (Verdict, Vec<u8>) {
        self.ms += ms;
        let now = at(self.epoch, self.ms);
        let v = match self.path {
            Path::Frame => self.p.process(&mut f, now),
            Path::General => self.p.process_general(&mut f, now),
            Path::Batch => {
                let mut verdicts = [Verdict::Pass];
                self.p.process_batch(&mut [&mut f[..]], now, &mut verdicts);
                verdicts[0]
            }
        };
        (v, f)
    }

    /// A client segment, 10 ms after the previous frame; it must be forwarded: where to.
    fn client(&mut self, flags: u8, seq: u32, ack: u32, corrupt: bool) -> (SocketAddr, SocketAddr) {
        self.client_after(10, flags, seq, ack, corrupt)
    }

    fn client_after(
        &mut self,
        ms: u64,
        flags: u8,
        seq: u32,
        ack: u32,
        corrupt: bool,
    ) -> (SocketAddr, SocketAddr) {
        let c = self.case;
        let f = segment(sa(c.client), sa(c.vip), flags, seq, ack, PAYLOAD, corrupt);
        let (v, out) = self.send_after(ms, f);
        assert_eq!(
            v,
            Verdict::Tx(0),
            "{:?} {:?}: client flags {flags:#x}",
            self.path,
            c
        );
        let (src, dst) = endpoints(&out);
        (dst, src)
    }

    /// A backend segment of the flow, 10 ms after the previous frame; forwarded.
    fn backend(&mut self, flags: u8, seq: u32, ack: u32, corrupt: bool) {
        self.backend_after(10, flags, seq, ack, corrupt)
    }

    fn backend_after(&mut self, ms: u64, flags: u8, seq: u32, ack: u32, corrupt: bool) {
        let (backend, src) = self.flow.expect("connected");
        let f = segment(backend, src, flags, seq, ack, b"", corrupt);
        let (v, out) = self.send_after(ms, f);
        assert_eq!(
            v,
            Verdict::Tx(0),
            "{:?} {:?}: backend flags {flags:#x}",
            self.path,
            self.case
        );
        assert_eq!(
            endpoints(&out),
            (sa(self.case.vip), sa(self.case.client)),
            "to the client"
        );
    }

    /// SYN, SYN-ACK, ACK: established.
    fn connect(&mut self) {
        let flow = self.client(SYN_, C0, 0, false);
        self.flow = Some(flow);
        self.backend(SYN_ | ACK_, B0, C0 + 1, false);
        assert_eq!(self.client(ACK_, C0 + 1, B0 + 1, false), flow);
        self.is(TcpState::Established);
    }

    fn state(&self) -> Option<(Path, bool, FlowState)> {
        let key = FlowKey::new(Protocol::Tcp, sa(self.case.client), sa(self.case.vip)).unwrap();
        let (h, _) = self.p.flows().lookup(&key)?;
        let v6 = self.case.client.starts_with('[');
        self.p.flows().get(h).map(|v| (self.path, v6, v.state))
    }

    /// `state()` must be `s`.
    fn is(&self, s: TcpState) {
        let v6 = self.case.client.starts_with('[');
        assert_eq!(self.state(), Some((self.path, v6, FlowState::Tcp(s))));
    }

    fn held(&self, r: HoldReason) -> u64 {
        self.p.counters().held[r as usize]
    }

    fn held_total(&self) -> u64 {
        self.p.counters().held.iter().sum()
    }
}

/// Every path and family, with a label.
fn labs() -> Vec<Lab> {
    let mut v: Vec<Lab> = PATHS.iter().map(|&p| Lab::new(p, V4)).collect();
    v.push(Lab::new(Path::Frame, V6));
    v.push(Lab::new(Path::Batch, V6));
    v
}

#[test]
fn a_client_rst_with_a_bad_checksum_moves_nothing_and_the_next_syn_follows_the_flow() {
    for mut lab in labs() {
        lab.connect();
        let flow = lab.flow.unwrap();
        // In the window, but its checksum is wrong: the backend would drop it.
        assert_eq!(lab.client(RST_ | ACK_, C0 + 1, B0 + 1, true), flow);
        lab.is(TcpState::Established);
        assert_eq!(lab.held(HoldReason::BadChecksum), 1);
        // The next SYN of the tuple is no new connection: it follows the flow.
        assert_eq!(lab.client(SYN_, C0 + 5000, 0, false), flow);
        assert_eq!(lab.p.counters().reused, 0);
        assert_eq!(lab.p.counters().new_flows, 1);
    }
}

#[test]
fn a_client_rst_outside_the_window_moves_nothing_and_one_inside_closes() {
    for mut lab in labs() {
        lab.connect();
        let flow = lab.flow.unwrap();
        for far in [RST_AHEAD_BYTES + 4096, 1 << 31, (2u32 << 20).wrapping_neg()] {
            assert_eq!(lab.client(RST_, (C0 + 1).wrapping_add(far), 0, false), flow);
            lab.is(TcpState::Established);
        }
        assert_eq!(lab.held(HoldReason::RstOutsideWindow), 3, "{:?}", lab.path);
        // Where the client is: taken.
        assert_eq!(lab.client(RST_, C0 + 1 + 700, 0, false), flow);
        lab.is(TcpState::Close);
        assert_eq!(lab.held_total(), 3);
    }
}

#[test]
fn a_fin_with_a_bad_checksum_moves_nothing_and_a_good_one_does() {
    for mut lab in labs() {
        lab.connect();
        lab.client(FIN_ | ACK_, C0 + 1, B0 + 1, true);
        lab.is(TcpState::Established);
        assert_eq!(lab.held(HoldReason::BadChecksum), 1);
        lab.client(FIN_ | ACK_, C0 + 1, B0 + 1, false);
        assert_ne!(
            lab.state().map(|s| s.2),
            Some(FlowState::Tcp(TcpState::Established))
        );
        assert_eq!(lab.held_total(), 1);
    }
}

#[test]
fn a_syn_with_a_bad_checksum_does_not_reopen_an_ended_flow() {
    for mut lab in labs() {
        lab.connect();
        let flow = lab.flow.unwrap();
        lab.client(FIN_ | ACK_, C0 + 1, B0 + 1, false);
        lab.backend(ACK_, B0 + 1, C0 + 2, false);
        lab.backend(FIN_ | ACK_, B0 + 1, C0 + 2, false);
        lab.client(ACK_, C0 + 2, B0 + 2, false);
        lab.is(TcpState::TimeWait);
        // A forged SYN: the flow stays, the SYN goes where the flow goes.
        assert_eq!(lab.client(SYN_, C0 + 9_000_000, 0, true), flow);
        lab.is(TcpState::TimeWait);
        assert_eq!(
            (lab.p.counters().reused, lab.held(HoldReason::BadChecksum)),
            (0, 1)
        );
        // A real one reopens the tuple as a new flow.
        lab.client(SYN_, C0 + 9_000_000, 0, false);
        assert_eq!(lab.p.counters().reused, 1, "{:?} {:?}", lab.path, lab.case);
        lab.is(TcpState::SynRecv);
    }
}

#[test]
fn the_window_follows_the_client_sample_by_sample() {
    for mut lab in labs() {
        lab.connect();
        let flow = lab.flow.unwrap();
        // An upload of 40 MiB in 4 MiB steps, one step per 100 ms tick: each tick's first
        // packet is sampled.
        let mut seq = C0 + 1;
        for _ in 0..10 {
            seq = seq.wrapping_add(4 << 20);
            assert_eq!(lab.client_after(150, PSH_ | ACK_, seq, B0 + 1, false), flow);
        }
        // Where the upload started is 40 MiB behind now: refused.
        lab.client(RST_, C0 + 1, 0, false);
        lab.is(TcpState::Established);
        assert_eq!(lab.held(HoldReason::RstOutsideWindow), 1, "{:?}", lab.path);
        // Where it is now: taken.
        lab.client(RST_, seq.wrapping_add(1 << 20), 0, false);
        lab.is(TcpState::Close);
    }
}

#[test]
fn a_backend_refusing_the_connection_must_acknowledge_the_client() {
    for mut lab in labs() {
        let flow = lab.client(SYN_, C0, 0, false);
        lab.flow = Some(flow);
        // The client's SYN again, a tick later: its sequence number is sampled.
        assert_eq!(lab.client_after(150, SYN_, C0, 0, false), flow);
        // A reset acknowledging something else is no answer to that SYN, nor is one
        // acknowledging nothing.
        lab.backend(RST_ | ACK_, 0, C0.wrapping_add(64 << 20), false);
        lab.backend(RST_, 0, 0, false);
        lab.is(TcpState::SynRecv);
        assert_eq!(lab.held(HoldReason::RstOutsideWindow), 2, "{:?}", lab.path);
        // The backend's real refusal: RST|ACK acknowledging the SYN.
        lab.backend(RST_ | ACK_, 0, C0 + 1, false);
        lab.is(TcpState::Close);
    }
}

#[test]
fn a_backend_rst_is_judged_by_the_backends_sample_once_there_is_one() {
    for mut lab in labs() {
        // No reply sample yet (the SYN-ACK came in the SYN's tick and changed nothing): a
        // backend's RST must acknowledge where the client is.
        lab.connect();
        lab.backend(RST_ | ACK_, B0 + 1, C0.wrapping_add(1 << 30), false);
        lab.is(TcpState::Established);
        // A backend packet a tick later is sampled: now the RST's own sequence number counts.
        lab.backend_after(150, ACK_, B0 + 1, C0 + 1, false);
        lab.backend(RST_ | ACK_, B0.wrapping_add(1 << 30), C0 + 1, false);
        lab.is(TcpState::Established);
        assert_eq!(lab.held(HoldReason::RstOutsideWindow), 2, "{:?}", lab.path);
        lab.backend(RST_ | ACK_, B0 + 1, C0 + 1, false);
        lab.is(TcpState::Close);
        assert_eq!(lab.held_total(), 2);
    }
}

#[test]
fn established_data_with_a_bad_checksum_is_forwarded_untouched_by_the_guard() {
    // Data and pure ACKs are not guarded: their checksums are updated incrementally, so a
    // corrupt one stays corrupt, and the receiver drops it.
    for mut lab in labs() {
        lab.connect();
        lab.client(PSH_ | ACK_, C0 + 1, B0 + 1, true);
        lab.client(ACK_, C0 + 1, B0 + 1, true);
        assert_eq!(lab.held_total(), 0);
        lab.is(TcpState::Established);
    }
}
