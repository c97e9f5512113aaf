//! The bare-metal unit, deploy/systemd/xvs.service, checked from outside: `systemd-analyze
//! verify` finds nothing to say about it (pointed at the built `xvs`, since verify wants the
//! binary to exist), and what it grants and sets matches what the code needs: exactly the
//! capabilities `xvs run` checks for, the runtime directory of the default `state_dir` and
//! control socket, kept across stops (the next start adopts the flows there), RLIMIT_MEMLOCK
//! lifted, a restart after a crash but not after a clean stop.
//!
//! systemd (scripts/deps installs it) is needed: without `systemd-analyze` the test fails
//! saying so.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn unit_text() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd/xvs.service"),
    )
    .unwrap()
}

/// The unit's `[Service]` (or other section) settings: (key, value), in order.
fn settings(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').expect("key=value");
        out.push((k.to_owned(), v.to_owned()));
    }
    out
}

fn one(set: &[(String, String)], key: &str) -> String {
    let v: Vec<&String> = set
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(v.len(), 1, "{key}: {v:?}");
    v[0].clone()
}

/// `systemd-analyze verify` of `text` as `xvs.service` (its /usr/local/bin/xvs replaced by
/// the built binary): the exit status and what it printed.
fn verify(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let unit: PathBuf = dir.path().join("xvs.service");
    std::fs::write(
        &unit,
        text.replace("/usr/local/bin/xvs", env!("CARGO_BIN_EXE_xvs")),
    )
    .unwrap();
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze (package systemd; scripts/deps installs it)");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), out)
}

#[test]
fn systemd_verifies_the_unit_and_refuses_broken_copies() {
    let text = unit_text();
    let (ok, out) = verify(&text);
    assert!(
        ok && out.trim().is_empty(),
        "systemd-analyze verify:\n{out}"
    );
    // verify does complain about what is wrong (it exits 0 on unknown keys and values,
    // hence the check of its output).
    for (from, to, says) in [
        ("LimitMEMLOCK=", "LimitMEMLOK=", "Unknown key 'LimitMEMLOK'"),
        (
            "Restart=on-failure",
            "Restart=sometimes",
            "Failed to parse service restart specifier",
        ),
        (
            "LimitMEMLOCK=infinity",
            "LimitMEMLOCK=lots",
            "Failed to parse resource value",
        ),
    ] {
        assert!(text.contains(from), "{from}");
        let (_, out) = verify(&text.replacen(from, to, 1));
        assert!(out.contains(says), "{to}: {out}");
    }
}

#[test]
fn the_unit_grants_what_xvs_run_checks_for_and_keeps_its_state() {
    let text = unit_text();
    let svc = settings(&text, "Service");
    // Exactly the capabilities `xvs run` checks for with a default config (napi_busy_poll
    // off): bounded to them and given to the process.
    let cfg = config::Config::default();
    let want: BTreeSet<String> = daemon::caps::required(&cfg)
        .iter()
        .map(|n| n.cap.name.to_owned())
        .collect();
    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let got: BTreeSet<String> = one(&svc, key)
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(got, want, "{key}");
    }
    assert_eq!(one(&svc, "NoNewPrivileges"), "yes");
    assert_eq!(one(&svc, "LimitMEMLOCK"), "infinity");
    // The default state_dir and control socket are the runtime directory, which survives a
    // stop (the next start of this boot adopts the flow table there).
    assert_eq!(cfg.dataplane.state_dir, Path::new("/run/xvs"));
    assert!(cfg.admin_socket().starts_with("/run/xvs"));
    assert_eq!(one(&svc, "RuntimeDirectory"), "xvs");
    assert_eq!(one(&svc, "RuntimeDirectoryPreserve"), "yes");
    // A crash restarts it; the drain after SIGTERM (exit 0) does not. The stop waits longer
    // than the default drain.
    assert_eq!(one(&svc, "Restart"), "on-failure");
    assert_eq!(one(&svc, "KillSignal"), "SIGTERM");
    let stop: u64 = one(&svc, "TimeoutStopSec")
        .trim_end_matches('s')
        .parse()
        .expect("TimeoutStopSec in seconds");
    assert!(stop > cfg.dataplane.drain_timeout.get().as_secs());
    // It runs the config it checked, and reloads on SIGHUP.
    assert_eq!(
        one(&svc, "ExecStart"),
        "/usr/local/bin/xvs run --config /etc/xvs/xvs.toml"
    );
    assert_eq!(
        one(&svc, "ExecStartPre"),
        "/usr/local/bin/xvs check --config /etc/xvs/xvs.toml"
    );
    assert_eq!(one(&svc, "ExecReload"), "/bin/kill -HUP $MAINPID");
    let install = settings(&text, "Install");
    assert_eq!(one(&install, "WantedBy"), "multi-user.target");
}
