//! The netns lab harness shared by the end-to-end tests: `scripts/lab` namespaces under a
//! unique prefix, the real `xvs run` binary inside, and real clients (curl, python).
#![allow(dead_code)]

pub mod dsr;
pub mod tier;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub static SERIAL: Mutex<()> = Mutex::new(());
pub static COUNTER: AtomicU32 = AtomicU32::new(0);

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// A lab under a unique prefix; removed on drop.
pub struct Lab {
    pub prefix: String,
    pub xvs: Option<Child>,
    pub dir: tempfile::TempDir,
}

impl Lab {
    pub fn up() -> Lab {
        let prefix = format!(
            "xl{}-{}",
            std::process::id() % 100000,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let lab = Lab {
            prefix,
            xvs: None,
            dir: tempfile::tempdir().unwrap(),
        };
        let o = run(Command::new(root().join("scripts/lab")).args(["up", &lab.prefix]));
        assert!(
            o.status.success(),
            "lab up: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        // The client's receive buffer (up to 32 MiB in a new namespace) would let a backend
        // push a whole download through xvs long before curl's rate limit has read it: at
        // most 256 KiB ahead keeps a rate-limited transfer on the wire while curl reads, so
        // what a test does to xvs meanwhile (a restart, a freeze, a removal) meets it.
        let o = lab.exec(
            "c",
            &["sysctl", "-qw", "net.ipv4.tcp_rmem=4096 65536 262144"],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        lab
    }

    pub fn ns(&self, which: &str) -> String {
        format!("{}-{which}", self.prefix)
    }

    /// Runs a command inside namespace `which`.
    pub fn exec(&self, which: &str, args: &[&str]) -> Output {
        run(Command::new("ip")
            .args(["netns", "exec", &self.ns(which)])
            .args(args))
    }

    /// The state directory of this lab's xvs (in the lab's own directory, so labs never
    /// share flows, pins or sockets).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The control socket of this lab's xvs (its state directory's).
    pub fn socket(&self) -> PathBuf {
        self.state_dir().join("xvs.sock")
    }

    /// `config` with this lab's state directory, unless it names one.
    pub fn with_state(&self, config: &str) -> String {
        if config.contains("\nstate_dir = ") {
            return config.to_owned();
        }
        let line = format!(
            "[dataplane]\nstate_dir = {:?}",
            self.state_dir().display().to_string()
        );
        config.replacen("[dataplane]", &line, 1)
    }

    /// Starts `xvs run` in the xvs node with `config` (TOML text) and waits until it says it
    /// forwards.
    pub fn start_xvs(&mut self, config: &str) {
        let child = self.spawn_xvs(config, &[]);
        match wait_ready(child) {
            Ok((child, _)) => self.xvs = Some(child),
            Err(log) => panic!("xvs did not become ready:\n{log}"),
        }
    }

    /// Spawns `xvs run` on `config` in the xvs node, behind `wrapper` (e.g. `setpriv ...`).
    pub fn spawn_xvs(&mut self, config: &str, wrapper: &[&str]) -> Child {
        self.stop_xvs();
        let path = self.dir.path().join("xvs.toml");
        std::fs::write(&path, self.with_state(config)).unwrap();
        Command::new("ip")
            .args(["netns", "exec", &self.ns("x")])
            .args(wrapper)
            .args([env!("CARGO_BIN_EXE_xvs"), "run", "--config"])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start xvs")
    }

    /// Stops xvs with SIGTERM and returns its stdout (the final counters).
    pub fn stop_xvs(&mut self) -> String {
        let Some(mut child) = self.xvs.take() else {
            return String::new();
        };
        // `ip netns exec` execs xvs, so the child pid is xvs itself.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                assert!(status.success(), "xvs exited with {status}");
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("xvs did not stop within 10 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        out
    }

    /// `curl` from the client; returns the body, or panics with curl's error.
    pub fn curl(&self, url: &str, extra: &[&str]) -> Vec<u8> {
        let mut args = vec!["curl", "-sS", "--fail", "--max-time", "10", "--retry", "0"];
        args.extend_from_slice(extra);
        args.push(url);
        let o = self.exec("c", &args);
        assert!(
            o.status.success(),
            "curl {url}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    }

    /// One UDP request/response from the client.
    pub fn udp(&self, addr: &str, port: u16, src_port: u16, payload: &str) -> String {
        let script = format!(
            "import socket\nfam=socket.AF_INET6 if ':' in '{addr}' else socket.AF_INET\ns=socket.socket(fam,socket.SOCK_DGRAM)\ns.bind(('',{src_port}))\ns.settimeout(3)\ns.sendto(b'{payload}',('{addr}',{port}))\nprint(s.recvfrom(2048)[0].decode())"
        );
        let o = self.exec("c", &["python3", "-c", &script]);
        assert!(
            o.status.success(),
            "udp to {addr}:{port}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap().trim().to_owned()
    }
}

/// Whether a log line is xvs's "ready" (text: `INFO xvs: ready ...`; json: target `xvs`,
/// message `ready`).
pub fn is_ready_line(line: &str) -> bool {
    line.contains("xvs: ready")
        || serde_json::from_str::<serde_json::Value>(line)
            .is_ok_and(|v| v["target"] == "xvs" && v["fields"]["message"] == "ready")
}

/// Waits (30 s at most) until `child` logs that it is ready; `Ok` with the child and the log
/// so far, `Err` with the log when it exits or times out first.
pub fn wait_ready(mut child: Child) -> Result<(Child, String), String> {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            log.push_str(&line);
            log.push('\n');
            if is_ready_line(&line) {
                let _ = tx.send(Ok(log.clone()));
            }
        }
        let _ = tx.send(Err(log));
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(log)) => Ok((child, log)),
        Ok(Err(log)) => {
            let _ = child.wait();
            Err(format!("xvs exited before it was ready:\n{log}"))
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err("xvs not ready after 30 s".to_owned())
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut c) = self.xvs.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new(root().join("scripts/lab"))
            .args(["down", &self.prefix])
            .output();
    }
}

pub fn lab_config() -> String {
    std::fs::read_to_string(root().join("config/examples/lab.toml"))
        .unwrap()
        .replace("batch_size = 64", "batch_size = 64\nidle_backoff = \"1ms\"")
}

pub fn nat_config() -> String {
    lab_config().replace("mode = \"fullnat\"", "mode = \"nat\"")
}

pub fn count(bodies: &[String], name: &str) -> usize {
    bodies.iter().filter(|b| b.as_str() == name).count()
}

pub fn http_round(lab: &Lab, url: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            String::from_utf8(lab.curl(url, &[]))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect()
}

/// Kills every process in backend namespace `which` (its HTTP and UDP servers).
pub fn stop_servers(lab: &Lab, which: &str) {
    let pids = lab.exec(which, &["ip", "netns", "pids", &lab.ns(which)]);
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        let _ = Command::new("kill").arg(pid).stderr(Stdio::null()).status();
    }
}

pub fn check_rr(lab: &Lab, url: &str) {
    let bodies = http_round(lab, url, 12);
    for b in ["backend-1", "backend-2", "backend-3"] {
        assert_eq!(count(&bodies, b), 4, "rr must be exactly even: {bodies:?}");
    }
}

/// Whether an XDP program is attached to an interface of the xvs node.
pub fn xdp_attached(lab: &Lab) -> bool {
    let links = lab.exec("x", &["ip", "-d", "link", "show"]);
    String::from_utf8_lossy(&links.stdout).contains("prog/xdp")
}

/// `curl` inside the xvs node; the HTTP status code ("000" when nothing answered).
pub fn http_code(lab: &Lab, method: &str, url: &str) -> String {
    let o = lab.exec(
        "x",
        &[
            "curl",
            "-s",
            "--max-time",
            "3",
            "-X",
            method,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            url,
        ],
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `curl` inside the xvs node against its admin API: GETs from `[admin] listen`
/// (127.0.0.1:10249), POSTs (control) through the control socket. Returns (HTTP code, body).
pub fn admin(lab: &Lab, method: &str, path: &str) -> (String, String) {
    admin_via(|args| lab.exec("x", args), &lab.socket(), method, path)
}

/// [`admin`] for any node: `exec` runs a command in its namespace, `socket` is its control
/// socket.
pub fn admin_via(
    exec: impl FnOnce(&[&str]) -> Output,
    socket: &Path,
    method: &str,
    path: &str,
) -> (String, String) {
    let sock = socket.display().to_string();
    let mut args = vec![
        "curl",
        "-s",
        "--max-time",
        "3",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ];
    let url = if method == "GET" {
        format!("http://127.0.0.1:10249{path}")
    } else {
        args.extend(["--unix-socket", &sock]);
        format!("http://localhost{path}")
    };
    args.push(&url);
    let o = exec(&args);
    let out = String::from_utf8(o.stdout).unwrap();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (code.to_owned(), body.to_owned())
}

/// A download of `bytes` from the web VIP at `rate`, in the background.
pub fn slow_download(lab: &Lab, bytes: usize, rate: &str) -> std::thread::JoinHandle<Output> {
    let ns = lab.ns("c");
    let rate = rate.to_owned();
    std::thread::spawn(move || {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                "curl",
                "-sS",
                "--fail",
                "--max-time",
                "20",
            ])
            .args(["--limit-rate", &rate])
            .arg(format!("http://198.18.100.1/bytes/{bytes}"))
            .output()
            .unwrap()
    })
}
