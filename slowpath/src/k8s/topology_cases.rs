//! kube-proxy's endpoint-selection cases (`TestCategorizeEndpoints`), row for row, checked
//! against what xvs selects: `endpoints::categorize` (the four facts kube-proxy's test
//! asserts) and the backends `build_model` gives each frontend group of a real Service.
//!
//! Ported from:
//! - kubernetes/kubernetes@6c039d9075ef18d200bb0ba7dbdb362f4d0deef0,
//!   `pkg/proxy/topology_test.go`, `TestCategorizeEndpoints`: every case, in its order, with
//!   its name (the logic: `pkg/proxy/topology.go` of
//!   kubernetes/kubernetes@008b3652959ca58af8be3fb5b6ecfe9ae7638282, `CategorizeEndpoints`,
//!   `topologyModeFromHints`, `availableForTopology`).
//! - The PreferSameNode cases that v1.33 added to that test. The stored kubernetes snapshot
//!   predates them, so their rows are taken from Antrea's port of the same test
//!   (antrea-io/antrea@03b8743a1ad732d15eff98509483e397d0d78ab1,
//!   `pkg/agent/proxy/topology_test.go`), which keeps the upstream names and data. Left out:
//!   "PreferSameNode falls back to same-zone when feature gate disabled" (xvs behaves as
//!   the gate on, its default since v1.34; "PreferSameNode available" is the same input
//!   with the gate on).
//!
//! Upstream's `isLocal` becomes the endpoint's `nodeName`: this node's name or another's.
//! Expectations read as upstream's checker reads them: `None` means "the port does not use
//! this set" (xvs must return None), `Some(&[])` accepts an empty or absent set, `all`
//! defaults to the one set given, and "has any endpoints" is expected when `all` is not
//! empty or the row says `only_remote`.

use std::net::{IpAddr, SocketAddr};

use config::Dur;
use config::{Config, Kubernetes, SchedulerKind};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{EndpointSlice, ForNode, ForZone};
use serde_json::json;

use super::endpoints::{self, Ep, Uses};
use super::{NodeInfo, build_model};

/// One upstream `BaseEndpointInfo`.
struct E {
    addr: &'static str,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
    zones: &'static [&'static str],
    nodes: &'static [&'static str],
}

const EP: E = E {
    addr: "",
    ready: false,
    serving: false,
    terminating: false,
    local: false,
    zones: &[],
    nodes: &[],
};

/// One upstream test case.
struct Case {
    name: &'static str,
    /// This node's name.
    node: &'static str,
    /// The node's `topology.kubernetes.io/zone` label (None: no label).
    zone: Option<&'static str>,
    internal_local: bool,
    external_local: bool,
    /// The port has a NodePort (upstream `nodePort: 8080`): externally accessible.
    node_port: bool,
    endpoints: &'static [E],
    cluster: Option<&'static [&'static str]>,
    local: Option<&'static [&'static str]>,
    all: Option<&'static [&'static str]>,
    only_remote: bool,
}

const CASE: Case = Case {
    name: "",
    node: "this-node",
    zone: None,
    internal_local: false,
    external_local: false,
    node_port: false,
    endpoints: &[],
    cluster: None,
    local: None,
    all: None,
    only_remote: false,
};

const OTHER_NODE: &str = "other-node";

#[rustfmt::skip]
const CASES: &[Case] = &[
    Case {
        name: "should use topology since all endpoints have hints, node has a zone label and and there are endpoints for the node's zone",
        zone: Some("zone-a"),
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, zones: &["zone-a"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, zones: &["zone-b"], ..EP },
            E { addr: "10.1.2.5:80", ready: true, zones: &["zone-c"], ..EP },
            E { addr: "10.1.2.6:80", ready: true, zones: &["zone-a"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "externalTrafficPolicy: Local, topology ignored for Local endpoints",
        zone: Some("zone-a"),
        external_local: true,
        node_port: true,
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, local: true, zones: &["zone-a"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, local: true, zones: &["zone-b"], ..EP },
            E { addr: "10.1.2.5:80", ready: true, zones: &["zone-c"], ..EP },
            E { addr: "10.1.2.6:80", ready: true, zones: &["zone-a"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
        all: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        ..CASE
    },
    Case {
        name: "internalTrafficPolicy: Local, topology ignored for Local endpoints",
        zone: Some("zone-a"),
        internal_local: true,
        node_port: true,
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, local: true, zones: &["zone-a"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, local: true, zones: &["zone-b"], ..EP },
            E { addr: "10.1.2.5:80", ready: true, zones: &["zone-c"], ..EP },
            E { addr: "10.1.2.6:80", ready: true, zones: &["zone-a"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
        all: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        ..CASE
    },
    Case {
        name: "empty node labels",
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, zones: &["zone-a"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "empty zone label",
        zone: Some(""),
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, zones: &["zone-a"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "node in different zone, no endpoint filtering",
        zone: Some("zone-b"),
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, zones: &["zone-a"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "unready endpoint",
        zone: Some("zone-a"),
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, zones: &["zone-a"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, zones: &["zone-b"], ..EP },
            E { addr: "10.1.2.5:80", ready: true, zones: &["zone-c"], ..EP },
            E { addr: "10.1.2.6:80", zones: &["zone-a"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "only unready endpoints in same zone (should not filter)",
        zone: Some("zone-a"),
        endpoints: &[
            E { addr: "10.1.2.3:80", zones: &["zone-a"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, zones: &["zone-b"], ..EP },
            E { addr: "10.1.2.5:80", ready: true, zones: &["zone-c"], ..EP },
            E { addr: "10.1.2.6:80", zones: &["zone-a"], ..EP },
        ],
        cluster: Some(&["10.1.2.4:80", "10.1.2.5:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "missing hints, no filtering applied",
        zone: Some("zone-a"),
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, zones: &["zone-a"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, zones: &["zone-b"], ..EP },
            E { addr: "10.1.2.5:80", ready: true, ..EP },
            E { addr: "10.1.2.6:80", ready: true, zones: &["zone-a"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "multiple hints per endpoint, filtering includes any endpoint with zone included",
        zone: Some("zone-c"),
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, zones: &["zone-a", "zone-b", "zone-c"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, zones: &["zone-b", "zone-c"], ..EP },
            E { addr: "10.1.2.5:80", ready: true, zones: &["zone-b", "zone-d"], ..EP },
            E { addr: "10.1.2.6:80", ready: true, zones: &["zone-c"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "conflicting topology and localness require merging allEndpoints",
        zone: Some("zone-a"),
        external_local: true,
        node_port: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, local: true, zones: &["zone-a"], ..EP },
            E { addr: "10.0.0.1:80", ready: true, local: true, zones: &["zone-b"], ..EP },
            E { addr: "10.0.0.2:80", ready: true, zones: &["zone-a"], ..EP },
            E { addr: "10.0.0.3:80", ready: true, zones: &["zone-b"], ..EP },
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.2:80"]),
        local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        all: Some(&["10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"]),
        ..CASE
    },
    Case {
        name: "internalTrafficPolicy: Local, with empty endpoints",
        internal_local: true,
        endpoints: &[
        ],
        cluster: None,
        local: Some(&[]),
        ..CASE
    },
    Case {
        name: "internalTrafficPolicy: Local, but all endpoints are remote",
        internal_local: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, ..EP },
            E { addr: "10.0.0.1:80", ready: true, ..EP },
        ],
        cluster: None,
        local: Some(&[]),
        only_remote: true,
        ..CASE
    },
    Case {
        name: "internalTrafficPolicy: Local, all endpoints are local",
        internal_local: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, local: true, ..EP },
            E { addr: "10.0.0.1:80", ready: true, local: true, ..EP },
        ],
        cluster: None,
        local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..CASE
    },
    Case {
        name: "internalTrafficPolicy: Local, some endpoints are local",
        internal_local: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, local: true, ..EP },
            E { addr: "10.0.0.1:80", ready: true, ..EP },
        ],
        cluster: None,
        local: Some(&["10.0.0.0:80"]),
        ..CASE
    },
    Case {
        name: "Cluster traffic policy, endpoints not Ready",
        endpoints: &[
            E { addr: "10.0.0.0:80", ..EP },
            E { addr: "10.0.0.1:80", ..EP },
        ],
        cluster: Some(&[]),
        local: None,
        ..CASE
    },
    Case {
        name: "Cluster traffic policy, some endpoints are Ready",
        endpoints: &[
            E { addr: "10.0.0.0:80", ..EP },
            E { addr: "10.0.0.1:80", ready: true, ..EP },
        ],
        cluster: Some(&["10.0.0.1:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "Cluster traffic policy, all endpoints are terminating",
        endpoints: &[
            E { addr: "10.0.0.0:80", serving: true, terminating: true, local: true, ..EP },
            E { addr: "10.0.0.1:80", serving: true, terminating: true, ..EP },
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "iTP: Local, eTP: Cluster, some endpoints local",
        internal_local: true,
        node_port: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, local: true, ..EP },
            E { addr: "10.0.0.1:80", ready: true, ..EP },
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&["10.0.0.0:80"]),
        all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..CASE
    },
    Case {
        name: "iTP: Cluster, eTP: Local, some endpoints local",
        external_local: true,
        node_port: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, local: true, ..EP },
            E { addr: "10.0.0.1:80", ready: true, ..EP },
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&["10.0.0.0:80"]),
        all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..CASE
    },
    Case {
        name: "iTP: Local, eTP: Local, some endpoints local",
        internal_local: true,
        external_local: true,
        node_port: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, local: true, ..EP },
            E { addr: "10.0.0.1:80", ready: true, ..EP },
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&["10.0.0.0:80"]),
        all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..CASE
    },
    Case {
        name: "iTP: Local, eTP: Local, all endpoints remote",
        internal_local: true,
        external_local: true,
        node_port: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, ..EP },
            E { addr: "10.0.0.1:80", ready: true, ..EP },
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&[]),
        all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..CASE
    },
    Case {
        name: "iTP: Local, eTP: Local, all endpoints remote and terminating",
        internal_local: true,
        external_local: true,
        node_port: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", serving: true, terminating: true, ..EP },
            E { addr: "10.0.0.1:80", serving: true, terminating: true, ..EP },
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&[]),
        all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        only_remote: true,
        ..CASE
    },
    Case {
        name: "iTP: Cluster, eTP: Local, with terminating endpoints",
        external_local: true,
        node_port: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, ..EP },
            E { addr: "10.0.0.1:80", local: true, ..EP },
            E { addr: "10.0.0.2:80", serving: true, terminating: true, local: true, ..EP },
            E { addr: "10.0.0.3:80", serving: true, terminating: true, ..EP },
        ],
        cluster: Some(&["10.0.0.0:80"]),
        local: Some(&["10.0.0.2:80"]),
        all: Some(&["10.0.0.0:80", "10.0.0.2:80"]),
        ..CASE
    },
    Case {
        name: "externalTrafficPolicy ignored if not externally accessible",
        external_local: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, ..EP },
            E { addr: "10.0.0.1:80", ready: true, local: true, ..EP },
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: None,
        all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..CASE
    },
    Case {
        name: "no cluster endpoints for iTP:Local internal-only service",
        internal_local: true,
        endpoints: &[
            E { addr: "10.0.0.0:80", ready: true, ..EP },
            E { addr: "10.0.0.1:80", ready: true, local: true, ..EP },
        ],
        cluster: None,
        local: Some(&["10.0.0.1:80"]),
        all: Some(&["10.0.0.1:80"]),
        ..CASE
    },
    // v1.33+: PreferSameNode (feature gate PreferSameTrafficDistribution on).
    Case {
        name: "PreferSameNode available",
        node: "node-1",
        zone: Some("zone-a"),
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, serving: true, zones: &["zone-a"], nodes: &["node-1"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, serving: true, zones: &["zone-b"], nodes: &["node-2"], ..EP },
            E { addr: "10.1.2.5:80", ready: true, serving: true, zones: &["zone-c"], nodes: &["node-3"], ..EP },
            E { addr: "10.1.2.6:80", ready: true, serving: true, zones: &["zone-a"], nodes: &["node-4"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "PreferSameNode ignored if some endpoints unhinted",
        node: "node-1",
        zone: Some("zone-a"),
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, serving: true, zones: &["zone-a"], nodes: &["node-1"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, serving: true, ..EP },
            E { addr: "10.1.2.5:80", ready: true, serving: true, zones: &["zone-c"], nodes: &["node-3"], ..EP },
            E { addr: "10.1.2.6:80", ready: true, serving: true, zones: &["zone-a"], nodes: &["node-4"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"]),
        local: None,
        ..CASE
    },
    Case {
        name: "PreferSameNode falls back to PreferSameZone if no endpoint for node",
        node: "node-0",
        zone: Some("zone-a"),
        endpoints: &[
            E { addr: "10.1.2.3:80", ready: true, serving: true, zones: &["zone-a"], nodes: &["node-1"], ..EP },
            E { addr: "10.1.2.4:80", ready: true, serving: true, zones: &["zone-b"], nodes: &["node-2"], ..EP },
            E { addr: "10.1.2.5:80", ready: true, serving: true, zones: &["zone-c"], nodes: &["node-3"], ..EP },
            E { addr: "10.1.2.6:80", ready: true, serving: true, zones: &["zone-a"], nodes: &["node-4"], ..EP },
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        local: None,
        ..CASE
    },
];

fn node_info(c: &Case) -> NodeInfo {
    NodeInfo {
        name: c.node.to_owned(),
        zone: c.zone.map(str::to_owned),
        addresses: vec!["198.18.0.10".parse().unwrap()],
        own: Vec::new(),
    }
}

fn sorted(v: impl IntoIterator<Item = SocketAddr>) -> Vec<SocketAddr> {
    let mut v: Vec<SocketAddr> = v.into_iter().collect();
    v.sort_unstable();
    v
}

fn addrs(s: &[&str]) -> Vec<SocketAddr> {
    sorted(s.iter().map(|a| a.parse().unwrap()))
}

fn eps_addrs(v: &[&Ep<'_>]) -> Vec<SocketAddr> {
    sorted(v.iter().map(|e| e.addr))
}

/// Upstream's checker: an expected None demands None; an expected set demands that set
/// (an absent set counts as empty).
fn check_set(case: &str, what: &str, expected: Option<&[&str]>, got: Option<&Vec<&Ep<'_>>>) {
    match expected {
        None => assert!(
            got.is_none(),
            "{case}: expected no {what} endpoints, got {got:?}"
        ),
        Some(e) => assert_eq!(
            got.map(|g| eps_addrs(g)).unwrap_or_default(),
            addrs(e),
            "{case}: {what} endpoints"
        ),
    }
}

fn expected_all(c: &Case) -> &'static [&'static str] {
    match (c.cluster, c.local) {
        (Some(cl), None) => cl,
        (None, Some(l)) => l,
        _ => c.all.unwrap_or(&[]),
    }
}

struct Owned {
    zones: Vec<Vec<ForZone>>,
    nodes: Vec<Vec<ForNode>>,
}

fn owned(c: &Case) -> Owned {
    Owned {
        zones: c
            .endpoints
            .iter()
            .map(|e| {
                e.zones
                    .iter()
                    .map(|z| ForZone {
                        name: (*z).to_owned(),
                    })
                    .collect()
            })
            .collect(),
        nodes: c
            .endpoints
            .iter()
            .map(|e| {
                e.nodes
                    .iter()
                    .map(|n| ForNode {
                        name: (*n).to_owned(),
                    })
                    .collect()
            })
            .collect(),
    }
}

fn ep_node(c: &Case, e: &E) -> &'static str {
    if e.local { c.node } else { OTHER_NODE }
}

fn to_eps<'a>(c: &'a Case, o: &'a Owned) -> Vec<Ep<'a>> {
    c.endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| Ep {
            addr: e.addr.parse().unwrap(),
            ready: e.ready,
            serving: e.serving,
            terminating: e.terminating,
            node: Some(ep_node(c, e)),
            zone_hints: &o.zones[i],
            node_hints: &o.nodes[i],
        })
        .collect()
}

#[test]
fn kube_proxy_categorize_endpoints_cases() {
    assert_eq!(
        CASES.len(),
        29,
        "26 upstream cases and 3 PreferSameNode ones"
    );
    for c in CASES {
        let node = node_info(c);
        let o = owned(c);
        let eps = to_eps(c, &o);
        let uses = Uses::of(c.internal_local, c.external_local, c.node_port);
        let cat = endpoints::categorize(&eps, uses, &node);
        check_set(c.name, "cluster", c.cluster, cat.cluster.as_ref());
        check_set(c.name, "local", c.local, cat.local.as_ref());
        let all = expected_all(c);
        assert_eq!(
            eps_addrs(&cat.all()),
            addrs(all),
            "{}: all reachable endpoints",
            c.name
        );
        assert_eq!(
            cat.has_any,
            !all.is_empty() || c.only_remote,
            "{}: has any endpoints",
            c.name
        );
    }
}

/// A Service `ns/web` (ClusterIP 198.18.100.1, port 80, NodePort 30080 when the case has
/// one) and its one EndpointSlice, built as the API server would serve them.
fn objects(c: &Case) -> (Service, EndpointSlice) {
    let policy = |local| if local { "Local" } else { "Cluster" };
    let mut port = json!({"port": 80, "protocol": "TCP"});
    if c.node_port {
        port["nodePort"] = json!(30080);
    }
    let svc = json!({
        "metadata": {"namespace": "ns", "name": "web"},
        "spec": {
            "type": if c.node_port { "NodePort" } else { "ClusterIP" },
            "clusterIP": "198.18.100.1",
            "clusterIPs": ["198.18.100.1"],
            "ipFamilies": ["IPv4"],
            "ports": [port],
            "internalTrafficPolicy": policy(c.internal_local),
            "externalTrafficPolicy": policy(c.external_local),
        },
    });
    let endpoints: Vec<serde_json::Value> = c
        .endpoints
        .iter()
        .map(|e| {
            let addr: SocketAddr = e.addr.parse().unwrap();
            assert_eq!(addr.port(), 80, "{}: one port per case", c.name);
            let mut v = json!({
                "addresses": [addr.ip().to_string()],
                "nodeName": ep_node(c, e),
                "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
            });
            let mut hints = serde_json::Map::new();
            if !e.zones.is_empty() {
                hints.insert("forZones".into(), json!(e.zones.iter().map(|z| json!({"name": z})).collect::<Vec<_>>()));
            }
            if !e.nodes.is_empty() {
                hints.insert("forNodes".into(), json!(e.nodes.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()));
            }
            if !hints.is_empty() {
                v["hints"] = serde_json::Value::Object(hints);
            }
            v
        })
        .collect();
    let slice = json!({
        "metadata": {"namespace": "ns", "name": "web-1",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"port": 80, "protocol": "TCP"}],
        "endpoints": endpoints,
    });
    (
        serde_json::from_value(svc).unwrap(),
        serde_json::from_value(slice).unwrap(),
    )
}

fn cfg() -> Config {
    Config {
        kubernetes: Some(Kubernetes {
            kubeconfig: None,
            service_proxy_name: None,
            min_sync_period: Dur(std::time::Duration::from_millis(100)),
            sync_period: Dur(std::time::Duration::from_secs(30)),
            default_scheduler: SchedulerKind::Rr,
            external_ip_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
        }),
        ..Config::default()
    }
}

/// The same rows through the whole translation: the ClusterIP group takes the set its
/// internal policy names, the NodePort group the set its external policy names, and every
/// other endpoint of the slice stays as an unusable (draining) backend.
#[test]
fn kube_proxy_cases_through_the_translation() {
    for c in CASES {
        let (svc, slice) = objects(c);
        let m = build_model(&[svc], &[slice], &node_info(c), &cfg());
        assert!(m.problems.is_empty(), "{}: {:?}", c.name, m.problems);
        let set = |local: bool| addrs(if local { c.local } else { c.cluster }.unwrap_or(&[]));
        let mut groups = vec![("ns/web:80", set(c.internal_local))];
        if c.node_port {
            groups.push(("ns/web:80/ext", set(c.external_local)));
        }
        let names: Vec<&str> = m.specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            groups.iter().map(|g| g.0).collect::<Vec<_>>(),
            "{}",
            c.name
        );
        for (spec, (name, want)) in m.specs.iter().zip(&groups) {
            let usable = sorted(spec.backends.iter().filter(|b| b.usable).map(|b| b.addr));
            assert_eq!(&usable, want, "{}: usable backends of {name}", c.name);
            let every = sorted(spec.backends.iter().map(|b| b.addr));
            let listed = addrs(&c.endpoints.iter().map(|e| e.addr).collect::<Vec<_>>());
            assert_eq!(
                every, listed,
                "{}: every endpoint of {name} is a backend",
                c.name
            );
        }
    }
}

/// The family rule, beside the case table because kube-proxy applies it before it
/// categorizes: an IPv4-only Service's IPv6 externalIPs and load-balancer IPs are no
/// frontends (left to the host), and the IPv4 ones are.
#[test]
fn external_and_lb_ips_of_a_family_without_cluster_ip_are_not_frontends() {
    let mut cfg = cfg();
    cfg.kubernetes.as_mut().unwrap().external_ip_cidrs = vec![
        "198.18.200.0/24".parse().unwrap(),
        "2001:2:200::/64".parse().unwrap(),
    ];
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "web"},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "198.18.100.1",
            "clusterIPs": ["198.18.100.1"],
            "ipFamilies": ["IPv4"],
            "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}],
            "externalIPs": ["198.18.200.7", "2001:2:200::7"],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "198.18.210.1"}, {"ip": "2001:2:210::1"}]}},
    }))
    .unwrap();
    let node = NodeInfo {
        name: "n".into(),
        zone: None,
        addresses: vec![
            "198.18.0.10".parse().unwrap(),
            "2001:2::10".parse().unwrap(),
        ],
        own: Vec::new(),
    };
    let m = build_model(&[svc], &[], &node, &cfg);
    let names: Vec<&str> = m.specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["ns/web:80", "ns/web:80/ext"]);
    let vips: Vec<IpAddr> = m.specs[1].frontends.iter().map(|f| f.vip).collect();
    let want: Vec<IpAddr> = ["198.18.0.10", "198.18.200.7", "198.18.210.1"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(vips, want);
    assert!(
        m.specs
            .iter()
            .flat_map(|s| &s.frontends)
            .all(|f| f.vip.is_ipv4()),
        "no IPv6 frontend for an IPv4-only Service"
    );
}
