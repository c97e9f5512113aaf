//! What the daemon does to flows when backends change, and the passive health check.
//!
//! # Endpoint removal (run after every snapshot publish, and once more a second later)
//!
//! - A backend that left its service (deleted from the static config, or gone from the
//!   EndpointSlices; the builder *retires* its id):
//!   - its UDP flows are removed, so the client's next datagram is scheduled again at once
//!     (the stale-UDP-conntrack blackhole is the most reported kube-proxy bug class);
//!   - its TCP and SCTP flows are ended when `[flowtable] removed_backend_tcp = "expire"`
//!     (the default: the next packet finds no flow and is dropped as `no_flow`, so the
//!     client fails fast instead of talking to an address that is gone), or left to run
//!     out with `"keep"`.
//! - A backend still listed but taking no new flows (terminating, not ready, failing its
//!   health checks): its TCP/SCTP flows continue until they end; its UDP flows are re-steered
//!   when the service has a backend that takes new flows (otherwise re-steering could only
//!   drop them). Weight 0 is a drain (IPVS's quiescent server): every flow continues.
//!
//! The second pass catches a flow a worker inserted with the previous snapshot while the
//! first pass ran. Only after it are retired ids whose counts reached zero handed back to
//! the builder for reuse.
//!
//! # Passive health
//!
//! Every second each backend's SYN / SYN-ACK counters ([`fastpath::passive::SynWatch`]) are
//! sampled; a second in which at least [`PASSIVE_MIN_SYNS`] SYNs that had a whole second to be
//! answered got no SYN-ACK at all counts as one failed check towards the health checker's
//! `fall` threshold.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use config::RemovedBackendPolicy;
use fastpath::passive::{Passive, SynWatch};
use fastpath::snapshot::{Snapshot, SnapshotBuilder};
use flowtable::{FlowTable, Protocol};
use lb_algos::{BackendId, ConnCounts};

/// SYNs without a SYN-ACK in one period that make it a failed passive check.
pub const PASSIVE_MIN_SYNS: u32 = 3;

/// What one pass of [`end_removed_flows`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removal {
    /// UDP flows removed so their next packet is scheduled again.
    pub resteered: u64,
    /// TCP/SCTP flows of removed backends ended.
    pub ended: u64,
}

/// Applies the endpoint-removal policy (module docs) to the flow table, given the builder
/// that built `snap` (for its retired ids).
pub fn end_removed_flows(
    flows: &FlowTable,
    builder: &SnapshotBuilder,
    snap: &Snapshot,
    policy: RemovedBackendPolicy,
) -> Removal {
    let retired: HashSet<BackendId> = builder.retired().collect();
    let mut unusable: HashSet<BackendId> = HashSet::new();
    for s in &snap.services {
        if s.backends.iter().any(|b| b.usable && b.weight > 0) {
            unusable.extend(s.backends.iter().filter(|b| !b.usable).map(|b| b.id));
        }
    }
    let held = |id: &BackendId| flows.active(*id) + flows.inactive(*id) > 0;
    let mut out = Removal::default();
    if !retired.iter().chain(&unusable).any(held) {
        return out;
    }
    flows.scan(0, flows.capacity(), |v| {
        let id = v.data.backend_id;
        let udp = v.data.proto == Protocol::Udp;
        let resteer = udp && (retired.contains(&id) || unusable.contains(&id));
        let end = !udp
            && v.data.proto != Protocol::Icmp
            && policy == RemovedBackendPolicy::Expire
            && retired.contains(&id);
        if (resteer || end) && flows.remove(v.handle).is_some() {
            if resteer {
                out.resteered += 1;
            } else {
                out.ended += 1;
            }
        }
    });
    out
}

/// Hands retired ids that no flow holds back to the builder; returns how many.
pub fn reclaim_ids(flows: &FlowTable, builder: &mut SnapshotBuilder) -> usize {
    builder.reclaim(|id| flows.active(id) + flows.inactive(id) > 0)
}

/// The passive check's state per backend.
#[derive(Debug, Default)]
pub struct PassiveHealth {
    by_id: HashMap<BackendId, Passive>,
}

impl PassiveHealth {
    /// Samples every backend of `snap` once (call once per second); returns the addresses
    /// whose period failed, each once.
    pub fn sample(&mut self, watch: &SynWatch, snap: &Snapshot) -> Vec<SocketAddr> {
        let mut seen = HashSet::new();
        let mut failed = Vec::new();
        for b in snap.services.iter().flat_map(|s| s.backends.iter()) {
            if !seen.insert(b.id) {
                continue;
            }
            let p = self.by_id.entry(b.id).or_default();
            if p.observe(watch.sample(b.id), PASSIVE_MIN_SYNS) {
                failed.push(b.addr);
            }
        }
        self.by_id.retain(|id, _| seen.contains(id));
        failed
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::Arc;
    use std::time::Instant;

    use fastpath::pipeline::{Pipeline, PipelineConfig, Verdict, flow_table_config};
    use fastpath::snapshot::{L2Table, Neighbour, ServiceSpec};
    use lb_algos::AffinityTable;

    use super::*;

    const CFG: &str = r#"
[dataplane]
mode = "nat"
[[services]]
name = "dns"
vip = "198.18.100.53"
port = 53
protocol = "udp"
scheduler = "rr"
backends = [{ addr = "198.18.1.1:53" }, { addr = "198.18.1.2:53" }]
[[services]]
name = "web"
vip = "198.18.100.80"
port = 80
protocol = "tcp"
scheduler = "rr"
backends = [{ addr = "198.18.1.1:80" }, { addr = "198.18.1.2:80" }]
"#;

    /// An Ethernet + IPv4 + UDP/TCP frame from `src`:`sport` to `dst`:`dport`.
    fn packet(udp: bool, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, flags: u8) -> Vec<u8> {
        let ip = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0, 1])
            .ipv4(src, dst, 64);
        let mut out = Vec::new();
        if udp {
            ip.udp(sport, dport).write(&mut out, &[0u8; 8]).unwrap();
        } else {
            let mut b = ip.tcp(sport, dport, 1000, 65535);
            if flags & 0x02 != 0 {
                b = b.syn();
            }
            if flags & 0x10 != 0 {
                b = b.ack(1);
            }
            b.write(&mut out, &[]).unwrap();
        }
        out
    }

    /// A client packet from 198.18.0.2.
    fn frame(udp: bool, sport: u16, vip: [u8; 4], dport: u16, flags: u8) -> Vec<u8> {
        packet(udp, [198, 18, 0, 2], sport, vip, dport, flags)
    }

    fn dst_of(f: &[u8]) -> IpAddr {
        IpAddr::from([f[30], f[31], f[32], f[33]])
    }

    struct Lab {
        cfg: config::Config,
        builder: SnapshotBuilder,
        specs: Vec<ServiceSpec>,
        flows: Arc<FlowTable>,
        pipeline: Pipeline,
        l2: L2Table,
        now: Instant,
    }

    impl Lab {
        fn new() -> Lab {
            let cfg = config::parse(CFG, "t.toml").unwrap();
            let now = Instant::now();
            let flows = Arc::new(FlowTable::new(flow_table_config(&cfg), now).unwrap());
            let mut builder = SnapshotBuilder::from_config(&cfg);
            let specs = ServiceSpec::from_config(&cfg);
            let l2 = L2Table {
                neighbours: ["198.18.1.1", "198.18.1.2", "198.18.1.3", "198.18.0.2"]
                    .iter()
                    .map(|ip| Neighbour {
                        ip: ip.parse().unwrap(),
                        mac: [2, 0, 0, 0, 0, 1],
                        port: None,
                    })
                    .collect(),
                ..L2Table::default()
            };
            let snap = Arc::new(builder.build(&specs, &l2).unwrap());
            let pipeline = Pipeline::new(
                PipelineConfig::from_config(&cfg, 0, 1),
                Arc::clone(&flows),
                Arc::new(AffinityTable::new(64, now)),
                snap,
            );
            Lab {
                cfg,
                builder,
                specs,
                flows,
                pipeline,
                l2,
                now,
            }
        }

        fn send(&mut self, f: &[u8]) -> Option<IpAddr> {
            let mut f = f.to_vec();
            match self.pipeline.process(&mut f, self.now) {
                Verdict::Tx(_) => Some(dst_of(&f)),
                _ => None,
            }
        }

        fn rebuild(&mut self) -> Removal {
            let snap = Arc::new(self.builder.build(&self.specs, &self.l2).unwrap());
            self.pipeline.set_snapshot(Arc::clone(&snap));
            end_removed_flows(
                &self.flows,
                &self.builder,
                &snap,
                self.cfg.flowtable.removed_backend_tcp,
            )
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn udp_flows_of_a_removed_backend_are_resteered_at_once_and_tcp_ones_expire() {
        let mut lab = Lab::new();
        let dns = [198, 18, 100, 53];
        let web = [198, 18, 100, 80];
        // rr: client ports 1000 and 1001 go to .1 and .2, for both services.
        assert_eq!(
            lab.send(&frame(true, 1000, dns, 53, 0)),
            Some(ip("198.18.1.1"))
        );
        assert_eq!(
            lab.send(&frame(true, 1001, dns, 53, 0)),
            Some(ip("198.18.1.2"))
        );
        assert_eq!(
            lab.send(&frame(false, 2000, web, 80, 0x02)),
            Some(ip("198.18.1.1"))
        );
        assert_eq!(
            lab.send(&frame(false, 2001, web, 80, 0x02)),
            Some(ip("198.18.1.2"))
        );
        // Backend .1 leaves both services.
        for s in &mut lab.specs {
            s.backends.remove(0);
        }
        let r = lab.rebuild();
        assert_eq!(
            r,
            Removal {
                resteered: 1,
                ended: 1
            }
        );
        // The UDP flow's next datagram goes to the remaining backend; the other flows stay.
        assert_eq!(
            lab.send(&frame(true, 1000, dns, 53, 0)),
            Some(ip("198.18.1.2"))
        );
        assert_eq!(
            lab.send(&frame(true, 1001, dns, 53, 0)),
            Some(ip("198.18.1.2"))
        );
        assert_eq!(
            lab.send(&frame(false, 2001, web, 80, 0x10)),
            Some(ip("198.18.1.2"))
        );
        // The ended TCP flow's next segment has no flow: dropped, never sent to .1.
        assert_eq!(lab.send(&frame(false, 2000, web, 80, 0x10)), None);
        // A second pass finds nothing more; the retired ids are then reclaimable.
        assert_eq!(lab.rebuild(), Removal::default());
        assert_eq!(reclaim_ids(&lab.flows, &mut lab.builder), 2);
    }

    #[test]
    fn keep_policy_and_unusable_backends() {
        let mut lab = Lab::new();
        lab.cfg.flowtable.removed_backend_tcp = RemovedBackendPolicy::Keep;
        let dns = [198, 18, 100, 53];
        let web = [198, 18, 100, 80];
        assert_eq!(
            lab.send(&frame(true, 1000, dns, 53, 0)),
            Some(ip("198.18.1.1"))
        );
        assert_eq!(
            lab.send(&frame(false, 2000, web, 80, 0x02)),
            Some(ip("198.18.1.1"))
        );
        // .1 stops taking new flows (terminating, unhealthy) in both services.
        for s in &mut lab.specs {
            s.backends[0].usable = false;
        }
        let r = lab.rebuild();
        assert_eq!(
            r,
            Removal {
                resteered: 1,
                ended: 0
            }
        );
        assert_eq!(
            lab.send(&frame(true, 1000, dns, 53, 0)),
            Some(ip("198.18.1.2"))
        );
        // TCP to a terminating backend continues.
        assert_eq!(
            lab.send(&frame(false, 2000, web, 80, 0x10)),
            Some(ip("198.18.1.1"))
        );
        // Removed under "keep": TCP still continues, nothing is reclaimed while it lives.
        lab.specs[1].backends.remove(0);
        assert_eq!(lab.rebuild(), Removal::default());
        assert_eq!(
            lab.send(&frame(false, 2000, web, 80, 0x10)),
            Some(ip("198.18.1.1"))
        );
        assert_eq!(reclaim_ids(&lab.flows, &mut lab.builder), 0);
        // With no usable alternative, UDP flows of an unusable backend stay.
        let mut lab = Lab::new();
        assert_eq!(
            lab.send(&frame(true, 1000, dns, 53, 0)),
            Some(ip("198.18.1.1"))
        );
        for b in &mut lab.specs[0].backends {
            b.usable = false;
        }
        assert_eq!(lab.rebuild(), Removal::default());
        assert_eq!(
            lab.send(&frame(true, 1000, dns, 53, 0)),
            Some(ip("198.18.1.1"))
        );
    }

    #[test]
    fn passive_health_reports_a_backend_that_never_answers_syns() {
        let mut lab = Lab::new();
        let watch = Arc::new(SynWatch::new(lab.cfg.flowtable.backends_max as usize));
        lab.pipeline.set_syn_watch(Arc::clone(&watch));
        let web = [198, 18, 100, 80];
        let mut passive = PassiveHealth::default();
        let snap = Arc::clone(lab.pipeline.snapshot());
        assert!(passive.sample(&watch, &snap).is_empty());
        // Ten SYNs, rr over .1 and .2; only .2 answers (a SYN-ACK from the backend).
        for p in 0..10u16 {
            lab.send(&frame(false, 3000 + p, web, 80, 0x02));
        }
        for p in (1..10u16).step_by(2) {
            let fixed = packet(false, [198, 18, 1, 2], 80, [198, 18, 0, 2], 3000 + p, 0x12);
            assert!(lab.send(&fixed).is_some(), "SYN-ACK of flow {p} forwarded");
        }
        assert!(
            passive.sample(&watch, &snap).is_empty(),
            "too young to judge"
        );
        assert_eq!(
            passive.sample(&watch, &snap),
            vec!["198.18.1.1:80".parse().unwrap()]
        );
    }
}
