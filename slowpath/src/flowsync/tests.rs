//! Two nodes' sync services wired back to back (datagrams carried by the test, no socket):
//! installs with the receiver's ids, updates in place, ends, dumps, refreshes, and the
//! datagrams that must be refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use fastpath::flowlog::{EndedFlow, FlowEvent, FlowLog};
use fastpath::pipeline::FLAG_PEER;
use fastpath::settings::flow_table_config;
use fastpath::snapshot::{Snapshot, SnapshotBuilder};
use flowtable::{
    BackendId, FlowData, FlowHandle, FlowState, FlowTable, Protocol, TcpFlags, TcpState,
};

use super::wire::{Key, Kind};
use super::*;

const A: &str = "198.18.2.11:7946";
const B: &str = "198.18.2.12:7946";

fn toml(backends: &str) -> String {
    format!(
        "[dataplane]\nsnat_addresses = [\"198.18.3.1\"]\n[flowtable]\ncapacity = 4096\n[[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{backends}]\n[[services]]\nname = \"other\"\nvip = \"198.18.100.2\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{{ addr = \"198.18.1.9:80\" }}]\n"
    )
}

struct Node {
    svc: Service,
    log: Arc<FlowLog>,
    flows: Arc<FlowTable>,
    snap: Arc<Snapshot>,
}

fn node(me: &str, peer: &str, text: &str, epoch: Instant) -> Node {
    let cfg = config::parse(text, "t.toml").unwrap();
    let snap = Arc::new(
        SnapshotBuilder::from_config(&cfg)
            .build_config(&cfg)
            .unwrap(),
    );
    let flows = Arc::new(FlowTable::new(flow_table_config(&cfg), epoch).unwrap());
    let log = Arc::new(FlowLog::new(1024));
    let svc = Service::new(
        FlowSyncConfig {
            listen: me.parse().unwrap(),
            peers: vec![peer.parse().unwrap()],
            key: Key::new(&[7; 32]).unwrap(),
            interval: Duration::from_millis(10),
            refresh: Duration::from_secs(60),
            max_messages_per_second: 20_000,
        },
        Arc::clone(&flows),
        Arc::new(ArcSwap::new(Arc::clone(&snap))),
        vec![Arc::clone(&log)],
        Arc::new(SyncStats::default()),
        Arc::new(AtomicBool::new(false)),
    );
    Node {
        svc,
        log,
        flows,
        snap,
    }
}

/// A (with backends .1, .2) and B (the same backends learnt the other way round, so its
/// ids differ).
fn pair(epoch: Instant) -> (Node, Node) {
    let a = node(
        A,
        B,
        &toml("{ addr = \"198.18.1.1:8080\" }, { addr = \"198.18.1.2:8080\" }"),
        epoch,
    );
    let b = node(
        B,
        A,
        &toml("{ addr = \"198.18.1.2:8080\" }, { addr = \"198.18.1.1:8080\" }"),
        epoch,
    );
    (a, b)
}

/// Every datagram `from` queued for `to`, handed to `to` as if from `from_addr`; returns
/// them.
fn deliver(from: &mut Node, to: &mut Node, from_addr: &str, now: Instant) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some((_, d)) = from.svc.queue.pop_front() {
        to.svc.receive(&d, from_addr.parse().unwrap(), now);
        out.push(d);
    }
    out
}

/// A flow of `n`'s own, as its worker would insert it (its ids for `backend`).
fn own_flow(n: &Node, port: u16, backend: &str, now: Instant) -> (FlowData, FlowHandle) {
    let svc = n.snap.services.iter().find(|s| s.name == "web").unwrap();
    let b = svc
        .backends
        .iter()
        .find(|b| b.addr.to_string() == backend)
        .unwrap();
    let d = FlowData {
        proto: Protocol::Tcp,
        client: format!("198.18.0.2:{port}").parse().unwrap(),
        vip: "198.18.100.1:80".parse().unwrap(),
        backend: b.addr,
        snat: format!("198.18.3.1:{}", 40000 + port).parse().unwrap(),
        service_id: svc.id,
        backend_id: b.id,
        snapshot_gen: 1,
        flags: 1,
    };
    let h = n
        .flows
        .insert(&d, TcpFlags::SYN, n.flows.tick(now))
        .unwrap();
    n.log.record(FlowEvent::Created(h));
    (d, h)
}

fn stat(n: &Node, f: impl Fn(&SyncStats) -> &std::sync::atomic::AtomicU64) -> u64 {
    f(&n.svc.stats).load(Ordering::Relaxed)
}

#[test]
fn a_peer_installs_flows_with_its_own_ids_and_updates_them_in_place() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    let (d, h) = own_flow(&a, 1000, "198.18.1.1:8080", now);
    a.svc.tick(now);
    let sent = deliver(&mut a, &mut b, A, now);
    assert!(sent.len() >= 2, "a flow datagram and a hello");
    assert_eq!(stat(&b, |s| &s.flows_installed), 1);
    let (hb, _) = b.flows.lookup(&d.original_key()).expect("installed");
    let copy = b.flows.get(hb).unwrap();
    assert_eq!((copy.data.backend, copy.data.snat), (d.backend, d.snat));
    assert_ne!(copy.data.flags & FLAG_PEER, 0, "marked as a peer's copy");
    // B's id for 198.18.1.1:8080, not A's.
    let b_id = b
        .snap
        .services
        .iter()
        .find(|s| s.name == "web")
        .unwrap()
        .backends[1]
        .id;
    assert_eq!(copy.data.backend_id, b_id);
    assert_ne!(
        b_id, d.backend_id,
        "the two nodes' ids differ (the test means it)"
    );
    // The reply tuple (backend -> A's SNAT address) finds it too: B can serve replies.
    assert!(b.flows.lookup(&d.reply_key()).is_some());

    // Established on A: B's copy follows, in place (same handle).
    let est = FlowState::Tcp(TcpState::Established);
    a.flows.update(h, est, a.flows.tick(now));
    a.log.record(FlowEvent::Changed(h));
    let later = now + Duration::from_secs(2);
    a.svc.tick(later);
    deliver(&mut a, &mut b, A, later);
    assert_eq!(stat(&b, |s| &s.flows_updated), 1);
    let copy = b.flows.get(hb).expect("the same entry, not reinserted");
    assert_eq!(copy.state, est);
    assert!(stat(&b, |s| &s.lag_us) < 60_000_000);
}

#[test]
fn flows_nobody_here_knows_and_own_flows_are_not_overwritten() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    // B has its own flow for the tuple A will send, to another backend.
    let (d, _) = own_flow(&b, 1000, "198.18.1.2:8080", now);
    while b.log.pop().is_some() {}
    own_flow(&a, 1000, "198.18.1.1:8080", now);
    // A flow to a backend B does not have.
    let mut stray = d;
    stray.client = "198.18.0.2:1001".parse().unwrap();
    stray.backend = "198.18.1.77:8080".parse().unwrap();
    stray.snat = "198.18.3.1:41001".parse().unwrap();
    let h = a
        .flows
        .insert(&stray, TcpFlags::SYN, a.flows.tick(now))
        .unwrap();
    a.log.record(FlowEvent::Created(h));
    a.svc.tick(now);
    deliver(&mut a, &mut b, A, now);
    assert_eq!(stat(&b, |s| &s.refused_conflict), 1);
    assert_eq!(stat(&b, |s| &s.refused_unknown), 1);
    assert_eq!(stat(&b, |s| &s.flows_installed), 0);
    let (hb, _) = b.flows.lookup(&d.original_key()).unwrap();
    assert_eq!(
        b.flows.get(hb).unwrap().data.backend,
        d.backend,
        "B's own flow kept"
    );
    assert_eq!(b.flows.len(), 1);
}

#[test]
fn forged_replayed_and_strangers_datagrams_are_refused_and_counted() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    own_flow(&a, 1000, "198.18.1.1:8080", now);
    a.svc.tick(now);
    let sent = deliver(&mut a, &mut b, A, now);
    let flows_dgram = sent
        .iter()
        .find(|d| d[5] == Kind::Flows as u8)
        .unwrap()
        .clone();
    let accepted = stat(&b, |s| &s.messages_received);
    // Replayed as is.
    b.svc.receive(&flows_dgram, A.parse().unwrap(), now);
    assert_eq!(stat(&b, |s| &s.rejected_replay), 1);
    // Forged: a changed record (another backend), the tag left as it was.
    let mut forged = flows_dgram.clone();
    forged[24 + 40] ^= 1;
    b.svc.receive(&forged, A.parse().unwrap(), now);
    assert_eq!(stat(&b, |s| &s.rejected_auth), 1);
    // Signed with another key.
    let mut w = Writer::new(Kind::Flows);
    let r = FlowRecord::decode(
        flows_dgram[24..24 + flowtable::RECORD_BYTES]
            .try_into()
            .unwrap(),
    )
    .unwrap();
    w.flow(&r);
    let other = w.seal(&Key::new(&[8; 32]).unwrap(), unix_us(), 0);
    b.svc.receive(&other, A.parse().unwrap(), now);
    assert_eq!(stat(&b, |s| &s.rejected_auth), 2);
    // From an address that is no peer.
    b.svc
        .receive(&flows_dgram, "198.18.2.99:7946".parse().unwrap(), now);
    assert_eq!(stat(&b, |s| &s.rejected_unknown_peer), 1);
    // Garbage.
    b.svc.receive(b"XVSY", A.parse().unwrap(), now);
    assert_eq!(stat(&b, |s| &s.rejected_malformed), 1);
    assert_eq!(
        stat(&b, |s| &s.messages_received),
        accepted,
        "none accepted"
    );
    assert_eq!(b.flows.len(), 1);
}

#[test]
fn a_starting_node_gets_a_full_dump_and_is_ready_after_it() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    for port in 0..40 {
        own_flow(&a, 2000 + port, "198.18.1.2:8080", now);
    }
    while a.log.pop().is_some() {}
    // B starts: asks A.
    b.svc.control(Some(0), Kind::DumpRequest, 0);
    deliver(&mut b, &mut a, B, now);
    assert!(!b.svc.ready.load(Ordering::Relaxed));
    a.svc.tick(now);
    deliver(&mut a, &mut b, A, now);
    assert_eq!(stat(&b, |s| &s.flows_installed), 40);
    assert_eq!(stat(&a, |s| &s.dumps_sent), 1);
    assert_eq!(stat(&b, |s| &s.dumps_received), 1);
    b.svc.tick(now);
    assert!(
        b.svc.ready.load(Ordering::Relaxed),
        "ready once the dump is in"
    );
    assert_eq!(b.flows.len(), 40);
}

#[test]
fn a_node_whose_peer_stays_silent_is_ready_after_the_wait() {
    let epoch = Instant::now();
    let (_, mut b) = pair(epoch);
    b.svc.started = epoch;
    b.svc.tick(epoch + Duration::from_secs(1));
    assert!(!b.svc.ready.load(Ordering::Relaxed));
    b.svc.tick(epoch + DUMP_WAIT + Duration::from_millis(1));
    assert!(b.svc.ready.load(Ordering::Relaxed));
}

#[test]
fn ends_remove_idle_copies_only_and_refreshes_send_own_active_flows_only() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    let (d1, _) = own_flow(&a, 3001, "198.18.1.1:8080", now);
    let (d2, _) = own_flow(&a, 3002, "198.18.1.1:8080", now);
    a.svc.tick(now);
    deliver(&mut a, &mut b, A, now);
    assert_eq!(b.flows.len(), 2);
    // B serves d2 (ECMP moved it): a packet through B touches it.
    let later = now + Duration::from_secs(5);
    let (h2, _) = b.flows.lookup(&d2.original_key()).unwrap();
    b.flows.update(
        h2,
        FlowState::Tcp(TcpState::Established),
        b.flows.tick(later),
    );
    // A's sweep ends both.
    for d in [&d1, &d2] {
        a.log.record(FlowEvent::Ended(EndedFlow::of(d)));
    }
    a.svc.tick(later);
    deliver(&mut a, &mut b, A, later);
    assert_eq!(stat(&b, |s| &s.flows_removed), 1);
    assert!(
        b.flows.lookup(&d1.original_key()).is_none(),
        "idle copy removed"
    );
    assert!(
        b.flows.lookup(&d2.original_key()).is_some(),
        "served copy kept"
    );

    // Refresh: A's own flow active in the period goes out again; B (only a copy) sends none.
    let (d3, _) = own_flow(&a, 3003, "198.18.1.2:8080", later);
    while a.log.pop().is_some() {}
    let sent_before = stat(&b, |s| &s.flows_sent);
    let t = later + Duration::from_secs(61);
    for n in [&mut a, &mut b] {
        n.svc.last_refresh = later - Duration::from_millis(1);
        n.svc.tick(t);
    }
    assert!(
        b.svc.queue.iter().all(|(_, d)| d[5] != Kind::Flows as u8),
        "a copy is not refreshed by the node that holds it"
    );
    assert_eq!(stat(&b, |s| &s.flows_sent), sent_before);
    deliver(&mut a, &mut b, A, t);
    let (h3, _) = b.flows.lookup(&d3.original_key()).expect("refreshed to B");
    assert!(b.flows.get(h3).is_some());
    let _ = BackendId(0);
    let _: SocketAddr = A.parse().unwrap();
}

#[test]
fn a_peer_that_starts_after_the_request_is_asked_again() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    b.svc.started = epoch;
    // B asked A before A listened: the request was lost.
    b.svc.ask(0, epoch);
    b.svc.queue.clear();
    // A comes up and says hello: B asks again at once.
    a.svc.tick(epoch + Duration::from_millis(500));
    deliver(&mut a, &mut b, A, epoch + Duration::from_millis(500));
    assert!(
        b.svc
            .queue
            .iter()
            .any(|(_, d)| d[5] == Kind::DumpRequest as u8),
        "asked again"
    );
    deliver(&mut b, &mut a, B, epoch + Duration::from_millis(500));
    let t = epoch + Duration::from_millis(510);
    a.svc.tick(t);
    deliver(&mut a, &mut b, A, t);
    b.svc.tick(t);
    assert!(b.svc.ready.load(Ordering::Relaxed), "ready after A's dump");
    // A peer that is up but never answers does not hold a node back for ever.
    let (mut c, mut d) = pair(epoch);
    d.svc.started = epoch;
    d.svc.ask(0, epoch);
    d.svc.queue.clear();
    for s in 1..=30u64 {
        let t = epoch + Duration::from_secs(s);
        c.svc.tick(t);
        while let Some((_, dg)) = c.svc.queue.pop_front() {
            if dg[5] == Kind::Hello as u8 {
                d.svc.receive(&dg, A.parse().unwrap(), t);
            }
        }
        d.svc.tick(t);
        d.svc.queue.clear();
    }
    assert!(
        d.svc.ready.load(Ordering::Relaxed),
        "gave up after DUMP_GIVE_UP"
    );
}
