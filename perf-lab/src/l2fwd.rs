//! `perf-lab l2fwd`: the AF_XDP ceiling. An AF_XDP forwarder in the LB namespace that does the
//! least any AF_XDP proxy must do: receive on the client side (and, for saturation mode, on
//! the backend side), pick a backend by a hash of the source address and port, rewrite the
//! MACs and transmit on the backend side. One UMEM per queue shared by the two sockets
//! (`XDP_SHARED_UMEM`), so a frame moves from rx to tx without a copy; libxdp's default
//! program feeds both sockets. Runs until SIGTERM/SIGINT, then prints `rx=`, `tx=`,
//! `tx_full=`, `busy_ns=` lines on stdout and exits. Busy time is counted as xvs counts it:
//! the time of polls that moved frames (see [`crate::cpu`]); with `--stats` it is also
//! rewritten to a file every 100 ms, so a window can be measured while it runs. With
//! `--napi-busy-poll` it busy-polls its sockets' NAPI as xvs does with `[dataplane]
//! napi_busy_poll` (same socket options, same interface settings, a `recvfrom` per socket
//! per poll), so the ceiling does the same receive work on its core as xvs (where the driver
//! gives the sockets a NAPI id; veth on Linux 6.18 does not, see `fastpath::xsk::napi`).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fastpath::xsk::napi::{self, NapiDefer};
use fastpath::xsk::wake_rx;
use xsk_rs::FrameDesc;

use crate::rig::{LB_BACKEND_MAC, backend_mac};
use crate::sys::pin;
use crate::xsk::{Feed, Port, RING, Rings};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const BATCH: usize = 64;

struct Queue {
    port: Port,
    out: Rings,
    free: Vec<FrameDesc>,
}

/// Runs the forwarder (in the calling process's namespace) until SIGTERM.
pub fn run(
    in_if: &str,
    out_if: &str,
    queues: u16,
    backends: u16,
    core: usize,
    stats: Option<&Path>,
    napi_busy_poll: bool,
) -> anyhow::Result<()> {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
    }
    pin(core);
    let _napi_defer = if napi_busy_poll {
        Some(NapiDefer::apply(&[in_if, out_if]).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    let mut qs = Vec::new();
    for q in 0..u32::from(queues) {
        let mut port = Port::open(in_if, q, 4 * RING, Feed::LibxdpDefault)?;
        let out = port.open_shared(out_if, q, Feed::LibxdpDefault)?;
        let mut free = std::mem::take(&mut port.frames);
        let mut out = out;
        if napi_busy_poll {
            for (ifname, rings) in [(in_if, &port.rings), (out_if, &out)] {
                napi::enable(rings.rx.fd().as_raw_fd(), BATCH as u32)
                    .map_err(|e| anyhow::anyhow!("{ifname} queue {q}: {e}"))?;
            }
        }
        let r = RING as usize;
        // SAFETY: frames of this UMEM, on no ring yet.
        unsafe {
            port.rings.fill.produce(&free[free.len() - r..]);
            let l = free.len() - r;
            free.truncate(l);
            out.fill.produce(&free[free.len() - r..]);
            let l = free.len() - r;
            free.truncate(l);
        }
        qs.push(Queue { port, out, free });
    }
    if let Some(path) = stats {
        write_stats(path, 0, 0, 0);
    }
    eprintln!(
        "perf-lab l2fwd: ready ({in_if} -> {out_if}, {queues} queue(s), core {core}, NAPI busy \
         polling {})",
        if napi_busy_poll { "on" } else { "off" }
    );
    let (mut rx_n, mut tx_n, mut full, mut busy_ns) = (0u64, 0u64, 0u64, 0u64);
    let mut descs = vec![FrameDesc::default(); BATCH];
    let mut stage: Vec<FrameDesc> = Vec::with_capacity(BATCH);
    let mut busy_since: Option<Instant> = None;
    let mut written = Instant::now();
    while !STOP.load(Ordering::Relaxed) {
        let now = Instant::now();
        if let Some(t) = busy_since.take() {
            busy_ns += now.duration_since(t).as_nanos() as u64;
        }
        if let Some(path) = stats
            && now.duration_since(written) >= Duration::from_millis(100)
        {
            written = now;
            write_stats(path, busy_ns, rx_n, tx_n);
        }
        let mut moved = false;
        for q in qs.iter_mut() {
            // Completions back to the free stack, then top up both fill rings.
            // SAFETY: descriptors of this queue's UMEM throughout.
            let n = unsafe { q.out.comp.consume(&mut descs) };
            q.free.extend_from_slice(&descs[..n]);
            moved |= n > 0;
            let n = unsafe { q.port.rings.comp.consume(&mut descs) };
            q.free.extend_from_slice(&descs[..n]);
            moved |= n > 0;
            for side in 0..2 {
                let rings = if side == 0 {
                    &mut q.port.rings
                } else {
                    &mut q.out
                };
                let room = (rings.fill.nb_free(BATCH as u32) as usize).min(q.free.len());
                if room > 0 {
                    let at = q.free.len() - room;
                    // SAFETY: free frames.
                    let k = unsafe { rings.fill.produce(&q.free[at..]) };
                    q.free.truncate(q.free.len() - k);
                }
            }
            for side in 0..2 {
                let rings = if side == 0 {
                    &mut q.port.rings
                } else {
                    &mut q.out
                };
                if napi_busy_poll {
                    wake_rx(rings.rx.fd().as_raw_fd());
                }
                // SAFETY: as above.
                let n = unsafe { rings.rx.consume(&mut descs) };
                if n == 0 {
                    continue;
                }
                moved = true;
                rx_n += n as u64;
                stage.clear();
                for d in descs[..n].iter_mut() {
                    // SAFETY: a received frame we own until it is produced to tx.
                    let mut data = unsafe { q.port.umem.data_mut(d) };
                    let f = data.contents_mut();
                    if f.len() >= 38 {
                        let h = u32::from_be_bytes([f[26], f[27], f[28], f[29]])
                            .wrapping_mul(0x9e37_79b1)
                            ^ u32::from(u16::from_be_bytes([f[34], f[35]]))
                                .wrapping_mul(0x85eb_ca6b);
                        let b = (h >> 8) % u32::from(backends) + 1;
                        f[0..6].copy_from_slice(&backend_mac(b as u16));
                        f[6..12].copy_from_slice(&LB_BACKEND_MAC);
                    }
                    stage.push(*d);
                }
                // SAFETY: received frames with their rx lengths.
                let k = unsafe { q.out.tx.produce(&stage) };
                tx_n += k as u64;
                full += (n - k) as u64;
                q.free.extend_from_slice(&stage[k..]);
            }
            // A kick of a ring the kernel has not drained yet is work (in copy mode the
            // `sendto` does the transmit copies); one of an empty ring is an idle poll.
            if q.out.tx.needs_wakeup() {
                moved |= q.out.tx.nb_free_exact() < RING;
                let _ = q.out.tx.wakeup();
            }
        }
        if moved {
            busy_since = Some(now);
        }
    }
    println!("rx={rx_n}");
    println!("tx={tx_n}");
    println!("tx_full={full}");
    println!("busy_ns={busy_ns}");
    Ok(())
}

/// Replaces `path` with the current counters (written aside and renamed, so a reader never
/// sees half a file).
fn write_stats(path: &Path, busy_ns: u64, rx: u64, tx: u64) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, format!("busy_ns={busy_ns}\nrx={rx}\ntx={tx}\n")).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// `key`'s value in a stats file written by [`write_stats`].
pub fn read_stat(path: &Path, key: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}
