//! The pipeline's invariants, as `debug_assert!`s: on in tests, proptests and fuzzing (debug
//! builds), compiled out of release builds (`cfg!(debug_assertions)` is false there, and the
//! bookkeeping they read is under `#[cfg(debug_assertions)]`).
//!
//! - **The shortcut parses as `classify` does**: for a frame [`fast::parse`] accepts,
//!   [`classify`] gives the same fields (untagged, `l3 = 14`, `l4 = 34`, not fragmented, the
//!   same tuple, flags, TTL and length): what the fast path's byte-for-byte equality with the
//!   general path rests on (`fast`'s module doc; `tests/pipeline_equiv.rs` checks the outputs).
//! - **A transmitted frame still parses**: a [`Verdict::Tx`] frame is one `classify` accepts
//!   (rewritten headers are consistent), with a TTL above 0.
//! - **Every frame is counted once**: a call that processed `n` frames added exactly `n` to
//!   the verdict counters (tx + pass + slow + drops + rejects).

use super::classify::{self, Frag};
use super::fast;
#[cfg(debug_assertions)]
use super::{Counters, Verdict};

/// Frames counted in some verdict so far.
#[cfg(debug_assertions)]
#[inline]
pub(super) fn counted(c: &Counters) -> u64 {
    c.tx + c.pass + c.slow + c.drops_total() + c.rejects_total()
}

/// Whether `classify` reads `frame`, which [`fast::parse`] read as `v`, the same way.
pub(super) fn parse_agrees(frame: &[u8], v: &fast::V4) -> bool {
    let Ok(p) = classify::classify(frame) else {
        return false;
    };
    let addr = |a: std::net::IpAddr| match a {
        std::net::IpAddr::V4(a) => Some(a.to_bits()),
        std::net::IpAddr::V6(_) => None,
    };
    p.l3 == fast::L3
        && p.l4 == fast::L4
        && !p.v6
        && p.frag == Frag::No
        && p.proto == v.proto
        && addr(p.src) == Some(v.src())
        && addr(p.dst) == Some(v.dst())
        && (p.sport, p.dport) == (v.sport(), v.dport())
        && p.flags == v.flags
        && p.ttl == v.ttl
        && p.ip_len() == usize::from(v.ip_len)
}

/// Whether `frame`, given verdict `v`, is as a verdict leaves it: a `Tx` or `Reject` frame
/// parses and keeps a TTL (hop limit) above 0. Other verdicts: nothing to check here (the
/// frame is left as it came, which only the caller, holding a copy, can check).
#[cfg(debug_assertions)]
pub(super) fn verdict_ok(frame: &[u8], v: Verdict) -> bool {
    match v {
        Verdict::Tx(_) | Verdict::Reject { .. } => {
            classify::classify(frame).is_ok_and(|p| p.ttl > 0)
        }
        _ => true,
    }
}
