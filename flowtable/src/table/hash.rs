//! The tuple hash: a keyed multiply-fold, its keys drawn from the table's seed.

use super::FlowTable;
use super::v4::{v4_addrs_be, v4_ports_be};
use crate::key::{FlowKey, Protocol};

/// The hash function's keys from a seed: six drawn, then the IPv4 hash's second key with
/// the protocol's term of [`FlowKey::misc`] folded in, TCP's ([`S1_TCP`]) and UDP's
/// ([`S1_UDP`]).
pub(super) fn seeds(seed: u64) -> [u64; 8] {
    let mut s = seed;
    let mut k = [0; 8];
    for w in &mut k[..6] {
        *w = splitmix(&mut s) | 1;
    }
    k[S1_TCP] = k[1] ^ u64::from(Protocol::Tcp as u8) << 32;
    k[S1_UDP] = k[1] ^ u64::from(Protocol::Udp as u8) << 32;
    k
}

/// The key `misc ^ seeds[1]` of the IPv4 hash takes from a TCP tuple's ports: `ports ^
/// seeds[S1_TCP]` (the ports fill the low half, the protocol is above them).
const S1_TCP: usize = 6;
/// [`S1_TCP`] for UDP.
const S1_UDP: usize = 7;

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
        fold_mul(a ^ b.rotate_left(29) ^ s[4], k.misc() ^ s[5])
    }

    /// The hash of an IPv4 key from its packed addresses (`src | dst << 32`) and
    /// [`FlowKey::misc`], addresses and ports in network byte order (as a `V4Key` holds
    /// them): both addresses fit one word, so two multiplies instead of three.
    #[inline(always)]
    pub(super) fn hash_v4(&self, addrs: u64, misc: u64) -> u64 {
        let s = &self.seeds;
        fold_mul(fold_mul(addrs ^ s[0], misc ^ s[1]) ^ s[2], s[3])
    }

    /// [`hash_v4`](Self::hash_v4) of a tuple of protocol `proto`, with ports `ports`: for
    /// TCP and UDP, the protocol's term is in a key of its own (one load where the protocol
    /// is a constant, instead of a constant and an `or`).
    #[inline(always)]
    pub(super) fn hash_v4_proto(&self, addrs: u64, proto: Protocol, ports: u32) -> u64 {
        let s = &self.seeds;
        let k1 = match proto {
            Protocol::Tcp => s[S1_TCP],
            Protocol::Udp => s[S1_UDP],
            p => s[1] ^ u64::from(p as u8) << 32,
        };
        debug_assert_eq!(k1, s[1] ^ u64::from(proto as u8) << 32);
        fold_mul(fold_mul(addrs ^ s[0], u64::from(ports) ^ k1) ^ s[2], s[3])
    }
}
