//! One bad service blocks only itself (issue #27): on the fake clock, a model with specs the
//! snapshot builder refuses and problems of the source is published without them, the
//! refusals are listed and counted once, and fixing them programs them.

use slowpath::k8s::{K8sModel, Problem, ProblemKind};

use super::testlab::CFG;
use super::tests::{Harness, K8S_CFG, TICK};
use super::*;

/// The lab's two services as a Kubernetes model, plus `extra` specs and `problems`.
fn model(extra: Vec<ServiceSpec>, problems: Vec<Problem>) -> Box<K8sModel> {
    let cfg = config::parse(CFG, "t.toml").unwrap();
    let mut specs = ServiceSpec::from_config(&cfg);
    specs.extend(extra);
    Box::new(K8sModel {
        specs,
        problems,
        ..K8sModel::default()
    })
}

/// A wrr spec whose weights (2^20 and 1) the wrr builder refuses.
fn poison(weight: u32) -> ServiceSpec {
    let text = CFG
        .replace("name = \"web\"", "name = \"poison\"")
        .replace("198.18.100.80", "198.18.100.99")
        .replace(
            "scheduler = \"rr\"\nbackends = [{ addr = \"198.18.1.1:80\" }",
            "scheduler = \"wrr\"\nbackends = [{ addr = \"198.18.1.1:80\" }",
        );
    let cfg = config::parse(&text, "t.toml").unwrap();
    let mut s = ServiceSpec::from_config(&cfg)
        .into_iter()
        .find(|s| s.name == "poison")
        .unwrap();
    s.backends[0].weight = weight;
    s
}

fn refused_service() -> Problem {
    Problem {
        object: "Service ns/dup".to_owned(),
        kind: ProblemKind::ServiceRefused,
        reason: "ports[1] and ports[0] are both named \"http\"".to_owned(),
    }
}

fn names(h: &Harness) -> Vec<String> {
    let snap = h.ctl.snapshot().unwrap();
    snap.services.iter().map(|s| s.name.clone()).collect()
}

#[test]
fn a_spec_the_builder_refuses_blocks_only_itself() {
    let mut h = Harness::new(K8S_CFG);
    h.step(TICK);
    h.event(Event::Model(model(vec![], vec![])));
    h.step(TICK);
    assert_eq!(names(&h), ["dns", "web"]);
    // A poisoned spec and a refused Service arrive with a change of the others (web loses
    // a backend): the change is programmed, the poison is not.
    let mut m = model(vec![poison(1 << 20)], vec![refused_service()]);
    m.specs[1].backends.remove(0);
    h.event(Event::Model(m));
    h.step(TICK);
    assert_eq!(names(&h), ["dns", "web"]);
    let snap = h.ctl.snapshot().unwrap();
    assert_eq!(snap.services.as_slice()[1].backends.len(), 1);
    assert_eq!(h.status.pending_since, None, "nothing waits");
    let refused: Vec<(&str, &str)> = h
        .status
        .refused
        .iter()
        .map(|r| (r.object.as_str(), r.kind))
        .collect();
    assert_eq!(
        refused,
        [
            ("Service ns/dup", "service_refused"),
            ("service poison", "snapshot_build")
        ]
    );
    let reason = &h.status.refused[1].reason;
    assert!(
        reason.contains("wrr sequence of 1048577 entries") && reason.ends_with("not programmed"),
        "{reason}"
    );
    let total = |h: &Harness| h.status.refused_total.clone();
    let once: std::collections::BTreeMap<&str, u64> =
        [("service_refused", 1), ("snapshot_build", 1)].into();
    assert_eq!(total(&h), once);
    // Still there at the next publishes: not counted again.
    h.event(Event::L2(L2Table::default()));
    h.step(TICK);
    let mut again = model(vec![poison(1 << 20)], vec![refused_service()]);
    again.specs[1].backends.remove(0);
    h.event(Event::Model(again));
    h.step(TICK);
    assert_eq!(total(&h), once);
    assert_eq!(h.status.refused.len(), 2);
    // Fixed: programmed, nothing refused any more, the counts stay.
    h.event(Event::Model(model(vec![poison(3)], vec![])));
    h.step(TICK);
    assert_eq!(names(&h), ["dns", "web", "poison"]);
    assert!(h.status.refused.is_empty());
    assert_eq!(total(&h), once);
    // Poisoned again: its previous version stays, and that is a new report.
    h.event(Event::Model(model(vec![poison(1 << 20)], vec![])));
    h.step(TICK);
    assert_eq!(names(&h), ["dns", "web", "poison"]);
    let poison_entry = &h.ctl.snapshot().unwrap().services.as_slice()[2];
    assert_eq!(poison_entry.backends[0].weight, 3);
    assert!(
        h.status.refused[0]
            .reason
            .ends_with("its previous version stays")
    );
    assert_eq!(h.status.refused_total["snapshot_build"], 2);
}

/// A reload whose `[[services]]` take addresses no service may (a loopback backend, a
/// backend on another service's VIP, a VIP on the node's own address) is refused as
/// invalid: the running services stay.
#[test]
fn a_reload_with_addresses_no_service_may_take_is_refused() {
    let mut h = Harness::new(CFG);
    h.step(TICK);
    let node = "[node]\naddresses = [\"198.18.0.1\"]\n";
    for bad in [
        CFG.replace("198.18.1.2:80", "127.0.0.1:80"),
        CFG.replace("198.18.1.2:80", "198.18.100.53:80"),
        format!("{node}{}", CFG.replace("198.18.100.80", "198.18.0.1")),
    ] {
        h.reload(&bad);
    }
    assert_eq!((h.status.reloads_ok, h.status.reloads_failed), (0, 3));
    h.step(TICK);
    assert_eq!(h.published(), 1, "nothing to publish");
    let snap = h.ctl.snapshot().unwrap();
    let web = snap.services.iter().find(|s| s.name == "web").unwrap();
    let addrs: Vec<String> = web.backends.iter().map(|b| b.addr.to_string()).collect();
    assert_eq!(addrs, ["198.18.1.1:80", "198.18.1.2:80"]);
}
