//! The flow table: an entry slab, a free list, the shared index, counters and the sweep.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use lb_algos::{BackendId, ConnCounts};

use crate::index::{self, Claim, Index};
use crate::key::{Direction, FlowData, FlowKey, Protocol, bits_addr};
#[cfg(not(loom))]
use crate::mem::Mapping;
use crate::mem::{One, Slab};
use crate::state::{FlowState, STATE_CODES, TcpFlags, TcpState, Timeouts};
use crate::sync::{AtomicU64, AtomicUsize, Ordering, Padded, fence};

#[cfg(not(loom))]
mod persist;
mod store;
mod v4;
#[cfg(not(loom))]
pub use persist::{
    FlowRecord, Imported, Opened, RECORD_BYTES, RECORD_VERSION, Recovery, previous_path,
};
pub use v4::{PendingV4, V4Flow, V4Hit, V4Key, v4_csum_delta};

/// Largest capacity: entry numbers must fit the index word's 32-bit field with room for the
/// reserved values.
pub const CAPACITY_MAX: usize = 1 << 31;

/// Time unit of the stored last-seen time: 100 ms (u32 ticks last 13.6 years from `epoch`).
const TICK_MS: u64 = 100;

/// Entries probed for an embryonic or expired victim when the free list is empty.
const VICTIM_PROBE: usize = 32;

/// How long the table stays under pressure after embryonic flows last had to give way:
/// 10 s, in ticks.
pub const PRESSURE_HOLD_TICKS: u64 = 100;

// Entry words: 0..8 in the hot line (`Entry`), 8..12 in the cold half-line (`Cold`).
const W_CTL: usize = 0;
/// client port | vip port << 16 | backend port << 32 | snat port << 48.
const W_PORTS: usize = 1;
/// service id | backend id << 32; while the entry is free: the free-list link (entry + 1).
const W_IDS: usize = 2;
/// snapshot gen | proto << 32 | v6 << 40 | flags << 48.
const W_META: usize = 3;
/// Addresses. IPv4: word 4 = client | vip << 32, word 5 = backend | snat << 32 (so an IPv4
/// flow lives in one cache line). IPv6: client (4, 5), vip (6, 7), backend (8, 9), snat
/// (10, 11), each (lo, hi).
const W_ADDR: usize = 4;
/// IPv4 only: the checksum adjustments ([`v4_csum_delta`]) of the original direction | the
/// reply direction's << 32.
const W_V4_CSUM: usize = 6;
/// IPv4 only: the flow's sequence word (see [`FlowTable::seq`]); an IPv6 flow keeps it in
/// the `seq6` slab.
const W_V4_SEQ: usize = 7;
const W_COLD: usize = 8;
const HOT_WORDS: usize = 8;
const COLD_WORDS: usize = 4;

/// Address slots, in word order.
const A_CLIENT: usize = 0;
const A_VIP: usize = 1;
const A_BACKEND: usize = 2;
const A_SNAT: usize = 3;

/// One flow's hot line: 8 atomic words, 64 bytes, cache-line aligned: the control word
/// `gen:22 | status:2 | state:8 | last_seen:32`, ports, ids, meta and the addresses (all of
/// them for IPv4, client and VIP for IPv6). The rest are immutable while the entry is
/// INSERTING or LIVE. Atomics (not plain fields) so readers may race with a recycler without
/// UB: they validate with the control word instead.
#[repr(C, align(64))]
struct Entry {
    w: [AtomicU64; HOT_WORDS],
}

/// The IPv6 backend and SNAT addresses of a flow (unused for IPv4): 32 bytes.
#[repr(C, align(32))]
struct Cold {
    w: [AtomicU64; COLD_WORDS],
}

const _: () = assert!(
    (std::mem::size_of::<Entry>() == 64 && std::mem::size_of::<Cold>() == 32) || cfg!(loom)
);

/// A bit of [`FlowData::flags`] that the table reads: [`FlowTable::lookup_v4`] (the IPv4
/// per-packet shortcut) does not return such a flow, while every other lookup, the inserts
/// and the rest treat it as any flow. For flows whose packets need more than the shortcut's
/// rewrite (the SYN proxy's): they cost the shortcut's hits nothing, not even a test. A
/// table that ever held one says so ([`FlowTable::has_slow_flows`]).
pub const FLAG_SLOW: u8 = 0x80;

/// Bits of a flow's sequence word that belong to its owner (the pipeline's SYN proxy); the
/// bits above tag the word with the low bits of the entry's generation, so that a word left
/// by an earlier flow of the entry (or stored for one that is gone) is never read as this
/// flow's.
pub const SEQ_BITS: u32 = 53;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// A sequence word as stored for generation `gen_`.
#[inline]
fn seq_stamp(gen_: u64, v: u64) -> u64 {
    gen_ << SEQ_BITS | (v & SEQ_MASK)
}

const ST_FREE: u64 = 0;
const ST_INSERTING: u64 = 1;
const ST_LIVE: u64 = 2;
const ST_DYING: u64 = 3;
const GEN_MASK: u64 = (1 << 22) - 1;

#[inline]
/// Whether `state` is a state of protocol `proto`.
fn state_fits(state: FlowState, proto: Protocol) -> bool {
    matches!(
        (state, proto),
        (FlowState::Tcp(_), Protocol::Tcp)
            | (FlowState::Udp, Protocol::Udp)
            | (FlowState::Icmp, Protocol::Icmp | Protocol::Icmpv6)
            | (FlowState::Sctp(_), Protocol::Sctp)
    )
}

fn ctl(gen_: u64, status: u64, state: u8, ls: u32) -> u64 {
    (gen_ & GEN_MASK) << 42 | status << 40 | u64::from(state) << 32 | u64::from(ls)
}
#[inline]
fn ctl_gen(c: u64) -> u64 {
    c >> 42
}
#[inline]
fn ctl_status(c: u64) -> u64 {
    (c >> 40) & 3
}
#[inline]
fn ctl_state(c: u64) -> u8 {
    (c >> 32) as u8
}
#[inline]
fn ctl_ls(c: u64) -> u32 {
    c as u32
}
/// Readable (lookups, `get`, `on_packet`): data complete and not being torn down.
#[inline]
fn ctl_readable(c: u64) -> bool {
    // Status + 1 is 2 or 3 (bit 1 set) exactly for INSERTING and LIVE: FREE gives 1, DYING 4
    // (a carry into the generation, which is not read back).
    (c.wrapping_add(1 << 40) >> 41) & 1 != 0
}
const _: () = assert!(ST_FREE == 0 && ST_INSERTING == 1 && ST_LIVE == 2 && ST_DYING == 3);

/// The two IPv4 addresses of an address word, `(high half, low half)`, as key bits.
#[inline(always)]
fn v4_halves(w: u64) -> (u128, u128) {
    let m = |x: u64| crate::key::V4_MAPPED | u128::from(x as u32);
    (m(w >> 32), m(w))
}

/// A time in the table's unit (100 ms ticks since the epoch), from [`FlowTable::tick`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tick(u32);

impl Tick {
    /// The time in 100 ms ticks since the table's epoch (boot, for a table in a state file:
    /// the same clock in every process of a boot).
    #[inline]
    pub fn get(self) -> u32 {
        self.0
    }
}

/// What a packet of a known flow needs, from [`FlowTable::lookup_hit`]: 48 bytes, `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowHit {
    /// The flow.
    pub handle: FlowHandle,
    /// Which tuple the packet matched.
    pub dir: Direction,
    /// New source port.
    pub src_port: u16,
    /// New destination port.
    pub dst_port: u16,
    /// The flow's pipeline flags byte ([`FlowData::flags`]).
    pub flags: u8,
    v6: bool,
    src: u128,
    dst: u128,
    ctl: u64,
    backend: u32,
}

impl FlowHit {
    /// The flow's state when it was looked up ([`FlowState::to_u8`]'s code): with what
    /// [`FlowTable::touch`] returns, whether the packet changed it.
    #[inline(always)]
    pub fn state_code(&self) -> u8 {
        ctl_state(self.ctl)
    }

    /// Whether the flow is IPv6.
    #[inline]
    pub fn is_ipv6(&self) -> bool {
        self.v6
    }

    /// New source address.
    #[inline]
    pub fn src_ip(&self) -> IpAddr {
        bits_addr(self.src, self.v6)
    }

    /// New destination address.
    #[inline]
    pub fn dst_ip(&self) -> IpAddr {
        bits_addr(self.dst, self.v6)
    }

    /// New source address bits: the IPv6 address, or the IPv4 one in the low 32 bits.
    #[inline]
    pub fn src_bits(&self) -> u128 {
        self.src
    }

    /// New destination address bits (like [`src_bits`](Self::src_bits)).
    #[inline]
    pub fn dst_bits(&self) -> u128 {
        self.dst
    }

    /// The backend the flow was scheduled to.
    #[inline]
    pub fn backend_id(&self) -> BackendId {
        BackendId(self.backend)
    }
}

/// A [`FlowKey`] and its hash in one table, from [`FlowTable::hashed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashedKey {
    key: FlowKey,
    hash: u64,
}

impl HashedKey {
    /// The key.
    #[inline]
    pub fn key(&self) -> &FlowKey {
        &self.key
    }
}

/// State codes padded to a power of two (the `next_code` table's last dimension).
const CODES_PAD: usize = 32;
const _: () = assert!(STATE_CODES <= CODES_PAD);

/// ESTABLISHED's state code.
const EST_CODE: u8 = TcpState::Established as u8;

/// The four flag bits `FlowState::next` reads (FIN, SYN, RST, ACK) as a 4-bit index.
#[inline(always)]
fn flags_index(f: u8) -> usize {
    usize::from((f & 0x07) | ((f >> 1) & 0x08))
}

/// [`FlowState::next`] tabulated over state codes, both directions and every combination of
/// the flag bits it reads.
fn next_code_table() -> [[[u8; CODES_PAD]; 16]; 2] {
    let mut t = [[[0u8; CODES_PAD]; 16]; 2];
    for (d, dir) in [Direction::Original, Direction::Reply]
        .into_iter()
        .enumerate()
    {
        for fi in 0..16u8 {
            let flags = TcpFlags((fi & 0x07) | ((fi & 0x08) << 1));
            debug_assert_eq!(flags_index(flags.0), usize::from(fi));
            for (code, next) in t[d][usize::from(fi)].iter_mut().enumerate() {
                *next = FlowState::from_u8(code as u8).next(dir, flags).to_u8();
            }
        }
    }
    t
}

/// Identifies one incarnation of one entry. A handle to a removed or recycled flow is detected
/// (calls return `None`), so holding a handle across batches is safe, just possibly stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowHandle(u64);

impl FlowHandle {
    fn new(entry: u32, gen_: u64) -> Self {
        FlowHandle(u64::from(entry) | gen_ << 32)
    }
    /// Entry number (`0..capacity`), e.g. for `/v1/flows` paging.
    pub fn entry(self) -> u32 {
        self.0 as u32
    }
    fn gen_(self) -> u64 {
        self.0 >> 32
    }
    /// The handle as one word (for a queue of handles; see [`from_bits`](Self::from_bits)).
    pub fn to_bits(self) -> u64 {
        self.0
    }
    /// A handle back from [`to_bits`](Self::to_bits). Any word makes a handle that is safe
    /// to use: one that names no live flow is stale (calls return `None`).
    pub fn from_bits(bits: u64) -> FlowHandle {
        FlowHandle(bits)
    }
}

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

/// Errors from [`FlowTable::new`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// Capacity is zero or above [`CAPACITY_MAX`].
    #[error("flow table capacity must be in 1..={max}, got {got}")]
    Capacity {
        /// The requested capacity.
        got: usize,
        /// The largest allowed.
        max: usize,
    },
    /// `backends_max` is zero or does not fit a `BackendId`.
    #[error("backends_max must be in 1..=2^32, got {0}")]
    BackendsMax(usize),
    /// A state file could not be used.
    #[error("flow state {path}: {detail}")]
    State {
        /// The file.
        path: String,
        /// What went wrong.
        detail: String,
    },
    /// The memory could not be mapped.
    #[error("mapping {bytes} bytes for the flow table failed: {}", std::io::Error::from_raw_os_error(*errno))]
    Memory {
        /// Bytes asked for.
        bytes: usize,
        /// The OS error number.
        errno: i32,
    },
}

/// Why an insert did not add a flow.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
pub enum InsertError {
    /// The table is full and no embryonic or expired entry near the flow could be recycled.
    #[error("flow table full")]
    Full,
    /// A live flow already has this original tuple (another worker won the race): use it. If
    /// `get` on it returns `None` it went away meanwhile: look up again.
    #[error("flow already in the table")]
    Exists(FlowHandle),
    /// Another live flow already uses this flow's reply tuple (e.g. its SNAT port).
    #[error("reply tuple in use by another flow")]
    ReplyInUse(FlowHandle),
    /// No free index slot within the probe limit (a pathological hash cluster).
    #[error("flow index probe limit reached")]
    IndexFull,
    /// The flow data is unusable.
    #[error("invalid flow: {0}")]
    Invalid(&'static str),
}

/// A flow copied out of the table, with its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowView {
    /// The flow's handle.
    pub handle: FlowHandle,
    /// The immutable flow data.
    pub data: FlowData,
    /// Protocol state when read.
    pub state: FlowState,
    /// Last packet time when read (100 ms resolution, rounded down).
    pub last_seen: Instant,
    /// The flow's sequence word ([`FlowTable::seq`]); 0 when none was stored.
    pub seq: u64,
}

/// A flow that left the table (expired, removed or recycled): release what it held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpiredFlow {
    /// Its (now stale) handle.
    pub handle: FlowHandle,
    /// Its data (SNAT port to release, backend id...).
    pub data: FlowData,
    /// Its last state.
    pub state: FlowState,
    /// Its last packet time.
    pub last_seen: Instant,
}

/// Counters since start-up, plus the current size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowTableStats {
    /// Entries allocated.
    pub capacity: usize,
    /// Live flows now.
    pub len: usize,
    /// Flows inserted.
    pub inserted: u64,
    /// Inserts refused because the table was full.
    pub full: u64,
    /// Inserts that found the flow already present.
    pub exists: u64,
    /// Inserts refused because the reply tuple was taken.
    pub reply_in_use: u64,
    /// Inserts refused for lack of an index slot.
    pub index_full: u64,
    /// Embryonic or expired flows recycled by inserts into a full table.
    pub recycled: u64,
    /// Flows expired by sweeps.
    pub expired: u64,
    /// Flows removed by `remove`.
    pub removed: u64,
    /// Embryonic flows ended to make room under pressure: by [`FlowTable::give_way`] (a
    /// SNAT port), or expired by a sweep with the shortened pressure timeout.
    pub gave_way: u64,
    /// Live TCP flows whose handshake has not completed ([`FlowState::is_embryonic`]) now
    /// (approximate while flows change state).
    pub embryonic: u64,
}

#[derive(Default)]
struct Counters {
    inserted: AtomicU64,
    full: AtomicU64,
    exists: AtomicU64,
    reply_in_use: AtomicU64,
    index_full: AtomicU64,
    recycled: AtomicU64,
    expired: AtomicU64,
    removed: AtomicU64,
    /// Lives in what was the padding of `Padded<Counters>` (layout version 1 files hold 0
    /// there), so the header's offsets are unchanged.
    gave_way: AtomicU64,
    /// Live embryonic flows: a gauge of wrapping signed updates (a decrement may overtake its
    /// increment for a moment).
    embryonic: AtomicU64,
}

/// One backend's counts in one word: `active << 32 | inactive`, each a wrapping 32-bit
/// count. Every change is one `fetch_add` of a signed delta (an inactive → active transition
/// is `+2^32 - 1`), so a component that dips below zero (a remover's decrement overtaking a
/// state change's increment) borrows from the other; [`unpack`] undoes the borrow, giving
/// exactly what two separate `AtomicU32`s would hold. One word lets the lc family's bulk scan
/// copy one load per backend.
struct BackendCount(AtomicU64);

const ACTIVE_ONE: u64 = 1 << 32;

/// `(active, inactive)` as signed counts from a packed word.
#[inline(always)]
fn unpack(w: u64) -> (i32, i32) {
    let inactive = w as u32 as i32;
    let active = (w.wrapping_sub(inactive as i64 as u64) >> 32) as u32 as i32;
    (active, inactive)
}

/// A packed word with both counts clamped at zero (what [`ConnCounts`] reports).
#[inline(always)]
fn clamped(w: u64) -> u64 {
    // Both components non-negative and no borrow: the word is already exact.
    if w & 0x8000_0000_8000_0000 == 0 {
        return w;
    }
    let (a, i) = unpack(w);
    u64::from(a.max(0) as u32) << 32 | u64::from(i.max(0) as u32)
}

/// What a sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Entries examined.
    pub visited: usize,
    /// Flows expired (each passed to the callback).
    pub expired: usize,
    /// Index tombstones cleared.
    pub tombs_cleared: usize,
}

/// The lock-free conntrack table. Share it by reference (`&FlowTable` or `Arc<FlowTable>`); every
/// method takes `&self`. See the crate docs for the concurrency protocol.
pub struct FlowTable {
    entries: Slab<Entry>,
    cold: Slab<Cold>,
    /// IPv6 flows' sequence words (an IPv4 flow's is in its hot line).
    seq6: Slab<AtomicU64>,
    /// 1 once a [`FLAG_SLOW`] flow was inserted or adopted (this process).
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
    timeouts: Timeouts,
    timeout_ticks: [u32; STATE_CODES],
    /// `timeout_ticks` under pressure: embryonic states capped at `tcp_syn_pressure`.
    pressure_ticks: [u32; STATE_CODES],
    /// The table is under pressure until this tick (set when embryonic flows had to give
    /// way: recycled for a slot, evicted for a SNAT port). Not persisted: a restarted process
    /// learns it again from the next flood packet.
    pressure_until: Padded<AtomicU64>,
    /// `FlowState::next` on state codes: `[dir][flags_index(flags)][code]`, for `touch`.
    next_code: [[[u8; CODES_PAD]; 16]; 2],
    seeds: [u64; 6],
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

/// Idle timeouts per state code, in ticks.
fn timeout_ticks(t: &Timeouts) -> [u32; STATE_CODES] {
    let mut ticks = [0; STATE_CODES];
    for (code, v) in ticks.iter_mut().enumerate() {
        *v = ticks_of(t.for_state(FlowState::from_u8(code as u8)));
    }
    ticks
}

/// [`timeout_ticks`] with every embryonic state capped at `tcp_syn_pressure`.
fn pressure_ticks(t: &Timeouts) -> [u32; STATE_CODES] {
    let mut ticks = timeout_ticks(t);
    let cap = ticks_of(t.tcp_syn_pressure);
    for (code, v) in ticks.iter_mut().enumerate() {
        if FlowState::from_u8(code as u8).is_embryonic() {
            *v = (*v).min(cap);
        }
    }
    ticks
}

/// The hash function's keys from a seed.
fn seeds(seed: u64) -> [u64; 6] {
    let mut s = seed;
    std::array::from_fn(|_| splitmix(&mut s) | 1)
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

fn ticks_of(d: Duration) -> u32 {
    let ms = d.as_millis();
    ms.div_ceil(u128::from(TICK_MS)).min(u128::from(u32::MAX)) as u32
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
            if lay.total >= 1 << 30 {
                mem.advise_huge();
            }
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
                cold: Slab::boxed(
                    (0..cap)
                        .map(|_| Cold {
                            w: std::array::from_fn(|_| AtomicU64::new(0)),
                        })
                        .collect(),
                ),
                seq6: Slab::boxed(zeros(cap)),
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
                timeout_ticks: timeout_ticks(&config.timeouts),
                pressure_ticks: pressure_ticks(&config.timeouts),
                pressure_until: Padded(AtomicU64::new(0)),
                next_code: next_code_table(),
                seeds: seeds(config.hash_seed),
                epoch,
            };
            t.init_fresh(&lay, None);
            Ok(t)
        }
    }

    /// The index slot where `key`'s probe sequence starts (diagnostics, and the tests that
    /// show a random key defeats precomputed collisions).
    pub fn home_slot(&self, key: &FlowKey) -> usize {
        self.index.home(self.hash(key))
    }

    /// Index slots a probe sequence may span from its home slot.
    pub const PROBE_SLOTS: usize = index::MAX_PROBE;

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

    /// The timeouts given at `new`.
    pub fn timeouts(&self) -> &Timeouts {
        &self.timeouts
    }

    /// Memory of the entries, the index and the backend counts, divided by the capacity.
    pub fn bytes_per_flow(&self) -> f64 {
        let bytes = std::mem::size_of_val(&*self.entries)
            + std::mem::size_of_val(&*self.cold)
            + std::mem::size_of_val(&*self.seq6)
            + self.index.len() * 8
            + std::mem::size_of_val(&*self.backends)
            + std::mem::size_of::<Self>();
        bytes as f64 / self.entries.len() as f64
    }

    /// Counters and current size.
    pub fn stats(&self) -> FlowTableStats {
        let c = &self.counters.0;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FlowTableStats {
            capacity: self.capacity(),
            len: self.len(),
            inserted: r(&c.inserted),
            full: r(&c.full),
            exists: r(&c.exists),
            reply_in_use: r(&c.reply_in_use),
            index_full: r(&c.index_full),
            recycled: r(&c.recycled),
            expired: r(&c.expired),
            removed: r(&c.removed),
            gave_way: r(&c.gave_way),
            embryonic: self.embryonic(),
        }
    }

    /// Whether a [`FLAG_SLOW`] flow was ever in this table (inserted, imported or adopted by
    /// this process): [`lookup_v4`](Self::lookup_v4)'s misses need a second look then. One
    /// relaxed load.
    #[inline]
    pub fn has_slow_flows(&self) -> bool {
        self.slow_seen.load(Ordering::Relaxed) != 0
    }

    /// Notes a [`FLAG_SLOW`] flow.
    #[inline]
    fn saw_flags(&self, flags: u8) {
        if flags & FLAG_SLOW != 0 && self.slow_seen.load(Ordering::Relaxed) == 0 {
            self.slow_seen.store(1, Ordering::Relaxed);
        }
    }

    /// Live embryonic TCP flows now (SYN sent or received, handshake not complete): what a
    /// SYN flood fills the table with. One relaxed load.
    #[inline]
    pub fn embryonic(&self) -> u64 {
        (self.counters.0.embryonic.load(Ordering::Relaxed) as i64).max(0) as u64
    }

    #[inline]
    fn ticks(&self, now: Instant) -> u32 {
        let d = now.saturating_duration_since(self.epoch);
        let t = d.as_secs() * (1000 / TICK_MS) + u64::from(d.subsec_millis()) / TICK_MS;
        t.min(u64::from(u32::MAX)) as u32
    }

    fn instant(&self, ticks: u32) -> Instant {
        self.epoch + Duration::from_millis(u64::from(ticks) * TICK_MS)
    }

    #[inline]
    fn hash(&self, k: &FlowKey) -> u64 {
        let s = &self.seeds;
        if !k.v6 {
            let addrs = u64::from(k.src as u32) | u64::from(k.dst as u32) << 32;
            return self.hash_v4(addrs, k.misc());
        }
        let a = fold_mul(k.src as u64 ^ s[0], (k.src >> 64) as u64 ^ s[1]);
        let b = fold_mul(k.dst as u64 ^ s[2], (k.dst >> 64) as u64 ^ s[3]);
        index::live_tag(fold_mul(a ^ b.rotate_left(29) ^ s[4], k.misc() ^ s[5]))
    }

    /// The hash of an IPv4 key from its packed addresses (`src | dst << 32`) and
    /// [`FlowKey::misc`]: both addresses fit one word, so two multiplies instead of three.
    #[inline(always)]
    fn hash_v4(&self, addrs: u64, misc: u64) -> u64 {
        let s = &self.seeds;
        index::live_tag(fold_mul(fold_mul(addrs ^ s[0], misc ^ s[1]) ^ s[2], s[3]))
    }

    #[inline(always)]
    fn word(&self, e: u32, w: usize) -> u64 {
        if w < W_COLD {
            self.entries[e as usize].w[w].load(Ordering::Relaxed)
        } else {
            self.cold[e as usize].w[w - W_COLD].load(Ordering::Relaxed)
        }
    }

    #[inline(always)]
    fn set_word(&self, e: u32, w: usize, v: u64) {
        if w < W_COLD {
            self.entries[e as usize].w[w].store(v, Ordering::Relaxed)
        } else {
            self.cold[e as usize].w[w - W_COLD].store(v, Ordering::Relaxed)
        }
    }

    /// Address `slot` (`A_*`) of entry `e`, as the key stores it (IPv4 v4-mapped).
    #[inline(always)]
    fn addr(&self, e: u32, slot: usize, v6: bool) -> u128 {
        if v6 {
            let w = W_ADDR + 2 * slot;
            u128::from(self.word(e, w)) | u128::from(self.word(e, w + 1)) << 64
        } else {
            let w = self.word(e, W_ADDR + slot / 2);
            crate::key::V4_MAPPED | u128::from((w >> (32 * (slot % 2))) as u32)
        }
    }

    /// Whether entry `e`'s addresses for the pair (`slot`, `slot + 1`) are `src`, `dst`.
    #[inline(always)]
    fn addrs_match(&self, e: u32, slot: usize, key: &FlowKey) -> bool {
        if key.v6 {
            self.addr(e, slot, true) == key.src && self.addr(e, slot + 1, true) == key.dst
        } else {
            // Both IPv4 addresses of the pair share one word.
            self.word(e, W_ADDR + slot / 2)
                == u64::from(key.src as u32) | u64::from(key.dst as u32) << 32
        }
    }

    /// Compare `key` with entry `e`'s tuple for direction `reply`, validated against recycling.
    /// Returns the entry's generation on a match.
    #[inline]
    fn matches(&self, e: u32, reply: bool, key: &FlowKey) -> Option<u64> {
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) {
            return None;
        }
        let meta = self.word(e, W_META);
        let ports = self.word(e, W_PORTS);
        let (slot, ports) = if reply {
            (A_BACKEND, ports >> 32)
        } else {
            (A_CLIENT, ports)
        };
        let misc = key.misc();
        let hit = (meta >> 32) & 0xffff == misc >> 32
            && ports as u32 == misc as u32
            && self.addrs_match(e, slot, key);
        fence(Ordering::Acquire);
        let c2 = entry.w[W_CTL].load(Ordering::Relaxed);
        (hit && ctl_readable(c2) && ctl_gen(c2) == ctl_gen(c1)).then_some(ctl_gen(c1))
    }

    /// Find the flow `key` belongs to and the direction it matched. Wait-free: at most
    /// `MAX_PROBE` index words and one entry comparison per tag match.
    #[inline]
    pub fn lookup(&self, key: &FlowKey) -> Option<(FlowHandle, Direction)> {
        self.lookup_hashed(key, self.hash(key))
    }

    /// [`lookup`](Self::lookup) for many keys, with the memory accesses of the whole batch
    /// overlapped: first every key's index slot is prefetched, then every candidate entry,
    /// then the lookups run (on warm lines). `out[i]` is the answer for `keys[i]`; `out` must
    /// be at least as long as `keys`. Same results as calling `lookup` per key.
    pub fn lookup_batch(&self, keys: &[FlowKey], out: &mut [Option<(FlowHandle, Direction)>]) {
        const CHUNK: usize = 16;
        assert!(
            out.len() >= keys.len(),
            "lookup_batch: out shorter than keys"
        );
        for (keys, out) in keys.chunks(CHUNK).zip(out.chunks_mut(CHUNK)) {
            let mut hashes = [0u64; CHUNK];
            for (h, k) in hashes.iter_mut().zip(keys) {
                *h = self.hash(k);
                self.index.prefetch(*h);
            }
            for &h in &hashes[..keys.len()] {
                self.prefetch_entry_word(self.index.home_word(h));
            }
            for ((o, k), &h) in out.iter_mut().zip(keys).zip(&hashes) {
                *o = self.lookup_hashed(k, h);
            }
        }
    }

    /// Prefetch the entry an index word points to, if it is a live word.
    #[inline]
    fn prefetch_entry_word(&self, w: u64) {
        if w != index::EMPTY && w != index::TOMB && w != index::FROZEN {
            let (e, _) = index::word_entry(w);
            if let Some(entry) = self.entries.get(e as usize) {
                crate::sync::prefetch(entry);
            }
        }
    }

    #[inline]
    fn lookup_hashed(&self, key: &FlowKey, h: u64) -> Option<(FlowHandle, Direction)> {
        self.index.probe(h, |w| {
            let (e, reply) = index::word_entry(w);
            let g = self.matches(e, reply, key)?;
            let dir = if reply {
                Direction::Reply
            } else {
                Direction::Original
            };
            Some((FlowHandle::new(e, g), dir))
        })
    }

    /// The per-packet lookup: finds `key`'s flow and returns only what a packet of it needs
    /// (handle, direction, the translated endpoints, the state word for [`touch`](Self::touch)),
    /// read from the entry's hot line in the same validated pass as the key comparison. No
    /// `FlowData`/`SocketAddr` is built. Wait-free like [`lookup`](Self::lookup).
    #[inline]
    pub fn lookup_hit(&self, key: &FlowKey) -> Option<FlowHit> {
        let h = self.hash(key);
        self.index.probe(h, |w| {
            let (e, reply) = index::word_entry(w);
            self.hit(e, reply, key)
        })
    }

    /// `key` with its hash in this table, for [`prefetch_index`](Self::prefetch_index),
    /// [`prefetch_entry`](Self::prefetch_entry) and
    /// [`lookup_hit_hashed`](Self::lookup_hit_hashed): a receive batch hashes every key first,
    /// prefetches, then looks up. (A `HashedKey` of another table only gives wrong misses.)
    #[inline(always)]
    pub fn hashed(&self, key: FlowKey) -> HashedKey {
        HashedKey {
            hash: self.hash(&key),
            key,
        }
    }

    /// Asks the CPU for `k`'s home index slot (a hint: no effect on results).
    #[inline]
    pub fn prefetch_index(&self, k: &HashedKey) {
        self.index.prefetch(k.hash);
    }

    /// Asks the CPU for the entry `k`'s home index slot points to; call it some time after
    /// [`prefetch_index`](Self::prefetch_index) so the slot is there. A hint only.
    #[inline]
    pub fn prefetch_entry(&self, k: &HashedKey) {
        self.prefetch_entry_word(self.index.home_word(k.hash));
    }

    /// [`lookup_hit`](Self::lookup_hit) with the hash computed by [`hashed`](Self::hashed).
    #[inline(always)]
    pub fn lookup_hit_hashed(&self, k: &HashedKey) -> Option<FlowHit> {
        // `Index::probe` spelled out: with a closure the compiler keeps `hit` out of line.
        for slot in self.index.window(k.hash) {
            let w = slot.load(Ordering::Acquire);
            if w == index::EMPTY || w == index::FROZEN {
                return None;
            }
            if w != index::TOMB && index::tag_matches(w, k.hash) {
                let (e, reply) = index::word_entry(w);
                if let Some(h) = self.hit(e, reply, &k.key) {
                    return Some(h);
                }
            }
        }
        None
    }

    /// [`matches`](Self::matches), reading the outgoing endpoints too.
    #[inline(always)]
    fn hit(&self, e: u32, reply: bool, key: &FlowKey) -> Option<FlowHit> {
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) {
            return None;
        }
        let meta = self.word(e, W_META);
        let ports = self.word(e, W_PORTS);
        let ids = self.word(e, W_IDS);
        let (slot, key_ports) = if reply {
            (A_BACKEND, ports >> 32)
        } else {
            (A_CLIENT, ports)
        };
        let misc = key.misc();
        if !((meta >> 32) & 0xffff == misc >> 32
            && key_ports as u32 == misc as u32
            && self.addrs_match(e, slot, key))
        {
            return None;
        }
        // Original: leaves as snat -> backend; reply: as vip -> client.
        let (src, dst, src_port, dst_port) = if reply {
            let (s, d) = if key.v6 {
                (self.addr(e, A_VIP, true), self.addr(e, A_CLIENT, true))
            } else {
                v4_halves(self.word(e, W_ADDR))
            };
            (s, d, (ports >> 16) as u16, ports as u16)
        } else {
            let (s, d) = if key.v6 {
                (self.addr(e, A_SNAT, true), self.addr(e, A_BACKEND, true))
            } else {
                v4_halves(self.word(e, W_ADDR + 1))
            };
            (s, d, (ports >> 48) as u16, (ports >> 32) as u16)
        };
        fence(Ordering::Acquire);
        let c2 = entry.w[W_CTL].load(Ordering::Relaxed);
        if !(ctl_readable(c2) && ctl_gen(c2) == ctl_gen(c1)) {
            return None;
        }
        Some(FlowHit {
            handle: FlowHandle::new(e, ctl_gen(c1)),
            dir: if reply {
                Direction::Reply
            } else {
                Direction::Original
            },
            src,
            dst,
            src_port,
            dst_port,
            v6: key.v6,
            flags: (meta >> 48) as u8,
            ctl: c2,
            backend: (ids >> 32) as u32,
        })
    }

    /// `now` in the table's compact time unit, for [`touch`](Self::touch). A worker computes
    /// it once per batch.
    #[inline]
    pub fn tick(&self, now: Instant) -> Tick {
        Tick(self.ticks(now))
    }

    /// [`on_packet`](Self::on_packet) for a flow just found by [`lookup_hit`](Self::lookup_hit):
    /// starts from the state word the lookup read, so a packet that changes neither the state
    /// nor the 100 ms tick costs no memory access at all. Same result as `on_packet` at the
    /// time of the lookup (call it right after: a hit held across batches may be stale, and
    /// then only a packet that needs a write notices, by returning `None`).
    #[inline]
    pub fn touch(&self, hit: &FlowHit, tcp_flags: TcpFlags, now: Tick) -> Option<FlowState> {
        let reply = hit.dir == Direction::Reply;
        self.touch_ctl(
            hit.handle.entry(),
            reply,
            hit.backend,
            hit.ctl,
            tcp_flags,
            now,
        )
    }

    /// The no-write case of `touch` inline; `c` is the validated state word of a hit.
    #[inline(always)]
    fn touch_ctl(
        &self,
        e: u32,
        reply: bool,
        backend: u32,
        c: u64,
        tcp_flags: TcpFlags,
        now: Tick,
    ) -> Option<FlowState> {
        let old = ctl_state(c);
        // The common packet first: an ACK without SYN, FIN or RST on an established
        // connection keeps it established (a test checks the table agrees).
        if tcp_flags.0 & 0x17 == 0x10 && old == EST_CODE && ctl_ls(c) >= now.0 {
            return Some(FlowState::Tcp(TcpState::Established));
        }
        // Codes are < STATE_CODES <= CODES_PAD; the mask only spares a bounds check.
        let new = self.next_code[usize::from(reply)][flags_index(tcp_flags.0)]
            [usize::from(old) & (CODES_PAD - 1)];
        // A hit's word is readable and of the hit's generation: nothing to check for a
        // packet that changes neither the state nor the time tick.
        if new == old && ctl_ls(c) >= now.0 {
            return Some(FlowState::from_u8(old));
        }
        self.touch_write(e, reply, backend, c, tcp_flags, now)
    }

    /// The rest of `touch`: a CAS loop from the hit's state word.
    #[inline(never)]
    fn touch_write(
        &self,
        e: u32,
        reply: bool,
        backend: u32,
        mut c: u64,
        tcp_flags: TcpFlags,
        now: Tick,
    ) -> Option<FlowState> {
        let next = &self.next_code[usize::from(reply)][flags_index(tcp_flags.0)];
        let gen_ = ctl_gen(c);
        loop {
            if !ctl_readable(c) || ctl_gen(c) != gen_ {
                return None;
            }
            let old = ctl_state(c);
            let new = next[usize::from(old) & (CODES_PAD - 1)];
            let ls = ctl_ls(c).max(now.0);
            if new == old && ls == ctl_ls(c) {
                return Some(FlowState::from_u8(old));
            }
            let entry = self.entries.get(e as usize)?;
            let nc = ctl(ctl_gen(c), ctl_status(c), new, ls);
            match entry.w[W_CTL].compare_exchange_weak(c, nc, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    #[cfg(not(loom))]
                    if new != old {
                        crate::log::changed(FlowHandle::new(e, gen_));
                    }
                    let (old, new) = (FlowState::from_u8(old), FlowState::from_u8(new));
                    self.recount(backend, old, new);
                    return Some(new);
                }
                Err(a) => c = a,
            }
        }
    }

    /// Flow `h`'s state code now ([`FlowState::to_u8`]); `None` when the handle is stale.
    /// With a hit's [`state_code`](FlowHit::state_code), whether a packet changed it.
    #[inline]
    pub fn state_code(&self, h: FlowHandle) -> Option<u8> {
        let c = self.entries.get(h.entry() as usize)?.w[W_CTL].load(Ordering::Acquire);
        (ctl_readable(c) && ctl_gen(c) == h.gen_()).then(|| ctl_state(c))
    }

    /// Sets flow `h`'s state to `state` and its last-seen time to `last_seen` when that is
    /// later than the flow's (a peer's copy of a flow it serves, see the slowpath's flow
    /// sync); the per-backend counts follow the state. Returns the state set, or `None`
    /// when the handle is stale or `state` is of another protocol. Not for the packet path.
    pub fn update(&self, h: FlowHandle, state: FlowState, last_seen: Instant) -> Option<FlowState> {
        let e = h.entry();
        let entry = self.entries.get(e as usize)?;
        let data = self.read_data(e)?;
        if !state_fits(state, data.proto) {
            return None;
        }
        let t = self.ticks(last_seen);
        let new = state.to_u8();
        let mut c = entry.w[W_CTL].load(Ordering::Acquire);
        loop {
            if !ctl_readable(c) || ctl_gen(c) != h.gen_() {
                return None;
            }
            let old = ctl_state(c);
            let ls = ctl_ls(c).max(t);
            if new == old && ls == ctl_ls(c) {
                return Some(state);
            }
            let nc = ctl(ctl_gen(c), ctl_status(c), new, ls);
            match entry.w[W_CTL].compare_exchange_weak(c, nc, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.recount(data.backend_id.0, FlowState::from_u8(old), state);
                    return Some(state);
                }
                Err(a) => c = a,
            }
        }
    }

    /// [`FlowState::initial`]'s code, from the `next_code` table: the first packet's
    /// transition from the protocol's starting state.
    #[inline]
    fn initial_code(&self, proto: Protocol, tcp_flags: TcpFlags) -> u8 {
        let start = match proto {
            Protocol::Tcp => TcpState::None as u8,
            Protocol::Udp => FlowState::Udp.to_u8(),
            Protocol::Icmp | Protocol::Icmpv6 => FlowState::Icmp.to_u8(),
            Protocol::Sctp => FlowState::Sctp(crate::state::SctpState::Established).to_u8(),
        };
        self.next_code[0][flags_index(tcp_flags.0)][usize::from(start) & (CODES_PAD - 1)]
    }

    /// [`lookup`](Self::lookup) and [`get`](Self::get) in one call.
    pub fn lookup_view(&self, key: &FlowKey) -> Option<(FlowView, Direction)> {
        // A flow removed between the two steps is reported as absent, as if removed before.
        let (h, dir) = self.lookup(key)?;
        Some((self.get(h)?, dir))
    }

    /// Copy a flow out; `None` if the handle is stale (flow removed or slot recycled).
    pub fn get(&self, h: FlowHandle) -> Option<FlowView> {
        let e = h.entry();
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) || ctl_gen(c1) != h.gen_() {
            return None;
        }
        let data = self.read_data(e);
        let seq = data.and_then(|d| self.seq_slot(e, d.client.is_ipv6()));
        let seq = seq.map_or(0, |s| s.load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        let c2 = entry.w[W_CTL].load(Ordering::Relaxed);
        if !ctl_readable(c2) || ctl_gen(c2) != h.gen_() {
            return None;
        }
        let data = data?;
        Some(FlowView {
            handle: h,
            data,
            state: FlowState::from_u8(ctl_state(c2)),
            last_seen: self.instant(ctl_ls(c2)),
            seq: if seq >> SEQ_BITS == Self::seq_gen(h) {
                seq & SEQ_MASK
            } else {
                0
            },
        })
    }

    /// Where entry `e`'s sequence word is.
    #[inline]
    fn seq_slot(&self, e: u32, v6: bool) -> Option<&AtomicU64> {
        if v6 {
            self.seq6.get(e as usize)
        } else {
            self.entries.get(e as usize).map(|x| &x.w[W_V4_SEQ])
        }
    }

    /// The generation bits a sequence word of flow `h` carries.
    #[inline]
    fn seq_gen(h: FlowHandle) -> u64 {
        h.gen_() & ((1 << (64 - SEQ_BITS)) - 1)
    }

    /// Flow `h`'s sequence word (`SEQ_BITS` bits): a word per flow that its owner (the
    /// pipeline's SYN proxy: the handshake's state, then the sequence-number delta) sets
    /// after the insert with [`set_seq`](Self::set_seq) and changes with
    /// [`update_seq`](Self::update_seq). `None` when the handle is stale or no word was
    /// stored for this flow. Lock-free; one more load than the lookup for an IPv4 flow (the
    /// word is in its hot line), one more line for an IPv6 flow.
    #[inline]
    pub fn seq(&self, h: FlowHandle) -> Option<u64> {
        let e = h.entry();
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) || ctl_gen(c1) != h.gen_() {
            return None;
        }
        let v6 = (self.word(e, W_META) >> 40) & 1 == 1;
        let w = self.seq_slot(e, v6)?.load(Ordering::Acquire);
        fence(Ordering::Acquire);
        let c2 = entry.w[W_CTL].load(Ordering::Relaxed);
        if !ctl_readable(c2) || ctl_gen(c2) != h.gen_() || w >> SEQ_BITS != Self::seq_gen(h) {
            return None;
        }
        Some(w & SEQ_MASK)
    }

    /// Stores flow `h`'s sequence word (the low `SEQ_BITS` bits of `v`); `false` when the
    /// handle is stale. For the flow's inserter, before anyone else may read the word.
    pub fn set_seq(&self, h: FlowHandle, v: u64) -> bool {
        let e = h.entry();
        let Some(entry) = self.entries.get(e as usize) else {
            return false;
        };
        let c = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c) || ctl_gen(c) != h.gen_() {
            return false;
        }
        let v6 = (self.word(e, W_META) >> 40) & 1 == 1;
        let Some(slot) = self.seq_slot(e, v6) else {
            return false;
        };
        slot.store(seq_stamp(Self::seq_gen(h), v), Ordering::Release);
        true
    }

    /// Replaces flow `h`'s sequence word `old` by `new` (compare-and-swap: a word that is
    /// not `old`, of another flow of the entry included, stays); whether it did.
    pub fn update_seq(&self, h: FlowHandle, old: u64, new: u64) -> bool {
        let e = h.entry();
        let Some(v6) = self
            .entries
            .get(e as usize)
            .map(|_| (self.word(e, W_META) >> 40) & 1 == 1)
        else {
            return false;
        };
        let Some(slot) = self.seq_slot(e, v6) else {
            return false;
        };
        let g = Self::seq_gen(h);
        slot.compare_exchange(
            seq_stamp(g, old),
            seq_stamp(g, new),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    }

    /// Decode entry `e`'s data (possibly torn if racing a recycler: callers validate after).
    fn read_data(&self, e: u32) -> Option<FlowData> {
        let meta = self.word(e, W_META);
        let ports = self.word(e, W_PORTS);
        let ids = self.word(e, W_IDS);
        let v6 = (meta >> 40) & 1 == 1;
        let sa = |a: usize, p: u64| SocketAddr::new(bits_addr(self.addr(e, a, v6), v6), p as u16);
        Some(FlowData {
            proto: Protocol::from_ip_proto((meta >> 32) as u8)?,
            client: sa(A_CLIENT, ports),
            vip: sa(A_VIP, ports >> 16),
            backend: sa(A_BACKEND, ports >> 32),
            snat: sa(A_SNAT, ports >> 48),
            service_id: ids as u32,
            backend_id: BackendId((ids >> 32) as u32),
            snapshot_gen: meta as u32,
            flags: (meta >> 48) as u8,
        })
    }

    fn count(&self, backend: u32, state: FlowState, delta: i32) {
        if state.is_embryonic() {
            self.counters
                .0
                .embryonic
                .fetch_add(delta as i64 as u64, Ordering::Relaxed);
        }
        let Some(b) = self.backends.get(backend as usize) else {
            return;
        };
        let one = if state.is_active() { ACTIVE_ONE } else { 1 };
        b.0.fetch_add(one.wrapping_mul(delta as i64 as u64), Ordering::Relaxed);
    }

    /// A flow of `backend` moved from `old` to `new`: one `fetch_add` when the active /
    /// inactive side changes, nothing otherwise.
    #[inline]
    fn recount(&self, backend: u32, old: FlowState, new: FlowState) {
        if old.is_embryonic() != new.is_embryonic() {
            let d: i64 = if new.is_embryonic() { 1 } else { -1 };
            self.counters
                .0
                .embryonic
                .fetch_add(d as u64, Ordering::Relaxed);
        }
        if old.is_active() == new.is_active() {
            return;
        }
        let Some(b) = self.backends.get(backend as usize) else {
            return;
        };
        // inactive -> active: +2^32 - 1; active -> inactive: -(2^32 - 1).
        let d = ACTIVE_ONE - 1;
        let d = if new.is_active() { d } else { d.wrapping_neg() };
        b.0.fetch_add(d, Ordering::Relaxed);
    }

    /// Insert a new flow in the state its first packet (`tcp_flags`, original direction) gives,
    /// indexed by both tuples. Embryonic or expired flows recycled to make room are dropped
    /// silently (see [`insert_with`](Self::insert_with)).
    pub fn insert(
        &self,
        data: &FlowData,
        tcp_flags: TcpFlags,
        now: Instant,
    ) -> Result<FlowHandle, InsertError> {
        self.insert_with(data, tcp_flags, now, |_| {})
    }

    /// [`insert`](Self::insert), passing any flow recycled to make room to `on_evict` (so its
    /// SNAT port can be released).
    pub fn insert_with(
        &self,
        data: &FlowData,
        tcp_flags: TcpFlags,
        now: Instant,
        on_evict: impl FnMut(ExpiredFlow),
    ) -> Result<FlowHandle, InsertError> {
        self.insert_ticks(data, tcp_flags, self.ticks(now), on_evict)
    }

    /// [`insert`](Self::insert) at a time from [`tick`](Self::tick) (a worker computes it
    /// once per batch).
    pub fn insert_at(
        &self,
        data: &FlowData,
        tcp_flags: TcpFlags,
        now: Tick,
    ) -> Result<FlowHandle, InsertError> {
        self.insert_ticks(data, tcp_flags, now.0, |_| {})
    }

    fn insert_ticks(
        &self,
        data: &FlowData,
        tcp_flags: TcpFlags,
        t: u32,
        on_evict: impl FnMut(ExpiredFlow),
    ) -> Result<FlowHandle, InsertError> {
        self.insert_state(data, FlowState::initial(data.proto, tcp_flags), t, on_evict)
    }

    /// Insert a flow that already has a life: in `state`, last seen `last_seen` (a flow read
    /// back from an export, another table, or a peer). Like [`insert`](Self::insert) in every
    /// other way, including [`InsertError::Exists`] for a tuple that is already here.
    pub fn restore(
        &self,
        data: &FlowData,
        state: FlowState,
        last_seen: Instant,
    ) -> Result<FlowHandle, InsertError> {
        if !state_fits(state, data.proto) {
            return Err(InsertError::Invalid("state of another protocol"));
        }
        self.insert_state(data, state, self.ticks(last_seen), |_| {})
    }

    /// [`restore`](Self::restore), then the flow's sequence word ([`seq`](Self::seq); 0:
    /// none) stored (imports run before any worker reads the table).
    pub fn restore_seq(
        &self,
        data: &FlowData,
        state: FlowState,
        last_seen: Instant,
        seq: u64,
    ) -> Result<FlowHandle, InsertError> {
        let h = self.restore(data, state, last_seen)?;
        if seq != 0 {
            self.set_seq(h, seq);
        }
        Ok(h)
    }

    fn insert_state(
        &self,
        data: &FlowData,
        state: FlowState,
        t: u32,
        on_evict: impl FnMut(ExpiredFlow),
    ) -> Result<FlowHandle, InsertError> {
        if !data.same_family() {
            return Err(InsertError::Invalid("addresses of different families"));
        }
        if data.backend_id.0 as usize >= self.backends.len() {
            return Err(InsertError::Invalid("backend id >= backends_max"));
        }
        let okey = data.original_key();
        let rkey = data.reply_key();
        if okey == rkey {
            return Err(InsertError::Invalid("original and reply tuples are equal"));
        }
        let oh = self.hash(&okey);
        // Common race loser fast path, and no slot churn for retransmitted SYNs.
        if let Some((h, Direction::Original)) = self.lookup(&okey) {
            self.counters.0.exists.fetch_add(1, Ordering::Relaxed);
            return Err(InsertError::Exists(h));
        }
        let rh = self.hash(&rkey);
        let Some(e) = self.alloc(oh, t, on_evict) else {
            self.counters.0.full.fetch_add(1, Ordering::Relaxed);
            return Err(InsertError::Full);
        };
        let gen_ = self.write_entry(e, data, state, t);
        self.publish(
            e,
            gen_,
            data.backend_id.0,
            state,
            (oh, |w| self.same_key(w, &okey)),
            (rh, |w| self.same_key(w, &rkey)),
        )
    }

    /// The rest of an insert once entry `e` (generation `gen_`) is written and INSERTING:
    /// [`publish_original`](Self::publish_original) then
    /// [`publish_reply`](Self::publish_reply).
    #[inline(always)]
    fn publish(
        &self,
        e: u32,
        gen_: u64,
        backend: u32,
        state: FlowState,
        original: (u64, impl Fn(u64) -> bool),
        reply: (u64, impl Fn(u64) -> bool),
    ) -> Result<FlowHandle, InsertError> {
        let oh = original.0;
        self.publish_original(e, backend, state, original)?;
        self.publish_reply(e, gen_, backend, oh, reply)
    }

    /// First half of publishing entry `e`: count it and index its original tuple (its hash
    /// and a same-key test for [`Index::insert`]). On a conflict the entry is torn down. The
    /// entry stays INSERTING: readable by lookups of the original tuple, removable by no one,
    /// until [`publish_reply`](Self::publish_reply).
    #[inline(always)]
    fn publish_original(
        &self,
        e: u32,
        backend: u32,
        state: FlowState,
        (oh, same_original): (u64, impl Fn(u64) -> bool),
    ) -> Result<(), InsertError> {
        self.count(backend, state, 1);
        match self
            .index
            .insert(oh, index::make_word(oh, false, e), same_original)
        {
            Claim::Done => Ok(()),
            claim => Err(self.tear_down(e, backend, claim, false)),
        }
    }

    /// Second half: index the reply tuple and make the entry LIVE; on a conflict withdraw the
    /// original tuple's word (hash `oh`) and tear the entry down.
    #[inline(always)]
    fn publish_reply(
        &self,
        e: u32,
        gen_: u64,
        backend: u32,
        oh: u64,
        (rh, same_reply): (u64, impl Fn(u64) -> bool),
    ) -> Result<FlowHandle, InsertError> {
        match self
            .index
            .insert(rh, index::make_word(rh, true, e), same_reply)
        {
            Claim::Done => {
                // Counted before the entry is LIVE (removable): its departure is counted after.
                self.counters.0.inserted.fetch_add(1, Ordering::Relaxed);
                // INSERTING -> LIVE. Only `on_packet`/`touch` write an INSERTING control word
                // besides us, and never its status bits: one atomic XOR flips 01 to 10.
                self.entries[e as usize].w[W_CTL]
                    .fetch_xor((ST_INSERTING ^ ST_LIVE) << 40, Ordering::Release);
                Ok(FlowHandle::new(e, gen_))
            }
            claim => {
                self.index.remove(oh, index::make_word(oh, false, e));
                Err(self.tear_down(e, backend, claim, true))
            }
        }
    }

    /// Free our never-fully-published entry `e` (nobody else may remove it) after `claim`
    /// failed for its original or (`reply`) reply tuple; the error to report.
    #[cold]
    fn tear_down(&self, e: u32, backend: u32, claim: Claim, reply: bool) -> InsertError {
        let entry = &self.entries[e as usize];
        let c = entry.w[W_CTL].fetch_or(ST_DYING << 40, Ordering::AcqRel);
        self.count(backend, FlowState::from_u8(ctl_state(c)), -1);
        self.release(e, ctl_gen(c));
        match claim {
            Claim::Conflict(oe, od) => {
                let g = ctl_gen(self.entries[oe as usize].w[W_CTL].load(Ordering::Relaxed));
                let h = FlowHandle::new(oe, g);
                debug_assert_eq!(od, reply);
                if reply {
                    self.counters.0.reply_in_use.fetch_add(1, Ordering::Relaxed);
                    InsertError::ReplyInUse(h)
                } else {
                    self.counters.0.exists.fetch_add(1, Ordering::Relaxed);
                    InsertError::Exists(h)
                }
            }
            _ => {
                self.counters.0.index_full.fetch_add(1, Ordering::Relaxed);
                InsertError::IndexFull
            }
        }
    }

    fn same_key(&self, w: u64, key: &FlowKey) -> bool {
        let (e, reply) = index::word_entry(w);
        self.matches(e, reply, key).is_some()
    }

    /// Write a popped (exclusively owned, FREE) entry and make it INSERTING. Returns its gen.
    fn write_entry(&self, e: u32, d: &FlowData, state: FlowState, t: u32) -> u64 {
        self.saw_flags(d.flags);
        let entry = &self.entries[e as usize];
        let old = entry.w[W_CTL].load(Ordering::Relaxed);
        let gen_ = (ctl_gen(old) + 1) & GEN_MASK;
        // Pairs with readers' acquire fence: a reader that sees any of the stores below also
        // sees the FREE/DYING control word stored before, so its validation fails.
        fence(Ordering::Release);
        let set = |w: usize, v: u64| self.set_word(e, w, v);
        let v6 = d.client.is_ipv6();
        let bits = [d.client, d.vip, d.backend, d.snat].map(|sa| crate::key::addr_bits(sa.ip()).0);
        if v6 {
            for (slot, b) in bits.iter().enumerate() {
                set(W_ADDR + 2 * slot, *b as u64);
                set(W_ADDR + 2 * slot + 1, (*b >> 64) as u64);
            }
        } else {
            let pair = |a: u128, b: u128| u64::from(a as u32) | u64::from(b as u32) << 32;
            let (cv, bs) = (
                pair(bits[A_CLIENT], bits[A_VIP]),
                pair(bits[A_BACKEND], bits[A_SNAT]),
            );
            set(W_ADDR, cv);
            set(W_ADDR + 1, bs);
            // Both directions' checksum adjustments (the word an IPv6 VIP would use).
            let ports =
                |a: SocketAddr, b: SocketAddr| u32::from(a.port()) | u32::from(b.port()) << 16;
            let (p_cv, p_bs) = (ports(d.client, d.vip), ports(d.backend, d.snat));
            let original = v4_csum_delta((cv, p_cv), (bs.rotate_left(32), p_bs.rotate_left(16)));
            let reply = v4_csum_delta((bs, p_bs), (cv.rotate_left(32), p_cv.rotate_left(16)));
            set(W_V4_CSUM, u64::from(original) | u64::from(reply) << 32);
        }
        set(
            W_PORTS,
            u64::from(d.client.port())
                | u64::from(d.vip.port()) << 16
                | u64::from(d.backend.port()) << 32
                | u64::from(d.snat.port()) << 48,
        );
        set(
            W_IDS,
            u64::from(d.service_id) | u64::from(d.backend_id.0) << 32,
        );
        set(
            W_META,
            u64::from(d.snapshot_gen)
                | u64::from(d.proto as u8) << 32
                | u64::from(v6) << 40
                | u64::from(d.flags) << 48,
        );
        entry.w[W_CTL].store(ctl(gen_, ST_INSERTING, state.to_u8(), t), Ordering::Release);
        gen_
    }

    /// Pop a free entry, or recycle an embryonic/expired one near `hash`.
    fn alloc(&self, hash: u64, now_t: u32, mut on_evict: impl FnMut(ExpiredFlow)) -> Option<u32> {
        if let Some(e) = self.pop_free() {
            return Some(e);
        }
        let cap = self.entries.len();
        // Low hash bits: independent of the index home (top bits), so recycled flows do not
        // all land in one index region.
        let start = (((hash & 0xffff_ffff) * cap as u64) >> 32) as usize;
        for i in 0..VICTIM_PROBE.min(cap) {
            let e = ((start + i) % cap) as u32;
            let c = self.entries[e as usize].w[W_CTL].load(Ordering::Acquire);
            if ctl_status(c) != ST_LIVE {
                continue;
            }
            let state = FlowState::from_u8(ctl_state(c));
            if !state.is_embryonic() && !self.expired(c, now_t) {
                continue;
            }
            let victim = |c: u64| {
                let s = FlowState::from_u8(ctl_state(c));
                s.is_embryonic() || self.expired(c, now_t)
            };
            if let Some(f) = self.take(e, ctl_gen(c), victim, false) {
                self.counters.0.recycled.fetch_add(1, Ordering::Relaxed);
                self.note_pressure(now_t);
                on_evict(f);
                return Some(e);
            }
        }
        // A sweep may have freed something meanwhile.
        self.pop_free()
    }

    fn pop_free(&self) -> Option<u32> {
        let mut head = self.free.0.load(Ordering::Acquire);
        loop {
            let idx = head as u32;
            if idx == 0 {
                return None;
            }
            let e = idx - 1;
            let next = self.entries[e as usize].w[W_IDS].load(Ordering::Relaxed) as u32;
            let new = ((head >> 32) + 1) << 32 | u64::from(next);
            match self
                .free
                .0
                .compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // The next insert takes the new head: start fetching its line now (a
                    // hint; on a shuffled free list it would be a cache miss later).
                    if let Some(n) = (next as usize)
                        .checked_sub(1)
                        .and_then(|n| self.entries.get(n))
                    {
                        crate::sync::prefetch(n);
                    }
                    return Some(e);
                }
                Err(h) => head = h,
            }
        }
    }

    fn push_free(&self, e: u32) {
        let link = &self.entries[e as usize].w[W_IDS];
        let mut head = self.free.0.load(Ordering::Relaxed);
        loop {
            link.store(head & 0xffff_ffff, Ordering::Relaxed);
            let new = ((head >> 32) + 1) << 32 | (u64::from(e) + 1);
            match self
                .free
                .0
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    #[inline]
    fn expired(&self, c: u64, now_t: u32) -> bool {
        Self::expired_by(&self.timeout_ticks, c, now_t)
    }

    #[inline]
    fn expired_by(limits: &[u32; STATE_CODES], c: u64, now_t: u32) -> bool {
        let idle = now_t.saturating_sub(ctl_ls(c));
        idle >= limits[usize::from(ctl_state(c)).min(STATE_CODES - 1)]
    }

    /// Whether the table is under pressure at tick `now_t`: nearly full (7/8), or embryonic
    /// flows gave way within the last [`PRESSURE_HOLD_TICKS`].
    fn pressure_at(&self, now_t: u32) -> bool {
        u64::from(now_t) < self.pressure_until.0.load(Ordering::Relaxed)
            || self.len() * 8 >= self.entries.len() * 7
    }

    /// Whether the table is under pressure now: embryonic TCP flows then expire after
    /// `tcp_syn_pressure` instead of their usual timeouts.
    pub fn under_pressure(&self, now: Instant) -> bool {
        self.pressure_at(self.ticks(now))
    }

    /// Records that embryonic flows had to give way at tick `now_t` (the pressure lasts
    /// [`PRESSURE_HOLD_TICKS`] from the last such event).
    fn note_pressure(&self, now_t: u32) {
        let until = u64::from(now_t) + PRESSURE_HOLD_TICKS;
        if self.pressure_until.0.load(Ordering::Relaxed) < until {
            self.pressure_until.0.store(until, Ordering::Relaxed);
        }
    }

    /// How long live flow `h` has been idle at `now`, in ticks, if it is an embryonic TCP flow
    /// (its handshake has not completed); `None` otherwise (or if `h` is stale).
    pub fn embryonic_idle(&self, h: FlowHandle, now: Tick) -> Option<u32> {
        let entry = self.entries.get(h.entry() as usize)?;
        let c = entry.w[W_CTL].load(Ordering::Acquire);
        (ctl_status(c) == ST_LIVE
            && ctl_gen(c) == h.gen_() & GEN_MASK
            && FlowState::from_u8(ctl_state(c)).is_embryonic())
        .then(|| now.0.saturating_sub(ctl_ls(c)))
    }

    /// Ends flow `h` if it is still an embryonic TCP flow, so that a new flow may take what
    /// it holds (a SNAT port towards its backend) when there is none left: half-open flows
    /// give way first under pressure. Counted in `gave_way`, and the table is under pressure
    /// from now on for [`PRESSURE_HOLD_TICKS`].
    pub fn give_way(&self, h: FlowHandle, now: Tick) -> Option<ExpiredFlow> {
        if h.entry() as usize >= self.entries.len() {
            return None;
        }
        let embryonic = |c: u64| FlowState::from_u8(ctl_state(c)).is_embryonic();
        let f = self.take(h.entry(), h.gen_() & GEN_MASK, embryonic, true)?;
        self.counters.0.gave_way.fetch_add(1, Ordering::Relaxed);
        self.note_pressure(now.0);
        Some(f)
    }

    /// Take LIVE entry `e` of generation `gen_` out of the table if `cond(ctl)` holds: CAS it to
    /// DYING (the one winner among removers), unindex both tuples, fix the counts, mark it FREE,
    /// and (if `to_free_list`) return it to the free list.
    fn take(
        &self,
        e: u32,
        gen_: u64,
        cond: impl Fn(u64) -> bool,
        to_free_list: bool,
    ) -> Option<ExpiredFlow> {
        let entry = &self.entries[e as usize];
        let mut c = entry.w[W_CTL].load(Ordering::Acquire);
        loop {
            if ctl_status(c) != ST_LIVE || ctl_gen(c) != gen_ || !cond(c) {
                return None;
            }
            let dying = c & !(3 << 40) | ST_DYING << 40;
            match entry.w[W_CTL].compare_exchange_weak(
                c,
                dying,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(a) => c = a,
            }
        }
        // We own the entry now; its data words are stable.
        let data = self.read_data(e).expect("live entry has a valid protocol");
        let state = FlowState::from_u8(ctl_state(c));
        let ok = data.original_key();
        let rk = data.reply_key();
        let oh = self.hash(&ok);
        let rh = self.hash(&rk);
        self.index.remove(oh, index::make_word(oh, false, e));
        self.index.remove(rh, index::make_word(rh, true, e));
        self.count(data.backend_id.0, state, -1);
        let flow = ExpiredFlow {
            handle: FlowHandle::new(e, gen_),
            data,
            state,
            last_seen: self.instant(ctl_ls(c)),
        };
        self.departed.0.fetch_add(1, Ordering::Relaxed);
        if to_free_list {
            self.release(e, gen_);
        } else {
            entry.w[W_CTL].store(ctl(gen_, ST_FREE, 0, 0), Ordering::Release);
        }
        Some(flow)
    }

    /// Mark an owned entry FREE and push it on the free list.
    fn release(&self, e: u32, gen_: u64) {
        self.entries[e as usize].w[W_CTL].store(ctl(gen_, ST_FREE, 0, 0), Ordering::Release);
        self.push_free(e);
    }

    /// Account one packet of flow `h` travelling in `dir`: update the state from `tcp_flags`
    /// (ignored for UDP/ICMP), the last-seen time and the backend's counts. Returns the new
    /// state, or `None` if the handle is stale. Writes nothing when neither the state nor the
    /// 100 ms time tick changes, so a busy flow's entry stays read-mostly.
    #[inline]
    pub fn on_packet(
        &self,
        h: FlowHandle,
        dir: Direction,
        tcp_flags: TcpFlags,
        now: Instant,
    ) -> Option<FlowState> {
        let entry = self.entries.get(h.entry() as usize)?;
        let t = self.ticks(now);
        let mut c = entry.w[W_CTL].load(Ordering::Acquire);
        let backend = (self.word(h.entry(), W_IDS) >> 32) as u32;
        // Orders the read above before the CAS: if it saw a recycler's write, the CAS fails.
        fence(Ordering::Acquire);
        loop {
            if !ctl_readable(c) || ctl_gen(c) != h.gen_() {
                return None;
            }
            let old = FlowState::from_u8(ctl_state(c));
            let new = old.next(dir, tcp_flags);
            let ls = ctl_ls(c).max(t);
            if new == old && ls == ctl_ls(c) {
                return Some(old);
            }
            let nc =
                c & !((0xff << 32) | 0xffff_ffff) | u64::from(new.to_u8()) << 32 | u64::from(ls);
            match entry.w[W_CTL].compare_exchange_weak(c, nc, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.recount(backend, old, new);
                    return Some(new);
                }
                Err(a) => c = a,
            }
        }
    }

    /// Remove flow `h` now (e.g. its backend was removed); returns it, or `None` if the handle
    /// is stale or the flow is still being inserted.
    pub fn remove(&self, h: FlowHandle) -> Option<ExpiredFlow> {
        if h.entry() as usize >= self.entries.len() {
            return None;
        }
        let f = self.take(h.entry(), h.gen_(), |_| true, true)?;
        self.counters.0.removed.fetch_add(1, Ordering::Relaxed);
        Some(f)
    }

    /// Examine the next `budget` entries (a chunk claimed from a shared cursor, so any number of
    /// workers may sweep at once without overlapping) and expire the idle ones, passing each to
    /// `out`. Also clears index tombstones in the matching share of the index. Call it every
    /// batch with a small budget; a full round takes `capacity / budget` calls.
    pub fn sweep(&self, now: Instant, budget: usize, out: impl FnMut(ExpiredFlow)) -> SweepStats {
        let cap = self.entries.len();
        let budget = budget.min(cap);
        let start = self.sweep_cursor.0.fetch_add(budget, Ordering::Relaxed) % cap;
        self.sweep_range(now, start, budget, out)
    }

    /// Sweep entries `start..start+len` (wrapping): for callers that shard the table between
    /// workers themselves (e.g. worker `i` of `n` owns `i*cap/n..(i+1)*cap/n` with its own
    /// cursor).
    pub fn sweep_range(
        &self,
        now: Instant,
        start: usize,
        len: usize,
        mut out: impl FnMut(ExpiredFlow),
    ) -> SweepStats {
        let cap = self.entries.len();
        let len = len.min(cap);
        let t = self.ticks(now);
        let mut st = SweepStats {
            visited: len,
            ..SweepStats::default()
        };
        let pressure = self.pressure_at(t);
        let limits = if pressure {
            &self.pressure_ticks
        } else {
            &self.timeout_ticks
        };
        let mut early = 0;
        for i in 0..len {
            let e = ((start + i) % cap) as u32;
            let c = self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed);
            if ctl_status(c) == ST_LIVE
                && Self::expired_by(limits, c, t)
                && let Some(f) = self.take(e, ctl_gen(c), |c| Self::expired_by(limits, c, t), true)
            {
                st.expired += 1;
                early += u64::from(pressure && !self.expired(c, t));
                out(f);
            }
        }
        self.counters
            .0
            .expired
            .fetch_add(st.expired as u64, Ordering::Relaxed);
        if early > 0 {
            self.counters.0.gave_way.fetch_add(early, Ordering::Relaxed);
        }
        // The index share that corresponds to this entry range.
        let n = self.index.len();
        let istart = ((start % cap) as u128 * n as u128 / cap as u128) as usize;
        let ilen = (len as u128 * n as u128).div_ceil(cap as u128) as usize;
        st.tombs_cleared = self.index.cleanup(istart, ilen);
        st
    }

    /// Visit every readable flow in entries `start..start+len` (wrapping), e.g. to find the
    /// flows of a removed backend or to list flows. Bounded like a sweep; `f` sees copies.
    pub fn scan(&self, start: usize, len: usize, mut f: impl FnMut(FlowView)) {
        let cap = self.entries.len();
        for i in 0..len.min(cap) {
            let e = ((start + i) % cap) as u32;
            let c = self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed);
            if ctl_readable(c)
                && let Some(v) = self.get(FlowHandle::new(e, ctl_gen(c)))
            {
                f(v);
            }
        }
    }
}

impl FlowTable {
    /// Index census `(live, tombstones, empty, max displacement)`, for tests and diagnostics (racy while in use).
    #[doc(hidden)]
    pub fn index_census(&self) -> (usize, usize, usize, usize) {
        let (mut live, mut tomb, mut empty, mut displacement) = (0, 0, 0, 0);
        for (pos, s) in self.index.slots.iter().enumerate() {
            match s.load(Ordering::Relaxed) {
                index::EMPTY | index::FROZEN => empty += 1,
                index::TOMB => tomb += 1,
                w => {
                    live += 1;
                    displacement = displacement.max(pos.saturating_sub(self.index.home(w)));
                }
            }
        }
        (live, tomb, empty, displacement)
    }
}

impl ConnCounts for FlowTable {
    fn active(&self, id: BackendId) -> u32 {
        // Transiently below zero when a remover's decrement overtakes a state change's
        // increment; report zero then.
        self.backends
            .get(id.0 as usize)
            .map_or(0, |b| (unpack(b.0.load(Ordering::Relaxed)).0).max(0) as u32)
    }

    fn inactive(&self, id: BackendId) -> u32 {
        self.backends
            .get(id.0 as usize)
            .map_or(0, |b| (unpack(b.0.load(Ordering::Relaxed)).1).max(0) as u32)
    }

    #[inline]
    fn counts_run(&self, first: BackendId, out: &mut [[u32; 2]]) -> bool {
        let start = first.0 as usize;
        let Some(src) = self.backends.get(start..start + out.len()) else {
            return false;
        };
        for (o, b) in out.iter_mut().zip(src) {
            let w = clamped(b.0.load(Ordering::Relaxed));
            *o = [(w >> 32) as u32, w as u32];
        }
        true
    }

    #[inline]
    fn packed_run(&self, first: BackendId, out: &mut [u64]) -> bool {
        let start = first.0 as usize;
        let Some(src) = self.backends.get(start..start + out.len()) else {
            return false;
        };
        for (o, b) in out.iter_mut().zip(src) {
            *o = clamped(b.0.load(Ordering::Relaxed));
        }
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn initial_codes_agree_with_initial_states() {
        let t = FlowTable::new(FlowTableConfig::new(4, 1), std::time::Instant::now()).unwrap();
        let protos = [
            Protocol::Tcp,
            Protocol::Udp,
            Protocol::Icmp,
            Protocol::Icmpv6,
            Protocol::Sctp,
        ];
        for p in protos {
            for f in 0..=u8::MAX {
                let want = FlowState::initial(p, TcpFlags(f)).to_u8();
                assert_eq!(t.initial_code(p, TcpFlags(f)), want, "{p:?} flags {f:#x}");
            }
        }
    }

    #[test]
    fn touch_shortcut_agrees_with_the_state_table() {
        // Every flags byte the shortcut takes (ACK set; SYN, FIN, RST clear), both ways.
        let t = next_code_table();
        for f in (0..=u8::MAX).filter(|f| f & 0x17 == 0x10) {
            for (d, dir) in [Direction::Original, Direction::Reply]
                .into_iter()
                .enumerate()
            {
                let est = FlowState::Tcp(TcpState::Established);
                assert_eq!(est.next(dir, TcpFlags(f)), est, "flags {f:#x} {dir:?}");
                assert_eq!(t[d][flags_index(f)][usize::from(EST_CODE)], EST_CODE);
            }
        }
    }

    #[test]
    fn packed_counts_behave_like_two_counters() {
        // Random signed deltas on each side; the packed word must decode to the same pair
        // two wrapping u32 counters hold.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            let (mut a, mut i, mut w) = (0u32, 0u32, 0u64);
            for _ in 0..50 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let d = (x % 5) as i32 - 2;
                if x & 1 << 40 != 0 {
                    a = a.wrapping_add(d as u32);
                    w = w.wrapping_add((1u64 << 32).wrapping_mul(d as i64 as u64));
                } else {
                    i = i.wrapping_add(d as u32);
                    w = w.wrapping_add(d as i64 as u64);
                }
                assert_eq!(unpack(w), (a as i32, i as i32));
                let c = clamped(w);
                assert_eq!(
                    c,
                    u64::from((a as i32).max(0) as u32) << 32 | u64::from((i as i32).max(0) as u32)
                );
            }
        }
    }
}
