//! Fastpath workers: one pinned thread per queue index, busy-polling the AF_XDP rings of an
//! [`XskSet`] and running the sans-IO [`Pipeline`] on every frame.
//!
//! # One poll (bounded work)
//!
//! 1. Load the published snapshot once; `set_snapshot` only when its generation changed.
//! 2. Read the clock once (`Instant::now()`): every frame of the poll gets the same `now`.
//! 3. Reclaim completed tx frames into the free stack (at most [`COMP_ROUNDS`] × batch per
//!    socket).
//! 4. For each socket: with `napi_busy_poll`, first run its receive NAPI on this core
//!    (`recvfrom(MSG_DONTWAIT)`, up to `batch_size` frames; see [`crate::xsk::napi`]). Then
//!    take at most `batch_size` frames from its rx ring (after a takeover, first the frames
//!    held during its pause, [`crate::xsk::gap`], at most what every tx ring has room for)
//!    and run
//!    `process_batch` over them (staged so that the flow table's cache misses overlap):
//!    - `Tx(port)`: the descriptor is staged for `port`'s tx ring (shared UMEM: no copy);
//!      after the batch the stage is produced in one go. Frames the tx ring has no room
//!      for are counted (`tx_ring_full`) and recycled. A port this worker has no socket on
//!      is counted (`tx_no_port`) and recycled.
//!    - `Drop(reason)`: recycled; the pipeline counts the reason.
//!    - `Pass`: the frame was for the kernel (the steering program should not have sent it,
//!      or libxdp's default program sends everything). An AF_XDP socket cannot give a frame
//!      back to the kernel stack; re-injecting through a TAP or raw socket is out of scope,
//!      so it is counted and recycled.
//!    - `Slow`: the next hop's MAC is unknown. Counted and recycled; the neighbour resolver
//!      learns the MAC from the kernel and a later frame of the flow goes through. Nothing
//!      is ever transmitted with a guessed MAC.
//! 5. Kick (`sendto`) every tx ring that still holds frames the kernel has not taken, when
//!    the ring asks for it (need_wakeup).
//! 6. Refill every fill ring up to its depth from the free stack (kick when need_wakeup).
//! 7. Sweep flow-table entries for expiry, paced by time rather than by polls: every
//!    [`SWEEP_EVERY`] the worker examines the share of the table that makes one full round
//!    per `sweep_round` (at most `sweep_budget` entries per poll). A busy-polling worker
//!    polls millions of times a second; sweeping a fixed number of entries on every poll
//!    made it walk the table (a cache miss per entry) hundreds of times a second.
//! 8. Publish counters ([`WorkerStats`] with each socket's [`RingStats`], relaxed atomics)
//!    when the poll did anything.
//! 9. After [`IDLE_POLLS`] empty polls in a row, sleep `idle_backoff` (when configured).
//!
//! # Ports
//!
//! A worker receives on every port of its [`XskSet`] but its [`Pipeline`] has one
//! `PipelineConfig::port` (the "port it came in on" of the one-armed fallback). With two
//! arms the transmit port must therefore come from the snapshot: a route, or the port a
//! neighbour was learnt on (the slowpath's netlink reader fills both). Static
//! `[[neighbours]]` without a port fall back to `PipelineConfig::port`.
//!
//! Every buffer the loop touches (rx, completion and tx staging arrays, the free stack) is
//! allocated before the loop starts; the loop allocates nothing.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::flowlog::{EndedFlow, FlowEvent};
use crate::pipeline::{
    Counters, DropReason, FrameBatch, HoldReason, Pipeline, RejectReason, Verdict,
};
use crate::snapshot::Snapshot;
use crate::xsk::pool::FramePool;
use crate::xsk::ring::Area;
use crate::xsk::{Desc, XskSet, napi, wake_rx};

/// Empty polls in a row before the worker sleeps `idle_backoff`.
pub const IDLE_POLLS: u32 = 1024;
/// Completion-ring reads of up to one batch each, per socket per poll.
pub const COMP_ROUNDS: usize = 4;
/// Most flow-table entries examined for expiry in one poll.
pub const SWEEP_BUDGET: usize = 1024;
/// Default time for one worker to sweep the whole flow table once.
pub const SWEEP_ROUND: Duration = Duration::from_secs(1);
/// Shortest interval between two sweeps of a worker.
pub const SWEEP_EVERY: Duration = Duration::from_micros(100);
/// Largest batch a worker accepts.
pub const BATCH_MAX: usize = 4096;
/// How long held frames ([`crate::xsk::gap`]) wait for room on a full tx ring before they
/// are processed anyway.
pub const HELD_WAIT: Duration = Duration::from_millis(10);

/// What a worker is: which queue, which core, which interfaces, how much work per poll. From
/// the config by `WorkerSpec::from_config` and `worker_specs` ([`crate::settings`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Worker index (= the queue it serves).
    pub index: usize,
    /// Core to pin to (`None`: not pinned).
    pub core: Option<usize>,
    /// The queue served on every interface that has it.
    pub queue: u32,
    /// Interface names in port order (`[dataplane] interfaces`).
    pub interfaces: Vec<String>,
    /// Frames per rx batch.
    pub batch_size: usize,
    /// Sleep after [`IDLE_POLLS`] empty polls (`None`: busy-poll forever).
    pub idle_backoff: Option<Duration>,
    /// Run the sockets' receive NAPI from every poll (`[dataplane] napi_busy_poll`; the
    /// sockets must have been opened with it, see [`crate::xsk::napi`]).
    pub napi_busy_poll: bool,
    /// Most flow-table entries swept in one poll.
    pub sweep_budget: usize,
    /// Time for one full sweep round of the flow table.
    pub sweep_round: Duration,
}

/// A worker's counters, readable from any thread; the worker stores them (relaxed) at the
/// end of every poll that did something. Totals since the worker started.
#[derive(Debug)]
pub struct WorkerStats {
    /// Frames received.
    pub rx: AtomicU64,
    /// Frames placed on a tx ring.
    pub tx: AtomicU64,
    /// `Tx` frames dropped because the tx ring was full.
    pub tx_ring_full: AtomicU64,
    /// `Tx` frames for a port this worker has no socket on.
    pub tx_no_port: AtomicU64,
    /// Failed tx/fill wake-ups (`sendto`/`recvfrom` errors other than busy).
    pub wakeup_errors: AtomicU64,
    /// `Pass` verdicts: frames the steering program redirected that xvs does not own.
    pub pass: AtomicU64,
    /// `Pass` frames handed to the kernel through the exception device
    /// ([`crate::xsk::tap`]); the others (no device, or its queue full) were dropped.
    pub pass_injected: AtomicU64,
    /// `Slow` verdicts (counted and dropped until the neighbour is resolved).
    pub slow: AtomicU64,
    /// Drops by reason (`DropReason as usize`), from the pipeline.
    pub drops: [AtomicU64; DropReason::COUNT],
    /// Rejects sent by reason (`RejectReason as usize`), from the pipeline (also in `tx`
    /// once transmitted).
    pub rejects: [AtomicU64; RejectReason::COUNT],
    /// Flows inserted by this worker.
    pub new_flows: AtomicU64,
    /// Flows this worker ended for a new connection on their tuple (a client's SYN on
    /// TIME_WAIT or CLOSE: port reuse), from the pipeline.
    pub reused: AtomicU64,
    /// SYN proxy: SYN-ACKs with a cookie this worker sent, from the pipeline.
    pub synproxy_syns: AtomicU64,
    /// SYN proxy: client ACKs with a valid cookie that opened a backend connection.
    pub synproxy_acks: AtomicU64,
    /// Packets of known flows forwarded without their state change (`HoldReason as
    /// usize`), from the pipeline's state guard.
    pub held: [AtomicU64; HoldReason::COUNT],
    /// Flows this worker's sweeps expired.
    pub expired: AtomicU64,
    /// Generation of the snapshot in use.
    pub generation: AtomicU64,
    /// Polls run.
    pub polls: AtomicU64,
    /// Nanoseconds spent in polls that moved frames (received, completed or kicked a tx
    /// ring): the worker's busy time, as DPDK's lcore "busyness" counts it. Wall time minus
    /// this is time spent finding empty rings.
    pub busy_ns: AtomicU64,
    /// Per port (`None`: no socket there): what the worker moved through that socket's
    /// rings. Sized by [`WorkerStats::with_ports`]; a default `WorkerStats` has none.
    pub rings: Vec<Option<RingStats>>,
}

/// What a worker gave to and took from one socket's rings, totals since it started
/// (published with the other counters). Their differences are the rings' state:
/// `filled - received` frames are the kernel's to receive into (on the fill ring, in the
/// driver, or waiting on the rx ring), `transmitted - completed` are on their way out.
#[derive(Debug, Default)]
pub struct RingStats {
    /// The socket's interface.
    pub interface: String,
    /// Frames given to the fill ring.
    pub filled: AtomicU64,
    /// Frames taken from the rx ring.
    pub received: AtomicU64,
    /// Frames placed on the tx ring.
    pub transmitted: AtomicU64,
    /// Frames taken back from the completion ring.
    pub completed: AtomicU64,
}

/// A plain copy of [`RingStats`]' counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingCounters {
    /// See [`RingStats::filled`].
    pub filled: u64,
    /// See [`RingStats::received`].
    pub received: u64,
    /// See [`RingStats::transmitted`].
    pub transmitted: u64,
    /// See [`RingStats::completed`].
    pub completed: u64,
}

impl RingStats {
    /// The counters now (each read once, relaxed).
    pub fn read(&self) -> RingCounters {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RingCounters {
            filled: r(&self.filled),
            received: r(&self.received),
            transmitted: r(&self.transmitted),
            completed: r(&self.completed),
        }
    }
}

// (Written out: `Default` is derived for arrays of at most 32 elements.)
impl Default for WorkerStats {
    fn default() -> Self {
        WorkerStats {
            rx: Default::default(),
            tx: Default::default(),
            tx_ring_full: Default::default(),
            tx_no_port: Default::default(),
            wakeup_errors: Default::default(),
            pass: Default::default(),
            pass_injected: Default::default(),
            slow: Default::default(),
            drops: std::array::from_fn(|_| AtomicU64::new(0)),
            rejects: Default::default(),
            new_flows: Default::default(),
            reused: Default::default(),
            synproxy_syns: Default::default(),
            synproxy_acks: Default::default(),
            held: Default::default(),
            expired: Default::default(),
            generation: Default::default(),
            polls: Default::default(),
            busy_ns: Default::default(),
            rings: Vec::new(),
        }
    }
}

/// A plain copy of [`WorkerStats`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerCounters {
    /// See [`WorkerStats::rx`].
    pub rx: u64,
    /// See [`WorkerStats::tx`].
    pub tx: u64,
    /// See [`WorkerStats::tx_ring_full`].
    pub tx_ring_full: u64,
    /// See [`WorkerStats::tx_no_port`].
    pub tx_no_port: u64,
    /// See [`WorkerStats::wakeup_errors`].
    pub wakeup_errors: u64,
    /// See [`WorkerStats::pass`].
    pub pass: u64,
    /// See [`WorkerStats::pass_injected`].
    pub pass_injected: u64,
    /// See [`WorkerStats::slow`].
    pub slow: u64,
    /// See [`WorkerStats::drops`].
    pub drops: [u64; DropReason::COUNT],
    /// See [`WorkerStats::rejects`].
    pub rejects: [u64; RejectReason::COUNT],
    /// See [`WorkerStats::new_flows`].
    pub new_flows: u64,
    /// See [`WorkerStats::reused`].
    pub reused: u64,
    /// See [`WorkerStats::synproxy_syns`].
    pub synproxy_syns: u64,
    /// See [`WorkerStats::synproxy_acks`].
    pub synproxy_acks: u64,
    /// See [`WorkerStats::held`].
    pub held: [u64; HoldReason::COUNT],
    /// See [`WorkerStats::expired`].
    pub expired: u64,
    /// See [`WorkerStats::generation`].
    pub generation: u64,
    /// See [`WorkerStats::polls`].
    pub polls: u64,
    /// See [`WorkerStats::busy_ns`].
    pub busy_ns: u64,
}

// (Written out: `Default` is derived for arrays of at most 32 elements.)
impl Default for WorkerCounters {
    fn default() -> Self {
        WorkerCounters {
            rx: Default::default(),
            tx: Default::default(),
            tx_ring_full: Default::default(),
            tx_no_port: Default::default(),
            wakeup_errors: Default::default(),
            pass: Default::default(),
            pass_injected: Default::default(),
            slow: Default::default(),
            drops: [0; DropReason::COUNT],
            rejects: Default::default(),
            new_flows: Default::default(),
            reused: Default::default(),
            synproxy_syns: Default::default(),
            synproxy_acks: Default::default(),
            held: Default::default(),
            expired: Default::default(),
            generation: Default::default(),
            polls: Default::default(),
            busy_ns: Default::default(),
        }
    }
}

impl WorkerCounters {
    /// Adds `other`'s counts to these (for totals over workers); `generation` keeps the
    /// higher of the two.
    pub fn add(&mut self, other: &WorkerCounters) {
        self.rx += other.rx;
        self.tx += other.tx;
        self.tx_ring_full += other.tx_ring_full;
        self.tx_no_port += other.tx_no_port;
        self.wakeup_errors += other.wakeup_errors;
        self.pass += other.pass;
        self.pass_injected += other.pass_injected;
        self.slow += other.slow;
        for (t, d) in self.drops.iter_mut().zip(other.drops) {
            *t += d;
        }
        for (t, r) in self.rejects.iter_mut().zip(other.rejects) {
            *t += r;
        }
        self.new_flows += other.new_flows;
        self.reused += other.reused;
        self.synproxy_syns += other.synproxy_syns;
        self.synproxy_acks += other.synproxy_acks;
        for (t, h) in self.held.iter_mut().zip(other.held) {
            *t += h;
        }
        self.expired += other.expired;
        self.generation = self.generation.max(other.generation);
        self.polls += other.polls;
        self.busy_ns += other.busy_ns;
    }

    /// Drops for one reason.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }
}

impl WorkerStats {
    /// Counters for a worker with `sockets`' ports (ring counters for each socket).
    pub fn with_ports(sockets: &XskSet) -> WorkerStats {
        WorkerStats {
            rings: sockets
                .ports
                .iter()
                .map(|p| {
                    p.as_ref().map(|s| RingStats {
                        interface: s.ifname.clone(),
                        ..RingStats::default()
                    })
                })
                .collect(),
            ..WorkerStats::default()
        }
    }

    /// A consistent-enough copy (each counter read once, relaxed).
    pub fn read(&self) -> WorkerCounters {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WorkerCounters {
            rx: r(&self.rx),
            tx: r(&self.tx),
            tx_ring_full: r(&self.tx_ring_full),
            tx_no_port: r(&self.tx_no_port),
            wakeup_errors: r(&self.wakeup_errors),
            pass: r(&self.pass),
            pass_injected: r(&self.pass_injected),
            slow: r(&self.slow),
            drops: std::array::from_fn(|i| r(&self.drops[i])),
            rejects: std::array::from_fn(|i| r(&self.rejects[i])),
            new_flows: r(&self.new_flows),
            reused: r(&self.reused),
            synproxy_syns: r(&self.synproxy_syns),
            synproxy_acks: r(&self.synproxy_acks),
            held: std::array::from_fn(|i| r(&self.held[i])),
            expired: r(&self.expired),
            generation: r(&self.generation),
            polls: r(&self.polls),
            busy_ns: r(&self.busy_ns),
        }
    }
}

/// Starts worker `spec` on its own thread (`xvs-w{index}`), pinned to `spec.core`, owning
/// `sockets` and `pipeline`. It runs until `stop` is set, then returns its sockets with
/// their frames accounted for ([`Worker::hand_back`]; `None`: it never ran): dropped, they
/// close; handed to another process, its worker continues ([`crate::xsk::handover`]).
pub fn spawn_worker(
    spec: WorkerSpec,
    sockets: XskSet,
    pipeline: Pipeline,
    snapshot: Arc<ArcSwap<Snapshot>>,
    stop: Arc<AtomicBool>,
) -> io::Result<(JoinHandle<Option<XskSet>>, Arc<WorkerStats>)> {
    let stats = Arc::new(WorkerStats::with_ports(&sockets));
    let mut worker = Worker::new(spec, sockets, pipeline, snapshot, stop, Arc::clone(&stats));
    let handle = std::thread::Builder::new()
        .name(format!("xvs-w{}", worker.spec.index))
        .spawn(move || {
            // The daemon checked the core against the cpuset at start; a worker that still
            // cannot be pinned (the cpuset shrank meanwhile) ends, and the daemon stops
            // with a failure, rather than busy-polling on a core it shares.
            if let Err(e) = worker.pin() {
                tracing::error!(worker = worker.spec.index, error = %e, "worker not started");
                return None;
            }
            worker.pipeline.enter_thread();
            worker.run();
            Some(worker.hand_back())
        })?;
    Ok((handle, stats))
}

/// A worker's state; [`spawn_worker`] runs it on its own thread.
#[derive(Debug)]
pub struct Worker {
    spec: WorkerSpec,
    xsk: XskSet,
    pipeline: Pipeline,
    snapshot: Arc<ArcSwap<Snapshot>>,
    stop: Arc<AtomicBool>,
    stats: Arc<WorkerStats>,
    pool: FramePool,
    /// Scratch for one rx or completion read.
    batch: Vec<Desc>,
    /// The verdicts of one rx batch (`batch_size` long).
    verdicts: Vec<Verdict>,
    /// Per port: descriptors waiting for that port's tx ring (capacity `batch_size`).
    stage: Vec<Vec<Desc>>,
    /// Per port: frames currently given to that socket's fill ring.
    in_fill: Vec<u32>,
    /// Per port: frames a takeover's pause took off the rx ring ([`crate::xsk::gap`]),
    /// processed before anything on the ring (empty after the first polls, and always
    /// without a takeover).
    held: Vec<VecDeque<Desc>>,
    /// Since when a tx ring has had no room for held frames ([`Worker::take_held`]).
    held_full_since: Option<Instant>,
    /// Ports whose socket's NAPI id is still to be checked (`napi_busy_poll`: once, at the
    /// first frames; see [`napi::check_napi_id`]).
    napi_unchecked: Vec<bool>,
    /// Start of the previous poll, when that poll moved frames (its time is busy time).
    busy_since: Option<Instant>,
    /// When this worker last swept.
    last_sweep: Instant,
    local: Local,
}

/// Counters the loop keeps to itself and publishes per poll.
#[derive(Debug, Default)]
struct Local {
    rx: u64,
    tx: u64,
    tx_ring_full: u64,
    tx_no_port: u64,
    wakeup_errors: u64,
    pass_injected: u64,
    expired: u64,
    polls: u64,
    busy_ns: u64,
    /// Per port: [`RingCounters`] of its socket.
    rings: Vec<RingCounters>,
}

impl Worker {
    /// Allocates everything the loop needs and fills the fill rings.
    pub fn new(
        spec: WorkerSpec,
        mut xsk: XskSet,
        pipeline: Pipeline,
        snapshot: Arc<ArcSwap<Snapshot>>,
        stop: Arc<AtomicBool>,
        stats: Arc<WorkerStats>,
    ) -> Worker {
        let batch_size = spec.batch_size.clamp(1, BATCH_MAX);
        let ports = xsk.ports.len();
        let napi_busy_poll = spec.napi_busy_poll;
        let pool = FramePool::new(std::mem::take(&mut xsk.frames), xsk.frames());
        let in_fill = std::mem::take(&mut xsk.in_fill);
        let mut rings = vec![RingCounters::default(); ports];
        let mut held: Vec<VecDeque<Desc>> = (0..ports).map(|_| VecDeque::new()).collect();
        for ((h, r), kept) in held
            .iter_mut()
            .zip(&mut rings)
            .zip(std::mem::take(&mut xsk.held))
        {
            *h = kept.frames;
            r.filled = kept.filled;
            r.received = kept.received;
            r.completed = kept.completed;
        }
        let mut w = Worker {
            spec: WorkerSpec { batch_size, ..spec },
            xsk,
            pipeline,
            snapshot,
            stop,
            stats,
            pool,
            batch: vec![Desc::default(); batch_size],
            verdicts: vec![Verdict::Pass; batch_size],
            stage: (0..ports).map(|_| Vec::with_capacity(batch_size)).collect(),
            in_fill,
            held,
            held_full_since: None,
            napi_unchecked: vec![napi_busy_poll; ports],
            busy_since: None,
            last_sweep: Instant::now(),
            local: Local {
                rings,
                ..Local::default()
            },
        };
        // Fill now: the sockets take frames as soon as the steering program sends them.
        w.refill();
        w.publish();
        w
    }

    /// Pins the calling thread to the configured core; `Err` names the core when the
    /// kernel refuses (a core outside the process's cpuset).
    pub fn pin(&self) -> Result<(), String> {
        let Some(id) = self.spec.core else {
            return Ok(());
        };
        if core_affinity::set_for_current(core_affinity::CoreId { id }) {
            tracing::info!(worker = self.spec.index, core = id, "worker pinned");
            Ok(())
        } else {
            Err(format!(
                "could not pin worker {} to core {id}: not in the cpuset this process may run on",
                self.spec.index
            ))
        }
    }

    /// Polls until the stop flag is set.
    pub fn run(&mut self) {
        let mut idle = 0u32;
        while !self.stop.load(Ordering::Relaxed) {
            if self.poll() {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle >= IDLE_POLLS {
                    if let Some(d) = self.spec.idle_backoff {
                        std::thread::sleep(d);
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        self.publish();
    }

    /// One poll; returns whether any frame moved.
    pub fn poll(&mut self) -> bool {
        {
            let current = self.snapshot.load();
            if current.generation != self.pipeline.snapshot().generation {
                self.pipeline.set_snapshot(Arc::clone(&current));
            }
        }
        let now = Instant::now();
        self.local.polls += 1;
        if let Some(since) = self.busy_since.take() {
            self.local.busy_ns += now.saturating_duration_since(since).as_nanos() as u64;
        }
        let mut moved = self.reclaim();
        for port in 0..self.xsk.ports.len() {
            moved |= self.receive(port, now);
        }
        let kicked = self.kick();
        self.refill();
        self.sweep(now);
        if moved || kicked {
            self.busy_since = Some(now);
        }
        if moved {
            self.publish();
        }
        moved
    }

    /// Expires idle flows: the share of the table due since the last sweep, at most
    /// `sweep_budget` entries, at most every [`SWEEP_EVERY`].
    fn sweep(&mut self, now: Instant) {
        let since = now.saturating_duration_since(self.last_sweep);
        if since < SWEEP_EVERY {
            return;
        }
        self.last_sweep = now;
        let flows = self.pipeline.flows();
        let due =
            flows.capacity() as u128 * since.as_nanos() / self.spec.sweep_round.as_nanos().max(1);
        let n = (due as usize).clamp(1, self.spec.sweep_budget.max(1));
        let expired = &mut self.local.expired;
        let now = flows.tick(now);
        match self.pipeline.flow_log() {
            Some(log) => flows.sweep(now, n, |e| {
                *expired += 1;
                log.record(FlowEvent::Ended(EndedFlow::of(&e.data)));
            }),
            None => flows.sweep(now, n, |_| *expired += 1),
        };
    }

    /// Completed tx frames back to the free stack.
    fn reclaim(&mut self) -> bool {
        let mut any = false;
        for (port, s) in self.xsk.ports.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            for _ in 0..COMP_ROUNDS {
                // SAFETY: the completion ring hands back frames of this UMEM that the kernel
                // is done with.
                let n = unsafe { s.rings.comp.consume_comp(&mut self.batch) };
                for d in &self.batch[..n] {
                    self.pool.put(*d);
                }
                self.local.rings[port].completed += n as u64;
                any |= n > 0;
                if n < self.batch.len() {
                    break;
                }
            }
        }
        any
    }

    /// One rx batch of `port`, processed and transmitted.
    fn receive(&mut self, port: usize, now: Instant) -> bool {
        let n = if self.held[port].is_empty() {
            self.take_rx(port)
        } else {
            self.take_held(port, now)
        };
        let Some(s) = self.xsk.ports[port].as_ref().filter(|_| n > 0) else {
            return false;
        };
        if self.napi_unchecked[port] {
            self.napi_unchecked[port] = false;
            napi::check_napi_id(s.fd(), &s.ifname, self.spec.queue);
        }
        self.local.rx += n as u64;
        let mut frames = RxFrames {
            area: &self.xsk.area,
            descs: &mut self.batch[..n],
        };
        self.pipeline
            .process_batch(&mut frames, now, &mut self.verdicts[..n]);
        for (&desc, &verdict) in self.batch[..n].iter().zip(&self.verdicts[..n]) {
            match verdict {
                Verdict::Tx(p) | Verdict::Reject { port: p, .. } => {
                    let p = usize::from(p);
                    if self.xsk.ports.get(p).is_some_and(Option::is_some) {
                        self.stage[p].push(desc);
                    } else {
                        self.local.tx_no_port += 1;
                        self.pool.put(desc);
                    }
                }
                Verdict::Pass => {
                    if let Some(tap) = self.xsk.pass.get(port).and_then(Option::as_ref) {
                        // SAFETY: the frame came off our rx ring and is ours until put back.
                        let data = unsafe { self.xsk.area.data(&desc) };
                        self.local.pass_injected += u64::from(tap.inject(data));
                    }
                    self.pool.put(desc);
                }
                Verdict::Drop(_) | Verdict::Slow => self.pool.put(desc),
            }
        }
        self.transmit();
        true
    }

    /// The next batch of `port`'s rx ring into `self.batch`.
    #[inline]
    fn take_rx(&mut self, port: usize) -> usize {
        let Some(s) = self.xsk.ports[port].as_mut() else {
            return 0;
        };
        if self.spec.napi_busy_poll && !wake_rx(s.fd()) {
            self.local.wakeup_errors += 1;
        }
        // SAFETY: the descriptors written are frames of this UMEM, now owned by us.
        let n = unsafe { s.rings.rx.consume_rx(&mut self.batch) };
        self.in_fill[port] = self.in_fill[port].saturating_sub(n as u32);
        self.local.rings[port].received += n as u64;
        n
    }

    /// The next batch of `port`'s held frames ([`crate::xsk::gap`]) into `self.batch`: at
    /// most what every tx ring has room for (a batch's verdicts may send each frame to any
    /// port, and producing to a tx ring is all or nothing), so none is dropped for a full
    /// ring; 0 while they are full (the poll's kick empties them), but for at most
    /// [`HELD_WAIT`]: a tx ring that stays full (a port whose link is down) does not stop
    /// the others' traffic, its frames dropped then as any that find it full.
    #[cold]
    fn take_held(&mut self, port: usize, now: Instant) -> usize {
        let room = (self.xsk.ports.iter_mut().flatten())
            .map(|s| s.rings.tx.nb_free_exact() as usize)
            .min()
            .unwrap_or(0);
        let room = if room > 0 {
            self.held_full_since = None;
            room
        } else if now.saturating_duration_since(*self.held_full_since.get_or_insert(now))
            >= HELD_WAIT
        {
            usize::MAX
        } else {
            0
        };
        let held = &mut self.held[port];
        let n = held.len().min(room).min(self.batch.len());
        for (slot, d) in self.batch.iter_mut().zip(held.drain(..n)) {
            *slot = d;
        }
        n
    }

    /// Produces every staged descriptor on its port's tx ring and kicks the kernel.
    fn transmit(&mut self) {
        for (port, stage) in self.stage.iter_mut().enumerate() {
            if stage.is_empty() {
                continue;
            }
            let Some(s) = self.xsk.ports[port].as_mut() else {
                continue;
            };
            // SAFETY: staged descriptors are frames of this UMEM with their lengths set by
            // the rx ring, or by the pipeline (`set_len`: a SYN to a backend, a reject).
            let done = unsafe { s.rings.tx.produce_tx(stage) };
            for d in &stage[done..] {
                self.local.tx_ring_full += 1;
                self.pool.put(*d);
            }
            self.local.tx += done as u64;
            self.local.rings[port].transmitted += done as u64;
            stage.clear();
        }
    }

    /// Kicks every tx ring the kernel has not drained. In copy mode one `sendto` sends at
    /// most a small batch (32 frames on Linux), so a ring is kicked on every poll until the
    /// kernel has taken all of it, not only when new frames were produced. Returns whether
    /// any ring was kicked.
    fn kick(&mut self) -> bool {
        let size = self.xsk.tx_ring_size;
        let mut kicked = false;
        for s in self.xsk.ports.iter_mut().flatten() {
            if s.rings.tx.nb_free_exact() < size && s.rings.tx.needs_wakeup() {
                kicked = true;
                if !crate::xsk::wake_tx(s.fd()) {
                    self.local.wakeup_errors += 1;
                }
            }
        }
        kicked
    }

    /// Tops every fill ring up to its depth.
    fn refill(&mut self) {
        for (port, s) in self.xsk.ports.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            let want = self.xsk.fill_target.saturating_sub(self.in_fill[port]);
            if want == 0 {
                continue;
            }
            // SAFETY: the pool holds frames of this UMEM; `s.fill` is a ring of it.
            let done = unsafe { self.pool.fill(&mut s.rings.fill, want as usize) };
            self.in_fill[port] += done as u32;
            self.local.rings[port].filled += done as u64;
            if done > 0 && s.rings.fill.needs_wakeup() && !wake_rx(s.fd()) {
                self.local.wakeup_errors += 1;
            }
        }
    }

    /// Stores the counters for other threads.
    fn publish(&self) {
        let st = &self.stats;
        let l = &self.local;
        let c: &Counters = self.pipeline.counters();
        let set = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&st.rx, l.rx);
        set(&st.tx, l.tx);
        set(&st.tx_ring_full, l.tx_ring_full);
        set(&st.tx_no_port, l.tx_no_port);
        set(&st.wakeup_errors, l.wakeup_errors);
        set(&st.expired, l.expired);
        set(&st.polls, l.polls);
        set(&st.busy_ns, l.busy_ns);
        set(&st.pass, c.pass);
        set(&st.pass_injected, l.pass_injected);
        set(&st.slow, c.slow);
        set(&st.new_flows, c.new_flows);
        set(&st.reused, c.reused);
        set(&st.synproxy_syns, c.synproxy_syns);
        set(&st.synproxy_acks, c.synproxy_acks);
        for (a, v) in st.drops.iter().zip(c.drops) {
            set(a, v);
        }
        for (a, v) in st.rejects.iter().zip(c.rejects) {
            set(a, v);
        }
        for (a, v) in st.held.iter().zip(c.held) {
            set(a, v);
        }
        set(&st.generation, self.pipeline.snapshot().generation);
        for (r, l) in st.rings.iter().zip(&l.rings) {
            if let Some(r) = r {
                set(&r.filled, l.filled);
                set(&r.received, l.received);
                set(&r.transmitted, l.transmitted);
                set(&r.completed, l.completed);
            }
        }
    }

    /// Ends the worker (after [`Worker::run`], or between polls): tops every fill ring up
    /// as far as the ring and the free frames allow, so that the kernel has the most room
    /// to receive into while nobody polls (a hand-over's gap), and returns the sockets with
    /// the free frames and fill counts ([`crate::xsk::handover::FrameState`]).
    pub fn hand_back(mut self) -> XskSet {
        // Held frames not processed yet (a stop right after a takeover): free again, and
        // their packets lost, which the log says.
        let unprocessed: usize = self.held.iter().map(VecDeque::len).sum();
        if unprocessed > 0 {
            tracing::warn!(
                worker = self.spec.index,
                frames = unprocessed,
                "stopped before processing the frames held during the takeover's pause: dropped"
            );
            for d in self.held.iter_mut().flat_map(|h| h.drain(..)) {
                self.pool.put(d);
            }
        }
        for (port, s) in self.xsk.ports.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            // SAFETY: the pool holds free frames of this set's UMEM.
            self.in_fill[port] += unsafe { s.fill_all(&mut self.pool) } as u32;
        }
        self.xsk.frames = self.pool.free().to_vec();
        self.xsk.in_fill = std::mem::take(&mut self.in_fill);
        self.xsk
    }

    /// The worker's counters so far (also published in its [`WorkerStats`]).
    pub fn stats(&self) -> &Arc<WorkerStats> {
        &self.stats
    }
}

/// One rx batch as the pipeline's [`FrameBatch`]: descriptors just taken off an rx ring,
/// whose frames this worker owns until it gives them to a ring again.
struct RxFrames<'a> {
    area: &'a Area,
    descs: &'a mut [Desc],
}

impl FrameBatch for RxFrames<'_> {
    #[inline]
    fn frames_len(&self) -> usize {
        self.descs.len()
    }

    #[inline]
    fn frame(&mut self, i: usize) -> &mut [u8] {
        // SAFETY: `descs[i]` came off our rx ring: the frame is ours alone until it is given
        // to a ring again, and the slice borrows `self` mutably, so no other view of it
        // exists meanwhile.
        unsafe { self.area.data(&self.descs[i]) }
    }

    fn buffer(&mut self, i: usize) -> &mut [u8] {
        // SAFETY: as in `frame`: the frame's data segment (all of it), ours alone.
        unsafe { self.area.buffer(&self.descs[i]) }
    }

    fn set_len(&mut self, i: usize, len: usize) {
        let room = self.buffer(i).len();
        self.descs[i].len = len.min(room) as u32;
    }
}
