//! The admin HTTP API end to end: its routes, bodies, exposures and socket (the server's
//! robustness against slow, idle and many clients is in `admin_robust.rs`).
//!
//! No assertion depends on timing; every wait is a bound that only a failure reaches.

mod admin_common;

use std::collections::HashSet;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use slowpath::admin::{
    self, AdminConfig, AdminError, AdminServer, AdminSource, ControlAction, FlowFilter, FlowsPage,
    FlowsResponse, HealthView, ServiceView, ServicesResponse, StatsView,
};

use admin_common::*;

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
    // A probed backend says what the checks judged; an unprobed one says nothing.
    assert_eq!(j["services"][0]["backends"][0]["health"], "up");
    assert!(j["services"][0]["backends"][1].get("health").is_none());
    // What the sources and the builder refuse, with the reason.
    assert_eq!(parsed.refused, fake.refused());
    assert_eq!(j["refused"][0]["object"], "Service ns/web\nINFO forged");
    assert_eq!(j["refused"][0]["kind"], "service_refused");
    assert!(!r.body.contains("web\nINFO"), "a raw newline in the body");

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
    assert_eq!((f.total_matched, f.truncated), (250, false));
    let j = get(addr, "/v1/flows?limit=7").json();
    assert_eq!(
        (j["total_matched"].as_u64(), j["truncated"].as_bool()),
        (Some(250), Some(true))
    );

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
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(helped.contains(name), "TYPE before HELP: {line}");
            assert!(typed.insert(name.to_owned()), "TYPE twice: {name}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "counter name: {name}");
            }
            continue;
        }
        let (name, labels, value) = parse_sample(line);
        assert!(
            name.starts_with("xvs_") || name.starts_with("process_"),
            "{line}"
        );
        // A histogram's samples are its family's name with a suffix.
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
            .map_or_else(|| name.clone(), str::to_owned);
        assert!(typed.contains(&family), "sample before its TYPE: {line}");
        assert!(value.is_finite(), "{line}");
        if name == "xvs_backend_connections" {
            assert_eq!(
                labels[0],
                ("service".to_owned(), "ns/we\"b\\x:80".to_owned())
            );
        }
        sampled.insert(family);
    }
    assert_eq!(helped, typed);

    let has = |needle: &str| assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    has("xvs_drops_total{reason=\"no_service\"} 6\n");
    has("xvs_rx_packets_total{worker=\"1\",interface=\"eth0,eth1\",queue=\"1\"} 101\n");
    has("xvs_tx_packets_total{worker=\"0\",interface=\"eth0,eth1\",queue=\"0\"} 90\n");
    has(
        "xvs_backend_connections{service=\"ns/we\\\"b\\\\x:80\",backend=\"198.18.1.1:8080\",state=\"active\"} 7\n",
    );
    has(
        "xvs_backend_connections{service=\"ns/we\\\"b\\\\x:80\",backend=\"198.18.1.2:8080\",state=\"inactive\"} 1\n",
    );
    has("xvs_flowtable_flows 10\n");
    has("xvs_flowtable_capacity 1024\n");
    has("xvs_sync_last_duration_seconds 0.004\n");
    has("xvs_last_sync_timestamp_seconds 1700000000.25\n");
    has("xvs_config_reloads_total{result=\"ok\"} 1\n");
    has("xvs_config_reloads_total{result=\"failed\"} 2\n");
    has("xvs_frozen 1\n");
    has("xvs_service_frozen{service=\"ns/we\\\"b\\\\x:80\"} 0\n");
    has("xvs_service_rate_limited_total{service=\"ns/we\\\"b\\\\x:80\"} 5\n");
    // Traffic (ipvsadm --stats): per service and per backend, by direction.
    has("xvs_service_connections_total{service=\"ns/we\\\"b\\\\x:80\"} 11\n");
    has("xvs_service_packets_total{service=\"ns/we\\\"b\\\\x:80\",direction=\"out\"} 104\n");
    has("xvs_service_bytes_total{service=\"ns/we\\\"b\\\\x:80\",direction=\"in\"} 7800\n");
    has(
        "xvs_backend_packets_total{service=\"ns/we\\\"b\\\\x:80\",backend=\"198.18.1.1:8080\",direction=\"in\"} 120\n",
    );
    has(
        "xvs_backend_bytes_total{service=\"ns/we\\\"b\\\\x:80\",backend=\"198.18.1.1:8080\",direction=\"out\"} 150000\n",
    );
    has(
        "xvs_backend_connections_total{service=\"ns/we\\\"b\\\\x:80\",backend=\"198.18.1.2:8080\"} 0\n",
    );
    has("xvs_traffic_backends_omitted 0\n");
    has("xvs_draining 0\n");
    has("xvs_removed_backend_flows_total{action=\"resteered\"} 4\n");
    has("xvs_removed_backend_flows_total{action=\"ended\"} 6\n");
    has("xvs_snapshot_generation 42\n");
    has("xvs_bgp_live 1\n");
    has("xvs_bgp_routes{kind=\"vip\"} 2\n");
    has("xvs_bgp_routes{kind=\"backup\"} 1\n");
    has("xvs_bgp_errors_total 1\n");
    has("xvs_refused{kind=\"service_refused\"} 1\n");
    has("xvs_refused{kind=\"snapshot_build\"} 0\n");
    has("xvs_refused_total{kind=\"service_refused\"} 2\n");
    has("xvs_refused_total{kind=\"snapshot_build\"} 1\n");
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
        fn flows(&self, _: &FlowFilter, _: usize) -> FlowsPage {
            FlowsPage::default()
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
fn the_metrics_listener_serves_metrics_and_nothing_else() {
    let fake = Fake::new();
    let cfg = AdminConfig {
        metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        ..tcp_config()
    };
    let s = Served::start(&cfg, Arc::clone(&fake) as _, patient());
    let m = s.metrics.expect("a metrics listener");
    assert_ne!(Some(m), s.healthz);
    assert_ne!(m, s.listen);
    let r = get(m, "/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.body
            .contains("xvs_admin_connections{listener=\"metrics\"}"),
        "{}",
        r.body
    );
    // What a scraper elsewhere has no business reading (client addresses), nor the probes.
    for path in [
        "/v1/flows",
        "/v1/services",
        "/v1/stats",
        "/healthz",
        "/livez",
        "/nope",
    ] {
        assert_eq!(get(m, path).status, 404, "{path}");
    }
    assert_eq!(post(m, "/v1/freeze").status, 404);
    assert!(fake.controls.lock().unwrap().is_empty());
    // The other listeners are as they were.
    assert_eq!(get(s.listen, "/v1/flows").status, 200);
    assert_eq!(get(s.healthz(), "/metrics").status, 404);
    s.stop();

    // A taken address is refused naming the key.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap();
    let cfg = AdminConfig {
        metrics_listen: Some(busy),
        ..tcp_config()
    };
    let e = AdminServer::bind(&cfg, Fake::new() as Arc<dyn AdminSource>)
        .err()
        .expect("metrics_listen is taken");
    assert!(
        e.to_string()
            .starts_with(&format!("[admin] metrics_listen {busy}: ")),
        "{e}"
    );
}

#[test]
fn flows_filter_before_the_limit_and_say_when_they_truncate() {
    let fake = Fake::new();
    let s = serve(&fake);
    let addr = s.listen;
    let flows = |q: &str| -> FlowsResponse {
        let r = get(addr, &format!("/v1/flows?{q}"));
        assert_eq!(r.status, 200, "{q}: {}", r.body);
        serde_json::from_str(&r.body).unwrap()
    };
    // 25 flows of dns (every tenth), 5 of them shown.
    let f = flows("service=dns&limit=5");
    assert_eq!((f.flows.len(), f.total_matched, f.truncated), (5, 25, true));
    assert!(f.flows.iter().all(|f| f.service == "dns"));
    assert_eq!(f.flows[0], flow(9), "the first match, not the first flow");
    // Odd flows go to 198.18.1.2; with the port, and the client's /24.
    let f = flows("backend=198.18.1.2");
    assert_eq!(
        (f.flows.len(), f.total_matched, f.truncated),
        (100, 125, true)
    );
    let f = flows("backend=198.18.1.2:8080&client=198.18.2.0/24&limit=1000");
    assert_eq!(
        (f.flows.len(), f.total_matched, f.truncated),
        (25, 25, false)
    );
    assert!(
        f.flows
            .iter()
            .all(|f| f.client.ip().to_string() == "198.18.2.1")
    );
    let f = flows("backend=198.18.1.2:9999");
    assert_eq!((f.flows.len(), f.total_matched, f.truncated), (0, 0, false));
    let f = flows("vip=198.18.100.1:80&service=web&client=198.18.0.1");
    assert_eq!(f.total_matched, 180);
    // Percent-encoded values, as `xvs flows` sends them.
    let f = flows("client=198.18.2.0%2F23&backend=%5B2001%3A2%3A%3A1%5D%3A80");
    assert_eq!(f.total_matched, 0);

    for (q, names) in [
        ("backend=198.18.1", "backend"),
        ("client=198.18.0.0/40", "client"),
        ("vip=web", "vip"),
        ("client=nope&limit=5", "client"),
    ] {
        let r = get(addr, &format!("/v1/flows?{q}"));
        assert_eq!(r.status, 400, "{q}");
        let e = r.json()["error"].as_str().unwrap().to_owned();
        assert!(e.starts_with(&format!("{names}: ")), "{q}: {e}");
    }
    s.stop();
}
