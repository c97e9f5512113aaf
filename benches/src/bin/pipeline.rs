//! Per-packet cost of `Pipeline::process`, in memory, on one thread: prints `key=value` lines
//! `flows`, `mix`, `packets`, `ns_per_packet`, `mpps_per_core`.
//!
//! - `--mix established`: the flows' handshakes are sent first (not timed: a SYN, then the
//!   first ACK, which moves the flow to ESTABLISHED), then their ACKs are replayed
//!   round-robin, `--rounds` times over all flows (fullnat, IPv4 TCP): every timed packet
//!   belongs to an established flow, whatever `--rounds`.
//! - `--mix syn`: one SYN per flow on a fresh table (every packet schedules, inserts a flow and
//!   takes a SNAT port).
//! - `--mix mixed`: established ACKs with one SYN of a brand-new flow in every 8 packets.
//! - `--mix first-ack`: like `established` without the first ACKs in the set-up: the first
//!   round's packets each complete a handshake (what `established` measured before).
//!
//! Frames go through the pipeline the way a worker drives it: `--batch N` (default: the
//! config's default `dataplane.batch_size`, 64) copies N frames from a pristine array into N
//! work buffers and hands them to `process_batch`, as an AF_XDP worker does per receive
//! batch; `--batch 1` copies one frame at a time and calls `process`. The copy is part of
//! the time. Run with
//! `cargo run --release -p benches --bin pipeline -- --flows 1000000 --mix established`.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fastpath::pipeline::{FrameBatch, Pipeline, PipelineConfig, Verdict, flow_table_config};
use fastpath::snapshot::SnapshotBuilder;
use fastpath::wire::checksum;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BACKENDS: usize = 32;
const STRIDE: usize = 64;
const FRAME_LEN: usize = 54;
/// Largest `--batch`.
const BATCH_MAX: usize = 256;

fn config(flows: usize) -> String {
    let mut s = format!(
        "[dataplane]\nmode = \"fullnat\"\nsnat_addresses = [\"198.18.1.254\"]\nsnat_port_range = \"1024-65535\"\n\
         [flowtable]\ncapacity = {}\nbackends_max = 64\n\
         [[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nscheduler = \"wrr\"\nbackends = [",
        (flows + flows / 4 + 1024).next_power_of_two()
    );
    for b in 0..BACKENDS {
        s += &format!("{{ addr = \"198.18.1.{}:8080\" }},", b + 1);
    }
    s += "]\n";
    for b in 0..BACKENDS {
        s += &format!(
            "[[neighbours]]\nip = \"198.18.1.{}\"\nmac = \"02:00:00:00:01:{:02x}\"\n",
            b + 1,
            b + 1
        );
    }
    s
}

/// Client i: address 198.18.(128 + i / 60000 % 64).(i / 60000 / 64 ..), port 1024 + i % 60000.
fn client(i: usize) -> (Ipv4Addr, u16) {
    let host = i / 60000;
    (
        Ipv4Addr::new(198, 18, 128 + (host / 256 % 64) as u8, (host % 256) as u8),
        1024 + (i % 60000) as u16,
    )
}

fn tcp_frame(out: &mut [u8], i: usize, flags: u8) {
    let (src, sport) = client(i);
    let f = &mut out[..FRAME_LEN];
    f.fill(0);
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0xcc, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..34];
    ip.copy_from_slice(&[
        0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 0, 0, 0, 0, 198, 18, 100, 1,
    ]);
    ip[12..16].copy_from_slice(&src.octets());
    let c = checksum::checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let tcp = &mut f[34..54];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&(i as u32).to_be_bytes());
    tcp[12] = 0x50;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let c = checksum::l4_checksum_v4(&src.octets(), &[198, 18, 100, 1], 6, tcp);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
}

fn frames(range: std::ops::Range<usize>, flags: u8) -> Vec<u8> {
    let mut v = vec![0u8; range.len() * STRIDE];
    for (k, i) in range.enumerate() {
        tcp_frame(&mut v[k * STRIDE..], i, flags);
    }
    v
}

fn pipeline(flows: usize, epoch: Instant) -> Pipeline {
    let cfg = config::parse(&config(flows), "bench.toml").expect("bench config");
    let snapshot = SnapshotBuilder::from_config(&cfg)
        .build_config(&cfg)
        .expect("snapshot");
    let table = flowtable::FlowTable::new(flow_table_config(&cfg), epoch).expect("flow table");
    let affinity = lb_algos::AffinityTable::new(1024, epoch);
    Pipeline::new(
        PipelineConfig::from_config(&cfg, 0, 1),
        Arc::new(table),
        Arc::new(affinity),
        Arc::new(snapshot),
    )
}

/// Sends every frame of `src` (stride `STRIDE`) once, in order; returns (elapsed, tx). The
/// measured packets go through here (and only here): `benches/callgrind.sh` counts the
/// instructions executed inside this function.
#[inline(never)]
fn send_timed(p: &mut Pipeline, src: &[u8], now: Instant, batch: usize) -> (Duration, u64) {
    if batch > 1 {
        send_batched(p, src, now, batch)
    } else {
        send_all(p, src, now)
    }
}

/// [`send_timed`] for set-up traffic (the handshakes before an established run).
#[inline(never)]
fn send_setup(p: &mut Pipeline, src: &[u8], now: Instant) -> u64 {
    send_all(p, src, now).1
}

#[inline(always)]
fn send_all(p: &mut Pipeline, src: &[u8], now: Instant) -> (Duration, u64) {
    let mut buf = [0u8; STRIDE];
    let mut tx = 0u64;
    let t = Instant::now();
    for f in src.chunks_exact(STRIDE) {
        buf.copy_from_slice(f);
        if let Verdict::Tx(_) = p.process(&mut buf[..FRAME_LEN], now) {
            tx += 1;
        }
    }
    (t.elapsed(), tx)
}

/// Work buffers as a [`FrameBatch`] of `FRAME_LEN`-byte frames.
struct Bufs<'a>(&'a mut [[u8; STRIDE]]);

impl FrameBatch for Bufs<'_> {
    #[inline]
    fn frames_len(&self) -> usize {
        self.0.len()
    }
    #[inline]
    fn frame(&mut self, i: usize) -> &mut [u8] {
        &mut self.0[i][..FRAME_LEN]
    }
}

#[inline(always)]
fn send_batched(p: &mut Pipeline, src: &[u8], now: Instant, batch: usize) -> (Duration, u64) {
    let mut bufs = [[0u8; STRIDE]; BATCH_MAX];
    let mut verdicts = [Verdict::Pass; BATCH_MAX];
    let mut tx = 0u64;
    let t = Instant::now();
    for group in src.chunks(STRIDE * batch) {
        let n = group.len() / STRIDE;
        for (b, s) in bufs.iter_mut().zip(group.chunks_exact(STRIDE)) {
            b.copy_from_slice(s);
        }
        p.process_batch(&mut Bufs(&mut bufs[..n]), now, &mut verdicts[..n]);
        tx += verdicts[..n]
            .iter()
            .filter(|v| matches!(v, Verdict::Tx(_)))
            .count() as u64;
    }
    (t.elapsed(), tx)
}

fn main() {
    let mut flows = 1_000_000usize;
    let mut mix = String::from("established");
    let mut rounds = 5usize;
    let mut batch = (config::Dataplane::default().batch_size as usize).min(BATCH_MAX);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--flows" => flows = args.next().and_then(|v| v.parse().ok()).expect("--flows N"),
            "--mix" => mix = args.next().expect("--mix established|syn|mixed|first-ack"),
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--rounds N")
            }
            "--batch" => {
                batch = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|b| (1..=BATCH_MAX).contains(b))
                    .expect("--batch 1..=256")
            }
            other => panic!(
                "unknown argument {other}; use --flows N --mix established|syn|mixed|first-ack [--rounds N] [--batch N]"
            ),
        }
    }
    assert!(
        flows > 0 && flows <= 60000 * 64 * 256,
        "--flows out of range"
    );
    let epoch = Instant::now();
    let mut p = pipeline(flows, epoch);
    let (elapsed, packets, tx) = match mix.as_str() {
        "syn" => {
            let syns = frames(0..flows, 0x02);
            let (e, tx) = send_timed(&mut p, &syns, epoch, batch);
            (e, flows as u64, tx)
        }
        "established" | "mixed" | "first-ack" => {
            let syns = frames(0..flows, 0x02);
            let tx = send_setup(&mut p, &syns, epoch);
            assert_eq!(tx as usize, flows, "every SYN must be forwarded");
            drop(syns);
            let acks = frames(0..flows, 0x10);
            if mix != "first-ack" {
                let tx = send_setup(&mut p, &acks, epoch);
                assert_eq!(tx as usize, flows, "every first ACK must be forwarded");
            }
            let src = if mix == "mixed" {
                // 7 ACKs of established flows, then one SYN of a new flow.
                let new = flows / 7 + 1;
                let news = frames(flows..flows + new, 0x02);
                let mut v = Vec::with_capacity(acks.len() + news.len());
                for (k, chunk) in acks.chunks(7 * STRIDE).enumerate() {
                    v.extend_from_slice(chunk);
                    if let Some(s) = news.get(k * STRIDE..(k + 1) * STRIDE) {
                        v.extend_from_slice(s);
                    }
                }
                rounds = 1;
                v
            } else {
                acks
            };
            let mut total = Duration::ZERO;
            let mut tx = 0;
            for r in 0..rounds {
                let (e, t) = send_timed(
                    &mut p,
                    &src,
                    epoch + Duration::from_millis(r as u64 * 10),
                    batch,
                );
                total += e;
                tx += t;
            }
            (total, (src.len() / STRIDE * rounds) as u64, tx)
        }
        other => panic!("unknown mix {other}"),
    };
    let ns = elapsed.as_nanos() as f64 / packets as f64;
    println!("flows={flows}");
    println!("mix={mix}");
    println!("batch={batch}");
    println!("packets={packets}");
    println!("tx={tx}");
    println!("new_flows={}", p.counters().new_flows);
    println!("ns_per_packet={ns:.1}");
    println!("mpps_per_core={:.2}", 1e3 / ns);
}
