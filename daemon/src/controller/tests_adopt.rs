//! An adopted table whose flows hold ids the first snapshot has nothing for (a Kubernetes
//! start, where the state check cannot know the services; or a damaged table): the builder
//! and the removal pass handle them like flows of removed backends, and nothing panics.

use std::net::SocketAddr;
use std::sync::Arc;

use fastpath::passive::SynWatch;
use fastpath::snapshot::{AdoptedIds, SERVICE_IDS_MAX};
use flowtable::{BackendId, FlowData, FlowState, Protocol, TcpState};

use super::testlab::{CFG, frame, ip};
use super::tests::{Harness, TICK, lab_l2, steps};
use super::*;

const WEB: [u8; 4] = [198, 18, 100, 80];
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// A flow no service of `CFG` has: service `sid`, backend id `bid`.
fn stray(udp: bool, sid: u32, bid: u32, port: u16) -> FlowData {
    let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
    FlowData {
        proto: if udp { Protocol::Udp } else { Protocol::Tcp },
        client: SocketAddr::new([198, 18, 0, 2].into(), port),
        vip: sa("198.18.100.99:443"),
        backend: SocketAddr::new([198, 18, 1, 7].into(), 400 + port),
        snat: SocketAddr::new([198, 18, 0, 2].into(), port),
        service_id: sid,
        backend_id: BackendId(bid),
        snapshot_gen: 1,
        flags: 0,
    }
}

#[test]
fn adopted_ids_no_service_has_end_through_the_removal_pass() {
    let mut first = Harness::new(CFG);
    first.step(TICK);
    first.send(&frame(false, 2000, WEB, 80, SYN));
    let now = first.flows.tick(first.now);
    let est = FlowState::Tcp(TcpState::Established);
    for (d, state) in [
        (stray(false, 300, 20, 3000), est),
        (stray(true, 301, 21, 3001), FlowState::Udp),
        (stray(false, SERVICE_IDS_MAX + 9, 22, 3002), est),
        (stray(false, SERVICE_IDS_MAX, 23, 3003), est),
    ] {
        first.flows.restore(&d, state, now, 0).unwrap();
    }
    assert_eq!(first.flows.len(), 5);
    let adopted = AdoptedIds::from_flows(&first.flows);
    let cfg = config::parse(CFG, "t.toml").unwrap();
    let syn = Arc::new(SynWatch::new(cfg.flowtable.backends_max as usize));
    let ctl = Controller::adopting(
        cfg,
        Arc::clone(&first.flows),
        Arc::clone(&syn),
        lab_l2(),
        first.now,
        Some(&adopted),
    );
    let mut h = Harness {
        ctl,
        pipeline: None,
        syn,
        flows: Arc::clone(&first.flows),
        now: first.now,
        tx: 0,
        log: Vec::new(),
        status: Status::default(),
        stopped: None,
        workers_running: true,
        triggers: Vec::new(),
        steering: None,
    };
    h.step(TICK);
    // The services of the config took none of the stray ids.
    let snap = h.ctl.snapshot().unwrap();
    for s in &snap.services {
        assert!(s.id < 300, "{}: {}", s.name, s.id);
        assert!(s.backends.iter().all(|b| b.id.0 < 20), "{}", s.name);
    }
    // After the grace: the stray TCP flows ended, the UDP one re-steered; the real flow
    // goes on.
    steps(&mut h, 31);
    assert_eq!((h.status.flows_resteered, h.status.flows_ended), (1, 3));
    assert_eq!(h.flows.len(), 1);
    assert_eq!(
        h.send(&frame(false, 2000, WEB, 80, ACK)),
        Some(ip("198.18.1.1"))
    );
}
