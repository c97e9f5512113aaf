//! The admin HTTP API end to end: a fake `AdminSource`, servers on 127.0.0.1:0 and on unix
//! sockets in temporary directories, each on a runtime of its own, and tiny blocking clients.
//!
//! No assertion depends on timing except the 1 s client timeouts of the hostile-client test;
//! every other wait is a bound that only a failure reaches.

use std::collections::{BTreeMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use slowpath::admin::{
    self, AdminConfig, AdminError, AdminLimits, AdminServer, AdminSource, BackendView,
    ControlAction, ControlFuture, FlowTableView, FlowViewJson, FlowsResponse, FrontendView,
    HealthView, ServiceView, ServicesResponse, StatsView, SyncView, WorkerView,
};
use tokio_util::sync::CancellationToken;

/// Bound on any single wait of a client (a failure, never a pass, reaches it).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

struct Fake {
    last_sync: Mutex<SystemTime>,
    not_ready: Mutex<Option<String>>,
    controls: Mutex<Vec<(ControlAction, Option<String>)>>,
    /// While true, `flows` and `stats` block (a stuck daemon).
    gate: (Mutex<bool>, Condvar),
    /// Calls blocked at the gate now.
    stuck: AtomicUsize,
}

impl Fake {
    fn new() -> Arc<Fake> {
        Arc::new(Fake {
            last_sync: Mutex::new(SystemTime::now()),
            not_ready: Mutex::new(None),
            controls: Mutex::new(Vec::new()),
            gate: (Mutex::new(false), Condvar::new()),
            stuck: AtomicUsize::new(0),
        })
    }

    fn set_gate(&self, closed: bool) {
        *self.gate.0.lock().unwrap() = closed;
        self.gate.1.notify_all();
    }

    /// Blocks while the gate is closed (at most [`CLIENT_TIMEOUT`]: a failed test must not
    /// hang).
    fn pass_gate(&self) {
        let mut closed = self.gate.0.lock().unwrap();
        if !*closed {
            return;
        }
        self.stuck.fetch_add(1, Ordering::SeqCst);
        let until = Instant::now() + CLIENT_TIMEOUT;
        while *closed && Instant::now() < until {
            closed = self
                .gate
                .1
                .wait_timeout(closed, Duration::from_millis(100))
                .unwrap()
                .0;
        }
        self.stuck.fetch_sub(1, Ordering::SeqCst);
    }
}

fn flow(i: u16) -> FlowViewJson {
    FlowViewJson {
        protocol: "tcp".into(),
        client: SocketAddr::from(([198, 18, 0, 1], 40000 + i)),
        vip: SocketAddr::from(([198, 18, 100, 1], 80)),
        backend: SocketAddr::from(([198, 18, 1, 1], 8080)),
        snat: SocketAddr::from(([198, 18, 0, 254], 20000 + i)),
        service: "web".into(),
        state: "ESTABLISHED".into(),
        idle_s: 0.5,
    }
}

impl AdminSource for Fake {
    fn services(&self) -> Vec<ServiceView> {
        vec![ServiceView {
            // A name that needs escaping in Prometheus labels.
            name: "ns/we\"b\\x:80".into(),
            frontends: vec![FrontendView {
                vip: [198, 18, 100, 1].into(),
                port: 80,
                protocol: "tcp".into(),
            }],
            scheduler: "wrr".into(),
            mode: "fullnat".into(),
            affinity_timeout_s: None,
            backends: vec![
                BackendView {
                    addr: SocketAddr::from(([198, 18, 1, 1], 8080)),
                    weight: 4,
                    usable: true,
                    active: 7,
                    inactive: 2,
                },
                BackendView {
                    addr: SocketAddr::from(([198, 18, 1, 2], 8080)),
                    weight: 0,
                    usable: false,
                    active: 0,
                    inactive: 1,
                },
            ],
            frozen: false,
            rate_limit: Some(admin::RateLimitView {
                rate: 100,
                burst: 10,
            }),
            rate_limited: 5,
        }]
    }

    fn flows(&self, limit: usize) -> Vec<FlowViewJson> {
        self.pass_gate();
        (0..limit.min(250) as u16).map(flow).collect()
    }

    fn stats(&self) -> StatsView {
        self.pass_gate();
        let drops: BTreeMap<String, u64> = [("no_service", 3), ("table_full", 0)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        StatsView {
            generation: 42,
            workers: (0..2)
                .map(|i| WorkerView {
                    index: i,
                    rx: 100 + i as u64,
                    tx: 90,
                    drops: drops.clone(),
                    ..WorkerView::default()
                })
                .collect(),
            flowtable: FlowTableView {
                flows: 10,
                capacity: 1024,
                bytes_per_flow: 122.4,
                ..FlowTableView::default()
            },
            steering: vec![admin::SteerView {
                interface: "eth0".into(),
                redirected: 5,
                passed: 1,
                counters: [
                    ("match_frontend".to_owned(), 5),
                    ("pass_not_ip".to_owned(), 1),
                ]
                .into_iter()
                .collect(),
            }],
            sync: SyncView {
                last_sync_unix_s: Some(1_700_000_000.25),
                last_duration_s: 0.004,
                syncs: 3,
                reloads_ok: 1,
                reloads_failed: 2,
            },
            governance: admin::GovernanceView {
                frozen: true,
                frozen_services: vec![],
                draining: false,
                flows_resteered: 4,
                flows_ended: 6,
            },
        }
    }

    fn health(&self) -> HealthView {
        HealthView {
            last_updated: Some(*self.last_sync.lock().unwrap()),
            oldest_pending: None,
            timeout: Duration::from_secs(60),
            fastpath_running: true,
            node_eligible: true,
            not_ready: self.not_ready.lock().unwrap().clone(),
        }
    }

    fn control(&self, action: ControlAction, service: Option<String>) -> ControlFuture {
        self.controls.lock().unwrap().push((action, service));
        // Answered from another task, as the daemon's controller does.
        Box::pin(async {
            tokio::spawn(async { Ok(()) })
                .await
                .map_err(|e| e.to_string())?
        })
    }
}

/// A server running on a runtime of its own.
struct Served {
    rt: tokio::runtime::Runtime,
    token: CancellationToken,
    done: Option<tokio::task::JoinHandle<()>>,
    listen: SocketAddr,
    healthz: Option<SocketAddr>,
    socket: Option<PathBuf>,
}

impl Served {
    fn start(cfg: &AdminConfig, src: Arc<dyn AdminSource>, limits: AdminLimits) -> Served {
        let server = AdminServer::bind_with(cfg, src, limits).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let token = CancellationToken::new();
        let (listen, healthz) = (server.local_addr(), server.healthz_addr());
        let socket = server.socket_path().map(Path::to_owned);
        let done = Some(rt.spawn(server.run(token.clone())));
        Served {
            rt,
            token,
            done,
            listen,
            healthz,
            socket,
        }
    }

    fn healthz(&self) -> SocketAddr {
        self.healthz.unwrap()
    }

    fn socket(&self) -> &Path {
        self.socket.as_deref().unwrap()
    }

    /// Cancels the token and waits for `run` to return.
    fn stop(mut self) {
        self.token.cancel();
        let done = self.done.take().unwrap();
        self.rt.block_on(done).unwrap();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// `listen` and `healthz_listen` on 127.0.0.1 port 0, no socket.
fn tcp_config() -> AdminConfig {
    AdminConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        healthz_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        socket: None,
        control_enabled: false,
    }
}

/// Like [`tcp_config`], plus a socket at `path`.
fn socket_config(path: &Path, control_enabled: bool) -> AdminConfig {
    AdminConfig {
        socket: Some(path.to_owned()),
        control_enabled,
        ..tcp_config()
    }
}

/// The defaults, but idle connections are kept longer than [`CLIENT_TIMEOUT`]: a server that
/// failed to close a `Connection: close` exchange would make the client time out, not pass.
fn patient() -> AdminLimits {
    AdminLimits {
        header_timeout: Duration::from_secs(60),
        ..AdminLimits::default()
    }
}

fn serve(fake: &Arc<Fake>) -> Served {
    Served::start(
        &tcp_config(),
        Arc::clone(fake) as Arc<dyn AdminSource>,
        patient(),
    )
}

struct Reply {
    /// `HTTP/1.1`, or `HTTP/1.0` when asked in 1.0.
    version: String,
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("JSON body")
    }
}

/// Reads one response: the head, then Content-Length bytes of body (none for `head_only`).
fn read_reply(s: &mut impl Read, head_only: bool) -> Reply {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) => panic!(
                "closed before a whole response head: {:?}",
                String::from_utf8_lossy(&head)
            ),
            Ok(_) => head.push(byte[0]),
            Err(e) => panic!("reading a response: {e}"),
        }
    }
    let head = String::from_utf8(head).unwrap();
    let mut lines = head.trim_end().split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(
        ["HTTP/1.1 ", "HTTP/1.0 "]
            .iter()
            .any(|v| status_line.starts_with(v)),
        "{status_line}"
    );
    let status = status_line[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    let mut reply = Reply {
        version: status_line[..8].to_owned(),
        status,
        headers,
        body: String::new(),
    };
    let len: usize = reply
        .header("content-length")
        .expect("a Content-Length")
        .parse()
        .unwrap();
    if !head_only {
        let mut body = vec![0; len];
        s.read_exact(&mut body).unwrap();
        reply.body = String::from_utf8(body).unwrap();
    }
    reply
}

/// Sends `raw`, reads one response; with `close`, also asserts that the server then closes
/// the connection with nothing more sent.
fn exchange<S: Read + Write>(mut s: S, raw: &str, close: bool) -> Reply {
    s.write_all(raw.as_bytes()).unwrap();
    let reply = read_reply(&mut s, raw.starts_with("HEAD "));
    if raw.contains(" HTTP/1.1\r\n") {
        assert_eq!(reply.version, "HTTP/1.1");
    }
    if close {
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "bytes after the response: {rest:?}");
    }
    reply
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    s
}

fn connect_unix(path: &Path) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    s
}

/// `raw` on a new connection; the connection is dropped after the response.
fn request(addr: SocketAddr, raw: &str) -> Reply {
    exchange(connect(addr), raw, false)
}

fn get_raw(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
}

/// GET with `Connection: close`, as `xvs status` does: the server must close after answering.
fn get(addr: SocketAddr, path: &str) -> Reply {
    exchange(connect(addr), &get_raw(path), true)
}

fn unix_get(socket: &Path, path: &str) -> Reply {
    exchange(connect_unix(socket), &get_raw(path), true)
}

fn unix_post(socket: &Path, path: &str) -> Reply {
    let raw = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    exchange(connect_unix(socket), &raw, false)
}

fn post(addr: SocketAddr, path: &str) -> Reply {
    request(
        addr,
        &format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
    )
}

/// True once the peer has closed `s` (EOF or reset); false while it is open and silent.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let closed = match s.read(&mut [0u8; 64]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    };
    s.set_nonblocking(false).unwrap();
    closed
}

/// Waits (at most [`CLIENT_TIMEOUT`]) for the peer to close `s`; true if it did.
fn wait_closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// The value of the sample `line_prefix` (`name{labels}`) in a /metrics text.
fn sample(metrics: &str, line_prefix: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {line_prefix} in\n{metrics}"))
        .parse()
        .unwrap()
}

#[test]
fn healthz_follows_the_last_sync() {
    let fake = Fake::new();
    let s = serve(&fake);
    let addr = s.listen;
    assert_ne!(addr.port(), 0);

    let r = get(addr, "/healthz");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let j = r.json();
    for key in ["lastUpdated", "currentTime"] {
        let t = j[key].as_str().unwrap();
        assert!(t.ends_with('Z') && t.contains('T'), "{key}: {t}");
    }
    assert_eq!(j["nodeEligible"], true);

    let r = get(addr, "/livez");
    assert_eq!(r.status, 200);
    assert!(
        r.json().get("nodeEligible").is_none(),
        "livez ignores node state"
    );

    // The slowpath stops syncing: older than the timeout (60 s).
    *fake.last_sync.lock().unwrap() = SystemTime::now() - Duration::from_secs(3600);
    let r = get(addr, "/healthz");
    assert_eq!(r.status, 503);
    assert!(r.json()["reason"].as_str().unwrap().contains("last sync"));
    assert_eq!(get(addr, "/livez").status, 503);

    // The answers are counted, like kube-proxy's proxy_healthz_total.
    let m = get(addr, "/metrics").body;
    assert!(m.contains("xvs_healthz_total{code=\"200\"} 1\n"), "{m}");
    assert!(m.contains("xvs_healthz_total{code=\"503\"} 1\n"), "{m}");
    s.stop();
}

#[test]
fn not_ready_fails_both_probes_with_its_reason() {
    let fake = Fake::new();
    let why = "waiting for the first sync of the Kubernetes source";
    *fake.not_ready.lock().unwrap() = Some(why.to_owned());
    let s = serve(&fake);
    for addr in [s.listen, s.healthz()] {
        for path in ["/healthz", "/livez"] {
            let r = get(addr, path);
            assert_eq!(r.status, 503, "{path}: {}", r.body);
            assert_eq!(r.json()["reason"], why, "{path}");
        }
    }
    *fake.not_ready.lock().unwrap() = None;
    assert_eq!(get(s.healthz(), "/healthz").status, 200);
    assert_eq!(get(s.healthz(), "/livez").status, 200);
    s.stop();
}

#[test]
fn json_endpoints_have_their_shapes() {
    let fake = Fake::new();
    let s = serve(&fake);
    let addr = s.listen;

    let r = get(addr, "/v1/services");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let parsed: ServicesResponse = serde_json::from_str(&r.body).unwrap();
    assert_eq!(parsed.services, fake.services());
    let j = r.json();
    assert_eq!(j["services"][0]["frontends"][0]["vip"], "198.18.100.1");
    assert_eq!(j["services"][0]["backends"][0]["addr"], "198.18.1.1:8080");
    assert_eq!(j["services"][0]["backends"][0]["active"], 7);

    let r = get(addr, "/v1/flows");
    assert_eq!(r.status, 200);
    let f: FlowsResponse = serde_json::from_str(&r.body).unwrap();
    assert_eq!(f.limit, 100, "default limit");
    assert_eq!(f.flows.len(), 100);
    assert_eq!(f.flows[0], flow(0));
    let j = r.json();
    assert_eq!(j["flows"][0]["client"], "198.18.0.1:40000");
    assert_eq!(j["flows"][0]["state"], "ESTABLISHED");

    let f: FlowsResponse = serde_json::from_str(&get(addr, "/v1/flows?limit=7").body).unwrap();
    assert_eq!((f.limit, f.flows.len()), (7, 7));
    let f: FlowsResponse =
        serde_json::from_str(&get(addr, "/v1/flows?x=1&limit=999999").body).unwrap();
    assert_eq!(f.limit, 10_000, "clamped");
    assert_eq!(get(addr, "/v1/flows?limit=abc").status, 400);

    let r = get(addr, "/v1/stats");
    assert_eq!(r.status, 200);
    let st: StatsView = serde_json::from_str(&r.body).unwrap();
    assert_eq!(st, fake.stats());
    let j = r.json();
    assert_eq!(j["workers"][1]["rx"], 101);
    assert_eq!(j["workers"][0]["drops"]["no_service"], 3);
    assert_eq!(j["flowtable"]["capacity"], 1024);
    assert_eq!(j["sync"]["reloads_failed"], 2);
    assert_eq!(j["steering"][0]["interface"], "eth0");
    s.stop();
}

#[test]
fn metrics_are_valid_prometheus_text() {
    let fake = Fake::new();
    let s = serve(&fake);
    let r = get(s.listen, "/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = r.body;
    assert!(text.ends_with('\n'));

    let mut helped = HashSet::new();
    let mut typed = HashSet::new();
    let mut sampled = HashSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(helped.insert(name.to_owned()), "HELP twice: {name}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let name = it.next().unwrap();
            let kind = it.next().unwrap();
            assert!(["counter", "gauge"].contains(&kind), "{line}");
            assert!(helped.contains(name), "TYPE before HELP: {line}");
            assert!(typed.insert(name.to_owned()), "TYPE twice: {name}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "counter name: {name}");
            }
            continue;
        }
        let (name, labels, value) = parse_sample(line);
        assert!(name.starts_with("xvs_"), "{line}");
        assert!(typed.contains(&name), "sample before its TYPE: {line}");
        assert!(value.is_finite(), "{line}");
        if name == "xvs_backend_connections" {
            assert_eq!(
                labels[0],
                ("service".to_owned(), "ns/we\"b\\x:80".to_owned())
            );
        }
        sampled.insert(name);
    }
    assert_eq!(helped, typed);

    let has = |needle: &str| assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    has("xvs_drops_total{reason=\"no_service\"} 6\n");
    has("xvs_rx_packets_total{worker=\"1\"} 101\n");
    has("xvs_tx_packets_total{worker=\"0\"} 90\n");
    has(
        "xvs_backend_connections{service=\"ns/we\\\"b\\\\x:80\",backend=\"198.18.1.1:8080\",state=\"active\"} 7\n",
    );
    has(
        "xvs_backend_connections{service=\"ns/we\\\"b\\\\x:80\",backend=\"198.18.1.2:8080\",state=\"inactive\"} 1\n",
    );
    has("xvs_flowtable_flows 10\n");
    has("xvs_flowtable_capacity 1024\n");
    has("xvs_sync_duration_seconds 0.004\n");
    has("xvs_last_sync_timestamp_seconds 1700000000.25\n");
    has("xvs_config_reloads_total{result=\"ok\"} 1\n");
    has("xvs_config_reloads_total{result=\"failed\"} 2\n");
    has("xvs_frozen 1\n");
    has("xvs_service_frozen{service=\"ns/we\\\"b\\\\x:80\"} 0\n");
    has("xvs_service_rate_limited_total{service=\"ns/we\\\"b\\\\x:80\"} 5\n");
    has("xvs_draining 0\n");
    has("xvs_removed_backend_flows_total{action=\"resteered\"} 4\n");
    has("xvs_removed_backend_flows_total{action=\"ended\"} 6\n");
    has("xvs_snapshot_generation 42\n");
    // The admin server's own families, one sample per listener.
    has("xvs_admin_connections_rejected_total{listener=\"listen\"} 0\n");
    has("xvs_admin_connections_rejected_total{listener=\"healthz\"} 0\n");
    has("xvs_admin_requests_timed_out_total 0\n");
    // This very connection is open on `listen`.
    has("xvs_admin_connections{listener=\"listen\"} 1\n");
    s.stop();
}

/// Parses `name{k="v",...} value`, honouring escapes in label values.
fn parse_sample(line: &str) -> (String, Vec<(String, String)>, f64) {
    let name_end = line
        .find(['{', ' '])
        .unwrap_or_else(|| panic!("no value: {line}"));
    let name = &line[..name_end];
    assert!(
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
        "bad name: {line}"
    );
    let mut labels = Vec::new();
    let mut chars = line[name_end..].chars().peekable();
    if chars.peek() == Some(&'{') {
        chars.next();
        loop {
            let mut key = String::new();
            for c in chars.by_ref() {
                if c == '=' {
                    break;
                }
                assert!(
                    c.is_ascii_alphanumeric() || c == '_',
                    "bad label name: {line}"
                );
                key.push(c);
            }
            assert_eq!(chars.next(), Some('"'), "label value not quoted: {line}");
            let mut value = String::new();
            loop {
                match chars
                    .next()
                    .unwrap_or_else(|| panic!("unterminated: {line}"))
                {
                    '\\' => match chars.next() {
                        Some('n') => value.push('\n'),
                        Some(e @ ('\\' | '"')) => value.push(e),
                        e => panic!("bad escape {e:?}: {line}"),
                    },
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.push((key, value));
            match chars.next() {
                Some(',') => continue,
                Some('}') => break,
                c => panic!("unexpected {c:?}: {line}"),
            }
        }
    }
    let rest: String = chars.collect();
    let value = rest
        .strip_prefix(' ')
        .unwrap_or_else(|| panic!("no space before value: {line}"));
    assert!(!value.contains(' '), "timestamps are not used: {line}");
    let value = value
        .parse()
        .unwrap_or_else(|_| panic!("bad value: {line}"));
    (name.to_owned(), labels, value)
}

#[test]
fn methods_paths_and_limits() {
    let fake = Fake::new();
    let s = serve(&fake);
    let addr = s.listen;
    assert_eq!(get(addr, "/nope").status, 404);
    let r = get(addr, "/v1/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"], "no such endpoint");
    let r = request(
        addr,
        "POST /v1/stats HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_eq!(r.status, 405);
    assert!(r.header("allow").unwrap().contains("GET"));
    assert_eq!(r.json()["error"], "method not allowed");
    let r = request(addr, &get_raw("/v1/freeze"));
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));

    // HEAD: the GET's head, no body.
    let get_len = get(addr, "/v1/stats").body.len();
    let r = exchange(
        connect(addr),
        "HEAD /v1/stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        true,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some(&*get_len.to_string()));

    // Garbage and oversized heads are refused, not hung on.
    assert_eq!(request(addr, "hello\r\n\r\n").status, 400);
    let big = format!("GET /healthz HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(9000));
    assert_eq!(request(addr, &big).status, 431);
    // Bodies: over BODY_MAX by declaration, or by what a chunked body carries.
    let r = request(
        addr,
        &format!(
            "POST /v1/drain HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            admin::BODY_MAX + 1
        ),
    );
    assert_eq!(r.status, 413);
    assert_eq!(r.header("connection"), Some("close"));
    let chunk = "b".repeat(admin::BODY_MAX);
    let r = request(
        addr,
        &format!(
            "POST /v1/drain HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
            chunk.len(),
            chunk.len()
        ),
    );
    assert_eq!(r.status, 413);
    // A small body is read and ignored.
    let r = request(
        addr,
        "POST /v1/stats HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    );
    assert_eq!(r.status, 405);
    assert!(fake.controls.lock().unwrap().is_empty());
    s.stop();
}

#[test]
fn keep_alive_and_connection_close() {
    let fake = Fake::new();
    let s = serve(&fake);
    let mut c = connect(s.listen);
    for path in ["/healthz", "/v1/stats", "/metrics"] {
        c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        let r = read_reply(&mut c, false);
        assert_eq!(r.status, 200, "{path}");
        assert!(!r.body.is_empty(), "{path}");
    }
    // Still open after three answers; then `Connection: close` is honoured.
    assert!(!closed_by_peer(&mut c));
    let r = exchange(&mut c, &get_raw("/livez"), true);
    assert_eq!(r.status, 200);
    // HTTP/1.0 without keep-alive is closed after one answer too.
    let r = exchange(connect(s.listen), "GET /healthz HTTP/1.0\r\n\r\n", true);
    assert_eq!((r.version.as_str(), r.status), ("HTTP/1.0", 200));
    s.stop();
}

#[test]
fn control_is_served_only_on_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run").join("xvs.sock");
    let fake = Fake::new();
    let src = Arc::clone(&fake) as Arc<dyn AdminSource>;
    let s = Served::start(&socket_config(&path, true), src, patient());
    assert_eq!(s.socket(), path);

    // TCP `listen`: read-only, even with control enabled.
    let r = post(s.listen, "/v1/freeze");
    assert_eq!(r.status, 403);
    let e = r.json()["error"].as_str().unwrap().to_owned();
    assert!(
        e.starts_with("control is served only on the unix socket ([admin] socket)"),
        "{e}"
    );
    // The healthz listener knows nothing but the probes.
    for path in [
        "/metrics",
        "/v1/stats",
        "/v1/flows",
        "/v1/services",
        "/nope",
    ] {
        assert_eq!(get(s.healthz(), path).status, 404, "{path}");
    }
    assert_eq!(post(s.healthz(), "/v1/freeze").status, 404);
    assert_eq!(get(s.healthz(), "/healthz").status, 200);
    assert_eq!(get(s.healthz(), "/livez").status, 200);
    assert!(fake.controls.lock().unwrap().is_empty());

    // The socket: the read-only set, and control.
    let r = unix_get(&path, "/v1/stats");
    assert_eq!(r.status, 200);
    assert_eq!(
        serde_json::from_str::<StatsView>(&r.body).unwrap(),
        fake.stats()
    );
    assert_eq!(unix_get(&path, "/metrics").status, 200);
    assert_eq!(unix_get(&path, "/healthz").status, 200);
    let r = unix_post(&path, "/v1/drain");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["action"], "drain");
    assert_eq!(r.json()["ok"], true);
    let r = unix_post(&path, "/v1/freeze?service=x");
    assert_eq!(r.status, 200, "{}", r.body);
    // One service, named in the (percent-encoded) query.
    let r = unix_post(&path, "/v1/unfreeze?service=ns%2Fweb%3Ahttp");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["service"], "ns/web:http");
    assert_eq!(
        *fake.controls.lock().unwrap(),
        vec![
            (ControlAction::Drain, None),
            (ControlAction::Freeze, Some("x".to_owned())),
            (ControlAction::Unfreeze, Some("ns/web:http".to_owned())),
        ]
    );
    s.stop();

    // Disabled: 403 naming the key, and the source is not called.
    fake.controls.lock().unwrap().clear();
    let src = Arc::clone(&fake) as Arc<dyn AdminSource>;
    let s = Served::start(&socket_config(&path, false), src, patient());
    let r = unix_post(&path, "/v1/freeze?service=x");
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["error"],
        "control endpoints are disabled; set [admin] enable_control = true"
    );
    assert!(fake.controls.lock().unwrap().is_empty());
    s.stop();
}

#[test]
fn control_defaults_to_not_supported() {
    struct Bare;
    impl AdminSource for Bare {
        fn services(&self) -> Vec<ServiceView> {
            Vec::new()
        }
        fn flows(&self, _: usize) -> Vec<FlowViewJson> {
            Vec::new()
        }
        fn stats(&self) -> StatsView {
            StatsView::default()
        }
        fn health(&self) -> HealthView {
            HealthView {
                last_updated: None,
                oldest_pending: None,
                timeout: Duration::from_secs(60),
                fastpath_running: true,
                node_eligible: true,
                not_ready: None,
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xvs.sock");
    let s = Served::start(&socket_config(&path, true), Arc::new(Bare), patient());
    let r = unix_post(&path, "/v1/freeze");
    assert_eq!(r.status, 409);
    assert_eq!(r.json()["error"], "not supported");
    // Never synced: not ready yet.
    assert_eq!(get(s.listen, "/healthz").status, 503);
    // Empty sources still give well-formed answers.
    assert_eq!(get(s.listen, "/metrics").status, 200);
    assert_eq!(get(s.listen, "/v1/flows?limit=0").json()["limit"], 1);
    s.stop();
}

#[test]
fn the_socket_file_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    // The parent directory does not exist yet.
    let path = dir.path().join("run").join("xvs.sock");
    let src = || Fake::new() as Arc<dyn AdminSource>;
    let s = Served::start(&socket_config(&path, false), src(), patient());
    let meta = std::fs::metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Nothing is left of the private directory it was bound in.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("xvs.sock")]);

    // A second server on the live path is refused; the first keeps serving.
    let cfg = socket_config(&path, false);
    match AdminServer::bind(&cfg, src()) {
        Err(e @ AdminError::SocketInUse { .. }) => {
            let m = e.to_string();
            assert!(
                m.starts_with(&format!("[admin] socket {}: in use", path.display())),
                "{m}"
            );
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("bound a socket another server serves"),
    }
    assert_eq!(unix_get(&path, "/v1/stats").status, 200);
    s.stop();
    assert!(!path.exists(), "the socket file is removed on shutdown");

    // A stale socket (its process died) is replaced.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let s = Served::start(&cfg, src(), patient());
    assert_eq!(unix_get(&path, "/v1/stats").status, 200);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    s.stop();
    assert!(!path.exists());

    // Something that is not a socket is left alone.
    std::fs::write(&path, "keep me").unwrap();
    match AdminServer::bind(&cfg, src()) {
        Err(AdminError::NotASocket { .. }) => {}
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("replaced a regular file"),
    }
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");

    // A server dropped without running removes its socket too.
    std::fs::remove_file(&path).unwrap();
    let server = AdminServer::bind(&cfg, src()).unwrap();
    assert!(path.exists());
    drop(server);
    assert!(!path.exists());
}

#[test]
fn bind_errors_name_the_key_and_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap();
    let src = || Fake::new() as Arc<dyn AdminSource>;
    let cfg = AdminConfig {
        listen: busy,
        ..tcp_config()
    };
    let e = AdminServer::bind(&cfg, src())
        .err()
        .expect("listen is taken");
    assert!(
        matches!(e, AdminError::Listen { key: "listen", .. }),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("[admin] listen {busy}: ")),
        "{e}"
    );
    let cfg = AdminConfig {
        healthz_listen: Some(busy),
        ..tcp_config()
    };
    let e = AdminServer::bind(&cfg, src())
        .err()
        .expect("healthz_listen is taken");
    assert!(
        e.to_string()
            .starts_with(&format!("[admin] healthz_listen {busy}: ")),
        "{e}"
    );
}

#[test]
fn one_listener_when_healthz_listen_equals_listen() {
    // A free port, asked for by number (port 0 would mean two listeners).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let cfg = AdminConfig {
        listen: addr,
        healthz_listen: Some(addr),
        ..tcp_config()
    };
    let s = Served::start(&cfg, Fake::new(), patient());
    assert_eq!((s.listen, s.healthz), (addr, Some(addr)));
    // The shared listener serves the `listen` set.
    assert_eq!(get(addr, "/healthz").status, 200);
    let m = get(addr, "/metrics").body;
    assert!(!m.contains("listener=\"healthz\""), "{m}");
    s.stop();

    // Without healthz_listen: only `listen`.
    let cfg = AdminConfig {
        healthz_listen: None,
        ..tcp_config()
    };
    let s = Served::start(&cfg, Fake::new(), patient());
    assert_eq!(s.healthz, None);
    assert_eq!(get(s.listen, "/healthz").status, 200);
    s.stop();
}

#[test]
fn idle_and_slow_heads_are_closed_after_the_header_timeout() {
    let limits = AdminLimits {
        header_timeout: Duration::from_millis(500),
        ..AdminLimits::default()
    };
    let s = Served::start(&tcp_config(), Fake::new(), limits);

    // Connected, never sending.
    let mut silent = connect(s.listen);
    // Kept alive after an answer, then idle: the same timer closes it.
    let mut idle = connect(s.listen);
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut idle, false).status, 200);
    assert!(wait_closed(&mut silent), "a silent connection stays open");
    assert!(
        wait_closed(&mut idle),
        "an idle keep-alive connection stays open"
    );

    // A byte every 50 ms: each read is quick, the head never ends. The timeout is for the
    // whole head, so the server closes it after about 10 bytes; 400 bytes (20 s) means it
    // did not.
    let mut drip = connect(s.listen);
    drip.write_all(b"GET /healthz HTTP/1.1\r\nX-Drip: ")
        .unwrap();
    let mut sent = 0;
    let closed = loop {
        if sent == 400 {
            break false;
        }
        if drip.write_all(b"a").is_err() || closed_by_peer(&mut drip) {
            break true;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(closed, "a head dripped byte by byte is never cut off");
    s.stop();
}

#[test]
fn connections_over_the_bound_are_closed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xvs.sock");
    let src = Fake::new() as Arc<dyn AdminSource>;
    let s = Served::start(&socket_config(&path, false), src, patient());
    const EXTRA: usize = 16;

    // Connected in order, accepted in order: the first MAX_CONNECTIONS take every slot.
    let mut held: Vec<TcpStream> = (0..admin::MAX_CONNECTIONS + EXTRA)
        .map(|_| connect(s.listen))
        .collect();
    let extra = held.split_off(admin::MAX_CONNECTIONS);
    for (i, mut c) in extra.into_iter().enumerate() {
        assert!(
            wait_closed(&mut c),
            "connection {i} over the bound stays open"
        );
    }
    for (i, c) in held.iter_mut().enumerate() {
        assert!(!closed_by_peer(c), "held connection {i} was closed");
    }
    // Counted; the other listeners have budgets of their own.
    let m = unix_get(&path, "/metrics").body;
    assert_eq!(
        sample(
            &m,
            "xvs_admin_connections_rejected_total{listener=\"listen\"}"
        ),
        EXTRA as f64
    );
    assert_eq!(
        sample(&m, "xvs_admin_connections{listener=\"listen\"}"),
        admin::MAX_CONNECTIONS as f64
    );
    assert_eq!(get(s.healthz(), "/healthz").status, 200);

    // A slot freed is a slot taken again: the server sees the close, then serves a new
    // client (tries bounded: the close reaches the server's task asynchronously).
    drop(held.pop());
    let served = (0..200).any(|_| {
        let mut c = connect(s.listen);
        if c.write_all(get_raw("/healthz").as_bytes()).is_ok() {
            let mut out = Vec::new();
            let _ = c.read_to_end(&mut out);
            if out.starts_with(b"HTTP/1.1 200 ") {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        false
    });
    assert!(served, "no new connection served after one was closed");
    drop(held);
    s.stop();
}

#[test]
fn a_stuck_source_gets_503_and_never_delays_the_probes() {
    let fake = Fake::new();
    let limits = AdminLimits {
        request_timeout: Duration::from_millis(300),
        ..patient()
    };
    let src = Arc::clone(&fake) as Arc<dyn AdminSource>;
    let s = Served::start(&tcp_config(), src, limits);
    fake.set_gate(true);
    // More expensive requests than there are blocking slots: each is answered 503 at its
    // deadline, whether it reached the source or waited for a slot.
    let n = admin::BLOCKING_MAX + 2;
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let addr = s.listen;
            std::thread::spawn(move || get(addr, &format!("/v1/flows?limit={}", i + 1)))
        })
        .collect();
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!(r.status, 503, "{}", r.body);
        assert!(
            r.json()["error"]
                .as_str()
                .unwrap()
                .contains("not answered within"),
            "{}",
            r.body
        );
    }
    // Every slot is held by a call stuck in the source; no more than that reached it.
    let until = Instant::now() + CLIENT_TIMEOUT;
    while fake.stuck.load(Ordering::SeqCst) < admin::BLOCKING_MAX {
        assert!(Instant::now() < until, "the blocking slots never filled");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fake.stuck.load(Ordering::SeqCst), admin::BLOCKING_MAX);
    assert_eq!(get(s.listen, "/v1/stats").status, 503);
    // The probes do not wait for a slot.
    for addr in [s.listen, s.healthz()] {
        for path in ["/healthz", "/livez"] {
            let r = get_within(addr, path, Duration::from_secs(1));
            assert_eq!(r.status, 200, "{path}");
        }
    }
    // Released: the slots come back.
    fake.set_gate(false);
    let f: FlowsResponse = serde_json::from_str(&get(s.listen, "/v1/flows?limit=3").body).unwrap();
    assert_eq!(f.flows.len(), 3);
    let m = get(s.listen, "/metrics").body;
    assert_eq!(
        sample(&m, "xvs_admin_requests_timed_out_total"),
        (n + 1) as f64
    );
    s.stop();
}

#[test]
fn shutdown_finishes_requests_in_flight_then_closes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xvs.sock");
    let fake = Fake::new();
    let limits = AdminLimits {
        shutdown_grace: Duration::from_secs(30),
        ..patient()
    };
    let src = Arc::clone(&fake) as Arc<dyn AdminSource>;
    let mut s = Served::start(&socket_config(&path, false), src, limits);
    let mut idle = connect(s.listen);
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut idle, false).status, 200);

    fake.set_gate(true);
    let addr = s.listen;
    let in_flight = std::thread::spawn(move || get(addr, "/v1/stats"));
    let until = Instant::now() + CLIENT_TIMEOUT;
    while fake.stuck.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < until,
            "the request never reached the source"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    s.token.cancel();
    // The idle connection is closed at once, the busy one is answered.
    assert!(
        wait_closed(&mut idle),
        "an idle connection outlives the shutdown"
    );
    fake.set_gate(false);
    assert_eq!(in_flight.join().unwrap().status, 200);
    let done = s.done.take().unwrap();
    s.rt.block_on(done).unwrap();
    assert!(TcpStream::connect(addr).is_err(), "still accepting");
    assert!(!path.exists(), "the socket file is left behind");
}

/// GET with `Connection: close`, answered in full within `within` (connect included).
fn get_within(addr: SocketAddr, path: &str, within: Duration) -> Reply {
    let start = Instant::now();
    let left = || {
        within
            .checked_sub(start.elapsed())
            .filter(|d| !d.is_zero())
            .unwrap_or_else(|| panic!("GET {path} on {addr}: no answer within {within:?}"))
    };
    let mut c = TcpStream::connect_timeout(&addr, left())
        .unwrap_or_else(|e| panic!("GET {path} on {addr}: connect: {e}"));
    c.set_write_timeout(Some(left())).unwrap();
    c.write_all(get_raw(path).as_bytes()).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        c.set_read_timeout(Some(left())).unwrap();
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => panic!("GET {path} on {addr}: {e} after {:?}", start.elapsed()),
        }
    }
    left();
    read_reply(&mut out.as_slice(), false)
}

/// Keeps `count` connections to `addr` open and silent until `until`, reconnecting those the
/// server closes (after its header timeout).
fn hold_idle(addr: SocketAddr, count: usize, until: Instant) -> usize {
    let open = || TcpStream::connect_timeout(&addr, CLIENT_TIMEOUT).unwrap();
    let mut conns: Vec<TcpStream> = (0..count).map(|_| open()).collect();
    let mut reconnects = 0;
    while Instant::now() < until {
        for c in &mut conns {
            if closed_by_peer(c) {
                *c = open();
                reconnects += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    reconnects
}

/// Sends a request head to `addr` one byte every 300 ms until `until`, never finishing it;
/// reconnects when the server closes the connection.
fn drip(addr: SocketAddr, until: Instant) {
    let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Drip: ";
    while Instant::now() < until {
        let Ok(mut c) = TcpStream::connect_timeout(&addr, CLIENT_TIMEOUT) else {
            continue;
        };
        let mut i = 0;
        while Instant::now() < until {
            let byte = head.get(i).copied().unwrap_or(b'a');
            if c.write_all(&[byte]).is_err() || closed_by_peer(&mut c) {
                break;
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// The acceptance test of the measured problem: with the default limits, 200 idle and 20
/// slow-drip clients on each TCP listener do not delay a single probe or scrape past 1 s.
#[test]
fn hostile_clients_do_not_delay_probes_or_scrapes() {
    const IDLE: usize = 200;
    const DRIPS: usize = 20;
    let s = Served::start(&tcp_config(), Fake::new(), AdminLimits::default());
    let until = Instant::now() + Duration::from_secs(8);
    let mut hostile = Vec::new();
    for addr in [s.listen, s.healthz()] {
        hostile.push(std::thread::spawn(move || {
            hold_idle(addr, IDLE, until);
        }));
        for _ in 0..DRIPS {
            hostile.push(std::thread::spawn(move || drip(addr, until)));
        }
    }
    // Probes and scrapes while they are all connected.
    let mut polls = 0;
    let mut most_open = [0.0f64; 2];
    std::thread::sleep(Duration::from_millis(500));
    while Instant::now() < until {
        let r = get_within(s.healthz(), "/healthz", Duration::from_secs(1));
        assert_eq!(r.status, 200, "{}", r.body);
        let r = get_within(s.listen, "/metrics", Duration::from_secs(1));
        assert_eq!(r.status, 200);
        for (i, l) in ["listen", "healthz"].into_iter().enumerate() {
            let open = sample(
                &r.body,
                &format!("xvs_admin_connections{{listener=\"{l}\"}}"),
            );
            most_open[i] = most_open[i].max(open);
        }
        polls += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    for h in hostile {
        h.join().unwrap();
    }
    assert!(polls >= 10, "only {polls} polls in 8 s");
    // The pressure was real: the server held the hostile connections while answering.
    for (i, l) in ["listen", "healthz"].into_iter().enumerate() {
        assert!(
            most_open[i] >= IDLE as f64,
            "{l}: at most {} connections open",
            most_open[i]
        );
    }
    s.stop();
}
