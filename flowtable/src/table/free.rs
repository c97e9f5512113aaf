//! Entry allocation: the free list (a Treiber stack with an ABA tag, linked through the free
//! entries' id words) and, when it is empty, recycling an embryonic or expired flow near the new
//! flow's hash.

use super::FlowTable;
use super::entry::debug_transition;
use super::entry::{ST_FREE, ST_LIVE, W_CTL, W_IDS, W_META, ctl, ctl_gen, ctl_state, ctl_status};
use super::handle::ExpiredFlow;
use crate::state::FlowState;
use crate::sync::Ordering;

/// Entries probed for an embryonic or expired victim when the free list is empty.
pub(super) const VICTIM_PROBE: usize = 32;

impl FlowTable {
    /// Pop a free entry, or recycle an embryonic/expired one near `hash`.
    #[inline]
    pub(super) fn alloc(
        &self,
        hash: u64,
        now_t: u32,
        on_evict: impl FnMut(ExpiredFlow),
    ) -> Option<u32> {
        if let Some(e) = self.pop_free() {
            return Some(e);
        }
        self.recycle(hash, now_t, on_evict)
    }

    /// [`alloc`](Self::alloc) when the free list is empty (a full table): out of line, so
    /// that an insert's usual case, inlined, does not carry its registers and stack.
    #[cold]
    #[inline(never)]
    fn recycle(&self, hash: u64, now_t: u32, mut on_evict: impl FnMut(ExpiredFlow)) -> Option<u32> {
        let cap = self.entries.len();
        // Low hash bits: independent of the index home (top bits), so recycled flows do not
        // all land in one index region.
        let start = (((hash & 0xffff_ffff) * cap as u64) >> 32) as usize;
        for i in 0..VICTIM_PROBE.min(cap) {
            let e = ((start + i) % cap) as u32;
            let c = self.entries[e as usize].w[W_CTL].load(Ordering::Acquire);
            if ctl_status(c) != ST_LIVE {
                continue;
            }
            let state = FlowState::from_u8(ctl_state(c));
            if !state.is_embryonic() && !self.expired(c, now_t) {
                continue;
            }
            let victim = |c: u64| {
                let s = FlowState::from_u8(ctl_state(c));
                s.is_embryonic() || self.expired(c, now_t)
            };
            if let Some(f) = self.take(e, ctl_gen(c), victim, false) {
                self.counters.0.recycled.fetch_add(1, Ordering::Relaxed);
                self.note_pressure(now_t);
                on_evict(f);
                return Some(e);
            }
        }
        // A sweep may have freed something meanwhile.
        self.pop_free()
    }

    #[inline]
    pub(super) fn pop_free(&self) -> Option<u32> {
        let mut head = self.free.0.load(Ordering::Acquire);
        loop {
            let idx = head as u32;
            if idx == 0 {
                return None;
            }
            let e = idx - 1;
            let next = self.entries[e as usize].w[W_IDS].load(Ordering::Relaxed) as u32;
            let new = ((head >> 32) + 1) << 32 | u64::from(next);
            match self
                .free
                .0
                .compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // A free-list entry is FREE; its link is an entry + 1, or 0 at the end.
                    debug_assert_eq!(
                        ctl_status(self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed)),
                        ST_FREE,
                        "popped entry {e}"
                    );
                    debug_assert!(next as usize <= self.entries.len(), "free link {next}");
                    // The next insert takes the new head: start fetching its line now (a
                    // hint; on a shuffled free list it would be a cache miss later).
                    if let Some(n) = (next as usize)
                        .checked_sub(1)
                        .and_then(|n| self.entries.get(n))
                    {
                        crate::sync::prefetch(n);
                    }
                    return Some(e);
                }
                Err(h) => head = h,
            }
        }
    }

    pub(super) fn push_free(&self, e: u32) {
        let link = &self.entries[e as usize].w[W_IDS];
        debug_assert_eq!(
            ctl_status(self.entries[e as usize].w[W_CTL].load(Ordering::Relaxed)),
            ST_FREE,
            "pushing entry {e}"
        );
        let mut head = self.free.0.load(Ordering::Relaxed);
        loop {
            link.store(head & 0xffff_ffff, Ordering::Relaxed);
            let new = ((head >> 32) + 1) << 32 | (u64::from(e) + 1);
            match self
                .free
                .0
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Mark an owned entry FREE and push it, and its extension, on the free list.
    pub(super) fn release(&self, e: u32, gen_: u64) {
        let ext = self.mark_free(e, gen_);
        self.push_free(e);
        if let Some(x) = ext {
            self.free_extension(x);
        }
    }

    /// Gives an IPv6 flow's extension back (its flow's entry is FREE already).
    pub(super) fn free_extension(&self, x: u32) {
        self.counters.0.extensions.fetch_sub(1, Ordering::Relaxed);
        self.push_free(x);
    }

    /// Entries in use: the live flows plus the IPv6 flows' extensions (approximate while
    /// flows come and go). What "full" means: an IPv6 flow takes two of the capacity's
    /// entries.
    pub fn entries_used(&self) -> usize {
        let ext = (self.counters.0.extensions.load(Ordering::Relaxed) as i64).max(0) as usize;
        (self.len() + ext).min(self.entries.len())
    }

    /// Mark an owned entry (DYING, by the one winner of the removal or a torn-down insert:
    /// its data words are stable) FREE; returns its extension, which the caller frees: only
    /// now, so that a reader that followed the entry to it sees the FREE word when it
    /// validates (the crate docs' "Readers").
    pub(super) fn mark_free(&self, e: u32, gen_: u64) -> Option<u32> {
        let entry = &self.entries[e as usize];
        let v6 = (entry.w[W_META].load(Ordering::Relaxed) >> 40) & 1 == 1;
        let ext = if v6 { self.ext_of(e) } else { None };
        let new = ctl(gen_, ST_FREE, 0, 0);
        debug_transition!(entry.w[W_CTL].load(Ordering::Relaxed), new);
        entry.w[W_CTL].store(new, Ordering::Release);
        ext
    }

    /// Two entries for an IPv6 flow (the second its extension), one for IPv4; see
    /// [`alloc`](Self::alloc). An IPv6 flow that finds only one gives it back.
    pub(super) fn alloc_flow(
        &self,
        v6: bool,
        hash: u64,
        now_t: u32,
        mut on_evict: impl FnMut(ExpiredFlow),
    ) -> Option<(u32, Option<u32>)> {
        let e = self.alloc(hash, now_t, &mut on_evict)?;
        if !v6 {
            return Some((e, None));
        }
        match self.alloc(hash.rotate_left(32), now_t, on_evict) {
            Some(x) => {
                self.counters.0.extensions.fetch_add(1, Ordering::Relaxed);
                Some((e, Some(x)))
            }
            None => {
                self.push_free(e);
                None
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::time::{Duration, Instant};

    use crate::{
        BackendId, ConnCounts, Direction, FlowData, FlowState, FlowTable, FlowTableConfig,
        InsertError, Protocol, TcpFlags, TcpState,
    };

    fn v4(a: u8, b: u8, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, a, b)), port)
    }

    /// Flow `i` (full-NAT): client 198.18.{i>>8}.{i} : 10000+i -> VIP, SNAT port 20000+i.
    fn flow(proto: Protocol, i: u32, backend: u32) -> FlowData {
        FlowData {
            proto,
            client: v4((i >> 8) as u8, i as u8, 10000 + (i % 50000) as u16),
            vip: v4(100, 1, 80),
            backend: v4(1, backend as u8, 8080),
            snat: v4(200, 1, 20000 + (i % 40000) as u16),
            service_id: 7,
            backend_id: BackendId(backend),
            snapshot_gen: i,
            flags: 1,
        }
    }

    fn v6(i: u32, port: u16) -> SocketAddr {
        SocketAddr::new(
            IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, i as u16, 1)),
            port,
        )
    }

    /// An IPv6 flow takes two entries (its extension) and gives both back whichever way it
    /// leaves: removal, a torn-down insert, expiry, recycling. One that finds a single free
    /// entry fails like a full table and leaves that entry free.
    #[test]
    fn ipv6_flows_take_two_entries_and_give_both_back() {
        let now = Instant::now();
        let t = FlowTable::new(FlowTableConfig::new(9, 4), now).unwrap();
        let tick = t.tick(now);
        let f6 = |i: u32| FlowData {
            proto: Protocol::Udp,
            client: v6(i, 1000),
            vip: v6(100, 80),
            backend: v6(200 + i, 8080),
            snat: v6(300, 2000 + i as u16),
            service_id: 1,
            backend_id: BackendId(0),
            snapshot_gen: 1,
            flags: 0,
        };
        let hs: Vec<_> = (0..4)
            .map(|i| t.insert(&f6(i), TcpFlags::NONE, tick).unwrap())
            .collect();
        assert_eq!(t.check_quiescent(), Ok(()));
        // Eight of nine entries in use for four flows: 7/8 full, so under pressure.
        assert_eq!((t.len(), t.stats().entries), (4, 8));
        assert!(t.under_pressure(tick));
        // One entry left: no IPv6 flow, and the entry is still there for an IPv4 one.
        assert_eq!(
            t.insert(&f6(4), TcpFlags::NONE, tick),
            Err(InsertError::Full)
        );
        assert_eq!(t.check_quiescent(), Ok(()));
        let h4 = t
            .insert(&flow(Protocol::Udp, 1, 0), TcpFlags::NONE, tick)
            .unwrap();
        assert_eq!(t.check_quiescent(), Ok(()));
        for (i, h) in hs.iter().enumerate() {
            let v = t.get(*h).unwrap();
            assert_eq!(
                v.data,
                f6(i as u32),
                "addresses read back through the extension"
            );
            assert_eq!(
                t.lookup(&f6(i as u32).reply_key()),
                Some((*h, Direction::Reply))
            );
        }
        // A reply tuple in use: the insert is torn down, both its entries freed.
        t.remove(hs[0]).unwrap();
        let mut clash = f6(9);
        (clash.backend, clash.snat) = (f6(1).backend, f6(1).snat);
        assert!(matches!(
            t.insert(&clash, TcpFlags::NONE, tick),
            Err(InsertError::ReplyInUse(_))
        ));
        assert_eq!(t.check_quiescent(), Ok(()));
        t.remove(hs[1]).unwrap();
        t.remove(h4).unwrap();
        // Expiry frees the rest; then nine IPv4 flows fit.
        t.sweep(
            t.tick(now + std::time::Duration::from_secs(3600)),
            9,
            |_| {},
        );
        assert_eq!((t.len(), t.check_quiescent()), (0, Ok(())));
        assert_eq!(t.entries_used(), 0);
        for i in 0..9 {
            t.insert(&flow(Protocol::Udp, 10 + i, 0), TcpFlags::NONE, tick)
                .unwrap();
        }
        assert_eq!(t.stats().recycled, 0);
        assert_eq!(t.check_quiescent(), Ok(()));

        // Recycling an embryonic IPv6 flow: its entry to the inserter, its extension free.
        let t = FlowTable::new(FlowTableConfig::new(4, 4), now).unwrap();
        let syn6 = FlowData {
            proto: Protocol::Tcp,
            ..f6(0)
        };
        t.insert(&syn6, TcpFlags::SYN, tick).unwrap();
        for i in 0..2 {
            t.insert(&flow(Protocol::Udp, i, 0), TcpFlags::NONE, tick)
                .unwrap();
        }
        t.insert(&flow(Protocol::Tcp, 5, 0), TcpFlags::SYN, tick)
            .unwrap();
        assert_eq!((t.stats().recycled, t.len()), (1, 3));
        assert_eq!(t.check_quiescent(), Ok(()));
        t.insert(&flow(Protocol::Udp, 6, 0), TcpFlags::NONE, tick)
            .unwrap();
        assert_eq!(
            (t.stats().recycled, t.len()),
            (1, 4),
            "the extension was free"
        );
    }

    /// What an insert recycles to make room (`insert_ticks`' `on_evict` sees it) is only ever
    /// an embryonic flow: established connections are never pushed out.
    #[test]
    fn full_table_refuses_then_recycles_only_embryonic() {
        use Direction::{Original as In, Reply as Out};
        const SYN: TcpFlags = TcpFlags::SYN;
        const SYNACK: TcpFlags = TcpFlags(TcpFlags::SYN.0 | TcpFlags::ACK.0);
        const ACK: TcpFlags = TcpFlags::ACK;
        let cap = 1000;
        let now = Instant::now();
        // A fixed hash seed: the probe displacement checked below depends on where the hash
        // puts the flows (a random seed exceeds it about one run in a hundred).
        let mut cfg = FlowTableConfig::new(cap, 8);
        cfg.hash_seed = 0x0123_4567_89ab_cdef;
        let t = FlowTable::new(cfg, now).unwrap();
        let mut est = Vec::new();
        for i in 0..cap as u32 - 10 {
            let d = flow(Protocol::Tcp, i, i % 8);
            let h = t.insert(&d, SYN, t.tick(now)).unwrap();
            t.on_packet(h, Out, SYNACK, t.tick(now));
            t.on_packet(h, In, ACK, t.tick(now));
            est.push((d, h));
        }
        let udp = flow(Protocol::Udp, 5000, 1);
        t.insert(&udp, TcpFlags::NONE, t.tick(now)).unwrap();
        // SYN flood: 20000 new embryonic flows, far more than the 9 free entries.
        let mut ok = 0;
        let mut evicted = Vec::new();
        for i in 0..20000u32 {
            if i % 100 == 0 {
                t.sweep(t.tick(now + Duration::from_secs(1)), 64, |_| {
                    panic!("nothing is idle yet")
                });
            }
            let d = flow(Protocol::Tcp, 10000 + i, 0);
            let at = t.tick(now + Duration::from_secs(1)).0;
            match t.insert_ticks(&d, SYN, at, |f| evicted.push(f)) {
                Ok(_) => ok += 1,
                Err(InsertError::Full) => {}
                Err(e) => panic!(
                    "unexpected {e:?} at {i}: {:?} {:?}",
                    t.index_census(),
                    t.stats()
                ),
            }
        }
        assert!(
            ok >= 9,
            "free entries and recycled embryonic ones are used: {ok}"
        );
        assert!(t.stats().full > 0);
        assert!(t.stats().recycled > 0);
        assert!(evicted.iter().all(|f| f.state.is_embryonic()));
        assert_eq!(t.len(), cap);
        for (d, h) in &est {
            assert_eq!(t.lookup(&d.original_key()), Some((*h, In)));
            assert_eq!(t.lookup(&d.reply_key()), Some((*h, Out)));
            assert_eq!(
                t.get(*h).unwrap().state,
                FlowState::Tcp(TcpState::Established)
            );
        }
        assert!(t.lookup(&udp.original_key()).is_some());
        assert!(
            t.index_census().3 < 64,
            "no runaway cluster: {:?}",
            t.index_census()
        );
        let active: u32 = (0..8).map(|b| t.active(BackendId(b))).sum();
        let inactive: u32 = (0..8).map(|b| t.inactive(BackendId(b))).sum();
        assert_eq!(active as usize, est.len());
        assert_eq!(inactive as usize, cap - est.len());
        // Once the UDP flow is idle for its timeout it can be recycled too.
        let later = now + Duration::from_secs(400);
        t.insert(&flow(Protocol::Udp, 6000, 1), TcpFlags::NONE, t.tick(later))
            .ok();
    }
}
