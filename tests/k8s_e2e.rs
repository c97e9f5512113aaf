//! End-to-end tests of control-plane churn with the Kubernetes source: xvs in the netns lab,
//! watching `tests/assets/fake-kube-api.py` (inside the xvs node), whose watches deliver the
//! changes the tests ask for through its `/__control/*` endpoints.
//!
//! The Service default/web (198.18.100.1) has a TCP port "http" (80 -> 8080) and a UDP port
//! "echo" (9000), both backed by 198.18.1.1-3 in the EndpointSlice web-x1.
//!
//! Run as root: `cargo test --test k8s_e2e`.

mod common;
use common::*;

use std::process::{Child, Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const API: &str = "http://127.0.0.1:16443";
const VIP: &str = "198.18.100.1";
const HTTP_SERVICE: &str = "default/web:http";
/// `[kubernetes] min_sync_period` of these tests.
const MIN_SYNC: Duration = Duration::from_secs(1);
/// The default `[flowtable] removal_grace`: two `min_sync_period`s plus one second.
const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// The fake API server in the xvs node; killed on drop.
struct FakeApi(Child);

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A lab whose xvs follows the fake API server (dropped first, then the lab).
struct K8sLab {
    _api: FakeApi,
    lab: Lab,
}

impl K8sLab {
    /// The lab, the fake API server, and xvs on lab.toml's dataplane with a `[kubernetes]`
    /// table (`min_sync_period = "1s"`) and `flowtable_extra` appended to `[flowtable]`;
    /// returns once xvs forwards to the three backends of both ports.
    fn up(flowtable_extra: &str) -> K8sLab {
        // (`Lab::up` caps the client's receive buffer, so downloads stay on the wire.)
        let mut lab = Lab::up();
        let api = FakeApi(
            Command::new("ip")
                .args(["netns", "exec", &lab.ns("x"), "python3"])
                .arg(root().join("tests/assets/fake-kube-api.py"))
                .arg("16443")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        wait_for("the fake API server", Duration::from_secs(10), || {
            let o = lab.exec(
                "x",
                &[
                    "curl",
                    "-sf",
                    "--max-time",
                    "1",
                    &format!("{API}/api/v1/nodes"),
                ],
            );
            o.status.success().then_some(())
        });
        let kubeconfig = lab.dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!("apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {API}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\nusers:\n- name: fake\n  user: {{}}\ncurrent-context: fake\n"),
        )
        .unwrap();
        let lab_toml = lab_config();
        let dataplane_and_rest = lab_toml
            [lab_toml.find("[dataplane]").unwrap()..lab_toml.find("[[services]]").unwrap()]
            .replacen(
                "[flowtable]\n",
                &format!("[flowtable]\n{flowtable_extra}"),
                1,
            );
        let config = format!(
            "[node]\nname = \"xvs-lab\"\naddresses = [\"198.18.0.1\"]\n{dataplane_and_rest}\n[kubernetes]\nkubeconfig = \"{}\"\nmin_sync_period = \"{}s\"\n{}",
            kubeconfig.display(),
            MIN_SYNC.as_secs(),
            &lab_toml[lab_toml.find("[[neighbours]]").unwrap()..]
        );
        lab.start_xvs(&config);
        wait_for(
            "the first sync with three backends per port",
            Duration::from_secs(20),
            || {
                let all = ["198.18.1.1", "198.18.1.2", "198.18.1.3"];
                let ok = admin(&lab, "GET", "/healthz").0 == "200"
                    && backends(&lab, HTTP_SERVICE) == all
                    && backends(&lab, "default/web:echo") == all;
                ok.then_some(())
            },
        );
        K8sLab { _api: api, lab }
    }

    /// `POST /__control/{action}` to the fake API server with the JSON `body`.
    fn control(&self, action: &str, body: &str) {
        let o = self.lab.exec(
            "x",
            &[
                "curl",
                "-sS",
                "--fail",
                "--max-time",
                "3",
                "-X",
                "POST",
                "-d",
                body,
                &format!("{API}/__control/{action}"),
            ],
        );
        assert!(
            o.status.success(),
            "{action} {body}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Calls `probe` every 50 ms until it answers, for at most `limit`; panics naming `what`.
fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "no {what} after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn admin_json(lab: &Lab, path: &str) -> serde_json::Value {
    let (code, body) = admin(lab, "GET", path);
    assert_eq!(code, "200", "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// The backend IPs of service `name` (sorted; empty when it is not there).
fn backends(lab: &Lab, name: &str) -> Vec<String> {
    let (code, body) = admin(lab, "GET", "/v1/services");
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
        return vec![format!("/v1/services answered {code}: {body}")];
    };
    let mut ips: Vec<String> = v["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["name"] == name)
        .flat_map(|s| s["backends"].as_array().cloned().unwrap_or_default())
        .map(|b| ip_of(b["addr"].as_str().unwrap_or_default()))
        .collect();
    ips.sort();
    ips
}

fn ip_of(addr: &str) -> String {
    addr.rsplit_once(':').map_or(addr, |(ip, _)| ip).to_owned()
}

/// `(flows_resteered, flows_ended)` of `/v1/stats`.
fn governance(lab: &Lab) -> (u64, u64) {
    let v = admin_json(lab, "/v1/stats");
    let g = &v["governance"];
    (
        g["flows_resteered"].as_u64().unwrap(),
        g["flows_ended"].as_u64().unwrap(),
    )
}

/// The backend IP of the client's established TCP flow to the VIP (waits up to 10 s).
fn download_backend(lab: &Lab) -> String {
    wait_for(
        "established TCP flow to the VIP",
        Duration::from_secs(10),
        || {
            let v = admin_json(lab, "/v1/flows?limit=1000");
            v["flows"].as_array()?.iter().find_map(|f| {
                (f["protocol"] == "tcp"
                    && f["vip"] == format!("{VIP}:80")
                    && f["state"] == "ESTABLISHED")
                    .then(|| ip_of(f["backend"].as_str().unwrap()))
            })
        },
    )
}

/// A download of `bytes` from the VIP at 1 MiB/s in the background, body captured; curl
/// gives up when it gets less than 1 KiB/s for 5 s (a flow that was ended) and after 60 s.
fn download(lab: &Lab, bytes: usize) -> JoinHandle<Output> {
    let ns = lab.ns("c");
    std::thread::spawn(move || {
        Command::new("ip")
            .args(["netns", "exec", &ns, "curl", "-sS", "--fail"])
            .args(["--max-time", "60", "--limit-rate", "1M"])
            .args(["--speed-limit", "1024", "--speed-time", "5"])
            .arg(format!("http://{VIP}/bytes/{bytes}"))
            .output()
            .unwrap()
    })
}

/// What `scripts/lab-backend.py` sends for `/bytes/N`.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 256) as u8).collect()
}

/// UDP flows from client ports 40001-40003 (rr: one per backend); `(port, backend name)`.
fn udp_flows(lab: &Lab) -> Vec<(u16, String)> {
    (40001..=40003)
        .map(|port| {
            let reply = lab.udp(VIP, 9000, port, "hello");
            let (name, _) = reply.split_once(' ').unwrap();
            (port, name.to_owned())
        })
        .collect()
}

/// `backend-N` for 198.18.1.N.
fn name_of(ip: &str) -> String {
    format!("backend-{}", ip.rsplit('.').next().unwrap())
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `churn` (given the download's backend IP, it asks the fake API server for a change
/// and returns the services' backends it should make absent for a while) during a 10 MiB
/// download at 1 MiB/s, with UDP flows to each backend: the absence is seen, the backends
/// come back, and then, past the default grace and the second removal pass, no flow was ended
/// or re-steered, the UDP flows keep their backends, the download completes intact, and new
/// connections reach all three backends.
fn churn_keeps_flows(churn: impl FnOnce(&K8sLab, &str) -> Vec<String>) {
    let mut k = K8sLab::up("");
    let udp = udp_flows(&k.lab);
    // 10 MiB at 1 MiB/s: it outlasts the churn, the grace and the second removal pass.
    const BYTES: usize = 10 << 20;
    let dl = download(&k.lab, BYTES);
    let target = download_backend(&k.lab);
    assert!(
        udp.iter().any(|(_, o)| *o == name_of(&target)),
        "no UDP flow to {target}: {udp:?}"
    );
    let absent = churn(&k, &target);
    let churned = Instant::now();
    wait_for("the removal published", Duration::from_secs(5), || {
        let now = backends(&k.lab, HTTP_SERVICE);
        (!absent.iter().any(|a| now.contains(a))).then_some(())
    });
    wait_for("the addition published", Duration::from_secs(5), || {
        (backends(&k.lab, HTTP_SERVICE).len() == 3).then_some(())
    });
    std::thread::sleep(
        (churned + DEFAULT_GRACE + Duration::from_secs(2)).duration_since(Instant::now()),
    );
    assert_eq!(governance(&k.lab), (0, 0), "flows ended or re-steered");
    assert!(
        !dl.is_finished(),
        "the download ended before the grace was over: {}",
        stderr_of(&dl.join().unwrap())
    );
    for (port, owner) in &udp {
        let reply = k.lab.udp(VIP, 9000, *port, "again");
        assert!(
            reply.starts_with(&format!("{owner} ")),
            "UDP flow from port {port} left {owner}: {reply}"
        );
    }
    let out = dl.join().unwrap();
    assert!(
        out.status.success(),
        "the download through {target} failed: {}",
        stderr_of(&out)
    );
    assert_eq!(out.stdout.len(), BYTES);
    assert!(out.stdout == pattern(BYTES), "the download's bytes differ");
    assert_eq!(governance(&k.lab), (0, 0), "flows ended or re-steered");
    check_rr(&k.lab, &format!("http://{VIP}/"));
    k.lab.stop_xvs();
}

/// Control-plane churn does not end flows: the backend of a TCP download moves from
/// EndpointSlice web-x1 to web-x2, the removal first and the addition one `min_sync_period`
/// later (it is absent from the service for a while).
#[test]
fn endpoint_moving_between_slices_keeps_its_flows() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    churn_keeps_flows(|k, target| {
        k.control(
            "move",
            &format!(
                r#"{{"ip": "{target}", "from": "web-x1", "to": "web-x2", "delay": {}}}"#,
                MIN_SYNC.as_secs_f64()
            ),
        );
        vec![target.to_owned()]
    });
}

/// The same when the whole EndpointSlice is replaced: web-x1 is deleted, and one
/// `min_sync_period` later web-x2 brings the same endpoints (the service has no backend for
/// a while).
#[test]
fn endpoint_slice_replaced_keeps_its_flows() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    churn_keeps_flows(|k, _| {
        k.control(
            "replace",
            &format!(
                r#"{{"from": "web-x1", "to": "web-x2", "delay": {}}}"#,
                MIN_SYNC.as_secs_f64()
            ),
        );
        (1..=3).map(|i| format!("198.18.1.{i}")).collect()
    });
}

/// A backend removed for good, for longer than the removal grace (5 s here), is handled as
/// before the grace existed: nothing happens to its flows within the grace; after it, its
/// TCP download is ended (the client's segments find no flow: the download stalls), its UDP
/// flow moves to another backend, and new connections never reach it. Added back, it takes
/// new connections again.
#[test]
fn backend_removed_past_the_grace_loses_its_flows() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const GRACE: Duration = Duration::from_secs(5);
    let mut k = K8sLab::up(&format!("removal_grace = \"{}s\"\n", GRACE.as_secs()));
    let udp = udp_flows(&k.lab);
    // 16 MiB at 1 MiB/s: still running when the grace is over.
    const BYTES: usize = 16 << 20;
    let dl = download(&k.lab, BYTES);
    let target = download_backend(&k.lab);
    let owner = name_of(&target);
    let udp_ports: Vec<u16> = udp
        .iter()
        .filter(|(_, o)| *o == owner)
        .map(|(p, _)| *p)
        .collect();
    assert!(!udp_ports.is_empty(), "no UDP flow to {owner}: {udp:?}");
    k.control("remove", &format!(r#"{{"ip": "{target}"}}"#));
    let removed = Instant::now();
    wait_for("removal published", Duration::from_secs(5), || {
        (backends(&k.lab, HTTP_SERVICE).len() == 2).then_some(())
    });
    assert!(!backends(&k.lab, HTTP_SERVICE).contains(&target));
    // Within the grace: its flows stay.
    let early = k.lab.udp(VIP, 9000, udp_ports[0], "early");
    assert!(
        removed.elapsed() < GRACE,
        "too slow to check within the grace ({:?})",
        removed.elapsed()
    );
    assert!(
        early.starts_with(&format!("{owner} ")),
        "UDP flow re-steered within the grace: {early}"
    );
    assert_eq!(
        governance(&k.lab),
        (0, 0),
        "flows acted on within the grace"
    );
    // New connections avoid it at once.
    let bodies = http_round(&k.lab, &format!("http://{VIP}/"), 6);
    assert_eq!(count(&bodies, &owner), 0, "{bodies:?}");
    // After the grace: the download's flow is ended, the UDP flows re-steered.
    wait_for("flows ended", GRACE + Duration::from_secs(10), || {
        (governance(&k.lab).1 > 0).then_some(())
    });
    assert!(
        removed.elapsed() >= GRACE,
        "flows ended {:?} after the removal",
        removed.elapsed()
    );
    // The second removal pass, a second after the first, finds nothing more.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(governance(&k.lab), (udp_ports.len() as u64, 1));
    for port in &udp_ports {
        let late = k.lab.udp(VIP, 9000, *port, "late");
        assert!(
            !late.starts_with(&format!("{owner} ")),
            "UDP flow from port {port} still goes to the removed {owner}: {late}"
        );
    }
    let out = dl.join().unwrap();
    assert!(
        !out.status.success(),
        "the download from the removed {target} completed"
    );
    assert!(out.stdout.len() < BYTES, "{}", out.stdout.len());
    assert!(
        out.stdout[..] == pattern(out.stdout.len())[..],
        "the bytes received differ"
    );
    let bodies = http_round(&k.lab, &format!("http://{VIP}/"), 6);
    assert_eq!(count(&bodies, &owner), 0, "{bodies:?}");
    // Back in its slice, it takes new connections again.
    k.control(
        "add",
        &format!(r#"{{"ip": "{target}", "slice": "web-x1"}}"#),
    );
    wait_for("addition published", Duration::from_secs(5), || {
        (backends(&k.lab, HTTP_SERVICE).len() == 3).then_some(())
    });
    check_rr(&k.lab, &format!("http://{VIP}/"));
    k.lab.stop_xvs();
}

/// The value of the unlabelled sample (or the exact series) `series` in `metrics`.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
}

/// Network programming latency as kube-proxy measures it: the initial list's slice (whose
/// trigger time is older than xvs) is not observed; each later change is, once, from the
/// fake API's `last-change-trigger-time` to the publish (a bounded latency: within the
/// 300 s bucket). The change counters count it, and the exposition stays valid for promtool.
#[test]
fn network_programming_latency_from_the_trigger_time() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let k = K8sLab::up("");
    let (_, before) = admin(&k.lab, "GET", "/metrics");
    assert_eq!(
        sample(&before, "xvs_network_programming_duration_seconds_count"),
        0.0
    );
    let changes = sample(&before, "xvs_sync_endpoint_changes_total");
    k.control("add", r#"{"ip": "198.18.1.4", "slice": "web-x1"}"#);
    wait_for("the added backend", Duration::from_secs(10), || {
        backends(&k.lab, HTTP_SERVICE)
            .contains(&"198.18.1.4".to_owned())
            .then_some(())
    });
    let metrics = wait_for("the latency observed", Duration::from_secs(5), || {
        let (_, m) = admin(&k.lab, "GET", "/metrics");
        (sample(&m, "xvs_network_programming_duration_seconds_count") >= 1.0).then_some(m)
    });
    let count = sample(&metrics, "xvs_network_programming_duration_seconds_count");
    assert_eq!(count, 1.0, "one change, one observation:\n{metrics}");
    assert_eq!(
        sample(
            &metrics,
            "xvs_network_programming_duration_seconds_bucket{le=\"300\"}"
        ),
        count,
        "{metrics}"
    );
    assert!(sample(&metrics, "xvs_sync_endpoint_changes_total") > changes);
    assert_eq!(sample(&metrics, "xvs_sync_endpoint_changes_pending"), 0.0);
    let o = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(metrics.as_bytes())?;
            c.wait_with_output()
        })
        .expect("promtool (scripts/deps installs it)");
    assert!(
        o.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&o.stdout),
        stderr_of(&o)
    );
}
