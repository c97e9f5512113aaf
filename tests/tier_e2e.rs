//! A tier, end to end, as root: two xvs nodes announce their VIPs and SNAT addresses through
//! their own BIRD to a router running BIRD, which spreads the client's flows over both with
//! ECMP (see `common::tier` and `scripts/tier`). Real BGP, real BFD, real kernel routes.
//!
//! Each scenario builds its own tier under a unique prefix and removes it on every exit path
//! (`Tier`'s Drop); they run one at a time. The times printed (`cargo test --test tier_e2e
//! -- --nocapture`) are measurements, not assertions: the bounds asserted are generous.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::SERIAL;
use common::tier::*;

/// How long routes may take to appear (BGP sessions coming up, BIRD's timers).
const SETTLE: Duration = Duration::from_secs(30);
/// How long a withdrawal may take to reach the router's kernel. Measured: milliseconds for a
/// withdrawal, below a second for BFD.
const WITHDRAW_MAX: Duration = Duration::from_secs(5);

fn both() -> Vec<IpAddr> {
    vec![uplink(1), uplink(2)]
}
fn both6() -> Vec<IpAddr> {
    vec![uplink6(1), uplink6(2)]
}

/// Waits for the router's next hops of `addr`, or fails with BIRD's and the nodes' views.
fn expect_hops(t: &Tier, addr: &str, want: &[IpAddr], within: Duration) -> Duration {
    match t.wait_next_hops(addr, want, within) {
        Ok(d) => d,
        Err(e) => panic!("{e}\n{}", t.debug()),
    }
}

/// `n` requests to `url` from the client, each a new connection (a new source port, so
/// ECMP hashes each on its own); the bodies.
fn requests(t: &Tier, url: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| String::from_utf8(t.curl(url)).unwrap().trim().to_owned())
        .collect()
}

#[test]
fn the_router_spreads_every_vip_over_both_nodes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Tier::up();
    t.start_all();
    // Each SNAT address is its owner's; the other node's backup (AS path longer) is in the
    // router's BIRD but not in its kernel.
    for n in 1..=2 {
        expect_hops(&t, &snat(n), &[uplink(n)], SETTLE);
        expect_hops(&t, &snat6(n), &[uplink6(n)], SETTLE);
    }
    // Backups may come in a later UPDATE than the VIPs (other attributes): bounded wait.
    let deadline = std::time::Instant::now() + SETTLE;
    let r = loop {
        let r = t.birdc("r", "show route 198.18.3.1/32 all");
        if r.contains("BGP.as_path: 65001 65001 65001 65001")
            || std::time::Instant::now() > deadline
        {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(r.contains("BGP.as_path: 65001 65001 65001 65001"), "{r}");
    assert!(r.contains("BGP.as_path: 65001\n"), "{r}");

    // Requests over both families and both modes reach the backends, through both nodes.
    let before = [t.new_flows(1), t.new_flows(2)];
    for url in [
        format!("http://{WEB}/"),
        format!("http://[{WEB6}]/"),
        format!("http://{NAT}/"),
        format!("http://[{NAT6}]/"),
    ] {
        let bodies = requests(&t, &url, 16);
        assert!(
            bodies.iter().all(|b| b.starts_with("backend-")),
            "{url}: {bodies:?}"
        );
    }
    let body = t.curl(&format!("http://{WEB}/bytes/{}", 4 << 20));
    assert_eq!(body.len(), 4 << 20);
    let after = [t.new_flows(1), t.new_flows(2)];
    let served = [after[0] - before[0], after[1] - before[1]];
    println!(
        "new flows of 65 connections through the VIPs: n1 {}, n2 {}",
        served[0], served[1]
    );
    assert!(
        served[0] > 0 && served[1] > 0,
        "ECMP sent nothing to a node: {served:?}"
    );
    assert_eq!(served[0] + served[1], 65);

    // What the nodes say about their announcements.
    for n in 1..=2 {
        let b = &t.stats(n)["bgp"];
        assert_eq!(b["live"], true, "n{n}: {b}");
        assert_eq!(b["in_sync"], true, "n{n}: {b}");
        assert_eq!(
            (
                b["vips"].as_u64(),
                b["snat"].as_u64(),
                b["backups"].as_u64()
            ),
            (Some(5), Some(2), Some(2)),
            "n{n}: {b}"
        );
        assert_eq!(b["errors"], 0, "n{n}: {b}");
        let (code, metrics) = t.admin(n, "GET", "/metrics");
        assert_eq!(code, "200");
        assert!(
            metrics.contains("xvs_bgp_routes{kind=\"vip\"} 5\n"),
            "{metrics}"
        );
    }
}

#[test]
fn a_vip_whose_backends_are_gone_is_withdrawn() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Tier::up();
    t.start_all();
    // SOLO's only backend dies: both nodes' health checks take it down (1 s probes, fall 2),
    // and both withdraw SOLO; the VIPs with other backends stay.
    t.stop_backend(3);
    let took = expect_hops(&t, SOLO, &[], SETTLE);
    println!(
        "SOLO withdrawn {:.2} s after its backend died (health probes: 1 s, fall 2)",
        took.as_secs_f64()
    );
    assert_eq!(t.next_hops(WEB), both());
    let bodies = requests(&t, &format!("http://{WEB}/"), 6);
    assert!(bodies.iter().all(|b| b != "backend-3"), "{bodies:?}");

    // n1 restarts (kill -9: it adopts its flow table) while SOLO's backend is still dead. No
    // probe has passed, so at no moment does it announce SOLO: the router never gets a route
    // to it (before, every start announced it until `fall` probes had failed: 2 s here).
    let watch = t.watch_route(SOLO, Duration::from_secs(60));
    t.kill(1);
    let started = std::time::Instant::now();
    t.start(1);
    let ready = started.elapsed();
    let back = expect_hops(&t, WEB, &both(), SETTLE);
    std::thread::sleep(Duration::from_secs(3));
    let (polls, seen) = watch.stop();
    assert!(
        seen.is_empty(),
        "the router had a route to SOLO during n1's restart, in {} of {polls} polls: first {:?}, last {:?}",
        seen.len(),
        seen.first(),
        seen.last()
    );
    println!(
        "restart of n1 with SOLO's only backend dead: ready after {:.2} s, {WEB} in ECMP again \
         {:.2} s after the start (its first probes passed), no route to SOLO in {polls} polls",
        ready.as_secs_f64(),
        ready.as_secs_f64() + back.as_secs_f64()
    );
    // What n1 shows of it: probed, judged down; WEB's .1 verified.
    let (code, body) = t.admin(1, "GET", "/v1/services");
    assert_eq!(code, "200", "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let health = |svc: &str, addr: &str| {
        v["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == svc)
            .and_then(|s| {
                s["backends"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|b| b["addr"] == addr)
            })
            .map(|b| b["health"].clone())
    };
    assert_eq!(
        health("solo", "198.18.1.3:8080"),
        Some("down".into()),
        "{v}"
    );
    assert_eq!(health("web", "198.18.1.1:8080"), Some("up".into()), "{v}");

    // It comes back with its backend.
    t.start_backend(3);
    let took = expect_hops(&t, SOLO, &both(), SETTLE);
    println!(
        "SOLO announced again {:.2} s after its backend came back",
        took.as_secs_f64()
    );
    assert_eq!(t.curl(&format!("http://{SOLO}/")), b"backend-3\n");
}

#[test]
fn drain_withdraws_a_node_first_and_undrain_brings_it_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Tier::up();
    t.start_all();
    let (code, body) = t.admin(1, "POST", "/v1/drain");
    assert_eq!(code, "200", "{body}");
    let took = expect_hops(&t, WEB, &[uplink(2)], WITHDRAW_MAX);
    println!(
        "drain of n1: the router's route to {WEB} is n2's alone {:.1} ms later",
        took.as_secs_f64() * 1e3
    );
    expect_hops(&t, WEB6, &[uplink6(2)], WITHDRAW_MAX);
    expect_hops(&t, NAT, &[uplink(2)], WITHDRAW_MAX);
    // n1's SNAT addresses too: n2's backups take them.
    expect_hops(&t, &snat(1), &[uplink(2)], WITHDRAW_MAX);
    expect_hops(&t, &snat6(1), &[uplink6(2)], WITHDRAW_MAX);
    // Everything new goes through n2.
    let n1 = t.new_flows(1);
    let bodies = requests(&t, &format!("http://{WEB}/"), 8);
    assert!(
        bodies.iter().all(|b| b.starts_with("backend-")),
        "{bodies:?}"
    );
    assert_eq!(t.new_flows(1), n1, "a drained node got new flows");
    let b = &t.stats(1)["bgp"];
    assert_eq!(
        (b["vips"].as_u64(), b["snat"].as_u64()),
        (Some(0), Some(0)),
        "{b}"
    );

    let (code, body) = t.admin(1, "POST", "/v1/undrain");
    assert_eq!(code, "200", "{body}");
    let took = expect_hops(&t, WEB, &both(), SETTLE);
    println!(
        "undrain of n1: ECMP over both again {:.1} ms later",
        took.as_secs_f64() * 1e3
    );
    expect_hops(&t, WEB6, &both6(), SETTLE);
    expect_hops(&t, &snat(1), &[uplink(1)], SETTLE);

    // A graceful stop (SIGTERM): its drain withdraws at once, then xvs exits.
    let out = t.stop(1);
    assert!(out.contains("tx"), "{out}");
    assert_eq!(t.next_hops(WEB), vec![uplink(2)]);
    assert_eq!(t.next_hops(&snat(1)), vec![uplink(2)]);
    let inc = std::fs::read_to_string(t.node_dir(1).join("bird-xvs.conf")).unwrap();
    assert!(
        !inc.contains(" via "),
        "the last file announces nothing:\n{inc}"
    );
}

#[test]
fn kill_9_withdraws_a_node_at_once_and_its_peer_takes_its_snat_addresses() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Tier::up();
    t.start_all();
    // BIRD keeps running; the liveness device goes with the process.
    let killed = t.kill(1);
    expect_hops(&t, WEB, &[uplink(2)], WITHDRAW_MAX);
    println!(
        "kill -9 of n1's xvs: the router's route to {WEB} is n2's alone {:.1} ms later",
        killed.elapsed().as_secs_f64() * 1e3
    );
    expect_hops(&t, WEB6, &[uplink6(2)], WITHDRAW_MAX);
    let took = expect_hops(&t, &snat(1), &[uplink(2)], WITHDRAW_MAX);
    println!(
        "  and n1's SNAT address {} goes to n2's backup route (checked {:.1} ms later)",
        snat(1),
        took.as_secs_f64() * 1e3
    );
    expect_hops(&t, &snat6(1), &[uplink6(2)], WITHDRAW_MAX);
    let r = t.birdc("n1", "show protocols");
    assert!(r.contains("xvs4"), "n1's BIRD still runs: {r}");
    // Traffic goes on through n2.
    let bodies = requests(&t, &format!("http://{WEB}/"), 4);
    assert!(
        bodies.iter().all(|b| b.starts_with("backend-")),
        "{bodies:?}"
    );

    // n1 comes back: its routes return once it is ready.
    let started = std::time::Instant::now();
    t.start(1);
    let ready = started.elapsed();
    expect_hops(&t, WEB, &both(), SETTLE);
    println!(
        "restart of n1: ready after {:.2} s, ECMP over both after {:.2} s",
        ready.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    expect_hops(&t, &snat(1), &[uplink(1)], SETTLE);
}

#[test]
fn bfd_removes_a_node_whose_link_died() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Tier::up();
    t.start_all();
    // The router's BFD sessions with n1 time out after n1's multiplier ([bgp]
    // bfd_multiplier = 3) × 100 ms (BIRD's default multiplier would be 5).
    let bfd = t.birdc("r", "show bfd sessions");
    let n1: Vec<&str> = bfd
        .lines()
        .filter(|l| l.starts_with(&uplink(1).to_string()) || l.starts_with(&uplink6(1).to_string()))
        .collect();
    assert_eq!(n1.len(), 2, "{bfd}");
    for l in &n1 {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(
            f[f.len() - 2..],
            ["0.100", "0.300"],
            "interval, timeout: {bfd}"
        );
    }
    let down = t.set_link(1, false);
    expect_hops(&t, WEB, &[uplink(2)], WITHDRAW_MAX);
    println!(
        "uplink of n1 down: BFD (3 x 100 ms), and the router's route to {WEB} is n2's alone {:.1} ms later",
        down.elapsed().as_secs_f64() * 1e3
    );
    expect_hops(&t, WEB6, &[uplink6(2)], WITHDRAW_MAX);
    expect_hops(&t, &snat(1), &[uplink(2)], WITHDRAW_MAX);
    let bodies = requests(&t, &format!("http://{WEB}/"), 4);
    assert!(
        bodies.iter().all(|b| b.starts_with("backend-")),
        "{bodies:?}"
    );
    // The link returns: the sessions come back up and so do the routes.
    let up = t.set_link(1, true);
    expect_hops(&t, WEB, &both(), Duration::from_secs(90));
    println!(
        "uplink of n1 up: ECMP over both again {:.2} s later",
        up.elapsed().as_secs_f64()
    );
    expect_hops(&t, &snat(1), &[uplink(1)], SETTLE);
}

#[test]
fn a_node_without_bird_forwards_and_announces_once_bird_is_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Tier::up();
    t.start_all();
    // n1's BIRD crashes: the router loses n1 (BFD), n1's xvs goes on.
    t.kill_bird("n1");
    let took = expect_hops(&t, WEB, &[uplink(2)], WITHDRAW_MAX);
    println!(
        "n1's BIRD killed: the router's route is n2's alone {:.1} ms later",
        took.as_secs_f64() * 1e3
    );
    // xvs restarts without a BIRD to talk to: it runs (BIRD's absence is logged, counted,
    // retried), and what it asks for is in the file.
    t.stop(1);
    t.start(1);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let b = loop {
        let b = t.stats(1)["bgp"].clone();
        if b["errors"].as_u64() > Some(0) || std::time::Instant::now() > deadline {
            break b;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(b["live"], true, "{b}");
    assert_eq!(b["in_sync"], false, "{b}");
    let e = b["last_error"].as_str().unwrap_or_default();
    assert!(e.contains("cannot connect to BIRD's control socket"), "{b}");
    // The VIPs are in the file once n1's first probes have passed (within a probe interval).
    let want = format!("route {WEB}/32 via \"xvs-live\"; # vip");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let inc = loop {
        let inc = std::fs::read_to_string(t.node_dir(1).join("bird-xvs.conf")).unwrap();
        if inc.contains(&want) || std::time::Instant::now() > deadline {
            break inc;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(inc.contains(&want), "{inc}");
    // BIRD comes back: it reads the file, the routes return, and xvs's retry reconfigures it.
    let started = std::time::Instant::now();
    t.start_bird("n1");
    expect_hops(&t, WEB, &both(), SETTLE);
    println!(
        "n1's BIRD started: ECMP over both again {:.2} s later",
        started.elapsed().as_secs_f64()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while t.stats(1)["bgp"]["in_sync"] != true && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let b = &t.stats(1)["bgp"];
    assert_eq!(b["in_sync"], true, "{b}");
    assert!(b.get("last_error").is_none(), "{b}");
}
