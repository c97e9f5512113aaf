//! Consistency checks of a quiescent table (no call running on it), for `debug_assert!`s at
//! the points where the table is quiescent by contract ([`FlowTable::mark_clean`]) and for
//! tests. Not on any per-packet path.
//!
//! - [`FlowTable::check_counts`]: the per-backend counts and the embryonic gauge equal a
//!   recount of the LIVE entries (so none is negative), and `len` is the number of LIVE
//!   entries. A concurrent table may be off for a moment (a remover's decrement overtaking a
//!   state change's increment); a quiescent one never is.
//! - [`FlowTable::check_quiescent`]: that, and the structure: every entry FREE or LIVE, every
//!   index slot holds what it may (`index::slot_valid`), each LIVE entry has exactly one word
//!   per direction, within its probe window and with no EMPTY slot between its home and it
//!   (the index's invariant (I)), no word names a FREE entry, and the free list holds exactly
//!   the FREE entries that are no LIVE IPv6 flow's extension (each such flow names its own).

use super::FlowTable;
use super::counts::unpack;
use super::entry::{ST_FREE, ST_LIVE, W_CTL, W_IDS, W_META, ctl_state, ctl_status};
use crate::index::{self, EMPTY, FROZEN, TOMB};
use crate::state::FlowState;
use crate::sync::Ordering;

impl FlowTable {
    /// The per-backend counts, the embryonic gauge and `len` against a recount of the LIVE
    /// entries; the first difference found. Only meaningful on a quiescent table.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn check_counts(&self) -> Result<(), String> {
        let mut want = vec![(0i64, 0i64); self.backends.len()];
        let (mut live, mut embryonic) = (0usize, 0i64);
        for (e, entry) in self.entries.iter().enumerate() {
            let c = entry.w[W_CTL].load(Ordering::Relaxed);
            if ctl_status(c) != ST_LIVE {
                continue;
            }
            live += 1;
            let state = FlowState::from_u8(ctl_state(c));
            embryonic += i64::from(state.is_embryonic());
            let backend = (self.word(e as u32, W_IDS) >> 32) as usize;
            let Some(w) = want.get_mut(backend) else {
                return Err(format!("entry {e}: backend id {backend} >= backends_max"));
            };
            if state.is_active() {
                w.0 += 1;
            } else {
                w.1 += 1;
            }
        }
        for (b, (w, have)) in want.iter().zip(self.backends.iter()).enumerate() {
            let (a, i) = unpack(have.0.load(Ordering::Relaxed));
            if (i64::from(a), i64::from(i)) != *w {
                return Err(format!(
                    "backend {b}: counts (active {a}, inactive {i}), live entries say {w:?}"
                ));
            }
        }
        let gauge = self.counters.0.embryonic.load(Ordering::Relaxed) as i64;
        if gauge != embryonic {
            return Err(format!(
                "embryonic gauge {gauge}, live entries say {embryonic}"
            ));
        }
        if self.len() != live {
            return Err(format!("len {}, live entries {live}", self.len()));
        }
        Ok(())
    }

    /// [`check_counts`](Self::check_counts) and the structure of entries, index and free
    /// list (see the module doc); the first inconsistency found.
    #[cfg_attr(any(not(test), loom), allow(dead_code))]
    pub(crate) fn check_quiescent(&self) -> Result<(), String> {
        let cap = self.entries.len();
        let mut words = vec![[0u32; 2]; cap];
        for (e, entry) in self.entries.iter().enumerate() {
            let s = ctl_status(entry.w[W_CTL].load(Ordering::Relaxed));
            if s != ST_FREE && s != ST_LIVE {
                return Err(format!("entry {e}: status {s} in a quiescent table"));
            }
        }
        let slots = &self.index.slots;
        for (p, slot) in slots.iter().enumerate() {
            let w = slot.load(Ordering::Relaxed);
            if !index::slot_valid(w, cap) {
                return Err(format!(
                    "index slot {p}: word {w:#x} is none a slot may hold"
                ));
            }
            if matches!(w, EMPTY | TOMB | FROZEN) {
                continue;
            }
            let (e, reply) = index::word_entry(w);
            let c = self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed);
            if ctl_status(c) != ST_LIVE {
                return Err(format!(
                    "index slot {p}: names entry {e}, status {}",
                    ctl_status(c)
                ));
            }
            words[e as usize][usize::from(reply)] += 1;
            let home = self.index.home(w);
            if p < home || p - home >= index::MAX_PROBE {
                return Err(format!(
                    "index slot {p}: outside its window from home {home}"
                ));
            }
            if let Some(q) =
                (home..p).find(|&q| matches!(slots[q].load(Ordering::Relaxed), EMPTY | FROZEN))
            {
                return Err(format!(
                    "index slot {p}: empty slot {q} after its home {home}"
                ));
            }
        }
        let mut free = 0;
        let mut ext = vec![false; cap];
        for (e, entry) in self.entries.iter().enumerate() {
            let live = ctl_status(entry.w[W_CTL].load(Ordering::Relaxed)) == ST_LIVE;
            if live && (self.word(e as u32, W_META) >> 40) & 1 == 1 {
                match self.ext_of(e as u32) {
                    Some(x)
                        if x as usize != e && !std::mem::replace(&mut ext[x as usize], true) => {}
                    x => {
                        return Err(format!(
                            "entry {e}: extension {x:?} (none, itself or shared)"
                        ));
                    }
                }
            }
            free += usize::from(!live);
            if live && words[e] != [1, 1] {
                return Err(format!(
                    "entry {e}: index words per direction {:?}",
                    words[e]
                ));
            }
        }
        self.check_free_list(free, &ext)?;
        self.check_counts()
    }

    /// The free list holds exactly the `free` FREE entries that are not LIVE flows'
    /// extensions (`ext`).
    #[cfg_attr(any(not(test), loom), allow(dead_code))]
    fn check_free_list(&self, free: usize, ext: &[bool]) -> Result<(), String> {
        let cap = self.entries.len();
        let mut head = self.free.0.load(Ordering::Relaxed) as u32;
        let mut listed = 0;
        while head != 0 {
            let e = head as usize - 1;
            if e >= cap || listed > cap {
                return Err(format!("free list: link {head} after {listed} entries"));
            }
            if ctl_status(self.entries[e].w[W_CTL].load(Ordering::Relaxed)) != ST_FREE {
                return Err(format!("free list: entry {e} is not FREE"));
            }
            if ext[e] {
                return Err(format!("free list: entry {e} is a live flow's extension"));
            }
            listed += 1;
            head = self.entries[e].w[W_IDS].load(Ordering::Relaxed) as u32;
        }
        let exts = ext.iter().filter(|x| **x).count();
        if listed + exts != free {
            return Err(format!(
                "free list: {listed} entries, {free} FREE of which {exts} extensions"
            ));
        }
        let gauge = self.counters.0.extensions.load(Ordering::Relaxed) as i64;
        if gauge != exts as i64 {
            return Err(format!("extensions gauge {gauge}, {exts} extensions taken"));
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use crate::table::entry::ST_INSERTING;
    use crate::table::entry::{W_CTL, ctl, ctl_gen, ctl_ls, ctl_state};
    use crate::{BackendId, FlowData, FlowTable, FlowTableConfig, Protocol, TcpFlags};
    use crate::{Direction, sync::Ordering};

    fn flow(i: u32, backend: u32) -> FlowData {
        let sa = |a: [u8; 4], p: u16| SocketAddr::from((a, p));
        FlowData {
            proto: Protocol::Tcp,
            client: sa(
                [198, 18, (i >> 8) as u8, i as u8],
                40000 + (i % 1000) as u16,
            ),
            vip: sa([198, 18, 200, 1], 80),
            backend: sa([198, 19, 0, backend as u8 + 1], 8080),
            snat: sa([198, 19, 100, 1], 10000 + i as u16),
            service_id: 1,
            backend_id: BackendId(backend),
            snapshot_gen: 1,
            flags: 0,
        }
    }

    #[test]
    fn a_table_through_inserts_packets_removals_and_sweeps_stays_consistent() {
        let epoch = Instant::now();
        let t = FlowTable::new(FlowTableConfig::new(64, 4), epoch).unwrap();
        t.check_quiescent().unwrap();
        let mut handles = Vec::new();
        // More inserts than entries: SYN-only flows are recycled when full.
        for i in 0..100u32 {
            let flags = if i % 3 == 0 {
                TcpFlags::ACK
            } else {
                TcpFlags::SYN
            };
            if let Ok(h) = t.insert(&flow(i, i % 4), flags, t.tick(epoch)) {
                handles.push(h);
            }
            t.check_quiescent().unwrap();
        }
        assert!(t.stats().recycled > 0, "the table never filled");
        for (k, h) in handles.iter().enumerate() {
            let flags = [TcpFlags::ACK, TcpFlags::FIN, TcpFlags::RST][k % 3];
            t.on_packet(
                *h,
                Direction::Reply,
                flags,
                t.tick(epoch + Duration::from_secs(1)),
            );
            if k % 5 == 0 {
                t.remove(*h);
            }
        }
        t.check_quiescent().unwrap();
        let late = epoch + Duration::from_secs(100_000);
        t.sweep(t.tick(late), 64, |_| {});
        assert_eq!(t.len(), 0);
        t.check_quiescent().unwrap();
    }

    #[test]
    fn the_checks_find_a_count_a_status_and_an_index_word_out_of_place() {
        let epoch = Instant::now();
        let t = FlowTable::new(FlowTableConfig::new(16, 2), epoch).unwrap();
        let h = t.insert(&flow(1, 1), TcpFlags::ACK, t.tick(epoch)).unwrap();
        t.check_quiescent().unwrap();
        // A count off by one.
        t.backends[1].0.fetch_add(1, Ordering::Relaxed);
        assert!(t.check_counts().unwrap_err().contains("backend 1"));
        t.backends[1].0.fetch_sub(1, Ordering::Relaxed);
        // An entry left INSERTING.
        let w = &t.entries[h.entry() as usize].w[W_CTL];
        let c = w.load(Ordering::Relaxed);
        w.store(
            ctl(ctl_gen(c), ST_INSERTING, ctl_state(c), ctl_ls(c)),
            Ordering::Relaxed,
        );
        assert!(t.check_quiescent().unwrap_err().contains("status 1"));
        w.store(c, Ordering::Relaxed);
        // An index word naming an entry beyond the table.
        let slot = t
            .index
            .slots
            .iter()
            .position(|s| s.load(Ordering::Relaxed) == 0)
            .unwrap();
        t.index.slots[slot].store(
            crate::index::make_word(1 << 40, false, 99),
            Ordering::Relaxed,
        );
        assert!(
            t.check_quiescent()
                .unwrap_err()
                .contains("none a slot may hold")
        );
    }
}
