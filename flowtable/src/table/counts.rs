//! Per-backend connection counts (`active << 32 | inactive` in one word, wrapping signed
//! updates) and the embryonic gauge: what the least-connection schedulers read through
//! [`ConnCounts`].

use super::FlowTable;
use crate::state::FlowState;
use crate::sync::{AtomicU64, Ordering};
use lb_algos::{BackendId, ConnCounts};

/// One backend's counts in one word: `active << 32 | inactive`, each a wrapping 32-bit
/// count. Every change is one `fetch_add` of a signed delta (an inactive → active transition
/// is `+2^32 - 1`), so a component that dips below zero (a remover's decrement overtaking a
/// state change's increment) borrows from the other; [`unpack`] undoes the borrow, giving
/// exactly what two separate `AtomicU32`s would hold. One word lets the lc family's bulk scan
/// copy one load per backend.
pub(super) struct BackendCount(pub(super) AtomicU64);

pub(super) const ACTIVE_ONE: u64 = 1 << 32;

/// The state codes ([`FlowState::to_u8`], all below 32) that are embryonic, as bits.
const EMBRYONIC_CODES: u32 = {
    let mut bits = 0u32;
    let mut code = 0;
    while code < 32 {
        if state_code_embryonic(code) {
            bits |= 1 << code;
        }
        code += 1;
    }
    bits
};

/// The one active state's code.
const ACTIVE_CODE: u8 = crate::state::TcpState::Established as u8;

/// [`FlowState::is_embryonic`] of a code, for the const above.
const fn state_code_embryonic(code: u8) -> bool {
    use crate::state::TcpState as T;
    matches!(code, c if c == T::None as u8
        || c == T::SynSent as u8
        || c == T::SynRecv as u8
        || c == T::SynAck as u8
        || c == T::Listen as u8)
}

/// `(active, inactive)` as signed counts from a packed word.
#[inline(always)]
pub(super) fn unpack(w: u64) -> (i32, i32) {
    let inactive = w as u32 as i32;
    let active = (w.wrapping_sub(inactive as i64 as u64) >> 32) as u32 as i32;
    (active, inactive)
}

/// A packed word with both counts clamped at zero (what [`ConnCounts`] reports).
#[inline(always)]
pub(super) fn clamped(w: u64) -> u64 {
    // Both components non-negative and no borrow: the word is already exact.
    if w & 0x8000_0000_8000_0000 == 0 {
        return w;
    }
    let (a, i) = unpack(w);
    u64::from(a.max(0) as u32) << 32 | u64::from(i.max(0) as u32)
}

impl FlowTable {
    /// Live embryonic TCP flows now (SYN sent or received, handshake not complete): what a
    /// SYN flood fills the table with. One relaxed load.
    #[inline]
    pub fn embryonic(&self) -> u64 {
        (self.counters.0.embryonic.load(Ordering::Relaxed) as i64).max(0) as u64
    }

    pub(super) fn count(&self, backend: u32, state: FlowState, delta: i32) {
        self.count_code(backend, state.to_u8(), delta);
    }

    /// [`count`](Self::count) for a state code ([`FlowState::to_u8`]): two bit tests
    /// instead of decoding the state (a new flow's insert).
    #[inline(always)]
    pub(super) fn count_code(&self, backend: u32, code: u8, delta: i32) {
        let bit = 1u32.checked_shl(u32::from(code)).unwrap_or(0);
        if bit & EMBRYONIC_CODES != 0 {
            self.counters
                .0
                .embryonic
                .fetch_add(delta as i64 as u64, Ordering::Relaxed);
        }
        let Some(b) = self.backends.get(backend as usize) else {
            return;
        };
        let one = if code == ACTIVE_CODE { ACTIVE_ONE } else { 1 };
        b.0.fetch_add(one.wrapping_mul(delta as i64 as u64), Ordering::Relaxed);
    }

    /// A flow of `backend` moved from `old` to `new`: one `fetch_add` when the active /
    /// inactive side changes, nothing otherwise.
    #[inline]
    pub(super) fn recount(&self, backend: u32, old: FlowState, new: FlowState) {
        if old.is_embryonic() != new.is_embryonic() {
            let d: i64 = if new.is_embryonic() { 1 } else { -1 };
            self.counters
                .0
                .embryonic
                .fetch_add(d as u64, Ordering::Relaxed);
        }
        if old.is_active() == new.is_active() {
            return;
        }
        let Some(b) = self.backends.get(backend as usize) else {
            return;
        };
        // inactive -> active: +2^32 - 1; active -> inactive: -(2^32 - 1).
        let d = ACTIVE_ONE - 1;
        let d = if new.is_active() { d } else { d.wrapping_neg() };
        b.0.fetch_add(d, Ordering::Relaxed);
    }
}

impl ConnCounts for FlowTable {
    fn active(&self, id: BackendId) -> u32 {
        // Transiently below zero when a remover's decrement overtakes a state change's
        // increment; report zero then.
        self.backends
            .get(id.0 as usize)
            .map_or(0, |b| (unpack(b.0.load(Ordering::Relaxed)).0).max(0) as u32)
    }

    fn inactive(&self, id: BackendId) -> u32 {
        self.backends
            .get(id.0 as usize)
            .map_or(0, |b| (unpack(b.0.load(Ordering::Relaxed)).1).max(0) as u32)
    }

    #[inline]
    fn counts_run(&self, first: BackendId, out: &mut [[u32; 2]]) -> bool {
        let start = first.0 as usize;
        let Some(src) = self.backends.get(start..start + out.len()) else {
            return false;
        };
        for (o, b) in out.iter_mut().zip(src) {
            let w = clamped(b.0.load(Ordering::Relaxed));
            *o = [(w >> 32) as u32, w as u32];
        }
        true
    }

    #[inline]
    fn packed_run(&self, first: BackendId, out: &mut [u64]) -> bool {
        let start = first.0 as usize;
        let Some(src) = self.backends.get(start..start + out.len()) else {
            return false;
        };
        for (o, b) in out.iter_mut().zip(src) {
            *o = clamped(b.0.load(Ordering::Relaxed));
        }
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn packed_counts_behave_like_two_counters() {
        // Random signed deltas on each side; the packed word must decode to the same pair
        // two wrapping u32 counters hold.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            let (mut a, mut i, mut w) = (0u32, 0u32, 0u64);
            for _ in 0..50 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let d = (x % 5) as i32 - 2;
                if x & 1 << 40 != 0 {
                    a = a.wrapping_add(d as u32);
                    w = w.wrapping_add((1u64 << 32).wrapping_mul(d as i64 as u64));
                } else {
                    i = i.wrapping_add(d as u32);
                    w = w.wrapping_add(d as i64 as u64);
                }
                assert_eq!(unpack(w), (a as i32, i as i32));
                let c = clamped(w);
                assert_eq!(
                    c,
                    u64::from((a as i32).max(0) as u32) << 32 | u64::from((i as i32).max(0) as u32)
                );
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod code_tests {
    use super::*;

    /// The code bits agree with the states' own predicates, for every code a state has.
    #[test]
    fn code_bits_agree_with_the_states() {
        for code in 0..=u8::MAX {
            let s = FlowState::from_u8(code);
            if s.to_u8() != code {
                continue;
            }
            let bit = 1u32.checked_shl(u32::from(code)).unwrap_or(0);
            assert_eq!(bit & EMBRYONIC_CODES != 0, s.is_embryonic(), "code {code}");
            assert_eq!(code == ACTIVE_CODE, s.is_active(), "code {code}");
        }
    }
}
