//! The immutable state the fastpath reads: services, their frontends and backends, prebuilt
//! scheduler state (Maglev tables...), and next-hop MACs.
//!
//! A `Snapshot` is built off the hot path by a [`SnapshotBuilder`] from a source-agnostic
//! model ([`ServiceSpec`]: the static source and the Kubernetes source both produce it), then
//! published as one `Arc` so every worker sees one consistent generation. Workers load it once
//! per batch; nothing in it is mutated except the schedulers' own lock-free cursors.
//!
//! Backend ids index the flow table's per-backend connection counters. The builder keeps them
//! stable across builds for the same (service, backend address), so counts survive a reload,
//! and recycles the ids of backends that disappeared.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use config::{Config, Mode, Protocol, SchedFlag, SchedulerName};
use lb_algos::{
    AffinityTable, Backend, BackendId, ConnCounts, FlowTuple, SchedFlags, SchedParams, Scheduler,
    SchedulerKind,
};

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
    pub services: Vec<ServiceEntry>,
    frontends: HashMap<Frontend, u32, ahash::RandomState>,
    neighbours: HashMap<IpAddr, [u8; 6], ahash::RandomState>,
}

impl Snapshot {
    /// The service a frontend belongs to.
    #[inline]
    pub fn service_for(&self, frontend: &Frontend) -> Option<&ServiceEntry> {
        let id = *self.frontends.get(frontend)?;
        self.services.get(id as usize)
    }

    /// The next hop's MAC, when known.
    #[inline]
    pub fn neighbour(&self, ip: &IpAddr) -> Option<[u8; 6]> {
        self.neighbours.get(ip).copied()
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
    free: Vec<BackendId>,
    next: u32,
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
            free: Vec::new(),
            next: 0,
        }
    }

    /// A builder sized from a config.
    pub fn from_config(c: &Config) -> Self {
        Self::new(c.flowtable.backends_max, c.dataplane.mh_table_size)
    }

    /// Builds the next snapshot from `services` and static `neighbours`.
    pub fn build(
        &mut self,
        services: &[ServiceSpec],
        neighbours: &[(IpAddr, [u8; 6])],
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
        // Release the ids of backends that are gone, then assign ids to new ones.
        let live: std::collections::HashSet<(&str, SocketAddr)> = services
            .iter()
            .flat_map(|s| s.backends.iter().map(move |b| (s.name.as_str(), b.addr)))
            .collect();
        let free = &mut self.free;
        self.ids.retain(|(name, addr), id| {
            let keep = live.contains(&(name.as_str(), *addr));
            if !keep {
                free.push(*id);
            }
            keep
        });
        let mut out = Vec::with_capacity(services.len());
        for (i, s) in services.iter().enumerate() {
            let mut backends = Vec::with_capacity(s.backends.len());
            for b in &s.backends {
                let id = match self.ids.get(&(s.name.clone(), b.addr)) {
                    Some(id) => *id,
                    None => {
                        let id = match self.free.pop() {
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
                        self.ids.insert((s.name.clone(), b.addr), id);
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
            out.push(ServiceEntry {
                id: i as u32,
                name: s.name.clone(),
                frontends: s.frontends.clone(),
                mode: s.mode,
                affinity_timeout: s.affinity_timeout,
                backends,
                scheduler,
            });
        }
        self.generation += 1;
        Ok(Snapshot {
            generation: self.generation,
            services: out,
            frontends,
            neighbours: neighbours.iter().copied().collect(),
        })
    }

    /// Builds a snapshot of a config's static services and neighbours.
    pub fn build_config(&mut self, c: &Config) -> Result<Snapshot, BuildError> {
        let neighbours: Vec<(IpAddr, [u8; 6])> =
            c.neighbours.iter().map(|n| (n.ip, n.mac.0)).collect();
        self.build(&ServiceSpec::from_config(c), &neighbours)
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
