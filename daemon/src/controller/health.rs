//! What the controller knows of the health checker's judgements
//! ([`slowpath::health::Judgement`]), and what it makes of them.
//!
//! - **What is probed** is a [`Plan`] of the services' specs: each service's own health keys
//!   (`[[services]] health`, a Kubernetes Service's annotations) over `[health]`. The
//!   `[health]` the daemon started with is the default: a reload does not change it (the
//!   services' own keys reload with them).
//! - **Forwarding** trusts every backend that is not judged down: a backend the checker has
//!   not judged yet (unknown) takes new flows at once, as kube-proxy trusts a ready endpoint.
//!   A judgement applies to the services whose check made it ([`HealthState::is_down`]).
//!   Only a change of the down set is a reason to publish a snapshot.
//! - **Announcing** trusts only what was verified ([`HealthState::unverified`]): a backend a
//!   service probes counts for that service's VIPs once a probe has passed (up); one it does
//!   not probe (its probe is `none`) counts when it is ready per its source. Every target
//!   starts unknown in each process: an adopted flow table verifies nothing, the first probe
//!   does.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use slowpath::health::{Judgement, Plan, Target};

/// The health checker's judgements as the controller keeps them.
#[derive(Debug, Default)]
pub(super) struct HealthState {
    /// What the checker was last told to probe.
    plan: Arc<Plan>,
    /// Its last judgement of every target it reported (absent: unknown).
    judged: HashMap<Target, Judgement>,
    /// Targets judged down: their services send them no new flows.
    down: HashSet<Target>,
    /// (service, backend) pairs judged down when they left the plan, until the next publish
    /// has noted them ([`HealthState::left_down`]): their flows end at once, not after a
    /// removal grace.
    left_down: HashSet<(String, SocketAddr)>,
    /// (service, backend) pairs no probe has passed yet (sorted): they take flows but make
    /// their service announce nothing.
    unverified: Vec<(String, SocketAddr)>,
    /// Changes whenever `unverified` does, so the announcement is rendered again.
    epoch: u64,
}

impl HealthState {
    /// The checker was told to probe `plan`; returns false when it is the plan it had. It
    /// forgets the targets that left, and starts one that comes back unknown: so does this.
    pub(super) fn set_plan(&mut self, plan: Plan) -> bool {
        if *self.plan == plan {
            return false;
        }
        if !self.down.is_empty() {
            for (service, t) in self.plan.pairs() {
                if self.down.contains(&t) && plan.target(service, t.addr).as_ref() != Some(&t) {
                    self.left_down.insert((service.to_owned(), t.addr));
                }
            }
        }
        self.plan = Arc::new(plan);
        let targets: HashSet<&Target> = self.plan.targets().iter().collect();
        self.judged.retain(|t, _| targets.contains(t));
        self.down.retain(|t| targets.contains(t));
        self.refresh();
        true
    }

    /// The plan last set.
    pub(super) fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// The checker's judgement of every target; returns whether the down set changed (a
    /// new snapshot is due).
    pub(super) fn judged(&mut self, states: HashMap<Target, Judgement>) -> bool {
        let down: HashSet<Target> = states
            .iter()
            .filter(|(_, j)| !j.usable())
            .map(|(t, _)| t.clone())
            .collect();
        self.judged = states;
        let changed = down != self.down;
        self.down = down;
        self.refresh();
        changed
    }

    fn refresh(&mut self) {
        let mut unverified: Vec<(String, SocketAddr)> = self
            .plan
            .pairs()
            .filter(|(_, t)| !self.judged.get(t).is_some_and(|j| j.verified()))
            .map(|(s, t)| (s.to_owned(), t.addr))
            .collect();
        unverified.sort_unstable();
        if unverified != self.unverified {
            self.unverified = unverified;
            self.epoch += 1;
        }
    }

    /// Whether anything is judged down.
    pub(super) fn any_down(&self) -> bool {
        !self.down.is_empty()
    }

    /// Whether backend `addr` of `service` is judged down by that service's check.
    pub(super) fn is_down(&self, service: &str, addr: SocketAddr) -> bool {
        !self.down.is_empty()
            && self
                .plan
                .target(service, addr)
                .is_some_and(|t| self.down.contains(&t))
    }

    /// Whether backend `addr` of `service` was judged down when it left the plan (since the
    /// last [`HealthState::forget_left`]).
    pub(super) fn left_down(&self, service: &str, addr: SocketAddr) -> bool {
        !self.left_down.is_empty() && self.left_down.contains(&(service.to_owned(), addr))
    }

    /// Forgets the pairs that left down (a publish has noted them).
    pub(super) fn forget_left(&mut self) {
        self.left_down.clear();
    }

    /// (service, backend) pairs a probe judges that no probe has passed yet, sorted.
    pub(super) fn unverified(&self) -> &[(String, SocketAddr)] {
        &self.unverified
    }

    /// A number that changes whenever [`HealthState::unverified`] does.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }
}

#[cfg(test)]
mod tests {
    use config::{ProbeKind, ServiceHealth};
    use slowpath::health::Check;

    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn check(probe: ProbeKind) -> Check {
        let global = config::Health {
            probe,
            ..config::Health::default()
        };
        Check::resolve(&global, &ServiceHealth::default()).unwrap()
    }

    fn plan(services: &[(&str, ProbeKind, &[SocketAddr])]) -> Plan {
        Plan::from_services(
            services
                .iter()
                .map(|(n, p, b)| (n.to_string(), check(*p), b.to_vec())),
        )
    }

    #[test]
    fn targets_are_unverified_until_a_probe_passes_and_only_down_changes_forwarding() {
        let (one, two) = (a("198.18.1.1:80"), a("198.18.1.2:80"));
        let mut h = HealthState::default();
        assert!(h.set_plan(plan(&[("web", ProbeKind::Tcp, &[one, two])])));
        assert!(!h.set_plan(plan(&[("web", ProbeKind::Tcp, &[one, two])])));
        let t = |addr| h.plan().target("web", addr).unwrap();
        let (t1, t2) = (t(one), t(two));
        let web = |addr| ("web".to_owned(), addr);
        assert_eq!(h.unverified(), [web(one), web(two)]);
        let e = h.epoch();
        // .1 passes its first probe: verified; forwarding has nothing to change.
        let changed = h.judged(HashMap::from([
            (t1.clone(), Judgement::Up),
            (t2.clone(), Judgement::Unknown),
        ]));
        assert!(!changed);
        assert_eq!(h.unverified(), [web(two)]);
        assert_ne!(h.epoch(), e);
        // .2 goes down: forwarding changes, and it stays unverified.
        assert!(h.judged(HashMap::from([
            (t1.clone(), Judgement::Up),
            (t2.clone(), Judgement::Down)
        ])));
        assert!(h.is_down("web", two) && !h.is_down("web", one));
        assert_eq!(h.unverified(), [web(two)]);
        // A target that leaves and comes back is unknown again (the checker forgets it).
        h.set_plan(plan(&[("web", ProbeKind::Tcp, &[two])]));
        assert_eq!(h.unverified(), [web(two)], "down: not verified");
        h.set_plan(plan(&[("web", ProbeKind::Tcp, &[one, two])]));
        assert_eq!(
            h.unverified(),
            [web(one), web(two)],
            ".1's old judgement is gone"
        );
        // .2 leaves while down: remembered until a publish has noted it.
        h.set_plan(plan(&[("web", ProbeKind::Tcp, &[one])]));
        assert!(!h.is_down("web", two) && h.left_down("web", two));
        assert!(!h.left_down("web", one));
        h.forget_left();
        assert!(!h.left_down("web", two));
        // A service without probes holds nothing back.
        let mut h = HealthState::default();
        h.set_plan(Plan::default());
        assert!(h.unverified().is_empty());
    }

    #[test]
    fn a_judgement_applies_to_the_services_of_its_check_only() {
        let b = a("198.18.1.1:80");
        let mut h = HealthState::default();
        // Two services share the backend: one probes it over TCP, one over HTTP.
        h.set_plan(plan(&[
            ("tcp", ProbeKind::Tcp, &[b]),
            ("also-tcp", ProbeKind::Tcp, &[b]),
            ("web", ProbeKind::Http, &[b]),
        ]));
        assert_eq!(h.plan().targets().len(), 2);
        let http = h.plan().target("web", b).unwrap();
        let tcp = h.plan().target("tcp", b).unwrap();
        assert!(h.judged(HashMap::from([
            (http, Judgement::Down),
            (tcp, Judgement::Up)
        ])));
        assert!(h.is_down("web", b), "its HTTP check failed");
        assert!(!h.is_down("tcp", b) && !h.is_down("also-tcp", b));
        assert!(!h.is_down("unprobed", b));
        assert_eq!(h.unverified(), [("web".to_owned(), b)]);
    }
}
