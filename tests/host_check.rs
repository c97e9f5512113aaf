//! `xvs check --host` and `xvs run`'s preflight, from outside: every problem of a config on
//! this machine listed at once, their exit codes, a tmpfs state directory without huge pages
//! warned, and (as root, in a network namespace this test creates) an interface with more
//! receive queues than `queues` refused with the `ethtool -L` command that fixes it, while
//! nothing of the namespace is touched.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The `problem:` lines of `check --host`'s output, as `(check, text)`.
fn findings<'a>(out: &'a str, kind: &str) -> Vec<(&'a str, &'a str)> {
    out.lines()
        .filter_map(|l| l.strip_prefix(kind)?.strip_prefix(": "))
        .filter_map(|l| l.split_once(": "))
        .collect()
}

/// edge-node.toml as `nobody` can read it, its kubeconfig (which `xvs run` and `check` read
/// first: `/etc/xvs/kubeconfig` is not on this machine) replaced by one that loads, owned by
/// `nobody` with mode 0600 (its server is never contacted).
fn edge_node_for_nobody(dir: &tempfile::TempDir) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode(dir.path(), 0o755);
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://198.18.0.10:6443\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
    )
    .unwrap();
    mode(&kc, 0o600);
    std::os::unix::fs::chown(&kc, Some(65534), Some(65534)).unwrap();
    let text = std::fs::read_to_string(root().join("config/examples/edge-node.toml")).unwrap();
    let text = text.replacen(
        "kubeconfig = \"/etc/xvs/kubeconfig\"",
        &format!("kubeconfig = \"{}\"", kc.display()),
        1,
    );
    let cfg = dir.path().join("edge-node.toml");
    std::fs::write(&cfg, text).unwrap();
    mode(&cfg, 0o644);
    cfg
}

/// The example edge node on this machine, restricted to core 0 and run as `nobody` without
/// capabilities (so the result does not depend on the machine's size or the test's uid):
/// its cores, its capabilities and both of its interfaces are listed in ONE run, exit 1;
/// `xvs run` refuses with the same list.
#[test]
fn the_edge_node_example_lists_every_problem_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = edge_node_for_nobody(&dir);
    let cfg = cfg.to_str().unwrap();
    let as_nobody = |args: &[&str]| {
        Command::new("taskset")
            .args(["-c", "0", "setpriv", "--reuid=65534", "--regid=65534"])
            .args(["--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
            .arg(env!("CARGO_BIN_EXE_xvs"))
            .args(args)
            .output()
            .expect("run xvs through taskset and setpriv")
    };
    let o = as_nobody(&["check", "--host", "--config", cfg]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let problems = findings(&out, "problem");
    let checks: std::collections::BTreeSet<&str> = problems.iter().map(|(c, _)| *c).collect();
    for want in ["cores", "capabilities", "interfaces"] {
        assert!(checks.contains(want), "no {want} problem in:\n{out}");
    }
    for ifname in ["ens1f0", "ens1f1"] {
        assert!(
            problems
                .iter()
                .any(|(c, t)| *c == "interfaces" && t.contains(&format!("interface {ifname} "))),
            "{ifname} not listed:\n{out}"
        );
    }
    assert!(
        problems
            .iter()
            .any(|(c, t)| *c == "cores"
                && t.contains("not in the cpuset this process may run on (0)")),
        "{out}"
    );
    assert!(
        out.contains(&format!("host: {} problems, ", problems.len()))
            && out.contains("`xvs run` would refuse to start"),
        "{out}"
    );
    // `run` checks the same before it touches anything, and says all of it.
    let o = as_nobody(&["run", "--config", cfg]);
    let log = text(&o);
    assert_eq!(o.status.code(), Some(1), "{log}");
    assert_eq!(
        log.matches("cannot run: ").count(),
        problems.len(),
        "run lists what check --host lists:\n{log}\n---\n{out}"
    );
    assert!(
        log.contains("interface ens1f1 (dataplane.interfaces)"),
        "{log}"
    );
    assert!(
        log.contains(&format!("problems={}", problems.len())),
        "{log}"
    );
}

/// Exit codes: 2 for a config that does not load and for bad arguments; 0 without a
/// config when the defaults are fine on the machine is covered by the namespace test.
#[test]
fn check_host_exit_codes_for_bad_configs_and_arguments() {
    let xvs = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_xvs"))
            .args(args)
            .output()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[dataplane]\nbatch_size = 3\n").unwrap();
    let o = xvs(&["check", "--host", "--config", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("batch_size"), "{}", text(&o));
    let o = xvs(&["check", "--host", "--config", "/nonexistent/xvs.toml"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // Neither --config nor --host: an argument error.
    let o = xvs(&["check"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// A state directory on a tmpfs without huge pages is warned (`hugepages`), naming the mount
/// and the remount that fixes it; on a tmpfs mounted `huge=within_size` it is not. Each tmpfs
/// is mounted in a mount namespace of its own (`unshare -m`), gone with the command.
#[test]
fn a_state_dir_on_a_tmpfs_without_huge_pages_is_warned() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let cfg = dir.path().join("xvs.toml");
    std::fs::write(
        &cfg,
        format!("[dataplane]\nstate_dir = \"{}/xvs\"\n", mnt.display()),
    )
    .unwrap();
    let check = |options: &str| {
        let script = format!(
            "mount -t tmpfs -o size=64m{options} xvs-hp-test \"$1\" && exec \"$2\" check --host --config \"$3\""
        );
        let o = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
            .arg(&mnt)
            .arg(env!("CARGO_BIN_EXE_xvs"))
            .arg(&cfg)
            .output()
            .expect("run xvs check --host in a mount namespace");
        let out = text(&o);
        assert!(out.contains("host checks for "), "{out}");
        findings(&out, "warning")
            .into_iter()
            .filter(|(c, _)| *c == "hugepages")
            .map(|(_, t)| t.to_owned())
            .collect::<Vec<_>>()
    };
    let warned = check("");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains(&format!(
            "mount -o remount,huge=within_size {}",
            mnt.display()
        )),
        "{warned:?}"
    );
    assert_eq!(check(",huge=within_size"), Vec::<String>::new());
}

/// A network namespace of this test's with one veth pair (`xq0`, `xq0p`) of `queues` rx and
/// tx queues, and a pin root of its own on the lab's bpffs; removed on drop.
struct Ns {
    name: String,
    pins: String,
    dir: tempfile::TempDir,
}

fn sh(args: &[&str]) -> Output {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", text(&o));
    o
}

impl Ns {
    fn new(queues: u32) -> Ns {
        let name = format!(
            "xh{}-{}",
            std::process::id() % 100000,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Ns {
            pins: format!("/run/xvs-bpf/{name}"),
            name,
            dir: tempfile::tempdir().unwrap(),
        };
        // The bpffs scripts/lab mounts (`ip netns exec` hides /sys/fs/bpf).
        if !Command::new("mountpoint")
            .args(["-q", "/run/xvs-bpf"])
            .status()
            .unwrap()
            .success()
        {
            std::fs::create_dir_all("/run/xvs-bpf").unwrap();
            sh(&["mount", "-t", "bpf", "bpf", "/run/xvs-bpf"]);
        }
        sh(&["ip", "netns", "add", &ns.name]);
        let q = queues.to_string();
        let qs = ["numtxqueues", &q, "numrxqueues", &q];
        let mut add = vec!["ip", "-n", &ns.name, "link", "add", "xq0"];
        add.extend(qs);
        add.extend(["type", "veth", "peer", "name", "xq0p"]);
        add.extend(qs);
        sh(&add);
        for dev in ["lo", "xq0", "xq0p"] {
            sh(&["ip", "-n", &ns.name, "link", "set", dev, "up"]);
        }
        ns
    }

    fn exec(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .unwrap()
    }

    /// A config for `xq0` with `queues`, and `extra` lines in `[dataplane]`.
    fn config(&self, queues: u32, extra: &str) -> String {
        let p = self.dir.path().join(format!("xvs-{queues}.toml"));
        std::fs::write(
            &p,
            format!(
                "[dataplane]\ninterfaces = [{{ name = \"xq0\", queues = {queues} }}]\ncores = [0]\nmode = \"nat\"\nstate_dir = {:?}\nbpf_pin_root = {:?}\n{extra}\n[flowtable]\ncapacity = 65536\n",
                self.dir.path().join("state").display().to_string(),
                self.pins
            ),
        )
        .unwrap();
        p.display().to_string()
    }

    fn check_host(&self, config: &str) -> (Option<i32>, String) {
        let o = self.exec(&[
            env!("CARGO_BIN_EXE_xvs"),
            "check",
            "--host",
            "--config",
            config,
        ]);
        (o.status.code(), text(&o))
    }

    fn xdp_attached(&self) -> bool {
        let o = self.exec(&["ip", "-d", "link", "show", "xq0"]);
        String::from_utf8_lossy(&o.stdout).contains("prog/xdp")
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|o| {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            });
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(&self.pins);
    }
}

/// `xvs run` on `config` in `ns`: its exit code and log (killed, and `None`, if it is still
/// running after 20 s: it started when it should have refused).
fn run_xvs(ns: &Ns, config: &str) -> (Option<i32>, String) {
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            env!("CARGO_BIN_EXE_xvs"),
            "run",
            "--config",
        ])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    (o.status.code(), text(&o))
}

/// A veth with 4 receive queues served with queues = 1: `check --host` and `run` refuse it,
/// naming the frames' fate (no_socket) and `ethtool -L xq0 rx 1 tx 1`; `run` touches
/// nothing. After that command, or with `allow_fewer_queues`, the host is fine (warnings:
/// the veth checksum trap, copy mode; the allowed mismatch). More queues than the veth has
/// are refused even when allowed.
#[test]
fn more_channels_than_queues_is_refused_with_the_ethtool_command() {
    let ns = Ns::new(4);
    let one = ns.config(1, "");
    let (code, out) = ns.check_host(&one);
    assert_eq!(code, Some(1), "{out}");
    let problems = findings(&out, "problem");
    assert_eq!(problems.len(), 1, "{out}");
    let (check, problem) = problems[0];
    assert_eq!(check, "channels");
    assert!(
        problem.contains("interface xq0 has 4 receive queues (ethtool -l)"),
        "{out}"
    );
    assert!(
        problem.contains("on queues 1-3 reach no xvs socket"),
        "{out}"
    );
    assert!(problem.contains("class=\"no_socket\""), "{out}");
    assert!(problem.contains("run `ethtool -L xq0 rx 1 tx 1`"), "{out}");

    let (code, log) = run_xvs(&ns, &one);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("cannot run: interface xq0 has 4 receive queues"),
        "{log}"
    );
    assert!(log.contains("`ethtool -L xq0 rx 1 tx 1`"), "{log}");
    assert!(!ns.xdp_attached(), "run refused, so nothing is attached");
    assert!(!Path::new(&ns.pins).exists(), "nor pinned");

    // The allowed mismatch is a warning.
    let allowed = ns.config(1, "allow_fewer_queues = true");
    let (code, out) = ns.check_host(&allowed);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        findings(&out, "warning")
            .iter()
            .any(|(c, t)| *c == "channels"
                && t.contains("allowed by [dataplane] allow_fewer_queues")),
        "{out}"
    );
    // Queues the veth does not have: refused, allowed or not.
    let eight = ns.config(8, "allow_fewer_queues = true");
    let (code, out) = ns.check_host(&eight);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("AF_XDP cannot bind queues 4-7"), "{out}");
    assert!(out.contains("the driver allows at most 4"), "{out}");

    // The fix it named.
    let o = ns.exec(&["ethtool", "-L", "xq0", "rx", "1", "tx", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let (code, out) = ns.check_host(&one);
    assert_eq!(code, Some(0), "{out}");
    assert!(findings(&out, "problem").is_empty(), "{out}");
    let warnings = findings(&out, "warning");
    assert!(
        warnings
            .iter()
            .any(|(c, t)| *c == "checksum" && t.contains("`ethtool -K PEER tx off`")),
        "the veth checksum trap is named:\n{out}"
    );
    assert!(
        warnings
            .iter()
            .any(|(c, t)| *c == "zero_copy" && t.contains("copy mode")),
        "{out}"
    );
    assert!(out.contains("host: OK (0 problems, "), "{out}");
}
