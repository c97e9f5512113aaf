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

#[test]
fn configmap_holds_a_valid_kubernetes_config() {
    let toml = embedded_config();
    let cfg = config::parse(&toml, "deploy/configmap.yaml").unwrap_or_else(|e| panic!("{e}"));
    let k = cfg
        .kubernetes
        .expect("the DaemonSet config uses the Kubernetes source");
    assert_eq!(k.service_proxy_name.as_deref(), Some("xvs"));
    assert!(cfg.services.is_empty());
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
    // Probes on the healthz listener (named port), which the ConfigMap binds on the node.
    assert_eq!(cfg.admin.healthz_listen().port(), 10256);
    assert!(ds.contains("name: healthz, containerPort: 10256"));
    assert!(ds.contains("name: metrics, containerPort: 10249"));
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
    assert!(rbac.contains(r#"verbs: ["get", "list", "watch"]"#));
}
