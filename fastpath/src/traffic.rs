//! Per-backend traffic counters of one worker: what `ipvsadm -Ln --stats` shows per real
//! server (connections, packets and bytes in each direction), kept by the pipeline and summed
//! over workers by the slowpath.
//!
//! Each worker has its own [`Traffic`] and is its only writer, so a count is a relaxed load
//! and store (no locked read-modify-write, no shared cache line between workers); readers on
//! other threads load relaxed and see each counter advance monotonically. Indexed by
//! [`BackendId`], which is per (service, backend): a service's traffic is the sum of its
//! backends'.
//!
//! What is counted, like IPVS: every packet of a flow that the pipeline transmits, its IP
//! length (header included, the Ethernet header and padding not), in the flow's direction
//! (`in`: client to backend, `out`: backend to client); a connection when a flow is created.
//! Later fragments (forwarded through the fragment table, which keeps no backend) and the SYN
//! proxy's own handshake packets (no backend yet) are not counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lb_algos::BackendId;

/// Word indices of a backend's packet line.
const IN_PKTS: usize = 0;
const IN_BYTES: usize = 1;
const OUT_PKTS: usize = 2;
const OUT_BYTES: usize = 3;

/// Backend ids a [`Traffic`] has counters for: every id a snapshot can give out
/// (`[flowtable] backends_max` is at most this, config `BACKENDS_MAX`).
pub const IDS: usize = 1 << 20;

/// A worker's counters for backend ids `0..IDS`.
///
/// Fixed arrays, zeroed by the allocator (untouched pages cost address space, not memory: a
/// worker's counters take 40 bytes of memory per backend id in use), held inline so that a
/// packet's count is one pointer away from the pipeline and its index needs a mask, not a
/// bounds check. A backend's packet counters are 4 words, `[in_pkts, in_bytes, out_pkts,
/// out_bytes]`: a packet writes one 16-byte pair, which never straddles a cache line. (No
/// alignment above 8: the allocator then zeroes the memory lazily, calloc's fresh pages,
/// instead of writing all of it.)
#[derive(Debug)]
pub struct Traffic {
    words: [AtomicU64; 4 * IDS],
    conns: [AtomicU64; IDS],
}

/// A plain copy of one backend's counters, or a sum of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficCounts {
    /// Connections (flows) created.
    pub conns: u64,
    /// Packets client → backend.
    pub in_pkts: u64,
    /// Bytes client → backend (IP length).
    pub in_bytes: u64,
    /// Packets backend → client.
    pub out_pkts: u64,
    /// Bytes backend → client (IP length).
    pub out_bytes: u64,
}

impl TrafficCounts {
    /// `self + o`, counter by counter (wrapping, as the counters do).
    pub fn add(&self, o: &TrafficCounts) -> TrafficCounts {
        TrafficCounts {
            conns: self.conns.wrapping_add(o.conns),
            in_pkts: self.in_pkts.wrapping_add(o.in_pkts),
            in_bytes: self.in_bytes.wrapping_add(o.in_bytes),
            out_pkts: self.out_pkts.wrapping_add(o.out_pkts),
            out_bytes: self.out_bytes.wrapping_add(o.out_bytes),
        }
    }

    /// `self - o`, counter by counter (wrapping: the difference of two readings of counters
    /// that only grow).
    pub fn sub(&self, o: &TrafficCounts) -> TrafficCounts {
        TrafficCounts {
            conns: self.conns.wrapping_sub(o.conns),
            in_pkts: self.in_pkts.wrapping_sub(o.in_pkts),
            in_bytes: self.in_bytes.wrapping_sub(o.in_bytes),
            out_pkts: self.out_pkts.wrapping_sub(o.out_pkts),
            out_bytes: self.out_bytes.wrapping_sub(o.out_bytes),
        }
    }
}

/// One writer's increment: a relaxed load and store (the owner is the only writer).
#[inline(always)]
fn bump(c: &AtomicU64, by: u64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl Traffic {
    /// Zeroed counters, on the heap without writing them (calloc'd pages).
    pub fn new() -> Arc<Traffic> {
        // SAFETY: all-zero bytes are a valid `Traffic` (arrays of atomics holding 0).
        unsafe { Arc::<Traffic>::new_zeroed().assume_init() }
    }

    /// A packet of `ip_len` bytes of a flow of `backend`, client → backend unless `reply`.
    /// Only the owning worker calls this. (Ids are below `backends_max`, so below [`IDS`];
    /// one that was not would count for the id it masks to, and nothing else happens.)
    #[inline(always)]
    pub fn packet(&self, backend: BackendId, reply: bool, ip_len: usize) {
        let at = (backend.0 as usize & (IDS - 1)) * 4 + usize::from(reply) * 2;
        bump(&self.words[at + IN_PKTS], 1);
        bump(&self.words[at + IN_BYTES], ip_len as u64);
    }

    /// A flow created for `backend`. Only the owning worker calls this.
    #[inline]
    pub fn connection(&self, backend: BackendId) {
        bump(&self.conns[backend.0 as usize & (IDS - 1)], 1);
    }

    /// `backend`'s counters (zero for an id at or above [`IDS`]).
    pub fn get(&self, backend: BackendId) -> TrafficCounts {
        let i = backend.0 as usize;
        let Some(c) = self.conns.get(i) else {
            return TrafficCounts::default();
        };
        let w = |k: usize| self.words[i * 4 + k].load(Ordering::Relaxed);
        TrafficCounts {
            conns: c.load(Ordering::Relaxed),
            in_pkts: w(IN_PKTS),
            in_bytes: w(IN_BYTES),
            out_pkts: w(OUT_PKTS),
            out_bytes: w(OUT_BYTES),
        }
    }
}

/// `backend`'s counters summed over `workers`.
pub fn sum<'a>(
    workers: impl IntoIterator<Item = &'a Traffic>,
    backend: BackendId,
) -> TrafficCounts {
    workers
        .into_iter()
        .fold(TrafficCounts::default(), |acc, t| acc.add(&t.get(backend)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_direction_and_never_panics_on_an_id() {
        let t = Traffic::new();
        t.packet(BackendId(1), false, 60);
        t.packet(BackendId(1), false, 40);
        t.packet(BackendId(1), true, 1500);
        t.connection(BackendId(1));
        t.connection(BackendId(IDS as u32 + 9));
        assert_eq!(
            t.get(BackendId(1)),
            TrafficCounts {
                conns: 1,
                in_pkts: 2,
                in_bytes: 100,
                out_pkts: 1,
                out_bytes: 1500,
            }
        );
        assert_eq!(t.get(BackendId(0)), TrafficCounts::default());
        // An id beyond IDS masks onto another id's counters instead of panicking.
        assert_eq!(t.get(BackendId(9)).conns, 1);
        assert_eq!(t.get(BackendId(IDS as u32 + 9)), TrafficCounts::default());
    }

    #[test]
    fn new_counters_are_zeroed_lazily() {
        fn rss_kib() -> u64 {
            let s = std::fs::read_to_string("/proc/self/status").unwrap();
            let l = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
            l.split_whitespace().nth(1).unwrap().parse().unwrap()
        }
        let before = rss_kib();
        let t: Vec<Arc<Traffic>> = (0..4).map(|_| Traffic::new()).collect();
        t[3].packet(BackendId(7), true, 1);
        // 4 × 40 MiB of address space; written, it would be 160 MiB of memory.
        let grown = rss_kib().saturating_sub(before);
        assert!(
            grown < 64 * 1024,
            "{grown} KiB resident after 4 Traffic::new()"
        );
        assert_eq!(t[3].get(BackendId(7)).out_pkts, 1);
    }

    #[test]
    fn sums_over_workers() {
        let (a, b) = (Traffic::new(), Traffic::new());
        a.packet(BackendId(0), false, 10);
        b.packet(BackendId(0), false, 20);
        b.connection(BackendId(0));
        let s = sum([&*a, &*b], BackendId(0));
        assert_eq!((s.conns, s.in_pkts, s.in_bytes), (1, 2, 30));
        assert_eq!(s.sub(&a.get(BackendId(0))).in_bytes, 20);
    }
}
