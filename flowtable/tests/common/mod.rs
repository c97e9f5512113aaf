//! Flows and invariant checks shared by the state-file tests.
#![allow(dead_code)]

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use flowtable::*;

/// Backends the test flows use.
pub const BACKENDS: u32 = 8;

/// Flow `i`: IPv4 for even `i`, IPv6 for odd; TCP, except every third is UDP; full-NAT.
pub fn flow(i: u32) -> FlowData {
    let v6 = i % 2 == 1;
    let ip = |net: u8, x: u32| -> IpAddr {
        if v6 {
            IpAddr::V6(Ipv6Addr::new(
                0x2001,
                2,
                0,
                u16::from(net),
                0,
                0,
                (x >> 16) as u16,
                x as u16,
            ))
        } else {
            IpAddr::V4(Ipv4Addr::new(
                198,
                18 + (x >> 16) as u8 % 2,
                net.wrapping_add((x >> 8) as u8),
                x as u8,
            ))
        }
    };
    FlowData {
        proto: if i.is_multiple_of(3) {
            Protocol::Udp
        } else {
            Protocol::Tcp
        },
        client: SocketAddr::new(ip(0, i), 1024 + (i % 50000) as u16),
        vip: SocketAddr::new(ip(100, 1), 80),
        backend: SocketAddr::new(ip(1, i % BACKENDS), 8080),
        snat: SocketAddr::new(ip(200, 1), 1024 + (i % 60000) as u16),
        service_id: 7,
        backend_id: BackendId(i % BACKENDS),
        snapshot_gen: 1,
        flags: 0,
    }
}

/// Checks every invariant a table must hold between operations; returns the live flows.
/// Every live flow is found by both tuples, no tuple belongs to two flows, the size and the
/// per-backend counts agree with the flows, and the index holds exactly two live words per
/// flow.
pub fn check(t: &FlowTable) -> Vec<FlowView> {
    let mut views = Vec::new();
    t.scan(0, t.capacity(), |v| views.push(v));
    let mut keys = HashSet::new();
    let mut active = [0u32; BACKENDS as usize];
    let mut inactive = [0u32; BACKENDS as usize];
    for v in &views {
        let (o, r) = (v.data.original_key(), v.data.reply_key());
        assert!(
            keys.insert(o),
            "two flows with one original tuple: {:?}",
            v.data
        );
        assert!(
            keys.insert(r),
            "two flows with one reply tuple: {:?}",
            v.data
        );
        assert_eq!(
            t.lookup(&o),
            Some((v.handle, Direction::Original)),
            "{:?}",
            v.data
        );
        assert_eq!(
            t.lookup(&r),
            Some((v.handle, Direction::Reply)),
            "{:?}",
            v.data
        );
        let b = v.data.backend_id.0 as usize;
        if v.state.is_active() {
            active[b] += 1;
        } else {
            inactive[b] += 1;
        }
    }
    assert_eq!(t.len(), views.len(), "size");
    for b in 0..BACKENDS {
        let id = BackendId(b);
        assert_eq!(
            (t.active(id), t.inactive(id)),
            (active[b as usize], inactive[b as usize]),
            "counts of backend {b}"
        );
    }
    let (live_words, _, _, _) = t.index_census();
    assert_eq!(live_words, 2 * views.len(), "index words");
    views
}
