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
//!
//! This file holds [`Snapshot`], the read side the pipeline sees; the rest is one subject per
//! file: `l2` (routes, neighbours, next hops), `spec` (the builder's input), `service` (the
//! services' entries and scheduling), `builder` (the [`SnapshotBuilder`]), `isolate` (a build
//! that leaves out the specs it cannot build), `adopt` (ids taken over from an adopted flow
//! table), `admit` (which flows read from a state file the config can own: [`StateCheck`]),
//! `v4_frontends` (the IPv4 frontends by one packed word, for the shortcut's new flows).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use vocab::Cidr;

mod admit;
mod adopt;
mod builder;
mod isolate;
mod l2;
#[cfg(test)]
mod mh_order;
mod service;
mod spec;
#[cfg(test)]
mod tests;
mod v4_frontends;

use v4_frontends::V4Frontends;

pub use crate::limit::RateLimit;
pub use admit::{SERVICE_IDS_MAX, StateCheck};
pub use adopt::{AdoptedIds, AdoptedService, IdsCollector};
pub use builder::{BuildError, SnapshotBuilder};
pub use isolate::Refused;
pub use l2::{L2Table, Neighbour, NextHop, Route};
pub use service::{BackendEntry, NoBackend, ServiceEntry, ServiceTable};
pub use spec::{BackendSpec, Frontend, NoEndpoints, ServiceSpec, SynproxySetting};

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
    /// The addresses of the frontends of `cluster_ip` specs, sorted: a packet to one of
    /// them for no frontend is rejected (`unserved_port`).
    cluster_ips: Arc<VipSet>,
    /// The Service CIDRs: a packet to an address inside one for no frontend (and no
    /// ClusterIP) is dropped (`service_cidr`). At most `config::SERVICE_CIDRS_MAX`.
    service_cidrs: Arc<[Cidr]>,
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

    /// [`service_for`](Self::service_for) for an IPv4 frontend (`vip` as
    /// `Ipv4Addr::to_bits`): the same service, found by one packed word (the new-flow path of
    /// the IPv4 shortcut: no `IpAddr` hashed or compared).
    #[inline(always)]
    pub fn service_for_v4(
        &self,
        vip: u32,
        protocol: flowtable::Protocol,
        port: u16,
    ) -> Option<&ServiceEntry> {
        let id = self.vips.by_v4.get(v4_frontend(vip, protocol, port))?;
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

    /// Whether `dst` is on a link of ours: no route, or its longest matching route has no
    /// gateway (a DSR `l2` backend must be).
    #[inline]
    pub fn on_link(&self, dst: IpAddr) -> bool {
        let route = self.routes.iter().find(|r| r.prefix.contains(dst));
        route.is_none_or(|r| r.gateway.is_none())
    }

    /// Whether any frontend uses `vip` (a binary search).
    #[inline]
    pub fn is_vip(&self, vip: IpAddr) -> bool {
        self.vips.contains(vip)
    }

    /// [`is_vip`](Self::is_vip) for an IPv4 address (`Ipv4Addr::to_bits`).
    #[inline]
    pub fn is_vip_v4(&self, vip: u32) -> bool {
        self.vips.v4.binary_search(&vip).is_ok()
    }

    /// Whether `ip` is a ClusterIP (the address of a `cluster_ip` spec's frontend; a binary
    /// search).
    #[inline]
    pub fn is_cluster_ip(&self, ip: IpAddr) -> bool {
        self.cluster_ips.contains(ip)
    }

    /// Whether `ip` lies inside a Service CIDR.
    #[inline]
    pub fn in_service_cidr(&self, ip: IpAddr) -> bool {
        self.service_cidrs.iter().any(|c| c.contains(ip))
    }

    /// The ClusterIPs, IPv4 first, each sorted (what the steering program redirects for
    /// every port).
    pub fn cluster_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.cluster_ips.iter()
    }

    /// The Service CIDRs.
    pub fn service_cidrs(&self) -> &[Cidr] {
        &self.service_cidrs
    }
}

/// Every frontend address of a [`FrontendMap`], sorted per family, built with the map (off
/// the hot path) and shared with it.
///
/// The frontends' IPv4 entries are kept a second time, keyed by one packed word
/// ([`v4_frontend`]), for [`Snapshot::service_for_v4`]: built here, with the map, so the two
/// never disagree.
#[derive(Debug, Default)]
struct VipSet {
    v4: Box<[u32]>,
    v6: Box<[u128]>,
    /// The map's IPv4 frontends by [`v4_frontend`] (empty in a set made by [`VipSet::of`]).
    by_v4: V4Frontends,
}

/// An IPv4 frontend as one word: address, port, protocol (distinct frontends, distinct
/// words).
#[inline(always)]
fn v4_frontend(vip: u32, protocol: flowtable::Protocol, port: u16) -> u64 {
    u64::from(vip) | u64::from(port) << 32 | u64::from(protocol as u8) << 48
}

impl VipSet {
    fn new(frontends: &FrontendMap) -> Self {
        let mut set = Self::of(frontends.keys().map(|f| f.vip));
        set.by_v4 = V4Frontends::build(frontends.iter().filter_map(|(f, &id)| match f.vip {
            IpAddr::V4(a) => Some((v4_frontend(a.to_bits(), f.protocol, f.port), id)),
            IpAddr::V6(_) => None,
        }));
        set
    }

    /// The set of `addrs`.
    fn of(addrs: impl Iterator<Item = IpAddr>) -> Self {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for a in addrs {
            match a {
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
            by_v4: V4Frontends::default(),
        }
    }

    #[inline]
    fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.v4.binary_search(&a.to_bits()).is_ok(),
            IpAddr::V6(a) => self.v6.binary_search(&a.to_bits()).is_ok(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let v4 = self
            .v4
            .iter()
            .map(|a| IpAddr::V4(std::net::Ipv4Addr::from_bits(*a)));
        let v6 = self
            .v6
            .iter()
            .map(|a| IpAddr::V6(std::net::Ipv6Addr::from_bits(*a)));
        v4.chain(v6)
    }
}

/// Frontend → service id.
type FrontendMap = HashMap<Frontend, u32, ahash::RandomState>;
