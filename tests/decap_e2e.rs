//! `xvs decap` end to end, needs root: `cargo test -p xvs --test decap_e2e`. Addresses:
//! 198.18.0.0/15 and 2001:2::/48 only, in namespaces the tests create and always remove.
//!
//! The command's lifecycle (attach, re-attach in place, a changed VIP set, `--detach`,
//! `--wait` ended by SIGTERM, a missing interface) on a veth pair between two namespaces:
//! `n`, standing for the xvs node and the client, and `b`, a backend running a UDP echo on
//! the VIPs' port 9053 behind the real `xvs decap`, which translates the service port 53 to
//! it. `tests/assets/dsr-send.py` in `n` sends one UDP request from the client's address as
//! an xvs node in DSR mode delivers it (IPIP, GUE, or plain for L2) and prints the reply the
//! backend sends straight back.
//!
//! Direct server return with real TCP clients in the DSR lab (`tests/common/dsr.rs`): curl
//! and 32 MiB downloads per VIP behind `xvs decap` (80 -> 8080) and behind kernel decap,
//! the replies bypassing the node, which is `xvs run` with DSR services, or
//! `tests/assets/dsr-relay.py` standing in for another load balancer's encapsulation.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

const BACKEND_MAC: &str = "02:00:00:00:01:01";
const BPFFS: &str = "/run/xvs-bpf";

/// The backend's UDP echo on VIP:9053, both families, answering `backend-1 <request>`.
const UDP_ECHO: &str = "
import socket, threading
def serve(fam, level, freebind, addr):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.setsockopt(level, freebind, 1)
    s.bind((addr, 9053))
    while True:
        d, p = s.recvfrom(2048)
        s.sendto(b'backend-1 ' + d, p)
threading.Thread(target=serve, args=(socket.AF_INET, 0, 15, '198.18.100.1'), daemon=True).start()
serve(socket.AF_INET6, 41, 78, '2001:2:0:100::1')
";

/// The two namespaces, the backend server and the decap pins; removed on drop.
struct Net {
    n: String,
    b: String,
    pins: PathBuf,
    servers: Vec<Child>,
}

fn sh(args: &[&str]) -> Output {
    let o = common::run(Command::new(args[0]).args(&args[1..]));
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

impl Net {
    fn up() -> Net {
        let id = format!(
            "xdc{}-{}",
            std::process::id() % 100000,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut net = Net {
            n: format!("{id}-n"),
            b: format!("{id}-b"),
            pins: PathBuf::from(BPFFS).join(&id),
            servers: Vec::new(),
        };
        if Command::new("mountpoint")
            .args(["-q", BPFFS])
            .status()
            .is_ok_and(|s| !s.success())
        {
            std::fs::create_dir_all(BPFFS).unwrap();
            sh(&["mount", "-t", "bpf", "bpf", BPFFS]);
        }
        sh(&["ip", "netns", "add", &net.n]);
        sh(&["ip", "netns", "add", &net.b]);
        sh(&[
            "ip", "link", "add", "n0", "netns", &net.n, "type", "veth", "peer", "name", "b0",
            "netns", &net.b,
        ]);
        for cmd in [
            "link set lo up",
            "link set n0 address 02:00:00:00:01:fe",
            "addr add 198.18.1.254/24 dev n0",
            "addr add 2001:2:0:1::fe/64 dev n0 nodad",
            // The client's addresses: replies come back here, straight from the backend.
            "addr add 198.18.0.2/32 dev lo",
            "addr add 2001:2::2/128 dev lo",
            "link set n0 up",
        ] {
            net.ip(&net.n, cmd);
        }
        for cmd in [
            "link set lo up",
            "link set b0 address 02:00:00:00:01:01",
            "addr add 198.18.1.1/24 dev b0",
            "addr add 2001:2:0:1::1/64 dev b0 nodad",
            "link set b0 up",
            "route add 198.18.0.0/24 via 198.18.1.254",
            "-6 route add 2001:2::/64 via 2001:2:0:1::fe",
            // The first reply must not wait for neighbour discovery (while b0's link-local
            // address is still tentative it can be slow): the node's MAC is known.
            "neigh replace 198.18.1.254 lladdr 02:00:00:00:01:fe dev b0 nud permanent",
            "-6 neigh replace 2001:2:0:1::fe lladdr 02:00:00:00:01:fe dev b0 nud permanent",
        ] {
            net.ip(&net.b, cmd);
        }
        // A UDP echo bound to the VIPs (a socket bound to the wildcard would answer from the
        // backend's own address: DSR UDP servers bind the VIP or use IP_PKTINFO). FREEBIND:
        // the VIPs are not local until xvs decap puts them on lo.
        let echo = Command::new("ip")
            .args(["netns", "exec", &net.b, "python3", "-c", UDP_ECHO])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        net.servers.push(echo);
        net.wait_for_backend();
        net
    }

    fn ip(&self, ns: &str, cmd: &str) {
        let mut args = vec!["ip", "-n", ns];
        args.extend(cmd.split(' '));
        sh(&args);
    }

    fn exec(&self, ns: &str, args: &[&str]) -> Output {
        common::run(Command::new("ip").args(["netns", "exec", ns]).args(args))
    }

    /// Until both UDP echo sockets are bound (10 s at most).
    fn wait_for_backend(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let o = self.exec(&self.b, &["ss", "-Hlun", "sport = :9053"]);
            if String::from_utf8_lossy(&o.stdout).lines().count() >= 2 {
                return;
            }
            assert!(Instant::now() < deadline, "the UDP echo did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `xvs decap ARGS --pin-root <ours>` in the backend.
    fn decap(&self, args: &[&str]) -> Output {
        let pins = self.pins.display().to_string();
        let mut all = vec![env!("CARGO_BIN_EXE_xvs"), "decap"];
        all.extend_from_slice(args);
        all.extend(["--pin-root", &pins]);
        self.exec(&self.b, &all)
    }

    /// `xvs decap --status` as `key=value` lines.
    fn status(&self) -> Vec<(String, String)> {
        let o = self.decap(&["--status"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn counter(&self, name: &str) -> u64 {
        let s = self.status();
        let v = s.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        v.unwrap_or_else(|| panic!("no {name} in {s:?}"))
            .parse()
            .unwrap()
    }

    /// One request through `dsr-send.py` from the client; the line it printed.
    fn request(&self, encap: &str, v6: bool, client_port: u16, payload: &str) -> String {
        let (osrc, odst, client, vip) = if v6 {
            (
                "2001:2:0:1::fe",
                "2001:2:0:1::1",
                "2001:2::2",
                "2001:2:0:100::1",
            )
        } else {
            ("198.18.1.254", "198.18.1.1", "198.18.0.2", "198.18.100.1")
        };
        let port = client_port.to_string();
        let script = common::root().join("tests/assets/dsr-send.py");
        let o = self.exec(
            &self.n,
            &[
                "python3",
                script.to_str().unwrap(),
                "n0",
                BACKEND_MAC,
                encap,
                osrc,
                odst,
                client,
                &port,
                vip,
                "53",
                payload,
                "6080",
                "2",
            ],
        );
        assert!(
            o.status.success(),
            "dsr-send.py: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap().trim().to_owned()
    }

    fn lo_addrs(&self) -> String {
        String::from_utf8(
            self.exec(&self.b, &["ip", "addr", "show", "dev", "lo"])
                .stdout,
        )
        .unwrap()
    }

    fn xdp_on_b0(&self) -> bool {
        let o = self.exec(&self.b, &["ip", "link", "show", "dev", "b0"]);
        String::from_utf8_lossy(&o.stdout).contains("xvs_decap")
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for child in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in [&self.b, &self.n] {
            let pids = Command::new("ip").args(["netns", "pids", ns]).output();
            if let Ok(o) = pids {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.pins);
        for ns in [&self.b, &self.n] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

const VIPS: [&str; 6] = [
    "--vip",
    "198.18.100.1:53=9053/udp",
    "--vip",
    "[2001:2:0:100::1]:53=9053/udp",
    "--interface",
    "b0",
];

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "xvs decap failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Every encapsulation and family reaches the backend's socket on port 9053 through the
/// VIP's port 53 (translated to 9053), and the reply comes back to the client from VIP:53; the counters say each
/// took the decap and translation paths. Then the same command again updates in place,
/// fewer VIPs take the other off, and `--detach` leaves nothing behind.
#[test]
fn decap_translates_each_encapsulation_then_updates_and_detaches() {
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::up();
    let mut args = VIPS.to_vec();
    args.push("--vips-on-lo");
    let out = stdout(&net.decap(&args));
    assert!(
        out.contains("attached interface=b0 xdp=native egress=yes"),
        "{out}"
    );
    assert!(out.contains("vip=198.18.100.1 lo=added"), "{out}");
    assert!(net.xdp_on_b0());

    let mut port = 40000;
    for v6 in [false, true] {
        let vip = if v6 {
            "2001:2:0:100::1"
        } else {
            "198.18.100.1"
        };
        for encap in ["ipip", "gue", "plain"] {
            port += 1;
            let reply = net.request(encap, v6, port, encap);
            assert_eq!(
                reply,
                format!("REPLY {vip} 53 backend-1 {encap}"),
                "{encap} v6={v6}"
            );
        }
    }
    assert_eq!(net.counter("decap_ipip"), 2);
    assert_eq!(net.counter("decap_gue"), 2);
    assert!(net.counter("in_translated") >= 6);
    assert!(net.counter("out_translated") >= 6);
    assert_eq!(net.counter("error") + net.counter("out_error"), 0);

    // Again, unchanged: the link is kept, its program (and fresh counters) replaced.
    let out = stdout(&net.decap(&args));
    assert!(
        out.contains("attached interface=b0 xdp=updated egress=yes"),
        "{out}"
    );
    assert!(out.contains("vip=198.18.100.1 lo=present"), "{out}");
    assert_eq!(net.counter("decap_ipip"), 0);
    assert_eq!(
        net.request("ipip", false, 41000, "again"),
        "REPLY 198.18.100.1 53 backend-1 again"
    );
    assert_eq!(net.counter("decap_ipip"), 1);

    // Without the IPv6 VIP: it leaves lo and is no longer decapsulated.
    let out = stdout(&net.decap(&[
        "--vip",
        "198.18.100.1:53=9053/udp",
        "--interface",
        "b0",
        "--vips-on-lo",
    ]));
    assert!(out.contains("vip=2001:2:0:100::1 lo=removed"), "{out}");
    assert!(!net.lo_addrs().contains("2001:2:0:100::1"));
    assert_eq!(net.request("ipip", true, 41001, "gone"), "TIMEOUT");
    assert_eq!(net.counter("pass_not_vip"), 1);
    assert_eq!(
        net.request("gue", false, 41002, "kept"),
        "REPLY 198.18.100.1 53 backend-1 kept"
    );

    let out = stdout(&net.decap(&["--detach"]));
    assert!(out.contains("detached interface=b0"), "{out}");
    assert!(out.contains("vip=198.18.100.1 lo=removed"), "{out}");
    assert!(!net.xdp_on_b0());
    assert!(!net.lo_addrs().contains("198.18.100.1"));
    assert_eq!(
        std::fs::read_dir(&net.pins).unwrap().count(),
        0,
        "no pins left"
    );
    assert_eq!(net.status(), [("attached".to_owned(), "0".to_owned())]);
    assert_eq!(net.request("ipip", false, 41003, "detached"), "TIMEOUT");
    // Idempotent.
    assert!(net.decap(&["--detach"]).status.success());
}

/// `--wait` keeps the programs attached until SIGTERM, which detaches them and exits 0.
#[test]
fn wait_detaches_on_sigterm() {
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::up();
    let pins = net.pins.display().to_string();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &net.b, env!("CARGO_BIN_EXE_xvs"), "decap"])
        .args(VIPS)
        .args(["--vips-on-lo", "--wait", "--pin-root", &pins])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Attached, and (after that) the VIPs on lo.
    while net.counter_or_zero("attached") == 0 || !net.lo_addrs().contains("2001:2:0:100::1") {
        assert!(Instant::now() < deadline, "xvs decap --wait did not attach");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        net.request("gue", true, 42000, "waiting"),
        "REPLY 2001:2:0:100::1 53 backend-1 waiting"
    );
    // `ip netns exec` execs xvs: the child is xvs itself.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "xvs decap did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert!(!net.xdp_on_b0());
    assert!(!net.lo_addrs().contains("198.18.100.1"));
    assert_eq!(net.status(), [("attached".to_owned(), "0".to_owned())]);
}

impl Net {
    fn counter_or_zero(&self, name: &str) -> u64 {
        self.status()
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    }
}

/// A missing interface among good ones: exit 1 with one line naming it, and nothing changed:
/// no program on the good interface, no pins, no VIP on `lo`.
#[test]
fn a_missing_interface_changes_nothing() {
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::up();
    let o = net.decap(&[
        "--interface",
        "b0",
        "--interface",
        "nosuch0",
        "--vip",
        "198.18.100.1:80=8080",
        "--vips-on-lo",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("xvs decap: interface nosuch0 not found"),
        "{err}"
    );
    assert!(!net.xdp_on_b0());
    assert!(!net.lo_addrs().contains("198.18.100.1"));
    let left = std::fs::read_dir(&net.pins).map_or(0, |d| d.count());
    assert_eq!(left, 0, "no pins");
    assert_eq!(net.status(), [("attached".to_owned(), "0".to_owned())]);
}

/// One VIP of the DSR lab: the backend side that serves it and how the node delivers to it.
struct Case {
    vip: &'static str,
    encap: &'static str,
    /// 1: kernel decap, HTTP on :80; 2: `xvs decap` translating 80 to the HTTP on :8080.
    backend: u8,
}

const CASES: [Case; 12] = [
    Case {
        vip: "198.18.100.11",
        encap: "ipip",
        backend: 1,
    },
    Case {
        vip: "198.18.100.13",
        encap: "gue",
        backend: 1,
    },
    Case {
        vip: "198.18.100.15",
        encap: "l2",
        backend: 1,
    },
    Case {
        vip: "2001:2:0:100::11",
        encap: "ipip",
        backend: 1,
    },
    Case {
        vip: "2001:2:0:100::13",
        encap: "gue",
        backend: 1,
    },
    Case {
        vip: "2001:2:0:100::15",
        encap: "l2",
        backend: 1,
    },
    Case {
        vip: "198.18.100.12",
        encap: "ipip",
        backend: 2,
    },
    Case {
        vip: "198.18.100.14",
        encap: "gue",
        backend: 2,
    },
    Case {
        vip: "198.18.100.16",
        encap: "l2",
        backend: 2,
    },
    Case {
        vip: "2001:2:0:100::12",
        encap: "ipip",
        backend: 2,
    },
    Case {
        vip: "2001:2:0:100::14",
        encap: "gue",
        backend: 2,
    },
    Case {
        vip: "2001:2:0:100::16",
        encap: "l2",
        backend: 2,
    },
];

impl Case {
    fn v6(&self) -> bool {
        self.vip.contains(':')
    }

    fn url(&self, path: &str) -> String {
        if self.v6() {
            format!("http://[{}]{path}", self.vip)
        } else {
            format!("http://{}{path}", self.vip)
        }
    }

    /// The relay's route: `VIP=ENCAP,BACKEND_IP,BACKEND_MAC`.
    fn route(&self) -> String {
        let b = self.backend;
        let (ip, mac) = if self.v6() {
            (format!("2001:2:0:1::{b}"), format!("02:00:00:00:01:0{b}"))
        } else {
            (format!("198.18.1.{b}"), format!("02:00:00:00:01:0{b}"))
        };
        format!("{}={},{ip},{mac}", self.vip, self.encap)
    }
}

/// Direct server return end to end with real TCP clients, through `xvs run` with one DSR
/// service per VIP: the client's packets to each VIP reach the backend encapsulated (IPIP,
/// GUE; or plain for L2), and the backend answers the client straight over its own
/// segment. Backend 1 is the kernel's decap (VIPs on lo; IPIP/ip6tnl/FOU where the kernel
/// has them), backend 2 `xvs decap` with port translation 80 -> 8080. For every VIP: curl
/// answers from the right backend and a 32 MiB download arrives intact (sha256), none of
/// its bytes through the node: the client's link to the node and the node's port on the
/// backends' segment carry under 1 MiB of it, the client's link on the backends' segment
/// all of it, and xvs received and sent no more frames than the client sent (its workers'
/// counters). The backends' routes to the client name that path.
#[test]
fn dsr_downloads_bypass_the_node_behind_kernel_and_xvs_decap() {
    dsr_lab(Node::Xvs);
}

/// The same with `tests/assets/dsr-relay.py` as the node: the backend side alone, against
/// encapsulation that is not xvs's own (as a Katran or IPVS node would send it).
#[test]
fn dsr_downloads_through_a_stand_in_node() {
    dsr_lab(Node::Relay);
}

/// What encapsulates the client's packets in the DSR lab.
#[derive(Clone, Copy, PartialEq)]
enum Node {
    /// `xvs run` with a DSR service per VIP.
    Xvs,
    /// `tests/assets/dsr-relay.py`.
    Relay,
}

/// The `[[services]]` of `xvs run` for the DSR lab: one per case, its backend's port the
/// one it listens on (8080 behind `xvs decap`, except for L2, whose packet keeps its port).
fn services(cases: &[&Case]) -> String {
    let mut out = String::new();
    for (i, c) in cases.iter().enumerate() {
        let b = c.backend;
        let port = if b == 2 && c.encap != "l2" { 8080 } else { 80 };
        let addr = if c.v6() {
            format!("[2001:2:0:1::{b}]:{port}")
        } else {
            format!("198.18.1.{b}:{port}")
        };
        out.push_str(&format!(
            "[[services]]\nname = \"dsr{i}\"\nvip = \"{}\"\nport = 80\nprotocol = \"tcp\"\n\
             scheduler = \"rr\"\nmode = \"dsr\"\nencap = \"{}\"\nbackends = [{{ addr = \"{addr}\" }}]\n\n",
            c.vip, c.encap
        ));
    }
    out
}

/// The frames xvs received and sent, summed over its workers (`/v1/stats`).
fn xvs_frames(lab: &common::Lab) -> (u64, u64) {
    let (code, body) = common::admin(lab, "GET", "/v1/stats");
    assert_eq!(code, "200", "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let sum = |k: &str| {
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w[k].as_u64().unwrap())
            .sum()
    };
    (sum("rx"), sum("tx"))
}

fn dsr_lab(node: Node) {
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = common::dsr::DsrLab::up();
    let tunnels = lab.kernel_tunnels();
    if !tunnels {
        eprintln!(
            "NOTE: this kernel has no IPIP/ip6tnl/FOU (CONFIG_NET_IPIP, CONFIG_IPV6_TUNNEL, \
             CONFIG_NET_FOU): backend 1's kernel decap runs for L2 only"
        );
    }
    let cases: Vec<&Case> = CASES
        .iter()
        .filter(|c| tunnels || c.backend == 2 || c.encap == "l2")
        .collect();
    let kernel_vips: Vec<&str> = cases
        .iter()
        .filter(|c| c.backend == 1)
        .map(|c| c.vip)
        .collect();
    lab.kernel_decap(&kernel_vips, tunnels);
    let mut args = vec!["--interface", "b0", "--vips-on-lo"];
    let translations: Vec<String> = cases
        .iter()
        .filter(|c| c.backend == 2)
        .map(|c| {
            if c.v6() {
                format!("[{}]:80=8080/tcp", c.vip)
            } else {
                format!("{}:80=8080/tcp", c.vip)
            }
        })
        .collect();
    for t in &translations {
        args.extend(["--vip", t]);
    }
    let o = lab.xvs_decap(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    match node {
        Node::Xvs => lab
            .lab
            .start_xvs(&common::dsr::xvs_config(&services(&cases))),
        Node::Relay => {
            let routes: Vec<String> = cases.iter().map(|c| c.route()).collect();
            lab.start_relay(&routes);
        }
    }

    let want = common::dsr::pattern_sha256(lab.lab.dir.path(), common::dsr::DOWNLOAD);
    let mut client_sent = 0;
    for c in &cases {
        let name = lab.curl(&c.url("/name"));
        assert_eq!(name, format!("backend-{}\n", c.backend), "{}", c.vip);

        let before = Stats::read(&lab);
        let frames = (node == Node::Xvs).then(|| xvs_frames(&lab.lab));
        let got = lab.download_sha256(&c.url(&format!("/bytes/{}", common::dsr::DOWNLOAD)));
        let after = Stats::read(&lab);
        assert_eq!(got, want, "{} ({}) download", c.vip, c.encap);
        let d = after.minus(&before);
        let mib = 1 << 20;
        assert!(
            d.client_return_rx >= common::dsr::DOWNLOAD as u64,
            "{}: {d:?}",
            c.vip
        );
        assert!(
            d.client_node_rx < mib,
            "{}: replies crossed the node: {d:?}",
            c.vip
        );
        assert!(
            d.node_backend_rx < mib,
            "{}: replies reached the node: {d:?}",
            c.vip
        );
        if let Some((rx0, tx0)) = frames {
            // xvs saw the client's packets (requests, ACKs) and sent each on, encapsulated:
            // no more, far fewer than the ~23k frames of the download it never saw.
            let (rx, tx) = xvs_frames(&lab.lab);
            let sent = d.client_node_tx_packets;
            assert!(rx - rx0 <= sent, "{}: xvs rx {} > {sent}", c.vip, rx - rx0);
            assert!(tx - tx0 <= sent, "{}: xvs tx {} > {sent}", c.vip, tx - tx0);
            assert!(tx - tx0 > 0, "{}: xvs sent nothing", c.vip);
        }
        client_sent += d.client_node_tx_packets;
    }
    if node == Node::Relay {
        let relayed = lab.stop_relay();
        let total: u64 = relayed.values().sum();
        for c in &cases {
            assert!(relayed[c.vip] > 0, "{}: {relayed:?}", c.vip);
        }
        // The node relays the client's packets (its ACKs and requests), no more.
        assert!(
            total <= client_sent + 20 * cases.len() as u64,
            "{total} > {client_sent}"
        );
    }

    for c in &cases {
        let b = format!("b{}", c.backend);
        let (client, via) = if c.v6() {
            ("2001:2::2", "via 2001:2:0:1::c8 dev b0")
        } else {
            ("198.18.0.2", "via 198.18.1.200 dev b0")
        };
        let r = lab.route_to_client(&b, client, c.vip);
        assert!(r.contains(via), "{b} from {}: {r}", c.vip);
    }
    let s = lab.decap_status();
    let n = |k: &str| s[k].parse::<u64>().unwrap();
    assert!(n("decap_ipip") > 0 && n("decap_gue") > 0, "{s:?}");
    assert!(n("in_translated") > 0 && n("out_translated") > 0, "{s:?}");
}

/// The interface counters the DSR test compares before and after a download.
#[derive(Debug)]
struct Stats {
    /// Bytes the client received on its link to the node (c0).
    client_node_rx: u64,
    /// Packets the client sent on its link to the node.
    client_node_tx_packets: u64,
    /// Bytes the client received on its link on the backends' segment (c1).
    client_return_rx: u64,
    /// Bytes the backends' segment sent toward the node (the switch's port to it).
    node_backend_rx: u64,
}

impl Stats {
    fn read(lab: &common::dsr::DsrLab) -> Stats {
        Stats {
            client_node_rx: lab.link_stat("c", "c0", "rx_bytes"),
            client_node_tx_packets: lab.link_stat("c", "c0", "tx_packets"),
            client_return_rx: lab.link_stat("c", "c1", "rx_bytes"),
            node_backend_rx: lab.link_stat("s", "up0", "tx_bytes"),
        }
    }

    fn minus(&self, before: &Stats) -> Stats {
        Stats {
            client_node_rx: self.client_node_rx - before.client_node_rx,
            client_node_tx_packets: self.client_node_tx_packets - before.client_node_tx_packets,
            client_return_rx: self.client_return_rx - before.client_return_rx,
            node_backend_rx: self.node_backend_rx - before.node_backend_rx,
        }
    }
}
