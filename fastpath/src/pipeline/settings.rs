//! A pipeline's settings: per worker ([`PipelineConfig`], [`DEFAULT_MAC`]) and the shared
//! flow table's ([`flow_table_config`]), from a config.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use config::Config;

use super::{CookieKey, snat};

/// Per-worker settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    /// The port this worker receives on and transmits on (one-armed).
    pub port: u16,
    /// That port's MAC: the source MAC of every transmitted frame.
    pub mac: [u8; 6],
    /// fullnat source address for IPv4 flows.
    pub snat_v4: Option<Ipv4Addr>,
    /// fullnat source address for IPv6 flows.
    pub snat_v6: Option<Ipv6Addr>,
    /// This worker's SNAT ports, inclusive.
    pub snat_ports: (u16, u16),
    /// Fragment-table entries (rounded up to a power of two, at least [`frag::WAYS`]).
    ///
    /// [`frag::WAYS`]: super::frag::WAYS
    pub fragments_max: usize,
    /// How long after its first fragment a datagram's later fragments are accepted.
    pub fragment_timeout: Duration,
    /// The SYN cookie secret; every worker must have the same (and the next process too).
    pub synproxy_key: CookieKey,
}

/// The source MAC the pcap replayer and tests use when none is configured.
pub const DEFAULT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

impl PipelineConfig {
    /// Settings of worker `worker` of `workers` from a config: the first SNAT address of each
    /// family, an even split of `snat_port_range`, port 0 and [`DEFAULT_MAC`] (the AF_XDP
    /// driver sets the real interface index and MAC).
    pub fn from_config(c: &Config, worker: usize, workers: usize) -> Self {
        let snat_v4 = c.dataplane.snat_addresses.iter().find_map(|a| match a {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        });
        let snat_v6 = c.dataplane.snat_addresses.iter().find_map(|a| match a {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        });
        let r = c.dataplane.snat_port_range;
        PipelineConfig {
            port: 0,
            mac: DEFAULT_MAC,
            snat_v4,
            snat_v6,
            snat_ports: snat::slice(r.first, r.last, worker, workers),
            fragments_max: 1024,
            fragment_timeout: c.timeouts.fragment.get(),
            synproxy_key: process_cookie_key(),
        }
    }
}

/// This process's SYN cookie key when none is configured: random, one for all workers. The
/// daemon sets the one kept in `state_dir` instead.
fn process_cookie_key() -> CookieKey {
    static KEY: std::sync::OnceLock<CookieKey> = std::sync::OnceLock::new();
    *KEY.get_or_init(CookieKey::random)
}

/// The flow table's settings from a config (capacity, backends, timeouts).
pub fn flow_table_config(c: &Config) -> flowtable::FlowTableConfig {
    let t = &c.timeouts;
    let mut f = flowtable::FlowTableConfig::new(
        c.flowtable.capacity as usize,
        c.flowtable.backends_max as usize,
    );
    f.timeouts = flowtable::Timeouts {
        tcp_established: t.tcp_established.get(),
        tcp_syn_sent: t.tcp_syn.get(),
        tcp_syn_recv: t.tcp_syn.get(),
        tcp_syn_pressure: t.tcp_syn_pressure.get(),
        tcp_fin_wait: t.tcp_fin_wait.get(),
        tcp_close_wait: t.tcp_close_wait.get(),
        tcp_last_ack: t.tcp_last_ack.get(),
        tcp_time_wait: t.tcp_time_wait.get(),
        tcp_close: t.tcp_close.get(),
        udp: t.udp.get(),
        icmp: t.icmp.get(),
        sctp_established: t.sctp.get(),
        sctp_closing: t.tcp_close.get(),
    };
    f
}
