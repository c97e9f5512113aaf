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
//! # When a removal takes effect
//!
//! The cause decides ([`Controller::note_explicit_removals`]):
//! - **Vanished from the Kubernetes source** (and not judged down): it acts as removed only
//!   once it has been absent for `[flowtable] removal_grace` ([`Retirees`]): control-plane
//!   churn (an endpoint moving between EndpointSlices, whose removal arrives one
//!   `min_sync_period` before its addition) must not end flows, and a backend that comes
//!   back within the grace keeps its id and its flows.
//! - **Removed explicitly**: by the operator (every removal of the static source is a
//!   reload's), or a backend health checks already judged down when it left. Nothing is
//!   churn there: it is removed by the pass right after the publish that drops it, so a UDP
//!   flow's next datagram goes to a live backend at once (within milliseconds of the
//!   reload; the grace would blackhole it for seconds).
//! - **Adopted ids nothing claimed** after a restart: like a vanished endpoint (the grace).
//!
//! The second pass, a second after the first, catches a flow a worker inserted with the
//! previous snapshot while the first pass ran. Only after it are retired ids whose grace is
//! over and whose counts reached zero handed back to the builder for reuse.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Retired backend ids and since when they are absent, for the removal grace.
#[derive(Debug, Default)]
pub struct Retirees {
    since: HashMap<BackendId, Retiree>,
}

#[derive(Clone, Copy, Debug)]
struct Retiree {
    since: Instant,
    /// Removal passes run on it since its grace ended (two: first and second).
    passes: u8,
    /// Removed explicitly: no grace.
    explicit: bool,
}

impl Retiree {
    fn due(&self, now: Instant, grace: Duration) -> bool {
        self.explicit || now >= self.since + grace
    }
}

impl Retirees {
    /// Follows the builder's retired ids at `now`: new ones start their grace, ones that
    /// came back (or were reclaimed) are forgotten.
    pub fn update(&mut self, retired: impl Iterator<Item = BackendId>, now: Instant) {
        let current: HashSet<BackendId> = retired.collect();
        self.since.retain(|id, _| current.contains(id));
        for id in current {
            self.since.entry(id).or_insert(Retiree {
                since: now,
                passes: 0,
                explicit: false,
            });
        }
    }

    /// Ends the grace of the tracked ids among `ids`: they were removed explicitly.
    pub fn expedite(&mut self, ids: &HashSet<BackendId>) {
        for id in ids {
            if let Some(r) = self.since.get_mut(id) {
                r.explicit = true;
            }
        }
    }

    /// Whether `id` is tracked (in its grace or past it).
    pub fn tracks(&self, id: BackendId) -> bool {
        self.since.contains_key(&id)
    }

    /// The ids removed explicitly or absent for at least `grace` at `now`.
    pub fn due(&self, now: Instant, grace: Duration) -> HashSet<BackendId> {
        self.since
            .iter()
            .filter(|(_, r)| r.due(now, grace))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether an id fell due at or before `now` and no pass has run on it since.
    pub fn newly_due(&self, now: Instant, grace: Duration) -> bool {
        self.since
            .values()
            .any(|r| r.passes == 0 && r.due(now, grace))
    }

    /// Records a pass over the ids due at `now`.
    pub fn passed(&mut self, now: Instant, grace: Duration) {
        for r in self.since.values_mut() {
            if r.due(now, grace) {
                r.passes = r.passes.saturating_add(1);
            }
        }
    }

    /// Ids tracked (in their grace or past it).
    pub fn len(&self) -> usize {
        self.since.len()
    }

    /// Whether none is tracked.
    pub fn is_empty(&self) -> bool {
        self.since.is_empty()
    }
}

impl super::Controller {
    /// After a build that retired ids, before its snapshot replaces the current one: notes
    /// which of the ids it retired were removed explicitly (see the module doc), so that
    /// the pass after its publish handles them without a grace.
    pub(super) fn note_explicit_removals(&mut self) {
        let fresh: HashSet<BackendId> = self
            .builder
            .retired()
            .filter(|id| !self.retirees.tracks(*id))
            .collect();
        let Some(old) = self.current.as_ref().map(Arc::clone) else {
            return;
        };
        if fresh.is_empty() {
            return;
        }
        // Every change of the static source's services is a reload's: the operator's.
        let operator = self.cfg.kubernetes.is_none();
        let health = &self.health;
        for s in old.services.iter() {
            for b in &s.backends {
                let judged_down =
                    health.is_down(&s.name, b.addr) || health.left_down(&s.name, b.addr);
                if fresh.contains(&b.id) && (operator || judged_down) {
                    self.expedite.insert(b.id);
                }
            }
        }
    }
}

/// Applies the endpoint-removal policy (module docs) to the flow table: `retired` are the
/// backend ids to handle as removed (retired and past their grace), `snap` says which
/// listed backends are unusable.
pub fn end_removed_flows(
    flows: &FlowTable,
    retired: &HashSet<BackendId>,
    snap: &Snapshot,
    policy: RemovedBackendPolicy,
) -> Removal {
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

/// Hands the retired ids of `due` that no flow holds back to the builder; returns how many.
pub fn reclaim_ids(
    flows: &FlowTable,
    builder: &mut SnapshotBuilder,
    due: &HashSet<BackendId>,
) -> usize {
    builder.reclaim(|id| !due.contains(&id) || flows.active(id) + flows.inactive(id) > 0)
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
        let all = lab.builder.retired().collect();
        assert_eq!(reclaim_ids(&lab.flows, &mut lab.builder, &all), 2);
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
        let all = lab.builder.retired().collect();
        assert_eq!(reclaim_ids(&lab.flows, &mut lab.builder, &all), 0);
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

#[cfg(test)]
mod grace_tests {
    use super::*;

    #[test]
    fn retirees_are_due_only_after_the_grace() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(3);
        let mut r = Retirees::default();
        r.update([BackendId(1), BackendId(2)].into_iter(), t0);
        assert!(r.due(t0 + Duration::from_secs(2), grace).is_empty());
        assert!(!r.newly_due(t0 + Duration::from_secs(2), grace));
        // .2 comes back (no longer retired) before the grace ends: forgotten.
        r.update([BackendId(1)].into_iter(), t0 + Duration::from_secs(2));
        // A later update does not restart .1's grace.
        r.update(
            [BackendId(1), BackendId(3)].into_iter(),
            t0 + Duration::from_millis(2500),
        );
        let at = t0 + Duration::from_secs(3);
        assert_eq!(r.due(at, grace), HashSet::from([BackendId(1)]));
        assert!(r.newly_due(at, grace));
        r.passed(at, grace);
        assert!(!r.newly_due(at, grace), "a pass ran on it");
        assert!(
            r.newly_due(t0 + Duration::from_millis(5500), grace),
            ".3's turn"
        );
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn expedited_ids_are_due_at_once() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(3);
        let mut r = Retirees::default();
        r.update([BackendId(1), BackendId(2)].into_iter(), t0);
        // Only tracked ids can be expedited; the others are unknown here.
        r.expedite(&HashSet::from([BackendId(2), BackendId(9)]));
        assert!(!r.tracks(BackendId(9)));
        assert_eq!(r.due(t0, grace), HashSet::from([BackendId(2)]));
        assert!(r.newly_due(t0, grace));
        r.passed(t0, grace);
        assert!(!r.newly_due(t0, grace), "its pass ran");
        // .1 keeps its grace.
        assert_eq!(
            r.due(t0 + grace, grace),
            HashSet::from([BackendId(1), BackendId(2)])
        );
    }
}
