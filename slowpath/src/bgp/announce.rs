//! What a node announces: a pure function of the published snapshot and the config.
//!
//! - Every frontend address (ClusterIP, externalIP, load-balancer ingress IP, a static
//!   service's VIP) of a service with at least one usable and verified backend, as a host
//!   route. Usable as the snapshot says: ready or serving as the source decided, not judged
//!   down, weight above 0. Verified: not among `unverified`, the backends health checks
//!   probe that no probe has passed yet (a backend the checker has not judged takes flows,
//!   as kube-proxy trusts a ready endpoint, but a node announces a VIP only on a backend it
//!   has seen alive; one that is not probed is verified by its source's readiness).
//!   An address shared by several services is announced while any of them has one.
//!   NodePort frontends sit on the node's own addresses, which the network already reaches:
//!   those (`node_addresses`) are never announced.
//! - The node's own SNAT addresses (`[dataplane] snat_addresses`): full-NAT replies come
//!   back to them.
//! - The peers' SNAT addresses, as backups: the export filter makes them worse (AS path
//!   prepended), so routers send a peer's replies here only while the peer's own route is gone.
//! - Nothing while the node drains (an admin drain, or the drain after a stop signal): the
//!   routers move everything, flows and replies, to the other nodes.
//!
//! A frozen service stays announced: a freeze refuses new flows but keeps established ones,
//! whose packets must keep arriving.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use fastpath::snapshot::Snapshot;

/// Why an address is announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    /// A frontend address with a usable backend.
    Vip,
    /// One of this node's SNAT addresses.
    Snat,
    /// A peer's SNAT address (announced worse, see the module doc).
    Backup,
}

impl RouteKind {
    /// `vip`, `snat` or `backup`.
    pub fn name(self) -> &'static str {
        match self {
            RouteKind::Vip => "vip",
            RouteKind::Snat => "snat",
            RouteKind::Backup => "backup",
        }
    }
}

/// The host routes a node announces, by address (each once: a primary role wins over
/// [`RouteKind::Backup`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Announcement {
    /// Address → why.
    pub routes: BTreeMap<IpAddr, RouteKind>,
}

impl Announcement {
    /// Routes of `kind`.
    pub fn count(&self, kind: RouteKind) -> usize {
        self.routes.values().filter(|k| **k == kind).count()
    }

    /// Whether nothing is announced.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The addresses of one family (`v6`), in order, with their kinds.
    pub fn family(&self, v6: bool) -> impl Iterator<Item = (IpAddr, RouteKind)> + '_ {
        self.routes
            .iter()
            .filter(move |(a, _)| a.is_ipv6() == v6)
            .map(|(a, k)| (*a, *k))
    }

    fn add(&mut self, a: IpAddr, kind: RouteKind) {
        let k = self.routes.entry(a).or_insert(kind);
        *k = (*k).min(kind);
    }
}

/// What [`announcement`] needs besides the snapshot.
#[derive(Clone, Copy, Debug, Default)]
pub struct Inputs<'a> {
    /// This node's SNAT addresses.
    pub snat_addresses: &'a [IpAddr],
    /// The peers' SNAT addresses.
    pub backups: &'a [IpAddr],
    /// This node's own addresses (NodePort frontends listen on them): never announced.
    pub node_addresses: &'a [IpAddr],
    /// (service, backend) pairs health checks probe that no probe has passed yet, sorted:
    /// they do not make that service's VIPs announced.
    pub unverified: &'a [(String, SocketAddr)],
    /// The node drains: nothing is announced.
    pub draining: bool,
}

/// What the node announces with `snap` published (see the module doc).
pub fn announcement(snap: &Snapshot, i: &Inputs<'_>) -> Announcement {
    let mut a = Announcement::default();
    if i.draining {
        return a;
    }
    for s in snap.services.iter() {
        let verified = |b: &SocketAddr| {
            i.unverified
                .binary_search_by(|(n, a)| (n.as_str(), a).cmp(&(s.name.as_str(), b)))
                .is_err()
        };
        if !s
            .backends
            .iter()
            .any(|b| b.usable && b.weight > 0 && verified(&b.addr))
        {
            continue;
        }
        for f in &s.frontends {
            if !i.node_addresses.contains(&f.vip) {
                a.add(f.vip, RouteKind::Vip);
            }
        }
    }
    for ip in i.snat_addresses {
        a.add(*ip, RouteKind::Snat);
    }
    for ip in i.backups {
        a.add(*ip, RouteKind::Backup);
    }
    a
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use config::{Mode, Protocol, SchedulerKind};
    use fastpath::snapshot::{
        BackendSpec, Frontend, L2Table, ServiceSpec, SnapshotBuilder, SynproxySetting,
    };

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn spec(name: &str, vips: &[&str], backends: &[(&str, u32, bool)]) -> ServiceSpec {
        spec_on(name, vips, 80, backends)
    }

    fn spec_on(
        name: &str,
        vips: &[&str],
        port: u16,
        backends: &[(&str, u32, bool)],
    ) -> ServiceSpec {
        ServiceSpec {
            name: name.to_owned(),
            frontends: vips
                .iter()
                .map(|v| Frontend {
                    vip: ip(v),
                    protocol: Protocol::Tcp,
                    port,
                })
                .collect(),
            scheduler: SchedulerKind::Rr,
            flags: Vec::new(),
            mode: Mode::Fullnat,
            affinity_timeout: None,
            backends: backends
                .iter()
                .map(|(addr, weight, usable)| BackendSpec {
                    addr: addr.parse::<SocketAddr>().unwrap(),
                    weight: *weight,
                    usable: *usable,
                })
                .collect(),
            source_ranges: Vec::new(),
            rate_limit: None,
            frozen: false,
            synproxy: SynproxySetting::Off,
            health: Default::default(),
            no_endpoints: fastpath::snapshot::NoEndpoints::Reject,
            cluster_ip: false,
        }
    }

    fn snapshot(specs: &[ServiceSpec]) -> Snapshot {
        SnapshotBuilder::new(1024, 251)
            .build(specs, &L2Table::default())
            .unwrap()
    }

    #[test]
    fn vips_with_a_usable_backend_snat_and_backups() {
        let snap = snapshot(&[
            // Usable: announced, both families, every frontend.
            spec(
                "web",
                &["198.18.100.1", "198.18.100.9"],
                &[("198.18.1.1:80", 1, true)],
            ),
            spec(
                "web6",
                &["2001:2:0:100::1"],
                &[("[2001:2:0:1::1]:80", 1, true)],
            ),
            // Every backend unhealthy, weight 0, or none at all: withdrawn.
            spec("down", &["198.18.100.2"], &[("198.18.1.1:81", 1, false)]),
            spec("drained", &["198.18.100.3"], &[("198.18.1.1:82", 0, true)]),
            spec("empty", &["198.18.100.4"], &[]),
            // A VIP shared with a service that has one: announced.
            spec(
                "shared-a",
                &["198.18.100.5"],
                &[("198.18.1.1:83", 1, false)],
            ),
            spec_on(
                "shared-b",
                &["198.18.100.5"],
                443,
                &[("198.18.1.2:83", 1, true)],
            ),
            // A NodePort frontend on the node's address: never.
            spec("nodeport", &["198.18.2.11"], &[("198.18.1.1:84", 1, true)]),
        ]);
        let snat = [ip("198.18.3.1"), ip("2001:2:0:3::1")];
        let backups = [ip("198.18.3.2"), ip("2001:2:0:3::2"), ip("198.18.3.1")];
        let node = [ip("198.18.2.11")];
        let i = Inputs {
            snat_addresses: &snat,
            backups: &backups,
            node_addresses: &node,
            unverified: &[],
            draining: false,
        };
        let a = announcement(&snap, &i);
        let want: Vec<(IpAddr, RouteKind)> = vec![
            (ip("198.18.3.1"), RouteKind::Snat),
            (ip("198.18.3.2"), RouteKind::Backup),
            (ip("198.18.100.1"), RouteKind::Vip),
            (ip("198.18.100.5"), RouteKind::Vip),
            (ip("198.18.100.9"), RouteKind::Vip),
            (ip("2001:2:0:3::1"), RouteKind::Snat),
            (ip("2001:2:0:3::2"), RouteKind::Backup),
            (ip("2001:2:0:100::1"), RouteKind::Vip),
        ];
        assert_eq!(a.routes.into_iter().collect::<Vec<_>>(), want);
    }

    #[test]
    fn a_vip_needs_a_verified_backend() {
        let snap = snapshot(&[
            spec(
                "web",
                &["198.18.100.1"],
                &[("198.18.1.1:80", 1, true), ("198.18.1.2:80", 1, true)],
            ),
            // Its only verified backend is down, its usable one not verified yet.
            spec(
                "api",
                &["198.18.100.2"],
                &[("198.18.1.1:81", 1, true), ("198.18.1.2:81", 1, false)],
            ),
            // web's first backend, under a check of its own.
            spec("web2", &["198.18.100.3"], &[("198.18.1.1:80", 1, true)]),
        ]);
        let vips = |unverified: &[(&str, &str)]| {
            let mut u: Vec<(String, SocketAddr)> = unverified
                .iter()
                .map(|(s, a)| (s.to_string(), a.parse().unwrap()))
                .collect();
            u.sort_unstable();
            let a = announcement(
                &snap,
                &Inputs {
                    unverified: &u,
                    ..Inputs::default()
                },
            );
            a.routes.keys().map(|ip| ip.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(vips(&[]), ["198.18.100.1", "198.18.100.2", "198.18.100.3"]);
        assert_eq!(
            vips(&[("web", "198.18.1.1:80"), ("api", "198.18.1.1:81")]),
            ["198.18.100.1", "198.18.100.3"],
            "web's .2 is verified; api's .1 is not, and its .2 is down"
        );
        // What web's check has not verified says nothing of web2's.
        assert_eq!(
            vips(&[
                ("web", "198.18.1.1:80"),
                ("web", "198.18.1.2:80"),
                ("api", "198.18.1.1:81")
            ]),
            ["198.18.100.3"]
        );
        assert!(
            vips(&[
                ("web", "198.18.1.1:80"),
                ("web", "198.18.1.2:80"),
                ("api", "198.18.1.1:81"),
                ("web2", "198.18.1.1:80")
            ])
            .is_empty()
        );
    }

    #[test]
    fn nothing_while_draining() {
        let snap = snapshot(&[spec(
            "web",
            &["198.18.100.1"],
            &[("198.18.1.1:80", 1, true)],
        )]);
        let snat = [ip("198.18.3.1")];
        let mut i = Inputs {
            snat_addresses: &snat,
            backups: &snat,
            ..Inputs::default()
        };
        // An address that is both this node's and a backup is this node's.
        let a = announcement(&snap, &i);
        assert_eq!(a.routes.len(), 2);
        assert_eq!(a.routes[&ip("198.18.3.1")], RouteKind::Snat);
        i.draining = true;
        assert!(announcement(&snap, &i).is_empty());
    }

    #[test]
    fn a_snapshot_without_services_announces_only_snat() {
        let snap = snapshot(&[]);
        let snat = [ip("198.18.3.1")];
        let a = announcement(
            &snap,
            &Inputs {
                snat_addresses: &snat,
                ..Inputs::default()
            },
        );
        assert_eq!(a.count(RouteKind::Snat), 1);
        assert_eq!(a.count(RouteKind::Vip), 0);
        assert_eq!(a.family(true).count(), 0);
    }
}
