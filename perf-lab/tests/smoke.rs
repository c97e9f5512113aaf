//! CI smoke test (privileged: needs root, network namespaces, AF_XDP, nft; iptables when
//! installed). Brings small rigs up, runs every target available here for ~2 s at 20 kpps
//! with 64 flows, and asserts behaviour, not rates: traffic reaches every backend, the JSON
//! result has every key, checksums verify at the sinks, `report` writes Markdown and SVG.
//! The restart scenario runs short (2,000 flows, 2 s runs): xvs killed and stopped under
//! load adopts every flow and loses none.
//! Every rig is removed on every exit path (perf-lab run tears its own down; the guard here
//! removes any leftover, even after a panic).

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_perf-lab");

const KEYS: &[&str] = &[
    "scenario",
    "target",
    "mode",
    "duration_s",
    "kind",
    "size",
    "flows",
    "services",
    "backends",
    "queues",
    "rate_pps",
    "offered_pps",
    "forwarded_pps",
    "sent",
    "received",
    "lost",
    "loss_ratio",
    "duplicates",
    "other_frames",
    "bad_checksums",
    "per_backend",
    "latency_us",
    "cpu_ns_per_pkt",
    "lb_process_cpu_ns",
    "lb_core_softirq_ns",
    "lb_core_busy_ratio",
    "target_busy_ratio",
    "rig_core_busy_ratio",
    "cpu_method",
    "napi_busy_poll",
    "ndr_pps",
    "ndr_trials",
    "latency_at_rate",
    "swap",
    "restart",
    "target_counters",
    "notes",
];

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["down", "--prefix", &self.0])
            .status();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd} >/dev/null")])
        .status()
        .is_ok_and(|s| s.success())
}

/// target/debug/xvs of this workspace, built if missing.
fn xvs() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = root.join("target/debug/xvs");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-p", "xvs"])
            .current_dir(&root)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("smoke: cannot build xvs (cargo build -p xvs); skipping the xvs target");
            return None;
        }
    }
    Some(bin)
}

fn run(prefix: &str, json: &Path, target: &str, extra: &[&str]) -> serde_json::Value {
    run_scenario(prefix, json, "one-service", target, extra)
}

fn run_scenario(
    prefix: &str,
    json: &Path,
    scenario: &str,
    target: &str,
    extra: &[&str],
) -> serde_json::Value {
    let flows = if scenario == "restart" { "2000" } else { "64" };
    let latency_rate = if scenario == "restart" { "0" } else { "10000" };
    let mut args = vec![
        "run",
        "--prefix",
        prefix,
        "--scenario",
        scenario,
        "--target",
        target,
        "--duration",
        "2",
        "--rate",
        "20000",
        "--latency-rate",
        latency_rate,
        "--flows",
        flows,
        "--verify",
    ];
    args.extend_from_slice(extra);
    let json_s = json.to_string_lossy().into_owned();
    args.extend(["--json", &json_s]);
    let out = Command::new(BIN)
        .args(&args)
        .output()
        .expect("run perf-lab");
    let json = json.to_path_buf();
    assert!(
        out.status.success(),
        "perf-lab {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("json");
    for k in KEYS {
        assert!(
            v.get(*k).is_some(),
            "{target}: key {k} missing from {json_s}"
        );
    }
    v
}

fn per_backend(v: &serde_json::Value) -> Vec<u64> {
    v["per_backend"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn every_target_forwards_to_every_backend_and_reports() {
    if !is_root() {
        eprintln!("smoke: skipped (needs root for network namespaces and AF_XDP)");
        return;
    }
    let prefix = format!("plsm{}", std::process::id() % 100_000);
    let _cleanup = Cleanup(prefix.clone());
    let dir = std::env::temp_dir().join(format!("perf-lab-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let mut targets = vec!["nft", "l2fwd"];
    if have("iptables-restore") {
        targets.push("iptables");
    } else {
        eprintln!("smoke: iptables-restore not installed; skipping the iptables target");
    }
    let xvs = xvs();
    let xvs_s = xvs.as_ref().map(|p| p.to_string_lossy().into_owned());
    if xvs.is_some() {
        targets.push("xvs");
    }
    let mut jsons = Vec::new();
    for t in &targets {
        let extra: Vec<&str> = match (&xvs_s, *t) {
            (Some(p), "xvs") => vec!["--xvs", p.as_str()],
            _ => vec![],
        };
        let json = dir.join(format!("{t}.json"));
        let v = run(&prefix, &json, t, &extra);
        assert!(
            v["forwarded_pps"].as_f64().unwrap() > 0.0,
            "{t}: nothing forwarded"
        );
        let per = per_backend(&v);
        assert_eq!(per.len(), 3, "{t}");
        assert!(
            per.iter().all(|&n| n > 0),
            "{t}: a backend got nothing: {per:?}"
        );
        assert_eq!(v["bad_checksums"].as_u64(), Some(0), "{t}: bad checksums");
        assert!(v["latency_us"]["p50"].as_f64().is_some(), "{t}: no latency");
        // The latency trial at the common rate ran after the main run, at that rate.
        let at = &v["latency_at_rate"];
        assert_eq!(at["rate_pps"].as_u64(), Some(10_000), "{t}: {at}");
        assert!(at["forwarded_pps"].as_f64().unwrap() > 0.0, "{t}: {at}");
        assert!(at["latency_us"]["p99"].as_f64().is_some(), "{t}: {at}");
        // A busy-polling target's CPU comes from its own busy count (xvs: its metrics
        // endpoint; l2fwd: its stats file): it must have been read, and be a share.
        let busy = v["target_busy_ratio"].as_f64();
        assert!(
            busy.is_some_and(|b| b > 0.0 && b <= 1.0),
            "{t}: target_busy_ratio {busy:?}"
        );
        assert!(v["cpu_ns_per_pkt"].as_f64().is_some(), "{t}: no CPU figure");
        // The AF_XDP targets say whether they busy-polled their NAPI (not by default), the
        // kernel targets have no such setting.
        let busy_poll = if matches!(*t, "xvs" | "l2fwd") {
            serde_json::Value::Bool(false)
        } else {
            serde_json::Value::Null
        };
        assert_eq!(v["napi_busy_poll"], busy_poll, "{t}");
        jsons.push(json);
    }
    // Saturation mode: a burst circulates through the reflectors.
    let json = dir.join("nft-saturation.json");
    let v = run(
        &prefix,
        &json,
        "nft",
        &["--mode", "saturation", "--burst", "256"],
    );
    assert!(
        v["forwarded_pps"].as_f64().unwrap() > 0.0,
        "saturation: nothing circulated"
    );
    assert_eq!(v["mode"], "saturation");
    jsons.push(json);
    // The same loop through an AF_XDP target (its own XDP program on the backend-side veth
    // takes the reflected frames); the reflector counts every backend.
    if let Some(p) = &xvs_s {
        let json = dir.join("xvs-saturation.json");
        let v = run(
            &prefix,
            &json,
            "xvs",
            &[
                "--mode",
                "saturation",
                "--burst",
                "256",
                "--xvs",
                p.as_str(),
            ],
        );
        assert!(v["forwarded_pps"].as_f64().unwrap() > 0.0, "xvs saturation");
        let per = per_backend(&v);
        assert!(
            per.len() == 3 && per.iter().all(|&n| n > 0),
            "xvs saturation per backend: {per:?}"
        );
        assert!(v["rig_core_busy_ratio"].as_f64().is_some_and(|b| b > 0.0));
        assert_eq!(v["napi_busy_poll"], false, "xvs saturation");
        jsons.push(json);
    }

    // The restart scenario: xvs only (others are refused before any rig is built); killed,
    // then stopped, under load, the new process adopts every flow and every flow continues.
    let refused = Command::new(BIN)
        .args(["run", "--scenario", "restart", "--target", "nft", "--json"])
        .arg(dir.join("refused.json"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("only --target xvs"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    if let Some(p) = &xvs_s {
        let json = dir.join("xvs-restart.json");
        let v = run_scenario(&prefix, &json, "restart", "xvs", &["--xvs", p.as_str()]);
        for signal in ["kill", "term"] {
            let r = &v["restart"][signal];
            assert_eq!(r["flows_before"].as_u64(), Some(2000), "{signal}: {r}");
            assert_eq!(r["flows_adopted"].as_u64(), Some(2000), "{signal}: {r}");
            assert_eq!(r["flows_seen"].as_u64(), Some(2000), "{signal}: {r}");
            assert_eq!(r["flows_checked"].as_u64(), Some(2000), "{signal}: {r}");
            assert_eq!(r["flows_lost"].as_u64(), Some(0), "{signal}: {r}");
            // Traffic came back, after a gap: a restart is not free.
            assert!(
                r["signal_to_forward_ms"].as_f64().is_some(),
                "{signal}: {r}"
            );
            assert!(
                r["gap_pkts"].as_u64().is_some_and(|n| n > 0),
                "{signal}: {r}"
            );
            assert!(r["phases_ms"]["ready"].as_f64().is_some(), "{signal}: {r}");
        }
        assert!(!Path::new(&format!("/dev/shm/perf-lab-{prefix}")).exists());
        jsons.push(json);
    }

    let out_dir = dir.join("report");
    let mut args = vec!["report".to_owned()];
    args.extend(jsons.iter().map(|p| p.to_string_lossy().into_owned()));
    args.extend(["--out".to_owned(), out_dir.to_string_lossy().into_owned()]);
    let st = Command::new(BIN).args(&args).status().unwrap();
    assert!(st.success());
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(md.contains("## one-service (generator mode)"), "{md}");
    assert!(md.contains("| nft |"));
    assert!(md.contains("Latency at one offered rate"), "{md}");
    if xvs.is_some() {
        assert!(md.contains("| xvs | kill | 1 |"), "{md}");
    }
    for f in [
        "one-service-generator-rate.svg",
        "one-service-generator-latency.svg",
        "one-service-saturation-rate.svg",
    ] {
        let svg = std::fs::read_to_string(out_dir.join(f)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{f}"
        );
    }

    drop(_cleanup);
    let list = String::from_utf8(
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        !list.lines().any(|l| l.starts_with(&format!("{prefix}-"))),
        "namespaces left: {list}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
