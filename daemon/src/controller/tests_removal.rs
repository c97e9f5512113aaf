//! Endpoint removal on the fake clock (see [`super::removal`]): what the cause of a removal
//! does to the grace, the second pass, and the ids.

use std::net::SocketAddr;
use std::sync::Arc;

use config::ProbeKind;
use fastpath::pipeline::{Pipeline, PipelineConfig, Verdict};
use lb_algos::AffinityTable;
use slowpath::health::Judgement;

use super::testlab::{CFG, dst_of, frame, ip};
use super::tests::{ACK, DNS, Harness, K8S_CFG, SYN, TICK, WEB, judged, steps, without_backend_1};
use super::*;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A model of the Kubernetes source with the lab's two services, less the backends at
/// `gone`.
fn model_without(gone: &[&str]) -> Event {
    model_of(gone, ProbeKind::None)
}

/// The lab's services from the Kubernetes source, without the backends `gone`, each probed
/// with `probe` (its `xvs.io/health-check-probe`).
fn model_of(gone: &[&str], probe: ProbeKind) -> Event {
    let cfg = config::parse(CFG, "t.toml").unwrap();
    let mut specs = ServiceSpec::from_config(&cfg);
    for s in &mut specs {
        s.backends
            .retain(|b| !gone.contains(&b.addr.to_string().as_str()));
        s.health.probe = Some(probe);
    }
    Event::Model(Box::new(slowpath::k8s::K8sModel {
        specs,
        ..slowpath::k8s::K8sModel::default()
    }))
}

/// A Kubernetes-sourced harness with both services published and, rr, a UDP flow (client
/// port 1000) and a TCP flow (2000) on backend .1, and the same on .2 (1001, 2001).
fn k8s_with_flows() -> Harness {
    k8s_with_flows_probed(ProbeKind::None)
}

fn k8s_with_flows_probed(probe: ProbeKind) -> Harness {
    let mut h = Harness::new(K8S_CFG);
    h.step(TICK);
    h.event(model_of(&[], probe));
    h.step(TICK);
    with_flows(&mut h);
    h
}

fn with_flows(h: &mut Harness) {
    for (port, to) in [(1000, "198.18.1.1"), (1001, "198.18.1.2")] {
        assert_eq!(h.send(&frame(true, port, DNS, 53, 0)), Some(ip(to)));
    }
    for (port, to) in [(2000, "198.18.1.1"), (2001, "198.18.1.2")] {
        assert_eq!(h.send(&frame(false, port, WEB, 80, SYN)), Some(ip(to)));
    }
}

fn acted(h: &Harness) -> (u64, u64) {
    (h.status.flows_resteered, h.status.flows_ended)
}

#[test]
fn a_static_reload_removing_a_backend_resteers_its_flows_at_the_next_tick() {
    let mut h = Harness::new(CFG);
    h.step(TICK);
    with_flows(&mut h);
    let old = h.ids("web")[&addr("198.18.1.1:80")];
    let old_dns = h.ids("dns")[&addr("198.18.1.1:53")];
    // The operator removes backend .1 from both services (a reload of the static source).
    h.reload(&without_backend_1(CFG));
    assert_eq!(h.status.reloads_ok, 1);
    assert!(
        h.status.pending_since.is_some(),
        "the change waits for a tick"
    );
    assert!(h.ctl.publish_due(), "which the driver runs at once");
    assert_eq!(acted(&h), (0, 0));
    h.step(TICK);
    assert!(!h.ctl.publish_due());
    // No grace: the pass after the publish re-steered its UDP flow and ended its TCP flow.
    assert_eq!(acted(&h), (1, 1));
    assert_eq!(
        h.send(&frame(true, 1000, DNS, 53, 0)),
        Some(ip("198.18.1.2"))
    );
    assert_eq!(h.send(&frame(false, 2000, WEB, 80, ACK)), None);
    assert_eq!(
        h.send(&frame(false, 2001, WEB, 80, ACK)),
        Some(ip("198.18.1.2"))
    );
    // A new backend before the second pass: the retired id is not reused yet.
    let with_3 = |t: &str| {
        t.replace(
            "198.18.1.2:80\" }]",
            "198.18.1.2:80\" }, { addr = \"198.18.1.3:80\" }]",
        )
    };
    h.reload(&with_3(&without_backend_1(CFG)));
    h.step(TICK);
    let early = h.ids("web")[&addr("198.18.1.3:80")];
    assert!(
        ![old, old_dns].contains(&early),
        "retired ids ({old}, {old_dns}) reused before the second pass: {early}"
    );
    // Take .3 out again, let the second pass run (1 s after the last publish), then add a
    // fourth address: it gets a reclaimed id, .1's among them.
    h.reload(&without_backend_1(CFG));
    steps(&mut h, 11);
    let with_4 = |t: &str| {
        t.replace(
            "198.18.1.2:80\" }]",
            "198.18.1.2:80\" }, { addr = \"198.18.1.4:80\" }]",
        )
    };
    h.reload(&with_4(&without_backend_1(CFG)));
    h.step(TICK);
    let late = h.ids("web")[&addr("198.18.1.4:80")];
    assert!(
        [old, old_dns, early].contains(&late),
        "a reclaimed id ({old}, {old_dns} or {early}) is reused, got {late}"
    );
}

#[test]
fn a_flow_inserted_with_the_previous_snapshot_is_caught_by_the_second_pass() {
    let mut h = Harness::new(CFG);
    h.step(TICK);
    // A second pipeline stands for a worker that has not loaded the new snapshot yet.
    let old_snap = Arc::clone(h.ctl.snapshot().unwrap());
    let cfg = h.ctl.config().clone();
    let mut laggard = Pipeline::new(
        PipelineConfig::from_config(&cfg, 0, 1),
        Arc::clone(&h.flows),
        Arc::new(AffinityTable::new(64, h.now)),
        old_snap,
    );
    h.reload(&without_backend_1(CFG));
    // The publish and its first pass (which finds nothing).
    h.step(TICK);
    assert_eq!(acted(&h), (0, 0));
    // The laggard inserts a UDP flow to .1 after the first pass.
    let mut f = frame(true, 1000, DNS, 53, 0);
    assert!(matches!(laggard.process(&mut f, h.now), Verdict::Tx(_)));
    assert_eq!(dst_of(&f), ip("198.18.1.1"));
    steps(&mut h, 8);
    assert_eq!(h.status.flows_resteered, 0, "second pass not due yet");
    steps(&mut h, 2);
    assert_eq!(h.status.flows_resteered, 1);
    assert_eq!(
        h.send(&frame(true, 1000, DNS, 53, 0)),
        Some(ip("198.18.1.2"))
    );
}

#[test]
fn an_endpoint_that_vanishes_from_kubernetes_keeps_the_grace_and_may_come_back() {
    // An endpoint moving between EndpointSlices: the removal arrives first, the addition one
    // min_sync_period later.
    let mut h = k8s_with_flows();
    let id = h.ids("web")[&addr("198.18.1.1:80")];
    h.event(model_without(&["198.18.1.1:53", "198.18.1.1:80"]));
    steps(&mut h, 10);
    h.event(model_without(&[]));
    steps(&mut h, 60);
    assert_eq!(acted(&h), (0, 0));
    assert_eq!(h.ids("web")[&addr("198.18.1.1:80")], id, "same id");
    assert_eq!(
        h.send(&frame(false, 2000, WEB, 80, ACK)),
        Some(ip("198.18.1.1"))
    );
    assert_eq!(
        h.send(&frame(true, 1000, DNS, 53, 0)),
        Some(ip("198.18.1.1"))
    );
    // Gone for good: within the grace (3 s) its flows stay, after it they are handled.
    h.event(model_without(&["198.18.1.1:53", "198.18.1.1:80"]));
    steps(&mut h, 25);
    assert_eq!(acted(&h), (0, 0));
    assert_eq!(
        h.send(&frame(true, 1000, DNS, 53, 0)),
        Some(ip("198.18.1.1"))
    );
    steps(&mut h, 10);
    assert_eq!(acted(&h), (1, 1));
    assert_eq!(
        h.send(&frame(true, 1000, DNS, 53, 0)),
        Some(ip("198.18.1.2"))
    );
    assert_eq!(h.send(&frame(false, 2000, WEB, 80, ACK)), None);
}

#[test]
fn a_backend_judged_down_that_leaves_the_kubernetes_source_is_removed_at_once() {
    // Both Services have xvs.io/health-check-probe: tcp.
    let mut h = k8s_with_flows_probed(ProbeKind::Tcp);
    // Health checks judge .1 down in both services: it takes no new flow, its UDP flow is
    // re-steered (another backend is usable), its TCP flow continues.
    let ev = judged(
        &h,
        &[
            ("198.18.1.1:53", Judgement::Down),
            ("198.18.1.1:80", Judgement::Down),
            ("198.18.1.2:53", Judgement::Up),
            ("198.18.1.2:80", Judgement::Up),
        ],
    );
    h.event(ev);
    h.step(TICK);
    assert_eq!(acted(&h), (1, 0));
    assert_eq!(
        h.send(&frame(false, 2000, WEB, 80, ACK)),
        Some(ip("198.18.1.1"))
    );
    // A UDP flow a client starts meanwhile goes to .2.
    assert_eq!(
        h.send(&frame(true, 1002, DNS, 53, 0)),
        Some(ip("198.18.1.2"))
    );
    // Then it leaves the EndpointSlices: known down, no churn to wait for. Its TCP flow
    // ends at the next tick, not after the grace.
    h.event(model_of(
        &["198.18.1.1:53", "198.18.1.1:80"],
        ProbeKind::Tcp,
    ));
    h.step(TICK);
    assert_eq!(acted(&h), (1, 1));
    assert_eq!(h.send(&frame(false, 2000, WEB, 80, ACK)), None);
    // .2's flows are untouched.
    assert_eq!(
        h.send(&frame(false, 2001, WEB, 80, ACK)),
        Some(ip("198.18.1.2"))
    );
    // A UDP flow inserted with the old snapshot meanwhile would be caught by the second
    // pass, after which the ids are reclaimed: nothing holds them.
    steps(&mut h, 11);
    assert_eq!(h.ctl.retirees.len(), 0, "reclaimed after the second pass");
}
