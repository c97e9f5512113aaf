//! Backend schedulers for xvs: every IPVS scheduler (rr, wrr, lc, wlc, sed, nq, mh, sh, dh,
//! lblc, lblcr) and Kubernetes ClientIP session affinity.
//!
//! This crate knows nothing of packets, sockets or clocks. Schedulers are *built* off the hot
//! path from a backend list (`Scheduler::build`) and *picked* from on the hot path
//! (`Scheduler::pick`), which never allocates. Time is an argument (`now: Instant`).
//! Connection counts for the least-connection family come from the flow table through the
//! [`ConnCounts`] trait.
//!
//! # Contract shared by every scheduler
//!
//! - `build` validates the backend list (no duplicate addresses, at most [`BACKENDS_MAX`]),
//!   allocates everything the scheduler will ever need, and may take time (Maglev: ~ms).
//! - `pick(&self, ..)` returns an index into the slice `build` was given, or `None` when no
//!   backend may take a new flow. It does not allocate, lock, or read the clock. Stateful
//!   schedulers (rr/wrr cursors, lblc/lblcr locality tables) keep their state in atomics so one
//!   built scheduler can be shared by every worker thread.
//! - Weight 0 means *drain*: no scheduler ever picks a weight-0 backend for a new flow.
//! - Semantics follow Linux IPVS (`net/netfilter/ipvs/ip_vs_*.c`); each module doc says where
//!   and why we deviate.
// Product functions stay within clippy.toml's 70 lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

pub mod affinity;
pub mod dh;
mod hash;
pub mod lblc;
pub mod lblcr;
pub mod lc;
mod locality;
pub mod mh;
pub mod nq;
pub mod rr;
mod run;
pub mod sed;
mod seqlock;
pub mod sh;
pub mod wlc;
pub mod wrr;

pub use affinity::{AffinityOpened, AffinityTable};
pub use locality::ENTRIES_MAX as LOCALITY_ENTRIES_MAX;

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
    /// Bulk access for the least-connection family: copies `[active, inactive]` of the
    /// backends with ids `first, first + 1, ...` into `out` (one per element) and returns
    /// `true`, or returns `false` (the default) when not supported or out of range; the
    /// schedulers then fall back to [`active`](Self::active)/[`inactive`](Self::inactive).
    /// Must agree with those two methods.
    fn counts_run(&self, first: BackendId, out: &mut [[u32; 2]]) -> bool {
        let _ = (first, out);
        false
    }
    /// [`counts_run`](Self::counts_run) packed one word per backend:
    /// `out[i] = active << 32 | inactive`. The default packs what `counts_run` gives;
    /// implement it when the counts are stored that way (the flow table does).
    fn packed_run(&self, first: BackendId, out: &mut [u64]) -> bool {
        const STEP: usize = 64;
        let mut buf = [[0u32; 2]; STEP];
        for (k, o) in out.chunks_mut(STEP).enumerate() {
            let b = &mut buf[..o.len()];
            let Some(id) = first.0.checked_add((k * STEP) as u32) else {
                return false;
            };
            if !self.counts_run(BackendId(id), b) {
                return false;
            }
            for (o, c) in o.iter_mut().zip(b.iter()) {
                *o = u64::from(c[0]) << 32 | u64::from(c[1]);
            }
        }
        true
    }
}

/// Most backends one scheduler accepts. Tables store backend indices as `u32`; the limit keeps
/// every per-backend table small enough to build in milliseconds.
pub const BACKENDS_MAX: usize = 1 << 20;

pub use vocab::{SchedulerKind, UnknownScheduler};

/// Whether `kind`'s `pick` reads [`ConnCounts`] (the least-connection family and lblc/lblcr).
/// The others ignore the `counts` argument.
pub const fn uses_conn_counts(kind: SchedulerKind) -> bool {
    matches!(
        kind,
        SchedulerKind::Lc
            | SchedulerKind::Wlc
            | SchedulerKind::Sed
            | SchedulerKind::Nq
            | SchedulerKind::Lblc
            | SchedulerKind::Lblcr
    )
}

/// One backend as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Backend {
    /// Key into the flow table's connection counts.
    pub id: BackendId,
    /// Where flows go; also what Maglev hashes, so it must be unique within a service.
    pub addr: SocketAddr,
    /// Relative weight; 0 = drain (no new flows).
    pub weight: u32,
}

/// IPVS's per-service scheduler flags. IPVS shares the two bits between sh and mh
/// (`sh-fallback`/`mh-fallback`, `sh-port`/`mh-port`); so do we.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SchedFlags {
    /// mh and sh: hash the source port as well as the source address (kube-proxy sets it).
    pub mh_port: bool,
    /// mh and sh: keep weight-0 backends in the table and, when a flow lands on one, probe on
    /// deterministically to the next usable backend (instead of leaving them out).
    pub mh_fallback: bool,
}

/// Build-time parameters. `Default` gives the IPVS defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedParams {
    /// Scheduler flags (mh/sh).
    pub flags: SchedFlags,
    /// Maglev lookup table size; must be prime. Default 65537.
    pub mh_table_size: u32,
    /// sh/dh: log2 of the smallest bucket table (IPVS's `CONFIG_IP_VS_SH_TAB_BITS`, 8). The
    /// table grows past it when the weights need more buckets; see [`sh`].
    pub hash_tab_bits: u8,
    /// lblc: a locality entry unused for this long is forgotten (IPVS `lblc_expiration`, 24 h).
    pub lblc_expiration: Duration,
    /// lblcr: entries unused, and server sets unmodified, for this long are expired / pruned
    /// (IPVS `lblcr_expiration`, 24 h).
    pub lblcr_expiration: Duration,
    /// lblc/lblcr: locality table entries, allocated at build (IPVS keeps at most
    /// 16 × 1024 entries before it starts expiring early). Rounded up to a power of two.
    pub locality_entries: u32,
}

impl Default for SchedParams {
    fn default() -> Self {
        SchedParams {
            flags: SchedFlags::default(),
            mh_table_size: mh::TABLE_SIZE_DEFAULT,
            hash_tab_bits: 8,
            lblc_expiration: Duration::from_secs(24 * 60 * 60),
            lblcr_expiration: Duration::from_secs(24 * 60 * 60),
            locality_entries: 16 * 1024,
        }
    }
}

/// What a scheduler may hash on. The pipeline fills it from the packet; `dst`/`dst_port` are
/// the frontend (VIP and port) the flow was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowTuple {
    /// Client address.
    pub src: IpAddr,
    /// Client port.
    pub src_port: u16,
    /// Frontend address (VIP).
    pub dst: IpAddr,
    /// Frontend port.
    pub dst_port: u16,
}

/// Why `Scheduler::build` refused a backend list or parameters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// Two backends share an address (IPVS refuses a duplicate destination too); the snapshot
    /// builder must deduplicate endpoints first.
    #[error("backend {0} is listed twice")]
    DuplicateBackend(SocketAddr),
    /// More backends than [`BACKENDS_MAX`].
    #[error("{count} backends; at most {max} per scheduler")]
    TooManyBackends {
        /// Backends given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The Maglev table size must be prime so every skip visits every slot.
    #[error("mh table size {0} is not prime")]
    MhTableSizeNotPrime(u32),
    /// The Maglev table size is above [`mh::TABLE_SIZE_MAX`].
    #[error("mh table size {size} is above the maximum {max}")]
    MhTableSizeTooLarge {
        /// Size given.
        size: u32,
        /// The limit.
        max: u32,
    },
    /// More Maglev turns per round than table slots: some backends would get no slot.
    #[error(
        "{turns} mh turns per round (backends x reduced weights) exceed the table size {table_size}"
    )]
    MhTooManyBackends {
        /// Slots one population round claims (one per backend per reduced weight unit).
        turns: u64,
        /// The table size.
        table_size: u32,
    },
    /// The wrr sequence (sum of weights / gcd) would exceed [`wrr::SEQUENCE_MAX`] entries.
    #[error("wrr sequence of {len} entries exceeds {max}; reduce the weights or their spread")]
    WrrSequenceTooLong {
        /// Sum of weights divided by their gcd.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// `hash_tab_bits` outside `1..=sh::TAB_BITS_MAX`.
    #[error("hash_tab_bits {0} outside 1..={max}", max = sh::TAB_BITS_MAX)]
    HashTabBits(u8),
    /// `locality_entries` is 0 or above [`LOCALITY_ENTRIES_MAX`].
    #[error("locality_entries {0} outside 1..={max}", max = LOCALITY_ENTRIES_MAX)]
    LocalityEntries(u32),
}

/// A built scheduler: one variant per scheduler, each owning its state.
#[derive(Debug)]
pub enum Scheduler {
    /// Round robin.
    Rr(rr::Rr),
    /// Weighted round robin.
    Wrr(wrr::Wrr),
    /// Least connections.
    Lc(lc::Lc),
    /// Weighted least connections.
    Wlc(wlc::Wlc),
    /// Shortest expected delay.
    Sed(sed::Sed),
    /// Never queue.
    Nq(nq::Nq),
    /// Maglev.
    Mh(mh::Maglev),
    /// Source hashing.
    Sh(sh::Sh),
    /// Destination hashing.
    Dh(dh::Dh),
    /// Locality-based least connections.
    Lblc(lblc::Lblc),
    /// Locality-based least connections with replication.
    Lblcr(lblcr::Lblcr),
}

impl Scheduler {
    /// Builds `kind` over `backends`. Off the hot path; allocates every table the scheduler
    /// will use. `pick` answers with indices into `backends`.
    pub fn build(
        kind: SchedulerKind,
        backends: &[Backend],
        params: &SchedParams,
    ) -> Result<Scheduler, BuildError> {
        validate(backends)?;
        Ok(match kind {
            SchedulerKind::Rr => Scheduler::Rr(rr::Rr::build(backends)),
            SchedulerKind::Wrr => Scheduler::Wrr(wrr::Wrr::build(backends)?),
            SchedulerKind::Lc => Scheduler::Lc(lc::Lc::build(backends)),
            SchedulerKind::Wlc => Scheduler::Wlc(wlc::Wlc::build(backends)),
            SchedulerKind::Sed => Scheduler::Sed(sed::Sed::build(backends)),
            SchedulerKind::Nq => Scheduler::Nq(nq::Nq::build(backends)),
            SchedulerKind::Mh => Scheduler::Mh(mh::Maglev::build(backends, params)?),
            SchedulerKind::Sh => Scheduler::Sh(sh::Sh::build(backends, params)?),
            SchedulerKind::Dh => Scheduler::Dh(dh::Dh::build(backends, params)?),
            SchedulerKind::Lblc => Scheduler::Lblc(lblc::Lblc::build(backends, params)?),
            SchedulerKind::Lblcr => Scheduler::Lblcr(lblcr::Lblcr::build(backends, params)?),
        })
    }

    /// Chooses a backend for a new flow: an index into the slice given to `build`, or `None`
    /// when no backend can take a new flow. Never allocates, locks, or reads the clock.
    #[inline]
    pub fn pick<C: ConnCounts + ?Sized>(
        &self,
        flow: &FlowTuple,
        counts: &C,
        now: Instant,
    ) -> Option<usize> {
        // The schedulers that pick in a few instructions (a cursor, a table lookup), inline in
        // the caller; the others, which walk the backends, out of line: one general dispatch
        // was a call with its prologue and a jump table for every new flow.
        match self {
            Scheduler::Rr(s) => s.pick(),
            Scheduler::Wrr(s) => s.pick(),
            Scheduler::Mh(s) => s.pick(flow),
            _ => self.pick_walking(flow, counts, now),
        }
    }

    /// [`pick`](Self::pick) for the schedulers that walk their backends.
    #[inline(never)]
    fn pick_walking<C: ConnCounts + ?Sized>(
        &self,
        flow: &FlowTuple,
        counts: &C,
        now: Instant,
    ) -> Option<usize> {
        match self {
            Scheduler::Rr(s) => s.pick(),
            Scheduler::Wrr(s) => s.pick(),
            Scheduler::Lc(s) => s.pick(counts),
            Scheduler::Wlc(s) => s.pick(counts),
            Scheduler::Sed(s) => s.pick(counts),
            Scheduler::Nq(s) => s.pick(counts),
            Scheduler::Mh(s) => s.pick(flow),
            Scheduler::Sh(s) => s.pick(flow),
            Scheduler::Dh(s) => s.pick(flow),
            Scheduler::Lblc(s) => s.pick(flow, counts, now),
            Scheduler::Lblcr(s) => s.pick(flow, counts, now),
        }
    }

    /// Which scheduler this is.
    pub fn kind(&self) -> SchedulerKind {
        match self {
            Scheduler::Rr(_) => SchedulerKind::Rr,
            Scheduler::Wrr(_) => SchedulerKind::Wrr,
            Scheduler::Lc(_) => SchedulerKind::Lc,
            Scheduler::Wlc(_) => SchedulerKind::Wlc,
            Scheduler::Sed(_) => SchedulerKind::Sed,
            Scheduler::Nq(_) => SchedulerKind::Nq,
            Scheduler::Mh(_) => SchedulerKind::Mh,
            Scheduler::Sh(_) => SchedulerKind::Sh,
            Scheduler::Dh(_) => SchedulerKind::Dh,
            Scheduler::Lblc(_) => SchedulerKind::Lblc,
            Scheduler::Lblcr(_) => SchedulerKind::Lblcr,
        }
    }
}

/// Checks shared by every scheduler: the backend count limit and unique addresses (Maglev's
/// order independence needs a total order on backends; IPVS refuses duplicates too).
fn validate(backends: &[Backend]) -> Result<(), BuildError> {
    if backends.len() > BACKENDS_MAX {
        return Err(BuildError::TooManyBackends {
            count: backends.len(),
            max: BACKENDS_MAX,
        });
    }
    let mut addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    addrs.sort_unstable();
    if let Some(w) = addrs.windows(2).find(|w| w[0] == w[1]) {
        return Err(BuildError::DuplicateBackend(w[0]));
    }
    Ok(())
}

/// What the connection-count schedulers keep per backend, in the caller's order (IPVS scans
/// its destination list in order, and ties go to the earlier one).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dest {
    pub(crate) id: BackendId,
    pub(crate) weight: u32,
}

pub(crate) fn dests(backends: &[Backend]) -> Box<[Dest]> {
    backends
        .iter()
        .map(|b| Dest {
            id: b.id,
            weight: b.weight,
        })
        .collect()
}

/// IPVS's weighted-least-load comparison `lhs_load * rhs_weight > rhs_load * lhs_weight`,
/// i.e. `lhs_load / lhs_weight > rhs_load / rhs_weight` without division. `u128` so that
/// `overhead (< 2^41) * weight (< 2^32)` cannot overflow.
#[inline]
pub(crate) fn heavier(lhs_load: u64, lhs_weight: u32, rhs_load: u64, rhs_weight: u32) -> bool {
    u128::from(lhs_load) * u128::from(rhs_weight) > u128::from(rhs_load) * u128::from(lhs_weight)
}

pub(crate) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Pads `T` to its own cache-line pair so that a cursor every worker writes does not share a
/// line with the read-only tables beside it.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_errors_list_valid_names() {
        for &k in SchedulerKind::ALL {
            assert_eq!(k.to_string().parse::<SchedulerKind>(), Ok(k));
        }
        assert_eq!(SchedulerKind::ALL.len(), 11);
        let err = "fifo".parse::<SchedulerKind>().unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("fifo") && msg.contains("lblcr") && msg.contains("wrr"),
            "{msg}"
        );
        assert!("WRR".parse::<SchedulerKind>().is_err());
    }

    #[test]
    fn uses_conn_counts_is_the_lc_family_and_locality() {
        let users: Vec<_> = SchedulerKind::ALL
            .iter()
            .filter(|&&k| uses_conn_counts(k))
            .map(|k| k.name())
            .collect();
        assert_eq!(users, ["lc", "wlc", "sed", "nq", "lblc", "lblcr"]);
    }

    #[test]
    fn duplicate_addresses_are_refused_by_every_scheduler() {
        let b = testutil::backends(&[1, 1]);
        let dup = [
            b[0],
            Backend {
                id: BackendId(9),
                ..b[0]
            },
        ];
        for &k in SchedulerKind::ALL {
            let err = Scheduler::build(k, &dup, &SchedParams::default()).unwrap_err();
            assert_eq!(err, BuildError::DuplicateBackend(b[0].addr), "{k}");
        }
    }

    #[test]
    fn every_scheduler_builds_reports_its_kind_and_drains_weight_zero() {
        let backends = testutil::backends(&[0, 3, 0, 2]);
        let counts = testutil::Counts::new(&[(0, 0), (5, 1), (0, 0), (1, 0)]);
        let now = Instant::now();
        for &k in SchedulerKind::ALL {
            let s = Scheduler::build(k, &backends, &SchedParams::default()).unwrap();
            assert_eq!(s.kind(), k);
            for i in 0..500u32 {
                let flow = testutil::flow(i, i as u16);
                let got = s.pick(&flow, &counts, now).unwrap();
                assert!(got == 1 || got == 3, "{k} picked drained backend {got}");
            }
        }
    }

    #[test]
    fn no_backends_or_all_drained_gives_none() {
        let counts = testutil::Counts::new(&[(0, 0), (0, 0)]);
        let now = Instant::now();
        for list in [vec![], testutil::backends(&[0, 0])] {
            for &k in SchedulerKind::ALL {
                let s = Scheduler::build(k, &list, &SchedParams::default()).unwrap();
                assert_eq!(s.pick(&testutil::flow(1, 2), &counts, now), None, "{k}");
            }
        }
    }

    #[test]
    fn shared_state_is_send_and_sync() {
        fn shared<T: Send + Sync>() {}
        shared::<Scheduler>();
        shared::<AffinityTable>();
    }

    #[test]
    fn pick_works_through_a_dyn_conn_counts() {
        let backends = testutil::backends(&[1, 1]);
        let counts = testutil::Counts::new(&[(3, 0), (1, 0)]);
        let dyn_counts: &dyn ConnCounts = &counts;
        let s = Scheduler::build(SchedulerKind::Lc, &backends, &SchedParams::default()).unwrap();
        assert_eq!(
            s.pick(&testutil::flow(0, 0), dyn_counts, Instant::now()),
            Some(1)
        );
    }
}
