//! A service's own health check, probed against real servers on 127.0.0.1: its port, HTTP
//! path and statuses, HTTPS (a self-signed certificate made by `openssl` for another name:
//! taken, as keepalived's `SSL_GET` takes it), and its rise and fall; and two services that
//! share a backend with different checks are judged apart.

mod health_common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};

use config::ProbeKind;
use slowpath::health::{Check, HealthChecker, Judgement, Plan, Target, TargetStatus};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

use health_common::*;

type Change = (HashMap<Target, Judgement>, HashMap<Target, TargetStatus>);

/// A checker of several services, its changes by target with the status at each change.
struct Rig {
    rt: Runtime,
    hc: Arc<HealthChecker>,
    shutdown: CancellationToken,
    changes: Receiver<Change>,
    /// The last change seen: a target may have flipped while another was awaited.
    last: RefCell<Change>,
}

impl Rig {
    fn start(plan: Plan) -> Rig {
        let (tx, changes) = mpsc::channel();
        let rt = runtime();
        let shutdown = CancellationToken::new();
        let slot: Arc<std::sync::OnceLock<std::sync::Weak<HealthChecker>>> = Arc::default();
        let slot2 = Arc::clone(&slot);
        let hc = Arc::new(HealthChecker::spawn(
            rt.handle(),
            move |states| {
                let status = slot2
                    .get()
                    .and_then(std::sync::Weak::upgrade)
                    .map(|c| c.status())
                    .unwrap_or_default();
                let _ = tx.send((states, status));
            },
            shutdown.clone(),
        ));
        slot.set(Arc::downgrade(&hc)).unwrap();
        hc.set_plan(Arc::new(plan));
        Rig {
            rt,
            hc,
            shutdown,
            changes,
            last: RefCell::default(),
        }
    }

    /// The status as of the first change (the last one seen, or one to come) in which `t`
    /// is judged `j`.
    fn until(&self, t: &Target, j: Judgement) -> HashMap<Target, TargetStatus> {
        loop {
            {
                let last = self.last.borrow();
                if last.0.get(t) == Some(&j) {
                    return last.1.clone();
                }
            }
            *self.last.borrow_mut() = self
                .changes
                .recv_timeout(WAIT)
                .unwrap_or_else(|_| panic!("{t:?} never {j:?}"));
        }
    }

    fn judged(&self, service: &str, addr: SocketAddr) -> Option<Judgement> {
        self.hc.reader().judgements().get(service, addr)
    }

    fn stop(self) {
        self.shutdown.cancel();
        drop(self.changes);
        let mut hc = self.hc;
        let t0 = std::time::Instant::now();
        let hc = loop {
            match Arc::try_unwrap(hc) {
                Ok(hc) => break hc,
                Err(again) => hc = again,
            }
            assert!(t0.elapsed() < WAIT, "the checker is still referenced");
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        join_within_wait(&self.rt, hc);
    }
}

/// Probes every 30 ms, each given 5 s: on a loaded machine a slow answer is not a failure
/// (the failures these tests make are refusals and statuses, which come at once).
fn check(probe: ProbeKind, rise: u32, fall: u32) -> Check {
    cfg(probe, 30, 5_000, rise, fall)
}

#[test]
fn a_services_port_path_and_statuses_are_what_its_probes_use() {
    // The backend serves on a port that refuses connections; its health endpoint is another
    // port, /ready, and answers 204, which only the service's own status list takes.
    let refused = refusing("127.0.0.1", 1);
    let backend = refused[0].local_addr().unwrap();
    let health = HttpServer::start(204);
    let own = Check {
        port: Some(health.addr.port()),
        http_path: "/ready".to_owned(),
        http_status: vec![204],
        ..check(ProbeKind::Http, 2, 2)
    };
    // A service without a port of its own probes the backend's port (refused): judged apart.
    let plain = check(ProbeKind::Http, 2, 2);
    let rig = Rig::start(Plan::from_services([
        ("own".to_owned(), own.clone(), vec![backend]),
        ("plain".to_owned(), plain.clone(), vec![backend]),
    ]));
    let t_own = Target {
        addr: backend,
        check: Arc::new(own),
    };
    let t_plain = Target {
        addr: backend,
        check: Arc::new(plain),
    };
    rig.until(&t_own, Judgement::Up);
    let status = rig.until(&t_plain, Judgement::Down);
    assert!(
        status[&t_plain]
            .last_error
            .as_deref()
            .unwrap()
            .contains("connect"),
        "{:?}",
        status[&t_plain]
    );
    assert_eq!(rig.judged("own", backend), Some(Judgement::Up));
    assert_eq!(rig.judged("plain", backend), Some(Judgement::Down));
    assert_eq!(rig.judged("other", backend), None, "not probed");
    // Its requests: the path, to the health port (the Host says where the probe went).
    let heads = health.heads();
    assert!(!heads.is_empty());
    for h in &heads {
        assert!(h.starts_with("GET /ready HTTP/1.0\r\n"), "{h}");
        assert!(h.contains(&format!("\r\nHost: {}\r\n", health.addr)), "{h}");
    }
    // 200 is not in its list: down after exactly `fall`, naming the status.
    health.code.store(200, std::sync::atomic::Ordering::SeqCst);
    let status = rig.until(&t_own, Judgement::Down);
    assert_eq!(status[&t_own].tracker.failures, 2);
    assert_eq!(
        status[&t_own].last_error.as_deref(),
        Some("http: status 200")
    );
    health.code.store(204, std::sync::atomic::Ordering::SeqCst);
    let status = rig.until(&t_own, Judgement::Up);
    assert_eq!(status[&t_own].tracker.successes, 2);
    rig.stop();
}

#[test]
fn https_probes_speak_tls_take_any_certificate_and_judge_the_status() {
    let dir = tempfile::tempdir().unwrap();
    let tls = self_signed(dir.path());
    let secure = HttpServer::start_tls(200, Arc::clone(&tls));
    let plain = HttpServer::start(200);
    let https = Check {
        http_path: "/ready".to_owned(),
        ..check(ProbeKind::Https, 1, 2)
    };
    let http = check(ProbeKind::Http, 1, 2);
    let rig = Rig::start(Plan::from_services([
        ("secure".to_owned(), https.clone(), vec![secure.addr]),
        ("mismatch".to_owned(), https.clone(), vec![plain.addr]),
        (
            "cleartext-to-tls".to_owned(),
            http.clone(),
            vec![secure.addr],
        ),
    ]));
    let target = |c: &Check, addr| Target {
        addr,
        check: Arc::new(c.clone()),
    };
    let (t_secure, t_mismatch, t_clear) = (
        target(&https, secure.addr),
        target(&https, plain.addr),
        target(&http, secure.addr),
    );
    // A certificate for another name, from no known issuer: taken (no verification). The
    // request arrived decrypted: the server read its head.
    rig.until(&t_secure, Judgement::Up);
    assert!(
        secure
            .heads()
            .iter()
            .any(|h| h.starts_with("GET /ready HTTP/1.0\r\n")),
        "{:?}",
        secure.heads()
    );
    // TLS to a cleartext server, and cleartext to a TLS server, fail.
    let status = rig.until(&t_mismatch, Judgement::Down);
    let why = status[&t_mismatch].last_error.clone().unwrap();
    assert!(why.starts_with("https"), "{why}");
    let status = rig.until(&t_clear, Judgement::Down);
    let why = status[&t_clear].last_error.clone().unwrap();
    assert!(
        why.starts_with("http:") || why.starts_with("http read"),
        "{why}"
    );
    // The status over TLS is judged as over TCP.
    secure.code.store(503, std::sync::atomic::Ordering::SeqCst);
    let status = rig.until(&t_secure, Judgement::Down);
    assert_eq!(
        status[&t_secure].last_error.as_deref(),
        Some("https: status 503")
    );
    assert_eq!(status[&t_secure].tracker.failures, 2);
    rig.stop();
}

#[test]
fn rise_and_fall_are_each_services_own() {
    let server = TcpServer::bind("127.0.0.1:0".parse().unwrap());
    let addr = server.addr;
    let quick = check(ProbeKind::Tcp, 1, 1);
    let patient = check(ProbeKind::Tcp, 3, 4);
    let rig = Rig::start(Plan::from_services([
        ("quick".to_owned(), quick.clone(), vec![addr]),
        ("patient".to_owned(), patient.clone(), vec![addr]),
    ]));
    let (tq, tp) = (
        Target {
            addr,
            check: Arc::new(quick),
        },
        Target {
            addr,
            check: Arc::new(patient),
        },
    );
    rig.until(&tq, Judgement::Up);
    rig.until(&tp, Judgement::Up);
    // The backend goes: each falls after its own count of failures in a row.
    drop(server);
    let status = rig.until(&tq, Judgement::Down);
    assert_eq!(status[&tq].tracker.failures, 1);
    let status = rig.until(&tp, Judgement::Down);
    assert_eq!(status[&tp].tracker.failures, 4);
    // It comes back: each rises after its own count of successes in a row.
    let _server = TcpServer::bind(addr);
    let status = rig.until(&tq, Judgement::Up);
    assert_eq!(status[&tq].tracker.successes, 1);
    let status = rig.until(&tp, Judgement::Up);
    assert_eq!(status[&tp].tracker.successes, 3);
    rig.stop();
}
