//! The free-frame stack of one UMEM.
//!
//! Every UMEM frame is, at any moment, in exactly one place: this stack, a fill ring, the
//! kernel (between fill and rx, or between tx and completion), an rx batch being processed,
//! or a tx staging array. The stack is allocated once with room for every frame, so
//! [`FramePool::put`] never reallocates: frames are conserved, the stack cannot overflow.

use super::ring::{Desc, Prod};

/// A fixed-capacity stack of free frame descriptors.
#[derive(Debug)]
pub struct FramePool {
    free: Vec<Desc>,
}

impl FramePool {
    /// A pool holding `frames` (the free ones of a UMEM of `total` frames: all of them, or
    /// what a previous owner left free), with room for every frame of the UMEM; its
    /// capacity never changes.
    pub fn new(mut frames: Vec<Desc>, total: usize) -> FramePool {
        // (Reuses `frames`' allocation when it already has the room.)
        frames.reserve(total.saturating_sub(frames.len()));
        FramePool { free: frames }
    }

    /// The free frames, as a `Vec` with the pool's room.
    pub fn into_frames(self) -> Vec<Desc> {
        self.free
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
    pub fn put(&mut self, desc: Desc) {
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

    /// The free frames' descriptors (for a hand-over: [`super::handover`]).
    pub fn free(&self) -> &[Desc] {
        &self.free
    }

    /// Takes a frame, if any is free.
    #[inline]
    pub fn take(&mut self) -> Option<Desc> {
        self.free.pop()
    }

    /// Moves up to `max` free frames to a fill ring; returns how many moved.
    ///
    /// # Safety
    ///
    /// `fill` must belong to a socket of the UMEM these frames come from.
    #[inline]
    pub unsafe fn fill(&mut self, fill: &mut Prod, max: usize) -> usize {
        let n = max.min(self.free.len());
        if n == 0 {
            return 0;
        }
        let from = self.free.len() - n;
        // SAFETY: the descriptors are free frames of the fill ring's UMEM (caller's contract);
        // the kernel owns them from here until they come back on an rx ring.
        let done = unsafe { fill.produce_fill(&self.free[from..]) };
        // The ring reserves all or nothing, but stay correct either way: `produce_fill`
        // takes descriptors from the front of the slice.
        self.free.drain(from..from + done);
        done
    }
}
