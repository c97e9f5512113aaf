//! Maglev consistent hashing (NSDI'16 §3.4; IPVS `ip_vs_mh.c`).
//!
//! - **Table.** `M` slots (prime, default 65537). Every backend in the table gets a permutation
//!   of the slots from `offset = h1(addr) mod M` and `skip = h2(addr) mod (M-1) + 1`; rounds
//!   walk the backends, each claiming its next free preferred slot, until the table is full.
//! - **Deterministic everywhere.** `h1`/`h2` and the flow hash are fixed (MurmurHash3
//!   finaliser with constant seeds, see `hash.rs`), and backends are populated in the order of
//!   their `SocketAddr`, so every node and every restart builds the same table for the same
//!   backend set whatever order it was listed in (IPVS seeds `hsiphash` randomly per service,
//!   so its tables differ between nodes; we must not, since a peer node may schedule the
//!   mid-flow packets of a connection it has never seen). `pick` still answers with the index
//!   into the caller's slice.
//! - **Weights.** As IPVS: weights are divided by their gcd and become *turns* (slots claimed
//!   per round); when the largest reduced weight needs more than `log2(M)/2` bits they are
//!   shifted right (at least one turn each) so a round stays small next to `M`. A backend's
//!   share of slots is then within `sum(turns) / M` of its weighted share.
//! - **Flow hash.** The client address, plus the client port with `mh_port` (kube-proxy always
//!   sets it).
//! - **Weight 0 (drain).** Without `mh_fallback`, drained backends are left out of the table:
//!   their slots go to the others (new flows to them move; Maglev keeps other flows mostly
//!   put). With `mh_fallback` (what IPVS does for a backend whose weight drops to 0) they keep
//!   their slots with one turn, and a flow landing on one re-hashes deterministically
//!   (`fmix64(h + k·φ)`, k = 1, 2, ...) until it finds a usable slot, so a drain moves *no*
//!   other flow. Neither mode ever picks a weight-0 backend.
//! - **Cost.** Build is O(M log M) probes (~ms for M = 65537); pick is one hash and one load.

use crate::hash::{fmix64, ip_port, reduce, socket_addr};
use crate::{Backend, BuildError, FlowTuple, SchedParams, gcd};

/// IPVS's largest listed table size and the NSDI paper's example: prime, ≥ 100 × 655.
pub const TABLE_SIZE_DEFAULT: u32 = 65537;
/// Largest table accepted (64 MiB of `u32`).
pub const TABLE_SIZE_MAX: u32 = 1 << 24;

const SEED_OFFSET: u64 = 0x6d61_676c_6576_0001;
const SEED_SKIP: u64 = 0x6d61_676c_6576_0002;
const SEED_FLOW: u64 = 0x6d61_676c_6576_0003;
const PROBE_STEP: u64 = 0x9e37_79b9_7f4a_7c15;

const EMPTY: u32 = u32::MAX;

/// Maglev scheduler.
#[derive(Debug)]
pub struct Maglev {
    /// Slot → backend index. Empty when no backend may take flows.
    table: Box<[u32]>,
    /// Per backend index: weight > 0.
    usable: Box<[bool]>,
    port: bool,
    fallback: bool,
}

impl Maglev {
    /// Builds the lookup table.
    pub fn build(backends: &[Backend], params: &SchedParams) -> Result<Maglev, BuildError> {
        let m = params.mh_table_size;
        if m > TABLE_SIZE_MAX {
            return Err(BuildError::MhTableSizeTooLarge {
                size: m,
                max: TABLE_SIZE_MAX,
            });
        }
        if !is_prime(m) {
            return Err(BuildError::MhTableSizeNotPrime(m));
        }
        let fallback = params.flags.mh_fallback;
        let usable: Box<[bool]> = backends.iter().map(|b| b.weight > 0).collect();
        let mut maglev = Maglev {
            table: Box::new([]),
            usable,
            port: params.flags.mh_port,
            fallback,
        };
        if !maglev.usable.iter().any(|&u| u) {
            return Ok(maglev);
        }

        let mut members: Vec<u32> = (0..backends.len() as u32)
            .filter(|&i| fallback || backends[i as usize].weight > 0)
            .collect();
        // Canonical order: addresses are unique (checked by `Scheduler::build`'s validation;
        // ties broken by index only matter to direct callers that skip it).
        members.sort_by_key(|&i| (backends[i as usize].addr, i));

        let weights: Vec<u64> = members
            .iter()
            .map(|&i| u64::from(backends[i as usize].weight))
            .collect();
        let turns = turns(&weights, m)?;

        let m64 = u64::from(m);
        let mut perm: Vec<(u64, u64)> = members
            .iter()
            .map(|&i| {
                let addr = backends[i as usize].addr;
                let offset = socket_addr(SEED_OFFSET, addr) % m64;
                let skip = if m > 1 {
                    socket_addr(SEED_SKIP, addr) % (m64 - 1) + 1
                } else {
                    1
                };
                (offset, skip)
            })
            .collect();
        let mut table = vec![EMPTY; m as usize];
        let mut filled = 0u64;
        'rounds: loop {
            for (k, &idx) in members.iter().enumerate() {
                for _ in 0..turns[k] {
                    let (pos, skip) = &mut perm[k];
                    while table[*pos as usize] != EMPTY {
                        *pos += *skip;
                        if *pos >= m64 {
                            *pos -= m64;
                        }
                    }
                    table[*pos as usize] = idx;
                    filled += 1;
                    if filled == m64 {
                        break 'rounds;
                    }
                }
            }
        }
        maglev.table = table.into_boxed_slice();
        Ok(maglev)
    }

    /// The backend owning the flow's slot (probing on past drained backends with fallback).
    #[inline]
    pub fn pick(&self, flow: &FlowTuple) -> Option<usize> {
        if self.table.is_empty() {
            return None;
        }
        let port = if self.port { Some(flow.src_port) } else { None };
        let h = ip_port(SEED_FLOW, flow.src, port);
        let d = self.table[reduce(h, self.table.len() as u32)] as usize;
        if !self.fallback || self.usable[d] {
            return Some(d);
        }
        self.probe(h)
    }

    /// Deterministic re-hashing past drained backends; bounded by the table size like IPVS's
    /// `ip_vs_mh_get_fallback`.
    #[cold]
    fn probe(&self, h: u64) -> Option<usize> {
        let m = self.table.len() as u32;
        (1..=u64::from(m))
            .map(|k| self.table[reduce(fmix64(h.wrapping_add(k.wrapping_mul(PROBE_STEP))), m)])
            .map(|d| d as usize)
            .find(|&d| self.usable[d])
    }

    /// The lookup table: slot → backend index (for tests, benchmarks and `/v1/services`).
    pub fn table(&self) -> &[u32] {
        &self.table
    }
}

/// Each member's turns per round of the fill: its weight divided by the weights' gcd, shifted
/// right so that the largest takes at most about the square root of the table; at least 1.
/// A round longer than the table is an error.
fn turns(weights: &[u64], m: u32) -> Result<Vec<u64>, BuildError> {
    let g = weights.iter().fold(0, |g, &w| gcd(g, w));
    let max_reduced = weights.iter().max().copied().unwrap_or(0) / g;
    let shift = (64 - max_reduced.leading_zeros()).saturating_sub(m.ilog2() / 2);
    let turns: Vec<u64> = weights.iter().map(|&w| ((w / g) >> shift).max(1)).collect();
    let round: u64 = turns.iter().sum();
    if round > u64::from(m) {
        return Err(BuildError::MhTooManyBackends {
            turns: round,
            table_size: m,
        });
    }
    Ok(turns)
}

/// Trial division; `m ≤ 2^24` so at most ~2,000 odd divisors.
fn is_prime(m: u32) -> bool {
    if m < 2 {
        return false;
    }
    if m.is_multiple_of(2) {
        return m == 2;
    }
    let mut d = 3u32;
    while d * d <= m {
        if m.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

#[cfg(test)]
mod tests;
