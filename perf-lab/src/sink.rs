//! The sink: AF_XDP receive on every queue of a backend's veth, fed by libxdp's default
//! program (every frame of the queue), one thread per backend.
//!
//! Loss detection: one global sequence number per packet (the generator's), one bit per
//! sequence number in a [`SeqBitmap`] shared by all sinks: a set bit is a packet received, a
//! bit already set a duplicate; loss = sent - distinct received. The bitmap has 2^k bits
//! (sized to the packets a run can send, at most 2^28); beyond that sequence numbers wrap
//! onto it and duplicate detection becomes approximate.
//!
//! Latency: receive time (CLOCK_MONOTONIC, read once per batch) minus the send time in the
//! payload, into an HDR histogram (ns, 3 significant digits). Frames that are not perf-lab
//! packets (no payload, or a send time in the future or older than 60 s) are counted as
//! `other` and otherwise ignored.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::bail;
use hdrhistogram::Histogram;
use xsk_rs::FrameDesc;

use crate::frame;
use crate::rig::IF_BACKEND;
use crate::sys::{enter_netns, mono_ns, pin};
use crate::xsk::{Feed, Port, RING};

const FRAMES: u32 = 2 * RING;
const BATCH: usize = 64;

/// One bit per sequence number.
pub struct SeqBitmap {
    words: Vec<AtomicU64>,
    mask: u64,
    start: u32,
}

impl SeqBitmap {
    /// A bitmap for about `packets` packets from sequence number `start`.
    pub fn new(packets: u64, start: u32) -> SeqBitmap {
        let bits = packets.clamp(1 << 16, 1 << 28).next_power_of_two();
        SeqBitmap {
            words: (0..bits / 64).map(|_| AtomicU64::new(0)).collect(),
            mask: bits - 1,
            start,
        }
    }

    /// Marks `seq` received; returns false if it already was (a duplicate).
    pub fn mark(&self, seq: u32) -> bool {
        let i = u64::from(seq.wrapping_sub(self.start)) & self.mask;
        let bit = 1u64 << (i % 64);
        self.words[(i / 64) as usize].fetch_or(bit, Ordering::Relaxed) & bit == 0
    }

    /// Packets missing among the `n` sequence numbers from `from` (relative to the start).
    pub fn missing(&self, from: u64, n: u64) -> u64 {
        (from..from + n).filter(|&i| !self.received(i)).count() as u64
    }

    /// Whether the packet `i` sequence numbers after the start was received.
    pub fn received(&self, i: u64) -> bool {
        let i = i & self.mask;
        self.words[(i / 64) as usize].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    /// The longest run of consecutive missing packets among the `n` from `from` (relative to
    /// the start): `(first, length)`, `(from, 0)` when none is missing.
    pub fn longest_missing(&self, from: u64, n: u64) -> (u64, u64) {
        let (mut best, mut run_start, mut run) = ((from, 0), from, 0);
        for i in from..from + n {
            if self.received(i) {
                run = 0;
                continue;
            }
            if run == 0 {
                run_start = i;
            }
            run += 1;
            if run > best.1 {
                best = (run_start, run);
            }
        }
        best
    }
}

/// What one sink saw.
#[derive(Clone)]
pub struct SinkStats {
    /// perf-lab frames received.
    pub received: u64,
    /// Of which duplicates.
    pub duplicates: u64,
    /// Frames that are not perf-lab packets.
    pub other: u64,
    /// Frames whose checksums failed (only with verification on).
    pub bad_checksum: u64,
    /// One-way latency, ns.
    pub latency_ns: Histogram<u64>,
}

impl SinkStats {
    fn new() -> SinkStats {
        SinkStats {
            received: 0,
            duplicates: 0,
            other: 0,
            bad_checksum: 0,
            latency_ns: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
        }
    }
}

/// Starts a sink on backend namespace `ns`; returns once its sockets are bound. `received`
/// counts perf-lab frames as they arrive (for progress); `stop` ends it.
pub fn spawn(
    ns: String,
    queues: u16,
    core: usize,
    verify: bool,
    bitmap: Arc<SeqBitmap>,
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
) -> anyhow::Result<JoinHandle<anyhow::Result<SinkStats>>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::Builder::new()
        .name("perf-lab-sink".into())
        .spawn(move || {
            let setup = (|| {
                enter_netns(&ns)?;
                pin(core);
                let mut ports = Vec::new();
                for q in 0..queues {
                    let mut p = open_retrying(u32::from(q))?;
                    let frames = std::mem::take(&mut p.frames);
                    // SAFETY: frames of this UMEM, not on any ring.
                    let n = unsafe { p.rings.fill.produce(&frames[..RING as usize]) };
                    if n != RING as usize {
                        bail!("fill ring took {n} of {RING} frames");
                    }
                    ports.push(p);
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
            Ok(receive(ports, verify, &bitmap, &stop, &received))
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(h),
        Ok(Err(e)) => {
            let _ = h.join();
            bail!("sink: {e}")
        }
        Err(_) => bail!("sink thread died during set-up"),
    }
}

/// Opens the sink socket of queue `q`; a socket closed by the previous trial is released by
/// the kernel asynchronously (EBUSY meanwhile), so retry for up to 3 s.
fn open_retrying(q: u32) -> anyhow::Result<Port> {
    let mut tries = 0;
    loop {
        match Port::open(IF_BACKEND, q, FRAMES, Feed::LibxdpDefault) {
            Ok(p) => return Ok(p),
            Err(e) if tries < 60 && format!("{e:#}").contains("busy") => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}

fn receive(
    mut ports: Vec<Port>,
    verify: bool,
    bitmap: &SeqBitmap,
    stop: &AtomicBool,
    progress: &AtomicU64,
) -> SinkStats {
    let mut st = SinkStats::new();
    let mut descs = vec![FrameDesc::default(); BATCH];
    while !stop.load(Ordering::Relaxed) {
        let mut got = 0;
        for port in ports.iter_mut() {
            // SAFETY: descriptors of this port's UMEM.
            let n = unsafe { port.rings.rx.consume(&mut descs) };
            if n == 0 {
                continue;
            }
            got += n;
            let now = mono_ns();
            for d in &descs[..n] {
                // SAFETY: a received frame, ours until it goes back to the fill ring.
                let data = unsafe { port.umem.data(d) };
                let f = data.contents();
                match frame::parse(f) {
                    Some(r) if r.ts_ns <= now && now - r.ts_ns < 60_000_000_000 => {
                        st.received += 1;
                        if !bitmap.mark(r.seq) {
                            st.duplicates += 1;
                        }
                        let _ = st.latency_ns.record((now - r.ts_ns).max(1));
                        if verify && !frame::checksums_ok(f) {
                            st.bad_checksum += 1;
                        }
                    }
                    _ => st.other += 1,
                }
            }
            // SAFETY: the frames just read, back to this UMEM's fill ring (which ignores
            // lengths); the ring has room since it held them before.
            let back = unsafe { port.rings.fill.produce(&descs[..n]) };
            debug_assert_eq!(back, n);
            if port.rings.fill.needs_wakeup() {
                let fd = port.rings.rx.fd_mut();
                let _ = port.rings.fill.wakeup(fd, 0);
            }
        }
        if got == 0 {
            if ports.len() == 1 {
                let _ = ports[0].rings.rx.poll(2);
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        } else {
            progress.store(st.received, Ordering::Relaxed);
        }
    }
    progress.store(st.received, Ordering::Relaxed);
    st
}
