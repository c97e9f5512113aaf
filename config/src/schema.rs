//! The typed TOML schema of `xvs.toml`. Every table rejects unknown keys, every key that can
//! have a default has one (written next to the field), and nothing here checks relations
//! between keys: that is `validate`'s job, which can name the key and line of a problem.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use serde::Deserialize;

use crate::cores::Cores;
use vocab::{Cidr, Encap, Mode, Protocol, SchedulerKind, XdpMode, ZeroCopy};

use crate::types::{Dur, Mac, PortRange};

/// The whole configuration file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node: its name and addresses.
    #[serde(default)]
    pub node: Node,
    /// Interfaces, queues, cores, forwarding mode and AF_XDP sizing.
    #[serde(default)]
    pub dataplane: Dataplane,
    /// The conntrack table.
    #[serde(default)]
    pub flowtable: FlowTable,
    /// Per-state flow timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// The Kubernetes source; when absent, services come from `[[services]]`.
    pub kubernetes: Option<Kubernetes>,
    /// Static services (the static source).
    #[serde(default)]
    pub services: Vec<Service>,
    /// Static next hops: pinned MACs, and the whole neighbour table for `xvs pcap`.
    #[serde(default)]
    pub neighbours: Vec<Neighbour>,
    /// The admin surface: healthz, metrics and read-only API, the control socket.
    #[serde(default)]
    pub admin: Admin,
    /// Logs.
    #[serde(default)]
    pub log: Log,
    /// Active backend health checks.
    #[serde(default)]
    pub health: Health,
    /// The SYN proxy (SYN cookies in front of the backends), for every TCP service.
    #[serde(default)]
    pub synproxy: Synproxy,
    /// Flow sync between the nodes of a tier (off unless `enable`).
    #[serde(default)]
    pub sync: Sync,
    /// VIP announcement through BIRD (off unless `enable`).
    #[serde(default)]
    pub bgp: Bgp,
}

impl Config {
    /// The control socket: `[admin] socket`, else `xvs.sock` in `[dataplane] state_dir`.
    pub fn admin_socket(&self) -> PathBuf {
        self.admin
            .socket
            .clone()
            .unwrap_or_else(|| self.dataplane.state_dir.join("xvs.sock"))
    }

    /// The outer source address of DSR `ipip` and `gue` packets of one family (`v6`) when
    /// `[dataplane] ipip_source_prefix` does not give one: the first of `[node] addresses`
    /// of that family, else the first of `[dataplane] snat_addresses`.
    pub fn dsr_outer_source(&self, v6: bool) -> Option<IpAddr> {
        let family = |a: &&IpAddr| a.is_ipv6() == v6;
        (self.node.addresses.iter().find(family))
            .or_else(|| self.dataplane.snat_addresses.iter().find(family))
            .copied()
    }

    /// Whether DSR `ipip` and `gue` packets of one family (`v6`) have an outer source: the
    /// family's `[dataplane] ipip_source_prefix`, or [`Config::dsr_outer_source`].
    pub fn has_dsr_source(&self, v6: bool) -> bool {
        self.dataplane
            .ipip_source_prefix
            .is_some_and(|c| c.addr.is_ipv6() == v6)
            || self.dsr_outer_source(v6).is_some()
    }

    /// `[flowtable] removal_grace`, else two `min_sync_period`s (of `[kubernetes]`, else
    /// the default 1s) plus one second.
    pub fn removal_grace(&self) -> std::time::Duration {
        match self.flowtable.removal_grace {
            Some(g) => g.get(),
            None => {
                let min_sync = self
                    .kubernetes
                    .as_ref()
                    .map_or(std::time::Duration::from_secs(1), |k| {
                        k.min_sync_period.get()
                    });
                2 * min_sync + std::time::Duration::from_secs(1)
            }
        }
    }
}

/// `[node]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Node name (default: the host name); the Kubernetes source matches it against
    /// `nodeName` for `Local` traffic policies and against `hints.forNodes` (PreferSameNode).
    pub name: Option<String>,
    /// The node's own addresses: NodePort frontends listen on these.
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    /// Topology zone, matched against EndpointSlice `hints.forZones` (default: from the
    /// Node's `topology.kubernetes.io/zone` label).
    pub zone: Option<String>,
}

/// One interface the fastpath serves.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    /// Kernel interface name.
    pub name: String,
    /// How many RX queues (0..queues) get an AF_XDP socket and a worker. Default 1.
    #[serde(default = "one_u16")]
    pub queues: u16,
}

fn one_u16() -> u16 {
    1
}

/// `[dataplane]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dataplane {
    /// Interfaces served; worker q serves queue q of every interface that has it.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Let an interface have more receive queues (NIC channels) than its `queues`: frames
    /// for xvs on the other queues reach no socket and are passed to the kernel (counted as
    /// `no_socket` by the steering program), so this is for a NIC that steers xvs's traffic
    /// to queues `0..queues` only. Off: `xvs run` refuses the mismatch.
    #[serde(default)]
    pub allow_fewer_queues: bool,
    /// Cores the workers are pinned to, in order; worker i runs on `cores[i % len]`. Or
    /// `"auto"`: the cpuset the process was given, resolved at start ([`Cores::resolve`]).
    #[serde(default)]
    pub cores: Cores,
    /// Core for the slowpath thread (default: any core not in `cores`; with `"auto"`, the
    /// cpuset's lowest core).
    pub slowpath_core: Option<usize>,
    /// Default forwarding mode for services that do not set one.
    #[serde(default)]
    pub mode: Mode,
    /// Source addresses for full-NAT (at least one per address family in use).
    #[serde(default)]
    pub snat_addresses: Vec<IpAddr>,
    /// Source ports for full-NAT, split evenly between workers.
    #[serde(default = "default_snat_ports")]
    pub snat_port_range: PortRange,
    /// UMEM frames per AF_XDP socket (power of two).
    #[serde(default = "default_umem_frames")]
    pub umem_frames: u32,
    /// UMEM frame size in bytes: 2048 or 4096.
    #[serde(default = "default_frame_size")]
    pub frame_size: u32,
    /// RX and fill ring entries (power of two).
    #[serde(default = "default_ring")]
    pub rx_ring_size: u32,
    /// TX and completion ring entries (power of two).
    #[serde(default = "default_ring")]
    pub tx_ring_size: u32,
    /// Frames handled per poll (power of two, at most the ring sizes).
    #[serde(default = "default_batch")]
    pub batch_size: u32,
    /// XDP attach mode.
    #[serde(default)]
    pub xdp_mode: XdpMode,
    /// AF_XDP zero-copy.
    #[serde(default)]
    pub zero_copy: ZeroCopy,
    /// Sleep this long after this many empty polls (absent: busy-poll forever).
    pub idle_backoff: Option<Dur>,
    /// Preferred NAPI busy polling: each worker runs its queues' receive NAPI (the driver's
    /// receive and, in copy mode, the copy into the UMEM) on its own core from its poll loop,
    /// instead of the kernel running it in softirq wherever the interrupt lands. Sets
    /// `SO_PREFER_BUSY_POLL` on the sockets and, on interfaces where they are 0,
    /// `napi_defer_hard_irqs` and `gro_flush_timeout` (restored at exit). Needs a driver
    /// that gives AF_XDP sockets a NAPI id (veth on Linux 6.18 does not; xvs warns).
    #[serde(default)]
    pub napi_busy_poll: bool,
    /// Frames the steering program redirected that xvs does not own (a nat-mode backend's
    /// packets of a connection that bypasses the VIPs, ICMP echo to a VIP, ...) are written
    /// into an exception TAP device per interface (`xvsp<ifindex>`), so the kernel receives
    /// them as if they had come in on the interface. Off: they are dropped (counted as
    /// `pass`). Needs `/dev/net/tun`.
    #[serde(default = "yes")]
    pub pass_to_kernel: bool,
    /// Maglev lookup-table size for `mh` services (prime).
    #[serde(default = "default_mh_table")]
    pub mh_table_size: u32,
    /// Graceful drain on SIGTERM/SIGINT: `/healthz` turns 503 at once (upstream load
    /// balancers stop sending), traffic keeps flowing, and xvs exits when no established
    /// flow is left and nothing was forwarded for a second, or after this long. A second
    /// signal stops at once. "0s": stop at once.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: Dur,
    /// Where state that outlives the process lives (a tmpfs: `/run`): the flow table and
    /// the ClientIP affinity table (shared mappings the next xvs of the boot adopts), the
    /// flows exported at a graceful stop, and the control socket by default. A hostPath in
    /// the DaemonSet.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// While no xvs runs (a restart, a crash), the steering program stays attached and
    /// drops frames xvs owns (to a VIP, to the SNAT ports, nat replies) instead of letting
    /// the kernel answer them with resets, for at most this long after the last xvs stopped
    /// refreshing it; then it passes everything and is removed, so a node whose xvs never
    /// returns still works.
    #[serde(default = "default_restart_hold")]
    pub restart_hold: Dur,
    /// Where the steering programs are pinned so they stay attached across a restart: a
    /// directory on a bpffs, with one subdirectory per network namespace. `ip netns exec`
    /// mounts a new `/sys`, hiding `/sys/fs/bpf`: there, mount a bpffs elsewhere (the lab
    /// uses `/run/xvs-bpf`) and point this at it.
    #[serde(default = "default_bpf_pin_root")]
    pub bpf_pin_root: PathBuf,
    /// Rejects (TCP RSTs, ICMP port unreachable: a Service without endpoints, a port a
    /// ClusterIP does not serve) each worker sends at most per second, in bursts of
    /// `reject_burst`: the kernel's `icmp_msgs_per_sec`. Over it they are dropped (counted
    /// `reject_rate_limited`). 0: never reject, always drop.
    #[serde(default = "default_reject_rate")]
    pub reject_rate: u32,
    /// The rejects a worker sends at once after a quiet spell (the kernel's
    /// `icmp_msgs_burst`).
    #[serde(default = "default_reject_burst")]
    pub reject_burst: u32,
    /// The UDP destination port of DSR services with `encap = "gue"`: the port the backends'
    /// GUE decapsulation listens on (Katran's 6080).
    #[serde(default = "default_gue_port")]
    pub gue_port: u16,
    /// Outer source addresses of the DSR services' `ipip` and `gue` packets of this prefix's
    /// family: one address of the prefix per flow, from the flow's hash, so that a backend's
    /// NIC spreads the encapsulated flows over its receive queues (RSS hashes the outer
    /// header; Katran's trick). Absent, and for the other family: the node's address
    /// ([`Config::dsr_outer_source`]).
    pub ipip_source_prefix: Option<Cidr>,
    /// Clamp the MSS option of the client SYNs xvs forwards to DSR backends to what fits the
    /// path once encapsulated (`dsr_mtu` minus the IP and TCP headers and the
    /// encapsulation's).
    #[serde(default = "yes")]
    pub dsr_mss_clamp: bool,
    /// The largest IP packet on the path to DSR backends, encapsulation included: a client
    /// packet that would exceed it once encapsulated is answered with ICMP fragmentation
    /// needed (IPv4 with DF) or packet too big (IPv6) carrying what is left for it. Absent:
    /// the smallest MTU of `interfaces`, read at start (1500 where xvs reads no interface:
    /// `xvs pcap`, `xvs sim`).
    pub dsr_mtu: Option<u32>,
}

fn default_snat_ports() -> PortRange {
    PortRange {
        first: 1024,
        last: 65535,
    }
}
fn default_umem_frames() -> u32 {
    4096
}
fn default_frame_size() -> u32 {
    4096
}
fn default_ring() -> u32 {
    2048
}
fn default_batch() -> u32 {
    64
}
fn default_mh_table() -> u32 {
    65537
}
fn default_drain_timeout() -> Dur {
    Dur::from_secs(5)
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/run/xvs")
}
fn default_restart_hold() -> Dur {
    Dur::from_secs(30)
}
fn default_bpf_pin_root() -> PathBuf {
    PathBuf::from("/sys/fs/bpf/xvs")
}
fn default_reject_rate() -> u32 {
    1000
}
fn default_reject_burst() -> u32 {
    50
}
/// The GUE port when `[dataplane] gue_port` is not set (Katran's).
pub const DEFAULT_GUE_PORT: u16 = 6080;
fn default_gue_port() -> u16 {
    DEFAULT_GUE_PORT
}

impl Default for Dataplane {
    fn default() -> Self {
        Dataplane {
            interfaces: Vec::new(),
            allow_fewer_queues: false,
            cores: Cores::default(),
            slowpath_core: None,
            mode: Mode::default(),
            snat_addresses: Vec::new(),
            snat_port_range: default_snat_ports(),
            umem_frames: default_umem_frames(),
            frame_size: default_frame_size(),
            rx_ring_size: default_ring(),
            tx_ring_size: default_ring(),
            batch_size: default_batch(),
            xdp_mode: XdpMode::default(),
            zero_copy: ZeroCopy::default(),
            idle_backoff: None,
            napi_busy_poll: false,
            pass_to_kernel: true,
            mh_table_size: default_mh_table(),
            drain_timeout: default_drain_timeout(),
            state_dir: default_state_dir(),
            restart_hold: default_restart_hold(),
            bpf_pin_root: default_bpf_pin_root(),
            reject_rate: default_reject_rate(),
            reject_burst: default_reject_burst(),
            gue_port: default_gue_port(),
            ipip_source_prefix: None,
            dsr_mss_clamp: true,
            dsr_mtu: None,
        }
    }
}

impl Dataplane {
    /// Number of fastpath workers: the most queues of any interface (worker q serves queue q
    /// of every interface that has it). `xvs check` and `xvs run` both count this way.
    pub fn workers(&self) -> usize {
        self.interfaces
            .iter()
            .map(|i| usize::from(i.queues))
            .max()
            .unwrap_or(0)
    }
}

/// `[flowtable]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowTable {
    /// Maximum concurrent flows; memory is allocated for all of them at start-up.
    #[serde(default = "default_capacity")]
    pub capacity: u32,
    /// Maximum backends tracked for connection counts.
    #[serde(default = "default_backends_max")]
    pub backends_max: u32,
    /// What happens to the TCP and SCTP flows of a backend that left its service (deleted,
    /// not terminating). UDP flows of such a backend are always re-steered at once.
    #[serde(default)]
    pub removed_backend_tcp: RemovedBackendPolicy,
    /// How long a backend must have been absent from its service before its flows are
    /// ended (TCP/SCTP, per `removed_backend_tcp`) or re-steered (UDP) and its id retired;
    /// one that comes back within it keeps its flows. Control-plane churn (an endpoint moving
    /// between EndpointSlices, an API server relist) makes backends vanish for about one
    /// `min_sync_period`. Default: two `[kubernetes] min_sync_period`s plus one second (3s).
    /// See [`Config::removal_grace`].
    pub removal_grace: Option<Dur>,
}

/// `[flowtable] removed_backend_tcp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemovedBackendPolicy {
    /// End the flows at once (IPVS `expire_nodest_conn = 1`, as kube-proxy's IPVS mode sets
    /// it): the client's next packet finds no flow and is dropped as `no_flow`, so the
    /// connection fails instead of being sent to an address that is gone.
    #[default]
    Expire,
    /// Keep forwarding to the old address until the flow ends or times out (kube-proxy's
    /// iptables behaviour: the backend may still be alive outside the Service).
    Keep,
}

fn default_capacity() -> u32 {
    1 << 20
}
fn default_backends_max() -> u32 {
    1 << 16
}

impl Default for FlowTable {
    fn default() -> Self {
        FlowTable {
            capacity: default_capacity(),
            backends_max: default_backends_max(),
            removed_backend_tcp: RemovedBackendPolicy::default(),
            removal_grace: None,
        }
    }
}

/// `[timeouts]`: per-state idle timeouts (IPVS defaults).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// TCP established.
    #[serde(default = "d900")]
    pub tcp_established: Dur,
    /// TCP SYN_SENT / SYN_RECV.
    #[serde(default = "d60")]
    pub tcp_syn: Dur,
    /// TCP SYN_SENT / SYN_RECV while the flow table is under pressure (7/8 full, or
    /// half-open flows had to give way to new ones within the last 10 s): a SYN flood's
    /// half-open flows leave this fast.
    #[serde(default = "d3")]
    pub tcp_syn_pressure: Dur,
    /// TCP FIN_WAIT.
    #[serde(default = "d120")]
    pub tcp_fin_wait: Dur,
    /// TCP CLOSE_WAIT.
    #[serde(default = "d60")]
    pub tcp_close_wait: Dur,
    /// TCP LAST_ACK.
    #[serde(default = "d30")]
    pub tcp_last_ack: Dur,
    /// TCP TIME_WAIT.
    #[serde(default = "d120")]
    pub tcp_time_wait: Dur,
    /// TCP CLOSE (after RST).
    #[serde(default = "d10")]
    pub tcp_close: Dur,
    /// UDP flows.
    #[serde(default = "d300")]
    pub udp: Dur,
    /// ICMP echo flows.
    #[serde(default = "d60")]
    pub icmp: Dur,
    /// SCTP established associations.
    #[serde(default = "d900")]
    pub sctp: Dur,
    /// Unmatched IPv4 fragments wait this long for their first fragment.
    #[serde(default = "d1")]
    pub fragment: Dur,
}

fn d1() -> Dur {
    Dur::from_secs(1)
}
fn yes() -> bool {
    true
}
fn d3() -> Dur {
    Dur::from_secs(3)
}
fn d10() -> Dur {
    Dur::from_secs(10)
}
fn d30() -> Dur {
    Dur::from_secs(30)
}
fn d60() -> Dur {
    Dur::from_secs(60)
}
fn d120() -> Dur {
    Dur::from_secs(120)
}
fn d300() -> Dur {
    Dur::from_secs(300)
}
fn d900() -> Dur {
    Dur::from_secs(900)
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            tcp_established: d900(),
            tcp_syn: d60(),
            tcp_syn_pressure: d3(),
            tcp_fin_wait: d120(),
            tcp_close_wait: d60(),
            tcp_last_ack: d30(),
            tcp_time_wait: d120(),
            tcp_close: d10(),
            udp: d300(),
            icmp: d60(),
            sctp: d900(),
            fragment: d1(),
        }
    }
}

/// `[kubernetes]`: watch Services and EndpointSlices instead of `[[services]]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kubernetes {
    /// Path to a kubeconfig; absent means in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// Like kube-proxy's `--service-proxy-name` label handling: absent means Services
    /// carrying `service.kubernetes.io/service-proxy-name` are left alone; present means only
    /// Services whose label equals it are handled.
    pub service_proxy_name: Option<String>,
    /// Changes are batched for at least this long before a snapshot is published.
    #[serde(default = "d1")]
    pub min_sync_period: Dur,
    /// Full resync period.
    #[serde(default = "default_sync_period")]
    pub sync_period: Dur,
    /// Scheduler for Services without an `xvs.io/scheduler` annotation.
    #[serde(default)]
    pub default_scheduler: SchedulerKind,
    /// externalIPs are only accepted inside these prefixes (CVE-2020-8554); empty = none.
    #[serde(default)]
    pub external_ip_cidrs: Vec<Cidr>,
    /// The cluster's Service CIDRs, besides those of the `networking.k8s.io/v1`
    /// ServiceCIDR objects (for clusters without them, before v1.33): packets to an address
    /// inside one that no Service has are dropped (`service_cidr`), as kube-proxy drops
    /// traffic to unallocated ClusterIPs.
    #[serde(default)]
    pub service_cidrs: Vec<Cidr>,
}

fn default_sync_period() -> Dur {
    Dur::from_secs(30)
}

/// Scheduler flags (IPVS's `--sched-flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedFlag {
    /// mh: hash the source port too.
    MhPort,
    /// mh: skip an unavailable or weight-0 backend by probing on.
    MhFallback,
}

/// One `[[services]]` entry: a frontend and its backends. The shape is fixed by DESIGN.md.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// Unique name.
    pub name: String,
    /// Virtual IP (IPv4 or IPv6).
    pub vip: IpAddr,
    /// Frontend port.
    pub port: u16,
    /// L4 protocol: `tcp`, `udp` or `sctp`.
    pub protocol: Protocol,
    /// Scheduler (default rr, like kube-proxy's ipvs mode).
    #[serde(default)]
    pub scheduler: SchedulerKind,
    /// Scheduler flags.
    #[serde(default)]
    pub flags: Vec<SchedFlag>,
    /// Forwarding mode (default: `[dataplane] mode`): `nat`, `fullnat` or `dsr`.
    pub mode: Option<Mode>,
    /// A DSR service's encapsulation: `ipip` (default), `gue` or `l2`. Only with
    /// `mode = "dsr"`.
    pub encap: Option<Encap>,
    /// ClientIP session affinity with this timeout, when present.
    pub session_affinity_timeout: Option<Dur>,
    /// Backends; an empty list is allowed (new flows are refused).
    #[serde(default)]
    pub backends: Vec<Backend>,
    /// New connections per second admitted (token bucket shared by all workers); excess
    /// new flows are dropped and counted (`rate_limited`). Absent: unlimited.
    pub new_conn_rate: Option<u32>,
    /// Bucket size: new connections admitted at once after a quiet spell (default: one
    /// second's worth, `new_conn_rate`). Needs `new_conn_rate`.
    pub new_conn_burst: Option<u32>,
    /// The SYN proxy for this service (TCP only; default: `[synproxy] mode`).
    pub synproxy: Option<SynproxyMode>,
    /// This service's own health check: each key it sets replaces `[health]`'s.
    #[serde(default)]
    pub health: ServiceHealth,
}

impl Service {
    /// The service's SYN proxy mode, given the global `[synproxy]` one.
    pub fn synproxy_or(&self, default: SynproxyMode) -> SynproxyMode {
        self.synproxy.unwrap_or(default)
    }

    /// The service's forwarding mode, given the dataplane default; a DSR mode carries the
    /// service's `encap`.
    pub fn mode_or(&self, default: Mode) -> Mode {
        match self.mode.unwrap_or(default) {
            Mode::Dsr(e) => Mode::Dsr(self.encap.unwrap_or(e)),
            m => m,
        }
    }
    /// Whether `flag` is set.
    pub fn has_flag(&self, flag: SchedFlag) -> bool {
        self.flags.contains(&flag)
    }
}

/// One backend of a static service.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// `IP:PORT` (`[IPv6]:PORT` for IPv6).
    pub addr: SocketAddr,
    /// Relative weight; 0 drains the backend (no new flows). Default 1.
    #[serde(default = "one_u32")]
    pub weight: u32,
}

fn one_u32() -> u32 {
    1
}

/// One `[[neighbours]]` entry: a next hop's MAC.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Neighbour {
    /// Next-hop IP.
    pub ip: IpAddr,
    /// Its MAC address.
    pub mac: Mac,
}

/// `[admin]`: the admin surface, split by exposure as kube-proxy's is.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// `/metrics`, the read-only `/v1/*` and `/healthz`, `/livez` (kube-proxy's metrics
    /// address, `127.0.0.1:10249`: node-local by default, since `/v1/flows` shows clients).
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// Only `/healthz` and `/livez`, for the kubelet's probes and upstream load balancers
    /// (default `0.0.0.0:10256`, kube-proxy's healthz address; when `listen` itself uses
    /// port 10256, as configs written before the split do, the default is `listen`: one
    /// listener serves both sets). See [`Admin::healthz_listen`].
    pub healthz_listen: Option<SocketAddr>,
    /// Only `/metrics`, for a Prometheus that scrapes the node from elsewhere (default: none,
    /// `/metrics` is on `listen` only). Nothing else is served there: `/v1/flows` shows
    /// client addresses, which a scraper has no business reading.
    pub metrics_listen: Option<SocketAddr>,
    /// The control socket (a unix socket, mode 0600): everything `listen` serves plus
    /// freeze/drain when `enable_control` is set; `xvs status`, `xvs freeze`... use it.
    /// Default: `xvs.sock` in `[dataplane] state_dir` (`/run/xvs/xvs.sock`); see
    /// [`Config::admin_socket`].
    pub socket: Option<PathBuf>,
    /// Allow state-changing endpoints (freeze, drain), on the control socket only. Off by
    /// default.
    #[serde(default)]
    pub enable_control: bool,
}

/// kube-proxy's healthz port.
pub const HEALTHZ_PORT: u16 = 10256;

fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 10249))
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            listen: default_admin_listen(),
            healthz_listen: None,
            metrics_listen: None,
            socket: None,
            enable_control: false,
        }
    }
}

impl Admin {
    /// The healthz listener's address: `healthz_listen` when set; otherwise `0.0.0.0:10256`,
    /// or `listen` when that already uses port 10256 (the two would collide).
    pub fn healthz_listen(&self) -> SocketAddr {
        self.healthz_listen.unwrap_or_else(|| {
            if self.listen.port() == HEALTHZ_PORT {
                self.listen
            } else {
                SocketAddr::from(([0, 0, 0, 0], HEALTHZ_PORT))
            }
        })
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event: time, level, target, message, fields.
    #[default]
    Text,
    /// One JSON object per line (for Loki, Elasticsearch): `timestamp`, `level`, `target`,
    /// `fields` (with `message`).
    Json,
}

/// `[log]`: the daemon's logs, on stderr.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    /// A filter: a level (`error`, `warn`, `info`, `debug`, `trace`, `off`) and/or
    /// `target=level` items separated by commas, e.g. `"info,kube=warn"`. `RUST_LOG`, when
    /// set, replaces it.
    #[serde(default = "default_log_level")]
    pub level: String,
    /// `text` or `json`.
    #[serde(default)]
    pub format: LogFormat,
}

fn default_log_level() -> String {
    "info".to_owned()
}

impl Default for Log {
    fn default() -> Self {
        Log {
            level: default_log_level(),
            format: LogFormat::default(),
        }
    }
}

/// Kind of active health probe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeKind {
    /// No active probes: every backend counts as healthy.
    #[default]
    None,
    /// A TCP connect to the backend's address.
    Tcp,
    /// An HTTP GET of `http_path`; healthy on a status of `http_status` (default: any 2xx
    /// or 3xx). keepalived's `HTTP_GET`.
    Http,
    /// The same GET over TLS, the backend's certificate not verified (keepalived's
    /// `SSL_GET`): a health check asks whether the backend answers, not who it is.
    Https,
}

impl ProbeKind {
    /// Every kind, in the order [`ProbeKind::name`] lists them.
    pub const ALL: [ProbeKind; 4] = [
        ProbeKind::None,
        ProbeKind::Tcp,
        ProbeKind::Http,
        ProbeKind::Https,
    ];

    /// The name in the config file and the `xvs.io/health-check-probe` annotation.
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::None => "none",
            ProbeKind::Tcp => "tcp",
            ProbeKind::Http => "http",
            ProbeKind::Https => "https",
        }
    }

    /// The kind named `name` (exactly as [`ProbeKind::name`] spells it).
    pub fn from_name(name: &str) -> Option<ProbeKind> {
        ProbeKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether it sends an HTTP request (`http_path`, `http_status` apply).
    pub fn is_http(self) -> bool {
        matches!(self, ProbeKind::Http | ProbeKind::Https)
    }
}

/// `[health]`: active probes of every service's backends, and the defaults of each
/// service's own [`ServiceHealth`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// Probe kind.
    #[serde(default)]
    pub probe: ProbeKind,
    /// Time between probes of one backend.
    #[serde(default = "default_health_interval")]
    pub interval: Dur,
    /// A probe that takes longer fails.
    #[serde(default = "default_health_timeout")]
    pub timeout: Dur,
    /// Consecutive successes before a down backend is up (one not judged yet is up, and
    /// verified for BGP, after its first success).
    #[serde(default = "default_rise")]
    pub rise: u32,
    /// Consecutive failures before an up (or not yet judged) backend is down.
    #[serde(default = "default_fall")]
    pub fall: u32,
    /// Path for HTTP probes.
    #[serde(default = "default_http_path")]
    pub http_path: String,
    /// The statuses an HTTP probe takes as healthy (keepalived's `status_code`); empty (the
    /// default): any 2xx or 3xx.
    #[serde(default)]
    pub http_status: Vec<u16>,
}

/// A service's own health check (`[[services]] health`, or a Kubernetes Service's
/// `xvs.io/health-check-*` annotations): each key set replaces `[health]`'s, each key
/// absent takes it. `interval` and `timeout` are `[health]`'s for every service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceHealth {
    /// Probe kind (`none` turns the checks off for this service).
    pub probe: Option<ProbeKind>,
    /// The port probed instead of each backend's own (keepalived's `connect_port`): a
    /// backend serving on 8080 with its health endpoint on 8081.
    pub port: Option<u16>,
    /// Path of HTTP probes.
    pub http_path: Option<String>,
    /// Healthy statuses of HTTP probes.
    pub http_status: Option<Vec<u16>>,
    /// Consecutive successes before a down backend is up.
    pub rise: Option<u32>,
    /// Consecutive failures before a backend is down.
    pub fall: Option<u32>,
}

fn default_health_interval() -> Dur {
    Dur::from_secs(5)
}
fn default_health_timeout() -> Dur {
    Dur::from_secs(2)
}
fn default_rise() -> u32 {
    2
}
fn default_fall() -> u32 {
    3
}
fn default_http_path() -> String {
    "/".to_owned()
}

impl Default for Health {
    fn default() -> Self {
        Health {
            probe: ProbeKind::default(),
            interval: default_health_interval(),
            timeout: default_health_timeout(),
            rise: default_rise(),
            fall: default_fall(),
            http_path: default_http_path(),
            http_status: Vec::new(),
        }
    }
}

/// When the SYN proxy answers a TCP service's SYNs itself (SYN cookies) and opens the
/// backend connection only for a client that completed the handshake.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SynproxyMode {
    /// Never: SYNs create flows and go to the backends.
    Off,
    /// Always.
    On,
    /// While the flow table holds more than `[synproxy] auto_threshold` embryonic flows (a
    /// SYN flood).
    #[default]
    Auto,
}

impl SynproxyMode {
    /// The name used in the config file (and the `xvs.io/synproxy` annotation).
    pub fn name(self) -> &'static str {
        match self {
            SynproxyMode::Off => "off",
            SynproxyMode::On => "on",
            SynproxyMode::Auto => "auto",
        }
    }

    /// From its name.
    pub fn from_name(name: &str) -> Option<SynproxyMode> {
        match name {
            "off" => Some(SynproxyMode::Off),
            "on" => Some(SynproxyMode::On),
            "auto" => Some(SynproxyMode::Auto),
            _ => None,
        }
    }
}

/// `[synproxy]`: the SYN proxy's global settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Synproxy {
    /// Every TCP service's mode unless the service (or its `xvs.io/synproxy` annotation)
    /// says otherwise. Default `auto`.
    #[serde(default)]
    pub mode: SynproxyMode,
    /// `auto` engages while the flow table holds more embryonic flows (SYN sent or
    /// received, handshake not complete) than this, and lets go once they are below half
    /// of it. Default 1000 (or half the flow table's capacity, when that is less): a busy
    /// node's legitimate handshakes (new connections a second times their round trip) stay
    /// below it; a flood of spoofed SYNs passes it within milliseconds. See
    /// [`Synproxy::threshold`].
    pub auto_threshold: Option<u32>,
}

/// `[synproxy] auto_threshold`'s default.
pub const SYNPROXY_AUTO_THRESHOLD: u32 = 1000;

impl Synproxy {
    /// The embryonic-flow count above which `auto` engages, for a flow table of `capacity`.
    pub fn threshold(&self, capacity: u32) -> u32 {
        self.auto_threshold
            .unwrap_or_else(|| SYNPROXY_AUTO_THRESHOLD.min(capacity / 2).max(1))
    }
}

/// `[sync]`: flow sync between the peers of a tier. Every node sends the flows its workers
/// create, the state changes that matter (established, closing) and their ends to every
/// peer, over UDP, authenticated with a key all peers share; a peer installs them so it
/// can serve them the moment ECMP moves their packets to it (replies to this node's SNAT
/// addresses included: the peers announce them as backups, see `[bgp]`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sync {
    /// Sync on. Default false.
    #[serde(default)]
    pub enable: bool,
    /// This node's sync address (UDP), where peers send. Required when enabled.
    pub listen: Option<SocketAddr>,
    /// The shared key: a file of at least 32 bytes (e.g. `head -c 32 /dev/urandom`), the
    /// same on every peer, readable by root only. Required when enabled.
    pub key_file: Option<PathBuf>,
    /// The other nodes of the tier.
    #[serde(default)]
    pub peers: Vec<SyncPeer>,
    /// How often the slowpath sends what the workers recorded. Default 10 ms.
    #[serde(default = "sync_interval")]
    pub interval: Dur,
    /// How often every live flow this node serves is sent again, so that a peer's copy
    /// does not expire while the flow lives here. Default 60 s (less than the shortest
    /// established timeout matters: a flow idle longer is not refreshed).
    #[serde(default = "d60")]
    pub refresh: Dur,
    /// At most this many messages a second to each peer (a full dump is paced by it too).
    /// Default 20000.
    #[serde(default = "sync_rate")]
    pub max_messages_per_second: u32,
}

/// One peer of `[sync] peers`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncPeer {
    /// Its sync address (its `[sync] listen`).
    pub address: SocketAddr,
    /// Its `[dataplane] snat_addresses`: this node takes replies to them once it serves
    /// the peer's flows, and (with `[bgp]`) announces them as backups.
    #[serde(default)]
    pub snat_addresses: Vec<IpAddr>,
}

impl Default for Sync {
    fn default() -> Sync {
        Sync {
            enable: false,
            listen: None,
            key_file: None,
            peers: Vec::new(),
            interval: sync_interval(),
            refresh: d60(),
            max_messages_per_second: sync_rate(),
        }
    }
}

impl Sync {
    /// The peers' SNAT addresses when sync is on (this node takes replies to them; `[bgp]`
    /// announces them as backups), else none.
    pub fn peer_snat_addresses(&self) -> Vec<IpAddr> {
        if !self.enable {
            return Vec::new();
        }
        let mut out: Vec<IpAddr> = self
            .peers
            .iter()
            .flat_map(|p| p.snat_addresses.iter().copied())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

fn sync_interval() -> Dur {
    Dur::from_millis(10)
}

fn sync_rate() -> u32 {
    20_000
}

/// `[bgp]`: this node's VIPs and SNAT addresses announced through BIRD 2. xvs writes an
/// include file for BIRD (static protocols `xvs4` and `xvs6` with one host route per
/// address, the export filter `xvs_export`, and, when `neighbors` are listed, the BGP
/// sessions themselves) and asks BIRD to reconfigure over its control socket. The routes
/// point at `liveness_device`, a device that exists only while xvs runs and is ready to
/// serve: when xvs dies (even `kill -9`) the kernel deletes it and BIRD withdraws the routes
/// at once, although BIRD itself keeps running.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bgp {
    /// Announce. Default false.
    #[serde(default)]
    pub enable: bool,
    /// BIRD's control socket (`bird -s`). Default `/run/bird/bird.ctl`, Debian's.
    #[serde(default = "default_bird_socket")]
    pub socket: PathBuf,
    /// The file xvs writes (aside, then renamed over), which bird.conf includes. Default
    /// `/run/bird/bird-xvs.conf`, beside Debian's socket: Debian's BIRD runs as user `bird`,
    /// which cannot read `[dataplane] state_dir` (mode 0750). xvs creates the directory
    /// when it is missing.
    #[serde(default = "default_bird_include")]
    pub include: PathBuf,
    /// This node's AS number. Required with `neighbors`, and whenever backups are
    /// announced (the export filter prepends it to them).
    pub local_as: Option<u32>,
    /// BIRD's router id, written into the include file when set (else bird.conf's, or
    /// BIRD's choice: the lowest IPv4 address of the node).
    pub router_id: Option<Ipv4Addr>,
    /// The routers this node peers with. Listed: xvs writes the BGP sessions (one per
    /// neighbour: an IPv4 neighbour carries the IPv4 routes, an IPv6 one the IPv6 routes)
    /// and, for `bfd`, a BFD protocol. Empty (the default): bird.conf owns the sessions and
    /// exports xvs's routes with `export filter xvs_export;`.
    #[serde(default)]
    pub neighbors: Vec<BgpNeighbor>,
    /// How many times this node's AS is prepended to the backups (the peers' SNAT
    /// addresses, `[sync] peers[].snat_addresses`), so that routers prefer the owner's
    /// route and use a backup only when the owner's is gone. Default 3.
    #[serde(default = "default_backup_prepend")]
    pub backup_prepend: u32,
    /// The liveness device: a TUN device xvs opens when it is ready to serve, and the kernel
    /// deletes when xvs exits. Default `xvs-live`.
    #[serde(default = "default_liveness_device")]
    pub liveness_device: String,
    /// The BFD sessions' interval (BIRD's `interval`: both the minimum receive and the
    /// desired transmit interval this node asks for) of the `neighbors` with `bfd`. Default
    /// 100ms (BIRD's transmit default).
    #[serde(default = "default_bfd_interval")]
    pub bfd_interval: Dur,
    /// How often BFD packets go out while a session is not up (BIRD's `idle tx interval`).
    /// Default 1s (BIRD's).
    #[serde(default = "default_bfd_idle_tx_interval")]
    pub bfd_idle_tx_interval: Dur,
    /// BFD packets missed in a row before a session is declared down (BIRD's `multiplier`);
    /// the router sees this node gone after this many of the agreed intervals. Default 5
    /// (BIRD's).
    #[serde(default = "default_bfd_multiplier")]
    pub bfd_multiplier: u32,
}

/// One of `[bgp] neighbors`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BgpNeighbor {
    /// The router's address on the link to this node.
    pub address: IpAddr,
    /// The router's AS number.
    #[serde(rename = "as")]
    pub asn: u32,
    /// BFD on the session: the router notices a dead link or node in well under a second
    /// (`[bgp] bfd_interval` × `bfd_multiplier`) instead of the BGP hold time. Default true.
    #[serde(default = "yes")]
    pub bfd: bool,
}

/// `[bgp] backup_prepend`'s default.
pub const BGP_BACKUP_PREPEND: u32 = 3;
/// `[bgp] bfd_interval`'s default (BIRD's `min tx interval` default).
pub const BFD_INTERVAL: Dur = Dur::from_millis(100);
/// `[bgp] bfd_idle_tx_interval`'s default (BIRD's).
pub const BFD_IDLE_TX_INTERVAL: Dur = Dur::from_secs(1);
/// `[bgp] bfd_multiplier`'s default (BIRD's).
pub const BFD_MULTIPLIER: u32 = 5;

fn default_bird_socket() -> PathBuf {
    PathBuf::from("/run/bird/bird.ctl")
}
fn default_bird_include() -> PathBuf {
    PathBuf::from("/run/bird/bird-xvs.conf")
}
fn default_backup_prepend() -> u32 {
    BGP_BACKUP_PREPEND
}
fn default_liveness_device() -> String {
    "xvs-live".to_owned()
}
fn default_bfd_interval() -> Dur {
    BFD_INTERVAL
}
fn default_bfd_idle_tx_interval() -> Dur {
    BFD_IDLE_TX_INTERVAL
}
fn default_bfd_multiplier() -> u32 {
    BFD_MULTIPLIER
}

impl Default for Bgp {
    fn default() -> Bgp {
        Bgp {
            enable: false,
            socket: default_bird_socket(),
            include: default_bird_include(),
            local_as: None,
            router_id: None,
            neighbors: Vec::new(),
            backup_prepend: default_backup_prepend(),
            liveness_device: default_liveness_device(),
            bfd_interval: BFD_INTERVAL,
            bfd_idle_tx_interval: BFD_IDLE_TX_INTERVAL,
            bfd_multiplier: BFD_MULTIPLIER,
        }
    }
}

impl Config {
    /// The addresses announced as backups: with `[sync]` on, every peer's SNAT address.
    pub fn bgp_backups(&self) -> Vec<IpAddr> {
        if !self.sync.enable {
            return Vec::new();
        }
        let mut v: Vec<IpAddr> = self
            .sync
            .peers
            .iter()
            .flat_map(|p| p.snat_addresses.iter().copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}
