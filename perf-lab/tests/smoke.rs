//! CI smoke test (privileged: needs root, network namespaces, AF_XDP, nft; iptables when
//! installed). Brings small rigs up, runs every target available here for ~2 s at 20 kpps
//! with 64 flows, and asserts behaviour, not rates: traffic reaches every backend, the JSON
//! result has every key, checksums verify at the sinks, `report` writes Markdown and SVG.
//! The restart scenario runs short (2,000 flows, 5 s runs): xvs killed and stopped under
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
    "meta",
    "latency_hgrm",
    "bulk_tcp",
    "conn_rate",
];

/// The keys of `meta` (every run's circumstances).
const META_KEYS: &[&str] = &[
    "timestamp_utc",
    "kernel",
    "cpu_model",
    "cores",
    "git_revision",
    "command_line",
];

/// One perf-lab run at a time (the tests of this file share the machine's two cores).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    // A restart comes halfway: 2.5 s leave the new process room to be ready and forward
    // again on a loaded machine (under the whole test suite a start took 1.1 s, and with 1 s
    // left the trial ended before the first packet came back).
    let duration = if scenario == "restart" { "5" } else { "2" };
    let mut args = vec![
        "run",
        "--prefix",
        prefix,
        "--scenario",
        scenario,
        "--target",
        target,
        "--duration",
        duration,
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
    check_meta_and_console(&v, &String::from_utf8_lossy(&out.stderr), &args);
    v
}

/// Every result records when, where and how it was made; the console says it in words, not
/// Rust `Debug` values, without libbpf's informational lines.
fn check_meta_and_console(v: &serde_json::Value, stderr: &str, args: &[&str]) {
    let m = &v["meta"];
    for k in META_KEYS {
        assert!(m.get(*k).is_some(), "meta.{k} missing: {m}");
    }
    let ts = m["timestamp_utc"].as_str().unwrap();
    assert!(ts.len() == 20 && ts.ends_with('Z'), "{ts}");
    assert!(m["cores"].as_u64().is_some_and(|c| c > 0), "{m}");
    assert!(m["kernel"].as_str().is_some_and(|k| !k.is_empty()), "{m}");
    let cmd = m["command_line"].as_str().unwrap();
    assert!(
        cmd.contains(&format!("run {}", args[1..].join(" "))),
        "{cmd}"
    );
    for bad in [
        "Some(",
        "None",
        "libbpf: elf:",
        "libxdp: Falling back",
        "{:?}",
    ] {
        assert!(!stderr.contains(bad), "console shows {bad:?}:\n{stderr}");
    }
    let summary = stderr
        .lines()
        .rfind(|l| l.starts_with("perf-lab: ") && l.contains(" pps"))
        .unwrap_or_else(|| panic!("no summary line:\n{stderr}"));
    assert!(
        summary.contains(&format!(
            "{} {}",
            v["scenario"].as_str().unwrap(),
            v["target"].as_str().unwrap()
        )),
        "{summary}"
    );
}

/// The `.hgrm` files a generator-mode run writes beside its JSON: HdrHistogram's percentile
/// distribution of the packets' latency, ending at 100% with every packet counted.
fn check_hgrm(json: &Path, v: &serde_json::Value) {
    let files = v["latency_hgrm"]
        .as_object()
        .unwrap_or_else(|| panic!("no latency_hgrm: {v}"));
    assert!(
        files.contains_key("main") && files.contains_key("latency_at_rate"),
        "{files:?}"
    );
    for (trial, f) in files {
        let p = json.parent().unwrap().join(f.as_str().unwrap());
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            text.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)\n\n"),
            "{trial}: {text}"
        );
        let rows: Vec<Vec<f64>> = text
            .lines()
            .skip(2)
            .take_while(|l| !l.starts_with('#'))
            .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
            .collect();
        let last = rows.last().unwrap();
        assert_eq!(last[1], 1.0, "{trial}: {text}");
        if trial == "main" {
            let counted = v["received"].as_u64().unwrap() + v["duplicates"].as_u64().unwrap();
            assert_eq!(last[2] as u64, counted, "{trial}: {text}");
            // The median row agrees with the JSON's p50 (same histogram).
            let p50 = v["latency_us"]["p50"].as_f64().unwrap();
            let row = rows.iter().find(|r| r[1] >= 0.5).unwrap();
            assert!(
                (row[0] - p50).abs() <= p50 * 0.002 + 0.01,
                "{row:?} vs {p50}"
            );
        }
        assert!(text.contains("#[Mean    = "), "{text}");
    }
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
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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
        check_hgrm(&json, &v);
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
    assert!(v["latency_hgrm"].is_null(), "saturation has no latency");
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
    // Saturation mode has no latency: no plot of it.
    assert!(!out_dir.join("one-service-saturation-latency.svg").exists());
    let sat = std::fs::read_to_string(out_dir.join("one-service-saturation-rate.svg")).unwrap();
    assert!(!sat.contains("offered"), "{sat}");
    let lat = std::fs::read_to_string(out_dir.join("one-service-generator-latency.svg")).unwrap();
    assert!(lat.contains("data-scale=\"log\""), "{lat}");

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

/// The real-client scenarios through every target that translates addresses (xvs, nft,
/// iptables when installed), short: iperf3 1 and 8 streams for 1 s each, ab for 1 s.
#[test]
fn real_clients_through_every_target() {
    if !is_root() {
        eprintln!("smoke: skipped (needs root for network namespaces and AF_XDP)");
        return;
    }
    assert!(
        have("iperf3") && have("ab"),
        "iperf3 or ab is not installed: scripts/deps installs them (apt-get install iperf3 apache2-utils)"
    );
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let prefix = format!("plrc{}", std::process::id() % 100_000);
    let _cleanup = Cleanup(prefix.clone());
    let dir = std::env::temp_dir().join(format!("perf-lab-smoke-rc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut targets = vec!["nft"];
    if have("iptables-restore") {
        targets.push("iptables");
    }
    let xvs = xvs().map(|p| p.to_string_lossy().into_owned());
    if xvs.is_some() {
        targets.push("xvs");
    }
    // Refused before any rig is built: l2fwd rewrites MACs one way only, and real clients
    // have no saturation mode.
    for (t, mode, why) in [
        ("l2fwd", "generator", "both ways"),
        ("nft", "saturation", "no saturation mode"),
    ] {
        let out = Command::new(BIN)
            .args([
                "run",
                "--scenario",
                "bulk-tcp",
                "--target",
                t,
                "--mode",
                mode,
                "--json",
            ])
            .arg(dir.join("refused.json"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{err}");
    }
    let mut jsons = Vec::new();
    for t in &targets {
        for scenario in ["bulk-tcp", "conn-rate"] {
            let json = dir.join(format!("{scenario}-{t}.json"));
            let json_s = json.to_string_lossy().into_owned();
            let mut args = vec![
                "run",
                "--prefix",
                &prefix,
                "--scenario",
                scenario,
                "--target",
                t,
                "--duration",
                "1",
                "--json",
                &json_s,
            ];
            if let (Some(p), "xvs") = (&xvs, *t) {
                args.extend(["--xvs", p.as_str()]);
            }
            let out = Command::new(BIN).args(&args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "perf-lab {args:?}:\n{stderr}");
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            for k in KEYS {
                assert!(v.get(*k).is_some(), "{t} {scenario}: key {k} missing");
            }
            check_meta_and_console(&v, &stderr, &args);
            assert!(
                v["forwarded_pps"].as_f64().unwrap() > 0.0,
                "{t} {scenario}: {v}"
            );
            if scenario == "bulk-tcp" {
                let runs = v["bulk_tcp"].as_array().unwrap();
                let streams: Vec<u64> = runs
                    .iter()
                    .map(|r| r["streams"].as_u64().unwrap())
                    .collect();
                assert_eq!(streams, [1, 8], "{t}");
                for r in runs {
                    assert!(r["gbit_s"].as_f64().unwrap() > 0.01, "{t}: {r}");
                    assert!(r["backend_packets"].as_u64().unwrap() > 1000, "{t}: {r}");
                    assert!(r["rig_core_busy_ratio"].as_f64().unwrap() > 0.0, "{t}: {r}");
                }
                if *t == "xvs" {
                    let m = &runs[0]["target_metrics"];
                    assert!(m["tx_packets"].as_f64().unwrap() > 1000.0, "{m}");
                    assert!(m.get("tx_ring_full").is_some(), "{m}");
                }
            } else {
                let c = &v["conn_rate"];
                assert!(c["completed"].as_u64().unwrap() > 100, "{t}: {c}");
                assert_eq!(c["failed"].as_u64(), Some(0), "{t}: {c}");
                assert_eq!(c["non_2xx"].as_u64(), Some(0), "{t}: {c}");
                assert!(c["latency_ms"]["p99"].as_f64().is_some(), "{t}: {c}");
                // Round robin (xvs) or random (kernel) over every backend.
                let per = per_backend(&v);
                assert!(per.len() == 3 && per.iter().all(|&n| n > 0), "{t}: {per:?}");
            }
            jsons.push(json);
        }
    }
    let out_dir = dir.join("report");
    let st = Command::new(BIN)
        .arg("report")
        .args(&jsons)
        .arg("--out")
        .arg(&out_dir)
        .status()
        .unwrap();
    assert!(st.success());
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(md.contains("## bulk-tcp (real clients)"), "{md}");
    assert!(md.contains("## conn-rate (real clients)"), "{md}");
    for t in &targets {
        assert!(md.contains(&format!("| {t} | 1 | 1 | ")), "{t}:\n{md}");
        assert!(md.contains(&format!("| {t} | 1 | 8 | ")), "{t}:\n{md}");
    }
    for f in [
        "bulk-tcp-generator-rate.svg",
        "conn-rate-generator-rate.svg",
        "conn-rate-generator-latency.svg",
    ] {
        let svg = std::fs::read_to_string(out_dir.join(f)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("class=\"bar\"")
                || svg.contains("class=\"point\""),
            "{f}"
        );
    }
    drop(_cleanup);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--mode dsr` of bulk-tcp: downloads through xvs by direct server return (`encap = "l2"`:
/// backend 1 holds the VIP on `lo` and replies on its own link to the client) and through
/// nft's DNAT, both moving data; xvs forwards only the client's direction (its transmitted
/// packets are the client's ACKs, far fewer than the data segments the client received).
/// Prints xvs-DSR against nft (speed is not asserted).
#[test]
fn bulk_tcp_dsr_downloads_bypass_xvs() {
    if !is_root() {
        eprintln!("smoke: skipped (needs root for network namespaces and AF_XDP)");
        return;
    }
    assert!(
        have("iperf3"),
        "iperf3 is not installed: scripts/deps installs it"
    );
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let prefix = format!("plds{}", std::process::id() % 100_000);
    let _cleanup = Cleanup(prefix.clone());
    let dir = std::env::temp_dir().join(format!("perf-lab-smoke-dsr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Refused before any rig is built: DSR is a variant of bulk-tcp only.
    let out = Command::new(BIN)
        .args([
            "run",
            "--scenario",
            "conn-rate",
            "--target",
            "nft",
            "--mode",
            "dsr",
            "--json",
        ])
        .arg(dir.join("refused.json"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bulk-tcp only"));
    let Some(xvs) = xvs().map(|p| p.to_string_lossy().into_owned()) else {
        return;
    };
    let mut gbit = Vec::new();
    for t in ["xvs", "nft"] {
        let json = dir.join(format!("dsr-{t}.json"));
        let json_s = json.to_string_lossy().into_owned();
        let mut args = vec![
            "run",
            "--prefix",
            &prefix,
            "--scenario",
            "bulk-tcp",
            "--target",
            t,
            "--mode",
            "dsr",
            "--duration",
            "1",
            "--json",
            &json_s,
        ];
        if t == "xvs" {
            args.extend(["--xvs", xvs.as_str()]);
        }
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "perf-lab {args:?}:\n{stderr}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["mode"], "dsr", "{t}");
        let runs = v["bulk_tcp"].as_array().unwrap();
        for r in runs {
            assert!(r["gbit_s"].as_f64().unwrap() > 0.01, "{t}: {r}");
        }
        if t == "xvs" {
            let r = &runs[1];
            let tx = r["target_metrics"]["tx_packets"].as_f64().unwrap();
            let drops = r["target_metrics"]["drops"].as_f64().unwrap_or(0.0);
            // 8 streams for a second: far more data segments than 1/10 of them as ACKs.
            let segments = r["gbit_s"].as_f64().unwrap() * 1e9 / 8.0 / 1500.0;
            assert!(tx > 100.0, "xvs forwarded the client's packets: {r}");
            assert!(
                tx < segments,
                "xvs did not carry the replies: {tx} vs {segments}: {r}"
            );
            assert!(drops < tx / 10.0, "{r}");
        }
        gbit.push(
            runs.iter()
                .map(|r| r["gbit_s"].as_f64().unwrap())
                .collect::<Vec<_>>(),
        );
    }
    eprintln!(
        "smoke: bulk-tcp downloads, Gbit/s at 1 and 8 streams: xvs-DSR {:?} vs nft {:?}",
        gbit[0], gbit[1]
    );
    drop(_cleanup);
    let _ = std::fs::remove_dir_all(&dir);
}
