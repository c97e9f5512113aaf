//! Shared by the admin API's test files: a fake `AdminSource`, servers on 127.0.0.1:0 and
//! on unix sockets in temporary directories, each on a runtime of its own, and tiny blocking
//! clients. Each test binary uses a part of it.
#![allow(dead_code, unused_imports)]

use std::collections::{BTreeMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use slowpath::admin::histogram::{Histogram, NETWORK_PROGRAMMING_BUCKETS, SYNC_DURATION_BUCKETS};
use slowpath::admin::{
    self, AdminConfig, AdminError, AdminLimits, AdminServer, AdminSource, BackendView,
    ControlAction, ControlFuture, FlowFilter, FlowTableView, FlowViewJson, FlowsPage,
    FlowsResponse, FrontendView, HealthView, ServiceView, ServicesResponse, StatsView, SyncView,
    WorkerView,
};
use tokio_util::sync::CancellationToken;

/// Bound on any single wait of a client (a failure, never a pass, reaches it).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Fake {
    pub last_sync: Mutex<SystemTime>,
    pub not_ready: Mutex<Option<String>>,
    pub controls: Mutex<Vec<(ControlAction, Option<String>)>>,
    /// While true, `flows` and `stats` block (a stuck daemon).
    pub gate: (Mutex<bool>, Condvar),
    /// Calls blocked at the gate now.
    pub stuck: AtomicUsize,
}

impl Fake {
    pub fn new() -> Arc<Fake> {
        Arc::new(Fake {
            last_sync: Mutex::new(SystemTime::now()),
            not_ready: Mutex::new(None),
            controls: Mutex::new(Vec::new()),
            gate: (Mutex::new(false), Condvar::new()),
            stuck: AtomicUsize::new(0),
        })
    }

    pub fn set_gate(&self, closed: bool) {
        *self.gate.0.lock().unwrap() = closed;
        self.gate.1.notify_all();
    }

    /// Blocks while the gate is closed (at most [`CLIENT_TIMEOUT`]: a failed test must not
    /// hang).
    pub fn pass_gate(&self) {
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

/// Flow `i` of the fake's 250: clients 198.18.0.1 (i < 200) and 198.18.2.1, backends
/// 198.18.1.1:8080 (even i) and 198.18.1.2:8080, every tenth of service `dns`, the others
/// `web`.
pub fn flow(i: u16) -> FlowViewJson {
    let client = if i < 200 {
        [198, 18, 0, 1]
    } else {
        [198, 18, 2, 1]
    };
    FlowViewJson {
        protocol: "tcp".into(),
        client: SocketAddr::from((client, 40000 + i)),
        vip: SocketAddr::from(([198, 18, 100, 1], 80)),
        backend: SocketAddr::from(([198, 18, 1, 1 + (i % 2) as u8], 8080)),
        snat: SocketAddr::from(([198, 18, 0, 254], 20000 + i)),
        service: if i % 10 == 9 { "dns" } else { "web" }.into(),
        state: "ESTABLISHED".into(),
        idle_s: 0.5,
        peer: false,
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
                    health: Some("up".into()),
                    active: 7,
                    inactive: 2,
                    stats: admin::TrafficView {
                        conns: 9,
                        in_pkts: 120,
                        out_pkts: 100,
                        in_bytes: 7_200,
                        out_bytes: 150_000,
                    },
                    rate: admin::RateView {
                        cps: 1.5,
                        in_pps: 20.0,
                        out_pps: 16.5,
                        in_bps: 1_200.0,
                        out_bps: 25_000.0,
                    },
                },
                BackendView {
                    addr: SocketAddr::from(([198, 18, 1, 2], 8080)),
                    weight: 0,
                    usable: false,
                    health: None,
                    active: 0,
                    inactive: 1,
                    stats: admin::TrafficView::default(),
                    rate: admin::RateView::default(),
                },
            ],
            frozen: false,
            rate_limit: Some(admin::RateLimitView {
                rate: 100,
                burst: 10,
            }),
            rate_limited: 5,
            stats: admin::TrafficView {
                conns: 11,
                in_pkts: 130,
                out_pkts: 104,
                in_bytes: 7_800,
                out_bytes: 150_240,
            },
            rate: admin::RateView {
                cps: 1.5,
                in_pps: 20.0,
                out_pps: 16.5,
                in_bps: 1_200.0,
                out_bps: 25_000.0,
            },
        }]
    }

    fn refused(&self) -> Vec<admin::RefusedView> {
        vec![admin::RefusedView {
            // A name from a hostile API server: JSON escapes it.
            object: "Service ns/web\nINFO forged".into(),
            kind: "service_refused".into(),
            reason: "ports[1] and ports[0] are both named \"http\"".into(),
        }]
    }

    fn flows(&self, filter: &FlowFilter, limit: usize) -> FlowsPage {
        self.pass_gate();
        let mut flows: Vec<FlowViewJson> = (0..250)
            .map(flow)
            .filter(|f| filter.matches(f.client, f.vip, f.backend, Some(&f.service)))
            .collect();
        let total_matched = flows.len() as u64;
        flows.truncate(limit);
        FlowsPage {
            flows,
            total_matched,
        }
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
                    queue: i as u32,
                    interfaces: vec!["eth0".into(), "eth1".into()],
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
            sockets: vec![admin::SocketView {
                interface: "eth0".into(),
                queue: 0,
                rx_ring_full: 17,
                rx_dropped: 2,
                rx_fill_ring_empty_descs: 5,
                filled: 4096,
                received: 4000,
                transmitted: 3990,
                completed: 3980,
                ..admin::SocketView::default()
            }],
            sync: SyncView {
                last_sync_unix_s: Some(1_700_000_000.25),
                last_duration_s: 0.004,
                syncs: 3,
                reloads_ok: 1,
                reloads_failed: 2,
                duration: sync_durations().view(),
                network_programming: programming_latencies().view(),
                service_changes_pending: 1,
                endpoint_changes_pending: 4,
                service_changes: 12,
                endpoint_changes: 40,
            },
            governance: admin::GovernanceView {
                frozen: true,
                frozen_services: vec![],
                draining: false,
                flows_resteered: 4,
                flows_ended: 6,
            },
            peer_sync: Some(admin::PeerSyncView {
                ready: true,
                peers_up: 1,
                messages_sent: 10,
                bytes_sent: 1000,
                flows_sent: 20,
                ends_sent: 5,
                messages_received: 9,
                flows_installed: 7,
                flows_updated: 3,
                flows_removed: 2,
                flows_refused: [("unknown", 1), ("conflict", 2), ("malformed", 0)]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
                messages_rejected: slowpath::flowsync::wire::Refused::ALL
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.name().to_owned(), i as u64))
                    .collect(),
                queue_dropped: 0,
                send_errors: 0,
                queued: 0,
                log_dropped: 0,
                dumps_sent: 1,
                dumps_received: 1,
                lag_us: 1500,
            }),
            bgp: Some(admin::BgpView {
                live: true,
                in_sync: true,
                vips: 2,
                snat: 1,
                backups: 1,
                writes: 3,
                reconfigures: 3,
                errors: 1,
                last_error: None,
            }),
            refused: admin::RefusedStats {
                current: [
                    ("service_refused".to_owned(), 1),
                    ("snapshot_build".to_owned(), 0),
                ]
                .into(),
                total: [
                    ("service_refused".to_owned(), 2),
                    ("snapshot_build".to_owned(), 1),
                ]
                .into(),
            },
            state: admin::StateView::default(),
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

/// The fake's sync durations: 3 syncs of 0.004 s, 0.1 s and 20 s (past the last bucket).
pub fn sync_durations() -> Histogram {
    let h = Histogram::new(&SYNC_DURATION_BUCKETS);
    for v in [0.004, 0.1, 20.0] {
        h.observe(v);
    }
    h
}

/// The fake's network programming latencies: 0.3 s, 1 s (on a bound) and 61 s.
pub fn programming_latencies() -> Histogram {
    let h = Histogram::new(&NETWORK_PROGRAMMING_BUCKETS);
    for v in [0.3, 1.0, 61.0] {
        h.observe(v);
    }
    h
}

/// A server running on a runtime of its own.
pub struct Served {
    pub rt: tokio::runtime::Runtime,
    pub token: CancellationToken,
    pub done: Option<tokio::task::JoinHandle<()>>,
    pub listen: SocketAddr,
    pub healthz: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    pub socket: Option<PathBuf>,
}

impl Served {
    pub fn start(cfg: &AdminConfig, src: Arc<dyn AdminSource>, limits: AdminLimits) -> Served {
        let server = AdminServer::bind_with(cfg, src, limits).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let token = CancellationToken::new();
        let (listen, healthz) = (server.local_addr(), server.healthz_addr());
        let metrics = server.metrics_addr();
        let socket = server.socket_path().map(Path::to_owned);
        let done = Some(rt.spawn(server.run(token.clone())));
        Served {
            rt,
            token,
            done,
            listen,
            healthz,
            metrics,
            socket,
        }
    }

    pub fn healthz(&self) -> SocketAddr {
        self.healthz.unwrap()
    }

    pub fn socket(&self) -> &Path {
        self.socket.as_deref().unwrap()
    }

    /// Cancels the token and waits for `run` to return.
    pub fn stop(mut self) {
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
pub fn tcp_config() -> AdminConfig {
    AdminConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        healthz_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        metrics_listen: None,
        socket: None,
        control_enabled: false,
    }
}

/// Like [`tcp_config`], plus a socket at `path`.
pub fn socket_config(path: &Path, control_enabled: bool) -> AdminConfig {
    AdminConfig {
        socket: Some(path.to_owned()),
        control_enabled,
        ..tcp_config()
    }
}

/// The defaults, but idle connections are kept longer than [`CLIENT_TIMEOUT`]: a server that
/// failed to close a `Connection: close` exchange would make the client time out, not pass.
pub fn patient() -> AdminLimits {
    AdminLimits {
        header_timeout: Duration::from_secs(60),
        ..AdminLimits::default()
    }
}

pub fn serve(fake: &Arc<Fake>) -> Served {
    Served::start(
        &tcp_config(),
        Arc::clone(fake) as Arc<dyn AdminSource>,
        patient(),
    )
}

pub struct Reply {
    /// `HTTP/1.1`, or `HTTP/1.0` when asked in 1.0.
    pub version: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("JSON body")
    }
}

/// Reads one response: the head, then Content-Length bytes of body (none for `head_only`).
pub fn read_reply(s: &mut impl Read, head_only: bool) -> Reply {
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
pub fn exchange<S: Read + Write>(mut s: S, raw: &str, close: bool) -> Reply {
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

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    s
}

pub fn connect_unix(path: &Path) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    s
}

/// `raw` on a new connection; the connection is dropped after the response.
pub fn request(addr: SocketAddr, raw: &str) -> Reply {
    exchange(connect(addr), raw, false)
}

pub fn get_raw(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
}

/// GET with `Connection: close`, as `xvs status` does: the server must close after answering.
pub fn get(addr: SocketAddr, path: &str) -> Reply {
    exchange(connect(addr), &get_raw(path), true)
}

pub fn unix_get(socket: &Path, path: &str) -> Reply {
    exchange(connect_unix(socket), &get_raw(path), true)
}

pub fn unix_post(socket: &Path, path: &str) -> Reply {
    let raw = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    exchange(connect_unix(socket), &raw, false)
}

pub fn post(addr: SocketAddr, path: &str) -> Reply {
    request(
        addr,
        &format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
    )
}

/// True once the peer has closed `s` (EOF or reset); false while it is open and silent.
pub fn closed_by_peer(s: &mut TcpStream) -> bool {
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
pub fn wait_closed(s: &mut TcpStream) -> bool {
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
pub fn sample(metrics: &str, line_prefix: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {line_prefix} in\n{metrics}"))
        .parse()
        .unwrap()
}
