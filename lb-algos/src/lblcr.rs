//! Locality-based least connections with replication (IPVS `ip_vs_lblcr.c`): each destination
//! IP maps to a *set* of backends, grown when the set is overloaded and pruned when it has not
//! changed for a while.
//!
//! Per pick, as IPVS:
//! 1. Look up the destination's set. Take its weighted-least-loaded member (`overhead/weight`,
//!    newest member first on ties, weight 0 skipped).
//! 2. If the set has more than one member and was not modified for
//!    [`SchedParams::lblcr_expiration`] (24 h), drop its weighted-*most*-loaded member.
//! 3. If the member from (1) exists and is not overloaded (`active > weight` while some backend
//!    is under half load, as lblc), use it.
//! 4. Otherwise wlc picks over all backends and the choice joins the set.
//!
//! Sets hold at most 8 members (IPVS's lists are unbounded); adding to a full set first drops
//! its most-loaded member. Entries unused for the expiration are forgotten lazily on lookup.
//! The table is lblc's fixed-size lock-free one; `pick` never allocates.

use std::time::Instant;

use crate::lblc::{is_overloaded, locality_table};
use crate::locality::{Entry, LocalityTable, SET_MAX};
use crate::wlc::weighted_least;
use crate::{Backend, BuildError, ConnCounts, Dest, FlowTuple, SchedParams, dests, heavier};

/// Locality-based least-connection-with-replication scheduler.
#[derive(Debug)]
pub struct Lblcr {
    dests: Box<[Dest]>,
    table: LocalityTable,
    expire_ms: u64,
}

impl Lblcr {
    /// Builds over `backends`, allocating the locality table.
    pub fn build(backends: &[Backend], params: &SchedParams) -> Result<Lblcr, BuildError> {
        Ok(Lblcr {
            dests: dests(backends),
            table: locality_table(params.locality_entries)?,
            expire_ms: params.lblcr_expiration.as_millis() as u64,
        })
    }

    /// A member of the destination's server set, or a fresh wlc choice that joins it.
    #[inline]
    pub fn pick<C: ConnCounts + ?Sized>(
        &self,
        flow: &FlowTuple,
        counts: &C,
        now: Instant,
    ) -> Option<usize> {
        let Some(t) = self.table.now_ms(now) else {
            return weighted_least(&self.dests, counts, |c, id| c.overhead(id));
        };
        let Some(mut e) = self.table.get(flow.dst, t, self.expire_ms) else {
            let d = weighted_least(&self.dests, counts, |c, id| c.overhead(id))?;
            self.table.put(flow.dst, &Entry::one(d as u32, t), t);
            return Some(d);
        };
        let min = self.set_min(&e, counts);
        let mut changed = false;
        if e.len > 1
            && t > e.lastmod_ms.saturating_add(self.expire_ms)
            && let Some(m) = self.set_max(&e, counts)
        {
            e.remove(m);
            e.lastmod_ms = t;
            changed = true;
        }
        let chosen = match min {
            Some(d) if !is_overloaded(&self.dests, d as usize, counts) => Some(d as usize),
            _ => {
                let d = weighted_least(&self.dests, counts, |c, id| c.overhead(id));
                if let Some(d) = d.map(|d| d as u32)
                    && !e.contains(d)
                {
                    if e.len == SET_MAX {
                        let evict = self.set_max(&e, counts).unwrap_or(e.members[0]);
                        e.remove(evict);
                    }
                    e.push(d);
                    e.lastmod_ms = t;
                    changed = true;
                }
                d
            }
        };
        if changed {
            self.table.put(flow.dst, &e, t);
        }
        chosen
    }

    /// IPVS `ip_vs_dest_set_min`: newest member first, weight > 0, least overhead/weight.
    fn set_min<C: ConnCounts + ?Sized>(&self, e: &Entry, counts: &C) -> Option<u32> {
        let mut least: Option<(u32, u64, u32)> = None;
        for &m in e.set().iter().rev() {
            let d = self.dests.get(m as usize)?;
            if d.weight == 0 {
                continue;
            }
            let doh = counts.overhead(d.id);
            if least.is_none_or(|(_, loh, lw)| heavier(loh, lw, doh, d.weight)) {
                least = Some((m, doh, d.weight));
            }
        }
        least.map(|(m, _, _)| m)
    }

    /// IPVS `ip_vs_dest_set_max`: newest member first, weight > 0, most overhead/weight.
    fn set_max<C: ConnCounts + ?Sized>(&self, e: &Entry, counts: &C) -> Option<u32> {
        let mut most: Option<(u32, u64, u32)> = None;
        for &m in e.set().iter().rev() {
            let d = self.dests.get(m as usize)?;
            if d.weight == 0 {
                continue;
            }
            let doh = counts.overhead(d.id);
            if most.is_none_or(|(_, moh, mw)| heavier(doh, d.weight, moh, mw)) {
                most = Some((m, doh, d.weight));
            }
        }
        most.map(|(m, _, _)| m)
    }

    #[cfg(test)]
    fn set_of(&self, flow: &FlowTuple, now: Instant) -> Vec<u32> {
        let t = self.table.now_ms(now).unwrap();
        self.table
            .get(flow.dst, t, self.expire_ms)
            .map_or(Vec::new(), |e| e.set().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use super::*;
    use crate::testutil::{Counts, backends, flow_to};

    fn dst(i: u32) -> FlowTuple {
        flow_to(IpAddr::V4(Ipv4Addr::from(0xC612_6400 + i)))
    }

    #[test]
    fn set_grows_on_overload_then_serves_its_least_loaded_member() {
        let s = Lblcr::build(&backends(&[4, 4, 4]), &SchedParams::default()).unwrap();
        let t0 = Instant::now();
        let f = dst(1);
        assert_eq!(
            s.pick(&f, &Counts::new(&[(0, 0), (1, 0), (1, 0)]), t0),
            Some(0)
        );
        // Busier than others but not overloaded: sticks.
        assert_eq!(
            s.pick(&f, &Counts::new(&[(4, 0), (1, 0), (2, 0)]), t0),
            Some(0)
        );
        assert_eq!(s.set_of(&f, t0), [0]);
        // Overloaded (5 > 4) and backend 1 is under half load: wlc adds 1 to the set.
        assert_eq!(
            s.pick(&f, &Counts::new(&[(5, 0), (1, 0), (2, 0)]), t0),
            Some(1)
        );
        assert_eq!(s.set_of(&f, t0), [0, 1]);
        // The set's least-loaded member serves, even when wlc over all would say 2.
        let c = Counts::new(&[(3, 0), (2, 0), (0, 0)]);
        assert_eq!(s.pick(&f, &c, t0), Some(1));
        let c = Counts::new(&[(1, 0), (2, 0), (0, 0)]);
        assert_eq!(s.pick(&f, &c, t0), Some(0));
    }

    #[test]
    fn unmodified_sets_are_pruned_of_their_most_loaded_member() {
        let s = Lblcr::build(&backends(&[4, 4]), &SchedParams::default()).unwrap();
        let t0 = Instant::now();
        let f = dst(1);
        s.pick(&f, &Counts::new(&[(0, 0), (1, 0)]), t0);
        s.pick(&f, &Counts::new(&[(5, 0), (1, 0)]), t0);
        assert_eq!(s.set_of(&f, t0), [0, 1]);
        let h = Duration::from_secs(3600);
        let c = Counts::new(&[(3, 0), (1, 0)]);
        // Used often but not modified: after 24 h the most loaded (0) is dropped.
        assert_eq!(s.pick(&f, &c, t0 + 12 * h), Some(1));
        assert_eq!(s.set_of(&f, t0 + 12 * h), [0, 1]);
        assert_eq!(
            s.pick(&f, &c, t0 + 24 * h + Duration::from_secs(1)),
            Some(1)
        );
        assert_eq!(s.set_of(&f, t0 + 24 * h + Duration::from_secs(1)), [1]);
    }

    #[test]
    fn idle_entries_expire() {
        let s = Lblcr::build(&backends(&[1, 1]), &SchedParams::default()).unwrap();
        let t0 = Instant::now();
        let f = dst(1);
        assert_eq!(s.pick(&f, &Counts::new(&[(1, 0), (0, 0)]), t0), Some(1));
        let later = t0 + Duration::from_secs(24 * 3600 + 1);
        assert!(s.set_of(&f, later).is_empty());
        assert_eq!(s.pick(&f, &Counts::new(&[(0, 0), (1, 0)]), later), Some(0));
    }

    #[test]
    fn set_is_bounded_and_drops_its_most_loaded_when_full() {
        let n = SET_MAX + 2;
        let s = Lblcr::build(&backends(&vec![2; n]), &SchedParams::default()).unwrap();
        let t0 = Instant::now();
        let f = dst(1);
        // Each round: every member so far is overloaded (3 > 2) and the next backend is idle.
        for k in 0..n {
            let c: Vec<(u32, u32)> = (0..n)
                .map(|i| if i < k { (3 + i as u32, 0) } else { (0, 0) })
                .collect();
            assert_eq!(s.pick(&f, &Counts(c), t0), Some(k));
        }
        let set = s.set_of(&f, t0);
        assert_eq!(set.len(), SET_MAX);
        // Each add to the full set evicted the then most-loaded member; the newest stays.
        assert!(set.contains(&(n as u32 - 1)));
    }
}
