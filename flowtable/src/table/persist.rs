//! A table that outlives its process: the table's memory is a shared mapping of a state file
//! (on tmpfs, `/run/xvs`), so every store a worker made is in the file however the process
//! ended, and the next process of the same boot adopts it.
//!
//! - [`FlowTable::open`] adopts a compatible state (same layout version, geometry and boot):
//!   a single-threaded [recovery pass](FlowTable::recover) first tears down what a dead worker
//!   left half-done (entries INSERTING or DYING, their index words, frozen index slots),
//!   rebuilds the free list and recounts the per-backend counts and the size. Live flows keep
//!   their entries, index words, states and last-seen times (the clock epoch is in the header,
//!   as CLOCK_MONOTONIC, which `Instant` reads on Linux and which does not restart with a
//!   process).
//! - A state that cannot be adopted (another capacity or backend count, another layout
//!   version, another boot, a damaged header) is replaced by a new table; a file of the same
//!   layout version and boot is kept aside so [`FlowTable::import_state`] can copy its live
//!   flows into the new table (a capacity change keeps flows even after a crash).
//! - Across layout versions, [`FlowTable::export`] writes the live flows in a small versioned
//!   record format (a graceful stop does it) and [`FlowTable::import_records`] reads them.
//! - The file is locked (`flock`) while a table has it open: two processes never share one.
//!
//! Nothing here runs on the per-packet path.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lb_algos::BackendId;

use super::FlowView;
use super::entry::{
    A_BACKEND, A_CLIENT, A_SNAT, A_VIP, GEN_MASK, ST_FREE, ST_LIVE, W_CTL, W_IDS, W_META, ctl,
    ctl_gen, ctl_ls, ctl_state, ctl_status,
};
use super::store::{
    HeaderBlock, LAYOUT_VERSION, Layout, MAGIC, STATUS_CLEAN, STATUS_RUNNING, entry_bytes,
};
use super::{Error, FlowTable, FlowTableConfig};
use crate::index::{EMPTY, FROZEN, TOMB, word_entry};
use crate::key::{FlowData, Protocol};
use crate::mem::Mapping;
use crate::state::{FlowState, STATE_CODES};
use crate::sync::Ordering;

/// What [`FlowTable::open`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opened {
    /// No state file: a new, empty table.
    Created,
    /// The state of an earlier process of this boot, adopted in place.
    Adopted(Recovery),
    /// A state that could not be adopted: a new table took its place. `previous` is the old
    /// file, kept when its flows can be imported ([`FlowTable::import_state`]).
    Replaced {
        /// Why it could not be adopted.
        reason: String,
        /// The old file, renamed, when importable.
        previous: Option<PathBuf>,
        /// Live flows it held, when its header could be read.
        flows: Option<u64>,
    },
}

/// What the recovery pass of an adoption found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Live flows adopted.
    pub flows: usize,
    /// Entries a dead worker left half-inserted or half-removed, torn down.
    pub torn_down: usize,
    /// Index words reset (words of torn-down entries, frozen slots).
    pub words_reset: usize,
    /// The previous owner stopped cleanly (else it died).
    pub clean: bool,
    /// Pid of the previous owner.
    pub previous_pid: u32,
    /// How long the pass took.
    pub took: Duration,
}

/// What an import did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// Flows read.
    pub read: usize,
    /// Flows inserted.
    pub restored: usize,
    /// Flows refused (full table, duplicate tuple, invalid record).
    pub refused: usize,
}

use shm::{StateFile, boot_id, instant_of, mono_of, monotonic_ns};

fn state_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::State {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// The header of a mapped state, read (not trusted: every field is checked by the caller).
struct Seen {
    magic: u64,
    version: u64,
    capacity: u64,
    homes: u64,
    backends_max: u64,
    entry_bytes: u64,
    boot: [u64; 2],
    epoch_ns: u64,
    seed: u64,
    status: u64,
    pid: u64,
    inserted: u64,
    departed: u64,
}

fn read_header(mem: &Mapping) -> Seen {
    let hb = mem.one::<HeaderBlock>(0);
    let h = &hb.header;
    let r = |a: &crate::sync::AtomicU64| a.load(Ordering::Acquire);
    Seen {
        magic: r(&h.magic),
        version: r(&h.version),
        capacity: r(&h.capacity),
        homes: r(&h.homes),
        backends_max: r(&h.backends_max),
        entry_bytes: r(&h.entry_bytes),
        boot: [r(&h.boot_id[0]), r(&h.boot_id[1])],
        epoch_ns: r(&h.epoch_mono_ns),
        seed: r(&h.seed),
        status: r(&h.status),
        pid: r(&h.owner_pid),
        inserted: r(&hb.counters.0.inserted),
        departed: r(&hb.departed.0),
    }
}

impl Seen {
    /// Why a state with this header cannot be read as layout `LAYOUT_VERSION` of this boot
    /// (whatever its geometry), if it cannot.
    fn unreadable(&self, boot: &[u64; 2], file_len: usize) -> Option<String> {
        if self.magic != MAGIC {
            return Some("not an xvs flow state (bad magic)".to_owned());
        }
        if self.version != LAYOUT_VERSION || self.entry_bytes != entry_bytes() {
            return Some(format!(
                "layout version {} (this xvs uses {LAYOUT_VERSION})",
                self.version
            ));
        }
        if self.boot != *boot {
            return Some("written before the last reboot".to_owned());
        }
        let lay = Layout::of(self.capacity as usize, self.backends_max as usize);
        if lay.homes as u64 != self.homes || lay.total > file_len {
            return Some("damaged header (sizes do not add up)".to_owned());
        }
        None
    }

    fn flows(&self) -> u64 {
        self.inserted.saturating_sub(self.departed)
    }
}

impl FlowTable {
    /// The table in state file `path`: the state an earlier process of this boot left there,
    /// adopted after a recovery pass, or a new table (see the module doc). The file stays
    /// locked while the table lives. A new table counts time from boot (CLOCK_MONOTONIC 0),
    /// or from `now` where this process cannot represent that.
    pub fn open(
        path: &Path,
        config: FlowTableConfig,
        now: Instant,
    ) -> Result<(FlowTable, Opened), Error> {
        let lay = Self::checked_layout(&config)?;
        let boot = boot_id().map_err(|e| state_err(path, format!("reading boot_id: {e}")))?;
        let replaced = match StateFile::open_existing(path).map_err(|e| state_err(path, e))? {
            None => None,
            Some(state) => match Self::try_adopt(state, &lay, &config, &boot)? {
                Ok(table) => return Ok(table),
                Err(why) => Some(why),
            },
        };
        let table = Self::create(path, &lay, &config, &boot, now)?;
        let opened = match replaced {
            None => Opened::Created,
            Some((reason, previous, flows)) => Opened::Replaced {
                reason,
                previous,
                flows,
            },
        };
        Ok((table, opened))
    }

    fn checked_layout(config: &FlowTableConfig) -> Result<Layout, Error> {
        if config.capacity == 0 || config.capacity > super::CAPACITY_MAX {
            return Err(Error::Capacity {
                got: config.capacity,
                max: super::CAPACITY_MAX,
            });
        }
        if config.backends_max == 0 || config.backends_max as u64 > 1 << 32 {
            return Err(Error::BackendsMax(config.backends_max));
        }
        Ok(Layout::of(config.capacity, config.backends_max))
    }

    /// Adopts the locked `file` when it is compatible; otherwise moves it aside (or removes
    /// it) and says why, with the kept path and its flow count.
    #[allow(clippy::type_complexity)]
    fn try_adopt(
        state: StateFile,
        lay: &Layout,
        config: &FlowTableConfig,
        boot: &[u64; 2],
    ) -> Result<Result<(FlowTable, Opened), (String, Option<PathBuf>, Option<u64>)>, Error> {
        let path = state.path.as_path();
        let file = &state.file;
        let len = state.size().map_err(|e| state_err(path, e))?;
        if len < crate::mem::PAGE {
            std::fs::remove_file(path).map_err(|e| state_err(path, e))?;
            return Ok(Err(("truncated file".to_owned(), None, None)));
        }
        let mem = Mapping::shared(file, len).map_err(|e| state_err(path, e))?;
        let seen = read_header(&mem);
        let unreadable = seen.unreadable(boot, len);
        let geometry = seen.capacity as usize == lay.capacity
            && seen.backends_max as usize == lay.backends_max
            && len >= lay.total;
        let epoch = instant_of(seen.epoch_ns);
        if let (None, true, Some(epoch)) = (&unreadable, geometry, epoch) {
            let table = FlowTable::carve(mem, lay, config, seen.seed, epoch, true);
            let recovery = table.recover(seen.status == STATUS_CLEAN, seen.pid as u32);
            let h = table.header.as_ref().expect("a file-backed table");
            h.status.store(STATUS_RUNNING, Ordering::Relaxed);
            h.owner_pid
                .store(u64::from(std::process::id()), Ordering::Relaxed);
            h.adoptions.fetch_add(1, Ordering::Relaxed);
            let table = FlowTable {
                lock: Some(state),
                ..table
            };
            return Ok(Ok((table, Opened::Adopted(recovery))));
        }
        let flows = (seen.magic == MAGIC).then(|| seen.flows());
        let (reason, keep) = match unreadable {
            Some(r) => (r, false),
            None if epoch.is_none() => ("its clock epoch is out of range".to_owned(), false),
            None => (
                format!(
                    "capacity {} and backends_max {} (configured: {} and {})",
                    seen.capacity, seen.backends_max, lay.capacity, lay.backends_max
                ),
                true,
            ),
        };
        drop(mem);
        let path = state.path.clone();
        drop(state);
        let path = path.as_path();
        let previous = if keep {
            let p = previous_path(path);
            std::fs::rename(path, &p).map_err(|e| state_err(path, e))?;
            Some(p)
        } else {
            std::fs::remove_file(path).map_err(|e| state_err(path, e))?;
            None
        };
        Ok(Err((reason, previous, flows)))
    }

    /// A new table in a new file at `path` (written aside, then renamed into place).
    fn create(
        path: &Path,
        lay: &Layout,
        config: &FlowTableConfig,
        boot: &[u64; 2],
        now: Instant,
    ) -> Result<FlowTable, Error> {
        let state = StateFile::create(path, lay.total).map_err(|e| state_err(path, e))?;
        let mem = Mapping::shared(&state.file, lay.total).map_err(|e| state_err(path, e))?;
        if lay.total >= 1 << 30 {
            mem.advise_huge();
        }
        let seed = shm::random_u64();
        // The clock's origin (boot) as the epoch: every time of this boot is representable,
        // flows imported with older times included, and every later process agrees.
        let epoch = instant_of(0).unwrap_or(now);
        let table = FlowTable::carve(mem, lay, config, seed, epoch, true);
        table.init_fresh(lay, Some((boot, mono_of(epoch), seed)));
        state.commit().map_err(|e| state_err(path, e))?;
        Ok(FlowTable {
            lock: Some(state),
            ..table
        })
    }

    /// The recovery pass of an adoption (see the module doc). Runs before any worker uses
    /// the table: plain loads and stores, one thread.
    pub(crate) fn recover(&self, clean: bool, previous_pid: u32) -> Recovery {
        let t0 = Instant::now();
        let cap = self.entries.len();
        let mut keep = vec![false; cap];
        for b in self.backends.iter() {
            b.0.store(0, Ordering::Relaxed);
        }
        self.counters.0.embryonic.store(0, Ordering::Relaxed);
        let mut out = Recovery {
            clean,
            previous_pid,
            ..Recovery::default()
        };
        for (e, entry) in self.entries.iter().enumerate() {
            let c = entry.w[W_CTL].load(Ordering::Relaxed);
            let backend = (self.word(e as u32, W_IDS) >> 32) as u32;
            let state = ctl_state(c);
            let usable = ctl_status(c) == ST_LIVE
                && (backend as usize) < self.backends.len()
                && usize::from(state) < STATE_CODES
                && self.read_data(e as u32).is_some();
            if usable {
                keep[e] = true;
                out.flows += 1;
                self.saw_flags((self.word(e as u32, W_META) >> 48) as u8);
                self.count(backend, FlowState::from_u8(state), 1);
            } else {
                if ctl_status(c) != ST_FREE {
                    out.torn_down += 1;
                }
                let gen_ = (ctl_gen(c) + 1) & GEN_MASK;
                entry.w[W_CTL].store(ctl(gen_, ST_FREE, 0, ctl_ls(c)), Ordering::Relaxed);
            }
        }
        for slot in self.index.slots.iter() {
            let w = slot.load(Ordering::Relaxed);
            let reset = match w {
                EMPTY | TOMB => None,
                FROZEN => Some(EMPTY),
                w => {
                    let (e, _) = word_entry(w);
                    (!keep.get(e as usize).copied().unwrap_or(false)).then_some(TOMB)
                }
            };
            if let Some(v) = reset {
                slot.store(v, Ordering::Relaxed);
                out.words_reset += 1;
            }
        }
        // The free list: every entry not kept, in order.
        let mut head = 0u64;
        for e in (0..cap).rev() {
            if !keep[e] {
                self.entries[e].w[W_IDS].store(head, Ordering::Relaxed);
                head = e as u64 + 1;
            }
        }
        self.free.0.store(head, Ordering::Relaxed);
        self.departed.0.store(0, Ordering::Relaxed);
        self.sweep_cursor.0.store(0, Ordering::Relaxed);
        let c = &self.counters.0;
        for a in [
            &c.full,
            &c.exists,
            &c.reply_in_use,
            &c.index_full,
            &c.recycled,
            &c.expired,
            &c.removed,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        c.inserted.store(out.flows as u64, Ordering::Relaxed);
        crate::sync::fence(Ordering::SeqCst);
        out.took = t0.elapsed();
        out
    }

    /// Marks the state file as cleanly stopped (after the last worker stopped): the next
    /// process knows it adopts a quiescent table. Nothing for an anonymous table.
    pub fn mark_clean(&self) {
        // Quiescent by contract: the counts are exact.
        debug_assert_eq!(self.check_counts(), Ok(()), "flow table at a clean stop");
        if let Some(h) = &self.header {
            h.status.store(STATUS_CLEAN, Ordering::Release);
        }
    }

    /// Whether this table lives in a state file.
    #[cfg(feature = "testing")]
    pub fn is_persistent(&self) -> bool {
        self.header.is_some()
    }

    /// Copies the live flows of the state file `previous` (kept aside by [`open`](Self::open):
    /// same layout version and boot, another geometry) into this table, then removes the file.
    pub fn import_state(&self, previous: &Path) -> Result<Imported, Error> {
        let file = File::open(previous).map_err(|e| state_err(previous, e))?;
        let len = file.metadata().map_err(|e| state_err(previous, e))?.len() as usize;
        if len < crate::mem::PAGE {
            return Err(state_err(previous, "truncated file"));
        }
        let mem = Mapping::shared_read(&file, len).map_err(|e| state_err(previous, e))?;
        let seen = read_header(&mem);
        let boot = boot_id().map_err(|e| state_err(previous, e))?;
        if let Some(why) = seen.unreadable(&boot, len) {
            return Err(state_err(previous, why));
        }
        let epoch = instant_of(seen.epoch_ns)
            .ok_or_else(|| state_err(previous, "its clock epoch is out of range"))?;
        let lay = Layout::of(seen.capacity as usize, seen.backends_max as usize);
        let cfg = FlowTableConfig {
            timeouts: self.timeouts,
            ..FlowTableConfig::new(lay.capacity, lay.backends_max)
        };
        let old = FlowTable::carve(mem, &lay, &cfg, seen.seed, epoch, true);
        let mut out = Imported::default();
        old.scan(0, old.capacity(), |v| {
            out.read += 1;
            match self.restore(&v.data, v.state, self.tick(v.last_seen), v.seq) {
                Ok(_) => out.restored += 1,
                Err(_) => out.refused += 1,
            }
        });
        drop(old);
        std::fs::remove_file(previous).map_err(|e| state_err(previous, e))?;
        Ok(out)
    }

    /// Writes every live flow to `path` in the record format (see [`RECORD_VERSION`]),
    /// aside then renamed into place; returns how many. For a graceful stop, so that a
    /// process with another layout can import them.
    pub fn export(&self, path: &Path, now: Instant) -> Result<usize, Error> {
        let tmp = path.with_extension("tmp");
        let file = File::create(&tmp).map_err(|e| state_err(&tmp, e))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let boot = boot_id().map_err(|e| state_err(path, e))?;
        let io = |e: io::Error| state_err(&tmp, e);
        // The count goes in the header once known: a placeholder first, streamed records,
        // then the header again.
        let mut head = RecordHeader {
            count: 0,
            boot,
            exported_mono_ns: mono_of(now),
            version: RECORD_VERSION,
            record_len: RECORD_LEN,
        };
        w.write_all(&head.encode()).map_err(io)?;
        let mut failed = None;
        self.scan(0, self.capacity(), |v| {
            if failed.is_none() {
                let age = now.saturating_duration_since(v.last_seen);
                match w.write_all(&encode_record(&v.data, v.state, age, v.seq)) {
                    Ok(()) => head.count += 1,
                    Err(e) => failed = Some(e),
                }
            }
        });
        if let Some(e) = failed {
            return Err(io(e));
        }
        let mut file = w.into_inner().map_err(|e| io(e.into_error()))?;
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&head.encode()).map_err(io)?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(|e| state_err(path, e))?;
        Ok(head.count as usize)
    }

    /// Reads flows written by [`export`](Self::export) (of this boot) into this table; their
    /// idle times continue from the export. The file is left for the caller to remove.
    pub fn import_records(&self, path: &Path, now: Instant) -> Result<Imported, Error> {
        let file = File::open(path).map_err(|e| state_err(path, e))?;
        let mut r = BufReader::new(file);
        let io = |e: io::Error| state_err(path, e);
        let mut head = [0u8; RECORD_HEADER_LEN];
        r.read_exact(&mut head).map_err(io)?;
        let head = RecordHeader::decode(&head).map_err(|why| state_err(path, why))?;
        let boot = boot_id().map_err(io)?;
        if head.boot != boot {
            return Err(state_err(path, "exported before the last reboot"));
        }
        // Time passed since the export counts as idle time.
        let since = Duration::from_nanos(monotonic_ns().saturating_sub(head.exported_mono_ns));
        let mut out = Imported::default();
        let mut rec = [0u8; RECORD_LEN];
        for _ in 0..head.count {
            r.read_exact(&mut rec[..head.record_len]).map_err(io)?;
            out.read += 1;
            let Some((data, state, age, seq)) = decode_record(&rec, head.version) else {
                out.refused += 1;
                continue;
            };
            let last_seen = now
                .checked_sub(age + since)
                .unwrap_or(self.epoch)
                .max(self.epoch);
            match self.restore(&data, state, self.tick(last_seen), seq) {
                Ok(_) => out.restored += 1,
                Err(_) => out.refused += 1,
            }
        }
        Ok(out)
    }
}

/// Bytes of one flow in the record format (this version).
pub const RECORD_BYTES: usize = RECORD_LEN;

/// One flow as the record format carries it: the flow data (with the writer's service
/// and backend ids, which a reader of another process maps to its own), its state, how
/// long it had been idle when written, and its sequence word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowRecord {
    /// The flow.
    pub data: FlowData,
    /// Its state.
    pub state: FlowState,
    /// Idle time when written (millisecond resolution).
    pub idle: Duration,
    /// Its sequence word (0: none).
    pub seq: u64,
}

impl FlowRecord {
    /// The record of `v` read at `now`.
    pub fn of(v: &FlowView, now: Instant) -> FlowRecord {
        FlowRecord {
            data: v.data,
            state: v.state,
            idle: now.saturating_duration_since(v.last_seen),
            seq: v.seq,
        }
    }

    /// Its [`RECORD_BYTES`] bytes (the format of [`FlowTable::export`]'s records, version
    /// [`RECORD_VERSION`]).
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        encode_record(&self.data, self.state, self.idle, self.seq)
    }

    /// A record back from its bytes; `None` for bytes that are no valid record.
    pub fn decode(b: &[u8; RECORD_BYTES]) -> Option<FlowRecord> {
        let (data, state, idle, seq) = decode_record(b, RECORD_VERSION)?;
        if !data.same_family() {
            return None;
        }
        Some(FlowRecord {
            data,
            state,
            idle,
            seq,
        })
    }
}

/// Where [`FlowTable::open`] keeps a replaced state that can be imported.
pub fn previous_path(path: &Path) -> PathBuf {
    path.with_extension("previous")
}

/// The record format's version. Records are little-endian and fixed-size; a new field means
/// a new version (and the reader of the old one kept).
///
/// - 1: 96-byte records.
/// - 2: 104-byte records: version 1's, then the flow's sequence word (SYN proxy). Version 1
///   records are still read (sequence word 0: no proxied flow existed then).
pub const RECORD_VERSION: u32 = 2;
const RECORD_MAGIC: &[u8; 8] = b"XVSFLOWR";
const RECORD_HEADER_LEN: usize = 48;
/// Bytes of a record of this version.
const RECORD_LEN: usize = 104;
/// Bytes of a version 1 record.
const RECORD_LEN_V1: usize = 96;

struct RecordHeader {
    count: u64,
    boot: [u64; 2],
    exported_mono_ns: u64,
    /// The records' version and size (read back: this version's or version 1's).
    version: u32,
    record_len: usize,
}

impl RecordHeader {
    fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut b = [0u8; RECORD_HEADER_LEN];
        b[..8].copy_from_slice(RECORD_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(self.record_len as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.boot[0].to_le_bytes());
        b[32..40].copy_from_slice(&self.boot[1].to_le_bytes());
        b[40..48].copy_from_slice(&self.exported_mono_ns.to_le_bytes());
        b
    }

    fn decode(b: &[u8; RECORD_HEADER_LEN]) -> Result<RecordHeader, String> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if &b[..8] != RECORD_MAGIC {
            return Err("not an xvs flow export (bad magic)".to_owned());
        }
        let (version, len) = (u32_at(8), u32_at(12) as usize);
        if !matches!(
            (version, len),
            (1, RECORD_LEN_V1) | (RECORD_VERSION, RECORD_LEN)
        ) {
            return Err(format!(
                "record version {version} (this xvs reads 1 and {RECORD_VERSION})"
            ));
        }
        Ok(RecordHeader {
            count: u64_at(16),
            boot: [u64_at(24), u64_at(32)],
            exported_mono_ns: u64_at(40),
            version,
            record_len: len,
        })
    }
}

/// One record: `proto, state, v6, flags` (4 bytes), the four ports (8), service and backend
/// ids and snapshot generation (12), idle ms (4), four 16-byte addresses (64), 4 reserved,
/// the sequence word (8, version 2).
fn encode_record(d: &FlowData, state: FlowState, age: Duration, seq: u64) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[0] = d.proto as u8;
    b[1] = state.to_u8();
    b[2] = u8::from(d.client.is_ipv6());
    b[3] = d.flags;
    for (i, sa) in [d.client, d.vip, d.backend, d.snat].iter().enumerate() {
        b[4 + 2 * i..6 + 2 * i].copy_from_slice(&sa.port().to_le_bytes());
        let bits = crate::key::addr_bits(sa.ip()).0;
        b[28 + 16 * i..44 + 16 * i].copy_from_slice(&bits.to_le_bytes());
    }
    b[12..16].copy_from_slice(&d.service_id.to_le_bytes());
    b[16..20].copy_from_slice(&d.backend_id.0.to_le_bytes());
    b[20..24].copy_from_slice(&d.snapshot_gen.to_le_bytes());
    let ms = age.as_millis().min(u128::from(u32::MAX)) as u32;
    b[24..28].copy_from_slice(&ms.to_le_bytes());
    b[96..104].copy_from_slice(&seq.to_le_bytes());
    b
}

/// A record of `version` (its bytes at the start of `b`).
fn decode_record(
    b: &[u8; RECORD_LEN],
    version: u32,
) -> Option<(FlowData, FlowState, Duration, u64)> {
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let proto = Protocol::from_ip_proto(b[0])?;
    if usize::from(b[1]) >= STATE_CODES {
        return None;
    }
    let state = FlowState::from_u8(b[1]);
    let v6 = b[2] == 1;
    let addr = |i: usize| {
        let bits = u128::from_le_bytes(b[28 + 16 * i..44 + 16 * i].try_into().expect("16"));
        std::net::SocketAddr::new(crate::key::bits_addr(bits, v6), u16_at(4 + 2 * i))
    };
    let data = FlowData {
        proto,
        client: addr(A_CLIENT),
        vip: addr(A_VIP),
        backend: addr(A_BACKEND),
        snat: addr(A_SNAT),
        service_id: u32_at(12),
        backend_id: BackendId(u32_at(16)),
        snapshot_gen: u32_at(20),
        flags: b[3],
    };
    let seq = if version >= 2 {
        u64::from_le_bytes(b[96..104].try_into().expect("8 bytes"))
    } else {
        0
    };
    Some((
        data,
        state,
        Duration::from_millis(u64::from(u32_at(24))),
        seq,
    ))
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::index::{EMPTY, FROZEN};
    use crate::state::TcpFlags;
    use crate::{ConnCounts, Direction};

    fn flow(i: u16) -> FlowData {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        FlowData {
            proto: Protocol::Tcp,
            client: SocketAddr::new(sa("198.18.0.1:0").ip(), 1000 + i),
            vip: sa("198.18.100.1:80"),
            backend: sa("198.18.1.1:8080"),
            snat: SocketAddr::new(sa("198.18.0.254:0").ip(), 2000 + i),
            service_id: 1,
            backend_id: BackendId(u32::from(i % 2)),
            snapshot_gen: 1,
            flags: 0,
        }
    }

    /// Every torn state a dead owner can leave, made by hand: an entry INSERTING with its
    /// words published, one DYING halfway through its tombstones, a FROZEN slot, counts that
    /// missed a decrement, a free list through a live entry.
    #[test]
    fn recovery_tears_down_what_a_dead_owner_left_half_done() {
        let now = Instant::now();
        // A fixed hash seed: which flow the last insert recycles depends on where the hash
        // puts it (with a random seed, about one run in fifty it recycles flow 0).
        let mut cfg = FlowTableConfig::new(64, 4);
        cfg.hash_seed = 0x0123_4567_89ab_cdef;
        let t = FlowTable::new(cfg, now).unwrap();
        let handles: Vec<_> = (0..10)
            .map(|i| t.insert(&flow(i), TcpFlags::SYN, t.tick(now)).unwrap())
            .collect();
        let set_status = |h: crate::FlowHandle, st: u64| {
            let w = &t.entries[h.entry() as usize].w[W_CTL];
            let c = w.load(Ordering::Relaxed);
            w.store(
                ctl(ctl_gen(c), st, ctl_state(c), ctl_ls(c)),
                Ordering::Relaxed,
            );
        };
        // Flow 3: its inserter died after publishing both words, before LIVE.
        set_status(handles[3], crate::table::entry::ST_INSERTING);
        // Flow 5: its remover won the CAS to DYING and tombed one word, then died.
        set_status(handles[5], crate::table::entry::ST_DYING);
        let reply = t.index.window(t.hash(&flow(5).reply_key()));
        let slot = reply
            .iter()
            .find(|s| {
                let w = s.load(Ordering::Relaxed);
                w != EMPTY && w != TOMB && w != FROZEN && word_entry(w).0 == handles[5].entry()
            })
            .expect("flow 5's reply word");
        slot.store(TOMB, Ordering::Relaxed);
        // A cleanup died with a slot frozen.
        let frozen = t
            .index
            .slots
            .iter()
            .position(|s| s.load(Ordering::Relaxed) == EMPTY)
            .unwrap();
        t.index.slots[frozen].store(FROZEN, Ordering::Relaxed);
        // Counts a dead remover half-updated, and a free list that points at live entries.
        t.backends[0].0.fetch_add(5, Ordering::Relaxed);
        t.free.0.store(1, Ordering::Relaxed);

        let r = t.recover(false, 42);
        assert_eq!(r.flows, 8);
        assert_eq!(r.torn_down, 2);
        // Flow 3's two words and flow 5's remaining one are tombed; the frozen slot emptied.
        assert_eq!(r.words_reset, 4);
        assert_eq!(t.index.slots[frozen].load(Ordering::Relaxed), EMPTY);
        for (i, h) in handles.iter().enumerate() {
            let d = flow(i as u16);
            let found = t.lookup(&d.original_key()).map(|(h, _)| h);
            if i == 3 || i == 5 {
                assert_eq!(found, None, "flow {i} was torn down");
                assert_eq!(t.lookup(&d.reply_key()), None);
                assert_eq!(t.get(*h), None, "its old handle is stale");
            } else {
                assert_eq!(found, Some(*h), "flow {i}");
                assert_eq!(t.lookup(&d.reply_key()), Some((*h, Direction::Reply)));
            }
        }
        // Recounted: four flows per backend left (0,2,4,6,8 minus nothing on 0; 1,7,9 on 1...).
        let on = |b: u32| {
            (0..10u32)
                .filter(|i| i % 2 == b && *i != 3 && *i != 5)
                .count() as u32
        };
        assert_eq!(t.inactive(BackendId(0)), on(0));
        assert_eq!(t.inactive(BackendId(1)), on(1));
        assert_eq!(t.len(), 8);
        // The free list holds exactly the other 56 entries: 56 more inserts take free
        // entries, the next one has to recycle an embryonic flow.
        for i in 100..156 {
            t.insert(&flow(i), TcpFlags::SYN, t.tick(now)).unwrap();
        }
        assert_eq!((t.len(), t.stats().recycled), (64, 0));
        t.insert(&flow(200), TcpFlags::SYN, t.tick(now)).unwrap();
        assert_eq!(t.stats().recycled, 1);
        // Torn-down flows insert again.
        assert!(t.remove(handles[0]).is_some());
        t.insert(&flow(3), TcpFlags::SYN, t.tick(now)).unwrap();
    }
}
