//! Several threads insert, look up, update, remove and expire a known set of flows at once.
//! Each flow's data encodes its identity, so a lost, duplicated or confused flow is detected.
//! Half the threads insert with the generic API, half with the two-step IPv4 one, doing other
//! lookups between its halves as a worker does.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flowtable::*;

const THREADS: u32 = 4;
const FLOWS: u32 = 4000; // each thread races on every flow
const ROUNDS: u32 = 3;

fn flow(i: u32, round: u32) -> FlowData {
    let ip =
        |a: u8, x: u32| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, a, (x >> 8) as u8)), 0);
    let with = |s: SocketAddr, b: u32, p: u16| {
        SocketAddr::new(
            match s.ip() {
                IpAddr::V4(v) => IpAddr::V4(Ipv4Addr::from_bits(v.to_bits() | b)),
                v6 => v6,
            },
            p,
        )
    };
    FlowData {
        proto: if i.is_multiple_of(3) {
            Protocol::Udp
        } else {
            Protocol::Tcp
        },
        client: with(ip(0, i), i & 0xff, 1000 + (i % 60000) as u16),
        vip: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 100, 1)), 80),
        backend: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 1, (i % 4) as u8)), 8080),
        snat: SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(198, 18, 200, round as u8)),
            1024 + i as u16,
        ),
        service_id: i,
        backend_id: BackendId(i % 4),
        snapshot_gen: round,
        flags: 0,
    }
}

/// `d` (IPv4) for the per-packet API.
fn flow_v4(t: &FlowTable, d: &FlowData) -> V4Flow {
    let bits = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => u64::from(v4.to_bits()),
        IpAddr::V6(_) => unreachable!("IPv4 flows"),
    };
    let key = |s: SocketAddr, x: SocketAddr| {
        t.v4_key(
            d.proto,
            flowtable::v4_addrs_be(bits(s) | bits(x) << 32),
            flowtable::v4_ports_be(u32::from(s.port()) | u32::from(x.port()) << 16),
        )
    };
    V4Flow {
        original: key(d.client, d.vip),
        reply: key(d.backend, d.snat),
        service_id: d.service_id,
        backend_id: d.backend_id,
        snapshot_gen: d.snapshot_gen,
        flags: d.flags,
    }
}

/// Thread `th`'s insert of flow `i` of `round`.
fn insert(
    t: &FlowTable,
    th: u32,
    i: u32,
    round: u32,
    now: Instant,
) -> Result<FlowHandle, InsertError> {
    let d = flow(i, round);
    if th.is_multiple_of(2) {
        return t.insert(&d, TcpFlags::SYN, t.tick(now));
    }
    let p = t.insert_v4_begin(&flow_v4(t, &d), TcpFlags::SYN, t.tick(now))?;
    // Other work between the halves: lookups of other flows (some of them half inserted).
    for j in 1..4 {
        let _ = t.lookup(&flow((i + j) % FLOWS, round).original_key());
    }
    t.insert_v4_finish(p)
}

#[test]
fn concurrent_insert_lookup_update_expire() {
    let epoch = Instant::now();
    let t = FlowTable::new(FlowTableConfig::new(FLOWS as usize + 64, 4), epoch).unwrap();
    for round in 0..ROUNDS {
        let now = epoch + Duration::from_secs(1000 * u64::from(round));
        let wins = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for th in 0..THREADS {
                let (t, wins) = (&t, &wins);
                s.spawn(move || {
                    // Every thread inserts every flow (in a different order): exactly one wins.
                    for k in 0..FLOWS {
                        let i = (k + th * 997) % FLOWS;
                        let d = flow(i, round);
                        let h = match insert(t, th, i, round, now) {
                            Ok(h) => {
                                wins.fetch_add(1, Ordering::Relaxed);
                                h
                            }
                            Err(InsertError::Exists(h)) => h,
                            Err(e) => panic!(
                                "insert {i} round {round}: {e:?} {:?} {:?}",
                                t.index_census(),
                                t.stats()
                            ),
                        };
                        // A loser may see the winner between its two index publications.
                        let mut found = t.lookup(&d.reply_key());
                        for _ in 0..100_000 {
                            if found.is_some() {
                                break;
                            }
                            std::thread::yield_now();
                            found = t.lookup(&d.reply_key());
                        }
                        let (h2, dir) = found.expect("reply tuple found");
                        assert_eq!((h2, dir), (h, Direction::Reply));
                        let v = t.get(h).expect("live");
                        assert_eq!(v.data, d, "flow {i} confused");
                        t.on_packet(h, Direction::Reply, TcpFlags(0x12), t.tick(now));
                        t.on_packet(h, Direction::Original, TcpFlags::ACK, t.tick(now));
                    }
                    // Concurrent partial sweeps while others still look up: nothing idle yet.
                    t.sweep(t.tick(now), 512, |f| panic!("expired too early: {f:?}"));
                    for k in 0..FLOWS {
                        let d = flow(k, round);
                        let (h, dir) = t.lookup(&d.original_key()).expect("original found");
                        assert_eq!(dir, Direction::Original);
                        assert_eq!(t.get(h).unwrap().data.service_id, k);
                    }
                });
            }
        });
        assert_eq!(
            wins.load(Ordering::Relaxed),
            FLOWS as usize,
            "one winner per flow"
        );
        assert_eq!(t.len(), FLOWS as usize);
        let tcp = (0..FLOWS).filter(|i| i % 3 != 0).count() as u32;
        let active: u32 = (0..4).map(|b| t.active(BackendId(b))).sum();
        let inactive: u32 = (0..4).map(|b| t.inactive(BackendId(b))).sum();
        assert_eq!((active, inactive), (tcp, FLOWS - tcp));
        // Remove a third by handle and expire the rest with concurrent sweeps.
        let expired = AtomicUsize::new(0);
        let later = now + Duration::from_secs(901);
        std::thread::scope(|s| {
            for th in 0..THREADS {
                let (t, expired) = (&t, &expired);
                s.spawn(move || {
                    for i in (th..FLOWS).step_by(THREADS as usize).filter(|i| i % 3 == 1) {
                        let d = flow(i, round);
                        if let Some((h, _)) = t.lookup(&d.original_key())
                            && let Some(f) = t.remove(h)
                        {
                            assert_eq!(f.data, d);
                            expired.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    loop {
                        let mut n = 0;
                        let st = t.sweep(t.tick(later), 256, |f| {
                            assert_eq!(f.data, flow(f.data.service_id, round));
                            n += 1;
                        });
                        expired.fetch_add(n, Ordering::Relaxed);
                        if t.is_empty() || st.visited == 0 {
                            break;
                        }
                    }
                });
            }
        });
        assert_eq!(
            expired.load(Ordering::Relaxed),
            FLOWS as usize,
            "each flow leaves once"
        );
        assert!(t.is_empty());
        // Workers keep sweeping every batch: one full round clears the index's tombstones.
        t.sweep(t.tick(later), t.capacity(), |f| {
            panic!("already gone: {f:?}")
        });
        assert_eq!(t.index_census().1, 0, "all tombstones cleared");
        for b in 0..4 {
            assert_eq!((t.active(BackendId(b)), t.inactive(BackendId(b))), (0, 0));
        }
    }
    assert_eq!(t.stats().index_full, 0);
}
