//! The table's memory layout: one region holding a header page (geometry, identity and the
//! shared scalar atomics), the entry slabs, the index and the backend counts, at page-aligned
//! offsets. The same layout serves an anonymous table ([`FlowTable::new`]) and a state file
//! ([`FlowTable::open`](super::FlowTable::open), in `persist`), so a state file is just a
//! table's memory.

#[cfg(not(loom))]
use std::time::Instant;

use super::FlowTable;
#[cfg(not(loom))]
use super::FlowTableConfig;
use super::counts::BackendCount;
use super::entry::{Entry, W_IDS};
use super::stats::Counters;
use crate::index::Index;
use crate::mem::page_round;
use crate::sync::{AtomicU64, AtomicUsize, Ordering, Padded};

/// `XVSFLOWT`: a state file.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"XVSFLOWT");
/// The layout version: entry words, index words, header fields and their offsets. Bump it
/// whenever any of them changes; a state of another version is imported, never adopted.
///
/// - 1: the first.
/// - 2: the sequence words (an IPv4 entry's last hot word, the `seq6` slab after the cold
///   half-lines) and the embryonic gauge in the counters.
/// - 3: no cold half-lines and no `seq6` slab: an IPv6 flow's VIP, backend and SNAT
///   addresses in an extension entry that its hot line names (the word IPv4 keeps its
///   checksum adjustments in), its sequence word in its hot line's last word as IPv4's.
/// - 4: an entry's ports and IPv4 addresses in network byte order (as frames carry them), and
///   the IPv4 hash taken over them.
/// - 5: the index words' tags are the hash's top 31 bits as they are (layout 4 set the
///   lowest and cleared the next, so that no tag was all zeros or all ones): live words are
///   told from `EMPTY`, `TOMB` and `FROZEN` by their values.
/// - 6: an IPv4 entry's checksum adjustments include the TTL's decrement
///   ([`v4_forward_delta`](crate::v4_forward_delta)), so that a rewrite adds one term to the
///   header checksum.
pub(crate) const LAYOUT_VERSION: u64 = 6;

/// Header status: a process owns the table (or owned it when it died).
pub(crate) const STATUS_RUNNING: u64 = 1;
/// Header status: the last owner stopped cleanly.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) const STATUS_CLEAN: u64 = 2;

/// Index slots per flow (two keys per flow at load factor 0.625).
pub(crate) const INDEX_SLOTS_NUM: usize = 16;
pub(crate) const INDEX_SLOTS_DEN: usize = 5;

/// The first page of a table's region. Fields are atomics so that a mapped header is
/// [`Plain`](crate::mem::Plain); the geometry and identity are written once, at creation.
#[repr(C)]
pub(crate) struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU64,
    pub capacity: AtomicU64,
    pub homes: AtomicU64,
    pub backends_max: AtomicU64,
    /// `size_of::<Entry>() << 32` (the low half held the cold half-line's size, up to layout
    /// 2): a cross-check of the layout.
    pub entry_bytes: AtomicU64,
    /// `/proc/sys/kernel/random/boot_id`: flows (and monotonic times) of another boot mean
    /// nothing.
    pub boot_id: [AtomicU64; 2],
    /// CLOCK_MONOTONIC (what `Instant` reads on Linux) at tick 0, in ns.
    pub epoch_mono_ns: AtomicU64,
    /// The hash seed this table's index was built with.
    pub seed: AtomicU64,
    /// [`STATUS_RUNNING`] or [`STATUS_CLEAN`].
    pub status: AtomicU64,
    /// The pid of the last process that opened it.
    pub owner_pid: AtomicU64,
    /// Times the table was adopted by a new process.
    pub adoptions: AtomicU64,
}

/// The header and the shared scalars, at offset 0.
#[repr(C)]
pub(crate) struct HeaderBlock {
    pub header: Header,
    pub free: Padded<AtomicU64>,
    pub departed: Padded<AtomicU64>,
    pub sweep_cursor: Padded<AtomicUsize>,
    pub counters: Padded<Counters>,
}

#[cfg(not(loom))]
mod plain {
    use super::*;
    use shm::Plain;
    // SAFETY: every one of these is repr(C)/repr(transparent) over integer atomics.
    unsafe impl Plain for Header {}
    // SAFETY: as above.
    unsafe impl Plain for HeaderBlock {}
    // SAFETY: as above.
    unsafe impl Plain for Entry {}
    // SAFETY: as above.
    unsafe impl Plain for BackendCount {}
    // SAFETY: as above.
    unsafe impl Plain for Counters {}
    // SAFETY: Padded is repr(align) over a Plain value.
    unsafe impl<T: Plain> Plain for Padded<T> {}
}

/// Where everything sits in a table's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub capacity: usize,
    pub homes: usize,
    pub index_slots: usize,
    pub backends_max: usize,
    pub entries: usize,
    pub index: usize,
    pub backends: usize,
    /// Bytes in all.
    pub total: usize,
}

impl Layout {
    /// The layout of a table with `capacity` flows and `backends_max` backends as a state
    /// file's header gives them (untrusted): `None` unless both are in range
    /// (`1..=CAPACITY_MAX`, `1..=2^32`), so that no size computation can overflow.
    #[cfg(not(loom))]
    pub(crate) fn checked(capacity: u64, backends_max: u64) -> Option<Layout> {
        let ok = (1..=super::CAPACITY_MAX as u64).contains(&capacity)
            && (1..=1u64 << 32).contains(&backends_max);
        // In range, the largest total is about 260 GiB: far from overflowing a 64-bit usize.
        ok.then(|| Layout::of(capacity as usize, backends_max as usize))
    }

    /// The layout of a table with `capacity` flows and `backends_max` backends (both in
    /// range: a config's, checked by the caller, or [`Layout::checked`]'s).
    pub(crate) fn of(capacity: usize, backends_max: usize) -> Layout {
        let homes = capacity * INDEX_SLOTS_NUM / INDEX_SLOTS_DEN;
        let index_slots = Index::slots_for(homes);
        let entries = page_round(std::mem::size_of::<HeaderBlock>());
        let index = entries + page_round(capacity * std::mem::size_of::<Entry>());
        let backends = index + page_round(index_slots * 8);
        let total = backends + page_round(backends_max * std::mem::size_of::<BackendCount>());
        Layout {
            capacity,
            homes,
            index_slots,
            backends_max,
            entries,
            index,
            backends,
            total,
        }
    }
}

impl FlowTable {
    /// The table over `mem` laid out as `lay`, with `config`'s timeouts and `seed`, times
    /// counted from `epoch`. Nothing in the memory is written.
    #[cfg(not(loom))]
    pub(crate) fn carve(
        mem: crate::mem::Mapping,
        lay: &Layout,
        config: &FlowTableConfig,
        seed: u64,
        epoch: Instant,
        file: bool,
    ) -> FlowTable {
        use std::mem::offset_of;
        FlowTable {
            entries: mem.slab(lay.entries, lay.capacity),
            slow_seen: AtomicUsize::new(0),
            index: Index::over(mem.slab(lay.index, lay.index_slots), lay.homes),
            free: mem.one(offset_of!(HeaderBlock, free)),
            departed: mem.one(offset_of!(HeaderBlock, departed)),
            sweep_cursor: mem.one(offset_of!(HeaderBlock, sweep_cursor)),
            counters: mem.one(offset_of!(HeaderBlock, counters)),
            backends: mem.slab(lay.backends, lay.backends_max),
            header: file.then(|| mem.one(offset_of!(HeaderBlock, header))),
            timeouts: config.timeouts,
            timeout_ticks: super::time::timeout_ticks(&config.timeouts),
            pressure_ticks: super::time::pressure_ticks(&config.timeouts),
            pressure_until: Padded(AtomicU64::new(0)),
            next_code: super::touch::next_code_table(),
            seeds: super::hash::seeds(seed),
            epoch,
            lock: None,
            mem,
        }
    }

    /// Makes a zeroed region a new, empty table: the free list through every entry, and the
    /// header's geometry and identity.
    pub(crate) fn init_fresh(&self, lay: &Layout, identity: Option<(&[u64; 2], u64, u64)>) {
        let cap = self.entries.len();
        for (i, e) in self.entries.iter().enumerate() {
            // Free list 0 -> 1 -> ... -> cap-1.
            let next = if i + 1 < cap { i as u64 + 2 } else { 0 };
            e.w[W_IDS].store(next, Ordering::Relaxed);
        }
        self.free.0.store(1, Ordering::Relaxed);
        if let (Some(h), Some((boot, epoch_ns, seed))) = (&self.header, identity) {
            let set = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
            set(&h.version, LAYOUT_VERSION);
            set(&h.capacity, lay.capacity as u64);
            set(&h.homes, lay.homes as u64);
            set(&h.backends_max, lay.backends_max as u64);
            set(&h.entry_bytes, entry_bytes());
            set(&h.boot_id[0], boot[0]);
            set(&h.boot_id[1], boot[1]);
            set(&h.epoch_mono_ns, epoch_ns);
            set(&h.seed, seed);
            set(&h.status, STATUS_RUNNING);
            set(&h.owner_pid, u64::from(std::process::id()));
            // Last, with release: a reader that sees the magic sees the rest.
            h.magic.store(MAGIC, Ordering::Release);
        }
    }
}

/// The entry sizes as the header records them.
pub(crate) fn entry_bytes() -> u64 {
    (std::mem::size_of::<Entry>() as u64) << 32
}
