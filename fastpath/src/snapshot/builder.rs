//! [`SnapshotBuilder`]: builds each [`Snapshot`] from the [`ServiceSpec`]s and the
//! [`L2Table`], keeping service and backend ids stable across builds ([`BuildError`] when it
//! cannot; a failed build is undone).
//!
//! Two ways to build: [`SnapshotBuilder::build`] refuses the whole list when one spec cannot
//! be built (`xvs check`, tests, tools that want to know); [`SnapshotBuilder::build_isolated`]
//! (the daemon's) leaves out each spec it cannot build, keeping that spec's previous version
//! when there is one, and says which and why ([`Refused`]): one bad service never stops the
//! others from being programmed.
//!
//! The builder stays in the fastpath crate, not the slowpath's: it fills the snapshot's
//! private fields, and fastpath's own tests and benches, `xvs sim` and the pcap replay build
//! snapshots too, so moving it to slowpath (which depends on fastpath) would need a
//! dependency cycle.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use config::{Cidr, Config, SchedFlag};
use lb_algos::{Backend, BackendId, SchedFlags, SchedParams, Scheduler};

use super::{
    BackendEntry, Frontend, FrontendMap, L2Table, ServiceEntry, ServiceSpec, ServiceTable,
    Snapshot, SynproxySetting, VipSet, adopt,
};
use crate::limit::TokenBucket;

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
    /// More backends than `[flowtable] backends_max`, all services together.
    #[error("service {service}: more than {max} backends in all (flowtable.backends_max)")]
    TooManyBackends {
        /// The service whose backends did not fit.
        service: String,
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

/// Builds snapshots, keeping service ids and backend ids stable across builds.
///
/// A build costs one comparison per unchanged spec (its entry is shared, found by name; in
/// the common case without a hash lookup), plus the work for the specs that changed: the
/// frontend map and the id tables are patched, not rebuilt.
#[derive(Debug)]
pub struct SnapshotBuilder {
    pub(super) backends_max: u32,
    mh_table_size: u32,
    generation: u64,
    /// Build attempts (failed ones too): stamps for `seen`.
    attempts: u64,
    /// Ids of backends that left their service, until [`SnapshotBuilder::reclaim`] frees them.
    pub(super) retired: HashMap<(String, SocketAddr), BackendId>,
    pub(super) free: Vec<BackendId>,
    pub(super) next: u32,
    /// The last build's services by id: the spec and the entry built from it. A live
    /// service's backend ids are those of its entry.
    pub(super) slots: Vec<Option<Slot>>,
    /// Service ids by name.
    names: HashMap<String, u32, ahash::RandomState>,
    /// Service ids free for new services.
    pub(super) free_ids: Vec<u32>,
    /// The last build's service ids in its order, and each id's position in it.
    order: Vec<u32>,
    pos: Vec<u32>,
    /// The last build's frontends → service id.
    frontends: Arc<FrontendMap>,
    /// Their addresses (rebuilt with the map).
    vips: Arc<VipSet>,
    /// The addresses of the `cluster_ip` specs' frontends (rebuilt with the map).
    cluster_ips: Arc<VipSet>,
    /// The Service CIDRs of the next snapshots.
    service_cidrs: Arc<[Cidr]>,
    /// Per service id: the build attempt that saw it last.
    pub(super) seen: Vec<u64>,
    /// Whether the next snapshots refuse every new flow.
    frozen: bool,
    /// Rate-limit buckets count from here.
    epoch: Instant,
    /// Ids of an adopted flow table not yet claimed (see `adopt`).
    pub(super) adopted: adopt::Adopted,
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
            cluster_ips: Arc::default(),
            service_cidrs: Arc::from([]),
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
        self.try_build(services, l2)
            .map_err(|mut e| e.swap_remove(0).1)
    }

    /// [`build`](Self::build), or the position in `services` and the error of every spec
    /// that failed in the first stage that had failures (names, then frontends, then
    /// entries: a later stage needs the earlier ones settled). On error the builder is left
    /// as it was.
    pub(super) fn try_build(
        &mut self,
        services: &[ServiceSpec],
        l2: &L2Table,
    ) -> Result<Snapshot, Vec<(usize, BuildError)>> {
        self.attempts += 1;
        let stamp = self.attempts;
        let (mut ids, changed) = self.match_names(services, stamp)?;
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
        self.commit(services, ids, &removed, frontends, built, retire);
        Ok(self.snapshot(l2))
    }

    /// Which id each spec has (by name, stamped `stamp` in `seen`; [`NO_ID`] for a name new
    /// to the builder), and which specs changed. A name listed twice is an error; then
    /// only stamps were taken, nothing to give back.
    #[allow(clippy::type_complexity)]
    fn match_names(
        &mut self,
        services: &[ServiceSpec],
        stamp: u64,
    ) -> Result<(Vec<u32>, Vec<usize>), Vec<(usize, BuildError)>> {
        // Specs mostly come in the order of the last build: try the next id of that order
        // before hashing.
        let mut ids: Vec<u32> = Vec::with_capacity(services.len());
        let mut changed: Vec<usize> = Vec::new();
        let mut hint = 0usize;
        let mut errors = Vec::new();
        for (p, s) in services.iter().enumerate() {
            let id = match self.order.get(hint) {
                Some(&id) if self.slot(id).is_some_and(|x| x.spec.name == s.name) => Some(id),
                _ => self.names.get(s.name.as_str()).copied(),
            };
            match id {
                Some(id) => {
                    let i = id as usize;
                    if self.seen[i] == stamp {
                        errors.push((
                            p,
                            BuildError::DuplicateName {
                                name: s.name.clone(),
                            },
                        ));
                        ids.push(NO_ID);
                        continue;
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
        if errors.is_empty() {
            Ok((ids, changed))
        } else {
            Err(errors)
        }
    }

    /// Makes a successful build the builder's state: backend ids retired, removed services
    /// freed, built entries in their slots, the frontend map and VIP sets, the order.
    #[allow(clippy::type_complexity)]
    fn commit(
        &mut self,
        services: &[ServiceSpec],
        ids: Vec<u32>,
        removed: &[u32],
        frontends: Arc<FrontendMap>,
        built: Vec<(usize, Arc<ServiceEntry>)>,
        retire: Vec<((String, SocketAddr), BackendId)>,
    ) {
        for (key, id) in retire {
            self.retired.insert(key, id);
        }
        for &id in removed {
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
            self.cluster_ips = Arc::new(VipSet::of(
                self.slots
                    .iter()
                    .flatten()
                    .filter(|x| x.spec.cluster_ip)
                    .flat_map(|x| x.spec.frontends.iter().map(|f| f.vip)),
            ));
        }
        self.frontends = frontends;
        self.pos.clear();
        self.pos.resize(self.slots.len(), u32::MAX);
        for (p, &id) in ids.iter().enumerate() {
            self.pos[id as usize] = p as u32;
        }
        self.order = ids;
        self.generation += 1;
    }

    /// The snapshot of the builder's state (after [`commit`](Self::commit)) over `l2`.
    fn snapshot(&self, l2: &L2Table) -> Snapshot {
        let list: Vec<Arc<ServiceEntry>> = self
            .order
            .iter()
            .map(|&id| Arc::clone(&self.slot(id).expect("a live service").entry))
            .collect();
        // (The entries' settings: a DSR service's is off.)
        debug_assert!(
            list.iter()
                .flat_map(|s| s.backends.iter())
                .all(|b| b.id.0 < self.backends_max),
            "builder rule: backend ids come from the builder's own range (below backends_max)"
        );
        debug_assert!(
            self.order.iter().all(|&id| {
                self.slot(id)
                    .is_some_and(|x| self.names.get(x.spec.name.as_str()) == Some(&id))
            }),
            "builder rule: one service id per name, kept across builds"
        );
        let synproxy_any = list.iter().any(|s| s.synproxy != SynproxySetting::Off);
        Snapshot {
            generation: self.generation,
            synproxy_any,
            services: ServiceTable {
                list,
                by_id: self.pos.clone(),
            },
            frozen: self.frozen,
            frontends: Arc::clone(&self.frontends),
            vips: Arc::clone(&self.vips),
            cluster_ips: Arc::clone(&self.cluster_ips),
            service_cidrs: Arc::clone(&self.service_cidrs),
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
        }
    }

    fn slot(&self, id: u32) -> Option<&Slot> {
        self.slots.get(id as usize).and_then(Option::as_ref)
    }

    /// The spec last built under `name`, if it is in the last snapshot.
    pub(super) fn previous(&self, name: &str) -> Option<&ServiceSpec> {
        let id = *self.names.get(name)?;
        self.slot(id).map(|x| &x.spec)
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
        Vec<(usize, BuildError)>,
    > {
        self.new_ids(services, ids, changed, undo)?;
        // The frontend map: the last one, shared when no frontend changed (the common case:
        // endpoints come and go), else a patched copy.
        // (The ClusterIP set is rebuilt with the map: a spec's flag counts as a frontend.)
        let same = removed.is_empty()
            && changed.iter().all(|&p| {
                self.slot(ids[p]).is_some_and(|x| {
                    x.spec.frontends == services[p].frontends
                        && x.spec.cluster_ip == services[p].cluster_ip
                })
            });
        if same {
            return self
                .build_entries(services, ids, changed, undo)
                .map(|(built, retire)| (Arc::clone(&self.frontends), built, retire));
        }
        let frontends = self.patch_frontends(services, ids, changed, removed)?;
        let (built, retire) = self.build_entries(services, ids, changed, undo)?;
        Ok((Arc::new(frontends), built, retire))
    }

    /// Ids for the changed specs new to the builder (never one freed by this build): an
    /// adopted one, else a freed one, else a new slot.
    fn new_ids(
        &mut self,
        services: &[ServiceSpec],
        ids: &mut [u32],
        changed: &[usize],
        undo: &mut Undo,
    ) -> Result<(), Vec<(usize, BuildError)>> {
        let mut new_names: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut errors = Vec::new();
        for &p in changed {
            if ids[p] != NO_ID {
                continue;
            }
            if !new_names.insert(services[p].name.as_str()) {
                errors.push((
                    p,
                    BuildError::DuplicateName {
                        name: services[p].name.clone(),
                    },
                ));
                continue;
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
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// A copy of the frontend map without the removed and changed services' frontends, then
    /// with the changed specs' ones; a frontend two services claim is an error.
    fn patch_frontends(
        &self,
        services: &[ServiceSpec],
        ids: &[u32],
        changed: &[usize],
        removed: &[u32],
    ) -> Result<FrontendMap, Vec<(usize, BuildError)>> {
        let mut errors = Vec::new();
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
        'specs: for &p in changed {
            let s = &services[p];
            for (k, f) in s.frontends.iter().enumerate() {
                if let Some(&holder) = frontends.get(f) {
                    let first = match self.slot(holder) {
                        Some(x) if holder != ids[p] => x.spec.name.clone(),
                        _ => changed
                            .iter()
                            .find(|&&q| ids[q] == holder)
                            .map(|&q| services[q].name.clone())
                            .unwrap_or_default(),
                    };
                    errors.push((
                        p,
                        BuildError::DuplicateFrontend {
                            frontend: *f,
                            first,
                            second: s.name.clone(),
                        },
                    ));
                    // The specs after it are still checked, against the ones that stay.
                    for g in &s.frontends[..k] {
                        frontends.remove(g);
                    }
                    continue 'specs;
                }
                frontends.insert(*f, ids[p]);
            }
        }
        if errors.is_empty() {
            Ok(frontends)
        } else {
            Err(errors)
        }
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
        Vec<(usize, BuildError)>,
    > {
        let mut built = Vec::with_capacity(changed.len());
        let mut retire = Vec::new();
        let mut errors = Vec::new();
        for &p in changed {
            let mark = undo.mark(self.next);
            match self.build_entry(&services[p], ids[p], undo, &mut retire) {
                Ok(entry) => built.push((p, entry)),
                Err(e) => {
                    // The specs after it may have the backend ids it took.
                    self.give_back(undo, mark);
                    errors.push((p, e));
                }
            }
        }
        if errors.is_empty() {
            Ok((built, retire))
        } else {
            Err(errors)
        }
    }

    /// The entry of the changed spec `s` (service `id`); the backend ids it no longer lists
    /// go to `retire`.
    fn build_entry(
        &mut self,
        s: &ServiceSpec,
        id: u32,
        undo: &mut Undo,
        retire: &mut Vec<((String, SocketAddr), BackendId)>,
    ) -> Result<Arc<ServiceEntry>, BuildError> {
        let backends = self.entry_backends(s, id, undo, retire)?;
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
        let scheduler =
            Scheduler::build(s.scheduler, &sched_backends, &params).map_err(|source| {
                BuildError::Scheduler {
                    service: s.name.clone(),
                    source,
                }
            })?;
        Ok(Arc::new(ServiceEntry {
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
            // The SYN proxy needs the replies, which a DSR service never sees.
            synproxy: match s.mode {
                vocab::Mode::Dsr(_) => SynproxySetting::Off,
                _ => s.synproxy,
            },
            no_endpoints: s.no_endpoints,
        }))
    }

    /// The backends of the changed spec `s` (service `id`), each address once, with its id:
    /// the one it had, else an adopted one, else a new one; the ids of the backends it no
    /// longer lists go to `retire`.
    fn entry_backends(
        &mut self,
        s: &ServiceSpec,
        id: u32,
        undo: &mut Undo,
        retire: &mut Vec<((String, SocketAddr), BackendId)>,
    ) -> Result<Vec<BackendEntry>, BuildError> {
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
        Ok(backends)
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
            service: service.to_owned(),
            max: self.backends_max,
        })
    }

    /// Gives back the backend ids taken since `mark` (one spec's, when its entry failed).
    fn give_back(&mut self, undo: &mut Undo, mark: Mark) {
        self.free.extend(undo.free.drain(mark.free..).rev());
        self.retired.extend(undo.retired.drain(mark.retired..));
        let adopted = undo.adopted.backends_since(mark.adopted);
        self.unclaim_adopted(adopted);
        self.next = mark.next;
    }

    /// Gives back what a failed build took.
    fn rollback(&mut self, undo: Undo) {
        debug_assert!(
            self.slots.len() >= undo.slots_len && self.next >= undo.next,
            "builder rule: a failed build is undone (it only added slots and took ids)"
        );
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

    /// Sets the Service CIDRs of the snapshots built from now on (the caller validated them
    /// and kept at most `config::SERVICE_CIDRS_MAX`; more are cut there).
    pub fn set_service_cidrs(&mut self, cidrs: &[Cidr]) {
        let cidrs = &cidrs[..cidrs.len().min(config::SERVICE_CIDRS_MAX)];
        if *self.service_cidrs != *cidrs {
            self.service_cidrs = Arc::from(cidrs);
        }
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

/// Marks a spec without an id yet.
const NO_ID: u32 = u32::MAX;

/// A service of the last build.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) spec: ServiceSpec,
    entry: Arc<ServiceEntry>,
}

/// What a build took from the builder before it failed.
pub(super) struct Undo {
    slots_len: usize,
    free_ids: Vec<u32>,
    free: Vec<BackendId>,
    next: u32,
    retired: Vec<((String, SocketAddr), BackendId)>,
    pub(super) adopted: adopt::AdoptedUndo,
}

/// How much of an [`Undo`] was taken at some point of a build.
#[derive(Clone, Copy)]
struct Mark {
    free: usize,
    retired: usize,
    adopted: usize,
    next: u32,
}

impl Undo {
    fn mark(&self, next: u32) -> Mark {
        Mark {
            free: self.free.len(),
            retired: self.retired.len(),
            adopted: self.adopted.backends_taken(),
            next,
        }
    }
}
