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
//! - A state of another capacity or backend count (same layout version and boot) is kept
//!   aside at [`previous_path`] so [`FlowTable::import_state`] can copy its live flows into
//!   the new table (a capacity change keeps flows even after a crash).
//! - Across layout versions, [`FlowTable::export`] writes the live flows in a small versioned
//!   record format (a graceful stop does it) and [`FlowTable::import_records`] reads them.
//! - The file is locked (`flock`) while a table has it open: two processes never share one.
//!
//! # State files are untrusted input
//!
//! Nothing read from a state file is used before it is checked, and nothing in one can make
//! the process abort:
//!
//! - The file itself is opened without following a link and only if it is a regular file
//!   that nobody else could have written (`shm::StateFile::open_existing`); its space is
//!   reserved before it is written (a full filesystem refuses the start, it never raises
//!   SIGBUS later).
//! - Every header field is checked (`persist/header.rs`): magic, layout version, entry
//!   sizes, boot, capacity and backends_max in range (no size computation can overflow),
//!   home slots and the file's size exactly what they make, an epoch in the past, a known
//!   status. A file that fails is **set aside** (renamed to `flows.refused-<time>-<field>`,
//!   `shm::set_aside`) and a new table is made: [`Opened::Replaced`] names the field and the
//!   value.
//! - Every adopted or imported flow is checked (`persist/valid.rs`, `persist/recover.rs`,
//!   `persist/records.rs`), by the table and by the caller's [`FlowCheck`] (the running
//!   config); one that fails is dropped and counted ([`Recovery::refused`],
//!   [`Imported::invalid`], with the first reason), so one bad record affects only itself.
//! - The index must agree with the entries under the header's hash seed; if it does not, it
//!   is rebuilt from the valid entries and the fault reported ([`Recovery::index`]).
//!
//! Nothing here runs on the per-packet path.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shm::{Existing, Refusal, SetAside, StateFile, boot_id, instant_of, mono_of, monotonic_ns};

use super::entry::{W_CTL, ctl_status};
use super::store::{Layout, STATUS_CLEAN, STATUS_RUNNING};
use super::{Error, FlowTable, FlowTableConfig};
use crate::mem::Mapping;
use crate::sync::Ordering;

mod handed;
mod header;
mod records;
mod recover;
mod recover_v4;
mod valid;

pub use handed::Handed;
pub use records::{FlowRecord, RECORD_BYTES, RECORD_VERSION};
pub use valid::{AnyFlow, FlowCheck};

/// What [`FlowTable::open`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opened {
    /// No state file: a new, empty table.
    Created,
    /// The state of an earlier process of this boot, adopted in place.
    Adopted(Recovery),
    /// A state that could not be adopted: a new table took its place.
    Replaced {
        /// Why: the header field and the value found (for another geometry, `capacity`
        /// with both geometries).
        refusal: Refusal,
        /// The old file, kept at [`previous_path`] when its flows can be imported
        /// ([`FlowTable::import_state`]): same layout and boot, another geometry.
        previous: Option<PathBuf>,
        /// Where the old file was set aside, when it was refused.
        set_aside: Option<SetAside>,
        /// Live flows its header claimed, when it was an xvs flow state.
        flows: Option<u64>,
    },
}

/// What the recovery pass of an adoption found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Live flows adopted.
    pub flows: usize,
    /// Entries a dead worker left half-inserted or half-removed, torn down.
    pub torn_down: usize,
    /// Live entries refused (invalid, or refused by the caller's [`FlowCheck`]), freed.
    pub refused: usize,
    /// The first refused entry's field and value.
    pub refusal: Option<Refusal>,
    /// The index did not agree with the entries (a changed seed, a damaged index): what
    /// was found. It was rebuilt from the adopted flows.
    pub index: Option<Refusal>,
    /// Index words reset (words of torn-down or refused entries, frozen slots).
    pub words_reset: usize,
    /// The previous owner stopped cleanly (else it died).
    pub clean: bool,
    /// Pid of the previous owner.
    pub previous_pid: u32,
    /// How long the pass took.
    pub took: Duration,
}

/// What an import did. `read` = `restored` + `refused` + `invalid`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// Flows read.
    pub read: usize,
    /// Flows inserted.
    pub restored: usize,
    /// Valid flows the table refused (full, a tuple already in it).
    pub refused: usize,
    /// Flows that failed a check (the table's or the caller's [`FlowCheck`]).
    pub invalid: usize,
    /// The first invalid flow's field and value.
    pub refusal: Option<Refusal>,
}

fn state_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::State {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// [`state_err`], or [`Error::NoSpace`] for a full filesystem.
fn space_err(path: &Path, what: impl std::fmt::Display, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::StorageFull {
        return Error::NoSpace {
            path: path.display().to_string(),
            detail: format!("{what}: {e}"),
        };
    }
    state_err(path, format!("{what}: {e}"))
}

fn refused(path: &Path, refusal: Refusal) -> Error {
    Error::Refused {
        path: path.display().to_string(),
        refusal,
    }
}

/// Why `try_adopt` did not adopt: the refusal, the kept path, the flows the header claimed,
/// where the file was set aside.
struct NotAdopted {
    refusal: Refusal,
    previous: Option<PathBuf>,
    set_aside: Option<SetAside>,
    flows: Option<u64>,
}

impl FlowTable {
    /// The table in state file `path`: the state an earlier process of this boot left there,
    /// adopted after a recovery pass that keeps only the flows `check` takes, or a new table
    /// (see the module doc). The file stays locked while the table lives. A new table counts
    /// time from boot (CLOCK_MONOTONIC 0), or from `now` where this process cannot represent
    /// that. Errors are what the caller cannot go on without: the file locked by another
    /// process, no space for the table, I/O.
    pub fn open(
        path: &Path,
        config: FlowTableConfig,
        now: Instant,
        check: &dyn FlowCheck,
    ) -> Result<(FlowTable, Opened), Error> {
        let existing = StateFile::open_existing(path).map_err(|e| state_err(path, e))?;
        Self::open_from(path, existing, None, config, now, check)
    }

    /// [`open`](Self::open) of what was found at `path` (`premapped`: see `try_adopt`).
    fn open_from(
        path: &Path,
        existing: Existing,
        premapped: Option<Mapping>,
        config: FlowTableConfig,
        now: Instant,
        check: &dyn FlowCheck,
    ) -> Result<(FlowTable, Opened), Error> {
        let lay = Self::checked_layout(&config)?;
        let boot = boot_id().map_err(|e| state_err(path, format!("reading boot_id: {e}")))?;
        let not_adopted = match existing {
            Existing::Missing => None,
            Existing::Refused(refusal) => Some(NotAdopted {
                set_aside: Some(shm::set_aside(path, &refusal).map_err(|e| state_err(path, e))?),
                refusal,
                previous: None,
                flows: None,
            }),
            Existing::Open(state) => {
                match Self::try_adopt(state, premapped, &lay, &config, &boot, now, check)? {
                    Ok(table) => return Ok(table),
                    Err(why) => Some(why),
                }
            }
        };
        let table = Self::create(path, &lay, &config, &boot, now)?;
        let opened = match not_adopted {
            None => Opened::Created,
            Some(n) => Opened::Replaced {
                refusal: n.refusal,
                previous: n.previous,
                set_aside: n.set_aside,
                flows: n.flows,
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

    /// The bytes of the state file of a table of `capacity` flows and `backends_max`
    /// backends (what [`open`](Self::open) reserves), if both are in range.
    pub fn file_bytes(capacity: usize, backends_max: usize) -> Option<u64> {
        Layout::checked(capacity as u64, backends_max as u64).map(|l| l.total as u64)
    }

    /// Adopts the locked `state` when its header checks and its geometry is `lay`; otherwise
    /// moves it aside (to [`previous_path`] for another geometry, set aside when refused)
    /// and says why. `premapped`: the whole file, reserved and mapped already (a handed-over
    /// state prepared before a takeover's switch), used when the file still has its size.
    fn try_adopt(
        state: StateFile,
        premapped: Option<Mapping>,
        lay: &Layout,
        config: &FlowTableConfig,
        boot: &[u64; 2],
        now: Instant,
        check: &dyn FlowCheck,
    ) -> Result<Result<(FlowTable, Opened), NotAdopted>, Error> {
        let path = state.path.clone();
        let len = state.size().map_err(|e| state_err(&path, e))?;
        let refuse = |state: StateFile, refusal: Refusal, flows: Option<u64>| {
            drop(state);
            let set_aside = shm::set_aside(&path, &refusal).map_err(|e| state_err(&path, e))?;
            Ok(Err(NotAdopted {
                refusal,
                previous: None,
                set_aside: Some(set_aside),
                flows,
            }))
        };
        let Some(seen) = header::read_file(&state.file, len).map_err(|e| state_err(&path, e))?
        else {
            let why = Refusal::new("size", format!("{len} bytes (a header needs 4096)"));
            return refuse(state, why, None);
        };
        let flows = (seen.magic == super::store::MAGIC).then(|| seen.flows());
        let (file_lay, epoch) = match seen.check(boot, len, monotonic_ns()) {
            Ok(x) => x,
            Err(refusal) => return refuse(state, refusal, flows),
        };
        if file_lay.capacity != lay.capacity || file_lay.backends_max != lay.backends_max {
            drop(state);
            let p = previous_path(&path);
            let geometry = format!(
                "{} and backends_max {} (configured: {} and {})",
                seen.capacity, seen.backends_max, lay.capacity, lay.backends_max
            );
            if let Err(e) = std::fs::rename(&path, &p) {
                // Something that is no file is in the way (a directory): the start goes on
                // without these flows rather than not at all.
                let why = Refusal::new("capacity", format!("{geometry}: not kept ({e})"));
                let set_aside = shm::set_aside(&path, &why).map_err(|e| state_err(&path, e))?;
                return Ok(Err(NotAdopted {
                    refusal: why,
                    previous: None,
                    set_aside: Some(set_aside),
                    flows,
                }));
            }
            return Ok(Err(NotAdopted {
                refusal: Refusal::new("capacity", format!("{geometry}: imported")),
                previous: Some(p),
                set_aside: None,
                flows,
            }));
        }
        let mem = map_whole(&state, len, premapped)?;
        let table = FlowTable::carve(mem, lay, config, seen.seed, epoch, true);
        let recovery = table.recover(seen.status == STATUS_CLEAN, seen.pid as u32, now, check);
        let h = table.header.as_ref().expect("a file-backed table");
        h.status.store(STATUS_RUNNING, Ordering::Relaxed);
        h.owner_pid
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        h.adoptions.fetch_add(1, Ordering::Relaxed);
        let table = FlowTable {
            lock: Some(state),
            ..table
        };
        Ok(Ok((table, Opened::Adopted(recovery))))
    }

    /// A new table in a new file at `path` (written aside, its space reserved, then renamed
    /// into place).
    fn create(
        path: &Path,
        lay: &Layout,
        config: &FlowTableConfig,
        boot: &[u64; 2],
        now: Instant,
    ) -> Result<FlowTable, Error> {
        let state = StateFile::create(path, lay.total).map_err(|e| {
            let what = format!("making a table of {}", shm::bytes(lay.total as u64));
            space_err(path, what, e)
        })?;
        let mem = Mapping::shared(&state.file, lay.total).map_err(|e| state_err(path, e))?;
        mem.advise_huge();
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

    /// The state file this table lives in, locked (`None` for an anonymous table): what a
    /// takeover hands over to the next process ([`FlowTable::prepare_handed`]).
    pub fn state_file(&self) -> Option<&std::fs::File> {
        self.lock.as_ref().map(|s| &s.file)
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

    /// Where a state file of `capacity` flows and `backends_max` backends keeps its parts,
    /// in bytes from its start: `(entries, index, index slots, total)` (for the tests that
    /// damage state files by hand).
    #[cfg(feature = "testing")]
    pub fn state_layout(capacity: usize, backends_max: usize) -> (usize, usize, usize, usize) {
        let l = Layout::of(capacity, backends_max);
        (l.entries, l.index, l.index_slots, l.total)
    }

    /// Whether this table lives in a state file.
    #[cfg(feature = "testing")]
    pub fn is_persistent(&self) -> bool {
        self.header.is_some()
    }

    /// Copies the live flows of the state file `previous` (kept aside by [`open`](Self::open):
    /// same layout version and boot, another geometry) into this table, then removes the
    /// file. Its header is checked again and each of its flows like an adopted one (`check`
    /// included); a file that fails is [`Error::Refused`] and left for the caller to set
    /// aside.
    pub fn import_state(&self, previous: &Path, check: &dyn FlowCheck) -> Result<Imported, Error> {
        let state = match StateFile::open_existing(previous).map_err(|e| state_err(previous, e))? {
            Existing::Open(s) => s,
            Existing::Missing => return Err(state_err(previous, "no such file")),
            Existing::Refused(r) => return Err(refused(previous, r)),
        };
        let len = state.size().map_err(|e| state_err(previous, e))?;
        let Some(seen) = header::read_file(&state.file, len).map_err(|e| state_err(previous, e))?
        else {
            let why = Refusal::new("size", format!("{len} bytes (a header needs 4096)"));
            return Err(refused(previous, why));
        };
        let boot = boot_id().map_err(|e| state_err(previous, e))?;
        let (lay, epoch) = seen
            .check(&boot, len, monotonic_ns())
            .map_err(|r| refused(previous, r))?;
        let mem = Mapping::shared_read(&state.file, len).map_err(|e| state_err(previous, e))?;
        let cfg = FlowTableConfig {
            timeouts: self.timeouts,
            ..FlowTableConfig::new(lay.capacity, lay.backends_max)
        };
        let old = FlowTable::carve(mem, &lay, &cfg, seen.seed, epoch, true);
        let out = self.import_entries(&old, check);
        drop(old);
        drop(state);
        std::fs::remove_file(previous).map_err(|e| state_err(previous, e))?;
        Ok(out)
    }

    /// Copies the valid live flows of `old` (a mapped state file) into this table.
    fn import_entries(&self, old: &FlowTable, check: &dyn FlowCheck) -> Imported {
        let mut out = Imported::default();
        let mut addrs = valid::BackendAddrs::default();
        let old_now = old.ticks(Instant::now());
        let exts = recover::Extensions::of(old);
        for (e, entry) in old.entries.iter().enumerate() {
            let c = entry.w[W_CTL].load(Ordering::Relaxed);
            if ctl_status(c) != super::entry::ST_LIVE {
                continue;
            }
            out.read += 1;
            let limit = self.backends.len();
            let flow = old
                .entry_flow(e as u32, c, old_now, limit, check)
                .and_then(|f| exts.claim(old, e as u32, &f.0).map(|()| f));
            let (d, state) = match flow {
                Ok(f) => f,
                Err(why) => {
                    out.refuse(why);
                    continue;
                }
            };
            let h = super::FlowHandle::new(e as u32, super::entry::ctl_gen(c));
            let (last_seen, seq) = match old.get(h) {
                Some(v) => (v.last_seen, v.seq),
                None => (old.instant(super::entry::ctl_ls(c)), 0),
            };
            match self.restore(&d, state, self.tick(last_seen), seq) {
                Ok(_) => {
                    out.restored += 1;
                    addrs.note(d.backend_id.0, d.backend);
                }
                Err(_) => out.refused += 1,
            }
        }
        self.drop_conflicting(&addrs, &mut out);
        out
    }
}

/// All `len` bytes of `state`, reserved and mapped: `premapped` when it is that already (a
/// handed-over state prepared before the switch).
fn map_whole(state: &StateFile, len: usize, premapped: Option<Mapping>) -> Result<Mapping, Error> {
    if let Some(mem) = premapped.filter(|m| m.len() == shm::page_round(len)) {
        return Ok(mem);
    }
    let path = &state.path;
    // Every page backed before anything is written through the mapping.
    shm::reserve(&state.file, len as u64).map_err(|e| {
        space_err(
            path,
            format_args!("reserving {}", shm::bytes(len as u64)),
            e,
        )
    })?;
    let mem = Mapping::shared(&state.file, len).map_err(|e| state_err(path, e))?;
    mem.advise_huge();
    // The recovery pass touches every page (each entry's control word, each index slot,
    // each backend's count): faulted in one call rather than one exception a page, as a
    // handed-over state is before the switch. A hint: a kernel without it faults them
    // during the pass.
    let _ = mem.populate();
    Ok(mem)
}

/// Where [`FlowTable::open`] keeps a replaced state that can be imported.
pub fn previous_path(path: &Path) -> PathBuf {
    path.with_extension("previous")
}
