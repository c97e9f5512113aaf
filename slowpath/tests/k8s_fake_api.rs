//! The Kubernetes source against a fake Kubernetes API server. The server: hand-written HTTP/1.1 on a
//! tokio `TcpListener` (127.0.0.1, ephemeral port), speaking the real protocol for the three
//! collections the source watches:
//!
//! - `GET /api/v1/services`, `/apis/discovery.k8s.io/v1/endpointslices`, `/api/v1/nodes`
//!   with `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated) and
//!   `fieldSelector` (`metadata.name=X`, `metadata.namespace=X`).
//! - Lists: `{"kind":"ServiceList","metadata":{"resourceVersion":"N"},"items":[...]}`.
//! - `?watch=true|1&resourceVersion=N`: a chunked stream of newline-delimited
//!   `{"type":"ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR","object":{...}}` events, the
//!   backlog after N first, then live ones. A watch from a compacted resourceVersion, or
//!   [`FakeApi::expire`], gets an `ERROR` event carrying a `Status` with code 410 (Gone), as
//!   the real API server sends, and the stream ends.
//! - [`FakeApi::set_down`]: drops every open connection and refuses new ones (closes them
//!   unanswered) until brought back: an API server restart.
//!
//! Objects are stored as JSON; every write bumps one global resourceVersion.
//!
//! The scenarios follow the server, each bounded in time (`WAIT`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
}

impl Kind {
    fn of(v: &Value) -> Kind {
        match v["kind"].as_str() {
            Some("Service") => Kind::Service,
            Some("EndpointSlice") => Kind::EndpointSlice,
            Some("Node") => Kind::Node,
            k => panic!("fake api: unsupported kind {k:?}"),
        }
    }
    fn from_path(path: &str) -> Option<Kind> {
        match path {
            "/api/v1/services" => Some(Kind::Service),
            "/apis/discovery.k8s.io/v1/endpointslices" => Some(Kind::EndpointSlice),
            "/api/v1/nodes" => Some(Kind::Node),
            _ => None,
        }
    }
    fn list_kind(self) -> (&'static str, &'static str) {
        match self {
            Kind::Service => ("ServiceList", "v1"),
            Kind::EndpointSlice => ("EndpointSliceList", "discovery.k8s.io/v1"),
            Kind::Node => ("NodeList", "v1"),
        }
    }
}

type Key = (Kind, String, String);

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// (resourceVersion, kind, event type, object)
    log: Vec<(u64, Kind, &'static str, Value)>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    /// Bumped to end every open connection (restart) or every watch (expire).
    generation: u64,
    gone_generation: u64,
    down: bool,
    /// "LIST Service", "WATCH Service" and the like, one per request.
    requests: Vec<String>,
    queries: Vec<String>,
}

/// The fake API server; it runs until dropped.
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    _thread: std::thread::JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl FakeApi {
    pub fn start() -> FakeApi {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let (changed, changed_rx) = watch::channel(0u64);
        let (stop, mut stop_rx) = watch::channel(false);
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                loop {
                    tokio::select! {
                        _ = stop_rx.changed() => return,
                        r = listener.accept() => {
                            let Ok((conn, _)) = r else { continue };
                            let st = st.clone();
                            let rx = changed_rx.clone();
                            tokio::spawn(async move { let _ = handle(conn, st, rx).await; });
                        }
                    }
                }
            });
        });
        FakeApi {
            addr,
            state,
            changed,
            _thread: thread,
            stop,
        }
    }

    fn notify(&self) {
        self.changed.send_modify(|g| *g += 1);
    }

    /// Creates or replaces an object (ADDED or MODIFIED); returns its resourceVersion.
    pub fn apply(&self, mut obj: Value) -> u64 {
        let kind = Kind::of(&obj);
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        let rv = {
            let mut s = self.state.lock().unwrap();
            s.rv += 1;
            let rv = s.rv;
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            let ty = if s.objects.contains_key(&(kind, ns.clone(), name.clone())) {
                "MODIFIED"
            } else {
                "ADDED"
            };
            s.objects.insert((kind, ns, name), obj.clone());
            s.log.push((rv, kind, ty, obj));
            rv
        };
        self.notify();
        rv
    }

    /// Deletes an object (DELETED).
    pub fn delete(&self, kind: Kind, ns: &str, name: &str) {
        {
            let mut s = self.state.lock().unwrap();
            let Some(mut obj) = s.objects.remove(&(kind, ns.to_owned(), name.to_owned())) else {
                return;
            };
            s.rv += 1;
            let rv = s.rv;
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            s.log.push((rv, kind, "DELETED", obj));
        }
        self.notify();
    }

    /// An API server restart: with `true`, every open connection is dropped and new ones are
    /// closed unanswered; `false` serves again.
    pub fn set_down(&self, down: bool) {
        {
            let mut s = self.state.lock().unwrap();
            s.down = down;
            if down {
                s.generation += 1;
            }
        }
        self.notify();
    }

    /// Compacts the history: every open watch gets an ERROR event with a 410 Status, and
    /// watches resuming from an older resourceVersion too, so clients must relist.
    pub fn expire(&self) {
        {
            let mut s = self.state.lock().unwrap();
            s.compacted = s.rv;
            s.gone_generation += 1;
        }
        self.notify();
    }

    /// The requests served so far, e.g. `LIST Service`, `WATCH EndpointSlice`.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The query strings of the requests served so far (decoded).
    pub fn queries(&self) -> Vec<String> {
        self.state.lock().unwrap().queries.clone()
    }

    /// Waits until a watch of every kind has been opened (a model can be published before:
    /// it needs the lists only).
    pub fn wait_watching(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while ["WATCH Service", "WATCH EndpointSlice", "WATCH Node"]
            .iter()
            .any(|r| self.count(r) == 0)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no watches: {:?}",
                self.requests()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    pub fn count(&self, request: &str) -> usize {
        self.requests().iter().filter(|r| *r == request).count()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.set_down(true);
    }
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
        } else if b[i] == b'+' {
            out.push(b' ');
            i += 1;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn label_matches(obj: &Value, selector: &str) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some(k) = term.strip_prefix('!') {
            labels.get(k).is_none()
        } else if let Some((k, v)) = term.split_once("!=") {
            labels.get(k).and_then(Value::as_str) != Some(v)
        } else if let Some((k, v)) = term.split_once('=') {
            let v = v.strip_prefix('=').unwrap_or(v);
            labels.get(k).and_then(Value::as_str) == Some(v)
        } else {
            labels.get(term).is_some()
        }
    })
}

fn field_matches(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap();
        let v = v.strip_prefix('=').unwrap_or(v);
        match k {
            "metadata.name" => obj["metadata"]["name"].as_str() == Some(v),
            "metadata.namespace" => obj["metadata"]["namespace"].as_str() == Some(v),
            other => panic!("fake api: unsupported field selector {other}"),
        }
    })
}

async fn respond(conn: &mut TcpStream, code: u16, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}

async fn chunk(conn: &mut TcpStream, line: &Value) -> std::io::Result<()> {
    let data = format!("{line}\n");
    conn.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())
        .await
}

fn gone() -> Value {
    json!({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410,
    }})
}

async fn handle(
    mut conn: TcpStream,
    state: Arc<Mutex<State>>,
    mut changed: watch::Receiver<u64>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (generation, gone_generation) = {
        let s = state.lock().unwrap();
        if s.down {
            return Ok(()); // dropped unanswered
        }
        (s.generation, s.gone_generation)
    };
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let params: BTreeMap<String, String> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect();
    let Some(kind) = Kind::from_path(path) else {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": format!("{path} not found")});
        return respond(&mut conn, 404, &status).await;
    };
    let labels = params.get("labelSelector").cloned().unwrap_or_default();
    let fields = params.get("fieldSelector").cloned().unwrap_or_default();
    let selected = |o: &Value| label_matches(o, &labels) && field_matches(o, &fields);
    let watching = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
    {
        let mut s = state.lock().unwrap();
        let what = if watching { "WATCH" } else { "LIST" };
        s.requests.push(format!("{what} {kind:?}"));
        s.queries.push(decode(query));
    }

    if !watching {
        let (rv, items) = {
            let s = state.lock().unwrap();
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|((k, _, _), o)| *k == kind && selected(o))
                .map(|(_, o)| o.clone())
                .collect();
            (s.rv, items)
        };
        let (list_kind, api_version) = kind.list_kind();
        let body = json!({"kind": list_kind, "apiVersion": api_version,
            "metadata": {"resourceVersion": rv.to_string()}, "items": items});
        return respond(&mut conn, 200, &body).await;
    }

    let from: u64 = params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    conn.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await?;
    let mut cursor = from;
    let bookmarks = params.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let mut first = true;
    loop {
        let (events, end, gone_now, rv) = {
            let s = state.lock().unwrap();
            let gone_now = (from != 0 && from < s.compacted && cursor == from)
                || s.gone_generation != gone_generation;
            let events: Vec<Value> = s
                .log
                .iter()
                .filter(|(rv, k, _, o)| *rv > cursor && *k == kind && selected(o))
                .map(|(_, _, ty, o)| json!({"type": ty, "object": o}))
                .collect();
            (events, s.generation != generation, gone_now, s.rv)
        };
        if end {
            return Ok(()); // restart: the connection just drops
        }
        if gone_now {
            chunk(&mut conn, &gone()).await?;
            conn.write_all(b"0\r\n\r\n").await?;
            return conn.shutdown().await;
        }
        for e in &events {
            chunk(&mut conn, e).await?;
        }
        cursor = rv;
        if first && bookmarks {
            let (_, api_version) = kind.list_kind();
            let kind_name = format!("{kind:?}");
            let bm = json!({"type": "BOOKMARK", "object": {"kind": kind_name,
                "apiVersion": api_version, "metadata": {"resourceVersion": rv.to_string()}}});
            chunk(&mut conn, &bm).await?;
        }
        first = false;
        conn.flush().await?;
        if changed.changed().await.is_err() {
            return Ok(());
        }
    }
}

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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            fake.addr
        ),
    )
    .unwrap();
    let mut k = Kubernetes {
        kubeconfig: Some(path),
        service_proxy_name: None,
        min_sync_period: Dur(Duration::from_millis(100)),
        sync_period: Dur(Duration::from_secs(30)),
        default_scheduler: SchedulerKind::Rr,
        external_ip_cidrs: vec![],
    };
    tweak(&mut k);
    let mut cfg = Config {
        kubernetes: Some(k),
        ..Config::default()
    };
    cfg.node.name = Some("node-a".to_owned());
    let (tx, models) = std::sync::mpsc::channel();
    let handle = k8s::spawn(&cfg, move |m| {
        let _ = tx.send(m);
    })
    .unwrap();
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
