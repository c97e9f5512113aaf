//! The services of a snapshot: [`ServiceEntry`] (its backends, its prebuilt scheduler, the
//! admission of a new flow and [`ServiceEntry::schedule`]), [`NoBackend`] when it finds no
//! backend, and [`ServiceTable`], the services in the source's order and by id.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lb_algos::{AffinityTable, BackendId, ConnCounts, FlowTuple, Scheduler};
use vocab::{Cidr, Mode};

use super::{Frontend, NoEndpoints, SynproxySetting};
use crate::limit::TokenBucket;
use crate::pipeline::DropReason;

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
    pub source_ranges: Vec<Cidr>,
    /// The new-connection rate limit, shared by every worker.
    pub limiter: Option<TokenBucket>,
    /// New flows refused.
    pub frozen: bool,
    /// New flows refused by the rate limit (this entry's lifetime).
    pub rate_limited: AtomicU64,
    /// The SYN proxy.
    pub synproxy: SynproxySetting,
    /// What a new flow gets when no backend is usable.
    pub no_endpoints: NoEndpoints,
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
    #[inline(always)]
    pub fn schedule<C: ConnCounts + ?Sized>(
        &self,
        flow: &FlowTuple,
        counts: &C,
        affinity: &AffinityTable,
        now: Instant,
    ) -> Result<usize, NoBackend> {
        // A service without ClientIP affinity (most): the scheduler's pick, inline; the
        // affinity and the reason for no backend out of line.
        if self.affinity_timeout.is_none() {
            return match self.scheduler.pick(flow, counts, now) {
                Some(i) => Ok(i),
                None => Err(self.no_backend()),
            };
        }
        self.schedule_affine(flow, counts, affinity, now)
    }

    /// [`schedule`](Self::schedule) for a service with ClientIP affinity.
    #[inline(never)]
    fn schedule_affine<C: ConnCounts + ?Sized>(
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
                affinity.insert(self.id, flow.src, self.backends[i].id, now);
                Ok(i)
            }
            None => Err(self.no_backend()),
        }
    }

    /// Why the scheduler found no backend.
    #[cold]
    #[inline(never)]
    fn no_backend(&self) -> NoBackend {
        if self.backends.is_empty() {
            NoBackend::Empty
        } else if self.backends.iter().all(|b| !b.usable || b.weight == 0) {
            NoBackend::AllDrained
        } else {
            NoBackend::Refused
        }
    }
}

/// The services of a snapshot: in the source's order (`iter`, `as_slice`) and by
/// [`ServiceEntry::id`] (`get`, `[id]`).
#[derive(Debug, Default)]
pub struct ServiceTable {
    pub(super) list: Vec<Arc<ServiceEntry>>,
    /// Position in `list` by service id (`u32::MAX`: no such service).
    pub(super) by_id: Vec<u32>,
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
