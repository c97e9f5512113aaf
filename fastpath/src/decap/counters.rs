//! The decap programs' per-CPU counters, summed over CPUs.
//!
//! The C programs index a `BPF_MAP_TYPE_PERCPU_ARRAY` by `enum counter`; [`Counter`] mirrors
//! it (a unit test checks the C source) and [`DecapCounters`] names every slot.

use aya::maps::{MapData, PerCpuArray};

use super::DecapError;

/// One slot of the `counters` map. Keep in step with `enum counter` in `bpf/decap.c`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Counter {
    PassNotIp = 0,
    PassMalformed = 1,
    PassPlain = 2,
    PassOuterFragment = 3,
    PassNotVip = 4,
    PassInnerMalformed = 5,
    DecapIpip = 6,
    DecapGue = 7,
    InTranslated = 8,
    Error = 9,
    OutTranslated = 10,
    OutError = 11,
}

impl Counter {
    pub(super) const ALL: [Counter; 12] = [
        Counter::PassNotIp,
        Counter::PassMalformed,
        Counter::PassPlain,
        Counter::PassOuterFragment,
        Counter::PassNotVip,
        Counter::PassInnerMalformed,
        Counter::DecapIpip,
        Counter::DecapGue,
        Counter::InTranslated,
        Counter::Error,
        Counter::OutTranslated,
        Counter::OutError,
    ];
}

/// Packets seen by the decap programs since they were loaded (by the last `xvs decap`),
/// summed over CPUs and interfaces.
///
/// Every packet the XDP program sees lands in exactly one of the `pass_*`, `decap_*` and
/// `error` fields; `in_translated` counts those among the passed-plain (L2 DSR) and
/// decapsulated packets whose destination port was rewritten. The egress program counts
/// only what it rewrote (`out_translated`) or failed to (`out_error`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecapCounters {
    /// Not IPv4/IPv6 (ARP, LLDP...): passed.
    pub pass_not_ip: u64,
    /// Short or malformed outer headers: passed (the kernel drops them).
    pub pass_malformed: u64,
    /// Not encapsulated (no IPIP/GUE): passed, its destination port rewritten when a
    /// translation maps it (counted in `in_translated` too).
    pub pass_plain: u64,
    /// An outer fragment of an IPIP/GUE packet: passed for the kernel to reassemble.
    pub pass_outer_fragment: u64,
    /// Encapsulated, but the inner destination is no configured VIP: passed untouched.
    pub pass_not_vip: u64,
    /// Encapsulated, but the inner header is short or not the IP version the outer header
    /// promises: passed untouched (the kernel drops it).
    pub pass_inner_malformed: u64,
    /// Decapsulated IPIP (IPv4 or IPv6 inside IPv4 or IPv6).
    pub decap_ipip: u64,
    /// Decapsulated GUE (variant 1: the inner IP packet right after the UDP header).
    pub decap_gue: u64,
    /// Destination port rewritten on the way in (decapsulated or plain packets).
    pub in_translated: u64,
    /// The kernel refused to move a packet's head: dropped.
    pub error: u64,
    /// Source port rewritten back on the way out.
    pub out_translated: u64,
    /// The egress rewrite failed (a helper refused): sent unchanged.
    pub out_error: u64,
}

impl DecapCounters {
    /// Packets decapsulated, IPIP and GUE.
    pub fn decapsulated(&self) -> u64 {
        self.decap_ipip + self.decap_gue
    }

    /// Every counter by name, in the C enum's order (what `xvs decap --status` prints).
    pub fn named(&self) -> [(&'static str, u64); 12] {
        [
            ("pass_not_ip", self.pass_not_ip),
            ("pass_malformed", self.pass_malformed),
            ("pass_plain", self.pass_plain),
            ("pass_outer_fragment", self.pass_outer_fragment),
            ("pass_not_vip", self.pass_not_vip),
            ("pass_inner_malformed", self.pass_inner_malformed),
            ("decap_ipip", self.decap_ipip),
            ("decap_gue", self.decap_gue),
            ("in_translated", self.in_translated),
            ("error", self.error),
            ("out_translated", self.out_translated),
            ("out_error", self.out_error),
        ]
    }

    fn add(&mut self, counter: Counter, n: u64) {
        let slot = match counter {
            Counter::PassNotIp => &mut self.pass_not_ip,
            Counter::PassMalformed => &mut self.pass_malformed,
            Counter::PassPlain => &mut self.pass_plain,
            Counter::PassOuterFragment => &mut self.pass_outer_fragment,
            Counter::PassNotVip => &mut self.pass_not_vip,
            Counter::PassInnerMalformed => &mut self.pass_inner_malformed,
            Counter::DecapIpip => &mut self.decap_ipip,
            Counter::DecapGue => &mut self.decap_gue,
            Counter::InTranslated => &mut self.in_translated,
            Counter::Error => &mut self.error,
            Counter::OutTranslated => &mut self.out_translated,
            Counter::OutError => &mut self.out_error,
        };
        *slot += n;
    }
}

/// Reads `map` (the programs' `counters`), summed over CPUs.
pub(super) fn read(map: &PerCpuArray<MapData, u64>) -> Result<DecapCounters, DecapError> {
    let mut sum = DecapCounters::default();
    for counter in Counter::ALL {
        let n =
            crate::steer::per_cpu_sum(map, counter as u32).map_err(|source| DecapError::Map {
                map: "counters",
                source,
            })?;
        sum.add(counter, n);
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `C_PASS_NOT_IP = 0,` style lines in the C enum must agree with [`Counter`], and the
    /// names printed with the C names.
    #[test]
    fn indices_match_the_c_enum() {
        let c = include_str!("../../bpf/decap.c");
        let names = DecapCounters::default().named();
        for ((name, _), counter) in names.iter().zip(Counter::ALL) {
            let decl = format!("C_{} = {},", name.to_uppercase(), counter as u32);
            assert!(c.contains(&decl), "decap.c lacks `{decl}`");
        }
        assert!(c.contains(&format!("C_MAX = {},", Counter::ALL.len())));
    }
}
