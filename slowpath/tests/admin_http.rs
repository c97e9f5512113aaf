//! The admin HTTP API end to end: a fake `AdminSource`, a server on 127.0.0.1:0, and a tiny
//! blocking client.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use slowpath::admin::{
    self, AdminSource, BackendView, FlowTableView, FlowViewJson, FlowsResponse, FrontendView,
    HealthView, ServiceView, ServicesResponse, StatsView, SyncView, WorkerView,
};

struct Fake {
    last_sync: Mutex<SystemTime>,
    controls: Mutex<Vec<String>>,
}

impl Fake {
    fn new() -> Arc<Fake> {
        Arc::new(Fake {
            last_sync: Mutex::new(SystemTime::now()),
            controls: Mutex::new(Vec::new()),
        })
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
        (0..limit.min(250) as u16).map(flow).collect()
    }

    fn stats(&self) -> StatsView {
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
            not_ready: None,
        }
    }

    fn control(&self, action: &str, service: Option<&str>) -> Result<(), String> {
        let what = match service {
            Some(s) => format!("{action} {s}"),
            None => action.to_owned(),
        };
        self.controls.lock().unwrap().push(what);
        Ok(())
    }
}

struct Reply {
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

fn request(addr: SocketAddr, raw: &str) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
    let status = status_line[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    let reply = Reply {
        status,
        headers,
        body: body.to_owned(),
    };
    let len: usize = reply.header("content-length").unwrap().parse().unwrap();
    assert_eq!(len, reply.body.len(), "Content-Length matches the body");
    reply
}

fn get(addr: SocketAddr, path: &str) -> Reply {
    request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
    )
}

fn start(fake: &Arc<Fake>, control: bool) -> admin::AdminHandle {
    let src: Arc<dyn AdminSource> = Arc::clone(fake) as Arc<dyn AdminSource>;
    admin::serve(SocketAddr::from(([127, 0, 0, 1], 0)), src, control).unwrap()
}

#[test]
fn healthz_follows_the_last_sync() {
    let fake = Fake::new();
    let h = start(&fake, false);
    let addr = h.local_addr();
    assert_ne!(addr.port(), 0);

    let r = get(addr, "/healthz");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
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
    h.stop();
}

#[test]
fn json_endpoints_have_their_shapes() {
    let fake = Fake::new();
    let h = start(&fake, false);
    let addr = h.local_addr();

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
    let s: StatsView = serde_json::from_str(&r.body).unwrap();
    assert_eq!(s, fake.stats());
    let j = r.json();
    assert_eq!(j["workers"][1]["rx"], 101);
    assert_eq!(j["workers"][0]["drops"]["no_service"], 3);
    assert_eq!(j["flowtable"]["capacity"], 1024);
    assert_eq!(j["sync"]["reloads_failed"], 2);
    assert_eq!(j["steering"][0]["interface"], "eth0");
    h.stop();
}

#[test]
fn metrics_are_valid_prometheus_text() {
    let fake = Fake::new();
    let h = start(&fake, false);
    let r = get(h.local_addr(), "/metrics");
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
    h.stop();
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
fn methods_paths_and_control_gate() {
    let fake = Fake::new();
    let h = start(&fake, false);
    let addr = h.local_addr();
    assert_eq!(get(addr, "/nope").status, 404);
    assert_eq!(get(addr, "/v1/nope").status, 404);
    let r = request(
        addr,
        "POST /v1/stats HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_eq!(r.status, 405);
    assert!(r.header("allow").unwrap().contains("GET"));
    let r = request(
        addr,
        "POST /v1/freeze HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(r.status, 403);
    assert_eq!(get(addr, "/v1/freeze").status, 405);
    assert!(fake.controls.lock().unwrap().is_empty());

    // HEAD: the GET's head, no body.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"HEAD /v1/stats HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 "));
    assert!(out.ends_with("\r\n\r\n"), "{out}");

    // Garbage and oversized heads are refused, not hung on.
    assert_eq!(request(addr, "hello\r\n\r\n").status, 400);
    let big = format!("GET /healthz HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(9000));
    assert_eq!(request(addr, &big).status, 431);
    h.stop();

    // Enabled: the action reaches the source.
    let h = start(&fake, true);
    let r = request(
        h.local_addr(),
        "POST /v1/drain HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["action"], "drain");
    // One service, named in the (percent-encoded) query.
    let r = request(
        h.local_addr(),
        "POST /v1/freeze?service=ns%2Fweb%3Ahttp HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["service"], "ns/web:http");
    assert_eq!(
        *fake.controls.lock().unwrap(),
        vec!["drain".to_owned(), "freeze ns/web:http".to_owned()]
    );
    h.stop();
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
    let h = admin::serve(SocketAddr::from(([127, 0, 0, 1], 0)), Arc::new(Bare), true).unwrap();
    let addr = h.local_addr();
    let r = request(addr, "POST /v1/freeze HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 409);
    assert_eq!(r.json()["error"], "not supported");
    // Never synced: not ready yet.
    assert_eq!(get(addr, "/healthz").status, 503);
    // Empty sources still give well-formed answers.
    assert_eq!(get(addr, "/metrics").status, 200);
    assert_eq!(get(addr, "/v1/flows?limit=0").json()["limit"], 1);
    h.stop();
}
