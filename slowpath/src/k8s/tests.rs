//! Unit tests of the translation: one or more per rule of `build_model`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use config::{Cidr, Config, Dur, Encap, Kubernetes, Mode, Protocol, SchedFlag, SchedulerKind};
use fastpath::snapshot::{BackendSpec, Frontend, ServiceSpec, SynproxySetting};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use super::*;
use crate::k8s::settings::parse_weights;
use crate::k8s::source::label_selector;

pub(super) fn cfg() -> Config {
    Config {
        kubernetes: Some(Kubernetes {
            kubeconfig: None,
            service_proxy_name: None,
            min_sync_period: Dur(Duration::from_millis(100)),
            sync_period: Dur(Duration::from_secs(30)),
            default_scheduler: SchedulerKind::Rr,
            external_ip_cidrs: vec!["198.18.200.0/24".parse().unwrap()],
            service_cidrs: Vec::new(),
        }),
        ..Config::default()
    }
}

pub(super) fn node() -> NodeInfo {
    NodeInfo {
        name: "node-a".to_owned(),
        zone: Some("zone-a".to_owned()),
        addresses: vec![ip("198.18.0.10"), ip("2001:2::10")],
        own: vec![ip("198.18.0.11")],
    }
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A ClusterIP Service `ns/web` on 198.18.100.1, port "http" 80 → named target port.
pub(super) fn web(extra_spec: Value) -> Service {
    let mut v = json!({
        "metadata": {"namespace": "ns", "name": "web"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "198.18.100.1",
            "clusterIPs": ["198.18.100.1"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "web"}],
        },
    });
    merge(&mut v["spec"], extra_spec);
    serde_json::from_value(v).unwrap()
}

pub(super) fn service(v: Value) -> Service {
    serde_json::from_value(v).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        for (k, v) in b {
            a.insert(k, v);
        }
    }
}

/// An endpoint: (address, node, zone hint) ready unless `conditions` say otherwise.
pub(super) fn ep(addr: &str, node: &str, conditions: Value) -> Value {
    json!({"addresses": [addr], "nodeName": node, "conditions": conditions})
}

pub(super) fn ready() -> Value {
    json!({"ready": true, "serving": true, "terminating": false})
}

pub(super) fn slice(name: &str, family: &str, port: u16, endpoints: Vec<Value>) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": family,
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .unwrap()
}

pub(super) fn spec<'m>(m: &'m K8sModel, name: &str) -> &'m ServiceSpec {
    m.specs
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no spec {name} in {:?}", names(m)))
}

pub(super) fn names(m: &K8sModel) -> Vec<&str> {
    m.specs.iter().map(|s| s.name.as_str()).collect()
}

pub(super) fn usable(s: &ServiceSpec) -> Vec<SocketAddr> {
    s.backends
        .iter()
        .filter(|b| b.usable)
        .map(|b| b.addr)
        .collect()
}

pub(super) fn fe(vip: &str, port: u16) -> Frontend {
    Frontend {
        vip: ip(vip),
        protocol: Protocol::Tcp,
        port,
    }
}

pub(super) fn model(services: &[Service], slices: &[EndpointSlice]) -> K8sModel {
    build_model(services, slices, &node(), &cfg())
}

#[test]
fn cluster_ip_service_gets_its_ready_endpoints() {
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            ep("10.0.0.1", "node-b", ready()),
            ep("10.0.0.2", "node-a", ready()),
        ],
    );
    let m = model(&[web(json!({}))], &[s]);
    assert_eq!(m.problems, vec![]);
    assert_eq!(
        m.specs,
        vec![ServiceSpec {
            name: "ns/web:http".to_owned(),
            frontends: vec![fe("198.18.100.1", 80)],
            scheduler: SchedulerKind::Rr,
            flags: vec![],
            mode: Mode::Fullnat,
            affinity_timeout: None,
            source_ranges: vec![],
            rate_limit: None,
            frozen: false,
            synproxy: SynproxySetting::Auto {
                embryonic_max: 1000
            },
            // No xvs.io/health-check-probe: not probed, whatever [health] says.
            health: config::ServiceHealth {
                probe: Some(config::ProbeKind::None),
                ..Default::default()
            },
            no_endpoints: fastpath::snapshot::NoEndpoints::Reject,
            cluster_ip: true,
            backends: vec![
                BackendSpec {
                    addr: sa("10.0.0.1:8080"),
                    weight: 1,
                    usable: true
                },
                BackendSpec {
                    addr: sa("10.0.0.2:8080"),
                    weight: 1,
                    usable: true
                },
            ],
        }]
    );
    let (specs, problems) = build_specs(&[web(json!({}))], &[], &node(), &cfg());
    assert_eq!(specs.len(), 1);
    assert!(specs[0].backends.is_empty(), "no slice, no backends");
    assert!(problems.is_empty());
}

#[test]
fn unnamed_port_is_named_by_number_and_not_ready_endpoints_take_no_new_flows() {
    let svc = service(json!({
        "metadata": {"namespace": "ns", "name": "web"},
        "spec": {"clusterIP": "198.18.100.1", "ports": [{"port": 53, "protocol": "UDP"}]},
    }));
    let s: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "web-x", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"port": 5353, "protocol": "UDP"}],
        "endpoints": [
            {"addresses": ["10.0.0.1"]},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": false}},
        ],
    }))
    .unwrap();
    let m = model(&[svc], &[s]);
    let sp = spec(&m, "ns/web:53");
    assert_eq!(sp.frontends[0].protocol, Protocol::Udp);
    assert_eq!(
        usable(sp),
        vec![sa("10.0.0.1:5353")],
        "nil conditions mean ready"
    );
    // Listed, so its existing flows are not treated as those of a removed endpoint.
    assert_eq!(sp.backends.len(), 2);
    assert!(!sp.backends[1].usable);
}

#[test]
fn dual_stack_gives_one_spec_per_family() {
    let svc = web(json!({
        "clusterIPs": ["198.18.100.1", "2001:2::100"],
        "ipFamilies": ["IPv4", "IPv6"],
    }));
    let v4 = slice(
        "web-4",
        "IPv4",
        8080,
        vec![ep("10.0.0.1", "node-b", ready())],
    );
    let v6 = slice(
        "web-6",
        "IPv6",
        8080,
        vec![ep("fd00::1", "node-b", ready())],
    );
    let m = model(&[svc], &[v4, v6]);
    assert_eq!(names(&m), vec!["ns/web:http", "ns/web:http/v6"]);
    assert_eq!(
        spec(&m, "ns/web:http").frontends,
        vec![fe("198.18.100.1", 80)]
    );
    assert_eq!(usable(spec(&m, "ns/web:http")), vec![sa("10.0.0.1:8080")]);
    assert_eq!(
        spec(&m, "ns/web:http/v6").frontends,
        vec![fe("2001:2::100", 80)]
    );
    assert_eq!(
        usable(spec(&m, "ns/web:http/v6")),
        vec![sa("[fd00::1]:8080")]
    );
}

#[test]
fn node_port_listens_on_node_addresses_of_the_service_family() {
    let svc = web(json!({"type": "NodePort",
        "ports": [{"name": "http", "port": 80, "nodePort": 30080, "targetPort": 8080}]}));
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![ep("10.0.0.1", "node-b", ready())],
    );
    let m = model(&[svc], &[s]);
    assert_eq!(names(&m), vec!["ns/web:http", "ns/web:http/ext"]);
    let ext = spec(&m, "ns/web:http/ext");
    assert_eq!(
        ext.frontends,
        vec![fe("198.18.0.10", 30080)],
        "no IPv6 NodePort on a v4 Service"
    );
    assert_eq!(usable(ext), vec![sa("10.0.0.1:8080")]);
}

#[test]
fn load_balancer_ingress_and_external_ips_are_external_frontends() {
    let mut svc = web(json!({
        "type": "LoadBalancer",
        "ports": [{"name": "http", "port": 80, "nodePort": 30080}],
        "externalIPs": ["198.18.200.7", "198.18.201.7", "bogus"],
    }));
    svc.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [
        {"ip": "198.18.210.1"},
        {"ip": "198.18.210.2", "ipMode": "Proxy"},
        {"hostname": "lb.example"},
    ]}}))
    .unwrap();
    let m = model(&[svc], &[]);
    let ext = spec(&m, "ns/web:http/ext");
    assert_eq!(
        ext.frontends,
        vec![
            fe("198.18.0.10", 30080),
            fe("198.18.200.7", 80),
            fe("198.18.210.1", 80)
        ]
    );
    let reasons: Vec<&str> = m.problems.iter().map(|p| p.reason.as_str()).collect();
    assert_eq!(m.problems.len(), 2, "{reasons:?}");
    assert!(reasons[0].contains("198.18.201.7") && reasons[0].contains("external_ip_cidrs"));
    assert!(reasons[1].contains("\"bogus\""));
    assert!(m.problems.iter().all(|p| p.object == "Service ns/web"));
}

#[test]
fn headless_and_external_name_services_are_skipped_quietly() {
    let headless = web(json!({"clusterIP": "None", "clusterIPs": ["None"]}));
    let ext_name = service(json!({
        "metadata": {"namespace": "ns", "name": "db"},
        "spec": {"type": "ExternalName", "externalName": "db.example.com"},
    }));
    let m = model(&[headless, ext_name], &[]);
    assert!(m.specs.is_empty());
    assert!(m.problems.is_empty());
}

fn mixed_slice() -> EndpointSlice {
    slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            ep("10.0.0.1", "node-a", ready()),
            ep("10.0.0.2", "node-b", ready()),
            ep(
                "10.0.0.3",
                "node-a",
                json!({"ready": false, "serving": true, "terminating": true}),
            ),
        ],
    )
}

#[test]
fn internal_traffic_policy_local_keeps_node_local_endpoints() {
    let m = model(
        &[web(json!({"internalTrafficPolicy": "Local"}))],
        &[mixed_slice()],
    );
    let sp = spec(&m, "ns/web:http");
    assert_eq!(usable(sp), vec![sa("10.0.0.1:8080")]);
    // The remote endpoint and the local terminating one take no new flows; they stay
    // listed so their established flows continue.
    assert_eq!(sp.backends.len(), 3);
    assert!(!sp.backends[1].usable && !sp.backends[2].usable);
}

#[test]
fn external_traffic_policy_local_applies_to_external_frontends_only() {
    let svc = web(json!({"type": "NodePort", "externalTrafficPolicy": "Local",
        "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}));
    let m = model(&[svc], &[mixed_slice()]);
    assert_eq!(
        usable(spec(&m, "ns/web:http")),
        vec![sa("10.0.0.1:8080"), sa("10.0.0.2:8080")]
    );
    assert_eq!(
        usable(spec(&m, "ns/web:http/ext")),
        vec![sa("10.0.0.1:8080")]
    );
}

#[test]
fn local_policy_without_local_endpoints_drops_traffic() {
    let svc = web(json!({"type": "NodePort", "externalTrafficPolicy": "Local",
        "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}));
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![ep("10.0.0.2", "node-b", ready())],
    );
    let m = model(&[svc], &[s]);
    let ext = spec(&m, "ns/web:http/ext");
    assert!(usable(ext).is_empty(), "{ext:?}");
    assert_eq!(
        ext.backends.len(),
        1,
        "the remote endpoint is listed, unusable"
    );
    assert_eq!(usable(spec(&m, "ns/web:http")), vec![sa("10.0.0.2:8080")]);
}

#[test]
fn local_policy_falls_back_to_local_terminating_endpoints() {
    let svc = web(json!({"internalTrafficPolicy": "Local"}));
    let term = json!({"ready": false, "serving": true, "terminating": true});
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            ep("10.0.0.2", "node-b", ready()),
            ep("10.0.0.3", "node-a", term),
        ],
    );
    let m = model(&[svc], &[s]);
    assert_eq!(usable(spec(&m, "ns/web:http")), vec![sa("10.0.0.3:8080")]);
}

#[test]
fn terminating_fallback_when_no_endpoint_is_ready() {
    let term = json!({"ready": false, "serving": true, "terminating": true});
    let gone = json!({"ready": false, "serving": false, "terminating": true});
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            ep("10.0.0.1", "node-b", term.clone()),
            ep("10.0.0.2", "node-b", gone),
        ],
    );
    let m = model(&[web(json!({}))], &[s]);
    let sp = spec(&m, "ns/web:http");
    assert_eq!(usable(sp), vec![sa("10.0.0.1:8080")]);
    assert_eq!(
        sp.backends.len(),
        2,
        "not serving: listed, takes no new flows"
    );
    assert!(!sp.backends[1].usable);

    // With a ready endpoint, the terminating one only drains.
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            ep("10.0.0.1", "node-b", term),
            ep("10.0.0.4", "node-b", ready()),
        ],
    );
    let m = model(&[web(json!({}))], &[s]);
    let sp = spec(&m, "ns/web:http");
    assert_eq!(usable(sp), vec![sa("10.0.0.4:8080")]);
    assert_eq!(
        sp.backends[0],
        BackendSpec {
            addr: sa("10.0.0.1:8080"),
            weight: 1,
            usable: false
        }
    );
}

fn zoned(addr: &str, node: &str, zone: Option<&str>) -> Value {
    let mut v = ep(addr, node, ready());
    if let Some(z) = zone {
        v["hints"] = json!({"forZones": [{"name": z}]});
    }
    v
}

#[test]
fn prefer_same_zone_uses_zone_hints() {
    let svc = web(json!({"trafficDistribution": "PreferSameZone"}));
    let hinted = |b| {
        slice(
            "web-1",
            "IPv4",
            8080,
            vec![
                zoned("10.0.0.1", "node-b", Some("zone-a")),
                zoned("10.0.0.2", "node-c", b),
            ],
        )
    };
    let m = model(std::slice::from_ref(&svc), &[hinted(Some("zone-b"))]);
    assert_eq!(usable(spec(&m, "ns/web:http")), vec![sa("10.0.0.1:8080")]);
    // One endpoint without hints: hints are ignored.
    let m = model(std::slice::from_ref(&svc), &[hinted(None)]);
    assert_eq!(usable(spec(&m, "ns/web:http")).len(), 2);
    // No endpoint for this zone: cluster-wide.
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            zoned("10.0.0.1", "node-b", Some("zone-b")),
            zoned("10.0.0.2", "node-c", Some("zone-c")),
        ],
    );
    let m = model(std::slice::from_ref(&svc), &[s]);
    assert_eq!(usable(spec(&m, "ns/web:http")).len(), 2);
    // As kube-proxy: the hints decide, whatever the Service says (trafficDistribution and
    // the topology-mode annotation only ask the EndpointSlice controller to write them).
    for extra in [
        json!({"trafficDistribution": "PreferClose"}),
        json!({}),
        json!({"trafficDistribution": "PreferSameNode"}),
    ] {
        let m = model(&[web(extra.clone())], &[hinted(Some("zone-b"))]);
        assert_eq!(
            usable(spec(&m, "ns/web:http")),
            vec![sa("10.0.0.1:8080")],
            "{extra}"
        );
    }
}

#[test]
fn same_node_hints_then_zone_hints_then_cluster_never_node_name() {
    let svc = web(json!({"trafficDistribution": "PreferSameNode"}));
    // Zone hints only, one endpoint on this node: no node preference from nodeName (as
    // kube-proxy), the zone's endpoints.
    let eps = slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            zoned("10.0.0.1", "node-a", Some("zone-a")),
            zoned("10.0.0.2", "node-c", Some("zone-a")),
            zoned("10.0.0.3", "node-d", Some("zone-b")),
        ],
    );
    let m = model(std::slice::from_ref(&svc), std::slice::from_ref(&eps));
    assert_eq!(
        usable(spec(&m, "ns/web:http")),
        vec![sa("10.0.0.1:8080"), sa("10.0.0.2:8080")]
    );
    // Node hints on every ready endpoint decide, against nodeName.
    let with_nodes = |hints: [Option<&str>; 3]| {
        let mut s = eps.clone();
        for (e, n) in s.endpoints.as_mut().unwrap().iter_mut().zip(hints) {
            e.hints.as_mut().unwrap().for_nodes =
                n.map(|n| vec![k8s_openapi::api::discovery::v1::ForNode { name: n.to_owned() }]);
        }
        s
    };
    let s = with_nodes([Some("node-b"), Some("node-a"), Some("node-d")]);
    let m = model(std::slice::from_ref(&svc), &[s]);
    assert_eq!(usable(spec(&m, "ns/web:http")), vec![sa("10.0.0.2:8080")]);
    // One ready endpoint without a node hint: zone hints.
    let s = with_nodes([Some("node-b"), Some("node-a"), None]);
    let m = model(std::slice::from_ref(&svc), &[s]);
    assert_eq!(
        usable(spec(&m, "ns/web:http")),
        vec![sa("10.0.0.1:8080"), sa("10.0.0.2:8080")]
    );
    // Node hints everywhere but none for this node: zone hints.
    let s = with_nodes([Some("node-b"), Some("node-c"), Some("node-d")]);
    let m = model(std::slice::from_ref(&svc), &[s]);
    assert_eq!(
        usable(spec(&m, "ns/web:http")),
        vec![sa("10.0.0.1:8080"), sa("10.0.0.2:8080")]
    );
}

#[test]
fn traffic_policy_local_takes_precedence_over_distribution() {
    let svc =
        web(json!({"trafficDistribution": "PreferSameZone", "internalTrafficPolicy": "Local"}));
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            zoned("10.0.0.1", "node-a", Some("zone-b")),
            zoned("10.0.0.2", "node-c", Some("zone-a")),
        ],
    );
    let m = model(&[svc], &[s]);
    assert_eq!(usable(spec(&m, "ns/web:http")), vec![sa("10.0.0.1:8080")]);
}

#[test]
fn named_target_ports_are_resolved_per_slice_and_duplicates_merged() {
    let a = slice(
        "web-a",
        "IPv4",
        8080,
        vec![ep("10.0.0.1", "node-b", ready())],
    );
    let b = slice(
        "web-b",
        "IPv4",
        9090,
        vec![
            ep("10.0.0.2", "node-b", ready()),
            ep(
                "10.0.0.3",
                "node-b",
                json!({"ready": false, "serving": true, "terminating": true}),
            ),
        ],
    );
    // The same endpoint, ready, listed again by a slice in transition.
    let c = slice(
        "web-c",
        "IPv4",
        9090,
        vec![ep("10.0.0.3", "node-b", ready())],
    );
    // A slice of another Service and one with another port name are not used.
    let mut other = slice(
        "other",
        "IPv4",
        7070,
        vec![ep("10.0.0.9", "node-b", ready())],
    );
    other.metadata.labels =
        Some([("kubernetes.io/service-name".to_owned(), "db".to_owned())].into());
    let mut grpc = slice(
        "web-g",
        "IPv4",
        6060,
        vec![ep("10.0.0.8", "node-b", ready())],
    );
    grpc.ports.as_mut().unwrap()[0].name = Some("grpc".to_owned());
    let m = model(&[web(json!({}))], &[a, b, c, other, grpc]);
    let sp = spec(&m, "ns/web:http");
    assert_eq!(
        usable(sp),
        vec![
            sa("10.0.0.1:8080"),
            sa("10.0.0.2:9090"),
            sa("10.0.0.3:9090")
        ]
    );
    assert_eq!(sp.backends.len(), 3);
}

#[test]
fn session_affinity_client_ip_sets_the_timeout() {
    let m = model(&[web(json!({"sessionAffinity": "ClientIP"}))], &[]);
    assert_eq!(
        spec(&m, "ns/web:http").affinity_timeout,
        Some(Duration::from_secs(10800))
    );
    let svc = web(json!({"sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}));
    let m = model(&[svc], &[]);
    assert_eq!(
        spec(&m, "ns/web:http").affinity_timeout,
        Some(Duration::from_secs(60))
    );
    let m = model(&[web(json!({"sessionAffinity": "None"}))], &[]);
    assert_eq!(spec(&m, "ns/web:http").affinity_timeout, None);
}

#[test]
fn protocols_and_malformed_ports() {
    let svc = web(json!({"ports": [
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        {"name": "sig", "port": 3868, "protocol": "SCTP"},
        {"name": "bad", "port": 70000, "protocol": "TCP"},
        {"name": "icmp", "port": 1, "protocol": "ICMP"},
    ]}));
    let m = model(&[svc], &[]);
    assert_eq!(
        names(&m),
        vec!["ns/web:dns", "ns/web:dns-tcp", "ns/web:sig"]
    );
    assert_eq!(spec(&m, "ns/web:dns").frontends[0].protocol, Protocol::Udp);
    assert_eq!(
        spec(&m, "ns/web:dns-tcp").frontends[0].protocol,
        Protocol::Tcp
    );
    assert_eq!(spec(&m, "ns/web:sig").frontends[0].protocol, Protocol::Sctp);
    assert_eq!(m.problems.len(), 2, "{:?}", m.problems);
    assert!(m.problems[0].reason.contains("70000"));
    assert!(m.problems[1].reason.contains("ICMP"));
}

#[test]
fn slice_ports_match_by_protocol_too() {
    let svc = web(json!({"ports": [
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
    ]}));
    let s: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}, {"name": "dns-tcp", "port": 5354}],
        "endpoints": [{"addresses": ["10.0.0.1"]}],
    }))
    .unwrap();
    let m = model(&[svc], &[s]);
    assert_eq!(usable(spec(&m, "ns/web:dns")), vec![sa("10.0.0.1:5353")]);
    assert_eq!(
        usable(spec(&m, "ns/web:dns-tcp")),
        vec![sa("10.0.0.1:5354")]
    );
}

fn annotated(annotations: Value) -> Service {
    let mut s = web(json!({}));
    s.metadata.annotations = serde_json::from_value(annotations).unwrap();
    s
}

#[test]
fn annotations_set_scheduler_flags_mode_and_weights() {
    let svc = annotated(json!({
        "xvs.io/scheduler": "mh",
        "xvs.io/scheduler-flags": "mh-port, mh-fallback",
        "xvs.io/mode": "nat",
        "xvs.io/weights": "10.0.0.1=3, 10.0.0.2=0",
        "xvs.io/synproxy": "on",
    }));
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            ep("10.0.0.1", "node-b", ready()),
            ep("10.0.0.2", "node-b", ready()),
            ep("10.0.0.3", "node-b", ready()),
        ],
    );
    let m = model(&[svc], &[s]);
    assert!(m.problems.is_empty(), "{:?}", m.problems);
    let sp = spec(&m, "ns/web:http");
    assert_eq!(sp.scheduler, SchedulerKind::Mh);
    assert_eq!(sp.flags, vec![SchedFlag::MhPort, SchedFlag::MhFallback]);
    assert_eq!(sp.mode, Mode::Nat);
    assert_eq!(sp.synproxy, SynproxySetting::On);
    let w: Vec<u32> = sp.backends.iter().map(|b| b.weight).collect();
    assert_eq!(w, vec![3, 0, 1]);
    // "off" overrides a global "on"; the global threshold goes with "auto".
    let mut c = cfg();
    c.synproxy.mode = config::SynproxyMode::On;
    c.synproxy.auto_threshold = Some(77);
    for (v, want) in [
        ("off", SynproxySetting::Off),
        ("auto", SynproxySetting::Auto { embryonic_max: 77 }),
    ] {
        let m = build_model(
            &[annotated(json!({"xvs.io/synproxy": v}))],
            &[],
            &node(),
            &c,
        );
        assert_eq!(spec(&m, "ns/web:http").synproxy, want, "{v}");
    }
    let m = build_model(&[web(json!({}))], &[], &node(), &c);
    assert_eq!(spec(&m, "ns/web:http").synproxy, SynproxySetting::On);
}

#[test]
fn invalid_annotations_fall_back_to_defaults_with_problems() {
    let svc = annotated(json!({
        "xvs.io/scheduler": "fastest",
        "xvs.io/mode": "tunnel",
        "xvs.io/weights": "10.0.0.1=heavy",
        "xvs.io/scheduler-flags": "turbo",
        "xvs.io/synproxy": "sometimes",
    }));
    let mut c = cfg();
    c.kubernetes.as_mut().unwrap().default_scheduler = SchedulerKind::Wlc;
    c.dataplane.mode = Mode::Nat;
    let m = build_model(&[svc], &[], &node(), &c);
    let sp = spec(&m, "ns/web:http");
    assert_eq!(sp.scheduler, SchedulerKind::Wlc);
    assert_eq!(sp.mode, Mode::Nat);
    assert!(sp.flags.is_empty());
    assert_eq!(
        sp.synproxy,
        SynproxySetting::Auto {
            embryonic_max: 1000
        }
    );
    assert_eq!(m.problems.len(), 5, "{:?}", m.problems);
}

#[test]
fn dsr_annotations_pick_the_encapsulation_and_refuse_what_cannot_work() {
    let mut c = cfg();
    c.dataplane.snat_addresses = vec![ip("198.18.0.20")];
    let mode = |ann: Value, c: &Config| {
        let m = build_model(&[annotated(ann)], &[], &node(), c);
        let problems: Vec<String> = m.problems.iter().map(|p| p.reason.clone()).collect();
        (
            spec(&m, "ns/web:http").mode,
            spec(&m, "ns/web:http").synproxy,
            problems,
        )
    };
    for (encap, want) in [
        (None, Encap::Ipip),
        (Some("ipip"), Encap::Ipip),
        (Some("gue"), Encap::Gue),
        (Some("l2"), Encap::L2),
    ] {
        let mut a = json!({"xvs.io/mode": "dsr"});
        if let Some(e) = encap {
            a["xvs.io/dsr-encap"] = json!(e);
        }
        let (m, _, p) = mode(a, &c);
        assert_eq!(m, Mode::Dsr(want), "{encap:?}");
        assert!(p.is_empty(), "{p:?}");
    }
    // An unknown encapsulation: the default mode, one problem naming the annotation.
    let (m, _, p) = mode(
        json!({"xvs.io/mode": "dsr", "xvs.io/dsr-encap": "vxlan"}),
        &c,
    );
    assert_eq!(m, c.dataplane.mode);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("xvs.io/dsr-encap") && p[0].contains("vxlan"),
        "{p:?}"
    );
    // An encapsulation without DSR: ignored with a problem.
    let (m, _, p) = mode(json!({"xvs.io/mode": "nat", "xvs.io/dsr-encap": "gue"}), &c);
    assert_eq!(m, Mode::Nat);
    assert_eq!(p.len(), 1, "{p:?}");
    // The SYN proxy cannot apply: off, with a problem.
    let (m, sp, p) = mode(json!({"xvs.io/mode": "dsr", "xvs.io/synproxy": "on"}), &c);
    assert_eq!(m, Mode::Dsr(Encap::Ipip));
    assert_eq!(sp, SynproxySetting::Off);
    assert_eq!(p.len(), 1, "{p:?}");
    // No IPv4 outer source: ipip refused (the default mode), l2 needs none.
    let bare = cfg();
    let (m, _, p) = mode(json!({"xvs.io/mode": "dsr"}), &bare);
    assert_eq!(m, bare.dataplane.mode);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("IPv4 outer source"), "{p:?}");
    let (m, _, p) = mode(
        json!({"xvs.io/mode": "dsr", "xvs.io/dsr-encap": "l2"}),
        &bare,
    );
    assert_eq!(m, Mode::Dsr(Encap::L2));
    assert!(p.is_empty(), "{p:?}");
}

#[test]
fn weights_format() {
    let w = parse_weights("10.0.0.5=3,fd00::7=2 , ").unwrap();
    assert_eq!(w[&ip("10.0.0.5")], 3);
    assert_eq!(w[&ip("fd00::7")], 2);
    assert!(parse_weights("10.0.0.5").is_err());
    assert!(parse_weights("10.0.0.5=-1").is_err());
}

#[test]
fn source_ranges_split_load_balancer_frontends_into_their_own_spec() {
    let mut svc = web(json!({
        "type": "LoadBalancer",
        "ports": [{"name": "http", "port": 80, "nodePort": 30080}],
        "loadBalancerSourceRanges": ["192.0.2.0/24", " 203.0.113.9/16 ", "nope"],
    }));
    svc.status =
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.210.1"}]}}))
            .unwrap();
    let m = model(&[svc], &[]);
    assert_eq!(
        names(&m),
        vec!["ns/web:http", "ns/web:http/ext", "ns/web:http/lb"]
    );
    assert_eq!(
        spec(&m, "ns/web:http/ext").frontends,
        vec![fe("198.18.0.10", 30080)]
    );
    assert_eq!(
        spec(&m, "ns/web:http/lb").frontends,
        vec![fe("198.18.210.1", 80)]
    );
    let want: Vec<Cidr> = vec![
        "192.0.2.0/24".parse().unwrap(),
        "203.0.0.0/16".parse().unwrap(),
    ];
    assert_eq!(m.source_ranges.len(), 1);
    assert_eq!(m.source_ranges["ns/web:http/lb"], want);
    assert_eq!(spec(&m, "ns/web:http/lb").source_ranges, want);
    assert!(spec(&m, "ns/web:http/ext").source_ranges.is_empty());
    assert_eq!(m.problems.len(), 1);
}

#[test]
fn health_check_node_port_counts_local_ready_endpoints() {
    let svc = web(json!({
        "type": "LoadBalancer",
        "externalTrafficPolicy": "Local",
        "healthCheckNodePort": 32000,
        "ports": [{"name": "http", "port": 80, "nodePort": 30080}],
    }));
    let m = model(std::slice::from_ref(&svc), &[mixed_slice()]);
    assert_eq!(
        m.health_check_node_ports,
        vec![HealthCheckNodePort {
            port: 32000,
            service: "ns/web".to_owned(),
            local_endpoints: 1
        }]
    );
    let m = model(&[svc], &[]);
    assert_eq!(m.health_check_node_ports[0].local_endpoints, 0);
    let cluster = web(json!({"type": "LoadBalancer", "healthCheckNodePort": 32000}));
    assert!(model(&[cluster], &[]).health_check_node_ports.is_empty());
}

#[test]
fn service_proxy_name_selects_services() {
    let mut mine = web(json!({}));
    mine.metadata.labels = Some([(LABEL_SERVICE_PROXY_NAME.to_owned(), "xvs".to_owned())].into());
    let mut other = web(json!({"clusterIP": "198.18.100.2", "clusterIPs": ["198.18.100.2"]}));
    other.metadata.name = Some("other".to_owned());
    let m = model(&[mine.clone(), other.clone()], &[]);
    assert_eq!(
        names(&m),
        vec!["ns/other:http"],
        "labelled Services are someone else's"
    );
    let mut c = cfg();
    c.kubernetes.as_mut().unwrap().service_proxy_name = Some("xvs".to_owned());
    let m = build_model(&[mine, other], &[], &node(), &c);
    assert_eq!(names(&m), vec!["ns/web:http"]);
    assert_eq!(
        label_selector(None),
        "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
    );
    assert_eq!(
        label_selector(Some("xvs")),
        "service.kubernetes.io/service-proxy-name=xvs,!service.kubernetes.io/headless"
    );
}

#[test]
fn a_frontend_claimed_twice_goes_to_the_older_service() {
    let mut old = web(json!({"externalIPs": ["198.18.200.7"]}));
    old.metadata.creation_timestamp =
        serde_json::from_value(json!("2024-01-01T00:00:00Z")).unwrap();
    let mut new = web(
        json!({"clusterIP": "198.18.100.2", "clusterIPs": ["198.18.100.2"],
        "externalIPs": ["198.18.200.7"]}),
    );
    new.metadata.name = Some("aaa".to_owned());
    new.metadata.creation_timestamp =
        serde_json::from_value(json!("2025-01-01T00:00:00Z")).unwrap();
    let m = model(&[new, old], &[]);
    assert_eq!(
        names(&m),
        vec!["ns/aaa:http", "ns/web:http", "ns/web:http/ext"]
    );
    assert_eq!(m.problems.len(), 1);
    assert_eq!(m.problems[0].object, "Service ns/aaa");
    assert!(
        m.problems[0].reason.contains("ns/web:http/ext"),
        "{}",
        m.problems[0]
    );
}

#[test]
fn bad_objects_are_problems_not_failures() {
    let svc = service(json!({"metadata": {"namespace": "ns", "name": "nospec"}}));
    let bad_ip = web(json!({"clusterIP": "300.1.1.1", "clusterIPs": ["300.1.1.1"]}));
    let good = {
        let mut s = web(json!({"clusterIP": "198.18.100.3", "clusterIPs": ["198.18.100.3"]}));
        s.metadata.name = Some("good".to_owned());
        s
    };
    let mut bad_slice = slice(
        "web-1",
        "IPv4",
        8080,
        vec![ep("not-an-ip", "node-b", ready())],
    );
    bad_slice.metadata.labels =
        Some([("kubernetes.io/service-name".to_owned(), "good".to_owned())].into());
    let m = model(&[svc, bad_ip, good], &[bad_slice]);
    assert_eq!(names(&m), vec!["ns/good:http"]);
    let objects: Vec<&str> = m.problems.iter().map(|p| p.object.as_str()).collect();
    assert_eq!(
        objects,
        vec![
            "EndpointSlice ns/web-1",
            "Service ns/nospec",
            "Service ns/web"
        ]
    );
}

#[test]
fn node_info_resolves_zone_and_addresses_from_the_node() {
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-z"}},
        "status": {"addresses": [
            {"type": "InternalIP", "address": "198.18.0.5"},
            {"type": "Hostname", "address": "node-a"},
        ]},
    }))
    .unwrap();
    let c = Config::default();
    let info = NodeInfo::resolve(&c, "node-a", Some(&n));
    assert_eq!(info.zone.as_deref(), Some("zone-z"));
    assert_eq!(info.addresses, vec![ip("198.18.0.5")]);
    let mut c = Config::default();
    c.node.zone = Some("zone-c".to_owned());
    c.node.addresses = vec![ip("198.18.0.9")];
    let info = NodeInfo::resolve(&c, "node-a", Some(&n));
    assert_eq!(info.zone.as_deref(), Some("zone-c"));
    assert_eq!(info.addresses, vec![ip("198.18.0.9")]);
    assert_eq!(NodeInfo::resolve(&c, "x", None).name, "x");
}

/// 10k Services × 10 endpoints: prints the time (a benchmark's job to judge it), asserts
/// the output.
#[test]
fn many_services_translate() {
    let n = 10_000;
    let mut services = Vec::with_capacity(n);
    let mut slices = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("svc-{i}");
        let vip = format!("198.18.{}.{}", 100 + i / 250, i % 250 + 1);
        services.push(service(json!({
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"clusterIP": vip, "ports": [{"name": "http", "port": 80}]},
        })));
        let eps: Vec<Value> = (0..10)
            .map(|j| {
                ep(
                    &format!("10.{}.{}.{j}", i / 250, i % 250),
                    "node-b",
                    ready(),
                )
            })
            .collect();
        let mut s = slice(&format!("{name}-1"), "IPv4", 8080, eps);
        s.metadata.labels = Some([("kubernetes.io/service-name".to_owned(), name)].into());
        slices.push(s);
    }
    let t0 = std::time::Instant::now();
    let m = model(&services, &slices);
    eprintln!(
        "build_model: {n} services x 10 endpoints in {:?}",
        t0.elapsed()
    );
    assert_eq!(m.specs.len(), n);
    assert!(m.specs.iter().all(|s| s.backends.len() == 10));
    assert!(m.problems.is_empty());
}

/// The model feeds the snapshot builder as is: dual-stack, every frontend kind, a frontend
/// conflict and annotations together still build (no duplicate frontend reaches it).
#[test]
fn the_model_builds_a_snapshot() {
    let mut lb = web(json!({
        "type": "LoadBalancer",
        "clusterIPs": ["198.18.100.1", "2001:2::100"],
        "ipFamilies": ["IPv4", "IPv6"],
        "externalIPs": ["198.18.200.7"],
        "ports": [{"name": "http", "port": 80, "nodePort": 30080}],
        "loadBalancerSourceRanges": ["192.0.2.0/24"],
    }));
    lb.status =
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.210.1"}]}}))
            .unwrap();
    lb.metadata.annotations = Some([(ANN_SCHEDULER.to_owned(), "mh".to_owned())].into());
    let mut clash = web(
        json!({"clusterIP": "198.18.100.2", "clusterIPs": ["198.18.100.2"],
        "externalIPs": ["198.18.200.7"]}),
    );
    clash.metadata.name = Some("zzz".to_owned());
    let v4 = slice(
        "web-4",
        "IPv4",
        8080,
        vec![ep("10.0.0.1", "node-b", ready())],
    );
    let v6 = slice(
        "web-6",
        "IPv6",
        8080,
        vec![ep("fd00::1", "node-b", ready())],
    );
    let m = model(&[lb, clash], &[v4, v6]);
    let mut builder = fastpath::snapshot::SnapshotBuilder::new(1024, 251);
    let snap = builder
        .build(&m.specs, &fastpath::snapshot::L2Table::default())
        .unwrap();
    assert_eq!(snap.services.len(), m.specs.len());
    assert!(snap.is_vip(ip("2001:2::100")));
    assert!(snap.is_vip(ip("198.18.210.1")));
}

/// xorshift64*: deterministic random edits without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
    fn coin(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// A random Service `svc-i` from small pools of addresses and ports, so frontends clash,
/// with every feature the translation knows turning up now and then.
fn random_service(r: &mut Rng, i: usize) -> Service {
    let v4 = format!("198.18.100.{}", 1 + r.below(6));
    let dual = r.coin(4);
    let ips: Vec<String> = if dual {
        vec![v4, format!("2001:2::{}", 1 + r.below(3))]
    } else {
        vec![v4]
    };
    let kind = ["ClusterIP", "NodePort", "LoadBalancer"][r.below(3)];
    let mut ports = vec![json!({"name": "http", "port": 80, "protocol": "TCP",
                               "nodePort": 30000 + r.below(3)})];
    if r.coin(3) {
        let proto = ["UDP", "TCP", "ICMP"][r.below(3)];
        ports.push(json!({"name": "dns", "port": 53, "protocol": proto}));
    }
    let mut spec = json!({
        "type": kind,
        "clusterIP": ips[0],
        "clusterIPs": ips,
        "ipFamilies": if dual { json!(["IPv4", "IPv6"]) } else { json!(["IPv4"]) },
        "ports": ports,
    });
    if r.coin(3) {
        spec["externalIPs"] = json!([format!(
            "198.18.{}.{}",
            [200, 201, 0][r.below(3)],
            [1 + r.below(3), 10][usize::from(r.coin(6))]
        )]);
    }
    if r.coin(3) {
        spec["externalTrafficPolicy"] = json!("Local");
        spec["healthCheckNodePort"] = json!(32000 + r.below(50));
    }
    if r.coin(4) {
        spec["internalTrafficPolicy"] = json!("Local");
    }
    if r.coin(4) {
        spec["loadBalancerSourceRanges"] = json!(["192.0.2.0/24", "2001:db8::/32"]);
    }
    if r.coin(4) {
        spec["trafficDistribution"] = json!(["PreferSameZone", "PreferSameNode"][r.below(2)]);
    }
    if r.coin(5) {
        spec["sessionAffinity"] = json!("ClientIP");
    }
    let mut meta = json!({
        "namespace": (["ns", "other"][r.below(2)]),
        "name": format!("svc-{i}"),
        "creationTimestamp": format!("2025-01-0{}T00:00:00Z", 1 + r.below(3)),
    });
    if r.coin(4) {
        meta["annotations"] = json!({"xvs.io/scheduler": (["mh", "bogus", "wrr"][r.below(3)]),
                                     "xvs.io/weights": "10.0.0.1=3"});
    }
    let mut v = json!({"metadata": meta, "spec": spec});
    if kind == "LoadBalancer" && r.coin(2) {
        // Sometimes an address other Services have as an externalIP.
        let net = [210, 200][usize::from(r.coin(3))];
        v["status"] = json!({"loadBalancer": {"ingress": [
            {"ip": format!("198.18.{net}.{}", 1 + r.below(3))}]}});
    }
    service(v)
}

/// A random EndpointSlice `slice-j` of a random Service (which may not exist).
fn random_slice(r: &mut Rng, j: usize, services: usize) -> EndpointSlice {
    let v6 = r.coin(4);
    let eps: Vec<Value> = (0..r.below(5))
        .map(|_| {
            let addr = if v6 && r.coin(8) {
                // A VIP: refused while a Service has it.
                format!("2001:2::{}", 1 + r.below(3))
            } else if v6 {
                format!("fd00::{}", 1 + r.below(6))
            } else if r.coin(20) {
                "bogus".to_owned()
            } else if r.coin(8) {
                [
                    "198.18.100.1",
                    "198.18.200.1",
                    "198.18.210.2",
                    "198.18.0.10",
                    "127.0.0.1",
                ][r.below(5)]
                .to_owned()
            } else {
                format!("10.0.0.{}", 1 + r.below(6))
            };
            let ready = !r.coin(3);
            let mut e = json!({
                "addresses": [addr],
                "nodeName": (["node-a", "node-b"][r.below(2)]),
                "conditions": {"ready": ready, "serving": ready || r.coin(2),
                               "terminating": !ready && r.coin(2)},
            });
            if r.coin(2) {
                e["hints"] = json!({"forZones": [{"name": (["zone-a", "zone-b"][r.below(2)])}]});
            }
            e
        })
        .collect();
    let mut ports = vec![json!({"name": "http", "port": 8080 + r.below(2), "protocol": "TCP"})];
    if r.coin(2) {
        ports.push(json!({"name": "dns", "port": 5353, "protocol": "UDP"}));
    }
    serde_json::from_value(json!({
        "metadata": {"namespace": (["ns", "other"][r.below(2)]), "name": format!("slice-{j}"),
                     "labels": {"kubernetes.io/service-name": format!("svc-{}", r.below(services))}},
        "addressType": if v6 { "IPv6" } else { "IPv4" },
        "ports": ports,
        "endpoints": eps,
    }))
    .unwrap()
}

/// Random edits (Services and slices added, changed and deleted, relists, node changes)
/// applied to an [`IncrementalModel`] give, after every batch, exactly what a full
/// translation of the same objects gives; and the snapshot builder, fed each model, keeps
/// the ids of backends that stay and shares the entries of specs that did not change.
#[test]
fn incremental_model_equals_full_translation_after_random_edits() {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;

    use fastpath::snapshot::{L2Table, SnapshotBuilder};

    const SERVICES: usize = 14;
    const SLICES: usize = 20;
    for seed in 1..=6u64 {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x1234_5678_9abc_def1));
        let cfg = cfg();
        let mut node = node();
        let mut inc = IncrementalModel::new(&cfg, node.clone());
        let mut services: BTreeMap<usize, Service> = BTreeMap::new();
        let mut slices: BTreeMap<usize, EndpointSlice> = BTreeMap::new();
        let mut builder = SnapshotBuilder::new(1 << 12, 251);
        let mut last: Option<(fastpath::snapshot::Snapshot, K8sModel)> = None;
        for step in 0..120 {
            for _ in 0..1 + r.below(3) {
                match r.below(10) {
                    0..=2 => {
                        let i = r.below(SERVICES);
                        let s = random_service(&mut r, i);
                        // Moving to the other namespace is a delete and an add.
                        if let Some(old) = services.get(&i)
                            && old.metadata.namespace != s.metadata.namespace
                        {
                            inc.delete_service(
                                old.metadata.namespace.as_deref().unwrap(),
                                old.metadata.name.as_deref().unwrap(),
                            );
                        }
                        inc.apply_service(Arc::new(s.clone()));
                        services.insert(i, s);
                    }
                    3 => {
                        let i = r.below(SERVICES);
                        if let Some(s) = services.remove(&i) {
                            inc.delete_service(
                                s.metadata.namespace.as_deref().unwrap(),
                                s.metadata.name.as_deref().unwrap(),
                            );
                        }
                    }
                    4..=6 => {
                        let j = r.below(SLICES);
                        let s = random_slice(&mut r, j, SERVICES);
                        if let Some(old) = slices.get(&j)
                            && old.metadata.namespace != s.metadata.namespace
                        {
                            inc.delete_slice(
                                old.metadata.namespace.as_deref().unwrap(),
                                old.metadata.name.as_deref().unwrap(),
                            );
                        }
                        inc.apply_slice(Arc::new(s.clone()));
                        slices.insert(j, s);
                    }
                    7 => {
                        let j = r.below(SLICES);
                        if let Some(s) = slices.remove(&j) {
                            inc.delete_slice(
                                s.metadata.namespace.as_deref().unwrap(),
                                s.metadata.name.as_deref().unwrap(),
                            );
                        }
                    }
                    8 => {
                        // A relist that lost some objects and changed others.
                        services.retain(|_, _| !r.coin(4));
                        slices.retain(|_, _| !r.coin(4));
                        if r.coin(2) {
                            let j = r.below(SLICES);
                            slices.insert(j, random_slice(&mut r, j, SERVICES));
                        }
                        inc.replace_services(services.values().cloned().map(Arc::new));
                        inc.replace_slices(slices.values().cloned().map(Arc::new));
                    }
                    _ => {
                        if r.coin(2) {
                            node.zone = Some(["zone-a", "zone-b"][r.below(2)].to_owned());
                        } else {
                            node.name = ["node-a", "node-b"][r.below(2)].to_owned();
                        }
                        inc.set_node(node.clone());
                    }
                }
            }
            let all_services: Vec<Service> = services.values().cloned().collect();
            let all_slices: Vec<EndpointSlice> = slices.values().cloned().collect();
            let full = build_model(&all_services, &all_slices, &node, &cfg);
            let got = inc.model().clone();
            assert_eq!(got, full, "seed {seed} step {step}");
            // The snapshot builder over the same models.
            let snap = builder
                .build(&got.specs, &L2Table::default())
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            if let Some((prev, prev_model)) = &last {
                let before: HashMap<(&str, SocketAddr), u32> = prev
                    .services
                    .iter()
                    .flat_map(|s| {
                        s.backends
                            .iter()
                            .map(|b| ((s.name.as_str(), b.addr), b.id.0))
                    })
                    .collect();
                for s in &snap.services {
                    for b in &s.backends {
                        if let Some(id) = before.get(&(s.name.as_str(), b.addr)) {
                            assert_eq!(*id, b.id.0, "seed {seed} step {step}: {}", s.name);
                        }
                    }
                    let old = prev_model.specs.iter().position(|p| p.name == s.name);
                    let new = got.specs.iter().find(|p| p.name == s.name).unwrap();
                    if let Some(o) = old
                        && prev_model.specs[o] == *new
                    {
                        let prev_entry = prev.services.as_slice()[o].clone();
                        assert!(Arc::ptr_eq(&prev_entry, &snap.services[s.id as usize]));
                        assert_eq!(prev_entry.id, s.id);
                    }
                }
            }
            last = Some((snap, got));
        }
    }
}

/// One EndpointSlice change translates its Service only.
#[test]
fn a_slice_change_retranslates_one_service() {
    use std::sync::Arc;
    let mut inc = IncrementalModel::new(&cfg(), node());
    let mut other = web(json!({"clusterIP": "198.18.100.2", "clusterIPs": ["198.18.100.2"]}));
    other.metadata.name = Some("other".to_owned());
    inc.apply_service(Arc::new(web(json!({}))));
    inc.apply_service(Arc::new(other));
    let s1 = slice(
        "web-1",
        "IPv4",
        8080,
        vec![ep("10.0.0.1", "node-b", ready())],
    );
    inc.apply_slice(Arc::new(s1.clone()));
    assert_eq!(inc.model().specs.len(), 2);
    assert_eq!(inc.last_translated(), 2);
    // Re-applying the same object is no change.
    inc.apply_slice(Arc::new(s1));
    assert!(!inc.is_dirty());
    let s2 = slice(
        "web-1",
        "IPv4",
        8080,
        vec![
            ep("10.0.0.1", "node-b", ready()),
            ep("10.0.0.2", "node-b", ready()),
        ],
    );
    inc.apply_slice(Arc::new(s2));
    let m = inc.model();
    assert_eq!(
        usable(spec(m, "ns/web:http")),
        vec![sa("10.0.0.1:8080"), sa("10.0.0.2:8080")]
    );
    assert_eq!(inc.last_translated(), 1);
}
