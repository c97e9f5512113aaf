use super::*;

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    v
}

/// The single problem of an invalid text.
fn problem(text: &str) -> Problem {
    match parse(text, "t.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => {
            let p = e.problems();
            assert_eq!(p.len(), 1, "expected one problem, got: {e}");
            p[0].clone()
        }
    }
}

const MINIMAL: &str = r#"
[dataplane]
snat_addresses = ["198.18.1.254"]

[[services]]
name = "web"
vip = "198.18.100.1"
port = 80
protocol = "tcp"
scheduler = "wrr"
backends = [
  { addr = "198.18.1.1:8080", weight = 4 },
  { addr = "198.18.1.2:8080", weight = 3 },
]
"#;

#[test]
fn every_example_loads() {
    let all = examples();
    let names: Vec<_> = all
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    for want in ["edge-node.toml", "lab.toml", "static-services.toml"] {
        assert!(names.contains(&want), "missing example {want}");
    }
    for p in &all {
        // decap.toml is `xvs decap`'s file, not `xvs run`'s.
        let loaded = if p.file_name().is_some_and(|n| n == "decap.toml") {
            let text = std::fs::read_to_string(p).unwrap();
            parse_decap(&text, &p.display().to_string()).map(drop)
        } else {
            load(p).map(drop)
        };
        if let Err(e) = loaded {
            panic!("{} does not load:\n{e}", p.display());
        }
    }
}

#[test]
fn examples_say_what_they_are() {
    let lab = parse(LAB_TOML, "lab.toml").unwrap();
    assert_eq!(lab.dataplane.interfaces.len(), 2);
    assert!(lab.kubernetes.is_none());
    assert!(lab.services.iter().all(|s| {
        let range: Cidr = if s.vip.is_ipv4() {
            "198.18.0.0/15"
        } else {
            "2001:2::/48"
        }
        .parse()
        .unwrap();
        range.contains(s.vip) && s.backends.iter().all(|b| range.contains(b.addr.ip()))
    }));
    let edge = load(
        &examples()
            .into_iter()
            .find(|p| p.ends_with("edge-node.toml"))
            .unwrap(),
    )
    .unwrap();
    assert!(edge.uses_kubernetes());
    assert_eq!(edge.dataplane.interfaces.len(), 2);
    assert_eq!(edge.dataplane.cores.listed().len(), 4);
    assert_eq!(edge.dataplane.workers(), 4);
}

#[test]
fn minimal_file_gets_defaults() {
    let c = parse(MINIMAL, "t.toml").unwrap();
    assert_eq!(c.dataplane.mode, Mode::Fullnat);
    assert_eq!(c.dataplane.batch_size, 64);
    assert_eq!(c.dataplane.mh_table_size, 65537);
    assert!(!c.dataplane.napi_busy_poll);
    assert_eq!(c.timeouts.tcp_established.get().as_secs(), 900);
    assert_eq!(c.timeouts.tcp_syn.get().as_secs(), 60);
    assert_eq!(c.timeouts.tcp_fin_wait.get().as_secs(), 120);
    assert_eq!(c.timeouts.tcp_time_wait.get().as_secs(), 120);
    assert_eq!(c.timeouts.tcp_close.get().as_secs(), 10);
    assert_eq!(c.timeouts.udp.get().as_secs(), 300);
    assert_eq!(c.admin.listen.to_string(), "127.0.0.1:10249");
    assert_eq!(c.admin.healthz_listen().to_string(), "0.0.0.0:10256");
    assert_eq!(c.admin_socket(), Path::new("/run/xvs/xvs.sock"));
    assert_eq!(c.dataplane.state_dir, Path::new("/run/xvs"));
    assert_eq!(c.dataplane.restart_hold.get().as_secs(), 30);
    assert_eq!(c.removal_grace().as_secs(), 3);
    assert!(!c.admin.enable_control);
    assert_eq!(c.log.level, "info");
    assert_eq!(c.log.format, LogFormat::Text);
    let s = &c.services[0];
    assert_eq!(s.scheduler, SchedulerKind::Wrr);
    assert_eq!(s.backends[1].weight, 3);
    assert_eq!(s.mode_or(c.dataplane.mode), Mode::Fullnat);
    // An empty file is a valid (idle) configuration.
    assert!(parse("", "t.toml").unwrap().services.is_empty());
}

#[test]
fn service_without_backends_is_fine() {
    let c = parse(
        "[[services]]\nname = \"a\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"udp\"\nmode = \"nat\"\n",
        "t.toml",
    )
    .unwrap();
    assert!(c.services[0].backends.is_empty());
    assert_eq!(c.services[0].scheduler, SchedulerKind::Rr);
}

#[test]
fn misspelt_key_names_key_and_line() {
    let text = MINIMAL.replace("scheduler = \"wrr\"", "schedular = \"wrr\"");
    let p = problem(&text);
    assert_eq!(p.key, "services[0].schedular");
    assert_eq!(p.line, 10);
    assert_eq!(
        p.message, "unknown key `schedular`: did you mean `scheduler`?",
        "a typo gets the key it meant, not the list of every key"
    );
    // A word that is no typo of any key keeps serde's list.
    let p = problem("[dataplane]\nbananas = 64\n");
    assert!(p.message.contains("expected one of"), "{}", p.message);
    let p = problem("[synproxy]\nmode = \"aut\"\n");
    assert!(p.message.contains("did you mean `auto`?"), "{}", p.message);
    let p = problem("[dataplane]\nbatch = 64\n");
    assert_eq!(
        (p.key.as_str(), p.line, p.column),
        ("dataplane.batch", 2, 1)
    );
    let p = problem("[dataplan]\n");
    assert_eq!((p.key.as_str(), p.line), ("dataplan", 1));
}

#[test]
fn invalid_ip_names_key_and_line() {
    let p = problem(&MINIMAL.replace("198.18.100.1", "198.18.300.1"));
    assert_eq!(
        (p.key.as_str(), p.line, p.column),
        ("services[0].vip", 7, 7)
    );
    assert!(p.message.contains("IP address"), "{}", p.message);
    let p = problem(&MINIMAL.replace("198.18.1.2:8080", "198.18.1.2"));
    assert_eq!(
        (p.key.as_str(), p.line),
        ("services[0].backends[1].addr", 13)
    );
}

#[test]
fn unknown_scheduler_names_key_and_line() {
    let p = problem(&MINIMAL.replace("\"wrr\"", "\"fastest\""));
    assert_eq!(
        (p.key.as_str(), p.line, p.column),
        ("services[0].scheduler", 10, 13)
    );
    assert!(p.message.contains("fastest"), "{}", p.message);
    assert!(
        p.message.contains("`mh`"),
        "lists the valid names: {}",
        p.message
    );
}

#[test]
fn batch_size_must_be_power_of_two() {
    let text = MINIMAL.replace("[dataplane]\n", "[dataplane]\nbatch_size = 48\n");
    let p = problem(&text);
    assert_eq!(
        (p.key.as_str(), p.line, p.column),
        ("dataplane.batch_size", 3, 14)
    );
    assert!(p.message.contains("power of two"));
}

#[test]
fn duplicate_frontend_is_an_error() {
    let second =
        "\n[[services]]\nname = \"web2\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\n";
    let p = problem(&format!("{MINIMAL}{second}"));
    assert_eq!((p.key.as_str(), p.line), ("services[1].vip", 18));
    assert!(
        p.message.contains("duplicate frontend 198.18.100.1:80/tcp"),
        "{}",
        p.message
    );
    // Same VIP and port on another protocol is a different frontend.
    let udp = second.replace("tcp", "udp");
    assert!(parse(&format!("{MINIMAL}{udp}"), "t.toml").is_ok());
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = MINIMAL
        .replace(
            "[dataplane]\n",
            "[dataplane]\nbatch_size = 100\nmh_table_size = 65536\n",
        )
        .replace("198.18.1.2:8080", "[2001:2::1]:8080");
    let e = parse(&text, "t.toml").unwrap_err();
    let keys: Vec<&str> = e.problems().iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "dataplane.batch_size",
            "dataplane.mh_table_size",
            "services[0].backends[1].addr"
        ]
    );
    let shown = e.to_string();
    assert!(
        shown.starts_with("t.toml:3:14: dataplane.batch_size: "),
        "{shown}"
    );
}

#[test]
fn cross_field_rules() {
    let cases: &[(&str, &str, &str)] = &[
        // (replace in MINIMAL, with, expected key)
        (
            "[dataplane]\n",
            "[dataplane]\ncores = [1, 1]\n",
            "dataplane.cores[1]",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\ninterfaces = [{ name = \"eth0\" }]\n",
            "dataplane.cores",
        ),
        (
            "snat_addresses = [\"198.18.1.254\"]",
            "",
            "services[0].mode",
        ),
        (
            "scheduler = \"wrr\"",
            "scheduler = \"rr\"\nflags = [\"mh-port\"]",
            "services[0].flags[0]",
        ),
        (
            "weight = 4",
            "weight = 70000",
            "services[0].backends[0].weight",
        ),
        (
            "198.18.1.2:8080",
            "198.18.1.1:8080",
            "services[0].backends[1].addr",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\nrx_ring_size = 1000\n",
            "dataplane.rx_ring_size",
        ),
        (
            "[dataplane]\n",
            "[dataplane]\numem_frames = 1024\n",
            "dataplane.umem_frames",
        ),
        (
            "[dataplane]\n",
            "[timeouts]\nudp = \"0s\"\n[dataplane]\n",
            "timeouts.udp",
        ),
        (
            "[dataplane]\n",
            "[timeouts]\nudp = \"30\"\n[dataplane]\n",
            "timeouts.udp",
        ),
        (
            "[dataplane]\n",
            "[health]\ntimeout = \"10s\"\n[dataplane]\n",
            "health.timeout",
        ),
        (
            "name = \"web\"\n",
            "name = \"web\"\nsession_affinity_timeout = \"2d\"\n",
            "services[0].session_affinity_timeout",
        ),
        ("port = 80\n", "", "services[0].port"),
    ];
    for (from, to, key) in cases {
        let text = MINIMAL.replace(from, to);
        assert_ne!(text, MINIMAL, "case {key}: replacement did not apply");
        let p = problem(&text);
        assert_eq!(p.key, *key, "{p:?}");
        assert!(p.line >= 1 && p.column >= 1);
    }
}

#[test]
fn kubernetes_and_static_services_do_not_mix() {
    let text = format!("[kubernetes]\nservice_proxy_name = \"xvs\"\n{MINIMAL}");
    let p = problem(&text);
    assert_eq!(p.key, "services");
    let c = parse(
        "[kubernetes]\nexternal_ip_cidrs = [\"198.18.200.0/24\"]\n",
        "t.toml",
    )
    .unwrap();
    let k = c.kubernetes.unwrap();
    assert_eq!(k.min_sync_period.get().as_secs(), 1);
    assert_eq!(k.default_scheduler, SchedulerKind::Rr);
    let p = problem("[kubernetes]\nexternal_ip_cidrs = [\"198.18.200.1/24\"]\n");
    assert_eq!(
        (p.key.as_str(), p.line),
        ("kubernetes.external_ip_cidrs[0]", 2)
    );
}

#[test]
fn syntax_errors_have_a_position() {
    let p = problem("[dataplane]\nbatch_size = = 4\n");
    assert_eq!(p.line, 2);
    assert!(p.key.is_empty());
    let e = load(Path::new("/nonexistent/xvs.toml")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/xvs.toml"));
}

#[test]
fn napi_busy_poll_is_a_boolean() {
    let text = MINIMAL.replace("[dataplane]\n", "[dataplane]\nnapi_busy_poll = true\n");
    assert!(parse(&text, "t.toml").unwrap().dataplane.napi_busy_poll);
    let p = problem(&MINIMAL.replace("[dataplane]\n", "[dataplane]\nnapi_busy_poll = 1\n"));
    assert_eq!(
        (p.key.as_str(), p.line),
        ("dataplane.napi_busy_poll", 3),
        "{}",
        p.message
    );
}

#[test]
fn admin_listeners_split_by_exposure() {
    let with = |admin: &str| MINIMAL.to_owned() + "\n[admin]\n" + admin;
    // A config written before the split (everything on 10256) keeps one listener.
    let c = parse(&with("listen = \"127.0.0.1:10256\"\n"), "t.toml").unwrap();
    assert_eq!(c.admin.healthz_listen(), c.admin.listen);
    let c = parse(
        &with("listen = \"127.0.0.1:10249\"\nhealthz_listen = \"[::]:10256\"\n"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.admin.healthz_listen().to_string(), "[::]:10256");
    // Same port, one side the wildcard of the other's family: cannot both be bound.
    let p = problem(&with(
        "listen = \"127.0.0.1:10250\"\nhealthz_listen = \"0.0.0.0:10250\"\n",
    ));
    assert_eq!(p.key, "admin.healthz_listen", "{}", p.message);
    assert!(p.message.contains("overlaps admin.listen"), "{}", p.message);
    let p = problem(&with("socket = \"xvs.sock\"\n"));
    assert_eq!(p.key, "admin.socket", "{}", p.message);
}

#[test]
fn log_level_and_format() {
    let with = |log: &str| MINIMAL.to_owned() + "\n[log]\n" + log;
    let c = parse(
        &with("level = \"info,kube=warn,xvs=DEBUG\"\nformat = \"json\"\n"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.log.format, LogFormat::Json);
    for bad in ["loud", "info,kube=", "=warn", ""] {
        let p = problem(&with(&format!("level = {bad:?}\n")));
        assert_eq!(
            (p.key.as_str(), p.line),
            ("log.level", 17),
            "{bad}: {}",
            p.message
        );
    }
    let p = problem(&with("format = \"xml\"\n"));
    assert_eq!(p.key, "log.format", "{}", p.message);
}

#[test]
fn state_dir_restart_hold_and_removal_grace() {
    let with = |dp: &str, extra: &str| {
        MINIMAL.replace("[dataplane]\n", &format!("[dataplane]\n{dp}")) + extra
    };
    // The socket follows the state directory unless set.
    let c = parse(&with("state_dir = \"/tmp/x\"\n", ""), "t.toml").unwrap();
    assert_eq!(c.admin_socket(), Path::new("/tmp/x/xvs.sock"));
    let c = parse(
        &with(
            "state_dir = \"/tmp/x\"\n",
            "\n[admin]\nsocket = \"/s/a.sock\"\n",
        ),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.admin_socket(), Path::new("/s/a.sock"));
    let p = problem(&with("state_dir = \"run/xvs\"\n", ""));
    assert_eq!(p.key, "dataplane.state_dir", "{}", p.message);
    let p = problem(&with("restart_hold = \"2h\"\n", ""));
    assert_eq!(p.key, "dataplane.restart_hold", "{}", p.message);
    // The grace must outlast two min_sync_periods (1s for the static source).
    let c = parse(
        &with("", "\n[flowtable]\nremoval_grace = \"10s\"\n"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.removal_grace().as_secs(), 10);
    let p = problem(&with("", "\n[flowtable]\nremoval_grace = \"2s\"\n"));
    assert_eq!(p.key, "flowtable.removal_grace", "{}", p.message);
    assert!(p.message.contains("EndpointSlices"), "{}", p.message);
}

/// What `xvs run` or the snapshot builder would refuse, `check` refuses, naming the key.
#[test]
fn values_run_or_the_builder_would_refuse() {
    let dp = |line: &str| MINIMAL.replace("[dataplane]\n", &format!("[dataplane]\n{line}\n"));
    let cases: Vec<(String, &str, &str)> = vec![
        // (text, expected key, a word the message must have)
        (
            format!("{MINIMAL}\n[flowtable]\ncapacity = 2147483648\n"),
            "flowtable.capacity",
            "GiB",
        ),
        (
            format!("{MINIMAL}\n[flowtable]\ncapacity = 0\n"),
            "flowtable.capacity",
            "1..=",
        ),
        (
            format!("{MINIMAL}\n[flowtable]\nbackends_max = 4294967295\n"),
            "flowtable.backends_max",
            "1..=",
        ),
        (
            dp("mh_table_size = 4294967291"),
            "dataplane.mh_table_size",
            "largest Maglev table",
        ),
        (
            dp("mh_table_size = 16777259"),
            "dataplane.mh_table_size",
            "largest Maglev table",
        ),
        (
            dp("mh_table_size = 65536"),
            "dataplane.mh_table_size",
            "not prime",
        ),
        (
            dp("idle_backoff = \"1d\""),
            "dataplane.idle_backoff",
            "maximum 10ms",
        ),
        (
            dp("umem_frames = 2147483648"),
            "dataplane.umem_frames",
            "maximum",
        ),
    ];
    for (text, key, word) in &cases {
        let p = problem(text);
        assert_eq!(p.key, *key, "{p:?}");
        assert!(p.message.contains(word), "{key}: {}", p.message);
    }
    // The bounds themselves are accepted.
    for ok in [
        dp("idle_backoff = \"10ms\""),
        dp("mh_table_size = 16777213"),
        format!("{MINIMAL}\n[flowtable]\ncapacity = 1073741824\n"),
    ] {
        parse(&ok, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn snat_addresses_backends_cannot_answer_are_refused() {
    for (addr, word) in [
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("255.255.255.255", "broadcast"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("::ffff:198.18.1.254", "IPv4-mapped"),
        ("198.18.100.1", "VIP of services[0] (web)"),
        ("198.18.1.2", "services[0].backends[1] (web)"),
    ] {
        let text = MINIMAL.replace(
            "snat_addresses = [\"198.18.1.254\"]",
            &format!("snat_addresses = [\"198.18.1.254\", \"{addr}\"]"),
        );
        let p = problem(&text);
        assert_eq!(
            (p.key.as_str(), p.line),
            ("dataplane.snat_addresses[1]", 3),
            "{addr}: {}",
            p.message
        );
        assert!(p.message.contains(word), "{addr}: {}", p.message);
    }
}

/// The addresses a Kubernetes Service may not take are config errors for `[[services]]`:
/// special addresses, the node's own addresses and other services' VIPs, for backends; the
/// special and the node's own addresses for VIPs. Each names the key, line and column.
#[test]
fn service_addresses_that_are_no_services_to_take_are_refused() {
    let node = "[node]\naddresses = [\"198.18.0.1\", \"2001:2::1\"]\n";
    let two = format!(
        "{node}{MINIMAL}\n[[services]]\nname = \"dns\"\nvip = \"198.18.100.53\"\nport = 53\nprotocol = \"udp\"\nbackends = [{{ addr = \"198.18.1.3:53\" }}]\n"
    );
    parse(&two, "t.toml").unwrap();
    for (addr, word) in [
        ("127.0.0.1", "a loopback address"),
        ("0.0.0.0", "the unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("255.255.255.255", "the broadcast address"),
        ("169.254.3.3", "link-local"),
        ("198.18.0.1", "this node's own address"),
        ("198.18.100.53", "the VIP of services[1] (dns)"),
        ("198.18.100.1", "the VIP of services[0] (web)"),
    ] {
        let text = two.replace("198.18.1.2:8080", &format!("{addr}:8080"));
        let p = problem(&text);
        assert_eq!(
            (p.key.as_str(), p.line, p.column),
            ("services[0].backends[1].addr", 15, 12),
            "{addr}: {}",
            p.message
        );
        assert!(
            p.message.contains("cannot be a backend"),
            "{addr}: {}",
            p.message
        );
        assert!(p.message.contains(word), "{addr}: {}", p.message);
    }
    for (vip, word) in [
        ("198.18.0.1", "this node's own address (node.addresses)"),
        ("127.0.0.1", "a loopback address"),
        ("255.255.255.255", "the broadcast address"),
    ] {
        let text = two.replace("vip = \"198.18.100.53\"", &format!("vip = \"{vip}\""));
        let p = problem(&text);
        assert_eq!(
            (p.key.as_str(), p.line),
            ("services[1].vip", 20),
            "{}",
            p.message
        );
        assert!(p.message.contains(word), "{vip}: {}", p.message);
    }
    // IPv6: the node's address and fe80::/10.
    let v6 = format!(
        "{node}[dataplane]\nmode = \"nat\"\n[[services]]\nname = \"w6\"\nvip = \"2001:2::100\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{{ addr = \"[2001:2::1]:80\" }}, {{ addr = \"[fe80::1]:80\" }}]\n"
    );
    let e = parse(&v6, "t.toml").unwrap_err();
    let keys: Vec<&str> = e.problems().iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "services[0].backends[0].addr",
            "services[0].backends[1].addr"
        ],
        "{e}"
    );
}

#[test]
fn interface_names_follow_the_kernel() {
    // `name` as a TOML basic string's contents.
    let with = |name: &str| {
        MINIMAL.replace(
            "[dataplane]\n",
            &format!("[dataplane]\ncores = [1]\ninterfaces = [{{ name = \"{name}\" }}]\n"),
        )
    };
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "eth0:1",
        "eth 0",
        "eth\\t0",
        "a\\u0001",
        "sixteen-bytes-xx",
    ] {
        let p = problem(&with(bad));
        assert_eq!(
            p.key, "dataplane.interfaces[0].name",
            "{bad:?}: {}",
            p.message
        );
        assert!(
            p.message.contains("not a valid interface name"),
            "{bad:?}: {}",
            p.message
        );
    }
    for good in ["eth0", "ens1f0np0", "fifteen-bytes-x", "xvs-c0", "veth.100"] {
        parse(&with(good), "t.toml").unwrap_or_else(|e| panic!("{good}: {e}"));
    }
}

#[test]
fn scheduler_limits_of_the_builder() {
    // wrr: a sequence of sum(weights) / gcd entries, at most 2^20.
    let mut backends = String::new();
    for i in 1..=17 {
        backends.push_str(&format!(
            "{{ addr = \"198.18.1.{i}:80\", weight = 65535 }},\n"
        ));
    }
    backends.push_str("{ addr = \"198.18.1.100:80\", weight = 1 },\n");
    let text = format!(
        "[dataplane]\nsnat_addresses = [\"198.18.1.254\"]\n[[services]]\nname = \"w\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nscheduler = \"wrr\"\nbackends = [\n{backends}]\n"
    );
    let p = problem(&text);
    assert_eq!(p.key, "services[0].backends", "{}", p.message);
    assert!(p.message.contains("wrr sequence"), "{}", p.message);
    // The same weights are fine for rr, which ignores them.
    parse(&text.replace("\"wrr\"", "\"rr\""), "t.toml").unwrap();
    // mh: every backend needs a slot per round.
    let text = text
        .replace("\"wrr\"", "\"mh\"")
        .replace("[dataplane]\n", "[dataplane]\nmh_table_size = 13\n");
    let p = problem(&text);
    assert_eq!(p.key, "services[0].backends", "{}", p.message);
    assert!(p.message.contains("Maglev turns"), "{}", p.message);
}

#[test]
fn a_duplicate_key_names_the_key() {
    let p = problem("[dataplane]\nbatch_size = 64\nbatch_size = 32\n");
    assert_eq!(
        (p.key.as_str(), p.line, p.column),
        ("dataplane.batch_size", 3, 1)
    );
    assert!(p.message.contains("set twice"), "{}", p.message);
    let p = problem("[dataplane]\nbatch_size = 64\n[timeouts]\nudp = \"1s\"\n[dataplane]\n");
    assert_eq!((p.key.as_str(), p.line), ("dataplane", 5), "{}", p.message);
    assert!(p.message.contains("defined twice"), "{}", p.message);
    let text = format!("{MINIMAL}\n[[services]]\nname = \"a\"\nname = \"b\"\n");
    let p = problem(&text);
    assert_eq!(
        (p.key.as_str(), p.line),
        ("services[1].name", 18),
        "{}",
        p.message
    );
    let p = problem("log = { level = \"info\", level = \"warn\" }\n");
    assert!(p.key.contains("level"), "{p:?}");
    // The whole line as the user sees it.
    let e = parse(
        "[admin]\nlisten = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:2\"\n",
        "x.toml",
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("x.toml:3:1: admin.listen: admin.listen is set twice"),
        "{e}"
    );
}

#[test]
fn what_a_file_wrote() {
    let (_, w) = parse_written("", "t.toml").unwrap();
    assert!(w.keys.is_empty() && w.ends_with_newline);
    let (_, w) = parse_written("# only a comment\n\n  \n", "t.toml").unwrap();
    assert!(w.keys.is_empty());
    let (c, w) = parse_written(MINIMAL, "t.toml").unwrap();
    assert_eq!(
        w.keys.iter().map(String::as_str).collect::<Vec<_>>(),
        ["dataplane", "services"]
    );
    assert!(w.ends_with_newline);
    let (_, w) = parse_written("services = []", "t.toml").unwrap();
    assert!(w.has("services") && !w.ends_with_newline);
    // Every key of [dataplane] is compared.
    let mut other = c.dataplane.clone();
    assert!(c.dataplane.differences(&other).is_empty());
    other.batch_size = 32;
    other.interfaces.push(Interface {
        name: "eth0".into(),
        queues: 1,
    });
    assert_eq!(
        c.dataplane.differences(&other),
        ["dataplane.interfaces", "dataplane.batch_size"]
    );
}

#[test]
fn synproxy_defaults_overrides_and_refusals() {
    let c = parse(MINIMAL, "t.toml").unwrap();
    assert_eq!(c.synproxy.mode, SynproxyMode::Auto);
    assert_eq!(c.synproxy.auto_threshold, None);
    assert_eq!(c.synproxy.threshold(c.flowtable.capacity), 1000);
    assert_eq!(c.synproxy.threshold(100), 50, "half a small table");
    assert_eq!(c.services[0].synproxy, None);
    assert_eq!(
        c.services[0].synproxy_or(c.synproxy.mode),
        SynproxyMode::Auto
    );
    let text = format!(
        "{}[synproxy]\nmode = \"off\"\nauto_threshold = 50\n",
        MINIMAL.replace("backends = [", "synproxy = \"on\"\nbackends = [")
    );
    let c = parse(&text, "t.toml").unwrap();
    assert_eq!(c.synproxy.mode, SynproxyMode::Off);
    assert_eq!(c.synproxy.auto_threshold, Some(50));
    assert_eq!(c.synproxy.threshold(c.flowtable.capacity), 50);
    assert_eq!(c.services[0].synproxy, Some(SynproxyMode::On));
    assert_eq!(c.services[0].synproxy_or(c.synproxy.mode), SynproxyMode::On);

    let p = problem("[synproxy]\nmode = \"maybe\"\n");
    assert_eq!(p.key, "synproxy.mode");
    let p = problem("[synproxy]\nauto_threshold = 0\n");
    assert_eq!(p.key, "synproxy.auto_threshold");
    let p = problem("[flowtable]\ncapacity = 100\n[synproxy]\nauto_threshold = 100\n");
    assert_eq!(p.key, "synproxy.auto_threshold");
    assert!(p.message.contains("flowtable.capacity"), "{}", p.message);
    let p = problem("[synproxy]\nthreshold = 10\n");
    assert_eq!(p.key, "synproxy.threshold");
    let p = problem(
        "[[services]]\nname = \"d\"\nvip = \"198.18.100.1\"\nport = 53\nprotocol = \"udp\"\nmode = \"nat\"\nsynproxy = \"on\"\n",
    );
    assert_eq!(p.key, "services[0].synproxy");
    assert!(p.message.contains("TCP"), "{}", p.message);
    // "off" and "auto" are harmless on a UDP service (the global default is auto).
    parse(
        "[[services]]\nname = \"d\"\nvip = \"198.18.100.1\"\nport = 53\nprotocol = \"udp\"\nmode = \"nat\"\nsynproxy = \"off\"\n",
        "t.toml",
    )
    .unwrap();
    for m in [SynproxyMode::Off, SynproxyMode::On, SynproxyMode::Auto] {
        assert_eq!(SynproxyMode::from_name(m.name()), Some(m));
    }
}

#[test]
fn sync_defaults_and_refusals() {
    let c = parse(MINIMAL, "t.toml").unwrap();
    assert!(!c.sync.enable);
    assert_eq!(c.sync.interval.get(), std::time::Duration::from_millis(10));
    assert_eq!(c.sync.max_messages_per_second, 20_000);
    let on = |extra: &str| {
        format!(
            "{MINIMAL}[sync]\nenable = true\nlisten = \"198.18.2.11:7946\"\nkey_file = \"/etc/xvs/sync.key\"\n{extra}"
        )
    };
    let c = parse(
        &on("peers = [{ address = \"198.18.2.12:7946\", snat_addresses = [\"198.18.3.2\"] }]\n"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.sync.peers.len(), 1);
    assert_eq!(
        c.sync.peers[0].snat_addresses,
        vec!["198.18.3.2".parse::<std::net::IpAddr>().unwrap()]
    );
    let p = problem(&on(""));
    assert_eq!(p.key, "sync.peers");
    let p = problem(&on("peers = [{ address = \"198.18.2.11:7946\" }]\n"));
    assert_eq!(p.key, "sync.peers[0].address");
    assert!(p.message.contains("sync.listen"), "{}", p.message);
    let p = problem(&on(
        "peers = [{ address = \"198.18.2.12:7946\", snat_addresses = [\"198.18.1.254\"] }]\n",
    ));
    assert_eq!(p.key, "sync.peers[0].snat_addresses");
    let p = problem(&on(
        "interval = \"5s\"\npeers = [{ address = \"198.18.2.12:7946\" }]\n",
    ));
    assert_eq!(p.key, "sync.interval");
    let p = problem(&format!(
        "{MINIMAL}[sync]\nenable = true\nkey_file = \"/k\"\npeers = [{{ address = \"198.18.2.12:7946\" }}]\n"
    ));
    assert_eq!(p.key, "sync.listen");
    // The sync address is the node's id in every datagram: a wildcard is no id.
    for listen in ["0.0.0.0:7946", "[::]:7946", "198.18.2.11:0"] {
        let p = problem(&format!(
            "{MINIMAL}[sync]\nenable = true\nlisten = \"{listen}\"\nkey_file = \"/k\"\npeers = [{{ address = \"198.18.2.12:7946\" }}]\n"
        ));
        assert_eq!(p.key, "sync.listen", "{listen}");
        assert!(p.message.contains("node's id"), "{}", p.message);
    }
}

#[test]
fn bgp_defaults_and_refusals() {
    let c = parse(MINIMAL, "t.toml").unwrap();
    assert!(!c.bgp.enable);
    assert_eq!(c.bgp.socket, Path::new("/run/bird/bird.ctl"));
    assert_eq!(c.bgp.include, Path::new("/run/bird/bird-xvs.conf"));
    assert_eq!(c.bgp.backup_prepend, 3);
    assert_eq!(c.bgp.liveness_device, "xvs-live");
    assert!(c.bgp.neighbors.is_empty() && c.bgp.local_as.is_none());
    // Operator-owned sessions: nothing else is needed.
    let c = parse(&format!("{MINIMAL}[bgp]\nenable = true\n"), "t.toml").unwrap();
    assert!(c.bgp.enable && c.bgp_backups().is_empty());
    let on = |extra: &str| format!("{MINIMAL}[bgp]\nenable = true\n{extra}");
    let c = parse(
        &on("local_as = 65001\nrouter_id = \"198.18.2.11\"\nneighbors = [{ address = \"198.18.2.1\", as = 65000 }, { address = \"2001:2:0:2::1\", as = 65000, bfd = false }]\ninclude = \"/etc/bird/xvs.conf\"\n"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.bgp.neighbors.len(), 2);
    assert!(c.bgp.neighbors[0].bfd && !c.bgp.neighbors[1].bfd);
    assert_eq!(c.bgp.neighbors[1].asn, 65000);
    assert_eq!(c.bgp.include, Path::new("/etc/bird/xvs.conf"));
    let p = problem(&on(
        "neighbors = [{ address = \"198.18.2.1\", as = 65000 }]\n",
    ));
    assert_eq!(p.key, "bgp.local_as");
    let p = problem(&on(
        "local_as = 65001\nneighbors = [{ address = \"198.18.2.1\", as = 0 }]\n",
    ));
    assert_eq!(p.key, "bgp.neighbors[0].as");
    let p = problem(&on(
        "local_as = 65001\nneighbors = [{ address = \"198.18.2.1\", as = 1 }, { address = \"198.18.2.1\", as = 2 }]\n",
    ));
    assert_eq!(p.key, "bgp.neighbors[1].address");
    let p = problem(&on("local_as = 23456\n"));
    assert_eq!(p.key, "bgp.local_as");
    let p = problem(&on("local_as = 65001\nbackup_prepend = 17\n"));
    assert_eq!(p.key, "bgp.backup_prepend");
    let p = problem(&on("liveness_device = \"a-much-too-long-name\"\n"));
    assert_eq!(p.key, "bgp.liveness_device");
    let p = problem(&on("liveness_device = \"x\\\"y\"\n"));
    assert_eq!(p.key, "bgp.liveness_device");
    // Backups (the peers' SNAT addresses, with sync on) are prepended with the local AS.
    let sync = "[sync]\nenable = true\nlisten = \"198.18.2.11:7946\"\nkey_file = \"/k\"\npeers = [{ address = \"198.18.2.12:7946\", snat_addresses = [\"198.18.3.2\", \"2001:2:0:3::2\"] }]\n";
    let p = problem(&format!("{}{sync}", on("")));
    assert_eq!(p.key, "bgp.local_as");
    assert!(p.message.contains("backup"), "{}", p.message);
    let c = parse(&format!("{}{sync}", on("backup_prepend = 0\n")), "t.toml").unwrap();
    assert_eq!(c.bgp_backups().len(), 2);
    let c = parse(&format!("{}{sync}", on("local_as = 65001\n")), "t.toml").unwrap();
    assert_eq!(
        c.bgp_backups(),
        vec![
            "198.18.3.2".parse::<std::net::IpAddr>().unwrap(),
            "2001:2:0:3::2".parse().unwrap()
        ]
    );
}

#[test]
fn cores_are_a_list_or_auto() {
    let with = |v: &str| MINIMAL.replace("[dataplane]\n", &format!("[dataplane]\ncores = {v}\n"));
    let c = parse(&with("\"auto\""), "t.toml").unwrap();
    assert_eq!(c.dataplane.cores, Cores::Auto);
    assert!(c.dataplane.cores.listed().is_empty());
    let c = parse(&with("[4, 2]"), "t.toml").unwrap();
    assert_eq!(c.dataplane.cores, Cores::List(vec![4, 2]));
    // "auto" gives the interfaces' workers cores to run on.
    let c = parse(
        &with("\"auto\"\ninterfaces = [{ name = \"eth0\" }]"),
        "t.toml",
    )
    .unwrap();
    assert!(c.dataplane.cores.is_set());
    // Anything else is refused, naming the key and what it accepts.
    for bad in ["\"all\"", "3", "[-1]", "[\"2\"]"] {
        let p = problem(&with(bad));
        assert!(p.key.starts_with("dataplane.cores"), "{bad}: {p:?}");
        assert_eq!(p.line, 3, "{bad}: {p:?}");
    }
    let p = problem(&with("\"all\""));
    assert!(
        p.message
            .contains("expected \"auto\" or a list of core numbers"),
        "{}",
        p.message
    );
    // slowpath_core may not be a listed worker core; with "auto" it is taken out of the set.
    let p = problem(&with("[1, 2]\nslowpath_core = 2"));
    assert_eq!(p.key, "dataplane.slowpath_core");
    parse(&with("\"auto\"\nslowpath_core = 2"), "t.toml").unwrap();
}

#[test]
fn shared_vocabulary_errors_keep_their_words() {
    // The protocol, scheduler, modes and CIDRs are `vocab`'s types; the file's words and
    // serde's messages about them are the config's.
    let svc = |line: &str, value: &str| problem(&MINIMAL.replace(line, value));
    let p = svc("protocol = \"tcp\"", "protocol = \"icmp\"");
    assert_eq!(
        p.message,
        "unknown value `icmp`: expected one of `tcp`, `udp`, `sctp`"
    );
    let p = svc("protocol = \"tcp\"", "protocol = \"icmpv6\"");
    assert_eq!(
        p.message,
        "unknown value `icmpv6`: expected one of `tcp`, `udp`, `sctp`"
    );
    let p = svc("scheduler = \"wrr\"", "scheduler = \"fifo\"");
    assert_eq!(
        p.message,
        "unknown value `fifo`: expected one of `rr`, `wrr`, `lc`, `wlc`, `sed`, `nq`, `mh`, \
         `sh`, `dh`, `lblc`, `lblcr`"
    );
    let p = svc("scheduler = \"wrr\"", "scheduler = \"wr\"");
    assert_eq!(p.message, "unknown value `wr`: did you mean `rr`?");
    let p = svc("scheduler = \"wrr\"", "mode = \"dnat\"");
    assert_eq!(p.message, "unknown value `dnat`: did you mean `nat`?");
    let p = svc("scheduler = \"wrr\"", "mode = \"bridge\"");
    assert_eq!(
        p.message,
        "unknown value `bridge`: expected one of `nat`, `fullnat`, `dsr`"
    );
    let p = problem("[dataplane]\nxdp_mode = \"skb\"\n");
    assert_eq!(
        p.message,
        "unknown value `skb`: expected one of `auto`, `native`, `generic`"
    );
    let p = problem("[dataplane]\nzero_copy = true\n");
    assert_eq!(p.message, "expected a string or a table");
    let p = problem("[dataplane]\nzero_copy = \"yes\"\n");
    assert_eq!(
        p.message,
        "unknown value `yes`: expected one of `auto`, `on`, `off`"
    );
    let k = "[kubernetes]\nexternal_ip_cidrs = [";
    let p = problem(&format!("{k}\"198.18.0.1/15\"]\n"));
    assert_eq!(
        p.message,
        "invalid CIDR \"198.18.0.1/15\": address has bits set past the prefix"
    );
    let p = problem(&format!("{k}15]\n"));
    assert_eq!(
        p.message,
        "expected a CIDR string such as \"198.18.0.0/15\""
    );
}
