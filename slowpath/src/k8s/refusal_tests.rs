//! What the translation refuses (issue #27): Services the API server would refuse, frontends
//! and endpoints on addresses no Service may take, and source ranges whatever the merge.
//! Each refusal is a [`Problem`] of its kind, and the rest of the Service (and every other
//! Service) is still translated.

use std::sync::Arc;
use std::time::Instant;

use config::Cidr;
use fastpath::pipeline::DropReason;
use fastpath::snapshot::{L2Table, SnapshotBuilder};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use super::tests::{
    cfg, ep, fe, ip, model, names, node, ready, sa, service, slice, spec, usable, web,
};
use super::*;

fn kinds(m: &K8sModel) -> Vec<(&str, ProblemKind)> {
    m.problems
        .iter()
        .map(|p| (p.object.as_str(), p.kind))
        .collect()
}

fn with_status(mut svc: Service, status: Value) -> Service {
    svc.status = serde_json::from_value(status).unwrap();
    svc
}

fn named(mut svc: Service, name: &str, created: &str) -> Service {
    svc.metadata.name = Some(name.to_owned());
    svc.metadata.creation_timestamp = serde_json::from_value(json!(created)).unwrap();
    svc
}

fn slice_of(svc: &str, name: &str, endpoints: Vec<Value>) -> EndpointSlice {
    let mut s = slice(name, "IPv4", 8080, endpoints);
    s.metadata.labels = Some([(LABEL_SERVICE_NAME.to_owned(), svc.to_owned())].into());
    s
}

fn canary() -> Service {
    named(
        web(json!({"clusterIP": "198.18.100.9", "clusterIPs": ["198.18.100.9"]})),
        "canary",
        "2025-01-01T00:00:00Z",
    )
}

/// Two ports with one name, or names that are no DNS labels (a newline in one), make the
/// API server refuse a Service; here it is skipped with a `service_refused` problem, and
/// the Services beside it are translated.
#[test]
fn a_service_the_api_server_would_refuse_is_skipped_alone() {
    let dup = web(json!({"ports": [
        {"name": "http", "port": 80, "protocol": "TCP"},
        {"name": "http", "port": 81, "protocol": "TCP"},
    ]}));
    let unnamed_clash = named(
        web(
            json!({"clusterIP": "198.18.100.3", "clusterIPs": ["198.18.100.3"], "ports": [
                {"port": 53, "protocol": "UDP"}, {"name": "53", "port": 5353, "protocol": "UDP"},
            ]}),
        ),
        "dns",
        "2024-01-01T00:00:00Z",
    );
    let forged = named(
        web(json!({"clusterIP": "198.18.100.4", "clusterIPs": ["198.18.100.4"]})),
        "web\n2026-01-01T00:00:00Z  INFO xvs: forged",
        "2024-01-01T00:00:00Z",
    );
    let upper = named(
        web(
            json!({"clusterIP": "198.18.100.5", "clusterIPs": ["198.18.100.5"],
            "ports": [{"name": "HTTP", "port": 80}]}),
        ),
        "upper",
        "2024-01-01T00:00:00Z",
    );
    let m = model(&[dup, unnamed_clash, forged, upper, canary()], &[]);
    assert_eq!(names(&m), ["ns/canary:http"]);
    let refused: Vec<&Problem> = m
        .problems
        .iter()
        .filter(|p| p.kind == ProblemKind::ServiceRefused)
        .collect();
    assert_eq!(refused.len(), 4, "{:#?}", m.problems);
    let reason = |object: &str| {
        refused
            .iter()
            .find(|p| p.object == object)
            .map(|p| p.reason.clone())
            .unwrap_or_else(|| panic!("no problem for {object}: {:#?}", m.problems))
    };
    assert!(
        reason("Service ns/web").contains("ports[1] and ports[0] are both named \"http\""),
        "{}",
        reason("Service ns/web")
    );
    assert!(reason("Service ns/dns").contains("both named \"53\""));
    assert!(reason("Service ns/upper").contains("ports[0]: name \"HTTP\" is not a DNS label"));
    // The name is quoted with its newline escaped: the reason is one line.
    let forged = reason("Service ns/web\n2026-01-01T00:00:00Z  INFO xvs: forged");
    assert!(forged.contains(r#"name "web\n2026"#), "{forged}");
    assert!(!forged.contains('\n'));
    let p = refused.iter().find(|p| p.object.contains('\n')).unwrap();
    assert!(p.to_string().starts_with(r"Service ns/web\n2026"), "{p}");
    assert!(!p.to_string().contains('\n'));
}

/// The incremental model keeps the last translation of a Service whose change is refused
/// (the API server would have kept the previous object); fixing or deleting it clears the
/// problem.
#[test]
fn a_refused_change_keeps_the_previous_translation() {
    let mut inc = IncrementalModel::new(&cfg(), node());
    inc.apply_service(Arc::new(web(json!({}))));
    inc.apply_service(Arc::new(canary()));
    inc.apply_slice(Arc::new(slice_of(
        "web",
        "web-1",
        vec![ep("10.0.0.1", "node-b", ready())],
    )));
    let before = inc.model().clone();
    assert_eq!(names(&before), ["ns/canary:http", "ns/web:http"]);
    let dup = web(json!({"ports": [
        {"name": "http", "port": 80, "protocol": "TCP"},
        {"name": "http", "port": 8080, "protocol": "TCP"},
    ]}));
    inc.apply_service(Arc::new(dup));
    // Its endpoints change meanwhile: still the previous translation.
    inc.apply_slice(Arc::new(slice_of(
        "web",
        "web-1",
        vec![ep("10.0.0.2", "node-b", ready())],
    )));
    let m = inc.model().clone();
    assert_eq!(m.specs, before.specs);
    assert_eq!(kinds(&m), [("Service ns/web", ProblemKind::ServiceRefused)]);
    // Fixed: translated again, problem gone.
    inc.apply_service(Arc::new(web(
        json!({"ports": [{"name": "http", "port": 8080}]}),
    )));
    let m = inc.model().clone();
    assert_eq!(
        spec(&m, "ns/web:http").frontends,
        [fe("198.18.100.1", 8080)]
    );
    assert_eq!(usable(spec(&m, "ns/web:http")), [sa("10.0.0.2:8080")]);
    assert!(m.problems.is_empty(), "{:#?}", m.problems);
    // Refused from its first version: nothing of it; deleting it clears the problem.
    let bad = named(
        web(
            json!({"clusterIP": "198.18.100.7", "clusterIPs": ["198.18.100.7"],
            "ports": [{"name": "a", "port": 1}, {"name": "a", "port": 2}]}),
        ),
        "bad",
        "2024-01-01T00:00:00Z",
    );
    inc.apply_service(Arc::new(bad));
    let m = inc.model().clone();
    assert_eq!(names(&m), ["ns/canary:http", "ns/web:http"]);
    assert_eq!(kinds(&m), [("Service ns/bad", ProblemKind::ServiceRefused)]);
    inc.delete_service("ns", "bad");
    assert!(inc.model().problems.is_empty());
}

/// Frontends on special addresses or on the node's own addresses are refused, address by
/// address (every port), with the rest of the Service kept: a load-balancer IP equal to
/// the node's address does not become a frontend on the node's SSH port.
#[test]
fn frontends_on_special_or_own_addresses_are_refused() {
    let svc = with_status(
        web(json!({
            "type": "LoadBalancer",
            "externalIPs": ["198.18.0.11", "127.0.0.1", "198.18.200.7"],
            "ports": [{"name": "ssh", "port": 22, "nodePort": 30022}],
        })),
        json!({"loadBalancer": {"ingress": [
            {"ip": "198.18.0.10"}, {"ip": "0.0.0.0"}, {"ip": "198.18.210.1"}]}}),
    );
    let node_vip = named(
        web(json!({"clusterIP": "198.18.0.10", "clusterIPs": ["198.18.0.10"]})),
        "nodeip",
        "2024-01-01T00:00:00Z",
    );
    let m = model(&[svc, node_vip], &[]);
    assert_eq!(names(&m), ["ns/web:ssh", "ns/web:ssh/ext"]);
    assert_eq!(spec(&m, "ns/web:ssh").frontends, [fe("198.18.100.1", 22)]);
    // NodePorts stay on the node's addresses; the other frontends are the allowed ones.
    assert_eq!(
        spec(&m, "ns/web:ssh/ext").frontends,
        [
            fe("198.18.0.10", 30022),
            fe("198.18.200.7", 22),
            fe("198.18.210.1", 22)
        ]
    );
    let mut got = kinds(&m);
    got.sort_unstable();
    assert_eq!(
        got,
        [
            ("Service ns/nodeip", ProblemKind::FrontendNodeAddress),
            ("Service ns/web", ProblemKind::FrontendSpecial),
            ("Service ns/web", ProblemKind::FrontendSpecial),
            ("Service ns/web", ProblemKind::FrontendNodeAddress),
            ("Service ns/web", ProblemKind::FrontendNodeAddress),
        ]
    );
    let reasons: Vec<&str> = m.problems.iter().map(|p| p.reason.as_str()).collect();
    assert!(
        reasons.contains(
            &"load-balancer ingress IP 198.18.0.10: it is this node's own address; ignored"
        ),
        "{reasons:#?}"
    );
    assert!(reasons.contains(&"externalIP 198.18.0.11: it is this node's own address; ignored"));
    assert!(reasons.contains(&"externalIP 127.0.0.1: it is a loopback address; ignored"));
}

/// An externalIP that is another Service's ClusterIP:port goes to that Service, even when
/// the hijacker is older.
#[test]
fn a_frontend_on_another_services_cluster_ip_stays_with_that_service() {
    let hijack = named(
        web(
            json!({"clusterIP": "198.18.100.2", "clusterIPs": ["198.18.100.2"],
            "externalIPs": ["198.18.200.5", "198.18.200.6"]}),
        ),
        "hijack",
        "2020-01-01T00:00:00Z",
    );
    let victim = named(
        web(json!({"clusterIP": "198.18.200.5", "clusterIPs": ["198.18.200.5"]})),
        "victim",
        "2025-01-01T00:00:00Z",
    );
    let m = model(&[hijack, victim], &[]);
    assert_eq!(
        spec(&m, "ns/victim:http").frontends,
        [fe("198.18.200.5", 80)]
    );
    assert_eq!(
        spec(&m, "ns/hijack:http/ext").frontends,
        [fe("198.18.200.6", 80)]
    );
    assert_eq!(
        kinds(&m),
        [("Service ns/hijack", ProblemKind::FrontendInUse)]
    );
    assert!(
        m.problems[0]
            .reason
            .contains("already used by ns/victim:http")
    );
}

/// Endpoints on special addresses, on the node's own addresses or on any Service's VIP are
/// refused one by one, with their slice named; the good ones stay.
#[test]
fn endpoints_that_are_no_backends_are_refused() {
    let bad = [
        "127.0.0.1",
        "224.0.0.1",
        "255.255.255.255",
        "0.0.0.0",
        "169.254.10.1",
        "198.18.0.10",
        "198.18.0.11",
        "198.18.100.2",
        "198.18.200.7",
    ];
    let mut eps: Vec<Value> = bad.iter().map(|a| ep(a, "node-b", ready())).collect();
    eps.push(ep("10.0.0.1", "node-b", ready()));
    let v4 = slice_of("web", "web-4", eps);
    let mut v6 = slice(
        "web-6",
        "IPv6",
        8080,
        ["::1", "fe80::1", "ff02::1", "2001:2::10", "fd00::1"]
            .iter()
            .map(|a| ep(a, "node-b", ready()))
            .collect(),
    );
    v6.metadata.labels = Some([(LABEL_SERVICE_NAME.to_owned(), "web".to_owned())].into());
    let svc = web(json!({"clusterIPs": ["198.18.100.1", "2001:2::100"],
        "ipFamilies": ["IPv4", "IPv6"]}));
    let other = named(
        web(
            json!({"clusterIP": "198.18.100.2", "clusterIPs": ["198.18.100.2"],
            "externalIPs": ["198.18.200.7"]}),
        ),
        "other",
        "2024-01-01T00:00:00Z",
    );
    let m = model(&[svc, other], &[v4, v6]);
    assert_eq!(usable(spec(&m, "ns/web:http")), [sa("10.0.0.1:8080")]);
    assert_eq!(spec(&m, "ns/web:http").backends.len(), 1);
    assert_eq!(usable(spec(&m, "ns/web:http/v6")), [sa("[fd00::1]:8080")]);
    let count = |kind| m.problems.iter().filter(|p| p.kind == kind).count();
    assert_eq!(count(ProblemKind::EndpointSpecial), 8, "{:#?}", m.problems);
    assert_eq!(count(ProblemKind::EndpointNodeAddress), 3);
    assert_eq!(count(ProblemKind::EndpointVip), 2);
    let p = m
        .problems
        .iter()
        .find(|p| p.reason.starts_with("endpoint 127.0.0.1:"))
        .unwrap();
    assert_eq!(p.object, "EndpointSlice ns/web-4");
    assert_eq!(
        p.reason,
        "endpoint 127.0.0.1: it is a loopback address; endpoint ignored"
    );
    assert!(
        m.problems.iter().any(|p| p.object == "Service ns/web"
            && p.reason == "endpoint 198.18.100.2:8080: it is a Service's VIP; endpoint ignored"),
        "{:#?}",
        m.problems
    );
}

/// An endpoint refused for being a VIP comes back when that VIP goes, and goes when it
/// comes, in the incremental model as in a full translation.
#[test]
fn endpoints_follow_the_vips_of_other_services_incrementally() {
    let mut inc = IncrementalModel::new(&cfg(), node());
    inc.apply_service(Arc::new(web(json!({}))));
    let eps = vec![
        ep("198.18.100.2", "node-b", ready()),
        ep("10.0.0.1", "node-b", ready()),
    ];
    inc.apply_slice(Arc::new(slice_of("web", "web-1", eps)));
    assert_eq!(spec(inc.model(), "ns/web:http").backends.len(), 2);
    let other = named(
        web(json!({"clusterIP": "198.18.100.2", "clusterIPs": ["198.18.100.2"]})),
        "other",
        "2024-01-01T00:00:00Z",
    );
    inc.apply_service(Arc::new(other));
    let m = inc.model().clone();
    assert_eq!(usable(spec(&m, "ns/web:http")), [sa("10.0.0.1:8080")]);
    assert_eq!(kinds(&m), [("Service ns/web", ProblemKind::EndpointVip)]);
    inc.delete_service("ns", "other");
    let m = inc.model().clone();
    assert_eq!(spec(&m, "ns/web:http").backends.len(), 2);
    assert!(m.problems.is_empty());
}

/// One address that is both an externalIP and a load-balancer IP of a Service with source
/// ranges: the merged frontend carries the ranges (kube-proxy checks them for the
/// load-balancer IP), and the snapshot built from it refuses a client outside them as
/// `source_range`.
#[test]
fn source_ranges_apply_to_an_address_that_is_also_an_external_ip() {
    let svc = with_status(
        web(json!({
            "type": "LoadBalancer",
            "externalIPs": ["198.18.200.7"],
            "ports": [{"name": "http", "port": 80, "nodePort": 30080}],
            "loadBalancerSourceRanges": ["192.0.2.0/24"],
        })),
        json!({"loadBalancer": {"ingress": [{"ip": "198.18.200.7"}]}}),
    );
    let m = model(
        &[svc],
        &[slice_of(
            "web",
            "web-1",
            vec![ep("10.0.0.1", "node-b", ready())],
        )],
    );
    assert!(m.problems.is_empty(), "{:#?}", m.problems);
    let ranges: Vec<Cidr> = vec!["192.0.2.0/24".parse().unwrap()];
    assert_eq!(
        spec(&m, "ns/web:http/lb").frontends,
        [fe("198.18.200.7", 80)]
    );
    assert_eq!(spec(&m, "ns/web:http/lb").source_ranges, ranges);
    assert_eq!(
        spec(&m, "ns/web:http/ext").frontends,
        [fe("198.18.0.10", 30080)]
    );
    let snap = SnapshotBuilder::new(64, 251)
        .build(&m.specs, &L2Table::default())
        .unwrap();
    let entry = snap.service_for(&fe("198.18.200.7", 80)).unwrap();
    let now = Instant::now();
    assert_eq!(
        entry.admit_new_flow(false, ip("198.51.100.1"), now),
        Err(DropReason::SourceRange)
    );
    assert_eq!(entry.admit_new_flow(false, ip("192.0.2.9"), now), Ok(()));
}

/// Across Services too: a load-balancer IP with source ranges wins the address over an
/// older Service's externalIP, so the ranges apply.
#[test]
fn source_ranges_win_a_frontend_another_service_lists_without_them() {
    let older = named(
        web(
            json!({"clusterIP": "198.18.100.2", "clusterIPs": ["198.18.100.2"],
            "externalIPs": ["198.18.200.7"]}),
        ),
        "older",
        "2020-01-01T00:00:00Z",
    );
    let lb = with_status(
        named(
            web(json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ["192.0.2.0/24"]})),
            "lb",
            "2025-01-01T00:00:00Z",
        ),
        json!({"loadBalancer": {"ingress": [{"ip": "198.18.200.7"}]}}),
    );
    let m = model(&[older, lb], &[]);
    assert_eq!(
        spec(&m, "ns/lb:http/lb").frontends,
        [fe("198.18.200.7", 80)]
    );
    assert!(!names(&m).contains(&"ns/older:http/ext"), "{:?}", names(&m));
    assert_eq!(
        kinds(&m),
        [("Service ns/older", ProblemKind::FrontendInUse)]
    );
}

/// The Node's own addresses come from the config, the Node object and the SNAT addresses;
/// NodePorts listen on the configured ones (else the Node's) only.
#[test]
fn the_nodes_own_addresses() {
    let n: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "node-a"},
        "status": {"addresses": [
            {"type": "InternalIP", "address": "198.18.0.5"},
            {"type": "ExternalIP", "address": "198.18.9.5"},
            {"type": "Hostname", "address": "node-a"},
        ]},
    }))
    .unwrap();
    let mut c = config::Config::default();
    c.node.addresses = vec![ip("198.18.0.9")];
    c.dataplane.snat_addresses = vec![ip("198.18.1.254")];
    let info = NodeInfo::resolve(&c, "node-a", Some(&n));
    assert_eq!(info.addresses, [ip("198.18.0.9")]);
    for own in ["198.18.0.9", "198.18.0.5", "198.18.9.5", "198.18.1.254"] {
        assert!(info.is_own(ip(own)), "{own}");
    }
    assert!(!info.is_own(ip("198.18.0.6")));
    let svc = service(json!({"metadata": {"namespace": "ns", "name": "np"},
        "spec": {"type": "NodePort", "clusterIP": "198.18.100.1",
            "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}));
    let m = build_model(&[svc], &[], &info, &cfg());
    assert_eq!(
        spec(&m, "ns/np:http/ext").frontends,
        [fe("198.18.0.9", 30080)]
    );
}

fn with_annotations(svc: Service, annotations: Value) -> Service {
    let mut svc = svc;
    svc.metadata.annotations = serde_json::from_value(annotations).unwrap();
    svc
}

/// The `xvs.io/health-check-*` annotations are the Service's own health check, on every one
/// of its specs; a Service without `xvs.io/health-check-probe` is not probed (its endpoints'
/// readiness is the EndpointSlice's), whatever `[health]` says.
#[test]
fn health_check_annotations_set_the_services_check() {
    let svc = with_annotations(
        web(json!({"externalIPs": ["198.18.200.7"]})),
        json!({
            "xvs.io/health-check-probe": "https",
            "xvs.io/health-check-port": " 8443 ",
            "xvs.io/health-check-path": "/ready?full=1",
            "xvs.io/health-check-status": "200, 204",
            "xvs.io/health-check-rise": "4",
            "xvs.io/health-check-fall": "1",
        }),
    );
    let m = model(&[svc, canary()], &[]);
    assert_eq!(m.problems, vec![]);
    let want = config::ServiceHealth {
        probe: Some(config::ProbeKind::Https),
        port: Some(8443),
        http_path: Some("/ready?full=1".to_owned()),
        http_status: Some(vec![200, 204]),
        rise: Some(4),
        fall: Some(1),
    };
    for name in ["ns/web:http", "ns/web:http/ext"] {
        assert_eq!(spec(&m, name).health, want, "{name}");
    }
    let not_probed = config::ServiceHealth {
        probe: Some(config::ProbeKind::None),
        ..config::ServiceHealth::default()
    };
    assert_eq!(spec(&m, "ns/canary:http").health, not_probed);
    // Only the probe: the rest from [health].
    let probe_only = with_annotations(web(json!({})), json!({"xvs.io/health-check-probe": "tcp"}));
    let m = model(&[probe_only], &[]);
    assert_eq!(
        spec(&m, "ns/web:http").health,
        config::ServiceHealth {
            probe: Some(config::ProbeKind::Tcp),
            ..config::ServiceHealth::default()
        }
    );
    // `none` turns probes off for the Service whatever [health] says.
    let off = with_annotations(web(json!({})), json!({"xvs.io/health-check-probe": "none"}));
    let m = model(&[off], &[]);
    assert_eq!(
        spec(&m, "ns/web:http").health.probe,
        Some(config::ProbeKind::None)
    );
}

/// One bad health-check annotation: that Service's endpoints are not probed (all of its
/// health annotations ignored, since half a check could probe the wrong port or path), with
/// one problem per bad value naming the annotation and the value; the rest of the Service
/// (its other annotations, its specs) and every other Service are as they were.
#[test]
fn a_bad_health_check_annotation_is_refused_for_its_service_alone() {
    let cases = [
        (
            "xvs.io/health-check-probe",
            "grpc",
            "\"grpc\" is not a probe",
        ),
        ("xvs.io/health-check-port", "0", "\"0\" is not a port"),
        ("xvs.io/health-check-port", "http", "\"http\" is not a port"),
        (
            "xvs.io/health-check-port",
            "65536",
            "\"65536\" is not a port",
        ),
        ("xvs.io/health-check-path", "ready", "must start with '/'"),
        (
            "xvs.io/health-check-path",
            "/ready\r\nX-Forged: 1",
            "only visible ASCII",
        ),
        ("xvs.io/health-check-path", "/a b", "only visible ASCII"),
        (
            "xvs.io/health-check-status",
            "200,ok",
            "\"ok\" is not a status code",
        ),
        (
            "xvs.io/health-check-status",
            "99",
            "99 is not an HTTP status",
        ),
        (
            "xvs.io/health-check-status",
            "",
            "\"\" is not a status code",
        ),
        (
            "xvs.io/health-check-rise",
            "0",
            "\"0\" is not a positive integer",
        ),
        (
            "xvs.io/health-check-fall",
            "-3",
            "\"-3\" is not a positive integer",
        ),
    ];
    let good = with_annotations(
        canary(),
        json!({"xvs.io/health-check-probe": "http", "xvs.io/health-check-path": "/ok"}),
    );
    for (key, value, says) in cases {
        let mut ann = json!({
            "xvs.io/health-check-probe": "http",
            "xvs.io/health-check-path": "/ready",
            "xvs.io/scheduler": "mh",
        });
        ann[key] = json!(value);
        let bad = with_annotations(web(json!({})), ann);
        let m = model(&[bad, good.clone()], &[]);
        assert_eq!(
            names(&m),
            ["ns/canary:http", "ns/web:http"],
            "{key}={value:?}"
        );
        let w = spec(&m, "ns/web:http");
        assert_eq!(
            w.health.probe,
            Some(config::ProbeKind::None),
            "{key}={value:?}"
        );
        assert_eq!(
            w.health,
            config::ServiceHealth {
                probe: Some(config::ProbeKind::None),
                ..config::ServiceHealth::default()
            }
        );
        assert_eq!(
            w.scheduler,
            config::SchedulerKind::Mh,
            "its other annotations apply"
        );
        let canary = spec(&m, "ns/canary:http");
        assert_eq!(canary.health.http_path.as_deref(), Some("/ok"));
        assert_eq!(m.problems.len(), 1, "{key}={value:?}: {:#?}", m.problems);
        let p = &m.problems[0];
        assert_eq!(
            (p.object.as_str(), p.kind),
            ("Service ns/web", ProblemKind::Invalid)
        );
        assert!(p.reason.starts_with(&format!("{key}: ")), "{}", p.reason);
        assert!(p.reason.contains(says), "{key}={value:?}: {}", p.reason);
        assert!(
            p.reason.ends_with("(its endpoints are not probed)"),
            "{}",
            p.reason
        );
        assert!(
            !p.reason.contains('\n') && !p.reason.contains('\r'),
            "one line"
        );
    }
    // How to probe without whether: refused the same way, naming the missing annotation.
    let no_probe = with_annotations(
        web(json!({})),
        json!({"xvs.io/health-check-path": "/ready"}),
    );
    let m = model(&[no_probe], &[]);
    assert_eq!(
        spec(&m, "ns/web:http").health.probe,
        Some(config::ProbeKind::None)
    );
    assert_eq!(m.problems.len(), 1, "{:#?}", m.problems);
    assert!(
        m.problems[0]
            .reason
            .starts_with("xvs.io/health-check-probe: not set"),
        "{}",
        m.problems[0].reason
    );
}
