//! The flow table: the [`FlowTable`] itself (its fields, construction and size), with each
//! subject of its implementation in a submodule:
//!
//! - `entry`: an entry's layout, the control word and its statuses, data reads and writes;
//! - `handle`, `error`: what callers hold ([`FlowHandle`], [`FlowHit`], [`FlowView`], ...) and
//!   the errors;
//! - `hash`: the tuple hash;
//! - `lookup`: the validated reads; `touch`: a packet's state transition; `seq`: the per-flow
//!   sequence word;
//! - `insert`: publishing a new flow; `free`: the free list and recycling; `remove`: removal,
//!   giving way and the sweep;
//! - `counts`: the per-backend counts; `stats`: counters; `time`: ticks and timeouts;
//! - `v4`: the leaner IPv4 per-packet API; `store`: the region's layout and header; `persist`:
//!   a table in a state file.

use crate::index::Index;
#[cfg(not(loom))]
use crate::mem::Mapping;
use crate::mem::{One, Slab};
use crate::state::{STATE_CODES, Timeouts};
use crate::sync::{AtomicU64, AtomicUsize, Ordering, Padded};
use std::time::Instant;

mod check;
mod counts;
mod entry;
mod error;
mod free;
mod handle;
mod hash;
mod insert;
mod lookup;
#[cfg(not(loom))]
mod persist;
mod remove;
mod seq;
mod stats;
mod store;
mod time;
mod touch;
mod v4;

use counts::BackendCount;
use entry::Entry;
use stats::Counters;
use touch::{CODES_PAD, ROWS};

pub use entry::{FLAG_ONE_WAY, FLAG_SLOW};
pub use error::{Error, InsertError};
pub use handle::{ExpiredFlow, FlowHandle, FlowHit, FlowView, Tick};
#[cfg(not(loom))]
pub use persist::{
    AnyFlow, FlowCheck, FlowRecord, Handed, Imported, Opened, RECORD_BYTES, RECORD_VERSION,
    Recovery, previous_path,
};
pub use seq::{RST_AHEAD_BYTES, RST_BEHIND_BYTES, RstWindow, SEQ_BITS};
pub use stats::{FlowTableStats, SweepStats};
#[cfg(feature = "testing")]
pub use time::PRESSURE_HOLD_TICKS;
pub use v4::{
    PendingV4, V4Flow, V4Hit, V4Key, v4_addrs_be, v4_csum_delta, v4_csum_delta_be,
    v4_forward_delta, v4_ports_be, v4_wire_word,
};

/// Largest capacity: entry numbers must fit the index word's 32-bit field with room for the
/// reserved values.
pub const CAPACITY_MAX: usize = 1 << 31;

/// Sizes and timeouts, fixed at [`FlowTable::new`].
#[derive(Clone, Copy, Debug)]
pub struct FlowTableConfig {
    /// Most live flows (entries allocated up front).
    pub capacity: usize,
    /// Size of the per-backend connection-count array: valid `BackendId`s are `0..backends_max`.
    pub backends_max: usize,
    /// Idle timeouts per state.
    pub timeouts: Timeouts,
    /// Key of the tuple hash. Random by default (from the kernel), so that nobody can
    /// compute offline which tuples collide and fill one tuple's probe window (hash
    /// flooding); set it only for a reproducible table. A state file keeps its own
    /// ([`FlowTable::open`] draws one for a new file and ignores this).
    pub hash_seed: u64,
}

impl FlowTableConfig {
    /// A config with default timeouts and a random hash key.
    pub fn new(capacity: usize, backends_max: usize) -> Self {
        FlowTableConfig {
            capacity,
            backends_max,
            timeouts: Timeouts::default(),
            // Loom explores one execution per schedule: the table must hash alike each time.
            hash_seed: if cfg!(loom) {
                0x9e37_79b9_7f4a_7c15
            } else {
                shm::random_u64()
            },
        }
    }
}

/// The lock-free conntrack table. Share it by reference (`&FlowTable` or `Arc<FlowTable>`); every
/// method takes `&self`. See the crate docs for the concurrency protocol.
pub struct FlowTable {
    /// The entries: flows' hot lines, and IPv6 flows' extensions (see `entry`).
    entries: Slab<Entry>,
    /// 1 once a [`FLAG_SLOW`] or [`FLAG_ONE_WAY`] flow was inserted or adopted (this
    /// process).
    slow_seen: AtomicUsize,
    index: Index,
    /// Free-list head: `tag:32 | entry+1:32` (0 in the low half = empty). The tag defeats ABA.
    free: One<Padded<AtomicU64>>,
    /// Flows that left the table (expired, removed, recycled): `len` is `inserted` minus this.
    departed: One<Padded<AtomicU64>>,
    sweep_cursor: One<Padded<AtomicUsize>>,
    counters: One<Padded<Counters>>,
    backends: Slab<BackendCount>,
    /// The header of a table in a state file ([`FlowTable::open`]).
    #[cfg_attr(loom, allow(dead_code))]
    header: Option<One<store::Header>>,
    /// The timeouts given at `new` (an import's table of another geometry takes them).
    #[cfg_attr(loom, allow(dead_code))]
    timeouts: Timeouts,
    timeout_ticks: [u32; STATE_CODES],
    /// `timeout_ticks` under pressure: embryonic states capped at `tcp_syn_pressure`.
    pressure_ticks: [u32; STATE_CODES],
    /// The table is under pressure until this tick (set when embryonic flows had to give
    /// way: recycled for a slot, evicted for a SNAT port). Not persisted: a restarted process
    /// learns it again from the next flood packet.
    pressure_until: Padded<AtomicU64>,
    /// `FlowState::next` on state codes: `[dir][flags_index(flags)][code]`, for `touch`.
    next_code: [[[u8; CODES_PAD]; 16]; ROWS],
    seeds: [u64; 8],
    epoch: Instant,
    /// The state file, locked while the table lives (a table made by `open`).
    #[cfg(not(loom))]
    #[allow(dead_code)]
    lock: Option<shm::StateFile>,
    /// The memory the slabs above point into; declared last, so dropped after them.
    #[cfg(not(loom))]
    #[allow(dead_code)]
    mem: Mapping,
}

impl FlowTable {
    /// Allocate a table for `config.capacity` flows. `epoch` is the origin of the compact
    /// timestamps: pass the start-up time (any `Instant` not after the first `now`).
    pub fn new(config: FlowTableConfig, epoch: Instant) -> Result<Self, Error> {
        let cap = config.capacity;
        if cap == 0 || cap > CAPACITY_MAX {
            return Err(Error::Capacity {
                got: cap,
                max: CAPACITY_MAX,
            });
        }
        if config.backends_max == 0 || config.backends_max as u64 > 1 << 32 {
            return Err(Error::BackendsMax(config.backends_max));
        }
        #[cfg(not(loom))]
        {
            let lay = store::Layout::of(cap, config.backends_max);
            let mem = Mapping::anonymous(lay.total).map_err(|e| Error::Memory {
                bytes: lay.total,
                errno: e.raw_os_error().unwrap_or(0),
            })?;
            mem.advise_huge();
            let t = FlowTable::carve(mem, &lay, &config, config.hash_seed, epoch, false);
            t.init_fresh(&lay, None);
            Ok(t)
        }
        #[cfg(loom)]
        {
            let lay = store::Layout::of(cap, config.backends_max);
            let zeros =
                |n: usize| -> Box<[AtomicU64]> { (0..n).map(|_| AtomicU64::new(0)).collect() };
            let t = FlowTable {
                entries: Slab::boxed(
                    (0..cap)
                        .map(|_| Entry {
                            w: std::array::from_fn(|_| AtomicU64::new(0)),
                        })
                        .collect(),
                ),
                slow_seen: AtomicUsize::new(0),
                index: Index::over(Slab::boxed(zeros(lay.index_slots)), lay.homes),
                free: One::boxed(Padded(AtomicU64::new(0))),
                departed: One::boxed(Padded(AtomicU64::new(0))),
                sweep_cursor: One::boxed(Padded(AtomicUsize::new(0))),
                counters: One::boxed(Padded(Counters::default())),
                backends: Slab::boxed(
                    (0..config.backends_max)
                        .map(|_| BackendCount(AtomicU64::new(0)))
                        .collect(),
                ),
                header: None,
                timeouts: config.timeouts,
                timeout_ticks: time::timeout_ticks(&config.timeouts),
                pressure_ticks: time::pressure_ticks(&config.timeouts),
                pressure_until: Padded(AtomicU64::new(0)),
                next_code: touch::next_code_table(),
                seeds: hash::seeds(config.hash_seed),
                epoch,
            };
            t.init_fresh(&lay, None);
            Ok(t)
        }
    }

    /// Index slots a probe sequence may span from its home slot.
    #[cfg(feature = "testing")]
    pub const PROBE_SLOTS: usize = crate::index::MAX_PROBE;

    /// Entries allocated.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Live flows (approximate while inserts and removals run).
    pub fn len(&self) -> usize {
        // Departures first: every departure counted was counted as an arrival before, so
        // the difference can only come out high while both move (or, with relaxed loads of
        // two words, rarely low: it saturates at zero).
        let departed = self.departed.0.load(Ordering::Relaxed);
        let inserted = self.counters.0.inserted.load(Ordering::Relaxed);
        inserted.saturating_sub(departed) as usize
    }

    /// Whether no flow is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `epoch` given at `new`.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Memory of the entries, the index and the backend counts, divided by the capacity.
    pub fn bytes_per_flow(&self) -> f64 {
        let bytes = std::mem::size_of_val(&*self.entries)
            + self.index.len() * 8
            + std::mem::size_of_val(&*self.backends)
            + std::mem::size_of::<Self>();
        bytes as f64 / self.entries.len() as f64
    }
}
