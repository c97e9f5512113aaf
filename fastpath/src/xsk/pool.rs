//! The free-frame stack of one UMEM.
//!
//! Every UMEM frame is, at any moment, in exactly one place: this stack, a fill ring, the
//! kernel (between fill and rx, or between tx and completion), an rx batch being processed,
//! or a tx staging array. The stack is allocated once with room for every frame, so
//! [`FramePool::put`] never reallocates: frames are conserved, the stack cannot overflow.

use xsk_rs::{FillQueue, FrameDesc};

/// A fixed-capacity stack of free frame descriptors.
#[derive(Debug)]
pub struct FramePool {
    free: Vec<FrameDesc>,
}

impl FramePool {
    /// A pool holding `frames` (all of a UMEM's frames); its capacity never changes.
    pub fn new(frames: Vec<FrameDesc>) -> FramePool {
        let mut free = Vec::with_capacity(frames.len());
        free.extend(frames);
        FramePool { free }
    }

    /// Free frames.
    #[inline]
    pub fn len(&self) -> usize {
        self.free.len()
    }

    /// Whether no frame is free.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.free.is_empty()
    }

    /// Every frame this pool can hold (the UMEM's frame count).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.free.capacity()
    }

    /// Returns a frame to the pool.
    #[inline]
    pub fn put(&mut self, desc: FrameDesc) {
        // Frames are conserved, so the stack is never full here; if a bug ever broke that,
        // losing a frame beats allocating on the hot path.
        debug_assert!(
            self.free.len() < self.free.capacity(),
            "frame pool overflow"
        );
        if self.free.len() < self.free.capacity() {
            self.free.push(desc);
        }
    }

    /// Takes a frame, if any is free.
    #[inline]
    pub fn take(&mut self) -> Option<FrameDesc> {
        self.free.pop()
    }

    /// Moves up to `max` free frames to a fill ring; returns how many moved.
    ///
    /// # Safety
    ///
    /// `fill` must belong to a socket of the UMEM these frames come from.
    #[inline]
    pub unsafe fn fill(&mut self, fill: &mut FillQueue, max: usize) -> usize {
        let n = max.min(self.free.len());
        if n == 0 {
            return 0;
        }
        let from = self.free.len() - n;
        // SAFETY: the descriptors are free frames of the fill ring's UMEM (caller's contract);
        // the kernel owns them from here until they come back on an rx ring.
        let done = unsafe { fill.produce(&self.free[from..]) };
        // The ring reserves all or nothing, but stay correct either way: `produce` takes
        // descriptors from the front of the slice.
        self.free.drain(from..from + done);
        done
    }
}
