//! A small lab for the controller's tests: the two-service config below, a flow table and
//! a pipeline driven frame by frame (no sockets, no root).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use fastpath::pipeline::{Pipeline, PipelineConfig, Verdict};
use fastpath::settings::flow_table_config;
use fastpath::snapshot::{L2Table, Neighbour, ServiceSpec, SnapshotBuilder};
use flowtable::FlowTable;
use lb_algos::AffinityTable;

use super::removal::{Removal, end_removed_flows};

/// Two services (UDP dns, TCP web), two backends each, nat mode.
pub const CFG: &str = r#"
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
pub fn packet(udp: bool, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, flags: u8) -> Vec<u8> {
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
pub fn frame(udp: bool, sport: u16, vip: [u8; 4], dport: u16, flags: u8) -> Vec<u8> {
    packet(udp, [198, 18, 0, 2], sport, vip, dport, flags)
}

pub fn dst_of(f: &[u8]) -> IpAddr {
    IpAddr::from([f[30], f[31], f[32], f[33]])
}

/// A pipeline over the config's services, with the builder and specs that made its snapshot.
pub struct Lab {
    pub cfg: config::Config,
    pub builder: SnapshotBuilder,
    pub specs: Vec<ServiceSpec>,
    pub flows: Arc<FlowTable>,
    pub pipeline: Pipeline,
    pub l2: L2Table,
    pub now: Instant,
}

impl Lab {
    pub fn new() -> Lab {
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

    pub fn send(&mut self, f: &[u8]) -> Option<IpAddr> {
        let mut f = f.to_vec();
        match self.pipeline.process(&mut f, self.now) {
            Verdict::Tx(_) => Some(dst_of(&f)),
            _ => None,
        }
    }

    pub fn rebuild(&mut self) -> Removal {
        let snap = Arc::new(self.builder.build(&self.specs, &self.l2).unwrap());
        self.pipeline.set_snapshot(Arc::clone(&snap));
        // No grace here: every retired id counts as removed.
        let retired = self.builder.retired().collect();
        end_removed_flows(
            &self.flows,
            &retired,
            &snap,
            self.cfg.flowtable.removed_backend_tcp,
        )
    }
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
