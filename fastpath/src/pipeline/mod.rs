//! The sans-IO per-packet pipeline: `process(frame, now) -> Verdict`.
//!
//! # Contract
//!
//! - [`Pipeline::process`] does no syscall, reads no clock, takes no lock, allocates nothing,
//!   and never panics, whatever the bytes (proptest and a counting allocator check it). It
//!   rewrites the frame in place when the verdict is [`Verdict::Tx`]; for every other verdict
//!   the frame is left as it arrived. [`Pipeline::process_at`] is `process` at a [`Clock`]
//!   (a clock reading with its flow-table time) that the caller made once for several frames.
//! - One `Pipeline` per worker (queue q of every interface). It shares the [`FlowTable`] and the
//!   [`AffinityTable`] with every other worker, and owns its SNAT port slice, its fragment
//!   table and its counters. The snapshot is swapped in between batches with
//!   [`Pipeline::set_snapshot`]; `process` only reads it.
//!
//! # Stages
//!
//! [`classify`] (parse, drop malformed, pass non-IP) → flow lookup by tuple → on a miss the
//! frontend's service schedules a backend and the flow is inserted (`create`) → [`nat`]
//! rewrites L2/L3/L4 with incremental checksums. ICMP errors go to [`icmp`], later
//! IPv4/IPv6 fragments to [`frag`]; fullnat source ports come from [`snat`]. The common
//! frame (untagged IPv4 TCP/UDP without options) takes a shortcut through the same stages
//! (`fast`); [`Pipeline::process_batch`] runs a batch of them as a software pipeline
//! (`batch`). A client's SYN on a flow that has ended first removes it (`reuse`), then
//! takes the new-flow path. TCP services may put a SYN proxy in front of the new-flow path
//! ([`synproxy`]): SYN cookies, the flow made for a client's valid ACK, sequence numbers
//! translated for the flow's life.
//!
//! This file holds the verdicts, the drop reasons and counters, the [`Pipeline`] and its IPv4
//! shortcut's driver; the general path's driver is `general`, the next-hop cache `next_hop`,
//! the per-worker and flow-table settings `settings`.
//!
//! # Rules chosen
//!
//! - **Ports and MACs.** [`Snapshot::next_hop`] decides, for the *new destination address*:
//!   the longest matching route gives the transmit port and gateway, the neighbour table the
//!   destination MAC, the port table the source MAC. Without routes (offline replays, tests)
//!   a frame leaves by the port it came in on, `Tx(config.port)`, with source MAC
//!   `config.mac`. An unknown next hop → [`Verdict::Slow`] with the frame unmodified; for a
//!   new flow nothing is inserted yet, so the slowpath may resolve the neighbour and
//!   re-inject the frame.
//! - **TTL.** Checked before anything is created: TTL/hop limit ≤ 1 → `Drop(TtlExceeded)`
//!   (no ICMP time-exceeded is generated). Forwarded frames leave with TTL − 1.
//! - **ICMP echo** (and every other ICMP non-error) → [`Verdict::Pass`]: the kernel answers for
//!   a VIP it holds, or ignores it. ICMP errors about a NATed flow are translated; other ICMP
//!   errors are passed.
//! - **New flows.** TCP needs SYN without ACK/RST, SCTP an INIT chunk; anything else without a
//!   flow is `Drop(NoFlow)`, except for `mh` services which schedule it anyway (consistent
//!   hashing picks the backend a peer or a restarted node picked). UDP always creates.
//! - **State guard** ([`guard`]): a TCP SYN, FIN or RST that finds a flow moves its state only
//!   when its checksum verifies and, for an RST, its sequence number lies in the window of
//!   its direction's last sample; otherwise it is forwarded without the state change and
//!   counted in [`Counters::held`].
//! - **Port reuse** (IPVS `conn_reuse_mode = 1`): a SYN without ACK/RST/FIN from the client
//!   (SCTP: an INIT) on a flow in TIME_WAIT or CLOSE (SCTP: closing) ends that flow and is
//!   scheduled as a new one (`reuse`). Other SYNs on a flow follow it.
//! - **SNAT ports** (fullnat): a per-worker cursor walks the worker's slice of
//!   `snat_port_range`, from a random place each run (`PipelineConfig::snat_start`: a run
//!   that lost the last one's flows does not hand its ports out again in the same order); the flow table's insert refuses a reply tuple already in use, and the
//!   next port is tried (at most [`SNAT_TRIES`]). A port is therefore "released" as soon as
//!   its flow leaves the table (expiry, removal, recycling): nothing to return.
//! - **Fragments**: see [`frag`]. SCTP fragments are dropped (`SctpFragment`): the CRC32c
//!   covers the whole datagram and cannot be fixed from the first fragment.
//! - **Router hygiene** (see `hygiene`): new flows and translated ICMP errors from martian
//!   sources or from xvs's own addresses (VIPs, SNAT addresses) are dropped, as are ICMP
//!   errors to martian destinations; checksums that are recomputed from scratch (ICMP, SCTP)
//!   are verified first, every other one is updated incrementally, so a corrupt input never
//!   leaves with a valid checksum; later fragments reaching past 65,535 bytes are dropped.
//!   Flow hits are not checked again (their sources passed when the flow was made), and a
//!   frame for no frontend stays `Pass` (but see the next rule).
//! - **Rejects** ([`reject`]): a new flow whose service has no usable backend is answered
//!   ([`Verdict::Reject`]: a TCP RST, an ICMP/ICMPv6 port unreachable) when the service says
//!   so (`NoEndpoints::Reject`), dropped (`NoBackend`) otherwise; a packet for no frontend
//!   to a ClusterIP is rejected (`UnservedPort`), one to another address inside a Service
//!   CIDR dropped (`ServiceCidr`); both after the source checks and the TTL. Rejects are
//!   rate-limited per worker (`RejectRateLimited`) and counted in [`Counters::rejects`].
//! - **Direct server return** ([`dsr`]): a DSR service's packets leave unchanged inside an
//!   encapsulation (IPIP, GUE) or with only their MACs changed (L2), TTL included; their
//!   flows see the client's direction only. They take the general path (the IPv4
//!   shortcut's lookup skips their flows, its new-flow path hands them over before
//!   scheduling); a packet too big once encapsulated is answered as a reject
//!   (`PacketTooBig`) or dropped (`TooBig`).

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use flowtable::{Direction, FlowHandle, FlowHit, FlowTable, Tick, V4Hit, V4Key};
use lb_algos::AffinityTable;
use vocab::TcpFlags;

use crate::flowlog::{FlowEvent, FlowLog};
use crate::passive::SynWatch;
use crate::snapshot::Snapshot;
use crate::traffic::Traffic;

mod batch;
pub(crate) mod classify;
mod create;
pub mod dsr;
pub(crate) mod fast;
pub mod frag;
mod general;
pub mod guard;
mod hygiene;
pub(crate) mod icmp;
mod invariants;
pub(crate) mod nat;
mod next_hop;
mod reject;
mod reuse;
mod settings;
pub mod snat;
pub mod synproxy;

pub use batch::{FrameBatch, STAGE_DISTANCE, WAITING_MAX};
pub use dsr::{DsrSettings, FLAG_DSR};
use general::l4_protocol;
pub(crate) use general::{flow_key, key_of};
pub use guard::HoldReason;
use next_hop::{NH_CACHE_SLOTS, NhSlot};
pub use reject::RejectReason;
pub use settings::{DEFAULT_MAC, PipelineConfig};
pub use synproxy::CookieKey;

/// Ports tried for one new fullnat flow before giving up with `SnatPortsExhausted`.
pub const SNAT_TRIES: usize = 16;

/// What to do with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Transmit the (rewritten) frame on this port.
    Tx(u16),
    /// Drop it, counting why.
    Drop(DropReason),
    /// Not ours: hand it to the kernel (XDP_PASS).
    Pass,
    /// Answered in its stead: the frame was rewritten into a reject (a TCP RST, an ICMP or
    /// ICMPv6 port unreachable, a DSR packet's fragmentation needed or packet too big) to
    /// its sender, to transmit on `port` (see [`reject`]).
    Reject {
        /// Why, counted in [`Counters::rejects`].
        reason: RejectReason,
        /// The transmit port (the client's next hop's).
        port: u16,
    },
    /// Ours but needs the slowpath (unresolved next hop); frame unmodified.
    Slow,
}

impl Verdict {
    /// `"tx"`, `"drop"`, `"pass"`, `"reject"` or `"slow"`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Tx(_) => "tx",
            Verdict::Drop(_) => "drop",
            Verdict::Pass => "pass",
            Verdict::Reject { .. } => "reject",
            Verdict::Slow => "slow",
        }
    }

    /// The port a transmitted frame leaves by: a forwarded one's or a reject's.
    #[inline]
    pub fn tx_port(self) -> Option<u16> {
        match self {
            Verdict::Tx(port) | Verdict::Reject { port, .. } => Some(port),
            _ => None,
        }
    }
}

macro_rules! drop_reasons {
    ($( $(#[doc = $doc:literal])* $variant:ident = $name:literal, )*) => {
        /// Why a frame was dropped; indexes [`Counters::drops`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum DropReason {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl DropReason {
            /// Every reason, in counter-index order.
            pub const ALL: &'static [DropReason] = &[$(DropReason::$variant,)*];
            /// Number of reasons (size of the counter array).
            pub const COUNT: usize = Self::ALL.len();

            /// A stable snake_case name (metrics label, pcap report).
            pub const fn name(self) -> &'static str {
                match self {
                    $( DropReason::$variant => $name, )*
                }
            }
        }
    };
}

drop_reasons! {
    /// A header, or the frame, is shorter than its fields say.
    Truncated = "truncated",
    /// IPv4 IHL below 5.
    BadIhl = "bad_ihl",
    /// An IP or UDP length field is inconsistent.
    BadLength = "bad_length",
    /// The IP version nibble does not match the EtherType.
    BadVersion = "bad_version",
    /// The IPv4 header checksum is wrong.
    BadIpChecksum = "bad_ip_checksum",
    /// TCP data offset out of range.
    BadL4Header = "bad_l4_header",
    /// Too many IPv6 extension headers.
    TooManyExtHeaders = "too_many_ext_headers",
    /// Some other malformed header.
    Malformed = "malformed",
    /// UDP over IPv6 with a zero checksum (invalid, RFC 8200).
    UdpZeroChecksumV6 = "udp_zero_checksum_v6",
    /// TTL or hop limit would reach zero.
    TtlExceeded = "ttl_exceeded",
    /// A TCP non-SYN (SCTP non-INIT) for a frontend without a flow.
    NoFlow = "no_flow",
    /// The service has no backend that may take a new flow.
    NoBackend = "no_backend",
    /// The flow table refused the new flow (full, or its index cluster is).
    FlowTableFull = "flow_table_full",
    /// fullnat service but no SNAT address of the packet's family.
    NoSnatAddress = "no_snat_address",
    /// Every SNAT port tried was in use towards this backend.
    SnatPortsExhausted = "snat_ports_exhausted",
    /// nat mode: the reply tuple (backend → client) is used by another flow.
    ReplyTupleInUse = "reply_tuple_in_use",
    /// A later fragment whose first fragment was not seen (or expired).
    FragmentNoMatch = "fragment_no_match",
    /// A fragmented SCTP packet (its CRC32c cannot be fixed).
    SctpFragment = "sctp_fragment",
    /// A new flow from a client outside the service's `loadBalancerSourceRanges`.
    SourceRange = "source_range",
    /// A new flow while new flows are refused (the freeze switch, global or per service).
    Frozen = "frozen",
    /// A new flow over the service's new-connection rate limit.
    RateLimited = "rate_limited",
    /// A new flow, or an ICMP error about a flow, from a source no host may use (IPv4 0/8,
    /// 127/8, multicast, 240/4 with broadcast; IPv6 `::`, `::1`, multicast, IPv4-mapped).
    MartianSource = "martian_source",
    /// A new flow, or an ICMP error about a flow, from one of xvs's own addresses (a VIP, a
    /// SNAT address): spoofed.
    OwnAddressSource = "own_address_source",
    /// An ICMP error about a flow sent to an address no unicast packet may go to.
    MartianDestination = "martian_destination",
    /// An ICMP or ICMPv6 error about a flow with a wrong checksum (it would be recomputed).
    BadIcmpChecksum = "bad_icmp_checksum",
    /// An SCTP packet, or one an ICMP error quotes whole, with a wrong CRC32c (it would be
    /// recomputed).
    BadSctpChecksum = "bad_sctp_checksum",
    /// A later fragment reaching past 65,535 bytes of its datagram.
    OversizedFragment = "oversized_fragment",
    /// SYN proxy: an ACK without a flow whose acknowledgment is no valid cookie of ours
    /// (forged, or older than two minutes) while the proxy is engaged.
    SynCookieInvalid = "syn_cookie_invalid",
    /// SYN proxy: a packet of a proxied flow before the backend's handshake completed
    /// (client data is retransmitted).
    SynproxyPending = "synproxy_pending",
    /// SYN proxy: a valid cookie's SYN to the backend did not fit the frame's buffer (only
    /// through `process`, whose frames cannot grow; never in the workers).
    SynproxyNoRoom = "synproxy_no_room",
    /// SYN proxy: the backend's SYN-ACK, which the proxy answers itself, failed the state
    /// guard (a wrong TCP checksum, or a first fragment): its receiver, xvs, drops it. Also
    /// a TCP segment xvs would answer with a reject whose checksum is wrong: a host does not
    /// answer what it cannot verify.
    BadTcpChecksum = "bad_tcp_checksum",
    /// A UDP datagram xvs would answer with a reject (ICMP port unreachable) whose checksum
    /// is wrong.
    BadUdpChecksum = "bad_udp_checksum",
    /// A reject ([`Verdict::Reject`]) over the worker's reject rate limit (`[dataplane]
    /// reject_rate`, `reject_burst`): dropped silently instead.
    RejectRateLimited = "reject_rate_limited",
    /// A packet to an address inside a Service CIDR that no Service has (kube-proxy's
    /// "unallocated ClusterIP").
    ServiceCidr = "service_cidr",
    /// A reject's ICMP error did not fit the frame's buffer (only through `process`, whose
    /// frames cannot grow; never in the workers).
    RejectNoRoom = "reject_no_room",
    /// A DSR packet's encapsulation did not fit the frame's buffer (through `process`, whose
    /// frames cannot grow; in the workers, only an encapsulated frame longer than a UMEM
    /// frame).
    EncapNoRoom = "encap_no_room",
    /// A DSR packet too big for `[dataplane] dsr_mtu` once encapsulated that may not be
    /// answered: IPv4 without DF (a fragment among them), or an ICMP error about a flow.
    TooBig = "too_big",
    /// A DSR packet (`ipip`, `gue`) of a family without an outer source address (`[node]
    /// addresses`, `[dataplane] snat_addresses` or `ipip_source_prefix`).
    NoEncapSource = "no_encap_source",
    /// An `l2` DSR packet whose backend is reached through a gateway: only the MACs change,
    /// so the backend must be on the link.
    DsrNotOnLink = "dsr_not_on_link",
}

/// What `schedule` answers for a packet the SYN proxy takes (its callers hand the frame
/// over; the same value is the proxy's answer to an ACK it cannot grow into a SYN).
const SYNPROXY: Verdict = Verdict::Drop(DropReason::SynproxyNoRoom);

/// Per-pipeline counters; the slowpath sums them over workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counters {
    /// Drops, indexed by `DropReason as usize`.
    pub drops: [u64; DropReason::COUNT],
    /// Rejects sent (frames answered with an RST or a port unreachable, transmitted but not
    /// in `tx`), indexed by `RejectReason as usize`.
    pub rejects: [u64; RejectReason::COUNT],
    /// Frames transmitted.
    pub tx: u64,
    /// Frames passed to the kernel.
    pub pass: u64,
    /// Frames sent to the slowpath.
    pub slow: u64,
    /// Flows this pipeline inserted.
    pub new_flows: u64,
    /// Flows ended by a new connection on their tuple (port reuse: a client's SYN on TIME_WAIT
    /// or CLOSE, an INIT on a closing SCTP association); the new flow, when one is made, is
    /// counted in `new_flows` too.
    pub reused: u64,
    /// ICMP errors translated.
    pub icmp_translated: u64,
    /// Later fragments forwarded through the fragment table.
    pub fragments_forwarded: u64,
    /// SYN proxy: SYN-ACKs with a cookie sent to clients.
    pub synproxy_syns: u64,
    /// SYN proxy: client ACKs with a valid cookie that opened a backend connection (a flow,
    /// also counted in `new_flows`).
    pub synproxy_acks: u64,
    /// Packets of known flows forwarded without the state change they asked for (the state
    /// guard, `guard`), indexed by `HoldReason as usize`; also counted in `tx`.
    pub held: [u64; HoldReason::COUNT],
}

// (Written out: `Default` is derived for arrays of at most 32 elements.)
impl Default for Counters {
    fn default() -> Self {
        Counters {
            drops: [0; DropReason::COUNT],
            rejects: Default::default(),
            tx: Default::default(),
            pass: Default::default(),
            slow: Default::default(),
            new_flows: Default::default(),
            reused: Default::default(),
            icmp_translated: Default::default(),
            fragments_forwarded: Default::default(),
            synproxy_syns: Default::default(),
            synproxy_acks: Default::default(),
            held: Default::default(),
        }
    }
}

impl Counters {
    /// The drop count for one reason.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }

    /// All drops.
    pub fn drops_total(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// The reject count for one reason.
    pub fn rejected(&self, reason: RejectReason) -> u64 {
        self.rejects[reason as usize]
    }

    /// All rejects.
    pub fn rejects_total(&self) -> u64 {
        self.rejects.iter().sum()
    }
}

/// Whether a verdict says the frame needs room to grow (the SYN proxy's SYN to a backend, a
/// reject's ICMP error, a DSR packet's encapsulation): a caller with room runs it again with
/// it.
#[inline(always)]
fn wants_room(v: Verdict) -> bool {
    v == SYNPROXY || v == reject::NO_ROOM || v == dsr::ENCAP
}

/// Bit in `FlowData::flags`: the flow is full-NAT.
pub(crate) const FLAG_FULLNAT: u8 = 1;
/// Bit in `FlowData::flags`: the flow was opened by the SYN proxy (its sequence word holds
/// the handshake's state, then the delta). It is the flow table's `FLAG_SLOW`: the IPv4
/// shortcut's lookup does not find such flows, so its hits pay nothing for them; its misses
/// look again ([`Pipeline::proxied_miss`]) once the table ever held one.
pub(crate) const FLAG_SYNPROXY: u8 = flowtable::FLAG_SLOW;

/// Bit in `FlowData::flags`: the flow was installed from a peer of the tier (flow sync);
/// the pipeline forwards it like any other, flow sync tells its copies from its own flows.
pub const FLAG_PEER: u8 = 2;

/// A clock reading as the per-packet path takes it: an [`Instant`], or the flow table's
/// [`Tick`] for it (which a batch computes once).
trait Now: Copy {
    /// The flow table's time.
    fn tick(self, p: &mut Pipeline) -> Tick;
}

impl Now for Instant {
    #[inline(always)]
    fn tick(self, p: &mut Pipeline) -> Tick {
        p.tick(self)
    }
}

impl Now for Tick {
    #[inline(always)]
    fn tick(self, _: &mut Pipeline) -> Tick {
        self
    }
}

/// A clock reading and the flow table's time for it, computed once for the frames that share
/// the reading ([`Pipeline::clock`], [`Pipeline::process_at`]). Of one flow table: a pipeline
/// sharing another table (another epoch) would read another time from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    now: Instant,
    tick: Tick,
}

impl Clock {
    /// The clock reading.
    pub fn instant(&self) -> Instant {
        self.now
    }
}

/// One worker's packet pipeline.
pub struct Pipeline {
    config: PipelineConfig,
    flows: Arc<FlowTable>,
    affinity: Arc<AffinityTable>,
    snapshot: Arc<Snapshot>,
    snat: snat::SnatPorts,
    frags: frag::FragTable,
    counters: Counters,
    /// Resolved next hops of the current snapshot (routes + neighbour hash lookups cost more
    /// than the rest of an established packet), emptied when another snapshot is set. Only
    /// hits are cached.
    nh_cache: Box<[NhSlot; NH_CACHE_SLOTS]>,
    /// The last `now` seen and its flow-table tick (the clock is the same for a whole batch).
    tick_now: Instant,
    tick: Tick,
    /// Passive health counters (SYNs sent, SYN-ACKs seen per backend), when watched.
    syn_watch: Option<Arc<SynWatch>>,
    /// New flows half inserted by `process_batch` (empty between calls).
    waiting: batch::Waiting,
    /// Whether the SYN proxy's `auto` setting is engaged (embryonic flows above the
    /// threshold, until below half of it).
    synproxy_auto: Cell<bool>,
    /// Where flow events go for the tier's flow sync, when it is on.
    log: Option<Arc<FlowLog>>,
    /// Per-backend connections, packets and bytes ([`crate::traffic`]).
    traffic: Arc<Traffic>,
    /// The rejects' state ([`reject`]), boxed: only the miss path reads it.
    rejects: Box<reject::RejectState>,
    /// The DSR state ([`dsr`]), boxed: only DSR packets read it.
    dsr: Box<dsr::DsrState>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("config", &self.config)
            .field("generation", &self.snapshot.generation)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// A pipeline over the shared tables; allocates its fragment table now.
    pub fn new(
        config: PipelineConfig,
        flows: Arc<FlowTable>,
        affinity: Arc<AffinityTable>,
        snapshot: Arc<Snapshot>,
    ) -> Self {
        let snat = snat::SnatPorts::new(config.snat_ports.0, config.snat_ports.1)
            .starting_at(config.snat_start);
        let frags = frag::FragTable::new(config.fragments_max, config.fragment_timeout);
        let tick_now = flows.epoch();
        let reject_limit = config.reject_limit;
        let tick = flows.tick(tick_now);
        let traffic = Traffic::new();
        Pipeline {
            config,
            flows,
            affinity,
            snapshot,
            snat,
            frags,
            counters: Counters::default(),
            nh_cache: next_hop::empty_cache(),
            tick_now,
            tick,
            syn_watch: None,
            waiting: batch::Waiting::new(),
            synproxy_auto: Cell::new(false),
            log: None,
            traffic,
            rejects: Box::new(reject::RejectState::new(reject_limit, tick_now)),
            dsr: Box::new(dsr::DsrState::new()),
        }
    }

    /// This pipeline's per-backend traffic counters (the slowpath sums them over workers).
    pub fn traffic(&self) -> &Arc<Traffic> {
        &self.traffic
    }

    /// Records the flows this pipeline creates and the state changes it makes in `log`
    /// (flow sync between the peers of a tier). State changes are recorded by the flow
    /// table into the log of the thread that makes them: this sets it for the calling
    /// thread, and a worker sets it again on its own ([`Pipeline::enter_thread`]).
    pub fn set_flow_log(&mut self, log: Arc<FlowLog>) {
        flowtable::log::set_thread_log(Some(Arc::clone(&log)));
        self.log = Some(log);
    }

    /// Call on the thread that will run this pipeline (a worker does at its start): the
    /// flow table's state changes on it go to this pipeline's flow log.
    pub fn enter_thread(&self) {
        flowtable::log::set_thread_log(self.log.clone());
    }

    /// The flow log, when flow sync is on.
    pub fn flow_log(&self) -> Option<&Arc<FlowLog>> {
        self.log.as_ref()
    }

    /// A flow this pipeline inserted, for the flow log.
    #[inline(always)]
    fn log_created(&self, h: FlowHandle) {
        if let Some(log) = &self.log {
            log.record(FlowEvent::Created(h));
        }
    }

    /// Counts SYNs sent to and SYN-ACKs seen from each backend into `watch` (passive health
    /// checks); shared by every worker.
    pub fn set_syn_watch(&mut self, watch: Arc<SynWatch>) {
        self.syn_watch = Some(watch);
    }

    /// Swaps in a new snapshot (once per batch). Existing flows keep their backends.
    pub fn set_snapshot(&mut self, snapshot: Arc<Snapshot>) {
        if !Arc::ptr_eq(&self.snapshot, &snapshot) {
            // Slots are keyed by the address alone (an IPv4 one compares one word a packet).
            next_hop::empty_all(&mut self.nh_cache);
        }
        self.snapshot = snapshot;
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> &Arc<Snapshot> {
        &self.snapshot
    }

    /// The shared flow table.
    pub fn flows(&self) -> &Arc<FlowTable> {
        &self.flows
    }

    /// This worker's settings.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// Counters since creation.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Processes one frame in place. See the module docs for the rules. The frame cannot
    /// grow: a client ACK that the SYN proxy would turn into a SYN to a backend is dropped
    /// (`SynproxyNoRoom`), and so are a reject whose ICMP error does not fit
    /// (`RejectNoRoom`) and a DSR packet to encapsulate (`EncapNoRoom`);
    /// [`process_frame`](Self::process_frame) has room.
    #[inline]
    pub fn process(&mut self, frame: &mut [u8], now: Instant) -> Verdict {
        let clock = self.clock_cached(now);
        self.process_at(frame, clock)
    }

    /// [`process`](Self::process) at a [`Clock`] reading (from [`clock`](Self::clock)), for
    /// a caller that reads the clock once for several frames: the same verdicts, bytes and
    /// counters as `process(frame, clock.instant())`, without comparing the reading with the
    /// last one per frame.
    #[inline]
    pub fn process_at(&mut self, frame: &mut [u8], clock: Clock) -> Verdict {
        #[cfg(debug_assertions)]
        let counted = invariants::counted(&self.counters);
        let v = self.run(frame, clock);
        #[cfg(debug_assertions)]
        self.debug_check(counted, 1, frame, v);
        v
    }

    /// `now` as a [`Clock`] of this pipeline's flow table, for
    /// [`process_at`](Self::process_at).
    pub fn clock(&self, now: Instant) -> Clock {
        Clock {
            now,
            tick: self.flows.tick(now),
        }
    }

    /// [`clock`](Self::clock) through the tick of the last reading (the clock is the same
    /// for a whole batch).
    #[inline(always)]
    fn clock_cached(&mut self, now: Instant) -> Clock {
        Clock {
            now,
            tick: self.tick(now),
        }
    }

    /// The [`invariants`] of one call that processed `frames` frames, `counted` before it;
    /// the last frame `frame` got verdict `v`.
    #[cfg(debug_assertions)]
    fn debug_check(&self, counted: u64, frames: u64, frame: &[u8], v: Verdict) {
        debug_assert_eq!(
            invariants::counted(&self.counters),
            counted + frames,
            "every frame is counted once"
        );
        debug_assert!(
            invariants::verdict_ok(frame, v),
            "a transmitted frame parses: {v:?} {frame:02x?}"
        );
    }

    /// [`process`](Self::process) for the frame `buf[..*len]` in a buffer that may hold a
    /// longer one: the SYN proxy's SYN to a backend (12 bytes longer than the client's ACK),
    /// a reject's ICMP error (28 or 48 bytes longer than what it quotes) and a DSR packet's
    /// encapsulation (20 to 48 bytes) are made there, and `*len` set to the frame's new
    /// length for a `Tx` or `Reject` verdict.
    pub fn process_frame(&mut self, buf: &mut [u8], len: &mut usize, now: Instant) -> Verdict {
        #[cfg(debug_assertions)]
        let counted = invariants::counted(&self.counters);
        let n = (*len).min(buf.len());
        let clock = self.clock_cached(now);
        let v = self.run(&mut buf[..n], clock);
        if !wants_room(v) || buf.len() <= n {
            let mut end = n;
            if let Verdict::Reject { .. } = v {
                (*len, end) = (self.rejects.len, self.rejects.len);
            }
            #[cfg(debug_assertions)]
            self.debug_check(counted, 1, &buf[..end], v);
            let _ = end;
            return v;
        }
        let (v, new_len) = self.with_room(buf, n, v, now);
        if v.tx_port().is_some() {
            *len = new_len;
        }
        let v = self.count(v);
        #[cfg(debug_assertions)]
        self.debug_check(counted, 1, &buf[..*len], v);
        v
    }

    /// A frame `buf[..n]` whose counted verdict `v` asked for room ([`wants_room`]): again,
    /// with the room of `buf` (the first verdict uncounted): the verdict, uncounted, and the
    /// frame's length.
    #[cold]
    #[inline(never)]
    fn with_room(
        &mut self,
        buf: &mut [u8],
        n: usize,
        v: Verdict,
        now: Instant,
    ) -> (Verdict, usize) {
        if let Verdict::Drop(r) = v {
            self.counters.drops[r as usize] -= 1;
        }
        if v == dsr::ENCAP {
            return self.encap_room(buf, n);
        }
        // An ACK with a valid cookie (its SYN to the backend), or a reject's ICMP error.
        let (v, len) = if v == SYNPROXY {
            self.synproxy_grow(buf, n, true, now)
        } else {
            (v, n)
        };
        if v == reject::NO_ROOM {
            return self.reject_again(buf, n, now);
        }
        (v, len)
    }

    /// A DSR packet's encapsulation ([`dsr::ENCAP`]) written into the frame `buf[..n]`: the
    /// verdict, uncounted, and the frame's length.
    #[cold]
    #[inline(never)]
    fn encap_room(&mut self, buf: &mut [u8], n: usize) -> (Verdict, usize) {
        match self.encap_apply(buf, n) {
            Some(len) => (Verdict::Tx(self.dsr.pending_port()), len),
            None => (dsr::ENCAP, n),
        }
    }

    /// [`process`](Self::process) without the fixed-offset shortcut ([`fast`]): every frame
    /// through the general path (`classify`, then the flow lookup by [`FlowKey`], `forward`
    /// or `new_flow`). For tests and benches only (the equivalence property test runs each
    /// frame both ways and compares verdicts, bytes and flows); workers call `process`. A
    /// separate entry, so `process` carries no switch for it.
    ///
    /// [`FlowKey`]: flowtable::FlowKey
    #[doc(hidden)]
    pub fn process_general(&mut self, frame: &mut [u8], now: Instant) -> Verdict {
        let v = self.run_general(frame, now);
        self.count(v)
    }

    /// [`process_frame`](Self::process_frame) through the general path only, as
    /// [`process_general`](Self::process_general) is `process`'s. For tests and benches.
    #[doc(hidden)]
    pub fn process_frame_general(
        &mut self,
        buf: &mut [u8],
        len: &mut usize,
        now: Instant,
    ) -> Verdict {
        let n = (*len).min(buf.len());
        let v = self.process_general(&mut buf[..n], now);
        if !wants_room(v) || buf.len() <= n {
            if let Verdict::Reject { .. } = v {
                *len = self.rejects.len;
            }
            return v;
        }
        let (v, new_len) = self.with_room(buf, n, v, now);
        if v.tx_port().is_some() {
            *len = new_len;
        }
        self.count(v)
    }

    #[inline(always)]
    fn count(&mut self, v: Verdict) -> Verdict {
        match v {
            Verdict::Tx(_) => self.counters.tx += 1,
            Verdict::Drop(r) => self.counters.drops[r as usize] += 1,
            Verdict::Pass => self.counters.pass += 1,
            Verdict::Reject { reason, .. } => self.counters.rejects[reason as usize] += 1,
            Verdict::Slow => self.counters.slow += 1,
        }
        v
    }

    /// One frame, counted.
    #[inline(always)]
    fn run(&mut self, frame: &mut [u8], clock: Clock) -> Verdict {
        if let Some(v) = fast::parse(frame) {
            // One copy of the known flow's path per protocol, each with its protocol, its
            // checksum's place (and UDP's flags, 0) a constant: a TCP segment tests nothing
            // of UDP's, and its key's protocol is no register.
            return if v.proto == classify::PROTO_TCP {
                let v = fast::V4 {
                    csum_at: fast::TCP_CSUM_AT,
                    proto: classify::PROTO_TCP,
                    protocol: flowtable::Protocol::Tcp,
                    ..v
                };
                let key = self.flows.v4_key_tcp(v.addrs, v.ports);
                self.run_v4(frame, v, key, clock)
            } else {
                let v = fast::V4 {
                    csum_at: fast::UDP_CSUM_AT,
                    proto: classify::PROTO_UDP,
                    protocol: flowtable::Protocol::Udp,
                    flags: 0,
                    ..v
                };
                let key = self.flows.v4_key_udp(v.addrs, v.ports);
                self.run_v4(frame, v, key, clock)
            };
        }
        let v = self.run_general(frame, clock.now);
        self.count(v)
    }

    /// The common case ([`fast`]), counted: a known flow is forwarded without building a
    /// [`Packet`]; anything else continues as the general path would after `classify`.
    ///
    /// [`Packet`]: classify::Packet
    #[inline(always)]
    fn run_v4(&mut self, frame: &mut [u8], v: fast::V4, key: V4Key, clock: Clock) -> Verdict {
        let Some(hit) = self.flows.lookup_v4(&key) else {
            return self.miss_v4(frame, key, clock.now);
        };
        // The flags byte read from the frame again here, not held across the probe (the
        // parse's read is then dead).
        let v = fast::V4 {
            flags: if v.proto == classify::PROTO_TCP {
                frame[fast::L4 + 13]
            } else {
                0
            },
            ..v
        };
        // Inline only the common segment, an ACK without SYN, FIN or RST: one test, which also
        // tells the touch below its flags (the flow table's shortcut). The guarded ones, and
        // the rare segments without ACK, go out of line, to the same verdicts.
        if v.proto == classify::PROTO_TCP && TcpFlags(v.flags).events() != TcpFlags::ACK {
            return self.guarded_v4(frame, clock.now);
        }
        self.forward_v4::<true>(frame, &v, &hit, clock.tick)
    }

    /// [`run_v4`](Self::run_v4) for a TCP segment that found a flow and is not a plain ACK
    /// (a SYN, FIN or RST, or a segment without ACK), counted: through the state guard
    /// ([`known_v4`](Self::known_v4)), then a new flow if a SYN reopened its tuple. Given
    /// only the frame (parsed and looked up again) so that the hit path keeps nothing across
    /// the call.
    #[cold]
    #[inline(never)]
    fn guarded_v4(&mut self, frame: &mut [u8], now: Instant) -> Verdict {
        let Some(v) = fast::parse(frame) else {
            // (Not reached: the frame is as `fast::parse` accepted it.)
            let verdict = self.run_general(frame, now);
            return self.count(verdict);
        };
        let key = self.flows.v4_key(v.protocol, v.addrs, v.ports);
        if let Some(hit) = self.flows.lookup_v4(&key)
            && let Some(verdict) = self.known_v4(frame, &v, &hit, now)
        {
            return verdict;
        }
        // (Through `miss_v4`, so that `new_flow_v4` keeps one caller, inlined in it.)
        self.miss_v4(frame, key, now)
    }

    /// A fast-path frame `v` of a known flow (`hit`) that may be guarded (SYN, FIN, RST),
    /// counted: forwarded without a state change when the state guard holds it, else
    /// forwarded as usual; `None` when it is a SYN that ended the flow (`reuse`), which
    /// then takes the new-flow path.
    #[cold]
    #[inline(never)]
    fn known_v4(
        &mut self,
        frame: &mut [u8],
        v: &fast::V4,
        hit: &V4Hit,
        now: Instant,
    ) -> Option<Verdict> {
        if v.proto == classify::PROTO_TCP && guard::guarded(v.flags) {
            let s = guard::Segment {
                l3: fast::L3,
                l4: fast::L4,
                l4_len: usize::from(v.ip_len).saturating_sub(fast::L4 - fast::L3),
                v6: false,
                fragment: false,
            };
            if let Some(r) = self.guard(frame, &s, v.flags, hit.handle(), hit.dir()) {
                self.counters.held[r as usize] += 1;
                return Some(self.forward_v4::<false>(frame, v, hit, now));
            }
        }
        if reuse::reopens(v.flags) && self.reopen(hit.handle(), hit.dir()) {
            return None;
        }
        Some(self.forward_v4::<true>(frame, v, hit, now))
    }

    /// A SYN found flow `h` in direction `dir`: removes the flow when the SYN is the client's
    /// and the flow has ended (`reuse`), and says so.
    #[cold]
    #[inline(never)]
    fn reopen(&mut self, h: FlowHandle, dir: Direction) -> bool {
        dir == Direction::Original && self.ended(h) && self.end(h)
    }

    /// A fast-path frame `v` of a known flow (`hit`) that the SYN proxy did not open (the
    /// callers send those to [`proxied_v4`](Self::proxied_v4)), counted; `TOUCH`: its state
    /// change and time are recorded (not for a packet the state guard holds). `now` is the
    /// batch's clock reading, or its flow-table time already (a batch's caller converts it
    /// once).
    #[inline(always)]
    fn forward_v4<const TOUCH: bool>(
        &mut self,
        frame: &mut [u8],
        v: &fast::V4,
        hit: &V4Hit,
        now: impl Now,
    ) -> Verdict {
        // (`fast::parse` left frames whose TTL expires to the general path.)
        let Some(nh) = self.next_hop_v4(hit.dst()) else {
            return self.count(Verdict::Slow);
        };
        // From here on the verdict is Tx: the MACs go in first, straight from the slot.
        let port = nh.nh.port;
        frame[..12].copy_from_slice(&nh.macs);
        if TOUCH {
            let tick = now.tick(self);
            self.touch_v4(hit, v.flags, frame, tick);
        }
        nat::rewrite_v4_delta(
            frame,
            fast::L3,
            fast::L4,
            usize::from(v.csum_at),
            hit.addrs(),
            hit.ports,
            hit.csum_delta,
        );
        self.traffic.packet(
            hit.backend_id(),
            hit.dir() == Direction::Reply,
            usize::from(v.ip_len),
        );
        self.count(Verdict::Tx(port))
    }

    /// Whether a fast-path frame (`v`, `key`) whose shortcut lookup missed belongs to a flow
    /// that lookup skips (one the SYN proxy opened, a DSR flow): once the table ever held
    /// one, a miss looks again with the general lookup (the index slots are warm).
    #[inline(always)]
    pub(super) fn proxied_miss(&self, _v: &fast::V4, key: &V4Key) -> bool {
        self.flows.has_slow_flows() && self.proxied_flow(key)
    }

    /// [`proxied_miss`](Self::proxied_miss)'s second look.
    #[cold]
    #[inline(never)]
    fn proxied_flow(&self, key: &V4Key) -> bool {
        self.flows.lookup_hit(&key.key()).is_some()
    }

    /// [`run_v4`](Self::run_v4) without a flow, counted. Kept out of line and given only the
    /// key (the rest is read again from the frame; the key, not hashed again), so that the
    /// hit path keeps the parsed fields in registers (and counts nothing but `Tx`). The key
    /// by value: by reference it was stored to memory before every probe, a hit's too
    /// (established 236.5 -> 228.5 a frame at batch 1; a SYN, which now copies it at the
    /// call, 951.2 -> 957.4). Cold:
    /// laid out for the hit, the frame-by-frame loop spends no jump per established packet
    /// (`benches/callgrind.sh`: established 254.5 to 253.5, a SYN 1.7 dearer).
    #[cold]
    #[inline(never)]
    fn miss_v4(&mut self, frame: &mut [u8], key: V4Key, now: Instant) -> Verdict {
        let v = fast::V4::reread(frame, key.addrs(), key.ports());
        let verdict = if self.proxied_miss(&v, &key) {
            // (The general path finds the flow, translates, or reopens it.)
            self.run_general(frame, now)
        } else {
            self.new_flow_v4(frame, &v, &key, now)
        };
        self.count(verdict)
    }

    /// The flow table's time for `now` (the clock is the same for a whole batch).
    #[inline(always)]
    fn tick(&mut self, now: Instant) -> Tick {
        if now != self.tick_now {
            self.tick_now = now;
            self.tick = self.flows.tick(now);
        }
        self.tick
    }

    /// The flow table's state update for a packet of a known flow whose L4 header is at `l4`
    /// of `frame` (its TCP sequence number is the direction's sample when the update
    /// writes, see `guard`).
    #[inline(always)]
    fn touch(&mut self, hit: &FlowHit, flags: u8, frame: &[u8], l4: usize, now: Instant) {
        let tick = self.tick(now);
        self.flows.touch(hit, flowtable::TcpFlags(flags), tick, || {
            guard::word_at(frame, l4 + 4)
        });
        self.answered(flags, hit.backend_id());
    }

    /// [`touch`](Self::touch) for a [`V4Hit`] of a fast-path frame, at `tick` (see
    /// [`tick`](Self::tick)).
    #[inline(always)]
    fn touch_v4(&self, hit: &V4Hit, flags: u8, frame: &[u8], tick: Tick) {
        self.flows
            .touch_v4(hit, flowtable::TcpFlags(flags), tick, || {
                guard::word_at(frame, fast::L4 + 4)
            });
        // (Tested as the flow table's shortcut tests it: a pure ACK is no SYN-ACK.)
        if TcpFlags(flags).events() != TcpFlags::ACK {
            self.answered(flags, hit.backend_id());
        }
    }

    /// A SYN-ACK: the backend answered a connection (passive health).
    #[inline(always)]
    fn answered(&self, flags: u8, backend: lb_algos::BackendId) {
        if TcpFlags(flags).contains(TcpFlags::SYN | TcpFlags::ACK)
            && let Some(w) = &self.syn_watch
        {
            w.answered(backend);
        }
    }
}
