//! Privileged tests of the pinned steering link and the restart hold, on a veth pair in
//! network namespaces this file creates, with pins under a bpffs root of its own
//! (`/sys/fs/bpf/xvs-test-<pid>-<n>`); both are removed even when a test fails. Run as root:
//! `cargo test -p fastpath --test steer_pinned_netns`.
//!
//! The `lb` namespace has the VIP on its loopback and a UDP server bound to VIP:5353 (a
//! frontend: xvs owns it) and to LB:6000 (not owned). No AF_XDP socket is ever registered,
//! so every owned frame takes the no-socket path: the server sees what the kernel got, the
//! counters what the program did. "Sent before the marker" is the barrier: the client sends
//! owned datagrams, then a marker to LB:6000 on the same path; once the server has the
//! marker, anything owned that the kernel was going to get has arrived.
//! Addresses: 198.18.0.0/15 only.

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use aya::programs::links::{FdLink, PinnedLink};
use fastpath::steer::{
    SteerCounters, SteerError, Steering, monotonic_ns, pin_dir, pin_dir_in, pinned_counters,
    pinned_hold, remove_pins,
};
use vocab::XdpMode;
use vocab::ip_proto::UDP;

const LB4: &str = "198.18.0.1";
const CL4: &str = "198.18.0.2";
const VIP4: &str = "198.18.100.1";
/// The frontend port: datagrams to VIP4 on it are xvs's.
const OWNED: u16 = 5353;
/// Not a frontend: datagrams to LB4 on it are the kernel's.
const KERNEL: u16 = 6000;
const HOLD_NS: u64 = 30_000_000_000;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Two namespaces, a veth pair and a pin root, all removed on drop.
struct Lab {
    lb: String,
    cl: String,
    lb_if: String,
    cl_if: String,
    /// The bpffs directory standing in for `/sys/fs/bpf/xvs`.
    root: PathBuf,
    /// `pin_dir_in(root)` for the `lb` namespace.
    pins: PathBuf,
}

impl Lab {
    fn new() -> Lab {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}x{n}", std::process::id());
        let mut lab = Lab {
            lb: format!("xvspn-lb-{id}"),
            cl: format!("xvspn-cl-{id}"),
            lb_if: format!("xp{id}a"),
            cl_if: format!("xp{id}b"),
            root: PathBuf::from(format!("/sys/fs/bpf/xvs-test-{}-{n}", std::process::id())),
            pins: PathBuf::new(),
        };
        assert!(lab.lb_if.len() <= 15);
        lab.remove();
        std::fs::create_dir(&lab.root).expect("create the test pin root");
        sh("ip", &["netns", "add", &lab.lb]);
        sh("ip", &["netns", "add", &lab.cl]);
        lab.add_veth();
        lab.exec(&lab.lb, &["ip", "link", "set", "lo", "up"]);
        lab.exec(&lab.cl, &["ip", "link", "set", "lo", "up"]);
        lab.exec(
            &lab.lb,
            &["ip", "addr", "add", &format!("{VIP4}/32"), "dev", "lo"],
        );
        let root = lab.root.clone();
        lab.pins = lab.in_lb(move || pin_dir_in(&root).unwrap());
        lab
    }

    /// (Re)creates the veth pair, addresses and the client's route to the VIP.
    fn add_veth(&self) {
        sh(
            "ip",
            &[
                "link",
                "add",
                &self.lb_if,
                "netns",
                &self.lb,
                "type",
                "veth",
                "peer",
                "name",
                &self.cl_if,
                "netns",
                &self.cl,
            ],
        );
        for (ns, ifname, v4) in [(&self.lb, &self.lb_if, LB4), (&self.cl, &self.cl_if, CL4)] {
            self.exec(
                ns,
                &["ip", "addr", "add", &format!("{v4}/24"), "dev", ifname],
            );
            self.exec(ns, &["ip", "link", "set", ifname, "up"]);
            // Full checksums on the wire: veth otherwise sends partial ones.
            self.exec(ns, &["ethtool", "-K", ifname, "tx", "off"]);
        }
        self.exec(
            &self.cl,
            &["ip", "route", "add", "198.18.100.0/24", "via", LB4],
        );
        // Resolve the neighbours, so the first datagrams are not queued behind ARP.
        self.exec(&self.cl, &["ping", "-c", "1", "-W", "2", LB4]);
    }

    fn remove(&self) {
        if !self.pins.as_os_str().is_empty() {
            let _ = remove_pins(&self.pins);
        }
        let _ = std::fs::remove_dir(&self.root);
        for ns in [&self.lb, &self.cl] {
            let _ = Command::new("ip")
                .args(["netns", "delete", ns])
                .stderr(Stdio::null())
                .status();
        }
    }

    fn exec(&self, ns: &str, argv: &[&str]) -> Output {
        let out = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(argv)
            .output()
            .expect("run ip netns exec");
        assert!(
            out.status.success(),
            "{argv:?} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs `f` on a thread inside `lb`.
    fn in_lb<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = self.lb.clone();
        std::thread::spawn(move || {
            enter_netns(&ns);
            f()
        })
        .join()
        .expect("thread in lb")
    }

    /// `attach_pinned` on the `lb` end, from a thread inside `lb`.
    fn attach_pinned(&self) -> (Steering, bool) {
        let (ifname, pins) = (self.lb_if.clone(), self.pins.clone());
        self.in_lb(move || Steering::attach_pinned(&ifname, XdpMode::Auto, &pins).unwrap())
    }

    fn has_xdp(&self) -> bool {
        let out = self.exec(&self.lb, &["ip", "-d", "link", "show", "dev", &self.lb_if]);
        String::from_utf8_lossy(&out.stdout).contains("xdp")
    }

    /// Polls until no XDP program is attached (a link freed by unpinning goes a moment
    /// later, from a kernel work item).
    fn wait_no_xdp(&self) -> bool {
        wait_for(|| !self.has_xdp())
    }

    /// Sends `count` UDP datagrams with payload `tag` from the client to `dst:port`.
    fn send(&self, dst: &str, port: u16, count: usize, tag: &str) {
        let code = format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             for _ in range({count}): s.sendto(b'{tag}',('{dst}',{port}))\n"
        );
        self.exec(&self.cl, &["python3", "-c", &code]);
    }

    /// Sends owned datagrams to the VIP every 2 ms until dropped.
    fn stream(&self) -> Reaped {
        let code = format!(
            "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             while True:\n  s.sendto(b'stream',('{VIP4}',{OWNED}))\n  time.sleep(0.002)\n"
        );
        Reaped(
            Command::new("ip")
                .args(["netns", "exec", &self.cl, "python3", "-c", &code])
                .spawn()
                .expect("spawn the stream"),
        )
    }

    /// The pinned link's (link id, program id).
    fn link_ids(&self) -> (u32, u32) {
        let link = PinnedLink::from_pin(self.pins.join(&self.lb_if).join("link")).unwrap();
        let info = FdLink::from(link).info().unwrap();
        (info.id(), info.program_id())
    }

    fn pinned_counters(&self) -> SteerCounters {
        pinned_counters(&self.pins, &self.lb_if)
            .unwrap()
            .expect("pinned")
    }

    /// Spawns [`child_attaches_pinned_and_holds`]; returns it once it has attached and set
    /// its hold, with the hold's deadline.
    fn child(&self) -> (Reaped, u64) {
        let mut child = Reaped(
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "child_attaches_pinned_and_holds",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(
                    "XVS_PINNED_CHILD",
                    format!("{} {} {}", self.lb, self.lb_if, self.pins.display()),
                )
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let reader = BufReader::new(child.0.stdout.take().unwrap());
        let ready = reader
            .lines()
            .map_while(Result::ok)
            // libtest may print "test <name> ... " on the same line first.
            .find_map(|l| l.split_once("child ready ").map(|(_, r)| r.to_owned()))
            .expect("the child did not attach");
        let (adopted, deadline) = ready.split_once(' ').unwrap();
        assert_eq!(adopted, "false", "the child found nothing to adopt");
        (child, deadline.parse().unwrap())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The UDP server in `lb`: one line `<port> <payload>` per datagram the kernel delivers.
struct Server {
    _proc: Reaped,
    lines: mpsc::Receiver<String>,
}

impl Server {
    fn start(lab: &Lab) -> Server {
        let code = format!(
            "import socket,select\nsocks=[]\n\
             for a,p in [('{VIP4}',{OWNED}),('{LB4}',{KERNEL})]:\n\
             \x20 s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind((a,p)); socks.append(s)\n\
             print('ready',flush=True)\n\
             while True:\n\
             \x20 r,_,_=select.select(socks,[],[])\n\
             \x20 for s in r:\n\
             \x20   d,_=s.recvfrom(2048); print(s.getsockname()[1],d.decode(),flush=True)\n"
        );
        let mut proc = Reaped(
            Command::new("ip")
                .args(["netns", "exec", &lab.lb, "python3", "-c", &code])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn the server"),
        );
        let stdout = proc.0.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let server = Server { _proc: proc, lines };
        assert_eq!(server.next().as_deref(), Some("ready"));
        server
    }

    fn next(&self) -> Option<String> {
        self.lines.recv_timeout(Duration::from_secs(10)).ok()
    }

    /// Sends a marker to the kernel's port and returns every line the server printed
    /// before it.
    fn until_marker(&self, lab: &Lab, marker: &str) -> Vec<String> {
        lab.send(LB4, KERNEL, 1, marker);
        let want = format!("{KERNEL} {marker}");
        let mut before = Vec::new();
        loop {
            let line = self.next().unwrap_or_else(|| {
                panic!("the marker {marker} never arrived; before it: {before:?}")
            });
            if line == want {
                return before;
            }
            before.push(line);
        }
    }

    /// Lines for the owned port among those before `marker`.
    fn owned_before(&self, lab: &Lab, marker: &str) -> Vec<String> {
        self.until_marker(lab, marker)
            .into_iter()
            .filter(|l| l.starts_with(&format!("{OWNED} ")))
            .collect()
    }
}

/// Polls `cond` for up to 10 s; only a failure waits that long.
fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

fn sh(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().expect("run command");
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Moves the calling thread into the named network namespace.
fn enter_netns(ns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    // SAFETY: a valid namespace fd; only this thread changes namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A process killed (SIGKILL) and reaped on drop.
struct Reaped(Child);

impl Reaped {
    fn kill(mut self) -> u32 {
        let pid = self.0.id();
        self.0.kill().unwrap();
        self.0.wait().unwrap();
        pid
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The restart: a child attaches pinned, sets a 30 s hold and is killed. The program stays
/// attached and drops owned frames (counted `held`; the kernel's socket gets none) while
/// passing the rest. The next process adopts the same link with its own program while owned
/// frames stream in, and the kernel gets none of them; its program knows the frontends and
/// the hold the dead one left. A hold in the past, or none, passes owned frames again.
#[test]
fn hold_outlives_the_process_and_adoption_has_no_gap() {
    let lab = Lab::new();
    let server = Server::start(&lab);

    let (child, deadline) = lab.child();
    let child_pid = child.kill();
    assert!(lab.has_xdp(), "the pinned link went with its process");
    assert_eq!(
        pinned_hold(&lab.pins, &lab.lb_if).unwrap(),
        Some((deadline, child_pid))
    );
    let (link_id, dead_prog) = lab.link_ids();

    // Held: owned frames are dropped, the kernel's pass.
    let before = lab.pinned_counters();
    lab.send(VIP4, OWNED, 10, "held");
    assert_eq!(server.owned_before(&lab, "m1"), Vec::<String>::new());
    let after = lab.pinned_counters();
    assert_eq!(after.held - before.held, 10, "{after:?}");
    assert_eq!(after.no_socket, before.no_socket, "{after:?}");
    lab.exec(&lab.cl, &["ping", "-c", "1", "-W", "2", LB4]);

    // Adopt while owned frames stream in, through the dead program and then the new one.
    let stream = lab.stream();
    let flowing = lab.pinned_counters().held;
    assert!(wait_for(|| lab.pinned_counters().held > flowing + 5));
    let (mut steer, adopted) = lab.attach_pinned();
    assert!(adopted, "the pinned link was not adopted");
    assert!(wait_for(|| steer.counters().unwrap().held > 5));
    drop(stream);
    assert_eq!(server.owned_before(&lab, "m2"), Vec::<String>::new());
    let (new_link_id, new_prog) = lab.link_ids();
    assert_eq!(new_link_id, link_id, "the link was replaced, not updated");
    assert_ne!(new_prog, dead_prog, "the link still runs the dead program");
    let c = steer.counters().unwrap();
    assert_eq!(c.no_socket, 0, "{c:?}");
    assert_eq!(
        c.match_frontend, c.held,
        "the copied frontends match: {c:?}"
    );
    // The new pins are the new program's (no owned frame arrives any more, so its `held`
    // stands still), and the hold is the dead one's until set.
    assert_eq!(lab.pinned_counters().held, c.held);
    assert_eq!(
        pinned_hold(&lab.pins, &lab.lb_if).unwrap(),
        Some((deadline, child_pid))
    );
    // The Service CIDRs were copied too (held: no socket, the hold runs).
    lab.send("198.18.100.200", 53, 2, "cidr");
    assert!(
        wait_for(|| steer.counters().unwrap().match_service_cidr == 2),
        "{:?}",
        steer.counters().unwrap()
    );

    // A hold in the past, and no hold: owned frames reach the kernel again.
    let me = std::process::id();
    for (deadline, tag) in [(monotonic_ns() - 1, "past"), (0, "zero")] {
        steer.set_hold(deadline, me).unwrap();
        assert_eq!(
            pinned_hold(&lab.pins, &lab.lb_if).unwrap(),
            Some((deadline, me))
        );
        let before = steer.counters().unwrap();
        lab.send(VIP4, OWNED, 3, tag);
        let owned = server.owned_before(&lab, &format!("m-{tag}"));
        assert_eq!(owned, vec![format!("{OWNED} {tag}"); 3]);
        let after = steer.counters().unwrap();
        assert_eq!(after.no_socket - before.no_socket, 3, "{after:?}");
        assert_eq!(after.held, before.held, "{after:?}");
    }
    steer.detach().unwrap();
    assert!(lab.wait_no_xdp());
}

/// A node whose xvs does not come back: the orphaned program holds until `remove_pins`,
/// which detaches it, removes the directory, is idempotent, and leaves the VIP's frames to
/// the kernel.
#[test]
fn remove_pins_leaves_nothing_attached() {
    let lab = Lab::new();
    let server = Server::start(&lab);
    let (child, deadline) = lab.child();
    child.kill();
    assert!(lab.has_xdp());
    assert!(deadline > monotonic_ns(), "the hold already ran out");
    lab.send(VIP4, OWNED, 2, "held");
    assert_eq!(server.owned_before(&lab, "m1"), Vec::<String>::new());

    assert_eq!(remove_pins(&lab.pins).unwrap(), 1);
    assert!(lab.wait_no_xdp(), "the unpinned program is still attached");
    assert!(!lab.pins.exists(), "{} is left", lab.pins.display());
    assert_eq!(remove_pins(&lab.pins).unwrap(), 0);
    assert_eq!(pinned_hold(&lab.pins, &lab.lb_if).unwrap(), None);
    assert!(pinned_counters(&lab.pins, &lab.lb_if).unwrap().is_none());

    lab.send(VIP4, OWNED, 2, "free");
    assert_eq!(
        server.owned_before(&lab, "m2"),
        vec![format!("{OWNED} free"); 2]
    );
    lab.exec(&lab.cl, &["ping", "-c", "1", "-W", "2", LB4]);
}

/// `release` leaves the program attached and pinned, for the same process to adopt;
/// `detach` removes it and the interface's pins at once.
#[test]
fn release_keeps_and_detach_removes() {
    let lab = Lab::new();
    let (mut steer, adopted) = lab.attach_pinned();
    assert!(!adopted);
    assert_eq!(
        pinned_hold(&lab.pins, &lab.lb_if).unwrap(),
        Some((0, 0)),
        "a new program holds nothing"
    );
    let deadline = monotonic_ns() + HOLD_NS;
    steer.set_hold(deadline, 42).unwrap();
    steer.release();
    assert!(lab.has_xdp(), "release detached");
    let (link_id, _) = lab.link_ids();

    let (steer, adopted) = lab.attach_pinned();
    assert!(adopted);
    assert_eq!(lab.link_ids().0, link_id);
    assert_eq!(
        pinned_hold(&lab.pins, &lab.lb_if).unwrap(),
        Some((deadline, 42))
    );
    steer.detach().unwrap();
    assert!(!lab.has_xdp(), "detach left the program attached");
    assert!(!lab.pins.join(&lab.lb_if).exists(), "detach left the pins");
    assert_eq!(pinned_hold(&lab.pins, &lab.lb_if).unwrap(), None);
}

/// A pinned link whose interface was deleted is stale: the next `attach_pinned` on the
/// recreated interface attaches afresh instead of adopting it.
#[test]
fn stale_link_of_a_recreated_interface_is_replaced() {
    let lab = Lab::new();
    let (steer, _) = lab.attach_pinned();
    steer.release();
    lab.exec(&lab.lb, &["ip", "link", "del", &lab.lb_if]);
    lab.add_veth();
    assert!(!lab.has_xdp());
    let (steer, adopted) = lab.attach_pinned();
    assert!(!adopted, "adopted the link of a deleted interface");
    assert!(lab.has_xdp());
    steer.detach().unwrap();
    assert!(!lab.has_xdp());
}

/// Plain `attach` on an interface held by xvs's pinned link (in the default pin directory)
/// refuses, naming the pin and the cleanup.
#[test]
fn attach_refuses_a_pinned_interface() {
    let lab = Lab::new();
    let ifname = lab.lb_if.clone();
    let (dir, err) = lab.in_lb(move || {
        let dir = pin_dir().unwrap();
        // The namespace is this test's own, so its directory is too.
        let guard = Unpin(dir.clone());
        let (steer, _) = Steering::attach_pinned(&ifname, XdpMode::Auto, &dir).unwrap();
        steer.release();
        let err = Steering::attach(&ifname, XdpMode::Auto).unwrap_err();
        drop(guard);
        (dir, err)
    });
    assert!(matches!(err, SteerError::Pinned { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&dir.join(&lab.lb_if).join("link").display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("rm -r"), "{msg}");
    assert!(lab.wait_no_xdp());
}

/// Removes a pin directory (and an empty `/sys/fs/bpf/xvs`) on drop.
struct Unpin(PathBuf);

impl Drop for Unpin {
    fn drop(&mut self) {
        let _ = remove_pins(&self.0);
        if let Some(root) = self.0.parent() {
            let _ = std::fs::remove_dir(root);
        }
    }
}

/// Helper for the tests above: runs only in the child they spawn. Attaches pinned, makes
/// VIP4:5353/udp a frontend, holds for 30 s, reports, and waits to be killed.
#[test]
#[ignore = "helper process for the pinned tests"]
fn child_attaches_pinned_and_holds() {
    let Ok(spec) = std::env::var("XVS_PINNED_CHILD") else {
        return;
    };
    let mut parts = spec.splitn(3, ' ');
    let (ns, ifname, pins) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        Path::new(parts.next().unwrap()),
    );
    enter_netns(ns);
    let (mut steer, adopted) = Steering::attach_pinned(ifname, XdpMode::Auto, pins).unwrap();
    steer.set_frontends(&[(ip(VIP4), UDP, OWNED)], &[]).unwrap();
    steer
        .set_service_cidrs(&["198.18.100.128/25".parse().unwrap()])
        .unwrap();
    let deadline = monotonic_ns() + HOLD_NS;
    steer.set_hold(deadline, std::process::id()).unwrap();
    println!("child ready {adopted} {deadline}");
    std::thread::sleep(Duration::from_secs(120));
}
