//! Locality-based least connections (IPVS `ip_vs_lblc.c`), for caches: flows to the same
//! destination IP go to the same backend while it is not overloaded.
//!
//! - The locality table maps destination IP → backend. On a hit, the backend is kept if its
//!   weight is > 0 and it is not *overloaded* in IPVS's sense: `active > weight` **and** some
//!   backend exists with `active * 2 < weight` (somewhere at under half load to move to).
//! - Otherwise (miss, drained, overloaded) wlc picks over all backends and the entry is
//!   (re)written.
//! - Entries unused for [`SchedParams::lblc_expiration`] (24 h) are forgotten. IPVS sweeps
//!   them from a timer (and more eagerly when the table is over-full); we check on lookup, and
//!   a full bucket replaces its least recently used entry (see `locality.rs`).
//! - The table is fixed-size and lock-free; `pick` never allocates. It costs a table lookup
//!   plus, on a miss or overload, wlc's O(n) scan.

use std::time::Instant;

use crate::locality::{ENTRIES_MAX, Entry, LocalityTable};
use crate::wlc::weighted_least;
use crate::{Backend, BuildError, ConnCounts, Dest, FlowTuple, SchedParams, dests};

/// Locality-based least-connection scheduler.
#[derive(Debug)]
pub struct Lblc {
    dests: Box<[Dest]>,
    table: LocalityTable,
    expire_ms: u64,
}

impl Lblc {
    /// Builds over `backends`, allocating the locality table.
    pub fn build(backends: &[Backend], params: &SchedParams) -> Result<Lblc, BuildError> {
        Ok(Lblc {
            dests: dests(backends),
            table: locality_table(params.locality_entries)?,
            expire_ms: params.lblc_expiration.as_millis() as u64,
        })
    }

    /// The destination's backend, or a fresh wlc choice.
    #[inline]
    pub fn pick<C: ConnCounts + ?Sized>(
        &self,
        flow: &FlowTuple,
        counts: &C,
        now: Instant,
    ) -> Option<usize> {
        let now_ms = self.table.now_ms(now);
        if let Some(t) = now_ms
            && let Some(e) = self.table.get(flow.dst, t, self.expire_ms)
        {
            let d = e.members[0] as usize;
            if self.dests.get(d).is_some_and(|x| x.weight > 0)
                && !is_overloaded(&self.dests, d, counts)
            {
                return Some(d);
            }
        }
        let d = weighted_least(&self.dests, counts, |c, id| c.overhead(id))?;
        if let Some(t) = now_ms {
            self.table.put(flow.dst, &Entry::one(d as u32, t), t);
        }
        Some(d)
    }
}

pub(crate) fn locality_table(entries: u32) -> Result<LocalityTable, BuildError> {
    if entries == 0 || entries > ENTRIES_MAX {
        return Err(BuildError::LocalityEntries(entries));
    }
    Ok(LocalityTable::new(entries))
}

/// IPVS's lblc/lblcr `is_overloaded`: more active connections than its weight, while some
/// backend is below half of its own weight.
#[inline]
pub(crate) fn is_overloaded<C: ConnCounts + ?Sized>(dests: &[Dest], d: usize, counts: &C) -> bool {
    let dest = dests[d];
    u64::from(counts.active(dest.id)) > u64::from(dest.weight)
        && dests
            .iter()
            .any(|x| u64::from(counts.active(x.id)) * 2 < u64::from(x.weight))
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
    fn same_destination_sticks_while_not_overloaded() {
        let s = Lblc::build(&backends(&[10, 10, 10]), &SchedParams::default()).unwrap();
        let t0 = Instant::now();
        let c = Counts::new(&[(5, 0), (1, 0), (3, 0)]);
        assert_eq!(s.pick(&dst(1), &c, t0), Some(1));
        // wlc would now choose 0, but the destination stays on 1 (busier, not overloaded).
        let c = Counts::new(&[(0, 0), (9, 0), (3, 0)]);
        assert_eq!(s.pick(&dst(1), &c, t0 + Duration::from_secs(1)), Some(1));
        // A new destination is scheduled by wlc.
        assert_eq!(s.pick(&dst(2), &c, t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(s.pick(&dst(2), &c, t0 + Duration::from_secs(2)), Some(0));
    }

    #[test]
    fn overload_reassigns_only_when_a_half_loaded_backend_exists() {
        let s = Lblc::build(&backends(&[4, 4]), &SchedParams::default()).unwrap();
        let t0 = Instant::now();
        assert_eq!(
            s.pick(&dst(1), &Counts::new(&[(0, 0), (1, 0)]), t0),
            Some(0)
        );
        // 0 is over its weight (5 > 4) but 1 is not under half (2*2 < 4 is false): stay.
        let c = Counts::new(&[(5, 0), (2, 0)]);
        assert_eq!(s.pick(&dst(1), &c, t0), Some(0));
        // Now 1 is under half load (1*2 < 4): reassign, and the entry follows.
        let c = Counts::new(&[(5, 0), (1, 0)]);
        assert_eq!(s.pick(&dst(1), &c, t0), Some(1));
        let c = Counts::new(&[(0, 0), (3, 0)]);
        assert_eq!(s.pick(&dst(1), &c, t0), Some(1), "new owner sticks");
    }

    #[test]
    fn idle_entries_expire_after_24h_and_use_refreshes() {
        let s = Lblc::build(&backends(&[1, 1]), &SchedParams::default()).unwrap();
        let t0 = Instant::now();
        let c1 = Counts::new(&[(1, 0), (0, 0)]);
        assert_eq!(s.pick(&dst(1), &c1, t0), Some(1));
        let c0 = Counts::new(&[(0, 0), (1, 0)]);
        let h = Duration::from_secs(3600);
        // Used at 23 h: still there, and the use resets the clock.
        assert_eq!(s.pick(&dst(1), &c0, t0 + 23 * h), Some(1));
        assert_eq!(s.pick(&dst(1), &c0, t0 + 46 * h), Some(1));
        // Idle for more than 24 h: forgotten, wlc decides again.
        assert_eq!(s.pick(&dst(1), &c0, t0 + 71 * h), Some(0));
    }

    #[test]
    fn drained_owner_is_replaced() {
        let t0 = Instant::now();
        let c = Counts::new(&[(0, 0), (1, 0)]);
        let s = Lblc::build(&backends(&[1, 1]), &SchedParams::default()).unwrap();
        assert_eq!(s.pick(&dst(1), &c, t0), Some(0));
        // Same table with backend 0 drained is a rebuild in xvs; simulate via a drained build
        // sharing nothing: a drained backend is never the answer.
        let s = Lblc::build(&backends(&[0, 1]), &SchedParams::default()).unwrap();
        assert_eq!(s.pick(&dst(1), &c, t0), Some(1));
    }

    #[test]
    fn locality_entries_are_validated() {
        let p = SchedParams {
            locality_entries: 0,
            ..SchedParams::default()
        };
        assert_eq!(
            Lblc::build(&backends(&[1]), &p).unwrap_err(),
            BuildError::LocalityEntries(0)
        );
    }
}
