//! Flow sync cannot be forged, end to end, as root: two `xvs run` nodes sync their flows
//! over one wire (`scripts/sync-lab`), and a third process on the wire
//! (`tests/assets/sync-forger.py`, AF_PACKET sockets on the bridge's ports) captures their
//! real datagrams and sends them again:
//!
//! - (a) back to their sender at once, as if their receiver had sent them (reflected while
//!   they are the newest datagrams on the wire: a window of sequences alone takes them);
//! - (b) to their receiver after it restarted, before it heard anything of its peer again
//!   (the wire drops the peer's datagrams meanwhile: a window that lived in memory is gone);
//! - (c) to their receiver after their sender restarted.
//!
//! Nothing of it may install or update a flow; each datagram is refused and counted by its
//! reason (`/v1/stats` `peer_sync`); genuine sync goes on both ways. The captured flows are
//! UDP flows that time out (2 s) before (b) and (c), so a datagram taken would install a
//! flow that exists nowhere (a forged flow: `/v1/flows` would show it).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{COUNTER, SERIAL, admin_via, is_ready_line, root, run};

const N: [&str; 2] = ["198.18.2.11", "198.18.2.12"];
/// The VIP whose traffic the wire routes to node `n` (index `n - 1`).
const VIP: [&str; 2] = ["198.18.100.1", "198.18.100.2"];
/// The client's (and backend's) address, on the wire.
const CLIENT: &str = "198.18.2.100";
/// How long anything the test waits for may take (polled; not a timed assertion).
const WAIT: Duration = Duration::from_secs(20);

/// One running xvs and its log.
struct Xvs {
    child: Child,
    log: Arc<Mutex<String>>,
}

/// The lab; removed on drop (failed tests included).
struct SyncLab {
    prefix: String,
    dir: tempfile::TempDir,
    xvs: [Option<Xvs>; 2],
}

/// What the forger says it captured or sent: the count by flow-sync kind.
#[derive(Debug, Default)]
struct Frames {
    total: u64,
    /// (kind, count).
    kinds: Vec<(u8, u64)>,
}

impl Frames {
    /// From a line "captured|sent N kinds K:N,...".
    fn parse(line: &str) -> Frames {
        let mut w = line.split_whitespace();
        let _verb = w.next();
        let total = w.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let kinds = w
            .nth(1)
            .unwrap_or("")
            .split(',')
            .filter_map(|kv| {
                let (k, n) = kv.split_once(':')?;
                Some((k.parse().ok()?, n.parse().ok()?))
            })
            .collect();
        Frames { total, kinds }
    }

    fn kind(&self, k: u8) -> u64 {
        self.kinds.iter().find(|(x, _)| *x == k).map_or(0, |x| x.1)
    }
}

const KIND_FLOWS: u8 = 1;
const KIND_HELLO: u8 = 5;

impl SyncLab {
    fn up() -> SyncLab {
        let prefix = format!(
            "xs{}-{}",
            std::process::id() % 100000,
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let lab = SyncLab {
            prefix,
            dir: tempfile::tempdir().unwrap(),
            xvs: [None, None],
        };
        let o = run(Command::new(root().join("scripts/sync-lab")).args(["up", &lab.prefix]));
        assert!(
            o.status.success(),
            "sync-lab up: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(29) ^ 0xa5).collect();
        std::fs::write(lab.dir.path().join("sync.key"), key).unwrap();
        lab
    }

    fn ns(&self, which: &str) -> String {
        format!("{}-{which}", self.prefix)
    }

    fn node_dir(&self, n: usize) -> PathBuf {
        let d = self.dir.path().join(format!("n{n}"));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Node `n`'s config: one interface on the wire, a UDP service on each VIP (backend:
    /// the wire's echo server), UDP flows ending after 2 s idle, `[sync]` with the other
    /// node as peer (refreshes rare enough not to happen during the test).
    fn config(&self, n: usize) -> String {
        let m = 3 - n;
        let dir = self.node_dir(n).display().to_string();
        let key = self.dir.path().join("sync.key").display().to_string();
        let services: String = VIP
            .iter()
            .enumerate()
            .map(|(i, vip)| {
                format!(
                    "[[services]]\nname = \"echo{i}\"\nvip = \"{vip}\"\nport = 9000\nprotocol = \"udp\"\nscheduler = \"rr\"\nbackends = [{{ addr = \"{CLIENT}:9000\" }}]\n\n"
                )
            })
            .collect();
        format!(
            r#"[node]
name = "n{n}"
addresses = ["{me}"]

[dataplane]
interfaces = [{{ name = "eth0", queues = 1 }}]
cores = [1]
slowpath_core = 0
mode = "fullnat"
snat_addresses = ["198.18.3.{n}"]
snat_port_range = "10000-29999"
batch_size = 64
idle_backoff = "1ms"
drain_timeout = "0s"
state_dir = "{dir}/state"
bpf_pin_root = "/run/xvs-bpf/xvs"

[flowtable]
capacity = 4096

[timeouts]
udp = "2s"

[admin]
listen = "127.0.0.1:10249"
socket = "{dir}/xvs.sock"

[sync]
enable = true
listen = "{me}:7946"
key_file = "{key}"
refresh = "600s"
peers = [{{ address = "{peer}:7946", snat_addresses = ["198.18.3.{m}"] }}]

[[neighbours]]
ip = "{CLIENT}"
mac = "02:00:00:00:02:64"

{services}"#,
            me = N[n - 1],
            peer = N[m - 1],
        )
    }

    /// Starts node `n`'s xvs and waits until it says it is ready.
    fn start(&mut self, n: usize) {
        let path = self.node_dir(n).join("xvs.toml");
        std::fs::write(&path, self.config(n)).unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns(&format!("n{n}"))])
            .args([env!("CARGO_BIN_EXE_xvs"), "run", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
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
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("n{n}'s xvs not ready:\n{}", log.lock().unwrap());
        }
        self.xvs[n - 1] = Some(Xvs { child, log });
    }

    /// `kill -9` of node `n`'s xvs.
    fn kill(&mut self, n: usize) {
        let mut x = self.xvs[n - 1].take().expect("xvs runs");
        x.child.kill().unwrap();
        x.child.wait().unwrap();
    }

    fn logs(&self) -> String {
        (1..=2)
            .map(|n| {
                let l = self.xvs[n - 1]
                    .as_ref()
                    .map(|x| x.log.lock().unwrap().clone())
                    .unwrap_or_default();
                format!("--- n{n}'s xvs log\n{l}")
            })
            .collect()
    }

    /// GET `path` of node `n`'s admin API.
    fn get(&self, n: usize, path: &str) -> serde_json::Value {
        let sock = self.node_dir(n).join("xvs.sock");
        let ns = self.ns(&format!("n{n}"));
        let (code, body) = admin_via(
            |args| run(Command::new("ip").args(["netns", "exec", &ns]).args(args)),
            &sock,
            "GET",
            path,
        );
        assert_eq!(code, "200", "n{n} {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Node `n`'s `peer_sync` of `/v1/stats`.
    fn sync(&self, n: usize) -> serde_json::Value {
        self.get(n, "/v1/stats")["peer_sync"].clone()
    }

    /// Polls `ok` on node `n`'s `peer_sync` until it holds, or fails with both logs.
    fn wait_sync(&self, n: usize, what: &str, ok: impl Fn(&serde_json::Value) -> bool) {
        let t0 = Instant::now();
        loop {
            let s = self.sync(n);
            if ok(&s) {
                return;
            }
            if t0.elapsed() > WAIT {
                panic!("n{n}: {what}: not within {WAIT:?}: {s}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until node `n` took its peer's dump since its start and hears it.
    fn wait_synced(&self, n: usize) {
        self.wait_sync(n, "the peer's dump in, the peer up", |s| {
            s["ready"] == true && s["dumps_received"].as_u64() >= Some(1) && s["peers_up"] == 1
        });
    }

    /// The client ports of node `n`'s flows to `vip`:9000.
    fn flow_ports(&self, n: usize, vip: &str) -> Vec<u16> {
        let r = self.get(n, &format!("/v1/flows?vip={vip}:9000"));
        r["flows"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["client"].as_str()?.parse::<std::net::SocketAddr>().ok())
            .map(|a| a.port())
            .collect()
    }

    /// Waits until each of `ports` is among node `n`'s flows to `vip` (`present`), or none.
    fn wait_flows(&self, n: usize, vip: &str, ports: &[u16], present: bool) {
        let t0 = Instant::now();
        loop {
            let have = self.flow_ports(n, vip);
            if ports.iter().all(|p| have.contains(p) == present) {
                return;
            }
            if t0.elapsed() > WAIT {
                panic!(
                    "n{n}: flows of {vip} from ports {ports:?} present={present}: have {have:?}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A UDP request from the client's `port` to the VIP the wire routes to node `n`; the
    /// echo comes back through xvs.
    fn udp_via(&self, n: usize, port: u16) {
        let vip = VIP[n - 1];
        let script = format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('{CLIENT}',{port}))\ns.settimeout(3)\ns.sendto(b'hi',('{vip}',9000))\nprint(s.recvfrom(2048)[0].decode())"
        );
        let o = run(Command::new("ip")
            .args(["netns", "exec", &self.ns("w"), "python3", "-c", &script])
            .stdin(Stdio::null()));
        assert!(
            o.status.success(),
            "udp from :{port} to {vip}: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            self.logs()
        );
    }

    fn forger(&self) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns("w"), "python3"])
            .arg(root().join("tests/assets/sync-forger.py"));
        c
    }

    /// Starts capturing, on the wire's port `iface`, node `from`'s datagrams to node `to`
    /// for `seconds`, into `out`; returns once the forger listens.
    /// With `reflect`, each is also sent back to its sender at once.
    fn capture(
        &self,
        iface: &str,
        (from, to): (usize, usize),
        out: &Path,
        seconds: f64,
        reflect: bool,
    ) -> Child {
        let mut c = self
            .forger()
            .args(["capture", iface, N[from - 1], N[to - 1]])
            .arg(out)
            .arg(seconds.to_string())
            .args(reflect.then_some("reflect"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "forger: {line}");
        c
    }

    /// Makes the wire drop what node `from` sends node `to` (`drop`), or stop dropping it
    /// (frames the forger sends out of a port directly are not bridged: not dropped).
    fn cut(&self, (from, to): (usize, usize), drop: bool) {
        let rules = if drop {
            format!(
                "table bridge xvs_cut {{ chain cut {{ type filter hook forward priority 0; ether saddr 02:00:00:00:02:1{from} ether daddr 02:00:00:00:02:1{to} drop; }}; }}\n"
            )
        } else {
            "delete table bridge xvs_cut\n".to_owned()
        };
        let mut c = Command::new("ip")
            .args(["netns", "exec", &self.ns("w"), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        c.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
        let o = c.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "nft: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Sends every frame of `frames` out of the wire's port `iface`, `mode` "as-is" or
    /// "reflect".
    fn send(&self, iface: &str, frames: &Path, mode: &str) -> Frames {
        let o = run(self.forger().args(["send", iface]).arg(frames).arg(mode));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Frames::parse(String::from_utf8_lossy(&o.stdout).trim())
    }
}

/// What the forger captured, once it ends.
fn captured(c: Child) -> Frames {
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    Frames::parse(out.lines().last().unwrap_or(""))
}

impl Drop for SyncLab {
    fn drop(&mut self) {
        for x in self.xvs.iter_mut().flatten() {
            let _ = x.child.kill();
            let _ = x.child.wait();
        }
        let _ = Command::new(root().join("scripts/sync-lab"))
            .args(["down", &self.prefix])
            .output();
    }
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Everything `s` (a `peer_sync`) says was done with peers' flows: installed, updated,
/// removed, refused by reason.
fn taken(s: &serde_json::Value) -> Vec<u64> {
    let mut v = vec![
        u(&s["flows_installed"]),
        u(&s["flows_updated"]),
        u(&s["flows_removed"]),
    ];
    let refused = s["flows_refused"].as_object().unwrap();
    v.extend(refused.values().map(u));
    v
}

fn rejected(s: &serde_json::Value, reason: &str) -> u64 {
    u(&s["messages_rejected"][reason])
}

/// Captures node 1's datagrams to node 2 (reflecting each to node 1 at once with
/// `reflect`) while the client opens flows from `ports` through node 1; waits until node 2
/// has them, then until they have timed out on both.
fn capture_flows(lab: &SyncLab, name: &str, ports: &[u16], reflect: bool) -> (PathBuf, Frames) {
    let path = lab.dir.path().join(name);
    let c = lab.capture("p1", (1, 2), &path, 4.0, reflect);
    for &p in ports {
        lab.udp_via(1, p);
    }
    lab.wait_flows(2, VIP[0], ports, true);
    let frames = captured(c);
    assert!(
        frames.kind(KIND_FLOWS) >= 1 && frames.kind(KIND_HELLO) >= 1,
        "captured {frames:?}"
    );
    lab.wait_flows(1, VIP[0], ports, false);
    lab.wait_flows(2, VIP[0], ports, false);
    (path, frames)
}

#[test]
fn sync_datagrams_reflected_or_replayed_across_restarts_are_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = SyncLab::up();
    lab.start(1);
    lab.start(2);
    lab.wait_synced(2);
    lab.wait_sync(1, "the peer up", |s| s["peers_up"] == 1);

    // (a) Genuine sync (n1's flows reach n2), each datagram also reflected to n1 at once.
    let before = lab.sync(1);
    let ports = [41001, 41002, 41003];
    let (first, sent) = capture_flows(&lab, "first.frames", &ports, true);
    let want = rejected(&before, "reflected") + sent.total;
    lab.wait_sync(1, "reflections refused", |s| {
        rejected(s, "reflected") >= want
    });
    let after = lab.sync(1);
    println!(
        "(a) reflected to n1: {sent:?}; n1 rejected {}",
        after["messages_rejected"]
    );
    assert_eq!(rejected(&after, "reflected"), want, "{after}");
    assert_eq!(taken(&after), taken(&before), "n1 took nothing: {after}");
    assert_eq!(
        lab.flow_ports(1, VIP[0]),
        Vec::<u16>::new(),
        "no forged flow on n1"
    );

    // (b) n2 restarts; before it hears n1 again, the datagrams it took are sent to it again.
    lab.kill(2);
    lab.cut((1, 2), true);
    lab.start(2);
    let before = lab.sync(2);
    let sent = lab.send("p2", &first, "as-is");
    // They present the old process's ticket: refused. (Hellos are not refused: they teach
    // n1's session and ticket, which is all a hello does.)
    let refused = sent.total - sent.kind(KIND_HELLO);
    let want = rejected(&before, "stale_session") + refused;
    lab.wait_sync(2, "replays after its restart refused", |s| {
        rejected(s, "stale_session") >= want
    });
    let after = lab.sync(2);
    println!(
        "(b) replayed to the restarted n2: {sent:?}; n2 rejected {}",
        after["messages_rejected"]
    );
    assert_eq!(rejected(&after, "stale_session"), want, "{after}");
    let total = |s: &serde_json::Value| {
        s["messages_rejected"]
            .as_object()
            .unwrap()
            .values()
            .map(u)
            .sum::<u64>()
    };
    assert_eq!(total(&after), total(&before) + refused, "{after}");
    assert_eq!(taken(&after), taken(&before), "n2 took nothing: {after}");
    assert_eq!(
        lab.flow_ports(2, VIP[0]),
        Vec::<u16>::new(),
        "no forged flow on n2"
    );
    // n1 heard again: the two talk, n2 gets n1's dump; still no forged flow.
    lab.cut((1, 2), false);
    lab.wait_synced(2);
    assert_eq!(lab.flow_ports(2, VIP[0]), Vec::<u16>::new());

    // (c) Captured again (n2's new process), then n1 restarts; sent to n2 again.
    let ports = [41011, 41012, 41013];
    let (second, _) = capture_flows(&lab, "second.frames", &ports, false);
    lab.kill(1);
    lab.start(1);
    lab.wait_synced(1);
    let before = lab.sync(2);
    let sent = lab.send("p2", &second, "as-is");
    // A session of n1 older than the one n2 follows now.
    let want = rejected(&before, "stale_session") + sent.total;
    lab.wait_sync(2, "the old session's datagrams refused", |s| {
        rejected(s, "stale_session") >= want
    });
    let after = lab.sync(2);
    println!(
        "(c) replayed to n2 after n1 restarted: {sent:?}; n2 rejected {}",
        after["messages_rejected"]
    );
    assert_eq!(rejected(&after, "stale_session"), want, "{after}");
    assert_eq!(taken(&after), taken(&before), "n2 took nothing: {after}");
    assert_eq!(
        lab.flow_ports(2, VIP[0]),
        Vec::<u16>::new(),
        "no forged flow on n2"
    );

    // Genuine sync goes on, both ways.
    lab.udp_via(1, 41021);
    lab.wait_flows(2, VIP[0], &[41021], true);
    lab.udp_via(2, 41022);
    lab.wait_flows(1, VIP[1], &[41022], true);
    for n in 1..=2 {
        let s = lab.sync(n);
        for r in [
            "auth",
            "malformed",
            "version",
            "unknown_peer",
            "wrong_sender",
            "wrong_receiver",
        ] {
            assert_eq!(rejected(&s, r), 0, "n{n} {r}: {s}");
        }
    }
}
