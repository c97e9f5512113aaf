//! Backend schedulers for xvs: every IPVS scheduler (rr, wrr, lc, wlc, sed, nq, mh, sh, dh,
//! lblc, lblcr) and Kubernetes ClientIP session affinity.
//!
//! This crate knows nothing of packets, sockets or clocks. Schedulers are *built* off the hot
//! path from a backend list (`Scheduler::build`) and *picked* from on the hot path
//! (`Scheduler::pick`), which never allocates. Time is an argument (`now: Instant`).
//! Connection counts for the least-connection family come from the flow table through the
//! [`ConnCounts`] trait.

use std::net::IpAddr;

/// Identifies a backend in the global per-backend connection-count table kept by the flow
/// table. Assigned by the snapshot builder; stable for a (service, backend address) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(pub u32);

/// Live connection counts per backend, as IPVS keeps them: `active` are established TCP
/// connections, `inactive` every other state (SYN, FIN, TIME_WAIT, UDP flows...).
pub trait ConnCounts {
    /// Established connections to `id`.
    fn active(&self, id: BackendId) -> u32;
    /// Non-established connections to `id`.
    fn inactive(&self, id: BackendId) -> u32;
    /// IPVS's overhead: `active * 256 + inactive` (`ip_vs_dest_conn_overhead`).
    fn overhead(&self, id: BackendId) -> u64 {
        u64::from(self.active(id)) * 256 + u64::from(self.inactive(id))
    }
}
