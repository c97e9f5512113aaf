//! Model-checks the core protocol with loom on a tiny table:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p flowtable --release --test loom`
#![cfg(loom)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowtable::*;

fn flow(i: u8) -> FlowData {
    let a = |x: u8, p: u16| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, x, i)), p);
    FlowData {
        proto: Protocol::Udp,
        client: a(0, 1000),
        vip: a(100, 80),
        backend: a(1, 8080),
        snat: a(200, 2000),
        service_id: u32::from(i),
        backend_id: BackendId(0),
        snapshot_gen: 0,
        flags: 0,
    }
}

fn table() -> (Arc<FlowTable>, Instant) {
    table_of(2)
}

/// A table of `capacity` flows with a fixed hash key: a model must run the same code in
/// every iteration, and tables draw a random key by default.
fn table_of(capacity: usize) -> (Arc<FlowTable>, Instant) {
    let epoch = Instant::now();
    let config = FlowTableConfig {
        hash_seed: 0x5eed,
        ..FlowTableConfig::new(capacity, 1)
    };
    (Arc::new(FlowTable::new(config, epoch).unwrap()), epoch)
}

#[test]
fn two_inserts_of_one_flow_make_one_entry() {
    loom::model(|| {
        let (t, now) = table();
        let t2 = t.clone();
        let j = loom::thread::spawn(move || t2.insert(&flow(1), TcpFlags::NONE, t2.tick(now)));
        let a = t.insert(&flow(1), TcpFlags::NONE, t.tick(now));
        let b = j.join().unwrap();
        let ok = [a, b].iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "{a:?} {b:?}");
        let (h, _) = t.lookup(&flow(1).original_key()).unwrap();
        assert_eq!(t.lookup(&flow(1).reply_key()).unwrap().0, h);
        assert_eq!(t.len(), 1);
        assert_eq!(t.inactive(BackendId(0)), 1);
    });
}

#[test]
fn two_inserts_of_different_flows() {
    loom::model(|| {
        let (t, now) = table();
        let t2 = t.clone();
        let j =
            loom::thread::spawn(move || t2.insert(&flow(2), TcpFlags::NONE, t2.tick(now)).unwrap());
        let a = t.insert(&flow(1), TcpFlags::NONE, t.tick(now)).unwrap();
        let b = j.join().unwrap();
        assert_ne!(a, b);
        assert_eq!(t.get(a).unwrap().data, flow(1));
        assert_eq!(t.get(b).unwrap().data, flow(2));
        assert_eq!(t.lookup(&flow(2).reply_key()).unwrap().0, b);
    });
}

#[test]
fn reader_races_remover_and_reinsert() {
    loom::model(|| {
        let (t, now) = table();
        let h = t.insert(&flow(1), TcpFlags::NONE, t.tick(now)).unwrap();
        let t2 = t.clone();
        let j = loom::thread::spawn(move || {
            t2.remove(h).unwrap();
            t2.insert(&flow(2), TcpFlags::NONE, t2.tick(now)).unwrap()
        });
        // Never a torn or recycled entry: either flow 1 as inserted, or nothing.
        if let Some(v) = t
            .lookup(&flow(1).original_key())
            .and_then(|(h, _)| t.get(h))
        {
            assert_eq!(v.data, flow(1));
        }
        if let Some(v) = t.get(h) {
            assert_eq!(v.data, flow(1));
        }
        let h2 = j.join().unwrap();
        assert!(t.get(h).is_none());
        assert_eq!(t.get(h2).unwrap().data, flow(2));
    });
}

/// `flow(i)` in IPv6: two entries, the second its extension.
fn flow6(i: u8) -> FlowData {
    let a = |x: u16, p: u16| {
        SocketAddr::new(
            IpAddr::V6(std::net::Ipv6Addr::new(
                0x2001,
                2,
                x,
                0,
                0,
                0,
                0,
                u16::from(i),
            )),
            p,
        )
    };
    FlowData {
        client: a(0, 1000),
        vip: a(100, 80),
        backend: a(1, 8080),
        snat: a(200, 2000),
        ..flow(i)
    }
}

/// A reader that follows an IPv6 flow's hot line to its extension while both entries are
/// freed and taken by the next IPv6 flow (in the other roles: the extension, pushed last,
/// is popped first): it sees the first flow whole or not at all.
#[test]
fn an_ipv6_reader_races_the_reuse_of_its_extension() {
    loom::model(|| {
        let (t, now) = table();
        let h = t.insert(&flow6(1), TcpFlags::NONE, t.tick(now)).unwrap();
        let t2 = t.clone();
        let j = loom::thread::spawn(move || {
            t2.remove(h).unwrap();
            t2.insert(&flow6(2), TcpFlags::NONE, t2.tick(now)).unwrap()
        });
        if let Some(v) = t.lookup(&flow6(1).reply_key()).and_then(|(h, _)| t.get(h)) {
            assert_eq!(v.data, flow6(1));
        }
        if let Some(v) = t.get(h) {
            assert_eq!(v.data, flow6(1));
        }
        let h2 = j.join().unwrap();
        assert!(t.get(h).is_none());
        assert_eq!(t.get(h2).unwrap().data, flow6(2));
        assert_eq!(t.lookup(&flow6(2).reply_key()).unwrap().0, h2);
    });
}

#[test]
fn insert_races_sweep_cleanup() {
    loom::model(|| {
        let (t, now) = table();
        let h = t.insert(&flow(1), TcpFlags::NONE, t.tick(now)).unwrap();
        t.remove(h).unwrap(); // leaves tombstones for the sweep to clear
        let t2 = t.clone();
        let later = now + Duration::from_secs(1);
        let j = loom::thread::spawn(move || {
            t2.sweep(t2.tick(later), 2, |_| {});
        });
        let h3 = t.insert(&flow(3), TcpFlags::NONE, t.tick(later)).unwrap();
        j.join().unwrap();
        assert_eq!(t.lookup(&flow(3).original_key()).unwrap().0, h3);
        assert_eq!(t.lookup(&flow(3).reply_key()).unwrap().0, h3);
    });
}

/// `flow(i)` as an IPv4 insert of the per-packet API.
fn flow_v4(t: &FlowTable, i: u8) -> V4Flow {
    let d = flow(i);
    let bits = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => u64::from(v4.to_bits()),
        IpAddr::V6(_) => unreachable!(),
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

#[test]
fn a_two_step_v4_insert_races_an_insert_of_the_same_flow() {
    loom::model(|| {
        let (t, now) = table();
        let t2 = t.clone();
        let j = loom::thread::spawn(move || t2.insert(&flow(1), TcpFlags::NONE, t2.tick(now)));
        let v4 = flow_v4(&t, 1);
        let tick = t.tick(now);
        // Between the halves the flow is found by its original tuple only (or is the other
        // thread's); either way a lookup never sees a torn entry.
        let a = t.insert_v4_begin(&v4, TcpFlags::NONE, tick).map(|p| {
            if let Some(v) = t
                .lookup(&flow(1).original_key())
                .and_then(|(h, _)| t.get(h))
            {
                assert_eq!(v.data, flow(1));
            }
            t.insert_v4_finish(p)
        });
        let b = j.join().unwrap();
        let a = a.and_then(|r| r);
        let ok = [a.is_ok(), b.is_ok()].iter().filter(|x| **x).count();
        assert_eq!(ok, 1, "{a:?} {b:?}");
        let (h, _) = t.lookup(&flow(1).original_key()).unwrap();
        assert_eq!(t.lookup(&flow(1).reply_key()).unwrap().0, h);
        assert_eq!(t.get(h).unwrap().data, flow(1));
        assert_eq!(t.len(), 1);
        assert_eq!(t.inactive(BackendId(0)), 1);
    });
}

#[test]
fn two_inserts_of_one_flow_over_tombstones_make_one_entry() {
    loom::model(|| {
        let (t, now) = table();
        // Tombstones where flow 1's words were: inserts may reuse them.
        let h = t.insert(&flow(1), TcpFlags::NONE, t.tick(now)).unwrap();
        t.remove(h).unwrap();
        let t2 = t.clone();
        let j = loom::thread::spawn(move || t2.insert(&flow(2), TcpFlags::NONE, t2.tick(now)));
        let a = t.insert(&flow(2), TcpFlags::NONE, t.tick(now));
        let b = j.join().unwrap();
        let ok = [a, b].iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "{a:?} {b:?}");
        let (h, _) = t.lookup(&flow(2).original_key()).unwrap();
        assert_eq!(t.lookup(&flow(2).reply_key()).unwrap().0, h);
        assert_eq!(t.len(), 1);
    });
}

#[test]
fn an_insert_over_tombstones_races_a_removal() {
    loom::model(|| {
        let (t, now) = table();
        let h1 = t.insert(&flow(1), TcpFlags::NONE, t.tick(now)).unwrap();
        let h2 = t.insert(&flow(2), TcpFlags::NONE, t.tick(now)).unwrap();
        t.remove(h1).unwrap();
        let t2 = t.clone();
        // Removing flow 2 leaves more tombstones, racing the insert that reuses them.
        let j = loom::thread::spawn(move || t2.remove(h2).unwrap());
        let h3 = t.insert(&flow(3), TcpFlags::NONE, t.tick(now)).unwrap();
        j.join().unwrap();
        assert_eq!(t.lookup(&flow(3).original_key()).unwrap().0, h3);
        assert_eq!(t.lookup(&flow(3).reply_key()).unwrap().0, h3);
        assert!(t.lookup(&flow(2).original_key()).is_none());
    });
}

#[test]
fn two_inserts_of_one_flow_racing_a_removal_make_one_entry() {
    loom::model(|| {
        let (t, now) = table_of(4);
        // Flow x's original word sits at flow 1's home: while it is removed, one insert of
        // flow 1 may claim the slot after it and the other the tombstone it leaves.
        let home = t.home_slot(&flow(1).original_key());
        let x = (2..=255u8)
            .find(|&i| t.home_slot(&flow(i).original_key()) == home)
            .expect("a flow sharing the home slot");
        let hx = t.insert(&flow(x), TcpFlags::NONE, t.tick(now)).unwrap();
        let (t2, t3) = (t.clone(), t.clone());
        let j = loom::thread::spawn(move || t2.insert(&flow(1), TcpFlags::NONE, t2.tick(now)));
        let k = loom::thread::spawn(move || {
            t3.remove(hx).unwrap();
        });
        let a = t.insert(&flow(1), TcpFlags::NONE, t.tick(now));
        let b = j.join().unwrap();
        k.join().unwrap();
        let ok = [a, b].iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "{a:?} {b:?}");
        let (h, _) = t.lookup(&flow(1).original_key()).unwrap();
        assert_eq!(t.lookup(&flow(1).reply_key()).unwrap().0, h);
        assert_eq!(t.len(), 1);
    });
}
