//! A state handed over by a running process (`xvs run --takeover`), in two steps around the
//! switch, so that the pause in which nobody polls holds only what must see the old
//! process stopped:
//!
//! 1. [`FlowTable::prepare_handed`], before the switch (the old process still forwards,
//!    writing the file): the header checked as [`FlowTable::open`] checks it (any
//!    geometry: a geometry change is the adoption's business), the space reserved, the whole
//!    file mapped and every page faulted in ([`shm::Mapping::populate`]). Nothing is
//!    written.
//! 2. [`FlowTable::open_handed`], after the switch: the adoption of [`FlowTable::open`] with
//!    that mapping: the header read and checked again (the old process marked it clean
//!    meanwhile), the full recovery pass (the clean mark is not trusted more than at a
//!    restart), or a new table when the file cannot be adopted.

use std::time::Instant;

use shm::{Existing, Refusal, StateFile, boot_id, monotonic_ns};

use super::super::{Error, FlowTable, FlowTableConfig};
use super::{Opened, header};
use crate::mem::Mapping;

/// A handed-over state file, checked and mapped before the switch (see the module doc).
pub struct Handed {
    state: StateFile,
    mem: Mapping,
}

impl std::fmt::Debug for Handed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handed")
            .field("path", &self.state.path)
            .field("bytes", &self.mem.len())
            .finish()
    }
}

impl FlowTable {
    /// Step 1 (see the module doc): `state` (a locked state file, e.g. from
    /// [`StateFile::handed`]) checked, reserved, mapped and faulted in. A refusal names the
    /// header field (or `read`, `reserve`, `map`) and the value; the caller falls back to
    /// [`FlowTable::open`] of the path, which checks it all again.
    pub fn prepare_handed(state: StateFile) -> Result<Handed, Refusal> {
        let len = state.size().map_err(|e| Refusal::new("read", e))?;
        let boot = boot_id().map_err(|e| Refusal::new("boot_id", e))?;
        let Some(seen) =
            header::read_file(&state.file, len).map_err(|e| Refusal::new("read", e))?
        else {
            return Err(Refusal::new(
                "size",
                format!("{len} bytes (a header needs 4096)"),
            ));
        };
        seen.check(&boot, len, monotonic_ns())?;
        shm::reserve(&state.file, len as u64).map_err(|e| Refusal::new("reserve", e))?;
        let mem = Mapping::shared(&state.file, len).map_err(|e| Refusal::new("map", e))?;
        mem.advise_huge();
        // A hint: a kernel without it faults the pages in during the recovery pass.
        let _ = mem.populate();
        Ok(Handed { state, mem })
    }

    /// Step 2 (see the module doc): the table of `handed`, adopted as [`FlowTable::open`]
    /// adopts the file at its path (same checks, same recovery pass, same outcomes: a file
    /// of another geometry kept for import, a refused one set aside and a new table made).
    pub fn open_handed(
        handed: Handed,
        config: FlowTableConfig,
        now: Instant,
        check: &dyn super::FlowCheck,
    ) -> Result<(FlowTable, Opened), Error> {
        let Handed { state, mem } = handed;
        let path = state.path.clone();
        Self::open_from(&path, Existing::Open(state), Some(mem), config, now, check)
    }
}
