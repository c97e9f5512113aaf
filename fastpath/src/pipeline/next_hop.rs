//! The per-pipeline next-hop cache: [`Snapshot::next_hop`]'s answers for the current
//! snapshot, direct-mapped by destination address, so that a packet of a known flow pays no
//! route or neighbour lookup. [`Pipeline::set_snapshot`] invalidates it.
//!
//! [`Snapshot::next_hop`]: crate::snapshot::Snapshot::next_hop

use std::net::{IpAddr, Ipv4Addr};

use super::{Pipeline, nat};
use crate::snapshot::NextHop;

/// Slots of the per-pipeline next-hop cache (direct-mapped by destination address).
pub(super) const NH_CACHE_SLOTS: usize = 256;
const _: () = assert!(NH_CACHE_SLOTS.is_power_of_two());

/// [`NhSlot::v4_key`] of slot `i` when no IPv4 address is to find it (an empty slot, an
/// IPv6 address's): an address of another slot ([`nh_index_v4`] of 0 is slot 0, of 1 slot
/// 97), so no address that looks in slot `i` equals it.
#[inline]
const fn no_v4(i: usize) -> u32 {
    if i == 0 { 1 } else { 0 }
}

/// A filled slot's [`NhSlot::tag`] bit (an empty slot's tag is 0).
const FILLED: u64 = 1 << 32;

/// One next-hop cache slot: [`Snapshot::next_hop`]'s answer for one destination address
/// in the current snapshot (`Pipeline::set_snapshot` empties every slot when it changes).
///
/// [`Snapshot::next_hop`]: crate::snapshot::Snapshot::next_hop
#[derive(Clone, Copy)]
pub(super) struct NhSlot {
    /// `FILLED | v6` (0: empty).
    pub(super) tag: u64,
    /// For an IPv4 address: the address (in network byte order), the one word
    /// `next_hop_v4` compares; [`no_v4`] for IPv6 and for an empty slot.
    pub(super) v4_key: u32,
    /// The address: IPv6 bits, or IPv4 `to_bits` in network byte order (as a frame and a
    /// flow entry hold it), zero-extended.
    pub(super) addr: (u64, u64),
    pub(super) nh: NextHop,
    /// `nh`'s destination MAC, then its source MAC (or `config.mac`), as a frame takes them.
    pub(super) macs: [u8; 12],
}

impl NhSlot {
    /// Slot `i` when empty: no address finds it.
    pub(super) const fn empty(i: usize) -> NhSlot {
        NhSlot {
            tag: 0,
            v4_key: no_v4(i),
            addr: (0, 0),
            nh: NextHop {
                port: 0,
                dst_mac: [0; 6],
                src_mac: None,
            },
            macs: [0; 12],
        }
    }
}

/// A cache whose slots are all empty.
pub(super) fn empty_cache() -> Box<[NhSlot; NH_CACHE_SLOTS]> {
    let mut cache = Box::new([NhSlot::empty(0); NH_CACHE_SLOTS]);
    empty_all(&mut cache);
    cache
}

/// Empties every slot of `cache` (each with its own [`NhSlot::empty`]), in place.
pub(super) fn empty_all(cache: &mut [NhSlot; NH_CACHE_SLOTS]) {
    for (i, slot) in cache.iter_mut().enumerate() {
        *slot = NhSlot::empty(i);
    }
}

/// A next-hop cache key: `(slot tag without FILLED, address)`.
#[inline(always)]
fn nh_key(dst: IpAddr) -> (u64, (u64, u64)) {
    match dst {
        IpAddr::V4(a) => (0, (u64::from(a.to_bits().to_be()), 0)),
        IpAddr::V6(a) => {
            let b = a.to_bits();
            (1, (b as u64, (b >> 64) as u64))
        }
    }
}

/// The cache slot of an address (its family's).
#[inline(always)]
fn nh_index(family: u64, (lo, hi): (u64, u64)) -> usize {
    if family == 0 {
        return nh_index_v4(lo as u32);
    }
    ((lo ^ hi).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize & (NH_CACHE_SLOTS - 1)
}

/// The cache slot of an IPv4 address (in network byte order): a 32-bit multiply, its
/// constant an immediate.
#[inline(always)]
fn nh_index_v4(dst: u32) -> usize {
    (dst.wrapping_mul(0x61c8_8647) >> 24) as usize & (NH_CACHE_SLOTS - 1)
}

impl Pipeline {
    /// The next hop towards `dst` in the current snapshot (frames without a route leave on
    /// this pipeline's own port), through the next-hop cache.
    #[inline]
    pub(super) fn next_hop(&mut self, dst: IpAddr) -> Option<NextHop> {
        self.nh_slot(dst).map(|s| s.nh)
    }

    /// [`next_hop`](Self::next_hop) for an IPv4 address in network byte order
    /// (`to_bits().to_be()`, as a [`flowtable::V4Hit`] gives it): its cache slot.
    #[inline(always)]
    pub(super) fn next_hop_v4(&mut self, dst: u32) -> Option<&NhSlot> {
        let i = nh_index_v4(dst);
        if self.nh_cache[i].v4_key == dst {
            return Some(&self.nh_cache[i]);
        }
        self.nh_fill(IpAddr::V4(Ipv4Addr::from_bits(u32::from_be(dst))))?;
        Some(&self.nh_cache[i])
    }

    /// The cache slot holding `dst`'s next hop, filled on a miss.
    #[inline]
    fn nh_slot(&mut self, dst: IpAddr) -> Option<NhSlot> {
        let (family, addr) = nh_key(dst);
        let slot = &self.nh_cache[nh_index(family, addr)];
        if slot.tag == FILLED | family && slot.addr == addr {
            return Some(*slot);
        }
        self.nh_fill(dst)
    }

    /// A next-hop cache miss: asks the snapshot, caches a hit (in `dst`'s slot).
    #[cold]
    #[inline(never)]
    fn nh_fill(&mut self, dst: IpAddr) -> Option<NhSlot> {
        let nh = self.snapshot.next_hop(dst, self.config.port)?;
        let (family, addr) = nh_key(dst);
        let i = nh_index(family, addr);
        let slot = NhSlot {
            tag: FILLED | family,
            v4_key: match dst {
                IpAddr::V4(a) => a.to_bits().to_be(),
                IpAddr::V6(_) => no_v4(i),
            },
            addr,
            nh,
            macs: nat::macs(nh.dst_mac, nh.src_mac.unwrap_or(self.config.mac)),
        };
        self.nh_cache[i] = slot;
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty slot's (and an IPv6 slot's) IPv4 key is an address that looks in another
    /// slot: no IPv4 destination that looks in the slot can equal it, so none finds it.
    #[test]
    fn no_ipv4_address_finds_a_slot_without_one() {
        for i in 0..NH_CACHE_SLOTS {
            assert_ne!(nh_index_v4(no_v4(i)), i, "slot {i}");
            assert_eq!(NhSlot::empty(i).v4_key, no_v4(i));
        }
    }
}
