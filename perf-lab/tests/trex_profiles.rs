//! The TRex profiles in `perf-lab/trex`, compiled by TRex's own profile compiler
//! (`../shared/tools/trex-compile`: TRex's Python client library, the compiler `stl-sim --json`
//! and `astf-sim --json` run, without a TRex server, a NIC or DPDK) with several tunable sets.
//!
//! STL (`perf_lab.py`): the measured streams carry no latency statistics (TRex's `-m` does not
//! scale latency streams) and one low-rate latency stream per port does; old-style and
//! argparse tunables give the same streams; the flows the field engine produces, counted by
//! running its program (tuple generators, writes, checksum fixes) over its whole period, are
//! exactly the flows asked; every stream fixes its IPv4 and L4 checksums last; IMIX and fixed
//! sizes; distinct flow-stats ids and flows per port; addresses, ports and MACs against the
//! configs shipped beside the profiles (`xvs.toml`, `trex_cfg.yaml`) and perf-lab's rig; and a
//! sample of the packets TRex would send (field values written in, checksums computed as the
//! fix instructions say, the port's MACs from `trex_cfg.yaml`) replayed through
//! `xvs pcap --config xvs.toml`: every one transmitted to a backend, with valid checksums.
//! ASTF (`conn_rate.py`): request and response sizes, connection rate, the ports and
//! addresses against `xvs.toml`.
//!
//! Not privileged. The compiler is looked for at `../shared/tools/trex-compile` beside the
//! repository (CI has `../shared` beside the clone): without it every test here fails, saying
//! so. `PERF_LAB_STL_PROFILE=PATH` checks another STL profile instead (an older revision's).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use perf_lab::frame::{checksum, checksums_ok};
use perf_lab::rig;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("perf-lab is in the workspace")
        .to_path_buf()
}

fn trex_dir() -> PathBuf {
    repo().join("perf-lab/trex")
}

/// `../shared/tools/trex-compile`; a missing compiler fails the test.
fn compiler() -> PathBuf {
    let p = repo().join("../shared/tools/trex-compile");
    assert!(
        p.is_file(),
        "TRex's profile compiler {} is missing: these tests need ../shared beside the repository \
         (tools/trex-compile and the TRex client library in trex/), as CI has it",
        p.display()
    );
    p
}

fn stl_profile() -> PathBuf {
    std::env::var_os("PERF_LAB_STL_PROFILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| trex_dir().join("perf_lab.py"))
}

fn astf_profile() -> PathBuf {
    trex_dir().join("conn_rate.py")
}

/// trex-compile's JSON, or its output when it exits non-zero.
fn try_compile(kind: &str, profile: &Path, port: u32, tunables: &[&str]) -> Result<Value, String> {
    let mut cmd = Command::new(compiler());
    cmd.arg(kind).arg(profile);
    if kind == "stl" {
        cmd.arg("-i").arg(port.to_string());
    }
    if !tunables.is_empty() {
        cmd.arg("-t").args(tunables);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", compiler().display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(text);
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("not JSON ({e}):\n{text}"))
}

fn compile(kind: &str, profile: &Path, port: u32, tunables: &[&str]) -> Value {
    try_compile(kind, profile, port, tunables).unwrap_or_else(|e| {
        panic!(
            "trex-compile {kind} {} (port {port}) -t {} failed:\n{e}",
            profile.display(),
            tunables.join(" ")
        )
    })
}

// ---- STL streams ---------------------------------------------------------------------------

/// One compiled STL stream.
#[derive(Clone, Debug)]
struct Stream {
    name: Option<String>,
    next: Option<String>,
    self_start: bool,
    /// Bit 0: source MAC from the packet; bits 1-2: destination MAC mode (0: the port's).
    flags: u64,
    /// `pps`, `bps_L1`... and the value.
    rate: (String, f64),
    /// A single burst's packets.
    burst: Option<u64>,
    /// flow_stats: rule type and pg_id, when enabled.
    stats: Option<(String, u64)>,
    packet: Vec<u8>,
    vm: Vm,
}

impl Stream {
    fn latency(&self) -> bool {
        matches!(&self.stats, Some((rule, _)) if rule == "latency")
    }
    fn pg_id(&self) -> Option<u64> {
        self.stats.as_ref().map(|s| s.1)
    }
    fn proto(&self) -> u8 {
        self.packet[23]
    }
    /// TCP flags, 0 for UDP.
    fn tcp_flags(&self) -> u8 {
        if self.proto() == 6 {
            self.packet[14 + 20 + 13]
        } else {
            0
        }
    }
}

fn streams(v: &Value) -> Vec<Stream> {
    let list = v
        .as_array()
        .expect("an STL profile compiles to a list of streams");
    list.iter()
        .map(|s| {
            let str_of = |k: &str| s.get(k).and_then(Value::as_str).map(str::to_owned);
            let mode = &s["mode"];
            let stats = (s["flow_stats"]["enabled"] == Value::Bool(true)).then(|| {
                (
                    s["flow_stats"]["rule_type"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                    s["flow_stats"]["stream_id"].as_u64().expect("pg_id"),
                )
            });
            Stream {
                name: str_of("name"),
                next: str_of("next"),
                self_start: s["self_start"].as_bool().unwrap_or(true),
                flags: s["flags"].as_u64().unwrap_or(0),
                rate: (
                    mode["rate"]["type"].as_str().unwrap_or("").to_owned(),
                    mode["rate"]["value"].as_f64().unwrap_or(0.0),
                ),
                burst: (mode["type"] == "single_burst").then(|| {
                    mode["total_pkts"]
                        .as_u64()
                        .expect("single burst: total_pkts")
                }),
                stats,
                packet: base64(s["packet"]["binary"].as_str().expect("packet.binary")),
                vm: Vm::parse(s["vm"]["instructions"].as_array().map_or(&[][..], |v| v)),
            }
        })
        .collect()
}

fn measured(s: &[Stream]) -> Vec<&Stream> {
    s.iter().filter(|s| !s.latency()).collect()
}

fn base64(text: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    for chunk in text.trim_end_matches('=').as_bytes().chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

// ---- the field engine ------------------------------------------------------------------------

/// A flow variable of the field engine.
#[derive(Clone, Debug)]
enum Var {
    /// `tuple_flow_var`: the address increments every packet, the port when the address wraps,
    /// and the pair wraps after `limit` packets.
    Tuple {
        ip_min: u64,
        ips: u64,
        port_min: u64,
        ports: u64,
        limit: u64,
    },
    /// `flow_var`, op `inc`, step 1.
    Inc {
        size: usize,
        min: u64,
        count: u64,
        init: u64,
    },
}

impl Var {
    fn period(&self) -> u64 {
        match *self {
            Var::Tuple {
                ips, ports, limit, ..
            } => {
                let all = ips * ports;
                if limit > 0 { all.min(limit) } else { all }
            }
            Var::Inc { count, .. } => count,
        }
    }

    /// The value of `field` ("ip", "port" of a tuple; "" of a plain variable) at packet `k`,
    /// and its size in bytes.
    fn value(&self, field: &str, k: u64) -> (u64, usize) {
        match *self {
            Var::Tuple {
                ip_min,
                ips,
                port_min,
                ports,
                ..
            } => {
                let f = k % self.period();
                match field {
                    "ip" => (ip_min + f % ips, 4),
                    "port" => (port_min + (f / ips) % ports, 2),
                    _ => panic!("tuple field {field:?}"),
                }
            }
            Var::Inc {
                size,
                min,
                count,
                init,
            } => (min + (init - min + k) % count, size),
        }
    }
}

/// A field-engine program: its variables and its instructions in order.
#[derive(Clone, Debug, Default)]
struct Vm {
    vars: HashMap<String, Var>,
    prog: Vec<Value>,
}

/// The IPv4 source/destination addresses and the L4 ports: bytes 26..38 of an untagged
/// Ethernet/IPv4 (no options) frame.
const TUPLE_BYTES: std::ops::Range<u64> = 26..38;

impl Vm {
    fn parse(instrs: &[Value]) -> Vm {
        let mut vm = Vm::default();
        for i in instrs {
            let u = |k: &str| {
                i[k].as_u64()
                    .unwrap_or_else(|| panic!("{k} of {i}: a number"))
            };
            let name = i["name"].as_str().unwrap_or("").to_owned();
            match i["type"].as_str().unwrap_or("") {
                "tuple_flow_var" => {
                    vm.vars.insert(
                        name,
                        Var::Tuple {
                            ip_min: u("ip_min"),
                            ips: u("ip_max") - u("ip_min") + 1,
                            port_min: u("port_min"),
                            ports: u("port_max") - u("port_min") + 1,
                            limit: u("limit_flows"),
                        },
                    );
                }
                "flow_var" => {
                    assert!(
                        i["op"] == "inc" && u("step") == 1,
                        "this emulator runs flow variables with op inc, step 1: {i}"
                    );
                    vm.vars.insert(
                        name,
                        Var::Inc {
                            size: u("size") as usize,
                            min: u("min_value"),
                            count: u("max_value") - u("min_value") + 1,
                            init: u("init_value"),
                        },
                    );
                }
                _ => {}
            }
            vm.prog.push(i.clone());
        }
        vm
    }

    fn var(&self, name: &str) -> (&Var, &'static str) {
        let (var, field) = match name.split_once('.') {
            Some((v, "ip")) => (v, "ip"),
            Some((v, "port")) => (v, "port"),
            _ => (name, ""),
        };
        let v = self
            .vars
            .get(var)
            .unwrap_or_else(|| panic!("write of an undefined variable {name}"));
        (v, field)
    }

    fn writes(&self) -> impl Iterator<Item = &Value> {
        self.prog.iter().filter(|i| i["type"] == "write_flow_var")
    }

    /// Packets after which the flow tuples repeat: the least common multiple of the periods
    /// of the variables written into addresses or ports.
    fn period(&self) -> u64 {
        self.writes()
            .filter(|w| TUPLE_BYTES.contains(&w["pkt_offset"].as_u64().unwrap_or(0)))
            .map(|w| self.var(w["name"].as_str().unwrap_or("")).0.period())
            .fold(1, lcm)
    }

    /// Packet `k` as the field engine writes it: every instruction in order, checksum fixes
    /// included when `checksums`.
    fn packet(&self, base: &[u8], k: u64, checksums: bool) -> Vec<u8> {
        let mut p = base.to_vec();
        for i in &self.prog {
            match i["type"].as_str().unwrap_or("") {
                "flow_var" | "tuple_flow_var" => {}
                "write_flow_var" => {
                    let (var, field) = self.var(i["name"].as_str().unwrap_or(""));
                    let (v, size) = var.value(field, k);
                    let v = v.wrapping_add(i["add_value"].as_i64().unwrap_or(0) as u64);
                    let at = i["pkt_offset"].as_u64().expect("pkt_offset") as usize;
                    let bytes = v.to_be_bytes();
                    let mut field = bytes[8 - size..].to_vec();
                    if i["is_big_endian"] == Value::Bool(false) {
                        field.reverse();
                    }
                    p[at..at + size].copy_from_slice(&field);
                }
                "fix_checksum_ipv4" if checksums => fix_ipv4(
                    &mut p,
                    i["pkt_offset"].as_u64().expect("pkt_offset") as usize,
                ),
                "fix_checksum_hw" if checksums => {
                    let l2 = i["l2_len"].as_u64().expect("l2_len") as usize;
                    let l3 = i["l3_len"].as_u64().expect("l3_len") as usize;
                    fix_ipv4(&mut p, l2);
                    match i["l4_type"].as_u64() {
                        Some(L4_TYPE_UDP) => fix_l4(&mut p, l2, l3, false),
                        Some(L4_TYPE_TCP) => fix_l4(&mut p, l2, l3, true),
                        _ => {}
                    }
                }
                "fix_checksum_ipv4" | "fix_checksum_hw" => {}
                other => panic!("this emulator does not run field-engine instruction {other}"),
            }
        }
        p
    }
}

/// `CTRexVmInsFixHwCs.L4_TYPE_UDP` / `_TCP`.
const L4_TYPE_UDP: u64 = 11;
const L4_TYPE_TCP: u64 = 13;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

fn fix_ipv4(p: &mut [u8], l2: usize) {
    let ihl = usize::from(p[l2] & 15) * 4;
    p[l2 + 10..l2 + 12].fill(0);
    let c = checksum(&p[l2..l2 + ihl]);
    p[l2 + 10..l2 + 12].copy_from_slice(&c.to_be_bytes());
}

/// The L4 checksum as a NIC's offload computes it (UDP: 0 is sent as 0xffff).
fn fix_l4(p: &mut [u8], l2: usize, l3: usize, tcp: bool) {
    let total = usize::from(u16::from_be_bytes([p[l2 + 2], p[l2 + 3]]));
    let l4 = l2 + l3;
    let len = total - l3;
    let at = l4 + if tcp { 16 } else { 6 };
    p[at..at + 2].fill(0);
    let mut pseudo = p[l2 + 12..l2 + 20].to_vec();
    pseudo.extend_from_slice(&[0, p[l2 + 9]]);
    pseudo.extend_from_slice(&(len as u16).to_be_bytes());
    pseudo.extend_from_slice(&p[l4..l4 + len]);
    let mut c = checksum(&pseudo);
    if !tcp && c == 0 {
        c = 0xffff;
    }
    p[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

/// A flow: protocol, source, destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Flow {
    proto: u8,
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    dport: u16,
}

fn flow_of(p: &[u8]) -> Flow {
    assert_eq!(&p[12..14], &[8, 0], "IPv4");
    assert_eq!(p[14], 0x45, "IPv4 without options");
    let ip = |at: usize| Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3]);
    let port = |at: usize| u16::from_be_bytes([p[at], p[at + 1]]);
    Flow {
        proto: p[23],
        src: ip(26),
        sport: port(34),
        dst: ip(30),
        dport: port(36),
    }
}

/// Every flow a stream sends: its program over a whole period.
fn flows_of(s: &Stream) -> HashSet<Flow> {
    (0..s.vm.period())
        .map(|k| flow_of(&s.vm.packet(&s.packet, k, false)))
        .collect()
}

/// Every flow the measured streams of a port send.
fn port_flows(s: &[Stream]) -> HashSet<Flow> {
    measured(s).into_iter().flat_map(flows_of).collect()
}

/// Packet indices sampled from a period: the first 32, 32 spread over it, the last.
fn sample(period: u64) -> BTreeSet<u64> {
    let mut k: BTreeSet<u64> = (0..period.min(32)).collect();
    k.extend((0..32).map(|j| j * period / 32));
    k.insert(period - 1);
    k
}

// ---- the shipped configs -----------------------------------------------------------------------

fn xvs_toml() -> PathBuf {
    trex_dir().join("xvs.toml")
}

fn xvs_config() -> config::Config {
    config::load(&xvs_toml()).unwrap_or_else(|e| panic!("{}: {e}", xvs_toml().display()))
}

/// A TRex port's MACs from `trex_cfg.yaml`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TrexPort {
    src_mac: [u8; 6],
    dest_mac: [u8; 6],
}

fn parse_mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap_or_else(|_| panic!("MAC {s}")))
        .collect();
    v.try_into().unwrap_or_else(|_| panic!("MAC {s}"))
}

/// `port_info` of `trex_cfg.yaml` (the `key: value` lines of each `- ` item).
fn trex_ports() -> Vec<TrexPort> {
    let text = std::fs::read_to_string(trex_dir().join("trex_cfg.yaml")).expect("trex_cfg.yaml");
    let mut ports: Vec<HashMap<String, String>> = Vec::new();
    let mut in_info = false;
    for line in text.lines() {
        let line = line.split(" #").next().unwrap_or("").trim_end();
        let t = line.trim_start();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        if t == "port_info:" {
            in_info = true;
            continue;
        }
        if !in_info {
            continue;
        }
        let item = t.strip_prefix("- ");
        if item.is_some() {
            ports.push(HashMap::new());
        }
        let kv = item.unwrap_or(t);
        let (k, v) = kv.split_once(':').expect("key: value");
        ports
            .last_mut()
            .expect("a port_info item")
            .insert(k.trim().to_owned(), v.trim().to_owned());
    }
    ports
        .iter()
        .map(|p| TrexPort {
            src_mac: parse_mac(&p["src_mac"]),
            dest_mac: parse_mac(&p["dest_mac"]),
        })
        .collect()
}

/// The frame TRex sends for packet `k` of `s` on `port`: the program run, its checksum fixes
/// computed, the port's MACs unless the stream takes them from its packet.
fn on_wire(s: &Stream, port: &TrexPort, k: u64) -> Vec<u8> {
    let mut p = s.vm.packet(&s.packet, k, true);
    if s.flags & 1 == 0 {
        p[6..12].copy_from_slice(&port.src_mac);
    }
    if (s.flags >> 1) & 3 == 0 {
        p[0..6].copy_from_slice(&port.dest_mac);
    }
    p
}

/// The frames of a sample of every stream, in the order TRex starts them: the bursts that
/// start others first (an ACK stream's SYNs), then the rest.
fn expand(s: &[Stream], port: &TrexPort) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let first: Vec<&Stream> = s.iter().filter(|s| s.next.is_some()).collect();
    let rest: Vec<&Stream> = s.iter().filter(|s| s.next.is_none()).collect();
    for st in first.into_iter().chain(rest) {
        for k in sample(st.vm.period()) {
            frames.push(on_wire(st, port, k));
        }
    }
    frames
}

/// What `xvs pcap` did with each frame: its verdicts (report lines) and the frames it sent.
fn replay(config: &Path, frames: &[Vec<u8>], tag: &str) -> (Vec<Value>, Vec<Vec<u8>>) {
    let dir = std::env::temp_dir().join(format!("perf-lab-trex-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = pcap::PcapWriter::new(Vec::new(), pcap::Resolution::Micros).expect("pcap header");
    for (i, f) in frames.iter().enumerate() {
        w.write(Duration::new(1_700_000_000, i as u32 * 1000), f)
            .expect("pcap record");
    }
    let input = dir.join("in.pcap");
    let output = dir.join("out.pcap");
    let report = dir.join("report.json");
    std::fs::write(&input, w.finish().unwrap()).unwrap();
    let out = Command::new(xvs())
        .arg("pcap")
        .arg("--config")
        .arg(config)
        .arg("--in")
        .arg(&input)
        .arg("--out")
        .arg(&output)
        .arg("--report")
        .arg(&report)
        .output()
        .expect("running xvs pcap");
    assert!(
        out.status.success(),
        "xvs pcap --config {}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts = std::fs::read_to_string(&report)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sent = pcap::PcapReader::new(&std::fs::read(&output).unwrap()[..])
        .unwrap()
        .map(|r| r.unwrap().data)
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    (verdicts, sent)
}

/// The xvs binary beside perf-lab's (built if missing).
fn xvs() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_perf-lab")).with_file_name("xvs");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = bin.parent().and_then(Path::file_name) == Some("release".as_ref());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "xvs", "--bin", "xvs"])
            .current_dir(repo());
        if release {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().is_ok_and(|s| s.success()) && bin.exists(),
            "cannot build {} (cargo build -p xvs)",
            bin.display()
        );
    }
    bin
}

// ---- the tests: STL ------------------------------------------------------------------------------

/// Tunable sets the tests compile (argparse style, as TRex's examples parse them).
const SETS: &[&[&str]] = &[
    &[],
    &[
        "--scenario",
        "syn-flood",
        "--flows",
        "1001",
        "--size",
        "128",
    ],
    &["--kind", "ack", "--flows", "333"],
    &["--kind", "mix", "--flows", "1001", "--size", "imix"],
    &["--scenario", "services-10k"],
    &["--latency-pps", "0", "--size", "1518"],
];

#[test]
fn measured_streams_scale_with_m_and_latency_is_a_separate_stream() {
    for set in SETS {
        let s = streams(&compile("stl", &stl_profile(), 0, set));
        let m = measured(&s);
        assert!(
            !m.is_empty(),
            "{set:?}: no measured stream (all carry latency stats)"
        );
        for st in &m {
            // A relative packet rate: `start -m` scales it (latency streams it would not).
            assert_eq!(st.rate.0, "pps", "{set:?}: {:?}", st.name);
            assert!(st.rate.1 > 0.0, "{set:?}: {:?}", st.name);
            // A burst that starts another stream runs at that stream's rate.
            if let Some(next) = &st.next {
                let n = m
                    .iter()
                    .find(|o| o.name.as_ref() == Some(next))
                    .unwrap_or_else(|| panic!("{set:?}: next {next} is no measured stream"));
                assert!(!n.self_start && n.rate == st.rate, "{set:?}: {next}");
            }
        }
        let lat: Vec<&Stream> = s.iter().filter(|s| s.latency()).collect();
        let want = if set.contains(&"--latency-pps") { 0 } else { 1 };
        assert_eq!(lat.len(), want, "{set:?}: latency streams");
        for l in lat {
            assert_eq!(l.rate, ("pps".to_owned(), 1000.0), "{set:?}: latency rate");
            assert!(
                l.vm.prog.is_empty(),
                "{set:?}: latency stream: one fixed flow"
            );
            let f = flow_of(&l.packet);
            assert_eq!(
                (f.proto, f.src, f.dst, f.dport),
                (17, rig::CLIENT_IP, rig::VIP, 1000)
            );
            assert_eq!(
                &l.packet[40..42],
                &[0, 0],
                "latency UDP checksum 0 (TRex writes in it)"
            );
        }
    }
    let s = streams(&compile(
        "stl",
        &stl_profile(),
        0,
        &["--latency-pps", "250"],
    ));
    let lat: Vec<&Stream> = s.iter().filter(|s| s.latency()).collect();
    assert_eq!(lat.len(), 1);
    assert_eq!(lat[0].rate.1, 250.0);
    // Per-stream counters on the measured streams, unless the NIC cannot count them.
    for st in measured(&s) {
        assert_eq!(st.stats.as_ref().map(|s| s.0.as_str()), Some("stats"));
    }
    let s = streams(&compile("stl", &stl_profile(), 0, &["--no-flow-stats"]));
    assert!(measured(&s).iter().all(|st| st.stats.is_none()));
    assert_eq!(s.iter().filter(|s| s.latency()).count(), 1);
}

#[test]
fn tunables_parse_like_trex_examples() {
    let p = stl_profile();
    let new = compile("stl", &p, 0, &["--scenario", "syn-flood", "--size", "128"]);
    let old = compile("stl", &p, 0, &["scenario=syn-flood,size=128"]);
    assert_eq!(
        new, old,
        "old-style and argparse tunables give the same streams"
    );
    let s = streams(&new);
    assert!(
        measured(&s)
            .iter()
            .all(|s| s.tcp_flags() == 0x02 && s.packet.len() == 124)
    );
    let help = Command::new(compiler())
        .arg("stl")
        .arg(&p)
        .args(["-t", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success() && text.contains("--scenario") && text.contains("--flows"));
    for bad in [
        &["--no-such-tunable", "1"][..],
        &["--size", "60"],
        &["--kind", "icmp"],
    ] {
        assert!(
            try_compile("stl", &p, 0, bad).is_err(),
            "{bad:?} should be refused"
        );
    }
}

#[test]
fn flow_counts_are_exact() {
    let cases: &[(&[&str], usize)] = &[
        (&[], 1000),
        (&["--scenario", "flows-1m"], 1_000_000),
        (&["--scenario", "syn-flood", "--flows", "1001"], 1001),
        (
            &["--kind", "mix", "--flows", "1001", "--size", "imix"],
            1001,
        ),
        (&["--kind", "ack", "--flows", "333"], 333),
        (&["--scenario", "services-10k"], 10_000),
        (&["--services", "4", "--flows", "40"], 40),
    ];
    for (set, want) in cases {
        let s = streams(&compile("stl", &stl_profile(), 0, set));
        let flows = port_flows(&s);
        assert_eq!(flows.len(), *want, "{set:?}: flows");
        // Every flow its own source: behind a DNAT, two flows from one source to services
        // with a common backend would share a reply tuple.
        let sources: HashSet<(u8, Ipv4Addr, u16)> =
            flows.iter().map(|f| (f.proto, f.src, f.sport)).collect();
        assert_eq!(sources.len(), *want, "{set:?}: distinct sources");
        for st in measured(&s) {
            let tuples: Vec<&Var> = st
                .vm
                .vars
                .values()
                .filter(|v| matches!(v, Var::Tuple { .. }))
                .collect();
            assert_eq!(tuples.len(), 1, "{set:?}: one tuple generator per stream");
            // Its limit is its flows: no flow repeats before the period ends.
            assert_eq!(
                flows_of(st).len() as u64,
                st.vm.period(),
                "{set:?}: {:?}",
                st.name
            );
            if let Some(n) = st.burst {
                assert_eq!(n, st.vm.period(), "{set:?}: one SYN per flow");
            }
        }
        let services: BTreeSet<(u8, u16)> = flows.iter().map(|f| (f.proto, f.dport)).collect();
        let srcs: BTreeSet<Ipv4Addr> = flows.iter().map(|f| f.src).collect();
        assert!(
            srcs.iter()
                .all(|a| (16..=239).contains(&a.octets()[3]) && a.octets()[..3] == [198, 18, 0]),
            "{set:?}: sources within perf-lab's 198.18.0.16-239"
        );
        let udp_services = services.iter().filter(|s| s.0 == 17).count();
        if set.contains(&"services-10k") {
            assert_eq!(udp_services, 10_000);
        } else if set.contains(&"--services") {
            assert_eq!(udp_services, 4);
        } else {
            assert!(
                services.iter().all(|s| s.1 == 1000),
                "{set:?}: {services:?}"
            );
        }
    }
    // One service, one kind: exactly the flows of perf-lab's own generator.
    let s = streams(&compile("stl", &stl_profile(), 0, &["--flows", "1000"]));
    let trex: BTreeSet<(Ipv4Addr, u16, u16)> = port_flows(&s)
        .iter()
        .map(|f| (f.src, f.sport, f.dport))
        .collect();
    let spec = perf_lab::generator::GenSpec {
        ns: String::new(),
        queues: 1,
        core: 0,
        rate_pps: 0,
        flows: 1000,
        services: 1,
        base_port: 1000,
        vip: rig::VIP,
        size: perf_lab::generator::Size::Fixed(64),
        kind: perf_lab::generator::Kind::Udp,
        syn_first: false,
        duration: Duration::from_secs(1),
        count: None,
        seq_start: 0,
        idle_sleep: false,
    };
    let gen_flows: BTreeSet<(Ipv4Addr, u16, u16)> = (0..1000)
        .map(|i| {
            let p = perf_lab::generator::packet(&spec, i, 0, 0);
            (p.src, p.sport, p.dport)
        })
        .collect();
    assert_eq!(trex, gen_flows, "TRex's flows are perf-lab generator's");
}

#[test]
fn every_kind_fixes_its_l4_checksum() {
    for kind in ["udp", "syn", "ack", "mix"] {
        let s = streams(&compile(
            "stl",
            &stl_profile(),
            0,
            &["--kind", kind, "--flows", "500"],
        ));
        let m = measured(&s);
        let protos: BTreeSet<u8> = m.iter().map(|s| s.proto()).collect();
        let want: BTreeSet<u8> = match kind {
            "udp" => [17].into(),
            "mix" => [6, 17].into(),
            _ => [6].into(),
        };
        assert_eq!(protos, want, "{kind}");
        for st in m {
            let last = st.vm.prog.last().expect("a field-engine program");
            let l4 = if st.proto() == 17 {
                L4_TYPE_UDP
            } else {
                L4_TYPE_TCP
            };
            // IPv4 header and L4 checksums, after every write.
            assert_eq!(last["type"], "fix_checksum_hw", "{kind} {:?}", st.name);
            assert_eq!(
                (
                    last["l2_len"].as_u64(),
                    last["l3_len"].as_u64(),
                    last["l4_type"].as_u64()
                ),
                (Some(14), Some(20), Some(l4)),
                "{kind} {:?}",
                st.name
            );
            for k in sample(st.vm.period()) {
                let p = st.vm.packet(&st.packet, k, true);
                assert!(checksums_ok(&p), "{kind} {:?} packet {k}", st.name);
            }
        }
    }
}

#[test]
fn sizes_and_imix() {
    for (size, len) in [("64", 60), ("128", 124), ("1518", 1514)] {
        for kind in ["udp", "syn", "ack"] {
            let s = streams(&compile(
                "stl",
                &stl_profile(),
                0,
                &["--size", size, "--kind", kind],
            ));
            for st in measured(&s).into_iter().filter(|s| s.burst.is_none()) {
                // 4 bytes of FCS on the wire: a "64" is a 64-byte frame.
                assert_eq!(st.packet.len(), len, "{kind} {size}");
            }
        }
    }
    for kind in ["udp", "mix"] {
        let s = streams(&compile(
            "stl",
            &stl_profile(),
            0,
            &["--size", "imix", "--kind", kind],
        ));
        // Per packet kind (protocol and TCP flags), frames of 64/594/1518 at 7:4:1.
        let mut by_kind: BTreeMap<(u8, u8), BTreeMap<usize, f64>> = BTreeMap::new();
        for st in measured(&s).into_iter().filter(|s| s.burst.is_none()) {
            by_kind
                .entry((st.proto(), st.tcp_flags()))
                .or_default()
                .insert(st.packet.len() + 4, st.rate.1);
        }
        assert_eq!(by_kind.len(), if kind == "mix" { 3 } else { 1 }, "{kind}");
        for rates in by_kind.values() {
            assert_eq!(
                rates.keys().copied().collect::<Vec<_>>(),
                vec![64, 594, 1518]
            );
            let r1518 = rates[&1518];
            assert!((rates[&64] / r1518 - 7.0).abs() < 1e-9, "{kind}: {rates:?}");
            assert!(
                (rates[&594] / r1518 - 4.0).abs() < 1e-9,
                "{kind}: {rates:?}"
            );
        }
    }
}

#[test]
fn ports_get_distinct_ids_and_flows() {
    let set = &["--kind", "mix", "--size", "imix", "--flows", "2000"];
    let p0 = streams(&compile("stl", &stl_profile(), 0, set));
    let p1 = streams(&compile("stl", &stl_profile(), 1, set));
    let mut ids = HashSet::new();
    for s in p0.iter().chain(&p1) {
        let id = s
            .pg_id()
            .unwrap_or_else(|| panic!("{:?}: no flow-stats id", s.name));
        assert!(ids.insert(id), "pg_id {id} twice");
    }
    let (f0, f1) = (port_flows(&p0), port_flows(&p1));
    assert_eq!((f0.len(), f1.len()), (2000, 2000));
    assert!(f0.is_disjoint(&f1), "the two ports send different flows");
}

#[test]
fn shipped_configs_match_perf_lab() {
    let cfg = xvs_config();
    let ports = trex_ports();
    assert_eq!(ports.len(), 2, "trex_cfg.yaml: two ports");
    // TRex port 0 is perf-lab's client, sending to the LB's client side; port 1 the backends.
    assert_eq!(ports[0].src_mac, rig::CLIENT_MAC);
    assert_eq!(ports[0].dest_mac, rig::LB_CLIENT_MAC);
    assert_eq!(ports[1].src_mac, rig::backend_mac(1));
    assert_eq!(ports[1].dest_mac, rig::LB_BACKEND_MAC);
    assert_eq!(cfg.node.addresses, vec![IpAddr::V4(rig::LB_CLIENT_IP)]);
    let backends: BTreeSet<String> = (1..=3)
        .map(|i| format!("{}:{}", rig::backend_ip(i), rig::BACKEND_PORT))
        .collect();
    let mut protos = BTreeSet::new();
    for s in &cfg.services {
        assert_eq!(s.vip, IpAddr::V4(rig::VIP), "{}", s.name);
        assert_eq!(s.port, 1000, "{}", s.name);
        protos.insert(format!("{:?}", s.protocol));
        let b: BTreeSet<String> = s.backends.iter().map(|b| b.addr.to_string()).collect();
        assert_eq!(b, backends, "{}", s.name);
    }
    assert_eq!(protos, ["Tcp".to_owned(), "Udp".to_owned()].into());
    let neigh: HashMap<IpAddr, [u8; 6]> = cfg.neighbours.iter().map(|n| (n.ip, n.mac.0)).collect();
    for i in 1..=3 {
        assert_eq!(
            neigh[&IpAddr::V4(rig::backend_ip(i))],
            ports[1].src_mac,
            "backends are TRex port 1"
        );
    }
    assert_eq!(neigh[&IpAddr::V4(rig::CLIENT_IP)], ports[0].src_mac);
    // The profile's packets: the port's MACs, to the VIP, from the clients.
    for set in SETS {
        let s = streams(&compile("stl", &stl_profile(), 0, set));
        for st in &s {
            assert_eq!(st.flags, 0, "{set:?}: MACs from trex_cfg.yaml");
            for k in sample(st.vm.period()) {
                let f = flow_of(&st.vm.packet(&st.packet, k, false));
                assert_eq!(f.dst, rig::VIP, "{set:?}");
            }
        }
    }
    // --src-mac/--dst-mac put MACs in the packets, and TRex takes them from there.
    let s = streams(&compile(
        "stl",
        &stl_profile(),
        0,
        &[
            "--src-mac",
            "02:00:00:00:aa:01",
            "--dst-mac",
            "02:00:00:00:aa:02",
        ],
    ));
    for st in &s {
        assert_eq!(st.flags & 1, 1);
        assert_eq!((st.flags >> 1) & 3, 1);
        let w = on_wire(st, &ports[0], 0);
        assert_eq!(&w[0..12], &[2, 0, 0, 0, 0xaa, 2, 2, 0, 0, 0, 0xaa, 1]);
    }
}

/// The shipped config with UDP services `1001..1000+services` added (services-10k).
fn config_with_services(services: u16, tag: &str) -> PathBuf {
    let mut text = std::fs::read_to_string(xvs_toml()).unwrap();
    let backends: Vec<String> = (1..=3)
        .map(|i| {
            format!(
                "{{ addr = \"{}:{}\" }}",
                rig::backend_ip(i),
                rig::BACKEND_PORT
            )
        })
        .collect();
    for i in 1..services {
        text.push_str(&format!(
            "\n[[services]]\nname = \"s{i}-udp\"\nvip = \"{}\"\nport = {}\nprotocol = \"udp\"\n\
             backends = [{}]\n",
            rig::VIP,
            1000 + i,
            backends.join(", ")
        ));
    }
    let path =
        std::env::temp_dir().join(format!("perf-lab-trex-{}-{tag}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn expanded_packets_go_through_xvs() {
    let cfg = xvs_config();
    let ports = trex_ports();
    let neigh: HashMap<IpAddr, [u8; 6]> = cfg.neighbours.iter().map(|n| (n.ip, n.mac.0)).collect();
    let cases: &[(u32, &[&str])] = &[
        (0, &[]),
        (0, &["--kind", "syn", "--size", "imix"]),
        (0, &["--kind", "ack", "--flows", "333"]),
        (0, &["--kind", "mix", "--flows", "1001", "--size", "imix"]),
        (0, &["--scenario", "flows-1m"]),
        (0, &["--scenario", "services-10k"]),
        (1, &["--kind", "mix", "--size", "1518"]),
    ];
    for (n, (port, set)) in cases.iter().enumerate() {
        let s = streams(&compile("stl", &stl_profile(), *port, set));
        let frames = expand(&s, &ports[*port as usize]);
        for f in &frames {
            assert!(checksums_ok(f), "{set:?}: TRex would send a bad checksum");
        }
        let extra = set.contains(&"services-10k");
        let config = if extra {
            config_with_services(10_000, &format!("cfg{n}"))
        } else {
            xvs_toml()
        };
        let (verdicts, sent) = replay(&config, &frames, &format!("case{n}"));
        if extra {
            let _ = std::fs::remove_file(&config);
        }
        assert_eq!(verdicts.len(), frames.len(), "{set:?}");
        for (i, v) in verdicts.iter().enumerate() {
            assert_eq!(v["verdict"], "tx", "{set:?}: frame {}: {v}", i + 1);
        }
        assert_eq!(sent.len(), frames.len(), "{set:?}");
        for (i, (out, inp)) in sent.iter().zip(&frames).enumerate() {
            assert!(
                checksums_ok(out),
                "{set:?}: frame {} left with a bad checksum",
                i + 1
            );
            let (fo, fi) = (flow_of(out), flow_of(inp));
            assert!(
                (1..=3).any(|b| fo.dst == rig::backend_ip(b)),
                "{set:?}: {fo:?}"
            );
            assert_eq!(fo.dport, rig::BACKEND_PORT, "{set:?}");
            assert_eq!((fo.src, fo.sport, fo.proto), (fi.src, fi.sport, fi.proto));
            assert_eq!(out[0..6], neigh[&IpAddr::V4(fo.dst)], "{set:?}");
        }
    }
}

// ---- the tests: ASTF ----------------------------------------------------------------------------

#[test]
fn conn_rate_profile_compiles_with_its_tunables() {
    let cfg = xvs_config();
    let tcp = cfg
        .services
        .iter()
        .find(|s| format!("{:?}", s.protocol) == "Tcp")
        .expect("a TCP service in xvs.toml");
    let cases: &[(&[&str], f64, usize, usize)] = &[
        (&[], 1000.0, 100, 1000),
        (
            &["--cps", "2500", "--req-size", "64", "--resp-size", "4000"],
            2500.0,
            64,
            4000,
        ),
        (&["cps=10,resp-size=99"], 10.0, 100, 99),
        (&["--resp-size", "100000"], 1000.0, 100, 100_000),
    ];
    for (set, cps, req, resp) in cases {
        let v = compile("astf", &astf_profile(), 0, set);
        let bufs: Vec<Vec<u8>> = v["buf_list"]
            .as_array()
            .expect("buf_list")
            .iter()
            .map(|b| base64(b.as_str().unwrap()))
            .collect();
        let progs = v["program_list"].as_array().expect("program_list");
        let t = &v["templates"].as_array().expect("templates")[0];
        let (c, s) = (&t["client_template"], &t["server_template"]);
        let prog = |i: &Value| &progs[i.as_u64().unwrap() as usize]["commands"];
        let (pc, ps) = (prog(&c["program_index"]), prog(&s["program_index"]));
        // Client: send the request, read the whole response (then close); server: the reverse.
        assert_eq!(pc[0]["name"], "tx", "{set:?}");
        assert_eq!(pc[1]["name"], "rx", "{set:?}");
        assert_eq!(ps[0]["name"], "rx", "{set:?}");
        assert_eq!(ps[1]["name"], "tx", "{set:?}");
        let request = &bufs[pc[0]["buf_index"].as_u64().unwrap() as usize];
        let response = &bufs[ps[1]["buf_index"].as_u64().unwrap() as usize];
        assert_eq!(request.len(), *req, "{set:?}");
        assert_eq!(response.len(), *resp, "{set:?}");
        assert_eq!(ps[0]["min_bytes"].as_u64(), Some(*req as u64), "{set:?}");
        assert_eq!(pc[1]["min_bytes"].as_u64(), Some(*resp as u64), "{set:?}");
        let rq = String::from_utf8_lossy(request);
        assert!(rq.starts_with("GET /") && rq.ends_with("\r\n\r\n"), "{rq}");
        let rs = String::from_utf8_lossy(response);
        let (head, body) = rs.split_once("\r\n\r\n").expect("response head");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert_eq!(c["cps"].as_f64(), Some(*cps), "{set:?}");
        // To the VIP's TCP service, from perf-lab's clients; served on the backends' port.
        assert_eq!(c["port"].as_u64(), Some(u64::from(tcp.port)), "{set:?}");
        let dist = v["ip_gen_dist_list"].as_array().unwrap();
        let d = |side: &str| {
            let i = &c["ip_gen"][side]["index"];
            &dist[i.as_u64().unwrap() as usize]
        };
        assert_eq!(d("dist_server")["ip_start"], rig::VIP.to_string());
        assert_eq!(d("dist_server")["ip_end"], rig::VIP.to_string());
        assert_eq!(d("dist_client")["ip_start"], "198.18.0.16");
        assert_eq!(d("dist_client")["ip_end"], "198.18.0.239");
        let assoc = &s["assoc"][0];
        let bport = tcp.backends[0].addr.port();
        assert_eq!(assoc["port"].as_u64(), Some(u64::from(bport)), "{set:?}");
        let bips: BTreeSet<String> = tcp
            .backends
            .iter()
            .map(|b| b.addr.ip().to_string())
            .collect();
        assert_eq!(assoc["ip_start"].as_str(), bips.first().map(String::as_str));
        assert_eq!(assoc["ip_end"].as_str(), bips.last().map(String::as_str));
    }
    for bad in [
        &["--req-size", "10"][..],
        &["--resp-size", "20"],
        &["--cps", "0.1"],
    ] {
        assert!(
            try_compile("astf", &astf_profile(), 0, bad).is_err(),
            "{bad:?} should be refused"
        );
    }
}
