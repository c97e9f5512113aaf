//! What is shipped to deploy xvs, checked from outside: every manifest in deploy/ against
//! the Kubernetes schemas (`kubernetes-validate`, strict), the ConfigMap's xvs.toml through
//! the built `xvs check`, the DaemonSet's and the ClusterRole's contents against what the code
//! uses, and the Dockerfile (stages, COPY sources, the cargo command, the runtime libraries
//! against `ldd` of the built binary).
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

#[test]
fn every_manifest_validates_against_the_kubernetes_schemas() {
    let files = manifests();
    let names: Vec<_> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(names, ["configmap.yaml", "daemonset.yaml", "rbac.yaml"]);
    for f in &files {
        let o = validate(f);
        let out = text(&o);
        assert!(o.status.success(), "{}:\n{out}", f.display());
        // Each document was checked (not skipped as an unknown kind).
        let n = docs(f.file_name().unwrap().to_str().unwrap()).len();
        assert_eq!(out.matches(" passed for resource ").count(), n, "{out}");
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
    assert_eq!(port_of("metrics"), u64::from(cfg.admin.listen.port()));
    for kube_proxy in [10256, 10249] {
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
    let v = python_json(
        "import json, sys\n\
         from dockerfile_parse import DockerfileParser\n\
         p = DockerfileParser(path=sys.argv[1])\n\
         print(json.dumps([[i['instruction'], i['value']] for i in p.structure]))",
        &[&root().join("Dockerfile")],
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
    let mut out: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for (ins, val) in dockerfile() {
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
