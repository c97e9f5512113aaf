//! Black-box tests of `xvs check`, `xvs run`'s refusals and `xvs --version`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The build script, for its revision rule (its `main` is cargo's).
#[allow(dead_code)]
#[path = "../src/build.rs"]
mod build_script;

fn xvs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args(args)
        // Outside a pod: the in-cluster configuration is not checked.
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run xvs")
}

/// A kubeconfig that loads (its server is never contacted), mode 0600.
fn kubeconfig(dir: &tempfile::TempDir) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.path().join("kubeconfig");
    std::fs::write(
        &p,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://198.18.0.10:6443\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// edge-node.toml with its kubeconfig replaced by one that loads.
fn edge_node(dir: &tempfile::TempDir) -> PathBuf {
    let text = std::fs::read_to_string(example("edge-node.toml")).unwrap();
    let kc = kubeconfig(dir);
    let text = text.replacen(
        "kubeconfig = \"/etc/xvs/kubeconfig\"",
        &format!("kubeconfig = \"{}\"", kc.display()),
        1,
    );
    let p = dir.path().join("edge-node.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/examples")
        .join(name)
}

fn write_temp(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let p = dir.path().join("xvs.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn check_lab_prints_summary() {
    let o = xvs(&["check", "--config", example("lab.toml").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("source: static (3 services)"), "{out}");
    assert!(
        out.contains("web 198.18.100.1:80/tcp scheduler rr mode fullnat, 3 backends"),
        "{out}"
    );
    assert!(
        out.contains("echo 198.18.100.1:9000/udp scheduler mh+mh-port"),
        "{out}"
    );
    assert!(out.contains("-> 198.18.1.2:8080 weight 1"), "{out}");
    assert!(out.contains("[2001:2:0:100::1]:80/tcp"), "{out}");
}

#[test]
fn check_every_example() {
    for name in ["lab.toml", "static-services.toml"] {
        let o = xvs(&["check", "--strict", example(name).to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert!(o.stderr.is_empty(), "{name}: no warning: {}", stderr(&o));
    }
    // edge-node.toml names a kubeconfig, which `xvs run` reads first: where it is missing,
    // `check` says so.
    let o = xvs(&["check", example("edge-node.toml").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(": kubernetes.kubeconfig: kubeconfig /etc/xvs/kubeconfig: "),
        "{}",
        stderr(&o)
    );
    let dir = tempfile::tempdir().unwrap();
    let o = xvs(&["check", "--strict", edge_node(&dir).to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains(&format!(
            "source: kubernetes ({}; service-proxy-name xvs",
            dir.path().join("kubeconfig").display()
        )),
        "{out}"
    );
    assert!(out.contains("4 workers on cores [2, 3, 4, 5]"), "{out}");
    assert!(
        out.contains("admin: http://127.0.0.1:10249 (metrics, read-only API), healthz http://0.0.0.0:10256, socket /run/xvs/xvs.sock (control off)"),
        "{out}"
    );
    assert!(out.contains("log: info (text)"), "{out}");
    assert!(
        out.contains("state: /run/xvs (restart hold 30s, steering pinned under /sys/fs/bpf/xvs)"),
        "{out}"
    );
    assert!(
        out.contains("capacity 4194304 flows, removal grace 3s"),
        "{out}"
    );
    // `xvs check` counts workers as `xvs run` does: the most queues of any interface.
    let dir = tempfile::tempdir().unwrap();
    let p = write_temp(
        &dir,
        "[dataplane]\ninterfaces = [{ name = \"a\", queues = 3 }, { name = \"b\", queues = 1 }]\ncores = [1, 2, 3]\nmode = \"nat\"\n",
    );
    let o = xvs(&["check", "--config", p.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("3 workers on cores [1, 2, 3]"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn governance_keys_are_shown_and_checked() {
    let o = xvs(&[
        "check",
        "--config",
        example("static-services.toml").to_str().unwrap(),
    ]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("at most 5000 new connections/s (burst 500)"),
        "{out}"
    );
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(example("lab.toml")).unwrap();
    let cases = [
        (
            "name = \"web\"\n",
            "name = \"web\"\nnew_conn_rate = 0\n",
            "services[0].new_conn_rate",
        ),
        (
            "name = \"web\"\n",
            "name = \"web\"\nnew_conn_burst = 5\n",
            "services[0].new_conn_burst",
        ),
        (
            "[flowtable]\n",
            "[flowtable]\nremoved_backend_tcp = \"reset\"\n",
            "flowtable.removed_backend_tcp",
        ),
        (
            "batch_size = 64\n",
            "batch_size = 64\ndrain_timeout = \"25\"\n",
            "dataplane.drain_timeout",
        ),
    ];
    for (from, to, key) in cases {
        let text = good.replacen(from, to, 1);
        assert_ne!(text, good, "{to}");
        let p = write_temp(&dir, &text);
        let o = xvs(&["check", "--config", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{to}");
        assert!(
            stderr(&o).contains(key),
            "{to}: wants key {key}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn health_checks_and_the_scrape_listener_are_shown_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let lab = std::fs::read_to_string(example("lab.toml")).unwrap();
    // web has a check of its own; the others take [health]'s (tcp here).
    let text = lab.replacen(
        "name = \"web\"\n",
        "name = \"web\"\nhealth = { probe = \"https\", port = 8443, http_path = \"/ready\", http_status = [204], fall = 5 }\n",
        1,
    ) + "\n[health]\nprobe = \"tcp\"\n";
    let text = text.replacen(
        "[admin]\n",
        "[admin]\nmetrics_listen = \"0.0.0.0:10269\"\n",
        1,
    );
    let o = xvs(&[
        "check",
        "--config",
        write_temp(&dir, &text).to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("    health: https GET /ready on port 8443, status 204, rise 2 fall 5\n"),
        "{out}"
    );
    assert_eq!(
        out.matches("    health: tcp on the backend's port, rise 2 fall 3\n")
            .count(),
        2,
        "{out}"
    );
    assert!(
        out.contains("metrics: http://0.0.0.0:10269/metrics (nothing else)"),
        "{out}"
    );
    // Without probes nothing is said.
    let o = xvs(&["check", "--config", example("lab.toml").to_str().unwrap()]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        !out.contains("health:") && !out.contains("metrics: "),
        "{out}"
    );
    // A bad value: exit 2 naming the key.
    for (health, key) in [
        ("health = { port = 0 }", "services[0].health.port"),
        (
            "health = { http_path = \"/a b\" }",
            "services[0].health.http_path",
        ),
        ("health = { probe = \"grpc\" }", "services[0].health.probe"),
    ] {
        let text = lab.replacen(
            "name = \"web\"\n",
            &format!("name = \"web\"\n{health}\n"),
            1,
        );
        let o = xvs(&[
            "check",
            "--config",
            write_temp(&dir, &text).to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{health}");
        assert!(stderr(&o).contains(key), "{health}: {}", stderr(&o));
    }
}

#[test]
fn bad_files_exit_2_naming_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(example("lab.toml")).unwrap();
    let line_of = |needle: &str| good.lines().position(|l| l.contains(needle)).unwrap() + 1;
    let cases = [
        (
            "batch_size = 64",
            "batch_sise = 64",
            "dataplane.batch_sise",
            line_of("batch_size = 64"),
        ),
        (
            "vip = \"198.18.100.1\"",
            "vip = \"198.18.100.256\"",
            "services[0].vip",
            line_of("vip = \"198.18.100.1\""),
        ),
        (
            "scheduler = \"mh\"",
            "scheduler = \"maglev\"",
            "services[1].scheduler",
            line_of("scheduler = \"mh\""),
        ),
        (
            "batch_size = 64",
            "batch_size = 65",
            "dataplane.batch_size",
            line_of("batch_size = 64"),
        ),
    ];
    for (from, to, key, line) in cases {
        let p = write_temp(&dir, &good.replacen(from, to, 1));
        let o = xvs(&["check", "--config", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{to}");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("xvs.toml:{line}:")),
            "{to}: wants line {line}: {err}"
        );
        assert!(err.contains(key), "{to}: wants key {key}: {err}");
        assert!(o.stdout.is_empty());
    }
}

/// Every value `xvs run` or the snapshot builder would refuse, `check` refuses (exit 2),
/// naming the key and its line.
#[test]
fn check_refuses_what_run_would() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(example("lab.toml")).unwrap();
    let line_of = |needle: &str| good.lines().position(|l| l.contains(needle)).unwrap() + 1;
    let snat = "snat_addresses = [\"198.18.1.254\", \"2001:2:0:1::fe\"]";
    let cases: Vec<(&str, String, &str, usize, &str)> = vec![
        // (replace, with, key, line, a word of the message)
        (
            "capacity = 65536",
            "capacity = 2147483648".into(),
            "flowtable.capacity",
            line_of("capacity = 65536"),
            "GiB",
        ),
        (
            "batch_size = 64",
            "batch_size = 64\nmh_table_size = 4294967291".into(),
            "dataplane.mh_table_size",
            line_of("batch_size = 64") + 1,
            "largest Maglev table",
        ),
        (
            "batch_size = 64",
            "batch_size = 64\nidle_backoff = \"1d\"".into(),
            "dataplane.idle_backoff",
            line_of("batch_size = 64") + 1,
            "10ms",
        ),
        (
            "name = \"xvs-b0\"",
            "name = \"..\"".into(),
            "dataplane.interfaces[1].name",
            line_of("name = \"xvs-b0\""),
            "not a valid interface name",
        ),
        (
            "batch_size = 64",
            "batch_size = 64\nbatch_size = 32".into(),
            "dataplane.batch_size",
            line_of("batch_size = 64") + 1,
            "set twice",
        ),
    ];
    let mut cases = cases;
    for (addr, word) in [
        ("0.0.0.0", "unspecified"),
        ("255.255.255.255", "broadcast"),
        ("224.0.0.1", "multicast"),
        ("127.0.0.1", "loopback"),
        ("198.18.100.1", "VIP of services[0] (web)"),
        ("198.18.1.2", "services[0].backends[1] (web)"),
    ] {
        cases.push((
            snat,
            format!("snat_addresses = [\"198.18.1.254\", \"2001:2:0:1::fe\", \"{addr}\"]"),
            "dataplane.snat_addresses[2]",
            line_of(snat),
            word,
        ));
    }
    // Addresses no service may take (the Kubernetes source's rules, issue #27).
    for (addr, word) in [
        ("127.0.0.1", "it is a loopback address"),
        ("169.254.1.1", "link-local"),
        ("198.18.0.1", "this node's own address"),
        ("198.18.100.1", "the VIP of services[0] (web)"),
    ] {
        cases.push((
            "198.18.1.2:8080",
            format!("{addr}:8080"),
            "services[0].backends[1].addr",
            line_of("198.18.1.2:8080"),
            word,
        ));
    }
    cases.push((
        "vip = \"198.18.100.1\"",
        "vip = \"198.18.0.1\"".into(),
        "services[0].vip",
        line_of("vip = \"198.18.100.1\""),
        "this node's own address",
    ));
    for (from, to, key, line, word) in &cases {
        let text = good.replacen(from, to, 1);
        assert_ne!(text, good, "{to}");
        let p = write_temp(&dir, &text);
        let o = xvs(&["check", "--config", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{to}");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("xvs.toml:{line}:")) && err.contains(&format!(": {key}: ")),
            "{to}: wants {key} at line {line}: {err}"
        );
        assert!(err.contains(word), "{to}: wants {word:?}: {err}");
        assert!(o.stdout.is_empty());
    }
}

/// A scheduler the snapshot builder would refuse (a wrr sequence above 2^20 entries) is
/// refused by `check` (validation does the builder's arithmetic; `check` also runs the
/// builder over the static services, as a backstop).
#[test]
fn check_refuses_what_the_builder_would() {
    let dir = tempfile::tempdir().unwrap();
    let mut backends = String::new();
    for i in 1..=17 {
        backends.push_str(&format!(
            "  {{ addr = \"198.18.1.{i}:80\", weight = 65535 }},\n"
        ));
    }
    let p = write_temp(
        &dir,
        &format!(
            "[dataplane]\nmode = \"nat\"\n[[services]]\nname = \"w\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nscheduler = \"wrr\"\nbackends = [\n{backends}  {{ addr = \"198.18.1.100:80\", weight = 1 }},\n]\n"
        ),
    );
    let o = xvs(&["check", "--config", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("xvs.toml:9:")
            && err.contains("services[0].backends: ")
            && err.contains("wrr sequence"),
        "{err}"
    );
}

#[test]
fn missing_file_exits_2() {
    let o = xvs(&["check", "--config", "/nonexistent/xvs.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("/nonexistent/xvs.toml"));
}

#[test]
fn run_refuses_a_missing_interface() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_temp(
        &dir,
        "[dataplane]\ninterfaces = [{ name = \"xvsnope0\" }]\ncores = [0]\nmode = \"nat\"\n",
    );
    let o = xvs(&["run", "--config", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    // With the capabilities the interface check speaks; otherwise the capability check does.
    assert!(
        err.contains("interface xvsnope0") || err.contains("missing capabilities: CAP_"),
        "{err}"
    );
    let bad = write_temp(&dir, "[dataplane]\nbatch_size = 3\n");
    assert_eq!(
        xvs(&["run", "--config", bad.to_str().unwrap()])
            .status
            .code(),
        Some(2)
    );
}

/// `xvs --version` names the git revision: `XVS_GIT_REVISION` when the build had it (an
/// image build), else the checkout's HEAD.
#[test]
fn version_names_the_revision() {
    let o = xvs(&["--version"]);
    assert!(o.status.success());
    let rev = env!("XVS_REVISION");
    assert_eq!(
        String::from_utf8(o.stdout).unwrap().trim(),
        format!("xvs {} (git {rev})", env!("CARGO_PKG_VERSION"))
    );
    let head = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match (option_env!("XVS_GIT_REVISION"), head) {
        (Some(given), _) if !given.trim().is_empty() => assert_eq!(rev, given.trim()),
        (_, Some(head)) => assert_eq!(rev, head, "the checkout's HEAD"),
        (_, None) => assert_eq!(rev, "unknown"),
    }
    // What the build script takes from XVS_GIT_REVISION.
    assert_eq!(
        build_script::revision(" 1a2b3c4\n"),
        Ok(Some("1a2b3c4".to_owned()))
    );
    assert_eq!(
        build_script::revision("v0.1.0-rc.1+abc"),
        Ok(Some("v0.1.0-rc.1+abc".to_owned()))
    );
    assert_eq!(build_script::revision(""), Ok(None));
    for bad in ["abc def", "x\";rm", &"a".repeat(65)] {
        assert!(build_script::revision(bad).is_err(), "{bad}");
    }
}

/// `xvs run` with its cpuset limited to core 0 (as the kubelet limits a pod's).
fn run_on_core0(config: &Path) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xvs"));
    cmd.args(["run", "--config", config.to_str().unwrap()]);
    // SAFETY: sched_setaffinity on the child between fork and exec; a zeroed cpu_set_t with
    // CPU_SET only writes the set we own.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("run xvs")
}

#[test]
fn run_refuses_cores_outside_its_cpuset() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_temp(
        &dir,
        "[dataplane]\ninterfaces = [{ name = \"lo\" }]\ncores = [0, 5, 7]\nmode = \"nat\"\n",
    );
    let o = run_on_core0(&p);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains(
            "dataplane.cores: cores 5, 7 are not in the cpuset this process may run on (0)"
        ),
        "{err}"
    );
    let p = write_temp(
        &dir,
        "[dataplane]\ninterfaces = [{ name = \"lo\" }]\ncores = \"auto\"\nslowpath_core = 3\nmode = \"nat\"\n",
    );
    let err = stderr(&run_on_core0(&p));
    assert!(
        err.contains(
            "dataplane.slowpath_core: core 3 is not in the cpuset this process may run on (0)"
        ),
        "{err}"
    );
}

#[test]
fn check_shows_auto_cores() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_temp(
        &dir,
        "[dataplane]\ninterfaces = [{ name = \"eth0\", queues = 2 }]\ncores = \"auto\"\nmode = \"nat\"\n",
    );
    let o = xvs(&["check", "--config", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("2 workers on cores auto (the process's cpuset)"),
        "{out}"
    );
}
