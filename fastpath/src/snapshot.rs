//! The immutable state the fastpath reads: services, their frontends and backends, prebuilt
//! scheduler state (Maglev tables...), and next-hop MACs.
//!
//! A `Snapshot` is built off the hot path by a [`SnapshotBuilder`] from a source-agnostic
//! model ([`ServiceSpec`]: the static source and the Kubernetes source both produce it), then
//! published as one `Arc` so every worker sees one consistent generation. Workers load it once
//! per batch; nothing in it is mutated except the schedulers' own lock-free cursors.
//!
//! Backend ids index the flow table's per-backend connection counters. The builder keeps them
//! stable across builds for the same (service, backend address), so counts survive a reload.
//! The id of a backend that disappeared is *retired*, not reused at once: flows may still
//! count on it. The owner of the flow table ends or re-steers those flows (see
//! [`SnapshotBuilder::retired`]) and hands the id back with [`SnapshotBuilder::reclaim`] once
//! no flow holds it; a backend that comes back before that gets its old id again.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use crate::limit::RateLimit;
use crate::limit::TokenBucket;
use config::{Config, Mode, Protocol, SchedFlag, SchedulerName};
use lb_algos::{
    AffinityTable, Backend, BackendId, ConnCounts, FlowTuple, SchedFlags, SchedParams, Scheduler,
    SchedulerKind,
};

/// Where a frame to some destination leaves: the fastpath port (index of the interface in
/// `[dataplane] interfaces`) and the Ethernet addresses to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHop {
    /// Transmit port.
    pub port: u16,
    /// The next hop's MAC.
    pub dst_mac: [u8; 6],
    /// The transmit port's own MAC (`None`: the caller's default for that port).
    pub src_mac: Option<[u8; 6]>,
}

/// A route: destinations inside `prefix` leave on `port`, through `gateway` (none: the
/// destination is on the link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Destination prefix.
    pub prefix: config::Cidr,
    /// Transmit port.
    pub port: u16,
    /// Next-hop router, when not directly connected.
    pub gateway: Option<IpAddr>,
}

/// A resolved neighbour: `ip` has `mac`, on `port` when known (static `[[neighbours]]`
/// entries do not say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// Its address.
    pub ip: IpAddr,
    /// Its MAC.
    pub mac: [u8; 6],
    /// The port it was learnt on.
    pub port: Option<u16>,
}

/// The kernel's view of the network that the fastpath needs: routes, neighbours and each
/// port's own MAC. Empty for configs replayed offline (`xvs pcap`, tests): then every frame
/// leaves on the port it came in on, towards the `[[neighbours]]` MAC of its destination.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct L2Table {
    /// Routes, any order (the builder sorts them longest prefix first).
    pub routes: Vec<Route>,
    /// Neighbours.
    pub neighbours: Vec<Neighbour>,
    /// MAC of each port, by port index.
    pub port_macs: Vec<[u8; 6]>,
}

impl L2Table {
    /// The static `[[neighbours]]` of a config, with no routes and no port MACs.
    pub fn from_config(c: &Config) -> L2Table {
        L2Table {
            neighbours: c
                .neighbours
                .iter()
                .map(|n| Neighbour {
                    ip: n.ip,
                    mac: n.mac.0,
                    port: None,
                })
                .collect(),
            ..L2Table::default()
        }
    }
}

/// A frontend: what a client addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend {
    /// Virtual IP.
    pub vip: IpAddr,
    /// L4 protocol.
    pub protocol: Protocol,
    /// Port.
    pub port: u16,
}

/// One backend as a source describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendSpec {
    /// Address and port.
    pub addr: SocketAddr,
    /// Weight; 0 drains.
    pub weight: u32,
    /// Whether it may take new flows (health checks, readiness); false behaves as weight 0.
    pub usable: bool,
}

/// One service as a source describes it: frontends sharing one backend set and scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Unique name (`namespace/name:port` for Kubernetes).
    pub name: String,
    /// Every frontend that reaches this service.
    pub frontends: Vec<Frontend>,
    /// Scheduler.
    pub scheduler: SchedulerName,
    /// Scheduler flags.
    pub flags: Vec<SchedFlag>,
    /// Forwarding mode.
    pub mode: Mode,
    /// ClientIP session affinity timeout, when enabled.
    pub affinity_timeout: Option<Duration>,
    /// Backends.
    pub backends: Vec<BackendSpec>,
    /// When not empty, only clients inside these prefixes may open new flows
    /// (`loadBalancerSourceRanges`); others are dropped and counted.
    pub source_ranges: Vec<config::Cidr>,
    /// New-connection rate limit (token bucket shared by all workers); excess new flows are
    /// dropped and counted (`rate_limited`).
    pub rate_limit: Option<RateLimit>,
    /// Frozen: new flows are refused (`frozen`), established ones continue.
    pub frozen: bool,
}

impl ServiceSpec {
    /// The static source: one spec per `[[services]]` entry.
    pub fn from_config(c: &Config) -> Vec<ServiceSpec> {
        c.services
            .iter()
            .map(|s| ServiceSpec {
                name: s.name.clone(),
                frontends: vec![Frontend {
                    vip: s.vip,
                    protocol: s.protocol,
                    port: s.port,
                }],
                scheduler: s.scheduler,
                flags: s.flags.clone(),
                mode: s.mode_or(c.dataplane.mode),
                affinity_timeout: s.session_affinity_timeout.map(|d| d.get()),
                backends: s
                    .backends
                    .iter()
                    .map(|b| BackendSpec {
                        addr: b.addr,
                        weight: b.weight,
                        usable: true,
                    })
                    .collect(),
                source_ranges: Vec::new(),
                rate_limit: s.new_conn_rate.map(|rate| RateLimit {
                    rate,
                    burst: s.new_conn_burst.unwrap_or(rate),
                }),
                frozen: false,
            })
            .collect()
    }
}

/// A backend in a snapshot.
#[derive(Clone, Debug)]
pub struct BackendEntry {
    /// Index into the flow table's per-backend counters.
    pub id: BackendId,
    /// Address and port.
    pub addr: SocketAddr,
    /// Configured weight.
    pub weight: u32,
    /// Whether it takes new flows.
    pub usable: bool,
}

/// A service in a snapshot.
#[derive(Debug)]
pub struct ServiceEntry {
    /// Index of this service in `Snapshot::services` (the flow table's service id).
    pub id: u32,
    /// Name.
    pub name: String,
    /// Frontends.
    pub frontends: Vec<Frontend>,
    /// Forwarding mode.
    pub mode: Mode,
    /// ClientIP affinity timeout.
    pub affinity_timeout: Option<Duration>,
    /// Backends, in the source's order; schedulers pick indices into this.
    pub backends: Vec<BackendEntry>,
    /// The prebuilt scheduler.
    pub scheduler: Scheduler,
    /// Allowed client prefixes for new flows; empty = everyone.
    pub source_ranges: Vec<config::Cidr>,
    /// The new-connection rate limit, shared by every worker.
    pub limiter: Option<TokenBucket>,
    /// New flows refused.
    pub frozen: bool,
    /// New flows refused by the rate limit (this entry's lifetime).
    pub rate_limited: AtomicU64,
}

impl ServiceEntry {
    /// Whether `client` may open a new flow (`loadBalancerSourceRanges`).
    #[inline]
    pub fn admits(&self, client: IpAddr) -> bool {
        self.source_ranges.is_empty() || self.source_ranges.iter().any(|c| c.contains(client))
    }

    /// Takes a new-connection token at `now`; `false` (and counted) when over the limit.
    #[inline]
    pub fn take_token(&self, now: Instant) -> bool {
        match &self.limiter {
            Some(b) if !b.admit(now) => {
                self.rate_limited.fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => true,
        }
    }
}

/// Why a new flow got no backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoBackend {
    /// The service has no backends at all.
    Empty,
    /// Every backend is drained (weight 0) or unusable.
    AllDrained,
    /// The scheduler found nobody (e.g. every lblc candidate overloaded).
    Refused,
}

impl NoBackend {
    /// A short reason, as `xvs sim` prints it.
    pub fn reason(self) -> &'static str {
        match self {
            NoBackend::Empty => "no backends",
            NoBackend::AllDrained => "all backends drained or unhealthy",
            NoBackend::Refused => "scheduler found no backend",
        }
    }
}

impl ServiceEntry {
    /// Picks a backend for a new flow: ClientIP affinity first (while fresh and the backend
    /// still usable), then the scheduler. Returns the index into `backends`. Hot path: no
    /// allocation, no clock.
    pub fn schedule<C: ConnCounts + ?Sized>(
        &self,
        flow: &FlowTuple,
        counts: &C,
        affinity: &AffinityTable,
        now: Instant,
    ) -> Result<usize, NoBackend> {
        if let Some(timeout) = self.affinity_timeout
            && let Some(id) = affinity.lookup(self.id, flow.src, now, timeout)
            && let Some(i) = self
                .backends
                .iter()
                .position(|b| b.id == id && b.usable && b.weight > 0)
        {
            return Ok(i);
        }
        match self.scheduler.pick(flow, counts, now) {
            Some(i) => {
                if self.affinity_timeout.is_some() {
                    affinity.insert(self.id, flow.src, self.backends[i].id, now);
                }
                Ok(i)
            }
            None if self.backends.is_empty() => Err(NoBackend::Empty),
            None if self.backends.iter().all(|b| !b.usable || b.weight == 0) => {
                Err(NoBackend::AllDrained)
            }
            None => Err(NoBackend::Refused),
        }
    }
}

/// Why a snapshot could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Two services claim one frontend.
    #[error("frontend {vip}:{port}/{proto} is claimed by both {first} and {second}", proto = .frontend.protocol.name(), vip = .frontend.vip, port = .frontend.port)]
    DuplicateFrontend {
        /// The frontend.
        frontend: Frontend,
        /// The service that had it first.
        first: String,
        /// The service that claimed it again.
        second: String,
    },
    /// More backends than `[flowtable] backends_max`.
    #[error("more than {max} backends (flowtable.backends_max)")]
    TooManyBackends {
        /// The limit.
        max: u32,
    },
    /// A scheduler could not be built.
    #[error("service {service}: {source}")]
    Scheduler {
        /// The service.
        service: String,
        /// The scheduler's error.
        source: lb_algos::BuildError,
    },
}

/// Everything the fastpath reads, for one generation.
#[derive(Debug)]
pub struct Snapshot {
    /// Increases by one per build.
    pub generation: u64,
    /// Services, indexed by `ServiceEntry::id`.
    /// Services, indexed by `ServiceEntry::id`. An entry whose spec did not change is shared
    /// with the previous snapshot, scheduler state included (rr/wrr position, lblc tables,
    /// Maglev table), as IPVS keeps a service's state across edits of other services.
    pub services: Vec<Arc<ServiceEntry>>,
    /// Every new flow is refused (the freeze switch, a draining shutdown); established
    /// flows continue.
    pub frozen: bool,
    frontends: HashMap<Frontend, u32, ahash::RandomState>,
    neighbours: HashMap<IpAddr, ([u8; 6], Option<u16>), ahash::RandomState>,
    /// Longest prefix first.
    routes: Vec<Route>,
    port_macs: Vec<[u8; 6]>,
}

impl Snapshot {
    /// The service a frontend belongs to.
    #[inline]
    pub fn service_for(&self, frontend: &Frontend) -> Option<&ServiceEntry> {
        let id = *self.frontends.get(frontend)?;
        self.services.get(id as usize).map(|s| &**s)
    }

    /// The MAC of neighbour `ip`, when known.
    #[inline]
    pub fn neighbour(&self, ip: &IpAddr) -> Option<[u8; 6]> {
        self.neighbours.get(ip).map(|n| n.0)
    }

    /// Where a frame to `dst` goes: the longest matching route picks the port and the
    /// gateway; without a route, the frame goes straight to `dst` on the neighbour's port, or
    /// back out of `rx_port` (one-arm). `None`: the next hop's MAC is unknown (the slowpath
    /// resolves it).
    #[inline]
    pub fn next_hop(&self, dst: IpAddr, rx_port: u16) -> Option<NextHop> {
        let route = self.routes.iter().find(|r| r.prefix.contains(dst));
        let via = route.and_then(|r| r.gateway).unwrap_or(dst);
        let (dst_mac, learnt_on) = *self.neighbours.get(&via)?;
        let port = route.map(|r| r.port).or(learnt_on).unwrap_or(rx_port);
        Some(NextHop {
            port,
            dst_mac,
            src_mac: self.port_macs.get(usize::from(port)).copied(),
        })
    }

    /// Whether any frontend uses `vip`.
    pub fn is_vip(&self, vip: IpAddr) -> bool {
        self.frontends.keys().any(|f| f.vip == vip)
    }
}

/// Builds snapshots, keeping backend ids stable across builds.
#[derive(Debug)]
pub struct SnapshotBuilder {
    backends_max: u32,
    mh_table_size: u32,
    generation: u64,
    ids: HashMap<(String, SocketAddr), BackendId>,
    /// Ids of backends that left their service, until [`SnapshotBuilder::reclaim`] frees them.
    retired: HashMap<(String, SocketAddr), BackendId>,
    free: Vec<BackendId>,
    next: u32,
    /// The specs of the last build and the entries built from them, by index.
    last: Vec<(ServiceSpec, Arc<ServiceEntry>)>,
    /// Whether the next snapshots refuse every new flow.
    frozen: bool,
    /// Rate-limit buckets count from here.
    epoch: Instant,
}

impl SnapshotBuilder {
    /// A builder whose backend ids stay below `backends_max` (the flow table's counter
    /// array), building Maglev tables of `mh_table_size` slots.
    pub fn new(backends_max: u32, mh_table_size: u32) -> Self {
        SnapshotBuilder {
            backends_max,
            mh_table_size,
            generation: 0,
            ids: HashMap::new(),
            retired: HashMap::new(),
            free: Vec::new(),
            next: 0,
            last: Vec::new(),
            frozen: false,
            // An hour back (when the clock allows): callers' clocks (and tests' fake ones)
            // that started a little before the builder still refill the buckets.
            epoch: {
                let now = Instant::now();
                now.checked_sub(Duration::from_secs(3600)).unwrap_or(now)
            },
        }
    }

    /// A builder sized from a config.
    pub fn from_config(c: &Config) -> Self {
        Self::new(c.flowtable.backends_max, c.dataplane.mh_table_size)
    }

    /// Builds the next snapshot from `services` and the network view `l2`.
    pub fn build(
        &mut self,
        services: &[ServiceSpec],
        l2: &L2Table,
    ) -> Result<Snapshot, BuildError> {
        let mut frontends: HashMap<Frontend, u32, ahash::RandomState> = HashMap::default();
        for (i, s) in services.iter().enumerate() {
            for f in &s.frontends {
                if let Some(first) = frontends.insert(*f, i as u32) {
                    return Err(BuildError::DuplicateFrontend {
                        frontend: *f,
                        first: services[first as usize].name.clone(),
                        second: s.name.clone(),
                    });
                }
            }
        }
        // Retire the ids of backends that are gone, then assign ids to new ones.
        let live: std::collections::HashSet<(&str, SocketAddr)> = services
            .iter()
            .flat_map(|s| s.backends.iter().map(move |b| (s.name.as_str(), b.addr)))
            .collect();
        let retired = &mut self.retired;
        self.ids.retain(|(name, addr), id| {
            let keep = live.contains(&(name.as_str(), *addr));
            if !keep {
                retired.insert((name.clone(), *addr), *id);
            }
            keep
        });
        let mut out: Vec<Arc<ServiceEntry>> = Vec::with_capacity(services.len());
        for (i, s) in services.iter().enumerate() {
            if let Some((spec, entry)) = self.last.get(i)
                && spec == s
            {
                out.push(Arc::clone(entry));
                continue;
            }
            let mut backends: Vec<BackendEntry> = Vec::with_capacity(s.backends.len());
            for b in &s.backends {
                // A source may list an endpoint twice (two EndpointSlices); schedulers refuse
                // duplicates, so the first listing wins.
                if backends.iter().any(|e| e.addr == b.addr) {
                    continue;
                }
                let key = (s.name.clone(), b.addr);
                let id = match self.ids.get(&key) {
                    Some(id) => *id,
                    None => {
                        let id = match self.retired.remove(&key).or_else(|| self.free.pop()) {
                            Some(id) => id,
                            None if self.next < self.backends_max => {
                                self.next += 1;
                                BackendId(self.next - 1)
                            }
                            None => {
                                return Err(BuildError::TooManyBackends {
                                    max: self.backends_max,
                                });
                            }
                        };
                        self.ids.insert(key, id);
                        id
                    }
                };
                backends.push(BackendEntry {
                    id,
                    addr: b.addr,
                    weight: b.weight,
                    usable: b.usable,
                });
            }
            let sched_backends: Vec<Backend> = backends
                .iter()
                .map(|b| Backend {
                    id: b.id,
                    addr: b.addr,
                    weight: if b.usable { b.weight } else { 0 },
                })
                .collect();
            let params = SchedParams {
                flags: SchedFlags {
                    mh_port: s.flags.contains(&SchedFlag::MhPort),
                    mh_fallback: s.flags.contains(&SchedFlag::MhFallback),
                },
                mh_table_size: self.mh_table_size,
                ..SchedParams::default()
            };
            let scheduler = Scheduler::build(kind(s.scheduler), &sched_backends, &params).map_err(
                |source| BuildError::Scheduler {
                    service: s.name.clone(),
                    source,
                },
            )?;
            out.push(Arc::new(ServiceEntry {
                id: i as u32,
                name: s.name.clone(),
                frontends: s.frontends.clone(),
                mode: s.mode,
                affinity_timeout: s.affinity_timeout,
                backends,
                scheduler,
                source_ranges: s.source_ranges.clone(),
                limiter: s.rate_limit.map(|l| TokenBucket::new(l, self.epoch)),
                frozen: s.frozen,
                rate_limited: AtomicU64::new(0),
            }));
        }
        self.last = services.iter().cloned().zip(out.iter().cloned()).collect();
        self.generation += 1;
        Ok(Snapshot {
            generation: self.generation,
            services: out,
            frozen: self.frozen,
            frontends,
            neighbours: l2
                .neighbours
                .iter()
                .map(|n| (n.ip, (n.mac, n.port)))
                .collect(),
            routes: {
                let mut r = l2.routes.clone();
                r.sort_by_key(|r| std::cmp::Reverse(r.prefix.prefix));
                r
            },
            port_macs: l2.port_macs.clone(),
        })
    }

    /// Sets the global freeze for the snapshots built from now on: every new flow is refused
    /// while established ones continue.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }

    /// Ids of backends that left their service and may still be held by flows: the flow
    /// table's owner ends or re-steers those flows, then calls [`SnapshotBuilder::reclaim`].
    pub fn retired(&self) -> impl Iterator<Item = BackendId> + '_ {
        self.retired.values().copied()
    }

    /// Frees every retired id for which `in_use` says no flow holds it any more (e.g. its
    /// active and inactive counts are both 0), so new backends may get it. Returns how many
    /// were freed.
    pub fn reclaim(&mut self, mut in_use: impl FnMut(BackendId) -> bool) -> usize {
        let free = &mut self.free;
        let before = free.len();
        self.retired.retain(|_, id| {
            let keep = in_use(*id);
            if !keep {
                free.push(*id);
            }
            keep
        });
        free.len() - before
    }

    /// Builds a snapshot of a config's static services and `[[neighbours]]` (no routes).
    pub fn build_config(&mut self, c: &Config) -> Result<Snapshot, BuildError> {
        self.build(&ServiceSpec::from_config(c), &L2Table::from_config(c))
    }
}

/// The scheduler a config name stands for.
pub fn kind(name: SchedulerName) -> SchedulerKind {
    match name {
        SchedulerName::Rr => SchedulerKind::Rr,
        SchedulerName::Wrr => SchedulerKind::Wrr,
        SchedulerName::Lc => SchedulerKind::Lc,
        SchedulerName::Wlc => SchedulerKind::Wlc,
        SchedulerName::Sed => SchedulerKind::Sed,
        SchedulerName::Nq => SchedulerKind::Nq,
        SchedulerName::Mh => SchedulerKind::Mh,
        SchedulerName::Sh => SchedulerKind::Sh,
        SchedulerName::Dh => SchedulerKind::Dh,
        SchedulerName::Lblc => SchedulerKind::Lblc,
        SchedulerName::Lblcr => SchedulerKind::Lblcr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn snapshot(l2: &L2Table) -> Snapshot {
        let cfg = config::parse(
            "[dataplane]\nsnat_addresses = [\"198.18.1.254\"]\n[[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.1:8080\" }, { addr = \"198.18.1.2:8080\" }]\n",
            "t.toml",
        )
        .unwrap();
        SnapshotBuilder::from_config(&cfg)
            .build(&ServiceSpec::from_config(&cfg), l2)
            .unwrap()
    }

    #[test]
    fn next_hop_follows_routes_gateways_and_port_macs() {
        let (client_mac, backend_mac, gw_mac) =
            ([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 1, 1], [2, 0, 0, 0, 0, 9]);
        let l2 = L2Table {
            routes: vec![
                Route {
                    prefix: "0.0.0.0/0".parse().unwrap(),
                    port: 0,
                    gateway: Some(ip("198.18.0.9")),
                },
                Route {
                    prefix: "198.18.0.0/24".parse().unwrap(),
                    port: 0,
                    gateway: None,
                },
                Route {
                    prefix: "198.18.1.0/24".parse().unwrap(),
                    port: 1,
                    gateway: None,
                },
            ],
            neighbours: vec![
                Neighbour {
                    ip: ip("198.18.0.2"),
                    mac: client_mac,
                    port: Some(0),
                },
                Neighbour {
                    ip: ip("198.18.0.9"),
                    mac: gw_mac,
                    port: Some(0),
                },
                Neighbour {
                    ip: ip("198.18.1.1"),
                    mac: backend_mac,
                    port: Some(1),
                },
            ],
            port_macs: vec![[2, 0, 0, 0, 0xaa, 0], [2, 0, 0, 0, 0xaa, 1]],
        };
        let s = snapshot(&l2);
        // On-link backend: port 1, its own MAC, port 1's MAC as source.
        assert_eq!(
            s.next_hop(ip("198.18.1.1"), 0),
            Some(NextHop {
                port: 1,
                dst_mac: backend_mac,
                src_mac: Some([2, 0, 0, 0, 0xaa, 1])
            })
        );
        // On-link client on port 0.
        assert_eq!(
            s.next_hop(ip("198.18.0.2"), 1).map(|n| (n.port, n.dst_mac)),
            Some((0, client_mac))
        );
        // Anything else goes to the default gateway's MAC on port 0.
        assert_eq!(
            s.next_hop(ip("203.0.113.7"), 1)
                .map(|n| (n.port, n.dst_mac)),
            Some((0, gw_mac))
        );
        // An on-link address without a neighbour entry is unresolved.
        assert_eq!(s.next_hop(ip("198.18.1.2"), 0), None);
    }

    #[test]
    fn without_routes_frames_leave_by_the_receiving_port() {
        let l2 = L2Table {
            neighbours: vec![Neighbour {
                ip: ip("198.18.1.1"),
                mac: [2, 0, 0, 0, 1, 1],
                port: None,
            }],
            ..L2Table::default()
        };
        let s = snapshot(&l2);
        assert_eq!(
            s.next_hop(ip("198.18.1.1"), 3),
            Some(NextHop {
                port: 3,
                dst_mac: [2, 0, 0, 0, 1, 1],
                src_mac: None
            })
        );
    }

    #[test]
    fn backend_ids_are_stable_and_recycled() {
        let cfg = config::parse(
            "[dataplane]\nsnat_addresses = [\"198.18.1.254\"]\n[[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.1:8080\" }, { addr = \"198.18.1.2:8080\" }]\n",
            "t.toml",
        )
        .unwrap();
        let mut b = SnapshotBuilder::from_config(&cfg);
        let mut specs = ServiceSpec::from_config(&cfg);
        let s1 = b.build(&specs, &L2Table::default()).unwrap();
        let ids1: Vec<u32> = s1.services[0].backends.iter().map(|b| b.id.0).collect();
        // Remove the first backend, add a third: the second keeps its id; the removed one's
        // id is retired (flows may hold it), so the new one gets a fresh id.
        let removed = specs[0].backends.remove(0);
        specs[0].backends.push(BackendSpec {
            addr: "198.18.1.3:8080".parse().unwrap(),
            weight: 1,
            usable: true,
        });
        let s2 = b.build(&specs, &L2Table::default()).unwrap();
        let ids2: Vec<u32> = s2.services[0].backends.iter().map(|b| b.id.0).collect();
        assert_eq!(ids2[0], ids1[1]);
        assert!(
            !ids1.contains(&ids2[1]),
            "a retired id is not reused: {ids2:?}"
        );
        assert_eq!(b.retired().collect::<Vec<_>>(), [BackendId(ids1[0])]);
        assert_eq!(s2.generation, s1.generation + 1);
        // The removed backend comes back while still retired: it gets its old id.
        specs[0].backends.push(removed.clone());
        let s3 = b.build(&specs, &L2Table::default()).unwrap();
        assert_eq!(s3.services[0].backends[2].id.0, ids1[0]);
        assert_eq!(b.retired().count(), 0);
        // Removed again; reclaim frees it only once nothing holds it, then a new backend
        // reuses it.
        specs[0].backends.pop();
        b.build(&specs, &L2Table::default()).unwrap();
        assert_eq!(b.reclaim(|_| true), 0);
        assert_eq!(b.retired().count(), 1);
        assert_eq!(b.reclaim(|_| false), 1);
        specs[0].backends.push(BackendSpec {
            addr: "198.18.1.4:8080".parse().unwrap(),
            weight: 1,
            usable: true,
        });
        let s4 = b.build(&specs, &L2Table::default()).unwrap();
        assert_eq!(s4.services[0].backends[2].id.0, ids1[0]);
        // Two services on one frontend are refused.
        specs.push(specs[0].clone());
        specs[1].name = "web-copy".into();
        assert!(matches!(
            b.build(&specs, &L2Table::default()),
            Err(BuildError::DuplicateFrontend { .. })
        ));
    }

    struct NoCounts;
    impl ConnCounts for NoCounts {
        fn active(&self, _: BackendId) -> u32 {
            0
        }
        fn inactive(&self, _: BackendId) -> u32 {
            0
        }
    }

    #[test]
    fn unchanged_services_keep_their_scheduler_state_across_builds() {
        let cfg = config::parse(
            "[dataplane]\nmode = \"nat\"\n[[services]]\nname = \"a\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.1:80\" }, { addr = \"198.18.1.2:80\" }, { addr = \"198.18.1.3:80\" }]\n[[services]]\nname = \"b\"\nvip = \"198.18.100.2\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.1:80\" }, { addr = \"198.18.1.2:80\" }]\n",
            "t.toml",
        )
        .unwrap();
        let epoch = Instant::now();
        let affinity = AffinityTable::new(16, epoch);
        let flow = FlowTuple {
            src: ip("198.18.0.2"),
            src_port: 1000,
            dst: ip("198.18.100.1"),
            dst_port: 80,
        };
        let pick = |s: &Snapshot, svc: usize| {
            s.services[svc]
                .schedule(&flow, &NoCounts, &affinity, epoch)
                .unwrap()
        };
        let mut b = SnapshotBuilder::from_config(&cfg);
        let mut specs = ServiceSpec::from_config(&cfg);
        let s1 = b.build(&specs, &L2Table::default()).unwrap();
        assert_eq!((pick(&s1, 0), pick(&s1, 0)), (0, 1));
        assert_eq!(pick(&s1, 1), 0);
        // A new neighbour only: rr goes on where it was (a fresh scheduler would restart at 0).
        let l2 = L2Table {
            neighbours: vec![Neighbour {
                ip: ip("198.18.1.1"),
                mac: [2, 0, 0, 0, 1, 1],
                port: None,
            }],
            ..L2Table::default()
        };
        let s2 = b.build(&specs, &l2).unwrap();
        assert!(Arc::ptr_eq(&s1.services[0], &s2.services[0]));
        assert_eq!(pick(&s2, 0), 2);
        // Editing service b rebuilds b only.
        specs[1].backends.pop();
        let s3 = b.build(&specs, &l2).unwrap();
        assert!(Arc::ptr_eq(&s2.services[0], &s3.services[0]));
        assert!(!Arc::ptr_eq(&s2.services[1], &s3.services[1]));
        assert_eq!(pick(&s3, 0), 0);
        assert_eq!(s3.services[1].backends.len(), 1);
    }
}
