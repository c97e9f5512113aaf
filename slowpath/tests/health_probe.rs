//! The health checker against real sockets on 127.0.0.1, on a two-worker runtime like the
//! daemon's. Intervals are tens of milliseconds; waits are generous and only bound how long a
//! failure takes to show.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use config::{Dur, Health, ProbeKind};
use slowpath::health::{HealthChecker, Judgement, PROBES_MAX, TargetStatus};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

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

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

type Change = (
    HashMap<SocketAddr, Judgement>,
    HashMap<SocketAddr, TargetStatus>,
);

/// A checker on its own runtime, with its shutdown token.
struct Checker {
    rt: Runtime,
    hc: Arc<HealthChecker>,
    shutdown: CancellationToken,
}

impl std::ops::Deref for Checker {
    type Target = HealthChecker;
    fn deref(&self) -> &HealthChecker {
        &self.hc
    }
}

impl Checker {
    /// Cancels the token and joins the checker, failing the test if that takes over `WAIT`.
    fn stop(self) {
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
fn join_within_wait(rt: &Runtime, hc: HealthChecker) {
    rt.block_on(async { tokio::time::timeout(WAIT, hc.join()).await })
        .expect("the checker ends within WAIT of the cancellation");
}

/// A checker whose `on_change` reports the new states together with the checker's status at
/// that moment (the counts that caused the flip).
fn checker(c: &Health) -> (Checker, Receiver<Change>) {
    let (tx, rx) = mpsc::channel();
    let slot: Arc<OnceLock<Weak<HealthChecker>>> = Arc::default();
    let slot2 = Arc::clone(&slot);
    let rt = runtime();
    let shutdown = CancellationToken::new();
    let hc = Arc::new(HealthChecker::spawn(
        rt.handle(),
        c,
        move |states| {
            let status = slot2
                .get()
                .and_then(Weak::upgrade)
                .map(|c| c.status())
                .unwrap_or_default();
            let _ = tx.send((states, status));
        },
        shutdown.clone(),
    ));
    slot.set(Arc::downgrade(&hc)).unwrap();
    (Checker { rt, hc, shutdown }, rx)
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
    assert!(hc.is_up(addr), "a new backend starts usable");
    // Its first probe passes: unknown -> up, said at once (rise is for a comeback).
    let (states, status) = changes
        .recv_timeout(WAIT)
        .expect("the first probe's change");
    assert_eq!(states, HashMap::from([(addr, Judgement::Up)]));
    assert_eq!(status[&addr].checks, 1);
    assert_eq!(hc.reader().judgements(), states, "what the admin API reads");
    wait_until("a few successful probes", || {
        hc.status().get(&addr).is_some_and(|s| s.checks >= 3)
    });
    assert!(hc.is_up(addr));
    assert!(changes.try_recv().is_err(), "no change while healthy");

    // The backend goes away: connection refused.
    drop(server);
    let (states, status) = changes.recv_timeout(WAIT).expect("a down flip");
    assert_eq!(states, HashMap::from([(addr, Judgement::Down)]));
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
    assert_eq!(states, HashMap::from([(addr, Judgement::Up)]));
    assert_eq!(
        status[&addr].tracker.successes, 2,
        "up after exactly `rise`"
    );
    assert!(hc.is_up(addr));
    hc.stop();
}

#[test]
fn http_probe_judges_the_status_code() {
    let server = HttpServer::start(200);
    let addr = server.addr;
    let (hc, changes) = checker(&cfg(ProbeKind::Http, 20, 20, 2, 2));
    hc.set_targets(vec![addr]);
    wait_until("three 200s", || server.requests.load(Ordering::SeqCst) >= 3);
    let (states, _) = changes.recv_timeout(WAIT).expect("verified");
    assert_eq!(states[&addr], Judgement::Up);
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
    assert_eq!(states[&addr], Judgement::Down);
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
    assert_eq!(states[&addr], Judgement::Up);
    assert_eq!(status[&addr].tracker.successes, 2);
    hc.stop();
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
    assert_eq!(states[&addr], Judgement::Down, "unknown, then down");
    let s = &status[&addr];
    assert_eq!(s.tracker.failures, 2);
    assert!(
        s.last_error.as_deref().unwrap().contains("timed out"),
        "{s:?}"
    );
    // Two probes of at most 40 ms each, one interval apart: far below the generous bound.
    assert!(t0.elapsed() < Duration::from_secs(5));
    hc.stop();
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
    let (states, _) = changes.recv_timeout(WAIT).expect("verified");
    assert_eq!(states[&addr], Judgement::Up);
    hc.report_failure("127.0.0.1:1".parse().unwrap()); // not a target: ignored
    hc.report_failure(addr);
    wait_until("the report", || hc.status()[&addr].checks == 2);
    assert!(hc.is_up(addr));
    assert!(changes.try_recv().is_err());
    hc.report_failure(addr);
    let (states, status) = changes.recv_timeout(WAIT).expect("a down flip");
    assert_eq!(states[&addr], Judgement::Down);
    assert_eq!(status[&addr].tracker.failures, 2);
    assert_eq!(status.len(), 1);
    hc.stop();
}

/// `n` addresses on `ip` that refuse connections: bound, never listening, held until the
/// vector drops (so no other test's listener can take the port meanwhile).
fn refusing(ip: &str, n: usize) -> Vec<tokio::net::TcpSocket> {
    (0..n)
        .map(|_| {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.bind(SocketAddr::new(ip.parse().unwrap(), 0)).unwrap();
            s
        })
        .collect()
}

#[test]
fn many_backends_share_the_bounded_pool() {
    // More targets than probes may run at once, all refusing: every one is judged.
    let refusing = refusing("127.0.0.2", PROBES_MAX * 3);
    let addrs: Vec<SocketAddr> = refusing.iter().map(|s| s.local_addr().unwrap()).collect();
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
    assert!(
        hc.is_up(addrs[5]),
        "addresses it does not check count as usable"
    );
    hc.stop();
}

#[test]
fn a_saturated_pool_delays_probes_and_cancelling_aborts_them() {
    // Twice as many targets as permits, each a listener that completes handshakes (kernel
    // backlog) and never answers: every HTTP probe hangs for its 60 s timeout. Its own
    // loopback address keeps other tests' probes away from these ports.
    let listeners: Vec<TcpListener> = (0..PROBES_MAX * 2)
        .map(|_| {
            let l = TcpListener::bind("127.0.0.3:0").unwrap();
            l.set_nonblocking(true).unwrap();
            l
        })
        .collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut held: Vec<TcpStream> = Vec::new();
    let accept_all = |held: &mut Vec<TcpStream>| {
        for l in &listeners {
            while let Ok((c, _)) = l.accept() {
                held.push(c);
            }
        }
    };
    let alive = Arc::new(());
    let (tx, changes) = mpsc::channel();
    let rt = runtime();
    let shutdown = CancellationToken::new();
    let hc = {
        let alive = Arc::clone(&alive);
        HealthChecker::spawn(
            rt.handle(),
            &cfg(ProbeKind::Http, 20, 60_000, 1, 1),
            move |states| {
                let _alive = &alive;
                let _ = tx.send(states);
            },
            shutdown.clone(),
        )
    };
    hc.set_targets(addrs.clone());
    wait_until("PROBES_MAX probes connected", || {
        accept_all(&mut held);
        held.len() >= PROBES_MAX
    });
    // A pool that ignored its bound would show it within milliseconds; a correct one can
    // never fail here, whatever the pause.
    std::thread::sleep(Duration::from_millis(200));
    accept_all(&mut held);
    assert_eq!(held.len(), PROBES_MAX, "at most PROBES_MAX probes at once");
    let status = hc.status();
    assert_eq!(status.len(), addrs.len());
    assert!(status.values().all(|s| s.checks == 0), "none has finished");

    // Cancelling ends the checker without waiting for the probes' timeouts.
    shutdown.cancel();
    join_within_wait(&rt, hc);
    assert_eq!(Arc::strong_count(&alive), 1, "on_change is dropped by join");
    assert_eq!(changes.try_recv(), Err(mpsc::TryRecvError::Disconnected));
    // The aborted probes closed their connections, and no probe started after join.
    for c in &mut held {
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        let mut request = Vec::new();
        match c.read_to_end(&mut request) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
    accept_all(&mut held);
    assert_eq!(held.len(), PROBES_MAX);
}

#[test]
fn a_target_that_comes_back_waits_for_its_running_probe() {
    // Never answers: the probe hangs until its connection is closed.
    let l = TcpListener::bind("127.0.0.4:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let mut held: Vec<TcpStream> = Vec::new();
    let accept = |held: &mut Vec<TcpStream>| {
        while let Ok((c, _)) = l.accept() {
            held.push(c);
        }
    };
    let (hc, _changes) = checker(&cfg(ProbeKind::Http, 10, 60_000, 1, 1));
    hc.set_targets(vec![addr]);
    wait_until("the first probe", || {
        accept(&mut held);
        !held.is_empty()
    });
    // It leaves and comes back while its probe still runs.
    hc.set_targets(vec![]);
    hc.set_targets(vec![addr]);
    wait_until("the comeback", || hc.status().contains_key(&addr));
    // A second probe would show within milliseconds; a correct checker never starts one.
    std::thread::sleep(Duration::from_millis(200));
    accept(&mut held);
    assert_eq!(held.len(), 1, "never two probes of one backend at once");
    // The old probe ends (no status line); its outcome is not the comeback's.
    held.clear();
    wait_until("the comeback's own probe", || {
        accept(&mut held);
        !held.is_empty()
    });
    assert_eq!(
        hc.status()[&addr].checks,
        0,
        "the old probe's outcome is dropped"
    );
    hc.stop();
}

#[test]
fn cancelling_ends_the_checker_and_drops_its_callback() {
    let refusing = refusing("127.0.0.2", 1);
    let addr = refusing[0].local_addr().unwrap();
    let alive = Arc::new(());
    let calls = Arc::new(AtomicUsize::new(0));
    let (tx, changes) = mpsc::channel();
    let rt = runtime();
    let shutdown = CancellationToken::new();
    let hc = {
        let (alive, calls) = (Arc::clone(&alive), Arc::clone(&calls));
        HealthChecker::spawn(
            rt.handle(),
            &cfg(ProbeKind::Tcp, 10, 20, 1, 1),
            move |states| {
                let _alive = &alive;
                calls.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(states);
            },
            shutdown.clone(),
        )
    };
    hc.set_targets(vec![addr]);
    let states = changes.recv_timeout(WAIT).expect("a down flip");
    assert_eq!(states, HashMap::from([(addr, Judgement::Down)]));
    // Probes keep running until the token is cancelled.
    wait_until("more probes", || {
        hc.status().get(&addr).is_some_and(|s| s.checks >= 3)
    });
    shutdown.cancel();
    join_within_wait(&rt, hc);
    let seen = calls.load(Ordering::SeqCst);
    assert_eq!(Arc::strong_count(&alive), 1, "on_change is dropped by join");
    assert_eq!(
        changes.recv_timeout(Duration::from_millis(100)),
        Err(RecvTimeoutError::Disconnected)
    );
    assert_eq!(calls.load(Ordering::SeqCst), seen, "no call after join");
    assert_eq!(seen, 1, "one flip, one call");
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
    assert!(
        hc.reader().judgements().is_empty(),
        "nothing probed, nothing judged"
    );
    hc.stop();
}
