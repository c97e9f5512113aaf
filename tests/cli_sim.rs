//! Black-box tests of `xvs sim` on config/examples/static-services.toml: each scheduler's
//! behaviour seen from outside, as an operator would check new weights.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn static_services() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/static-services.toml")
}

/// Runs `xvs sim` with `flows` on stdin.
fn sim(flows: &str, extra: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args([
            "sim",
            "--config",
            static_services().to_str().unwrap(),
            "--flows",
            "-",
        ])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xvs");
    // Feed stdin from a thread: xvs writes while it reads, and a full stdout pipe would
    // otherwise block both sides.
    let mut stdin = child.stdin.take().unwrap();
    let input = flows.to_owned();
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    out
}

/// The backend each flow line went to (`none (...)` included), in order.
fn targets(o: &Output) -> Vec<String> {
    assert!(
        o.status.success(),
        "xvs sim failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .take_while(|l| !l.is_empty())
        .map(|l| {
            l.split(" => ")
                .nth(1)
                .unwrap_or_else(|| panic!("bad line {l:?}"))
                .to_owned()
        })
        .collect()
}

fn flows(proto: &str, vip: &str, port: u16, n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "{proto},198.18.0.{},{},{vip},{port}\n",
                2 + i % 200,
                10000 + i
            )
        })
        .collect()
}

/// A DSR service (GUE) of the example: its flows go to its backends, as any service's.
#[test]
fn dsr_flows_go_to_their_backends() {
    let t = targets(&sim(&flows("tcp", "198.18.100.60", 80, 4), &[]));
    assert_eq!(
        t,
        [
            "198.18.1.1:8080",
            "198.18.1.2:8080",
            "198.18.1.1:8080",
            "198.18.1.2:8080"
        ]
    );
}

#[test]
fn rr_is_exactly_even_in_order() {
    let t = targets(&sim(&flows("tcp", "198.18.100.1", 80, 9), &[]));
    let want: Vec<&str> = ["198.18.1.1:8080", "198.18.1.2:8080", "198.18.1.3:8080"].repeat(3);
    assert_eq!(t, want);
}

#[test]
fn wrr_follows_ipvs_interleaved_sequence() {
    // Weights 4,3,2 (a,b,c): Linux ip_vs_wrr gives a a b a b c a b c.
    let t = targets(&sim(&flows("tcp", "198.18.100.2", 80, 18), &[]));
    let (a, b, c) = ("198.18.1.1:8080", "198.18.1.2:8080", "198.18.1.3:8080");
    let round = [a, a, b, a, b, c, a, b, c];
    let want: Vec<&str> = round.iter().chain(round.iter()).copied().collect();
    assert_eq!(t, want);
}

#[test]
fn lc_follows_connection_counts_and_close() {
    let (a, b) = ("198.18.1.1:8080", "198.18.1.2:8080");
    let input = "\
tcp,198.18.0.2,1000,198.18.100.3,80
tcp,198.18.0.2,1001,198.18.100.3,80
tcp,198.18.0.2,1002,198.18.100.3,80
tcp,198.18.0.2,1001,198.18.100.3,80,close
tcp,198.18.0.2,1003,198.18.100.3,80
tcp,198.18.0.2,1000,198.18.100.3,80
";
    let t = targets(&sim(input, &[]));
    // 1000 -> a, 1001 -> b, 1002 -> a (tie: first); closing 1001 leaves b idle so 1003 -> b;
    // a repeated open of a still-open flow is the same connection.
    assert_eq!(t[..3], [a, b, a]);
    assert_eq!(t[3], format!("{b} (close)"));
    assert_eq!(t[4], b);
    assert_eq!(t[5], a);
}

#[test]
fn wlc_and_sed_prefer_the_heavier_backend() {
    // weights 3:1. With w=3 vs 1, wlc sends 3 of the first 4 connections to a.
    let t = targets(&sim(&flows("tcp", "198.18.100.4", 80, 4), &[]));
    assert_eq!(
        t.iter().filter(|x| x.as_str() == "198.18.1.1:8080").count(),
        3,
        "{t:?}"
    );
    let t = targets(&sim(&flows("tcp", "198.18.100.5", 80, 4), &[]));
    assert_eq!(
        t.iter().filter(|x| x.as_str() == "198.18.1.1:8080").count(),
        3,
        "{t:?}"
    );
}

#[test]
fn nq_uses_an_idle_backend_first() {
    let t = targets(&sim(&flows("tcp", "198.18.100.6", 80, 2), &[]));
    let mut sorted = t.clone();
    sorted.sort();
    assert_eq!(sorted, ["198.18.1.1:8080", "198.18.1.2:8080"], "{t:?}");
}

#[test]
fn hashing_schedulers_are_sticky() {
    for (vip, port) in [("198.18.100.7", 443), ("198.18.100.8", 80)] {
        // Same client address and port, opened, closed, opened again: same backend.
        let line = format!("tcp,198.18.0.9,4242,{vip},{port}");
        let input = format!("{line}\n{line},close\n{line}\n");
        let t = targets(&sim(&input, &[]));
        assert_eq!(t[0], t[2], "{vip}: {t:?}");
    }
    // dh hashes the destination: every client of one VIP lands on one backend.
    let t = targets(&sim(&flows("tcp", "198.18.100.9", 3128, 20), &[]));
    assert!(t.iter().all(|x| *x == t[0]), "{t:?}");
}

#[test]
fn maglev_respects_weights() {
    // Weights 2:1:1 over many clients with mh-port: about half go to the first backend.
    let t = targets(&sim(&flows("tcp", "198.18.100.7", 443, 4000), &[]));
    let first = t.iter().filter(|x| x.as_str() == "198.18.1.1:8443").count();
    assert!((1700..=2300).contains(&first), "{first} of 4000");
}

#[test]
fn lblc_keeps_locality() {
    // One destination sticks to one backend until it is overloaded (IPVS: more active
    // connections than its weight while another backend is under half its weight).
    let t = targets(&sim(&flows("tcp", "198.18.100.10", 3128, 3), &[]));
    assert_eq!(t[0], t[1], "{t:?}");
    assert_ne!(
        t[2], t[0],
        "overloaded backend keeps the destination: {t:?}"
    );
    let t = targets(&sim(&flows("tcp", "198.18.100.11", 3128, 2), &[]));
    assert_eq!(t[0], t[1], "{t:?}");
}

#[test]
fn affinity_drain_and_refusals() {
    let input = "\
udp,198.18.0.2,1000,198.18.100.53,53
udp,198.18.0.2,1001,198.18.100.53,53
udp,198.18.0.3,1000,198.18.100.53,53
tcp,198.18.0.2,1000,198.18.100.99,80
tcp,198.18.0.2,1000,198.18.100.200,80
tcp,198.18.0.2,1000,198.18.100.53,53
";
    let t = targets(&sim(input, &[]));
    // ClientIP affinity pins 198.18.0.2 to its first backend although rr moves on; the
    // next client gets the next backend; the weight-0 backend gets nothing.
    assert_eq!(t[..3], ["198.18.1.1:53", "198.18.1.1:53", "198.18.1.2:53"]);
    // A service without backends is answered (as IPVS and kube-proxy answer it); no frontend:
    // not xvs's, the host gets it.
    assert_eq!(t[3], "reject (no_endpoints)");
    assert_eq!(t[4], "pass");
    assert_eq!(t[5], "pass", "udp service must not catch tcp");
}

#[test]
fn distribution_table_and_json() {
    let o = sim(&flows("tcp", "198.18.100.1", 80, 6), &[]);
    let out = String::from_utf8(o.stdout).unwrap();
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("rr ")).collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(
        rows.iter()
            .all(|r| r.contains(" 2 ") && r.contains("33.33%")),
        "{out}"
    );

    let o = sim(
        "tcp,2001:2::5,999,2001:2:0:100::1,3868\nsctp,2001:2::5,999,2001:2:0:100::1,3868\n",
        &["--json"],
    );
    assert!(o.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    assert_eq!(lines[0]["backend"], serde_json::Value::Null);
    assert_eq!(lines[0]["verdict"], "pass");
    assert_eq!(lines[0]["reason"], serde_json::Value::Null);
    assert_eq!(lines[1]["verdict"], "forward");
    assert_eq!(lines[1]["service"], "sctp6");
    assert_eq!(lines[1]["backend"], "[2001:2:0:1::1]:3868");
    assert_eq!(lines[1]["frontend"], "[2001:2:0:100::1]:3868");
    let dist: Vec<_> = lines
        .iter()
        .filter(|l| l.get("share_pct").is_some())
        .collect();
    assert_eq!(dist.len(), 2);
    assert_eq!(dist[0]["flows"], 1);
}

#[test]
fn bad_flow_line_names_the_line() {
    let o = sim(
        "tcp,198.18.0.2,1000,198.18.100.1,80\nudp,198.18.0.2,70000,198.18.100.1,80\n",
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("<stdin>:2:") && err.contains("src_port"),
        "{err}"
    );
}

#[test]
fn flows_file_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("flows.csv");
    std::fs::write(
        &p,
        "# a comment\n\ntcp,198.18.0.2,1000,198.18.100.1,80,open\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args([
            "sim",
            "--config",
            static_services().to_str().unwrap(),
            "--flows",
            p.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.starts_with("tcp 198.18.0.2:1000 -> 198.18.100.1:80 => 198.18.1.1:8080\n"),
        "{out}"
    );
}

/// Writes a config whose mh services list `backends` (v4 and v6) in the given order, after
/// `pad` rr backends that take the first backend ids, with `m`-slot Maglev tables.
fn mh_config(dir: &Path, name: &str, m: u32, pad: usize, order: &[usize]) -> PathBuf {
    let v4: Vec<String> = (0..9)
        .map(|i| {
            format!(
                "{{ addr = \"198.18.1.{}:{}\", weight = {} }}",
                10 + i,
                8443 + i % 2,
                1 + i % 3
            )
        })
        .collect();
    let v6: Vec<String> = (0..9)
        .map(|i| {
            format!(
                "{{ addr = \"[2001:2:0:1::{:x}]:443\", weight = {} }}",
                0x10 + i,
                (i % 4) * 2
            )
        })
        .collect();
    let list = |all: &[String]| {
        order
            .iter()
            .map(|&i| all[i].as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let pad: Vec<String> = (0..pad)
        .map(|i| format!("{{ addr = \"198.18.2.{}:80\" }}", 1 + i))
        .collect();
    let mut text = format!(
        "[dataplane]\nmode = \"fullnat\"\nsnat_addresses = [\"198.18.1.254\", \"2001:2:0:1::fe\"]\nmh_table_size = {m}\n",
    );
    if !pad.is_empty() {
        text += &format!(
            "[[services]]\nname = \"pad\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nbackends = [{}]\n",
            pad.join(", ")
        );
    }
    text += &format!(
        "[[services]]\nname = \"mh4\"\nvip = \"198.18.100.7\"\nport = 443\nprotocol = \"tcp\"\nscheduler = \"mh\"\nflags = [\"mh-port\"]\nbackends = [{}]\n",
        list(&v4)
    );
    text += &format!(
        "[[services]]\nname = \"mh6\"\nvip = \"2001:2:0:100::7\"\nport = 443\nprotocol = \"tcp\"\nscheduler = \"mh\"\nflags = [\"mh-port\", \"mh-fallback\"]\nbackends = [{}]\n",
        list(&v6)
    );
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Runs `xvs sim --config config --flows file`.
fn sim_file(config: &Path, flows: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xvs"))
        .args(["sim", "--config", config.to_str().unwrap(), "--flows"])
        .arg(flows)
        .output()
        .expect("run xvs")
}

#[test]
fn maglev_agrees_across_processes_whatever_the_backend_order() {
    // Two nodes of a tier (or one node before and after a restart): the same mh services,
    // their backends listed in other orders and numbered differently (the second config has
    // a service first whose backends take the low ids). Every flow must reach the same
    // backend address in both processes.
    let dir = tempfile::tempdir().unwrap();
    let mut input = flows("tcp", "198.18.100.7", 443, 3000);
    for i in 0..3000 {
        input += &format!(
            "tcp,2001:2::{:x},{},2001:2:0:100::7,443\n",
            1 + i % 500,
            20000 + i
        );
    }
    let f = dir.path().join("flows.csv");
    std::fs::write(&f, input).unwrap();
    // The default table size, and a small one whose every slot the flows sample.
    for m in [65537, 251] {
        let a = mh_config(dir.path(), "a.toml", m, 0, &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let b = mh_config(dir.path(), "b.toml", m, 5, &[7, 2, 8, 0, 5, 3, 1, 6, 4]);
        let c = mh_config(dir.path(), "c.toml", m, 2, &[8, 7, 6, 5, 4, 3, 2, 1, 0]);
        same_backends(&a, &[&b, &c], &f);
    }
}

/// Asserts every flow of the file `f` reaches the same backend address under `a` and under
/// each of `others`.
fn same_backends(a: &Path, others: &[&Path], f: &Path) {
    let want = targets(&sim_file(a, f));
    assert_eq!(want.len(), 6000);
    assert!(want.iter().all(|t| !t.starts_with("none")), "{want:?}");
    // Every usable backend is used (the weight-0 ones of mh6 never are).
    let used: std::collections::BTreeSet<&String> = want.iter().collect();
    assert_eq!(used.len(), 9 + 6, "{used:?}");
    for other in others {
        let got = targets(&sim_file(other, f));
        let diff: Vec<usize> = (0..want.len()).filter(|&i| want[i] != got[i]).collect();
        assert!(
            diff.is_empty(),
            "{}: {} of {} flows differ, first {:?}: {} vs {}",
            other.display(),
            diff.len(),
            want.len(),
            diff.first(),
            want[diff[0]],
            got[diff[0]]
        );
    }
}

#[test]
fn verdicts_are_the_pipelines_hygiene_included() {
    let input = "\
tcp,127.0.0.1,1000,198.18.100.1,80
tcp,198.18.100.3,1000,198.18.100.1,80
tcp,198.18.0.2,1000,198.18.100.99,80
tcp,198.18.0.2,1000,198.18.100.99,80,close
udp,198.18.0.2,1000,198.18.100.53,53
udp,198.18.0.2,1000,198.18.100.53,53,close
udp,198.18.0.2,1000,198.18.100.53,53,close
";
    let t = targets(&sim(input, &[]));
    assert_eq!(
        t,
        [
            "drop (martian_source)",
            "drop (own_address_source)",
            "reject (no_endpoints)",
            "drop (no_flow) (close)",
            "198.18.1.1:53",
            "198.18.1.1:53 (close)",
            "drop (no_flow) (close)",
        ]
    );
    let o = sim(
        "tcp,198.18.0.2,1000,198.18.100.99,80\ntcp,127.0.0.1,1,198.18.100.1,80\n",
        &["--json"],
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        (
            &lines[0]["verdict"],
            &lines[0]["reason"],
            &lines[0]["service"]
        ),
        (
            &serde_json::json!("reject"),
            &serde_json::json!("no_endpoints"),
            &serde_json::json!("empty")
        )
    );
    assert_eq!(
        (&lines[1]["verdict"], &lines[1]["reason"]),
        (
            &serde_json::json!("drop"),
            &serde_json::json!("martian_source")
        )
    );
}

/// `xvs sim` and `xvs pcap` give one packet the same verdict: the same pipeline runs both.
#[test]
fn sim_and_pcap_agree() {
    use etherparse::PacketBuilder;
    let config = "\
[dataplane]
mode = \"fullnat\"
snat_addresses = [\"198.18.1.254\"]

[[services]]
name = \"web\"
vip = \"198.18.100.1\"
port = 80
protocol = \"tcp\"
backends = [{ addr = \"198.18.1.1:8080\" }]

[[services]]
name = \"empty\"
vip = \"198.18.100.99\"
port = 80
protocol = \"tcp\"

[[services]]
name = \"emptyudp\"
vip = \"198.18.100.99\"
port = 53
protocol = \"udp\"

[[neighbours]]
ip = \"198.18.1.1\"
mac = \"02:00:00:00:01:01\"
[[neighbours]]
ip = \"198.18.0.2\"
mac = \"02:00:00:00:cc:01\"
[[neighbours]]
ip = \"127.0.0.1\"
mac = \"02:00:00:00:cc:02\"
";
    let flows = [
        ("tcp", "198.18.0.2", 1000u16, "198.18.100.1", 80u16),
        ("tcp", "127.0.0.1", 1001, "198.18.100.1", 80),
        ("tcp", "198.18.100.1", 1002, "198.18.100.1", 80),
        ("tcp", "198.18.0.2", 1003, "198.18.100.99", 80),
        ("udp", "198.18.0.2", 1004, "198.18.100.99", 53),
        ("udp", "198.18.0.2", 1005, "198.18.100.1", 53),
        ("tcp", "198.18.0.2", 1006, "198.18.100.99", 443),
    ];
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("xvs.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut w = pcap::PcapWriter::new(Vec::new(), pcap::Resolution::Micros).unwrap();
    let mut lines = String::new();
    for (i, (proto, src, sport, dst, dport)) in flows.iter().enumerate() {
        let (s, d): (std::net::Ipv4Addr, std::net::Ipv4Addr) =
            (src.parse().unwrap(), dst.parse().unwrap());
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0xcc, 1], [2, 0, 0, 0, 0, 1]).ipv4(
            s.octets(),
            d.octets(),
            64,
        );
        let mut f = Vec::new();
        if *proto == "tcp" {
            b.tcp(*sport, *dport, 1000, 64240).syn().write(&mut f, &[])
        } else {
            b.udp(*sport, *dport).write(&mut f, b"hello")
        }
        .unwrap();
        w.write(std::time::Duration::from_millis(i as u64), &f)
            .unwrap();
        lines += &format!("{proto},{src},{sport},{dst},{dport}\n");
    }
    std::fs::write(dir.path().join("in.pcap"), w.finish().unwrap()).unwrap();
    std::fs::write(dir.path().join("flows.csv"), &lines).unwrap();
    let pcap = Command::new(env!("CARGO_BIN_EXE_xvs"))
        .current_dir(dir.path())
        .args([
            "pcap", "--config", "xvs.toml", "--in", "in.pcap", "--out", "out.pcap",
        ])
        .args(["--report", "-"])
        .output()
        .unwrap();
    assert!(pcap.status.success());
    let sim = sim_file(&cfg, &dir.path().join("flows.csv"));
    assert!(sim.status.success());
    let pcap_verdicts: Vec<String> = String::from_utf8(pcap.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            match (v["verdict"].as_str().unwrap(), v["reason"].as_str()) {
                ("tx", _) => "forward".to_owned(),
                (verdict, Some(r)) => format!("{verdict} ({r})"),
                (verdict, None) => verdict.to_owned(),
            }
        })
        .collect();
    let sim_verdicts: Vec<String> = targets(&sim)
        .into_iter()
        .map(|t| {
            if t.starts_with(|c: char| c.is_ascii_digit()) {
                "forward".to_owned()
            } else {
                t
            }
        })
        .collect();
    assert_eq!(sim_verdicts, pcap_verdicts);
    assert_eq!(
        sim_verdicts,
        [
            "forward",
            "drop (martian_source)",
            "drop (own_address_source)",
            "reject (no_endpoints)",
            "reject (no_endpoints)",
            "pass",
            "pass",
        ]
    );
}
