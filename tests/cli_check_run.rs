//! `xvs check` refuses what `xvs run` or a reload refuses, and warns about what is valid but
//! dangerous (issue #30's list of configs `check` used to pass); `xvs run` refuses the same
//! before it looks at the machine and logs the same warnings. The real binary, no root.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn xvs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run xvs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A node with one interface and one core: nothing to refuse or warn about.
const NODE: &str = "[dataplane]\ninterfaces = [{ name = \"eth0\" }]\ncores = [1]\nmode = \"nat\"\n";

fn service(vip: &str, backend: &str) -> String {
    format!(
        "{NODE}[[services]]\nname = \"w\"\nvip = \"{vip}\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{{ addr = \"{backend}\" }}]\n"
    )
}

#[test]
fn a_plain_node_passes() {
    let dir = tempfile::tempdir().unwrap();
    for text in [NODE.to_owned(), service("198.18.100.1", "198.18.1.1:80")] {
        let p = write(dir.path(), "xvs.toml", &text);
        let o = xvs(&["check", "--strict", p.to_str().unwrap()]);
        assert!(o.status.success(), "{text}: {}", stderr(&o));
        assert!(o.stderr.is_empty(), "{}", stderr(&o));
    }
}

/// Every config of issue #30's list that `run` or a reload refuses: exit 2, the key and
/// line named, nothing on stdout.
#[test]
fn check_refuses_every_config_run_or_a_reload_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("sync.key");
    let sync = |path: &Path| {
        format!(
            "{NODE}[sync]\nenable = true\nlisten = \"198.18.0.1:7946\"\nkey_file = \"{}\"\npeers = [{{ address = \"198.18.0.2:7946\" }}]\n",
            path.display()
        )
    };
    let kubeconfig = dir.path().join("kubeconfig");
    let cases: Vec<(&str, String, &str, usize, &str)> = vec![
        // (what, text, key, line, a word of the message)
        (
            "an empty file",
            "# nothing\n\n".into(),
            "(file)",
            1,
            "the file is empty",
        ),
        (
            "no interfaces",
            "[dataplane]\nmode = \"nat\"\n".into(),
            "dataplane.interfaces",
            1,
            "nothing to forward on",
        ),
        (
            "VIP 127.0.0.1",
            service("127.0.0.1", "198.18.1.1:80"),
            "services[0].vip",
            7,
            "loopback",
        ),
        (
            "VIP ::1",
            service("::1", "[2001:2::5]:80"),
            "services[0].vip",
            7,
            "loopback",
        ),
        (
            "VIP fe80::1",
            service("fe80::1", "[2001:2::5]:80"),
            "services[0].vip",
            7,
            "link-local",
        ),
        (
            "VIP ::ffff:198.18.100.1",
            service("::ffff:198.18.100.1", "[2001:2::5]:80"),
            "services[0].vip",
            7,
            "IPv4-mapped",
        ),
        (
            "VIP 255.255.255.255",
            service("255.255.255.255", "198.18.1.1:80"),
            "services[0].vip",
            7,
            "broadcast",
        ),
        (
            "node address 0.0.0.0",
            format!(
                "[node]\naddresses = [\"0.0.0.0\"]\n{}",
                service("198.18.100.1", "198.18.1.1:80")
            ),
            "node.addresses[0]",
            2,
            "unspecified",
        ),
        (
            "a backend equal to its VIP",
            service("198.18.100.1", "198.18.100.1:80"),
            "services[0].backends[0].addr",
            10,
            "the VIP of services[0] (w)",
        ),
        (
            "a missing sync key file",
            sync(&key),
            "sync.key_file",
            8,
            "No such file",
        ),
        (
            "a missing kubeconfig",
            format!(
                "{NODE}[kubernetes]\nkubeconfig = \"{}\"\n",
                kubeconfig.display()
            ),
            "kubernetes.kubeconfig",
            6,
            "No such file",
        ),
        (
            "a last line cut short",
            NODE.trim_end().to_owned(),
            "(file)",
            4,
            "no newline",
        ),
    ];
    for (what, text, key, line, word) in &cases {
        let p = write(dir.path(), "xvs.toml", text);
        let o = xvs(&["check", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("xvs.toml:{line}:")) && err.contains(&format!(": {key}: ")),
            "{what}: wants {key} at line {line}: {err}"
        );
        assert!(err.contains(word), "{what}: wants {word:?}: {err}");
        assert!(o.stdout.is_empty(), "{what}");
    }
    // A key file that is there but too short is refused as the daemon refuses it.
    std::fs::write(&key, [1u8; 8]).unwrap();
    let p = write(dir.path(), "xvs.toml", &sync(&key));
    let o = xvs(&["check", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(": sync.key_file: "), "{}", stderr(&o));
    // Every problem at once.
    let p = write(
        dir.path(),
        "xvs.toml",
        &format!(
            "[node]\naddresses = [\"0.0.0.0\"]\n[sync]\nenable = true\nlisten = \"198.18.0.1:7946\"\nkey_file = \"{}\"\npeers = [{{ address = \"198.18.0.2:7946\" }}]\n",
            dir.path().join("none").display()
        ),
    );
    let o = xvs(&["check", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(": node.addresses[0]: "),
        "{}",
        stderr(&o)
    );
    let p = write(
        dir.path(),
        "xvs.toml",
        &sync(&dir.path().join("none")).replace(NODE, "[dataplane]\nmode = \"nat\"\n"),
    );
    let o = xvs(&["check", p.to_str().unwrap()]);
    let err = stderr(&o);
    assert!(
        err.contains(": dataplane.interfaces: ") && err.contains(": sync.key_file: "),
        "both at once: {err}"
    );
}

/// Valid but dangerous: `warning:` lines naming key and line, exit 0 with the summary;
/// `--strict` refuses them.
#[test]
fn check_warns_about_dangerous_settings_and_strict_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("sync.key");
    std::fs::write(&key, [1u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cases: Vec<(&str, String, &str, usize, &str)> = vec![
        (
            "external_ip_cidrs 0.0.0.0/0",
            format!("{NODE}[kubernetes]\nexternal_ip_cidrs = [\"0.0.0.0/0\"]\n"),
            "kubernetes.external_ip_cidrs[0]",
            6,
            "CVE-2020-8554",
        ),
        (
            "4 queues on 1 core",
            NODE.replace("name = \"eth0\"", "name = \"eth0\", queues = 4"),
            "dataplane.cores",
            3,
            "4 workers (the most queues of any interface) on 1 core",
        ),
        (
            "restart_hold 0s",
            format!("{NODE}restart_hold = \"0s\"\n"),
            "dataplane.restart_hold",
            5,
            "every connection breaks",
        ),
        (
            "a sync key others can read",
            format!(
                "{NODE}[sync]\nenable = true\nlisten = \"198.18.0.1:7946\"\nkey_file = \"{}\"\npeers = [{{ address = \"198.18.0.2:7946\" }}]\n",
                key.display()
            ),
            "sync.key_file",
            8,
            "(mode 0644)",
        ),
    ];
    for (what, text, key, line, word) in &cases {
        let p = write(dir.path(), "xvs.toml", text);
        let o = xvs(&["check", "--config", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", stderr(&o));
        let err = stderr(&o);
        let want = format!("warning: {}:{line}:", p.display());
        assert!(
            err.starts_with(&want) && err.contains(&format!(": {key}: ")),
            "{what}: wants {want} ... {key}: {err}"
        );
        assert!(err.contains(word), "{what}: wants {word:?}: {err}");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.starts_with(&format!("{}: OK (1 warning)\n", p.display())),
            "{what}: {out}"
        );
        let o = xvs(&["check", "--strict", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{what}: --strict");
        let err = stderr(&o);
        assert!(
            err.starts_with("xvs: invalid configuration (--strict: warnings too):\n")
                && err.contains(&format!(": {key}: ")),
            "{what}: {err}"
        );
        assert!(o.stdout.is_empty());
    }
}

/// `xvs run` refuses what `check` refuses before it looks at the machine (exit 2, every
/// problem at once, no root needed), and logs `check`'s warnings.
#[test]
fn run_refuses_what_check_refuses_and_logs_its_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "xvs.toml",
        &format!(
            "[dataplane]\nmode = \"nat\"\n[sync]\nenable = true\nlisten = \"198.18.0.1:7946\"\nkey_file = \"{}\"\npeers = [{{ address = \"198.18.0.2:7946\" }}]\n",
            dir.path().join("none").display()
        ),
    );
    let o = xvs(&["run", "--config", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(": dataplane.interfaces: no interfaces") && err.contains(": sync.key_file: "),
        "{err}"
    );
    // A file run can start from (its last line is cut) is a warning for run, which then
    // stops at the machine: the interface does not exist here.
    let p = write(
        dir.path(),
        "xvs.toml",
        "[dataplane]\ninterfaces = [{ name = \"xvsnope0\", queues = 2 }]\ncores = [0]\nmode = \"nat\"",
    );
    let o = xvs(&["run", "--config", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("dataplane.cores: 2 workers (the most queues of any interface) on 1 core"),
        "the warning is logged: {err}"
    );
    assert!(
        err.contains("(file): the file's last line has no newline"),
        "{err}"
    );
}

#[test]
fn check_takes_the_file_as_an_argument() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "xvs.toml", NODE);
    let by_arg = xvs(&["check", p.to_str().unwrap()]);
    let by_flag = xvs(&["check", "--config", p.to_str().unwrap()]);
    assert!(by_arg.status.success(), "{}", stderr(&by_arg));
    assert_eq!(by_arg.stdout, by_flag.stdout);
    assert!(String::from_utf8_lossy(&by_arg.stdout).starts_with(&format!("{}: OK\n", p.display())));
    // Neither, or both: a usage error.
    for args in [
        vec!["check"],
        vec![
            "check",
            p.to_str().unwrap(),
            "--config",
            p.to_str().unwrap(),
        ],
    ] {
        let o = xvs(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&o).contains("Usage: xvs check <FILE|--config <CONFIG>|--host>"),
            "{}",
            stderr(&o)
        );
    }
}
