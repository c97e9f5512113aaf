//! What the XDP steering programs must redirect for a snapshot: pure data, computed by the
//! controller, written into the BPF maps by the driver.

use std::net::IpAddr;

use config::{Cidr, Dataplane, Mode};
use fastpath::snapshot::Snapshot;

/// An (address, IP protocol number, port) the steering program matches.
pub type SteerKey = (IpAddr, u8, u16);

/// The steering maps' contents for one snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SteerSet {
    /// Every frontend (VIP, protocol, port), sorted, no duplicates.
    pub frontends: Vec<SteerKey>,
    /// The ClusterIPs: every TCP/UDP/SCTP port of theirs is redirected (the pipeline rejects
    /// the ports no frontend serves).
    pub cluster_ips: Vec<IpAddr>,
    /// The Service CIDRs: TCP/UDP/SCTP to an address inside one is redirected (the pipeline
    /// drops what no Service has).
    pub service_cidrs: Vec<Cidr>,
    /// Every backend of a nat-mode service (its replies come back through the node), sorted.
    pub backends: Vec<SteerKey>,
    /// The full-NAT source addresses; replies to them in `snat_ports` are redirected.
    pub snat_addresses: Vec<IpAddr>,
    /// The full-NAT port range, first and last.
    pub snat_ports: (u16, u16),
}

impl SteerSet {
    /// What `snap` owns, with the dataplane's SNAT addresses and ports.
    pub fn of(snap: &Snapshot, dp: &Dataplane) -> SteerSet {
        let mut frontends = Vec::new();
        let mut backends = Vec::new();
        for s in snap.services.iter() {
            for f in &s.frontends {
                frontends.push((f.vip, f.protocol.ip_proto(), f.port));
                if s.mode == Mode::Nat {
                    for b in &s.backends {
                        backends.push((b.addr.ip(), f.protocol.ip_proto(), b.addr.port()));
                    }
                }
            }
        }
        frontends.sort_unstable();
        frontends.dedup();
        backends.sort_unstable();
        backends.dedup();
        let r = dp.snat_port_range;
        SteerSet {
            frontends,
            cluster_ips: snap.cluster_ips().collect(),
            service_cidrs: snap.service_cidrs().to_vec(),
            backends,
            snat_addresses: dp.snat_addresses.clone(),
            snat_ports: (r.first, r.last),
        }
    }
}
