//! Behaviour of the table on a fake clock: lookups by both tuples, timeouts per state, counts,
//! removal, recycling under a SYN flood.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use flowtable::*;

fn v4(a: u8, b: u8, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, a, b)), port)
}

fn v6(a: u16, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, a)), port)
}

/// Flow `i` (full-NAT): client 198.18.{i>>8}.{i} : 10000+i -> VIP, SNAT port 20000+i.
fn flow(proto: Protocol, i: u32, backend: u32) -> FlowData {
    FlowData {
        proto,
        client: v4((i >> 8) as u8, i as u8, 10000 + (i % 50000) as u16),
        vip: v4(100, 1, 80),
        backend: v4(1, backend as u8, 8080),
        snat: v4(200, 1, 20000 + (i % 40000) as u16),
        service_id: 7,
        backend_id: BackendId(backend),
        snapshot_gen: i,
        flags: 1,
    }
}

fn table(cap: usize) -> (FlowTable, Instant) {
    let epoch = Instant::now();
    (
        FlowTable::new(FlowTableConfig::new(cap, 8), epoch).unwrap(),
        epoch,
    )
}

fn expire_all(t: &FlowTable, now: Instant) -> Vec<ExpiredFlow> {
    let mut out = Vec::new();
    t.sweep(t.tick(now), t.capacity(), |f| out.push(f));
    out
}

#[test]
fn both_tuples_lead_to_one_entry() {
    let (t, now) = table(64);
    let d = flow(Protocol::Tcp, 1, 2);
    let h = t.insert(&d, TcpFlags::SYN, t.tick(now)).unwrap();
    assert_eq!(t.lookup(&d.original_key()), Some((h, Direction::Original)));
    assert_eq!(t.lookup(&d.reply_key()), Some((h, Direction::Reply)));
    let v = t.get(h).unwrap();
    assert_eq!(v.data, d);
    assert_eq!(v.state, FlowState::Tcp(TcpState::SynRecv));
    assert_eq!(t.len(), 1);
    // The reverse of the original tuple is not a flow.
    let rev = FlowKey::new(Protocol::Tcp, d.vip, d.client).unwrap();
    assert_eq!(t.lookup(&rev), None);
    assert_eq!(
        t.insert(&d, TcpFlags::SYN, t.tick(now)),
        Err(InsertError::Exists(h))
    );
}

#[test]
fn ipv6_and_protocols_are_distinct() {
    let (t, now) = table(64);
    let d6 = FlowData {
        proto: Protocol::Udp,
        client: v6(1, 5000),
        vip: v6(0x100, 53),
        backend: v6(0x200, 5353),
        snat: v6(0x300, 30000),
        service_id: 1,
        backend_id: BackendId(0),
        snapshot_gen: 3,
        flags: 0,
    };
    let h6 = t.insert(&d6, TcpFlags::NONE, t.tick(now)).unwrap();
    let dt = FlowData {
        proto: Protocol::Tcp,
        ..d6
    };
    let ht = t.insert(&dt, TcpFlags::SYN, t.tick(now)).unwrap();
    let ds = FlowData {
        proto: Protocol::Sctp,
        ..d6
    };
    let hs = t.insert(&ds, TcpFlags::SYN, t.tick(now)).unwrap();
    assert!(h6 != ht && ht != hs);
    assert_eq!(
        t.lookup(&d6.original_key()),
        Some((h6, Direction::Original))
    );
    assert_eq!(t.lookup(&dt.reply_key()), Some((ht, Direction::Reply)));
    assert_eq!(
        t.lookup(&ds.original_key()),
        Some((hs, Direction::Original))
    );
    assert_eq!(t.get(h6).unwrap().data, d6);
    assert_eq!(
        t.get(hs).unwrap().state,
        FlowState::Sctp(SctpState::Established)
    );
    // A v4-mapped IPv6 tuple is not the IPv4 tuple.
    let d4 = flow(Protocol::Udp, 9, 0);
    let h4 = t.insert(&d4, TcpFlags::NONE, t.tick(now)).unwrap();
    let mapped = |s: SocketAddr| match s.ip() {
        IpAddr::V4(a) => SocketAddr::new(IpAddr::V6(a.to_ipv6_mapped()), s.port()),
        IpAddr::V6(_) => s,
    };
    let k = FlowKey::new(Protocol::Udp, mapped(d4.client), mapped(d4.vip)).unwrap();
    assert_eq!(t.lookup(&k), None);
    assert_eq!(
        t.lookup(&d4.original_key()),
        Some((h4, Direction::Original))
    );
    // Mixed families are refused.
    let bad = FlowData {
        backend: v6(1, 1),
        ..d4
    };
    assert!(matches!(
        t.insert(&bad, TcpFlags::NONE, t.tick(now)),
        Err(InsertError::Invalid(_))
    ));
}

#[test]
fn icmp_echo_id_as_port() {
    let (t, now) = table(16);
    let d = FlowData {
        proto: Protocol::Icmp,
        ..flow(Protocol::Icmp, 3, 1)
    };
    let d = FlowData {
        client: SocketAddr::new(d.client.ip(), 77),
        vip: SocketAddr::new(d.vip.ip(), 77),
        ..d
    };
    let h = t.insert(&d, TcpFlags::NONE, t.tick(now)).unwrap();
    assert_eq!(t.get(h).unwrap().state, FlowState::Icmp);
    assert!(expire_all(&t, now + Duration::from_secs(59)).is_empty());
    assert_eq!(expire_all(&t, now + Duration::from_secs(60)).len(), 1);
    assert_eq!(t.get(h), None);
}

/// Drive one TCP flow through `steps`, checking the state after each, then check it expires
/// exactly after the last state's timeout.
fn tcp_case(steps: &[(Direction, TcpFlags, TcpState)], timeout_s: u64) {
    let (t, epoch) = table(16);
    let mut now = epoch;
    let d = flow(Protocol::Tcp, 1, 3);
    let h = t.insert(&d, steps[0].1, t.tick(now)).unwrap();
    assert_eq!(t.get(h).unwrap().state, FlowState::Tcp(steps[0].2));
    for &(dir, fl, want) in &steps[1..] {
        now += Duration::from_secs(1);
        let key = if dir == Direction::Original {
            d.original_key()
        } else {
            d.reply_key()
        };
        let (hh, got_dir) = t.lookup(&key).unwrap();
        assert_eq!((hh, got_dir), (h, dir));
        assert_eq!(
            t.on_packet(h, dir, fl, t.tick(now)),
            Some(FlowState::Tcp(want))
        );
    }
    let last = now;
    assert!(expire_all(&t, last + Duration::from_millis(timeout_s * 1000 - 100)).is_empty());
    let gone = expire_all(&t, last + Duration::from_secs(timeout_s));
    assert_eq!(gone.len(), 1, "expires after {timeout_s}s");
    assert_eq!(gone[0].data, d);
    assert_eq!(gone[0].state, FlowState::Tcp(steps.last().unwrap().2));
    assert_eq!(t.lookup(&d.original_key()), None);
    assert_eq!(t.lookup(&d.reply_key()), None);
    assert_eq!(
        t.on_packet(h, Direction::Original, TcpFlags::ACK, t.tick(last)),
        None
    );
    assert_eq!((t.active(BackendId(3)), t.inactive(BackendId(3))), (0, 0));
    assert_eq!(t.len(), 0);
}

use Direction::{Original as In, Reply as Out};
use TcpState::{Close, CloseWait, Established, FinWait, LastAck, SynRecv, SynSent, TimeWait};
const SYN: TcpFlags = TcpFlags::SYN;
const SYNACK: TcpFlags = TcpFlags(0x12);
const ACK: TcpFlags = TcpFlags::ACK;
const FIN: TcpFlags = TcpFlags(0x11);
const RST: TcpFlags = TcpFlags::RST;

#[test]
fn tcp_states_and_timeouts() {
    tcp_case(&[(In, SYN, SynRecv)], 60);
    tcp_case(&[(In, SYN, SynRecv), (Out, SYNACK, SynRecv)], 60);
    tcp_case(
        &[
            (In, SYN, SynRecv),
            (Out, SYNACK, SynRecv),
            (In, ACK, Established),
        ],
        900,
    );
    tcp_case(
        &[
            (In, SYN, SynRecv),
            (Out, SYN, SynRecv),
            (In, ACK, Established),
            (Out, FIN, FinWait),
        ],
        120,
    );
    tcp_case(
        &[
            (In, SYN, SynRecv),
            (Out, SYNACK, SynRecv),
            (In, ACK, Established),
            (In, FIN, CloseWait),
        ],
        60,
    );
    tcp_case(
        &[
            (In, SYN, SynRecv),
            (Out, SYNACK, SynRecv),
            (In, ACK, Established),
            (In, FIN, CloseWait),
            (Out, FIN, TimeWait),
        ],
        120,
    );
    tcp_case(
        &[
            (In, SYN, SynRecv),
            (Out, SYNACK, SynRecv),
            (In, ACK, Established),
            (Out, RST, Close),
        ],
        10,
    );
    tcp_case(&[(In, SYN, SynRecv), (Out, RST, Close)], 10);
    tcp_case(&[(In, ACK, Close)], 10);
}

#[test]
fn syn_sent_and_last_ack_timeouts() {
    // SYN_SENT (backend-side SYN first) and LAST_ACK are only reachable in unusual orders; check
    // their timeouts through the table directly.
    let t = Timeouts::default();
    assert_eq!(
        t.for_state(FlowState::Tcp(SynSent)),
        Duration::from_secs(60)
    );
    assert_eq!(
        t.for_state(FlowState::Tcp(LastAck)),
        Duration::from_secs(30)
    );
    assert_eq!(
        t.for_state(FlowState::Tcp(CloseWait)),
        Duration::from_secs(60)
    );
    assert_eq!(
        t.for_state(FlowState::Sctp(SctpState::Closing)),
        Duration::from_secs(10)
    );
}

#[test]
fn traffic_refreshes_and_udp_sctp_timeouts() {
    let (t, epoch) = table(16);
    let u = t
        .insert(&flow(Protocol::Udp, 1, 0), TcpFlags::NONE, t.tick(epoch))
        .unwrap();
    let s = t
        .insert(&flow(Protocol::Sctp, 2, 0), TcpFlags::SYN, t.tick(epoch))
        .unwrap();
    let s2 = t
        .insert(&flow(Protocol::Sctp, 3, 0), TcpFlags::SYN, t.tick(epoch))
        .unwrap();
    assert_eq!(
        t.on_packet(s2, Out, TcpFlags::FIN, t.tick(epoch)),
        Some(FlowState::Sctp(SctpState::Closing))
    );
    assert_eq!(t.inactive(BackendId(0)), 3);
    let at = |s| epoch + Duration::from_secs(s);
    assert_eq!(expire_all(&t, at(10)).len(), 1); // SCTP closing, 10 s
    assert!(t.get(s2).is_none());
    assert_eq!(
        t.on_packet(u, Out, TcpFlags::NONE, t.tick(at(200))),
        Some(FlowState::Udp)
    );
    assert!(expire_all(&t, at(499)).is_empty()); // refreshed at 200 s
    let e = expire_all(&t, at(500));
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].handle, u);
    assert_eq!(e[0].last_seen, at(200));
    assert!(expire_all(&t, at(899)).is_empty());
    assert_eq!(expire_all(&t, at(900)).len(), 1); // SCTP established, 900 s
    assert!(t.get(s).is_none());
    assert_eq!(t.stats().expired, 3);
    assert_eq!(t.inactive(BackendId(0)), 0);
}

#[test]
fn custom_timeouts() {
    let epoch = Instant::now();
    let mut cfg = FlowTableConfig::new(8, 1);
    cfg.timeouts.udp = Duration::from_secs(5);
    let t = FlowTable::new(cfg, epoch).unwrap();
    t.insert(&flow(Protocol::Udp, 1, 0), TcpFlags::NONE, t.tick(epoch))
        .unwrap();
    assert!(expire_all(&t, epoch + Duration::from_millis(4900)).is_empty());
    assert_eq!(expire_all(&t, epoch + Duration::from_secs(5)).len(), 1);
}

#[test]
fn counts_follow_states_removal_and_expiry() {
    let (t, now) = table(64);
    let b = BackendId(5);
    let d1 = flow(Protocol::Tcp, 1, 5);
    let d2 = flow(Protocol::Tcp, 2, 5);
    let du = flow(Protocol::Udp, 3, 5);
    let h1 = t.insert(&d1, SYN, t.tick(now)).unwrap();
    let h2 = t.insert(&d2, SYN, t.tick(now)).unwrap();
    let hu = t.insert(&du, TcpFlags::NONE, t.tick(now)).unwrap();
    assert_eq!((t.active(b), t.inactive(b)), (0, 3));
    t.on_packet(h1, Out, SYNACK, t.tick(now));
    t.on_packet(h1, In, ACK, t.tick(now));
    t.on_packet(h2, Out, SYNACK, t.tick(now));
    t.on_packet(h2, In, ACK, t.tick(now));
    assert_eq!((t.active(b), t.inactive(b)), (2, 1));
    assert_eq!(t.overhead(b), 2 * 256 + 1);
    t.on_packet(h1, In, FIN, t.tick(now));
    assert_eq!((t.active(b), t.inactive(b)), (1, 2));
    let r = t.remove(hu).unwrap();
    assert_eq!(r.data, du);
    assert_eq!(t.remove(hu), None);
    assert_eq!((t.active(b), t.inactive(b)), (1, 1));
    // h1 in CLOSE_WAIT expires after 60 s, h2 established stays.
    assert_eq!(expire_all(&t, now + Duration::from_secs(61)).len(), 1);
    assert_eq!((t.active(b), t.inactive(b)), (1, 0));
    t.remove(h2).unwrap();
    assert_eq!((t.active(b), t.inactive(b)), (0, 0));
    assert_eq!(t.stats().removed, 2);
    assert_eq!(
        (t.active(BackendId(1000)), t.inactive(BackendId(1000))),
        (0, 0)
    );
    let bad = flow(Protocol::Tcp, 9, 8); // backend 8 >= backends_max
    assert!(matches!(
        t.insert(&bad, SYN, t.tick(now)),
        Err(InsertError::Invalid(_))
    ));
}

#[test]
fn reply_tuple_conflict_and_churn_reuses_index() {
    let (t, now) = table(128);
    let a = flow(Protocol::Udp, 1, 0);
    let ha = t.insert(&a, TcpFlags::NONE, t.tick(now)).unwrap();
    // Same SNAT port, different client: reply tuple in use.
    let b = FlowData {
        client: v4(9, 9, 999),
        snat: a.snat,
        ..a
    };
    assert_eq!(
        t.insert(&b, TcpFlags::NONE, t.tick(now)),
        Err(InsertError::ReplyInUse(ha))
    );
    assert_eq!(t.len(), 1);
    assert_eq!(t.stats().reply_in_use, 1);
    // Churn many generations through a small table: tombstones must be cleared by sweeps.
    let mut now = now;
    for round in 0..200u32 {
        let mut hs = Vec::new();
        for i in 0..100u32 {
            let d = flow(Protocol::Tcp, 1000 + round * 100 + i, 1);
            let r = t.insert(&d, SYN, t.tick(now));
            let h = r.unwrap_or_else(|e| panic!("round {round} i {i}: {e:?} {:?}", t.stats()));
            hs.push((d, h));
        }
        for (d, h) in &hs {
            assert_eq!(t.lookup(&d.reply_key()), Some((*h, Out)));
            assert_eq!(t.get(*h).unwrap().data, *d);
        }
        for (i, (_, h)) in hs.iter().enumerate() {
            if i % 2 == 0 {
                t.remove(*h).unwrap();
            }
        }
        now += Duration::from_secs(61);
        t.sweep(t.tick(now), 128, |_| {});
        let (live, tombs, _, _) = t.index_census();
        assert_eq!(live, 2);
        assert!(tombs < 50, "tombstones are cleared: {tombs}");
        // The other half were embryonic for 61 s: expired by the sweep.
        assert_eq!(t.len(), 1, "round {round}");
        // The long-lived UDP flow is refreshed so it survives.
        t.on_packet(ha, Out, TcpFlags::NONE, t.tick(now));
    }
    assert_eq!(t.lookup(&a.original_key()), Some((ha, In)));
    assert_eq!(t.stats().index_full, 0);
}

#[test]
fn sweep_budget_and_scan() {
    let (t, now) = table(100);
    for i in 0..50 {
        t.insert(&flow(Protocol::Udp, i, 2), TcpFlags::NONE, t.tick(now))
            .unwrap();
    }
    let mut seen = 0;
    t.scan(0, 100, |v| {
        assert_eq!(v.data.backend_id, BackendId(2));
        seen += 1
    });
    assert_eq!(seen, 50);
    let later = now + Duration::from_secs(300);
    let mut n = 0;
    for _ in 0..10 {
        let s = t.sweep(t.tick(later), 10, |_| n += 1);
        assert_eq!(s.visited, 10);
    }
    assert_eq!(n, 50);
    assert!(t.is_empty());
}

#[test]
fn bytes_per_flow_target() {
    let (t, _) = table(100_000);
    let b = t.bytes_per_flow();
    // 64 (the entry: an IPv6 flow takes a second one, its extension) + the index (3.2 slots
    // of 8 bytes) + backend counts: about 89.7 (issue #32's ceiling: 96).
    assert!(b <= 96.0, "{b}");
    assert!(FlowTable::new(FlowTableConfig::new(0, 1), Instant::now()).is_err());
    assert!(FlowTable::new(FlowTableConfig::new(1, 0), Instant::now()).is_err());
}

#[test]
fn lookup_hit_gives_the_translated_endpoints_and_touch_agrees_with_on_packet() {
    let (t, epoch) = table(64);
    let d4 = flow(Protocol::Tcp, 3, 2);
    let d6 = FlowData {
        client: v6(1, 40000),
        vip: v6(2, 80),
        backend: v6(3, 8080),
        snat: v6(4, 20001),
        ..flow(Protocol::Udp, 4, 5)
    };
    for d in [d4, d6] {
        let h = t.insert(&d, TcpFlags::SYN, t.tick(epoch)).unwrap();
        let o = t.lookup_hit(&d.original_key()).unwrap();
        assert_eq!((o.handle, o.dir), (h, Direction::Original));
        assert_eq!(SocketAddr::new(o.src_ip(), o.src_port), d.snat);
        assert_eq!(SocketAddr::new(o.dst_ip(), o.dst_port), d.backend);
        assert_eq!(
            (o.flags, o.backend_id(), o.dst_ip().is_ipv6()),
            (1, d.backend_id, d.client.is_ipv6())
        );
        let r = t.lookup_hit(&d.reply_key()).unwrap();
        assert_eq!((r.handle, r.dir), (h, Direction::Reply));
        assert_eq!(SocketAddr::new(r.src_ip(), r.src_port), d.vip);
        assert_eq!(SocketAddr::new(r.dst_ip(), r.dst_port), d.client);
        // SYN-ACK from the backend, then the client's ACK: same states as on_packet gives.
        let now = epoch + Duration::from_secs(1);
        let s1 = t.touch(&r, TcpFlags(0x12), t.tick(now), || 0);
        let o2 = t.lookup_hit(&d.original_key()).unwrap();
        let s2 = t.touch(&o2, TcpFlags::ACK, t.tick(now), || 0);
        assert_eq!(t.get(h).unwrap().state, s2.unwrap());
        assert!(s1.is_some());
        // The batch lookup answers like the single one, misses included.
        let keys = [
            d.original_key(),
            d.reply_key(),
            flow(Protocol::Tcp, 9, 1).original_key(),
        ];
        let mut out = [None; 3];
        t.lookup_batch(&keys, &mut out);
        assert_eq!(out, keys.map(|k| t.lookup(&k)));
        // A removed flow is gone; a stale hit cannot change it (a write would need the CAS).
        t.remove(h).unwrap();
        assert_eq!(t.lookup_hit(&d.original_key()), None);
        let later = now + Duration::from_secs(5);
        assert_eq!(t.touch(&o2, TcpFlags::ACK, t.tick(later), || 0), None);
    }
}

/// The sequence samples behind the state guard's RST window: taken by the writer of a state
/// change or a new tick (TCP flows that are not FLAG_SLOW only), per direction, never read
/// for a later flow of the same entry.
#[test]
fn sequence_samples_judge_rsts_per_direction_and_per_flow() {
    // One entry: the second flow takes the first one's entry.
    let (t, epoch) = table(1);
    let d = FlowData {
        flags: 0,
        ..flow(Protocol::Tcp, 1, 1)
    };
    let h = t.insert(&d, TcpFlags::SYN, t.tick(epoch)).unwrap();
    let (orig, reply) = (Direction::Original, Direction::Reply);
    // Nothing sampled yet: nothing to judge by.
    assert_eq!(t.rst_window(h, orig, 5, None), RstWindow::Unknown);
    assert_eq!(t.rst_window(h, reply, 5, Some(5)), RstWindow::Unknown);
    // The backend's SYN-ACK a tick later writes: its sequence number is the reply sample.
    let later = epoch + Duration::from_secs(1);
    let r = t.lookup_hit(&d.reply_key()).unwrap();
    let mut read = 0;
    t.touch(&r, TcpFlags(0x12), t.tick(later), || {
        read += 1;
        4_000_000_000
    });
    assert_eq!(read, 1);
    // A packet that writes nothing (same state, same tick) does not even read it.
    let r = t.lookup_hit(&d.reply_key()).unwrap();
    t.touch(&r, TcpFlags(0x12), t.tick(later), || panic!("read"));
    assert_eq!(
        t.rst_window(h, reply, 4_000_000_100, None),
        RstWindow::Inside
    );
    // Wrapping past 2^32 ahead, and 1 MiB behind, are inside; far is not.
    assert_eq!(
        t.rst_window(
            h,
            reply,
            4_000_000_000u32.wrapping_add(RST_AHEAD_BYTES - 128),
            None
        ),
        RstWindow::Inside
    );
    assert_eq!(
        t.rst_window(h, reply, 4_000_000_000 - RST_BEHIND_BYTES + 128, None),
        RstWindow::Inside
    );
    assert_eq!(
        t.rst_window(
            h,
            reply,
            4_000_000_000u32.wrapping_add(RST_AHEAD_BYTES + 256),
            None
        ),
        RstWindow::Outside
    );
    assert_eq!(
        t.rst_window(h, reply, 4_000_000_000 - RST_BEHIND_BYTES - 256, None),
        RstWindow::Outside
    );
    // The client's direction has no sample of its own yet.
    assert_eq!(t.rst_window(h, orig, 1, None), RstWindow::Unknown);
    let o = t.lookup_hit(&d.original_key()).unwrap();
    t.touch(&o, TcpFlags::ACK, t.tick(later), || 1000);
    assert_eq!(t.rst_window(h, orig, 1000, None), RstWindow::Inside);
    assert_eq!(t.rst_window(h, orig, 1 << 31, None), RstWindow::Outside);
    // Both samples kept side by side.
    assert_eq!(
        t.rst_window(h, reply, 4_000_000_000, None),
        RstWindow::Inside
    );
    // A later flow of the same entry starts with no samples.
    t.remove(h).unwrap();
    let h2 = t.insert(&d, TcpFlags::SYN, t.tick(epoch)).unwrap();
    assert_ne!(h2, h);
    assert_eq!(t.rst_window(h2, orig, 1 << 31, None), RstWindow::Unknown);
    assert_eq!(t.rst_window(h, orig, 1000, None), RstWindow::Unknown);
    // Reply without its own sample: its ACK must acknowledge about where the client is.
    let o = t.lookup_hit(&d.original_key()).unwrap();
    t.touch(
        &o,
        TcpFlags::SYN,
        t.tick(epoch + Duration::from_secs(1)),
        || 77,
    );
    assert_eq!(t.rst_window(h2, reply, 0, Some(78)), RstWindow::Inside);
    assert_eq!(
        t.rst_window(h2, reply, 0, Some(1 << 30)),
        RstWindow::Outside
    );
    assert_eq!(t.rst_window(h2, reply, 78, None), RstWindow::Outside);
}

#[test]
fn the_syn_proxys_word_and_other_protocols_take_no_samples() {
    let (t, epoch) = table(64);
    let slow = FlowData {
        flags: FLAG_SLOW,
        ..flow(Protocol::Tcp, 2, 1)
    };
    let h = t.insert(&slow, TcpFlags::SYN, t.tick(epoch)).unwrap();
    assert!(t.set_seq(h, 0xabcd));
    let o = t.lookup_hit(&slow.original_key()).unwrap();
    t.touch(
        &o,
        TcpFlags::ACK,
        t.tick(epoch + Duration::from_secs(1)),
        || 5,
    );
    assert_eq!(t.seq(h), Some(0xabcd), "the proxy's word is left alone");
    assert_eq!(
        t.rst_window(h, Direction::Original, 1 << 31, None),
        RstWindow::Unknown
    );
    let udp = flow(Protocol::Udp, 3, 1);
    let h = t.insert(&udp, TcpFlags::NONE, t.tick(epoch)).unwrap();
    let o = t.lookup_hit(&udp.original_key()).unwrap();
    t.touch(
        &o,
        TcpFlags::NONE,
        t.tick(epoch + Duration::from_secs(1)),
        || 5,
    );
    assert_eq!(t.seq(h), None);
}

/// A pending IPv4 insert carries the original direction's checksum delta (what the first
/// packet's rewrite adds) and its entry's generation in one word: the delta is the one a
/// lookup of the original tuple answers later, and the handle the insert ends with is the
/// flow's, across generations of a reused entry.
#[test]
fn a_pending_v4_insert_carries_the_checksum_delta_and_the_generation() {
    let (t, epoch) = table(64);
    for round in 0..3u32 {
        let tick = t.tick(epoch + Duration::from_secs(u64::from(round)));
        for i in 0..40u32 {
            // Host order; the keys take network order.
            let (oa, op) = (
                u64::from(0xc612_0000 + i) | 0xc612_6401 << 32,
                u32::from(10_000 + i as u16) | 80 << 16,
            );
            let (ra, rp) = (
                0xc612_0101 | u64::from(0xc612_c801 + round) << 32,
                8080 | u32::from(20_000 + i as u16) << 16,
            );
            let o = t.v4_key(Protocol::Tcp, v4_addrs_be(oa), v4_ports_be(op));
            let r = t.v4_key(Protocol::Tcp, v4_addrs_be(ra), v4_ports_be(rp));
            let f = V4Flow {
                original: o,
                reply: r,
                service_id: 7,
                backend_id: BackendId(1),
                snapshot_gen: round,
                flags: 0,
            };
            let p = t.insert_v4_begin(&f, TcpFlags::SYN, tick).unwrap();
            // A forwarded packet's: the tuple's adjustment and the TTL's decrement.
            let want = v4_csum_delta((oa, op), (ra.rotate_left(32), rp.rotate_left(16)));
            let want = v4_forward_delta(want);
            assert_eq!(p.csum_delta(), want, "round {round}, flow {i}");
            let h = t.insert_v4_finish(p).unwrap();
            let hit = t.lookup_v4(&o).expect("inserted");
            assert_eq!(hit.csum_delta, want);
            assert_eq!(hit.handle(), h, "the generation survives the packing");
            assert!(t.remove(h).is_some(), "round {round}, flow {i}");
        }
    }
}
