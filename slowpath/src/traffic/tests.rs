use std::time::Duration;

use config::{Mode, Protocol, SchedulerKind};
use fastpath::snapshot::{BackendSpec, Frontend, L2Table, ServiceSpec, SnapshotBuilder};

use super::*;

fn spec(name: &str, vip: &str, backends: &[&str]) -> ServiceSpec {
    ServiceSpec {
        name: name.to_owned(),
        frontends: vec![Frontend {
            vip: vip.parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 80,
        }],
        scheduler: SchedulerKind::Rr,
        flags: Vec::new(),
        mode: Mode::Fullnat,
        affinity_timeout: None,
        backends: backends
            .iter()
            .map(|a| BackendSpec {
                addr: a.parse().unwrap(),
                weight: 1,
                usable: true,
            })
            .collect(),
        source_ranges: Vec::new(),
        rate_limit: None,
        frozen: false,
        synproxy: Default::default(),
        health: Default::default(),
        no_endpoints: fastpath::snapshot::NoEndpoints::Reject,
        cluster_ip: false,
    }
}

struct Rig {
    builder: SnapshotBuilder,
    workers: Vec<Arc<Traffic>>,
    meter: TrafficMeter,
    t0: Instant,
}

impl Rig {
    fn new() -> Rig {
        let workers: Vec<Arc<Traffic>> = (0..2).map(|_| Traffic::new()).collect();
        Rig {
            builder: SnapshotBuilder::new(8, 251),
            meter: TrafficMeter::new(workers.clone()),
            workers,
            t0: Instant::now(),
        }
    }

    fn build(&mut self, specs: &[ServiceSpec]) -> Snapshot {
        self.builder.build(specs, &L2Table::default()).unwrap()
    }

    /// `n` packets of 100 bytes each way and one connection for backend `addr` of `service`,
    /// split over the workers.
    fn traffic(&self, snap: &Snapshot, service: &str, addr: &str, n: u64) {
        let id = id_of(snap, service, addr);
        self.workers[0].connection(id);
        for i in 0..n {
            let w = &self.workers[i as usize % self.workers.len()];
            w.packet(id, false, 100);
            w.packet(id, true, 100);
        }
    }
}

fn id_of(snap: &Snapshot, service: &str, addr: &str) -> BackendId {
    let addr: SocketAddr = addr.parse().unwrap();
    let s = snap.services.iter().find(|s| s.name == service).unwrap();
    s.backends.iter().find(|b| b.addr == addr).unwrap().id
}

fn entry<'a>(snap: &'a Snapshot, service: &str) -> &'a ServiceEntry {
    snap.services.iter().find(|s| s.name == service).unwrap()
}

#[test]
fn totals_are_read_live_and_rates_come_from_samples() {
    let mut r = Rig::new();
    let snap = r.build(&[spec(
        "web",
        "198.18.0.10",
        &["198.18.1.1:80", "198.18.1.2:80"],
    )]);
    r.meter.sample(&snap, r.t0);
    r.traffic(&snap, "web", "198.18.1.1:80", 10);
    // Not sampled yet: totals are there, rates are not.
    let t = r.meter.service(entry(&snap, "web"));
    assert_eq!(t.backends[0].counts.in_pkts, 10);
    assert_eq!(t.backends[0].counts.out_bytes, 1000);
    assert_eq!(t.backends[0].counts.conns, 1);
    assert_eq!(t.backends[1].counts, TrafficCounts::default());
    assert_eq!(t.total.counts.in_pkts, 10);
    assert_eq!(t.total.rate, Rates::default());
    r.meter.sample(&snap, r.t0 + Duration::from_secs(2));
    let t = r.meter.service(entry(&snap, "web"));
    assert_eq!(t.backends[0].rate.in_pps, 5.0);
    assert_eq!(t.backends[0].rate.out_bps, 500.0);
    assert_eq!(t.backends[0].rate.cps, 0.5);
    assert_eq!(t.total.rate.in_pps, 5.0);
    // Quiet for the next period: the rate falls to zero, the totals stay.
    r.meter.sample(&snap, r.t0 + Duration::from_secs(4));
    let t = r.meter.service(entry(&snap, "web"));
    assert_eq!(t.backends[0].rate.in_pps, 0.0);
    assert_eq!(t.total.counts.in_pkts, 10);
}

#[test]
fn a_backend_that_leaves_stays_in_its_service_and_its_id_starts_afresh_elsewhere() {
    let mut r = Rig::new();
    let s1 = r.build(&[
        spec("web", "198.18.0.10", &["198.18.1.1:80", "198.18.1.2:80"]),
        spec("db", "198.18.0.11", &["198.18.2.1:80"]),
    ]);
    r.meter.sample(&s1, r.t0);
    r.traffic(&s1, "web", "198.18.1.1:80", 7);
    r.traffic(&s1, "web", "198.18.1.2:80", 3);
    let gone = id_of(&s1, "web", "198.18.1.1:80");
    // 198.18.1.1 leaves web.
    let s2 = r.build(&[
        spec("web", "198.18.0.10", &["198.18.1.2:80"]),
        spec("db", "198.18.0.11", &["198.18.2.1:80"]),
    ]);
    r.meter.sample(&s2, r.t0 + Duration::from_secs(2));
    let web = r.meter.service(entry(&s2, "web"));
    assert_eq!(web.backends.len(), 1);
    assert_eq!(web.backends[0].counts.in_pkts, 3);
    assert_eq!(
        web.total.counts.in_pkts, 10,
        "the departed backend's 7 stay"
    );
    // Its id, once reused for another service's new backend, counts from zero there.
    let mut s3 = None;
    for _ in 0..4 {
        // (Retired ids are kept for a while for a returning backend; build until reused.)
        let s = r.build(&[
            spec("web", "198.18.0.10", &["198.18.1.2:80"]),
            spec("db", "198.18.0.11", &["198.18.2.1:80", "198.18.2.9:80"]),
        ]);
        if id_of(&s, "db", "198.18.2.9:80") == gone {
            s3 = Some(s);
            break;
        }
        s3 = Some(s);
    }
    let s3 = s3.unwrap();
    r.meter.sample(&s3, r.t0 + Duration::from_secs(4));
    let db = r.meter.service(entry(&s3, "db"));
    assert_eq!(db.backends[1].counts, TrafficCounts::default());
    assert_eq!(db.total.counts.in_pkts, 0);
    r.traffic(&s3, "db", "198.18.2.9:80", 2);
    let db = r.meter.service(entry(&s3, "db"));
    assert_eq!(db.backends[1].counts.in_pkts, 2);
    let web = r.meter.service(entry(&s3, "web"));
    assert_eq!(web.total.counts.in_pkts, 10);
}

#[test]
fn a_backend_that_returns_is_not_counted_twice_in_its_service() {
    let mut r = Rig::new();
    let both = [spec(
        "web",
        "198.18.0.10",
        &["198.18.1.1:80", "198.18.1.2:80"],
    )];
    let s1 = r.build(&both);
    r.meter.sample(&s1, r.t0);
    r.traffic(&s1, "web", "198.18.1.1:80", 4);
    let s2 = r.build(&[spec("web", "198.18.0.10", &["198.18.1.2:80"])]);
    r.meter.sample(&s2, r.t0 + Duration::from_secs(2));
    let s3 = r.build(&both);
    r.meter.sample(&s3, r.t0 + Duration::from_secs(4));
    let web = r.meter.service(entry(&s3, "web"));
    assert_eq!(web.total.counts.in_pkts, 4);
    r.traffic(&s3, "web", "198.18.1.1:80", 1);
    let web = r.meter.service(entry(&s3, "web"));
    assert_eq!(web.total.counts.in_pkts, 5);
    assert_eq!(
        web.backends[0].counts.in_pkts, 1,
        "the returned backend counts afresh"
    );
}
