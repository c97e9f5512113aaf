//! The neighbour resolver against a real kernel: two network namespaces joined by two veth
//! pairs. The reader runs in namespace A (ports 0 and 1 are `xa…0` and `xa…1`); namespace B
//! holds the peers, which answer ARP and neighbour discovery.
//!
//! Needs root (network namespaces); skipped otherwise. Addresses are from the benchmarking
//! ranges 198.18.0.0/15 and 2001:2::/48 only, and every namespace is deleted on every exit.
//!
//! Only one thread at a time enters namespace A (`setns`); the watcher's runtime is built
//! outside it, so its threads stay in the test's own namespace: the watcher must watch A
//! all the same, because it is spawned from a thread in A.

use std::net::IpAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fastpath::snapshot::{L2Table, Neighbour, Route};
use slowpath::neigh::{NeighError, NeighbourWatcher, read_l2, solicit};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

/// The longest a watcher may take to end once cancelled.
const JOIN_WAIT: Duration = Duration::from_secs(10);

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root for network namespaces");
    }
    root
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn run(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn mac_of(ns: &str, interface: &str) -> [u8; 6] {
    // `ip netns exec` mounts the namespace's own /sys.
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat"])
        .arg(format!("/sys/class/net/{interface}/address"))
        .output()
        .expect("run ip netns exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_mac(String::from_utf8(out.stdout).unwrap().trim())
}

/// `interface`'s link-local address in `ns`, once duplicate address detection is done
/// (a tentative address answers no neighbour solicitation); up to 5 s.
fn link_local_of(ns: &str, interface: &str) -> IpAddr {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = Command::new("ip")
            .args([
                "-n", ns, "-6", "-o", "addr", "show", "dev", interface, "scope", "link",
            ])
            .output()
            .expect("run ip");
        let text = String::from_utf8_lossy(&out.stdout);
        let addr = text
            .split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .and_then(|a| a.split('/').next())
            .map(ip);
        match addr {
            Some(a) if !text.contains("tentative") => return a,
            _ => assert!(
                Instant::now() < deadline,
                "no usable link-local address on {interface}: {text}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn parse_mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

/// Namespaces A and B and two veth pairs, deleted on drop (even when a test panics).
struct Lab {
    a: String,
    b: String,
    /// Port 0 and port 1 in A.
    ports: [String; 2],
    /// Their peers in B.
    peers: [String; 2],
}

impl Lab {
    fn new() -> Lab {
        let id = format!(
            "{}{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let lab = Lab {
            a: format!("xvsna{id}"),
            b: format!("xvsnb{id}"),
            ports: [format!("xa{id}p0"), format!("xa{id}p1")],
            peers: [format!("xb{id}p0"), format!("xb{id}p1")],
        };
        assert!(lab.ports.iter().chain(&lab.peers).all(|n| n.len() <= 15));
        lab.delete();
        run(&["netns", "add", &lab.a]);
        run(&["netns", "add", &lab.b]);
        for (port, peer) in lab.ports.iter().zip(&lab.peers) {
            run(&[
                "link", "add", port, "netns", &lab.a, "type", "veth", "peer", "name", peer,
                "netns", &lab.b,
            ]);
        }
        let (a, b) = (lab.a.as_str(), lab.b.as_str());
        let [p0, p1] = [lab.ports[0].as_str(), lab.ports[1].as_str()];
        let [q0, q1] = [lab.peers[0].as_str(), lab.peers[1].as_str()];
        for (ns, dev, v4, v6) in [
            (a, p0, "198.18.0.1/24", "2001:2::1/64"),
            (a, p1, "198.18.1.1/24", "2001:2:0:1::1/64"),
            (b, q0, "198.18.0.2/24", "2001:2::2/64"),
            (b, q1, "198.18.1.2/24", "2001:2:0:1::2/64"),
        ] {
            run(&["-n", ns, "addr", "add", v4, "dev", dev]);
            run(&["-n", ns, "-6", "addr", "add", v6, "dev", dev, "nodad"]);
            run(&["-n", ns, "link", "set", dev, "up"]);
        }
        run(&["-n", a, "link", "set", "lo", "up"]);
        run(&["-n", b, "link", "set", "lo", "up"]);
        run(&[
            "-n",
            a,
            "route",
            "add",
            "default",
            "via",
            "198.18.0.254",
            "dev",
            p0,
        ]);
        run(&[
            "-n",
            a,
            "-6",
            "route",
            "add",
            "default",
            "via",
            "2001:2:0:1::fe",
            "dev",
            p1,
        ]);
        lab
    }

    fn interfaces(&self) -> Vec<String> {
        self.ports.to_vec()
    }

    /// Runs `f` on a thread that has entered namespace A; threads it spawns stay there.
    fn in_a<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.a);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(&path).expect("open netns");
                // SAFETY: a valid namespace descriptor; only this thread moves.
                let rc = unsafe {
                    libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET)
                };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    fn delete(&self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.delete();
    }
}

/// Reads until `pred` holds, for up to 2 s.
fn poll_l2(interfaces: &[String], pred: impl Fn(&L2Table) -> bool) -> L2Table {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let t = read_l2(interfaces).unwrap();
        if pred(&t) || Instant::now() > deadline {
            return t;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn route(t: &L2Table, prefix: &str) -> Option<Route> {
    let prefix = prefix.parse().unwrap();
    t.routes.iter().find(|r| r.prefix == prefix).copied()
}

fn neighbour(t: &L2Table, addr: &str) -> Option<Neighbour> {
    t.neighbours.iter().find(|n| n.ip == ip(addr)).copied()
}

#[test]
fn reads_port_macs_routes_and_permanent_neighbours() {
    if !is_root() {
        return;
    }
    let lab = Lab::new();
    let (p0, p1) = (&lab.ports[0], &lab.ports[1]);
    run(&[
        "-n",
        &lab.a,
        "neigh",
        "add",
        "198.18.0.77",
        "lladdr",
        "02:00:00:00:00:77",
        "nud",
        "permanent",
        "dev",
        p0,
    ]);
    run(&[
        "-n",
        &lab.a,
        "-6",
        "neigh",
        "add",
        "2001:2:0:1::77",
        "lladdr",
        "02:00:00:00:01:77",
        "nud",
        "permanent",
        "dev",
        p1,
    ]);
    let t = lab.in_a(|| read_l2(&lab.interfaces()).unwrap());

    assert_eq!(t.port_macs, vec![mac_of(&lab.a, p0), mac_of(&lab.a, p1)]);
    let connected = |prefix: &str, port| Route {
        prefix: prefix.parse().unwrap(),
        port,
        gateway: None,
    };
    assert_eq!(
        route(&t, "198.18.0.0/24"),
        Some(connected("198.18.0.0/24", 0))
    );
    assert_eq!(
        route(&t, "198.18.1.0/24"),
        Some(connected("198.18.1.0/24", 1))
    );
    assert_eq!(route(&t, "2001:2::/64"), Some(connected("2001:2::/64", 0)));
    assert_eq!(
        route(&t, "2001:2:0:1::/64"),
        Some(connected("2001:2:0:1::/64", 1))
    );
    let default4 = route(&t, "0.0.0.0/0").expect("IPv4 default route");
    assert_eq!(
        (default4.port, default4.gateway),
        (0, Some(ip("198.18.0.254")))
    );
    let default6 = route(&t, "::/0").expect("IPv6 default route");
    assert_eq!(
        (default6.port, default6.gateway),
        (1, Some(ip("2001:2:0:1::fe")))
    );
    // Only the main table: no local or broadcast routes.
    assert!(route(&t, "198.18.0.1/32").is_none(), "{:?}", t.routes);

    assert_eq!(
        neighbour(&t, "198.18.0.77"),
        Some(Neighbour {
            ip: ip("198.18.0.77"),
            mac: [2, 0, 0, 0, 0, 0x77],
            port: Some(0)
        })
    );
    assert_eq!(
        neighbour(&t, "2001:2:0:1::77"),
        Some(Neighbour {
            ip: ip("2001:2:0:1::77"),
            mac: [2, 0, 0, 0, 1, 0x77],
            port: Some(1)
        })
    );
    // Multicast groups the kernel joins on its own are never next hops.
    assert!(t.neighbours.iter().all(|n| !n.ip.is_multicast()), "{t:?}");
    // An unchanged kernel reads the same.
    assert_eq!(lab.in_a(|| read_l2(&lab.interfaces()).unwrap()), t);
}

#[test]
fn solicit_resolves_the_peer_and_skips_incomplete_entries() {
    if !is_root() {
        return;
    }
    let lab = Lab::new();
    let (p0, p1) = (lab.ports[0].clone(), lab.ports[1].clone());
    let peer0 = mac_of(&lab.b, &lab.peers[0]);
    let peer1 = mac_of(&lab.b, &lab.peers[1]);
    let interfaces = lab.interfaces();
    // A link-local next hop needs its link's index (the scope) to be reached at all. The
    // peer's is the kernel's own (no address outside the benchmarking ranges is added).
    let peer1_ll = link_local_of(&lab.b, &lab.peers[1]);
    let peer1_ll_s = peer1_ll.to_string();
    lab.in_a(|| {
        let t = read_l2(&interfaces).unwrap();
        assert!(neighbour(&t, "198.18.0.2").is_none());
        solicit(ip("198.18.0.2"), &p0).unwrap();
        solicit(ip("2001:2:0:1::2"), &p1).unwrap();
        solicit(peer1_ll, &p1).unwrap();
        // Nobody has this one: it stays INCOMPLETE, then FAILED, never usable.
        solicit(ip("198.18.0.99"), &p0).unwrap();
        let t = poll_l2(&interfaces, |t| {
            neighbour(t, "198.18.0.2").is_some()
                && neighbour(t, "2001:2:0:1::2").is_some()
                && neighbour(t, &peer1_ll_s).is_some()
        });
        assert_eq!(
            neighbour(&t, "198.18.0.2"),
            Some(Neighbour {
                ip: ip("198.18.0.2"),
                mac: peer0,
                port: Some(0)
            })
        );
        assert_eq!(
            neighbour(&t, "2001:2:0:1::2"),
            Some(Neighbour {
                ip: ip("2001:2:0:1::2"),
                mac: peer1,
                port: Some(1)
            })
        );
        assert_eq!(
            neighbour(&t, &peer1_ll_s),
            Some(Neighbour {
                ip: peer1_ll,
                mac: peer1,
                port: Some(1)
            })
        );
        assert!(neighbour(&t, "198.18.0.99").is_none(), "{:?}", t.neighbours);
    });
}

/// A two-worker runtime like the daemon's, built on the calling thread (so outside A).
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Joins `watcher`, failing the test if it takes over `JOIN_WAIT`.
fn join_within_wait(rt: &Runtime, watcher: NeighbourWatcher) {
    rt.block_on(async { tokio::time::timeout(JOIN_WAIT, watcher.join()).await })
        .expect("the watcher ends within JOIN_WAIT of the cancellation");
}

#[test]
fn watcher_reports_changes_and_solicits_requests() {
    if !is_root() {
        return;
    }
    let lab = Lab::new();
    let peer1 = mac_of(&lab.b, &lab.peers[1]);
    let rt = runtime();
    // The runtime's threads are not in A: there, A's interfaces do not exist.
    let interfaces = lab.interfaces();
    let elsewhere = rt
        .block_on(rt.spawn(async move { read_l2(&interfaces) }))
        .unwrap();
    assert!(
        matches!(elsewhere, Err(NeighError::NoSuchInterface { .. })),
        "{elsewhere:?}"
    );
    let shutdown = CancellationToken::new();
    let (tx, rx) = mpsc::channel();
    // A long period: changes must arrive through netlink events and requests.
    let watcher = lab.in_a(|| {
        NeighbourWatcher::spawn(
            rt.handle(),
            lab.interfaces(),
            Duration::from_secs(30),
            move |t| {
                let _ = tx.send(t);
            },
            shutdown.clone(),
        )
        .unwrap()
    });
    let recv = |pred: &dyn Fn(&L2Table) -> bool| -> L2Table {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(t) if pred(&t) => return t,
                Ok(_) => {}
                Err(_) => panic!("no matching table within 2 s; {:?}", watcher.last_error()),
            }
        }
    };
    let first = recv(&|_| true);
    assert_eq!(first.port_macs.len(), 2);
    assert_eq!(first.port_macs[0], mac_of(&lab.a, &lab.ports[0]));

    run(&[
        "-n",
        &lab.a,
        "neigh",
        "add",
        "198.18.0.88",
        "lladdr",
        "02:00:00:00:00:88",
        "nud",
        "permanent",
        "dev",
        &lab.ports[0],
    ]);
    recv(&|t| neighbour(t, "198.18.0.88").is_some());

    // On-link on port 1: the watcher finds the port from the routes and solicits (through a
    // socket opened in A, from a thread that is not).
    watcher.request(ip("198.18.1.2"));
    let t = recv(&|t| neighbour(t, "198.18.1.2").is_some());
    assert_eq!(neighbour(&t, "198.18.1.2").unwrap().mac, peer1);
    assert_eq!(watcher.last_error(), None);
    shutdown.cancel();
    join_within_wait(&rt, watcher);
}

#[test]
fn cancelling_ends_the_watcher_and_drops_its_callback() {
    if !is_root() {
        return;
    }
    let lab = Lab::new();
    let rt = runtime();
    let shutdown = CancellationToken::new();
    let alive = Arc::new(());
    let (tx, rx) = mpsc::channel();
    let watcher = lab.in_a(|| {
        let alive = Arc::clone(&alive);
        NeighbourWatcher::spawn(
            rt.handle(),
            lab.interfaces(),
            Duration::from_millis(10),
            move |t| {
                let _alive = &alive;
                let _ = tx.send(t);
            },
            shutdown.clone(),
        )
        .unwrap()
    });
    rx.recv_timeout(Duration::from_secs(2))
        .expect("the first table");
    let requester = watcher.requester();
    shutdown.cancel();
    join_within_wait(&rt, watcher);
    assert_eq!(Arc::strong_count(&alive), 1, "on_change is dropped by join");
    // A requester that outlives the watcher is harmless.
    requester.request(ip("198.18.0.2"));
    // A change after join reaches nobody.
    run(&[
        "-n",
        &lab.a,
        "neigh",
        "add",
        "198.18.0.89",
        "lladdr",
        "02:00:00:00:00:89",
        "nud",
        "permanent",
        "dev",
        &lab.ports[0],
    ]);
    while let Ok(t) = rx.try_recv() {
        assert!(neighbour(&t, "198.18.0.89").is_none(), "a call after join");
    }
    assert_eq!(rx.try_recv(), Err(mpsc::TryRecvError::Disconnected));
}

#[test]
fn a_missing_interface_is_named() {
    let name = format!("xvsnone{}", std::process::id());
    let err = read_l2(&["lo".to_string(), name.clone()]).unwrap_err();
    assert!(
        matches!(&err, NeighError::NoSuchInterface { name: n } if *n == name),
        "{err:?}"
    );
    assert!(err.to_string().contains(&name), "{err}");
}
