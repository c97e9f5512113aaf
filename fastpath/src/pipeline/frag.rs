//! The per-worker fragment table: later fragments follow their first fragment.
//!
//! Only the first fragment of a datagram (offset 0, MF) carries the L4 header, so only it can be
//! matched to a flow. When it is forwarded, its (source, destination, identification,
//! protocol) and the addresses it was rewritten to are recorded here; a later fragment of the
//! same datagram gets the same L3 rewrite (addresses, TTL, IPv4 header checksum; it has no L4
//! header). An unmatched later fragment is dropped (`FragmentNoMatch`), never guessed: fragments
//! arriving before their first fragment are not buffered. Works for IPv4 and for IPv6 fragment
//! headers alike. A first fragment of a DSR flow records its encapsulation instead (the
//! backend, the encapsulation, the flow's hash): its later fragments go out encapsulated
//! the same way, unchanged inside (`dsr`).
//!
//! Fixed size, allocated at start: a set-associative array of [`WAYS`]-entry buckets. Entries
//! live `timeout` after the first fragment; an insert takes a free or expired way, else the way
//! that expires soonest.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use vocab::Encap;

use super::classify::Packet;

/// Entries per bucket.
pub const WAYS: usize = 4;

/// Identifies one datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragKey {
    src: IpAddr,
    dst: IpAddr,
    id: u32,
    proto: u8,
}

impl FragKey {
    pub(crate) fn new(p: &Packet, id: u32) -> Self {
        FragKey {
            src: p.src,
            dst: p.dst,
            id,
            proto: p.proto,
        }
    }

    fn hash(&self) -> u64 {
        fn bits(a: IpAddr) -> u128 {
            match a {
                IpAddr::V4(v) => u128::from(v.to_bits()),
                IpAddr::V6(v) => v.to_bits(),
            }
        }
        let s = bits(self.src);
        let d = bits(self.dst);
        let mut h = (s as u64) ^ ((s >> 64) as u64).rotate_left(17) ^ (d as u64).rotate_left(31);
        h ^= ((d >> 64) as u64).rotate_left(47) ^ u64::from(self.id) << 8 ^ u64::from(self.proto);
        // fmix64
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: FragKey,
    to: FragTo,
    expires: Instant,
}

/// Where a datagram's later fragments go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FragTo {
    /// Rewritten to these source and destination addresses.
    Nat(IpAddr, IpAddr),
    /// Unchanged, encapsulated to this backend (DSR) with this encapsulation and flow hash.
    Dsr(IpAddr, Encap, u32),
}

/// A fixed-size fragment table.
#[derive(Debug)]
pub struct FragTable {
    entries: Box<[Option<Entry>]>,
    bucket_mask: usize,
    timeout: Duration,
}

impl FragTable {
    /// At least `capacity` entries (a power of two, at least [`WAYS`]).
    pub fn new(capacity: usize, timeout: Duration) -> Self {
        let n = capacity.clamp(WAYS, 1 << 24).next_power_of_two();
        FragTable {
            entries: vec![None; n].into_boxed_slice(),
            bucket_mask: n / WAYS - 1,
            timeout,
        }
    }

    fn bucket(&self, key: &FragKey) -> std::ops::Range<usize> {
        let b = (key.hash() as usize) & self.bucket_mask;
        b * WAYS..(b + 1) * WAYS
    }

    /// Records the first fragment of `key`, translated to `new_src → new_dst`.
    pub fn insert(&mut self, key: FragKey, new_src: IpAddr, new_dst: IpAddr, now: Instant) {
        self.put(key, FragTo::Nat(new_src, new_dst), now);
    }

    /// Records the first fragment of `key`, of a DSR flow encapsulated to `backend` with
    /// `encap` (the flow's hash `hash`).
    pub fn insert_dsr(
        &mut self,
        key: FragKey,
        backend: IpAddr,
        (encap, hash): (Encap, u32),
        now: Instant,
    ) {
        self.put(key, FragTo::Dsr(backend, encap, hash), now);
    }

    fn put(&mut self, key: FragKey, to: FragTo, now: Instant) {
        let range = self.bucket(&key);
        let bucket = &mut self.entries[range];
        let way = bucket
            .iter()
            .position(|e| e.is_some_and(|e| e.key == key))
            .or_else(|| {
                bucket
                    .iter()
                    .position(|e| e.is_none_or(|e| e.expires <= now))
            })
            .unwrap_or_else(|| {
                (0..WAYS)
                    .min_by_key(|&i| bucket[i].map(|e| e.expires))
                    .unwrap_or(0)
            });
        bucket[way] = Some(Entry {
            key,
            to,
            expires: now + self.timeout,
        });
    }

    /// Where a later fragment of `key` goes, while fresh.
    pub fn lookup(&self, key: &FragKey, now: Instant) -> Option<FragTo> {
        self.entries[self.bucket(key)]
            .iter()
            .flatten()
            .find(|e| e.key == *key && e.expires > now)
            .map(|e| e.to)
    }
}
