//! One-way flows (`FLAG_ONE_WAY`, direct server return): only the original direction is
//! ever seen. Their TCP state follows IPVS's input-only rows from the client's packets alone,
//! with the per-state timeouts; the IPv4 shortcut lookup leaves them to the general one; the
//! flag survives the state file (adoption) and the export records.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::flow;
use flowtable::*;

fn config(capacity: usize) -> FlowTableConfig {
    FlowTableConfig::new(capacity, common::BACKENDS as usize)
}

/// Flow `i` of the common set (IPv4 for even `i`) as a one-way nat flow (the backend sees
/// the client), TCP.
fn one_way(i: u32) -> FlowData {
    let mut d = flow(i);
    d.proto = Protocol::Tcp;
    d.snat = d.client;
    d.flags = FLAG_ONE_WAY;
    d
}

fn state(t: &FlowTable, h: FlowHandle) -> Option<FlowState> {
    t.get(h).map(|v| v.state)
}

fn swept(t: &FlowTable, at: Instant) -> usize {
    let mut n = 0;
    t.sweep(t.tick(at), t.capacity(), |_| n += 1);
    n
}

fn v4_key(t: &FlowTable, d: &FlowData) -> V4Key {
    let bits = |a: std::net::SocketAddr| match a.ip() {
        std::net::IpAddr::V4(v) => v.to_bits(),
        _ => panic!("IPv4"),
    };
    t.v4_key(
        d.proto,
        flowtable::v4_addrs_be(u64::from(bits(d.client)) | u64::from(bits(d.vip)) << 32),
        flowtable::v4_ports_be(u32::from(d.client.port()) | u32::from(d.vip.port()) << 16),
    )
}

#[test]
fn the_shortcut_lookup_leaves_one_way_flows_to_the_general_one() {
    let epoch = Instant::now();
    let t = FlowTable::new(config(64), epoch).unwrap();
    let now = t.tick(epoch);
    let mut two_way = one_way(0);
    two_way.flags = 0;
    t.insert(&two_way, TcpFlags::SYN, now).unwrap();
    assert!(!t.has_slow_flows());
    assert!(t.lookup_v4(&v4_key(&t, &two_way)).is_some());
    let d = one_way(2);
    let h = t.insert(&d, TcpFlags::SYN, now).unwrap();
    assert!(t.has_slow_flows(), "a one-way flow makes misses look again");
    assert_eq!(t.lookup_v4(&v4_key(&t, &d)), None);
    let hit = t.lookup_hit(&d.original_key()).unwrap();
    assert_eq!((hit.handle, hit.dir), (h, Direction::Original));
    assert_eq!(hit.flags, FLAG_ONE_WAY);
    assert_eq!(hit.state(), FlowState::Tcp(TcpState::SynRecv));
}

/// A connection's client packets alone: SYN (SYN_RECV, 60 s), ACK (ESTABLISHED, 900 s), FIN
/// (FIN_WAIT, 120 s, where a two-way flow's would wait in CLOSE_WAIT, 60 s, for the
/// backend's FIN), its last ACK (still FIN_WAIT), then expiry; an RST closes (10 s).
#[test]
fn client_packets_alone_take_a_connection_through_and_out() {
    let epoch = Instant::now();
    let t = FlowTable::new(config(64), epoch).unwrap();
    let s = |secs: u64| epoch + Duration::from_secs(secs);
    for (touching, i) in [(true, 0u32), (false, 2)] {
        let d = one_way(i);
        let h = t.insert(&d, TcpFlags::SYN, t.tick(s(0))).unwrap();
        // Both the per-packet call (from a hit) and the one by handle.
        let step = |flags: TcpFlags, at: Instant| {
            if touching {
                let hit = t.lookup_hit(&d.original_key()).unwrap();
                t.touch(&hit, flags, t.tick(at), || 1)
            } else {
                t.on_packet(h, Direction::Original, flags, t.tick(at))
            }
        };
        assert_eq!(state(&t, h), Some(FlowState::Tcp(TcpState::SynRecv)));
        assert_eq!(swept(&t, s(59)), 0, "SYN_RECV lasts 60 s");
        let est = Some(FlowState::Tcp(TcpState::Established));
        assert_eq!(step(TcpFlags::ACK, s(59)), est);
        assert_eq!(step(TcpFlags::ACK | TcpFlags::PSH, s(60)), est);
        assert_eq!(swept(&t, s(60 + 899)), 0, "ESTABLISHED lasts 900 s");
        let fw = Some(FlowState::Tcp(TcpState::FinWait));
        assert_eq!(step(TcpFlags::FIN | TcpFlags::ACK, s(959)), fw);
        assert_eq!(step(TcpFlags::ACK, s(960)), fw, "the last ACK");
        assert_eq!(swept(&t, s(960 + 119)), 0, "FIN_WAIT lasts 120 s");
        assert_eq!(swept(&t, s(960 + 121)), 1, "then the flow is gone");
        assert_eq!(t.lookup(&d.original_key()), None);
    }
    // An RST: CLOSE, 10 s.
    let d = one_way(4);
    let h = t.insert(&d, TcpFlags::SYN, t.tick(s(2000))).unwrap();
    t.on_packet(h, Direction::Original, TcpFlags::ACK, t.tick(s(2000)));
    assert_eq!(
        t.on_packet(h, Direction::Original, TcpFlags::RST, t.tick(s(2001))),
        Some(FlowState::Tcp(TcpState::Close))
    );
    assert_eq!(swept(&t, s(2010)), 0);
    assert_eq!(swept(&t, s(2012)), 1);
    // The same client FIN on a two-way flow: CLOSE_WAIT.
    let mut d = one_way(6);
    d.flags = 0;
    let h = t.insert(&d, TcpFlags::SYN, t.tick(s(3000))).unwrap();
    t.on_packet(h, Direction::Original, TcpFlags::ACK, t.tick(s(3000)));
    assert_eq!(
        t.on_packet(h, Direction::Original, TcpFlags::FIN, t.tick(s(3000))),
        Some(FlowState::Tcp(TcpState::CloseWait))
    );
}

#[test]
fn the_flag_survives_the_state_file_and_the_export() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let t0 = Instant::now();
    let (t, _) = FlowTable::open(&path, config(256), t0, &AnyFlow).unwrap();
    for i in 0..20 {
        let h = t.insert(&one_way(i), TcpFlags::SYN, t.tick(t0)).unwrap();
        t.on_packet(h, Direction::Original, TcpFlags::ACK, t.tick(t0));
    }
    let out = dir.path().join("flows.export");
    assert_eq!(t.export(&out, t0).unwrap(), 20);
    t.mark_clean();
    drop(t);
    let (t, opened) = FlowTable::open(&path, config(256), t0, &AnyFlow).unwrap();
    assert!(matches!(opened, Opened::Adopted(_)), "{opened:?}");
    assert!(t.has_slow_flows(), "an adopted one-way flow counts");
    let mut views = Vec::new();
    t.scan(0, t.capacity(), |v| views.push(v));
    assert_eq!(views.len(), 20);
    for v in &views {
        assert_eq!(v.data.flags, FLAG_ONE_WAY);
        assert_eq!(v.state, FlowState::Tcp(TcpState::Established));
        // Still on the input-only rows.
        assert_eq!(
            t.on_packet(v.handle, Direction::Original, TcpFlags::FIN, t.tick(t0)),
            Some(FlowState::Tcp(TcpState::FinWait))
        );
    }
    let b = FlowTable::new(config(256), t0).unwrap();
    let imported = b.import_records(&out, t0, &AnyFlow).unwrap();
    assert_eq!(imported.restored, 20, "{imported:?}");
    assert!(b.has_slow_flows(), "an imported one-way flow counts");
    let mut n = 0;
    b.scan(0, b.capacity(), |v| {
        assert_eq!(v.data.flags, FLAG_ONE_WAY);
        n += 1;
    });
    assert_eq!(n, 20);
}
