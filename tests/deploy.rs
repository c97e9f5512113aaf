//! The deployment manifests stay in step with the config schema.

use std::path::Path;

fn deploy(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy")
            .join(name),
    )
    .unwrap()
}

/// The `xvs.toml: |` block of the ConfigMap, de-indented.
fn embedded_config() -> String {
    let text = deploy("configmap.yaml");
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim() != "xvs.toml: |")
        .skip(1);
    let first = lines.next().expect("xvs.toml block is empty");
    let indent = first.len() - first.trim_start().len();
    std::iter::once(first)
        .chain(
            lines.take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent),
        )
        .map(|l| l.get(indent..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The ConfigMap's config with its commented-out `# [bgp]` table uncommented: the lines from
/// `# [bgp]` to the first that is not `# ` TOML.
fn config_with_bgp() -> String {
    let text = embedded_config();
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line == "# [bgp]" {
            inside = true;
        }
        match line.strip_prefix("# ") {
            Some(toml) if inside => out.push(toml.to_owned()),
            _ => {
                inside = false;
                out.push(line.to_owned());
            }
        }
    }
    assert!(
        out.iter().any(|l| l == "[bgp]"),
        "no `# [bgp]` table to uncomment"
    );
    out.join("\n") + "\n"
}

#[test]
fn configmap_holds_a_valid_kubernetes_config() {
    let toml = embedded_config();
    let cfg = config::parse(&toml, "deploy/configmap.yaml").unwrap_or_else(|e| panic!("{e}"));
    // As shipped: no BGP (a node without routers to peer with runs as it is).
    assert!(!cfg.bgp.enable, "BGP is off as shipped");
    assert!(!cfg.sync.enable);
    let k = cfg
        .kubernetes
        .expect("the DaemonSet config uses the Kubernetes source");
    assert_eq!(k.service_proxy_name.as_deref(), Some("xvs"));
    assert!(cfg.services.is_empty());
    // Uncommenting [bgp] is all it takes to announce.
    let bgp = config::parse(&config_with_bgp(), "deploy/configmap.yaml with [bgp]")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(bgp.bgp.enable && bgp.bgp.local_as.is_some() && !bgp.bgp.neighbors.is_empty());
}

#[test]
fn daemonset_runs_that_config_with_the_capabilities_it_needs() {
    let ds = deploy("daemonset.yaml");
    assert!(ds.contains("hostNetwork: true"));
    assert!(ds.contains(r#"args: ["run", "--config", "/etc/xvs/xvs.toml"]"#));
    // Drops ALL and adds exactly the capabilities `xvs run` checks for with this config.
    let cfg = config::parse(&embedded_config(), "deploy/configmap.yaml").unwrap();
    let want: Vec<String> = daemon::caps::required(&cfg)
        .iter()
        .map(|n| format!("\"{}\"", n.cap.name.trim_start_matches("CAP_")))
        .collect();
    assert!(ds.contains(r#"drop: ["ALL"]"#));
    let add = ds
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: "))
        .expect("a capabilities add list");
    assert_eq!(add, format!("[{}]", want.join(", ")));
    // Probes on the healthz listener (named port), which the ConfigMap binds on the node,
    // on ports other than kube-proxy's (10256 healthz, 10249 metrics) so both fit a node.
    let metrics = cfg
        .admin
        .metrics_listen
        .expect("[admin] metrics_listen")
        .port();
    let (healthz, listen) = (cfg.admin.healthz_listen().port(), cfg.admin.listen.port());
    assert!(![10256, 10249].contains(&listen) && ![healthz, metrics].contains(&listen));
    assert!(![10256, 10249].contains(&healthz) && ![10256, 10249].contains(&metrics));
    assert!(ds.contains(&format!("name: healthz, containerPort: {healthz}")));
    assert!(ds.contains(&format!("name: metrics, containerPort: {metrics}")));
    assert!(
        ds.contains("path: /healthz, port: healthz") && ds.contains("path: /livez, port: healthz")
    );
    // The control socket's directory is a hostPath.
    assert!(cfg.admin_socket().starts_with("/run/xvs"));
    assert_eq!(cfg.dataplane.state_dir, std::path::Path::new("/run/xvs"));
    assert!(ds.contains("mountPath: /run/xvs") && ds.contains("path: /run/xvs"));
    let rbac = deploy("rbac.yaml");
    for res in ["services", "nodes", "endpointslices"] {
        assert!(rbac.contains(res), "RBAC lacks {res}");
    }
    assert!(rbac.contains(r#"verbs: ["list", "watch"]"#));
}

/// The `bird.conf: |` block of the ConfigMap, de-indented.
fn embedded_bird_conf() -> String {
    let text = deploy("configmap.yaml");
    let block: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim() != "bird.conf: |")
        .skip(1)
        .take_while(|l| l.trim().is_empty() || l.starts_with("    "))
        .collect();
    assert!(!block.is_empty(), "the ConfigMap has no bird.conf");
    block
        .iter()
        .map(|l| l.get(4..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `bird -p` accepts `conf` with xvs's include file `include` where it includes
/// `/run/bird/bird-xvs.con[f]`; `None` when BIRD is not installed (scripts/deps installs it).
fn bird_accepts(conf: &str, include: &str) -> Option<Result<(), String>> {
    let dir = tempfile::tempdir().unwrap();
    let inc = dir.path().join("bird-xvs.conf");
    std::fs::write(&inc, include).unwrap();
    let main = dir.path().join("bird.conf");
    assert!(conf.contains("\"/run/bird/bird-xvs.con[f]\""), "{conf}");
    std::fs::write(
        &main,
        conf.replace("/run/bird/bird-xvs.con[f]", inc.to_str().unwrap()),
    )
    .unwrap();
    let o = std::process::Command::new("bird")
        .arg("-p")
        .arg("-c")
        .arg(&main)
        .output()
        .ok()?;
    Some(if o.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    })
}

/// An announcement of every kind, both families.
fn announcement() -> slowpath::bgp::Announcement {
    use slowpath::bgp::RouteKind;
    let mut a = slowpath::bgp::Announcement::default();
    for (ip, k) in [
        ("198.18.100.1", RouteKind::Vip),
        ("198.18.20.1", RouteKind::Snat),
        ("198.18.20.2", RouteKind::Backup),
        ("2001:2:0:100::1", RouteKind::Vip),
        ("2001:2:0:20::2", RouteKind::Backup),
    ] {
        a.routes.insert(ip.parse().unwrap(), k);
    }
    a
}

#[test]
fn the_bird_beside_xvs_reads_what_xvs_writes() {
    let cfg = config::parse(&config_with_bgp(), "deploy/configmap.yaml").unwrap();
    let b = &cfg.bgp;
    assert!(b.enable);
    // Socket and include file in the emptyDir both containers mount at /run/bird.
    assert_eq!(b.socket, Path::new("/run/bird/bird.ctl"));
    assert_eq!(b.include, Path::new("/run/bird/bird-xvs.conf"));
    let ds = deploy("daemonset.yaml");
    assert_eq!(
        ds.matches("{ name: bird-run, mountPath: /run/bird }")
            .count(),
        2
    );
    assert!(ds.contains(r#""-s", "/run/bird/bird.ctl""#));
    assert!(ds.contains("{ name: sync, containerPort: 7946, protocol: UDP }"));
    let conf = embedded_bird_conf();
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/bird.conf"),
    )
    .unwrap();
    let edge =
        config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/edge-node.toml"))
            .unwrap();
    // Sessions xvs writes, BFD tuned through [bgp] (and neighbours with and without BFD).
    let tuned = config::parse(
        "[bgp]\nenable = true\nlocal_as = 65001\nneighbors = [{ address = \"198.18.20.254\", as = 65000 }, { address = \"2001:2:0:20::fe\", as = 65000, bfd = false }]\nbfd_interval = \"30ms\"\nbfd_idle_tx_interval = \"2s\"\nbfd_multiplier = 3\n",
        "tuned.toml",
    )
    .unwrap();
    let text = slowpath::bgp::render(&tuned.bgp, &announcement());
    assert!(text.contains("multiplier 3;"), "{text}");
    let cases = [
        ("deploy/configmap.yaml bird.conf", &conf, b),
        ("config/examples/bird.conf", &example, &edge.bgp),
        ("config/examples/bird.conf, tuned BFD", &example, &tuned.bgp),
    ];
    for (what, conf, bgp) in cases {
        for a in [announcement(), slowpath::bgp::Announcement::default()] {
            let include = slowpath::bgp::render(bgp, &a);
            match bird_accepts(conf, &include) {
                None => {
                    eprintln!("skipped: no `bird` here (scripts/deps installs bird2)");
                    return;
                }
                Some(Ok(())) => {}
                Some(Err(e)) => panic!("BIRD refuses {what} with:\n{include}\n{e}"),
            }
        }
    }
}
