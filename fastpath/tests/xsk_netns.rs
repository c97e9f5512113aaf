//! A real fastpath worker on AF_XDP sockets between two network namespaces (needs root).
//!
//! ```text
//!  ns client            ns lb (the worker's sockets, queue 0)            ns backend
//!  xc<id> 198.18.0.1 ── xl<id> (port 0)  [worker]  xm<id> (port 1) ── xb<id> 198.18.1.1
//! ```
//!
//! The client sends UDP datagrams to the VIP 198.18.100.1:5353 (full-NAT service); the worker
//! rewrites them to the backend, from the SNAT address 198.18.1.100, out of port 1; the
//! backend echoes; the worker rewrites the echo back (VIP → client) out of port 0; the client
//! checks payloads and source. libxdp's default XDP program feeds the sockets (every frame of
//! queue 0), so ARP/IPv6 noise is avoided with static neighbours and IPv6 disabled.
//! Namespaces are named per pid and counter, and removed on every exit path. A second test
//! drives `Worker::poll` on its own thread under a counting allocator: zero allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use fastpath::pipeline::{Pipeline, PipelineConfig};
use fastpath::settings::flow_table_config;
use fastpath::snapshot::{L2Table, ServiceSpec, Snapshot, SnapshotBuilder};
use fastpath::worker::{Worker, WorkerSpec, WorkerStats, spawn_worker};
use fastpath::xsk::{Program, XskSet, XskSettings, worker_count};
use flowtable::FlowTable;
use lb_algos::AffinityTable;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command line (words split on whitespace), panicking on failure.
fn sh(line: &str) {
    let args: Vec<&str> = line.split_whitespace().collect();
    run(&args).unwrap_or_else(|e| panic!("{e}"));
}

/// [`sh`] inside namespace `ns`.
fn in_ns(ns: &str, line: &str) {
    sh(&format!("ip netns exec {ns} {line}"));
}

/// Owns the namespaces, the child processes and the worker's stop flag; undoes all on drop.
struct Lab {
    namespaces: Vec<String>,
    children: Vec<Child>,
    stop: Arc<AtomicBool>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.namespaces {
            // Deleting a namespace deletes the veth ends in it, and so their peers.
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
}

fn mac_of(ns: &str, ifname: &str) -> String {
    let path = format!("/sys/class/net/{ifname}/address");
    let out = run(&["ip", "netns", "exec", ns, "cat", &path]).unwrap_or_else(|e| panic!("{e}"));
    out.trim().to_owned()
}

/// Runs `f` on a thread that has entered network namespace `ns` (sockets and XDP programs
/// are created in the thread's namespace; threads it spawns inherit it).
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    std::thread::spawn(move || {
        // SAFETY: setns on a valid namespace fd affects only this thread.
        let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("netns thread")
}

const ECHO_SERVER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# Room for a burst of several rings (SO_RCVBUFFORCE: root may pass rmem_max).
s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)
s.bind(("198.18.1.1", 5353))
s.settimeout(40)
print("ready", flush=True)
while True:
    try:
        data, peer = s.recvfrom(2048)
    except socket.timeout:
        break
    s.sendto(b"echo:" + data, peer)
"#;

const CLIENT: &str = r#"
import socket, sys
want = int(sys.argv[1])
burst = int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)
s.bind(("198.18.0.1", 0))
s.settimeout(0.5)
ok = 0
bad = 0
if burst:
    # Send `burst` datagrams back to back, then collect the echoes.
    sent = set()
    for i in range(burst):
        msg = b"burst-%d" % i
        sent.add(b"echo:" + msg)
        s.sendto(msg, ("198.18.100.1", 5353))
    s.settimeout(2)
    try:
        while ok < burst:
            data, peer = s.recvfrom(2048)
            if data in sent and peer == ("198.18.100.1", 5353):
                sent.discard(data)
                ok += 1
            else:
                bad += 1
    except socket.timeout:
        pass
    print("ok=%d bad=%d" % (ok, bad), flush=True)
    sys.exit(0)
for i in range(60):
    msg = b"ping-%d" % i
    s.sendto(msg, ("198.18.100.1", 5353))
    try:
        while True:
            data, peer = s.recvfrom(2048)
            if data == b"echo:" + msg and peer == ("198.18.100.1", 5353):
                ok += 1
                break
            bad += 1
    except socket.timeout:
        pass
    if ok >= want:
        break
print("ok=%d bad=%d" % (ok, bad), flush=True)
"#;

fn wait_with_deadline(child: &mut Child, deadline: Instant) -> bool {
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Everything one scenario needs, built through the real config → snapshot path.
struct Setup {
    lab: Lab,
    ns_c: String,
    ns_l: String,
    cfg: config::Config,
    l2: L2Table,
    services: Vec<ServiceSpec>,
    builder: SnapshotBuilder,
    snapshot: Arc<Snapshot>,
    pipeline: Option<Pipeline>,
    /// A second pipeline over the same tables, for the worker that takes over.
    second: Option<Pipeline>,
}

/// Builds the three namespaces and two veth pairs, starts the echo server, and prepares a
/// pipeline whose snapshot knows both neighbours (with their ports) and both port MACs.
/// `None` when not root.
fn setup() -> Option<Setup> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (network namespaces, AF_XDP)");
        return None;
    }
    let id = format!(
        "{}{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let (ns_c, ns_l, ns_b) = (
        format!("xvs-xc-{id}"),
        format!("xvs-xl-{id}"),
        format!("xvs-xb-{id}"),
    );
    // Interface names ≤ 15 chars: "xc" + pid (≤ 7 digits) + counter.
    let (if_c, if_lc, if_lb, if_b) = (
        format!("xc{id}"),
        format!("xl{id}"),
        format!("xm{id}"),
        format!("xb{id}"),
    );
    assert!(if_lc.len() <= 15);
    let mut lab = Lab {
        namespaces: Vec::new(),
        children: Vec::new(),
        stop: Arc::new(AtomicBool::new(false)),
    };
    for ns in [&ns_c, &ns_l, &ns_b] {
        let _ = run(&["ip", "netns", "del", ns]); // a leftover of the same name
        sh(&format!("ip netns add {ns}"));
        lab.namespaces.push(ns.clone());
        in_ns(ns, "sysctl -qw net.ipv6.conf.all.disable_ipv6=1");
        in_ns(ns, "sysctl -qw net.ipv6.conf.default.disable_ipv6=1");
        in_ns(ns, "ip link set lo up");
    }
    // One queue per veth end, so every frame lands on queue 0.
    let q1 = "numtxqueues 1 numrxqueues 1";
    for (a, ans, b, bns) in [(&if_c, &ns_c, &if_lc, &ns_l), (&if_b, &ns_b, &if_lb, &ns_l)] {
        sh(&format!(
            "ip link add {a} netns {ans} {q1} type veth peer name {b} netns {bns} {q1}"
        ));
    }
    for (ns, ifname) in [
        (&ns_c, &if_c),
        (&ns_l, &if_lc),
        (&ns_l, &if_lb),
        (&ns_b, &if_b),
    ] {
        in_ns(ns, &format!("ip link set {ifname} up"));
    }
    // Senders must compute UDP checksums themselves.
    in_ns(&ns_c, &format!("ethtool -K {if_c} tx off"));
    in_ns(&ns_b, &format!("ethtool -K {if_b} tx off"));
    let (mac_c, mac_lc, mac_lb, mac_b) = (
        mac_of(&ns_c, &if_c),
        mac_of(&ns_l, &if_lc),
        mac_of(&ns_l, &if_lb),
        mac_of(&ns_b, &if_b),
    );
    // The client reaches the VIP through the worker's port 0; the backend answers the SNAT
    // address through port 1 (static neighbours: the sockets take ARP too).
    in_ns(&ns_c, &format!("ip addr add 198.18.0.1/24 dev {if_c}"));
    in_ns(&ns_c, &format!("ip route add 198.18.100.1/32 dev {if_c}"));
    in_ns(
        &ns_c,
        &format!("ip neigh replace 198.18.100.1 lladdr {mac_lc} dev {if_c} nud permanent"),
    );
    in_ns(&ns_b, &format!("ip addr add 198.18.1.1/24 dev {if_b}"));
    in_ns(
        &ns_b,
        &format!("ip neigh replace 198.18.1.100 lladdr {mac_lb} dev {if_b} nud permanent"),
    );

    // The backend echoes.
    let mut server = Command::new("ip")
        .args(["netns", "exec", &ns_b, "python3", "-u", "-c", ECHO_SERVER])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn echo server");
    let stdout = server.stdout.take().unwrap();
    lab.children.push(server);
    let mut ready = String::new();
    BufReader::new(stdout).read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");

    // config → snapshot (neighbours on their ports, port MACs) → pipeline.
    let toml = format!(
        r#"
[dataplane]
interfaces = [{{ name = "{if_lc}" }}, {{ name = "{if_lb}" }}]
cores = [0]
mode = "fullnat"
snat_addresses = ["198.18.1.100"]
umem_frames = 1024
frame_size = 2048
rx_ring_size = 256
tx_ring_size = 256
batch_size = 32
idle_backoff = "1ms"

[flowtable]
capacity = 4096

[[services]]
name = "echo"
vip = "198.18.100.1"
port = 5353
protocol = "udp"
scheduler = "rr"
backends = [{{ addr = "198.18.1.1:5353" }}]

[[neighbours]]
ip = "198.18.1.1"
mac = "{mac_b}"

[[neighbours]]
ip = "198.18.0.1"
mac = "{mac_c}"
"#
    );
    let cfg = config::parse(&toml, "xsk_netns.toml").unwrap_or_else(|e| panic!("{e}"));
    let xsk = XskSettings::from_config(&cfg.dataplane);
    assert_eq!(worker_count(&xsk), 1);
    let mut l2 = L2Table::from_config(&cfg);
    let backend: IpAddr = "198.18.1.1".parse().unwrap();
    for n in &mut l2.neighbours {
        n.port = Some(if n.ip == backend { 1 } else { 0 });
    }
    l2.port_macs = vec![parse_mac(&mac_lc), parse_mac(&mac_lb)];
    let services = ServiceSpec::from_config(&cfg);
    let mut builder = SnapshotBuilder::from_config(&cfg);
    let snapshot = Arc::new(builder.build(&services, &l2).unwrap());
    let epoch = Instant::now();
    let flows = Arc::new(FlowTable::new(flow_table_config(&cfg), epoch).unwrap());
    let affinity = Arc::new(AffinityTable::new(1024, epoch));
    let mut pc = PipelineConfig::from_config(&cfg, 0, worker_count(&xsk));
    pc.mac = parse_mac(&mac_lc);
    let second = Pipeline::new(
        pc.clone(),
        Arc::clone(&flows),
        Arc::clone(&affinity),
        Arc::clone(&snapshot),
    );
    let pipeline = Pipeline::new(pc, flows, affinity, Arc::clone(&snapshot));
    Some(Setup {
        second: Some(second),
        lab,
        ns_c,
        ns_l,
        cfg,
        l2,
        services,
        builder,
        snapshot,
        pipeline: Some(pipeline),
    })
}

fn parse_mac(m: &str) -> [u8; 6] {
    let v: Vec<u8> = m
        .split(':')
        .map(|x| u8::from_str_radix(x, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

impl Setup {
    /// Opens the worker's sockets inside the lb namespace (libxdp's default program).
    fn open_sockets(&self) -> XskSet {
        let dp = XskSettings::from_config(&self.cfg.dataplane);
        let set = in_netns(&self.ns_l, move || {
            XskSet::open_with(&dp, 0, Program::LibxdpDefault)
                .unwrap_or_else(|e| panic!("open sockets: {e}"))
        });
        eprintln!("bind mode on veth: {}; sockets {:?}", set.mode(), set.fds());
        assert_eq!(set.fds().len(), 2);
        assert_eq!(set.mode(), "copy", "veth has no zero-copy AF_XDP");
        set
    }

    /// Runs the client until `want` good echoes came back (at most 60 tries of 0.5 s);
    /// returns (good, wrong) echoes.
    fn client_round(&mut self, want: usize) -> (usize, usize) {
        self.client(want, 0)
    }

    /// Sends `n` datagrams back to back, then collects echoes for up to 2 s; returns (good,
    /// wrong) echoes.
    fn client_burst(&mut self, n: usize) -> (usize, usize) {
        self.client(0, n)
    }

    fn client(&mut self, want: usize, burst: usize) -> (usize, usize) {
        let client = self.start_client(want, burst);
        self.end_client(client)
    }

    /// Starts the client (see [`Setup::client`]) without waiting for it.
    fn start_client(&self, want: usize, burst: usize) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.ns_c, "python3", "-u", "-c", CLIENT])
            .args([want.to_string(), burst.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn client")
    }

    /// Waits (at most 40 s) for a client [`Setup::start_client`] started; its (good, wrong)
    /// echoes.
    fn end_client(&mut self, mut client: Child) -> (usize, usize) {
        let out = client.stdout.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(40);
        let done = wait_with_deadline(&mut client, deadline);
        self.lab.children.push(client);
        assert!(done, "client did not finish in time");
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        eprintln!("client: {}", line.trim());
        let field = |k: &str| -> usize {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("ok="), field("bad="))
    }

    /// Removes everything and checks that no namespace is left.
    fn finish(self) {
        let names = self.lab.namespaces.clone();
        drop(self.lab);
        for ns in names {
            assert!(!std::path::Path::new(&format!("/run/netns/{ns}")).exists());
        }
    }
}

#[test]
fn udp_echo_through_a_fullnat_worker() {
    let Some(mut s) = setup() else { return };
    let generation0 = s.snapshot.generation;
    let published = Arc::new(ArcSwap::new(Arc::clone(&s.snapshot)));
    let sockets = s.open_sockets();
    let mut spec = WorkerSpec::from_config(&s.cfg.dataplane, s.cfg.dataplane.cores.listed(), 0);
    assert_eq!(spec.core, Some(0));
    spec.core = None; // do not pin a test thread on this shared machine
    let pipeline = s.pipeline.take().unwrap();
    let (handle, stats) = spawn_worker(
        spec,
        sockets,
        pipeline,
        Arc::clone(&published),
        Arc::clone(&s.lab.stop),
    )
    .unwrap();

    let (ok, bad) = s.client_round(10);
    assert!(ok >= 10, "only {ok} echoes came back ({bad} wrong ones)");
    assert_eq!(bad, 0, "echoes with a wrong payload or source");

    // A new snapshot generation is picked up by the running worker; flows keep working.
    let snap2 = Arc::new(s.builder.build(&s.services, &s.l2).unwrap());
    let generation1 = snap2.generation;
    assert!(generation1 > generation0);
    published.store(snap2);
    let (ok2, bad2) = s.client_round(5);
    assert!(
        ok2 >= 5,
        "after the snapshot swap only {ok2} echoes ({bad2} wrong)"
    );

    // A burst larger than a batch and than one copy-mode sendto (32 frames): the tx rings
    // must be kicked until drained. UDP sockets may drop a few; most must come back.
    let (ok3, bad3) = s.client_burst(100);
    assert!(ok3 >= 80, "burst: only {ok3} of 100 echoes ({bad3} wrong)");
    assert_eq!(bad3, 0, "burst: echoes with a wrong payload or source");

    s.lab.stop.store(true, Ordering::Relaxed);
    handle.join().expect("worker thread");
    let c = stats.read();
    eprintln!("worker counters: {c:?}");
    assert_eq!(c.generation, generation1);
    // Each good echo crossed the worker twice (request and reply).
    assert!(c.rx >= 2 * (ok + ok2 + ok3) as u64, "{c:?}");
    assert!(c.tx >= 2 * (ok + ok2 + ok3) as u64, "{c:?}");
    assert!(c.new_flows >= 3, "{c:?}");
    assert_eq!(c.tx_ring_full, 0, "{c:?}");
    assert_eq!(c.tx_no_port, 0, "{c:?}");
    assert_eq!(c.slow, 0, "{c:?}");
    s.finish();
}

/// Worker 1 of a hand-over ([`Setup::start_exported`]).
struct Exported {
    /// Its sockets and UMEM as another process would adopt them.
    export: fastpath::xsk::handover::Export,
    /// Frames in the UMEM.
    total: u64,
    spec: WorkerSpec,
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Option<XskSet>>,
}

impl Setup {
    /// Opens the worker's sockets, exports them (before the worker owns the set, as the
    /// daemon does) and starts worker 1 on them (not pinned), with the first pipeline.
    fn start_exported(&mut self, published: &Arc<ArcSwap<Snapshot>>) -> Exported {
        let sockets = self.open_sockets();
        let export = sockets.export().expect("export");
        let total = sockets.frames() as u64;
        let mut spec =
            WorkerSpec::from_config(&self.cfg.dataplane, self.cfg.dataplane.cores.listed(), 0);
        spec.core = None;
        let stop = Arc::new(AtomicBool::new(false));
        let (handle, _) = spawn_worker(
            spec.clone(),
            sockets,
            self.pipeline.take().unwrap(),
            Arc::clone(published),
            Arc::clone(&stop),
        )
        .unwrap();
        Exported {
            export,
            total,
            spec,
            stop,
            handle,
        }
    }
}

/// A duplicate of `fd`, as SCM_RIGHTS would give another process.
fn dup(fd: std::os::fd::RawFd) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: duplicating an open descriptor; the copy is ours alone.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    assert!(d >= 0, "dup: {}", std::io::Error::last_os_error());
    // SAFETY: freshly duplicated, owned by nobody else.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(d) }
}

/// A hand-over as `xvs run --takeover` does it, inside one process: worker 1 stops, its
/// sockets and UMEM are exported, adopted from duplicated descriptors (checked: a wrong
/// description, a descriptor that is no AF_XDP socket, free lists naming a frame twice or
/// outside the UMEM are refused), and worker 2 continues from the same rings: a burst sent
/// while nobody polled is answered, so the frames in flight at the switch were kept.
#[test]
fn handed_over_sockets_keep_serving_what_arrived_meanwhile() {
    use fastpath::xsk::handover::FrameState;
    let Some(mut s) = setup() else { return };
    let published = Arc::new(ArcSwap::new(Arc::clone(&s.snapshot)));
    let Exported {
        export,
        total,
        spec,
        stop: stop1,
        handle: h1,
    } = s.start_exported(&published);
    assert_eq!(export.sockets.len(), 2);
    let dp = XskSettings::from_config(&s.cfg.dataplane);
    let adopt = |meta: &fastpath::xsk::handover::SetMeta, sockets: Vec<std::os::fd::OwnedFd>| {
        XskSet::adopt(&dp, 0, meta, dup(export.umem.as_raw_fd()), sockets)
    };
    let socks = || export.sockets.iter().map(|&fd| dup(fd)).collect::<Vec<_>>();
    // Adopted (rings mapped) while worker 1 still runs and moves the rings' indices.
    let mut new = adopt(&export.meta, socks()).expect("adopt");
    let (ok, bad) = s.client_round(5);
    assert!(ok >= 5 && bad == 0, "before: {ok} good, {bad} wrong echoes");

    stop1.store(true, Ordering::Relaxed);
    let old = h1
        .join()
        .unwrap()
        .expect("the worker hands its sockets back");
    let state = old.frame_state();
    let in_fill: u64 = state.in_fill.iter().map(|&n| u64::from(n)).sum();
    assert!(
        in_fill > 0,
        "the fill rings hold frames at the switch: {state:?}"
    );
    assert!(state.free.len() as u64 + in_fill <= total);

    // The burst arrives while nobody polls: the kernel receives into the fill rings.
    let client = s.start_client(0, 100);
    std::thread::sleep(Duration::from_millis(300));

    // Refused: ports swapped, a UDP socket for an AF_XDP one.
    let mut swapped = export.meta.clone();
    swapped.ports.reverse();
    let e = adopt(&swapped, socks()).unwrap_err();
    assert_eq!(e.field, "ports", "{e}");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let e = adopt(
        &export.meta,
        vec![dup(udp.as_raw_fd()), dup(export.sockets[1])],
    )
    .unwrap_err();
    assert_eq!(e.field, "socket", "{e}");
    let e = adopt(&export.meta, vec![dup(export.sockets[0])]).unwrap_err();
    assert_eq!(e.field, "sockets", "{e}");
    let twice = FrameState {
        free: vec![state.free[0], state.free[0]],
        in_fill: state.in_fill.clone(),
    };
    assert_eq!(new.resume(twice).unwrap_err().field, "free");
    let outside = FrameState {
        free: vec![total * u64::from(s.cfg.dataplane.frame_size)],
        in_fill: state.in_fill.clone(),
    };
    assert_eq!(new.resume(outside).unwrap_err().field, "free");
    // Frames given to the fill ring and not yet received may fill it and the rx ring.
    let rx = s.cfg.dataplane.rx_ring_size;
    let deep = FrameState {
        free: state.free.clone(),
        in_fill: vec![rx + 1, 0],
    };
    new.resume(deep)
        .expect("a fill ring and part of the rx ring");
    let deeper = FrameState {
        free: state.free.clone(),
        in_fill: vec![2 * rx + 1, 0],
    };
    assert_eq!(new.resume(deeper).unwrap_err().field, "in_fill");
    new.resume(state).expect("resume");

    let stop2 = Arc::new(AtomicBool::new(false));
    let (h2, stats2) = spawn_worker(
        spec,
        new,
        s.second.take().unwrap(),
        Arc::clone(&published),
        Arc::clone(&stop2),
    )
    .unwrap();
    let (ok2, bad2) = s.end_client(client);
    assert!(
        ok2 >= 80,
        "after the hand-over only {ok2} of 100 echoes ({bad2} wrong)"
    );
    assert_eq!(bad2, 0);
    let (ok3, bad3) = s.client_round(5);
    assert!(
        ok3 >= 5 && bad3 == 0,
        "after: {ok3} good, {bad3} wrong echoes"
    );
    stop2.store(true, Ordering::Relaxed);
    h2.join().unwrap();
    let c = stats2.read();
    assert!(c.rx >= 2 * (ok2 + ok3) as u64, "{c:?}");
    // The old set (and libxdp's program it attached) goes last.
    drop(old);
    s.finish();
}

/// A takeover's pause kept receiving (`fastpath::xsk::gap`): worker 1 stops and hands its
/// sockets over; a keeper holds them while a burst of three rx rings' worth arrives and no
/// worker polls, giving the fill rings the free frames (it holds more than twice an rx
/// ring); worker 2 forwards every held frame to the backend, the held frames first, none
/// dropped for a full tx ring. Without the keeper the
/// kernel keeps at most an rx ring's worth (what the fill ring held: 256 here).
#[test]
fn a_kept_pause_outlasts_the_rx_ring() {
    use fastpath::xsk::gap::GapKeeper;
    let Some(mut s) = setup() else { return };
    let published = Arc::new(ArcSwap::new(Arc::clone(&s.snapshot)));
    let Exported {
        export,
        spec,
        stop: stop1,
        handle: h1,
        ..
    } = s.start_exported(&published);
    let dp = XskSettings::from_config(&s.cfg.dataplane);
    let socks = export.sockets.iter().map(|&fd| dup(fd)).collect();
    let mut new =
        XskSet::adopt(&dp, 0, &export.meta, dup(export.umem.as_raw_fd()), socks).expect("adopt");
    let (ok, bad) = s.client_round(5);
    assert!(ok >= 5 && bad == 0, "before: {ok} good, {bad} wrong echoes");
    stop1.store(true, Ordering::Relaxed);
    let old = h1
        .join()
        .unwrap()
        .expect("the worker hands its sockets back");
    new.resume(old.frame_state()).expect("resume");

    let keeper = GapKeeper::start(vec![new]);
    let rx = s.cfg.dataplane.rx_ring_size as usize;
    let burst = 3 * rx;
    let client = s.start_client(0, burst);
    std::thread::sleep(Duration::from_millis(600));
    let (mut sets, kept) = keeper.stop();
    eprintln!("keeper: {kept:?}");
    // (The keeper's rounds are late on a loaded machine, and the kernel drops while an rx
    // ring waits full: not all of the burst, but twice what an rx ring alone keeps.)
    assert!(
        kept.held as usize > 2 * rx && kept.filled as usize > rx,
        "the keeper held more than twice an rx ring ({rx}) and refilled: {kept:?}"
    );
    let stop2 = Arc::new(AtomicBool::new(false));
    let (h2, stats2) = spawn_worker(
        spec,
        sets.pop().unwrap(),
        s.second.take().unwrap(),
        Arc::clone(&published),
        Arc::clone(&stop2),
    )
    .unwrap();
    let (ok2, bad2) = s.end_client(client);
    stop2.store(true, Ordering::Relaxed);
    let back = h2.join().unwrap().expect("worker 2 hands its sockets back");
    let c = stats2.read();
    let to_backend = stats2.rings[1].as_ref().unwrap().read();
    eprintln!("worker 2: {c:?}, backend port {to_backend:?}");
    // Every held request went out to the backend, none dropped for a full tx ring. (Not
    // every echo comes back: the test's worker sleeps 1 ms when idle, and the backend's
    // burst of echoes can overflow the other socket's rx ring meanwhile.)
    assert!(
        to_backend.transmitted >= kept.held,
        "{to_backend:?} {kept:?}"
    );
    assert_eq!(c.tx_ring_full, 0, "{c:?}");
    assert!(ok2 > 0 && bad2 == 0, "{ok2} good, {bad2} wrong echoes");
    drop(back);
    drop(old);
    s.finish();
}

/// Counts allocations made by threads that set [`COUNTING`], while [`ARMED`].
struct CountingAlloc;

static ARMED: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards to the system allocator; the counting touches only atomics and a
// const-initialised thread-local (no allocation).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) && COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) && COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// The worker loop allocates nothing per packet: after a warm-up round (first flow, first
/// snapshot load on the thread), a second round of echoes and a snapshot swap run with the
/// counter armed on the polling thread.
#[test]
fn worker_loop_allocates_nothing() {
    let Some(mut s) = setup() else { return };
    let published = Arc::new(ArcSwap::new(Arc::clone(&s.snapshot)));
    let sockets = s.open_sockets();
    let spec = WorkerSpec::from_config(&s.cfg.dataplane, s.cfg.dataplane.cores.listed(), 0);
    let pipeline = s.pipeline.take().unwrap();
    let stats = Arc::new(WorkerStats::default());
    let mut worker = Worker::new(
        spec,
        sockets,
        pipeline,
        Arc::clone(&published),
        Arc::clone(&s.lab.stop),
        Arc::clone(&stats),
    );
    let stop = Arc::clone(&s.lab.stop);
    let poller = std::thread::spawn(move || {
        COUNTING.with(|c| c.set(true));
        while !stop.load(Ordering::Relaxed) {
            if !worker.poll() {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    });

    let (ok, _) = s.client_round(5);
    assert!(ok >= 5, "warm-up: only {ok} echoes");
    ARMED.store(true, Ordering::SeqCst);
    published.store(Arc::new(s.builder.build(&s.services, &s.l2).unwrap()));
    let (ok2, _) = s.client_round(10);
    ARMED.store(false, Ordering::SeqCst);
    assert!(ok2 >= 10, "only {ok2} echoes");

    s.lab.stop.store(true, Ordering::Relaxed);
    poller.join().expect("poller");
    let c = stats.read();
    eprintln!("worker counters: {c:?}");
    assert!(c.rx >= 2 * (ok + ok2) as u64, "{c:?}");
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "the worker loop allocated while forwarding"
    );
    s.finish();
}
