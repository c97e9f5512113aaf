//! Endpoint selection for one (Service, port, frontend group): which endpoints of the
//! EndpointSlices take new flows, following kube-proxy's `CategorizeEndpoints`:
//!
//! - Readiness: a nil `ready` or `serving` condition counts as true, a nil `terminating` as
//!   false (as kube-proxy reads them).
//! - `Cluster` policy: the ready endpoints (narrowed by topology, below); with none ready
//!   anywhere, the serving-and-terminating ones (the terminating fallback).
//! - `Local` policy: the ready endpoints on this node; with none, the serving-and-terminating
//!   endpoints on this node; with none of those either, nothing (traffic is dropped). A
//!   `Local` policy takes precedence over `trafficDistribution`.
//! - Topology (`Cluster` policy only; `PreferSameNode` first, then zone):
//!   - same node: when every ready endpoint carries `hints.forNodes`, those hinted for this
//!     node; without node hints, the ready endpoints whose `nodeName` is this node. Used
//!     when there is at least one; otherwise the zone rule applies.
//!   - same zone: when every ready endpoint carries `hints.forZones` and at least one names
//!     this node's zone, those; otherwise every ready endpoint (cluster-wide).
//!
//! Serving-and-terminating endpoints inside the policy's scope that are not selected are
//! kept as unusable backends (weight 0): established flows to them drain instead of being
//! cut, as IPVS's graceful termination does.

use std::net::SocketAddr;

use k8s_openapi::api::discovery::v1::{ForNode, ForZone};

use super::NodeInfo;

/// One endpoint address of one port, as read from a slice.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ep<'a> {
    pub addr: SocketAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node: Option<&'a str>,
    pub zone_hints: &'a [ForZone],
    pub node_hints: &'a [ForNode],
}

impl Ep<'_> {
    fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
    fn local(&self, node: &NodeInfo) -> bool {
        self.node == Some(node.name.as_str())
    }
    /// Rank for de-duplication: an address listed twice (slices in transition) keeps its
    /// most usable copy.
    fn rank(&self) -> u8 {
        if self.ready {
            0
        } else if self.serving_terminating() {
            1
        } else {
            2
        }
    }
}

/// Which traffic distribution a group uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    /// Every endpoint.
    Any,
    /// `PreferSameZone` / `PreferClose` / `topology-mode: Auto`.
    SameZone,
    /// `PreferSameNode`.
    SameNode,
}

/// The traffic policy of a frontend group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// `Cluster` (the default), with a topology preference.
    Cluster(Topology),
    /// `Local`.
    Local,
}

/// Sorts by address and drops duplicate addresses, keeping the most usable copy.
pub(crate) fn dedup(eps: &mut Vec<Ep<'_>>) {
    eps.sort_by_key(|e| (e.addr, e.rank()));
    eps.dedup_by_key(|e| e.addr);
}

/// The backends of a group: `(address, usable)`, sorted by address.
pub(crate) fn select(eps: &[Ep<'_>], policy: Policy, node: &NodeInfo) -> Vec<(SocketAddr, bool)> {
    let selected: Vec<&Ep<'_>> = match policy {
        Policy::Local => {
            let local = || eps.iter().filter(|e| e.local(node));
            if local().any(|e| e.ready) {
                local().filter(|e| e.ready).collect()
            } else {
                local().filter(|e| e.serving_terminating()).collect()
            }
        }
        Policy::Cluster(topology) => {
            let ready: Vec<&Ep<'_>> = eps.iter().filter(|e| e.ready).collect();
            if ready.is_empty() {
                eps.iter().filter(|e| e.serving_terminating()).collect()
            } else {
                narrow(ready, topology, node)
            }
        }
    };
    // Every other endpoint the slices list stays as a backend that takes no new flows:
    // terminating ones (their TCP flows continue until they end), not-ready ones, and ones
    // outside the policy's or the topology's scope. Only an endpoint gone from the slices
    // leaves the spec, and that is what "removed" means for its flows (UDP re-steered at
    // once, TCP per `[flowtable] removed_backend_tcp`).
    let mut out: Vec<(SocketAddr, bool)> = selected.iter().map(|e| (e.addr, true)).collect();
    for e in eps {
        if !selected.iter().any(|s| s.addr == e.addr) {
            out.push((e.addr, false));
        }
    }
    out.sort_unstable();
    out
}

/// Applies the topology preference to a non-empty set of ready endpoints.
fn narrow<'e, 'a>(ready: Vec<&'e Ep<'a>>, topology: Topology, node: &NodeInfo) -> Vec<&'e Ep<'a>> {
    if topology == Topology::Any {
        return ready;
    }
    if topology == Topology::SameNode {
        let hinted = ready.iter().all(|e| !e.node_hints.is_empty());
        let same_node: Vec<&Ep<'_>> = ready
            .iter()
            .copied()
            .filter(|e| {
                if hinted {
                    e.node_hints.iter().any(|h| h.name == node.name)
                } else {
                    e.local(node)
                }
            })
            .collect();
        if !same_node.is_empty() {
            return same_node;
        }
    }
    let Some(zone) = node.zone.as_deref() else {
        return ready;
    };
    if !ready.iter().all(|e| !e.zone_hints.is_empty()) {
        return ready;
    }
    let same_zone: Vec<&Ep<'_>> = ready
        .iter()
        .copied()
        .filter(|e| e.zone_hints.iter().any(|h| h.name == zone))
        .collect();
    if same_zone.is_empty() {
        ready
    } else {
        same_zone
    }
}
