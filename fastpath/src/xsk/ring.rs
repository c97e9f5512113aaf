//! The four rings of an AF_XDP socket and its UMEM's frames, mapped by xvs itself from the
//! socket's descriptor: what the worker polls, whether the socket was opened here (xsk-rs
//! created it) or received from the previous process at a takeover ([`super::handover`]).
//!
//! # Contract
//!
//! - **Mapped from the fd.** [`Rings::map`] asks the kernel for the rings' offsets
//!   (`XDP_MMAP_OFFSETS`) and maps each ring of a bound socket again (Linux allows mapping
//!   the rings of a bound socket: the fill and completion rings are then the buffer pool's).
//!   A mapping holds the socket's file, so the rings stay valid while a [`Rings`] lives.
//! - **The same indices as libxdp.** A producer ring (fill, tx) keeps a cached producer and
//!   a cached consumer (plus the ring size), a consumer ring (rx, completion) the reverse,
//!   exactly as libxdp's `xsk_ring_prod`/`xsk_ring_cons` do; the shared indices are written
//!   with release and read with acquire ordering. A ring mapped from a socket someone else
//!   used starts from the shared producer and consumer indices as they are once the old
//!   owner has stopped ([`Rings::resync`]: mapped earlier, they are read again then), so the
//!   new owner continues where the old one stopped, provided the old one reserved nothing
//!   it did not submit and peeked nothing it did not release (the calls here never leave
//!   either).
//! - **Frames.** [`Desc`] is the kernel's `struct xdp_desc`; [`Area`] is the UMEM as
//!   memory: a frame's data starts at its descriptor's address and its buffer runs to the
//!   end of its chunk (aligned mode: chunks of `frame_size`, a power of two). A descriptor
//!   outside the area yields an empty slice rather than memory past it.
//!
//! Nothing here allocates after mapping; the per-frame calls are a few loads and stores.

use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// `XDP_PGOFF_RX_RING` (`linux/if_xdp.h`).
const PGOFF_RX: i64 = 0;
/// `XDP_PGOFF_TX_RING`.
const PGOFF_TX: i64 = 0x8000_0000;
/// `XDP_UMEM_PGOFF_FILL_RING`.
const PGOFF_FILL: i64 = 0x1_0000_0000;
/// `XDP_UMEM_PGOFF_COMPLETION_RING`.
const PGOFF_COMP: i64 = 0x1_8000_0000;
/// Largest ring xvs maps (entries); the config's ring sizes are far below.
pub const RING_MAX: u32 = 1 << 20;

/// A frame descriptor as the rx and tx rings hold it (`struct xdp_desc`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    /// Offset of the frame's data in the UMEM.
    pub addr: u64,
    /// Length of the frame's data.
    pub len: u32,
    /// `XDP_PKT_CONTD` and friends.
    pub options: u32,
}

/// One shared mapping of a descriptor (a ring, a handed-over UMEM): unmapped on drop.
#[derive(Debug)]
pub(super) struct Map {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; the ring types that use it are moved whole
// into one worker thread.
unsafe impl Send for Map {}

impl Map {
    /// Maps `len` bytes of `fd` from page `pgoff`, read-write, shared, populated.
    pub(super) fn new(fd: RawFd, len: usize, pgoff: i64) -> io::Result<Map> {
        // SAFETY: mapping a descriptor's memory: the kernel checks the offset and the
        // length against the object (a ring, a file of at least `len` bytes).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Map {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
        })
    }

    /// The mapping's first byte.
    pub(super) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    fn at<T>(&self, off: u64) -> *mut T {
        // SAFETY (of the callers' use): the kernel's offsets lie inside the ring's mapping.
        self.ptr.as_ptr().wrapping_add(off as usize).cast()
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The shared part of a ring: its mapping and the pointers into it.
#[derive(Debug)]
struct Shared {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut u8,
    mask: u32,
    size: u32,
    _map: Map,
}

// SAFETY: see `Map`.
unsafe impl Send for Shared {}

impl Shared {
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        entry: usize,
        pgoff: i64,
    ) -> io::Result<Shared> {
        if !size.is_power_of_two() || size > RING_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ring size {size} is not a power of two up to {RING_MAX}"),
            ));
        }
        let len = off.desc as usize + size as usize * entry;
        let map = Map::new(fd, len, pgoff)?;
        Ok(Shared {
            producer: map.at(off.producer),
            consumer: map.at(off.consumer),
            flags: map.at(off.flags),
            descs: map.at(off.desc),
            mask: size - 1,
            size,
            _map: map,
        })
    }

    #[inline]
    fn producer(&self) -> &AtomicU32 {
        // SAFETY: a u32 the kernel keeps aligned inside the mapping, which lives with self.
        unsafe { &*self.producer }
    }

    #[inline]
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as `producer`.
        unsafe { &*self.consumer }
    }

    #[inline]
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as `producer`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// A ring userspace produces to (fill, tx).
#[derive(Debug)]
pub struct Prod {
    ring: Shared,
    cached_prod: u32,
    cached_cons: u32,
}

impl Prod {
    fn new(ring: Shared) -> Prod {
        let mut p = Prod {
            ring,
            cached_prod: 0,
            cached_cons: 0,
        };
        p.resync();
        p
    }

    /// Takes the shared indices as they are now (a ring another owner used until now).
    fn resync(&mut self) {
        self.cached_prod = self.ring.producer().load(Ordering::Acquire);
        self.cached_cons = self
            .ring
            .consumer()
            .load(Ordering::Acquire)
            .wrapping_add(self.ring.size);
    }

    #[inline]
    fn nb_free(&mut self, nb: u32) -> u32 {
        let free = self.cached_cons.wrapping_sub(self.cached_prod);
        if free >= nb {
            return free;
        }
        self.cached_cons = self
            .ring
            .consumer()
            .load(Ordering::Acquire)
            .wrapping_add(self.ring.size);
        self.cached_cons.wrapping_sub(self.cached_prod)
    }

    /// Free entries, read from the kernel's consumer index now.
    #[inline]
    pub fn nb_free_exact(&mut self) -> u32 {
        self.nb_free(self.ring.size)
    }

    /// Whether the kernel asks for a wake-up (`XDP_USE_NEED_WAKEUP`).
    #[inline]
    pub fn needs_wakeup(&self) -> bool {
        self.ring.needs_wakeup()
    }

    /// Reserves `n` entries (all or none), writes entry `i` with `write(base, slot, i)`,
    /// submits them.
    #[inline]
    fn produce_with(&mut self, n: u32, mut write: impl FnMut(*mut u8, usize, usize)) -> usize {
        if n == 0 || self.nb_free(n) < n {
            return 0;
        }
        let idx = self.cached_prod;
        self.cached_prod = self.cached_prod.wrapping_add(n);
        for i in 0..n {
            let slot = (idx.wrapping_add(i) & self.ring.mask) as usize;
            write(self.ring.descs, slot, i as usize);
        }
        self.ring
            .producer()
            .store(self.cached_prod, Ordering::Release);
        n as usize
    }

    /// Produces `descs` to a tx ring (all or none); returns how many.
    ///
    /// # Safety
    ///
    /// This must be a tx ring, and the descriptors frames of its UMEM owned by the caller;
    /// the kernel owns them from here until they come back on the completion ring.
    #[inline]
    pub unsafe fn produce_tx(&mut self, descs: &[Desc]) -> usize {
        self.produce_with(descs.len() as u32, |base, slot, i| {
            // SAFETY: a slot of the ring's descriptor array (masked index).
            unsafe { base.cast::<Desc>().add(slot).write(descs[i]) }
        })
    }

    /// Produces the addresses of `descs` to a fill ring (all or none); returns how many.
    ///
    /// # Safety
    ///
    /// This must be a fill ring, and the descriptors free frames of its UMEM; the kernel
    /// owns them until they come back on an rx ring.
    #[inline]
    pub unsafe fn produce_fill(&mut self, descs: &[Desc]) -> usize {
        self.produce_with(descs.len() as u32, |base, slot, i| {
            // SAFETY: a slot of the ring's address array (masked index).
            unsafe { base.cast::<u64>().add(slot).write(descs[i].addr) }
        })
    }
}

/// A ring userspace consumes from (rx, completion).
#[derive(Debug)]
pub struct Cons {
    ring: Shared,
    cached_prod: u32,
    cached_cons: u32,
}

impl Cons {
    fn new(ring: Shared) -> Cons {
        let mut c = Cons {
            ring,
            cached_prod: 0,
            cached_cons: 0,
        };
        c.resync();
        c
    }

    /// Takes the shared indices as they are now (a ring another owner used until now).
    fn resync(&mut self) {
        self.cached_cons = self.ring.consumer().load(Ordering::Acquire);
        self.cached_prod = self.ring.producer().load(Ordering::Acquire);
    }

    #[inline]
    fn peek(&mut self, nb: u32) -> (u32, u32) {
        let mut entries = self.cached_prod.wrapping_sub(self.cached_cons);
        if entries == 0 {
            self.cached_prod = self.ring.producer().load(Ordering::Acquire);
            entries = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        let n = entries.min(nb);
        let idx = self.cached_cons;
        self.cached_cons = self.cached_cons.wrapping_add(n);
        (idx, n)
    }

    #[inline]
    fn release(&self, n: u32) {
        let c = self.ring.consumer();
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Release);
    }

    /// Takes up to `out.len()` descriptors off an rx ring; returns how many.
    ///
    /// # Safety
    ///
    /// This must be an rx ring; the frames described are the caller's from here.
    #[inline]
    pub unsafe fn consume_rx(&mut self, out: &mut [Desc]) -> usize {
        let (idx, n) = self.peek(out.len() as u32);
        let base = self.ring.descs.cast::<Desc>();
        for (i, d) in out[..n as usize].iter_mut().enumerate() {
            let slot = (idx.wrapping_add(i as u32) & self.ring.mask) as usize;
            // SAFETY: a slot of the ring the kernel produced (masked index).
            *d = unsafe { base.add(slot).read() };
        }
        self.release(n);
        n as usize
    }

    /// Takes up to `out.len()` completed addresses off a completion ring (lengths zeroed);
    /// returns how many.
    ///
    /// # Safety
    ///
    /// This must be a completion ring; the frames are the caller's from here.
    #[inline]
    pub unsafe fn consume_comp(&mut self, out: &mut [Desc]) -> usize {
        let (idx, n) = self.peek(out.len() as u32);
        let base = self.ring.descs.cast::<u64>();
        for (i, d) in out[..n as usize].iter_mut().enumerate() {
            let slot = (idx.wrapping_add(i as u32) & self.ring.mask) as usize;
            // SAFETY: a slot of the ring the kernel produced (masked index).
            let addr = unsafe { base.add(slot).read() };
            *d = Desc {
                addr,
                len: 0,
                options: 0,
            };
        }
        self.release(n);
        n as usize
    }
}

/// Ring sizes of one socket (entries, powers of two): rx and fill share `rx_ring_size`, tx
/// and completion `tx_ring_size`, as xvs opens them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSizes {
    /// Entries of the rx and fill rings.
    pub rx: u32,
    /// Entries of the tx and completion rings.
    pub tx: u32,
}

/// The four rings of one socket.
#[derive(Debug)]
pub struct Rings {
    /// Received frames.
    pub rx: Cons,
    /// Frames to send.
    pub tx: Prod,
    /// Free frames for the kernel to receive into.
    pub fill: Prod,
    /// Frames the kernel has sent.
    pub comp: Cons,
}

impl Rings {
    /// Takes every ring's shared indices as they are now: the cached copies were read when
    /// the rings were mapped, and whoever used them since (the previous owner, until its
    /// worker stopped) has moved them. Must be called once nobody else uses the rings and
    /// before this owner does.
    pub fn resync(&mut self) {
        self.rx.resync();
        self.tx.resync();
        self.fill.resync();
        self.comp.resync();
    }

    /// Maps the rings of the bound AF_XDP socket `fd`, sized `sizes`.
    pub fn map(fd: RawFd, sizes: RingSizes) -> io::Result<Rings> {
        let off = mmap_offsets(fd)?;
        let desc = std::mem::size_of::<Desc>();
        let addr = std::mem::size_of::<u64>();
        Ok(Rings {
            rx: Cons::new(Shared::map(fd, &off.rx, sizes.rx, desc, PGOFF_RX)?),
            tx: Prod::new(Shared::map(fd, &off.tx, sizes.tx, desc, PGOFF_TX)?),
            fill: Prod::new(Shared::map(fd, &off.fr, sizes.rx, addr, PGOFF_FILL)?),
            comp: Cons::new(Shared::map(fd, &off.cr, sizes.tx, addr, PGOFF_COMP)?),
        })
    }
}

/// The kernel's offsets of the rings of `fd` (`XDP_MMAP_OFFSETS`).
fn mmap_offsets(fd: RawFd) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: `xdp_mmap_offsets` is plain u64 offsets.
    let (off, len) = unsafe {
        super::sockopt::<libc::xdp_mmap_offsets>(fd, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS)?
    };
    if len != std::mem::size_of::<libc::xdp_mmap_offsets>() {
        return Err(io::Error::other(format!(
            "XDP_MMAP_OFFSETS of {len} bytes: a kernel without the rings' flags field"
        )));
    }
    Ok(off)
}

/// A UMEM as memory: `len` bytes at `base`, in chunks of `frame_size`.
#[derive(Debug)]
pub struct Area {
    base: NonNull<u8>,
    len: usize,
    frame_size: usize,
}

// SAFETY: plain shared memory, moved whole into one worker thread.
unsafe impl Send for Area {}

impl Area {
    /// The area at `base`, `len` bytes, chunks of `frame_size` (a power of two).
    ///
    /// # Safety
    ///
    /// `base..base + len` must stay mapped while the area is used, and hold nothing but the
    /// UMEM's frames.
    pub unsafe fn new(base: NonNull<u8>, len: usize, frame_size: usize) -> Area {
        Area {
            base,
            len,
            frame_size,
        }
    }

    /// The area's start.
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Chunk size.
    pub fn frame_size(&self) -> usize {
        self.frame_size
    }

    /// The bytes from `d.addr` to the end of its chunk (empty if `d` is outside the area).
    ///
    /// # Safety
    ///
    /// The frame must be the caller's alone (taken off an rx or completion ring, or free),
    /// and the slice must not outlive the area.
    #[inline]
    pub unsafe fn buffer<'a>(&self, d: &Desc) -> &'a mut [u8] {
        let addr = d.addr as usize;
        let end = (addr | (self.frame_size - 1))
            .saturating_add(1)
            .min(self.len);
        if addr >= end {
            return &mut [];
        }
        // SAFETY: inside the area (checked above), ours alone (caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(addr), end - addr) }
    }

    /// The frame's data: `d.len` bytes from `d.addr`, clipped to its chunk.
    ///
    /// # Safety
    ///
    /// As [`Area::buffer`].
    #[inline]
    pub unsafe fn data<'a>(&self, d: &Desc) -> &'a mut [u8] {
        // SAFETY: caller's contract.
        let b = unsafe { self.buffer(d) };
        let n = (d.len as usize).min(b.len());
        &mut b[..n]
    }
}
