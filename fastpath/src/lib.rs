//! The xvs fastpath: zero-copy wire views, the sans-IO per-packet pipeline, the immutable
//! `Snapshot` it reads, and (later) the AF_XDP workers that drive it.
// Product functions stay within clippy.toml's 70 lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

/// Flow sync's per-worker flow log (in the flow table's crate, which records state changes).
pub use flowtable::log as flowlog;
pub mod decap;
pub mod limit;
pub mod passive;
pub mod pipeline;
pub mod settings;
pub mod snapshot;
pub mod steer;
#[cfg(feature = "testing")]
pub mod testing;
pub mod traffic;
pub mod wire;
pub mod worker;
pub mod xsk;
