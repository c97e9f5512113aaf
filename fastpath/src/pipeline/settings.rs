//! A pipeline's settings: per worker ([`PipelineConfig`], [`DEFAULT_MAC`]). They are built
//! from the config in [`crate::settings`], with the shared flow table's.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use super::{CookieKey, DsrSettings};
use crate::limit::RateLimit;

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
    /// Where in `snat_ports` the worker's cursor starts (taken modulo the slice's length; 0:
    /// its first port). The daemon starts every run at a random place
    /// ([`PipelineConfig::with_random_snat_start`]), so that after a start that lost its
    /// flow table a new connection does not take the (SNAT address, port) of one the last
    /// run handed out, which a backend may still hold.
    pub snat_start: u32,
    /// Fragment-table entries (rounded up to a power of two, at least [`frag::WAYS`]).
    ///
    /// [`frag::WAYS`]: super::frag::WAYS
    pub fragments_max: usize,
    /// How long after its first fragment a datagram's later fragments are accepted.
    pub fragment_timeout: Duration,
    /// The SYN cookie secret; every worker must have the same (and the next process too).
    pub synproxy_key: CookieKey,
    /// This worker's reject rate limit (`[dataplane] reject_rate`, `reject_burst`; rate 0:
    /// every reject is dropped instead).
    pub reject_limit: RateLimit,
    /// Direct server return: encapsulation, MTU, MSS clamp, outer sources.
    pub dsr: DsrSettings,
}

impl PipelineConfig {
    /// These settings with [`snat_start`](Self::snat_start) drawn at random.
    pub fn with_random_snat_start(self) -> Self {
        PipelineConfig {
            snat_start: shm::random_u64() as u32,
            ..self
        }
    }
}

/// The source MAC the pcap replayer and tests use when none is configured.
pub const DEFAULT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
