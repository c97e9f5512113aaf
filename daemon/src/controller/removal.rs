//! What the controller does to flows when backends change.
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

use std::collections::HashSet;

use config::RemovedBackendPolicy;
use fastpath::snapshot::{Snapshot, SnapshotBuilder};
use flowtable::{FlowTable, Protocol};
use lb_algos::{BackendId, ConnCounts};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::testlab::{Lab, frame, ip};
    use config::RemovedBackendPolicy;

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
}
