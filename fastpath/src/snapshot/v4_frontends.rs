//! The IPv4 frontends by one packed word, for the new-flow path of the IPv4 shortcut
//! (`Snapshot::service_for_v4`): an open-addressing table built once per snapshot, looked up
//! with one multiply and, usually, one or two slots (a general `HashMap` with a keyed hasher
//! cost about 25 instructions a lookup).
//!
//! Contract: [`V4Frontends::get`] answers exactly what the map it was built from answers,
//! for every key. The keys come from the configuration (not from packets), and at most half
//! of the slots are taken, so every probe meets an empty slot; a lookup walks at most the
//! table's length anyway.

/// A slot no key can be: a packed frontend has its top byte 0 (`v4_frontend`).
const EMPTY: u64 = u64::MAX;

/// Fibonacci hashing's multiplier (2^64 / golden ratio, odd).
const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// IPv4 frontend words to service ids.
#[derive(Debug)]
pub(super) struct V4Frontends {
    /// `(key, id)`; a power of two of them, at least twice the keys.
    slots: Box<[(u64, u32)]>,
    /// `64 - log2(slots.len())`: a key's home is its hash's top bits.
    shift: u32,
}

impl Default for V4Frontends {
    fn default() -> Self {
        Self::build(std::iter::empty())
    }
}

impl V4Frontends {
    /// The table of `entries` (`(key, id)`, keys distinct and not [`EMPTY`]; a repeated key
    /// keeps its first id, one that is `EMPTY` is left out).
    pub(super) fn build(entries: impl Iterator<Item = (u64, u32)>) -> Self {
        let entries: Vec<(u64, u32)> = entries.filter(|&(k, _)| k != EMPTY).collect();
        let len = (entries.len() * 2).next_power_of_two().max(2);
        let mut t = V4Frontends {
            slots: vec![(EMPTY, 0); len].into_boxed_slice(),
            shift: 64 - len.trailing_zeros(),
        };
        for (k, id) in entries {
            let mut at = t.home(k);
            while t.slots[at].0 != EMPTY && t.slots[at].0 != k {
                at = (at + 1) & (len - 1);
            }
            if t.slots[at].0 == EMPTY {
                t.slots[at] = (k, id);
            }
        }
        t
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        // (`shift` is 63 at most: a table has 2 slots at least.)
        (key.wrapping_mul(MUL) >> self.shift) as usize
    }

    /// The id of `key`'s frontend.
    #[inline(always)]
    pub(super) fn get(&self, key: u64) -> Option<u32> {
        // The home slot inline (a frontend's key usually is there), the rest of the probe
        // out of line.
        let at = self.home(key);
        match self.slots.get(at) {
            Some(&(k, id)) if k == key && k != EMPTY => Some(id),
            Some(&(k, _)) if k == EMPTY => None,
            _ => self.probe(key, at),
        }
    }

    /// [`get`](Self::get) past `key`'s home slot `home`.
    #[inline(never)]
    fn probe(&self, key: u64, home: usize) -> Option<u32> {
        let mask = self.slots.len() - 1;
        for at in home + 1..home + self.slots.len() {
            let (k, id) = self.slots[at & mask];
            if k == EMPTY {
                return None;
            }
            if k == key {
                return Some(id);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn answers_what_the_map_answers() {
        for n in [0usize, 1, 2, 3, 7, 64, 1000] {
            // Neighbouring VIPs and ports, the keys a configuration has.
            let map: HashMap<u64, u32> = (0..n as u64)
                .map(|i| {
                    let vip = 0xc612_6400 + (i % 37) as u32;
                    (u64::from(vip) | (80 + i / 37) << 32 | 6 << 48, i as u32)
                })
                .collect();
            let t = V4Frontends::build(map.iter().map(|(&k, &v)| (k, v)));
            for (&k, &v) in &map {
                assert_eq!(t.get(k), Some(v), "n {n} key {k:#x}");
            }
            for probe in (0..5000u64).map(|i| i.wrapping_mul(0x1234_5678_9abc_def1)) {
                assert_eq!(t.get(probe), map.get(&probe).copied(), "n {n} {probe:#x}");
            }
            assert_eq!(t.get(EMPTY), None);
        }
    }

    #[test]
    fn a_repeated_key_keeps_its_first_id_and_empty_is_no_key() {
        let t = V4Frontends::build([(5, 1), (5, 2), (EMPTY, 3)].into_iter());
        assert_eq!(t.get(5), Some(1));
        assert_eq!(t.get(EMPTY), None);
        assert_eq!(V4Frontends::default().get(0), None);
    }
}
