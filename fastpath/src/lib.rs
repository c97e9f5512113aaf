//! The xvs fastpath: zero-copy wire views, the sans-IO per-packet pipeline, the immutable
//! `Snapshot` it reads, and (later) the AF_XDP workers that drive it.

pub mod flowlog;
pub mod limit;
pub mod passive;
pub mod pcap;
pub mod pipeline;
pub mod snapshot;
pub mod steer;
pub mod wire;
pub mod worker;
pub mod xsk;
