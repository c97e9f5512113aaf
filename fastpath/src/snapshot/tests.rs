//! The builder's unit tests: next hops, stable and recycled ids, entries shared across
//! builds, failed builds.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use lb_algos::{AffinityTable, BackendId, ConnCounts, FlowTuple};
use vocab::{Mode, Protocol, SchedulerKind};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The test client's flow (198.18.0.2:1000) to `vip`:80.
fn client_flow(vip: &str) -> FlowTuple {
    FlowTuple {
        src: ip("198.18.0.2"),
        src_port: 1000,
        dst: ip(vip),
        dst_port: 80,
    }
}

fn snapshot(l2: &L2Table) -> Snapshot {
    let cfg = config::parse(
        "[dataplane]\nsnat_addresses = [\"198.18.1.254\"]\n[[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.1:8080\" }, { addr = \"198.18.1.2:8080\" }]\n",
        "t.toml",
    )
    .unwrap();
    SnapshotBuilder::from_config(&cfg)
        .build(&ServiceSpec::from_config(&cfg), l2)
        .unwrap()
}

#[test]
fn next_hop_follows_routes_gateways_and_port_macs() {
    let (client_mac, backend_mac, gw_mac) =
        ([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 1, 1], [2, 0, 0, 0, 0, 9]);
    let l2 = L2Table {
        routes: vec![
            Route {
                prefix: "0.0.0.0/0".parse().unwrap(),
                port: 0,
                gateway: Some(ip("198.18.0.9")),
            },
            Route {
                prefix: "198.18.0.0/24".parse().unwrap(),
                port: 0,
                gateway: None,
            },
            Route {
                prefix: "198.18.1.0/24".parse().unwrap(),
                port: 1,
                gateway: None,
            },
        ],
        neighbours: vec![
            Neighbour {
                ip: ip("198.18.0.2"),
                mac: client_mac,
                port: Some(0),
            },
            Neighbour {
                ip: ip("198.18.0.9"),
                mac: gw_mac,
                port: Some(0),
            },
            Neighbour {
                ip: ip("198.18.1.1"),
                mac: backend_mac,
                port: Some(1),
            },
        ],
        port_macs: vec![[2, 0, 0, 0, 0xaa, 0], [2, 0, 0, 0, 0xaa, 1]],
    };
    let s = snapshot(&l2);
    // On-link backend: port 1, its own MAC, port 1's MAC as source.
    assert_eq!(
        s.next_hop(ip("198.18.1.1"), 0),
        Some(NextHop {
            port: 1,
            dst_mac: backend_mac,
            src_mac: Some([2, 0, 0, 0, 0xaa, 1])
        })
    );
    // On-link client on port 0.
    assert_eq!(
        s.next_hop(ip("198.18.0.2"), 1).map(|n| (n.port, n.dst_mac)),
        Some((0, client_mac))
    );
    // Anything else goes to the default gateway's MAC on port 0.
    assert_eq!(
        s.next_hop(ip("203.0.113.7"), 1)
            .map(|n| (n.port, n.dst_mac)),
        Some((0, gw_mac))
    );
    // An on-link address without a neighbour entry is unresolved.
    assert_eq!(s.next_hop(ip("198.18.1.2"), 0), None);
}

#[test]
fn without_routes_frames_leave_by_the_receiving_port() {
    let l2 = L2Table {
        neighbours: vec![Neighbour {
            ip: ip("198.18.1.1"),
            mac: [2, 0, 0, 0, 1, 1],
            port: None,
        }],
        ..L2Table::default()
    };
    let s = snapshot(&l2);
    assert_eq!(
        s.next_hop(ip("198.18.1.1"), 3),
        Some(NextHop {
            port: 3,
            dst_mac: [2, 0, 0, 0, 1, 1],
            src_mac: None
        })
    );
}

#[test]
fn backend_ids_are_stable_and_recycled() {
    let cfg = config::parse(
        "[dataplane]\nsnat_addresses = [\"198.18.1.254\"]\n[[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.1:8080\" }, { addr = \"198.18.1.2:8080\" }]\n",
        "t.toml",
    )
    .unwrap();
    let mut b = SnapshotBuilder::from_config(&cfg);
    let mut specs = ServiceSpec::from_config(&cfg);
    let s1 = b.build(&specs, &L2Table::default()).unwrap();
    let ids1: Vec<u32> = s1.services[0].backends.iter().map(|b| b.id.0).collect();
    // Remove the first backend, add a third: the second keeps its id; the removed one's
    // id is retired (flows may hold it), so the new one gets a fresh id.
    let removed = specs[0].backends.remove(0);
    specs[0].backends.push(BackendSpec {
        addr: "198.18.1.3:8080".parse().unwrap(),
        weight: 1,
        usable: true,
    });
    let s2 = b.build(&specs, &L2Table::default()).unwrap();
    let ids2: Vec<u32> = s2.services[0].backends.iter().map(|b| b.id.0).collect();
    assert_eq!(ids2[0], ids1[1]);
    assert!(
        !ids1.contains(&ids2[1]),
        "a retired id is not reused: {ids2:?}"
    );
    assert_eq!(b.retired().collect::<Vec<_>>(), [BackendId(ids1[0])]);
    assert_eq!(s2.generation, s1.generation + 1);
    // The removed backend comes back while still retired: it gets its old id.
    specs[0].backends.push(removed.clone());
    let s3 = b.build(&specs, &L2Table::default()).unwrap();
    assert_eq!(s3.services[0].backends[2].id.0, ids1[0]);
    assert_eq!(b.retired().count(), 0);
    // Removed again; reclaim frees it only once nothing holds it, then a new backend
    // reuses it.
    specs[0].backends.pop();
    b.build(&specs, &L2Table::default()).unwrap();
    assert_eq!(b.reclaim(|_| true), 0);
    assert_eq!(b.retired().count(), 1);
    assert_eq!(b.reclaim(|_| false), 1);
    specs[0].backends.push(BackendSpec {
        addr: "198.18.1.4:8080".parse().unwrap(),
        weight: 1,
        usable: true,
    });
    let s4 = b.build(&specs, &L2Table::default()).unwrap();
    assert_eq!(s4.services[0].backends[2].id.0, ids1[0]);
    // Two services on one frontend are refused.
    specs.push(specs[0].clone());
    specs[1].name = "web-copy".into();
    assert!(matches!(
        b.build(&specs, &L2Table::default()),
        Err(BuildError::DuplicateFrontend { .. })
    ));
}

struct NoCounts;
impl ConnCounts for NoCounts {
    fn active(&self, _: BackendId) -> u32 {
        0
    }
    fn inactive(&self, _: BackendId) -> u32 {
        0
    }
}

#[test]
fn unchanged_services_keep_their_scheduler_state_across_builds() {
    let cfg = config::parse(
        "[dataplane]\nmode = \"nat\"\n[[services]]\nname = \"a\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.1:80\" }, { addr = \"198.18.1.2:80\" }, { addr = \"198.18.1.3:80\" }]\n[[services]]\nname = \"b\"\nvip = \"198.18.100.2\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.1:80\" }, { addr = \"198.18.1.2:80\" }]\n",
        "t.toml",
    )
    .unwrap();
    let epoch = Instant::now();
    let affinity = AffinityTable::new(16, epoch);
    let flow = client_flow("198.18.100.1");
    let pick = |s: &Snapshot, svc: usize| {
        s.services[svc]
            .schedule(&flow, &NoCounts, &affinity, epoch)
            .unwrap()
    };
    let mut b = SnapshotBuilder::from_config(&cfg);
    let mut specs = ServiceSpec::from_config(&cfg);
    let s1 = b.build(&specs, &L2Table::default()).unwrap();
    assert_eq!((pick(&s1, 0), pick(&s1, 0)), (0, 1));
    assert_eq!(pick(&s1, 1), 0);
    // A new neighbour only: rr goes on where it was (a fresh scheduler would restart at 0).
    let l2 = L2Table {
        neighbours: vec![Neighbour {
            ip: ip("198.18.1.1"),
            mac: [2, 0, 0, 0, 1, 1],
            port: None,
        }],
        ..L2Table::default()
    };
    let s2 = b.build(&specs, &l2).unwrap();
    assert!(Arc::ptr_eq(&s1.services[0], &s2.services[0]));
    assert_eq!(pick(&s2, 0), 2);
    // Editing service b rebuilds b only.
    specs[1].backends.pop();
    let s3 = b.build(&specs, &l2).unwrap();
    assert!(Arc::ptr_eq(&s2.services[0], &s3.services[0]));
    assert!(!Arc::ptr_eq(&s2.services[1], &s3.services[1]));
    assert_eq!(pick(&s3, 0), 0);
    assert_eq!(s3.services[1].backends.len(), 1);
}

fn spec(name: &str, vip: u8, backends: &[u8]) -> ServiceSpec {
    ServiceSpec {
        name: name.to_owned(),
        frontends: vec![Frontend {
            vip: IpAddr::from([198, 18, 100, vip]),
            protocol: Protocol::Tcp,
            port: 80,
        }],
        scheduler: SchedulerKind::Rr,
        flags: Vec::new(),
        mode: Mode::Nat,
        affinity_timeout: None,
        backends: backends
            .iter()
            .map(|b| BackendSpec {
                addr: SocketAddr::from(([198, 18, 1, *b], 80)),
                weight: 1,
                usable: true,
            })
            .collect(),
        source_ranges: Vec::new(),
        rate_limit: None,
        frozen: false,
        synproxy: SynproxySetting::Off,
        health: Default::default(),
        no_endpoints: crate::snapshot::NoEndpoints::Reject,
        cluster_ip: false,
    }
}

/// Inserting and removing services around others (which moves their positions) keeps
/// the others' entries (scheduler state), service ids and backend ids; `services[id]`
/// and `service_for` keep finding them.
#[test]
fn entries_are_reused_by_name_when_positions_move() {
    let mut b = SnapshotBuilder::new(1024, 251);
    let l2 = L2Table::default();
    let mut specs = vec![spec("b", 2, &[1, 2]), spec("d", 4, &[3, 4])];
    let s1 = b.build(&specs, &l2).unwrap();
    let (b1, d1) = (Arc::clone(&s1.services[0]), Arc::clone(&s1.services[1]));
    assert_eq!((b1.id, d1.id), (0, 1));
    // Advance b's rr cursor: a rebuilt entry would start over.
    let epoch = Instant::now();
    let affinity = AffinityTable::new(16, epoch);
    let flow = client_flow("198.18.100.2");
    assert_eq!(b1.schedule(&flow, &NoCounts, &affinity, epoch), Ok(0));
    // a and c arrive around them.
    specs = vec![
        spec("a", 1, &[5]),
        spec("b", 2, &[1, 2]),
        spec("c", 3, &[6]),
        spec("d", 4, &[3, 4]),
    ];
    let s2 = b.build(&specs, &l2).unwrap();
    let names: Vec<&str> = s2.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert!(Arc::ptr_eq(&s2.services[b1.id as usize], &b1));
    assert!(Arc::ptr_eq(&s2.services[d1.id as usize], &d1));
    let fe = |vip: u8| Frontend {
        vip: IpAddr::from([198, 18, 100, vip]),
        protocol: Protocol::Tcp,
        port: 80,
    };
    assert!(std::ptr::eq(s2.service_for(&fe(2)).unwrap(), &*b1));
    assert_eq!(s2.service_for(&fe(3)).unwrap().name, "c");
    assert_eq!(b1.schedule(&flow, &NoCounts, &affinity, epoch), Ok(1));
    let (a2, c2) = (
        Arc::clone(&s2.services.as_slice()[0]),
        Arc::clone(&s2.services.as_slice()[2]),
    );
    // Every id is distinct, every backend id too.
    let mut sids: Vec<u32> = s2.services.iter().map(|s| s.id).collect();
    sids.sort_unstable();
    sids.dedup();
    assert_eq!(sids.len(), 4);
    let mut bids: Vec<u32> = s2
        .services
        .iter()
        .flat_map(|s| s.backends.iter().map(|b| b.id.0))
        .collect();
    bids.sort_unstable();
    bids.dedup();
    assert_eq!(bids.len(), 6);
    // b goes away: the others keep their entries; b's backend ids are retired and its
    // frontend is gone.
    specs.remove(1);
    let s3 = b.build(&specs, &l2).unwrap();
    assert_eq!(s3.services.len(), 3);
    for e in [&a2, &c2, &d1] {
        assert!(Arc::ptr_eq(&s3.services[e.id as usize], e));
    }
    assert!(s3.services.get(b1.id as usize).is_none());
    assert!(s3.service_for(&fe(2)).is_none());
    let mut retired: Vec<BackendId> = b.retired().collect();
    retired.sort_unstable_by_key(|i| i.0);
    let mut b_ids: Vec<BackendId> = b1.backends.iter().map(|b| b.id).collect();
    b_ids.sort_unstable_by_key(|i| i.0);
    assert_eq!(retired, b_ids);
    // A new service takes b's frontend and gets a fresh entry (b's id may be reused).
    specs.push(spec("e", 2, &[7]));
    let s4 = b.build(&specs, &l2).unwrap();
    let e4 = s4.service_for(&fe(2)).unwrap();
    assert_eq!(e4.name, "e");
    assert!(Arc::ptr_eq(
        &s4.services[e4.id as usize],
        &s4.services.as_slice()[3]
    ));
    for e in [&a2, &c2, &d1] {
        assert!(Arc::ptr_eq(&s4.services[e.id as usize], e));
    }
    // b comes back while its ids are still retired: same backend ids, fresh entry.
    specs.insert(1, spec("b", 9, &[1, 2]));
    let s5 = b.build(&specs, &l2).unwrap();
    let b5 = s5.service_for(&fe(9)).unwrap();
    assert!(!std::ptr::eq(b5, &*b1));
    assert_eq!(
        b5.backends.iter().map(|b| b.id).collect::<Vec<_>>(),
        b1.backends.iter().map(|b| b.id).collect::<Vec<_>>()
    );
    assert_eq!(b.retired().count(), 0);
}

/// A failed build leaves the builder as it was: the next good build shares entries and
/// hands out the same ids as if the failure never happened.
#[test]
fn a_failed_build_changes_nothing() {
    let mut b = SnapshotBuilder::new(4, 251);
    let l2 = L2Table::default();
    let good = vec![spec("a", 1, &[1]), spec("b", 2, &[2])];
    let s1 = b.build(&good, &l2).unwrap();
    // A duplicate frontend, a duplicate name, too many backends.
    let mut dup_fe = good.clone();
    dup_fe.push(spec("c", 1, &[3]));
    assert!(matches!(
        b.build(&dup_fe, &l2),
        Err(BuildError::DuplicateFrontend { .. })
    ));
    let mut dup_name = good.clone();
    dup_name.push(spec("a", 3, &[3]));
    assert!(matches!(
        b.build(&dup_name, &l2),
        Err(BuildError::DuplicateName { .. })
    ));
    let mut too_many = good.clone();
    too_many.push(spec("c", 3, &[3, 4, 5]));
    assert!(matches!(
        b.build(&too_many, &l2),
        Err(BuildError::TooManyBackends { .. })
    ));
    let mut next = good.clone();
    next.push(spec("c", 3, &[3, 4]));
    let s2 = b.build(&next, &l2).unwrap();
    assert!(Arc::ptr_eq(&s1.services[0], &s2.services[0]));
    assert!(Arc::ptr_eq(&s1.services[1], &s2.services[1]));
    let c = &s2.services.as_slice()[2];
    assert_eq!(c.id, 2);
    assert_eq!(
        c.backends.iter().map(|b| b.id.0).collect::<Vec<_>>(),
        [2, 3]
    );
    assert_eq!(s2.generation, s1.generation + 1);
}

/// `spec` with wrr over two backends weighing 2^20 and 1: a sequence of 2^20 + 1 entries,
/// which the wrr builder refuses.
fn wrr_too_wide(name: &str, vip: u8) -> ServiceSpec {
    let mut s = spec(name, vip, &[7, 8]);
    s.scheduler = SchedulerKind::Wrr;
    s.backends[0].weight = 1 << 20;
    s
}

fn refusals(r: &[Refused]) -> Vec<(&str, bool)> {
    r.iter()
        .map(|x| (x.name.as_str(), x.kept_previous))
        .collect()
}

/// One spec the builder cannot build (wrr weights it refuses, a name or a frontend taken
/// twice) is left out with its reason; every other spec, the ones after it included, is
/// in the snapshot.
#[test]
fn an_isolated_build_leaves_out_only_what_it_cannot_build() {
    let mut b = SnapshotBuilder::new(64, 251);
    let l2 = L2Table::default();
    let (s1, refused) = b.build_isolated(&[spec("a", 1, &[1]), spec("b", 2, &[2])], &l2);
    assert!(refused.is_empty());
    let list = vec![
        spec("a", 1, &[1]),
        wrr_too_wide("poison", 3),
        spec("a", 4, &[4]),
        spec("d", 1, &[5]),
        spec("b", 2, &[2]),
        spec("canary", 6, &[6]),
    ];
    let (s2, refused) = b.build_isolated(&list, &l2);
    let names: Vec<&str> = s2.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "canary"]);
    assert_eq!(s2.generation, s1.generation + 1);
    let mut got = refusals(&refused);
    got.sort_unstable();
    assert_eq!(got, [("a", false), ("d", false), ("poison", false)]);
    let why = |name: &str| {
        refused
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.to_string())
            .unwrap()
    };
    assert!(
        why("poison").contains("wrr sequence of 1048577 entries"),
        "{}",
        why("poison")
    );
    assert!(
        why("poison").ends_with("not programmed"),
        "{}",
        why("poison")
    );
    assert!(why("d").contains("claimed by both a and d"), "{}", why("d"));
    // The unchanged specs kept their entries.
    assert!(Arc::ptr_eq(&s1.services[0], &s2.services[0]));
    assert_eq!(
        s2.service_for(&Frontend {
            vip: ip("198.18.100.1"),
            protocol: Protocol::Tcp,
            port: 80
        })
        .map(|s| s.name.as_str()),
        Some("a")
    );
    // Fixed, it is built like any other.
    let mut fixed = list.clone();
    fixed[1].backends[0].weight = 3;
    fixed.retain(|s| s.name != "d" && s.frontends[0].vip != ip("198.18.100.4"));
    let (s3, refused) = b.build_isolated(&fixed, &l2);
    assert!(refused.is_empty(), "{refused:?}");
    assert!(s3.services.iter().any(|s| s.name == "poison"));
}

/// A change the builder refuses keeps the spec's previous version, entry and ids
/// included; the next good change replaces it.
#[test]
fn a_refused_change_keeps_the_previous_version() {
    let mut b = SnapshotBuilder::new(64, 251);
    let l2 = L2Table::default();
    let mut w = wrr_too_wide("w", 1);
    w.backends[0].weight = 2;
    let (s1, _) = b.build_isolated(&[w.clone(), spec("b", 2, &[2])], &l2);
    let (s2, refused) = b.build_isolated(&[wrr_too_wide("w", 1), spec("b", 2, &[2, 3])], &l2);
    assert_eq!(refusals(&refused), [("w", true)]);
    assert!(
        refused[0]
            .to_string()
            .ends_with("its previous version stays")
    );
    assert!(Arc::ptr_eq(&s1.services[0], &s2.services[0]));
    assert_eq!(
        s2.services[1].backends.len(),
        2,
        "the other change is programmed"
    );
    let mut w3 = w.clone();
    w3.backends[0].weight = 5;
    let (s3, refused) = b.build_isolated(&[w3, spec("b", 2, &[2, 3])], &l2);
    assert!(refused.is_empty());
    assert_eq!(s3.services[0].backends[0].weight, 5);
    assert_eq!(
        s3.services[0]
            .backends
            .iter()
            .map(|x| x.id)
            .collect::<Vec<_>>(),
        s1.services[0]
            .backends
            .iter()
            .map(|x| x.id)
            .collect::<Vec<_>>()
    );
}

/// A spec whose backends find no id left (`backends_max`) is refused alone, and the ids a
/// refused attempt took are given back.
#[test]
fn running_out_of_backend_ids_refuses_one_spec() {
    let mut b = SnapshotBuilder::new(4, 251);
    let l2 = L2Table::default();
    let list = vec![
        spec("a", 1, &[1]),
        spec("big", 3, &[3, 4, 5, 6]),
        spec("c", 4, &[7]),
    ];
    let (s, refused) = b.build_isolated(&list, &l2);
    assert_eq!(refusals(&refused), [("big", false)]);
    assert!(matches!(
        &refused[0].error,
        BuildError::TooManyBackends { service, max: 4 } if service == "big"
    ));
    let ids: Vec<u32> = s
        .services
        .iter()
        .flat_map(|x| x.backends.iter().map(|b| b.id.0))
        .collect();
    assert_eq!(ids, [0, 1]);
}

/// The previous version of a refused spec never takes a frontend from a spec of the list:
/// a frontend that moved from the refused service to another goes to the other, and the
/// previous version keeps the rest.
#[test]
fn a_previous_version_keeps_only_frontends_nobody_else_has() {
    let mut b = SnapshotBuilder::new(64, 251);
    let l2 = L2Table::default();
    let fe = |vip: u8| Frontend {
        vip: IpAddr::from([198, 18, 100, vip]),
        protocol: Protocol::Tcp,
        port: 80,
    };
    let mut a = spec("a", 1, &[1]);
    a.frontends.push(fe(3));
    let (_, refused) = b.build_isolated(&[a, spec("c", 4, &[4])], &l2);
    assert!(refused.is_empty());
    // `a` moves to .2 with weights wrr refuses; `b` takes .1, which `a` had.
    let (s, refused) = b.build_isolated(&[wrr_too_wide("a", 2), spec("b", 1, &[2])], &l2);
    assert_eq!(refusals(&refused), [("a", true)]);
    assert_eq!(s.service_for(&fe(1)).map(|x| x.name.as_str()), Some("b"));
    assert_eq!(s.service_for(&fe(3)).map(|x| x.name.as_str()), Some("a"));
    assert!(s.service_for(&fe(2)).is_none());
    assert!(s.service_for(&fe(4)).is_none(), "c is gone");
    // With nothing left of it, the previous version is not kept.
    let (s, refused) = b.build_isolated(
        &[wrr_too_wide("a", 2), spec("b", 1, &[2]), spec("d", 3, &[5])],
        &l2,
    );
    assert_eq!(refusals(&refused), [("a", false)]);
    assert!(s.services.iter().all(|x| x.name != "a"));
}

/// The IPv4 shortcut's frontend lookup (`service_for_v4`, one packed word) finds what
/// `service_for` finds, across builds that add, move and remove frontends, and nothing for a
/// VIP's other ports and protocols, other VIPs, or an IPv6 frontend's address.
#[test]
fn the_v4_frontend_lookup_agrees_with_service_for() {
    let mut b = SnapshotBuilder::new(1024, 251);
    let l2 = L2Table::default();
    let mut udp = spec("u", 2, &[5]);
    udp.frontends[0].protocol = Protocol::Udp;
    udp.frontends[0].port = 53;
    let mut v6 = spec("six", 9, &[6]);
    v6.frontends[0].vip = ip("2001:2::9");
    let builds = [
        vec![spec("a", 1, &[1]), spec("b", 2, &[2])],
        vec![spec("b", 2, &[2]), udp.clone(), spec("c", 3, &[3]), v6],
        vec![udp, spec("a", 1, &[1])],
    ];
    for specs in &builds {
        let s = b.build(specs, &l2).unwrap();
        for vip in 0..=10u8 {
            for (protocol, port) in [
                (Protocol::Tcp, 80),
                (Protocol::Udp, 80),
                (Protocol::Tcp, 53),
                (Protocol::Udp, 53),
                (Protocol::Sctp, 80),
            ] {
                let fe = Frontend {
                    vip: IpAddr::from([198, 18, 100, vip]),
                    protocol,
                    port,
                };
                let bits = u32::from_be_bytes([198, 18, 100, vip]);
                let got = s.service_for_v4(bits, protocol, port).map(|x| x.id);
                assert_eq!(got, s.service_for(&fe).map(|x| x.id), "{fe:?}");
            }
        }
        let served = specs
            .iter()
            .flat_map(|x| &x.frontends)
            .filter(|f| f.vip.is_ipv4())
            .filter(|f| {
                let IpAddr::V4(a) = f.vip else { return false };
                s.service_for_v4(a.to_bits(), f.protocol, f.port).is_some()
            })
            .count();
        assert_eq!(
            served,
            specs
                .iter()
                .flat_map(|x| &x.frontends)
                .filter(|f| f.vip.is_ipv4())
                .count()
        );
    }
    // An IPv6 frontend is not found through the IPv4 lookup of its address's low bits.
    let s = b.build(&builds[1], &l2).unwrap();
    assert!(s.service_for_v4(9, Protocol::Tcp, 80).is_none());
}

/// `schedule` says why a service found no backend (no backends, all drained), with and
/// without ClientIP affinity, and an affine service keeps a client on its backend.
#[test]
fn schedule_says_why_no_backend_with_and_without_affinity() {
    let mut b = SnapshotBuilder::new(1024, 251);
    let mut specs = vec![spec("empty", 1, &[]), spec("drained", 2, &[1, 2])];
    specs.push(spec("affine", 3, &[3, 4]));
    for s in &mut specs[1].backends {
        s.weight = 0;
    }
    let mut affine = specs.clone();
    for (i, s) in affine.iter_mut().enumerate() {
        s.name.push_str("-affine");
        s.frontends[0].vip = IpAddr::from([198, 18, 101, i as u8 + 1]);
        s.affinity_timeout = Some(std::time::Duration::from_secs(60));
    }
    specs.extend(affine);
    let s = b.build(&specs, &L2Table::default()).unwrap();
    let epoch = Instant::now();
    let affinity = AffinityTable::new(16, epoch);
    let flow = client_flow("198.18.100.1");
    let pick = |name: &str| {
        let svc = s.services.iter().find(|x| x.name == name).unwrap();
        svc.schedule(&flow, &NoCounts, &affinity, epoch)
    };
    for suffix in ["", "-affine"] {
        assert_eq!(pick(&format!("empty{suffix}")), Err(NoBackend::Empty));
        assert_eq!(
            pick(&format!("drained{suffix}")),
            Err(NoBackend::AllDrained)
        );
    }
    // Round robin moves on; affinity keeps the client where its first flow went.
    assert_eq!((pick("affine"), pick("affine")), (Ok(0), Ok(1)));
    assert_eq!(
        (pick("affine-affine"), pick("affine-affine")),
        (Ok(0), Ok(0))
    );
}
