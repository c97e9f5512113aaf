//! A per-slot sequence lock over plain atomics, for the lock-free tables (lblc/lblcr locality,
//! ClientIP affinity).
//!
//! Readers never wait: they read the fields, then check the sequence did not move; a read that
//! overlapped a write is discarded (a *miss*, never a torn value). Writers never wait either:
//! `try_write` fails when another writer holds the slot, and the caller skips its update (these
//! tables are caches; losing one insert only costs a re-schedule). Every field is an atomic, so
//! there is no data race in the Rust sense; the fences give the usual seqlock ordering.

use std::sync::atomic::{AtomicU64, Ordering, fence};

#[derive(Debug, Default)]
#[repr(transparent)]
pub(crate) struct SeqLock {
    seq: AtomicU64,
}

impl SeqLock {
    /// Undoes a write that will never finish (its writer's process died): makes the
    /// sequence even again and says whether it was held. One thread, before any reader.
    pub(crate) fn reset_if_held(&self) -> bool {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 == 0 {
            return false;
        }
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        true
    }

    /// Starts a read; `None` while a writer holds the slot.
    #[inline]
    pub(crate) fn read_begin(&self) -> Option<u64> {
        let s = self.seq.load(Ordering::Acquire);
        (s & 1 == 0).then_some(s)
    }

    /// Whether the fields read since `read_begin` returned `stamp` are consistent.
    #[inline]
    pub(crate) fn read_validate(&self, stamp: u64) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == stamp
    }

    /// Takes the slot for writing, or `None` if another writer has it.
    #[inline]
    pub(crate) fn try_write(&self) -> Option<WriteGuard<'_>> {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 != 0 {
            return None;
        }
        self.seq
            .compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        // Orders the odd sequence before the field stores that follow.
        fence(Ordering::Release);
        Some(WriteGuard { lock: self, seq: s })
    }
}

pub(crate) struct WriteGuard<'a> {
    lock: &'a SeqLock,
    seq: u64,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.lock
            .seq
            .store(self.seq.wrapping_add(2), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_across_a_write_fails_validation_and_writers_exclude() {
        let l = SeqLock::default();
        let stamp = l.read_begin().unwrap();
        let g = l.try_write().unwrap();
        assert!(l.read_begin().is_none(), "reader must see the writer");
        assert!(l.try_write().is_none(), "second writer must fail");
        drop(g);
        assert!(
            !l.read_validate(stamp),
            "read overlapping a write must be discarded"
        );
        let stamp = l.read_begin().unwrap();
        assert!(l.read_validate(stamp));
    }
}
