//! The steering program's per-CPU counters, summed over CPUs.
//!
//! The C program indexes a `BPF_MAP_TYPE_PERCPU_ARRAY` by `enum counter`; [`Counter`] mirrors
//! it (a unit test checks the C source) and [`SteerCounters`] names every slot, so no caller
//! depends on an index.

use aya::maps::{MapData, MapError, PerCpuArray};

use super::SteerError;

/// One slot of the `counters` map. Keep in step with `enum counter` in `bpf/steer.c`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Counter {
    PassNotIp = 0,
    PassMalformed = 1,
    PassNotOurs = 2,
    PassIcmp = 3,
    MatchFrontend = 4,
    MatchSnat = 5,
    MatchBackend = 6,
    MatchFragment = 7,
    MatchIcmpError = 8,
    MatchIpv6Ext = 9,
    Redirected = 10,
    NoSocket = 11,
    Held = 12,
    MatchClusterIp = 13,
    MatchServiceCidr = 14,
}

impl Counter {
    pub(super) const ALL: [Counter; 15] = [
        Counter::PassNotIp,
        Counter::PassMalformed,
        Counter::PassNotOurs,
        Counter::PassIcmp,
        Counter::MatchFrontend,
        Counter::MatchSnat,
        Counter::MatchBackend,
        Counter::MatchFragment,
        Counter::MatchIcmpError,
        Counter::MatchIpv6Ext,
        Counter::Redirected,
        Counter::NoSocket,
        Counter::Held,
        Counter::MatchClusterIp,
        Counter::MatchServiceCidr,
    ];
}

/// Frames seen by the steering program since it was loaded, summed over CPUs.
///
/// Every frame lands in exactly one `pass_*` or `match_*` field; every matched frame also
/// lands in exactly one of `redirected`, `no_socket` and `held`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteerCounters {
    /// Not IPv4/IPv6 (ARP, LLDP...): passed.
    pub pass_not_ip: u64,
    /// Short or malformed headers: passed (the kernel drops them).
    pub pass_malformed: u64,
    /// IP traffic xvs does not own: passed.
    pub pass_not_ours: u64,
    /// ICMP that is not an error about xvs traffic (echo, ND, RA...): passed.
    pub pass_icmp: u64,
    /// To a VIP:port/proto.
    pub match_frontend: u64,
    /// To a SNAT address, destination port within the SNAT range.
    pub match_snat: u64,
    /// From a backend ip:port/proto (nat-mode replies).
    pub match_backend: u64,
    /// A later fragment to a VIP or SNAT address.
    pub match_fragment: u64,
    /// An ICMP error about xvs traffic.
    pub match_icmp_error: u64,
    /// IPv6 with extension headers to a VIP or SNAT address.
    pub match_ipv6_ext: u64,
    /// Matched frames handed to the queue's AF_XDP socket.
    pub redirected: u64,
    /// Matched frames passed to the kernel because no socket is registered for the queue
    /// and no restart hold runs.
    pub no_socket: u64,
    /// Matched frames dropped because no socket is registered for the queue while a restart
    /// hold runs (see [`Steering::set_hold`](super::Steering::set_hold)): the only frames the
    /// program drops.
    pub held: u64,
    /// TCP/UDP/SCTP to a ClusterIP on a port no frontend serves (xvs rejects it).
    pub match_cluster_ip: u64,
    /// TCP/UDP/SCTP to an address inside a Service CIDR that is no frontend's (xvs drops it).
    pub match_service_cidr: u64,
}

impl SteerCounters {
    /// Frames that matched a map (whether or not a socket took them).
    pub fn matched(&self) -> u64 {
        self.match_frontend
            + self.match_snat
            + self.match_backend
            + self.match_fragment
            + self.match_icmp_error
            + self.match_ipv6_ext
            + self.match_cluster_ip
            + self.match_service_cidr
    }

    /// Frames that went to the kernel: unmatched, plus matched without a socket.
    pub fn passed(&self) -> u64 {
        self.pass_not_ip
            + self.pass_malformed
            + self.pass_not_ours
            + self.pass_icmp
            + self.no_socket
    }

    pub(super) fn add(&mut self, counter: Counter, n: u64) {
        let slot = match counter {
            Counter::PassNotIp => &mut self.pass_not_ip,
            Counter::PassMalformed => &mut self.pass_malformed,
            Counter::PassNotOurs => &mut self.pass_not_ours,
            Counter::PassIcmp => &mut self.pass_icmp,
            Counter::MatchFrontend => &mut self.match_frontend,
            Counter::MatchSnat => &mut self.match_snat,
            Counter::MatchBackend => &mut self.match_backend,
            Counter::MatchFragment => &mut self.match_fragment,
            Counter::MatchIcmpError => &mut self.match_icmp_error,
            Counter::MatchIpv6Ext => &mut self.match_ipv6_ext,
            Counter::Redirected => &mut self.redirected,
            Counter::NoSocket => &mut self.no_socket,
            Counter::Held => &mut self.held,
            Counter::MatchClusterIp => &mut self.match_cluster_ip,
            Counter::MatchServiceCidr => &mut self.match_service_cidr,
        };
        *slot += n;
    }
}

/// Reads `map` (the program's `counters`), summed over CPUs. A map of an older program
/// (pinned) with fewer slots reads 0 for the slots it lacks.
pub(super) fn read(map: &PerCpuArray<MapData, u64>) -> Result<SteerCounters, SteerError> {
    let mut sum = SteerCounters::default();
    for counter in Counter::ALL {
        let n = per_cpu_sum(map, counter as u32).map_err(|source| SteerError::Map {
            map: "counters",
            source,
        })?;
        sum.add(counter, n);
    }
    Ok(sum)
}

/// Slot `index` of a per-CPU counter array summed over CPUs; 0 for a slot past its end (a
/// map of an older program). Shared with `xvs decap`'s counters.
pub(crate) fn per_cpu_sum(map: &PerCpuArray<MapData, u64>, index: u32) -> Result<u64, MapError> {
    if index >= map.len() {
        return Ok(0);
    }
    Ok(map.get(&index, 0)?.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `C_PASS_NOT_IP = 0,` style lines in the C enum must agree with [`Counter`].
    #[test]
    fn indices_match_the_c_enum() {
        let c = include_str!("../../bpf/steer.c");
        let names = [
            "C_PASS_NOT_IP",
            "C_PASS_MALFORMED",
            "C_PASS_NOT_OURS",
            "C_PASS_ICMP",
            "C_MATCH_FRONTEND",
            "C_MATCH_SNAT",
            "C_MATCH_BACKEND",
            "C_MATCH_FRAGMENT",
            "C_MATCH_ICMP_ERROR",
            "C_MATCH_IPV6_EXT",
            "C_REDIRECTED",
            "C_NO_SOCKET",
            "C_HELD",
            "C_MATCH_CLUSTER_IP",
            "C_MATCH_SERVICE_CIDR",
        ];
        for (name, counter) in names.iter().zip(Counter::ALL) {
            let decl = format!("{name} = {},", counter as u32);
            assert!(c.contains(&decl), "steer.c lacks `{decl}`");
        }
        assert!(c.contains(&format!("C_MAX = {},", Counter::ALL.len())));
    }
}
