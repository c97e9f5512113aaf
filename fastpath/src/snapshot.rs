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
//!
//! Service ids (the flow table's service id, the ClientIP affinity key) are stable per name
//! too, and a build finds the last entry of each spec by name: services coming and going
//! around a service (which moves its position in the list) neither rebuild its entry nor
//! lose its scheduler state. `Snapshot::services` iterates in the source's order and is
//! indexed by id. A build costs one comparison per unchanged spec plus the work of the
//! changed ones (10k Kubernetes Services: under a millisecond for a one-Service change; see
//! `benches/src/bin/scale.rs`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod adopt;
#[cfg(test)]
mod mh_order;

pub use crate::limit::RateLimit;
use crate::limit::TokenBucket;
use crate::pipeline::DropReason;
pub use adopt::{AdoptedIds, AdoptedService};
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

impl Frontend {
    /// The frontend flow `d`'s client addressed (none for ICMP flows, which have no port).
    pub fn of_flow(d: &flowtable::FlowData) -> Option<Frontend> {
        let protocol = match d.proto {
            flowtable::Protocol::Tcp => Protocol::Tcp,
            flowtable::Protocol::Udp => Protocol::Udp,
            flowtable::Protocol::Sctp => Protocol::Sctp,
            flowtable::Protocol::Icmp | flowtable::Protocol::Icmpv6 => return None,
        };
        Some(Frontend {
            vip: d.vip.ip(),
            protocol,
            port: d.vip.port(),
        })
    }
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
    /// The SYN proxy (TCP frontends), with the global setting folded in.
    pub synproxy: SynproxySetting,
}

/// A service's SYN proxy as the fastpath applies it: the service's mode (its own, or the
/// global `[synproxy] mode`) with the global threshold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SynproxySetting {
    /// SYNs make flows.
    #[default]
    Off,
    /// SYNs are answered with SYN cookies.
    On,
    /// As `On` while the flow table holds more than `embryonic_max` embryonic flows (and
    /// until it holds fewer than half of it), else as `Off`.
    Auto {
        /// `[synproxy] auto_threshold`.
        embryonic_max: u32,
    },
}

impl SynproxySetting {
    /// The setting of a service whose mode is `mode`, under `c`'s `[synproxy]` (and flow
    /// table capacity).
    pub fn of(mode: config::SynproxyMode, c: &Config) -> Self {
        match mode {
            config::SynproxyMode::Off => SynproxySetting::Off,
            config::SynproxyMode::On => SynproxySetting::On,
            config::SynproxyMode::Auto => SynproxySetting::Auto {
                embryonic_max: c.synproxy.threshold(c.flowtable.capacity),
            },
        }
    }

    /// `off`, `on` or `auto`.
    pub fn name(self) -> &'static str {
        match self {
            SynproxySetting::Off => "off",
            SynproxySetting::On => "on",
            SynproxySetting::Auto { .. } => "auto",
        }
    }
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
                synproxy: SynproxySetting::of(s.synproxy_or(c.synproxy.mode), c),
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
    /// This service's id: the flow table's service id and the ClientIP affinity key. Stable
    /// for as long as a service of this name exists (services coming and going around it do
    /// not change it), so its entry can be shared between snapshots; freed ids are reused by
    /// later services. `Snapshot::services[id]` finds the entry. Not a position: a builder's
    /// first build numbers its services 0, 1, 2... in order, later ones need not.
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
    /// The SYN proxy.
    pub synproxy: SynproxySetting,
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

    /// The pipeline's admission of a new flow from `client` at `now`, in its order: the
    /// source ranges, the freeze (this service's, or every service's with `all_frozen`),
    /// then the rate limit (which takes a token). `xvs sim` runs the same.
    #[inline]
    pub fn admit_new_flow(
        &self,
        all_frozen: bool,
        client: IpAddr,
        now: Instant,
    ) -> Result<(), DropReason> {
        if !self.admits(client) {
            return Err(DropReason::SourceRange);
        }
        if all_frozen || self.frozen {
            return Err(DropReason::Frozen);
        }
        if !self.take_token(now) {
            return Err(DropReason::RateLimited);
        }
        Ok(())
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
    /// Two services have one name (names key the services' ids and backend ids).
    #[error("two services are named {name}")]
    DuplicateName {
        /// The name.
        name: String,
    },
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

/// The services of a snapshot: in the source's order (`iter`, `as_slice`) and by
/// [`ServiceEntry::id`] (`get`, `[id]`).
#[derive(Debug, Default)]
pub struct ServiceTable {
    list: Vec<Arc<ServiceEntry>>,
    /// Position in `list` by service id (`u32::MAX`: no such service).
    by_id: Vec<u32>,
}

impl ServiceTable {
    /// Number of services.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The services in the source's order.
    pub fn iter(&self) -> std::slice::Iter<'_, Arc<ServiceEntry>> {
        self.list.iter()
    }

    /// The services in the source's order.
    pub fn as_slice(&self) -> &[Arc<ServiceEntry>] {
        &self.list
    }

    /// The service whose [`ServiceEntry::id`] is `id`.
    #[inline]
    pub fn get(&self, id: usize) -> Option<&Arc<ServiceEntry>> {
        let pos = *self.by_id.get(id)?;
        self.list.get(pos as usize)
    }
}

impl std::ops::Index<usize> for ServiceTable {
    type Output = Arc<ServiceEntry>;

    /// The service whose id is `id`; panics when there is none.
    fn index(&self, id: usize) -> &Arc<ServiceEntry> {
        self.get(id)
            .unwrap_or_else(|| panic!("no service with id {id}"))
    }
}

impl<'a> IntoIterator for &'a ServiceTable {
    type Item = &'a Arc<ServiceEntry>;
    type IntoIter = std::slice::Iter<'a, Arc<ServiceEntry>>;

    fn into_iter(self) -> Self::IntoIter {
        self.list.iter()
    }
}

/// Everything the fastpath reads, for one generation.
#[derive(Debug)]
pub struct Snapshot {
    /// Increases by one per build.
    pub generation: u64,
    /// Services: iterated in the source's order, indexed (`[id]`, `get(id)`) by
    /// [`ServiceEntry::id`]. An entry whose spec did not change is shared with the previous
    /// snapshot, scheduler state included (rr/wrr position, lblc tables, Maglev table, rate
    /// limiter), as IPVS keeps a service's state across edits of other services.
    pub services: ServiceTable,
    /// Every new flow is refused (the freeze switch, a draining shutdown); established
    /// flows continue.
    pub frozen: bool,
    /// Whether any service's SYN proxy is not off (the pipeline's new-flow path tests this
    /// before looking at the service's).
    pub synproxy_any: bool,
    /// Frontend → service id; shared with the next snapshot when no frontend changed.
    frontends: Arc<FrontendMap>,
    /// The frontends' addresses, sorted: "is this source one of ours" on the new-flow path.
    vips: Arc<VipSet>,
    neighbours: HashMap<IpAddr, ([u8; 6], Option<u16>), ahash::RandomState>,
    /// Longest prefix first.
    routes: Vec<Route>,
    port_macs: Vec<[u8; 6]>,
}

impl Snapshot {
    /// The service a frontend belongs to.
    #[inline(always)]
    pub fn service_for(&self, frontend: &Frontend) -> Option<&ServiceEntry> {
        let id = *self.frontends.get(frontend)?;
        self.services.get(id as usize).map(|s| &**s)
    }

    /// Number of frontends.
    pub fn frontend_count(&self) -> usize {
        self.frontends.len()
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

    /// Whether any frontend uses `vip` (a binary search).
    #[inline]
    pub fn is_vip(&self, vip: IpAddr) -> bool {
        self.vips.contains(vip)
    }
}

/// Every frontend address of a [`FrontendMap`], sorted per family, built with the map (off
/// the hot path) and shared with it.
#[derive(Debug, Default)]
struct VipSet {
    v4: Box<[u32]>,
    v6: Box<[u128]>,
}

impl VipSet {
    fn new(frontends: &FrontendMap) -> Self {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for f in frontends.keys() {
            match f.vip {
                IpAddr::V4(a) => v4.push(a.to_bits()),
                IpAddr::V6(a) => v6.push(a.to_bits()),
            }
        }
        v4.sort_unstable();
        v4.dedup();
        v6.sort_unstable();
        v6.dedup();
        VipSet {
            v4: v4.into(),
            v6: v6.into(),
        }
    }

    #[inline]
    fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.v4.binary_search(&a.to_bits()).is_ok(),
            IpAddr::V6(a) => self.v6.binary_search(&a.to_bits()).is_ok(),
        }
    }
}

/// Builds snapshots, keeping service ids and backend ids stable across builds.
///
/// A build costs one comparison per unchanged spec (its entry is shared, found by name; in
/// the common case without a hash lookup), plus the work for the specs that changed: the
/// frontend map and the id tables are patched, not rebuilt.
#[derive(Debug)]
pub struct SnapshotBuilder {
    backends_max: u32,
    mh_table_size: u32,
    generation: u64,
    /// Build attempts (failed ones too): stamps for `seen`.
    attempts: u64,
    /// Ids of backends that left their service, until [`SnapshotBuilder::reclaim`] frees them.
    retired: HashMap<(String, SocketAddr), BackendId>,
    free: Vec<BackendId>,
    next: u32,
    /// The last build's services by id: the spec and the entry built from it. A live
    /// service's backend ids are those of its entry.
    slots: Vec<Option<Slot>>,
    /// Service ids by name.
    names: HashMap<String, u32, ahash::RandomState>,
    /// Service ids free for new services.
    free_ids: Vec<u32>,
    /// The last build's service ids in its order, and each id's position in it.
    order: Vec<u32>,
    pos: Vec<u32>,
    /// The last build's frontends → service id.
    frontends: Arc<FrontendMap>,
    /// Their addresses (rebuilt with the map).
    vips: Arc<VipSet>,
    /// Per service id: the build attempt that saw it last.
    seen: Vec<u64>,
    /// Whether the next snapshots refuse every new flow.
    frozen: bool,
    /// Rate-limit buckets count from here.
    epoch: Instant,
    /// Ids of an adopted flow table not yet claimed (see `adopt`).
    adopted: adopt::Adopted,
}

impl SnapshotBuilder {
    /// A builder whose backend ids stay below `backends_max` (the flow table's counter
    /// array), building Maglev tables of `mh_table_size` slots.
    pub fn new(backends_max: u32, mh_table_size: u32) -> Self {
        SnapshotBuilder {
            backends_max,
            mh_table_size,
            generation: 0,
            attempts: 0,
            retired: HashMap::new(),
            free: Vec::new(),
            next: 0,
            slots: Vec::new(),
            names: HashMap::default(),
            free_ids: Vec::new(),
            order: Vec::new(),
            pos: Vec::new(),
            frontends: Arc::default(),
            vips: Arc::default(),
            seen: Vec::new(),
            frozen: false,
            // An hour back (when the clock allows): callers' clocks (and tests' fake ones)
            // that started a little before the builder still refill the buckets.
            epoch: {
                let now = Instant::now();
                now.checked_sub(Duration::from_secs(3600)).unwrap_or(now)
            },
            adopted: adopt::Adopted::default(),
        }
    }

    /// A builder sized from a config.
    pub fn from_config(c: &Config) -> Self {
        Self::new(c.flowtable.backends_max, c.dataplane.mh_table_size)
    }

    /// Builds the next snapshot from `services` and the network view `l2`. On error the
    /// builder is left as it was.
    pub fn build(
        &mut self,
        services: &[ServiceSpec],
        l2: &L2Table,
    ) -> Result<Snapshot, BuildError> {
        self.attempts += 1;
        let stamp = self.attempts;
        // Which id each spec has (by name), and which specs changed. Specs mostly come in
        // the order of the last build: try the next id of that order before hashing.
        let mut ids: Vec<u32> = Vec::with_capacity(services.len());
        let mut changed: Vec<usize> = Vec::new();
        let mut hint = 0usize;
        for (p, s) in services.iter().enumerate() {
            let id = match self.order.get(hint) {
                Some(&id) if self.slot(id).is_some_and(|x| x.spec.name == s.name) => Some(id),
                _ => self.names.get(s.name.as_str()).copied(),
            };
            match id {
                Some(id) => {
                    let i = id as usize;
                    if self.seen[i] == stamp {
                        return Err(BuildError::DuplicateName {
                            name: s.name.clone(),
                        });
                    }
                    self.seen[i] = stamp;
                    hint = self.pos[i] as usize + 1;
                    if self.slot(id).is_none_or(|x| x.spec != *s) {
                        changed.push(p);
                    }
                    ids.push(id);
                }
                None => {
                    changed.push(p);
                    ids.push(NO_ID);
                }
            }
        }
        let removed: Vec<u32> = self
            .order
            .iter()
            .copied()
            .filter(|&id| self.seen[id as usize] != stamp)
            .collect();

        let mut undo = Undo {
            slots_len: self.slots.len(),
            free_ids: Vec::new(),
            free: Vec::new(),
            next: self.next,
            retired: Vec::new(),
            adopted: adopt::AdoptedUndo::default(),
        };
        let result = self.build_changed(services, &mut ids, &changed, &removed, &mut undo);
        let (frontends, built, retire) = match result {
            Ok(r) => r,
            Err(e) => {
                self.rollback(undo);
                return Err(e);
            }
        };

        // Commit.
        for (key, id) in retire {
            self.retired.insert(key, id);
        }
        for &id in &removed {
            if let Some(slot) = self.slots[id as usize].take() {
                for b in &slot.entry.backends {
                    self.retired.insert((slot.spec.name.clone(), b.addr), b.id);
                }
                self.names.remove(&slot.spec.name);
                self.free_ids.push(id);
            }
        }
        for (p, entry) in built {
            let id = ids[p];
            let slot = &mut self.slots[id as usize];
            if slot.is_none() {
                self.names.insert(services[p].name.clone(), id);
            }
            *slot = Some(Slot {
                spec: services[p].clone(),
                entry,
            });
        }
        if !Arc::ptr_eq(&self.frontends, &frontends) {
            self.vips = Arc::new(VipSet::new(&frontends));
        }
        self.frontends = frontends;
        self.pos.clear();
        self.pos.resize(self.slots.len(), u32::MAX);
        for (p, &id) in ids.iter().enumerate() {
            self.pos[id as usize] = p as u32;
        }
        let list: Vec<Arc<ServiceEntry>> = ids
            .iter()
            .map(|&id| Arc::clone(&self.slot(id).expect("a live service").entry))
            .collect();
        self.order = ids;
        self.generation += 1;
        let synproxy_any = list.iter().any(|s| s.synproxy != SynproxySetting::Off);
        Ok(Snapshot {
            generation: self.generation,
            synproxy_any,
            services: ServiceTable {
                list,
                by_id: self.pos.clone(),
            },
            frozen: self.frozen,
            frontends: Arc::clone(&self.frontends),
            vips: Arc::clone(&self.vips),
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

    fn slot(&self, id: u32) -> Option<&Slot> {
        self.slots.get(id as usize).and_then(Option::as_ref)
    }

    /// The fallible part of a build: ids for new services, the new frontend map, and entries
    /// for the changed specs (with the backend ids to retire). Everything it takes from the
    /// builder is recorded in `undo`.
    #[allow(clippy::type_complexity)]
    fn build_changed(
        &mut self,
        services: &[ServiceSpec],
        ids: &mut [u32],
        changed: &[usize],
        removed: &[u32],
        undo: &mut Undo,
    ) -> Result<
        (
            Arc<FrontendMap>,
            Vec<(usize, Arc<ServiceEntry>)>,
            Vec<((String, SocketAddr), BackendId)>,
        ),
        BuildError,
    > {
        // Ids for new services (never one freed by this build).
        let mut new_names: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for &p in changed {
            if ids[p] != NO_ID {
                continue;
            }
            if !new_names.insert(services[p].name.as_str()) {
                return Err(BuildError::DuplicateName {
                    name: services[p].name.clone(),
                });
            }
            let adopted = self.claim_adopted_service(&services[p].frontends, undo);
            let id = match adopted.or_else(|| self.free_ids.pop()) {
                Some(id) if adopted.is_some() => id,
                Some(id) => {
                    undo.free_ids.push(id);
                    id
                }
                None => {
                    self.slots.push(None);
                    self.seen.push(0);
                    (self.slots.len() - 1) as u32
                }
            };
            self.seen[id as usize] = self.attempts;
            ids[p] = id;
        }

        // The frontend map: the last one, shared when no frontend changed (the common case:
        // endpoints come and go), else a patched copy.
        let same = removed.is_empty()
            && changed.iter().all(|&p| {
                self.slot(ids[p])
                    .is_some_and(|x| x.spec.frontends == services[p].frontends)
            });
        if same {
            return self
                .build_entries(services, ids, changed, undo)
                .map(|(built, retire)| (Arc::clone(&self.frontends), built, retire));
        }
        let mut frontends: FrontendMap = (*self.frontends).clone();
        let old_specs = removed
            .iter()
            .copied()
            .chain(changed.iter().map(|&p| ids[p]));
        for id in old_specs {
            if let Some(slot) = self.slot(id) {
                for f in &slot.spec.frontends {
                    if frontends.get(f) == Some(&id) {
                        frontends.remove(f);
                    }
                }
            }
        }
        for &p in changed {
            let s = &services[p];
            for f in &s.frontends {
                if let Some(&holder) = frontends.get(f) {
                    let first = match self.slot(holder) {
                        Some(x) if holder != ids[p] => x.spec.name.clone(),
                        _ => changed
                            .iter()
                            .find(|&&q| ids[q] == holder)
                            .map(|&q| services[q].name.clone())
                            .unwrap_or_default(),
                    };
                    return Err(BuildError::DuplicateFrontend {
                        frontend: *f,
                        first,
                        second: s.name.clone(),
                    });
                }
                frontends.insert(*f, ids[p]);
            }
        }
        let (built, retire) = self.build_entries(services, ids, changed, undo)?;
        Ok((Arc::new(frontends), built, retire))
    }

    /// Entries for the changed specs, and the backend ids their specs no longer list.
    #[allow(clippy::type_complexity)]
    fn build_entries(
        &mut self,
        services: &[ServiceSpec],
        ids: &[u32],
        changed: &[usize],
        undo: &mut Undo,
    ) -> Result<
        (
            Vec<(usize, Arc<ServiceEntry>)>,
            Vec<((String, SocketAddr), BackendId)>,
        ),
        BuildError,
    > {
        let mut built = Vec::with_capacity(changed.len());
        let mut retire = Vec::new();
        for &p in changed {
            let s = &services[p];
            let id = ids[p];
            let old_entry = self.slot(id).map(|x| Arc::clone(&x.entry));
            let old: &[BackendEntry] = old_entry.as_deref().map_or(&[], |e| &e.backends);
            let old_ids: HashMap<SocketAddr, BackendId, ahash::RandomState> =
                old.iter().map(|b| (b.addr, b.id)).collect();
            let mut backends: Vec<BackendEntry> = Vec::with_capacity(s.backends.len());
            // Address → position in `backends`.
            let mut listed: HashMap<SocketAddr, usize, ahash::RandomState> = HashMap::default();
            let mut fresh: Vec<(usize, SocketAddr)> = Vec::new();
            for b in &s.backends {
                // A source may list an endpoint twice (two EndpointSlices, two sources);
                // schedulers refuse duplicates, so the listings merge into the most usable
                // one (usable, then the larger weight): whichever comes first, every node
                // and every restart builds the same tables (mh across a tier).
                if let Some(&i) = listed.get(&b.addr) {
                    let e = &mut backends[i];
                    if (b.usable, b.weight) > (e.usable, e.weight) {
                        (e.usable, e.weight) = (b.usable, b.weight);
                    }
                    continue;
                }
                listed.insert(b.addr, backends.len());
                let bid = match old_ids.get(&b.addr) {
                    Some(id) => *id,
                    None => {
                        fresh.push((backends.len(), b.addr));
                        BackendId(u32::MAX)
                    }
                };
                backends.push(BackendEntry {
                    id: bid,
                    addr: b.addr,
                    weight: b.weight,
                    usable: b.usable,
                });
            }
            for (i, addr) in fresh {
                backends[i].id = match self.claim_adopted_backend(id, addr, undo) {
                    Some(adopted) => adopted,
                    None => self.take_backend_id(&s.name, addr, undo)?,
                };
            }
            for b in old {
                if !listed.contains_key(&b.addr) {
                    retire.push(((s.name.clone(), b.addr), b.id));
                }
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
            built.push((
                p,
                Arc::new(ServiceEntry {
                    id,
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
                    synproxy: s.synproxy,
                }),
            ));
        }
        Ok((built, retire))
    }

    /// An id for a backend new to its service: its retired id when it left recently, else a
    /// freed one, else the next unused one.
    fn take_backend_id(
        &mut self,
        service: &str,
        addr: SocketAddr,
        undo: &mut Undo,
    ) -> Result<BackendId, BuildError> {
        if !self.retired.is_empty() {
            let key = (service.to_owned(), addr);
            if let Some(id) = self.retired.remove(&key) {
                undo.retired.push((key, id));
                return Ok(id);
            }
        }
        if let Some(id) = self.free.pop() {
            undo.free.push(id);
            return Ok(id);
        }
        if self.next < self.backends_max {
            self.next += 1;
            return Ok(BackendId(self.next - 1));
        }
        Err(BuildError::TooManyBackends {
            max: self.backends_max,
        })
    }

    /// Gives back what a failed build took.
    fn rollback(&mut self, undo: Undo) {
        self.slots.truncate(undo.slots_len);
        self.seen.truncate(undo.slots_len);
        self.free_ids.extend(undo.free_ids.into_iter().rev());
        self.free.extend(undo.free.into_iter().rev());
        self.next = undo.next;
        self.retired.extend(undo.retired);
        self.unclaim_adopted(undo.adopted);
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

/// Frontend → service id.
type FrontendMap = HashMap<Frontend, u32, ahash::RandomState>;

/// Marks a spec without an id yet.
const NO_ID: u32 = u32::MAX;

/// A service of the last build.
#[derive(Debug)]
struct Slot {
    spec: ServiceSpec,
    entry: Arc<ServiceEntry>,
}

/// What a build took from the builder before it failed.
struct Undo {
    slots_len: usize,
    free_ids: Vec<u32>,
    free: Vec<BackendId>,
    next: u32,
    retired: Vec<((String, SocketAddr), BackendId)>,
    adopted: adopt::AdoptedUndo,
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

    fn spec(name: &str, vip: u8, backends: &[u8]) -> ServiceSpec {
        ServiceSpec {
            name: name.to_owned(),
            frontends: vec![Frontend {
                vip: IpAddr::from([198, 18, 100, vip]),
                protocol: Protocol::Tcp,
                port: 80,
            }],
            scheduler: SchedulerName::Rr,
            flags: Vec::new(),
            mode: Mode::Nat,
            affinity_timeout: None,
            backends: backends
                .iter()
                .map(|b| BackendSpec {
                    addr: SocketAddr::from(([198, 18, 1, *b], 80)),
                    weight: 1,
                    usable: true,
                })
                .collect(),
            source_ranges: Vec::new(),
            rate_limit: None,
            frozen: false,
            synproxy: SynproxySetting::Off,
        }
    }

    /// Inserting and removing services around others (which moves their positions) keeps
    /// the others' entries (scheduler state), service ids and backend ids; `services[id]`
    /// and `service_for` keep finding them.
    #[test]
    fn entries_are_reused_by_name_when_positions_move() {
        let mut b = SnapshotBuilder::new(1024, 251);
        let l2 = L2Table::default();
        let mut specs = vec![spec("b", 2, &[1, 2]), spec("d", 4, &[3, 4])];
        let s1 = b.build(&specs, &l2).unwrap();
        let (b1, d1) = (Arc::clone(&s1.services[0]), Arc::clone(&s1.services[1]));
        assert_eq!((b1.id, d1.id), (0, 1));
        // Advance b's rr cursor: a rebuilt entry would start over.
        let epoch = Instant::now();
        let affinity = AffinityTable::new(16, epoch);
        let flow = FlowTuple {
            src: ip("198.18.0.2"),
            src_port: 1000,
            dst: ip("198.18.100.2"),
            dst_port: 80,
        };
        assert_eq!(b1.schedule(&flow, &NoCounts, &affinity, epoch), Ok(0));
        // a and c arrive around them.
        specs = vec![
            spec("a", 1, &[5]),
            spec("b", 2, &[1, 2]),
            spec("c", 3, &[6]),
            spec("d", 4, &[3, 4]),
        ];
        let s2 = b.build(&specs, &l2).unwrap();
        let names: Vec<&str> = s2.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        assert!(Arc::ptr_eq(&s2.services[b1.id as usize], &b1));
        assert!(Arc::ptr_eq(&s2.services[d1.id as usize], &d1));
        let fe = |vip: u8| Frontend {
            vip: IpAddr::from([198, 18, 100, vip]),
            protocol: Protocol::Tcp,
            port: 80,
        };
        assert!(std::ptr::eq(s2.service_for(&fe(2)).unwrap(), &*b1));
        assert_eq!(s2.service_for(&fe(3)).unwrap().name, "c");
        assert_eq!(b1.schedule(&flow, &NoCounts, &affinity, epoch), Ok(1));
        let (a2, c2) = (
            Arc::clone(&s2.services.as_slice()[0]),
            Arc::clone(&s2.services.as_slice()[2]),
        );
        // Every id is distinct, every backend id too.
        let mut sids: Vec<u32> = s2.services.iter().map(|s| s.id).collect();
        sids.sort_unstable();
        sids.dedup();
        assert_eq!(sids.len(), 4);
        let mut bids: Vec<u32> = s2
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(|b| b.id.0))
            .collect();
        bids.sort_unstable();
        bids.dedup();
        assert_eq!(bids.len(), 6);
        // b goes away: the others keep their entries; b's backend ids are retired and its
        // frontend is gone.
        specs.remove(1);
        let s3 = b.build(&specs, &l2).unwrap();
        assert_eq!(s3.services.len(), 3);
        for e in [&a2, &c2, &d1] {
            assert!(Arc::ptr_eq(&s3.services[e.id as usize], e));
        }
        assert!(s3.services.get(b1.id as usize).is_none());
        assert!(s3.service_for(&fe(2)).is_none());
        let mut retired: Vec<BackendId> = b.retired().collect();
        retired.sort_unstable_by_key(|i| i.0);
        let mut b_ids: Vec<BackendId> = b1.backends.iter().map(|b| b.id).collect();
        b_ids.sort_unstable_by_key(|i| i.0);
        assert_eq!(retired, b_ids);
        // A new service takes b's frontend and gets a fresh entry (b's id may be reused).
        specs.push(spec("e", 2, &[7]));
        let s4 = b.build(&specs, &l2).unwrap();
        let e4 = s4.service_for(&fe(2)).unwrap();
        assert_eq!(e4.name, "e");
        assert!(Arc::ptr_eq(
            &s4.services[e4.id as usize],
            &s4.services.as_slice()[3]
        ));
        for e in [&a2, &c2, &d1] {
            assert!(Arc::ptr_eq(&s4.services[e.id as usize], e));
        }
        // b comes back while its ids are still retired: same backend ids, fresh entry.
        specs.insert(1, spec("b", 9, &[1, 2]));
        let s5 = b.build(&specs, &l2).unwrap();
        let b5 = s5.service_for(&fe(9)).unwrap();
        assert!(!std::ptr::eq(b5, &*b1));
        assert_eq!(
            b5.backends.iter().map(|b| b.id).collect::<Vec<_>>(),
            b1.backends.iter().map(|b| b.id).collect::<Vec<_>>()
        );
        assert_eq!(b.retired().count(), 0);
    }

    /// A failed build leaves the builder as it was: the next good build shares entries and
    /// hands out the same ids as if the failure never happened.
    #[test]
    fn a_failed_build_changes_nothing() {
        let mut b = SnapshotBuilder::new(4, 251);
        let l2 = L2Table::default();
        let good = vec![spec("a", 1, &[1]), spec("b", 2, &[2])];
        let s1 = b.build(&good, &l2).unwrap();
        // A duplicate frontend, a duplicate name, too many backends.
        let mut dup_fe = good.clone();
        dup_fe.push(spec("c", 1, &[3]));
        assert!(matches!(
            b.build(&dup_fe, &l2),
            Err(BuildError::DuplicateFrontend { .. })
        ));
        let mut dup_name = good.clone();
        dup_name.push(spec("a", 3, &[3]));
        assert!(matches!(
            b.build(&dup_name, &l2),
            Err(BuildError::DuplicateName { .. })
        ));
        let mut too_many = good.clone();
        too_many.push(spec("c", 3, &[3, 4, 5]));
        assert!(matches!(
            b.build(&too_many, &l2),
            Err(BuildError::TooManyBackends { .. })
        ));
        let mut next = good.clone();
        next.push(spec("c", 3, &[3, 4]));
        let s2 = b.build(&next, &l2).unwrap();
        assert!(Arc::ptr_eq(&s1.services[0], &s2.services[0]));
        assert!(Arc::ptr_eq(&s1.services[1], &s2.services[1]));
        let c = &s2.services.as_slice()[2];
        assert_eq!(c.id, 2);
        assert_eq!(
            c.backends.iter().map(|b| b.id.0).collect::<Vec<_>>(),
            [2, 3]
        );
        assert_eq!(s2.generation, s1.generation + 1);
    }
}
