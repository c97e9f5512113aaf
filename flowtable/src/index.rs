//! The open-addressing index: `u64` words, linear probing, shared by both tuples of every flow.
//!
//! A word is `EMPTY` (0), `TOMB` (a removed word), `FROZEN` (an empty slot that a cleanup is
//! working next to), or `tag:31 | dir:1 | entry+1:32`. The tag is the top 31 bits of the key's
//! hash; the home slot is computed from the tag alone (`tag * homes >> 31`), so a cleanup can
//! tell where any word's probe sequence started, and a probe touches an entry only on a tag
//! match. Keys are not stored here: a candidate is confirmed against the entry's fields.
//!
//! Which words are live is told by their values (`EMPTY`, `TOMB` and `FROZEN` are three
//! values no live word takes), not by their tags: a key's tag may be any 31 bits, all zeros
//! or all ones too. A probe that compares tags first ([`FlowTable::lookup_v4`]) may then
//! meet a special word with its key's tag (1 in 2^30 keys): that word's entry field names
//! no entry, so the candidate fails the entry's bounds check and the probe goes on, to
//! the window's end at worst.
//!
//! [`FlowTable::lookup_v4`]: crate::FlowTable::lookup_v4
//!
//! Home slots are `0..homes`; [`MAX_PROBE`] more slots follow them, so a probe sequence (at
//! most `MAX_PROBE` slots from its home) never runs past the end: probes and inserts walk one
//! plain slice, [`Index::window`]. (Cleanups still treat the slots as a ring, which is
//! correct whether or not a sequence could wrap.)
//!
//! Invariant (I): a word whose key hashes to home slot `h` and which sits at slot `s` has no
//! `EMPTY`/`FROZEN` slot in `[h, s)`, and `s` is fewer than [`MAX_PROBE`] slots from `h`. So a
//! lookup may stop at the first `EMPTY`/`FROZEN` slot or after `MAX_PROBE` slots.
//! See the crate docs for how inserts, removals and cleanups keep (I) without locks.

use crate::mem::Slab;
use crate::sync::{AtomicU64, Ordering, seq_cst_for_loom, spin};

pub(crate) const EMPTY: u64 = 0;
pub(crate) const TOMB: u64 = u64::MAX;
pub(crate) const FROZEN: u64 = u64::MAX - 1;

/// Longest probe sequence: bounds every lookup (wait-free) and insert.
#[cfg(not(loom))]
pub(crate) const MAX_PROBE: usize = 128;
#[cfg(loom)]
pub(crate) const MAX_PROBE: usize = 8;

/// Retries of an insert whose claimed slot turned out invalid (a cleanup raced it).
const MAX_RETRIES: usize = 64;

#[inline]
pub(crate) fn make_word(hash: u64, dir_reply: bool, entry: u32) -> u64 {
    let w = ((hash >> 33) << 33) | (u64::from(dir_reply) << 32) | (u64::from(entry) + 1);
    debug_assert!(
        is_live(w) && word_entry(w) == (entry, dir_reply),
        "index word {w:#x} from hash {hash:#x} and entry {entry}"
    );
    w
}

/// Whether `w` is a live word: none of `EMPTY`, `TOMB`, `FROZEN`, and its entry field not 0.
/// Its tag may be anything, all zeros and all ones included: no live word equals `TOMB` or
/// `FROZEN`, whose entry fields (entries `u32::MAX - 1` and `- 2`) lie beyond
/// [`CAPACITY_MAX`](crate::CAPACITY_MAX).
pub(crate) fn is_live(w: u64) -> bool {
    !matches!(w, EMPTY | TOMB | FROZEN) && w as u32 != 0
}
const _: () = assert!((crate::CAPACITY_MAX as u64) < u32::MAX as u64 - 2);

/// What an index slot may hold, in a table of `entries` entries: `EMPTY`, `TOMB`, `FROZEN`,
/// or a live word naming an entry below `entries`.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn slot_valid(w: u64, entries: usize) -> bool {
    matches!(w, EMPTY | TOMB | FROZEN) || (is_live(w) && (word_entry(w).0 as usize) < entries)
}

/// `(entry, dir_reply)` of a live word (not EMPTY/TOMB/FROZEN).
#[inline]
pub(crate) fn word_entry(w: u64) -> (u32, bool) {
    ((w as u32).wrapping_sub(1), w & (1 << 32) != 0)
}

#[inline]
pub(crate) fn tag_matches(w: u64, hash: u64) -> bool {
    (w >> 33) == (hash >> 33)
}

pub(crate) struct Index {
    /// `homes + MAX_PROBE` slots.
    pub(crate) slots: Slab<AtomicU64>,
    /// Number of home slots.
    homes: u64,
}

/// Withdraw our just-claimed `word` from `slot`.
fn retract(slot: &AtomicU64, word: u64) {
    // Only we write a slot holding our word (removers of our entry wait for it to be LIVE).
    let prev = slot.swap(TOMB, Ordering::SeqCst);
    debug_assert_eq!(prev, word);
}

/// Outcome of [`Index::insert`].
pub(crate) enum Claim {
    /// The word is published and (I) holds for it.
    Done,
    /// Another live entry has the same key: `(entry, dir_reply)` of its word.
    Conflict(u32, bool),
    /// No empty slot within the probe limit, or too many retries.
    Full,
}

impl Index {
    /// Slots for an index with `homes` home slots: `homes + MAX_PROBE`.
    pub(crate) fn slots_for(homes: usize) -> usize {
        homes.max(1) + MAX_PROBE
    }

    /// An index over `slots` ([`Index::slots_for`] of `homes`; all `EMPTY` for a new table).
    pub(crate) fn over(slots: Slab<AtomicU64>, homes: usize) -> Self {
        let homes = homes.max(1);
        // `window` relies on it (a state file's geometry was checked before this).
        assert_eq!(slots.len(), Self::slots_for(homes), "index geometry");
        Index {
            slots,
            homes: homes as u64,
        }
    }

    /// A new, empty index on the heap (unit tests).
    #[cfg(test)]
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn new(homes: usize) -> Self {
        let n = Self::slots_for(homes);
        #[cfg(not(loom))]
        let slots = {
            let m = crate::mem::Mapping::anonymous(n * 8).expect("map an index");
            let s = m.slab(0, n);
            std::mem::forget(m); // a test index lives for the test process
            s
        };
        #[cfg(loom)]
        let slots = Slab::boxed((0..n).map(|_| AtomicU64::new(EMPTY)).collect());
        Self::over(slots, homes)
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The home slot of a key with `hash`, or of the key of live word `hash` (same tag).
    #[inline]
    pub(crate) fn home(&self, hash: u64) -> usize {
        (((hash >> 33) * self.homes) >> 31) as usize
    }

    /// `hash`'s probe sequence: the `MAX_PROBE` slots from its home.
    #[inline(always)]
    pub(crate) fn window(&self, hash: u64) -> &[AtomicU64] {
        self.window_at(self.home(hash))
    }

    /// The `MAX_PROBE` slots from home slot `home` (a [`home`](Self::home)).
    #[inline(always)]
    fn window_at(&self, home: usize) -> &[AtomicU64] {
        debug_assert!(home + MAX_PROBE <= self.slots.len());
        // SAFETY: in range: `home` < `homes` (`hash >> 33` < 2^31), and `over` checked that
        // MAX_PROBE slots follow the last home. (Per packet, so no bounds check.)
        unsafe { self.slots.get_unchecked(home..home + MAX_PROBE) }
    }

    /// Slots from `a` forward to `b`.
    #[inline]
    fn dist(&self, a: usize, b: usize) -> usize {
        if b >= a {
            b - a
        } else {
            b + self.slots.len() - a
        }
    }

    #[inline]
    pub(crate) fn next(&self, pos: usize) -> usize {
        if pos + 1 == self.slots.len() {
            0
        } else {
            pos + 1
        }
    }

    #[inline]
    fn prev(&self, pos: usize) -> usize {
        if pos == 0 {
            self.slots.len() - 1
        } else {
            pos - 1
        }
    }

    /// Probe words that may belong to `hash`, in order, until `EMPTY`/`FROZEN` or the limit;
    /// `f` returns `Some` to stop.
    #[inline(always)]
    pub(crate) fn probe<R>(&self, hash: u64, mut f: impl FnMut(u64) -> Option<R>) -> Option<R> {
        for slot in self.window(hash) {
            let w = slot.load(Ordering::Acquire);
            if w == EMPTY || w == FROZEN {
                return None;
            }
            if w != TOMB
                && tag_matches(w, hash)
                && let Some(r) = f(w)
            {
                return Some(r);
            }
        }
        None
    }

    /// The word in `hash`'s home slot (a hint for prefetching: may be anything).
    #[inline]
    pub(crate) fn home_word(&self, hash: u64) -> u64 {
        // (The window's first slot: in range by construction, no bounds check per packet.)
        self.window(hash)[0].load(Ordering::Relaxed)
    }

    /// Asks the CPU to fetch `hash`'s home slot.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        crate::sync::prefetch(&self.window(hash)[0]);
    }

    /// Publish `word` for a key with `hash`. `same_key(w)` says whether the live word `w` (not
    /// our own) indexes another live entry with the same key.
    ///
    /// Each attempt: (1) walks the probe window to its first `EMPTY` slot: a same-key word
    /// there is a [`Claim::Conflict`]; the first `EMPTY` *or tombstone* slot is the one to
    /// claim (reusing tombstones keeps a table under heavy churn, a SYN flood's half-open
    /// flows recycled as fast as they come, from filling with them faster than cleanups clear
    /// them). (2) CASes our word into it. (3) Verifies, retracting and retrying if any check
    /// fails:
    /// - forward from our slot to the first `EMPTY` slot (past the window, as far as a
    ///   cleanup's frozen slot can be): no `FROZEN` slot and no other same-key word;
    /// - then `[home, claimed)`: no `EMPTY`/`FROZEN` slot and no other same-key word.
    ///
    /// Why this keeps (I) against a cleanup clearing a tombstone `p` before our slot `r`: the
    /// cleanup freezes the first `EMPTY` slot `q` after `p` (no `EMPTY` lies in `(p, q)`, so
    /// the forward walk from `r` reaches `q`), checks the words in `(p, q)`, then clears `p`
    /// and thaws `q`. If it read `r` before our CAS, then either our forward walk read `q`
    /// before the thaw (`FROZEN`: retry), or it read `q` after the thaw, so the second walk
    /// reads `p` after it was cleared (`EMPTY`: retry). And two inserts of one key: by sequential
    /// consistency at least one of them reads the other's word after its CAS, and whoever
    /// sees another's word retracts; the retry's step (1) then reports the survivor.
    ///
    /// Inlined into its callers, a new flow's two among them (the insert's halves), where a
    /// call cost more than the code it would share: its prologue, epilogue and spills, about
    /// 25 instructions (`benches/callgrind.sh --mix syn`).
    #[inline(always)]
    pub(crate) fn insert(&self, hash: u64, word: u64, same_key: impl Fn(u64) -> bool) -> Claim {
        debug_assert!(
            is_live(word) && tag_matches(word, hash),
            "inserting index word {word:#x} for hash {hash:#x}"
        );
        let home = self.home(hash);
        let window = self.window_at(home);
        'retry: for _ in 0..MAX_RETRIES {
            let mut claim = None;
            for (i, slot) in window.iter().enumerate() {
                let w = slot.load(Ordering::SeqCst);
                if w == FROZEN {
                    spin();
                    continue 'retry;
                }
                if w == EMPTY || w == TOMB {
                    if claim.is_none() {
                        claim = Some((i, w));
                    }
                    if w == EMPTY {
                        break;
                    }
                } else if tag_matches(w, hash) && same_key(w) {
                    let (e, d) = word_entry(w);
                    return Claim::Conflict(e, d);
                }
            }
            let Some((claimed, seen)) = claim else {
                // Every slot of the window holds a live word.
                return Claim::Full;
            };
            if window[claimed]
                .compare_exchange(seen, word, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue 'retry;
            }
            seq_cst_for_loom();
            // Forward from our slot to the first EMPTY slot.
            let mut pos = self.next(home + claimed);
            for _ in 0..3 * MAX_PROBE {
                let w = self.slots[pos].load(Ordering::SeqCst);
                if w == EMPTY {
                    break;
                }
                if w == FROZEN {
                    retract(&window[claimed], word);
                    spin();
                    continue 'retry;
                }
                if w != TOMB && tag_matches(w, hash) && same_key(w) {
                    retract(&window[claimed], word);
                    continue 'retry;
                }
                pos = self.next(pos);
            }
            // Then `[home, claimed)`.
            for slot in &window[..claimed] {
                let w = slot.load(Ordering::SeqCst);
                if w == EMPTY || w == FROZEN {
                    retract(&window[claimed], word);
                    spin();
                    continue 'retry;
                }
                if w != TOMB && tag_matches(w, hash) && same_key(w) {
                    retract(&window[claimed], word);
                    continue 'retry;
                }
            }
            return Claim::Done;
        }
        Claim::Full
    }

    /// Tombstone the slot holding exactly `word` (at most one does). Returns whether found.
    pub(crate) fn remove(&self, hash: u64, word: u64) -> bool {
        debug_assert!(
            is_live(word) && tag_matches(word, hash),
            "removing index word {word:#x} for hash {hash:#x}"
        );
        for slot in self.window(hash) {
            let w = slot.load(Ordering::SeqCst);
            if w == word {
                return slot
                    .compare_exchange(word, TOMB, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
            }
            if w == EMPTY {
                return false;
            }
        }
        false
    }

    /// Turn tombstones back into `EMPTY` in `[start, start+len)`, walking backwards so runs of
    /// tombstones are cleared from their end in one pass. Returns the number cleared.
    ///
    /// A tombstone at `p` may become `EMPTY` when no live word's probe path `[home, pos)` covers
    /// `p`. Only words between `p` and the next `EMPTY` slot `q` can have such a path; `q` is
    /// frozen (CAS `EMPTY` → `FROZEN`) while we check them and clear `p`, so no insert can claim
    /// `q` or anything beyond through `p` meanwhile (inserts wait on `FROZEN`), and no `EMPTY`
    /// can appear between `p` and `q` (clearing one would need `q` frozen by its cleaner).
    pub(crate) fn cleanup(&self, start: usize, len: usize) -> usize {
        let n = self.slots.len();
        let len = len.min(n);
        let mut cleared = 0;
        let mut p = (start + len) % n;
        for _ in 0..len {
            p = self.prev(p);
            if self.slots[p].load(Ordering::Relaxed) == TOMB && self.clear_tomb(p) {
                cleared += 1;
            }
        }
        cleared
    }

    fn clear_tomb(&self, p: usize) -> bool {
        let limit = (2 * MAX_PROBE).min(self.slots.len() - 1);
        let mut q = self.next(p);
        let mut found = false;
        for _ in 0..limit {
            let w = self.slots[q].load(Ordering::SeqCst);
            if w == FROZEN {
                return false;
            }
            if w == EMPTY {
                found = true;
                break;
            }
            q = self.next(q);
        }
        if !found
            || self.slots[q]
                .compare_exchange(EMPTY, FROZEN, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return false;
        }
        let mut blocked = false;
        let mut r = self.next(p);
        while r != q {
            let w = self.slots[r].load(Ordering::SeqCst);
            if w != TOMB {
                let home = self.home(w);
                if self.dist(home, p) < self.dist(home, r) {
                    blocked = true;
                    break;
                }
            }
            r = self.next(r);
        }
        let ok = !blocked
            && self.slots[p]
                .compare_exchange(TOMB, EMPTY, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok();
        self.slots[q].store(EMPTY, Ordering::SeqCst);
        ok
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn hash_for_home(ix: &Index, home: usize) -> u64 {
        let tag = (home as u64 * (1 << 31)).div_ceil(ix.homes);
        let h = tag << 33;
        assert_eq!(ix.home(h), home);
        h
    }

    fn census(ix: &Index, range: std::ops::Range<usize>) -> String {
        ix.slots[range]
            .iter()
            .map(|s| match s.load(Ordering::Relaxed) {
                EMPTY => '.',
                TOMB => 'T',
                _ => 'L',
            })
            .collect()
    }

    #[test]
    fn cleanup_clears_unpinned_tombstones_only() {
        let ix = Index::new(16);
        assert_eq!(ix.len(), 16 + MAX_PROBE);
        let put = |home: usize, e: u32| {
            let h = hash_for_home(&ix, home);
            let w = make_word(h, false, e);
            assert!(matches!(ix.insert(h, w, |_| false), Claim::Done));
            (h, w)
        };
        let a = put(14, 0); // 14
        let b = put(14, 1); // 15
        let c = put(14, 2); // 16: past the last home, in the tail (no wrap)
        let d = put(15, 3); // 17
        let e = put(15, 4); // 18
        assert_eq!(census(&ix, 12..20), "..LLLLL.");
        assert!(ix.remove(a.0, a.1) && ix.remove(b.0, b.1) && ix.remove(d.0, d.1));
        assert_eq!(census(&ix, 12..20), "..TTLTL.");
        // 14 and 15 are pinned by c (home 14, at 16); 15 and 17 by e (home 15, at 18).
        assert_eq!(ix.cleanup(0, ix.len()), 0);
        assert!(ix.remove(c.0, c.1));
        // 14 is on no live word's path any more.
        assert_eq!(ix.cleanup(0, ix.len()), 1, "{}", census(&ix, 12..20));
        assert_eq!(census(&ix, 12..20), "...TTTL.");
        assert!(ix.remove(e.0, e.1));
        assert_eq!(ix.cleanup(0, ix.len()), 4);
        assert_eq!(census(&ix, 0..ix.len()), ".".repeat(ix.len()));
    }

    #[test]
    fn the_last_home_probes_into_the_tail() {
        let ix = Index::new(4);
        let h = hash_for_home(&ix, 3);
        for e in 0..MAX_PROBE as u32 {
            let w = make_word(h, false, e);
            assert!(matches!(ix.insert(h, w, |_| false), Claim::Done));
        }
        assert_eq!(census(&ix, 0..3), "...");
        assert_eq!(census(&ix, 3..3 + MAX_PROBE), "L".repeat(MAX_PROBE));
        let w = make_word(h, false, 999);
        assert!(matches!(ix.insert(h, w, |_| false), Claim::Full));
        assert_eq!(
            ix.probe(h, |w| (word_entry(w).0 == 7).then_some(())),
            Some(())
        );
    }
}
