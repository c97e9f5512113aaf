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
    for cap in ["BPF", "NET_ADMIN", "NET_RAW", "IPC_LOCK"] {
        assert!(
            ds.contains(&format!("\"{cap}\"")),
            "missing capability {cap}"
        );
    }
    assert!(ds.contains("path: /healthz") && ds.contains("path: /livez"));
    let rbac = deploy("rbac.yaml");
    for res in ["services", "nodes", "endpointslices"] {
        assert!(rbac.contains(res), "RBAC lacks {res}");
    }
    assert!(rbac.contains(r#"verbs: ["get", "list", "watch"]"#));
}
