//! The mh table a builder makes depends only on the backends' addresses, weights and
//! usability: not on the order a source listed or learned them, nor on the ids this builder
//! (or the process whose flow table it adopted) gave them. A tier of nodes behind ECMP, and a
//! node before and after a restart, must send a flow to the same backend.

use std::net::SocketAddr;
use std::time::Instant;

use config::Config;
use flowtable::{FlowData, FlowTable, FlowTableConfig, TcpFlags};
use lb_algos::{BackendId, Scheduler};

use super::*;

const CFG: &str = r#"
[dataplane]
snat_addresses = ["198.18.1.254"]
mh_table_size = 4093
[[services]]
name = "pad"
vip = "198.18.100.2"
port = 80
protocol = "tcp"
backends = [{ addr = "198.18.2.1:80" }, { addr = "198.18.2.2:80" }, { addr = "198.18.2.3:80" }]
[[services]]
name = "web"
vip = "198.18.100.1"
port = 443
protocol = "tcp"
scheduler = "mh"
flags = ["mh-port"]
backends = [{ addr = "198.18.1.1:8443" }]
"#;

fn cfg() -> Config {
    config::parse(CFG, "t.toml").unwrap()
}

/// `pad` and `web`; `web` with the backends `web`, in that order.
fn specs(web: &[BackendSpec]) -> (ServiceSpec, ServiceSpec) {
    let s = ServiceSpec::from_config(&cfg());
    let mut w = s[1].clone();
    w.backends = web.to_vec();
    (s[0].clone(), w)
}

/// Nine backends: two families' worth of ports on one address, uneven weights, one failing
/// its health check, listed in address order.
fn web_backends() -> Vec<BackendSpec> {
    let mut v: Vec<BackendSpec> = (1..=8u32)
        .map(|i| BackendSpec {
            addr: format!("198.18.1.{}:{}", i, 8443 + i % 2).parse().unwrap(),
            weight: 1 + i % 3,
            usable: i != 4,
        })
        .collect();
    v.push(BackendSpec {
        addr: "198.18.1.1:9443".parse().unwrap(),
        weight: 2,
        usable: true,
    });
    v.sort_by_key(|b| b.addr);
    v
}

fn web(snap: &Snapshot) -> &ServiceEntry {
    snap.services.iter().find(|s| s.name == "web").unwrap()
}

/// Slot → backend address.
fn owners(snap: &Snapshot) -> Vec<SocketAddr> {
    let s = web(snap);
    let Scheduler::Mh(m) = &s.scheduler else {
        panic!("web is not mh")
    };
    m.table()
        .iter()
        .map(|&i| s.backends[i as usize].addr)
        .collect()
}

/// Equal slot owners, or how many slots differ (the tables are too long to print).
#[track_caller]
fn assert_same(a: &[SocketAddr], b: &[SocketAddr], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: table sizes");
    let diff = a.iter().zip(b).filter(|(x, y)| x != y).count();
    assert_eq!(diff, 0, "{what}: {diff} of {} slots differ", a.len());
}

/// Backend address → id.
fn ids(snap: &Snapshot) -> Vec<(SocketAddr, BackendId)> {
    let mut v: Vec<_> = web(snap).backends.iter().map(|b| (b.addr, b.id)).collect();
    v.sort();
    v
}

/// A node that never saw anything else: one build, address order.
fn fresh_owners() -> Vec<SocketAddr> {
    let (_, w) = specs(&web_backends());
    owners(
        &SnapshotBuilder::from_config(&cfg())
            .build(&[w], &L2Table::default())
            .unwrap(),
    )
}

#[test]
fn the_order_backends_were_learned_in_does_not_change_the_table() {
    let all = web_backends();
    let want = fresh_owners();
    let l2 = L2Table::default();

    // Node A: `pad` first (its backends take the low ids), then web's backends one by one
    // in reverse address order, each listed last.
    let mut a = SnapshotBuilder::from_config(&cfg());
    let mut listed: Vec<BackendSpec> = Vec::new();
    let mut snap_a = None;
    for b in all.iter().rev() {
        listed.push(b.clone());
        let (pad, w) = specs(&listed);
        snap_a = Some(a.build(&[pad, w], &l2).unwrap());
    }
    let snap_a = snap_a.unwrap();

    // Node B: web alone, its backends in a shuffled order, each listed first; `pad` comes in
    // half way; one backend leaves (its id freed and reused) and comes back later; one
    // fails its health check for a while.
    let mut b = SnapshotBuilder::from_config(&cfg());
    let order = [4usize, 7, 0, 2, 8, 5, 1, 3, 6];
    let mut listed: Vec<BackendSpec> = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        listed.insert(0, all[i].clone());
        let (pad, w) = specs(&listed);
        let services = if k >= 4 { vec![w, pad] } else { vec![w] };
        b.build(&services, &l2).unwrap();
    }
    let gone = listed.remove(3);
    listed[0].usable = !listed[0].usable;
    let (pad, w) = specs(&listed);
    b.build(&[w, pad.clone()], &l2).unwrap();
    assert_eq!(b.reclaim(|_| false), 1);
    let mut other = pad.clone();
    other.name = "other".into();
    other.frontends[0].port = 8080;
    other.backends[0].addr = "198.18.3.1:80".parse().unwrap();
    other.backends.truncate(1);
    let (pad, w) = specs(&listed);
    b.build(&[other.clone(), w, pad], &l2).unwrap();
    listed.insert(5, gone);
    listed[0].usable = !listed[0].usable;
    let (pad, w) = specs(&listed);
    let snap_b = b.build(&[other, w, pad], &l2).unwrap();

    assert_ne!(
        ids(&snap_a),
        ids(&snap_b),
        "the nodes numbered web's backends alike"
    );
    assert_same(&owners(&snap_a), &want, "node A");
    assert_same(&owners(&snap_b), &want, "node B");
}

/// One flow to every backend of `snap`, as the last process left its flow table.
fn flows_of(snap: &Snapshot) -> FlowTable {
    let t = FlowTable::new(FlowTableConfig::new(256, 64), Instant::now()).unwrap();
    for (i, s) in snap.services.iter().enumerate() {
        let f = s.frontends[0];
        for (j, b) in s.backends.iter().enumerate() {
            let n = (100 * i + j) as u16;
            let d = FlowData {
                proto: flowtable::Protocol::Tcp,
                client: SocketAddr::new([198, 18, 0, 2].into(), 1000 + n),
                vip: SocketAddr::new(f.vip, f.port),
                backend: b.addr,
                snat: SocketAddr::new([198, 18, 1, 254].into(), 2000 + n),
                service_id: s.id,
                backend_id: b.id,
                snapshot_gen: 1,
                flags: 0,
            };
            t.insert(&d, TcpFlags::SYN, t.tick(Instant::now())).unwrap();
        }
    }
    t
}

#[test]
fn a_restarted_node_builds_a_fresh_nodes_table() {
    let all = web_backends();
    let l2 = L2Table::default();
    // The last process learned `pad` first and web's backends in reverse order.
    let mut rev = all.clone();
    rev.reverse();
    let (pad, w) = specs(&rev);
    let old = SnapshotBuilder::from_config(&cfg())
        .build(&[pad, w], &l2)
        .unwrap();
    let adopted = AdoptedIds::from_flows(&flows_of(&old));

    // The next one adopts its ids and hears of web first, its backends in another order.
    let mut next = SnapshotBuilder::from_config(&cfg());
    next.adopt(&adopted);
    let mut listed = all.clone();
    listed.rotate_left(4);
    let (pad, w) = specs(&listed);
    let new = next.build(&[w, pad], &l2).unwrap();
    assert_eq!(ids(&new), ids(&old), "adopted ids");

    let (_, w) = specs(&all);
    let fresh = SnapshotBuilder::from_config(&cfg())
        .build(&[w], &l2)
        .unwrap();
    assert_ne!(
        ids(&new),
        ids(&fresh),
        "the restarted node's ids are a fresh node's"
    );
    assert_same(&owners(&new), &owners(&fresh), "restarted vs fresh");
    assert_same(&owners(&old), &owners(&fresh), "last process vs fresh");
}

#[test]
fn a_backend_listed_twice_counts_the_same_whatever_the_order() {
    // Two listings of one address (two sources, or slices in transition) that disagree: the
    // result must not depend on which comes first.
    let l2 = L2Table::default();
    let all = web_backends();
    let dup = |first_usable: bool| {
        let mut v = all.clone();
        let mut b = v[2].clone();
        b.weight = 7;
        b.usable = false;
        let mut c = v[2].clone();
        c.weight = 3;
        c.usable = true;
        let (x, y) = if first_usable { (c, b) } else { (b, c) };
        v[2] = x;
        v.push(y);
        let mut d = v[5].clone();
        d.weight += 4;
        v.insert(0, d);
        let (_, w) = specs(&v);
        SnapshotBuilder::from_config(&cfg())
            .build(&[w], &l2)
            .unwrap()
    };
    let (one, two) = (dup(true), dup(false));
    assert_same(&owners(&one), &owners(&two), "usable listing first vs last");
    let entry = |s: &Snapshot, a: SocketAddr| {
        let b = web(s).backends.iter().find(|b| b.addr == a).unwrap();
        (b.weight, b.usable)
    };
    for a in [all[2].addr, all[5].addr] {
        assert_eq!(entry(&one, a), entry(&two, a), "{a}");
    }
    // The most usable listing counts: usable, then the larger weight.
    assert_eq!(entry(&one, all[2].addr), (3, true));
    assert_eq!(entry(&one, all[5].addr), (all[5].weight + 4, true));
}
