//! A fake Kubernetes API server for tests, shared by `slowpath/tests/k8s_fake_api.rs` and
//! `daemon/tests/k8s_poison.rs` (each uses part of it). Hand-written HTTP/1.1 on a
//! tokio `TcpListener` (127.0.0.1, ephemeral port), speaking the real protocol for the four
//! collections the source watches:
//!
//! - `GET /api/v1/services`, `/apis/discovery.k8s.io/v1/endpointslices`, `/api/v1/nodes`,
//!   `/apis/networking.k8s.io/v1/servicecidrs` (unless [`FakeApi::without_service_cidrs`]:
//!   then 404, as an API server before v1.33) with `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated) and
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

#![allow(dead_code)]

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
    ServiceCidr,
}

impl Kind {
    fn of(v: &Value) -> Kind {
        match v["kind"].as_str() {
            Some("Service") => Kind::Service,
            Some("EndpointSlice") => Kind::EndpointSlice,
            Some("Node") => Kind::Node,
            Some("ServiceCIDR") => Kind::ServiceCidr,
            k => panic!("fake api: unsupported kind {k:?}"),
        }
    }
    fn from_path(path: &str) -> Option<Kind> {
        match path {
            "/api/v1/services" => Some(Kind::Service),
            "/apis/discovery.k8s.io/v1/endpointslices" => Some(Kind::EndpointSlice),
            "/api/v1/nodes" => Some(Kind::Node),
            "/apis/networking.k8s.io/v1/servicecidrs" => Some(Kind::ServiceCidr),
            _ => None,
        }
    }
    fn list_kind(self) -> (&'static str, &'static str) {
        match self {
            Kind::Service => ("ServiceList", "v1"),
            Kind::EndpointSlice => ("EndpointSliceList", "discovery.k8s.io/v1"),
            Kind::Node => ("NodeList", "v1"),
            Kind::ServiceCidr => ("ServiceCIDRList", "networking.k8s.io/v1"),
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
    /// ServiceCIDRs are not served (404).
    no_service_cidrs: bool,
    /// "LIST Service", "WATCH Service" and the like, one per request ("NOTFOUND path" for a
    /// 404).
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

    /// Answers 404 for ServiceCIDRs from now on (an API server before v1.33).
    pub fn without_service_cidrs(&self) {
        self.state.lock().unwrap().no_service_cidrs = true;
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
    let served = Kind::from_path(path).filter(|k| {
        let mut s = state.lock().unwrap();
        let off = *k == Kind::ServiceCidr && s.no_service_cidrs;
        if off {
            s.requests.push(format!("NOTFOUND {path}"));
        }
        !off
    });
    let Some(kind) = served else {
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

/// Writes a kubeconfig for the fake server at `addr` into `dir`; returns its path.
pub fn kubeconfig(dir: &std::path::Path, addr: SocketAddr) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
        ),
    )
    .unwrap();
    path
}
