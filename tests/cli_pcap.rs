//! `xvs pcap` through the real binary: `--report -` puts the per-frame report on stdout (a
//! pipe for `jq`) and makes no file named `-`; pcapng, Linux cooked (SLL, SLL2) and raw-IP
//! captures, built here byte by byte (and read back by libpcap through `tcpdump -r`) or taken
//! by `tcpdump -i any` in test-made network namespaces, replay with the same verdicts and
//! output frames as the Ethernet capture of the same packets.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const CONFIG: &str = r#"
[dataplane]
mode = "fullnat"
snat_addresses = ["198.18.1.254"]

[[services]]
name = "dns"
vip = "198.18.100.53"
port = 53
protocol = "udp"
backends = [{ addr = "198.18.1.1:53" }]

[[neighbours]]
ip = "198.18.1.1"
mac = "02:00:00:00:01:01"
"#;

/// An Ethernet/IPv4/UDP frame 198.18.0.1:5000 → dst:53.
fn udp_frame(dst: [u8; 4]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0xcc, 1, 0x08, 0x00];
    let mut ip = vec![0x45, 0, 0, 32, 0, 0, 0, 0, 64, 17, 0, 0, 198, 18, 0, 1];
    ip.extend_from_slice(&dst);
    let c = fastpath::wire::checksum::checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0x13, 0x88, 0, 53, 0, 12, 0, 0, 1, 2, 3, 4]);
    f
}

#[test]
fn a_report_of_dash_goes_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("xvs.toml"), CONFIG).unwrap();
    let mut w = pcap::PcapWriter::new(Vec::new(), pcap::Resolution::Micros).unwrap();
    let t = Duration::new(1_700_000_000, 0);
    w.write(t, &udp_frame([198, 18, 100, 53])).unwrap();
    w.write(t, &udp_frame([198, 18, 0, 9])).unwrap();
    std::fs::write(dir.path().join("in.pcap"), w.finish().unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .current_dir(dir.path())
        .args([
            "pcap", "--config", "xvs.toml", "--in", "in.pcap", "--out", "out.pcap",
        ])
        .args(["--report", "-"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "one line per frame");
    assert_eq!(lines[0]["verdict"], "tx");
    assert_ne!(lines[1]["verdict"], "tx");
    assert!(!dir.path().join("-").exists(), "no file named -");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2 frames"),
        "the summary stays on stderr"
    );
}

/// The pipeline's MAC (`fastpath::pipeline::DEFAULT_MAC`, which a replay uses) and a client's.
const XVS_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0xcc, 1];

/// An IPv4/UDP packet 198.18.0.1:5000 → dst:53 with `ttl`.
fn udp_packet(dst: [u8; 4], ttl: u8) -> Vec<u8> {
    let mut f = udp_frame(dst);
    f[14 + 8] = ttl;
    f[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
    let c = fastpath::wire::checksum::checksum(&f[14..34]);
    f[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
    f.split_off(14)
}

/// The packets every format carries: to the VIP (tx), TTL 1 (drop), elsewhere (pass), an
/// ARP request (pass).
fn packets() -> Vec<(u16, Vec<u8>)> {
    let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
    arp.extend_from_slice(&CLIENT_MAC);
    arp.extend_from_slice(&[198, 18, 0, 1, 0, 0, 0, 0, 0, 0, 198, 18, 0, 2]);
    vec![
        (0x0800, udp_packet([198, 18, 100, 53], 64)),
        (0x0800, udp_packet([198, 18, 100, 53], 1)),
        (0x0800, udp_packet([198, 18, 0, 9], 64)),
        (0x0806, arp),
    ]
}

fn ethernet(src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = XVS_MAC.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A Linux cooked v1 header (packet type "to us", Ethernet, the client's MAC).
fn sll(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0, 0, 0, 1, 0, 6];
    h.extend_from_slice(&CLIENT_MAC);
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(&ethertype.to_be_bytes());
    h.extend_from_slice(payload);
    h
}

/// A Linux cooked v2 header (interface 2, Ethernet, "to us", the client's MAC).
fn sll2(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = ethertype.to_be_bytes().to_vec();
    h.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 1, 0, 6]);
    h.extend_from_slice(&CLIENT_MAC);
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(payload);
    h
}

const T0: Duration = Duration::new(1_700_000_000, 250_000);

fn ts(i: usize) -> Duration {
    T0 + Duration::from_millis(i as u64)
}

/// A classic pcap of `frames` with `linktype`.
fn pcap(linktype: u32, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut w = pcap::PcapWriter::new(Vec::new(), pcap::Resolution::Micros).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write(ts(i), f).unwrap();
    }
    let mut bytes = w.finish().unwrap();
    bytes[20..24].copy_from_slice(&linktype.to_le_bytes());
    bytes
}

/// A pcapng in one byte order: interface 0 Ethernet, interface 1 SLL2 (`mixed`; else
/// Ethernet too) in nanoseconds and with options, the packets alternating between them, a
/// name-resolution block in between. (libpcap reads only files whose interfaces share one
/// link type; xvs reads both.)
fn pcapng(be: bool, mixed: bool) -> Vec<u8> {
    let u16b = |v: u16| if be { v.to_be_bytes() } else { v.to_le_bytes() };
    let u32b = |v: u32| if be { v.to_be_bytes() } else { v.to_le_bytes() };
    let mut out = Vec::new();
    let mut block = |ty: u32, mut body: Vec<u8>| {
        body.resize(body.len().next_multiple_of(4), 0);
        let len = u32b(body.len() as u32 + 12);
        out.extend_from_slice(&u32b(ty));
        out.extend_from_slice(&len);
        out.extend_from_slice(&body);
        out.extend_from_slice(&len);
    };
    let mut shb = u32b(0x1a2b_3c4d).to_vec();
    shb.extend_from_slice(&u16b(1));
    shb.extend_from_slice(&u16b(0));
    shb.extend_from_slice(&[0xff; 8]);
    block(0x0a0d_0d0a, shb);
    let mut idb0 = u16b(1).to_vec();
    idb0.extend_from_slice(&[0, 0]);
    idb0.extend_from_slice(&u32b(0));
    block(1, idb0);
    let mut idb1 = u16b(if mixed { 276 } else { 1 }).to_vec();
    idb1.extend_from_slice(&[0, 0]);
    idb1.extend_from_slice(&u32b(262_144));
    for (code, value) in [(2u16, &b"any"[..]), (9, &[9][..])] {
        idb1.extend_from_slice(&u16b(code));
        idb1.extend_from_slice(&u16b(value.len() as u16));
        idb1.extend_from_slice(value);
        idb1.resize(idb1.len().next_multiple_of(4), 0);
    }
    idb1.extend_from_slice(&[0; 4]);
    block(1, idb1);
    // A name resolution block: 198.18.0.1 is "client".
    let mut nrb = u16b(1).to_vec();
    nrb.extend_from_slice(&u16b(11));
    nrb.extend_from_slice(&[198, 18, 0, 1]);
    nrb.extend_from_slice(b"client\0");
    nrb.resize(nrb.len().next_multiple_of(4), 0);
    nrb.extend_from_slice(&[0; 4]);
    block(4, nrb);
    for (i, (ethertype, p)) in packets().iter().enumerate() {
        let (iface, data, count) = if i % 2 == 0 {
            (
                0u32,
                ethernet(CLIENT_MAC, *ethertype, p),
                ts(i).as_micros() as u64,
            )
        } else if mixed {
            (1, sll2(*ethertype, p), ts(i).as_nanos() as u64)
        } else {
            (
                1,
                ethernet(CLIENT_MAC, *ethertype, p),
                ts(i).as_nanos() as u64,
            )
        };
        let mut epb = u32b(iface).to_vec();
        epb.extend_from_slice(&u32b((count >> 32) as u32));
        epb.extend_from_slice(&u32b(count as u32));
        epb.extend_from_slice(&u32b(data.len() as u32));
        epb.extend_from_slice(&u32b(data.len() as u32));
        epb.extend_from_slice(&data);
        block(6, epb);
    }
    out
}

struct Replay {
    report: Vec<serde_json::Value>,
    out: Vec<pcap::Record>,
    stderr: String,
}

/// `xvs pcap` on `input`; panics unless it succeeds.
fn replay(dir: &Path, name: &str, input: &[u8]) -> Replay {
    let path = dir.join(format!("{name}.in"));
    std::fs::write(&path, input).unwrap();
    replay_file(dir, name, &path)
}

fn replay_file(dir: &Path, name: &str, input: &Path) -> Replay {
    std::fs::write(dir.join("xvs.toml"), CONFIG).unwrap();
    let output = dir.join(format!("{name}.out.pcap"));
    let out = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args(["pcap", "--config"])
        .arg(dir.join("xvs.toml"))
        .arg("--in")
        .arg(input)
        .arg("--out")
        .arg(&output)
        .args(["--report", "-"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{name}: {stderr}");
    let report = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let bytes = std::fs::read(&output).unwrap();
    let out = pcap::PcapReader::new(&bytes[..])
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    Replay {
        report,
        out,
        stderr,
    }
}

/// libpcap (through tcpdump) reads `path` and finds `n` packets: the hand-built files are
/// what real tools read.
fn libpcap_reads(path: &Path, n: usize) {
    let out = Command::new("tcpdump")
        .args(["-n", "-r"])
        .arg(path)
        .output()
        .expect("tcpdump (scripts/deps installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), n, "{}: {text}", path.display());
}

#[test]
fn pcapng_cooked_and_raw_captures_replay_like_ethernet() {
    let dir = tempfile::tempdir().unwrap();
    let pk = packets();
    let eth: Vec<_> = pk
        .iter()
        .map(|(t, p)| ethernet(CLIENT_MAC, *t, p))
        .collect();
    let want = replay(dir.path(), "ethernet", &pcap(1, &eth));
    let verdicts: Vec<_> = want.report.iter().map(|l| l["verdict"].clone()).collect();
    assert_eq!(
        verdicts,
        ["tx", "drop", "pass", "pass"],
        "{:?}",
        want.report
    );
    assert_eq!(want.out.len(), 1);
    assert_eq!(&want.out[0].data[14 + 16..14 + 20], &[198, 18, 1, 1]);

    let sll1: Vec<_> = pk.iter().map(|(t, p)| sll(*t, p)).collect();
    let sll2s: Vec<_> = pk.iter().map(|(t, p)| sll2(*t, p)).collect();
    // Raw IP carries no ARP.
    let raw: Vec<_> = pk[..3].iter().map(|(_, p)| p.clone()).collect();
    let cases = [
        ("pcapng-le", pcapng(false, false)),
        ("pcapng-be", pcapng(true, false)),
        ("pcapng-mixed-le", pcapng(false, true)),
        ("pcapng-mixed-be", pcapng(true, true)),
        ("sll", pcap(113, &sll1)),
        ("sll2", pcap(276, &sll2s)),
        ("raw", pcap(101, &raw)),
        ("ipv4", pcap(228, &raw)),
    ];
    for (name, bytes) in cases {
        let got = replay(dir.path(), name, &bytes);
        if !name.contains("mixed") {
            libpcap_reads(&dir.path().join(format!("{name}.in")), got.report.len());
        }
        let n = got.report.len();
        assert_eq!(got.report, want.report[..n], "{name}");
        assert_eq!(
            got.out, want.out,
            "{name}: the same frames at the same times"
        );
        assert!(
            got.stderr.contains(&format!("{n} frames")),
            "{name}: {}",
            got.stderr
        );
    }

    // A packet that is neither IP nor ARP (802.2 LLC) is skipped, counted, and the rest
    // replay as before.
    let mut with_llc = sll2s.clone();
    with_llc.insert(1, sll2(0x0004, &[0x42, 0x42, 3, 0, 0]));
    let got = replay(dir.path(), "llc", &pcap(276, &with_llc));
    assert_eq!(
        got.report[1],
        serde_json::json!({"frame": 2, "verdict": "skip", "reason": "not_ip"})
    );
    let mut rest = got.report.clone();
    rest.remove(1);
    for (l, w) in rest.iter_mut().zip(&want.report) {
        l["frame"] = w["frame"].clone();
    }
    assert_eq!(rest, want.report);
    assert!(
        got.stderr.contains("1 skipped (not_ip 1)"),
        "{}",
        got.stderr
    );
}

#[test]
fn unknown_link_types_are_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("xvs.toml"), CONFIG).unwrap();
    // 105: IEEE 802.11.
    std::fs::write(dir.path().join("wifi.pcap"), pcap(105, &[vec![0; 30]])).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .current_dir(dir.path())
        .args([
            "pcap",
            "--config",
            "xvs.toml",
            "--in",
            "wifi.pcap",
            "--out",
            "o.pcap",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unsupported link type 105") && err.contains("276 (Linux cooked v2"),
        "{err}"
    );
}

/// Network namespaces of one test, deleted on drop (failures included).
struct Netns(Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts `tcpdump ARGS -w path -c 3 -U udp` in `ns` and returns once it listens.
fn tcpdump(ns: &str, args: &[&str], path: &Path) -> std::process::Child {
    use std::io::BufRead;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "timeout", "30", "tcpdump"])
        .args(args)
        .arg("-w")
        .arg(path)
        .args(["-c", "3", "-U", "udp"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tcpdump (scripts/deps installs it)");
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("listening on") => break,
            Some(Ok(_)) => {}
            _ => panic!("tcpdump {args:?} did not start listening"),
        }
    }
    // Keep reading so that its exit statistics never block on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    child
}

/// Real captures of the same three datagrams: `tcpdump -i any` (SLL2, today's default),
/// `tcpdump -y LINUX_SLL -i any` (SLL) and `tcpdump -i v1` (Ethernet), taken in a netns
/// that receives them from a client netns over a veth pair; all three replay alike.
#[test]
fn tcpdump_any_captures_replay_like_the_ethernet_capture() {
    let tag = format!("xvspc{}", std::process::id());
    let (c, s) = (format!("{tag}c"), format!("{tag}s"));
    let mut netns = Netns(Vec::new());
    for ns in [&c, &s] {
        sh(&["ip", "netns", "add", ns]);
        netns.0.push(ns.clone());
    }
    for ns in [&c, &s] {
        // No IPv6: no router solicitations or MLD reports in the captures.
        sh(&[
            "ip",
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ]);
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
    }
    sh(&[
        "ip",
        "-n",
        &c,
        "link",
        "add",
        "v0",
        "address",
        "02:00:00:00:cc:01",
        "type",
        "veth",
        "peer",
        "name",
        "v1",
        "netns",
        &s,
        "address",
        "02:00:00:00:00:01",
    ]);
    sh(&["ip", "-n", &c, "addr", "add", "198.18.0.1/24", "dev", "v0"]);
    sh(&["ip", "-n", &s, "addr", "add", "198.18.0.2/24", "dev", "v1"]);
    sh(&["ip", "-n", &c, "link", "set", "v0", "up"]);
    sh(&["ip", "-n", &s, "link", "set", "v1", "up"]);
    sh(&[
        "ip",
        "-n",
        &c,
        "route",
        "add",
        "198.18.100.0/24",
        "via",
        "198.18.0.2",
    ]);

    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("any-sll2", vec!["-i", "any"]),
        ("any-sll", vec!["-y", "LINUX_SLL", "-i", "any"]),
        ("ethernet", vec!["-i", "v1"]),
    ];
    let mut dumps: Vec<_> = files
        .iter()
        .map(|(name, args)| tcpdump(&s, args, &dir.path().join(name)))
        .collect();
    // To the VIP twice (one flow), then elsewhere.
    let send = "import socket\n\
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        s.bind(('198.18.0.1', 5000))\n\
        for dst in ['198.18.100.53', '198.18.100.53', '198.18.100.9']:\n    s.sendto(b'query', (dst, 53))\n";
    sh(&["ip", "netns", "exec", &c, "python3", "-c", send]);
    for d in &mut dumps {
        assert!(d.wait().unwrap().success(), "tcpdump captured 3 datagrams");
    }
    let linktype = |name: &str| {
        let b = std::fs::read(dir.path().join(name)).unwrap();
        u32::from_le_bytes([b[20], b[21], b[22], b[23]])
    };
    assert_eq!(linktype("any-sll2"), 276);
    assert_eq!(linktype("any-sll"), 113);
    assert_eq!(linktype("ethernet"), 1);

    let want = replay_file(dir.path(), "ethernet", &dir.path().join("ethernet"));
    let verdicts: Vec<_> = want.report.iter().map(|l| l["verdict"].clone()).collect();
    assert_eq!(verdicts, ["tx", "tx", "pass"], "{:?}", want.report);
    for name in ["any-sll2", "any-sll"] {
        let got = replay_file(dir.path(), name, &dir.path().join(name));
        assert_eq!(got.report, want.report, "{name}");
        // The same frames (each capture took its own timestamps).
        let frames = |r: &Replay| r.out.iter().map(|r| r.data.clone()).collect::<Vec<_>>();
        assert_eq!(frames(&got), frames(&want), "{name}");
    }
}
