//! What the health checker's tests share: a checker on a runtime of its own that probes with
//! one check (its judgements by backend address), and real backends on 127.0.0.x: TCP
//! listeners, HTTP servers and HTTPS servers (a self-signed certificate `openssl` makes).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use config::ProbeKind;
use slowpath::health::{Check, HealthChecker, Judgement, Plan, Target, TargetStatus};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

pub const WAIT: Duration = Duration::from_secs(10);

/// A check with these settings, on the backend's own port, `GET /healthz`, any 2xx or 3xx.
pub fn cfg(probe: ProbeKind, interval_ms: u64, timeout_ms: u64, rise: u32, fall: u32) -> Check {
    Check {
        probe,
        port: None,
        http_path: "/healthz".into(),
        http_status: Vec::new(),
        rise,
        fall,
        interval: Duration::from_millis(interval_ms),
        timeout: Duration::from_millis(timeout_ms),
    }
}

/// One service, `svc`, probed with `c`.
pub fn plan_of(c: &Check, addrs: Vec<SocketAddr>) -> Arc<Plan> {
    Arc::new(Plan::from_services([("svc".to_owned(), c.clone(), addrs)]))
}

/// A map by target as one by backend address (the tests' plans have one check).
pub fn by_addr<V>(m: HashMap<Target, V>) -> HashMap<SocketAddr, V> {
    let n = m.len();
    let out: HashMap<SocketAddr, V> = m.into_iter().map(|(t, v)| (t.addr, v)).collect();
    assert_eq!(out.len(), n, "one check per test");
    out
}

pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub type Change = (
    HashMap<SocketAddr, Judgement>,
    HashMap<SocketAddr, TargetStatus>,
);

/// A checker on its own runtime, with its shutdown token, probing with one check.
pub struct Checker {
    pub rt: Runtime,
    pub hc: Arc<HealthChecker>,
    pub shutdown: CancellationToken,
    pub check: Check,
}

impl Checker {
    /// Probes `addrs` with the checker's check.
    pub fn set_targets(&self, addrs: Vec<SocketAddr>) {
        self.hc.set_plan(plan_of(&self.check, addrs));
    }

    pub fn status(&self) -> HashMap<SocketAddr, TargetStatus> {
        by_addr(self.hc.status())
    }

    pub fn is_up(&self, addr: SocketAddr) -> bool {
        self.hc.is_up(&Target {
            addr,
            check: Arc::new(self.check.clone()),
        })
    }

    pub fn report_failure(&self, addr: SocketAddr) {
        self.hc.report_failure(addr);
    }

    /// What the admin API reads, by address.
    pub fn judgements(&self) -> HashMap<SocketAddr, Judgement> {
        by_addr(self.hc.reader().judgements().states)
    }

    /// Cancels the token and joins the checker, failing the test if that takes over `WAIT`.
    pub fn stop(self) {
        self.shutdown.cancel();
        // `on_change` may hold a strong reference for a moment (see `checker`).
        let t0 = Instant::now();
        let mut hc = self.hc;
        let hc = loop {
            match Arc::try_unwrap(hc) {
                Ok(hc) => break hc,
                Err(again) => hc = again,
            }
            assert!(t0.elapsed() < WAIT, "the checker is still referenced");
            std::thread::sleep(Duration::from_millis(1));
        };
        join_within_wait(&self.rt, hc);
    }
}

/// Joins `hc`, failing the test if it takes over `WAIT`.
pub fn join_within_wait(rt: &Runtime, hc: HealthChecker) {
    rt.block_on(async { tokio::time::timeout(WAIT, hc.join()).await })
        .expect("the checker ends within WAIT of the cancellation");
}

/// A checker whose `on_change` reports the new states together with the checker's status at
/// that moment (the counts that caused the flip), both by address.
pub fn checker(c: &Check) -> (Checker, Receiver<Change>) {
    let (tx, rx) = mpsc::channel();
    let slot: Arc<OnceLock<Weak<HealthChecker>>> = Arc::default();
    let slot2 = Arc::clone(&slot);
    let rt = runtime();
    let shutdown = CancellationToken::new();
    let hc = Arc::new(HealthChecker::spawn(
        rt.handle(),
        move |states| {
            let status = slot2
                .get()
                .and_then(Weak::upgrade)
                .map(|c| c.status())
                .unwrap_or_default();
            let _ = tx.send((by_addr(states), by_addr(status)));
        },
        shutdown.clone(),
    ));
    slot.set(Arc::downgrade(&hc)).unwrap();
    let checker = Checker {
        rt,
        hc,
        shutdown,
        check: c.clone(),
    };
    (checker, rx)
}

pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Accepts and closes connections until stopped; dropping it closes the listener.
pub struct TcpServer {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    pub fn bind(addr: SocketAddr) -> TcpServer {
        let l = TcpListener::bind(addr).unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((c, _)) => drop(c),
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        TcpServer {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers every request with the current `code` (over TLS when started so), keeping each
/// request's head; a thread per connection. Runs until the test process ends.
pub struct HttpServer {
    pub addr: SocketAddr,
    pub code: Arc<AtomicU16>,
    pub heads: Arc<Mutex<Vec<String>>>,
}

impl HttpServer {
    /// Plain HTTP on 127.0.0.1.
    pub fn start(code: u16) -> HttpServer {
        HttpServer::start_on("127.0.0.1:0", code, None)
    }

    /// HTTPS with `tls` (see [`self_signed`]) on 127.0.0.1.
    pub fn start_tls(code: u16, tls: Arc<rustls::ServerConfig>) -> HttpServer {
        HttpServer::start_on("127.0.0.1:0", code, Some(tls))
    }

    pub fn start_on(addr: &str, code: u16, tls: Option<Arc<rustls::ServerConfig>>) -> HttpServer {
        let l = TcpListener::bind(addr).unwrap();
        let addr = l.local_addr().unwrap();
        let code = Arc::new(AtomicU16::new(code));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (c2, h2) = (Arc::clone(&code), Arc::clone(&heads));
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let (code, heads, tls) = (Arc::clone(&c2), Arc::clone(&h2), tls.clone());
                // A connection of its own: a slow or aborted probe holds up no other.
                std::thread::spawn(move || match tls {
                    None => serve(conn, &code, &heads),
                    Some(cfg) => {
                        let Ok(sc) = rustls::ServerConnection::new(cfg) else {
                            return;
                        };
                        let mut s = rustls::StreamOwned::new(sc, conn);
                        serve(&mut s, &code, &heads);
                        s.conn.send_close_notify();
                        let _ = s.flush();
                    }
                });
            }
        });
        HttpServer { addr, code, heads }
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.heads.lock().unwrap().len()
    }

    /// Every request head so far.
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// Reads one request head from `conn`, keeps it, answers with `code`.
fn serve(mut conn: impl Read + Write, code: &AtomicU16, heads: &Mutex<Vec<String>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    heads
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(&buf).into_owned());
    let code = code.load(Ordering::SeqCst);
    let _ = write!(
        conn,
        "HTTP/1.0 {code} Whatever\r\nContent-Length: 0\r\n\r\n"
    );
    let _ = conn.flush();
}

/// A TLS server config with a fresh self-signed ECDSA certificate for `backend.test` (no IP
/// address, an unknown issuer: nothing a verifying client would take), made with `openssl`
/// in `dir`.
pub fn self_signed(dir: &Path) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let o = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .arg("ec_paramgen_curve:prime256v1")
        .args([
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=backend.test",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (scripts/deps installs it)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let chain = vec![CertificateDer::from_pem_file(&cert).unwrap()];
    let key = PrivateKeyDer::from_pem_file(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    Arc::new(cfg)
}

/// `n` addresses on `ip` that refuse connections: bound, never listening, held until the
/// vector drops (so no other test's listener can take the port meanwhile).
pub fn refusing(ip: &str, n: usize) -> Vec<tokio::net::TcpSocket> {
    (0..n)
        .map(|_| {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.bind(SocketAddr::new(ip.parse().unwrap(), 0)).unwrap();
            s
        })
        .collect()
}
