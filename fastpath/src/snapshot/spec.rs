//! What the builder takes: the source-agnostic model of a service ([`ServiceSpec`], its
//! [`Frontend`]s and [`BackendSpec`]s, its [`SynproxySetting`]). The static source
//! ([`ServiceSpec::from_config`]) and the Kubernetes source both produce it. The static
//! `[[neighbours]]` of the config are an [`L2Table`] ([`L2Table::from_config`]).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use config::{Config, SchedFlag};
use vocab::{Cidr, Mode, Protocol, SchedulerKind};

use super::{L2Table, Neighbour};
use crate::limit::RateLimit;

/// A frontend: what a client addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend {
    /// Virtual IP.
    pub vip: IpAddr,
    /// L4 protocol: TCP, UDP or SCTP.
    pub protocol: Protocol,
    /// Port.
    pub port: u16,
}

impl Frontend {
    /// The frontend flow `d`'s client addressed (none for ICMP flows, which have no port).
    pub fn of_flow(d: &flowtable::FlowData) -> Option<Frontend> {
        if matches!(d.proto, Protocol::Icmp | Protocol::Icmpv6) {
            return None;
        }
        Some(Frontend {
            vip: d.vip.ip(),
            protocol: d.proto,
            port: d.vip.port(),
        })
    }
}

/// One backend as a source describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendSpec {
    /// Address and port.
    pub addr: SocketAddr,
    /// Weight; 0 drains.
    pub weight: u32,
    /// Whether it may take new flows (health checks, readiness); false behaves as weight 0.
    pub usable: bool,
}

/// One service as a source describes it: frontends sharing one backend set and scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Unique name (`namespace/name:port` for Kubernetes).
    pub name: String,
    /// Every frontend that reaches this service.
    pub frontends: Vec<Frontend>,
    /// Scheduler.
    pub scheduler: SchedulerKind,
    /// Scheduler flags.
    pub flags: Vec<SchedFlag>,
    /// Forwarding mode.
    pub mode: Mode,
    /// ClientIP session affinity timeout, when enabled.
    pub affinity_timeout: Option<Duration>,
    /// Backends.
    pub backends: Vec<BackendSpec>,
    /// When not empty, only clients inside these prefixes may open new flows
    /// (`loadBalancerSourceRanges`); others are dropped and counted.
    pub source_ranges: Vec<Cidr>,
    /// New-connection rate limit (token bucket shared by all workers); excess new flows are
    /// dropped and counted (`rate_limited`).
    pub rate_limit: Option<RateLimit>,
    /// Frozen: new flows are refused (`frozen`), established ones continue.
    pub frozen: bool,
    /// The SYN proxy (TCP frontends), with the global setting folded in.
    pub synproxy: SynproxySetting,
    /// The service's own health check, over `[health]` (the daemon's health checker reads
    /// it; the snapshot does not).
    pub health: config::ServiceHealth,
    /// What a new flow gets when no backend is usable.
    pub no_endpoints: NoEndpoints,
    /// The frontends' addresses are ClusterIPs (kube-proxy's `cluster-ips` set): a packet to
    /// one of them on a port or protocol no frontend serves is rejected (`unserved_port`)
    /// instead of passed to the host.
    pub cluster_ip: bool,
}

/// What a new flow gets when its service has no usable backend (none listed, every one
/// drained, unready or judged down).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NoEndpoints {
    /// A reject (TCP RST, ICMP port unreachable; see the pipeline's `reject`): kube-proxy's
    /// answer for a Service without endpoints, IPVS's for a service without a usable
    /// destination (`ip_vs_leave`).
    #[default]
    Reject,
    /// Dropped silently (`no_backend`): kube-proxy's answer for a traffic policy `Local`
    /// without endpoints on this node while the Service has some elsewhere.
    Drop,
}

impl NoEndpoints {
    /// `reject` or `drop`.
    pub fn name(self) -> &'static str {
        match self {
            NoEndpoints::Reject => "reject",
            NoEndpoints::Drop => "drop",
        }
    }
}

/// A service's SYN proxy as the fastpath applies it: the service's mode (its own, or the
/// global `[synproxy] mode`) with the global threshold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SynproxySetting {
    /// SYNs make flows.
    #[default]
    Off,
    /// SYNs are answered with SYN cookies.
    On,
    /// As `On` while the flow table holds more than `embryonic_max` embryonic flows (and
    /// until it holds fewer than half of it), else as `Off`.
    Auto {
        /// `[synproxy] auto_threshold`.
        embryonic_max: u32,
    },
}

impl SynproxySetting {
    /// The setting of a service whose mode is `mode`, under `c`'s `[synproxy]` (and flow
    /// table capacity).
    pub fn of(mode: config::SynproxyMode, c: &Config) -> Self {
        match mode {
            config::SynproxyMode::Off => SynproxySetting::Off,
            config::SynproxyMode::On => SynproxySetting::On,
            config::SynproxyMode::Auto => SynproxySetting::Auto {
                embryonic_max: c.synproxy.threshold(c.flowtable.capacity),
            },
        }
    }

    /// `off`, `on` or `auto`.
    pub fn name(self) -> &'static str {
        match self {
            SynproxySetting::Off => "off",
            SynproxySetting::On => "on",
            SynproxySetting::Auto { .. } => "auto",
        }
    }
}

impl ServiceSpec {
    /// The static source: one spec per `[[services]]` entry.
    pub fn from_config(c: &Config) -> Vec<ServiceSpec> {
        c.services
            .iter()
            .map(|s| ServiceSpec {
                name: s.name.clone(),
                frontends: vec![Frontend {
                    vip: s.vip,
                    protocol: s.protocol,
                    port: s.port,
                }],
                scheduler: s.scheduler,
                flags: s.flags.clone(),
                mode: s.mode_or(c.dataplane.mode),
                affinity_timeout: s.session_affinity_timeout.map(|d| d.get()),
                backends: s
                    .backends
                    .iter()
                    .map(|b| BackendSpec {
                        addr: b.addr,
                        weight: b.weight,
                        usable: true,
                    })
                    .collect(),
                source_ranges: Vec::new(),
                rate_limit: s.new_conn_rate.map(|rate| RateLimit {
                    rate,
                    burst: s.new_conn_burst.unwrap_or(rate),
                }),
                frozen: false,
                synproxy: SynproxySetting::of(s.synproxy_or(c.synproxy.mode), c),
                health: s.health.clone(),
                // IPVS answers a service without a usable destination.
                no_endpoints: NoEndpoints::Reject,
                cluster_ip: false,
            })
            .collect()
    }
}

impl L2Table {
    /// The static `[[neighbours]]` of a config, with no routes and no port MACs.
    pub fn from_config(c: &Config) -> L2Table {
        L2Table {
            neighbours: c
                .neighbours
                .iter()
                .map(|n| Neighbour {
                    ip: n.ip,
                    mac: n.mac.0,
                    port: None,
                })
                .collect(),
            ..L2Table::default()
        }
    }
}
