//! Privileged tests of the XDP steering program and its loader, on veth pairs in network
//! namespaces this file creates (and always removes). Run as root:
//! `cargo test -p fastpath --test steer_netns`.
//!
//! Each test builds two namespaces, `lb` and `cl`, joined by a veth pair; the program is
//! attached to the `lb` end from a thread that entered `lb` (the rest of the process stays in
//! the host namespace). With no AF_XDP socket registered, matched frames fall back to
//! XDP_PASS (no restart hold is set), so the counters' `match_*` and `no_socket` fields prove
//! what was steered. The pinned link and the hold are tested in `steer_pinned_netns.rs`.
//! Addresses: 198.18.0.0/15 and 2001:2::/48 only.

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use fastpath::steer::{SteerCounters, Steering};
use vocab::XdpMode;
use vocab::ip_proto::{TCP, UDP};

const LB4: &str = "198.18.0.1";
const CL4: &str = "198.18.0.2";
const LB6: &str = "2001:2::1";
const CL6: &str = "2001:2::2";
const VIP4: &str = "198.18.100.1";
const VIP6: &str = "2001:2:0:100::1";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Two namespaces and a veth pair, deleted on drop (and at creation, should a crashed run
/// with the same pid have left them).
struct Net {
    lb: String,
    cl: String,
    /// The veth end inside `lb`, where the program attaches.
    lb_if: String,
}

impl Net {
    fn new() -> Net {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}x{n}", std::process::id());
        let net = Net {
            lb: format!("xvsst-lb-{id}"),
            cl: format!("xvsst-cl-{id}"),
            lb_if: format!("xs{id}a"),
        };
        assert!(net.lb_if.len() <= 15);
        net.remove();
        let cl_if = format!("xs{id}b");
        sh("ip", &["netns", "add", &net.lb]);
        sh("ip", &["netns", "add", &net.cl]);
        sh(
            "ip",
            &[
                "link", "add", &net.lb_if, "netns", &net.lb, "type", "veth", "peer", "name",
                &cl_if, "netns", &net.cl,
            ],
        );
        for (ns, ifname, v4, v6) in [(&net.lb, &net.lb_if, LB4, LB6), (&net.cl, &cl_if, CL4, CL6)] {
            net.exec(ns, &["ip", "link", "set", "lo", "up"]);
            net.exec(
                ns,
                &["ip", "addr", "add", &format!("{v4}/24"), "dev", ifname],
            );
            net.exec(
                ns,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{v6}/64"),
                    "dev",
                    ifname,
                    "nodad",
                ],
            );
            net.exec(ns, &["ip", "link", "set", ifname, "up"]);
            // Full checksums on the wire: veth otherwise sends partial ones.
            net.exec(ns, &["ethtool", "-K", ifname, "tx", "off"]);
        }
        // The client reaches the VIPs through lb; lb has no route for them (the kernel drops
        // what XDP passes, which is fine: the counters are the observation).
        net.exec(
            &net.cl,
            &["ip", "route", "add", "198.18.100.0/24", "via", LB4],
        );
        net.exec(
            &net.cl,
            &["ip", "-6", "route", "add", "2001:2:0:100::/64", "via", LB6],
        );
        net
    }

    fn remove(&self) {
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

    /// Attaches the program to the `lb` veth end, from a thread inside `lb`.
    fn attach(&self, mode: XdpMode) -> Steering {
        let (ns, ifname) = (self.lb.clone(), self.lb_if.clone());
        std::thread::spawn(move || {
            enter_netns(&ns);
            Steering::attach(&ifname, mode).expect("attach")
        })
        .join()
        .expect("attach thread")
    }

    /// Whether `ip -d link show` lists an XDP program on the `lb` end.
    fn has_xdp(&self) -> bool {
        let out = self.exec(&self.lb, &["ip", "-d", "link", "show", "dev", &self.lb_if]);
        String::from_utf8_lossy(&out.stdout).contains("xdp")
    }

    /// Polls until no XDP program is attached (link release may trail a process's exit).
    fn wait_no_xdp(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !self.has_xdp() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Runs a python3 snippet in the client namespace.
    fn client_py(&self, code: &str) -> String {
        let out = self.exec(&self.cl, &["python3", "-c", code]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Sends `count` UDP datagrams of `len` bytes from the client to `dst:port`, from
    /// source port `sport` (0: any).
    fn udp(&self, dst: &str, port: u16, count: usize, len: usize, sport: u16) {
        let family = if dst.contains(':') {
            "AF_INET6"
        } else {
            "AF_INET"
        };
        let code = format!(
            "import socket\ns=socket.socket(socket.{family},socket.SOCK_DGRAM)\n\
             s.bind(('',{sport}))\n\
             for _ in range({count}): s.sendto(b'x'*{len},('{dst}',{port}))\n"
        );
        self.client_py(&code);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
    }
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

fn delta(after: SteerCounters, before: SteerCounters) -> SteerCounters {
    SteerCounters {
        pass_not_ip: after.pass_not_ip - before.pass_not_ip,
        pass_malformed: after.pass_malformed - before.pass_malformed,
        pass_not_ours: after.pass_not_ours - before.pass_not_ours,
        pass_icmp: after.pass_icmp - before.pass_icmp,
        match_frontend: after.match_frontend - before.match_frontend,
        match_snat: after.match_snat - before.match_snat,
        match_backend: after.match_backend - before.match_backend,
        match_fragment: after.match_fragment - before.match_fragment,
        match_icmp_error: after.match_icmp_error - before.match_icmp_error,
        match_ipv6_ext: after.match_ipv6_ext - before.match_ipv6_ext,
        redirected: after.redirected - before.redirected,
        no_socket: after.no_socket - before.no_socket,
        held: after.held - before.held,
        match_cluster_ip: after.match_cluster_ip - before.match_cluster_ip,
        match_service_cidr: after.match_service_cidr - before.match_service_cidr,
    }
}

/// The XDP_PASS path: ping (v4 and v6) and a TCP connection to a non-VIP address work with
/// the program attached, and none of it is matched.
#[test]
fn pass_path_keeps_ping_and_tcp_working() {
    let net = Net::new();
    let mut steer = net.attach(XdpMode::Auto);
    eprintln!("attached in {:?} mode", steer.attached());
    steer
        .set_frontends(&[(ip(VIP4), TCP, 8080), (ip(VIP6), TCP, 8080)], &[])
        .unwrap();

    net.exec(&net.cl, &["ping", "-c", "2", "-i", "0.2", "-W", "2", LB4]);
    net.exec(
        &net.cl,
        &["ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", LB6],
    );

    let mut server = Reaped(Command::new("ip")
        .args(["netns", "exec", &net.lb, "python3", "-c"])
        .arg(format!(
            "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('{LB4}',8080))\ns.listen(1)\nprint('ready',flush=True)\ns.settimeout(10)\n\
             c,_=s.accept()\nc.sendall(b'hello')\nc.close()\n"
        ))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn server"));
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let got = net.client_py(&format!(
        "import socket\ns=socket.create_connection(('{LB4}',8080),timeout=5)\nprint(s.recv(16).decode())"
    ));
    assert_eq!(got.trim(), "hello");

    let c = steer.counters().unwrap();
    assert!(c.pass_icmp >= 4, "echo and ND are passed: {c:?}");
    assert!(c.pass_not_ours >= 3, "TCP to a non-VIP is passed: {c:?}");
    assert!(c.pass_not_ip >= 1, "ARP is passed: {c:?}");
    assert_eq!(c.matched(), 0, "{c:?}");
    steer.detach().unwrap();
}

/// Frames xvs owns are matched (and, with no socket, passed as `no_socket`); frames to a VIP
/// on another port are not.
#[test]
fn owned_frames_are_matched_and_others_passed() {
    let net = Net::new();
    let mut steer = net.attach(XdpMode::Auto);
    steer
        .set_frontends(
            &[
                (ip(VIP4), UDP, 5353),
                (ip(VIP6), UDP, 5353),
                (ip(VIP4), TCP, 80),
            ],
            &[],
        )
        .unwrap();
    steer.set_snat(&[ip(LB4), ip(LB6)], (30000, 39999)).unwrap();
    steer.set_backends(&[(ip(CL4), UDP, 7000)]).unwrap();
    // Resolve neighbours first, so the deltas below hold only the test's frames.
    net.exec(&net.cl, &["ping", "-c", "1", "-W", "2", LB4]);
    net.exec(&net.cl, &["ping", "-6", "-c", "1", "-W", "2", LB6]);

    check(
        &steer,
        "UDP to VIP4 frontend",
        &|| net.udp(VIP4, 5353, 10, 32, 0),
        &|d| d.match_frontend == 10 && d.no_socket == 10,
    );
    check(
        &steer,
        "UDP to VIP6 frontend",
        &|| net.udp(VIP6, 5353, 10, 32, 0),
        &|d| d.match_frontend == 10 && d.no_socket == 10,
    );
    check(
        &steer,
        "UDP to a VIP, not a frontend port",
        &|| net.udp(VIP4, 5354, 5, 32, 0),
        &|d| d.matched() == 0 && d.pass_not_ours >= 5,
    );
    check(
        &steer,
        "UDP to the SNAT range",
        &|| net.udp(LB4, 35000, 3, 32, 0),
        &|d| d.match_snat == 3,
    );
    check(
        &steer,
        "UDP to SNAT v6 range",
        &|| net.udp(LB6, 30000, 3, 32, 0),
        &|d| d.match_snat == 3,
    );
    check(
        &steer,
        "UDP to the SNAT address, outside the range",
        &|| net.udp(LB4, 40000, 3, 32, 0),
        &|d| d.matched() == 0 && d.pass_not_ours >= 3,
    );
    check(
        &steer,
        "UDP from a backend (nat reply)",
        &|| net.udp(LB4, 9999, 2, 32, 7000),
        &|d| d.match_backend == 2,
    );
    // 2000 bytes over a 1500 MTU: the first fragment has the (non-frontend) port and is
    // passed, the later one carries no ports and is steered because its destination is a VIP.
    check(
        &steer,
        "fragmented UDP to VIP4",
        &|| net.udp(VIP4, 5354, 1, 2000, 0),
        &|d| d.match_fragment == 1 && d.match_frontend == 0 && d.pass_not_ours >= 1,
    );
    check(
        &steer,
        "fragmented UDP to VIP6",
        &|| net.udp(VIP6, 5354, 1, 2000, 0),
        &|d| d.match_fragment == 1 && d.match_frontend == 0 && d.pass_not_ours >= 1,
    );
    check(
        &steer,
        "fragmented UDP to a VIP6 frontend",
        &|| net.udp(VIP6, 5353, 1, 2000, 0),
        &|d| d.match_fragment == 1 && d.match_frontend == 1,
    );
    // A destination-options header: the program leaves it to userspace when the
    // destination is a VIP, whatever the port.
    check(
        &steer,
        "IPv6 with a destination-options header to a VIP",
        &|| {
            net.client_py(&format!(
                "import socket\ns=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM)\n\
             s.setsockopt(socket.IPPROTO_IPV6,socket.IPV6_DSTOPTS,bytes([0,0,1,4,0,0,0,0]))\n\
             s.sendto(b'x',('{VIP6}',5354))\n"
            ));
        },
        &|d| d.match_ipv6_ext == 1,
    );
    // ICMP errors: steered when sent to a SNAT address, or when the packet they quote came
    // from a VIP; an error about someone else's packet is the kernel's.
    for (dst, quoted_src, steered) in [
        (LB4, "198.18.0.99", true),
        (VIP4, VIP4, true),
        (VIP4, CL4, false),
        (LB6, "2001:2::99", true),
        (VIP6, VIP6, true),
        (VIP6, CL6, false),
    ] {
        check(
            &steer,
            &format!("ICMP error to {dst} quoting a packet from {quoted_src}"),
            &|| {
                net.client_py(&icmp_error(dst, quoted_src));
            },
            &|d| {
                if steered {
                    d.match_icmp_error == 1
                } else {
                    d.matched() == 0 && d.pass_icmp >= 1
                }
            },
        );
    }
    check(
        &steer,
        "ICMP echo",
        &|| {
            net.exec(&net.cl, &["ping", "-c", "1", "-W", "2", LB4]);
        },
        &|d| d.matched() == 0 && d.pass_icmp >= 1,
    );
    check(
        &steer,
        "ARP",
        &|| {
            net.exec(&net.cl, &["ip", "neigh", "flush", "all"]);
            net.exec(&net.cl, &["ping", "-c", "1", "-W", "2", LB4]);
        },
        &|d| d.matched() == 0 && d.pass_not_ip >= 1,
    );

    // Shrinking the frontends stops the steering of what is gone.
    steer.set_frontends(&[(ip(VIP6), UDP, 5353)], &[]).unwrap();
    check(
        &steer,
        "UDP to a removed frontend",
        &|| net.udp(VIP4, 5353, 4, 32, 0),
        &|d| d.matched() == 0 && d.pass_not_ours >= 4,
    );
    check(
        &steer,
        "UDP to a kept frontend",
        &|| net.udp(VIP6, 5353, 4, 32, 0),
        &|d| d.match_frontend == 4,
    );
}

/// Runs `send`, then asserts `want` on the counter deltas (polling briefly: the
/// receiving side runs in softirq) and that nothing was redirected.
/// A ClusterIP's every TCP/UDP port and every address of a Service CIDR are steered (the
/// pipeline rejects or drops what no frontend serves); other addresses, other protocols and
/// the node's own addresses are not; emptied maps steer nothing more.
#[test]
fn clusterip_ports_and_service_cidrs_are_steered() {
    let net = Net::new();
    let mut steer = net.attach(XdpMode::Auto);
    steer
        .set_frontends(
            &[(ip(VIP4), TCP, 80), (ip(VIP6), TCP, 80)],
            &[ip(VIP4), ip(VIP6)],
        )
        .unwrap();
    let cidrs: Vec<vocab::Cidr> = ["198.18.100.128/25", "2001:2:0:100::8000/113"]
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
    steer.set_service_cidrs(&cidrs).unwrap();
    net.exec(&net.cl, &["ping", "-c", "1", "-W", "2", LB4]);
    net.exec(&net.cl, &["ping", "-6", "-c", "1", "-W", "2", LB6]);

    for (dst, port, what) in [(VIP4, 9999, "v4"), (VIP6, 53, "v6")] {
        check(
            &steer,
            &format!("UDP to a ClusterIP's unserved port ({what})"),
            &|| net.udp(dst, port, 3, 32, 0),
            &|d| d.match_cluster_ip == 3 && d.no_socket == 3,
        );
    }
    check(
        &steer,
        "TCP to a ClusterIP's unserved port",
        &|| {
            net.client_py(&format!(
                "import socket\ns=socket.socket()\ns.settimeout(0.2)\ns.connect_ex(('{VIP4}',81))\n"
            ));
        },
        &|d| d.match_cluster_ip >= 1 && d.match_frontend == 0,
    );
    check(
        &steer,
        "TCP to a ClusterIP's frontend",
        &|| {
            net.client_py(&format!(
                "import socket\ns=socket.socket()\ns.settimeout(0.2)\ns.connect_ex(('{VIP4}',80))\n"
            ));
        },
        &|d| d.match_frontend >= 1 && d.match_cluster_ip == 0,
    );
    for (dst, what) in [("198.18.100.200", "v4"), ("2001:2:0:100::8001", "v6")] {
        check(
            &steer,
            &format!("UDP to a Service CIDR's address ({what})"),
            &|| net.udp(dst, 53, 2, 32, 0),
            &|d| d.match_service_cidr == 2,
        );
    }
    check(
        &steer,
        "UDP outside the CIDRs, to no VIP",
        &|| net.udp("198.18.100.50", 53, 2, 32, 0),
        &|d| d.matched() == 0 && d.pass_not_ours >= 2,
    );
    check(
        &steer,
        "UDP to the node's own address",
        &|| net.udp(LB4, 5000, 2, 32, 0),
        &|d| d.matched() == 0 && d.pass_not_ours >= 2,
    );
    check(
        &steer,
        "ICMP echo to a ClusterIP",
        &|| {
            let _ = Command::new("ip")
                .args(["netns", "exec", &net.cl, "ping", "-c", "1", "-W", "1", VIP4])
                .output();
        },
        &|d| d.matched() == 0 && d.pass_icmp >= 1,
    );

    // Emptied: nothing of it is steered any more.
    steer
        .set_frontends(&[(ip(VIP4), TCP, 80), (ip(VIP6), TCP, 80)], &[])
        .unwrap();
    steer.set_service_cidrs(&[]).unwrap();
    check(
        &steer,
        "UDP to a former ClusterIP's port",
        &|| net.udp(VIP4, 9999, 2, 32, 0),
        &|d| d.matched() == 0 && d.pass_not_ours >= 2,
    );
    check(
        &steer,
        "UDP to a former Service CIDR",
        &|| net.udp("198.18.100.200", 53, 2, 32, 0),
        &|d| d.matched() == 0 && d.pass_not_ours >= 2,
    );
}

fn check(steer: &Steering, what: &str, send: &dyn Fn(), want: &dyn Fn(&SteerCounters) -> bool) {
    let before = steer.counters().unwrap();
    send();
    // The receiving side runs in softirq: give it a moment rather than a fixed sleep.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut d = delta(steer.counters().unwrap(), before);
    while !want(&d) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        d = delta(steer.counters().unwrap(), before);
    }
    assert!(want(&d), "{what}: {d:?}");
    assert_eq!(d.redirected, 0, "{what}: no socket is registered: {d:?}");
    assert_eq!(d.held, 0, "{what}: no hold is set: {d:?}");
}

/// Python for a raw ICMP (v4) or ICMPv6 "port unreachable" to `dst`, quoting a UDP packet
/// from `quoted_src`.
fn icmp_error(dst: &str, quoted_src: &str) -> String {
    if dst.contains(':') {
        format!(
            "import socket,struct\n\
             inner=struct.pack('!IHBB',0x60000000,8,17,64)+socket.inet_pton(socket.AF_INET6,'{quoted_src}')+socket.inet_pton(socket.AF_INET6,'{CL6}')+struct.pack('!HHHH',5353,40000,8,0)\n\
             msg=struct.pack('!BBHI',1,4,0,0)+inner\n\
             s=socket.socket(socket.AF_INET6,socket.SOCK_RAW,socket.IPPROTO_ICMPV6)\n\
             s.sendto(msg,('{dst}',0))\n"
        )
    } else {
        format!(
            "import socket,struct\n\
             inner=struct.pack('!BBHHHBBH4s4s',0x45,0,28,0,0,64,17,0,socket.inet_aton('{quoted_src}'),socket.inet_aton('{CL4}'))+struct.pack('!HHHH',5353,40000,8,0)\n\
             msg=struct.pack('!BBHI',3,3,0,0)+inner\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP)\n\
             s.sendto(msg,('{dst}',0))\n"
        )
    }
}

/// detach, drop, and the death of the attaching process each leave no program behind; a
/// program an earlier run attached the legacy way is replaced.
#[test]
fn nothing_is_left_attached() {
    let net = Net::new();

    let steer = net.attach(XdpMode::Generic);
    assert!(net.has_xdp());
    steer.detach().unwrap();
    assert!(net.wait_no_xdp(), "detach left a program");

    let steer = net.attach(XdpMode::Auto);
    assert!(net.has_xdp());
    drop(steer);
    assert!(net.wait_no_xdp(), "drop left a program");

    // A child process attaches and is killed.
    let mut child = Reaped(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_attaches_and_waits",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("XVS_STEER_CHILD", format!("{} {}", net.lb, net.lb_if))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let reader = BufReader::new(child.0.stdout.take().unwrap());
    let attached = reader
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("child attached"));
    assert!(attached, "child did not attach");
    assert!(net.has_xdp());
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert!(net.wait_no_xdp(), "a killed process left a program");

    // A leftover attached through netlink (as an old xvs or `ip link` would): attach removes
    // it by name and takes over.
    let obj = concat!(env!("OUT_DIR"), "/steer.o");
    net.exec(
        &net.lb,
        &[
            "ip",
            "link",
            "set",
            "dev",
            &net.lb_if,
            "xdpgeneric",
            "obj",
            obj,
            "sec",
            "xdp",
        ],
    );
    assert!(net.has_xdp());
    let steer = net.attach(XdpMode::Auto);
    drop(steer);
    assert!(net.wait_no_xdp(), "the legacy leftover survived");
}

/// Helper for [`nothing_is_left_attached`]: runs only in the child it spawns.
#[test]
#[ignore = "helper process for nothing_is_left_attached"]
fn child_attaches_and_waits() {
    let Ok(spec) = std::env::var("XVS_STEER_CHILD") else {
        return;
    };
    let (ns, ifname) = spec.split_once(' ').unwrap();
    enter_netns(ns);
    let _steer = Steering::attach(ifname, XdpMode::Auto).unwrap();
    println!("child attached");
    std::thread::sleep(Duration::from_secs(60));
}

/// An unknown interface is a clear error, not a panic.
#[test]
fn unknown_interface_is_an_error() {
    let err = Steering::attach("xvs-nonexist0", XdpMode::Auto).unwrap_err();
    assert!(err.to_string().contains("xvs-nonexist0"), "{err}");
}

/// A child process killed and reaped on drop, so a failed assertion leaves none behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
