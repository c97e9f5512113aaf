//! What the controller knows of the health checker's judgements
//! ([`slowpath::health::Judgement`]), and what it makes of them.
//!
//! - **Forwarding** trusts every backend that is not judged down: a backend the checker has
//!   not judged yet (unknown) takes new flows at once, as kube-proxy trusts a ready endpoint.
//!   Only a change of the down set is a reason to publish a snapshot.
//! - **Announcing** trusts only what was verified ([`HealthState::unverified`]): a backend
//!   the checker probes counts for BGP once a probe has passed (up); one it does not probe
//!   (`[health] probe = "none"`, or a Kubernetes endpoint, whose readiness comes from its
//!   EndpointSlice) counts when it is ready per its source. Every target starts unknown in
//!   each process: an adopted flow table verifies nothing, the first probe does.
//! - **Which probe.** The checker runs with the `[health] probe` the daemon started with (a
//!   reload does not restart it), so that one, not the reloaded config's, says whether the
//!   targets are probed.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use slowpath::health::Judgement;

/// The health checker's judgements as the controller keeps them.
#[derive(Debug, Default)]
pub(super) struct HealthState {
    /// The checker probes its targets (`[health] probe` at start is not `none`).
    probing: bool,
    /// The backends the checker was last told to check.
    targets: Vec<SocketAddr>,
    /// Its last judgement of every target it reported (absent: unknown).
    judged: HashMap<SocketAddr, Judgement>,
    /// Backends judged down: they take no new flows.
    down: HashSet<SocketAddr>,
    /// Targets no probe has passed yet (sorted): they take flows but announce nothing.
    unverified: Vec<SocketAddr>,
    /// Changes whenever `unverified` does, so the announcement is rendered again.
    epoch: u64,
}

impl HealthState {
    /// For a checker that probes (`probing`) or not.
    pub(super) fn new(probing: bool) -> HealthState {
        HealthState {
            probing,
            ..HealthState::default()
        }
    }

    /// The checker was told to check `targets` (sorted, deduplicated). It forgets the
    /// others, and starts one that comes back unknown: so does this.
    pub(super) fn set_targets(&mut self, targets: &[SocketAddr]) {
        self.targets = targets.to_vec();
        let kept = |a: &SocketAddr| targets.binary_search(a).is_ok();
        self.judged.retain(|a, _| kept(a));
        self.down.retain(kept);
        self.refresh();
    }

    /// The checker's judgement of every target; returns whether the down set changed (a
    /// new snapshot is due).
    pub(super) fn judged(&mut self, states: HashMap<SocketAddr, Judgement>) -> bool {
        let down: HashSet<SocketAddr> = states
            .iter()
            .filter(|(_, j)| !j.usable())
            .map(|(a, _)| *a)
            .collect();
        self.judged = states;
        let changed = down != self.down;
        self.down = down;
        self.refresh();
        changed
    }

    fn refresh(&mut self) {
        let unverified: Vec<SocketAddr> = if self.probing {
            self.targets
                .iter()
                .filter(|a| !self.judged.get(a).is_some_and(|j| j.verified()))
                .copied()
                .collect()
        } else {
            Vec::new()
        };
        if unverified != self.unverified {
            self.unverified = unverified;
            self.epoch += 1;
        }
    }

    /// Backends judged down.
    pub(super) fn down(&self) -> &HashSet<SocketAddr> {
        &self.down
    }

    /// Backends the checker probes that no probe has passed yet, sorted.
    pub(super) fn unverified(&self) -> &[SocketAddr] {
        &self.unverified
    }

    /// A number that changes whenever [`HealthState::unverified`] does.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn targets_are_unverified_until_a_probe_passes_and_only_down_changes_forwarding() {
        let (one, two) = (a("198.18.1.1:80"), a("198.18.1.2:80"));
        let mut h = HealthState::new(true);
        h.set_targets(&[one, two]);
        assert_eq!(h.unverified(), [one, two]);
        let e = h.epoch();
        // .1 passes its first probe: verified; forwarding has nothing to change.
        let changed = h.judged(HashMap::from([
            (one, Judgement::Up),
            (two, Judgement::Unknown),
        ]));
        assert!(!changed);
        assert_eq!(h.unverified(), [two]);
        assert_ne!(h.epoch(), e);
        // .2 goes down: forwarding changes, and it stays unverified.
        assert!(h.judged(HashMap::from([
            (one, Judgement::Up),
            (two, Judgement::Down)
        ])));
        assert_eq!(h.down(), &HashSet::from([two]));
        assert_eq!(h.unverified(), [two]);
        // A target that leaves and comes back is unknown again (the checker forgets it).
        h.set_targets(&[two]);
        assert_eq!(h.unverified(), [two], "down: not verified");
        h.set_targets(&[one, two]);
        assert_eq!(h.unverified(), [one, two], ".1's old judgement is gone");
        // Without probes nothing is held back.
        let mut h = HealthState::new(false);
        h.set_targets(&[one, two]);
        assert!(h.unverified().is_empty());
    }
}
