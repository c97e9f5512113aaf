//! The status commands against a fake admin API (a thread serving canned answers).

use super::*;
use std::io::Read;
use std::net::TcpListener;
use std::thread::JoinHandle;

use slowpath::admin::{
    BackendView, FlowViewJson, FrontendView, RateView, ServiceView, TrafficView, WorkerView,
};

const TEXT: Output = Output {
    json: false,
    exact: false,
};
const EXACT: Output = Output {
    json: false,
    exact: true,
};
const JSON: Output = Output {
    json: true,
    exact: false,
};

/// Serves `n` connections: each gets `(status, body)` of the first route whose path
/// prefix matches the request target, 404 otherwise. Returns the address.
fn server(routes: Vec<(&'static str, u16, String)>, n: usize) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        for conn in l.incoming().take(n) {
            let mut conn = conn.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let k = conn.read(&mut chunk).unwrap();
                if k == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..k]);
            }
            let head = String::from_utf8_lossy(&buf);
            let target = head.split(' ').nth(1).unwrap_or("").to_owned();
            let (code, body) = routes
                .iter()
                .find(|(p, _, _)| target.starts_with(p))
                .map(|(_, c, b)| (*c, b.clone()))
                .unwrap_or((404, "{\"error\":\"no such endpoint\"}".into()));
            let _ = write!(
                conn,
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (addr, t)
}

fn services() -> ServicesResponse {
    ServicesResponse {
        services: vec![ServiceView {
            name: "web".into(),
            frontends: vec![FrontendView {
                vip: [198, 18, 100, 1].into(),
                port: 80,
                protocol: "tcp".into(),
            }],
            scheduler: "wrr".into(),
            mode: "fullnat".into(),
            affinity_timeout_s: Some(10800),
            backends: vec![BackendView {
                addr: "198.18.1.1:8080".parse().unwrap(),
                weight: 4,
                usable: true,
                health: None,
                active: 12,
                inactive: 3,
                stats: TrafficView {
                    conns: 5,
                    in_pkts: 100,
                    out_pkts: 80,
                    in_bytes: 6_000,
                    out_bytes: 96_000,
                },
                rate: RateView {
                    cps: 2.5,
                    in_pps: 50.0,
                    out_pps: 40.0,
                    in_bps: 3_000.0,
                    out_bps: 48_000.0,
                },
            }],
            frozen: true,
            rate_limit: Some(slowpath::admin::RateLimitView {
                rate: 100,
                burst: 20,
            }),
            rate_limited: 7,
            stats: TrafficView {
                conns: 6,
                in_pkts: 101,
                out_pkts: 81,
                in_bytes: 6_060,
                out_bytes: 96_060,
            },
            rate: RateView::default(),
        }],
        refused: Vec::new(),
    }
}

#[test]
fn unreachable_is_a_clear_error() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let e = run(StatusCmd::Status, &Endpoint::Tcp(addr), TEXT).unwrap_err();
    assert_eq!(
        e,
        Failure::Runtime(format!(
            "cannot reach the xvs admin API at {addr}: connection refused — is xvs running? (its [admin] listen address)"
        ))
    );
    assert_eq!(
        main(
            StatusCmd::Services(ServicesShow::Connections),
            &Endpoint::Tcp(addr),
            TEXT
        ),
        ExitCode::FAILURE
    );
}

#[test]
fn services_table_and_json() {
    let body = serde_json::to_string(&services()).unwrap();
    let (addr, t) = server(vec![("/v1/services", 200, body.clone())], 2);
    let (out, ok) = run(
        StatusCmd::Services(ServicesShow::Connections),
        &Endpoint::Tcp(addr),
        TEXT,
    )
    .unwrap();
    assert!(ok);
    assert!(
        out.starts_with("web  198.18.100.1:80/tcp  wrr fullnat  affinity 10800s  limit 100/s burst 20 (7 refused)  FROZEN\n"),
        "{out}"
    );
    assert!(
        out.contains("  BACKEND          WEIGHT  USABLE  ACTIVE  INACTIVE\n"),
        "{out}"
    );
    assert!(
        out.contains("  198.18.1.1:8080  4       yes     12      3\n"),
        "{out}"
    );
    let (raw, _) = run(
        StatusCmd::Services(ServicesShow::Connections),
        &Endpoint::Tcp(addr),
        JSON,
    )
    .unwrap();
    assert_eq!(raw, body);
    t.join().unwrap();
}

fn one_flow() -> FlowViewJson {
    FlowViewJson {
        protocol: "udp".into(),
        client: "198.18.0.1:5353".parse().unwrap(),
        vip: "198.18.100.1:53".parse().unwrap(),
        backend: "198.18.1.1:53".parse().unwrap(),
        snat: "198.18.0.254:20001".parse().unwrap(),
        service: "dns".into(),
        state: "UDP".into(),
        idle_s: 1.25,
        peer: false,
    }
}

#[test]
fn services_stats_and_rates_like_ipvsadm() {
    let body = serde_json::to_string(&services()).unwrap();
    let (addr, t) = server(vec![("/v1/services", 200, body)], 4);
    let ask = |show, out| {
        run(StatusCmd::Services(show), &Endpoint::Tcp(addr), out)
            .unwrap()
            .0
    };
    // Columns split on two spaces: a scaled cell has one inside ("6.0 kB").
    let cells = |out: &str, i: usize| -> Vec<String> {
        let line = out.lines().nth(i).unwrap();
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let out = ask(ServicesShow::Stats, EXACT);
    assert_eq!(
        cells(&out, 1),
        [
            "BACKEND", "CONNS", "INPKTS", "OUTPKTS", "INBYTES", "OUTBYTES"
        ],
        "{out}"
    );
    assert_eq!(
        cells(&out, 2),
        ["198.18.1.1:8080", "5", "100", "80", "6000", "96000"],
        "{out}"
    );
    assert_eq!(
        cells(&out, 3),
        ["(service)", "6", "101", "81", "6060", "96060"],
        "{out}"
    );
    let out = ask(ServicesShow::Stats, TEXT);
    assert_eq!(
        cells(&out, 2),
        ["198.18.1.1:8080", "5", "100", "80", "6.0 kB", "96.0 kB"],
        "{out}"
    );
    assert_eq!(
        cells(&out, 3),
        ["(service)", "6", "101", "81", "6.1 kB", "96.1 kB"],
        "{out}"
    );
    // Rates: traffic in bits per second (the API's in_bps is bytes per second, as IPVS's).
    let out = ask(ServicesShow::Rate, EXACT);
    assert_eq!(
        cells(&out, 1),
        [
            "BACKEND",
            "CONNS/S",
            "INPKTS/S",
            "OUTPKTS/S",
            "INBIT/S",
            "OUTBIT/S"
        ],
        "{out}"
    );
    assert_eq!(
        cells(&out, 2),
        ["198.18.1.1:8080", "2.5", "50", "40", "24000", "384000"],
        "{out}"
    );
    let out = ask(ServicesShow::Rate, TEXT);
    assert_eq!(
        cells(&out, 2),
        [
            "198.18.1.1:8080",
            "2.5",
            "50",
            "40",
            "24.0 kbit/s",
            "384 kbit/s"
        ],
        "{out}"
    );
    t.join().unwrap();
}

/// Scaled numbers: SI prefixes, three digits at most, rounding that carries into the next
/// prefix; exact ones as given.
#[test]
fn numbers_scale() {
    let scaled = render::Num { exact: false };
    let exact = render::Num { exact: true };
    for (n, want) in [
        (0, "0"),
        (999, "999"),
        (1000, "1.0k"),
        (1234, "1.2k"),
        (12_345, "12.3k"),
        (123_456, "123k"),
        (999_499, "999k"),
        (999_500, "1.0M"),
        (1_234_567, "1.2M"),
        (3_400_000_000, "3.4G"),
        (u64::MAX, "18.4E"),
    ] {
        assert_eq!(scaled.count(n), want, "{n}");
        assert_eq!(exact.count(n), n.to_string());
    }
    assert_eq!(scaled.bytes(512), "512 B");
    assert_eq!(scaled.bytes(1_500_000), "1.5 MB");
    assert_eq!(scaled.bits_per_s(425_000_000.0), "3.4 Gbit/s");
    assert_eq!(exact.bits_per_s(425_000_000.0), "3400000000");
    assert_eq!(scaled.per_s(2.5), "2.5");
    assert_eq!(scaled.per_s(12.5), "12");
    assert_eq!(exact.per_s(1234.5678), "1234.57");
    assert_eq!(scaled.per_s(f64::NAN), "0");
}

#[test]
fn flows_table() {
    let flows = FlowsResponse {
        limit: 1,
        flows: vec![one_flow()],
        total_matched: 123_456,
        truncated: true,
    };
    let (addr, t) = server(
        vec![(
            "/v1/flows?limit=1",
            200,
            serde_json::to_string(&flows).unwrap(),
        )],
        1,
    );
    let cmd = StatusCmd::Flows {
        limit: 1,
        filter: FlowQuery::default(),
    };
    let (out, _) = run(cmd, &Endpoint::Tcp(addr), TEXT).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("PROTO  CLIENT"), "{out}");
    assert!(lines[1].starts_with("udp    198.18.0.1:5353"), "{out}");
    assert!(lines[1].ends_with("UDP    1.2s  dns"), "{out}");
    assert_eq!(
        lines[2],
        "showing 1 of 123456 flows; use --limit (at most 10000) or narrow the filters"
    );
    t.join().unwrap();
}

#[test]
fn flows_filters_go_to_the_server_and_bad_ones_name_the_option() {
    let flows = FlowsResponse {
        limit: 5,
        flows: vec![one_flow()],
        total_matched: 1,
        truncated: false,
    };
    let (addr, t) = server(
        vec![(
            "/v1/flows?limit=5&service=kube-system%2Fkube-dns%3Adns&backend=198.18.1.1%3A53&client=198.18.0.0%2F24&vip=%5B2001%3A2%3A%3A53%5D%3A53",
            200,
            serde_json::to_string(&flows).unwrap(),
        )],
        1,
    );
    let filter = FlowQuery {
        service: Some("kube-system/kube-dns:dns".into()),
        backend: Some("198.18.1.1:53".into()),
        client: Some("198.18.0.0/24".into()),
        vip: Some("[2001:2::53]:53".into()),
    };
    let cmd = StatusCmd::Flows { limit: 5, filter };
    let (out, _) = run(cmd, &Endpoint::Tcp(addr), TEXT).unwrap();
    assert!(
        out.ends_with("\n1 flows shown (all that matched)\n"),
        "{out}"
    );
    t.join().unwrap();

    // Refused before any request (nothing listens there).
    let nowhere = Endpoint::Tcp("127.0.0.1:9".parse().unwrap());
    for (filter, want) in [
        (
            FlowQuery {
                backend: Some("198.18.1".into()),
                ..FlowQuery::default()
            },
            "flows: --backend: \"198.18.1\" is not an IP address or IP:PORT",
        ),
        (
            FlowQuery {
                client: Some("198.18.0.0/99".into()),
                ..FlowQuery::default()
            },
            "flows: --client: prefix \"99\" is not 0 to 32",
        ),
    ] {
        let e = run(StatusCmd::Flows { limit: 5, filter }, &nowhere, TEXT).unwrap_err();
        assert_eq!(e, Failure::Usage(want.to_owned()), "exit 2");
    }
}

#[test]
fn status_reports_health_and_counters() {
    let stats = StatsView {
        generation: 7,
        workers: vec![WorkerView {
            index: 0,
            rx: 1000,
            tx: 990,
            drops: [
                ("no_service".to_owned(), 10),
                ("bad_checksum".to_owned(), 0),
            ]
            .into_iter()
            .collect(),
            ..WorkerView::default()
        }],
        ..StatsView::default()
    };
    let healthy = r#"{"lastUpdated":"2024-05-01T12:34:56.789Z","currentTime":"2024-05-01T12:34:57.000Z","nodeEligible":true,"fastpathRunning":true}"#;
    let sick = r#"{"lastUpdated":"","currentTime":"2024-05-01T12:34:57.000Z","nodeEligible":true,"fastpathRunning":false,"reason":"fastpath workers are not running"}"#;
    let s = serde_json::to_string(&stats).unwrap();
    let (addr, t) = server(
        vec![
            ("/healthz", 200, healthy.into()),
            ("/v1/stats", 200, s.clone()),
        ],
        6,
    );
    let (out, ok) = run(StatusCmd::Status, &Endpoint::Tcp(addr), TEXT).unwrap();
    assert!(ok);
    assert!(
        out.starts_with(&format!("xvs at {addr}: healthy\n")),
        "{out}"
    );
    assert!(out.contains("generation 7"), "{out}");
    assert!(out.contains("\nworkers (frames):\n"), "{out}");
    assert!(out.contains("  0       1.0k  990"), "{out}");
    assert!(out.contains("  no_service  10\n"), "{out}");
    assert!(
        !out.contains("bad_checksum"),
        "zero drops are not listed: {out}"
    );
    let (out, _) = run(StatusCmd::Status, &Endpoint::Tcp(addr), EXACT).unwrap();
    assert!(out.contains("  0       1000  990"), "{out}");
    let (raw, _) = run(StatusCmd::Status, &Endpoint::Tcp(addr), JSON).unwrap();
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v["healthz"]["status"], 200);
    assert_eq!(v["stats"]["generation"], 7);
    t.join().unwrap();

    let (addr, t) = server(
        vec![("/healthz", 503, sick.into()), ("/v1/stats", 200, s)],
        2,
    );
    let (out, ok) = run(StatusCmd::Status, &Endpoint::Tcp(addr), TEXT).unwrap();
    assert!(!ok, "unhealthy: exit 1");
    assert!(
        out.contains("UNHEALTHY (503): fastpath workers are not running"),
        "{out}"
    );
    t.join().unwrap();
}

#[test]
fn error_answers_are_reported() {
    let (addr, t) = server(vec![], 1);
    let e = run(
        StatusCmd::Services(ServicesShow::Connections),
        &Endpoint::Tcp(addr),
        TEXT,
    )
    .unwrap_err();
    assert!(
        matches!(&e, Failure::Runtime(m) if m.contains("answered 404 to GET /v1/services: no such endpoint")),
        "{e}"
    );
    t.join().unwrap();
}

/// Answers one connection with `answer` after reading the request head.
fn raw_server(answer: &'static [u8]) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut conn, _) = l.accept().unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        }
        let _ = conn.write_all(answer);
    });
    (addr, t)
}

#[test]
fn content_length_bounds_the_body_and_garbage_is_malformed() {
    let drain = StatusCmd::Control {
        action: "drain",
        service: None,
    };
    let (addr, t) = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}xx");
    let (body, _) = run(drain.clone(), &Endpoint::Tcp(addr), JSON).unwrap();
    assert_eq!(body, "{}", "the body ends where Content-Length says");
    t.join().unwrap();
    for garbage in [
        &b"garbage\r\n\r\n"[..],
        b"",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}",
    ] {
        let (addr, t) = raw_server(garbage);
        let e = run(drain.clone(), &Endpoint::Tcp(addr), JSON).unwrap_err();
        assert!(
            matches!(&e, Failure::Runtime(m) if m.starts_with(&format!("malformed HTTP response from {addr} to POST /v1/drain"))),
            "{:?}: {e}",
            String::from_utf8_lossy(garbage)
        );
        t.join().unwrap();
    }
}

/// Answers one connection on a unix socket with `(code, body)`; returns the request
/// line it got.
fn unix_server(path: &std::path::Path, code: u16, body: &'static str) -> JoinHandle<String> {
    let l = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut conn, _) = l.accept().unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let k = conn.read(&mut chunk).unwrap();
            if k == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..k]);
        }
        let _ = write!(
            conn,
            "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        String::from_utf8_lossy(&buf)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned()
    })
}

#[test]
fn control_commands_go_to_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("xvs.sock");
    let t = unix_server(&sock, 200, "{\"ok\":true}");
    let ep = Endpoint::Unix(sock.clone());
    let freeze = StatusCmd::Control {
        action: "freeze",
        service: Some("ns/web:http".into()),
    };
    let (out, ok) = run(freeze.clone(), &ep, TEXT).unwrap();
    assert!(ok);
    assert_eq!(out, "freeze: service ns/web:http: ok\n");
    assert_eq!(
        t.join().unwrap(),
        "POST /v1/freeze?service=ns%2Fweb%3Ahttp HTTP/1.1"
    );
    // A refusal is an error with the server's reason.
    std::fs::remove_file(&sock).unwrap();
    let t = unix_server(
        &sock,
        403,
        "{\"error\":\"control endpoints are disabled; set [admin] enable_control = true\"}",
    );
    let e = run(freeze, &ep, TEXT).unwrap_err();
    assert!(
        matches!(&e, Failure::Runtime(m) if m.contains("answered 403 to POST /v1/freeze?service=ns%2Fweb%3Ahttp: control endpoints are disabled")),
        "{e}"
    );
    t.join().unwrap();
    // No server: says which socket and which key.
    std::fs::remove_file(&sock).unwrap();
    let drain = StatusCmd::Control {
        action: "drain",
        service: None,
    };
    let e = run(drain, &ep, TEXT).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "cannot reach the xvs admin API at unix:{}: no such socket — is xvs running? (its [admin] socket)",
            sock.display()
        )
    );
}

#[test]
fn endpoint_choice() {
    let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
    assert_eq!(Endpoint::choose(Some(a), None), Endpoint::Tcp(a));
    assert_eq!(
        Endpoint::choose(None, Some("/x.sock".into())),
        Endpoint::Unix("/x.sock".into())
    );
}

#[test]
fn the_flow_table_line_counts_entries_when_ipv6_flows_take_two() {
    let line = |flows: u64, entries: u64| {
        let mut stats = StatsView::default();
        stats.flowtable.flows = flows;
        stats.flowtable.entries = entries;
        stats.flowtable.capacity = 1000;
        let out = render_status(
            &Endpoint::Tcp("198.18.0.1:9100".parse().unwrap()),
            200,
            &serde_json::from_str::<slowpath::admin::HealthzBody>(
                r#"{"lastUpdated":"","currentTime":"","fastpathRunning":true}"#,
            )
            .unwrap(),
            &stats,
            SystemTime::now(),
            true,
        );
        out.lines()
            .find(|l| l.starts_with("flow table:"))
            .unwrap()
            .to_owned()
    };
    // IPv4 only: flows are entries, the line as it always was.
    assert!(line(250, 250).starts_with("flow table: 250 / 1000 flows (25.0%), "));
    // 250 IPv6 flows of 400: 650 entries, 65 % full.
    assert!(
        line(400, 650).starts_with(
            "flow table: 400 / 1000 flows (65.0%, 650 entries with IPv6 flows' second), "
        ),
        "{}",
        line(400, 650)
    );
    // An older xvs's JSON has no entries: its flows.
    assert!(line(300, 0).starts_with("flow table: 300 / 1000 flows (30.0%), "));
}
