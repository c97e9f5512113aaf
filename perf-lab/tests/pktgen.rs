//! `perf-lab/pktgen/perf-lab.sh --dry-run`: the commands it would write to /proc/net/pktgen,
//! checked for sizes (pktgen's pkt_size is the frame without its FCS), per-thread settings,
//! and the flows they make. The flows are counted by stepping each thread's ranges as pktgen
//! does without the *_RND flags (`mod_cur_headers` in net/core/pktgen.c: every range one step
//! per packet, the source address wrapping after src_max, the ports before udp_*_max) over a
//! whole period: together the threads must send exactly the flows asked, each from its own
//! source address and port, to every service. pktgen's own `flows` (at most MAX_CFLOWS =
//! 65,536 per device) only pins destination addresses; if written, it must be within that.
//! Not privileged: a dry run touches nothing.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

const IFACE: &str = "eth9";
const DST_MAC: &str = "02:00:00:00:00:01";
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 1);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("pktgen/perf-lab.sh")
}

/// The script's output, or its stderr when it fails.
fn dry_run(args: &[&str], flows: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new("sh");
    cmd.arg(script())
        .arg("--dry-run")
        .args([IFACE, DST_MAC])
        .args(args);
    if let Some(f) = flows {
        cmd.env("FLOWS", f);
    } else {
        cmd.env_remove("FLOWS");
    }
    let out = cmd.output().expect("running sh");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `(file, command)` of every `echo "CMD" > /proc/net/pktgen/FILE` line, in order.
fn writes(out: &str) -> Vec<(String, String)> {
    let mut w = Vec::new();
    for line in out.lines() {
        if line.starts_with('#') || line.starts_with("sleep ") {
            continue;
        }
        let rest = line
            .strip_prefix("echo \"")
            .unwrap_or_else(|| panic!("not a pktgen write: {line}"));
        let (cmd, file) = rest
            .split_once("\" > /proc/net/pktgen/")
            .unwrap_or_else(|| panic!("not a pktgen write: {line}"));
        w.push((file.to_owned(), cmd.to_owned()));
    }
    w
}

/// One device's settings: `key -> values` (flags collect).
type Dev = BTreeMap<String, Vec<String>>;

fn one(d: &Dev, key: &str) -> String {
    let v = d.get(key).unwrap_or_else(|| panic!("{key} not set: {d:?}"));
    assert_eq!(v.len(), 1, "{key} set {} times", v.len());
    v[0].clone()
}

fn num(d: &Dev, key: &str) -> u64 {
    one(d, key)
        .parse()
        .unwrap_or_else(|_| panic!("{key}: not a number"))
}

fn ip(d: &Dev, key: &str) -> u32 {
    u32::from(one(d, key).parse::<Ipv4Addr>().expect(key))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// pktgen's sequential range: `min..=max` for addresses, `min..max` for ports; no range when
/// min is not below max.
struct Range {
    min: u64,
    len: u64,
}

impl Range {
    fn addr(min: u32, max: u32) -> Range {
        Range {
            min: u64::from(min),
            len: if min < max {
                u64::from(max - min) + 1
            } else {
                1
            },
        }
    }
    fn port(min: u64, max: u64) -> Range {
        Range {
            min,
            len: if min < max { max - min } else { 1 },
        }
    }
    /// The value of packet k (pktgen steps before it builds each packet).
    fn at(&self, k: u64) -> u64 {
        self.min + (k + 1) % self.len
    }
}

/// Checks one dry run; returns the flows (source, source port, destination port).
fn check(args: &[&str], flows: Option<&str>) -> HashSet<(u32, u16, u16)> {
    let out = dry_run(args, flows).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let size: u64 = args[1].parse().unwrap();
    let rate: u64 = args[2].parse().unwrap();
    let threads: u64 = args[4].parse().unwrap();
    let w = writes(&out);
    let mut devs: BTreeMap<String, Dev> = BTreeMap::new();
    let mut ctrl = Vec::new();
    for (file, cmd) in &w {
        if file == "pgctrl" {
            ctrl.push(cmd.clone());
            continue;
        }
        if let Some(t) = file.strip_prefix("kpktgend_") {
            let t: u64 = t.parse().unwrap();
            assert!(t < threads, "{args:?}: thread {t}");
            match cmd.as_str() {
                "rem_device_all" => {}
                c => assert_eq!(c, format!("add_device {IFACE}@{t}"), "{args:?}"),
            }
            continue;
        }
        let (key, val) = cmd.split_once(' ').unwrap_or((cmd, ""));
        devs.entry(file.clone())
            .or_default()
            .entry(key.to_owned())
            .or_default()
            .push(val.to_owned());
    }
    assert_eq!(ctrl, ["start", "stop"], "{args:?}");
    assert_eq!(
        devs.len() as u64,
        threads,
        "{args:?}: one device per thread"
    );
    let mut all = HashSet::new();
    for (t, (name, d)) in devs.iter().enumerate() {
        assert_eq!(name, &format!("{IFACE}@{t}"));
        // The frame without its FCS: "64" is a 64-byte frame on the wire.
        assert_eq!(num(d, "pkt_size"), size - 4, "{args:?}");
        assert_eq!(num(d, "count"), 0);
        assert_eq!(
            num(d, "clone_skb"),
            0,
            "every packet built anew: ranges apply"
        );
        assert_eq!(
            (num(d, "queue_map_min"), num(d, "queue_map_max")),
            (t as u64, t as u64)
        );
        assert_eq!(one(d, "dst_mac"), DST_MAC);
        assert_eq!(one(d, "dst").parse::<Ipv4Addr>().unwrap(), VIP);
        // Sequential ranges (random picks make no exact flow count), UDP checksums.
        assert_eq!(d["flag"], ["UDPCSUM"], "{args:?}");
        if let Some(f) = d.get("flows") {
            assert!(f.iter().all(|f| f.parse::<u64>().unwrap() <= 65_536));
        }
        if rate > 0 {
            assert_eq!(num(d, "ratep"), rate / threads);
        } else {
            assert!(!d.contains_key("ratep"));
        }
        let src = Range::addr(ip(d, "src_min"), ip(d, "src_max"));
        let sport = Range::port(num(d, "udp_src_min"), num(d, "udp_src_max"));
        let dport = Range::port(num(d, "udp_dst_min"), num(d, "udp_dst_max"));
        assert!(
            src.min >= u64::from(u32::from(Ipv4Addr::new(198, 18, 0, 16)))
                && src.min + src.len - 1 <= u64::from(u32::from(Ipv4Addr::new(198, 18, 0, 239))),
            "{args:?}: sources within 198.18.0.16-239"
        );
        assert!(sport.min >= 1024 && sport.min + sport.len - 1 <= 65535);
        let lcm = |a: u64, b: u64| a / gcd(a, b) * b;
        let period = lcm(lcm(src.len, sport.len), dport.len);
        let mine: HashSet<(u32, u16, u16)> = (0..period)
            .map(|k| (src.at(k) as u32, sport.at(k) as u16, dport.at(k) as u16))
            .collect();
        assert_eq!(mine.len() as u64, period);
        let n = mine.len();
        all.extend(mine);
        assert_eq!(
            all.len(),
            n * (t + 1),
            "{args:?}: threads send disjoint flows"
        );
    }
    all
}

#[test]
fn dry_run_commands_make_the_flows_asked() {
    let cases: &[(&[&str], Option<&str>, usize, usize)] = &[
        // (scenario size rate seconds threads), FLOWS, flows, services
        (&["one-service", "64", "0", "10", "1"], None, 1000, 1),
        (
            &["one-service", "1518", "1000000", "10", "2"],
            None,
            1000,
            1,
        ),
        (&["change-under-load", "128", "0", "5", "4"], None, 1000, 1),
        (&["flows-1m", "64", "0", "10", "1"], None, 1_000_000, 1),
        (
            &["flows-1m", "64", "2000000", "10", "4"],
            None,
            1_000_000,
            1,
        ),
        (&["flows-1m", "64", "0", "10", "5"], None, 1_000_000, 1),
        (&["syn-flood", "64", "0", "10", "8"], None, 1_000_000, 1),
        (
            &["services-10k", "64", "0", "10", "1"],
            None,
            10_000,
            10_000,
        ),
        (
            &["services-10k", "64", "0", "10", "4"],
            None,
            10_000,
            10_000,
        ),
        (
            &["one-service", "64", "0", "10", "4"],
            Some("131072"),
            131_072,
            1,
        ),
    ];
    for (args, env, flows, services) in cases {
        let got = check(args, *env);
        assert_eq!(got.len(), *flows, "{args:?}: flows");
        let sources: HashSet<(u32, u16)> = got.iter().map(|f| (f.0, f.1)).collect();
        assert_eq!(
            sources.len(),
            *flows,
            "{args:?}: a source address and port per flow"
        );
        let ports: BTreeSet<u16> = got.iter().map(|f| f.2).collect();
        let want: BTreeSet<u16> = (1000..1000 + *services as u16).collect();
        assert_eq!(ports, want, "{args:?}: services");
    }
}

#[test]
fn bad_arguments_are_refused() {
    for (args, env) in [
        (&["one-service", "60", "0", "10", "1"][..], None),
        (&["one-service", "1519", "0", "10", "1"], None),
        (&["services-10k", "64", "0", "10", "3"], None),
        (&["one-service", "64", "0", "10", "1"], Some("65536")),
        (&["no-such-scenario", "64", "0", "10", "1"], None),
    ] {
        assert!(
            dry_run(args, env).is_err(),
            "{args:?} FLOWS={env:?} should be refused"
        );
    }
}
