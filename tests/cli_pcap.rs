//! `xvs pcap --report -`: the per-frame report on stdout (a pipe for `jq`), and no file
//! named `-`.

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
    let mut w =
        fastpath::pcap::PcapWriter::new(Vec::new(), fastpath::pcap::Resolution::Micros).unwrap();
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
