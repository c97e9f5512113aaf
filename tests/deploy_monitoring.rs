//! The monitoring shipped in deploy/, checked from outside: the Prometheus alert rules
//! (`deploy/prometheus/xvs-rules.yaml`) pass `promtool check rules` and their unit tests
//! (`promtool test rules deploy/prometheus/xvs-rules.test.yaml`), every alert has a test
//! that expects it to fire, and every metric the rules and the Grafana dashboard
//! (`deploy/grafana/xvs.json`) query is a family xvs exports (docs/metrics.md's table, which
//! `slowpath/tests/admin_metrics_parsers.rs` keeps equal to `/metrics`).
//!
//! promtool comes from Debian's `prometheus` package (`scripts/deps`); a missing one fails the
//! test.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rules() -> PathBuf {
    root().join("deploy/prometheus/xvs-rules.yaml")
}

fn rules_test() -> PathBuf {
    root().join("deploy/prometheus/xvs-rules.test.yaml")
}

fn promtool(args: &[&str], file: &Path) -> Output {
    Command::new("promtool")
        .args(args)
        .arg(file)
        .output()
        .expect("run promtool (scripts/deps installs the prometheus package)")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn yaml(path: &Path) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The metric families of docs/metrics.md's table.
fn families() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(root().join("docs/metrics.md")).unwrap();
    let f: BTreeSet<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split_once("` |"))
        .map(|(name, _)| name.to_owned())
        .filter(|n| n.starts_with("xvs_"))
        .collect();
    assert!(f.len() > 80, "{f:?}");
    f
}

/// The `xvs_*` names an expression reads (a histogram's `_bucket`/`_sum`/`_count` as its
/// family).
fn metrics_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("xvs_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name)
            .to_owned();
        out.push(family);
    }
    out
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let o = promtool(&["check", "rules"], &rules());
    assert!(o.status.success(), "{}", text(&o));
    let groups = yaml(&rules());
    let alerts: Vec<&Value> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert!(
        text(&o).contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{}",
        text(&o)
    );
    let o = promtool(&["test", "rules"], &rules_test());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("SUCCESS"), "{}", text(&o));

    // Every alert has a test that expects it to fire.
    let tests = yaml(&rules_test());
    let fired: BTreeSet<&str> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|c| c["alertname"].as_str())
        .collect();
    for a in &alerts {
        let name = a["alert"].as_str().expect("every rule is an alert");
        assert!(fired.contains(name), "no test expects {name} to fire");
        assert!(
            ["critical", "warning"].contains(&a["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity"
        );
        assert!(a["annotations"]["summary"].is_string(), "{name}: summary");
    }
    // The brief's list: drops, ring overflow, no_socket, health, refusals, sync peers, BGP.
    for name in [
        "XvsCapacityDrops",
        "XvsRingOverflow",
        "XvsFramesWithoutSocket",
        "XvsUnhealthy",
        "XvsRefusedObjects",
        "XvsSyncPeersDown",
        "XvsBgpNotAnnouncing",
    ] {
        assert!(fired.contains(name), "{name}");
    }
}

/// promtool is not lenient: a test expecting another annotation fails, and so does a
/// rules file with an expression that does not parse.
#[test]
fn promtool_fails_a_wrong_expectation_and_a_broken_rule() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(rules(), dir.path().join("xvs-rules.yaml")).unwrap();
    let t = std::fs::read_to_string(rules_test()).unwrap();
    assert!(t.contains("drops 2.001k frames/s"));
    let wrong = dir.path().join("wrong.test.yaml");
    std::fs::write(
        &wrong,
        t.replace("drops 2.001k frames/s", "drops 2k frames/s"),
    )
    .unwrap();
    let o = promtool(&["test", "rules"], &wrong);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("XvsDropsRising"), "{}", text(&o));

    let r = std::fs::read_to_string(rules()).unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        r.replacen("rate(xvs_drops_total[5m])", "rate(xvs_drops_total[5m]", 1),
    )
    .unwrap();
    let o = promtool(&["check", "rules"], &broken);
    assert!(!o.status.success(), "{}", text(&o));
}

#[test]
fn the_rules_query_only_families_xvs_exports() {
    let known = families();
    let groups = yaml(&rules());
    for g in groups["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            let expr = r["expr"].as_str().unwrap();
            let used = metrics_in(expr);
            assert!(!used.is_empty(), "{expr}");
            for m in used {
                assert!(
                    known.contains(&m),
                    "{} queries {m}, which xvs does not export",
                    r["alert"]
                );
            }
        }
    }
}

#[test]
fn the_dashboard_is_valid_and_queries_only_families_xvs_exports() {
    let known = families();
    let text = std::fs::read_to_string(root().join("deploy/grafana/xvs.json")).unwrap();
    let d: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(d["uid"], "xvs-overview");
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    let vars = d["templating"]["list"].as_array().unwrap();
    let var = |name: &str| vars.iter().find(|v| v["name"] == name).unwrap();
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    assert!(
        var("instance")["definition"]
            .as_str()
            .unwrap()
            .contains("xvs_build_info")
    );
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut queried = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "panel id twice: {p}");
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap();
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}");
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            assert!(expr.contains("instance=~\"$instance\""), "{title}: {expr}");
            let used = metrics_in(expr);
            assert!(!used.is_empty(), "{title}: {expr}");
            for m in used {
                assert!(
                    known.contains(&m),
                    "{title} queries {m}, which xvs does not export"
                );
                queried.insert(m);
            }
        }
    }
    // The panels an operator looks for first.
    for m in [
        "xvs_drops_total",
        "xvs_xsk_rx_dropped_total",
        "xvs_xsk_fill_ring_frames",
        "xvs_steer_frames_total",
        "xvs_healthz_total",
        "xvs_refused",
        "xvs_peer_sync_peers_up",
        "xvs_bgp_live",
    ] {
        assert!(queried.contains(m), "no panel shows {m}");
    }
}
