//! The health checker against real sockets on 127.0.0.1, on a two-worker runtime like the
//! daemon's. Intervals are tens of milliseconds; waits are generous and only bound how long a
//! failure takes to show. Each test probes with one check (a [`Plan`] of one service) unless
//! it says otherwise, so its judgements are by backend address. The per-service settings
//! (port, path, statuses, HTTPS, rise and fall) are in `health_service.rs`.

mod health_common;

use std::collections::HashMap;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use config::ProbeKind;
use slowpath::health::{HealthChecker, Judgement, PROBES_MAX, Plan};
use tokio_util::sync::CancellationToken;

use health_common::*;

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
    assert_eq!(hc.judgements(), states, "what the admin API reads");
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
    wait_until("three 200s", || server.requests() >= 3);
    assert!(
        server
            .heads()
            .iter()
            .all(|h| h.starts_with("GET /healthz HTTP/1.0\r\n")),
        "{:?}",
        server.heads()
    );
    let (states, _) = changes.recv_timeout(WAIT).expect("verified");
    assert_eq!(states[&addr], Judgement::Up);
    assert!(changes.try_recv().is_err(), "200 is healthy");
    assert!(hc.is_up(addr));

    server.code.store(302, Ordering::SeqCst);
    let seen = server.requests();
    wait_until("three 302s", || server.requests() >= seen + 3);
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
            move |states| {
                let _alive = &alive;
                let _ = tx.send(by_addr(states));
            },
            shutdown.clone(),
        )
    };
    hc.set_plan(plan_of(
        &cfg(ProbeKind::Http, 20, 60_000, 1, 1),
        addrs.clone(),
    ));
    wait_until("PROBES_MAX probes connected", || {
        accept_all(&mut held);
        held.len() >= PROBES_MAX
    });
    // A pool that ignored its bound would show it within milliseconds; a correct one can
    // never fail here, whatever the pause.
    std::thread::sleep(Duration::from_millis(200));
    accept_all(&mut held);
    assert_eq!(held.len(), PROBES_MAX, "at most PROBES_MAX probes at once");
    let status = by_addr(hc.status());
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
            move |states| {
                let _alive = &alive;
                calls.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(by_addr(states));
            },
            shutdown.clone(),
        )
    };
    hc.set_plan(plan_of(&cfg(ProbeKind::Tcp, 10, 20, 1, 1), vec![addr]));
    let states = changes.recv_timeout(WAIT).expect("a down flip");
    assert_eq!(states, HashMap::from([(addr, Judgement::Down)]));
    // Probes keep running until the token is cancelled.
    wait_until("more probes", || {
        by_addr(hc.status())
            .get(&addr)
            .is_some_and(|s| s.checks >= 3)
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
fn a_service_without_a_check_is_not_probed() {
    // `none` in [health], nothing of its own: no target, no probe, passive reports ignored.
    let server = HttpServer::start(200);
    let addr = server.addr;
    let mut spec = fastpath::snapshot::ServiceSpec::from_config(
        &config::parse(
            "[dataplane]\nmode = \"nat\"\n[[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.1:80\" }]\n",
            "t.toml",
        )
        .unwrap(),
    );
    // The server's loopback address, which the config would refuse as a backend.
    spec[0].backends[0].addr = addr;
    let plan = Plan::of(&spec, &config::Health::default());
    assert!(
        !Plan::of(
            &spec,
            &config::Health {
                probe: ProbeKind::Tcp,
                ..config::Health::default()
            }
        )
        .is_empty(),
        "with a probe it would be"
    );
    assert!(plan.is_empty());
    let (hc, changes) = checker(&cfg(ProbeKind::Tcp, 20, 20, 1, 1));
    hc.hc.set_plan(Arc::new(plan));
    hc.report_failure(addr);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(server.requests(), 0);
    assert!(hc.status().is_empty());
    assert!(changes.try_recv().is_err());
    assert!(hc.judgements().is_empty(), "nothing probed, nothing judged");
    hc.stop();
}
