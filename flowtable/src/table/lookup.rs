//! Lookups (seqlock-style validated reads, see the crate docs' "Readers"): by key, by batch,
//! the per-packet [`FlowHit`], and copies of a flow by handle. Wait-free: a bounded probe plus
//! validated reads; nothing here writes.

use super::FlowTable;
use super::entry::{
    A_BACKEND, A_CLIENT, A_SNAT, A_VIP, W_CTL, W_IDS, W_META, ctl_gen, ctl_ls, ctl_readable,
    ctl_state, v4_halves,
};
use super::handle::{FlowHandle, FlowHit, FlowView};
use super::seq::{SEQ_BITS, SEQ_MASK};
use crate::index::{self};
use crate::key::{Direction, FlowKey};
use crate::state::FlowState;
use crate::sync::{Ordering, fence};

impl FlowTable {
    /// Compare `key` with entry `e`'s tuple for direction `reply`, validated against recycling.
    /// Returns the entry's generation on a match.
    #[inline]
    pub(super) fn matches(&self, e: u32, reply: bool, key: &FlowKey) -> Option<u64> {
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) {
            return None;
        }
        let meta = self.word(e, W_META);
        let ports = self.ports_host(e);
        let (slot, ports) = if reply {
            (A_BACKEND, ports >> 32)
        } else {
            (A_CLIENT, ports)
        };
        let misc = key.misc();
        let hit = (meta >> 32) & 0xffff == misc >> 32
            && ports as u32 == misc as u32
            && self.addrs_match(e, slot, key);
        fence(Ordering::Acquire);
        let c2 = entry.w[W_CTL].load(Ordering::Relaxed);
        (hit && ctl_readable(c2) && ctl_gen(c2) == ctl_gen(c1)).then_some(ctl_gen(c1))
    }

    /// Find the flow `key` belongs to and the direction it matched. Wait-free: at most
    /// `MAX_PROBE` index words and one entry comparison per tag match.
    #[inline]
    pub fn lookup(&self, key: &FlowKey) -> Option<(FlowHandle, Direction)> {
        self.lookup_hashed(key, self.hash(key))
    }

    /// [`lookup`](Self::lookup) for many keys, with the memory accesses of the whole batch
    /// overlapped: first every key's index slot is prefetched, then every candidate entry,
    /// then the lookups run (on warm lines). `out[i]` is the answer for `keys[i]`; `out` must
    /// be at least as long as `keys`. Same results as calling `lookup` per key.
    pub fn lookup_batch(&self, keys: &[FlowKey], out: &mut [Option<(FlowHandle, Direction)>]) {
        const CHUNK: usize = 16;
        assert!(
            out.len() >= keys.len(),
            "lookup_batch: out shorter than keys"
        );
        for (keys, out) in keys.chunks(CHUNK).zip(out.chunks_mut(CHUNK)) {
            let mut hashes = [0u64; CHUNK];
            for (h, k) in hashes.iter_mut().zip(keys) {
                *h = self.hash(k);
                self.index.prefetch(*h);
            }
            for &h in &hashes[..keys.len()] {
                self.prefetch_entry_word(self.index.home_word(h));
            }
            for ((o, k), &h) in out.iter_mut().zip(keys).zip(&hashes) {
                *o = self.lookup_hashed(k, h);
            }
        }
    }

    /// Prefetch the entry an index word points to, if it is a live word.
    #[inline]
    pub(super) fn prefetch_entry_word(&self, w: u64) {
        if w != index::EMPTY && w != index::TOMB && w != index::FROZEN {
            let (e, _) = index::word_entry(w);
            // No bounds check: a hint reads nothing, so a damaged word's address (wrapping
            // arithmetic, never dereferenced) is harmless.
            crate::sync::prefetch_ptr(self.entries.as_ptr().wrapping_add(e as usize));
        }
    }

    #[inline]
    pub(super) fn lookup_hashed(&self, key: &FlowKey, h: u64) -> Option<(FlowHandle, Direction)> {
        self.index.probe(h, |w| {
            let (e, reply) = index::word_entry(w);
            let g = self.matches(e, reply, key)?;
            let dir = if reply {
                Direction::Reply
            } else {
                Direction::Original
            };
            Some((FlowHandle::new(e, g), dir))
        })
    }

    /// The per-packet lookup: finds `key`'s flow and returns only what a packet of it needs
    /// (handle, direction, the translated endpoints, the state word for [`touch`](Self::touch)),
    /// read from the entry's hot line in the same validated pass as the key comparison. No
    /// `FlowData`/`SocketAddr` is built. Wait-free like [`lookup`](Self::lookup).
    #[inline]
    pub fn lookup_hit(&self, key: &FlowKey) -> Option<FlowHit> {
        let h = self.hash(key);
        self.index.probe(h, |w| {
            let (e, reply) = index::word_entry(w);
            self.hit(e, reply, key)
        })
    }

    /// [`matches`](Self::matches), reading the outgoing endpoints too.
    #[inline(always)]
    pub(super) fn hit(&self, e: u32, reply: bool, key: &FlowKey) -> Option<FlowHit> {
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) {
            return None;
        }
        let meta = self.word(e, W_META);
        let ports = self.ports_host(e);
        let ids = self.word(e, W_IDS);
        let (slot, key_ports) = if reply {
            (A_BACKEND, ports >> 32)
        } else {
            (A_CLIENT, ports)
        };
        let misc = key.misc();
        if !((meta >> 32) & 0xffff == misc >> 32
            && key_ports as u32 == misc as u32
            && self.addrs_match(e, slot, key))
        {
            return None;
        }
        // Original: leaves as snat -> backend; reply: as vip -> client.
        let (src, dst, src_port, dst_port) = if reply {
            let (s, d) = if key.v6 {
                (self.addr(e, A_VIP, true), self.addr(e, A_CLIENT, true))
            } else {
                v4_halves(self.v4_addrs_host(e, 0))
            };
            (s, d, (ports >> 16) as u16, ports as u16)
        } else {
            let (s, d) = if key.v6 {
                (self.addr(e, A_SNAT, true), self.addr(e, A_BACKEND, true))
            } else {
                v4_halves(self.v4_addrs_host(e, 1))
            };
            (s, d, (ports >> 48) as u16, (ports >> 32) as u16)
        };
        fence(Ordering::Acquire);
        let c2 = entry.w[W_CTL].load(Ordering::Relaxed);
        if !(ctl_readable(c2) && ctl_gen(c2) == ctl_gen(c1)) {
            return None;
        }
        Some(FlowHit {
            handle: FlowHandle::new(e, ctl_gen(c1)),
            dir: if reply {
                Direction::Reply
            } else {
                Direction::Original
            },
            src,
            dst,
            src_port,
            dst_port,
            v6: key.v6,
            flags: (meta >> 48) as u8,
            ctl: c2,
            backend: (ids >> 32) as u32,
        })
    }

    /// Copy a flow out; `None` if the handle is stale (flow removed or slot recycled).
    pub fn get(&self, h: FlowHandle) -> Option<FlowView> {
        let e = h.entry();
        let entry = self.entries.get(e as usize)?;
        let c1 = entry.w[W_CTL].load(Ordering::Acquire);
        if !ctl_readable(c1) || ctl_gen(c1) != h.gen_() {
            return None;
        }
        let data = self.read_data(e);
        let seq = entry.w[super::entry::W_SEQ].load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let c2 = entry.w[W_CTL].load(Ordering::Relaxed);
        if !ctl_readable(c2) || ctl_gen(c2) != h.gen_() {
            return None;
        }
        let data = data?;
        Some(FlowView {
            handle: h,
            data,
            state: FlowState::from_u8(ctl_state(c2)),
            last_seen: self.instant(ctl_ls(c2)),
            seq: if seq >> SEQ_BITS == Self::seq_gen(h) {
                seq & SEQ_MASK
            } else {
                0
            },
        })
    }
}
