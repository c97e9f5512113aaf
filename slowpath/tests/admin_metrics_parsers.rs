//! `/metrics` of a running admin server, read by Prometheus' own tools: `promtool check
//! metrics` (the Prometheus server's parser and its naming lint; exit 0 only when the text
//! parses and nothing is linted) and the Python client library's parser
//! (`prometheus_client.parser`), which gives the families, their types and samples, so the
//! histograms are found as Prometheus sees them, not as this crate wrote them.
//!
//! Both tools come from Debian packages that `scripts/deps` installs (`prometheus`,
//! `python3-prometheus-client` for the system's `/usr/bin/python3`). A missing tool fails the
//! test: it is not skipped.

mod admin_common;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use admin_common::*;
use serde_json::Value;

/// Runs `cmd` with `input` on stdin; returns (exit code, stdout, stderr).
fn run(cmd: &mut Command, input: &str) -> (i32, String, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (scripts/deps installs it)"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scrape() -> String {
    let fake = Fake::new();
    let s = serve(&fake);
    let r = get(s.listen, "/metrics");
    assert_eq!(r.status, 200);
    s.stop();
    r.body
}

#[test]
fn promtool_accepts_the_exposition_without_lint_problems() {
    let text = scrape();
    let (code, out, err) = run(Command::new("promtool").args(["check", "metrics"]), &text);
    assert_eq!(code, 0, "promtool check metrics:\n{out}{err}\n---\n{text}");
    // And it is not lenient: a counter without `_total` and a sample of no family fail.
    let bad = "# HELP xvs_x x\n# TYPE xvs_x counter\nxvs_x 1\n";
    let (code, out, err) = run(Command::new("promtool").args(["check", "metrics"]), bad);
    assert_ne!(code, 0, "{out}{err}");
}

/// The families as `prometheus_client.parser` reads them: name → (type, samples as
/// (sample name, labels, value)).
type Families = BTreeMap<String, (String, Vec<(String, BTreeMap<String, String>, f64)>)>;

const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    out[fam.name] = [fam.type, [[s.name, s.labels, s.value] for s in fam.samples]]
print(json.dumps(out))
"#;

fn parse(text: &str) -> Families {
    let (code, out, err) = run(Command::new("/usr/bin/python3").args(["-c", PARSE]), text);
    assert_eq!(
        code, 0,
        "prometheus_client.parser failed:\n{err}\n---\n{text}"
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    v.as_object()
        .unwrap()
        .iter()
        .map(|(name, f)| {
            let kind = f[0].as_str().unwrap().to_owned();
            let samples = f[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let labels = s[1]
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                        .collect();
                    (
                        s[0].as_str().unwrap().to_owned(),
                        labels,
                        s[2].as_f64().unwrap(),
                    )
                })
                .collect();
            (name.clone(), (kind, samples))
        })
        .collect()
}

/// A histogram family's `(le, cumulative count)` buckets, `_sum` and `_count`.
fn histogram(f: &Families, name: &str) -> (Vec<(f64, f64)>, f64, f64) {
    let (kind, samples) = f
        .get(name)
        .unwrap_or_else(|| panic!("no family {name}: {:?}", f.keys()));
    assert_eq!(kind, "histogram", "{name}");
    let mut buckets = Vec::new();
    let (mut sum, mut count) = (None, None);
    for (sample, labels, v) in samples {
        match sample.strip_prefix(name) {
            Some("_bucket") => {
                let le = &labels["le"];
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                buckets.push((le, *v));
            }
            Some("_sum") => sum = Some(*v),
            Some("_count") => count = Some(*v),
            _ => panic!("unexpected sample {sample} in {name}"),
        }
    }
    (buckets, sum.expect("_sum"), count.expect("_count"))
}

fn count_le(buckets: &[(f64, f64)], le: f64) -> f64 {
    buckets
        .iter()
        .find(|(b, _)| *b == le)
        .unwrap_or_else(|| panic!("no bucket le={le}"))
        .1
}

#[test]
fn the_python_client_parser_finds_the_histograms_and_families() {
    let f = parse(&scrape());

    // Sync duration: kube-proxy's 15 exponential buckets from 1 ms, then +Inf.
    let (b, sum, count) = histogram(&f, "xvs_sync_duration_seconds");
    assert_eq!(b.len(), 16, "{b:?}");
    assert_eq!(b[0].0, 0.001);
    assert_eq!(b[14].0, 16.384);
    assert_eq!(b[15].0, f64::INFINITY);
    assert!(b.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    // The fake observed 0.004, 0.1 and 20 s.
    assert_eq!(count_le(&b, 0.004), 1.0);
    assert_eq!(count_le(&b, 0.064), 1.0);
    assert_eq!(count_le(&b, 0.128), 2.0);
    assert_eq!(count_le(&b, 16.384), 2.0);
    assert_eq!(count_le(&b, f64::INFINITY), 3.0);
    assert_eq!(count, 3.0);
    assert!((sum - 20.104).abs() < 1e-9, "{sum}");

    // Network programming latency: kube-proxy's buckets, 0 to 300 s.
    let (b, sum, count) = histogram(&f, "xvs_network_programming_duration_seconds");
    assert_eq!(b.len(), 82, "{b:?}");
    assert_eq!(b[80].0, 300.0);
    assert_eq!(count_le(&b, 0.25), 0.0);
    assert_eq!(count_le(&b, 0.5), 1.0);
    // 1.0 lies on a bound: `le` includes it.
    assert_eq!(count_le(&b, 1.0), 2.0);
    assert_eq!(count_le(&b, 60.0), 2.0);
    assert_eq!(count_le(&b, 65.0), 3.0);
    assert_eq!((count, sum), (3.0, 62.3));

    // The last duration is a gauge of its own name now.
    let gauge = |name: &str| -> f64 {
        let (kind, samples) = &f[name];
        assert_eq!(kind, "gauge", "{name}");
        samples[0].2
    };
    assert_eq!(gauge("xvs_sync_last_duration_seconds"), 0.004);
    assert_eq!(gauge("xvs_sync_endpoint_changes_pending"), 4.0);
    assert_eq!(gauge("xvs_sync_service_changes_pending"), 1.0);
    // The parser names counters without `_total`.
    assert_eq!(f["xvs_sync_endpoint_changes"].1[0].2, 40.0);
    assert_eq!(f["xvs_sync_service_changes"].1[0].2, 12.0);

    // Flow sync's refusals: one sample per reason, the fake's counts.
    let (kind, samples) = &f["xvs_peer_sync_messages_rejected"];
    assert_eq!(kind, "counter");
    for (i, r) in slowpath::flowsync::wire::Refused::ALL.iter().enumerate() {
        let s = samples
            .iter()
            .find(|(_, l, _)| l["reason"] == r.name())
            .unwrap_or_else(|| panic!("no reason {}", r.name()));
        assert_eq!(s.2, i as f64, "{}", r.name());
    }

    // build_info: a constant 1 with the version, revision and compiler.
    let (kind, samples) = &f["xvs_build_info"];
    assert_eq!(kind, "gauge");
    let (_, labels, v) = &samples[0];
    assert_eq!(*v, 1.0);
    assert_eq!(labels["version"], env!("CARGO_PKG_VERSION"));
    assert!(!labels["revision"].is_empty());
    assert!(labels["rustc"].starts_with("rustc "), "{labels:?}");

    // The process collector's families, of this (test) process.
    for (name, kind) in [
        ("process_cpu_seconds", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        let (k, samples) = f.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(k, kind, "{name}");
        assert!(
            samples[0].2 > 0.0 || name == "process_cpu_seconds",
            "{name}"
        );
    }

    // Per-worker families carry the worker, its interfaces and its queue.
    let (_, samples) = &f["xvs_rx_packets"];
    let w1 = samples
        .iter()
        .find(|(_, l, _)| l["worker"] == "1")
        .expect("worker 1");
    assert_eq!(w1.1["interface"], "eth0,eth1");
    assert_eq!(w1.1["queue"], "1");
    assert_eq!(w1.2, 101.0);
}

#[test]
fn every_family_is_in_the_docs_metrics_table() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
            .expect("docs/metrics.md");
    let text = scrape();
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(families.len() > 50, "{families:?}");
    let missing: Vec<&&str> = families
        .iter()
        .filter(|f| !readme.contains(&format!("| `{f}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/metrics.md's table: {missing:?}"
    );
}
