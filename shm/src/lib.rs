//! Shared memory that outlives the process: the flow table and the ClientIP affinity table
//! live in mappings of files on tmpfs (`/run/xvs`), so every store a worker made is in the
//! file however the process ended, and the next process of the same boot adopts them.
//!
//! - [`Mapping`]: anonymous memory (a table of this process only) or a shared mapping of a
//!   file, unmapped on drop.
//! - [`Slab`] and [`One`]: typed views into a mapping, of [`Plain`] types only (integers and
//!   integer atomics), so any bytes a previous process left are a valid value and the
//!   owner's own checks decide what they mean. The owner keeps the mapping alive at least as
//!   long as its views (declare it last in the struct).
//! - [`StateFile`]: open or create a state file under an exclusive `flock`, so two processes
//!   never share one; state files are untrusted input (`file.rs`: no symbolic link is
//!   followed, files others could write are refused, space is reserved up front, refused
//!   files are set aside with a [`Refusal`]).
//! - Identity and time across processes: [`boot_id`], [`monotonic_ns`] and the conversions
//!   between it and `Instant` (which reads CLOCK_MONOTONIC on Linux), so a state can store
//!   its clock epoch and the next process can continue it.
// Product functions stay within clippy.toml's 70 lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::fs::File;
use std::io;
use std::ops::Deref;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

mod file;
mod handed;

pub use file::{
    Existing, REFUSED_KEEP, Refusal, SetAside, StateFile, bytes, check_dir, create_temp,
    free_bytes, refused_in, remove_any, reserve, set_aside, stale_temp, untrusted, untrusted_at,
};

/// A transparent huge page (x86-64, arm64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// Types for which every bit pattern is a valid value, with no drop glue: safe to view in
/// mapped memory.
///
/// # Safety
/// Implement only for `repr(C)`/`repr(transparent)`/`repr(align)` types made of integers and
/// integer atomics (arrays included).
pub unsafe trait Plain: Sync {}

// SAFETY: an integer atomic is its integer in memory.
unsafe impl Plain for std::sync::atomic::AtomicU64 {}
// SAFETY: as above.
unsafe impl Plain for std::sync::atomic::AtomicU32 {}
// SAFETY: as above.
unsafe impl Plain for std::sync::atomic::AtomicUsize {}
// SAFETY: arrays of Plain values are Plain.
unsafe impl<T: Plain, const N: usize> Plain for [T; N] {}

/// The page size assumed for offsets (4 KiB; a bigger page only wastes address space).
pub const PAGE: usize = 4096;

/// `n` rounded up to whole pages.
pub const fn page_round(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

/// A memory mapping, unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; every access goes through atomics in slabs.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes of zeroed private memory.
    pub fn anonymous(len: usize) -> io::Result<Mapping> {
        Self::map(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
        )
    }

    /// The first `len` bytes of `file`, shared: stores reach the file's pages, so they
    /// outlive the process however it ends.
    pub fn shared(file: &File, len: usize) -> io::Result<Mapping> {
        Self::map(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
        )
    }

    /// The first `len` bytes of `file`, shared and read-only.
    pub fn shared_read(file: &File, len: usize) -> io::Result<Mapping> {
        Self::map(len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd())
    }

    fn map(len: usize, prot: i32, flags: i32, fd: i32) -> io::Result<Mapping> {
        let len = page_round(len.max(1));
        // SAFETY: a fresh mapping chosen by the kernel; checked for failure below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap never returns null on success"),
            len,
        })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: a mapping has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `n` values of `T` at byte `offset`.
    ///
    /// # Panics
    /// If the range is out of the mapping or misaligned (offsets come from the owner's
    /// layout code, so that is a bug).
    pub fn slab<T: Plain>(&self, offset: usize, n: usize) -> Slab<T> {
        let bytes = n.checked_mul(std::mem::size_of::<T>()).expect("slab size");
        assert!(
            offset.checked_add(bytes).is_some_and(|end| end <= self.len),
            "slab out of the mapping"
        );
        assert_eq!(offset % std::mem::align_of::<T>(), 0, "misaligned slab");
        // SAFETY: in bounds (checked above) of a live mapping.
        let ptr = unsafe { self.ptr.as_ptr().add(offset) };
        Slab {
            ptr: NonNull::new(ptr.cast()).expect("non-null"),
            len: n,
        }
    }

    /// The `T` at byte `offset` (see [`Mapping::slab`]).
    pub fn one<T: Plain>(&self, offset: usize) -> One<T> {
        One(self.slab(offset, 1))
    }

    /// Faults every page of the mapping in, writable, without changing a byte
    /// (`MADV_POPULATE_WRITE`): a shared mapping of a file that is already in memory costs
    /// a page fault per page at its first touch; this pays them now, so that a later pass
    /// over the memory does not. An error (a kernel before 5.14) only means they are paid
    /// later.
    pub fn populate(&self) -> io::Result<()> {
        // SAFETY: advice on our own mapping; no content changes.
        let r = unsafe {
            libc::madvise(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Advises the kernel to back the mapping with huge pages where it can (a hint), when
    /// it spans at least one (2 MiB). A flow table's lookups land anywhere in it: with 4 KiB
    /// pages most miss the TLB (the pipeline bench at 1M flows: 18.3 Mpps established with
    /// them, 23.9 with huge pages). Anonymous memory takes the advice where
    /// `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` or `always`; a state file on
    /// tmpfs only where `.../shmem_enabled` is `advise`, `within_size` or `always`.
    pub fn advise_huge(&self) {
        if self.len < HUGE_PAGE {
            return;
        }
        // SAFETY: advice on our own mapping; failure is harmless.
        unsafe {
            libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_HUGEPAGE);
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; the owner drops its slabs before.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A slice of [`Plain`] values in a mapping.
pub struct Slab<T> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: a slab is a shared view of `T`s that are `Sync` (Plain requires it).
unsafe impl<T: Sync> Send for Slab<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Slab<T> {}

impl<T> Deref for Slab<T> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr..ptr+len` lies in a live mapping (the owner's contract), aligned for
        // T, and T is Plain.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

/// One [`Plain`] value in a mapping.
pub struct One<T>(Slab<T>);

impl<T> Deref for One<T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0[0]
    }
}

/// The boot id of this boot (`/proc/sys/kernel/random/boot_id`) as two words: state of
/// another boot (flows, monotonic times) means nothing.
pub fn boot_id() -> io::Result<[u64; 2]> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return Err(io::Error::other(format!("unexpected boot_id {s:?}")));
    }
    let parse = |h: &str| u64::from_str_radix(h, 16).map_err(io::Error::other);
    Ok([parse(&hex[..16])?, parse(&hex[16..])?])
}

/// CLOCK_MONOTONIC now, in ns: the clock `Instant` reads on Linux, and what BPF programs'
/// `bpf_ktime_get_ns` returns.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `t` on CLOCK_MONOTONIC, in ns.
pub fn mono_of(t: Instant) -> u64 {
    let (now_i, now_ns) = (Instant::now(), monotonic_ns());
    if t <= now_i {
        now_ns.saturating_sub(now_i.duration_since(t).as_nanos() as u64)
    } else {
        now_ns + t.duration_since(now_i).as_nanos() as u64
    }
}

/// The `Instant` of a CLOCK_MONOTONIC time in ns, if this process can represent it.
pub fn instant_of(ns: u64) -> Option<Instant> {
    let (now_i, now_ns) = (Instant::now(), monotonic_ns());
    if ns <= now_ns {
        now_i.checked_sub(Duration::from_nanos(now_ns - ns))
    } else {
        now_i.checked_add(Duration::from_nanos(ns - now_ns))
    }
}

/// A random 64-bit value from the kernel.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: fills our 8-byte buffer; a short read leaves zeros, mixed with the time below.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let r = u64::from_le_bytes(b);
    if n == 8 {
        r
    } else {
        r ^ monotonic_ns().rotate_left(17)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn a_shared_mapping_outlives_its_mapping_and_is_locked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        {
            let f = StateFile::create(&path, 3 * PAGE).unwrap();
            let m = Mapping::shared(&f.file, f.size().unwrap()).unwrap();
            let s: Slab<AtomicU64> = m.slab(PAGE, 4);
            s[3].store(42, Ordering::Relaxed);
            f.commit().unwrap();
            // Locked while open, by this process too (flock is per open file).
            let e = StateFile::open_existing(&path).unwrap_err();
            assert!(e.to_string().contains("in use"), "{e}");
        }
        let Existing::Open(f) = StateFile::open_existing(&path).unwrap() else {
            panic!("not opened")
        };
        let m = Mapping::shared(&f.file, f.size().unwrap()).unwrap();
        let one: One<AtomicU64> = m.one(PAGE + 24);
        assert_eq!(one.load(Ordering::Relaxed), 42);
        assert!(matches!(
            StateFile::open_existing(&dir.path().join("none")).unwrap(),
            Existing::Missing
        ));
    }

    #[test]
    #[should_panic(expected = "slab out of the mapping")]
    fn slabs_stay_inside() {
        let m = Mapping::anonymous(PAGE).unwrap();
        let _s: Slab<AtomicU64> = m.slab(PAGE - 8, 2);
    }

    #[test]
    fn monotonic_round_trip_and_boot_id() {
        let t = Instant::now() - Duration::from_secs(3);
        let back = instant_of(mono_of(t)).unwrap();
        let err = if back > t { back - t } else { t - back };
        // Two clock reads apart: a unit or sign error would be off by seconds.
        assert!(err < Duration::from_millis(500), "{err:?}");
        let b = boot_id().unwrap();
        assert_eq!(b, boot_id().unwrap());
        assert_ne!(b, [0, 0]);
        assert_ne!(random_u64(), random_u64());
    }
}
