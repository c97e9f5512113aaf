//! Hash flooding: with a known hash key, an attacker can compute offline which tuples share a
//! victim tuple's probe window and fill it with a few hundred spoofed SYNs, so the victim can
//! no longer connect (`IndexFull`) while the table is nearly empty. Tables draw a random key,
//! so the same precomputed tuples land all over the index and the victim connects.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use flowtable::*;

const CAPACITY: usize = 65536;
/// A key anyone could read in an old release: what the attacker computes with.
const KNOWN_KEY: u64 = 0x9e37_79b9_7f4a_7c15;

fn syn(client: Ipv4Addr, port: u16, snat_port: u16) -> FlowData {
    FlowData {
        proto: Protocol::Tcp,
        client: SocketAddr::new(IpAddr::V4(client), port),
        vip: "198.18.100.1:80".parse().unwrap(),
        backend: "198.18.1.1:8080".parse().unwrap(),
        snat: SocketAddr::new([198, 18, 1, 254].into(), snat_port),
        service_id: 0,
        backend_id: BackendId(0),
        snapshot_gen: 1,
        flags: 0,
    }
}

fn table(key: u64) -> FlowTable {
    let cfg = FlowTableConfig {
        hash_seed: key,
        ..FlowTableConfig::new(CAPACITY, 16)
    };
    FlowTable::new(cfg, Instant::now()).unwrap()
}

/// Original tuples from spoofed sources whose home slots, under `key`, fall within the
/// victim's probe window: `n` of them, searched over sources in 198.18.0.0/16.
fn colliding(key: u64, victim: &FlowData, n: usize) -> Vec<FlowData> {
    let oracle = table(key);
    let home = oracle.home_slot(&victim.original_key());
    let window = home..home + FlowTable::PROBE_SLOTS / 2;
    let mut out = Vec::new();
    'search: for a in 0..=255u8 {
        for b in 1..=254u8 {
            for port in (1024..65535u16).step_by(97) {
                let d = syn(Ipv4Addr::new(198, 18, a, b), port, 0);
                if window.contains(&oracle.home_slot(&d.original_key())) {
                    out.push(d);
                    if out.len() == n {
                        break 'search;
                    }
                }
            }
        }
    }
    assert_eq!(out.len(), n, "not enough colliding tuples found");
    out
}

/// Inserts the flood (each flow's reply tuple on a distinct SNAT port, so only the original
/// tuples collide), then the victim's flow; the victim's result.
fn flood_then_connect(
    t: &FlowTable,
    flood: &[FlowData],
    victim: &FlowData,
) -> Result<(), InsertError> {
    let now = Instant::now();
    for (i, d) in flood.iter().enumerate() {
        let d = FlowData {
            snat: SocketAddr::new(d.snat.ip(), 2000 + i as u16),
            ..*d
        };
        let _ = t.insert(&d, TcpFlags::SYN, t.tick(now));
    }
    t.insert(victim, TcpFlags::SYN, t.tick(now)).map(|_| ())
}

#[test]
fn precomputed_collisions_fill_a_known_key_but_not_a_random_one() {
    let victim = syn(Ipv4Addr::new(198, 18, 0, 2), 40000, 1024);
    let flood = colliding(KNOWN_KEY, &victim, 400);
    // Under the key the attacker used, the victim's window is full.
    let known = table(KNOWN_KEY);
    assert_eq!(
        flood_then_connect(&known, &flood, &victim),
        Err(InsertError::IndexFull),
        "the precomputed tuples should fill the victim's probe window"
    );
    assert!(
        known.len() < 500,
        "with the table nearly empty: {}",
        known.len()
    );
    // Under the random key of a table (what FlowTableConfig::new and state files use), the
    // same tuples spread out and the victim connects.
    let random = FlowTable::new(FlowTableConfig::new(CAPACITY, 16), Instant::now()).unwrap();
    assert_eq!(flood_then_connect(&random, &flood, &victim), Ok(()));
    // Two tables draw different keys.
    let other = FlowTable::new(FlowTableConfig::new(CAPACITY, 16), Instant::now()).unwrap();
    let k = victim.original_key();
    let differs = (0..64).any(|i| {
        let d = syn(Ipv4Addr::new(198, 18, 7, i), 5000, 0);
        random.home_slot(&d.original_key()) != other.home_slot(&d.original_key())
    });
    assert!(differs || random.home_slot(&k) != other.home_slot(&k));
}
