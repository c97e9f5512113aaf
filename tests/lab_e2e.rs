//! End to end, as root: the netns lab of `scripts/lab` (a client, the xvs node, three
//! backends running real HTTP and UDP servers), the real `xvs run` binary on
//! `config/examples/lab.toml` (or a variant), and real traffic through the VIPs.
//!
//! Every scenario builds its own lab under a unique prefix and removes it on every exit path
//! (`Lab`'s Drop). Scenarios run one at a time: each xvs busy-polls a core.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn http_and_udp_through_the_vip_in_both_modes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    for (mode, config) in [("fullnat", lab_config()), ("nat", nat_config())] {
        lab.start_xvs(&config);
        check_rr(&lab, "http://198.18.100.1/");
        check_rr(&lab, "http://[2001:2:0:100::1]/");
        let reply = lab.udp("198.18.100.1", 9000, 40000, "ping");
        assert!(
            reply.starts_with("backend-") && reply.ends_with(" ping"),
            "{mode}: {reply}"
        );
        let out = lab.stop_xvs();
        assert!(out.contains("tx"), "{mode}: final counters: {out}");
    }
}

#[test]
fn large_download_arrives_intact() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    lab.start_xvs(&lab_config());
    let n = 8 << 20;
    let body = lab.curl(&format!("http://198.18.100.1/bytes/{n}"), &[]);
    assert_eq!(body.len(), n);
    let block: Vec<u8> = (0..=255u8).collect();
    assert!(
        body.chunks(256).all(|c| c == &block[..c.len()]),
        "content corrupted"
    );
    let body6 = lab.curl(&format!("http://[2001:2:0:100::1]/bytes/{}", 2 << 20), &[]);
    assert_eq!(body6.len(), 2 << 20);
    lab.stop_xvs();
}

#[test]
fn maglev_keeps_a_client_port_on_its_backend_across_restarts() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    lab.start_xvs(&lab_config());
    let ports = [41000u16, 41001, 41002, 41003, 41004, 41005];
    let before: Vec<String> = ports
        .iter()
        .map(|p| lab.udp("198.18.100.1", 9000, *p, "x"))
        .collect();
    lab.stop_xvs();
    lab.start_xvs(&lab_config());
    let after: Vec<String> = ports
        .iter()
        .map(|p| lab.udp("198.18.100.1", 9000, *p, "x"))
        .collect();
    assert_eq!(before, after);
    // The ports do spread (mh-port hashes them), so the check above means something.
    let mut distinct = before.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() > 1, "{before:?}");
    lab.stop_xvs();
}

#[test]
fn the_node_keeps_its_own_traffic() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    // A service of the node itself, on an address and port that are not a frontend.
    let mut server = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.ns("x"),
            "python3",
            "-m",
            "http.server",
            "2222",
            "--bind",
            "198.18.0.1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    lab.start_xvs(&lab_config());
    let ping = lab.exec("c", &["ping", "-c", "2", "-W", "2", "198.18.0.1"]);
    assert!(
        ping.status.success(),
        "ping: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    let ping6 = lab.exec("c", &["ping", "-6", "-c", "2", "-W", "2", "2001:2::1"]);
    assert!(
        ping6.status.success(),
        "ping -6: {}",
        String::from_utf8_lossy(&ping6.stdout)
    );
    let mut ok = false;
    for _ in 0..20 {
        let o = lab.exec(
            "c",
            &[
                "curl",
                "-sS",
                "--max-time",
                "2",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "http://198.18.0.1:2222/",
            ],
        );
        if o.stdout == b"200" {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        ok,
        "the node's own TCP service is unreachable with xvs running"
    );
    lab.stop_xvs();
    // The steering stays attached for the restart hold, and the node's own traffic still
    // passes it.
    assert!(xdp_attached(&lab));
    let ping = lab.exec("c", &["ping", "-c", "1", "-W", "2", "198.18.0.1"]);
    assert!(ping.status.success());
}

/// A crash (SIGKILL, no clean-up code runs): the steering program stays attached and holds
/// the frames xvs owns (dropped, not answered by the kernel) while the node's own traffic
/// passes; the next start adopts it and forwards. Then a node whose xvs does not come back:
/// once `restart_hold` ran out, the watchdog has removed the steering and the node works.
#[test]
fn a_crash_holds_xvs_frames_and_a_node_left_alone_is_released() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let config = lab_config().replace("batch_size = 64", "batch_size = 64\nrestart_hold = \"3s\"");
    lab.start_xvs(&config);
    assert_eq!(http_round(&lab, "http://198.18.100.1/", 3).len(), 3);
    let mut child = lab.xvs.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        xdp_attached(&lab),
        "the steering program went with the process"
    );
    let ping = lab.exec("c", &["ping", "-c", "1", "-W", "2", "198.18.0.1"]);
    assert!(ping.status.success(), "the node's own traffic is held too");
    // A connection to the VIP gets no answer (not even a reset) while held.
    let held = lab.exec(
        "c",
        &["curl", "-sS", "--max-time", "1", "http://198.18.100.1/"],
    );
    assert!(!held.status.success());
    let err = String::from_utf8_lossy(&held.stderr);
    assert!(
        err.contains("timed out"),
        "held frames were answered: {err}"
    );
    // The next start adopts the pinned program and forwards.
    lab.start_xvs(&config);
    assert!(
        http_round(&lab, "http://198.18.100.1/", 3)
            .iter()
            .all(|b| b.starts_with("backend-"))
    );
    // Crash again, and nothing comes back: after the hold the watchdog removes it all.
    let mut child = lab.xvs.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while xdp_attached(&lab) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !xdp_attached(&lab),
        "steering still attached 15 s after a 3 s hold"
    );
    let ping = lab.exec("c", &["ping", "-c", "1", "-W", "2", "198.18.0.1"]);
    assert!(ping.status.success());
    let pins = std::fs::read_dir("/run/xvs-bpf/xvs")
        .map(|d| d.count())
        .unwrap_or(0);
    let _ = pins; // other labs may pin meanwhile: the namespace's own directory is checked below
    let ino = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/var/run/netns/{}", lab.ns("x")))
            .unwrap()
            .ino()
    };
    assert!(
        !Path::new(&format!("/run/xvs-bpf/xvs/ns-{ino}"))
            .join("xvs-c0")
            .exists(),
        "pins left behind"
    );
}

/// Runs `promtool check metrics` (Debian's `prometheus`, installed by `scripts/deps`) on
/// `text`: it must parse and have no lint problem.
fn check_with_promtool(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/deps installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `xvs status|services|flows` and `/metrics` against the running daemon.
#[test]
fn admin_api_and_status_commands() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    lab.start_xvs(&lab_config());
    http_round(&lab, "http://198.18.100.1/", 3);
    let xvs = env!("CARGO_BIN_EXE_xvs");
    let sock = lab.socket().display().to_string();
    // Read-only commands over TCP ([admin] listen) and over the control socket.
    let web = service_json(&lab, "web");
    assert_eq!(web["backends"].as_array().unwrap().len(), 3);
    assert_eq!(web["scheduler"], "rr");
    let o = lab.exec(
        "x",
        &[xvs, "flows", "--json", "--limit", "50", "--socket", &sock],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["flows"].as_array().unwrap().len() >= 3, "{v}");
    let o = lab.exec("x", &[xvs, "status", "--socket", &sock]);
    assert!(
        o.status.success(),
        "status: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    // The socket is the owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(lab.socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // Control is off ([admin] enable_control): the socket refuses it, naming the key.
    let o = lab.exec("x", &[xvs, "freeze", "--socket", &sock]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("enable_control"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = lab.exec(
        "x",
        &[
            "curl",
            "-sS",
            "--max-time",
            "3",
            "http://127.0.0.1:10249/metrics",
        ],
    );
    let metrics = String::from_utf8(o.stdout).unwrap();
    assert!(
        metrics.contains("xvs_drops_total{reason=\"no_flow\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("xvs_backend_connections{"), "{metrics}");
    // The running daemon's exposition passes Prometheus' own parser and lint, and has the
    // sync histogram (at least the first publish), build info, process metrics, and the
    // workers labelled with their interfaces and queue.
    check_with_promtool(&metrics);
    let count = metrics
        .lines()
        .find_map(|l| l.strip_prefix("xvs_sync_duration_seconds_count "))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no sync duration count in {metrics}"));
    assert!(count >= 1, "{metrics}");
    assert!(
        metrics.contains("xvs_sync_duration_seconds_bucket{le=\"+Inf\"} "),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE xvs_network_programming_duration_seconds histogram\n"),
        "{metrics}"
    );
    assert!(metrics.contains("xvs_build_info{version=\""), "{metrics}");
    assert!(
        metrics.contains("\nprocess_resident_memory_bytes "),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "xvs_rx_packets_total{worker=\"0\",interface=\"xvs-c0,xvs-b0\",queue=\"0\"} "
        ),
        "{metrics}"
    );
    // The healthz listener (every address, port 10256) serves health and nothing else.
    assert_eq!(
        http_code(&lab, "GET", "http://198.18.0.1:10256/healthz"),
        "200"
    );
    assert_eq!(
        http_code(&lab, "GET", "http://127.0.0.1:10256/livez"),
        "200"
    );
    assert_eq!(
        http_code(&lab, "GET", "http://198.18.0.1:10256/metrics"),
        "404"
    );
    assert_eq!(
        http_code(&lab, "GET", "http://198.18.0.1:10256/v1/flows"),
        "404"
    );
    // The metrics listener is node-local and refuses control.
    assert_eq!(
        http_code(&lab, "POST", "http://127.0.0.1:10249/v1/freeze"),
        "403"
    );
    lab.stop_xvs();
}

/// SIGHUP applies a new config without dropping established flows; a bad file is refused
/// and the running config stays.
#[test]
fn hot_reload_keeps_flows_and_refuses_bad_files() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    lab.start_xvs(&lab_config());
    let pid = lab.xvs.as_ref().unwrap().id() as i32;
    // A long download is in flight while the config changes under it.
    let ns = lab.ns("c");
    let download = std::thread::spawn(move || {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                "curl",
                "-sS",
                "--fail",
                "--max-time",
                "20",
                "--limit-rate",
                "2M",
            ])
            .arg(format!("http://198.18.100.1/bytes/{}", 4 << 20))
            .output()
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    // Drain backend 1 (weight 0) and add a service on a new port.
    let new = lab_config().replacen(
        "{ addr = \"198.18.1.1:8080\" }",
        "{ addr = \"198.18.1.1:8080\", weight = 0 }",
        1,
    ) + "\n[[services]]\nname = \"web8080\"\nvip = \"198.18.100.2\"\nport = 8080\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.3:8080\" }]\n";
    // The running [dataplane] (its state_dir included): a reload cannot change it.
    std::fs::write(lab.dir.path().join("xvs.toml"), lab.with_state(&new)).unwrap();
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let mut ok = false;
    for _ in 0..50 {
        let o = lab.exec(
            "c",
            &[
                "curl",
                "-sS",
                "--max-time",
                "1",
                "http://198.18.100.2:8080/",
            ],
        );
        if o.status.success() && o.stdout == b"backend-3\n" {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ok, "the new service never answered");
    let bodies = http_round(&lab, "http://198.18.100.1/", 6);
    assert_eq!(
        count(&bodies, "backend-1"),
        0,
        "drained backend got new flows: {bodies:?}"
    );
    // A broken file: refused, and the running config still serves.
    std::fs::write(
        lab.dir.path().join("xvs.toml"),
        "[dataplane]\nbatch_size = 3\n",
    )
    .unwrap();
    unsafe { libc::kill(pid, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        String::from_utf8(lab.curl("http://198.18.100.2:8080/", &[])).unwrap(),
        "backend-3\n"
    );
    let out = download.join().unwrap();
    assert!(
        out.status.success(),
        "download broken by the reload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), 4 << 20);
    let o = lab.exec("x", &[env!("CARGO_BIN_EXE_xvs"), "status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stats"]["sync"]["reloads_ok"], 1, "{v}");
    assert_eq!(v["stats"]["sync"]["reloads_failed"], 1, "{v}");
    lab.stop_xvs();
}

/// The reload guards, live: an empty file and truncated files, with SIGHUP, are refused
/// and counted; services, the snapshot and an established flow are untouched. A valid
/// change, written atomically and picked up by the file watch (no signal), still applies.
#[test]
fn reload_refuses_empty_and_truncated_files() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let running = lab.with_state(&lab_config());
    lab.start_xvs(&running);
    let pid = lab.xvs.as_ref().unwrap().id() as i32;
    let path = lab.dir.path().join("xvs.toml");
    // A long-lived TCP flow: 3 MiB at 300 KiB/s, about 10 s.
    let download = slow_download(&lab, 3 << 20, "300K");
    let get = |what: &str| -> serde_json::Value {
        let (code, body) = admin(&lab, "GET", what);
        assert_eq!(code, "200", "{what}: {body}");
        serde_json::from_str(&body).unwrap()
    };
    let services = |v: serde_json::Value| -> Vec<(String, usize)> {
        v["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let n = s["backends"].as_array().unwrap().len();
                (s["name"].as_str().unwrap().to_owned(), n)
            })
            .collect()
    };
    let established = |v: serde_json::Value| -> Vec<String> {
        let mut f: Vec<String> = v["flows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["state"] == "ESTABLISHED")
            .map(|f| format!("{} -> {}", f["client"], f["backend"]))
            .collect();
        f.sort();
        f
    };
    let mut flows = Vec::new();
    for _ in 0..50 {
        flows = established(get("/v1/flows?limit=1000"));
        if !flows.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(flows.len(), 1, "the download's flow: {flows:?}");
    let before = services(get("/v1/services"));
    assert_eq!(before.len(), 3, "{before:?}");
    let generation = get("/v1/stats")["generation"].clone();
    // Empty; cut mid-file (mid-line); cut at the line before the first [[services]].
    let half = &running[..running.len() / 2];
    let head = &running[..running.find("[[services]]").unwrap()];
    for (i, text) in ["", half, head].into_iter().enumerate() {
        std::fs::write(&path, text).unwrap();
        unsafe { libc::kill(pid, libc::SIGHUP) };
        let mut failed = 0;
        for _ in 0..30 {
            std::thread::sleep(Duration::from_millis(100));
            failed = get("/v1/stats")["sync"]["reloads_failed"].as_u64().unwrap();
            if failed > i as u64 {
                break;
            }
        }
        assert_eq!(failed, i as u64 + 1, "reload {i} not refused");
        // Longer than the file watch's settle time: it does not reload it again.
        std::thread::sleep(Duration::from_millis(700));
        let stats = get("/v1/stats");
        assert_eq!(stats["sync"]["reloads_failed"], i + 1, "{stats}");
        assert_eq!(stats["sync"]["reloads_ok"], 0, "{stats}");
        assert_eq!(
            stats["generation"], generation,
            "a refused reload published"
        );
        assert_eq!(services(get("/v1/services")), before);
        assert_eq!(established(get("/v1/flows?limit=1000")), flows);
    }
    let o = lab.exec(
        "x",
        &[
            "curl",
            "-sS",
            "--max-time",
            "3",
            "http://127.0.0.1:10249/metrics",
        ],
    );
    let metrics = String::from_utf8(o.stdout).unwrap();
    assert!(
        metrics.contains("xvs_config_reloads_total{result=\"failed\"} 3\n"),
        "{metrics}"
    );
    // A valid change, replaced atomically, no signal: the file watch applies it.
    let new = running.clone()
        + "\n[[services]]\nname = \"web8080\"\nvip = \"198.18.100.2\"\nport = 8080\nprotocol = \"tcp\"\nbackends = [{ addr = \"198.18.1.3:8080\" }]\n";
    let tmp = lab.dir.path().join("xvs.toml.tmp");
    std::fs::write(&tmp, new).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let mut ok = false;
    for _ in 0..50 {
        let o = lab.exec(
            "c",
            &[
                "curl",
                "-sS",
                "--max-time",
                "1",
                "http://198.18.100.2:8080/",
            ],
        );
        if o.status.success() && o.stdout == b"backend-3\n" {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ok, "the new service never answered");
    let stats = get("/v1/stats");
    assert_eq!(stats["sync"]["reloads_ok"], 1, "{stats}");
    assert_eq!(stats["sync"]["reloads_failed"], 3, "{stats}");
    assert_eq!(established(get("/v1/flows?limit=1000")), flows);
    let out = download.join().unwrap();
    assert!(
        out.status.success(),
        "download broken: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), 3 << 20);
    lab.stop_xvs();
}

/// Active HTTP health checks: a backend whose server dies gets no new flows.
#[test]
fn unhealthy_backend_gets_no_new_flows() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let config = lab_config()
        + "\n[health]\nprobe = \"http\"\ninterval = \"200ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 2\n";
    lab.start_xvs(&config);
    check_rr(&lab, "http://198.18.100.1/");
    stop_servers(&lab, "b2");
    std::thread::sleep(Duration::from_millis(1500));
    let bodies = http_round(&lab, "http://198.18.100.1/", 8);
    assert_eq!(
        count(&bodies, "backend-1") + count(&bodies, "backend-3"),
        8,
        "{bodies:?}"
    );
    lab.stop_xvs();
}

/// A service's own health check, end to end: web takes only 204 from `GET /` (the lab's
/// backends answer 200), so its backends are judged down by its check and take no new
/// flows, while echo, with no check of its own and `[health] probe = "none"`, is not probed
/// at all.
#[test]
fn a_services_own_health_check_judges_its_backends() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let config = lab_config().replacen(
        "name = \"web\"\n",
        "name = \"web\"\nhealth = { probe = \"http\", http_status = [204], rise = 1, fall = 2 }\n",
        1,
    ) + "\n[health]\ninterval = \"200ms\"\ntimeout = \"100ms\"\n";
    lab.start_xvs(&config);
    let t0 = std::time::Instant::now();
    let down = |svc: &serde_json::Value| {
        svc["backends"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["health"] == "down" && b["usable"] == false)
    };
    while !down(&service_json(&lab, "web")) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{}",
            service_json(&lab, "web")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let echo = service_json(&lab, "echo");
    for b in echo["backends"].as_array().unwrap() {
        assert!(b.get("health").is_none_or(|h| h.is_null()), "{echo}");
        assert_eq!(b["usable"], true, "{echo}");
    }
    // No backend of web takes a new connection.
    let o = lab.exec(
        "c",
        &[
            "curl",
            "-s",
            "--max-time",
            "2",
            "-o",
            "/dev/null",
            "http://198.18.100.1/",
        ],
    );
    assert!(!o.status.success(), "web answered with every backend down");
    lab.stop_xvs();
}

/// `xvs run` with the Kubernetes source: a Service and its EndpointSlice from an API server
/// (a small fake speaking the list/watch protocol) become a forwarding frontend. Until the
/// API server has answered, `/healthz` is 503 and says why. Logs are JSON lines here.
#[test]
fn kubernetes_service_is_forwarded() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let kubeconfig = lab.dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:16443\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\nusers:\n- name: fake\n  user: {}\ncurrent-context: fake\n",
    )
    .unwrap();
    let lab_toml = lab_config().replace("format = \"text\"", "format = \"json\"");
    let dataplane_and_rest =
        &lab_toml[lab_toml.find("[dataplane]").unwrap()..lab_toml.find("[[services]]").unwrap()];
    let config = format!(
        "[node]\nname = \"xvs-lab\"\naddresses = [\"198.18.0.1\"]\n{dataplane_and_rest}\n[kubernetes]\nkubeconfig = \"{}\"\nmin_sync_period = \"100ms\"\n{}",
        kubeconfig.display(),
        &lab_toml[lab_toml.find("[[neighbours]]").unwrap()..]
    );
    // xvs first: the API server is not there yet.
    let child = lab.spawn_xvs(&config, &[]);
    let (child, log) = wait_ready(child).unwrap_or_else(|log| panic!("{log}"));
    lab.xvs = Some(child);
    let ready: serde_json::Value = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .find(|v: &serde_json::Value| v["fields"]["message"] == "ready")
        .unwrap_or_else(|| panic!("no JSON ready line:\n{log}"));
    assert_eq!(ready["level"], "INFO", "{ready}");
    assert_eq!(ready["target"], "xvs", "{ready}");
    assert_eq!(ready["fields"]["workers"], 1, "{ready}");
    assert_eq!(ready["fields"]["services"], 0, "{ready}");
    assert!(ready["timestamp"].is_string(), "{ready}");
    let (code, body) = admin(&lab, "GET", "/healthz");
    assert_eq!(code, "503", "{body}");
    assert!(
        body.contains("waiting for the first sync of the Kubernetes source"),
        "{body}"
    );

    let mut api = Command::new("ip")
        .args(["netns", "exec", &lab.ns("x"), "python3"])
        .arg(root().join("tests/assets/fake-kube-api.py"))
        .arg("16443")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut bodies = Vec::new();
    for _ in 0..200 {
        let o = lab.exec(
            "c",
            &["curl", "-sS", "--max-time", "1", "http://198.18.100.1/"],
        );
        if o.status.success() {
            bodies.push(String::from_utf8(o.stdout).unwrap().trim().to_owned());
            if bodies.len() == 3 {
                break;
            }
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let (code, body) = admin(&lab, "GET", "/healthz");
    let _ = api.kill();
    let _ = api.wait();
    bodies.sort();
    assert_eq!(bodies, ["backend-1", "backend-2", "backend-3"]);
    assert_eq!(code, "200", "{body}");
    lab.stop_xvs();
}

/// `setpriv` arguments that run xvs as `nobody` with exactly `caps` (ambient, so they survive
/// the exec).
fn as_nobody_with(caps: &[&str]) -> Vec<String> {
    let list: Vec<String> = caps.iter().map(|c| format!("+{c}")).collect();
    let list = list.join(",");
    vec![
        "setpriv".into(),
        "--reuid=65534".into(),
        "--regid=65534".into(),
        "--clear-groups".into(),
        format!("--inh-caps={list}"),
        format!("--ambient-caps={list}"),
    ]
}

/// Privileges are capabilities, not uid 0: as `nobody` with exactly the capabilities xvs
/// names, it forwards; without one of them it refuses, naming it.
#[test]
fn runs_as_a_non_root_user_with_exactly_its_capabilities() {
    use std::os::unix::fs::PermissionsExt;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    // nobody reads the config and owns its state directory (flow state, control socket).
    std::fs::set_permissions(lab.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run_dir = lab.state_dir();
    std::fs::create_dir(&run_dir).unwrap();
    std::os::unix::fs::chown(&run_dir, Some(65534), Some(65534)).unwrap();
    let sock = lab.socket();
    // And a pin root of its own on the lab's bpffs (pins belong to their maker).
    let pin_root = format!("/run/xvs-bpf/{}-nobody", lab.prefix);
    std::fs::create_dir_all(&pin_root).unwrap();
    std::os::unix::fs::chown(&pin_root, Some(65534), Some(65534)).unwrap();
    struct RemoveDir(String);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _pins = RemoveDir(pin_root.clone());
    let config = lab_config().replace(
        "bpf_pin_root = \"/run/xvs-bpf/xvs\"",
        &format!("bpf_pin_root = {pin_root:?}"),
    );
    let caps = ["bpf", "perfmon", "net_admin", "net_raw", "ipc_lock"];
    let wrapper = as_nobody_with(&caps);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let child = lab.spawn_xvs(&config, &wrapper);
    let (child, _) = wait_ready(child).unwrap_or_else(|log| panic!("{log}"));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65534"),
        "{uid}"
    );
    lab.xvs = Some(child);
    check_rr(&lab, "http://198.18.100.1/");
    let reply = lab.udp("198.18.100.1", 9000, 40002, "caps");
    assert!(reply.ends_with(" caps"), "{reply}");
    let o = lab.exec(
        "x",
        &[
            env!("CARGO_BIN_EXE_xvs"),
            "status",
            "--socket",
            &sock.display().to_string(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let out = lab.stop_xvs();
    assert!(out.contains("tx="), "{out}");
    // Each capability is needed, and a missing one is named.
    for missing in ["net_raw", "perfmon"] {
        let some: Vec<&str> = caps.iter().copied().filter(|c| *c != missing).collect();
        let wrapper = as_nobody_with(&some);
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let mut child = lab.spawn_xvs(&config, &wrapper);
        let code = child.wait().unwrap().code();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert_eq!(code, Some(1), "{err}");
        let name = format!("CAP_{}", missing.to_uppercase());
        assert!(
            err.contains(&format!("missing capabilities: {name} (")),
            "{err}"
        );
    }
}

/// `napi_defer_hard_irqs` and `gro_flush_timeout` of both xvs interfaces.
fn napi_defer(lab: &Lab) -> Vec<String> {
    let mut v = Vec::new();
    for ifname in ["xvs-c0", "xvs-b0"] {
        for file in ["napi_defer_hard_irqs", "gro_flush_timeout"] {
            let o = lab.exec("x", &["cat", &format!("/sys/class/net/{ifname}/{file}")]);
            assert!(o.status.success(), "{ifname}/{file}");
            v.push(String::from_utf8_lossy(&o.stdout).trim().to_owned());
        }
    }
    v
}

#[test]
fn napi_busy_poll_forwards_and_puts_the_interfaces_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    assert_eq!(napi_defer(&lab), ["0", "0", "0", "0"]);
    // No idle_backoff: the worker polls (and so runs the NAPI) all the time.
    let config = std::fs::read_to_string(root().join("config/examples/lab.toml"))
        .unwrap()
        .replace("batch_size = 64", "batch_size = 64\nnapi_busy_poll = true");
    lab.start_xvs(&config);
    assert_eq!(
        napi_defer(&lab),
        ["2", "200000", "2", "200000"],
        "xvs sets the NAPI deferral it needs while it runs"
    );
    check_rr(&lab, "http://198.18.100.1/");
    check_rr(&lab, "http://[2001:2:0:100::1]/");
    let reply = lab.udp("198.18.100.1", 9000, 40001, "busy");
    assert!(reply.ends_with(" busy"), "{reply}");
    let n = 4 << 20;
    assert_eq!(
        lab.curl(&format!("http://198.18.100.1/bytes/{n}"), &[])
            .len(),
        n
    );
    lab.stop_xvs();
    assert_eq!(
        napi_defer(&lab),
        ["0", "0", "0", "0"],
        "xvs restores the interfaces at exit"
    );
    // An operator's own values are kept, and left as they were.
    lab.exec(
        "x",
        &[
            "sh",
            "-c",
            "echo 5 > /sys/class/net/xvs-c0/napi_defer_hard_irqs",
        ],
    );
    lab.start_xvs(&config);
    assert_eq!(napi_defer(&lab), ["5", "200000", "2", "200000"]);
    check_rr(&lab, "http://198.18.100.1/");
    lab.stop_xvs();
    assert_eq!(napi_defer(&lab), ["5", "0", "0", "0"]);
}

#[test]
fn lab_script_cleans_up() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up();
    let prefix = lab.prefix.clone();
    drop(lab);
    let list = run(Command::new("ip").args(["netns", "list"]));
    assert!(!String::from_utf8_lossy(&list.stdout).contains(&prefix));
    assert!(Path::new("/var/run/netns").exists());
}

/// Governance through the admin API: freeze refuses new connections while an established
/// one continues, unfreeze restores; a UDP flow whose backend is removed is re-steered at
/// once; SIGTERM drains (healthz 503) until the last transfer ends, then exits.
#[test]
fn freeze_udp_resteer_and_graceful_drain() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let config = lab_config()
        .replace(
            "listen = \"127.0.0.1:10249\"",
            "listen = \"127.0.0.1:10249\"\nenable_control = true",
        )
        .replace(
            "batch_size = 64",
            "batch_size = 64\ndrain_timeout = \"15s\"",
        );
    lab.start_xvs(&config);
    let pid = lab.xvs.as_ref().unwrap().id() as i32;

    // Freeze with a transfer in flight.
    let download = slow_download(&lab, 3 << 20, "2M");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(admin(&lab, "POST", "/v1/freeze").0, "200");
    std::thread::sleep(Duration::from_millis(300));
    let refused = lab.exec(
        "c",
        &["curl", "-sS", "--max-time", "1", "http://198.18.100.1/"],
    );
    assert!(
        !refused.status.success(),
        "a new connection got through a freeze"
    );
    let (_, stats) = admin(&lab, "GET", "/v1/stats");
    let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(v["governance"]["frozen"], true, "{v}");
    let (_, metrics) = admin(&lab, "GET", "/metrics");
    assert!(metrics.contains("xvs_frozen 1\n"), "{metrics}");
    assert!(
        !metrics.contains("xvs_drops_total{reason=\"frozen\"} 0\n"),
        "{metrics}"
    );
    let out = download.join().unwrap();
    assert!(
        out.status.success(),
        "established transfer broken by the freeze: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), 3 << 20);
    // The CLI does the same through the socket.
    let sock = lab.socket().display().to_string();
    let o = lab.exec(
        "x",
        &[env!("CARGO_BIN_EXE_xvs"), "unfreeze", "--socket", &sock],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::thread::sleep(Duration::from_millis(300));
    check_rr(&lab, "http://198.18.100.1/");
    // A service name that does not exist is refused.
    assert_eq!(admin(&lab, "POST", "/v1/freeze?service=nope").0, "409");

    // UDP: the operator takes the backend of a flow out of the service (a reload): no
    // removal grace (that is for EndpointSlice churn), the next datagram goes elsewhere.
    let first = lab.udp("198.18.100.1", 9000, 40001, "a");
    let (owner, _) = first.split_once(' ').unwrap();
    let n = owner.trim_start_matches("backend-");
    let path = lab.dir.path().join("xvs.toml");
    let without = config.replacen(&format!("  {{ addr = \"198.18.1.{n}:9000\" }},\n"), "", 1);
    assert_ne!(without, config, "backend {n} not found in the echo service");
    // The running [dataplane] (with the lab's state_dir): a reload may not change it.
    std::fs::write(&path, lab.with_state(&without)).unwrap();
    unsafe { libc::kill(pid, libc::SIGHUP) };
    // Well within the 3 s grace a vanished endpoint would get.
    let deadline = Instant::now() + Duration::from_secs(2);
    let v = loop {
        let (_, stats) = admin(&lab, "GET", "/v1/stats");
        let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
        if v["governance"]["flows_resteered"] == 1 || Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["governance"]["flows_resteered"], 1, "{v}");
    let again = lab.udp("198.18.100.1", 9000, 40001, "b");
    assert!(
        !again.starts_with(owner),
        "the UDP flow still goes to the removed {owner}: {again}"
    );

    // Graceful drain: SIGTERM with a transfer in flight.
    let download = slow_download(&lab, 4 << 20, "2M");
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc::kill(pid, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(300));
    let (code, body) = admin(&lab, "GET", "/healthz");
    assert_eq!(code, "503", "{body}");
    assert_eq!(
        http_code(&lab, "GET", "http://198.18.0.1:10256/healthz"),
        "503"
    );
    assert_eq!(admin(&lab, "GET", "/livez").0, "200");
    let out = download.join().unwrap();
    assert!(
        out.status.success(),
        "transfer broken by the drain: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), 4 << 20);
    // xvs exits by itself about a second after the transfer ended.
    let mut child = lab.xvs.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(8);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "xvs did not finish its drain");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
}

/// Passive health: a backend that answers SYNs with RSTs (its server is gone) is marked
/// down from the SYN-ACKs it never sent, long before the next active probe.
#[test]
fn passive_health_check_catches_refused_connections() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let config = lab_config()
        + "\n[health]\nprobe = \"tcp\"\ninterval = \"60s\"\ntimeout = \"1s\"\nrise = 1\nfall = 2\n";
    lab.start_xvs(&config);
    check_rr(&lab, "http://198.18.100.1/");
    stop_servers(&lab, "b2");
    // About 30 connection attempts a second for up to 6 s; a third hit backend 2.
    let script = "import socket,time\nend=time.time()+6\nwhile time.time()<end:\n  s=socket.socket()\n  s.settimeout(0.2)\n  try:\n    s.connect(('198.18.100.1',80))\n  except OSError:\n    pass\n  s.close()\n  time.sleep(0.03)\n";
    let ns = lab.ns("c");
    let load = std::thread::spawn(move || {
        Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-c", script])
            .output()
            .unwrap()
    });
    let started = Instant::now();
    let mut down_after = None;
    while started.elapsed() < Duration::from_secs(6) {
        let o = lab.exec("x", &[env!("CARGO_BIN_EXE_xvs"), "services", "--json"]);
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&o.stdout) {
            let web = &v["services"][0];
            let b2 = web["backends"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["addr"] == "198.18.1.2:8080")
                .unwrap();
            if b2["usable"] == false {
                down_after = Some(started.elapsed());
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = load.join();
    assert!(
        down_after.is_some(),
        "backend 2 refuses connections but is still usable after 6 s"
    );
    // New flows avoid it.
    let bodies = http_round(&lab, "http://198.18.100.1/", 6);
    assert_eq!(
        count(&bodies, "backend-1") + count(&bodies, "backend-3"),
        6,
        "{bodies:?}"
    );
    lab.stop_xvs();
}

/// TIME_WAIT reuse (IPVS `conn_reuse_mode = 1`): a client that reuses its port for a new
/// connection while the old one's flow is in TIME_WAIT is scheduled afresh, so a backend that
/// went to weight 0 meanwhile gets no new connection.
#[test]
fn a_reused_client_port_in_time_wait_is_scheduled_afresh() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let config = lab_config();
    lab.start_xvs(&config);
    // One request from client port 45000; the server closes first (`Connection: close`), so
    // the client's port is free again while xvs's flow sits in TIME_WAIT.
    let script = "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('198.18.0.2',45000))\ns.settimeout(5)\ns.connect(('198.18.100.1',80))\ns.sendall(b'GET / HTTP/1.1\\r\\nHost: vip\\r\\nConnection: close\\r\\n\\r\\n')\nd=b''\nwhile True:\n  c=s.recv(4096)\n  if not c: break\n  d+=c\ns.close()\nprint(d.split(b'\\r\\n\\r\\n',1)[1].decode().strip())\n";
    let get = |lab: &Lab| {
        let o = lab.exec("c", &["python3", "-c", script]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap().trim().to_owned()
    };
    let first = get(&lab);
    let n = first.trim_start_matches("backend-");
    // Its backend drains (weight 0): existing flows may finish, new ones go elsewhere.
    let drained = config.replacen(
        &format!("{{ addr = \"198.18.1.{n}:8080\" }}"),
        &format!("{{ addr = \"198.18.1.{n}:8080\", weight = 0 }}"),
        1,
    );
    assert_ne!(drained, config);
    std::fs::write(lab.dir.path().join("xvs.toml"), lab.with_state(&drained)).unwrap();
    let pid = lab.xvs.as_ref().unwrap().id() as i32;
    // SAFETY: our child's pid.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(1000));
    let second = get(&lab);
    assert_ne!(
        second, first,
        "the reused tuple went to the old flow's backend, drained to weight 0"
    );
    lab.stop_xvs();
}

#[test]
fn pass_reaches_the_kernel_for_traffic_to_a_nat_backend_that_bypasses_the_vip() {
    // In nat mode every backend ip:port is steered to xvs (to catch the backends' replies),
    // so a backend's packets of a connection that does not go through a VIP (the client
    // reaching the backend's port through the node, which routes) reach xvs, which owns no
    // flow for them: `Pass`. They must reach the kernel, which forwards them.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let ok = |o: &std::process::Output| assert!(o.status.success(), "{o:?}");
    ok(&lab.exec(
        "x",
        &[
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv6.conf.all.forwarding=1",
        ],
    ));
    ok(&lab.exec(
        "c",
        &["ip", "route", "add", "198.18.1.0/24", "via", "198.18.0.1"],
    ));
    ok(&lab.exec(
        "c",
        &[
            "ip",
            "-6",
            "route",
            "add",
            "2001:2:0:1::/64",
            "via",
            "2001:2::1",
        ],
    ));
    let direct =
        |lab: &Lab, url: &str| lab.exec("c", &["curl", "-sS", "--fail", "--max-time", "3", url]);

    // Without the exception path the backend's replies die in xvs.
    let off = nat_config().replace("batch_size = 64", "batch_size = 64\npass_to_kernel = false");
    lab.start_xvs(&off);
    check_rr(&lab, "http://198.18.100.1/");
    let o = direct(&lab, "http://198.18.1.1:8080/");
    assert!(!o.status.success(), "without pass_to_kernel: {o:?}");
    lab.stop_xvs();

    lab.start_xvs(&nat_config());
    check_rr(&lab, "http://198.18.100.1/");
    for url in ["http://198.18.1.1:8080/", "http://[2001:2:0:1::2]:8080/"] {
        let o = direct(&lab, url);
        assert!(o.status.success(), "{url}: {o:?}");
        assert!(String::from_utf8_lossy(&o.stdout).starts_with("backend-"));
    }
    // A large transfer too (its rate printed: the exception path's cost), and the VIP
    // still works beside it.
    let t = Instant::now();
    let o = direct(&lab, "http://198.18.1.3:8080/bytes/33554432");
    assert!(o.status.success() && o.stdout.len() == 32 << 20, "{o:?}");
    eprintln!(
        "32 MiB through the exception path: {:.0} MiB/s",
        32.0 / t.elapsed().as_secs_f64()
    );
    check_rr(&lab, "http://198.18.100.1/");
    let links = lab.exec("x", &["ip", "-o", "link", "show"]);
    let links = String::from_utf8_lossy(&links.stdout).to_string();
    assert_eq!(
        links.matches(": xvsp").count(),
        2,
        "one device per interface: {links}"
    );
    let (_, body) = admin(&lab, "GET", "/v1/stats");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    let injected: u64 = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["pass_injected"].as_u64().unwrap())
        .sum();
    assert!(injected > 0, "{stats}");
    // The devices outlive the process (a restart attaches to them), and `xvs cleanup`
    // removes them.
    lab.stop_xvs();
    let links = |lab: &Lab| {
        let o = lab.exec("x", &["ip", "-o", "link", "show"]);
        String::from_utf8_lossy(&o.stdout).matches(": xvsp").count()
    };
    assert_eq!(links(&lab), 2, "the devices stay for the next xvs");
    lab.start_xvs(&nat_config());
    assert_eq!(links(&lab), 2, "a restart attaches to them");
    let o = direct(&lab, "http://198.18.1.2:8080/");
    assert!(o.status.success(), "after a restart: {o:?}");
    lab.stop_xvs();
    let config = lab.dir.path().join("xvs.toml").display().to_string();
    let o = lab.exec(
        "x",
        &[env!("CARGO_BIN_EXE_xvs"), "cleanup", "--config", &config],
    );
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("2 exception device(s)"),
        "{o:?}"
    );
    assert_eq!(links(&lab), 0, "xvs cleanup removes the devices");
}

/// The SYN proxy with real TCP stacks on both sides: every connection's handshake goes
/// through cookies (`mode = "on"`), the backend side is opened with the client's options,
/// and a large download (window scaling, SACK, many segments) arrives intact through the
/// sequence translation, in both modes and both families.
#[test]
fn synproxy_on_serves_real_connections() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    for (mode, config) in [("fullnat", lab_config()), ("nat", nat_config())] {
        lab.start_xvs(&format!("{config}\n[synproxy]\nmode = \"on\"\n"));
        check_rr(&lab, "http://198.18.100.1/");
        check_rr(&lab, "http://[2001:2:0:100::1]/");
        let n = 4 << 20;
        let body = lab.curl(&format!("http://198.18.100.1/bytes/{n}"), &[]);
        assert_eq!(body.len(), n, "{mode}");
        let block: Vec<u8> = (0..=255u8).collect();
        assert!(
            body.chunks(256).all(|c| c == &block[..c.len()]),
            "{mode}: content corrupted"
        );
        let (code, metrics) = admin(&lab, "GET", "/metrics");
        assert_eq!(code, "200");
        let acks: u64 = metrics
            .lines()
            .filter(|l| l.starts_with("xvs_synproxy_acks_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        assert!(acks >= 25, "{mode}: {acks} proxied handshakes in /metrics");
        let out = lab.stop_xvs();
        let line = |k: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(k)?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        assert!(
            line("synproxy_acks=") >= 25,
            "{mode}: final counters: {out}"
        );
        assert!(line("synproxy_syns=") >= line("synproxy_acks="), "{out}");
        assert_eq!(line("drop_syn_cookie_invalid="), 0, "{out}");
    }
}

/// Service `name` as `xvs services --json` shows it (over `[admin] listen`).
fn service_json(lab: &Lab, name: &str) -> serde_json::Value {
    let xvs = env!("CARGO_BIN_EXE_xvs");
    let o = lab.exec(
        "x",
        &[xvs, "services", "--json", "--admin", "127.0.0.1:10249"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no service {name} in {v}"))
        .clone()
}

/// An nft table in namespace `which` counting the packets and bytes (IP length) of
/// `out_match` on output and `in_match` on input; segmentation offloads off, so the kernel
/// counts the packets that are on the wire.
fn count_packets(lab: &Lab, which: &str, dev: &str, out_match: &str, in_match: &str) {
    let o = lab.exec(
        which,
        &[
            "ethtool", "-K", dev, "gso", "off", "gro", "off", "tso", "off",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rules = format!(
        "table inet xvs_count {{\n\
         chain o {{ type filter hook output priority 0; {out_match} counter; }}\n\
         chain i {{ type filter hook input priority 0; {in_match} counter; }}\n\
         }}\n"
    );
    let path = lab.dir.path().join(format!("count-{which}.nft"));
    std::fs::write(&path, rules).unwrap();
    let o = lab.exec(which, &["nft", "-f", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// An nft table in the lab's switch counting the IP packets and bytes backend `i` sends to
/// xvs's SNAT address through its switch port.
fn count_port(lab: &Lab, i: usize) {
    let rules = format!(
        "table netdev xvs_port{i} {{\n\
         chain in {{ type filter hook ingress device p{i} priority 0; \
         ip saddr 198.18.1.{i} ip daddr 198.18.1.254 tcp sport 8080 counter; }}\n\
         }}\n"
    );
    let path = lab.dir.path().join(format!("port{i}.nft"));
    std::fs::write(&path, rules).unwrap();
    let o = lab.exec("s", &["nft", "-f", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The counter of [`count_port`]: (packets, IP bytes).
fn counted_port(lab: &Lab, i: usize) -> (u64, u64) {
    let o = lab.exec(
        "s",
        &[
            "nft",
            "-j",
            "list",
            "table",
            "netdev",
            &format!("xvs_port{i}"),
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for item in v["nftables"].as_array().unwrap() {
        for e in item["rule"]["expr"].as_array().into_iter().flatten() {
            if let Some(c) = e.get("counter") {
                // (At ingress the skb starts at the IP header: its length is the IP length.)
                return (c["packets"].as_u64().unwrap(), c["bytes"].as_u64().unwrap());
            }
        }
    }
    panic!("no counter in {v}");
}

/// The counters of [`count_packets`]: (output packets, output bytes, input packets, input
/// bytes).
fn counted(lab: &Lab, which: &str) -> (u64, u64, u64, u64) {
    let o = lab.exec(which, &["nft", "-j", "list", "table", "inet", "xvs_count"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut by_chain = std::collections::HashMap::new();
    for item in v["nftables"].as_array().unwrap() {
        let Some(rule) = item.get("rule") else {
            continue;
        };
        for e in rule["expr"].as_array().unwrap() {
            if let Some(c) = e.get("counter") {
                by_chain.insert(
                    rule["chain"].as_str().unwrap().to_owned(),
                    (c["packets"].as_u64().unwrap(), c["bytes"].as_u64().unwrap()),
                );
            }
        }
    }
    let (op, ob) = by_chain["o"];
    let (ip, ib) = by_chain["i"];
    (op, ob, ip, ib)
}

/// `xvs services --stats` counts what the client and the backends count themselves: per
/// backend exactly what reached it and what it answered, and for the service what the client
/// sent and received (IP packets and bytes, as `ipvsadm --stats`).
#[test]
fn services_stats_match_the_clients_and_backends_counts() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    count_packets(
        &lab,
        "c",
        "c0",
        "ip daddr 198.18.100.1 tcp dport 80",
        "ip saddr 198.18.100.1 tcp sport 80",
    );
    for i in 1..=3 {
        // What reaches a backend: its own input hook. What it sends: the switch port it
        // leaves on (TCP hands the output hook whole GSO segments; on the wire, with
        // segmentation off on b0, they are packets).
        count_packets(
            &lab,
            &format!("b{i}"),
            "b0",
            "ip daddr 198.18.1.254 tcp sport 8080",
            "ip saddr 198.18.1.254 tcp dport 8080",
        );
        count_port(&lab, i);
    }
    lab.start_xvs(&lab_config());
    // Small answers and one multi-packet download per backend (rr: 3 rounds of 3).
    let mut bodies = http_round(&lab, "http://198.18.100.1/", 6);
    for _ in 0..3 {
        assert_eq!(
            lab.curl("http://198.18.100.1/bytes/30000", &[]).len(),
            30000
        );
    }
    bodies.extend(http_round(&lab, "http://198.18.100.1/", 3));
    // The closing handshakes finish after curl exits.
    std::thread::sleep(Duration::from_millis(1500));
    let xvs = env!("CARGO_BIN_EXE_xvs");
    let web = service_json(&lab, "web");
    let n = |v: &serde_json::Value, k: &str| v["stats"][k].as_u64().unwrap();
    let (c_out, c_out_b, c_in, c_in_b) = counted(&lab, "c");
    assert!(c_out > 0 && c_in > 0);
    assert_eq!(
        (
            n(&web, "in_pkts"),
            n(&web, "in_bytes"),
            n(&web, "out_pkts"),
            n(&web, "out_bytes")
        ),
        (c_out, c_out_b, c_in, c_in_b),
        "the service's traffic is the client's: {web}"
    );
    assert_eq!(n(&web, "conns"), 12, "{web}");
    let mut table = Vec::new();
    for i in 1..=3 {
        let b = web["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["addr"] == format!("198.18.1.{i}:8080"))
            .unwrap();
        let (_, _, b_in, b_in_b) = counted(&lab, &format!("b{i}"));
        let (b_out, b_out_b) = counted_port(&lab, i);
        assert_eq!(
            (
                n(b, "in_pkts"),
                n(b, "in_bytes"),
                n(b, "out_pkts"),
                n(b, "out_bytes")
            ),
            (b_in, b_in_b, b_out, b_out_b),
            "backend {i} counts what reached it and what it sent: {b}"
        );
        assert_eq!(n(b, "conns"), 4, "{b}");
        table.push(format!(
            "198.18.1.{i}:8080 4 {b_in} {b_out} {b_in_b} {b_out_b}"
        ));
    }
    assert_eq!(count(&bodies, "backend-1"), 3, "{bodies:?}");
    // The table says the same (--exact: not scaled to kB).
    let o = lab.exec(
        "x",
        &[
            xvs,
            "services",
            "--stats",
            "--exact",
            "--admin",
            "127.0.0.1:10249",
        ],
    );
    let out = String::from_utf8(o.stdout).unwrap();
    let rows: Vec<String> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    for row in &table {
        assert!(rows.contains(row), "{row} not in\n{out}");
    }
    // Rates: sampled every 2 s; idle now, so the next sample reads zero.
    let o = lab.exec(
        "x",
        &[xvs, "services", "--rate", "--admin", "127.0.0.1:10249"],
    );
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("CONNS/S") && out.contains("INBIT/S"), "{out}");
    lab.stop_xvs();
}
