//! A takeover's pause kept receiving: from the switch until the new workers poll, a thread
//! of the new process keeps the adopted sockets' rings moving, so the pause is bounded by
//! the UMEM's frames rather than by one rx ring.
//!
//! Without it, what arrives during the pause (the flow table's recovery pass, the first
//! snapshot: ~20 ms at 100,000 flows) waits on each socket's rx ring, in the frames the old
//! worker left on the fill ring: `rx_ring_size` frames (2,048 by default, 20 ms at
//! 100 kpps a queue), after which the kernel drops. The frames the old worker had free,
//! and those coming back on the completion rings, sat unused meanwhile.
//!
//! # Contract
//!
//! - **What the keeper does.** [`GapKeeper::start`] moves the sets (resumed:
//!   [`XskSet::resume`]) to a thread (`xvs-gap`) that, every [`ROUND`], per socket: takes the
//!   completion ring's frames back to the free frames; takes every frame the rx ring holds,
//!   in order, into the socket's *held* frames; kicks the tx ring when the kernel asks for
//!   it and it still holds frames (the old worker's last ones); and gives the fill ring as
//!   many free frames as it has room for. [`GapKeeper::stop`] ends the thread and gives
//!   the sets back, their held frames and what the keeper moved through each ring with
//!   them.
//! - **Frames are conserved.** A frame is in exactly one place: the free frames, a fill
//!   ring, the kernel, an rx ring, the held frames (off the rx ring, not yet processed), a
//!   tx ring, or the completion ring. The held frames' deques are allocated once, with
//!   room for every frame of the UMEM, so taking never reallocates.
//! - **The worker processes held frames first** ([`crate::worker`]): a port's held frames
//!   in the order they arrived, before anything on its rx ring, and no more in one batch
//!   than every tx ring has room for (producing a batch to a tx ring is all or nothing: a
//!   held frame is never dropped for a full tx ring).
//! - **What it cannot keep.** Once the free frames run out, the fill ring empties and the
//!   kernel drops (the socket's `rx_fill_ring_empty_descs` in `XDP_STATISTICS`): the
//!   pause the UMEM outlasts is about (`umem_frames` × sockets − the other sockets' fill
//!   rings − tx in flight) ÷ the rate.
//! - **No per-packet cost.** The worker tests one deque's length per port and poll.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::pool::FramePool;
use super::ring::Desc;
use super::{XskSet, wake_tx};

/// How long the keeper sleeps between rounds: at 1 Mpps a queue a round's arrivals are
/// 200 frames, a tenth of a default rx ring.
pub const ROUND: Duration = Duration::from_micros(200);

/// Frames one socket's keeper took off its rx ring that no worker has processed yet, and
/// what the keeper moved through that socket's rings (the worker's ring counters start
/// from them).
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Frames taken off the rx ring, oldest first.
    pub frames: VecDeque<Desc>,
    /// Frames the keeper gave the fill ring.
    pub filled: u64,
    /// Frames the keeper took off the rx ring.
    pub received: u64,
    /// Frames the keeper took back from the completion ring.
    pub completed: u64,
}

/// What a keeper did, for the pause's log line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GapStats {
    /// Frames it took off the rx rings (held for the workers).
    pub held: u64,
    /// Frames it gave the fill rings.
    pub filled: u64,
    /// Rounds it ran.
    pub rounds: u64,
}

/// The thread that keeps a takeover's sockets receiving; see the module doc.
#[derive(Debug)]
pub struct GapKeeper {
    sets: Arc<Mutex<Vec<XskSet>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl GapKeeper {
    /// Starts keeping `sets` (resumed from a stopped worker's frame state). A thread that
    /// cannot be spawned is logged; the sets are then kept by nobody until
    /// [`GapKeeper::stop`] (the pause as without a keeper).
    pub fn start(mut sets: Vec<XskSet>) -> GapKeeper {
        for set in &mut sets {
            let room = set.frames();
            set.held = (0..set.ports.len())
                .map(|_| Held {
                    frames: VecDeque::with_capacity(room),
                    ..Held::default()
                })
                .collect();
        }
        let sets = Arc::new(Mutex::new(sets));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (sets, stop) = (Arc::clone(&sets), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("xvs-gap".into())
                .spawn(move || keep(&sets, &stop))
        };
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "no thread keeps the sockets receiving during the takeover's pause: its rx rings hold what arrives");
                None
            }
        };
        GapKeeper { sets, stop, thread }
    }

    /// Runs `f` on the kept sets (between two rounds).
    pub fn with<R>(&self, f: impl FnOnce(&mut [XskSet]) -> R) -> R {
        f(&mut self.sets.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Ends the keeper after its current round (one last round run here, so that what
    /// arrived since is held too) and gives the sets back, each with its held frames.
    pub fn stop(mut self) -> (Vec<XskSet>, GapStats) {
        self.stop.store(true, Ordering::Relaxed);
        let rounds = self.thread.take().map_or(0, |t| t.join().unwrap_or(0));
        let mut sets =
            std::mem::take(&mut *self.sets.lock().unwrap_or_else(PoisonError::into_inner));
        let mut stats = GapStats {
            rounds,
            ..GapStats::default()
        };
        let mut scratch = vec![Desc::default(); SCRATCH];
        for set in &mut sets {
            round(set, &mut scratch);
            for h in &set.held {
                stats.held += h.received;
                stats.filled += h.filled;
            }
        }
        (sets, stats)
    }
}

impl Drop for GapKeeper {
    /// A keeper dropped unstopped (a start-up that failed during the pause) ends its
    /// thread, so that the sets close with it.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Descriptors read from a ring at once.
const SCRATCH: usize = 256;

/// The keeper's thread: rounds until `stop`; returns how many it ran.
fn keep(sets: &Mutex<Vec<XskSet>>, stop: &AtomicBool) -> u64 {
    let mut scratch = vec![Desc::default(); SCRATCH];
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) {
        {
            let mut sets = sets.lock().unwrap_or_else(PoisonError::into_inner);
            for set in sets.iter_mut() {
                round(set, &mut scratch);
            }
        }
        rounds += 1;
        std::thread::sleep(ROUND);
    }
    rounds
}

/// One round over a set's sockets (see the module doc).
fn round(set: &mut XskSet, scratch: &mut [Desc]) {
    let total = set.frames();
    let mut pool = FramePool::new(std::mem::take(&mut set.frames), total);
    let tx_size = set.tx_ring_size;
    for (port, s) in set.ports.iter_mut().enumerate() {
        let (Some(s), Some(held)) = (s.as_mut(), set.held.get_mut(port)) else {
            continue;
        };
        loop {
            // SAFETY: the completion ring hands back frames of this UMEM the kernel is done
            // with.
            let n = unsafe { s.rings.comp.consume_comp(scratch) };
            for d in &scratch[..n] {
                pool.put(*d);
            }
            held.completed += n as u64;
            if n < scratch.len() {
                break;
            }
        }
        loop {
            // SAFETY: the descriptors are frames of this UMEM, now ours (held).
            let n = unsafe { s.rings.rx.consume_rx(scratch) };
            held.frames.extend(&scratch[..n]);
            held.received += n as u64;
            set.in_fill[port] = set.in_fill[port].saturating_sub(n as u32);
            if n < scratch.len() {
                break;
            }
        }
        if s.rings.tx.nb_free_exact() < tx_size && s.rings.tx.needs_wakeup() {
            wake_tx(s.fd());
        }
        // SAFETY: the pool holds free frames of this set's UMEM.
        let done = unsafe { s.fill_all(&mut pool) };
        set.in_fill[port] += done as u32;
        held.filled += done as u64;
    }
    set.frames = pool.into_frames();
}
