//! kube-proxy's own packet-flow cases through the real `xvs sim --objects` (issue #28): the
//! `runPacketFlowTests` tables of kubernetes/kubernetes `pkg/proxy/nftables/proxier_test.go`
//! ([`cases::UPSTREAM`] names the commit), ported as data: the cases in
//! `tests/kube_proxy/cases.rs` (each naming its upstream test function, subtest and case),
//! the objects each test builds as dumps under `tests/assets/kube-proxy/`.
//!
//! - [`external_client_cases_get_kube_proxys_verdicts`]: every case whose client is outside
//!   the cluster (75), as upstream wrote it.
//! - [`pod_to_cluster_ip_cases_from_an_external_client`]: every case from a pod to a
//!   ClusterIP (53), from an external client instead; kube-proxy's ClusterIP rules look at
//!   no source, except to masquerade (see `cases::derived`).
//!
//! Left out: the cases whose client is a pod and whose destination is no ClusterIP (xvs runs
//! on edge nodes, where pods' traffic does not come), the endpoint itself (hairpin), the node
//! itself (`testNodeIP`) or a load-balancer IP standing for it ("same node to LB, SNATted
//! to LB"): the node's own traffic does not go through xvs, which drops a packet from the
//! wire with one of the node's addresses or VIPs as its source (`own_address_source`).
//!
//! kube-proxy's outputs are sim's verdicts: an endpoint list is `forward`, each flow to one
//! of them and every one of them taken (a case sends 4 flows per endpoint from distinct
//! client ports; the default scheduler is rr); `REJECT` is `reject`, `DROP` is `drop`, each
//! with xvs's reason for the kube-proxy rule that decided it (`cases::Want`); `""` (no
//! kube-proxy rule matched: the host gets the packet) is `pass`. The masquerade flag is not
//! asserted: xvs masquerades by forwarding mode, not by client.
//!
//! One `xvs sim` per dump and config with all its cases' flows in one batch: the file runs in
//! a few seconds.

#[path = "kube_proxy/cases.rs"]
mod cases;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cases::{Case, Scenario, UPSTREAM, Want};

fn asset(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/assets/kube-proxy")
        .join(name)
}

/// What sim said about one flow.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Got {
    Forward(String),
    Reject(String),
    Drop(String),
    Pass,
    /// A line this file cannot read (kept whole for the failure message).
    Other(String),
}

/// Reads the part of a flow line after ` => `: `BACKEND`, `reject (R)`, `drop (R)`, `pass`.
fn verdict(target: &str) -> Got {
    let reason = |v: &str| {
        target
            .strip_prefix(v)
            .and_then(|r| r.strip_prefix(" ("))
            .and_then(|r| r.strip_suffix(')'))
            .map(str::to_owned)
    };
    if let Some(r) = reason("reject") {
        Got::Reject(r)
    } else if let Some(r) = reason("drop") {
        Got::Drop(r)
    } else if target == "pass" {
        Got::Pass
    } else if target.parse::<SocketAddr>().is_ok() {
        Got::Forward(target.to_owned())
    } else {
        Got::Other(target.to_owned())
    }
}

/// How many flows a case sends: 4 per endpoint, so that rr takes each of them.
fn flows_of(case: &Case) -> usize {
    match case.want {
        Want::Forward(eps) => 4 * eps.len(),
        _ => 2,
    }
}

/// Runs a scenario's cases in one `xvs sim`; returns each case's verdicts, in order.
fn run(s: &Scenario) -> Vec<Vec<Got>> {
    let mut input = String::new();
    let mut port = 20000u16;
    for c in &s.cases {
        let dst: SocketAddr = c.dst.parse().expect("a case's dst is ip:port");
        for _ in 0..flows_of(c) {
            port += 1;
            let (ip, dport) = (dst.ip(), dst.port());
            input.push_str(&format!("{},{},{port},{ip},{dport}\n", c.proto, c.src));
        }
    }
    let (dump, config) = (asset(&s.dump), asset(s.config));
    let mut child = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args(["sim", "--node", "test-node", "--flows", "-"])
        .arg("--objects")
        .arg(&dump)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xvs");
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "xvs sim on {}: {err}", s.dump);
    // The dumps hold nothing xvs refuses: a refusal would change what is tested.
    assert!(err.trim().is_empty(), "xvs sim on {}: {err}", s.dump);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut lines = stdout.lines().take_while(|l| !l.is_empty());
    s.cases
        .iter()
        .map(|c| {
            (0..flows_of(c))
                .map(|_| {
                    let line = lines.next().expect("one line per flow");
                    verdict(line.split_once(" => ").expect("a flow line").1)
                })
                .collect()
        })
        .collect()
}

/// Whether `got` is kube-proxy's answer to `case`.
fn agrees(case: &Case, got: &[Got]) -> bool {
    match case.want {
        Want::Forward(eps) => {
            let mut chosen = BTreeSet::new();
            for g in got {
                let Got::Forward(b) = g else { return false };
                chosen.insert(b.as_str());
            }
            chosen == eps.iter().copied().collect()
        }
        Want::Reject(why) => got.iter().all(|g| *g == Got::Reject(why.to_owned())),
        Want::Drop(why) => got.iter().all(|g| *g == Got::Drop(why.to_owned())),
        Want::Pass => got.iter().all(|g| *g == Got::Pass),
    }
}

/// Runs every scenario; fails naming each case xvs answers otherwise than kube-proxy.
fn run_all(scenarios: &[Scenario]) {
    let mut failures = Vec::new();
    for s in scenarios {
        for (case, got) in s.cases.iter().zip(run(s)) {
            if !agrees(case, &got) {
                failures.push(format!(
                    "{UPSTREAM} {} {:?} ({}): {} {} -> {}: kube-proxy {:?} (masq {}), xvs {:?}",
                    case.test,
                    case.name,
                    s.dump,
                    case.proto,
                    case.src,
                    case.dst,
                    case.want,
                    case.masq,
                    got
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) differ from kube-proxy:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn count(scenarios: &[Scenario]) -> usize {
    scenarios.iter().map(|s| s.cases.len()).sum()
}

#[test]
fn external_client_cases_get_kube_proxys_verdicts() {
    let scenarios = cases::external();
    assert_eq!(count(&scenarios), 75, "upstream's external-client cases");
    run_all(&scenarios);
}

#[test]
fn pod_to_cluster_ip_cases_from_an_external_client() {
    let scenarios = cases::derived();
    assert_eq!(count(&scenarios), 53, "upstream's pod-to-ClusterIP cases");
    run_all(&scenarios);
}

#[test]
fn verdicts_are_read() {
    assert_eq!(verdict("10.0.1.1:80"), Got::Forward("10.0.1.1:80".into()));
    assert_eq!(verdict("[fd00::1]:80"), Got::Forward("[fd00::1]:80".into()));
    assert_eq!(
        verdict("reject (no_endpoints)"),
        Got::Reject("no_endpoints".into())
    );
    assert_eq!(
        verdict("drop (source_range)"),
        Got::Drop("source_range".into())
    );
    assert_eq!(verdict("pass"), Got::Pass);
    assert_eq!(verdict("none (x)"), Got::Other("none (x)".into()));
}
