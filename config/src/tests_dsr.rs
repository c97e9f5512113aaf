//! Direct server return's keys: `mode = "dsr"` and `encap` per service, `[dataplane]
//! gue_port`, `ipip_source_prefix`, `dsr_mss_clamp`, `dsr_mtu`.

use super::*;

const BASE: &str = r#"
[dataplane]
snat_addresses = ["198.18.1.254"]

[[services]]
name = "web"
vip = "198.18.100.1"
port = 80
protocol = "tcp"
mode = "dsr"
backends = [{ addr = "198.18.1.1:8080" }]
"#;

fn problems(text: &str) -> Vec<Problem> {
    match parse(text, "t.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.problems().to_vec(),
    }
}

fn one(text: &str) -> Problem {
    let p = problems(text);
    assert_eq!(p.len(), 1, "expected one problem, got: {p:?}");
    p[0].clone()
}

#[test]
fn dsr_defaults_to_ipip_and_encap_picks_the_others() {
    let c = parse(BASE, "t.toml").unwrap();
    let s = &c.services[0];
    assert_eq!(s.mode_or(c.dataplane.mode), Mode::Dsr(Encap::Ipip));
    assert_eq!(c.dataplane.gue_port, 6080);
    assert!(c.dataplane.dsr_mss_clamp);
    assert_eq!(c.dataplane.dsr_mtu, None);
    assert_eq!(c.dataplane.ipip_source_prefix, None);
    for e in ["ipip", "gue"] {
        let c = parse(
            &BASE.replace(
                "mode = \"dsr\"",
                &format!("mode = \"dsr\"\nencap = \"{e}\""),
            ),
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            c.services[0].mode_or(c.dataplane.mode),
            Mode::Dsr(Encap::from_name(e).unwrap())
        );
    }
    let l2 = BASE
        .replace("mode = \"dsr\"", "mode = \"dsr\"\nencap = \"l2\"")
        .replace("198.18.1.1:8080", "198.18.1.1:80");
    let c = parse(&l2, "t.toml").unwrap();
    assert_eq!(
        c.services[0].mode_or(c.dataplane.mode),
        Mode::Dsr(Encap::L2)
    );
    let keys = "[dataplane]\ngue_port = 7000\nipip_source_prefix = \"198.18.200.0/24\"\ndsr_mss_clamp = false\ndsr_mtu = 9000\n";
    let c = parse(&BASE.replace("[dataplane]\n", keys), "t.toml").unwrap();
    let dp = &c.dataplane;
    assert_eq!(dp.gue_port, 7000);
    assert_eq!(
        dp.ipip_source_prefix,
        Some("198.18.200.0/24".parse().unwrap())
    );
    assert!(!dp.dsr_mss_clamp);
    assert_eq!(dp.dsr_mtu, Some(9000));
    // Restart-only keys, as every [dataplane] key.
    let base = parse(BASE, "t.toml").unwrap();
    assert_eq!(
        base.dataplane.differences(dp),
        [
            "dataplane.gue_port",
            "dataplane.ipip_source_prefix",
            "dataplane.dsr_mss_clamp",
            "dataplane.dsr_mtu"
        ]
    );
}

#[test]
fn misplaced_or_bad_dsr_keys_are_refused_by_key() {
    let cases: &[(&str, &str, &str)] = &[
        // Not as every service's default.
        (
            "[dataplane]\n",
            "[dataplane]\nmode = \"dsr\"\n",
            "dataplane.mode",
        ),
        // encap without DSR.
        (
            "mode = \"dsr\"",
            "mode = \"nat\"\nencap = \"gue\"",
            "services[0].encap",
        ),
        ("mode = \"dsr\"", "encap = \"gue\"", "services[0].encap"),
        // An unknown encapsulation.
        (
            "mode = \"dsr\"",
            "mode = \"dsr\"\nencap = \"vxlan\"",
            "services[0].encap",
        ),
        // The SYN proxy needs replies.
        (
            "mode = \"dsr\"",
            "mode = \"dsr\"\nsynproxy = \"on\"",
            "services[0].synproxy",
        ),
        // l2 cannot translate ports.
        (
            "mode = \"dsr\"",
            "mode = \"dsr\"\nencap = \"l2\"",
            "services[0].backends[0].addr",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\ngue_port = 0\n",
            "dataplane.gue_port",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\ndsr_mtu = 576\n",
            "dataplane.dsr_mtu",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\ndsr_mtu = 65000\n",
            "dataplane.dsr_mtu",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\nipip_source_prefix = \"224.0.0.0/8\"\n",
            "dataplane.ipip_source_prefix",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\nipip_source_prefix = \"198.18.0.1/24\"\n",
            "dataplane.ipip_source_prefix",
        ),
        // Absurd lengths: too wide to be the node's, or no prefix at all.
        (
            "[dataplane]\n",
            "[dataplane]\nipip_source_prefix = \"128.0.0.0/1\"\n",
            "dataplane.ipip_source_prefix",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\nipip_source_prefix = \"2001::/16\"\n",
            "dataplane.ipip_source_prefix",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\nipip_source_prefix = \"198.18.0.0/33\"\n",
            "dataplane.ipip_source_prefix",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\nipip_source_prefix = \"0.0.0.0/0\"\n",
            "dataplane.ipip_source_prefix",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\ngue_port = 70000\n",
            "dataplane.gue_port",
        ),
        // Full-NAT-only: the SYN proxy, on or auto.
        (
            "mode = \"dsr\"",
            "mode = \"dsr\"\nsynproxy = \"auto\"",
            "services[0].synproxy",
        ),
        ("mode = \"dsr\"", "mode = \"DSR\"", "services[0].mode"),
    ];
    for (from, to, key) in cases {
        let text = BASE.replace(from, to);
        assert_ne!(text, BASE, "{to}");
        let p = one(&text);
        assert_eq!(p.key, *key, "{to}: {}", p.message);
    }
}

#[test]
fn a_source_prefix_of_the_other_family_gives_no_outer_source() {
    // The only IPv4 source is gone, the prefix is IPv6: the IPv4 service is refused.
    let text = BASE.replace(
        "snat_addresses = [\"198.18.1.254\"]",
        "ipip_source_prefix = \"2001:2:0:ff::/64\"",
    );
    let p = one(&text);
    assert_eq!(p.key, "services[0].mode", "{}", p.message);
    assert!(p.message.contains("IPv4"), "{}", p.message);
    // The widest prefixes allowed, and a single address, are taken.
    for ok in ["198.18.0.0/16", "198.18.7.7/32", "2001:2::/48"] {
        let text = BASE.replace(
            "[dataplane]\n",
            &format!("[dataplane]\nipip_source_prefix = \"{ok}\"\n"),
        );
        parse(&text, "t.toml").unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn ipip_and_gue_need_an_outer_source_of_the_family() {
    // IPv6 service, no IPv6 address anywhere: refused at its mode.
    let v6 = BASE
        .replace("198.18.100.1", "2001:2:0:100::1")
        .replace("198.18.1.1:8080", "[2001:2:0:1::1]:8080");
    let p = one(&v6);
    assert_eq!(p.key, "services[0].mode", "{}", p.message);
    assert!(p.message.contains("IPv6"), "{}", p.message);
    // l2 needs none.
    let l2 = v6
        .replace("mode = \"dsr\"", "mode = \"dsr\"\nencap = \"l2\"")
        .replace("]:8080", "]:80");
    parse(&l2, "t.toml").unwrap();
    // Each source of an IPv6 address will do.
    for extra in [
        "[node]\naddresses = [\"2001:2:0:1::fe\"]\n",
        "[dataplane]\nipip_source_prefix = \"2001:2:0:ff::/64\"\n",
    ] {
        let text = v6.replacen("[dataplane]\n", "[dataplane]\n#\n", 1);
        let text = if extra.starts_with("[dataplane]") {
            text.replace("[dataplane]\n#\n", extra)
        } else {
            format!("{extra}{text}")
        };
        let c = parse(&text, "t.toml").unwrap_or_else(|e| panic!("{extra}: {e}"));
        assert!(c.has_dsr_source(true), "{extra}");
    }
    let with_snat = v6.replace(
        "snat_addresses = [\"198.18.1.254\"]",
        "snat_addresses = [\"198.18.1.254\", \"2001:2:0:1::fe\"]",
    );
    let c = parse(&with_snat, "t.toml").unwrap();
    assert_eq!(
        c.dsr_outer_source(true),
        Some("2001:2:0:1::fe".parse().unwrap())
    );
    // The node's address comes before the SNAT address.
    let c = parse(
        &format!("[node]\naddresses = [\"198.18.10.1\"]\n{BASE}"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(
        c.dsr_outer_source(false),
        Some("198.18.10.1".parse().unwrap())
    );
}
