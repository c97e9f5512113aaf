//! Two (or three) nodes' sync services wired back to back (datagrams carried by the test, no
//! socket): the hello that teaches tickets, installs with the receiver's ids, updates in
//! place, ends, dumps, refreshes, and the datagrams that must be refused: forged, reflected,
//! meant for another node, replayed after either side restarted, of another version.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use fastpath::flowlog::{EndedFlow, FlowEvent, FlowLog};
use fastpath::pipeline::FLAG_PEER;
use fastpath::settings::flow_table_config;
use fastpath::snapshot::{Snapshot, SnapshotBuilder};
use flowtable::{FlowData, FlowHandle, FlowState, FlowTable, Protocol, TcpFlags, TcpState};
use ring::hmac;

use super::wire::{Key, Kind, Refused};
use super::*;

const A: &str = "198.18.2.11:7946";
const B: &str = "198.18.2.12:7946";
const C: &str = "198.18.2.13:7946";
const KEY: [u8; 32] = [7; 32];
/// Where a datagram's records start (the header's length).
const RECORDS_AT: usize = 88;

/// A node's config: SNAT address `snat`, the web service with `backends`.
fn toml(snat: &str, backends: &str) -> String {
    format!(
        "[dataplane]\nsnat_addresses = [\"{snat}\"]\n[flowtable]\ncapacity = 4096\n[[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{backends}]\n[[services]]\nname = \"other\"\nvip = \"198.18.100.2\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{{ addr = \"198.18.1.9:80\" }}]\n"
    )
}

struct Node {
    svc: Service,
    log: Arc<FlowLog>,
    flows: Arc<FlowTable>,
    snap: Arc<Snapshot>,
}

/// A node listening on `me` with `peers` (address, SNAT addresses listed), on `text`; its
/// table is `flows` (a restarted node adopts its predecessor's) or a new one.
fn node_with(
    me: &str,
    peers: &[(&str, &[&str])],
    text: &str,
    flows: Option<Arc<FlowTable>>,
    epoch: Instant,
) -> Node {
    let cfg = config::parse(text, "t.toml").unwrap();
    let snap = Arc::new(
        SnapshotBuilder::from_config(&cfg)
            .build_config(&cfg)
            .unwrap(),
    );
    let flows =
        flows.unwrap_or_else(|| Arc::new(FlowTable::new(flow_table_config(&cfg), epoch).unwrap()));
    let log = Arc::new(FlowLog::new(1024));
    let svc = Service::new(
        FlowSyncConfig {
            listen: me.parse().unwrap(),
            peers: peers
                .iter()
                .map(|(a, snat)| config::SyncPeer {
                    address: a.parse().unwrap(),
                    snat_addresses: snat.iter().map(|s| s.parse().unwrap()).collect(),
                })
                .collect(),
            snat_addresses: cfg.dataplane.snat_addresses.clone(),
            key: Key::new(&KEY).unwrap(),
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

const BACKENDS_12: &str = "{ addr = \"198.18.1.1:8080\" }, { addr = \"198.18.1.2:8080\" }";
const BACKENDS_21: &str = "{ addr = \"198.18.1.2:8080\" }, { addr = \"198.18.1.1:8080\" }";

fn node_a(epoch: Instant) -> Node {
    node_with(
        A,
        &[(B, &[])],
        &toml("198.18.3.1", BACKENDS_12),
        None,
        epoch,
    )
}

fn node_b(epoch: Instant) -> Node {
    node_with(
        B,
        &[(A, &[])],
        &toml("198.18.3.2", BACKENDS_21),
        None,
        epoch,
    )
}

/// A (with backends .1, .2) and B (the same backends learnt the other way round, so its
/// ids differ), not yet introduced.
fn pair(epoch: Instant) -> (Node, Node) {
    (node_a(epoch), node_b(epoch))
}

/// Every datagram `from` has waiting, sealed for its receivers; (receiver, datagram).
fn outgoing(from: &mut Node) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(ds) = from.svc.next_datagrams() {
        out.extend(ds);
    }
    out
}

/// Every datagram `from` has waiting for `to`, handed to `to` (from `from`'s address);
/// returns them. Datagrams for other receivers are dropped.
fn deliver(from: &mut Node, to: &mut Node, now: Instant) -> Vec<Vec<u8>> {
    let (src, dst) = (from.svc.cfg.listen, to.svc.cfg.listen);
    let mut out = Vec::new();
    for (t, d) in outgoing(from) {
        if t == dst {
            to.svc.receive(&d, src, now);
            out.push(d);
        }
    }
    out
}

/// Lets `a` and `b` talk (ticks and deliveries both ways) until neither has anything to
/// say: hellos, tickets, dump requests, dumps.
fn converse(a: &mut Node, b: &mut Node, now: Instant) {
    for _ in 0..8 {
        a.svc.tick(now);
        b.svc.tick(now);
        let n = deliver(a, b, now).len() + deliver(b, a, now).len();
        if n == 0 && a.svc.scans.is_empty() && b.svc.scans.is_empty() {
            return;
        }
    }
    panic!("a and b still talking after 8 rounds");
}

/// `d` with its body changed by `f` and signed again with the tier's key: what a peer that
/// holds the key (compromised, buggy) can send.
fn resigned(d: &[u8], f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut body = d[..d.len() - 32].to_vec();
    f(&mut body);
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &KEY), &body);
    body.extend_from_slice(tag.as_ref());
    body
}

/// A flow of `n`'s own, as its worker would insert it (its ids for `backend`, its SNAT
/// address).
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
        snat: SocketAddr::new(n.svc.cfg.snat_addresses[0], 40000 + port),
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

fn rejected(n: &Node, r: Refused) -> u64 {
    n.svc.stats.rejected(r)
}

/// What `n` has installed, updated or refused of its peers' flows so far (all of it).
fn taken(n: &Node) -> [u64; 7] {
    let s = &n.svc.stats;
    [
        &s.flows_installed,
        &s.flows_updated,
        &s.flows_removed,
        &s.refused_unknown,
        &s.refused_conflict,
        &s.refused_invalid,
        &s.refused_other,
    ]
    .map(|a| a.load(Ordering::Relaxed))
}

/// A's flow datagrams to B for flows on ports `ports`, delivered (B installs them);
/// returns the datagrams.
fn flows_a_to_b(a: &mut Node, b: &mut Node, ports: &[u16], now: Instant) -> Vec<Vec<u8>> {
    for &p in ports {
        own_flow(a, p, "198.18.1.1:8080", now);
    }
    a.svc.tick(now);
    deliver(a, b, now)
        .into_iter()
        .filter(|d| d[5] == Kind::Flows as u8)
        .collect()
}

#[test]
fn two_new_nodes_learn_each_others_tickets_then_sync() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_millis(10);
    // A flow of A's before B's ticket is known: nothing but hellos leaves for B.
    let (early, _) = own_flow(&a, 999, "198.18.1.1:8080", now);
    a.svc.tick(now);
    let first = deliver(&mut a, &mut b, now);
    assert!(
        first.iter().all(|d| d[5] == Kind::Hello as u8),
        "only a hello before the ticket is known"
    );
    assert_eq!(stat(&b, |s| &s.flows_installed), 0);
    converse(&mut a, &mut b, now);
    for n in [&a, &b] {
        assert!(Refused::ALL.iter().all(|&r| rejected(n, r) == 0));
        assert_eq!(
            n.svc.peers[0].their_ticket,
            other(n, &a, &b).svc.peers[0].ticket
        );
        assert_eq!(stat(n, |s| &s.dumps_received), 1, "each asked the other");
    }
    // The flow created before the handshake reached B afterwards (the catch-up).
    assert!(b.flows.lookup(&early.original_key()).is_some());
    b.svc.tick(now);
    assert!(b.svc.ready.load(Ordering::Relaxed));
}

/// The node of `a`, `b` that is not `n`.
fn other<'a>(n: &Node, a: &'a Node, b: &'a Node) -> &'a Node {
    if n.svc.cfg.listen == a.svc.cfg.listen {
        b
    } else {
        a
    }
}

#[test]
fn a_peer_installs_flows_with_its_own_ids_and_updates_them_in_place() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    converse(&mut a, &mut b, now);
    let (d, h) = own_flow(&a, 1000, "198.18.1.1:8080", now);
    a.svc.tick(now);
    deliver(&mut a, &mut b, now);
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
    deliver(&mut a, &mut b, later);
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
    converse(&mut a, &mut b, now);
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
    deliver(&mut a, &mut b, now);
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
    converse(&mut a, &mut b, now);
    let flows_dgram = flows_a_to_b(&mut a, &mut b, &[1000], now).remove(0);
    let accepted = stat(&b, |s| &s.messages_received);
    let a_addr: SocketAddr = A.parse().unwrap();
    // Replayed as is.
    b.svc.receive(&flows_dgram, a_addr, now);
    assert_eq!(rejected(&b, Refused::Replay), 1);
    // Forged: a changed record (another backend), the tag left as it was.
    let mut forged = flows_dgram.clone();
    forged[RECORDS_AT + 40] ^= 1;
    b.svc.receive(&forged, a_addr, now);
    assert_eq!(rejected(&b, Refused::Auth), 1);
    // Signed with another key, every header field right.
    let r = FlowRecord::decode(
        flows_dgram[RECORDS_AT..RECORDS_AT + flowtable::RECORD_BYTES]
            .try_into()
            .unwrap(),
    )
    .unwrap();
    let mut w = Writer::new(Kind::Flows);
    w.flow(&r);
    let mut head = wire::open(&Key::new(&KEY).unwrap(), &flows_dgram)
        .unwrap()
        .head;
    head.seq = unix_us();
    let other = w.seal(&Key::new(&[8; 32]).unwrap(), &head);
    b.svc.receive(&other, a_addr, now);
    assert_eq!(rejected(&b, Refused::Auth), 2);
    // From an address that is no peer.
    b.svc
        .receive(&flows_dgram, "198.18.2.99:7946".parse().unwrap(), now);
    assert_eq!(rejected(&b, Refused::UnknownPeer), 1);
    // Garbage.
    b.svc.receive(b"XVSY", a_addr, now);
    assert_eq!(rejected(&b, Refused::Malformed), 1);
    assert_eq!(
        stat(&b, |s| &s.messages_received),
        accepted,
        "none accepted"
    );
    assert_eq!(b.flows.len(), 1);
}

#[test]
fn a_datagram_reflected_to_its_sender_is_refused() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    converse(&mut a, &mut b, now);
    // A flow of A's that B installs; A then loses it (ended, swept).
    let sent = flows_a_to_b(&mut a, &mut b, &[1100, 1101], now);
    assert_eq!(stat(&b, |s| &s.flows_installed), 2);
    while let Some((h, _)) = a.flows.lookup(
        &FlowData {
            client: "198.18.0.2:1100".parse().unwrap(),
            ..own_flow_data(&a)
        }
        .original_key(),
    ) {
        a.flows.remove(h);
    }
    let before = taken(&a);
    let received = stat(&a, |s| &s.messages_received);
    // Everything A sent B, hellos included, sent back to A as if from B.
    let mut reflected = sent;
    a.svc.tick(now);
    reflected.extend(outgoing(&mut a).into_iter().map(|(_, d)| d));
    for d in &reflected {
        a.svc.receive(d, B.parse().unwrap(), now);
    }
    assert_eq!(rejected(&a, Refused::Reflected), reflected.len() as u64);
    assert_eq!(taken(&a), before, "nothing installed or updated");
    assert_eq!(stat(&a, |s| &s.messages_received), received);
    assert!(
        a.flows
            .lookup(
                &FlowData {
                    client: "198.18.0.2:1100".parse().unwrap(),
                    ..own_flow_data(&a)
                }
                .original_key()
            )
            .is_none(),
        "the flow A ended did not come back"
    );
}

/// The data of [`own_flow`] for `n`, port 0 (for lookups).
fn own_flow_data(n: &Node) -> FlowData {
    FlowData {
        proto: Protocol::Tcp,
        client: "198.18.0.2:0".parse().unwrap(),
        vip: "198.18.100.1:80".parse().unwrap(),
        backend: "198.18.1.1:8080".parse().unwrap(),
        snat: SocketAddr::new(n.svc.cfg.snat_addresses[0], 40000),
        service_id: 0,
        backend_id: flowtable::BackendId(0),
        snapshot_gen: 1,
        flags: 1,
    }
}

#[test]
fn datagrams_for_another_node_or_from_another_than_their_sender_are_refused() {
    let epoch = Instant::now();
    // A tier of three: A and B as before, C a peer of both.
    let text = |snat| toml(snat, BACKENDS_12);
    let mut a = node_with(A, &[(B, &[]), (C, &[])], &text("198.18.3.1"), None, epoch);
    let mut b = node_with(B, &[(A, &[]), (C, &[])], &text("198.18.3.2"), None, epoch);
    let mut c = node_with(C, &[(A, &[]), (B, &[])], &text("198.18.3.3"), None, epoch);
    let now = epoch + Duration::from_secs(1);
    for _ in 0..4 {
        for n in [&mut a, &mut b, &mut c] {
            n.svc.tick(now);
        }
        // Everyone's datagrams to whom they are meant for.
        let mut all: Vec<(SocketAddr, SocketAddr, Vec<u8>)> = Vec::new();
        for n in [&mut a, &mut b, &mut c] {
            let src = n.svc.cfg.listen;
            all.extend(outgoing(n).into_iter().map(|(t, d)| (src, t, d)));
        }
        for (src, t, d) in all {
            let n = [&mut a, &mut b, &mut c]
                .into_iter()
                .find(|n| n.svc.cfg.listen == t)
                .unwrap();
            n.svc.receive(&d, src, now);
        }
    }
    for n in [&a, &b, &c] {
        assert!(n.svc.peers.iter().all(|p| p.their_ticket != 0));
    }
    // A's flow datagram to B, taken off the wire.
    own_flow(&a, 1200, "198.18.1.1:8080", now);
    a.svc.tick(now);
    let to_b: Vec<Vec<u8>> = outgoing(&mut a)
        .into_iter()
        .filter(|(t, d)| *t == B.parse().unwrap() && d[5] == Kind::Flows as u8)
        .map(|(_, d)| d)
        .collect();
    assert_eq!(to_b.len(), 1);
    let before = taken(&c);
    // ... sent to C from A's address (A's datagram for B): the wrong receiver.
    c.svc.receive(&to_b[0], A.parse().unwrap(), now);
    assert_eq!(rejected(&c, Refused::WrongReceiver), 1);
    // ... sent to B from C's address: the sender is not the peer it came from.
    b.svc.receive(&to_b[0], C.parse().unwrap(), now);
    assert_eq!(rejected(&b, Refused::WrongSender), 1);
    assert_eq!(taken(&c), before);
    assert_eq!(stat(&b, |s| &s.flows_installed), 0);
    // Delivered as meant, it is taken.
    b.svc.receive(&to_b[0], A.parse().unwrap(), now);
    assert_eq!(stat(&b, |s| &s.flows_installed), 1);
}

#[test]
fn datagrams_captured_before_the_receiver_restarted_are_refused_after() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    converse(&mut a, &mut b, now);
    let captured = flows_a_to_b(&mut a, &mut b, &[1300, 1301, 1302], now);
    a.svc.tick(now);
    let hellos: Vec<Vec<u8>> = outgoing(&mut a).into_iter().map(|(_, d)| d).collect();
    assert_eq!(stat(&b, |s| &s.flows_installed), 3);
    // A's flows end: A forgets them (its ends reach nobody: B is restarting).
    for port in 1300..1303 {
        let key = FlowData {
            client: format!("198.18.0.2:{port}").parse().unwrap(),
            ..own_flow_data(&a)
        }
        .original_key();
        let (h, _) = a.flows.lookup(&key).unwrap();
        a.flows.remove(h);
    }
    // B restarts with an empty table (its state was lost) and knows nothing of A yet.
    let mut b2 = node_b(epoch);
    let later = now + Duration::from_secs(2);
    for d in captured.iter().chain(&hellos) {
        b2.svc.receive(d, A.parse().unwrap(), later);
    }
    assert_eq!(
        rejected(&b2, Refused::StaleSession),
        captured.len() as u64,
        "every flow datagram presents the old process's ticket"
    );
    assert_eq!(taken(&b2), [0; 7]);
    assert_eq!(b2.flows.len(), 0, "no forged flow");
    // Once A and the new B talked, the same datagrams are still refused; genuine ones are
    // taken.
    converse(&mut a, &mut b2, later);
    for d in &captured {
        b2.svc.receive(d, A.parse().unwrap(), later);
    }
    assert_eq!(
        rejected(&b2, Refused::StaleSession),
        2 * captured.len() as u64
    );
    assert_eq!(b2.flows.len(), 0, "no forged flow");
    flows_a_to_b(&mut a, &mut b2, &[1310], later);
    assert_eq!(stat(&b2, |s| &s.flows_installed), 1);
    assert_eq!(b2.flows.len(), 1);
}

#[test]
fn datagrams_captured_before_the_sender_restarted_are_refused_after() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    converse(&mut a, &mut b, now);
    let captured = flows_a_to_b(&mut a, &mut b, &[1400, 1401], now);
    assert_eq!(stat(&b, |s| &s.flows_installed), 2);
    // B loses its copies (their ends came, or it was told to forget them).
    for port in 1400..1402 {
        let key = FlowData {
            client: format!("198.18.0.2:{port}").parse().unwrap(),
            ..own_flow_data(&a)
        }
        .original_key();
        let (h, _) = b.flows.lookup(&key).unwrap();
        b.flows.remove(h);
    }
    // A restarts (a new process: a new session, tickets unknown), keeping its table.
    let table = Arc::clone(&a.flows);
    drop(a);
    let mut a2 = node_with(
        A,
        &[(B, &[])],
        &toml("198.18.3.1", BACKENDS_12),
        Some(table),
        epoch,
    );
    let later = now + Duration::from_secs(1);
    converse(&mut a2, &mut b, later);
    let old_ticket_refused = rejected(&b, Refused::StaleSession);
    let before = taken(&b);
    for d in &captured {
        b.svc.receive(d, A.parse().unwrap(), later);
    }
    assert_eq!(
        rejected(&b, Refused::StaleSession),
        old_ticket_refused + captured.len() as u64,
        "an older session of the peer"
    );
    assert_eq!(taken(&b), before, "nothing installed or updated");
    // A's new process syncs: its catch-up sent its flows again; new ones go through.
    flows_a_to_b(&mut a2, &mut b, &[1410], later);
    assert!(
        b.flows
            .lookup(
                &FlowData {
                    client: "198.18.0.2:1410".parse().unwrap(),
                    ..own_flow_data(&a2)
                }
                .original_key()
            )
            .is_some()
    );

    // The new A goes silent (dies); an old datagram replayed now makes B follow the old
    // session again (it cannot tell a peer whose clock stepped back), but re-issues A's
    // ticket, so neither that datagram nor any other of the old process is acted on.
    let silent = later + PEER_SILENT + Duration::from_millis(1);
    let before = taken(&b);
    let ticket = b.svc.peers[0].ticket;
    for d in &captured {
        b.svc.receive(d, A.parse().unwrap(), silent);
    }
    assert_ne!(b.svc.peers[0].ticket, ticket, "re-issued");
    assert_eq!(taken(&b), before, "nothing installed or updated");
    // The new A back: B follows it again (it is newer) and they talk as before.
    converse(&mut a2, &mut b, silent);
    flows_a_to_b(&mut a2, &mut b, &[1420], silent);
    assert!(
        b.flows
            .lookup(
                &FlowData {
                    client: "198.18.0.2:1420".parse().unwrap(),
                    ..own_flow_data(&a2)
                }
                .original_key()
            )
            .is_some()
    );
}

#[test]
fn a_datagram_of_another_version_is_refused_and_counted() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    converse(&mut a, &mut b, now);
    own_flow(&a, 1500, "198.18.1.1:8080", now);
    a.svc.tick(now);
    let d = outgoing(&mut a)
        .into_iter()
        .map(|(_, d)| d)
        .find(|d| d[5] == Kind::Flows as u8)
        .unwrap();
    // The same datagram from a node of another version (signed right: it has the key).
    b.svc
        .receive(&resigned(&d, |b| b[4] = 1), A.parse().unwrap(), now);
    b.svc
        .receive(&resigned(&d, |b| b[4] = 3), A.parse().unwrap(), now);
    assert_eq!(rejected(&b, Refused::Version), 2);
    assert_eq!(stat(&b, |s| &s.flows_installed), 0);
    b.svc.receive(&d, A.parse().unwrap(), now);
    assert_eq!(
        stat(&b, |s| &s.flows_installed),
        1,
        "this version's is taken"
    );
}

#[test]
fn records_a_signed_datagram_carries_are_judged_one_by_one() {
    let epoch = Instant::now();
    // B lists A's SNAT address.
    let mut a = node_a(epoch);
    let mut b = node_with(
        B,
        &[(A, &["198.18.3.1"])],
        &toml("198.18.3.2", BACKENDS_21),
        None,
        epoch,
    );
    let now = epoch + Duration::from_secs(1);
    converse(&mut a, &mut b, now);
    for port in 1600..1604 {
        own_flow(&a, port, "198.18.1.1:8080", now);
    }
    a.svc.tick(now);
    let d = outgoing(&mut a)
        .into_iter()
        .map(|(_, d)| d)
        .find(|d| d[5] == Kind::Flows as u8)
        .unwrap();
    let rec = |i: usize| RECORDS_AT + i * flowtable::RECORD_BYTES;
    // A peer with the key (compromised, buggy) sends: record 0 that does not decode (no
    // protocol), record 1 on B's own SNAT address, record 2 on an address that is not
    // A's, record 3 as it was.
    let evil = resigned(&d, |b| {
        b[rec(0)] = 0;
        let snat_at = |i: usize| rec(i) + 28 + 16 * 3;
        b[snat_at(1)..snat_at(1) + 4].copy_from_slice(&[2, 3, 18, 198]);
        b[snat_at(2)..snat_at(2) + 4].copy_from_slice(&[9, 3, 18, 198]);
    });
    b.svc.receive(&evil, A.parse().unwrap(), now);
    assert_eq!(stat(&b, |s| &s.refused_malformed), 1);
    assert_eq!(stat(&b, |s| &s.refused_invalid), 2);
    assert_eq!(stat(&b, |s| &s.flows_installed), 1);
    assert_eq!(b.flows.len(), 1);
    assert!(
        b.flows
            .lookup(
                &FlowData {
                    client: "198.18.0.2:1603".parse().unwrap(),
                    ..own_flow_data(&a)
                }
                .original_key()
            )
            .is_some()
    );
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
    // A has run for a while; B starts: its hello, A's answer, B's request, A's dump.
    a.svc.started = epoch;
    b.svc.tick(now);
    assert!(!b.svc.ready.load(Ordering::Relaxed));
    converse(&mut b, &mut a, now);
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
    converse(&mut a, &mut b, now);
    let (d1, _) = own_flow(&a, 3001, "198.18.1.1:8080", now);
    let (d2, _) = own_flow(&a, 3002, "198.18.1.1:8080", now);
    a.svc.tick(now);
    deliver(&mut a, &mut b, now);
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
    deliver(&mut a, &mut b, later);
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
        b.svc.queue.iter().all(|o| o.body.kind() != Kind::Flows),
        "a copy is not refreshed by the node that holds it"
    );
    assert_eq!(stat(&b, |s| &s.flows_sent), sent_before);
    deliver(&mut a, &mut b, t);
    let (h3, _) = b.flows.lookup(&d3.original_key()).expect("refreshed to B");
    assert!(b.flows.get(h3).is_some());
}

#[test]
fn a_peer_that_starts_later_is_asked_once_it_answers() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    b.svc.started = epoch;
    // B says hello before A listens: it goes nowhere.
    b.svc.tick(epoch);
    outgoing(&mut b);
    assert!(!b.svc.ready.load(Ordering::Relaxed));
    // A comes up and says hello: B learns A's ticket and asks at once.
    let t = epoch + Duration::from_millis(500);
    a.svc.tick(t);
    deliver(&mut a, &mut b, t);
    assert!(
        b.svc
            .queue
            .iter()
            .any(|o| o.body.kind() == Kind::DumpRequest),
        "asked"
    );
    converse(&mut a, &mut b, t);
    b.svc.tick(t);
    assert!(b.svc.ready.load(Ordering::Relaxed), "ready after A's dump");
    // A peer that is up but never answers does not hold a node back for ever.
    let (mut c, mut d) = pair(epoch);
    d.svc.started = epoch;
    for s in 1..=30u64 {
        let t = epoch + Duration::from_secs(s);
        c.svc.tick(t);
        // Only C's hellos reach D; D's answers are lost.
        for (_, dg) in outgoing(&mut c) {
            if dg[5] == Kind::Hello as u8 {
                d.svc.receive(&dg, A.parse().unwrap(), t);
            }
        }
        d.svc.tick(t);
        outgoing(&mut d);
    }
    assert!(
        d.svc.ready.load(Ordering::Relaxed),
        "gave up after DUMP_GIVE_UP"
    );
}

#[test]
fn a_node_that_started_while_its_peer_was_unreachable_gets_its_flows_once_it_hears_it() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    // A's flows come from its previous process (adopted): older than A's start, so A's
    // catch-up does not send them; only a dump does.
    for port in 0..5 {
        own_flow(&a, 2500 + port, "198.18.1.2:8080", now);
    }
    while a.log.pop().is_some() {}
    a.svc.started = now + Duration::from_secs(1);
    b.svc.started = epoch;
    // B alone for longer than DUMP_WAIT: it stops waiting and is ready.
    let t = epoch + DUMP_WAIT + Duration::from_secs(1);
    b.svc.tick(t);
    outgoing(&mut b);
    assert!(b.svc.ready.load(Ordering::Relaxed));
    // The wire heals: B learns A's ticket and asks for its flows all the same.
    converse(&mut a, &mut b, t);
    assert_eq!(stat(&b, |s| &s.dumps_received), 1);
    assert_eq!(b.flows.len(), 5);
}

#[test]
fn a_dump_request_made_with_a_stale_ticket_is_made_again() {
    let epoch = Instant::now();
    let (mut a, mut b) = pair(epoch);
    let now = epoch + Duration::from_secs(1);
    converse(&mut a, &mut b, now);
    for port in 0..3 {
        own_flow(&a, 2600 + port, "198.18.1.2:8080", now);
    }
    while a.log.pop().is_some() {}
    a.svc.started = now + Duration::from_secs(1);
    a.svc.hello(Some(0));
    let old_hello = outgoing(&mut a).remove(0).1;
    // B restarts while A's datagrams do not reach it, and stops waiting for A.
    let mut b2 = node_b(epoch);
    b2.svc.started = epoch;
    let t = epoch + DUMP_WAIT + Duration::from_secs(1);
    b2.svc.tick(t);
    outgoing(&mut b2);
    // A replayed hello teaches B A's ticket for B's previous process: B asks with it, and
    // A refuses that (it re-issued B's ticket on seeing B's new session).
    b2.svc.receive(&old_hello, A.parse().unwrap(), t);
    assert!(
        b2.svc
            .queue
            .iter()
            .any(|o| o.body.kind() == Kind::DumpRequest)
    );
    deliver(&mut b2, &mut a, t);
    assert_eq!(rejected(&a, Refused::StaleSession), 1);
    outgoing(&mut a);
    // A heard again: B asks again and gets A's flows.
    converse(&mut a, &mut b2, t);
    assert_eq!(stat(&b2, |s| &s.dumps_received), 1);
    assert_eq!(b2.flows.len(), 3);
}

#[test]
fn refusals_are_logged_once_per_reason_and_source_and_strangers_share_one_line() {
    let epoch = Instant::now();
    let (_, mut b) = pair(epoch);
    let t = epoch + Duration::from_secs(1);
    // A flood from 300 addresses that are no peer: counted each, logged once.
    for i in 0..300u32 {
        let from = SocketAddr::from((std::net::Ipv4Addr::from(0xc612_0000 + i), 7946));
        b.svc.receive(b"XVSY", from, t);
    }
    assert_eq!(rejected(&b, Refused::UnknownPeer), 300);
    let any = SocketAddr::from(([0, 0, 0, 0], 0));
    assert_eq!(b.svc.log_gate.pass("unknown_peer", any, t), None, "gated");
    assert_eq!(
        b.svc.log_gate.pass("unknown_peer", any, t + LOG_EVERY),
        Some(300),
        "the next line says how many were not logged"
    );
    // A peer's refusals: gated by reason.
    let a_addr: SocketAddr = A.parse().unwrap();
    assert_eq!(b.svc.log_gate.pass("auth", a_addr, t), Some(0));
    assert_eq!(b.svc.log_gate.pass("auth", a_addr, t), None);
    assert_eq!(b.svc.log_gate.pass("replay", a_addr, t), Some(0));
}
