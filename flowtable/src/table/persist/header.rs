//! A state file's header, read and checked field by field before anything else of the file
//! is used: every field either checks against this build and this boot, or against the
//! file itself (the geometry must make exactly the file's size), or the file is refused
//! with the field and the value. The shared scalars after the header (free list, counts,
//! counters, sweep cursor) are not trusted at all: the recovery pass rebuilds them.

use std::fs::File;
use std::time::Instant;

use shm::{Mapping, Refusal};

use super::super::store::{
    HeaderBlock, LAYOUT_VERSION, Layout, MAGIC, STATUS_CLEAN, STATUS_RUNNING, entry_bytes,
};
use crate::sync::{AtomicU64, Ordering};

/// The header of a mapped state, as read (not trusted: see [`Seen::check`]).
pub(super) struct Seen {
    pub(super) magic: u64,
    pub(super) version: u64,
    pub(super) capacity: u64,
    pub(super) homes: u64,
    pub(super) backends_max: u64,
    pub(super) entry_bytes: u64,
    pub(super) boot: [u64; 2],
    pub(super) epoch_ns: u64,
    pub(super) seed: u64,
    pub(super) status: u64,
    pub(super) pid: u64,
    inserted: u64,
    departed: u64,
}

/// The header of a state file of `len` bytes, read through a mapping of its first page
/// only (the file's size is checked against its header before all of it is mapped); `None`
/// for a file shorter than a page.
pub(super) fn read_file(file: &File, len: usize) -> std::io::Result<Option<Seen>> {
    if len < crate::mem::PAGE {
        return Ok(None);
    }
    let mem = Mapping::shared_read(file, crate::mem::PAGE)?;
    Ok(Some(read_header(&mem)))
}

/// Reads the header of `mem` (at least a page).
fn read_header(mem: &Mapping) -> Seen {
    let hb = mem.one::<HeaderBlock>(0);
    let h = &hb.header;
    let r = |a: &AtomicU64| a.load(Ordering::Acquire);
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
    /// The layout and the clock epoch of a state with this header, if it can be read as
    /// layout `LAYOUT_VERSION` of this boot (whatever its geometry) in a file of `file_len`
    /// bytes at CLOCK_MONOTONIC `now_ns`; else the first field that fails, with its value.
    pub(super) fn check(
        &self,
        boot: &[u64; 2],
        file_len: usize,
        now_ns: u64,
    ) -> Result<(Layout, Instant), Refusal> {
        self.check_identity(boot)?;
        let lay = self.check_geometry(file_len)?;
        let epoch = shm::instant_of(self.epoch_ns).filter(|_| self.epoch_ns <= now_ns);
        let Some(epoch) = epoch else {
            return Err(Refusal::new(
                "epoch",
                format!(
                    "{} ns (CLOCK_MONOTONIC is {now_ns} ns: a clock origin in the future)",
                    self.epoch_ns
                ),
            ));
        };
        if self.status != STATUS_RUNNING && self.status != STATUS_CLEAN {
            return Err(Refusal::new(
                "status",
                format!(
                    "{} (running {STATUS_RUNNING} or clean {STATUS_CLEAN})",
                    self.status
                ),
            ));
        }
        if self.pid > u64::from(u32::MAX) {
            return Err(Refusal::new("owner_pid", self.pid));
        }
        Ok((lay, epoch))
    }

    /// An xvs flow state of this layout version and entry size, written in this boot.
    fn check_identity(&self, boot: &[u64; 2]) -> Result<(), Refusal> {
        if self.magic != MAGIC {
            return Err(Refusal::new(
                "magic",
                format!("{:#018x} (not an xvs flow state)", self.magic),
            ));
        }
        if self.version != LAYOUT_VERSION {
            return Err(Refusal::new(
                "version",
                format!("{} (this xvs uses {LAYOUT_VERSION})", self.version),
            ));
        }
        if self.entry_bytes != entry_bytes() {
            return Err(Refusal::new(
                "entry_bytes",
                format!(
                    "{:#x} (this xvs uses {:#x})",
                    self.entry_bytes,
                    entry_bytes()
                ),
            ));
        }
        if self.boot != *boot {
            return Err(Refusal::new(
                "boot_id",
                format!(
                    "{:016x}{:016x} (written before the last reboot)",
                    self.boot[0], self.boot[1]
                ),
            ));
        }
        Ok(())
    }

    /// The layout its capacity and backends_max make, if that is the index and the file
    /// it has (a `file_len`-byte file).
    fn check_geometry(&self, file_len: usize) -> Result<Layout, Refusal> {
        let Some(lay) = Layout::checked(self.capacity, self.backends_max) else {
            let (field, value, max) =
                if (1..=super::super::CAPACITY_MAX as u64).contains(&self.capacity) {
                    ("backends_max", self.backends_max, 1u64 << 32)
                } else {
                    ("capacity", self.capacity, super::super::CAPACITY_MAX as u64)
                };
            return Err(Refusal::new(field, format!("{value} (1 to {max})")));
        };
        let homes_ok = lay.homes as u64 == self.homes;
        if !homes_ok && lay.total != file_len {
            // Neither the index nor the file has the size the capacity makes: the capacity
            // is what changed.
            return Err(Refusal::new(
                "capacity",
                format!(
                    "{} (its index would have {} home slots, not {}, and its file {} bytes, not {file_len})",
                    self.capacity, lay.homes, self.homes, lay.total
                ),
            ));
        }
        if !homes_ok {
            return Err(Refusal::new(
                "homes",
                format!(
                    "{} (capacity {} makes {})",
                    self.homes, self.capacity, lay.homes
                ),
            ));
        }
        if lay.total != file_len {
            return Err(Refusal::new(
                "size",
                format!(
                    "{file_len} bytes (capacity {} and backends_max {} make {})",
                    self.capacity, self.backends_max, lay.total
                ),
            ));
        }
        Ok(lay)
    }

    /// Live flows the header's counters claim (for a log line only: never trusted).
    pub(super) fn flows(&self) -> u64 {
        self.inserted.saturating_sub(self.departed)
    }
}
