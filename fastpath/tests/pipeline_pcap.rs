//! A replay of fixture frames through `fastpath::pcap::replay` (the `xvs pcap` CLI is tested
//! in the root crate's `src/pcap.rs`).

mod pipeline_common;

use fastpath::pcap::{PcapReader, PcapWriter, Resolution, replay};
use pipeline_common::*;
use std::time::Duration;

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
