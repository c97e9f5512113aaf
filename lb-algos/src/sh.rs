//! Source hashing (IPVS `ip_vs_sh.c`): a static bucket table indexed by a hash of the client
//! address (and port with the `mh_port` flag, IPVS's `sh-port`).
//!
//! - **Buckets.** As IPVS's `ip_vs_sh_reassign`: walking the list in order, each backend fills
//!   `weight` consecutive buckets, and the walk wraps to the first backend until every bucket is
//!   filled. The hash is IPVS's `hash_32(ntohl(addr) + port, bits)` (IPv6 folded by XOR of its
//!   four words), so for the default 256 buckets the table and the bucket of every client are
//!   IPVS's own.
//! - **Deviation: table size.** IPVS's table is fixed at 2^8 buckets (a compile option), so
//!   with more than 256 weight units the later backends get no bucket at all. We grow the table
//!   to the smallest power of two ≥ the sum of weights (at most 2^[`TAB_BITS_MAX`]; beyond that
//!   the weights are first divided by their gcd), so every backend gets its weighted share.
//! - **Weight 0.** Without `mh_fallback` drained backends are left out of the table (IPVS keeps
//!   them one bucket and returns no backend for clients hashing there). With `mh_fallback`
//!   (IPVS's `sh-fallback`) they keep that one bucket, and a client landing on it probes on as
//!   IPVS does — buckets `2·h, 2·h+1, ...` — to the next usable backend, so draining one backend
//!   moves no other client.

use std::net::IpAddr;

use crate::{Backend, BuildError, FlowTuple, SchedParams, gcd};

/// Largest bucket table: 2^20 buckets (4 MiB).
pub const TAB_BITS_MAX: u8 = 20;

/// A filled bucket table (shared with dh).
#[derive(Debug)]
pub(crate) struct Buckets {
    /// Backend index per bucket; empty when no backend is in the table.
    pub(crate) table: Box<[u32]>,
    pub(crate) bits: u8,
}

impl Buckets {
    /// IPVS's fill over `members` (indices into `backends`, list order).
    pub(crate) fn fill(
        backends: &[Backend],
        members: &[u32],
        min_bits: u8,
    ) -> Result<Buckets, BuildError> {
        if min_bits == 0 || min_bits > TAB_BITS_MAX {
            return Err(BuildError::HashTabBits(min_bits));
        }
        if members.is_empty() {
            return Ok(Buckets {
                table: Box::new([]),
                bits: min_bits,
            });
        }
        // A weight-0 member (fallback mode) takes one bucket, as in IPVS.
        let mut turns: Vec<u64> = members
            .iter()
            .map(|&i| u64::from(backends[i as usize].weight).max(1))
            .collect();
        let max_size = 1u64 << TAB_BITS_MAX;
        if turns.iter().sum::<u64>() > max_size {
            let g = turns.iter().fold(0, |g, &t| gcd(g, t));
            turns.iter_mut().for_each(|t| *t /= g);
        }
        let sum: u64 = turns.iter().sum();
        let mut bits = min_bits;
        while (1u64 << bits) < sum && bits < TAB_BITS_MAX {
            bits += 1;
        }
        let size = 1usize << bits;
        let mut table = Vec::with_capacity(size);
        let (mut m, mut count) = (0, 0);
        while table.len() < size {
            table.push(members[m]);
            count += 1;
            if count >= turns[m] {
                (m, count) = ((m + 1) % members.len(), 0);
            }
        }
        Ok(Buckets {
            table: table.into_boxed_slice(),
            bits,
        })
    }
}

/// IPVS's address fold: the IPv4 address, or the XOR of an IPv6 address's four words.
#[inline]
pub(crate) fn fold(ip: IpAddr) -> u32 {
    match ip {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(a) => {
            let b = u128::from(a);
            (b as u32) ^ ((b >> 32) as u32) ^ ((b >> 64) as u32) ^ ((b >> 96) as u32)
        }
    }
}

/// The kernel's `hash_32(val, bits)`.
#[inline]
fn hash_32(val: u32, bits: u8) -> usize {
    (val.wrapping_mul(0x61C8_8647) >> (32 - u32::from(bits))) as usize
}

/// Source-hashing scheduler.
#[derive(Debug)]
pub struct Sh {
    buckets: Buckets,
    /// Per backend index: may take new flows (weight > 0).
    usable: Box<[bool]>,
    port: bool,
    fallback: bool,
}

impl Sh {
    /// Builds the bucket table.
    pub fn build(backends: &[Backend], params: &SchedParams) -> Result<Sh, BuildError> {
        let fallback = params.flags.mh_fallback;
        let usable: Box<[bool]> = backends.iter().map(|b| b.weight > 0).collect();
        let members: Vec<u32> = if usable.iter().any(|&u| u) {
            (0..backends.len() as u32)
                .filter(|&i| fallback || usable[i as usize])
                .collect()
        } else {
            Vec::new()
        };
        Ok(Sh {
            buckets: Buckets::fill(backends, &members, params.hash_tab_bits)?,
            usable,
            port: params.flags.mh_port,
            fallback,
        })
    }

    /// The backend owning the client's bucket.
    #[inline]
    pub fn pick(&self, flow: &FlowTuple) -> Option<usize> {
        let table = &self.buckets.table;
        if table.is_empty() {
            return None;
        }
        let port = if self.port { flow.src_port } else { 0 };
        let ihash = hash_32(
            fold(flow.src).wrapping_add(u32::from(port)),
            self.buckets.bits,
        );
        let d = table[ihash] as usize;
        if !self.fallback || self.usable[d] {
            return Some(d);
        }
        self.probe(ihash)
    }

    /// IPVS's `ip_vs_sh_get_fallback`: probe `(offset + ihash) + ihash` for every offset.
    #[cold]
    fn probe(&self, ihash: usize) -> Option<usize> {
        let table = &self.buckets.table;
        let mask = table.len() - 1;
        (0..table.len())
            .map(|offset| table[(offset + 2 * ihash) & mask] as usize)
            .find(|&d| self.usable[d])
    }

    #[cfg(test)]
    pub(crate) fn table(&self) -> &[u32] {
        &self.buckets.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SchedFlags;
    use crate::testutil::{backends, flow};

    fn params(port: bool, fallback: bool) -> SchedParams {
        SchedParams {
            flags: SchedFlags {
                mh_port: port,
                mh_fallback: fallback,
            },
            ..SchedParams::default()
        }
    }

    fn bucket_counts(s: &Sh, n: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        s.table().iter().for_each(|&d| c[d as usize] += 1);
        c
    }

    #[test]
    fn table_is_ipvs_fill_and_weights_set_bucket_counts() {
        let s = Sh::build(&backends(&[4, 3, 1]), &params(false, false)).unwrap();
        assert_eq!(s.table().len(), 256);
        assert_eq!(&s.table()[..10], [0, 0, 0, 0, 1, 1, 1, 2, 0, 0]);
        assert_eq!(bucket_counts(&s, 3), [128, 96, 32]);
    }

    #[test]
    fn same_source_same_backend_and_port_only_with_flag() {
        let s = Sh::build(&backends(&[1; 7]), &params(false, false)).unwrap();
        let mut seen = [false; 7];
        for i in 0..2000 {
            let a = s.pick(&flow(i, 1000)).unwrap();
            assert_eq!(Some(a), s.pick(&flow(i, 2000)), "port must not matter");
            seen[a] = true;
        }
        assert!(seen.iter().all(|&s| s), "all backends receive clients");

        let s = Sh::build(&backends(&[1; 7]), &params(true, false)).unwrap();
        let differs = (0..200u32)
            .filter(|&i| s.pick(&flow(i, 1000)) != s.pick(&flow(i, 1001)))
            .count();
        assert!(
            differs > 100,
            "sh-port spreads one client's ports ({differs}/200)"
        );
        assert_eq!(s.pick(&flow(5, 1000)), s.pick(&flow(5, 1000)));
    }

    #[test]
    fn matches_ipvs_hash_for_a_known_client() {
        // hash_32(0xC6130005, 8) computed by hand: (0xC6130005 * 0x61C88647) >> 24.
        let s = Sh::build(&backends(&[1; 256]), &params(false, false)).unwrap();
        let expect = (0xC613_0005u32.wrapping_mul(0x61C8_8647) >> 24) as usize;
        assert_eq!(s.pick(&flow(5, 0)), Some(expect));
    }

    #[test]
    fn drained_backend_is_excluded_without_fallback() {
        let s = Sh::build(&backends(&[2, 0, 2]), &params(false, false)).unwrap();
        assert_eq!(bucket_counts(&s, 3), [128, 0, 128]);
        assert!((0..1000).all(|i| s.pick(&flow(i, 0)) != Some(1)));
    }

    #[test]
    fn fallback_keeps_drained_bucket_and_moves_only_its_clients() {
        let live = Sh::build(&backends(&[1, 1, 1]), &params(false, true)).unwrap();
        let drained = Sh::build(&backends(&[1, 0, 1]), &params(false, true)).unwrap();
        assert_eq!(
            live.table(),
            drained.table(),
            "bucket layout unchanged by a drain"
        );
        for i in 0..1000 {
            let before = live.pick(&flow(i, 0)).unwrap();
            let after = drained.pick(&flow(i, 0)).unwrap();
            assert_ne!(after, 1);
            if before != 1 {
                assert_eq!(
                    before, after,
                    "client {i} moved although its backend is live"
                );
            }
        }
    }

    #[test]
    fn table_grows_for_many_backends() {
        let s = Sh::build(&backends(&vec![1; 1000]), &params(false, false)).unwrap();
        assert_eq!(s.table().len(), 1024);
        assert!(bucket_counts(&s, 1000).iter().all(|&c| c == 1 || c == 2));
        let err = Sh::build(
            &backends(&[1]),
            &SchedParams {
                hash_tab_bits: 21,
                ..SchedParams::default()
            },
        );
        assert_eq!(err.unwrap_err(), BuildError::HashTabBits(21));
    }

    #[test]
    fn ipv6_sources_fold_like_ipvs() {
        let a: IpAddr = "2001:2::1:2:3:4".parse().unwrap();
        assert_eq!(fold(a), 0x2001_0002 ^ 0x0001_0002 ^ 0x0003_0004);
    }
}
