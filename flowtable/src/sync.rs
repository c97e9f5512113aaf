//! Atomics shim: `loom`'s model-checked atomics under `--cfg loom`, `std`'s otherwise.
//!
//! Every atomic the concurrency protocol relies on goes through this module so that the loom
//! test (`tests/loom.rs`) checks the same code that runs in production.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

/// Orders a SeqCst RMW before the SeqCst loads that follow it, for loom only. The language's
/// memory model already puts every SeqCst operation in one total order (no store buffering
/// between a SeqCst CAS and a later SeqCst load; on x86 the CAS is a full barrier), but loom
/// models SeqCst accesses as AcqRel (tokio-rs/loom#180) and only SeqCst fences as SeqCst,
/// so the model checks the protocol with this fence where production needs none.
#[inline(always)]
pub(crate) fn seq_cst_for_loom() {
    #[cfg(loom)]
    fence(Ordering::SeqCst);
}

/// Spin hint while waiting for another thread's short critical step (index slot freeze).
#[inline]
pub(crate) fn spin() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Keeps a hot shared counter on its own cache lines (two, for the adjacent-line prefetcher).
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub T);

/// Asks the CPU to bring `t`'s cache line into L1 (a hint: no effect on semantics).
#[inline(always)]
pub(crate) fn prefetch<T>(t: &T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: a prefetch never faults and has no architectural effect.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
            (t as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = t;
}

/// [`prefetch`] for an address that may point anywhere (it is never dereferenced).
#[inline(always)]
pub(crate) fn prefetch_ptr<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: a prefetch never faults and has no architectural effect, whatever the address.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}
