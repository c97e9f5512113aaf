//! Destination hashing (IPVS `ip_vs_dh.c`): a static bucket table indexed by a hash of the
//! flow's destination address (the VIP here), IPVS's `(ntohl(addr) * 2654435761) & mask`.
//!
//! Deviations from IPVS, on purpose:
//! - **Weights.** IPVS's dh gives every destination one bucket in turn and ignores weights; we
//!   fill buckets exactly as sh does (`weight` consecutive buckets each), so weights hold.
//! - **Table size** grows past 256 buckets like sh's (see [`crate::sh`]).
//! - **Weight 0** backends are left out of the table (IPVS returns no backend for destinations
//!   hashing to a drained one; dh has no fallback flag).

use crate::sh::{Buckets, fold};
use crate::{Backend, BuildError, FlowTuple, SchedParams};

/// Destination-hashing scheduler.
#[derive(Debug)]
pub struct Dh {
    buckets: Buckets,
}

impl Dh {
    /// Builds the bucket table from the backends with weight > 0.
    pub fn build(backends: &[Backend], params: &SchedParams) -> Result<Dh, BuildError> {
        let members: Vec<u32> = (0..backends.len() as u32)
            .filter(|&i| backends[i as usize].weight > 0)
            .collect();
        Ok(Dh {
            buckets: Buckets::fill(backends, &members, params.hash_tab_bits)?,
        })
    }

    /// The backend owning the destination's bucket.
    #[inline]
    pub fn pick(&self, flow: &FlowTuple) -> Option<usize> {
        let table = &self.buckets.table;
        if table.is_empty() {
            return None;
        }
        let h = u64::from(fold(flow.dst)).wrapping_mul(2_654_435_761) as usize;
        Some(table[h & (table.len() - 1)] as usize)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;
    use crate::testutil::{backends, flow_to};

    fn dst(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0xC612_6400 + i))
    }

    #[test]
    fn same_destination_same_backend_whatever_the_source() {
        let s = Dh::build(&backends(&[1, 1, 1]), &SchedParams::default()).unwrap();
        for i in 0..100 {
            let mut f = flow_to(dst(i));
            let a = s.pick(&f);
            f.src = IpAddr::V4(Ipv4Addr::new(198, 19, 9, 9));
            f.src_port = 1;
            assert_eq!(a, s.pick(&f));
        }
    }

    #[test]
    fn weights_set_bucket_counts_and_drained_is_excluded() {
        let s = Dh::build(&backends(&[3, 0, 1]), &SchedParams::default()).unwrap();
        let mut c = [0; 3];
        s.buckets.table.iter().for_each(|&d| c[d as usize] += 1);
        assert_eq!(c, [192, 0, 64]);
        // The multiplicative hash is a bijection on the low 8 bits: 256 consecutive
        // destinations hit every bucket once.
        let mut hits = [0; 3];
        for i in 0..256 {
            hits[s.pick(&flow_to(dst(i))).unwrap()] += 1;
        }
        assert_eq!(hits, [192, 0, 64]);
    }
}
