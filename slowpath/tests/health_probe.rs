//! The health checker against real sockets on 127.0.0.1. Intervals are tens of
//! milliseconds; waits are generous and only bound how long a failure takes to show.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use config::{Dur, Health, ProbeKind};
use slowpath::health::{HealthChecker, PROBE_THREADS, TargetStatus};

const WAIT: Duration = Duration::from_secs(10);

fn cfg(probe: ProbeKind, interval_ms: u64, timeout_ms: u64, rise: u32, fall: u32) -> Health {
    Health {
        probe,
        interval: Dur(Duration::from_millis(interval_ms)),
        timeout: Dur(Duration::from_millis(timeout_ms)),
        rise,
        fall,
        http_path: "/healthz".into(),
    }
}

type Change = (HashMap<SocketAddr, bool>, HashMap<SocketAddr, TargetStatus>);

/// A checker whose `on_change` reports the new states together with the checker's status at
/// that moment (the counts that caused the flip).
fn checker(c: &Health) -> (Arc<HealthChecker>, Receiver<Change>) {
    let (tx, rx) = mpsc::channel();
    let slot: Arc<OnceLock<Weak<HealthChecker>>> = Arc::default();
    let slot2 = Arc::clone(&slot);
    let hc = Arc::new(
        HealthChecker::spawn(c, move |states| {
            let status = slot2
                .get()
                .and_then(Weak::upgrade)
                .map(|c| c.status())
                .unwrap_or_default();
            let _ = tx.send((states, status));
        })
        .unwrap(),
    );
    slot.set(Arc::downgrade(&hc)).unwrap();
    (hc, rx)
}

fn stop(hc: Arc<HealthChecker>) {
    if let Ok(hc) = Arc::try_unwrap(hc) {
        hc.stop();
    }
}

/// Accepts and closes connections until stopped; dropping it closes the listener.
struct TcpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    fn bind(addr: SocketAddr) -> TcpServer {
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

/// Answers every request with the current `code`, counting requests.
struct HttpServer {
    addr: SocketAddr,
    code: Arc<AtomicU16>,
    requests: Arc<AtomicUsize>,
}

impl HttpServer {
    fn start(code: u16) -> HttpServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let code = Arc::new(AtomicU16::new(code));
        let requests = Arc::new(AtomicUsize::new(0));
        let (c2, r2) = (Arc::clone(&code), Arc::clone(&requests));
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 512];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf);
                assert!(head.starts_with("GET /healthz HTTP/1.0\r\n"), "{head}");
                r2.fetch_add(1, Ordering::SeqCst);
                let code = c2.load(Ordering::SeqCst);
                let _ = write!(
                    conn,
                    "HTTP/1.0 {code} Whatever\r\nContent-Length: 0\r\n\r\n"
                );
            }
        });
        HttpServer {
            addr,
            code,
            requests,
        }
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn tcp_backend_falls_and_rises_with_exact_counts() {
    let server = TcpServer::bind("127.0.0.1:0".parse().unwrap());
    let addr = server.addr;
    let (hc, changes) = checker(&cfg(ProbeKind::Tcp, 20, 20, 2, 3));
    hc.set_targets(vec![addr]);
    assert!(hc.is_up(addr), "a new backend starts up");
    wait_until("a few successful probes", || {
        hc.status().get(&addr).is_some_and(|s| s.checks >= 3)
    });
    assert!(hc.is_up(addr));
    assert!(changes.try_recv().is_err(), "no flip while healthy");

    // The backend goes away: connection refused.
    drop(server);
    let (states, status) = changes.recv_timeout(WAIT).expect("a down flip");
    assert_eq!(states, HashMap::from([(addr, false)]));
    let s = &status[&addr];
    assert_eq!(s.tracker.failures, 3, "down after exactly `fall` failures");
    assert!(!s.tracker.up);
    assert!(
        s.last_error.as_deref().unwrap().contains("connect"),
        "{s:?}"
    );
    assert!(!hc.is_up(addr));

    // It comes back on the same port.
    let _server = TcpServer::bind(addr);
    let (states, status) = changes.recv_timeout(WAIT).expect("an up flip");
    assert_eq!(states, HashMap::from([(addr, true)]));
    assert_eq!(
        status[&addr].tracker.successes, 2,
        "up after exactly `rise`"
    );
    assert!(hc.is_up(addr));
    stop(hc);
}

#[test]
fn http_probe_judges_the_status_code() {
    let server = HttpServer::start(200);
    let addr = server.addr;
    let (hc, changes) = checker(&cfg(ProbeKind::Http, 20, 20, 2, 2));
    hc.set_targets(vec![addr]);
    wait_until("three 200s", || server.requests.load(Ordering::SeqCst) >= 3);
    assert!(changes.try_recv().is_err(), "200 is healthy");
    assert!(hc.is_up(addr));

    server.code.store(302, Ordering::SeqCst);
    let seen = server.requests.load(Ordering::SeqCst);
    wait_until("three 302s", || {
        server.requests.load(Ordering::SeqCst) >= seen + 3
    });
    assert!(changes.try_recv().is_err(), "3xx is healthy");

    server.code.store(500, Ordering::SeqCst);
    let (states, status) = changes.recv_timeout(WAIT).expect("a down flip");
    assert!(!states[&addr]);
    assert_eq!(status[&addr].tracker.failures, 2);
    assert!(
        status[&addr]
            .last_error
            .as_deref()
            .unwrap()
            .contains("status 500")
    );

    server.code.store(204, Ordering::SeqCst);
    let (states, status) = changes.recv_timeout(WAIT).expect("an up flip");
    assert!(states[&addr]);
    assert_eq!(status[&addr].tracker.successes, 2);
    stop(hc);
}

#[test]
fn a_backend_that_never_answers_times_out() {
    // Never accepted: the kernel completes the handshake (backlog), nobody ever answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let (hc, changes) = checker(&cfg(ProbeKind::Http, 60, 40, 1, 2));
    let t0 = Instant::now();
    hc.set_targets(vec![addr]);
    let (states, status) = changes.recv_timeout(WAIT).expect("a down flip");
    assert!(!states[&addr]);
    let s = &status[&addr];
    assert_eq!(s.tracker.failures, 2);
    assert!(
        s.last_error.as_deref().unwrap().contains("timed out"),
        "{s:?}"
    );
    // Two probes of at most 40 ms each, one interval apart: far below the generous bound.
    assert!(t0.elapsed() < Duration::from_secs(5));
    stop(hc);
    drop(silent);
}

#[test]
fn passive_failures_count_like_failed_probes() {
    let server = TcpServer::bind("127.0.0.1:0".parse().unwrap());
    let addr = server.addr;
    // One probe at start, then none for a minute: only passive reports change the state.
    let (hc, changes) = checker(&cfg(ProbeKind::Tcp, 60_000, 1_000, 1, 2));
    hc.set_targets(vec![addr]);
    wait_until("the first probe", || {
        hc.status().get(&addr).is_some_and(|s| s.checks == 1)
    });
    hc.report_failure("127.0.0.1:1".parse().unwrap()); // not a target: ignored
    hc.report_failure(addr);
    wait_until("the report", || hc.status()[&addr].checks == 2);
    assert!(hc.is_up(addr));
    assert!(changes.try_recv().is_err());
    hc.report_failure(addr);
    let (states, status) = changes.recv_timeout(WAIT).expect("a down flip");
    assert!(!states[&addr]);
    assert_eq!(status[&addr].tracker.failures, 2);
    assert_eq!(status.len(), 1);
    stop(hc);
}

#[test]
fn many_backends_share_the_small_pool() {
    // More targets than probe threads, all refusing: every one is judged.
    let addrs: Vec<SocketAddr> = (0..PROBE_THREADS * 3)
        .map(|_| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap() // closed when `l` drops: refused
        })
        .collect();
    let (hc, changes) = checker(&cfg(ProbeKind::Tcp, 20, 20, 1, 1));
    hc.set_targets(addrs.clone());
    wait_until("every backend down", || {
        while changes.try_recv().is_ok() {}
        addrs.iter().all(|a| !hc.is_up(*a))
    });
    // Targets that leave are forgotten; known ones keep their state.
    hc.set_targets(addrs[..2].to_vec());
    wait_until("the smaller set", || hc.status().len() == 2);
    assert!(!hc.is_up(addrs[0]));
    assert!(hc.is_up(addrs[5]), "unknown targets count as up");
    stop(hc);
}

#[test]
fn probe_none_keeps_everyone_up() {
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let (hc, changes) = checker(&cfg(ProbeKind::None, 20, 20, 1, 1));
    hc.set_targets(vec![addr]);
    hc.report_failure(addr);
    std::thread::sleep(Duration::from_millis(100));
    assert!(hc.is_up(addr));
    assert_eq!(hc.status()[&addr].checks, 0);
    assert!(changes.try_recv().is_err());
    stop(hc);
}
