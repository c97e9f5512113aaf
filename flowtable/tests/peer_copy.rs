//! What flow sync needs of the table: a flow's record written and read back, and a peer's
//! copy updated in place (state and last-seen time) without removing it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flowtable::{
    BackendId, ConnCounts, FlowData, FlowHandle, FlowRecord, FlowState, FlowTable, FlowTableConfig,
    Protocol, TcpFlags, TcpState,
};

fn flow(port: u16, v6: bool) -> FlowData {
    let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
    let (c, v, b, s) = if v6 {
        (
            "[2001:2::2]:1",
            "[2001:2:0:100::1]:80",
            "[2001:2:0:1::1]:8080",
            "[2001:2:0:3::1]:1",
        )
    } else {
        (
            "198.18.0.2:1",
            "198.18.100.1:80",
            "198.18.1.1:8080",
            "198.18.3.1:1",
        )
    };
    FlowData {
        proto: Protocol::Tcp,
        client: SocketAddr::new(sa(c).ip(), port),
        vip: sa(v),
        backend: sa(b),
        snat: SocketAddr::new(sa(s).ip(), 40000 + port),
        service_id: 3,
        backend_id: BackendId(1),
        snapshot_gen: 7,
        flags: 1,
    }
}

#[test]
fn a_record_reads_back_as_written_in_both_families() {
    let now = Instant::now();
    let t = FlowTable::new(FlowTableConfig::new(64, 4), now).unwrap();
    for v6 in [false, true] {
        let d = flow(1000 + u16::from(v6), v6);
        let h = t.insert(&d, TcpFlags::SYN, t.tick(now)).unwrap();
        t.set_seq(h, 0x1234);
        let later = now + Duration::from_millis(1500);
        let r = FlowRecord::of(&t.get(h).unwrap(), later);
        assert_eq!(r.data, d);
        assert_eq!(r.state, FlowState::Tcp(TcpState::SynRecv));
        assert_eq!(r.idle, Duration::from_millis(1500));
        assert_eq!(r.seq & 0xffff, 0x1234 & 0xffff);
        let back = FlowRecord::decode(&r.encode()).expect("valid");
        assert_eq!(back, r);
    }
    // Bytes that are no record: an unknown protocol, a state code out of range, mixed
    // families.
    let mut b = FlowRecord::of(
        &t.get(t.lookup(&flow(1000, false).original_key()).unwrap().0)
            .unwrap(),
        now,
    )
    .encode();
    let good = b;
    b[0] = 99;
    assert_eq!(FlowRecord::decode(&b), None);
    b = good;
    b[1] = 250;
    assert_eq!(FlowRecord::decode(&b), None);
}

#[test]
fn update_moves_state_and_time_forward_in_place() {
    let now = Instant::now();
    let t = FlowTable::new(FlowTableConfig::new(64, 4), now).unwrap();
    let d = flow(1, false);
    let h = t.insert(&d, TcpFlags::SYN, t.tick(now)).unwrap();
    assert_eq!((t.active(BackendId(1)), t.inactive(BackendId(1))), (0, 1));
    assert_eq!(t.embryonic(), 1);
    let est = FlowState::Tcp(TcpState::Established);
    let later = now + Duration::from_secs(5);
    assert_eq!(t.update(h, est, t.tick(later)), Some(est));
    let v = t.get(h).unwrap();
    assert_eq!(v.state, est);
    assert!(
        v.last_seen >= now + Duration::from_millis(4900),
        "time moved forward"
    );
    // The counts follow the state: now active, no longer embryonic.
    assert_eq!((t.active(BackendId(1)), t.inactive(BackendId(1))), (1, 0));
    assert_eq!(t.embryonic(), 0);
    // An older time does not move it back; the same handle, the same flow.
    assert_eq!(t.update(h, est, t.tick(now)), Some(est));
    assert_eq!(t.get(h).unwrap().last_seen, v.last_seen);
    assert_eq!(t.lookup(&d.original_key()).map(|x| x.0), Some(h));
    // A state of another protocol is refused; a stale handle is refused.
    assert_eq!(t.update(h, FlowState::Udp, t.tick(later)), None);
    assert!(t.remove(h).is_some());
    assert_eq!(t.update(h, est, t.tick(later)), None);
    assert_eq!(
        t.update(FlowHandle::from_bits(u64::MAX), est, t.tick(later)),
        None
    );
    assert_eq!(FlowHandle::from_bits(h.to_bits()), h);
}
