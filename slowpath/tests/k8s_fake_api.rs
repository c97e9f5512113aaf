//! The Kubernetes source against a fake Kubernetes API server (`fake_api`, which speaks
//! the real protocol: lists, watches, 410 Gone, restarts). The scenarios are each bounded in
//! time (`WAIT`).

mod fake_api;

use fake_api::{FakeApi, Kind, kubeconfig};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use config::{Config, Dur, Kubernetes, SchedulerKind};
use slowpath::k8s::{self, K8sModel, SourceHandle};

/// Upper bound for any one expectation (reconnects wait for kube's backoff, ~1-3 s).
const WAIT: Duration = Duration::from_secs(20);

fn node_obj(zone: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "uid": "n-1",
            "labels": {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": zone}},
        "status": {"addresses": [
            {"type": "InternalIP", "address": "198.18.0.10"},
            {"type": "Hostname", "address": "node-a"}]}})
}

fn svc_obj(name: &str, vip: &str, spec: Value) -> Value {
    let mut v = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "ns", "name": name, "uid": format!("uid-{name}"),
            "creationTimestamp": "2024-01-01T00:00:00Z", "labels": {"app": name}},
        "spec": {"type": "ClusterIP", "clusterIP": vip, "clusterIPs": [vip],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "web"}],
            "selector": {"app": name}, "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster"},
        "status": {"loadBalancer": {}}});
    for (k, val) in spec.as_object().unwrap() {
        v["spec"][k] = val.clone();
    }
    v
}

fn ep(ip: &str, node: &str, ready: bool, serving: bool, terminating: bool) -> Value {
    json!({"addresses": [ip], "nodeName": node, "targetRef": {"kind": "Pod", "name": format!("pod-{ip}")},
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
}

fn up(ip: &str, node: &str) -> Value {
    ep(ip, node, true, true, false)
}

fn slice_obj(svc: &str, name: &str, endpoints: Vec<Value>) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "ns", "name": name, "labels": {
            "kubernetes.io/service-name": svc, "app": svc,
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints})
}

struct Run {
    fake: FakeApi,
    models: Receiver<K8sModel>,
    handle: Option<SourceHandle>,
    _dir: tempfile::TempDir,
}

fn start(fake: FakeApi, tweak: impl FnOnce(&mut Kubernetes)) -> Run {
    let (tx, models) = std::sync::mpsc::channel();
    start_with(fake, tweak, models, move |m| {
        let _ = tx.send(m);
    })
}

/// [`start`] with the source's callback given (`models` is where it sends them).
fn start_with(
    fake: FakeApi,
    tweak: impl FnOnce(&mut Kubernetes),
    models: Receiver<K8sModel>,
    on_model: impl FnMut(K8sModel) + Send + 'static,
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig(dir.path(), fake.addr);
    let mut k = Kubernetes {
        kubeconfig: Some(path),
        service_proxy_name: None,
        min_sync_period: Dur(Duration::from_millis(100)),
        sync_period: Dur(Duration::from_secs(30)),
        default_scheduler: SchedulerKind::Rr,
        external_ip_cidrs: vec![],
        service_cidrs: vec![],
    };
    tweak(&mut k);
    let mut cfg = Config {
        kubernetes: Some(k),
        ..Config::default()
    };
    cfg.node.name = Some("node-a".to_owned());
    let handle = k8s::spawn(&cfg, on_model).unwrap();
    Run {
        fake,
        models,
        handle: Some(handle),
        _dir: dir,
    }
}

impl Run {
    /// The first model that satisfies `pred`; every model before it must satisfy `always`.
    fn wait_with(
        &self,
        what: &str,
        pred: impl Fn(&K8sModel) -> bool,
        always: impl Fn(&K8sModel) -> bool,
    ) -> K8sModel {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.models.recv_timeout(left) {
                Ok(m) if pred(&m) => return m,
                Ok(m) => assert!(always(&m), "{what}: unexpected model {m:#?}"),
                Err(RecvTimeoutError::Timeout) => panic!("{what}: no such model within {WAIT:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("{what}: the source stopped"),
            }
        }
    }

    fn wait(&self, what: &str, pred: impl Fn(&K8sModel) -> bool) -> K8sModel {
        self.wait_with(what, pred, |_| true)
    }

    fn stats(&self) -> &k8s::SourceStats {
        self.handle.as_ref().unwrap().stats()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.stop();
        }
    }
}

fn backends(m: &K8sModel, spec: &str) -> Option<Vec<(String, bool)>> {
    m.specs.iter().find(|s| s.name == spec).map(|s| {
        s.backends
            .iter()
            .map(|b| (b.addr.to_string(), b.usable))
            .collect()
    })
}

fn usable(m: &K8sModel, spec: &str) -> Option<Vec<String>> {
    backends(m, spec).map(|b| b.into_iter().filter(|(_, u)| *u).map(|(a, _)| a).collect())
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn has(m: &K8sModel, spec: &str, want: &[&str]) -> bool {
    usable(m, spec) == Some(strs(want))
}

#[test]
fn a_service_and_its_slice_appear_in_the_model() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    let run = start(fake, |_| {});
    let first = run.wait("initial model", |_| true);
    assert!(first.specs.is_empty());
    let t0 = Instant::now();
    run.fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    run.fake
        .apply(slice_obj("web", "web-abc", vec![up("10.0.0.1", "node-b")]));
    let m = run.wait("web with one backend", |m| {
        has(m, "ns/web:http", &["10.0.0.1:8080"])
    });
    eprintln!("change → model in {:?}", t0.elapsed());
    let spec = &m.specs[0];
    assert_eq!(
        spec.frontends[0].vip,
        "198.18.100.1".parse::<IpAddr>().unwrap()
    );
    assert_eq!(spec.frontends[0].port, 80);
    let st = run.stats();
    assert!(st.synced.load(Ordering::Relaxed));
    assert!(st.syncs.load(Ordering::Relaxed) >= 2);
    assert!(st.last_sync_unix_ms.load(Ordering::Relaxed) > 0);
    assert_eq!(st.services.load(Ordering::Relaxed), 1);
    assert_eq!(st.endpoint_slices.load(Ordering::Relaxed), 1);
    assert_eq!(st.backends.load(Ordering::Relaxed), 1);
    // Watches were used, with kube-proxy's label selector.
    assert!(run.fake.count("WATCH Service") >= 1);
    let q = run.fake.queries();
    assert!(
        q.iter().any(|q| q.contains(
            "labelSelector=!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
        )),
        "{q:?}"
    );
    assert!(
        q.iter()
            .any(|q| q.contains("fieldSelector=metadata.name=node-a")),
        "{q:?}"
    );
}

#[test]
fn nothing_is_published_before_every_initial_list() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    fake.apply(slice_obj("web", "web-abc", vec![up("10.0.0.1", "node-b")]));
    fake.set_down(true);
    let run = start(fake, |_| {});
    assert!(
        run.models.recv_timeout(Duration::from_millis(600)).is_err(),
        "published before listing"
    );
    assert!(!run.stats().synced.load(Ordering::Relaxed));
    run.fake.set_down(false);
    let m = run.wait("first model", |_| true);
    assert!(
        has(&m, "ns/web:http", &["10.0.0.1:8080"]),
        "first model is complete: {m:#?}"
    );
}

#[test]
fn scaling_up_and_down() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    fake.apply(slice_obj("web", "web-abc", vec![up("10.0.0.1", "node-b")]));
    let run = start(fake, |_| {});
    run.wait("one", |m| has(m, "ns/web:http", &["10.0.0.1:8080"]));
    run.fake.apply(slice_obj(
        "web",
        "web-abc",
        vec![up("10.0.0.1", "node-b"), up("10.0.0.2", "node-c")],
    ));
    run.wait("two", |m| {
        has(m, "ns/web:http", &["10.0.0.1:8080", "10.0.0.2:8080"])
    });
    run.fake
        .apply(slice_obj("web", "web-def", vec![up("10.0.0.3", "node-c")]));
    run.wait("three over two slices", |m| {
        has(
            m,
            "ns/web:http",
            &["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"],
        )
    });
    run.fake.delete(Kind::EndpointSlice, "ns", "web-abc");
    run.wait("slice deleted", |m| {
        has(m, "ns/web:http", &["10.0.0.3:8080"])
    });
    run.fake.delete(Kind::Service, "ns", "web");
    run.wait("service deleted", |m| m.specs.is_empty());
}

#[test]
fn terminating_endpoints_are_the_fallback() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    fake.apply(slice_obj("web", "web-abc", vec![up("10.0.0.1", "node-b")]));
    let run = start(fake, |_| {});
    run.wait("ready", |m| has(m, "ns/web:http", &["10.0.0.1:8080"]));
    // Rolling update: the old pod terminates (still serving), the new one is not ready yet.
    run.fake.apply(slice_obj(
        "web",
        "web-abc",
        vec![
            ep("10.0.0.1", "node-b", false, true, true),
            ep("10.0.0.2", "node-b", false, false, false),
        ],
    ));
    run.wait("terminating fallback", |m| {
        has(m, "ns/web:http", &["10.0.0.1:8080"])
    });
    // The new pod is ready: the terminating one only drains.
    run.fake.apply(slice_obj(
        "web",
        "web-abc",
        vec![
            ep("10.0.0.1", "node-b", false, true, true),
            up("10.0.0.2", "node-b"),
        ],
    ));
    let m = run.wait("new pod", |m| has(m, "ns/web:http", &["10.0.0.2:8080"]));
    assert_eq!(
        backends(&m, "ns/web:http").unwrap(),
        vec![
            ("10.0.0.1:8080".to_owned(), false),
            ("10.0.0.2:8080".to_owned(), true)
        ]
    );
}

#[test]
fn traffic_policies_local() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj(
        "web",
        "198.18.100.1",
        json!({"type": "LoadBalancer", "internalTrafficPolicy": "Local",
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 32001,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]}),
    ));
    fake.apply(slice_obj(
        "web",
        "web-abc",
        vec![up("10.0.0.1", "node-a"), up("10.0.0.2", "node-b")],
    ));
    let run = start(fake, |_| {});
    let m = run.wait("local only", |m| {
        has(m, "ns/web:http", &["10.0.0.1:8080"]) && has(m, "ns/web:http/ext", &["10.0.0.1:8080"])
    });
    // The NodePort listens on the Node's InternalIP ([node] addresses is empty).
    let ext = m
        .specs
        .iter()
        .find(|s| s.name == "ns/web:http/ext")
        .unwrap();
    assert_eq!(
        ext.frontends[0].vip,
        "198.18.0.10".parse::<IpAddr>().unwrap()
    );
    assert_eq!(ext.frontends[0].port, 30080);
    assert_eq!(m.health_check_node_ports[0].port, 32001);
    assert_eq!(m.health_check_node_ports[0].local_endpoints, 1);
    // The local pod goes away: no local endpoints, traffic dropped, health check 0.
    run.fake
        .apply(slice_obj("web", "web-abc", vec![up("10.0.0.2", "node-b")]));
    let m = run.wait("no local endpoint", |m| has(m, "ns/web:http/ext", &[]));
    assert!(has(&m, "ns/web:http", &[]));
    assert_eq!(m.health_check_node_ports[0].local_endpoints, 0);
}

fn hinted(ip: &str, node: &str, zone: &str) -> Value {
    let mut e = up(ip, node);
    e["zone"] = json!(zone);
    e["hints"] = json!({"forZones": [{"name": zone}]});
    e
}

#[test]
fn topology_hints_follow_the_node_zone() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj(
        "web",
        "198.18.100.1",
        json!({"trafficDistribution": "PreferSameZone"}),
    ));
    fake.apply(slice_obj(
        "web",
        "web-abc",
        vec![
            hinted("10.0.0.1", "node-b", "zone-a"),
            hinted("10.0.0.2", "node-c", "zone-b"),
        ],
    ));
    let run = start(fake, |_| {});
    run.wait("zone-a", |m| has(m, "ns/web:http", &["10.0.0.1:8080"]));
    // The node's zone label changes (the Node watch): the other zone's endpoint is chosen.
    run.fake.apply(node_obj("zone-b"));
    run.wait("zone-b", |m| has(m, "ns/web:http", &["10.0.0.2:8080"]));
    // A zone without endpoints: cluster-wide.
    run.fake.apply(node_obj("zone-c"));
    run.wait("zone-c", |m| {
        has(m, "ns/web:http", &["10.0.0.1:8080", "10.0.0.2:8080"])
    });
}

/// Through list/watch, as kube-proxy (issue #19): zone hints are used though the Service does
/// not ask for topology; `externalTrafficPolicy: Local` takes this node's endpoint whatever
/// its hint; the IPv6 externalIP and ingress IP of an IPv4-only Service are no frontends.
#[test]
fn hints_without_distribution_local_policy_and_families_as_kube_proxy() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    let mut svc = svc_obj(
        "web",
        "198.18.100.1",
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "externalIPs": ["198.18.200.7", "2001:2:200::7"],
            "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP",
                "targetPort": "web"}]}),
    );
    svc["status"] = json!({"loadBalancer": {"ingress": [
        {"ip": "198.18.210.1"}, {"ip": "2001:2:210::1"}]}});
    fake.apply(svc);
    fake.apply(slice_obj(
        "web",
        "web-abc",
        vec![
            hinted("10.0.0.1", "node-a", "zone-b"),
            hinted("10.0.0.2", "node-c", "zone-a"),
        ],
    ));
    let run = start(fake, |k| {
        k.external_ip_cidrs = vec![
            "198.18.200.0/24".parse().unwrap(),
            "2001:2:200::/64".parse().unwrap(),
        ];
    });
    let m = run.wait("ClusterIP by zone hint, external by locality", |m| {
        has(m, "ns/web:http", &["10.0.0.2:8080"]) && has(m, "ns/web:http/ext", &["10.0.0.1:8080"])
    });
    let names: Vec<&str> = m.specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["ns/web:http", "ns/web:http/ext"]);
    let ext = m
        .specs
        .iter()
        .find(|s| s.name == "ns/web:http/ext")
        .unwrap();
    let vips: Vec<String> = ext.frontends.iter().map(|f| f.vip.to_string()).collect();
    assert_eq!(vips, ["198.18.0.10", "198.18.200.7", "198.18.210.1"]);
}

#[test]
fn api_server_restart_keeps_the_last_model_and_catches_up() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    fake.apply(slice_obj("web", "web-abc", vec![up("10.0.0.1", "node-b")]));
    let run = start(fake, |_| {});
    run.wait("before", |m| has(m, "ns/web:http", &["10.0.0.1:8080"]));
    run.fake.set_down(true);
    // Changes land while the server is unreachable (it restarts from its storage).
    run.fake.apply(slice_obj(
        "web",
        "web-abc",
        vec![up("10.0.0.1", "node-b"), up("10.0.0.2", "node-b")],
    ));
    std::thread::sleep(Duration::from_millis(500));
    run.fake.set_down(false);
    let intact = |m: &K8sModel| usable(m, "ns/web:http").is_some_and(|b| !b.is_empty());
    run.wait_with(
        "caught up",
        |m| has(m, "ns/web:http", &["10.0.0.1:8080", "10.0.0.2:8080"]),
        intact,
    );
    assert!(run.stats().watch_errors.load(Ordering::Relaxed) > 0);
    // And keeps following changes.
    run.fake
        .apply(slice_obj("web", "web-abc", vec![up("10.0.0.3", "node-b")]));
    run.wait_with(
        "after",
        |m| has(m, "ns/web:http", &["10.0.0.3:8080"]),
        intact,
    );
}

#[test]
fn gone_410_makes_the_watchers_relist() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    fake.apply(slice_obj("web", "web-abc", vec![up("10.0.0.1", "node-b")]));
    let run = start(fake, |_| {});
    run.wait("before", |m| has(m, "ns/web:http", &["10.0.0.1:8080"]));
    let lists_before = run.fake.count("LIST EndpointSlice");
    assert_eq!(lists_before, 1);
    run.fake.wait_watching();
    run.fake.expire();
    run.fake
        .apply(slice_obj("web", "web-abc", vec![up("10.0.0.2", "node-b")]));
    let intact = |m: &K8sModel| usable(m, "ns/web:http").is_some_and(|b| !b.is_empty());
    run.wait_with(
        "after relist",
        |m| has(m, "ns/web:http", &["10.0.0.2:8080"]),
        intact,
    );
    assert!(
        run.fake.count("LIST EndpointSlice") > lists_before,
        "{:?}",
        run.fake.requests()
    );
    // Every watcher got the 410 and relists (after kube's backoff).
    let deadline = Instant::now() + WAIT;
    while run.fake.count("LIST Service") < 2 || run.fake.count("LIST Node") < 2 {
        assert!(
            Instant::now() < deadline,
            "no relist: {:?}",
            run.fake.requests()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A change after the relist still arrives (the watches resumed).
    run.fake.apply(svc_obj("web", "198.18.100.9", json!({})));
    run.wait_with(
        "watching again",
        |m| {
            m.specs
                .first()
                .is_some_and(|s| s.frontends[0].vip.to_string() == "198.18.100.9")
        },
        intact,
    );
}

#[test]
fn a_bad_service_is_ignored_with_a_problem() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj(
        "bad",
        "198.18.100.2",
        json!({"ports": [{"name": "http", "port": 0, "protocol": "TCP"}]}),
    ));
    fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    fake.apply(slice_obj("web", "web-abc", vec![up("10.0.0.1", "node-b")]));
    let run = start(fake, |_| {});
    let m = run.wait("good one", |m| has(m, "ns/web:http", &["10.0.0.1:8080"]));
    assert_eq!(m.specs.len(), 1);
    assert_eq!(m.problems.len(), 1, "{:?}", m.problems);
    assert_eq!(m.problems[0].object, "Service ns/bad");
    // Fixing it brings it in.
    run.fake.apply(svc_obj("bad", "198.18.100.2", json!({})));
    let m = run.wait("fixed", |m| m.specs.len() == 2);
    assert!(m.problems.is_empty());
}

#[test]
fn service_proxy_name_selects_services_by_label() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    let labelled = |name: &str, vip: &str, proxy: Option<&str>| {
        let mut s = svc_obj(name, vip, json!({}));
        if let Some(p) = proxy {
            s["metadata"]["labels"]["service.kubernetes.io/service-proxy-name"] = json!(p);
        }
        s
    };
    fake.apply(labelled("mine", "198.18.100.1", Some("xvs")));
    fake.apply(labelled("theirs", "198.18.100.2", Some("other-proxy")));
    fake.apply(labelled("plain", "198.18.100.3", None));
    let run = start(fake, |k| k.service_proxy_name = Some("xvs".to_owned()));
    let m = run.wait("first", |_| true);
    let names: Vec<&str> = m.specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, vec!["ns/mine:http"]);
    assert_eq!(
        run.stats().services.load(Ordering::Relaxed),
        1,
        "filtered by the watch itself"
    );
    assert!(run.fake.queries().iter().any(|q| q.contains(
        "labelSelector=service.kubernetes.io/service-proxy-name=xvs,!service.kubernetes.io/headless"
    )));
}

#[test]
fn changes_are_batched_by_min_sync_period_and_resynced_every_sync_period() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    let run = start(fake, |k| {
        k.min_sync_period = Dur(Duration::from_secs(1));
        k.sync_period = Dur(Duration::from_secs(2));
    });
    run.wait("first", |_| true);
    // Ten changes in a burst, well inside one min_sync_period.
    for n in 1..=10 {
        let eps = (1..=n)
            .map(|i| up(&format!("10.0.0.{i}"), "node-b"))
            .collect();
        run.fake.apply(slice_obj("web", "web-abc", eps));
    }
    run.wait("all ten", |m| {
        usable(m, "ns/web:http").is_some_and(|b| b.len() == 10)
    });
    // The first model, then at most one partial one and the complete one: the burst was
    // batched rather than published change by change.
    let syncs = run.stats().syncs.load(Ordering::Relaxed);
    assert!(syncs <= 3, "{syncs} models for one burst");
    // No change: a full resync still publishes the same model.
    let m = run.wait("resync", |_| true);
    assert!(usable(&m, "ns/web:http").is_some_and(|b| b.len() == 10));
}

/// A Service the API server would refuse (two ports named `http`), created before a canary
/// Service: the canary is in the model, the poisoned one is a `service_refused` problem
/// (with the object's name and the reason), and fixing it brings it in; deleting a
/// poisoned one clears its problem.
#[test]
fn a_poisoned_service_blocks_only_itself() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    let dup = json!({"ports": [
        {"name": "http", "port": 80, "protocol": "TCP"},
        {"name": "http", "port": 81, "protocol": "TCP"}]});
    fake.apply(svc_obj("poison", "198.18.100.2", dup.clone()));
    let run = start(fake, |_| {});
    run.wait("the poisoned one reported", |m| {
        m.specs.is_empty() && m.problems.iter().any(|p| p.object == "Service ns/poison")
    });
    // Created after it: programmed.
    run.fake.apply(svc_obj("canary", "198.18.100.3", json!({})));
    run.fake.apply(slice_obj(
        "canary",
        "canary-1",
        vec![up("10.0.0.1", "node-b")],
    ));
    let m = run.wait("canary", |m| has(m, "ns/canary:http", &["10.0.0.1:8080"]));
    assert_eq!(m.specs.len(), 1);
    assert_eq!(m.problems.len(), 1, "{:?}", m.problems);
    let p = &m.problems[0];
    assert_eq!(p.kind, k8s::ProblemKind::ServiceRefused);
    assert!(
        p.reason
            .contains("ports[1] and ports[0] are both named \"http\""),
        "{p}"
    );
    assert_eq!(run.stats().problems.load(Ordering::Relaxed), 1);
    // Fixed: programmed, no problem.
    run.fake.apply(svc_obj("poison", "198.18.100.2", json!({})));
    let m = run.wait("fixed", |m| m.specs.len() == 2);
    assert!(m.problems.is_empty(), "{:?}", m.problems);
    // Poisoned anew, then deleted: its problem goes with it.
    run.fake.apply(svc_obj("poison", "198.18.100.2", dup));
    run.wait("poisoned again", |m| !m.problems.is_empty());
    run.fake.delete(Kind::Service, "ns", "poison");
    let m = run.wait("deleted", |m| m.problems.is_empty());
    assert_eq!(m.specs.len(), 1);
}

/// `/healthz`'s view of the source: a change it received stays pending until its model is
/// handed over. Here the consumer of the models stalls (the callback blocks) on the model
/// that carries the change: the change still counts as pending, and once its wait reaches
/// the health timeout the view fails; when the consumer takes it, the view passes again.
/// The health rules are evaluated at given instants (no timing in the test).
#[test]
fn a_change_not_handed_over_keeps_healthz_failing_once_late() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::SystemTime;

    use slowpath::admin::{HealthView, evaluate};

    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    let (tx, models) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let stall = Arc::new(AtomicBool::new(false));
    let gate = Arc::clone(&stall);
    let run = start_with(
        fake,
        |_| {},
        models,
        move |m| {
            // Only the model with the change stalls.
            let carries = !m.specs.is_empty();
            let _ = tx.send(m);
            if carries && gate.load(Ordering::Relaxed) {
                let _ = released.recv_timeout(WAIT);
            }
        },
    );
    run.wait("initial model", |_| true);
    let handed_over = || {
        let deadline = Instant::now() + WAIT;
        while run.stats().pending_since().is_some() {
            assert!(Instant::now() < deadline, "still pending");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // Once the callback has returned, nothing is pending.
    handed_over();
    stall.store(true, Ordering::Relaxed);
    let before = SystemTime::now();
    run.fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    run.wait("the model with the change", |m| m.specs.len() == 1);
    // The callback is blocked on that model: the change is not handed over.
    let since = run.stats().pending_since().expect("the change is pending");
    assert!(
        since + Duration::from_secs(1) >= before,
        "{since:?} {before:?}"
    );
    let timeout = Duration::from_secs(60);
    let view = |now: SystemTime| {
        HealthView {
            last_updated: Some(now),
            oldest_pending: None,
            timeout,
            fastpath_running: true,
            node_eligible: true,
            not_ready: None,
        }
        .with_source(run.stats())
    };
    let late = since + timeout;
    assert_eq!(
        evaluate(&view(late), late - Duration::from_secs(1), true),
        Ok(())
    );
    let e = evaluate(&view(late), late, true).unwrap_err();
    assert!(e.contains("a change has waited"), "{e}");
    // The consumer takes it: nothing pending, healthy at the same instant.
    stall.store(false, Ordering::Relaxed);
    release.send(()).unwrap();
    handed_over();
    assert_eq!(evaluate(&view(late), late, true), Ok(()));
}

fn cidr_obj(name: &str, cidrs: &[&str]) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": name}, "spec": {"cidrs": cidrs}})
}

fn cidrs(m: &K8sModel) -> Vec<String> {
    m.service_cidrs.iter().map(|c| c.to_string()).collect()
}

#[test]
fn service_cidr_objects_are_watched_and_a_bad_one_refused_alone() {
    let fake = FakeApi::start();
    fake.apply(node_obj("zone-a"));
    fake.apply(cidr_obj("kubernetes", &["198.18.96.0/20"]));
    let run = start(fake, |k| {
        k.service_cidrs = vec!["2001:2:0:96::/112".parse().unwrap()];
    });
    run.wait("the listed CIDR and the config's", |m| {
        cidrs(m) == ["198.18.96.0/20", "2001:2:0:96::/112"]
    });
    // One holding the node's address (198.18.0.10, from its Node object): refused with a
    // problem, the others kept.
    run.fake.apply(cidr_obj("wide", &["198.18.0.0/16"]));
    let m = run.wait("the wide one refused", |m| !m.problems.is_empty());
    assert_eq!(cidrs(&m), ["198.18.96.0/20", "2001:2:0:96::/112"]);
    assert_eq!(m.problems[0].object, "ServiceCIDR wide");
    assert_eq!(m.problems[0].kind, k8s::ProblemKind::ServiceCidr);
    run.fake.apply(cidr_obj("extra", &["198.18.112.0/24"]));
    run.fake.delete(Kind::ServiceCidr, "", "kubernetes");
    run.fake.delete(Kind::ServiceCidr, "", "wide");
    run.wait("extra in, kubernetes and wide out", |m| {
        cidrs(m) == ["198.18.112.0/24", "2001:2:0:96::/112"] && m.problems.is_empty()
    });
}

#[test]
fn an_api_server_without_service_cidrs_is_served_with_the_configs() {
    let fake = FakeApi::start();
    fake.without_service_cidrs();
    fake.apply(node_obj("zone-a"));
    fake.apply(svc_obj("web", "198.18.100.1", json!({})));
    let run = start(fake, |k| {
        k.service_cidrs = vec!["198.18.96.0/20".parse().unwrap()];
    });
    let m = run.wait("a model, not held back by the missing collection", |m| {
        !m.specs.is_empty()
    });
    assert_eq!(cidrs(&m), ["198.18.96.0/20"]);
    // Asked once: a 404 is not retried (no backoff loop against a collection that is not
    // there).
    std::thread::sleep(Duration::from_secs(3));
    let asked = run
        .fake
        .requests()
        .iter()
        .filter(|r| r.contains("servicecidrs"))
        .count();
    assert_eq!(asked, 1, "{:?}", run.fake.requests());
}
