//! The tier lab: `scripts/tier` namespaces under a unique prefix (a client, a router running
//! BIRD with ECMP and BFD, two nodes each with its own BIRD and keepalived, three backends),
//! and the real `xvs run` on each node announcing through its BIRD (`[bgp]`). keepalived
//! holds the nat-mode return gateways (VRRP, one per node, tracking the node's liveness
//! device: [`Tier::gateway_holder`], [`Tier::wait_gateways`]; see `scripts/tier`).
//!
//! ```text
//!  client 198.18.0.2 ── router 198.18.0.1 ─┬─ br-up 198.18.2.0/24 ── n1 .11, n2 .12 (up0)
//!                                          └─ br-be 198.18.1.0/24 ── n1 .251, n2 .252 (dn0)
//!                                                                    backends .1 .2 .3
//! ```
//!
//! What a test can do: start, stop (SIGTERM), `kill -9` and restart a node's xvs
//! ([`Tier::start`], [`Tier::stop`], [`Tier::kill`]); take a node's uplink down and up
//! ([`Tier::set_link`]); crash and restart a BIRD ([`Tier::kill_bird`],
//! [`Tier::start_bird`]); read the router's kernel routes ([`Tier::next_hops`]) and wait for
//! them to change, timing it ([`Tier::wait_next_hops`]); ask BIRD ([`Tier::birdc`]); run
//! requests and downloads from the client ([`Tier::curl`], [`Tier::download`]); read a
//! node's admin API ([`Tier::admin`], [`Tier::stats`]); stop and restart a backend's
//! servers ([`Tier::stop_backend`], [`Tier::start_backend`]). Nodes are numbered 1 and 2.
//!
//! Everything is removed on drop, failed tests included: the processes in the namespaces
//! (BIRD, xvs, watchdogs, servers), the namespaces, the nodes' pinned steering programs;
//! BIRD's files and xvs's state live in the tier's temporary directory.
//!
//! Addresses: VIPs in 198.18.100.0/24 and 2001:2:0:100::/64 ([`WEB`], [`WEB6`]: full-NAT
//! rr; [`NAT`], [`NAT6`]: nat mh; [`SOLO`]: full-NAT, its only backend is backend 3); SNAT
//! addresses 198.18.3.N and 2001:2:0:3::N for node N; uplinks 198.18.2.1N, 2001:2:0:2::1N.

use std::io::{BufRead, BufReader, Read};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{COUNTER, is_ready_line, root, run};

/// The full-NAT rr service's VIP (HTTP on :80, backends 1-3 :8080).
pub const WEB: &str = "198.18.100.1";
/// Its IPv6 twin.
pub const WEB6: &str = "2001:2:0:100::1";
/// The nat-mode Maglev service's VIP.
pub const NAT: &str = "198.18.100.2";
/// Its IPv6 twin.
pub const NAT6: &str = "2001:2:0:100::2";
/// A full-NAT service whose only backend is backend 3.
pub const SOLO: &str = "198.18.100.3";

/// Node `n`'s uplink address (the router's BGP neighbour and next hop), IPv4.
pub fn uplink(n: usize) -> IpAddr {
    format!("198.18.2.1{n}").parse().unwrap()
}
/// Node `n`'s uplink address, IPv6.
pub fn uplink6(n: usize) -> IpAddr {
    format!("2001:2:0:2::1{n}").parse().unwrap()
}
/// Node `n`'s SNAT address, IPv4.
pub fn snat(n: usize) -> String {
    format!("198.18.3.{n}")
}
/// Node `n`'s SNAT address, IPv6.
pub fn snat6(n: usize) -> String {
    format!("2001:2:0:3::{n}")
}

/// How long a node's xvs may take to say it is ready.
const READY_MAX: Duration = Duration::from_secs(30);

/// One running xvs: the child and its log (stderr, collected by a thread).
struct Xvs {
    child: Child,
    log: Arc<Mutex<String>>,
}

/// The tier; removed on drop.
pub struct Tier {
    pub prefix: String,
    pub dir: tempfile::TempDir,
    xvs: [Option<Xvs>; 2],
    /// Backend servers started again by [`Tier::start_backend`].
    servers: Mutex<Vec<Child>>,
}

impl Tier {
    /// Builds the tier (`scripts/tier up`): namespaces, links, BIRD on the router and both
    /// nodes, backend servers. No xvs runs yet.
    pub fn up() -> Tier {
        let prefix = format!(
            "xt{}-{}",
            std::process::id() % 100000,
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let t = Tier {
            prefix,
            dir: tempfile::tempdir().unwrap(),
            xvs: [None, None],
            servers: Mutex::new(Vec::new()),
        };
        let o = run(Command::new(root().join("scripts/tier"))
            .args(["up", &t.prefix])
            .arg(t.dir.path()));
        assert!(
            o.status.success(),
            "tier up: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        // The client's receive buffer at most 256 KiB ahead, so a rate-limited download
        // stays on the wire while a test does things to the nodes (see common::Lab::up).
        let o = t.exec(
            "c",
            &["sysctl", "-qw", "net.ipv4.tcp_rmem=4096 65536 262144"],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // The sync key the nodes share (for [sync]).
        let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        let path = t.dir.path().join("sync.key");
        std::fs::write(&path, key).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        t
    }

    /// The namespace `which` (`c`, `r`, `s`, `n1`, `n2`, `b1`..`b3`).
    pub fn ns(&self, which: &str) -> String {
        format!("{}-{which}", self.prefix)
    }

    /// Runs a command in namespace `which`.
    pub fn exec(&self, which: &str, args: &[&str]) -> Output {
        run(Command::new("ip")
            .args(["netns", "exec", &self.ns(which)])
            .args(args))
    }

    /// Node `n`'s directory: BIRD's config, socket and log, xvs's config, state and socket.
    pub fn node_dir(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("n{n}"))
    }

    /// Node `n`'s xvs config: the services above, `[bgp]` with the router as neighbour (IPv4
    /// and IPv6 sessions, BFD: 3 × 100 ms, the router's own), `[sync]` with the other node
    /// as peer, TCP health probes every second.
    pub fn config(&self, n: usize) -> String {
        assert!(n == 1 || n == 2, "nodes are 1 and 2");
        let m = 3 - n;
        let dir = self.node_dir(n).display().to_string();
        let key = self.dir.path().join("sync.key").display().to_string();
        let backends = |port: u16, v6: bool, which: &[u8]| -> String {
            which
                .iter()
                .map(|b| {
                    if v6 {
                        format!("{{ addr = \"[2001:2:0:1::{b}]:{port}\" }}")
                    } else {
                        format!("{{ addr = \"198.18.1.{b}:{port}\" }}")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let all4 = backends(8080, false, &[1, 2, 3]);
        let all6 = backends(8080, true, &[1, 2, 3]);
        let solo = backends(8080, false, &[3]);
        format!(
            r#"[node]
name = "n{n}"
addresses = ["198.18.2.1{n}", "2001:2:0:2::1{n}"]

[dataplane]
interfaces = [{{ name = "up0", queues = 1 }}, {{ name = "dn0", queues = 1 }}]
cores = [1]
slowpath_core = 0
mode = "fullnat"
snat_addresses = ["{s4}", "{s6}"]
snat_port_range = "10000-29999"
batch_size = 64
idle_backoff = "1ms"
drain_timeout = "5s"
state_dir = "{dir}/state"
bpf_pin_root = "/run/xvs-bpf/xvs"

[flowtable]
capacity = 65536

[admin]
listen = "127.0.0.1:10249"
socket = "{dir}/xvs.sock"
enable_control = true

[health]
probe = "tcp"
interval = "1s"
timeout = "500ms"
rise = 1
fall = 2

[sync]
enable = true
listen = "198.18.2.1{n}:7946"
key_file = "{key}"
peers = [{{ address = "198.18.2.1{m}:7946", snat_addresses = ["{p4}", "{p6}"] }}]

[bgp]
enable = true
socket = "{dir}/bird.ctl"
include = "{dir}/bird-xvs.conf"
local_as = 65001
neighbors = [{{ address = "198.18.2.1", as = 65000 }}, {{ address = "2001:2:0:2::1", as = 65000 }}]
bfd_interval = "100ms"
bfd_multiplier = 3

[[services]]
name = "web"
vip = "{WEB}"
port = 80
protocol = "tcp"
scheduler = "rr"
backends = [{all4}]

[[services]]
name = "web6"
vip = "{WEB6}"
port = 80
protocol = "tcp"
scheduler = "rr"
backends = [{all6}]

[[services]]
name = "nat"
vip = "{NAT}"
port = 80
protocol = "tcp"
scheduler = "mh"
flags = ["mh-port"]
mode = "nat"
backends = [{all4}]

[[services]]
name = "nat6"
vip = "{NAT6}"
port = 80
protocol = "tcp"
scheduler = "mh"
flags = ["mh-port"]
mode = "nat"
backends = [{all6}]

[[services]]
name = "solo"
vip = "{SOLO}"
port = 80
protocol = "tcp"
scheduler = "rr"
backends = [{solo}]
"#,
            s4 = snat(n),
            s6 = snat6(n),
            p4 = snat(m),
            p6 = snat6(m),
        )
    }

    /// Starts node `n`'s xvs on `config` (TOML text) and waits until it is ready.
    pub fn start_with(&mut self, n: usize, config: &str) {
        self.stop(n);
        let path = self.node_dir(n).join("xvs.toml");
        std::fs::write(&path, config).unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns(&format!("n{n}"))])
            .args([env!("CARGO_BIN_EXE_xvs"), "run", "--config"])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start xvs");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if is_ready_line(&line) {
                    let _ = tx.send(());
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        if rx.recv_timeout(READY_MAX).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(100));
            panic!(
                "n{n}'s xvs did not become ready within {READY_MAX:?}:\n{}",
                log.lock().unwrap()
            );
        }
        self.xvs[n - 1] = Some(Xvs { child, log });
    }

    /// Starts node `n`'s xvs on [`Tier::config`].
    pub fn start(&mut self, n: usize) {
        let c = self.config(n);
        self.start_with(n, &c);
    }

    /// The node holding nat-mode return gateway `g` (VRRP, `scripts/tier`): 198.18.1.24g on
    /// its `dn0`; `None` when neither does.
    pub fn gateway_holder(&self, g: usize) -> Option<usize> {
        let addr = format!("inet 198.18.1.24{g}/");
        (1..=2).find(|&n| {
            let o = self.exec(
                &format!("n{n}"),
                &["ip", "-4", "addr", "show", "dev", "dn0"],
            );
            String::from_utf8_lossy(&o.stdout).contains(&addr)
        })
    }

    /// Waits (at most `timeout`) until each nat-mode return gateway is held by its own node
    /// when that node's xvs runs, else by the other when that one's does.
    pub fn wait_gateways(&self, timeout: Duration) -> Result<(), String> {
        let want = |g: usize| [g, 3 - g].into_iter().find(|&n| self.running(n));
        let t0 = Instant::now();
        loop {
            let have = [self.gateway_holder(1), self.gateway_holder(2)];
            if have == [want(1), want(2)] {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                return Err(format!(
                    "nat-mode return gateways held by {have:?} after {timeout:?}, want {:?}",
                    [want(1), want(2)]
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts both nodes and waits until the router has ECMP routes over both for every
    /// VIP of both families, and each node holds its nat-mode return gateway.
    pub fn start_all(&mut self) {
        self.start(1);
        self.start(2);
        if let Err(e) = self.wait_gateways(Duration::from_secs(10)) {
            panic!("{e}\n{}", self.debug());
        }
        let both4 = [uplink(1), uplink(2)];
        let both6 = [uplink6(1), uplink6(2)];
        for (vip, want) in [
            (WEB, &both4),
            (NAT, &both4),
            (SOLO, &both4),
            (WEB6, &both6),
            (NAT6, &both6),
        ] {
            if let Err(e) = self.wait_next_hops(vip, want, Duration::from_secs(30)) {
                panic!("{e}\n{}", self.debug());
            }
        }
    }

    /// Node `n`'s xvs log so far.
    pub fn log(&self, n: usize) -> String {
        self.xvs[n - 1]
            .as_ref()
            .map(|x| x.log.lock().unwrap().clone())
            .unwrap_or_default()
    }

    /// Stops node `n`'s xvs with SIGTERM (it drains for at most `drain_timeout`) and returns
    /// its stdout (the final counters); nothing when it does not run.
    pub fn stop(&mut self, n: usize) -> String {
        let Some(mut x) = self.xvs[n - 1].take() else {
            return String::new();
        };
        // `ip netns exec` execs xvs: the child is xvs itself.
        unsafe { libc::kill(x.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = x.child.try_wait() {
                assert!(
                    status.success(),
                    "n{n}'s xvs exited with {status}:\n{}",
                    x.log.lock().unwrap()
                );
                break;
            }
            if Instant::now() > deadline {
                let _ = x.child.kill();
                let _ = x.child.wait();
                panic!("n{n}'s xvs did not stop within 15 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut out = String::new();
        let _ = x.child.stdout.take().unwrap().read_to_string(&mut out);
        out
    }

    /// `kill -9` of node `n`'s xvs; returns the moment of the kill.
    pub fn kill(&mut self, n: usize) -> Instant {
        let mut x = self.xvs[n - 1].take().expect("xvs does not run");
        let t = Instant::now();
        x.child.kill().unwrap();
        x.child.wait().unwrap();
        t
    }

    /// Whether node `n`'s xvs runs (as far as this tier started it).
    pub fn running(&self, n: usize) -> bool {
        self.xvs[n - 1].is_some()
    }

    /// Takes node `n`'s uplink down or up where a link fails: at the switch port (the node
    /// sees its carrier go, as with a pulled cable or a dead switch port; its addresses and
    /// routes stay, as they do then). Returns when it was done.
    pub fn set_link(&self, n: usize, up: bool) -> Instant {
        let t = Instant::now();
        let o = run(Command::new("ip").args([
            "-n",
            &self.ns("s"),
            "link",
            "set",
            &format!("n{n}-up"),
            if up { "up" } else { "down" },
        ]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        t
    }

    /// Watches the router's kernel route to host `addr` from another thread (every few
    /// milliseconds, for at most `limit`) until [`RouteWatch::stop`].
    pub fn watch_route(&self, addr: &str, limit: Duration) -> RouteWatch {
        let (ns, addr) = (self.ns("r"), addr.to_owned());
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let (mut polls, mut seen) = (0, Vec::new());
            let t0 = Instant::now();
            while !flag.load(Ordering::SeqCst) && t0.elapsed() < limit {
                let hops = next_hops_in(&ns, &addr);
                polls += 1;
                if !hops.is_empty() {
                    seen.push((t0.elapsed(), hops));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (polls, seen)
        });
        RouteWatch { stop, thread }
    }

    /// The next hops of the router's kernel route to host `addr` (`/32` or `/128`), sorted;
    /// empty when it has none.
    pub fn next_hops(&self, addr: &str) -> Vec<IpAddr> {
        next_hops_in(&self.ns("r"), addr)
    }

    /// Waits (polling every 2 ms, at most `timeout`) until the router's next hops for `addr`
    /// are exactly `want` (in any order); returns how long it took.
    pub fn wait_next_hops(
        &self,
        addr: &str,
        want: &[IpAddr],
        timeout: Duration,
    ) -> Result<Duration, String> {
        let mut want = want.to_vec();
        want.sort();
        let t0 = Instant::now();
        let mut last = Vec::new();
        while t0.elapsed() < timeout {
            last = self.next_hops(addr);
            if last == want {
                return Ok(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Err(format!(
            "router's next hops for {addr}: {last:?} after {timeout:?}, want {want:?}"
        ))
    }

    /// `birdc`'s answer to `cmd` from the BIRD of `which` (`r`, `n1`, `n2`).
    pub fn birdc(&self, which: &str, cmd: &str) -> String {
        let sock = self.dir.path().join(which).join("bird.ctl");
        let o = run(Command::new("birdc")
            .arg("-s")
            .arg(&sock)
            .args(cmd.split_whitespace()));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `kill -9` of the BIRD of `which` (`r`, `n1`, `n2`), as a crash would.
    pub fn kill_bird(&self, which: &str) {
        let pidfile = self.dir.path().join(which).join("bird.pid");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("{}: {e}", pidfile.display()))
            .trim()
            .parse()
            .unwrap();
        unsafe { libc::kill(pid, libc::SIGKILL) };
        // Bounded: BIRD exits at once on SIGKILL.
        for _ in 0..200 {
            if unsafe { libc::kill(pid, 0) } != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_file(pidfile);
        let _ = std::fs::remove_file(self.dir.path().join(which).join("bird.ctl"));
    }

    /// Starts the BIRD of `which` again (as `scripts/tier up` did).
    pub fn start_bird(&self, which: &str) {
        let d = self.dir.path().join(which);
        let o = self.exec(
            which,
            &[
                "bird",
                "-c",
                d.join("bird.conf").to_str().unwrap(),
                "-s",
                d.join("bird.ctl").to_str().unwrap(),
                "-P",
                d.join("bird.pid").to_str().unwrap(),
            ],
        );
        assert!(
            o.status.success(),
            "bird: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// What to print when a tier assertion fails: BIRD's views and the nodes' logs.
    pub fn debug(&self) -> String {
        let mut s = String::new();
        for which in ["r", "n1", "n2"] {
            s += &format!(
                "--- BIRD {which}: protocols\n{}",
                self.birdc(which, "show protocols")
            );
            s += &format!(
                "--- BIRD {which}: routes\n{}",
                self.birdc(which, "show route")
            );
        }
        let routes = self.exec("r", &["ip", "route"]);
        s += &format!(
            "--- router kernel routes\n{}",
            String::from_utf8_lossy(&routes.stdout)
        );
        for n in 1..=2 {
            let read =
                |f: &str| std::fs::read_to_string(self.node_dir(n).join(f)).unwrap_or_default();
            s += &format!(
                "--- n{n} bird-xvs.conf\n{}--- n{n} keepalived log\n{}--- n{n} xvs log\n{}",
                read("bird-xvs.conf"),
                read("keepalived.log"),
                self.log(n)
            );
        }
        s
    }

    /// `curl` from the client; the body, or panics with curl's error.
    pub fn curl(&self, url: &str) -> Vec<u8> {
        let o = self.exec(
            "c",
            &[
                "curl",
                "-sS",
                "--fail",
                "--max-time",
                "10",
                "--retry",
                "0",
                url,
            ],
        );
        assert!(
            o.status.success(),
            "curl {url}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    }

    /// Node `n`'s admin API: GETs from `[admin] listen`, POSTs (control) through the control
    /// socket. Returns (HTTP code, body).
    pub fn admin(&self, n: usize, method: &str, path: &str) -> (String, String) {
        let sock = self.node_dir(n).join("xvs.sock");
        super::admin_via(
            |args| self.exec(&format!("n{n}"), args),
            &sock,
            method,
            path,
        )
    }

    /// Node `n`'s `/v1/stats`.
    pub fn stats(&self, n: usize) -> serde_json::Value {
        let (code, body) = self.admin(n, "GET", "/v1/stats");
        assert_eq!(code, "200", "n{n} /v1/stats: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// New flows node `n`'s workers created so far.
    pub fn new_flows(&self, n: usize) -> u64 {
        self.stats(n)["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["new_flows"].as_u64().unwrap_or(0))
            .sum()
    }

    /// Kills every process of backend `b` (its HTTP and UDP servers).
    pub fn stop_backend(&self, b: usize) {
        let ns = self.ns(&format!("b{b}"));
        let pids = run(Command::new("ip").args(["netns", "pids", &ns]));
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let _ = Command::new("kill").arg(pid).stderr(Stdio::null()).status();
        }
    }

    /// Starts backend `b`'s servers again and waits until HTTP answers.
    pub fn start_backend(&self, b: usize) {
        let ns = self.ns(&format!("b{b}"));
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, "python3"])
            .arg(root().join("scripts/lab-backend.py"))
            .arg(format!("backend-{b}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.servers.lock().unwrap().push(child);
        let probe =
            format!("import socket;socket.create_connection(('198.18.1.{b}',8080),0.2).close()");
        for _ in 0..50 {
            if self
                .exec(&format!("b{b}"), &["python3", "-c", &probe])
                .status
                .success()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("backend {b} does not answer");
    }
}

/// The next hops of the kernel route to host `addr` in namespace `ns`, sorted.
fn next_hops_in(ns: &str, addr: &str) -> Vec<IpAddr> {
    let ip: IpAddr = addr.parse().unwrap();
    let (fam, plen) = if ip.is_ipv6() {
        ("-6", 128)
    } else {
        ("-4", 32)
    };
    let o = run(Command::new("ip").args([
        "-n",
        ns,
        fam,
        "-j",
        "route",
        "show",
        &format!("{addr}/{plen}"),
    ]));
    let routes: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    let mut hops: Vec<IpAddr> = Vec::new();
    for r in routes.as_array().into_iter().flatten() {
        if let Some(g) = r["gateway"].as_str() {
            hops.push(g.parse().unwrap());
        }
        for h in r["nexthops"].as_array().into_iter().flatten() {
            if let Some(g) = h["gateway"].as_str() {
                hops.push(g.parse().unwrap());
            }
        }
    }
    hops.sort();
    hops
}

/// What a [`RouteWatch`] saw: how many times it looked, and when (since the watch began)
/// it saw which next hops.
pub type Sightings = (usize, Vec<(Duration, Vec<IpAddr>)>);

/// A route watch of [`Tier::watch_route`].
pub struct RouteWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Sightings>,
}

impl RouteWatch {
    /// Ends the watch.
    pub fn stop(self) -> Sightings {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        for x in self.xvs.iter_mut().flatten() {
            let _ = x.child.kill();
            let _ = x.child.wait();
        }
        let _ = Command::new(root().join("scripts/tier"))
            .args(["down", &self.prefix])
            .output();
        // Killed by `down` with everything else in the namespaces: reap them.
        for c in self.servers.get_mut().unwrap().iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
