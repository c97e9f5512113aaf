//! Kubernetes `sessionAffinity: ClientIP`: (service, client address) → backend, for
//! `timeoutSeconds` (default [`TIMEOUT_DEFAULT`], 10800 s) after the client was last seen.
//!
//! - **Fixed capacity**, allocated by [`AffinityTable::new`]: 4-way set-associative buckets.
//!   An insert goes to the slot already holding the key, else an empty slot, else the slot
//!   unused for longest (expired entries are the oldest, so they go first).
//! - **Lock-free.** Shared by every worker. Each slot's key and backend sit behind a sequence
//!   lock: a lookup reads them, then checks the sequence did not move, so a read racing a
//!   write is a *miss*, never a wrong backend. An insert that finds its slot being written by
//!   another worker is dropped (returns `false`); the flow still goes where the caller
//!   scheduled it, and the next insert stores it.
//! - **Races.** Two workers inserting the same new key at once may fill two slots; lookups and
//!   later inserts always use the first matching slot of the bucket, so the answer stays
//!   consistent and the other copy ages out. The last-used time (`u32` seconds since the epoch
//!   given to `new`, refreshed by lookups with a relaxed store) is outside the lock: a refresh
//!   racing a replacement can only stamp the new entry with "now", which it just got anyway.
//! - The caller checks that the returned [`BackendId`] is still a usable backend of the
//!   service (it may have been removed or drained since); if not, it schedules and inserts
//!   again, overriding the entry.
//! - **Outlives the process** when made by [`AffinityTable::open`]: the slots live in a state
//!   file (a shared mapping, see the `shm` crate), with a header holding the geometry, the
//!   boot id and the clock epoch; the next process of the boot adopts it (a slot a dead
//!   writer left locked is cleared), so clients keep their backends across a restart. The
//!   file is untrusted input: anything but a regular file of ours with a header of this
//!   table and boot and exactly its size (a directory, a symbolic link, garbage) is set
//!   aside and a new table made; adopted slots that hold no entry are cleared, and the
//!   backend an entry names is the caller's to check, as always.

use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shm::{Existing, Mapping, Plain, Refusal, SetAside, Slab, StateFile};

use crate::BackendId;
use crate::hash::fmix64;
use crate::seqlock::SeqLock;

/// Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(10800);
/// Largest table (slots).
pub const CAPACITY_MAX: usize = 1 << 26;
const WAYS: usize = 4;
const SEED: u64 = 0x6166_6669_6e69_7479;

#[derive(Default)]
#[repr(C)]
struct Slot {
    lock: SeqLock,
    /// `service << 32 | family`, family 4 or 6; 0 = empty.
    head: AtomicU64,
    addr_hi: AtomicU64,
    addr_lo: AtomicU64,
    backend: AtomicU32,
    /// Seconds since the epoch; outside the lock (see the module doc).
    last_used_s: AtomicU32,
}

// SAFETY: repr(C) over integer atomics (the seqlock is one AtomicU64).
unsafe impl Plain for Slot {}

/// The header page of an affinity state file.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU64,
    slots: AtomicU64,
    boot_id: [AtomicU64; 2],
    /// CLOCK_MONOTONIC of second 0, in ns.
    epoch_mono_ns: AtomicU64,
}

// SAFETY: repr(C) over integer atomics.
unsafe impl Plain for Header {}

/// `XVSAFFIN`.
const MAGIC: u64 = u64::from_le_bytes(*b"XVSAFFIN");
/// The slot layout's version; another version is not adopted.
const VERSION: u64 = 1;

/// What [`AffinityTable::open`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AffinityOpened {
    /// No state: a new table.
    Created,
    /// The table of an earlier process of this boot: `entries` client entries kept,
    /// `cleared` slots a dead writer left locked.
    Adopted {
        /// Slots in use.
        entries: usize,
        /// Slots cleared.
        cleared: usize,
    },
    /// A state that could not be adopted (another size, version or boot, a damaged
    /// header, not a regular file of ours): set aside, and a new table made.
    Replaced {
        /// Why: the field and the value found.
        refusal: Refusal,
        /// Where the old file (or link, or directory) was set aside.
        set_aside: SetAside,
    },
}

/// The ClientIP affinity table. See the module doc for its contract.
pub struct AffinityTable {
    slots: Slab<Slot>,
    bucket_mask: usize,
    epoch: Instant,
    /// The state file, locked while the table lives.
    _lock: Option<StateFile>,
    /// The memory `slots` points into; declared last, so dropped after it.
    _mem: Mapping,
}

impl std::fmt::Debug for AffinityTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AffinityTable")
            .field("capacity", &self.slots.len())
            .finish()
    }
}

type Key = [u64; 3];

fn key(service: u32, client: IpAddr) -> Key {
    match client {
        IpAddr::V4(a) => [u64::from(service) << 32 | 4, 0, u64::from(u32::from(a))],
        IpAddr::V6(a) => {
            let b = u128::from(a);
            [u64::from(service) << 32 | 6, (b >> 64) as u64, b as u64]
        }
    }
}

impl AffinityTable {
    /// A table of at least `capacity` entries (rounded up to a power of two, at least 4, at
    /// most [`CAPACITY_MAX`]). Times are stored relative to `epoch`; pass the process start.
    pub fn new(capacity: usize, epoch: Instant) -> AffinityTable {
        let n = Self::slots_for(capacity);
        let mem = Mapping::anonymous(n * std::mem::size_of::<Slot>())
            .expect("mapping the affinity table");
        AffinityTable {
            slots: mem.slab(0, n),
            bucket_mask: n / WAYS - 1,
            epoch,
            _lock: None,
            _mem: mem,
        }
    }

    fn slots_for(capacity: usize) -> usize {
        capacity.clamp(WAYS, CAPACITY_MAX).next_power_of_two()
    }

    /// The bytes of the state file of a table of `capacity` entries (what
    /// [`AffinityTable::open`] reserves).
    pub fn file_bytes(capacity: usize) -> u64 {
        let header = shm::page_round(std::mem::size_of::<Header>());
        (header + Self::slots_for(capacity) * std::mem::size_of::<Slot>()) as u64
    }

    /// The table in state file `path` (see the module doc): the one an earlier process of
    /// this boot left there, or a new one. A state that cannot be adopted (another size,
    /// version or boot, a damaged header, or no regular file of ours: a directory, a
    /// symbolic link...) is set aside (`shm::set_aside`) and a new table made; adopted
    /// slots that are no entry (an unknown family, a last use in the future) are cleared.
    /// The file stays locked while the table lives.
    pub fn open(
        path: &Path,
        capacity: usize,
        now: Instant,
    ) -> io::Result<(AffinityTable, AffinityOpened)> {
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let existing = StateFile::open_existing(path).map_err(named)?;
        Self::open_from(path, existing, capacity, now)
    }

    /// [`AffinityTable::open`] of a state file handed over by a running process (`xvs run
    /// --takeover`, checked and locked by `shm::StateFile::handed`): adopted, or set aside
    /// and replaced, exactly as the file at its path would be.
    pub fn open_handed(
        state: StateFile,
        capacity: usize,
        now: Instant,
    ) -> io::Result<(AffinityTable, AffinityOpened)> {
        let path = state.path.clone();
        Self::open_from(&path, Existing::Open(state), capacity, now)
    }

    /// The state file this table lives in, locked (`None` for a table of this process only):
    /// what a takeover hands over.
    pub fn state_file(&self) -> Option<&std::fs::File> {
        self._lock.as_ref().map(|s| &s.file)
    }

    fn open_from(
        path: &Path,
        existing: Existing,
        capacity: usize,
        now: Instant,
    ) -> io::Result<(AffinityTable, AffinityOpened)> {
        let n = Self::slots_for(capacity);
        let header = shm::page_round(std::mem::size_of::<Header>());
        let total = header + n * std::mem::size_of::<Slot>();
        let boot = shm::boot_id()?;
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let refusal = match existing {
            Existing::Missing => None,
            Existing::Refused(r) => Some(r),
            Existing::Open(state) => match Self::adopt(state, n, total, &boot, now)? {
                Ok(t) => return Ok(t),
                Err(r) => Some(r),
            },
        };
        let replaced = match refusal {
            None => None,
            Some(r) => Some((shm::set_aside(path, &r).map_err(named)?, r)),
        };
        let state = StateFile::create(path, total).map_err(named)?;
        let mem = Mapping::shared(&state.file, total).map_err(named)?;
        let h = mem.one::<Header>(0);
        // Seconds since boot: every later process of the boot shares the epoch.
        let epoch = shm::instant_of(0).unwrap_or(now);
        h.version.store(VERSION, Ordering::Relaxed);
        h.slots.store(n as u64, Ordering::Relaxed);
        h.boot_id[0].store(boot[0], Ordering::Relaxed);
        h.boot_id[1].store(boot[1], Ordering::Relaxed);
        h.epoch_mono_ns
            .store(shm::mono_of(epoch), Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        state.commit().map_err(named)?;
        let t = AffinityTable {
            slots: mem.slab(header, n),
            bucket_mask: n / WAYS - 1,
            epoch,
            _lock: Some(state),
            _mem: mem,
        };
        let opened = match replaced {
            None => AffinityOpened::Created,
            Some((set_aside, refusal)) => AffinityOpened::Replaced { refusal, set_aside },
        };
        Ok((t, opened))
    }

    /// Adopts the locked `state` if its header is one of this table (`n` slots, `total`
    /// bytes, this boot); else why not (the field and the value).
    fn adopt(
        state: StateFile,
        n: usize,
        total: usize,
        boot: &[u64; 2],
        now: Instant,
    ) -> io::Result<Result<(AffinityTable, AffinityOpened), Refusal>> {
        let size = state.size()?;
        let header = shm::page_round(std::mem::size_of::<Header>());
        if size < header {
            return Ok(Err(Refusal::new(
                "size",
                format!("{size} bytes (a header needs {header})"),
            )));
        }
        // The header alone first: the file's size is checked before all of it is mapped.
        let head = Mapping::shared_read(&state.file, header)?;
        let h = head.one::<Header>(0);
        let r = |a: &AtomicU64| a.load(Ordering::Acquire);
        let epoch_ns = r(&h.epoch_mono_ns);
        let why = if r(&h.magic) != MAGIC {
            Refusal::new(
                "magic",
                format!("{:#018x} (not an affinity state)", r(&h.magic)),
            )
        } else if r(&h.version) != VERSION {
            Refusal::new(
                "version",
                format!("{} (this xvs uses {VERSION})", r(&h.version)),
            )
        } else if r(&h.slots) != n as u64 {
            Refusal::new("slots", format!("{} ({n} configured)", r(&h.slots)))
        } else if [r(&h.boot_id[0]), r(&h.boot_id[1])] != *boot {
            Refusal::new("boot_id", "written before the last reboot")
        } else if size != total {
            Refusal::new("size", format!("{size} bytes ({n} slots make {total})"))
        } else if epoch_ns > shm::monotonic_ns() {
            Refusal::new("epoch", format!("{epoch_ns} ns (in the future)"))
        } else if let Some(epoch) = shm::instant_of(epoch_ns) {
            // Every page backed before anything is written through the mapping.
            shm::reserve(&state.file, total as u64)?;
            let mem = Mapping::shared(&state.file, total)?;
            let t = AffinityTable {
                slots: mem.slab(header, n),
                bucket_mask: n / WAYS - 1,
                epoch,
                _lock: Some(state),
                _mem: mem,
            };
            let (entries, cleared) = t.recover(now);
            return Ok(Ok((t, AffinityOpened::Adopted { entries, cleared })));
        } else {
            Refusal::new("epoch", format!("{epoch_ns} ns (out of range)"))
        };
        Ok(Err(why))
    }

    /// Clears slots a dead writer left locked and slots that hold no entry (an unknown
    /// family, an IPv4 key with high bits, a last use in the future, which would never
    /// expire nor be evicted); returns (slots in use, slots cleared).
    fn recover(&self, now: Instant) -> (usize, usize) {
        let now_s = self.secs(now);
        let mut cleared = 0;
        for s in self.slots.iter() {
            let held = s.lock.reset_if_held();
            let head = s.head.load(Ordering::Relaxed);
            let (hi, lo) = (
                s.addr_hi.load(Ordering::Relaxed),
                s.addr_lo.load(Ordering::Relaxed),
            );
            let entry = match head & 0xffff_ffff {
                4 => hi == 0 && lo >> 32 == 0,
                6 => true,
                _ => false,
            };
            let future = s.last_used_s.load(Ordering::Relaxed) > now_s.saturating_add(60);
            if held || (head != 0 && (!entry || future)) {
                s.head.store(0, Ordering::Relaxed);
                s.last_used_s.store(0, Ordering::Relaxed);
                cleared += 1;
            }
        }
        let used = self
            .slots
            .iter()
            .filter(|s| s.head.load(Ordering::Relaxed) != 0)
            .count();
        (used, cleared)
    }

    /// Slots allocated.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn secs(&self, now: Instant) -> u32 {
        now.saturating_duration_since(self.epoch)
            .as_secs()
            .min(u64::from(u32::MAX)) as u32
    }

    #[inline]
    fn bucket(&self, k: &Key) -> &[Slot] {
        let h = fmix64(fmix64(SEED ^ k[0] ^ k[1]) ^ k[2]);
        let b = (h as usize) & self.bucket_mask;
        &self.slots[b * WAYS..(b + 1) * WAYS]
    }

    /// The backend of a slot holding `k`, read consistently.
    #[inline]
    fn read(slot: &Slot, k: &Key) -> Option<BackendId> {
        let stamp = slot.lock.read_begin()?;
        let same = slot.head.load(Ordering::Relaxed) == k[0]
            && slot.addr_hi.load(Ordering::Relaxed) == k[1]
            && slot.addr_lo.load(Ordering::Relaxed) == k[2];
        let backend = slot.backend.load(Ordering::Relaxed);
        (same && slot.lock.read_validate(stamp)).then_some(BackendId(backend))
    }

    /// The client's backend for `service` if it was used within `timeout`; refreshes the
    /// last-used time. Never allocates or blocks.
    #[inline]
    pub fn lookup(
        &self,
        service: u32,
        client: IpAddr,
        now: Instant,
        timeout: Duration,
    ) -> Option<BackendId> {
        let k = key(service, client);
        let now_s = self.secs(now);
        for slot in self.bucket(&k) {
            if let Some(b) = Self::read(slot, &k) {
                let last = slot.last_used_s.load(Ordering::Relaxed);
                if u64::from(now_s.saturating_sub(last)) > timeout.as_secs() {
                    return None;
                }
                if last != now_s {
                    slot.last_used_s.store(now_s, Ordering::Relaxed);
                }
                return Some(b);
            }
        }
        None
    }

    /// Records (or overrides) the client's backend for `service`, last used `now`. Returns
    /// `false` if the chosen slot was being written by another worker and the insert was
    /// dropped.
    pub fn insert(&self, service: u32, client: IpAddr, backend: BackendId, now: Instant) -> bool {
        let k = key(service, client);
        let bucket = self.bucket(&k);
        let victim = bucket
            .iter()
            .position(|s| Self::read(s, &k).is_some())
            .or_else(|| {
                bucket
                    .iter()
                    .position(|s| s.head.load(Ordering::Relaxed) == 0)
            })
            .unwrap_or_else(|| {
                (0..WAYS)
                    .min_by_key(|&i| bucket[i].last_used_s.load(Ordering::Relaxed))
                    .unwrap_or(0)
            });
        let slot = &bucket[victim];
        let Some(_guard) = slot.lock.try_write() else {
            return false;
        };
        slot.head.store(k[0], Ordering::Relaxed);
        slot.addr_hi.store(k[1], Ordering::Relaxed);
        slot.addr_lo.store(k[2], Ordering::Relaxed);
        slot.backend.store(backend.0, Ordering::Relaxed);
        slot.last_used_s.store(self.secs(now), Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn client(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0xC613_0000 + i))
    }

    #[test]
    fn hit_within_timeout_and_use_refreshes() {
        let t0 = Instant::now();
        let t = AffinityTable::new(1024, t0);
        assert_eq!(t.lookup(1, client(1), t0, TIMEOUT_DEFAULT), None);
        assert!(t.insert(1, client(1), BackendId(7), t0));
        let s = Duration::from_secs;
        assert_eq!(
            t.lookup(1, client(1), t0 + s(10800), TIMEOUT_DEFAULT),
            Some(BackendId(7))
        );
        // That lookup refreshed it: 10800 s after it, still there.
        assert_eq!(
            t.lookup(1, client(1), t0 + s(21600), TIMEOUT_DEFAULT),
            Some(BackendId(7))
        );
        // 10801 s idle: expired.
        assert_eq!(t.lookup(1, client(1), t0 + s(32401), TIMEOUT_DEFAULT), None);
        // A shorter per-service timeout applies at lookup.
        t.insert(1, client(2), BackendId(8), t0);
        assert_eq!(t.lookup(1, client(2), t0 + s(61), s(60)), None);
    }

    #[test]
    fn insert_overrides_and_keys_include_service_and_family() {
        let t0 = Instant::now();
        let t = AffinityTable::new(64, t0);
        t.insert(1, client(1), BackendId(7), t0);
        t.insert(1, client(1), BackendId(9), t0);
        assert_eq!(
            t.lookup(1, client(1), t0, TIMEOUT_DEFAULT),
            Some(BackendId(9))
        );
        assert_eq!(t.lookup(2, client(1), t0, TIMEOUT_DEFAULT), None);
        let v6: IpAddr = "::c613:1".parse().unwrap();
        assert_eq!(t.lookup(1, v6, t0, TIMEOUT_DEFAULT), None);
        t.insert(1, v6, BackendId(3), t0);
        assert_eq!(t.lookup(1, v6, t0, TIMEOUT_DEFAULT), Some(BackendId(3)));
        assert_eq!(
            t.lookup(1, client(1), t0, TIMEOUT_DEFAULT),
            Some(BackendId(9))
        );
    }

    #[test]
    fn a_full_bucket_evicts_the_least_recently_used() {
        let t0 = Instant::now();
        let t = AffinityTable::new(4, t0); // one bucket
        let s = Duration::from_secs;
        for i in 0..4 {
            t.insert(1, client(i), BackendId(i), t0 + s(u64::from(i)));
        }
        t.lookup(1, client(0), t0 + s(10), TIMEOUT_DEFAULT).unwrap();
        t.insert(1, client(9), BackendId(9), t0 + s(11));
        assert_eq!(
            t.lookup(1, client(1), t0 + s(11), TIMEOUT_DEFAULT),
            None,
            "LRU evicted"
        );
        for i in [0, 2, 3, 9] {
            assert_eq!(
                t.lookup(1, client(i), t0 + s(11), TIMEOUT_DEFAULT),
                Some(BackendId(i))
            );
        }
    }

    #[test]
    fn concurrent_writers_never_produce_a_wrong_backend() {
        // Each client's backend id encodes the client, so any torn read would show up as a
        // mismatch. Four threads hammer a tiny table (heavy eviction and write collisions).
        let t0 = Instant::now();
        let t = AffinityTable::new(16, t0);
        std::thread::scope(|sc| {
            for w in 0..4u32 {
                let t = &t;
                sc.spawn(move || {
                    for n in 0..20_000u32 {
                        let c = (n * 7 + w) % 64;
                        if n % 3 == 0 {
                            t.insert(5, client(c), BackendId(c * 1000 + 1), t0);
                        } else if let Some(b) = t.lookup(5, client(c), t0, TIMEOUT_DEFAULT) {
                            assert_eq!(b, BackendId(c * 1000 + 1), "torn read for client {c}");
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn a_state_file_keeps_clients_on_their_backends_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("affinity");
        let t0 = Instant::now();
        let (t, opened) = AffinityTable::open(&path, 1024, t0).unwrap();
        assert_eq!(opened, AffinityOpened::Created);
        for i in 0..100 {
            assert!(t.insert(1, client(i), BackendId(i % 7), t0));
        }
        // A writer that died holding slot 0's lock.
        let _held = t.slots[0].lock.try_write().map(std::mem::forget);
        drop(t);

        let (t, opened) = AffinityTable::open(&path, 1024, Instant::now()).unwrap();
        let AffinityOpened::Adopted { entries, cleared } = opened else {
            panic!("{opened:?}")
        };
        assert_eq!(cleared, 1);
        // Slot 0 held a client or was empty: 99 or 100 kept.
        assert!((99..=100).contains(&entries), "{entries}");
        let hits = (0..100)
            .filter(|&i| {
                t.lookup(1, client(i), Instant::now(), TIMEOUT_DEFAULT) == Some(BackendId(i % 7))
            })
            .count();
        assert_eq!(hits, entries);
        // The cleared slot is writable again.
        assert!(t.slots[0].lock.try_write().is_some());
        // Locked while open.
        assert!(AffinityTable::open(&path, 1024, Instant::now()).is_err());
        drop(t);
        // Another size starts afresh.
        let (t, opened) = AffinityTable::open(&path, 4096, Instant::now()).unwrap();
        assert!(
            matches!(opened, AffinityOpened::Replaced { ref refusal, .. } if refusal.value.contains("1024 (4096 configured)")),
            "{opened:?}"
        );
        assert_eq!(
            t.lookup(1, client(1), Instant::now(), TIMEOUT_DEFAULT),
            None
        );
    }

    #[test]
    fn a_handed_state_file_is_adopted_with_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("affinity");
        let t0 = Instant::now();
        let (old, _) = AffinityTable::open(&path, 1024, t0).unwrap();
        for i in 0..50 {
            assert!(old.insert(1, client(i), BackendId(i % 5), t0));
        }
        // The takeover: the old process's descriptor, then its exit.
        let fd = old.state_file().unwrap().try_clone().unwrap();
        let state = StateFile::handed(fd.into(), &path).unwrap();
        drop(old);
        assert!(AffinityTable::open(&path, 1024, Instant::now()).is_err());
        let (t, opened) = AffinityTable::open_handed(state, 1024, Instant::now()).unwrap();
        assert_eq!(
            opened,
            AffinityOpened::Adopted {
                entries: 50,
                cleared: 0
            }
        );
        let now = Instant::now();
        assert!(
            (0..50).all(|i| t.lookup(1, client(i), now, TIMEOUT_DEFAULT) == Some(BackendId(i % 5)))
        );
        // Still locked: the lock came with the descriptor.
        assert!(AffinityTable::open(&path, 1024, Instant::now()).is_err());
        assert!(AffinityTable::new(4, now).state_file().is_none());
    }

    #[test]
    fn a_state_that_is_no_table_is_set_aside_and_garbage_slots_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("affinity");
        let fresh = |path: &Path| {
            let (t, opened) = AffinityTable::open(path, 64, Instant::now()).unwrap();
            let AffinityOpened::Replaced { refusal, set_aside } = opened else {
                panic!("{opened:?}")
            };
            assert!(set_aside.to.symlink_metadata().is_ok(), "kept aside");
            assert_eq!(
                t.lookup(1, client(1), Instant::now(), TIMEOUT_DEFAULT),
                None
            );
            refusal
        };
        // A directory, a symbolic link (to a victim left untouched), a truncated file.
        std::fs::create_dir(&path).unwrap();
        assert_eq!(fresh(&path).field, "type");
        std::fs::remove_file(&path).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"do not touch").unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert_eq!(fresh(&path).field, "type");
        assert_eq!(std::fs::read(&victim).unwrap(), b"do not touch");
        std::fs::remove_file(&path).unwrap();
        let (t, _) = AffinityTable::open(&path, 64, Instant::now()).unwrap();
        drop(t);
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 40)
            .unwrap();
        assert_eq!(fresh(&path).field, "size");
        // A sparse terabyte: refused by its size, never mapped whole.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        assert_eq!(fresh(&path).field, "size");
        // Slots that hold no entry: an unknown family, a last use far in the future.
        let t0 = Instant::now();
        let (t, _) = AffinityTable::open(&path, 64, t0).unwrap();
        for i in 0..3 {
            assert!(t.insert(1, client(i), BackendId(i), t0));
        }
        let used: Vec<&Slot> = t
            .slots
            .iter()
            .filter(|s| s.head.load(Ordering::Relaxed) != 0)
            .collect();
        used[0].head.store(1 << 32 | 9, Ordering::Relaxed);
        used[1].last_used_s.store(u32::MAX, Ordering::Relaxed);
        drop(t);
        let (t, opened) = AffinityTable::open(&path, 64, t0).unwrap();
        assert_eq!(
            opened,
            AffinityOpened::Adopted {
                entries: 1,
                cleared: 2
            }
        );
        assert_eq!(
            (0..3)
                .filter(|&i| t.lookup(1, client(i), t0, TIMEOUT_DEFAULT).is_some())
                .count(),
            1
        );
    }
}
