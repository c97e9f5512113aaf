//! What the translation tells the pipeline about a Service that cannot serve a new flow
//! (kube-proxy's reject or drop, `NoEndpoints`), which frontends are ClusterIPs (their other
//! ports are rejected), and the Service CIDRs (from the config and the ServiceCIDR objects,
//! untrusted), in full translations and in the incremental model.

use std::sync::Arc;

use fastpath::snapshot::NoEndpoints;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use serde_json::json;

use super::tests::{cfg, ep, model, node, ready, slice, spec, web};
use super::{IncrementalModel, ProblemKind, build_model, build_model_with};

/// A LoadBalancer Service (NodePort 30080, ingress 198.18.210.1) with `policy` as its
/// externalTrafficPolicy, and `ranges` as its source ranges.
fn lb(policy: &str, ranges: &[&str]) -> k8s_openapi::api::core::v1::Service {
    let mut svc = web(json!({
        "type": "LoadBalancer",
        "externalTrafficPolicy": policy,
        "loadBalancerSourceRanges": ranges,
        "ports": [{"name": "http", "port": 80, "nodePort": 30080}],
    }));
    svc.status =
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.210.1"}]}}))
            .unwrap();
    svc
}

fn verdicts(m: &super::K8sModel, names: &[&str]) -> Vec<(NoEndpoints, bool)> {
    names
        .iter()
        .map(|n| {
            let s = spec(m, n);
            (s.no_endpoints, s.cluster_ip)
        })
        .collect()
}

#[test]
fn a_service_without_endpoints_rejects_everywhere_and_marks_its_clusterip() {
    use NoEndpoints::Reject;
    let m = model(&[lb("Cluster", &[])], &[]);
    assert_eq!(
        verdicts(&m, &["ns/web:http", "ns/web:http/ext"]),
        [(Reject, true), (Reject, false)]
    );
    // Endpoints, but none ready nor serving: none usable anywhere, the same.
    let s = slice(
        "web-1",
        "IPv4",
        8080,
        vec![ep(
            "10.0.0.2",
            "node-a",
            json!({"ready": false, "serving": false}),
        )],
    );
    let m = model(&[lb("Local", &[])], &[s]);
    assert_eq!(
        verdicts(&m, &["ns/web:http", "ns/web:http/ext"]),
        [(Reject, true), (Reject, false)]
    );
}

#[test]
fn local_policies_without_local_endpoints_drop_while_others_have_some() {
    use NoEndpoints::{Drop, Reject};
    let remote = || {
        slice(
            "web-1",
            "IPv4",
            8080,
            vec![ep("10.0.0.2", "node-b", ready())],
        )
    };
    // externalTrafficPolicy Local: the external frontends (NodePort, load-balancer IP, with
    // source ranges in their own spec) drop; the ClusterIP keeps Cluster's endpoints.
    let m = model(&[lb("Local", &["198.19.0.0/16"])], &[remote()]);
    assert_eq!(
        verdicts(&m, &["ns/web:http", "ns/web:http/ext", "ns/web:http/lb"]),
        [(Reject, true), (Drop, false), (Drop, false)]
    );
    // internalTrafficPolicy Local: the ClusterIP drops.
    let m = model(
        &[web(json!({"internalTrafficPolicy": "Local"}))],
        &[remote()],
    );
    assert_eq!(verdicts(&m, &["ns/web:http"]), [(Drop, true)]);
    // A local endpoint: nothing to decide, but the value stays the policy's.
    let local = slice(
        "web-1",
        "IPv4",
        8080,
        vec![ep("10.0.0.1", "node-a", ready())],
    );
    let m = model(&[lb("Local", &[])], &[local]);
    assert_eq!(
        verdicts(&m, &["ns/web:http", "ns/web:http/ext"]),
        [(Reject, true), (Drop, false)]
    );
}

fn cidr_object(name: &str, cidrs: &[&str]) -> ServiceCIDR {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"cidrs": cidrs},
    }))
    .unwrap()
}

#[test]
fn service_cidrs_come_from_the_config_and_the_objects_bad_ones_alone_refused() {
    let mut c = cfg();
    c.kubernetes.as_mut().unwrap().service_cidrs = vec![
        "198.18.96.0/20".parse().unwrap(),
        // Holds the node's address (198.18.0.10): refused at run time too.
        "198.18.0.0/24".parse().unwrap(),
    ];
    let objects = [
        cidr_object("kubernetes", &["198.18.112.0/20", "2001:2:0:96::/112"]),
        cidr_object("bad", &["198.18.128.1/20"]),
    ];
    let m = build_model_with(&[web(json!({}))], &[], &objects, &node(), &c);
    let got: Vec<String> = m.service_cidrs.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        got,
        ["198.18.96.0/20", "198.18.112.0/20", "2001:2:0:96::/112"]
    );
    let refused: Vec<(&str, ProblemKind)> = m
        .problems
        .iter()
        .map(|p| (p.object.as_str(), p.kind))
        .collect();
    assert_eq!(
        refused,
        [
            ("ServiceCIDR bad", ProblemKind::ServiceCidr),
            (
                "config [kubernetes] service_cidrs",
                ProblemKind::ServiceCidr
            ),
        ]
    );
    // Without objects: the config's only.
    let m = build_model(&[web(json!({}))], &[], &node(), &c);
    assert_eq!(m.service_cidrs.len(), 1);
}

#[test]
fn the_incremental_model_follows_service_cidr_objects() {
    let c = cfg();
    let mut inc = IncrementalModel::new(&c, node());
    inc.apply_service(Arc::new(web(json!({}))));
    assert!(inc.model().service_cidrs.is_empty());
    let a = Arc::new(cidr_object("a", &["198.18.96.0/20"]));
    let bad = Arc::new(cidr_object("bad", &["0.0.0.0/0"]));
    inc.apply_service_cidr(Arc::clone(&a));
    inc.apply_service_cidr(Arc::clone(&bad));
    assert!(inc.is_dirty());
    let m = inc.model().clone();
    assert_eq!(m.service_cidrs, ["198.18.96.0/20".parse().unwrap()]);
    assert_eq!(m.problems.len(), 1, "{:?}", m.problems);
    assert!(
        m.problems[0].reason.contains("198.18.0.10"),
        "{:?}",
        m.problems
    );
    let full = build_model_with(
        &[web(json!({}))],
        &[],
        &[(*a).clone(), (*bad).clone()],
        &node(),
        &c,
    );
    assert_eq!(m, full, "incremental = full translation");
    // A Service's problem and the CIDRs' together, then the bad object gone.
    inc.apply_service(Arc::new(web(json!({"externalIPs": ["nope"]}))));
    let m = inc.model().clone();
    assert_eq!(m.problems.len(), 2, "{:?}", m.problems);
    assert_eq!(m.problems[1].kind, ProblemKind::ServiceCidr);
    inc.delete_service_cidr("bad");
    let m = inc.model().clone();
    assert_eq!(m.problems.len(), 1, "{:?}", m.problems);
    assert_ne!(m.problems[0].kind, ProblemKind::ServiceCidr);
    inc.replace_service_cidrs(std::iter::empty());
    assert!(inc.model().service_cidrs.is_empty());
}
