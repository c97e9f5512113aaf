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
//! - `--mix synproxy`: SYN-proxied handshakes (`[synproxy] mode = "on"`): per connection the
//!   client's SYN (Linux's options) → the SYN-ACK with a cookie, the client's ACK → the SYN
//!   to the backend (a new flow, a SNAT port), the backend's SYN-ACK → the ACK back to it;
//!   all three frames timed (the frames of each step are built from the previous step's
//!   output between the timed passes). Prints `synproxy_handshakes_per_sec` too.
//!
//! The other mixes run with the SYN proxy off (their SYNs would engage `auto`).
//!
//! Frames go through the pipeline the way a worker drives it: `--batch N` (default: the
//! config's default `dataplane.batch_size`, 64) copies N frames from a pristine array into N
//! work buffers and hands them to `process_batch`, as an AF_XDP worker does per receive
//! batch; `--batch 1` copies one frame at a time and calls `process`. The copy is part of
//! the time. Run with
//! `cargo run --release -p benches --bin pipeline -- --flows 1000000 --mix established`.
//! `--general` (with `--batch 1`) sends every frame through `Pipeline::process_general`, the
//! general path without the fixed-offset IPv4 shortcut, and prints `general=1`: what the
//! shortcut saves. `--sync` logs every flow event for flow sync (a thread drains the log each millisecond, as
//! the slowpath does) and prints `sync_events` and `sync_log_dropped`.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fastpath::flowlog::{self, FlowLog};
use fastpath::pipeline::{FrameBatch, Pipeline, PipelineConfig, Verdict};
use fastpath::settings::flow_table_config;
use fastpath::snapshot::SnapshotBuilder;
use fastpath::wire::checksum;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BACKENDS: usize = 32;
const STRIDE: usize = 64;
const FRAME_LEN: usize = 54;
/// Largest `--batch`.
const BATCH_MAX: usize = 256;

fn config(flows: usize, synproxy: bool) -> String {
    let mut s = format!(
        "[dataplane]\nmode = \"fullnat\"\nsnat_addresses = [\"198.18.1.254\"]\nsnat_port_range = \"1024-65535\"\n\
         [synproxy]\nmode = \"{}\"\n\
         [flowtable]\ncapacity = {}\nbackends_max = 64\n\
         [[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\nscheduler = \"wrr\"\nbackends = [",
        if synproxy { "on" } else { "off" },
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
    if synproxy {
        // SYN-ACKs go back to the clients: their MACs.
        for h in 0..=flows / 60000 {
            let (ip, _) = client(h * 60000);
            s += &format!("[[neighbours]]\nip = \"{ip}\"\nmac = \"02:00:00:00:cc:01\"\n");
        }
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

fn pipeline(flows: usize, synproxy: bool, epoch: Instant) -> Pipeline {
    let cfg = config::parse(&config(flows, synproxy), "bench.toml").expect("bench config");
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
/// `batch == 0`: `--general`, one frame at a time through the general path.
#[inline(never)]
fn send_timed(p: &mut Pipeline, src: &[u8], now: Instant, batch: usize) -> (Duration, u64) {
    if batch > 1 {
        send_batched(p, src, now, batch)
    } else if batch == 1 {
        send_all::<false>(p, src, now)
    } else {
        send_all::<true>(p, src, now)
    }
}

/// [`send_timed`] for set-up traffic (the handshakes before an established run).
#[inline(never)]
fn send_setup(p: &mut Pipeline, src: &[u8], now: Instant) -> u64 {
    send_all::<false>(p, src, now).1
}

/// One frame at a time through `Pipeline::process`, or with `GENERAL` through
/// `Pipeline::process_general`: what every frame would cost without the fixed-offset shortcut
/// (`fastpath/src/pipeline/fast.rs`).
#[inline(always)]
fn send_all<const GENERAL: bool>(p: &mut Pipeline, src: &[u8], now: Instant) -> (Duration, u64) {
    let mut buf = [0u8; STRIDE];
    let mut tx = 0u64;
    // (Read once, as a worker reads its clock once a batch.)
    let clock = p.clock(now);
    let t = Instant::now();
    for f in src.chunks_exact(STRIDE) {
        buf.copy_from_slice(f);
        let frame = &mut buf[..FRAME_LEN];
        let v = if GENERAL {
            p.process_general(frame, now)
        } else {
            p.process_at(frame, clock)
        };
        if let Verdict::Tx(_) = v {
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
    let mut sync = false;
    let mut general = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--flows" => flows = args.next().and_then(|v| v.parse().ok()).expect("--flows N"),
            "--mix" => {
                mix = args
                    .next()
                    .expect("--mix established|syn|mixed|first-ack|synproxy")
            }
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
            "--sync" => sync = true,
            "--general" => general = true,
            other => panic!(
                "unknown argument {other}; use --flows N --mix established|syn|mixed|first-ack|synproxy [--rounds N] [--batch N] [--general] [--sync]"
            ),
        }
    }
    assert!(
        flows > 0 && flows <= 60000 * 64 * 256,
        "--flows out of range"
    );
    assert!(
        !general || (batch == 1 && mix != "synproxy"),
        "--general needs --batch 1 and a mix other than synproxy"
    );
    let timed_batch = if general { 0 } else { batch };
    let epoch = Instant::now();
    let mut p = pipeline(flows, mix == "synproxy", epoch);
    // `--sync`: the worker logs its flows for flow sync, and a thread drains the log every
    // millisecond as the slowpath does every `[sync] interval`.
    let drained = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drainer = sync.then(|| {
        let log = Arc::new(FlowLog::new(flowlog::DEFAULT_CAPACITY));
        p.set_flow_log(Arc::clone(&log));
        let (drained, stop) = (Arc::clone(&drained), Arc::clone(&stop));
        std::thread::spawn(move || {
            use std::sync::atomic::Ordering::Relaxed;
            while !stop.load(Relaxed) {
                while log.pop().is_some() {
                    drained.fetch_add(1, Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            log.dropped()
        })
    });
    let (elapsed, packets, tx) = match mix.as_str() {
        "synproxy" => {
            let (e, tx) = synproxy::handshakes(&mut p, flows, epoch, batch);
            println!(
                "synproxy_handshakes_per_sec={:.0}",
                flows as f64 / e.as_secs_f64()
            );
            (e, 3 * flows as u64, tx)
        }
        "syn" => {
            let syns = frames(0..flows, 0x02);
            let (e, tx) = send_timed(&mut p, &syns, epoch, timed_batch);
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
                    timed_batch,
                );
                total += e;
                tx += t;
            }
            (total, (src.len() / STRIDE * rounds) as u64, tx)
        }
        other => panic!("unknown mix {other}"),
    };
    let ns = elapsed.as_nanos() as f64 / packets as f64;
    if let Some(d) = drainer {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let dropped = d.join().expect("drainer");
        println!("sync=1");
        println!(
            "sync_events={}",
            drained.load(std::sync::atomic::Ordering::Relaxed)
        );
        println!("sync_log_dropped={dropped}");
    }
    println!("flows={flows}");
    println!("mix={mix}");
    println!("batch={batch}");
    if general {
        println!("general=1");
    }
    println!("packets={packets}");
    println!("tx={tx}");
    println!("new_flows={}", p.counters().new_flows);
    println!("ns_per_packet={ns:.1}");
    println!("mpps_per_core={:.2}", 1e3 / ns);
}

/// `--mix synproxy`.
mod synproxy {
    use super::*;

    /// Bytes per frame buffer: room for the SYN that replaces a client's ACK.
    const ROOM: usize = 128;

    /// Frames in buffers with room, as a [`FrameBatch`] (as UMEM frames are).
    struct Roomy<'a> {
        bufs: &'a mut [[u8; ROOM]],
        lens: &'a mut [usize],
    }

    impl FrameBatch for Roomy<'_> {
        #[inline]
        fn frames_len(&self) -> usize {
            self.bufs.len()
        }
        #[inline]
        fn frame(&mut self, i: usize) -> &mut [u8] {
            &mut self.bufs[i][..self.lens[i]]
        }
        #[inline]
        fn buffer(&mut self, i: usize) -> &mut [u8] {
            &mut self.bufs[i]
        }
        #[inline]
        fn set_len(&mut self, i: usize, len: usize) {
            self.lens[i] = len;
        }
    }

    /// A TCP frame (IPv4, no IP options) into `out`: `src` → `dst`, options `opts`.
    #[allow(clippy::too_many_arguments)]
    fn tcp(
        out: &mut [u8; ROOM],
        src: (Ipv4Addr, u16),
        dst: (Ipv4Addr, u16),
        seq: u32,
        ack: u32,
        flags: u8,
        opts: &[u8],
    ) -> usize {
        let len = 54 + opts.len();
        out.fill(0);
        let f = &mut out[..len];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0xcc, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..34];
        ip.copy_from_slice(&[
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ]);
        ip[2..4].copy_from_slice(&((len - 14) as u16).to_be_bytes());
        ip[12..16].copy_from_slice(&src.0.octets());
        ip[16..20].copy_from_slice(&dst.0.octets());
        let c = checksum::checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let tcp = &mut f[34..];
        tcp[0..2].copy_from_slice(&src.1.to_be_bytes());
        tcp[2..4].copy_from_slice(&dst.1.to_be_bytes());
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        tcp[8..12].copy_from_slice(&ack.to_be_bytes());
        tcp[12] = (((20 + opts.len()) / 4) << 4) as u8;
        tcp[13] = flags;
        tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
        tcp[20..].copy_from_slice(opts);
        let c = checksum::l4_checksum_v4(&src.0.octets(), &dst.0.octets(), 6, tcp);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        len
    }

    fn be32(f: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]])
    }

    /// Times `frames` (each `lens[i]` long) through the pipeline as a worker does, in
    /// batches of `batch` (1: `process_frame`); the frames are left as transmitted.
    fn timed(
        p: &mut Pipeline,
        frames: &mut [[u8; ROOM]],
        lens: &mut [usize],
        now: Instant,
        batch: usize,
    ) -> (Duration, u64) {
        let mut verdicts = [Verdict::Pass; BATCH_MAX];
        let mut tx = 0u64;
        let t = Instant::now();
        if batch == 1 {
            for (f, len) in frames.iter_mut().zip(lens.iter_mut()) {
                if let Verdict::Tx(_) = p.process_frame(f, len, now) {
                    tx += 1;
                }
            }
        } else {
            for (f, l) in frames.chunks_mut(batch).zip(lens.chunks_mut(batch)) {
                let n = f.len();
                p.process_batch(&mut Roomy { bufs: f, lens: l }, now, &mut verdicts[..n]);
                tx += verdicts[..n]
                    .iter()
                    .filter(|v| matches!(v, Verdict::Tx(_)))
                    .count() as u64;
            }
        }
        (t.elapsed(), tx)
    }

    /// `flows` proxied handshakes: the time of their three timed passes, and frames sent.
    pub fn handshakes(
        p: &mut Pipeline,
        flows: usize,
        now: Instant,
        batch: usize,
    ) -> (Duration, u64) {
        let vip = (Ipv4Addr::new(198, 18, 100, 1), 80);
        // Linux's SYN options: MSS 1460, SACK-permitted, timestamps, NOP, window scale 7.
        let syn_opts = [
            2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        let mut frames = vec![[0u8; ROOM]; flows];
        let mut lens = vec![0usize; flows];
        for i in 0..flows {
            lens[i] = tcp(&mut frames[i], client(i), vip, i as u32, 0, 0x02, &syn_opts);
        }
        let (t1, tx1) = timed(p, &mut frames, &mut lens, now, batch);
        assert_eq!(tx1 as usize, flows, "every SYN must be answered");
        // The SYN-ACKs' cookies make the ACKs.
        for i in 0..flows {
            let cookie = be32(&frames[i], 38);
            lens[i] = tcp(
                &mut frames[i],
                client(i),
                vip,
                i as u32 + 1,
                cookie.wrapping_add(1),
                0x10,
                &[],
            );
        }
        let (t2, tx2) = timed(p, &mut frames, &mut lens, now, batch);
        assert_eq!(tx2 as usize, flows, "every cookie must open a flow");
        // The SYNs to the backends make the backends' SYN-ACKs.
        for i in 0..flows {
            let f = &frames[i];
            let snat = (
                Ipv4Addr::new(f[26], f[27], f[28], f[29]),
                u16::from_be_bytes([f[34], f[35]]),
            );
            let backend = (
                Ipv4Addr::new(f[30], f[31], f[32], f[33]),
                u16::from_be_bytes([f[36], f[37]]),
            );
            let isn = be32(f, 38);
            lens[i] = tcp(
                &mut frames[i],
                backend,
                snat,
                0x5000_0000,
                isn.wrapping_add(1),
                0x12,
                &[2, 4, 5, 0xb4, 1, 3, 3, 7],
            );
        }
        let (t3, tx3) = timed(p, &mut frames, &mut lens, now, batch);
        assert_eq!(tx3 as usize, flows, "every SYN-ACK must be answered");
        assert_eq!(p.counters().synproxy_acks as usize, flows);
        (t1 + t2 + t3, tx1 + tx2 + tx3)
    }
}
