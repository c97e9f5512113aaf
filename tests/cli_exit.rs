//! Exit codes of every command, through the real binary: 0 success, 1 a runtime failure
//! (the machine, an input or output file, a running xvs that cannot be reached, refuses a
//! control command or is unhealthy), 2 a bad configuration or bad arguments. The admin API
//! is a thread here serving canned answers, on 127.0.0.1 or a unix socket in a temporary
//! directory. No root needed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use slowpath::admin::{
    BackendView, FlowsResponse, FrontendView, RateView, ServiceView, ServicesResponse, StatsView,
    TrafficView,
};

fn xvs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .output()
        .expect("run xvs")
}

fn code(args: &[&str]) -> Option<i32> {
    xvs(args).status.code()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write(dir: &Path, name: &str, text: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Answers one request on `conn` with the first route whose path prefix matches.
fn answer(mut conn: impl Read + Write, routes: &[(&str, u16, String)]) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
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

/// How long a fake API waits for the connections it expects: a bound, not an expectation
/// (the commands connect at once).
const SERVE_FOR: Duration = Duration::from_secs(30);

/// Accepts up to `n` connections (or until [`SERVE_FOR`] passed) and answers each.
macro_rules! serve {
    ($listener:expr, $routes:expr, $n:expr) => {{
        let (l, routes, n) = ($listener, $routes, $n);
        l.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let deadline = Instant::now() + SERVE_FOR;
            let mut served = 0;
            while served < n && Instant::now() < deadline {
                match l.accept() {
                    Ok((conn, _)) => {
                        conn.set_nonblocking(false).unwrap();
                        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                        answer(conn, &routes);
                        served += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
            served
        })
    }};
}

/// A fake admin API on 127.0.0.1 answering `n` connections; joined, it says how many it
/// answered.
fn tcp_api(routes: Vec<(&'static str, u16, String)>, n: usize) -> (String, JoinHandle<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (addr, serve!(l, routes, n))
}

/// A fake control socket answering `n` connections.
fn unix_api(path: &Path, routes: Vec<(&'static str, u16, String)>, n: usize) -> JoinHandle<usize> {
    serve!(UnixListener::bind(path).unwrap(), routes, n)
}

/// An address nothing listens on.
fn nowhere() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a: SocketAddr = l.local_addr().unwrap();
    a.to_string()
}

const STATIC: &str = "[dataplane]\nmode = \"nat\"\ninterfaces = [{ name = \"eth0\" }]\ncores = [1]\n[[services]]\nname = \"dns\"\nvip = \"198.18.100.53\"\nport = 53\nprotocol = \"udp\"\nbackends = [{ addr = \"198.18.1.1:53\" }]\n";

#[test]
fn usage_help_and_version() {
    assert_eq!(code(&[]), Some(2), "no command");
    assert_eq!(code(&["frobnicate"]), Some(2), "unknown command");
    assert_eq!(code(&["status", "--bogus"]), Some(2), "unknown option");
    assert_eq!(code(&["flows", "--limit", "many"]), Some(2), "bad number");
    assert_eq!(code(&["services", "--stats", "--rate"]), Some(2));
    assert_eq!(code(&["--help"]), Some(0));
    assert_eq!(code(&["check", "--help"]), Some(0));
    assert_eq!(code(&["--version"]), Some(0));
}

#[test]
fn check_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.toml", STATIC.as_bytes());
    let bad = write(dir.path(), "bad.toml", b"[dataplane]\nbatch_size = 3\n");
    let good = good.to_str().unwrap();
    let bad = bad.to_str().unwrap();
    assert_eq!(code(&["check", good]), Some(0));
    assert_eq!(code(&["check", bad]), Some(2));
    assert_eq!(code(&["check", "/nonexistent/xvs.toml"]), Some(2));
    assert_eq!(code(&["run", "--config", bad]), Some(2));
    assert_eq!(code(&["run", "--config", "/nonexistent/xvs.toml"]), Some(2));
    // The machine cannot run it (no such interface here, or no capabilities): 1.
    let missing = write(
        dir.path(),
        "missing.toml",
        STATIC.replace("eth0", "xvsnope0").as_bytes(),
    );
    assert_eq!(
        code(&["run", "--config", missing.to_str().unwrap()]),
        Some(1)
    );
}

#[test]
fn sim() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "xvs.toml", STATIC.as_bytes());
    let flows = write(
        dir.path(),
        "flows",
        b"udp,198.18.0.1,5000,198.18.100.53,53\n",
    );
    let bad_flows = write(dir.path(), "bad", b"udp,198.18.0.1,5000\n");
    let bad_cfg = write(dir.path(), "bad.toml", b"[[services]]\nname = 1\n");
    let (cfg, flows, bad_flows, bad_cfg) = (
        cfg.to_str().unwrap(),
        flows.to_str().unwrap(),
        bad_flows.to_str().unwrap(),
        bad_cfg.to_str().unwrap(),
    );
    assert_eq!(code(&["sim", "--config", cfg, "--flows", flows]), Some(0));
    assert_eq!(
        code(&["sim", "--config", bad_cfg, "--flows", flows]),
        Some(2)
    );
    assert_eq!(
        code(&["sim", "--config", cfg, "--flows", bad_flows]),
        Some(2)
    );
    assert_eq!(
        code(&["sim", "--config", cfg, "--flows", flows, "--frozen", "nope"]),
        Some(2)
    );
    assert_eq!(
        code(&["sim", "--config", cfg, "--flows", "/nonexistent/flows"]),
        Some(1)
    );
    assert_eq!(
        code(&["sim", "--flows", flows]),
        Some(2),
        "neither --config nor --objects"
    );
}

#[test]
fn pcap() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "xvs.toml", STATIC.as_bytes());
    let bad_cfg = write(dir.path(), "bad.toml", b"[dataplane]\nbatch_size = 3\n");
    let empty = pcap::PcapWriter::new(Vec::new(), pcap::Resolution::Micros)
        .unwrap()
        .finish()
        .unwrap();
    let input = write(dir.path(), "in.pcap", &empty);
    let junk = write(dir.path(), "junk.pcap", b"not a capture");
    let out = dir.path().join("out.pcap");
    let run = |cfg: &Path, input: &Path| {
        code(&[
            "pcap",
            "--config",
            cfg.to_str().unwrap(),
            "--in",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    assert_eq!(run(&cfg, &input), Some(0));
    assert_eq!(run(&bad_cfg, &input), Some(2));
    assert_eq!(run(&cfg, &junk), Some(1));
    assert_eq!(run(&cfg, Path::new("/nonexistent/in.pcap")), Some(1));
}

fn services_body() -> String {
    let traffic = TrafficView {
        conns: 1_234_567,
        in_pkts: 3_400_000_000,
        out_pkts: 10,
        in_bytes: 96_060,
        out_bytes: 512,
    };
    let rate = RateView {
        cps: 2.5,
        in_pps: 1_500.0,
        out_pps: 0.0,
        in_bps: 425_000_000.0,
        out_bps: 125.0,
    };
    serde_json::to_string(&ServicesResponse {
        services: vec![ServiceView {
            name: "dns".into(),
            frontends: vec![FrontendView {
                vip: [198, 18, 100, 53].into(),
                port: 53,
                protocol: "udp".into(),
            }],
            scheduler: "rr".into(),
            mode: "nat".into(),
            affinity_timeout_s: None,
            backends: vec![BackendView {
                addr: "198.18.1.1:53".parse().unwrap(),
                weight: 1,
                usable: true,
                health: None,
                active: 12_345,
                inactive: 3,
                stats: traffic,
                rate,
            }],
            frozen: false,
            rate_limit: None,
            rate_limited: 0,
            stats: traffic,
            rate,
        }],
        refused: Vec::new(),
    })
    .unwrap()
}

/// Cells of a table line (columns are two spaces apart; a scaled cell has one inside).
fn cells(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn status_services_and_flows() {
    let healthy = r#"{"lastUpdated":"","currentTime":"2024-05-01T12:34:57.000Z","nodeEligible":true,"fastpathRunning":true}"#;
    let sick = r#"{"lastUpdated":"","currentTime":"2024-05-01T12:34:57.000Z","nodeEligible":true,"fastpathRunning":false,"reason":"fastpath workers are not running"}"#;
    let stats = serde_json::to_string(&StatsView::default()).unwrap();
    let flows = serde_json::to_string(&FlowsResponse::default()).unwrap();
    let (addr, t) = tcp_api(
        vec![
            ("/healthz", 200, healthy.into()),
            ("/v1/stats", 200, stats.clone()),
            ("/v1/services", 200, services_body()),
            (
                "/v1/flows?limit=100&client=",
                400,
                "{\"error\":\"client: no\"}".into(),
            ),
            ("/v1/flows", 200, flows),
        ],
        7,
    );
    let a = addr.as_str();
    assert_eq!(code(&["status", "--admin", a]), Some(0));
    let o = xvs(&["services", "--admin", a, "--stats"]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        cells(lines[2]),
        ["198.18.1.1:53", "1.2M", "3.4G", "10", "96.1 kB", "512 B"],
        "{out}"
    );
    let o = xvs(&["services", "--admin", a, "--rate", "--exact"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        cells(lines[1]),
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
        cells(lines[2]),
        ["198.18.1.1:53", "2.5", "1500", "0", "3400000000", "1000"],
        "{out}"
    );
    let o = xvs(&["services", "--admin", a]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        cells(out.lines().nth(2).unwrap()),
        ["198.18.1.1:53", "1", "yes", "12.3k", "3"],
        "{out}"
    );
    assert_eq!(code(&["flows", "--admin", a]), Some(0));
    // A filter the API refuses (400): bad arguments.
    assert_eq!(
        code(&["flows", "--admin", a, "--client", "198.18.0.1"]),
        Some(2)
    );
    assert_eq!(t.join().unwrap(), 7, "one request each, two for status");

    let (addr, t) = tcp_api(
        vec![("/healthz", 503, sick.into()), ("/v1/stats", 200, stats)],
        2,
    );
    let o = xvs(&["status", "--admin", &addr]);
    assert_eq!(o.status.code(), Some(1), "unhealthy");
    assert!(String::from_utf8_lossy(&o.stdout).contains("UNHEALTHY (503)"));
    assert_eq!(t.join().unwrap(), 2);

    // Nothing listens: 1 for each; a malformed filter is refused before any request: 2.
    let gone = nowhere();
    for cmd in ["status", "services", "flows"] {
        assert_eq!(code(&[cmd, "--admin", &gone]), Some(1), "{cmd}");
    }
    let o = xvs(&["flows", "--admin", &gone, "--backend", "198.18.1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("flows: --backend:"), "{}", stderr(&o));
}

#[test]
fn control_commands() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("xvs.sock");
    let s = sock.to_str().unwrap();
    for action in ["freeze", "unfreeze", "drain", "undrain"] {
        let t = unix_api(&sock, vec![("/v1/", 200, "{\"ok\":true}".into())], 1);
        assert_eq!(code(&[action, "--socket", s]), Some(0), "{action}");
        assert_eq!(t.join().unwrap(), 1);
        std::fs::remove_file(&sock).unwrap();
        for refusal in [403, 409] {
            let t = unix_api(
                &sock,
                vec![("/v1/", refusal, "{\"error\":\"no\"}".into())],
                1,
            );
            assert_eq!(
                code(&[action, "--socket", s]),
                Some(1),
                "{action} {refusal}"
            );
            assert_eq!(t.join().unwrap(), 1);
            std::fs::remove_file(&sock).unwrap();
        }
        assert_eq!(
            code(&[action, "--socket", s]),
            Some(1),
            "{action}: no socket"
        );
    }
}

#[test]
fn cleanup() {
    let dir = tempfile::tempdir().unwrap();
    // Without --config: refused, naming the option (the target is not guessed).
    let o = xvs(&["cleanup"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--config <CONFIG>"), "{}", stderr(&o));
    let bad = write(dir.path(), "bad.toml", b"[dataplane]\nbatch_size = 3\n");
    assert_eq!(
        code(&["cleanup", "--config", bad.to_str().unwrap()]),
        Some(2)
    );
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::write(state.join("flows.export"), b"old flows").unwrap();
    let cfg = write(
        dir.path(),
        "xvs.toml",
        format!(
            "[dataplane]\nmode = \"nat\"\ninterfaces = [{{ name = \"xvsnope0\" }}]\ncores = [1]\nstate_dir = \"{}\"\nbpf_pin_root = \"{}\"\n",
            state.display(),
            dir.path().join("pins").display()
        )
        .as_bytes(),
    );
    let o = xvs(&["cleanup", "--config", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!state.join("flows.export").exists());
}

#[test]
fn decap() {
    let dir = tempfile::tempdir().unwrap();
    let pins = dir.path().join("pins");
    let pins = pins.to_str().unwrap();
    assert_eq!(code(&["decap"]), Some(2));
    assert_eq!(
        code(&["decap", "--interface", "lo", "--vip", "198.18.100.1:0=80"]),
        Some(2)
    );
    assert_eq!(code(&["decap", "--status", "--detach"]), Some(2));
    let bad = write(
        dir.path(),
        "decap.toml",
        b"interfaces = [\"lo\"]\nvips = []\n",
    );
    assert_eq!(code(&["decap", "--config", bad.to_str().unwrap()]), Some(2));
    // A pin root off bpffs: a runtime failure, before anything is attached.
    let o = xvs(&[
        "decap",
        "--interface",
        "lo",
        "--vip",
        "198.18.100.1",
        "--pin-root",
        pins,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not on a bpf file system"),
        "{}",
        stderr(&o)
    );
    assert!(!Path::new(pins).exists());
    // Nothing pinned there: attached=0, success.
    let o = xvs(&["decap", "--status", "--pin-root", pins]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "attached=0\n");
}
