//! The passive health check: every second each backend's SYN / SYN-ACK counters
//! ([`fastpath::passive::SynWatch`]) are sampled; a second in which at least
//! [`PASSIVE_MIN_SYNS`] SYNs that had a whole second to be answered got no SYN-ACK at all
//! counts as one failed check towards the health checker's `fall` threshold.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use fastpath::passive::{Passive, SynWatch};
use fastpath::snapshot::Snapshot;
use lb_algos::BackendId;

/// SYNs without a SYN-ACK in one period that make it a failed passive check.
pub const PASSIVE_MIN_SYNS: u32 = 3;

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
    use std::sync::Arc;

    use super::*;
    use crate::controller::testlab::{Lab, frame, packet};

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
