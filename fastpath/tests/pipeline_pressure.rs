//! A SYN flood through `Pipeline::process` on the lab's configuration (fullnat, 65,536 flows,
//! 20,000 SNAT ports, three backends), on a simulated clock: 200,000 spoofed SYNs from
//! 198.18.0.0/16 at 140 kpps (the flood that blocked every new connection for a minute), with
//! a legitimate client opening a connection every few milliseconds during the flood and after
//! it, and connections established before it sending data throughout. The table is swept as a
//! worker sweeps it. Without pressure handling the legitimate SYNs fail with
//! `snat_ports_exhausted` once the ports are held by half-open flows.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use fastpath::pipeline::{DropReason, Pipeline, Verdict};
use fastpath::testing::*;
use fastpath::worker::{SWEEP_BUDGET, SWEEP_ROUND};

const LAB_CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// `(src, dst)` socket addresses of a TCP frame.
fn tuple(f: &[u8]) -> (SocketAddr, SocketAddr) {
    let p = SlicedPacket::from_ethernet(f).unwrap();
    let (s, d): (IpAddr, IpAddr) = match p.net.unwrap() {
        NetSlice::Ipv4(v4) => (
            v4.header().source_addr().into(),
            v4.header().destination_addr().into(),
        ),
        NetSlice::Ipv6(v6) => (
            v6.header().source_addr().into(),
            v6.header().destination_addr().into(),
        ),
        _ => unreachable!(),
    };
    let Some(TransportSlice::Tcp(t)) = p.transport else {
        panic!("not TCP")
    };
    (
        SocketAddr::new(s, t.source_port()),
        SocketAddr::new(d, t.destination_port()),
    )
}

/// A simulated worker: the pipeline, the clock, and the sweep the worker runs between polls.
struct Sim {
    p: Pipeline,
    now: Instant,
    last_sweep: Instant,
}

impl Sim {
    fn new() -> Self {
        let epoch = Instant::now();
        Sim {
            // The SYN proxy off: this is the defence without it.
            p: pipeline_from(
                &format!("{}\n[synproxy]\nmode = \"off\"\n", config::LAB_TOML),
                epoch,
            ),
            now: epoch,
            last_sweep: epoch,
        }
    }

    /// Advance the clock, sweeping as `Worker::sweep` does.
    fn advance(&mut self, d: Duration) {
        self.now += d;
        let since = self.now - self.last_sweep;
        self.last_sweep = self.now;
        let flows = self.p.flows();
        let due = flows.capacity() as u128 * since.as_nanos() / SWEEP_ROUND.as_nanos();
        flows.sweep(
            flows.tick(self.now),
            (due as usize).clamp(1, SWEEP_BUDGET),
            |_| (),
        );
    }

    fn send(&mut self, mut f: Vec<u8>) -> (Verdict, Vec<u8>) {
        let v = self.p.process(&mut f, self.now);
        (v, f)
    }

    /// A legitimate handshake from `client`: SYN, the backend's SYN-ACK, the client's ACK.
    /// `Ok(backend side tuple)` or the verdict that failed.
    fn connect(&mut self, client: SocketAddr) -> Result<(SocketAddr, SocketAddr), Verdict> {
        let vip = sa("198.18.100.1:80");
        let (v, out) = self.send(frame(LAB_CLIENT_MAC, XVS_MAC, client, vip, 64, SYN));
        let Verdict::Tx(_) = v else { return Err(v) };
        let (snat, backend) = tuple(&out);
        let (v, _) = self.send(frame(B1_MAC, XVS_MAC, backend, snat, 64, SYNACK));
        let Verdict::Tx(_) = v else { return Err(v) };
        let (v, _) = self.send(frame(LAB_CLIENT_MAC, XVS_MAC, client, vip, 64, ACK));
        let Verdict::Tx(_) = v else { return Err(v) };
        Ok((snat, backend))
    }
}

/// Spoofed source `i` of the flood: 198.18.0.0/16, varying port.
fn spoofed(i: u32) -> SocketAddr {
    let h = i.wrapping_mul(0x9e37_79b9);
    let ip = Ipv4Addr::new(198, 18, (h >> 24) as u8, (h >> 16) as u8);
    SocketAddr::new(ip.into(), 1024 + (h as u16 % 60000))
}

#[test]
fn legitimate_clients_connect_during_and_after_a_syn_flood() {
    const FLOOD: u32 = 200_000;
    const RATE_PPS: u64 = 140_000;
    const LEGIT_EVERY: u32 = 500;
    let mut s = Sim::new();
    let vip = sa("198.18.100.1:80");

    // Connections established before the flood.
    let mut established = Vec::new();
    for port in 2000..2100u16 {
        let client = SocketAddr::new(Ipv4Addr::new(198, 18, 0, 2).into(), port);
        let backend_side = s.connect(client).expect("before the flood");
        established.push((client, backend_side));
        s.advance(Duration::from_micros(100));
    }

    let gap = Duration::from_nanos(1_000_000_000 / RATE_PPS);
    let (mut tried, mut failed) = (0u32, Vec::new());
    let mut legit_port = 10_000u16;
    for i in 0..FLOOD {
        let (v, _) = s.send(frame(LAB_CLIENT_MAC, XVS_MAC, spoofed(i), vip, 64, SYN));
        assert!(
            matches!(v, Verdict::Tx(_) | Verdict::Drop(_)),
            "flood SYN {i}: {v:?}"
        );
        s.advance(gap);
        if i % LEGIT_EVERY == 0 {
            let client = SocketAddr::new(Ipv4Addr::new(198, 18, 0, 2).into(), legit_port);
            legit_port += 1;
            tried += 1;
            if let Err(v) = s.connect(client) {
                failed.push((i, v));
            }
        }
        if i % 20_000 == 0 {
            // The established connections keep sending.
            for (client, _) in &established {
                let (v, _) = s.send(frame(LAB_CLIENT_MAC, XVS_MAC, *client, vip, 64, ACK));
                assert!(matches!(v, Verdict::Tx(_)), "established {client}: {v:?}");
            }
        }
    }
    // After the flood: a connection every 5 ms for 2 s.
    for _ in 0..400 {
        s.advance(Duration::from_millis(5));
        let client = SocketAddr::new(Ipv4Addr::new(198, 18, 0, 2).into(), legit_port);
        legit_port += 1;
        tried += 1;
        if let Err(v) = s.connect(client) {
            failed.push((FLOOD, v));
        }
    }
    let c = s.p.counters();
    eprintln!(
        "legit: {tried} tried, {} failed (first: {:?}); snat_ports_exhausted {}, flow_table_full {}, \
         table {:?}",
        failed.len(),
        failed.first(),
        c.dropped(DropReason::SnatPortsExhausted),
        c.dropped(DropReason::FlowTableFull),
        s.p.flows().stats(),
    );
    // The defences that acted: half-open flows gave way for SNAT ports, and the table is
    // under pressure (embryonic timeouts shortened).
    assert!(s.p.flows().stats().gave_way > 0);
    assert!(s.p.flows().under_pressure(s.p.flows().tick(s.now)));
    assert!(
        failed.len() * 100 <= tried as usize,
        "{} of {tried} legitimate connections failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(10)]
    );
    // Every connection established before the flood survived, on its backend.
    for (client, (snat, backend)) in &established {
        let (v, out) = s.send(frame(LAB_CLIENT_MAC, XVS_MAC, *client, vip, 64, ACK));
        assert!(matches!(v, Verdict::Tx(_)), "established {client}: {v:?}");
        assert_eq!(tuple(&out), (*snat, *backend), "{client} kept its backend");
    }
}
