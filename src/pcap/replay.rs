//! The replay behind `xvs pcap`: a capture through one pipeline built from the config, the
//! transmitted frames to an output capture, one report line per input packet. The capture
//! formats are the `pcap` crate's (`pcap/src/lib.rs`); the pipeline is the fastpath's, built
//! through the same config → snapshot path as the daemon's.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Instant;

use fastpath::pipeline::{Pipeline, PipelineConfig, Verdict};
use fastpath::settings::flow_table_config;
use pcap::{CaptureReader, PcapError, PcapWriter, link};

/// What [`replay`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Frames read.
    pub frames: u64,
    /// Frames written to the output (verdict `tx`, and the rejects).
    pub tx: u64,
    /// Packets not given to the pipeline, by reason ([`pcap::link::Skip::name`]): not IP or ARP,
    /// or shorter than their link header.
    pub skipped: std::collections::BTreeMap<&'static str, u64>,
    /// The pipeline's counters at the end.
    pub counters: fastpath::pipeline::Counters,
}

/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The input capture could not be read.
    #[error("reading the input capture: {0}")]
    Input(PcapError),
    /// The output capture could not be written.
    #[error("writing the output capture: {0}")]
    Output(PcapError),
    /// The report could not be written.
    #[error("writing the report: {0}")]
    Report(io::Error),
    /// The config's services or tables could not be built.
    #[error("building the dataplane from the config: {0}")]
    Build(String),
}

/// Replays a capture (pcap or pcapng, link types of [`pcap::link::SUPPORTED`]) through one
/// [`Pipeline`](Pipeline) (worker 0 of 1, port 0, MAC
/// [`DEFAULT_MAC`](fastpath::pipeline::DEFAULT_MAC)) built from `config`: each packet becomes an
/// Ethernet frame ([`pcap::link::to_ethernet`], the pipeline's MAC as the destination of a cooked or
/// raw-IP packet), time comes from the capture (the first packet is the epoch), every `Tx`
/// frame is written to `output` with its input timestamp, and `report` gets one JSON line per
/// input packet: `{"frame":n,"verdict":"tx","port":p}` /
/// `{"frame":n,"verdict":"drop","reason":"..."}` /
/// `{"frame":n,"verdict":"reject","reason":"...","port":p}` (the reject, an RST or a port
/// unreachable to the sender, is written to `output` too) / `{"frame":n,"verdict":"pass"}` /
/// `{"frame":n,"verdict":"slow"}` / `{"frame":n,"verdict":"skip","reason":"not_ip"}` (`n` from
/// 1, as Wireshark numbers frames). A packet of an unsupported link type stops the replay
/// with [`pcap::PcapError::LinkType`].
pub fn replay<R: Read, W: Write>(
    config: &config::Config,
    input: R,
    output: W,
    mut report: Option<&mut dyn Write>,
) -> Result<ReplaySummary, ReplayError> {
    let mut reader = CaptureReader::new(input).map_err(ReplayError::Input)?;
    let mut writer = PcapWriter::new(output, reader.resolution()).map_err(ReplayError::Output)?;
    let snapshot = fastpath::snapshot::SnapshotBuilder::from_config(config)
        .build_config(config)
        .map_err(|e| ReplayError::Build(e.to_string()))?;
    let epoch = Instant::now();
    let flows = flowtable::FlowTable::new(flow_table_config(config), epoch)
        .map_err(|e| ReplayError::Build(e.to_string()))?;
    let affinity = lb_algos::AffinityTable::new(64 * 1024, epoch);
    let pipeline_config = PipelineConfig::from_config(config, 0, 1);
    let mac = pipeline_config.mac;
    let mut pipeline = Pipeline::new(
        pipeline_config,
        Arc::new(flows),
        Arc::new(affinity),
        Arc::new(snapshot),
    );
    let mut summary = ReplaySummary::default();
    let mut first_ts = None;
    let mut frame = Vec::new();
    while let Some(pkt) = reader.next_packet().map_err(ReplayError::Input)? {
        summary.frames += 1;
        let n = summary.frames;
        let ts = pkt.record.ts;
        if !link::supported(pkt.linktype) {
            return Err(ReplayError::Input(PcapError::LinkType(pkt.linktype)));
        }
        if let Err(skip) = link::to_ethernet(pkt.linktype, &pkt.record.data, mac, &mut frame) {
            *summary.skipped.entry(skip.name()).or_default() += 1;
            if let Some(r) = report.as_deref_mut() {
                let reason = skip.name();
                writeln!(r, r#"{{"frame":{n},"verdict":"skip","reason":"{reason}"}}"#)
                    .map_err(ReplayError::Report)?;
            }
            continue;
        }
        let t0 = *first_ts.get_or_insert(ts);
        let now = epoch + ts.saturating_sub(t0);
        // Room for a frame that grows (the SYN proxy's SYN to a backend), as UMEM has.
        let mut len = frame.len();
        frame.resize(len + 64, 0);
        let verdict = pipeline.process_frame(&mut frame, &mut len, now);
        frame.truncate(len);
        if verdict.tx_port().is_some() {
            writer.write(ts, &frame).map_err(ReplayError::Output)?;
            summary.tx += 1;
        }
        if let Some(r) = report.as_deref_mut() {
            let line = match verdict {
                Verdict::Tx(port) => format!(r#"{{"frame":{n},"verdict":"tx","port":{port}}}"#),
                Verdict::Drop(reason) => {
                    format!(
                        r#"{{"frame":{n},"verdict":"drop","reason":"{}"}}"#,
                        reason.name()
                    )
                }
                Verdict::Reject { reason, port } => format!(
                    r#"{{"frame":{n},"verdict":"reject","reason":"{}","port":{port}}}"#,
                    reason.name()
                ),
                v => format!(r#"{{"frame":{n},"verdict":"{}"}}"#, v.name()),
            };
            writeln!(r, "{line}").map_err(ReplayError::Report)?;
        }
    }
    writer.finish().map_err(ReplayError::Output)?;
    if let Some(r) = report {
        r.flush().map_err(ReplayError::Report)?;
    }
    summary.counters = pipeline.counters().clone();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    //! Fixture frames through the replay (moved from `fastpath/tests`, with the replay).

    use std::time::Duration;

    use super::replay;
    use ::pcap::{PcapReader, PcapWriter, Resolution};
    use fastpath::testing::*;

    const C4: &str = "198.18.0.1:40001";
    const VIP: &str = "198.18.100.1:80";
    const VIPS: &str = "198.18.100.9:3868";

    fn cin(src: &str, dst: &str, l4: L4) -> Vec<u8> {
        frame(CLIENT_MAC, XVS_MAC, sa(src), sa(dst), 64, l4)
    }

    #[test]
    fn replay_fixture_frames_nanosecond_capture() {
        let cfg = config::parse(CONFIG, "fixture.toml").unwrap();
        let mut w = PcapWriter::new(Vec::new(), Resolution::Nanos).unwrap();
        let t = Duration::new(1_700_000_000, 123_456_789);
        w.write(
            t,
            &frame(
                CLIENT_MAC,
                XVS_MAC,
                sa("198.18.0.1:1"),
                sa("198.18.100.1:80"),
                64,
                SYN,
            ),
        )
        .unwrap();
        w.write(
            t + Duration::from_millis(1),
            &frame(
                B1_MAC,
                XVS_MAC,
                sa("198.18.1.1:8080"),
                sa("198.18.1.254:40000"),
                64,
                SYNACK,
            ),
        )
        .unwrap();
        w.write(
            t,
            &frame(
                CLIENT_MAC,
                XVS_MAC,
                sa("198.18.0.1:2"),
                sa("198.18.100.1:80"),
                64,
                ACK,
            ),
        )
        .unwrap();
        w.write(t, &[0u8; 5]).unwrap();
        let input = w.finish().unwrap();
        let mut out = Vec::new();
        let mut report = Vec::new();
        let s = replay(&cfg, &input[..], &mut out, Some(&mut report)).unwrap();
        assert_eq!((s.frames, s.tx), (4, 2));
        let recs: Vec<_> = PcapReader::new(&out[..])
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].ts, t);
        assert_eq!(recs[1].ts, t + Duration::from_millis(1));
        assert_eq!(
            recs[0].data,
            frame(
                XVS_MAC,
                B1_MAC,
                sa("198.18.1.254:40000"),
                sa("198.18.1.1:8080"),
                63,
                SYN
            )
        );
        for r in &recs {
            verify_checksums(&r.data, "replayed");
        }
        let text = String::from_utf8(report).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[2],
            serde_json::json!({"frame": 3, "verdict": "drop", "reason": "no_flow"})
        );
        assert_eq!(
            lines[3],
            serde_json::json!({"frame": 4, "verdict": "drop", "reason": "truncated"})
        );
    }

    #[test]
    fn hygiene_drops_in_the_pcap_report() {
        let cfg = config::parse(CONFIG, "fixture.toml").unwrap();
        let mut w = PcapWriter::new(Vec::new(), Resolution::Micros).unwrap();
        let t = std::time::Duration::from_secs(1_700_000_000);
        w.write(t, &cin("127.0.0.1:1", VIP, SYN)).unwrap();
        w.write(t, &cin("198.18.100.1:1", VIP, SYN)).unwrap();
        let mut sctp = cin(C4, VIPS, L4::Sctp(1));
        sctp[14 + 20 + 8] ^= 1;
        w.write(t, &sctp).unwrap();
        w.write(t, &frag4(C4, "198.18.100.54:53", 1, 65_528, 8))
            .unwrap();
        let input = w.finish().unwrap();
        let mut report = Vec::new();
        replay(&cfg, &input[..], &mut Vec::new(), Some(&mut report)).unwrap();
        let reasons: Vec<String> = String::from_utf8(report)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["reason"].to_string())
            .collect();
        assert_eq!(
            reasons,
            [
                "\"martian_source\"",
                "\"own_address_source\"",
                "\"bad_sctp_checksum\"",
                "\"oversized_fragment\""
            ]
        );
    }

    #[test]
    fn a_reject_is_reported_and_written_out() {
        let cfg = config::parse(CONFIG, "fixture.toml").unwrap();
        let mut w = PcapWriter::new(Vec::new(), Resolution::Micros).unwrap();
        let t = std::time::Duration::from_secs(1_700_000_000);
        w.write(t, &cin(C4, "198.18.100.99:80", SYN)).unwrap();
        let input = w.finish().unwrap();
        let (mut out, mut report) = (Vec::new(), Vec::new());
        let s = replay(&cfg, &input[..], &mut out, Some(&mut report)).unwrap();
        assert_eq!((s.tx, s.counters.rejects_total()), (1, 1));
        let line: serde_json::Value =
            serde_json::from_str(String::from_utf8(report).unwrap().trim()).unwrap();
        assert_eq!(
            line,
            serde_json::json!({"frame": 1, "verdict": "reject", "reason": "no_endpoints", "port": 0})
        );
        let recs: Vec<_> = PcapReader::new(&out[..])
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        // The RST to the client: 54 bytes, from the VIP, RST|ACK.
        assert_eq!(recs[0].data.len(), 54);
        assert_eq!(&recs[0].data[26..34], &[198, 18, 100, 99, 198, 18, 0, 1]);
        assert_eq!(recs[0].data[47], 0x14);
        verify_checksums(&recs[0].data, "reject");
    }
}
