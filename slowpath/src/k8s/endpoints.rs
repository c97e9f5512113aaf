//! Endpoint selection for one (Service, port, address family): kube-proxy's
//! `CategorizeEndpoints` (`pkg/proxy/topology.go`), rule for rule. The case table in
//! `topology_cases.rs` is kube-proxy's own `TestCategorizeEndpoints`.
//!
//! - Readiness: a nil `ready` or `serving` condition counts as true, a nil `terminating` as
//!   false (as kube-proxy reads them).
//! - Cluster endpoints (used when `internalTrafficPolicy` is `Cluster`, or the port is
//!   externally accessible): the ready endpoints available for the topology mode; with none
//!   ready anywhere, the serving-and-terminating ones (the terminating fallback).
//! - Topology mode, decided from the endpoints alone, whatever the Service says
//!   (`trafficDistribution` and the `topology-mode` annotation only tell the EndpointSlice
//!   controller to write hints): `PreferSameNode` when every ready endpoint has
//!   `hints.forNodes` and one names this node; else `PreferSameZone` when every ready
//!   endpoint has `hints.forZones` and one names this node's zone; else none (every ready
//!   endpoint). There is no fallback to `nodeName`.
//! - Local endpoints (used when either traffic policy is `Local`; the external one only when
//!   the port is externally accessible): the ready endpoints on this node; with none, the
//!   serving-and-terminating endpoints on this node; with none of those either, nothing
//!   (traffic is dropped). Topology is ignored for them.
//!
//! Endpoints the group does not select are kept as unusable backends (weight 0): established
//! flows to them drain instead of being cut, as IPVS's graceful termination does.

use std::collections::HashSet;
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
    fn hinted_for_node(&self, node: &NodeInfo) -> bool {
        self.node_hints.iter().any(|h| h.name == node.name)
    }
    fn hinted_for_zone(&self, zone: &str) -> bool {
        self.zone_hints.iter().any(|h| h.name == zone)
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

/// The topology mode kube-proxy derives from the hints (`topologyModeFromHints`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TopologyMode {
    /// Every ready endpoint.
    Any,
    /// The ready endpoints hinted for this node's zone.
    SameZone,
    /// The ready endpoints hinted for this node.
    SameNode,
}

/// Which endpoint sets a Service port uses: kube-proxy's `UsesClusterEndpoints` and
/// `UsesLocalEndpoints`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Uses {
    pub cluster: bool,
    pub local: bool,
}

impl Uses {
    /// From the traffic policies and whether the port is externally accessible (a
    /// NodePort, an externalIP or a load-balancer IP). `externalTrafficPolicy: Local` counts
    /// only for an externally accessible port; such a port uses the cluster endpoints too
    /// (kube-proxy short-circuits traffic from the node itself to them).
    pub fn of(internal_local: bool, external_local: bool, externally_accessible: bool) -> Uses {
        Uses {
            cluster: !internal_local || externally_accessible,
            local: internal_local || (external_local && externally_accessible),
        }
    }
}

/// The result of [`categorize`], as kube-proxy's `CategorizeEndpoints` returns it.
#[derive(Debug)]
pub(crate) struct Categorized<'e, 'a> {
    /// The endpoints of `Cluster` traffic policy; None when the port never uses them.
    pub cluster: Option<Vec<&'e Ep<'a>>>,
    /// The endpoints of `Local` traffic policy; None when the port never uses them.
    pub local: Option<Vec<&'e Ep<'a>>>,
    /// Whether the Service has a usable endpoint anywhere in the cluster (true even when
    /// this node reaches none of them). kube-proxy tells "drop" from "reject" with it, and so
    /// does the translation: a traffic policy `Local` without local endpoints drops while
    /// the Service has some elsewhere, rejects when it has none.
    pub has_any: bool,
}

impl<'e, 'a> Categorized<'e, 'a> {
    /// Every endpoint reachable from this node: the union of the two sets, by address.
    #[cfg(test)]
    pub fn all(&self) -> Vec<&'e Ep<'a>> {
        let mut all: Vec<&Ep<'_>> = self
            .cluster
            .iter()
            .chain(&self.local)
            .flatten()
            .copied()
            .collect();
        all.sort_by_key(|e| e.addr);
        all.dedup_by_key(|e| e.addr);
        all
    }
}

/// Sorts by address and drops duplicate addresses, keeping the most usable copy.
pub(crate) fn dedup(eps: &mut Vec<Ep<'_>>) {
    eps.sort_by_key(|e| (e.addr, e.rank()));
    eps.dedup_by_key(|e| e.addr);
}

/// kube-proxy's `topologyModeFromHints`, with the `PreferSameTrafficDistribution` feature
/// gate on (its default since v1.34).
pub(crate) fn topology_mode(eps: &[Ep<'_>], node: &NodeInfo) -> TopologyMode {
    let zone = node.zone.as_deref().unwrap_or("");
    let mut any_ready = false;
    let (mut all_node_hints, mut for_node) = (true, false);
    let (mut all_zone_hints, mut for_zone) = (true, false);
    for e in eps.iter().filter(|e| e.ready) {
        any_ready = true;
        if e.node_hints.is_empty() {
            all_node_hints = false;
        } else if e.hinted_for_node(node) {
            for_node = true;
        }
        if e.zone_hints.is_empty() {
            all_zone_hints = false;
        } else if e.hinted_for_zone(zone) {
            for_zone = true;
        }
    }
    if !any_ready {
        TopologyMode::Any
    } else if all_node_hints && for_node {
        TopologyMode::SameNode
    } else if all_zone_hints && for_zone {
        TopologyMode::SameZone
    } else {
        TopologyMode::Any
    }
}

/// kube-proxy's `availableForTopology`.
fn available(e: &Ep<'_>, mode: TopologyMode, node: &NodeInfo) -> bool {
    match mode {
        TopologyMode::Any => true,
        TopologyMode::SameNode => e.hinted_for_node(node),
        TopologyMode::SameZone => e.hinted_for_zone(node.zone.as_deref().unwrap_or("")),
    }
}

/// kube-proxy's `CategorizeEndpoints` over the endpoints of one port and family.
pub(crate) fn categorize<'e, 'a>(
    eps: &'e [Ep<'a>],
    uses: Uses,
    node: &NodeInfo,
) -> Categorized<'e, 'a> {
    let mut out = Categorized {
        cluster: None,
        local: None,
        has_any: false,
    };
    if eps.is_empty() {
        // kube-proxy returns early: no set at all, not even empty ones.
        return out;
    }
    if uses.cluster {
        let mode = topology_mode(eps, node);
        let mut cluster: Vec<&Ep<'_>> = eps
            .iter()
            .filter(|e| e.ready && available(e, mode, node))
            .collect();
        if cluster.is_empty() {
            // No ready endpoint anywhere (a mode is only chosen when the node or zone has
            // one): the serving-and-terminating ones.
            cluster = eps.iter().filter(|e| e.serving_terminating()).collect();
        }
        out.has_any = !cluster.is_empty();
        out.cluster = Some(cluster);
    }
    if uses.local {
        out.has_any |= eps.iter().any(|e| e.ready || e.serving_terminating());
        let local = || eps.iter().filter(|e| e.local(node));
        out.local = Some(if local().any(|e| e.ready) {
            local().filter(|e| e.ready).collect()
        } else {
            local().filter(|e| e.serving_terminating()).collect()
        });
    }
    out
}

/// The backends of a group that uses `chosen`: `(address, usable)`, sorted by address.
/// Every other endpoint the slices list stays as a backend that takes no new flows:
/// terminating ones (their TCP flows continue until they end), not-ready ones, and ones
/// outside the policy's or the topology's scope. Only an endpoint gone from the slices
/// leaves the spec, and that is what "removed" means for its flows (UDP re-steered at once,
/// TCP per `[flowtable] removed_backend_tcp`).
pub(crate) fn backends(eps: &[Ep<'_>], chosen: &[&Ep<'_>]) -> Vec<(SocketAddr, bool)> {
    let chosen: HashSet<SocketAddr> = chosen.iter().map(|c| c.addr).collect();
    let mut out: Vec<(SocketAddr, bool)> = eps
        .iter()
        .map(|e| (e.addr, chosen.contains(&e.addr)))
        .collect();
    out.sort_unstable();
    out
}
