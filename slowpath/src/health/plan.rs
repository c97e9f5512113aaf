//! What the checker probes: each service's check ([`Check`], `[health]` with the service's
//! own keys over it) and the backends it applies to ([`Plan`]).
//!
//! A backend is probed once per distinct check: two services that share a backend and a
//! check share its probes and its judgement ([`Target`]); a service with a check of its own
//! gets probes of its own, and its judgement applies to that service only. A backend of a
//! service whose probe is `none` is no target at all: nothing judges it, its source's
//! readiness alone decides.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use config::{ProbeKind, ServiceHealth};
use fastpath::snapshot::ServiceSpec;

/// One health check, every key resolved: how a backend is probed and judged.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Check {
    /// Probe kind; never [`ProbeKind::None`] (a service with `none` has no check).
    pub probe: ProbeKind,
    /// The port probed instead of the backend's own.
    pub port: Option<u16>,
    /// Path of HTTP(S) probes.
    pub http_path: String,
    /// Healthy statuses of HTTP(S) probes; empty: any 2xx or 3xx.
    pub http_status: Vec<u16>,
    /// Consecutive successes before a down backend is up.
    pub rise: u32,
    /// Consecutive failures before a backend is down.
    pub fall: u32,
    /// Time between probes of one backend (at least 1 ms).
    pub interval: Duration,
    /// A probe that takes longer fails (at least 1 ms).
    pub timeout: Duration,
}

impl Check {
    /// `global` with `own`'s keys over it; `None` when the probe is `none`.
    pub fn resolve(global: &config::Health, own: &ServiceHealth) -> Option<Check> {
        let probe = own.probe.unwrap_or(global.probe);
        if probe == ProbeKind::None {
            return None;
        }
        Some(Check {
            probe,
            port: own.port,
            http_path: own
                .http_path
                .clone()
                .unwrap_or_else(|| global.http_path.clone()),
            http_status: own
                .http_status
                .clone()
                .unwrap_or_else(|| global.http_status.clone()),
            rise: own.rise.unwrap_or(global.rise).max(1),
            fall: own.fall.unwrap_or(global.fall).max(1),
            interval: global.interval.get().max(Duration::from_millis(1)),
            timeout: global.timeout.get().max(Duration::from_millis(1)),
        })
    }

    /// Where a probe of `backend` goes: its address, on [`Check::port`] when set.
    pub fn probe_addr(&self, backend: SocketAddr) -> SocketAddr {
        SocketAddr::new(backend.ip(), self.port.unwrap_or(backend.port()))
    }

    /// Whether `status` is healthy: one of `http_status`, else any 2xx or 3xx.
    pub fn status_ok(&self, status: u16) -> bool {
        if self.http_status.is_empty() {
            (200..=399).contains(&status)
        } else {
            self.http_status.contains(&status)
        }
    }

    /// One line for people: `http GET /ready on port 8081, status 200, rise 2 fall 3`.
    pub fn describe(&self) -> String {
        let mut s = self.probe.name().to_owned();
        if self.probe.is_http() {
            s.push_str(&format!(" GET {}", self.http_path));
        }
        match self.port {
            Some(p) => s.push_str(&format!(" on port {p}")),
            None => s.push_str(" on the backend's port"),
        }
        if self.probe.is_http() {
            if self.http_status.is_empty() {
                s.push_str(", status 2xx/3xx");
            } else {
                let list: Vec<String> = self.http_status.iter().map(u16::to_string).collect();
                s.push_str(&format!(", status {}", list.join("/")));
            }
        }
        s.push_str(&format!(", rise {} fall {}", self.rise, self.fall));
        s
    }
}

/// A backend as the checker probes it: its address and the check it is probed with.
/// Equal by value: services with equal checks share the target.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// The backend (what the services forward to; the probe goes to
    /// [`Check::probe_addr`] of it).
    pub addr: SocketAddr,
    /// How it is probed.
    pub check: Arc<Check>,
}

/// Everything the checker probes: each service that has a check, with its backends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Service name → its check and its backends (sorted, deduplicated).
    services: BTreeMap<String, (Arc<Check>, Vec<SocketAddr>)>,
    /// Every target, sorted, each once.
    targets: Vec<Target>,
}

impl Plan {
    /// The plan of `specs` under `global` (`[health]`): each spec's own health keys over it.
    pub fn of(specs: &[ServiceSpec], global: &config::Health) -> Plan {
        Plan::from_services(specs.iter().filter_map(|s| {
            let check = Check::resolve(global, &s.health)?;
            Some((s.name.clone(), check, s.backends.iter().map(|b| b.addr)))
        }))
    }

    /// The plan of `(service, check, backends)` triples (a name given twice: the last wins).
    pub fn from_services<B: IntoIterator<Item = SocketAddr>>(
        services: impl IntoIterator<Item = (String, Check, B)>,
    ) -> Plan {
        // One Arc per distinct check, so equal checks hash and compare as one.
        let mut interned: HashSet<Arc<Check>> = HashSet::new();
        let mut out = BTreeMap::new();
        for (name, check, backends) in services {
            let check = match interned.get(&check) {
                Some(c) => Arc::clone(c),
                None => {
                    let c = Arc::new(check);
                    interned.insert(Arc::clone(&c));
                    c
                }
            };
            let mut addrs: Vec<SocketAddr> = backends.into_iter().collect();
            addrs.sort_unstable();
            addrs.dedup();
            out.insert(name, (check, addrs));
        }
        let mut targets: Vec<Target> = out
            .values()
            .flat_map(|(check, addrs)| {
                addrs.iter().map(|a| Target {
                    addr: *a,
                    check: Arc::clone(check),
                })
            })
            .collect();
        targets.sort_unstable();
        targets.dedup();
        Plan {
            services: out,
            targets,
        }
    }

    /// Every target, sorted, each once.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Whether nothing is probed.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// The check of `service`, if it has one.
    pub fn check(&self, service: &str) -> Option<&Arc<Check>> {
        self.services.get(service).map(|(c, _)| c)
    }

    /// The target that judges backend `addr` of `service`, if it is probed.
    pub fn target(&self, service: &str, addr: SocketAddr) -> Option<Target> {
        let (check, addrs) = self.services.get(service)?;
        addrs.binary_search(&addr).ok()?;
        Some(Target {
            addr,
            check: Arc::clone(check),
        })
    }

    /// Every probed (service, backend) pair with its target, by service name.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, Target)> + '_ {
        self.services.iter().flat_map(|(name, (check, addrs))| {
            addrs.iter().map(move |a| {
                (
                    name.as_str(),
                    Target {
                        addr: *a,
                        check: Arc::clone(check),
                    },
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global(probe: ProbeKind) -> config::Health {
        config::Health {
            probe,
            http_path: "/healthz".to_owned(),
            ..config::Health::default()
        }
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_services_keys_replace_the_global_ones_one_by_one() {
        let g = global(ProbeKind::Tcp);
        let plain = Check::resolve(&g, &ServiceHealth::default()).unwrap();
        assert_eq!(plain.probe, ProbeKind::Tcp);
        assert_eq!((plain.rise, plain.fall), (2, 3));
        assert_eq!(plain.http_path, "/healthz");
        assert_eq!(plain.probe_addr(sa("198.18.1.1:80")), sa("198.18.1.1:80"));
        let own = ServiceHealth {
            probe: Some(ProbeKind::Https),
            port: Some(8443),
            http_path: Some("/ready".to_owned()),
            http_status: Some(vec![204]),
            rise: Some(5),
            fall: None,
        };
        let c = Check::resolve(&g, &own).unwrap();
        assert_eq!(c.probe, ProbeKind::Https);
        assert_eq!(c.probe_addr(sa("198.18.1.1:80")), sa("198.18.1.1:8443"));
        assert_eq!(c.http_path, "/ready");
        assert_eq!((c.rise, c.fall), (5, 3), "fall from [health]");
        assert!(c.status_ok(204) && !c.status_ok(200));
        assert!(plain.status_ok(200) && plain.status_ok(399) && !plain.status_ok(404));
        assert_eq!(
            c.describe(),
            "https GET /ready on port 8443, status 204, rise 5 fall 3"
        );
        // `none` either way: no check.
        let off = ServiceHealth {
            probe: Some(ProbeKind::None),
            ..ServiceHealth::default()
        };
        assert_eq!(Check::resolve(&g, &off), None);
        assert_eq!(
            Check::resolve(&global(ProbeKind::None), &ServiceHealth::default()),
            None
        );
        // A service can turn checks on where [health] has none.
        let on = ServiceHealth {
            probe: Some(ProbeKind::Http),
            ..ServiceHealth::default()
        };
        assert!(Check::resolve(&global(ProbeKind::None), &on).is_some());
    }

    #[test]
    fn equal_checks_share_targets_and_different_ones_do_not() {
        let g = global(ProbeKind::Tcp);
        let tcp = Check::resolve(&g, &ServiceHealth::default()).unwrap();
        let http = Check::resolve(
            &g,
            &ServiceHealth {
                probe: Some(ProbeKind::Http),
                ..ServiceHealth::default()
            },
        )
        .unwrap();
        let (a, b) = (sa("198.18.1.1:80"), sa("198.18.1.2:80"));
        let plan = Plan::from_services([
            ("one".to_owned(), tcp.clone(), vec![a, b, a]),
            ("two".to_owned(), tcp.clone(), vec![a]),
            ("web".to_owned(), http.clone(), vec![a]),
        ]);
        // a with tcp (one and two share it), b with tcp, a with http.
        assert_eq!(plan.targets().len(), 3);
        assert_eq!(plan.target("one", a), plan.target("two", a));
        assert_ne!(plan.target("one", a), plan.target("web", a));
        assert_eq!(plan.target("two", b), None, "not a backend of two");
        assert_eq!(plan.target("nope", a), None);
        assert_eq!(plan.check("web").map(|c| c.probe), Some(ProbeKind::Http));
        assert_eq!(plan.pairs().count(), 4);
        assert!(Plan::default().is_empty());
    }
}
