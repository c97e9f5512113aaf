//! The table's errors: [`Error`] (making or opening a table) and [`InsertError`] (why an insert
//! did not add a flow).

use super::handle::FlowHandle;

/// Errors from [`FlowTable::new`](crate::FlowTable::new).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// Capacity is zero or above [`CAPACITY_MAX`](crate::CAPACITY_MAX).
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
    /// A state file's content cannot be used (see the `persist` module doc): the field and
    /// the value found. The caller sets the file aside.
    #[cfg(not(loom))]
    #[error("flow state {path}: {refusal}")]
    Refused {
        /// The file.
        path: String,
        /// The field and the value.
        refusal: shm::Refusal,
    },
    /// No room on the state file's filesystem for the table (its space is reserved when the
    /// file is made or adopted): what it needs and what is free.
    #[error("flow state {path}: {detail}")]
    NoSpace {
        /// The file.
        path: String,
        /// The sizes.
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
