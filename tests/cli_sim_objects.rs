//! Black-box tests of `xvs sim --objects` on a Kubernetes object dump
//! (tests/assets/k8s-objects.yaml): the endpoints kube-proxy would pick on each node
//! (topology hints, externalTrafficPolicy: Local), the family rule, the pipeline's
//! admission rules (source ranges, freeze, rate limit), and kube-proxy's rejects and drops
//! (no endpoints, a ClusterIP's unserved ports, Service CIDRs).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn dump() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/assets/k8s-objects.yaml")
}

/// Runs `xvs sim --objects FILE --flows -` with `extra` arguments and `flows` on stdin.
fn sim(objects: &Path, flows: &str, extra: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args([
            "sim",
            "--objects",
            objects.to_str().unwrap(),
            "--flows",
            "-",
        ])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xvs");
    let mut stdin = child.stdin.take().unwrap();
    let input = flows.to_owned();
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The target of each flow line (`none (...)` included), in order.
fn targets(o: &Output) -> Vec<String> {
    assert!(o.status.success(), "xvs sim failed: {}", stderr(o));
    String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .take_while(|l| !l.is_empty())
        .map(|l| l.split(" => ").nth(1).expect("a flow line").to_owned())
        .collect()
}

/// `n` TCP flows from distinct client ports to `dst`.
fn flows(src: &str, dst: &str, port: u16, n: u16) -> String {
    (0..n)
        .map(|i| format!("tcp,{src},{},{dst},{port}\n", 40000 + i))
        .collect()
}

fn set(v: &[String]) -> BTreeSet<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn picks_what_kube_proxy_picks_on_each_node() {
    let input = [
        flows("198.18.50.7", "198.18.100.1", 80, 6), // zoned ClusterIP
        flows("198.18.50.7", "198.18.210.1", 80, 3), // edge LB VIP (ETP Local)
        flows("198.18.50.7", "198.18.100.2", 80, 3), // edge ClusterIP (iTP Cluster)
    ]
    .concat();
    let o = sim(&dump(), &input, &["--node", "edge-1"]);
    let t = targets(&o);
    // Every endpoint is hinted: the node's zone (zone-a) only, though the Service does not
    // ask for topology.
    assert_eq!(
        set(&t[0..6]),
        BTreeSet::from(["198.19.1.1:8080", "198.19.1.2:8080"])
    );
    // ETP Local: this node's endpoint, its zone-b hint ignored.
    assert_eq!(set(&t[6..9]), BTreeSet::from(["198.19.1.10:8080"]));
    // The same Service's ClusterIP uses the cluster endpoints: the one hinted for zone-a.
    assert_eq!(set(&t[9..12]), BTreeSet::from(["198.19.2.10:8080"]));
    assert!(
        stderr(&o).contains("1 v1/ConfigMap object(s) skipped"),
        "{}",
        stderr(&o)
    );

    // The other node, in zone-b: the mirror image.
    let input = [
        flows("198.18.50.7", "198.18.100.1", 80, 4),
        flows("198.18.50.7", "198.18.210.1", 80, 2),
        flows("198.18.50.7", "198.18.100.2", 80, 2),
        flows("198.18.50.7", "198.18.0.11", 30080, 2), // edge-2's NodePort, from its Node
    ]
    .concat();
    let t = targets(&sim(&dump(), &input, &["--node", "edge-2"]));
    assert_eq!(set(&t[0..4]), BTreeSet::from(["198.19.2.1:8080"]));
    assert_eq!(set(&t[4..6]), BTreeSet::from(["198.19.2.10:8080"]));
    assert_eq!(set(&t[6..8]), BTreeSet::from(["198.19.1.10:8080"]));
    assert_eq!(set(&t[8..10]), BTreeSet::from(["198.19.2.10:8080"]));
}

#[test]
fn json_dump_gives_the_same_answers() {
    let yaml = std::fs::read_to_string(dump()).unwrap();
    let v: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("objects.json");
    std::fs::write(&json, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let input = [
        flows("198.18.50.7", "198.18.100.1", 80, 4),
        flows("198.18.50.7", "198.18.210.1", 80, 2),
    ]
    .concat();
    let a = sim(&dump(), &input, &["--node", "edge-1"]);
    let b = sim(&json, &input, &["--node", "edge-1"]);
    assert_eq!(targets(&a), targets(&b));
    assert_eq!(
        set(&targets(&b)[4..6]),
        BTreeSet::from(["198.19.1.10:8080"])
    );
}

#[test]
fn admission_family_rule_and_freeze() {
    let input = [
        // Outside loadBalancerSourceRanges, to the LB VIP: refused. The NodePort and the
        // ClusterIP are not subject to the ranges (as kube-proxy).
        "tcp,198.18.60.1,40000,198.18.210.1,80\n",
        "tcp,198.18.60.1,40001,198.18.0.10,30080\n",
        // The IPv6 ingress IP of an IPv4-only Service is no frontend: left to the host.
        "tcp,2001:2::5,40000,2001:2:210::1,80\n",
        // 1 new connection a second, burst 1; lines are 1 ms apart.
        "udp,198.18.50.7,40000,198.18.100.3,53\n",
        "udp,198.18.50.7,40001,198.18.100.3,53\n",
        "tcp,198.18.50.7,40000,198.18.100.1,80\n",
    ]
    .concat();
    let t = targets(&sim(&dump(), &input, &["--node", "edge-1"]));
    assert_eq!(t[0], "drop (source_range)");
    assert_eq!(t[1], "198.19.1.10:8080");
    assert_eq!(t[2], "pass");
    assert_eq!(t[3], "198.19.3.1:5353");
    assert_eq!(t[4], "drop (rate_limited)");
    assert!(t[5].starts_with("198.19.1."), "{}", t[5]);

    let t = targets(&sim(
        &dump(),
        &input,
        &["--node", "edge-1", "--frozen", "shop/zoned"],
    ));
    assert_eq!(t[5], "drop (frozen)");
    assert_eq!(t[1], "198.19.1.10:8080", "other services are not frozen");
}

#[test]
fn bad_input_is_named() {
    let o = sim(&dump(), "", &["--node", "edge-1", "--frozen", "shop/nope"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--frozen shop/nope: no service named"),
        "{}",
        stderr(&o)
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec:\n  ports: 7\n",
    )
    .unwrap();
    let o = sim(&bad, "", &[]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("bad.yaml: document 1: Service ns/web:"), "{e}");

    let o = sim(&dump(), "", &["--node", "edge-9"]);
    assert!(o.status.success());
    assert!(stderr(&o).contains("no Node \"edge-9\""), "{}", stderr(&o));

    // Neither --config nor --objects.
    let o = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args(["sim", "--flows", "-"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--config"), "{}", stderr(&o));
}

/// Issue #27: one address both an externalIP and a load-balancer IP of a Service with
/// loadBalancerSourceRanges is served with the ranges (a client outside them is refused as
/// `source_range`), and a Service whose weights the wrr builder refuses is left out with a
/// note while the others are simulated.
#[test]
fn source_ranges_apply_to_a_shared_address_and_a_poisoned_service_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects.json");
    let svc = |name: &str, vip: &str, extra: serde_json::Value| {
        let mut v = serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"type": "ClusterIP", "clusterIP": vip, "clusterIPs": [vip],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}});
        for (k, x) in extra.as_object().unwrap() {
            match v[k.as_str()].as_object_mut() {
                Some(o) => o.extend(x.as_object().unwrap().clone()),
                None => v[k.as_str()] = x.clone(),
            }
        }
        v
    };
    let slice = |svc: &str, ips: &[&str]| {
        serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "ns", "name": format!("{svc}-1"),
                "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": ips.iter().map(|ip| serde_json::json!({"addresses": [ip]}))
                .collect::<Vec<_>>()})
    };
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1"},
         "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.10"}]}},
        svc("shared", "198.18.100.1", serde_json::json!({
            "spec": {"type": "LoadBalancer", "externalIPs": ["198.18.200.7"],
                     "loadBalancerSourceRanges": ["198.18.50.0/24"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.200.7"}]}}})),
        slice("shared", &["198.19.1.1"]),
        svc("poison", "198.18.100.2", serde_json::json!({
            "metadata": {"annotations": {"xvs.io/scheduler": "wrr",
                "xvs.io/weights": "198.19.2.1=1048576,198.19.2.2=1"}}})),
        slice("poison", &["198.19.2.1", "198.19.2.2"]),
    ]});
    std::fs::write(&objects, list.to_string()).unwrap();
    let config = dir.path().join("xvs.toml");
    std::fs::write(
        &config,
        "[dataplane]\nmode = \"nat\"\n[kubernetes]\nexternal_ip_cidrs = [\"198.18.200.0/24\"]\n",
    )
    .unwrap();
    let input = [
        "tcp,198.18.60.1,40000,198.18.200.7,80\n", // outside the ranges
        "tcp,198.18.50.7,40001,198.18.200.7,80\n", // inside
        "tcp,198.18.60.1,40002,198.18.100.1,80\n", // the ClusterIP: no ranges
        "tcp,198.18.60.1,40003,198.18.100.2,80\n", // the poisoned one
    ]
    .concat();
    let o = sim(
        &objects,
        &input,
        &["--node", "edge-1", "--config", config.to_str().unwrap()],
    );
    assert_eq!(
        targets(&o),
        [
            "drop (source_range)",
            "198.19.1.1:8080",
            "198.19.1.1:8080",
            // Left out of the snapshot: not a ClusterIP xvs knows.
            "pass"
        ]
    );
    let err = stderr(&o);
    assert!(
        err.contains("service ns/poison:http: refused: service ns/poison:http: wrr sequence"),
        "{err}"
    );
    assert!(!err.contains("already used"), "{err}");
}

/// kube-proxy's answers to flows it cannot serve, through `xvs sim --objects`: a Service
/// without endpoints rejects on every address (ClusterIP, NodePort, load-balancer IP),
/// `externalTrafficPolicy: Local` without local endpoints drops on the external ones only, a
/// ClusterIP rejects the ports and protocols it does not serve (a load-balancer IP's other
/// ports are the host's), and an unallocated address of a ServiceCIDR (from the dump, and
/// from `[kubernetes] service_cidrs`) is dropped.
#[test]
fn rejects_and_drops_as_kube_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects.json");
    let lb = |name: &str, vip: &str, ingress: &str, node_port: u16, policy: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"type": "LoadBalancer", "clusterIP": vip, "clusterIPs": [vip],
                "externalTrafficPolicy": policy,
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": node_port}]},
            "status": {"loadBalancer": {"ingress": [{"ip": ingress}]}}})
    };
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1"},
         "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.10"}]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
         "metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["198.18.96.0/20"]}},
        lb("empty", "198.18.96.1", "198.18.210.1", 30081, "Cluster"),
        lb("local", "198.18.96.2", "198.18.210.2", 30082, "Local"),
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"namespace": "ns", "name": "local-1",
             "labels": {"kubernetes.io/service-name": "local"}},
         "addressType": "IPv4",
         "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
         "endpoints": [{"addresses": ["198.19.1.1"], "nodeName": "edge-2"}]},
    ]});
    std::fs::write(&objects, list.to_string()).unwrap();
    let config = dir.path().join("xvs.toml");
    std::fs::write(
        &config,
        "[kubernetes]\nservice_cidrs = [\"2001:2:0:96::/112\"]\n",
    )
    .unwrap();
    let input = [
        "tcp,198.18.60.1,40000,198.18.96.1,80\n", // no endpoints: ClusterIP
        "tcp,198.18.60.1,40001,198.18.0.10,30081\n", // NodePort
        "udp,198.18.60.1,40002,198.18.210.1,80\n", // LB IP, another protocol: the host's
        "tcp,198.18.60.1,40003,198.18.210.1,80\n", // LB IP
        "tcp,198.18.60.1,40004,198.18.210.2,80\n", // eTP Local, endpoint elsewhere: LB IP
        "tcp,198.18.60.1,40005,198.18.0.10,30082\n", // NodePort
        "tcp,198.18.60.1,40006,198.18.96.2,80\n", // its ClusterIP: Cluster
        "tcp,198.18.60.1,40007,198.18.96.2,443\n", // an unserved port of a ClusterIP
        "udp,198.18.60.1,40008,198.18.96.2,80\n", // an unserved protocol
        "tcp,198.18.60.1,40009,198.18.210.2,443\n", // a LB IP's other port: the host's
        "tcp,198.18.60.1,40010,198.18.96.77,80\n", // unallocated, the dump's CIDR
        "udp,2001:2::5,40011,2001:2:0:96::9,53\n", // unallocated, the config's CIDR
        "tcp,198.18.60.1,40012,198.18.112.1,80\n", // outside the CIDRs: the host's
        "tcp,127.0.0.1,40013,198.18.96.1,80\n",   // martian: never answered
    ]
    .concat();
    let o = sim(
        &objects,
        &input,
        &["--node", "edge-1", "--config", config.to_str().unwrap()],
    );
    assert_eq!(
        targets(&o),
        [
            "reject (no_endpoints)",
            "reject (no_endpoints)",
            "pass",
            "reject (no_endpoints)",
            "drop (no_backend)",
            "drop (no_backend)",
            "198.19.1.1:8080",
            "reject (unserved_port)",
            "reject (unserved_port)",
            "pass",
            "drop (service_cidr)",
            "drop (service_cidr)",
            "pass",
            "drop (martian_source)",
        ]
    );
}

/// A Service another proxy owns (kube-proxy's service-proxy-name label) is skipped, as the
/// daemon skips it, and the dry run says so instead of printing nothing for its VIP; with
/// the config naming that proxy, it is simulated and the unlabelled one is the skipped one.
#[test]
fn services_of_another_proxy_are_named_when_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects.json");
    let svc = |name: &str, vip: &str, label: Option<&str>| {
        let mut meta = serde_json::json!({"namespace": "ns", "name": name});
        if let Some(l) = label {
            meta["labels"] = serde_json::json!({"service.kubernetes.io/service-proxy-name": l});
        }
        serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"type": "ClusterIP", "clusterIP": vip, "clusterIPs": [vip],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
    };
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        svc("mine", "198.18.100.1", None),
        svc("theirs", "198.18.100.2", Some("xvs")),
        svc("theirs2", "198.18.100.3", Some("xvs")),
    ]});
    std::fs::write(&objects, list.to_string()).unwrap();
    let o = sim(&objects, "", &["--node", "edge-1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "2 Service(s) labelled service.kubernetes.io/service-proxy-name=xvs skipped (another proxy's; set [kubernetes] service_proxy_name"
        ),
        "{}",
        stderr(&o)
    );
    let config = dir.path().join("xvs.toml");
    std::fs::write(&config, "[kubernetes]\nservice_proxy_name = \"xvs\"\n").unwrap();
    let o = sim(
        &objects,
        "",
        &["--node", "edge-1", "--config", config.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains(
            "1 Service(s) without the label service.kubernetes.io/service-proxy-name=xvs skipped"
        ),
        "{e}"
    );
    assert!(!e.contains("labelled"), "{e}");
}
