//! The DSR lab: `scripts/lab`'s namespaces ([`Lab`]) with a return path that bypasses the
//! xvs node, and the two backend sides of direct server return:
//!
//! ```text
//!  client c0 198.18.0.2 ── xvs node (x) ── br0 (s) ── b1 kernel decap, VIPs on lo, HTTP :80
//!         c1 198.18.1.200 ───────────────────┘     └─ b2 xvs decap 80 -> 8080, HTTP :8080
//! ```
//!
//! The backends route the client's network (198.18.0.0/24, 2001:2::/64) via the client's
//! second link `c1` on their segment, so replies go straight to the client and never reach
//! the xvs node; the client accepts them there (rp_filter off). The node's side is
//! `tests/assets/dsr-relay.py` ([`DsrLab::start_relay`]): it encapsulates what the client
//! sends to a VIP as an xvs node in DSR mode does.
//!
//! Everything is removed on drop, failed tests included: the relay, `xvs decap`'s pins (its
//! programs and VIPs go with the namespace), then the lab.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::{Lab, root, run};

/// Bytes of the download each VIP serves (32 MiB: ~23k full-size frames).
pub const DOWNLOAD: usize = 32 << 20;
/// The client's address on the backends' segment (its return path).
pub const CLIENT_RETURN4: &str = "198.18.1.200";
pub const CLIENT_RETURN6: &str = "2001:2:0:1::c8";
pub const B1_MAC: &str = "02:00:00:00:01:01";
pub const B2_MAC: &str = "02:00:00:00:01:02";
const BPFFS: &str = "/run/xvs-bpf";

/// A DSR lab; see the module doc.
pub struct DsrLab {
    relay: Option<Child>,
    servers: Vec<Child>,
    pins: PathBuf,
    /// b1's HTTP files: `name` and `bytes/<DOWNLOAD>`.
    www: PathBuf,
    pub lab: Lab,
}

impl DsrLab {
    pub fn up() -> DsrLab {
        let lab = Lab::up();
        let pins = PathBuf::from(BPFFS).join(format!("{}-decap", lab.prefix));
        let www = lab.dir.path().join("www");
        let dsr = DsrLab {
            relay: None,
            servers: Vec::new(),
            pins,
            www,
            lab,
        };
        dsr.return_path();
        dsr
    }

    fn sh(&self, args: &[&str]) -> Output {
        let o = run(Command::new(args[0]).args(&args[1..]));
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    /// `ip -n <which> ARGS` (split on spaces), which must succeed.
    pub fn ip(&self, which: &str, cmd: &str) -> Output {
        let ns = self.lab.ns(which);
        let mut args = vec!["ip", "-n", &ns];
        args.extend(cmd.split(' '));
        self.sh(&args)
    }

    /// In `which`, a command that must succeed.
    pub fn must(&self, which: &str, args: &[&str]) -> Output {
        let o = self.lab.exec(which, args);
        assert!(
            o.status.success(),
            "{which}: {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    /// The client's second link on the backends' segment, and the backends' routes to the
    /// client's network through it.
    fn return_path(&self) {
        let (c, s) = (self.lab.ns("c"), self.lab.ns("s"));
        self.sh(&[
            "ip", "link", "add", "c1", "netns", &c, "type", "veth", "peer", "name", "pc", "netns",
            &s,
        ]);
        self.ip("s", "link set pc master br0");
        self.ip("s", "link set pc up");
        self.ip("c", "addr add 198.18.1.200/24 dev c1");
        self.ip("c", "addr add 2001:2:0:1::c8/64 dev c1 nodad");
        self.ip("c", "link set c1 up");
        // Replies from a VIP arrive on c1 while the VIP is routed via c0.
        self.must(
            "c",
            &[
                "sysctl",
                "-qw",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.c1.rp_filter=0",
            ],
        );
        for b in ["b1", "b2"] {
            self.ip(b, "route add 198.18.0.0/24 via 198.18.1.200");
            self.ip(b, "-6 route add 2001:2::/64 via 2001:2:0:1::c8");
        }
    }

    /// `ip route get CLIENT from VIP` in backend `which`.
    pub fn route_to_client(&self, which: &str, client: &str, vip: &str) -> String {
        let ns = self.lab.ns(which);
        let o = self.sh(&["ip", "-n", &ns, "route", "get", client, "from", vip]);
        String::from_utf8(o.stdout).unwrap()
    }

    /// Whether this kernel has IPIP, ip6tnl and FOU (all three, or the kernel decap recipe
    /// cannot run): probed in backend 1.
    pub fn kernel_tunnels(&self) -> bool {
        let ns = self.lab.ns("b1");
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(["-n", &ns])
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        ok(&["link", "show", "tunl0"]) && ok(&["link", "show", "ip6tnl0"]) && {
            let fou = ok(&["fou", "add", "port", "6080", "ipproto", "4"]);
            fou && ok(&["fou", "del", "port", "6080"])
        }
    }

    /// Backend 1 as IPVS TUN/DR users set it up (docs/decap.md): the VIPs on `lo`, ARP for
    /// them off (L2), and with `tunnels` the kernel's IPIP, ip6tnl and FOU/GUE decap with
    /// rp_filter off; HTTP on :80 serving `name` and `bytes/<DOWNLOAD>`.
    pub fn kernel_decap(&mut self, vips: &[&str], tunnels: bool) {
        for vip in vips {
            let len = if vip.contains(':') { 128 } else { 32 };
            self.ip("b1", &format!("addr add {vip}/{len} dev lo"));
        }
        self.must(
            "b1",
            &[
                "sysctl",
                "-qw",
                "net.ipv4.conf.all.arp_ignore=1",
                "net.ipv4.conf.all.arp_announce=2",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ],
        );
        if tunnels {
            self.ip("b1", "link set tunl0 up");
            self.ip("b1", "link set ip6tnl0 up");
            self.ip("b1", "fou add port 6080 ipproto 4");
            self.ip("b1", "fou add port 6080 ipproto 41 -6");
            self.must("b1", &["sysctl", "-qw", "net.ipv4.conf.tunl0.rp_filter=0"]);
        }
        std::fs::create_dir_all(self.www.join("bytes")).unwrap();
        std::fs::write(self.www.join("name"), "backend-1\n").unwrap();
        std::fs::write(
            self.www.join(format!("bytes/{DOWNLOAD}")),
            pattern(DOWNLOAD),
        )
        .unwrap();
        let www = self.www.display().to_string();
        let server = Command::new("ip")
            .args(["netns", "exec", &self.lab.ns("b1"), "python3", "-m"])
            .args(["http.server", "80", "--bind", "::", "--directory", &www])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.servers.push(server);
        self.wait_listening("b1", 80);
    }

    /// Until `which` listens on TCP `port` (10 s at most).
    fn wait_listening(&self, which: &str, port: u16) {
        let filter = format!("sport = :{port}");
        for _ in 0..200 {
            let o = self.lab.exec(which, &["ss", "-Hltn", &filter]);
            if !o.stdout.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{which}: nothing listens on {port} after 10 s");
    }

    /// `xvs decap ARGS --pin-root <this lab's>` in backend 2.
    pub fn xvs_decap(&self, args: &[&str]) -> Output {
        let pins = self.pins.display().to_string();
        let mut all = vec![env!("CARGO_BIN_EXE_xvs"), "decap"];
        all.extend_from_slice(args);
        all.extend(["--pin-root", &pins]);
        self.lab.exec("b2", &all)
    }

    /// `xvs decap --status` of backend 2 as a map.
    pub fn decap_status(&self) -> HashMap<String, String> {
        let o = self.xvs_decap(&["--status"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// Starts the stand-in node in `x`: `routes` are `VIP=ENCAP,BACKEND_IP,BACKEND_MAC`.
    pub fn start_relay(&mut self, routes: &[String]) {
        // The relay reads the client's packets beside the kernel, which must not answer
        // them (IPv6 would send "no route" for a VIP): it discards them silently.
        self.ip("x", "route add blackhole 198.18.100.0/24");
        self.ip("x", "-6 route add blackhole 2001:2:0:100::/64");
        let script = root().join("tests/assets/dsr-relay.py");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.lab.ns("x"), "python3"])
            .arg(script)
            .args([
                "xvs-c0",
                "xvs-b0",
                "198.18.1.254",
                "2001:2:0:1::fe",
                "6080",
                "300",
            ])
            .args(routes)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        let stdout = child.stdout.as_mut().unwrap();
        let _ = BufReader::new(stdout).read_line(&mut first);
        assert_eq!(first.trim(), "ready", "dsr-relay.py did not start");
        self.relay = Some(child);
    }

    /// Stops the relay (SIGTERM, 10 s at most); the packets it relayed per VIP.
    pub fn stop_relay(&mut self) -> HashMap<String, u64> {
        let mut child = self.relay.take().expect("the relay runs");
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        for _ in 0..200 {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let status = child.wait().unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "dsr-relay.py: {status}: {err}");
        out.lines()
            .filter_map(|l| l.strip_prefix("relayed "))
            .filter_map(|l| l.split_once(' '))
            .map(|(vip, n)| (vip.to_owned(), n.parse().unwrap()))
            .collect()
    }

    /// A counter of interface `dev` in `which` (`rx_bytes`, `tx_packets`, ...).
    pub fn link_stat(&self, which: &str, dev: &str, stat: &str) -> u64 {
        let path = format!("/sys/class/net/{dev}/statistics/{stat}");
        let o = self.must(which, &["cat", &path]);
        String::from_utf8(o.stdout).unwrap().trim().parse().unwrap()
    }

    /// `curl` from the client, the body (panics with curl's error).
    pub fn curl(&self, url: &str) -> String {
        let o = self.must(
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
        String::from_utf8(o.stdout).unwrap()
    }

    /// Downloads `url` to a file in the client and returns its sha256 (`sha256sum`).
    pub fn download_sha256(&self, url: &str) -> String {
        let file = self.lab.dir.path().join("download");
        let path = file.display().to_string();
        self.must(
            "c",
            &[
                "curl",
                "-sS",
                "--fail",
                "--max-time",
                "120",
                "--output",
                &path,
                url,
            ],
        );
        let o = self.must("c", &["sha256sum", &path]);
        let _ = std::fs::remove_file(&file);
        String::from_utf8(o.stdout).unwrap()[..64].to_owned()
    }
}

/// The bytes `scripts/lab-backend.py` answers `GET /bytes/N` with.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| i as u8).collect()
}

/// The sha256 of [`pattern`]`(n)` (`sha256sum` of a file holding it).
pub fn pattern_sha256(dir: &std::path::Path, n: usize) -> String {
    let file = dir.join("expected");
    std::fs::write(&file, pattern(n)).unwrap();
    let o = run(Command::new("sha256sum").arg(&file));
    let _ = std::fs::remove_file(&file);
    String::from_utf8(o.stdout).unwrap()[..64].to_owned()
}

impl Drop for DsrLab {
    fn drop(&mut self) {
        if let Some(mut c) = self.relay.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for c in &mut self.servers {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.pins);
        // Then `lab` drops: the processes in the namespaces, the namespaces.
    }
}

/// The lab's `xvs run` config with `services` (TOML `[[services]]` tables) instead of
/// lab.toml's, its `[node]`, `[dataplane]`, `[admin]` and `[[neighbours]]` kept.
pub fn xvs_config(services: &str) -> String {
    let lab = super::lab_config();
    let head = &lab[..lab.find("[[services]]").expect("lab.toml has services")];
    let neighbours = &lab[lab.find("[[neighbours]]").expect("lab.toml has neighbours")..];
    format!("{head}{services}\n{neighbours}")
}
