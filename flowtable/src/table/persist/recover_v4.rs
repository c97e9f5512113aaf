//! The recovery pass's shortcut for an IPv4 entry (nearly every flow): the table's checks of
//! [`FlowTable::entry_flow`] made on the entry's words as they are, without building the
//! flow's socket addresses twice, its tuples three times and a [`Refusal`] nobody reads.
//!
//! Contract: [`FlowTable::v4_flow`] passes an entry exactly when `entry_flow` (with a check
//! that takes everything) would take it, and then with the same [`FlowData`] and state, and
//! the two tuples `FlowData::original_key` and `reply_key` make (the tests check it both
//! ways over entries with random words). An entry it does not pass goes the general way,
//! which names the field and the value refused: nothing is checked less, and the refusals
//! read as before.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use lb_algos::BackendId;

use super::super::FlowTable;
use super::super::entry::{
    FLAG_ONE_WAY, W_ADDR, W_IDS, W_META, W_PORTS, W_V4_CSUM, ctl_ls, ctl_state,
};
use super::super::v4::{ports4_be, v4_addrs_be};
use super::recover::{FUTURE_TICKS, v4_csum_word};
use super::valid::state_of;
use crate::key::{FlowData, FlowKey, Protocol};
use crate::state::FlowState;

#[cfg(doc)]
use shm::Refusal;

/// An IPv4 flow the shortcut passed: its data, state and both tuples.
pub(super) struct V4Flow {
    pub(super) data: FlowData,
    pub(super) state: FlowState,
    pub(super) original: FlowKey,
    pub(super) reply: FlowKey,
}

/// The meta word's bits an IPv4 flow has clear: the unused ones `entry_flow` refuses and
/// the IPv6 bit (40).
const META_NOT_V4: u64 = 0xff00_ff00_0000_0000;

impl FlowTable {
    /// LIVE entry `e` (control word `c`) as `entry_flow` would take it at tick `now` with
    /// `backends_max`, if it is an IPv4 flow that passes every table check; `None` for
    /// anything else (see the module doc).
    #[inline]
    pub(super) fn v4_flow(&self, e: u32, c: u64, now: u32, backends_max: usize) -> Option<V4Flow> {
        let meta = self.word(e, W_META);
        if meta & META_NOT_V4 != 0 {
            return None;
        }
        let proto = Protocol::from_ip_proto((meta >> 32) as u8)?;
        let ported = match proto {
            Protocol::Tcp | Protocol::Udp | Protocol::Sctp => true,
            Protocol::Icmp => false,
            Protocol::Icmpv6 => return None,
        };
        let state = state_of(ctl_state(c), proto).ok()?;
        if ctl_ls(c) > now.saturating_add(FUTURE_TICKS) {
            return None;
        }
        let (ports, ids) = (self.word(e, W_PORTS), self.word(e, W_IDS));
        let (cv, bs) = (self.word(e, W_ADDR), self.word(e, W_ADDR + 1));
        if self.word(e, W_V4_CSUM) != v4_csum_word(cv, bs, ports) {
            return None;
        }
        // client, vip, backend, snat (host order: stored in network order).
        let (cv, bs, ports) = (v4_addrs_be(cv), v4_addrs_be(bs), ports4_be(ports));
        let a = [cv as u32, (cv >> 32) as u32, bs as u32, (bs >> 32) as u32];
        let p = [
            ports as u16,
            (ports >> 16) as u16,
            (ports >> 32) as u16,
            (ports >> 48) as u16,
        ];
        // Unicast: not unspecified, multicast (224/4) or broadcast (`flow_refusal`'s).
        let unicast = |x: u32| x != 0 && x >> 28 != 0xe && x != u32::MAX;
        if !a.into_iter().all(unicast) || (ported && p.contains(&0)) {
            return None;
        }
        let backend_id = (ids >> 32) as u32;
        if backend_id as usize >= backends_max {
            return None;
        }
        let flags = (meta >> 48) as u8;
        let original = FlowKey::v4_bits(proto, a[0], p[0], a[1], p[1]);
        let reply = if flags & FLAG_ONE_WAY != 0 {
            FlowKey::v4_bits(proto, a[1], p[1], a[0], p[0])
        } else {
            FlowKey::v4_bits(proto, a[2], p[2], a[3], p[3])
        };
        if original == reply {
            return None;
        }
        let sa = |i: usize| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from_bits(a[i]), p[i]));
        let data = FlowData {
            proto,
            client: sa(0),
            vip: sa(1),
            backend: sa(2),
            snat: sa(3),
            service_id: ids as u32,
            backend_id: BackendId(backend_id),
            snapshot_gen: meta as u32,
            flags,
        };
        Some(V4Flow {
            data,
            state,
            original,
            reply,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::super::entry::{HOT_WORDS, ST_LIVE, W_CTL, ctl, ctl_status};
    use super::super::AnyFlow;
    use super::*;
    use crate::FlowTableConfig;
    use crate::state::TcpFlags;
    use crate::sync::Ordering;

    /// A small xorshift: the test's words, reproducible.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// The first of `choices` (the valid value) one time in two, a random word one
        /// time in eight, else any of them.
        fn pick(&mut self, choices: &[u64]) -> u64 {
            let r = self.next();
            match r % 8 {
                0 => self.next(),
                1..4 => choices[(r >> 8) as usize % choices.len()],
                _ => choices[0],
            }
        }
    }

    fn flow(i: u16) -> FlowData {
        super::super::recover::tests::flow_of(i, 4)
    }

    /// The shortcut and `entry_flow` agree on every entry: the same entries pass, with the
    /// same data, state and tuples. Entries are valid flows with each word in turn replaced
    /// by edge values (0, multicast, broadcast, other protocols, meta bits, one-way flows,
    /// a backend id at the limit, last-seen times ahead) or random bits, the checksum word
    /// recomputed or not.
    #[test]
    fn the_ipv4_shortcut_takes_exactly_what_entry_flow_takes() {
        let now = Instant::now();
        let t = FlowTable::new(FlowTableConfig::new(64, 4), now).unwrap();
        let h = t.insert(&flow(1), TcpFlags::SYN, t.tick(now)).unwrap();
        let e = h.entry();
        let good: Vec<u64> = (0..HOT_WORDS).map(|w| t.word(e, w)).collect();
        let tick = t.ticks(now);
        // (Written in host order; the entry stores network order.)
        let addr_words = [
            0,
            v4_addrs_be(good[W_ADDR]),
            v4_addrs_be(good[W_ADDR + 1]),
            0xe000_0001_c612_0001,
            0xc612_0001_ffff_ffff,
            0xc612_0001_0000_0000,
            0xc612_0001_c612_0001,
            0x0a00_0001_0a00_0002,
        ]
        .map(v4_addrs_be);
        let port_words = [
            ports4_be(good[W_PORTS]),
            0,
            0x1f90_0050_0050_1f90,
            0x1f90_07d0_0050_03e8,
            0x0000_07d0_0050_03e8,
            0x1f90_07d0_0050_0000,
            // Both directions alike (with both address words alike), and a one-way flow's.
            0x0050_1f90_0050_1f90,
            0x07d0_0050_1f90_1f90,
        ]
        .map(ports4_be);
        let (m, mut rng) = (good[W_META], Rng(0x9e37_79b9_7f4a_7c15));
        let metas = [
            m,
            m | 1 << 40,
            m | 1 << 41,
            m | 1 << 63,
            m | 1 << 8,
            (m & !(0xff << 32)) | 17 << 32,
            (m & !(0xff << 32)) | 1 << 32,
            (m & !(0xff << 32)) | 58 << 32,
            (m & !(0xff << 32)) | 132 << 32,
            (m & !(0xff << 32)) | 99 << 32,
            m | u64::from(FLAG_ONE_WAY) << 48,
            m | 0x81 << 48,
        ];
        let ids_words = [good[W_IDS], 3 << 32 | 7, 4 << 32 | 7, u64::MAX];
        let (mut passed, mut taken) = (0, 0);
        for round in 0..40_000 {
            let c0 = good[W_CTL];
            let states = [ctl_state(c0), 1, 5, 10, 16, 200].map(u64::from);
            let state = rng.pick(&states) as u8;
            let ls = rng.pick(&[ctl_ls(c0), tick + 600, tick + 601, u32::MAX].map(u64::from));
            let ls = ls as u32;
            let c = ctl(0, ST_LIVE, state, ls);
            let mut w = good.clone();
            w[W_META] = rng.pick(&metas);
            w[W_PORTS] = rng.pick(&port_words);
            w[W_IDS] = rng.pick(&ids_words);
            w[W_ADDR] = rng.pick(&addr_words);
            w[W_ADDR + 1] = rng.pick(&addr_words);
            if round % 8 != 0 {
                w[W_V4_CSUM] = v4_csum_word(w[W_ADDR], w[W_ADDR + 1], w[W_PORTS]);
            }
            for (i, v) in w.iter().enumerate().skip(1) {
                t.entries[e as usize].w[i].store(*v, Ordering::Relaxed);
            }
            t.entries[e as usize].w[W_CTL].store(c, Ordering::Relaxed);
            assert_eq!(ctl_status(c), ST_LIVE);
            let fast = t.v4_flow(e, c, tick, 4);
            let slow = t
                .entry_flow(e, c, tick, 4, &AnyFlow)
                .ok()
                .filter(|(d, _)| !d.client.is_ipv6());
            match (&fast, &slow) {
                (Some(f), Some((d, s))) => {
                    assert_eq!((&f.data, f.state), (d, *s), "round {round}: {w:x?}");
                    assert_eq!(f.original, d.original_key(), "round {round}");
                    assert_eq!(f.reply, d.reply_key(), "round {round}");
                    passed += 1;
                }
                (None, None) => {}
                _ => panic!(
                    "round {round}: shortcut {} entry_flow {}: {w:x?} ctl {c:x}",
                    fast.is_some(),
                    slow.is_some()
                ),
            }
            taken += usize::from(slow.is_some());
        }
        // Both outcomes were exercised, and often.
        assert!(passed > 100 && taken < 30_000, "{passed} of {taken} passed");
    }
}
