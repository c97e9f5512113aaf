//! The tuple hash: a keyed multiply-fold, its keys drawn from the table's seed.

use super::FlowTable;
use super::v4::{v4_addrs_be, v4_ports_be};
use crate::index::{self};
use crate::key::FlowKey;

/// The hash function's keys from a seed.
pub(super) fn seeds(seed: u64) -> [u64; 6] {
    let mut s = seed;
    std::array::from_fn(|_| splitmix(&mut s) | 1)
}

pub(super) fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[inline]
pub(super) fn fold_mul(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

impl FlowTable {
    /// The index slot where `key`'s probe sequence starts (for the tests that show a random
    /// key defeats precomputed collisions).
    #[cfg(feature = "testing")]
    pub fn home_slot(&self, key: &FlowKey) -> usize {
        self.index.home(self.hash(key))
    }

    #[inline]
    pub(super) fn hash(&self, k: &FlowKey) -> u64 {
        let s = &self.seeds;
        if !k.v6 {
            // In network order, as the per-packet path's `V4Key`s hash them.
            let addrs = v4_addrs_be(u64::from(k.src as u32) | u64::from(k.dst as u32) << 32);
            let misc = k.misc();
            let misc = misc & !0xffff_ffff | u64::from(v4_ports_be(misc as u32));
            return self.hash_v4(addrs, misc);
        }
        let a = fold_mul(k.src as u64 ^ s[0], (k.src >> 64) as u64 ^ s[1]);
        let b = fold_mul(k.dst as u64 ^ s[2], (k.dst >> 64) as u64 ^ s[3]);
        index::live_tag(fold_mul(a ^ b.rotate_left(29) ^ s[4], k.misc() ^ s[5]))
    }

    /// The hash of an IPv4 key from its packed addresses (`src | dst << 32`) and
    /// [`FlowKey::misc`], addresses and ports in network byte order (as a `V4Key` holds
    /// them): both addresses fit one word, so two multiplies instead of three.
    #[inline(always)]
    pub(super) fn hash_v4(&self, addrs: u64, misc: u64) -> u64 {
        let s = &self.seeds;
        index::live_tag(fold_mul(fold_mul(addrs ^ s[0], misc ^ s[1]) ^ s[2], s[3]))
    }
}
