//! The admin HTTP server under hostile or broken clients: header timeouts, the connection
//! bound, a stuck source, shutdown, and a crowd of idle and slow clients while probes and
//! scrapes must still answer.
//!
//! No assertion depends on timing except the 1 s client timeouts of the hostile-client test;
//! every other wait is a bound that only a failure reaches.

mod admin_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use slowpath::admin::{self, AdminLimits, AdminSource, FlowsResponse};

use admin_common::*;

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
