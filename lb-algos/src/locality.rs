//! The lock-free locality table behind lblc and lblcr: destination IP → a small set of backend
//! indices, with last-use and last-modification times.
//!
//! - **Fixed capacity.** Allocated at build: `entries` slots in 4-way buckets. An insert into a
//!   full bucket replaces the entry unused for longest (IPVS instead grows a hash list and
//!   expires entries from a timer; we expire lazily on lookup, using the caller's `now`).
//! - **Concurrency.** Each slot's contents sit behind a [`SeqLock`]: lookups never block and
//!   never return a torn entry; a write that finds the slot busy is skipped (a lost update
//!   costs one re-schedule). Read-modify-write by two workers at once is last-writer-wins.
//!   The last-use time lives outside the lock and is refreshed with a relaxed store at most
//!   once a second; a refresh racing a replacement only extends the new entry's life by that
//!   race.
//! - **Time** is milliseconds since an epoch fixed by the first `now` ever seen (see
//!   [`Epoch`]); earlier `now`s from other workers saturate to 0.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use crate::hash::fmix64;
use crate::seqlock::SeqLock;

/// Most locality entries per scheduler.
pub const ENTRIES_MAX: u32 = 1 << 22;
/// Backends one lblcr server set holds (IPVS's sets are unbounded lists; they grow by one per
/// overload episode and shrink once per expiration period).
pub(crate) const SET_MAX: usize = 8;
const WAYS: usize = 4;
const SEED: u64 = 0x6c62_6c63_0000_0001;
/// Last-use refresh granularity: keeps the shared cache line clean on hot entries.
const REFRESH_MS: u64 = 1000;

/// A copy of one entry's server set. `members[..len]`, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) members: [u32; SET_MAX],
    pub(crate) len: usize,
    pub(crate) lastmod_ms: u64,
}

impl Entry {
    pub(crate) fn one(d: u32, now_ms: u64) -> Entry {
        let mut members = [0; SET_MAX];
        members[0] = d;
        Entry {
            members,
            len: 1,
            lastmod_ms: now_ms,
        }
    }

    pub(crate) fn set(&self) -> &[u32] {
        &self.members[..self.len]
    }

    pub(crate) fn contains(&self, d: u32) -> bool {
        self.set().contains(&d)
    }

    pub(crate) fn remove(&mut self, d: u32) {
        if let Some(at) = self.set().iter().position(|&m| m == d) {
            self.members.copy_within(at + 1..self.len, at);
            self.len -= 1;
        }
    }

    /// Appends `d` (newest); the caller makes room first.
    pub(crate) fn push(&mut self, d: u32) {
        debug_assert!(self.len < SET_MAX);
        self.members[self.len] = d;
        self.len += 1;
    }
}

#[derive(Default)]
struct Slot {
    lock: SeqLock,
    /// `[tag, high, low]`: tag 0 = empty, 4 = IPv4, 6 = IPv6.
    key: [AtomicU64; 3],
    len: AtomicU32,
    members: [AtomicU32; SET_MAX],
    lastmod_ms: AtomicU64,
    /// Outside the seqlock: see the module doc.
    lastuse_ms: AtomicU64,
}

fn key_words(ip: IpAddr) -> [u64; 3] {
    match ip {
        IpAddr::V4(a) => [4, 0, u64::from(u32::from(a))],
        IpAddr::V6(a) => {
            let b = u128::from(a);
            [6, (b >> 64) as u64, b as u64]
        }
    }
}

pub(crate) struct LocalityTable {
    slots: Box<[Slot]>,
    bucket_mask: usize,
    epoch: Epoch,
}

impl std::fmt::Debug for LocalityTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalityTable")
            .field("entries", &self.slots.len())
            .finish()
    }
}

impl LocalityTable {
    /// `entries` is rounded up to a power of two, at least one bucket.
    pub(crate) fn new(entries: u32) -> LocalityTable {
        let n = (entries as usize).next_power_of_two().max(WAYS);
        LocalityTable {
            slots: (0..n).map(|_| Slot::default()).collect(),
            bucket_mask: n / WAYS - 1,
            epoch: Epoch::default(),
        }
    }

    /// `now` as table time, or `None` in the instant another thread is fixing the epoch (the
    /// caller then schedules without the table).
    #[inline]
    pub(crate) fn now_ms(&self, now: Instant) -> Option<u64> {
        let epoch = self.epoch.get_or_init(now)?;
        Some(now.saturating_duration_since(epoch).as_millis() as u64)
    }

    #[inline]
    fn bucket(&self, key: &[u64; 3]) -> &[Slot] {
        let h = fmix64(fmix64(SEED ^ key[1]) ^ key[2] ^ (key[0] << 56));
        let b = (h as usize) & self.bucket_mask;
        &self.slots[b * WAYS..(b + 1) * WAYS]
    }

    /// A consistent copy of `slot` if it holds `key`.
    #[inline]
    fn read(slot: &Slot, key: &[u64; 3]) -> Option<Entry> {
        let stamp = slot.lock.read_begin()?;
        if slot
            .key
            .iter()
            .zip(key)
            .any(|(a, &k)| a.load(Ordering::Relaxed) != k)
        {
            return None;
        }
        let len = (slot.len.load(Ordering::Relaxed) as usize).min(SET_MAX);
        let mut members = [0; SET_MAX];
        for (m, a) in members.iter_mut().zip(&slot.members).take(len) {
            *m = a.load(Ordering::Relaxed);
        }
        let lastmod_ms = slot.lastmod_ms.load(Ordering::Relaxed);
        slot.lock.read_validate(stamp).then_some(Entry {
            members,
            len,
            lastmod_ms,
        })
    }

    /// The live entry for `ip`, refreshing its last use; `None` if absent or unused for more
    /// than `expire_ms`.
    #[inline]
    pub(crate) fn get(&self, ip: IpAddr, now_ms: u64, expire_ms: u64) -> Option<Entry> {
        let key = key_words(ip);
        for slot in self.bucket(&key) {
            if let Some(e) = Self::read(slot, &key) {
                let last = slot.lastuse_ms.load(Ordering::Relaxed);
                if now_ms.saturating_sub(last) > expire_ms {
                    return None;
                }
                if now_ms >= last + REFRESH_MS {
                    slot.lastuse_ms.store(now_ms, Ordering::Relaxed);
                }
                return Some(e);
            }
        }
        None
    }

    /// Stores `entry` for `ip`: over the slot already holding `ip`, else an empty one, else
    /// the one unused for longest. Skipped if that slot is being written.
    pub(crate) fn put(&self, ip: IpAddr, entry: &Entry, now_ms: u64) {
        let key = key_words(ip);
        let bucket = self.bucket(&key);
        let victim = bucket
            .iter()
            .position(|s| Self::read(s, &key).is_some())
            .or_else(|| {
                bucket
                    .iter()
                    .position(|s| s.key[0].load(Ordering::Relaxed) == 0)
            })
            .unwrap_or_else(|| {
                (0..WAYS)
                    .min_by_key(|&i| bucket[i].lastuse_ms.load(Ordering::Relaxed))
                    .unwrap_or(0)
            });
        let slot = &bucket[victim];
        let Some(_guard) = slot.lock.try_write() else {
            return;
        };
        for (a, &k) in slot.key.iter().zip(&key) {
            a.store(k, Ordering::Relaxed);
        }
        slot.len.store(entry.len as u32, Ordering::Relaxed);
        for (a, &m) in slot.members.iter().zip(entry.set()) {
            a.store(m, Ordering::Relaxed);
        }
        slot.lastmod_ms.store(entry.lastmod_ms, Ordering::Relaxed);
        slot.lastuse_ms.store(now_ms, Ordering::Relaxed);
    }
}

/// An `Instant` set once, by the first `now` a table sees, without locks: whoever wins the
/// `UNSET → WRITING` race writes it; readers that catch it mid-write get `None`.
pub(crate) struct Epoch {
    state: AtomicU8,
    value: UnsafeCell<MaybeUninit<Instant>>,
}

const UNSET: u8 = 0;
const WRITING: u8 = 1;
const READY: u8 = 2;

// SAFETY: `value` is written exactly once, by the thread that moved `state` from UNSET to
// WRITING, before it publishes READY with Release; it is read only after an Acquire load of
// READY, and never written again.
unsafe impl Sync for Epoch {}

impl Default for Epoch {
    fn default() -> Self {
        Epoch {
            state: AtomicU8::new(UNSET),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }
}

impl Epoch {
    #[inline]
    pub(crate) fn get_or_init(&self, now: Instant) -> Option<Instant> {
        match self.state.load(Ordering::Acquire) {
            // SAFETY: READY was published after the one write (see `impl Sync`).
            READY => Some(unsafe { (*self.value.get()).assume_init() }),
            UNSET => {
                if self
                    .state
                    .compare_exchange(UNSET, WRITING, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
                {
                    return None;
                }
                // SAFETY: we own the WRITING state, so no other thread touches `value`.
                unsafe { (*self.value.get()).write(now) };
                self.state.store(READY, Ordering::Release);
                Some(now)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use super::*;

    fn ip(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0xC612_0000 + i))
    }

    #[test]
    fn put_get_expire_and_collisions_replace_the_oldest() {
        let t = LocalityTable::new(4); // one bucket of four
        for i in 0..4 {
            t.put(ip(i), &Entry::one(i, 0), i as u64 * 10_000);
        }
        for i in 0..4 {
            assert_eq!(t.get(ip(i), 40_000, 60_000).unwrap().set(), [i]);
        }
        // All four refreshed at 40 s except none is older... touch 1..4 again later.
        for i in 1..4 {
            t.get(ip(i), 50_000, 60_000).unwrap();
        }
        t.put(ip(9), &Entry::one(9, 0), 50_000);
        assert!(t.get(ip(0), 50_000, 60_000).is_none(), "oldest evicted");
        assert_eq!(t.get(ip(9), 50_000, 60_000).unwrap().set(), [9]);
        // Unused for more than the expiry: gone.
        assert!(t.get(ip(9), 50_000 + 60_001, 60_000).is_none());
    }

    #[test]
    fn ipv4_and_ipv6_keys_do_not_alias() {
        let t = LocalityTable::new(64);
        let v4 = ip(1);
        let v6: IpAddr = "::c612:1".parse().unwrap();
        t.put(v4, &Entry::one(1, 0), 0);
        assert!(t.get(v6, 0, 1000).is_none());
    }

    #[test]
    fn entry_set_operations() {
        let mut e = Entry::one(3, 5);
        e.push(7);
        e.push(9);
        e.remove(7);
        assert_eq!(e.set(), [3, 9]);
        assert!(e.contains(9) && !e.contains(7));
    }

    #[test]
    fn epoch_is_the_first_now() {
        let e = Epoch::default();
        let t0 = Instant::now();
        assert_eq!(
            e.get_or_init(t0 + Duration::from_secs(5)),
            Some(t0 + Duration::from_secs(5))
        );
        assert_eq!(e.get_or_init(t0), Some(t0 + Duration::from_secs(5)));
    }
}
