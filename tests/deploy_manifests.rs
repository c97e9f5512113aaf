//! What is shipped to deploy xvs, checked from outside: every manifest in deploy/ against
//! the Kubernetes schemas (`kubernetes-validate`, strict; the Prometheus Operator's kinds,
//! which it does not know, against a structural schema of the fields they use), the
//! ConfigMap's xvs.toml through the built `xvs check`, the DaemonSet's, the ClusterRole's
//! and the PodMonitor's contents against what the code uses, the Dockerfile (stages, COPY
//! sources, the cargo command and the revision it gets, the runtime libraries against `ldd`
//! of the built binary) and BIRD's (deploy/bird/Dockerfile, against Debian's bird2 here).
//!
//! The Python tools (kubernetes-validate, dockerfile-parse, PyYAML) live in the venv that
//! scripts/deps creates (`/opt/xvs-venv`, or `$XVS_PY_VENV`); a missing one fails the test
//! saying so.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn venv_bin(tool: &str) -> PathBuf {
    let venv = std::env::var_os("XVS_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/xvs-venv"));
    let p = venv.join("bin").join(tool);
    assert!(
        p.exists(),
        "{} is missing: run scripts/deps (it installs kubernetes-validate and dockerfile-parse in {})",
        p.display(),
        venv.display()
    );
    p
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs the venv's python on `script` with `args`; its stdout parsed as JSON.
fn python_json(script: &str, args: &[&Path]) -> Value {
    let o = Command::new(venv_bin("python"))
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run the venv's python");
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The YAML documents of `deploy/NAME`.
fn docs(name: &str) -> Vec<Value> {
    let v = python_json(
        "import json, sys, yaml\n\
         print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))",
        &[&root().join("deploy").join(name)],
    );
    v.as_array().unwrap().clone()
}

fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("deploy"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    v.sort();
    v
}

fn validate(path: &Path) -> Output {
    Command::new(venv_bin("kubernetes-validate"))
        .arg("--strict")
        .arg(path)
        .output()
        .expect("run kubernetes-validate")
}

/// The API groups of custom resources the manifests use: kubernetes-validate has no schema
/// for them (it warns and passes), so [`crd_schema`] checks them instead.
const CRD_GROUPS: [&str; 1] = ["monitoring.coreos.com/"];

fn is_custom(doc: &Value) -> bool {
    let api = doc["apiVersion"].as_str().unwrap_or_default();
    CRD_GROUPS.iter().any(|g| api.starts_with(g))
}

#[test]
fn every_manifest_validates_against_the_kubernetes_schemas() {
    let files = manifests();
    let names: Vec<_> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "configmap.yaml",
            "daemonset.yaml",
            "podmonitor.yaml",
            "rbac.yaml"
        ]
    );
    for f in &files {
        let o = validate(f);
        let out = text(&o);
        assert!(o.status.success(), "{}:\n{out}", f.display());
        // Each built-in document was checked (not skipped as an unknown kind); each custom
        // one is skipped by name, and checked below against its structural schema.
        let d = docs(f.file_name().unwrap().to_str().unwrap());
        let custom: Vec<&Value> = d.iter().filter(|d| is_custom(d)).collect();
        let n = d.len() - custom.len();
        assert_eq!(out.matches(" passed for resource ").count(), n, "{out}");
        for c in custom {
            let kind = c["kind"].as_str().unwrap();
            assert!(
                out.contains(&format!("Couldn't find schema for kind {kind}")),
                "{out}"
            );
            let problems = crd_problems(c);
            assert!(problems.is_empty(), "{}: {problems:?}", f.display());
        }
    }
    // The validator does refuse: a misspelt field and a wrong type in copies.
    let dir = tempfile::tempdir().unwrap();
    let ds = std::fs::read_to_string(root().join("deploy/daemonset.yaml")).unwrap();
    for (from, to, says) in [
        ("hostNetwork: true", "hostNetwrk: true", "hostNetwrk"),
        (
            "terminationGracePeriodSeconds: 30",
            "terminationGracePeriodSeconds: soon",
            "terminationGracePeriodSeconds",
        ),
    ] {
        assert!(ds.contains(from));
        let p = dir.path().join("bad.yaml");
        std::fs::write(&p, ds.replacen(from, to, 1)).unwrap();
        let o = validate(&p);
        assert!(!o.status.success(), "accepted {to}");
        assert!(text(&o).contains(says), "{}", text(&o));
    }
}

/// A structural schema of the PodMonitor fields deploy/ uses, as the Prometheus Operator's
/// CRD (monitoring.coreos.com/v1) types them, every object closed (`additionalProperties:
/// false`, like kubernetes-validate's `--strict`): a misspelt or misplaced field fails.
fn crd_schema(kind: &str) -> Value {
    // The operator's Duration pattern.
    let duration = serde_json::json!({
        "type": "string",
        "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
    });
    let labels = serde_json::json!({
        "type": "object", "additionalProperties": { "type": "string" }
    });
    match kind {
        "PodMonitor" => serde_json::json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": { "const": "monitoring.coreos.com/v1" },
                "kind": { "const": "PodMonitor" },
                "metadata": {
                    "type": "object", "additionalProperties": false, "required": ["name"],
                    "properties": {
                        "name": { "type": "string" }, "namespace": { "type": "string" },
                        "labels": labels
                    }
                },
                "spec": {
                    "type": "object", "additionalProperties": false,
                    "required": ["selector", "podMetricsEndpoints"],
                    "properties": {
                        "selector": {
                            "type": "object", "additionalProperties": false,
                            "properties": { "matchLabels": labels }
                        },
                        "podMetricsEndpoints": {
                            "type": "array", "minItems": 1,
                            "items": {
                                "type": "object", "additionalProperties": false,
                                "properties": {
                                    "port": { "type": "string" },
                                    "path": { "type": "string" },
                                    "scheme": { "enum": ["http", "https", "HTTP", "HTTPS"] },
                                    "interval": duration,
                                    "scrapeTimeout": duration,
                                    "relabelings": {
                                        "type": "array",
                                        "items": {
                                            "type": "object", "additionalProperties": false,
                                            "properties": {
                                                "sourceLabels": {
                                                    "type": "array",
                                                    "items": {
                                                        "type": "string",
                                                        "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"
                                                    }
                                                },
                                                "targetLabel": { "type": "string" },
                                                "action": { "type": "string" },
                                                "regex": { "type": "string" },
                                                "replacement": { "type": "string" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }),
        other => panic!("no structural schema for {other}: add one to crd_schema"),
    }
}

/// What the structural schema of `doc`'s kind finds wrong with it (the venv's jsonschema).
fn crd_problems(doc: &Value) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let (schema, instance) = (dir.path().join("schema.json"), dir.path().join("doc.json"));
    let kind = doc["kind"].as_str().unwrap();
    std::fs::write(&schema, crd_schema(kind).to_string()).unwrap();
    std::fs::write(&instance, doc.to_string()).unwrap();
    let v = python_json(
        "import json, sys, jsonschema\n\
         s = json.load(open(sys.argv[1])); d = json.load(open(sys.argv[2]))\n\
         v = jsonschema.Draft202012Validator(s)\n\
         print(json.dumps(['/'.join(map(str, e.absolute_path)) + ': ' + e.message for e in v.iter_errors(d)]))",
        &[&schema, &instance],
    );
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_structural_schema_refuses_what_the_operator_would() {
    let pm = docs("podmonitor.yaml").remove(0);
    assert!(crd_problems(&pm).is_empty());
    let mut bad = pm.clone();
    bad["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s".into();
    assert!(
        crd_problems(&bad)
            .iter()
            .any(|p| p.contains("'intervall' was unexpected")),
        "{:?}",
        crd_problems(&bad)
    );
    let mut bad = pm.clone();
    bad["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds".into();
    assert!(!crd_problems(&bad).is_empty());
    let mut bad = pm;
    bad["spec"]["endpoints"] = bad["spec"]["podMetricsEndpoints"].clone();
    assert!(!crd_problems(&bad).is_empty(), "a ServiceMonitor's field");
}

#[test]
fn the_podmonitor_scrapes_the_metrics_listener_of_the_daemonsets_pods() {
    let cfg = config::parse(configmap_data()["xvs.toml"].as_str().unwrap(), "xvs.toml").unwrap();
    let pm = docs("podmonitor.yaml").remove(0);
    let ds = docs("daemonset.yaml").remove(0);
    assert_eq!(pm["metadata"]["namespace"], ds["metadata"]["namespace"]);
    // Its selector picks the DaemonSet's pods.
    let pod_labels = ds["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap();
    let selector = pm["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(pod_labels.get(k), Some(v), "{k}");
    }
    // It scrapes /metrics on the containerPort of [admin] metrics_listen, which serves only
    // /metrics on every address of the node (the pods are in the host network).
    let metrics = cfg
        .admin
        .metrics_listen
        .expect("the ConfigMap sets metrics_listen");
    assert!(metrics.ip().is_unspecified(), "{metrics}");
    assert!(
        cfg.admin.listen.ip().is_loopback(),
        "the read-only API stays node-local"
    );
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(ep["path"], "/metrics");
    let xvs = &ds["spec"]["template"]["spec"]["containers"][0];
    let port = xvs["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == ep["port"])
        .unwrap_or_else(|| panic!("no containerPort named {}", ep["port"]));
    assert_eq!(port["containerPort"], u64::from(metrics.port()));
    assert_eq!(port["protocol"], "TCP");
}

fn configmap_data() -> serde_json::Map<String, Value> {
    let d = docs("configmap.yaml");
    assert_eq!(d.len(), 1);
    d[0]["data"].as_object().unwrap().clone()
}

#[test]
fn the_configmaps_config_passes_xvs_check() {
    let data = configmap_data();
    let toml = data["xvs.toml"].as_str().expect("an xvs.toml key");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("xvs.toml");
    std::fs::write(&p, toml).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args(["check", "--config", p.to_str().unwrap()])
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("source: kubernetes"), "{out}");
    // Cores from the pod's cpuset, not a hard-coded list.
    assert!(
        out.contains("on cores auto (the process's cpuset)"),
        "{out}"
    );
}

#[test]
fn the_daemonset_runs_like_kube_proxys_beside_it() {
    let data = configmap_data();
    let cfg = config::parse(data["xvs.toml"].as_str().unwrap(), "xvs.toml").unwrap();
    let d = docs("daemonset.yaml");
    let spec = &d[0]["spec"]["template"]["spec"];
    // Every taint tolerated, as kube-proxy's DaemonSet.
    assert_eq!(
        spec["tolerations"],
        serde_json::json!([{ "operator": "Exists" }])
    );
    let c = &spec["containers"][0];
    assert_eq!(c["name"], "xvs");
    // The image scripts/image builds: xvs:<version>.
    assert_eq!(
        c["image"],
        format!("xvs:{}", env!("CARGO_PKG_VERSION")),
        "the DaemonSet's image is not what scripts/image builds"
    );
    // The API server for kube-proxy-free nodes, from ConfigMap keys the operator edits.
    let env = c["env"].as_array().unwrap();
    for (var, key) in [
        ("KUBERNETES_SERVICE_HOST", "k8sServiceHost"),
        ("KUBERNETES_SERVICE_PORT", "k8sServicePort"),
    ] {
        let e = env
            .iter()
            .find(|e| e["name"] == var)
            .unwrap_or_else(|| panic!("no {var}"));
        let r = &e["valueFrom"]["configMapKeyRef"];
        assert_eq!(r["name"], d_name("configmap.yaml"), "{var}");
        assert_eq!(r["key"], key, "{var}");
        assert!(data.contains_key(key), "the ConfigMap has no {key}");
    }
    let host: std::net::IpAddr = data["k8sServiceHost"].as_str().unwrap().parse().unwrap();
    assert!(host.is_ipv4() || host.is_ipv6());
    let port: u16 = data["k8sServicePort"].as_str().unwrap().parse().unwrap();
    assert!(port > 0);
    // Probes on the healthz listener's port, which is neither of kube-proxy's.
    let ports = c["ports"].as_array().unwrap();
    let port_of = |name: &str| {
        ports
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no port {name}"))
    };
    assert_eq!(
        port_of("healthz"),
        u64::from(cfg.admin.healthz_listen().port())
    );
    let metrics = cfg.admin.metrics_listen.expect("[admin] metrics_listen");
    assert_eq!(port_of("metrics"), u64::from(metrics.port()));
    for kube_proxy in [10256u16, 10249] {
        assert_ne!(cfg.admin.listen.port(), kube_proxy);
        let kube_proxy = u64::from(kube_proxy);
        assert_ne!(port_of("healthz"), kube_proxy);
        assert_ne!(port_of("metrics"), kube_proxy);
    }
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/healthz");
    // Exactly the capabilities `xvs run` checks for with this config.
    let caps = &c["securityContext"]["capabilities"];
    assert_eq!(caps["drop"], serde_json::json!(["ALL"]));
    let want: BTreeSet<String> = daemon::caps::required(&cfg)
        .iter()
        .map(|n| n.cap.name.trim_start_matches("CAP_").to_owned())
        .collect();
    let got: BTreeSet<String> = caps["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, want);
    // cores = "auto" needs integer CPUs in a Guaranteed pod (the static CPU manager).
    let res = &c["resources"];
    assert_eq!(res["requests"], res["limits"]);
    let cpus: u32 = res["limits"]["cpu"].as_str().unwrap().parse().unwrap();
    assert!(cpus >= 2, "a core for the slowpath and one for a worker");
}

fn d_name(file: &str) -> Value {
    docs(file)[0]["metadata"]["name"].clone()
}

/// The kinds the Kubernetes source lists and watches (`Api::<Kind>::all` in its code).
fn kinds_the_code_watches() -> BTreeSet<String> {
    let src = std::fs::read_to_string(root().join("slowpath/src/k8s/source.rs")).unwrap();
    src.match_indices("Api::<")
        .map(|(i, _)| {
            let rest = &src[i + 6..];
            rest[..rest.find('>').unwrap()].to_owned()
        })
        .collect()
}

#[test]
fn the_cluster_role_grants_only_what_the_code_uses() {
    let kinds = kinds_the_code_watches();
    assert_eq!(
        kinds,
        ["EndpointSlice", "Node", "Service", "ServiceCIDR"]
            .map(String::from)
            .into()
    );
    // kube's watcher lists then watches; nothing gets, writes or emits Events.
    let resources: BTreeSet<String> = kinds
        .iter()
        .map(|k| format!("{}s", k.to_lowercase()))
        .collect();
    let d = docs("rbac.yaml");
    let role = d.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(
            rule["verbs"],
            serde_json::json!(["list", "watch"]),
            "{rule}"
        );
        for r in rule["resources"].as_array().unwrap() {
            let r = r.as_str().unwrap().to_owned();
            let group = match r.as_str() {
                "endpointslices" => "discovery.k8s.io",
                "servicecidrs" => "networking.k8s.io",
                _ => "",
            };
            assert_eq!(rule["apiGroups"], serde_json::json!([group]), "{r}");
            granted.insert(r);
        }
    }
    assert_eq!(granted, resources);
    // Bound to the DaemonSet's ServiceAccount.
    let sa = d.iter().find(|d| d["kind"] == "ServiceAccount").unwrap();
    let binding = d
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);
    let ds = docs("daemonset.yaml");
    assert_eq!(
        ds[0]["spec"]["template"]["spec"]["serviceAccountName"],
        sa["metadata"]["name"]
    );
}

/// The Dockerfile's instructions, as dockerfile-parse reads them: (instruction, value).
fn dockerfile() -> Vec<(String, String)> {
    dockerfile_at("Dockerfile")
}

/// The instructions of the Dockerfile at `path` (from the repository's root).
fn dockerfile_at(path: &str) -> Vec<(String, String)> {
    let v = python_json(
        "import json, sys\n\
         from dockerfile_parse import DockerfileParser\n\
         p = DockerfileParser(path=sys.argv[1])\n\
         print(json.dumps([[i['instruction'], i['value']] for i in p.structure]))",
        &[&root().join(path)],
    );
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i[0].as_str().unwrap().to_owned(),
                i[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The Dockerfile's stages: (FROM value, instructions).
fn stages() -> Vec<(String, Vec<(String, String)>)> {
    stages_of(dockerfile())
}

/// The stages of a Dockerfile's instructions: (FROM value, instructions).
fn stages_of(instructions: Vec<(String, String)>) -> Vec<(String, Vec<(String, String)>)> {
    let mut out: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for (ins, val) in instructions {
        if ins == "FROM" {
            out.push((val, Vec::new()));
        } else if let Some(s) = out.last_mut() {
            s.1.push((ins, val));
        }
    }
    out
}

/// The packages `apt-get install` names in `run` (options and `&&`-chained commands aside).
fn apt_installs(run: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for cmd in run.split("&&") {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        if let Some(i) = words.windows(2).position(|w| w == ["apt-get", "install"]) {
            out.extend(
                words[i + 2..]
                    .iter()
                    .filter(|w| !w.starts_with('-'))
                    .map(|w| w.to_string()),
            );
        }
    }
    out
}

#[test]
fn the_dockerfile_builds_xvs_in_one_stage_and_ships_it_in_a_minimal_one() {
    let stages = stages();
    assert_eq!(stages.len(), 2, "a build stage and a runtime stage");
    let (build_from, build) = &stages[0];
    let (run_from, runtime) = &stages[1];
    assert!(build_from.ends_with(" AS build"), "{build_from}");
    assert!(run_from.ends_with(" AS runtime"), "{run_from}");
    let args: Vec<String> = dockerfile()
        .into_iter()
        .filter(|(i, _)| i == "ARG")
        .map(|(_, v)| v)
        .collect();
    // The build image is a Rust of the workspace's rust-version; the runtime Debian 12 slim.
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let rust_version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap()
        .trim_matches('"');
    assert!(
        args.iter()
            .any(|a| a.as_str()
                == format!("RUST_IMAGE=docker.io/library/rust:{rust_version}-bookworm")),
        "{args:?}"
    );
    assert!(
        args.iter()
            .any(|a| a.as_str() == "RUNTIME_IMAGE=docker.io/library/debian:12-slim"),
        "{args:?}"
    );
    assert!(build_from.starts_with("${RUST_IMAGE}"), "{build_from}");
    assert!(run_from.starts_with("${RUNTIME_IMAGE}"), "{run_from}");

    // Every COPY source of the build context exists, and the workspace is all there.
    let mut copied = BTreeSet::new();
    for (ins, val) in build {
        if ins == "COPY" {
            let words: Vec<&str> = val.split_whitespace().collect();
            assert!(!words[0].starts_with("--"), "{val}");
            for src in &words[..words.len() - 1] {
                assert!(
                    root().join(src).exists(),
                    "COPY {src}: not in the repository"
                );
                copied.insert(src.trim_end_matches('/').to_owned());
            }
        }
    }
    let members_line = manifest
        .lines()
        .find(|l| l.starts_with("members = "))
        .unwrap();
    let mut want: BTreeSet<String> = members_line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect();
    want.extend(["Cargo.toml", "Cargo.lock", "src"].map(String::from));
    assert_eq!(copied, want, "the build stage copies the whole workspace");

    // The cargo command builds this package's binary, locked, in release.
    let runs: Vec<&String> = build
        .iter()
        .filter(|(i, _)| i == "RUN")
        .map(|(_, v)| v)
        .collect();
    let cargo = runs
        .iter()
        .find(|r| r.contains("cargo build"))
        .expect("a cargo build");
    let words: Vec<&str> = cargo.split_whitespace().collect();
    let after = |flag: &str| {
        words
            .windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1])
            .unwrap_or_else(|| panic!("no {flag} in {cargo}"))
    };
    assert_eq!(after("-p"), env!("CARGO_PKG_NAME"));
    let bin = after("--bin");
    assert!(
        Path::new(env!("CARGO_BIN_EXE_xvs")).file_name().unwrap() == bin,
        "--bin {bin} is not this package's binary"
    );
    assert!(words.contains(&"--release") && words.contains(&"--locked"));
    // The git revision reaches the build (the context has no .git): a build argument,
    // declared in the stage before the cargo command, passed to it in its environment.
    let arg_at = build
        .iter()
        .position(|(i, v)| i == "ARG" && v.starts_with("XVS_GIT_REVISION"))
        .expect("ARG XVS_GIT_REVISION in the build stage");
    let cargo_at = build
        .iter()
        .position(|(i, v)| i == "RUN" && v.contains("cargo build"))
        .unwrap();
    assert!(arg_at < cargo_at);
    // `xvs --version` reads XVS_GIT_REVISION, xvs_build_info (slowpath/build.rs)
    // XVS_REVISION: both get it.
    assert!(
        cargo.starts_with(
            "XVS_GIT_REVISION=\"${XVS_GIT_REVISION}\" XVS_REVISION=\"${XVS_GIT_REVISION}\""
        ),
        "{cargo}"
    );
    let build_rs = std::fs::read_to_string(root().join("slowpath/build.rs")).unwrap();
    assert!(build_rs.contains("std::env::var(\"XVS_REVISION\")"));
    assert!(
        cargo.contains(&format!("target/release/{bin} /out/{bin}")),
        "{cargo}"
    );
    // The build stage installs what xsk-rs / libxdp and the XDP program need.
    let build_pkgs: BTreeSet<String> = runs.iter().flat_map(|r| apt_installs(r)).collect();
    for p in [
        "clang",
        "llvm",
        "libelf-dev",
        "zlib1g-dev",
        "m4",
        "pkg-config",
        "make",
    ] {
        assert!(build_pkgs.contains(p), "the build stage lacks {p}");
    }

    // The runtime stage: the binary from the build stage, the entrypoint, the libraries.
    assert!(
        runtime.iter().any(
            |(i, v)| i == "COPY" && v == &format!("--from=build /out/{bin} /usr/local/bin/xvs")
        ),
        "{runtime:?}"
    );
    let entry = runtime
        .iter()
        .find(|(i, _)| i == "ENTRYPOINT")
        .expect("an ENTRYPOINT");
    assert_eq!(entry.1, r#"["/usr/local/bin/xvs"]"#);
    let cmd = runtime.iter().find(|(i, _)| i == "CMD").expect("a CMD");
    let ds = std::fs::read_to_string(root().join("deploy/daemonset.yaml")).unwrap();
    assert!(
        ds.contains(&format!("args: {}", cmd.1.replace("\",\"", "\", \""))),
        "{}",
        cmd.1
    );
    let runtime_pkgs: BTreeSet<String> = runtime
        .iter()
        .filter(|(i, _)| i == "RUN")
        .flat_map(|(_, v)| apt_installs(v))
        .collect();
    let need = linked_packages(Path::new(env!("CARGO_BIN_EXE_xvs")));
    assert!(need.contains("libelf1"), "{need:?}");
    for p in &need {
        // glibc is in every Debian image; everything else is installed explicitly.
        if p != "libc6" {
            assert!(
                runtime_pkgs.contains(p),
                "the runtime stage lacks {p} (ldd of xvs)"
            );
        }
    }
    // And nothing of the build toolchain.
    for p in &runtime_pkgs {
        assert!(!p.ends_with("-dev") && p != "clang" && p != "llvm", "{p}");
    }
    assert_revision_labels(runtime, "xvs");
    // scripts/image passes the revision and the version to both builds.
    let script = std::fs::read_to_string(root().join("scripts/image")).unwrap();
    for want in [
        "--build-arg \"XVS_GIT_REVISION=$XVS_GIT_REVISION\"",
        "--build-arg \"XVS_VERSION=$version\"",
        "git rev-parse HEAD",
        "build \"$image\" Dockerfile .",
        "build \"$bird_image\" deploy/bird/Dockerfile deploy/bird",
    ] {
        assert!(script.contains(want), "scripts/image lacks {want}");
    }
}

/// The OCI labels of a final stage: its title, and its revision and version from the build
/// arguments scripts/image passes (declared in that stage, so they are in scope).
fn assert_revision_labels(stage: &[(String, String)], title: &str) {
    for arg in ["XVS_GIT_REVISION=unknown", "XVS_VERSION=unknown"] {
        assert!(
            stage.iter().any(|(i, v)| i == "ARG" && v == arg),
            "ARG {arg} in the stage: {stage:?}"
        );
    }
    let labels: String = stage
        .iter()
        .filter(|(i, _)| i == "LABEL")
        .map(|(_, v)| v.as_str())
        .collect();
    for want in [
        format!("org.opencontainers.image.title=\"{title}\""),
        "org.opencontainers.image.revision=\"${XVS_GIT_REVISION}\"".to_owned(),
        "org.opencontainers.image.version=\"${XVS_VERSION}\"".to_owned(),
    ] {
        assert!(labels.contains(&want), "{want} not in {labels}");
    }
}

/// The files Debian's package `pkg` installs here (`dpkg -L`); scripts/deps installs bird2.
fn package_files(pkg: &str) -> BTreeSet<String> {
    let o = Command::new("dpkg")
        .args(["-L", pkg])
        .output()
        .expect("dpkg");
    assert!(
        o.status.success(),
        "{pkg} is not installed: run scripts/deps"
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn the_bird_image_is_debians_bird2_and_runs_as_the_daemonset_says() {
    let stages = stages_of(dockerfile_at("deploy/bird/Dockerfile"));
    assert_eq!(stages.len(), 1, "one stage");
    let (from, ins) = &stages[0];
    assert!(from.starts_with("${BIRD_BASE_IMAGE}"), "{from}");
    let args: Vec<String> = dockerfile_at("deploy/bird/Dockerfile")
        .into_iter()
        .filter(|(i, _)| i == "ARG")
        .map(|(_, v)| v)
        .collect();
    // The same Debian release as the runtime of xvs's image, and as this machine's bird2.
    assert!(
        args.iter()
            .any(|a| a == "BIRD_BASE_IMAGE=docker.io/library/debian:12-slim"),
        "{args:?}"
    );
    let os = std::fs::read_to_string("/etc/os-release").unwrap();
    assert!(os.contains("VERSION_ID=\"12\""), "{os}");
    // bird2 and nothing else; nothing copied from the context.
    let pkgs: BTreeSet<String> = ins
        .iter()
        .filter(|(i, _)| i == "RUN")
        .flat_map(|(_, v)| apt_installs(v))
        .collect();
    assert_eq!(pkgs, BTreeSet::from(["bird2".to_owned()]));
    assert!(!ins.iter().any(|(i, _)| i == "COPY" || i == "ADD"));
    assert_revision_labels(ins, "xvs-bird");
    // ENTRYPOINT + CMD is the DaemonSet's command, whose binary bird2 installs.
    let json_list = |i: &str| -> Vec<String> {
        let v = &ins.iter().find(|(x, _)| x == i).unwrap().1;
        serde_json::from_str(v).unwrap()
    };
    let mut image_cmd = json_list("ENTRYPOINT");
    image_cmd.extend(json_list("CMD"));
    let ds = docs("daemonset.yaml").remove(0);
    let spec = &ds["spec"]["template"]["spec"];
    let bird = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "bird")
        .expect("a bird container");
    let ds_cmd: Vec<String> = serde_json::from_value(bird["command"].clone()).unwrap();
    assert_eq!(ds_cmd, image_cmd);
    assert!(package_files("bird2").contains(&ds_cmd[0]), "{}", ds_cmd[0]);
    // The image scripts/image builds, xvs-bird:<version>, not a placeholder.
    assert_eq!(
        bird["image"],
        format!("xvs-bird:{}", env!("CARGO_PKG_VERSION"))
    );
    // Its config and socket where the command says: the ConfigMap's bird.conf, the
    // emptyDir shared with xvs.
    let mounts = bird["volumeMounts"].as_array().unwrap();
    for (dir, file) in [
        ("/etc/bird", "/etc/bird/bird.conf"),
        ("/run/bird", "/run/bird/bird.ctl"),
    ] {
        assert!(ds_cmd.iter().any(|a| a == file), "{ds_cmd:?}");
        assert!(mounts.iter().any(|m| m["mountPath"] == dir), "{mounts:?}");
    }
}

/// The Debian packages holding the shared libraries `ldd` lists for `bin`.
fn linked_packages(bin: &Path) -> BTreeSet<String> {
    let o = Command::new("ldd").arg(bin).output().expect("run ldd");
    assert!(o.status.success(), "{}", text(&o));
    let mut pkgs = BTreeSet::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        // "libelf.so.1 => /lib/x86_64-linux-gnu/libelf.so.1 (0x...)" or "/lib64/ld-... (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        let Some(path) = path else { continue };
        let canon = std::fs::canonicalize(path).unwrap();
        let owner = [PathBuf::from(path), canon.clone(), usr_variant(&canon)]
            .iter()
            .find_map(|p| dpkg_owner(p))
            .unwrap_or_else(|| panic!("no Debian package holds {path}"));
        pkgs.insert(owner);
    }
    pkgs
}

/// `/lib/x` as `/usr/lib/x` and back (Debian 12's merged /usr: dpkg knows one of them).
fn usr_variant(p: &Path) -> PathBuf {
    match p.strip_prefix("/usr") {
        Ok(rest) => Path::new("/").join(rest),
        Err(_) => Path::new("/usr").join(p.strip_prefix("/").unwrap()),
    }
}

fn dpkg_owner(p: &Path) -> Option<String> {
    let o = Command::new("dpkg").arg("-S").arg(p).output().ok()?;
    if !o.status.success() {
        return None;
    }
    let s = String::from_utf8_lossy(&o.stdout);
    let pkg = s.lines().next()?.split(':').next()?.trim().to_owned();
    Some(pkg)
}
