//! `xvs pcap --config F --in IN.pcap --out OUT.pcap [--report R.json | --report -]`: replay a capture
//! through one fastpath pipeline built from the config (see `replay.rs`). The
//! input is pcap or pcapng, Ethernet, Linux cooked (`tcpdump -i any`) or raw IP; the output
//! is Ethernet pcap.
//!
//! Exit codes: 0 done, 1 the capture could not be read or an output could not be written,
//! 2 the config is invalid or its services cannot be built.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;

mod replay;

use replay::{ReplayError, replay};

/// Runs the replay; prints a one-line summary to stderr.
pub fn main(config: &Path, input: &Path, output: &Path, report: Option<&Path>) -> ExitCode {
    let cfg = match config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xvs pcap: invalid configuration:\n{e}");
            return ExitCode::from(2);
        }
    };
    let fail = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        eprintln!("xvs pcap: {what} {}: {e}", path.display());
        ExitCode::from(1)
    };
    let inp = match File::open(input) {
        Ok(f) => BufReader::new(f),
        Err(e) => return fail("cannot open input", input, &e),
    };
    let out = match File::create(output) {
        Ok(f) => BufWriter::new(f),
        Err(e) => return fail("cannot create output", output, &e),
    };
    // `--report -`: the report on stdout (the summary stays on stderr).
    let mut rep: Option<Box<dyn Write>> = match report {
        None => None,
        Some(p) if p == Path::new("-") => Some(Box::new(BufWriter::new(std::io::stdout().lock()))),
        Some(p) => match File::create(p) {
            Ok(f) => Some(Box::new(BufWriter::new(f))),
            Err(e) => return fail("cannot create report", p, &e),
        },
    };
    let result = replay(&cfg, inp, out, rep.as_mut().map(|w| w as &mut dyn Write));
    drop(rep);
    match result {
        Ok(s) => {
            let c = &s.counters;
            let skipped: u64 = s.skipped.values().sum();
            let skipped = if skipped == 0 {
                String::new()
            } else {
                let why: Vec<String> = s.skipped.iter().map(|(r, n)| format!("{r} {n}")).collect();
                format!(", {skipped} skipped ({})", why.join(", "))
            };
            eprintln!(
                "xvs pcap: {} frames: {} tx, {} drop, {} reject, {} pass, {} slow{skipped}; {} new flows; synproxy: {} syns, {} acks",
                s.frames,
                c.tx,
                c.drops_total(),
                c.rejects_total(),
                c.pass,
                c.slow,
                c.new_flows,
                c.synproxy_syns,
                c.synproxy_acks
            );
            ExitCode::SUCCESS
        }
        Err(ReplayError::Build(e)) => {
            eprintln!("xvs pcap: invalid configuration: {e}");
            ExitCode::from(2)
        }
        Err(ReplayError::Input(e)) => fail("invalid capture", input, &e),
        Err(ReplayError::Output(e)) => fail("cannot write", output, &e),
        Err(ReplayError::Report(e)) => fail("cannot write report", report.unwrap_or(output), &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// An Ethernet/IPv4/UDP frame 198.18.0.1:5000 → dst:53, checksums filled by hand.
    fn udp_frame(dst: [u8; 4], ttl: u8) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0xcc, 1, 0x08, 0x00];
        let mut ip = vec![0x45, 0, 0, 32, 0, 0, 0, 0, ttl, 17, 0, 0, 198, 18, 0, 1];
        ip.extend_from_slice(&dst);
        let c = fastpath::wire::checksum::checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0x13, 0x88, 0, 53, 0, 12, 0, 0, 1, 2, 3, 4]);
        f
    }

    #[test]
    fn replays_a_capture_and_reports_every_frame() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("xvs.toml");
        std::fs::write(&cfg, CONFIG).unwrap();
        let input = dir.path().join("in.pcap");
        let mut w = ::pcap::PcapWriter::new(Vec::new(), ::pcap::Resolution::Micros).unwrap();
        let t = std::time::Duration::new(1_700_000_000, 5_000);
        w.write(t, &udp_frame([198, 18, 100, 53], 64)).unwrap();
        w.write(t, &udp_frame([198, 18, 100, 53], 1)).unwrap();
        w.write(t, &udp_frame([198, 18, 0, 9], 64)).unwrap();
        std::fs::write(&input, w.finish().unwrap()).unwrap();
        let output = dir.path().join("out.pcap");
        let report = dir.path().join("r.json");
        assert_eq!(
            main(&cfg, &input, &output, Some(&report)),
            ExitCode::SUCCESS
        );
        let out = std::fs::read(&output).unwrap();
        let recs: Vec<_> = ::pcap::PcapReader::new(&out[..])
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].ts, t);
        assert_eq!(&recs[0].data[14 + 16..14 + 20], &[198, 18, 1, 1]);
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&report)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            serde_json::json!({"frame": 1, "verdict": "tx", "port": 0})
        );
        assert_eq!(
            lines[1],
            serde_json::json!({"frame": 2, "verdict": "drop", "reason": "ttl_exceeded"})
        );
        assert_eq!(lines[2], serde_json::json!({"frame": 3, "verdict": "pass"}));
    }

    #[test]
    fn bad_inputs_give_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("xvs.toml");
        std::fs::write(&cfg, CONFIG).unwrap();
        let bad_cfg = dir.path().join("bad.toml");
        std::fs::write(&bad_cfg, "[dataplane]\nmode = \"dsr\"\n").unwrap();
        let junk = dir.path().join("junk.pcap");
        std::fs::write(&junk, b"this is not a capture at all").unwrap();
        let out = dir.path().join("out.pcap");
        assert_eq!(main(&bad_cfg, &junk, &out, None), ExitCode::from(2));
        assert_eq!(main(&cfg, &junk, &out, None), ExitCode::from(1));
        assert_eq!(
            main(&cfg, &dir.path().join("missing.pcap"), &out, None),
            ExitCode::from(1)
        );
    }
}
