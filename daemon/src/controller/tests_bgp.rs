//! The controller's `[bgp]` rules on the fake clock (see [`super::bgp`]).

use slowpath::bgp::Include;
use slowpath::health::Judgement;

use super::testlab::{CFG, ip};
use super::tests::{Harness, Seen, TICK, judged, steps};
use super::*;

/// The lab's two services, a SNAT address, a peer's as backup, BGP on.
fn bgp_cfg(extra_bgp: &str) -> String {
    CFG.replace(
        "mode = \"nat\"",
        "mode = \"nat\"\nsnat_addresses = [\"198.18.3.1\"]\ndrain_timeout = \"3s\"",
    ) + &format!(
        "[sync]\nenable = true\nlisten = \"198.18.2.11:7946\"\nkey_file = \"/k\"\npeers = [{{ address = \"198.18.2.12:7946\", snat_addresses = [\"198.18.3.2\"] }}]\n[bgp]\nenable = true\nlocal_as = 65001\ninclude = \"/x/bird-xvs.conf\"\n{extra_bgp}"
    )
}

fn announced(h: &Harness) -> Vec<&Include> {
    h.log
        .iter()
        .filter_map(|s| match s {
            Seen::Announce(i) => Some(i),
            _ => None,
        })
        .collect()
}

fn counts(i: &Include) -> (usize, usize, usize) {
    (i.vips, i.snat, i.backups)
}

const ALL: [&str; 4] = [
    "198.18.1.1:53",
    "198.18.1.1:80",
    "198.18.1.2:53",
    "198.18.1.2:80",
];

#[test]
fn announces_once_ready_withdraws_on_drain_and_before_the_stop() {
    let mut h = Harness::new(&(bgp_cfg("") + "[health]\nprobe = \"tcp\"\n"));
    // Every backend has passed a probe (see below for before).
    let up = judged(&h, &ALL.map(|a| (a, Judgement::Up)));
    h.event(up);
    // Flow sync's start-up dumps are in (see the last test for before).
    h.ctl.set_peers_ready(true);
    assert!(announced(&h).is_empty(), "nothing before the first publish");
    assert!(!h.ctl.ready_to_announce());
    steps(&mut h, 3);
    assert!(h.ctl.ready_to_announce());
    let a = announced(&h);
    assert_eq!(a.len(), 1, "one include file, not one per tick");
    assert_eq!(counts(a[0]), (2, 1, 1));
    assert_eq!(a[0].path, std::path::Path::new("/x/bird-xvs.conf"));
    let text = &a[0].text;
    for route in [
        "route 198.18.100.53/32 via \"xvs-live\"; # vip",
        "route 198.18.100.80/32 via \"xvs-live\"; # vip",
        "route 198.18.3.1/32 via \"xvs-live\"; # snat",
        "route 198.18.3.2/32 via \"xvs-live\"; # backup",
        "bgp_path.prepend(65001);",
    ] {
        assert!(text.contains(route), "{route} in\n{text}");
    }

    // Every backend of web down: its VIP goes.
    let down = judged(
        &h,
        &[
            ("198.18.1.1:53", Judgement::Up),
            ("198.18.1.2:53", Judgement::Up),
            ("198.18.1.1:80", Judgement::Down),
            ("198.18.1.2:80", Judgement::Down),
        ],
    );
    h.event(down);
    steps(&mut h, 2);
    let a = announced(&h);
    assert_eq!(a.len(), 2);
    assert_eq!(counts(a[1]), (1, 1, 1));
    assert!(!a[1].text.contains("198.18.100.80/32"));
    let up = judged(&h, &ALL.map(|a| (a, Judgement::Up)));
    h.event(up);
    steps(&mut h, 2);
    assert_eq!(counts(announced(&h)[2]), (2, 1, 1));

    // An admin drain withdraws everything; undrain brings it back.
    h.ctl.command(h.now, Command::Drain).unwrap();
    h.perform();
    assert_eq!(counts(announced(&h)[3]), (0, 0, 0));
    h.ctl.command(h.now, Command::Undrain).unwrap();
    h.perform();
    assert_eq!(counts(announced(&h)[4]), (2, 1, 1));

    // The drain of a stop signal withdraws at once; the stop adds nothing more.
    h.event(Event::Signal(Signal::Stop));
    assert_eq!(counts(announced(&h)[5]), (0, 0, 0));
    steps(&mut h, 40);
    assert!(h.stopped.is_some());
    assert_eq!(announced(&h).len(), 6);
}

#[test]
fn a_stop_without_drain_withdraws_before_stopping() {
    let mut h =
        Harness::new(&bgp_cfg("").replace("drain_timeout = \"3s\"", "drain_timeout = \"0s\""));
    h.ctl.set_peers_ready(true);
    steps(&mut h, 2);
    assert_eq!(announced(&h).len(), 1);
    h.event(Event::Signal(Signal::Stop));
    let last = announced(&h).pop().unwrap();
    assert_eq!(counts(last), (0, 0, 0));
    assert!(!last.text.contains(" via "));
    assert_eq!(h.stopped, Some(StopReason::Signal));
    // The withdrawal came before the stop.
    assert!(matches!(h.log.last(), Some(Seen::Announce(_))));
}

#[test]
fn node_addresses_are_never_announced_and_bgp_off_announces_nothing() {
    let mut h = Harness::new(&bgp_cfg(""));
    // Flow sync's start-up dumps are in (see the last test for before).
    h.ctl.set_peers_ready(true);
    h.ctl.set_node_addresses(vec![ip("198.18.100.53")]);
    steps(&mut h, 2);
    let a = announced(&h);
    assert_eq!(counts(a[0]), (1, 1, 1));
    assert!(!a[0].text.contains("198.18.100.53/32"));

    let mut h = Harness::new(CFG);
    steps(&mut h, 3);
    h.event(Event::Signal(Signal::Stop));
    steps(&mut h, 2);
    assert!(announced(&h).is_empty());
}

#[test]
fn reloads_rewrite_the_file_but_cannot_switch_bgp_on_or_off() {
    let mut h = Harness::new(&bgp_cfg(""));
    // Flow sync's start-up dumps are in (see the last test for before).
    h.ctl.set_peers_ready(true);
    steps(&mut h, 2);
    assert_eq!(announced(&h).len(), 1);
    // Neighbours added: the sessions appear in the file.
    h.reload(&bgp_cfg(
        "neighbors = [{ address = \"198.18.2.1\", as = 65000 }]\n",
    ));
    steps(&mut h, 2);
    let a = announced(&h);
    assert_eq!(a.len(), 2);
    assert!(a[1].text.contains("protocol bgp xvs_198_18_2_1"));
    assert_eq!(h.status.reloads_ok, 1);
    // Switching BGP off, or renaming the device, needs a restart.
    h.reload(&bgp_cfg("").replace("[bgp]\nenable = true", "[bgp]\nenable = false"));
    h.reload(&bgp_cfg("liveness_device = \"live1\"\n"));
    steps(&mut h, 2);
    assert_eq!(h.status.reloads_failed, 2);
    assert_eq!(announced(&h).len(), 2);
    let _ = TICK;
}

#[test]
fn a_reload_cannot_change_sync_and_the_node_announces_only_once_the_peers_flows_are_in() {
    let mut h = Harness::new(&bgp_cfg(""));
    h.ctl.set_peers_ready(false);
    steps(&mut h, 2);
    assert_eq!(
        announced(&h).len(),
        0,
        "nothing before the peers' dumps are in"
    );
    h.ctl.set_peers_ready(true);
    steps(&mut h, 1);
    assert_eq!(announced(&h).len(), 1);
    h.reload(&bgp_cfg("").replace("198.18.2.12:7946", "198.18.2.13:7946"));
    steps(&mut h, 1);
    assert_eq!(h.status.reloads_failed, 1, "[sync] changes need a restart");
}

#[test]
fn with_probes_a_vip_is_announced_only_once_one_of_its_backends_passed_one() {
    let mut h = Harness::new(&(bgp_cfg("") + "[health]\nprobe = \"tcp\"\n"));
    h.ctl.set_peers_ready(true);
    steps(&mut h, 3);
    // At start no backend has passed a probe: the node announces its SNAT address and the
    // peer's backup, no VIP...
    let a = announced(&h);
    assert_eq!(a.len(), 1);
    assert_eq!(counts(a[0]), (0, 1, 1));
    // ...but forwards to them: a backend not judged yet takes flows (kube-proxy's trust).
    assert_eq!(
        h.send(&super::testlab::frame(
            true,
            1000,
            [198, 18, 100, 53],
            53,
            0
        )),
        Some(ip("198.18.1.1"))
    );
    // web's .1 passes its first probe: web is announced, with no snapshot to publish.
    let published = h.published();
    h.event(judged(&h, &[("198.18.1.1:80", Judgement::Up)]));
    let a = announced(&h);
    assert_eq!(a.len(), 2);
    assert_eq!(counts(a[1]), (1, 1, 1));
    assert!(
        a[1].text.contains("route 198.18.100.80/32"),
        "{}",
        a[1].text
    );
    steps(&mut h, 2);
    assert_eq!(h.published(), published, "forwarding had nothing to change");
    // A down backend is no better than an unknown one: .1:80 down, .2:80 unknown; .2:53
    // down, .1:53 unknown. Nothing is announced.
    h.event(judged(
        &h,
        &[
            ("198.18.1.1:80", Judgement::Down),
            ("198.18.1.2:53", Judgement::Down),
        ],
    ));
    steps(&mut h, 2);
    assert_eq!(counts(announced(&h).last().unwrap()), (0, 1, 1));
    // dns's .1 passes: dns is announced.
    h.event(judged(
        &h,
        &[
            ("198.18.1.1:80", Judgement::Down),
            ("198.18.1.2:53", Judgement::Down),
            ("198.18.1.1:53", Judgement::Up),
        ],
    ));
    steps(&mut h, 2);
    let last = announced(&h).pop().unwrap();
    assert_eq!(counts(last), (1, 1, 1));
    assert!(
        last.text.contains("route 198.18.100.53/32"),
        "{}",
        last.text
    );
}

#[test]
fn a_restart_that_adopts_the_flow_table_verifies_no_backend() {
    let cfg = bgp_cfg("") + "[health]\nprobe = \"tcp\"\n";
    // The first process: its backends were verified, and it has flows.
    let mut first = Harness::new(&cfg);
    first.ctl.set_peers_ready(true);
    first.step(TICK);
    first.event(judged(
        &first,
        &[
            ("198.18.1.1:53", Judgement::Up),
            ("198.18.1.1:80", Judgement::Up),
        ],
    ));
    assert_eq!(counts(announced(&first).pop().unwrap()), (2, 1, 1));
    let web = [198, 18, 100, 80];
    assert!(
        first
            .send(&super::testlab::frame(false, 2000, web, 80, 0x02))
            .is_some()
    );
    // The next one adopts its table: the same backends, the same flows, nothing verified.
    let adopted = AdoptedIds::from_flows(&first.flows);
    let mut h = Harness::adopting(&cfg, &first, &adopted);
    h.ctl.set_peers_ready(true);
    steps(&mut h, 3);
    assert_eq!(
        h.send(&super::testlab::frame(false, 2000, web, 80, 0x10)),
        Some(ip("198.18.1.1")),
        "the adopted flow goes on"
    );
    assert_eq!(counts(announced(&h)[0]), (0, 1, 1));
    // Its own first probe does.
    h.event(judged(&h, &[("198.18.1.2:80", Judgement::Up)]));
    assert_eq!(counts(announced(&h).pop().unwrap()), (1, 1, 1));
}

#[test]
fn unprobed_backends_count_when_ready_per_their_source() {
    // The endpoints of a Kubernetes Service without xvs.io/health-check-probe are not
    // probed (their readiness is the EndpointSlice's), even with [health] probe set: ready
    // ones make a VIP announced at once.
    let text = format!(
        "{}[bgp]\nenable = true\ninclude = \"/x/bird-xvs.conf\"\n[health]\nprobe = \"tcp\"\n",
        super::tests::K8S_CFG
    );
    let mut h = Harness::new(&text);
    h.step(TICK);
    let cfg = config::parse(CFG, "t.toml").unwrap();
    let mut specs = ServiceSpec::from_config(&cfg);
    // dns: every endpoint not ready.
    for b in &mut specs[0].backends {
        b.usable = false;
    }
    // As the source translates a Service without xvs.io/health-check-probe.
    for s in &mut specs {
        s.health.probe = Some(config::ProbeKind::None);
    }
    h.event(Event::Model(Box::new(slowpath::k8s::K8sModel {
        specs,
        ..slowpath::k8s::K8sModel::default()
    })));
    steps(&mut h, 2);
    let last = announced(&h).pop().unwrap();
    assert_eq!(counts(last), (1, 0, 0));
    assert!(
        last.text.contains("route 198.18.100.80/32"),
        "{}",
        last.text
    );
    // Without probes, a static backend is verified by being listed.
    let mut h = Harness::new(&bgp_cfg(""));
    h.ctl.set_peers_ready(true);
    steps(&mut h, 2);
    assert_eq!(counts(announced(&h)[0]), (2, 1, 1));
}
