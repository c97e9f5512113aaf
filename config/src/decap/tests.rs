use super::*;

const GOOD: &str = r#"
interfaces = ["eth0", "eth1.100"]
vips = [
  "198.18.100.1",
  "198.18.100.1:80=8080/tcp",
  "198.18.100.2:53=5353/udp",
  "[2001:2:0:100::1]:80=8080",
]
gue_port = 7000
xdp_mode = "generic"
vips_on_lo = true
bpf_pin_root = "/run/xvs-bpf/decap"
"#;

fn problems(text: &str) -> Vec<crate::Problem> {
    parse_decap(text, "decap.toml")
        .expect_err("must be refused")
        .problems()
        .to_vec()
}

#[test]
fn a_full_file_parses() {
    let c = parse_decap(GOOD, "decap.toml").unwrap();
    assert_eq!(c.interfaces, ["eth0", "eth1.100"]);
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(
        c.vips,
        [
            ip("198.18.100.1"),
            ip("198.18.100.2"),
            ip("2001:2:0:100::1")
        ]
    );
    assert_eq!(
        c.ports,
        [
            PortTranslation {
                vip: ip("198.18.100.1"),
                protocol: Protocol::Tcp,
                port: 80,
                target: 8080
            },
            PortTranslation {
                vip: ip("198.18.100.2"),
                protocol: Protocol::Udp,
                port: 53,
                target: 5353
            },
            PortTranslation {
                vip: ip("2001:2:0:100::1"),
                protocol: Protocol::Tcp,
                port: 80,
                target: 8080
            },
        ]
    );
    assert_eq!(c.gue_port, 7000);
    assert_eq!(c.xdp_mode, XdpMode::Generic);
    assert!(c.vips_on_lo);
    assert_eq!(c.bpf_pin_root, PathBuf::from("/run/xvs-bpf/decap"));
}

#[test]
fn defaults() {
    let c = parse_decap("interfaces = [\"eth0\"]\nvips = [\"198.18.100.1\"]\n", "f").unwrap();
    assert_eq!(c.gue_port, 6080);
    assert_eq!(c.xdp_mode, XdpMode::Auto);
    assert!(!c.vips_on_lo);
    assert_eq!(c.bpf_pin_root, PathBuf::from("/sys/fs/bpf/xvs-decap"));
    assert!(c.ports.is_empty());
}

/// The documented example is a valid file and sets every key the schema has.
#[test]
fn the_example_parses_and_documents_every_key() {
    let text = include_str!("../../examples/decap.toml");
    parse_decap(text, "decap.toml").unwrap();
    for key in [
        "interfaces",
        "vips",
        "gue_port",
        "xdp_mode",
        "vips_on_lo",
        "bpf_pin_root",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{key} ="))),
            "decap.toml does not set {key}"
        );
    }
}

#[test]
fn every_bad_entry_is_named_with_its_line() {
    let text = r#"interfaces = ["eth0", "eth0", "a/b", ""]
vips = [
  "198.18.100.1:80=8080/tcp",
  "198.18.100.1:80=9090/tcp",
  "198.18.100.1:81=8080/tcp",
  "198.18.100.1:82=82",
  "198.18.100.1:83",
  "198.18.100.1:84=8084/sctp",
  "127.0.0.1",
  "2001:2::1:80=8080",
  "198.18.100.1:0=80",
  "198.18.100.9",
  "198.18.100.9",
  "not an address",
]
gue_port = 0
bpf_pin_root = "relative"
"#;
    let got: Vec<(String, usize)> = problems(text)
        .into_iter()
        .map(|p| (p.key, p.line))
        .collect();
    let want: Vec<(String, usize)> = [
        ("interfaces[1]", 1),
        ("interfaces[2]", 1),
        ("interfaces[3]", 1),
        ("vips[1]", 4),
        ("vips[2]", 5),
        ("vips[3]", 6),
        ("vips[4]", 7),
        ("vips[5]", 8),
        ("vips[6]", 9),
        ("vips[7]", 10),
        ("vips[8]", 11),
        ("vips[10]", 13),
        ("vips[11]", 14),
        ("gue_port", 16),
        ("bpf_pin_root", 17),
    ]
    .iter()
    .map(|(k, l)| ((*k).to_owned(), *l))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn messages_say_what_is_wrong() {
    let msg = |entry: &str| VipEntry::parse(entry).unwrap_err();
    assert!(msg("198.18.100.1:80=80").contains("translated to itself"));
    assert!(msg("198.18.100.1:80").contains("translates nothing"));
    assert!(msg("198.18.100.1:80=8080/sctp").contains("CRC32c"));
    assert!(msg("198.18.100.1:80=8080/icmp").contains("unknown protocol"));
    assert!(msg("[2001:2::1:80=8080").contains("no `]`"));
    assert!(msg("198.18.100.1:70000=80").contains("not a port"));
    let p = problems(
        "interfaces = [\"eth0\"]\nvips = [\"198.18.100.1:80=8080\", \"198.18.100.1:81=8080\"]\n",
    );
    assert!(
        p[0].message.contains("replies from it could not tell"),
        "{}",
        p[0].message
    );
}

#[test]
fn unknown_keys_and_missing_lists_are_refused() {
    let p = problems("interfaces = [\"eth0\"]\nvips = [\"198.18.100.1\"]\ngue = 1\n");
    assert_eq!(p[0].key, "gue");
    let p = problems("interfaces = [\"eth0\"]\n");
    assert_eq!(p[0].key, "vips");
    let p = problems("interfaces = []\nvips = []\n");
    let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["interfaces", "vips"]);
}

#[test]
fn flags_are_validated_alike_and_named() {
    let ok = decap_from_args(DecapArgs {
        interfaces: vec!["eth0".into()],
        vips: vec!["198.18.100.1:80=8080/tcp".into()],
        ..DecapArgs::default()
    })
    .unwrap();
    assert_eq!(ok.vips, ["198.18.100.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(ok.gue_port, DEFAULT_GUE_PORT);
    let errs = decap_from_args(DecapArgs {
        interfaces: vec![],
        vips: vec!["198.18.100.1:80=80".into(), "224.0.0.1".into()],
        gue_port: Some(0),
        bpf_pin_root: Some("x".into()),
        ..DecapArgs::default()
    })
    .unwrap_err();
    assert_eq!(errs.len(), 5, "{errs:?}");
    assert!(errs[0].starts_with("--interface: "), "{errs:?}");
    assert!(
        errs[1].starts_with("--vip 198.18.100.1:80=80: "),
        "{errs:?}"
    );
    assert!(
        errs[2].starts_with("--vip 224.0.0.1: 224.0.0.1 is a multicast"),
        "{errs:?}"
    );
    assert!(errs[3].starts_with("--gue-port: "), "{errs:?}");
    assert!(errs[4].starts_with("--pin-root: "), "{errs:?}");
}
