//! The AF_XDP traffic generator (client namespace, transmit only, copy mode).
//!
//! Each UMEM frame has a fixed size (IMIX: frame j gets 64/576/1500 by the 7:4:1 pattern
//! over j mod 12); its zero padding is written once. For each packet only the headers and
//! the 20-byte payload are rewritten ([`frame::write`]) and the checksums recomputed over those
//! bytes. xsk-rs' `CompQueue::consume` resets a completed descriptor's length, so the length
//! is set again (`cursor().set_pos`) before a frame is resubmitted.
//!
//! Pacing: a token bucket checked once per batch (up to [`BATCH`] frames): the packets due
//! since the start at `rate_pps`, minus those sent, capped at 4 batches of backlog so a stall
//! does not turn into a burst. Rate 0 sends as fast as the rings take frames. When nothing is
//! due the generator spins, then yields (or sleeps [`IDLE_SLEEP`], with `idle_sleep`).
//!
//! Flows: packet i belongs to flow f = i mod flows; flow f has source 198.18.0.(16 + f mod
//! 224), source port 1024 + f / 224 and service s = f mod services (destination port
//! `base_port + s`). Kinds: `udp`; `syn` (every packet a SYN); `ack` (PSH|ACK with data; with
//! `syn_first`, the first packet of each flow is a SYN, since xvs drops a non-SYN without a
//! flow); `mix` (by flow: half udp, a quarter ack, a quarter syn).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::bail;
use xsk_rs::FrameDesc;

use crate::frame::{self, Pkt, Proto};
use crate::rig::{CLIENT_MAC, IF_CLIENT, LB_CLIENT_MAC};
use crate::sys::{enter_netns, mono_ns, pin};
use crate::xsk::{FRAME_SIZE, Feed, Port};

/// Frames per ring operation.
pub const BATCH: usize = 64;
/// UMEM frames per queue.
const FRAMES: u32 = 4096;
/// Most flows (distinct source address and port pairs).
pub const FLOWS_MAX: u32 = 224 * 64_000;

/// Traffic kind.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// UDP datagrams.
    Udp,
    /// TCP SYN flood.
    Syn,
    /// TCP established-like ACK stream.
    Ack,
    /// Half udp, a quarter ack, a quarter syn (by flow).
    Mix,
}

/// Frame size: fixed or IMIX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// Every frame this many bytes.
    Fixed(usize),
    /// 7:4:1 of 64/576/1500.
    Imix,
}

impl std::str::FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("imix") {
            return Ok(Size::Imix);
        }
        match s.parse::<usize>() {
            Ok(n) if (64..=1500).contains(&n) => Ok(Size::Fixed(n)),
            _ => Err(format!("size {s:?}: want 64..1500 or imix")),
        }
    }
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Size::Fixed(n) => write!(f, "{n}"),
            Size::Imix => f.write_str("imix"),
        }
    }
}

impl Size {
    fn of_frame(self, j: usize) -> usize {
        match self {
            Size::Fixed(n) => n,
            Size::Imix => match j % 12 {
                0..=6 => 64,
                7..=10 => 576,
                _ => 1500,
            },
        }
    }
}

/// What to send.
#[derive(Clone, Debug)]
pub struct GenSpec {
    /// Client namespace.
    pub ns: String,
    /// Queues to send on (one socket each, round robin).
    pub queues: u16,
    /// Core to pin the generator to.
    pub core: usize,
    /// Packets per second; 0 = as fast as possible.
    pub rate_pps: u64,
    /// Flows.
    pub flows: u32,
    /// Services (destination ports `base_port..base_port+services`).
    pub services: u32,
    /// First service port.
    pub base_port: u16,
    /// Destination address.
    pub vip: Ipv4Addr,
    /// Frame size.
    pub size: Size,
    /// Traffic kind.
    pub kind: Kind,
    /// `ack`/`mix`: a SYN first on each flow.
    pub syn_first: bool,
    /// How long to send.
    pub duration: Duration,
    /// Stop after this many packets (saturation bursts).
    pub count: Option<u64>,
    /// First sequence number.
    pub seq_start: u32,
    /// Rate-limited and early: sleep [`IDLE_SLEEP`] instead of yielding. A thread that
    /// spins and yields keeps this kernel's per-CPU threads of its core (ksoftirqd, which
    /// runs RCU callbacks, and kworkers) from running for seconds: the restart scenario
    /// sleeps, so that what it measures is xvs's restart and not the rig core's backlog.
    pub idle_sleep: bool,
}

/// How long a rate-limited generator with `idle_sleep` sleeps when nothing is due.
pub const IDLE_SLEEP: Duration = Duration::from_micros(50);

/// What was sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct GenResult {
    /// Packets handed to the kernel.
    pub sent: u64,
    /// CLOCK_MONOTONIC at the first packet, ns.
    pub start_ns: u64,
    /// Sending time, ns.
    pub elapsed_ns: u64,
}

impl GenResult {
    /// Offered rate, packets per second.
    pub fn pps(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.sent as f64 * 1e9 / self.elapsed_ns as f64
        }
    }
}

/// The packet with index `i` of a spec (sequence `seq`, sent at `ts_ns`).
pub fn packet(spec: &GenSpec, i: u64, seq: u32, ts_ns: u64) -> Pkt {
    let f = (i % u64::from(spec.flows.max(1))) as u32;
    let first_round = i < u64::from(spec.flows);
    let stream = |first: bool| {
        if spec.syn_first && first {
            Proto::Syn
        } else {
            Proto::Ack
        }
    };
    let proto = match spec.kind {
        Kind::Udp => Proto::Udp,
        Kind::Syn => Proto::Syn,
        Kind::Ack => stream(first_round),
        Kind::Mix => match f % 4 {
            0 | 1 => Proto::Udp,
            2 => stream(first_round),
            _ => Proto::Syn,
        },
    };
    let service = f % spec.services.max(1);
    Pkt {
        src_mac: CLIENT_MAC,
        dst_mac: LB_CLIENT_MAC,
        src: Ipv4Addr::new(198, 18, 0, 16 + (f % 224) as u8),
        dst: spec.vip,
        sport: 1024 + (f / 224) as u16,
        dport: spec.base_port.wrapping_add(service as u16),
        proto,
        seq,
        ts_ns,
    }
}

/// Starts the generator thread. `sent` is updated once per batch (progress for callers);
/// `stop` ends it early.
pub fn spawn(
    spec: GenSpec,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> anyhow::Result<JoinHandle<anyhow::Result<GenResult>>> {
    if spec.flows == 0 || spec.flows > FLOWS_MAX {
        bail!("flows must be 1..={FLOWS_MAX}");
    }
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::Builder::new()
        .name("perf-lab-gen".into())
        .spawn(move || {
            let setup = (|| {
                enter_netns(&spec.ns)?;
                pin(spec.core);
                let mut ports = Vec::new();
                for q in 0..spec.queues {
                    ports.push(Port::open(IF_CLIENT, u32::from(q), FRAMES, Feed::TxOnly)?);
                }
                Ok::<_, anyhow::Error>(ports)
            })();
            let ports = match setup {
                Ok(p) => {
                    let _ = ready_tx.send(Ok(()));
                    p
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{e:#}")));
                    return Err(e);
                }
            };
            Ok(send(&spec, ports, &stop, &sent))
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(h),
        Ok(Err(e)) => {
            let _ = h.join();
            bail!("generator: {e}")
        }
        Err(_) => bail!("generator thread died during set-up"),
    }
}

fn send(
    spec: &GenSpec,
    mut ports: Vec<Port>,
    stop: &AtomicBool,
    progress: &AtomicU64,
) -> GenResult {
    let mut free: Vec<Vec<FrameDesc>> = ports
        .iter_mut()
        .map(|p| std::mem::take(&mut p.frames))
        .collect();
    let mut done = vec![FrameDesc::default(); BATCH];
    let mut batch: Vec<FrameDesc> = Vec::with_capacity(BATCH);
    let limit = spec.count.unwrap_or(u64::MAX);
    let start = mono_ns();
    let end = start + spec.duration.as_nanos() as u64;
    let mut sent: u64 = 0;
    let mut idle_spins = 0u32;
    let backlog_max = 4 * BATCH as u64;
    let mut credit_base: u64 = 0; // tokens forfeited by stalls
    'outer: loop {
        for (qi, port) in ports.iter_mut().enumerate() {
            let now = mono_ns();
            if now >= end || sent >= limit || stop.load(Ordering::Relaxed) {
                break 'outer;
            }
            // SAFETY: `done` holds descriptors of this port's UMEM only.
            let n = unsafe { port.rings.comp.consume(&mut done) };
            free[qi].extend_from_slice(&done[..n]);
            let mut want = BATCH as u64;
            if spec.rate_pps > 0 {
                let due = ((now - start) as u128 * spec.rate_pps as u128 / 1_000_000_000) as u64;
                let due = due.saturating_sub(credit_base);
                if due > sent + backlog_max {
                    credit_base += due - sent - backlog_max;
                }
                want = due.saturating_sub(sent).min(BATCH as u64);
            }
            want = want.min(limit - sent).min(free[qi].len() as u64);
            if want == 0 {
                idle_spins += 1;
                if port.rings.tx.needs_wakeup() {
                    let _ = port.rings.tx.wakeup();
                }
                // Rate-limited and early: let the sinks sharing this core run.
                if idle_spins > 16 && spec.idle_sleep {
                    std::thread::sleep(IDLE_SLEEP);
                } else if idle_spins > 16 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            idle_spins = 0;
            let ts = mono_ns();
            batch.clear();
            for k in 0..want {
                let mut desc = free[qi].pop().expect("checked");
                let j = desc.addr() / FRAME_SIZE as usize;
                let i = sent + k;
                let p = packet(spec, i, spec.seq_start.wrapping_add(i as u32), ts);
                // SAFETY: the frame is ours (taken from the free list, not on any ring).
                let mut data = unsafe { port.umem.data_mut(&mut desc) };
                data.cursor().set_pos(frame::FRAME_MAX);
                let len = frame::write(data.contents_mut(), &p, spec.size.of_frame(j));
                data.cursor().set_pos(len);
                batch.push(desc);
            }
            // SAFETY: every descriptor is a frame of this UMEM with its length set.
            let produced = unsafe { port.rings.tx.produce(&batch) };
            // Frames the ring did not take go back; their sequence numbers are reused.
            free[qi].extend_from_slice(&batch[produced..]);
            if port.rings.tx.needs_wakeup() {
                let _ = port.rings.tx.wakeup();
            }
            sent += produced as u64;
            progress.store(sent, Ordering::Relaxed);
        }
    }
    let elapsed = mono_ns() - start;
    // Let the kernel finish what is on the rings (copy mode sends on wakeup).
    let drain_end = mono_ns() + 50_000_000;
    while mono_ns() < drain_end {
        for (qi, port) in ports.iter_mut().enumerate() {
            // SAFETY: as above.
            let n = unsafe { port.rings.comp.consume(&mut done) };
            free[qi].extend_from_slice(&done[..n]);
            if port.rings.tx.needs_wakeup() {
                let _ = port.rings.tx.wakeup();
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    GenResult {
        sent,
        start_ns: start,
        elapsed_ns: elapsed,
    }
}
