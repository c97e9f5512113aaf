//! Flow sync between the nodes of a tier (`[sync]`): every node sends the flows its
//! workers create, the state changes they make and the flows their sweeps end to every
//! peer, and installs what its peers send into its own flow table, as flows it can serve
//! the moment ECMP moves their packets to it (replies to a peer's SNAT address included:
//! the steering takes them, `[bgp]` announces them as backups).
//!
//! - **Sending.** Every `interval` the task drains the workers' [`FlowLog`]s, reads each
//!   logged flow from the table (its state now; a flow gone since is skipped), and sends
//!   them in datagrams of [`wire::FLOWS_PER_DATAGRAM`] flows, ends in their own. Every
//!   `refresh` it sends again every flow of its own that was active in the last period,
//!   so a peer's copy lives as long as the flow (a peer's copy is never refreshed by a
//!   node that does not own it, so copies do not echo between peers).
//! - **Pacing.** At most `max_messages_per_second` datagrams a second leave; what waits
//!   is queued (bounded: beyond [`QUEUE_MAX`] datagrams new ones are dropped and counted;
//!   the next refresh sends their flows again).
//! - **Receiving.** A datagram is acted on only when all of these hold, checked in this
//!   order, each refusal counted by its reason ([`wire::Refused`]) and logged (one line per
//!   reason and peer every [`LOG_EVERY`]): it comes from a listed peer's address; its
//!   magic, version and length are right and its HMAC verifies ([`wire::open`]); it names
//!   a sender that is not this node (a reflected datagram names it), this node as its
//!   receiver, and as sender the peer it came from (node ids are sync addresses: `listen`
//!   here, `peers[].address` there); it belongs to the session of the peer this node
//!   follows, presents this node's current ticket for the peer and has a sequence new in
//!   that session ([`peer`]: what survives restarts of either side).
//! - **Installing.** Records are untrusted even then ([`install()`]): a flow is installed with
//!   this node's ids for its service (found by the frontend its client addressed) and
//!   backend (by address), through the table's validated restore: a flow whose service or
//!   backend this node does not know, or whose SNAT address is not the peer's, is refused
//!   and counted, one by one. A flow already here is updated in place (state, last-seen
//!   time), never removed and inserted again: a packet between the two would find no flow.
//!   A flow of this node's own is never overwritten by a peer's; a peer's end removes only a
//!   copy that has been idle here for [`END_IDLE`] (one this node serves stays).
//! - **Dumps.** At start a node says hello to every peer; once it has learnt a peer's
//!   ticket (from the peer's answer) it asks it for all its flows
//!   ([`wire::Kind::DumpRequest`]), and sends it what its own workers created meanwhile
//!   (own flows active since its start). It is [`ready`](FlowSync::ready) (to be announced
//!   by `[bgp]`) once every peer has finished its dump or been silent for [`DUMP_WAIT`]; a
//!   peer heard again after [`PEER_SILENT`] of silence (a partition healed) is asked again.
//!   Nothing but hellos goes to a peer whose ticket this node does not know.
//!
//! Nothing here runs on the packet path; the workers only push to their logs.

mod install;
pub mod peer;
mod receive;
pub mod wire;

use std::collections::{HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use fastpath::flowlog::{FlowEvent, FlowLog};
use fastpath::pipeline::FLAG_PEER;
use fastpath::snapshot::Snapshot;
use flowtable::{FlowRecord, FlowTable};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

pub use install::{Installed, Origin, end, install};
use peer::Peer;
use wire::{End, Header, Key, Kind, Refused, Writer};

/// Datagrams waiting to be sent, at most.
pub const QUEUE_MAX: usize = 100_000;
/// A peer's end removes a copy only when it has been idle here this long.
pub const END_IDLE: Duration = Duration::from_secs(1);
/// A starting node waits this long for a silent peer's dump.
pub const DUMP_WAIT: Duration = Duration::from_secs(3);
/// A starting node stops waiting for a peer that is up but sends no dump after this long.
pub const DUMP_GIVE_UP: Duration = Duration::from_secs(30);
/// A peer not heard from for this long is down; heard again, it is asked for a dump.
pub const PEER_SILENT: Duration = Duration::from_secs(3);
/// How often a node says it is alive.
pub const HELLO_EVERY: Duration = Duration::from_secs(1);
/// A refusal of one reason from one source is logged at most once this often (the others
/// are counted, and the next line says how many).
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// Flow-table entries a dump or refresh reads per interval.
const SCAN_CHUNK: usize = 1 << 16;
/// A dump or refresh reads on only while fewer datagrams than this wait.
const SCAN_BACKLOG: usize = 2048;

/// `[sync]`, resolved (the key read).
#[derive(Debug)]
pub struct FlowSyncConfig {
    /// This node's sync address (its node id).
    pub listen: SocketAddr,
    /// The peers: sync addresses (their node ids) and SNAT addresses.
    pub peers: Vec<config::SyncPeer>,
    /// This node's own SNAT addresses (a peer's flow never takes them).
    pub snat_addresses: Vec<IpAddr>,
    /// The shared key.
    pub key: Key,
    /// How often logs are drained and datagrams sent.
    pub interval: Duration,
    /// How often own active flows are sent again.
    pub refresh: Duration,
    /// Datagrams a second, at most.
    pub max_messages_per_second: u32,
}

impl FlowSyncConfig {
    /// From the config's `[sync]` (enabled), reading the key file.
    pub fn from_config(c: &config::Config) -> Result<FlowSyncConfig, String> {
        let s = &c.sync;
        let listen = s.listen.ok_or("[sync] listen is not set")?;
        let path = s.key_file.as_ref().ok_or("[sync] key_file is not set")?;
        let bytes =
            read_key(path).map_err(|e| format!("[sync] key_file {}: {e}", path.display()))?;
        let key =
            Key::new(&bytes).map_err(|e| format!("[sync] key_file {}: {e}", path.display()))?;
        Ok(FlowSyncConfig {
            listen,
            peers: s.peers.clone(),
            snat_addresses: c.dataplane.snat_addresses.clone(),
            key,
            interval: s.interval.get(),
            refresh: s.refresh.get(),
            max_messages_per_second: s.max_messages_per_second,
        })
    }
}

/// Largest key file read: a key is 32 bytes or more, not a file of data.
const KEY_FILE_MAX: u64 = 4096;

/// The key file's bytes: a regular file (following links, as a Secret volume's are) of at
/// most [`KEY_FILE_MAX`] bytes, so that a key file named wrongly (`/dev/zero`, a FIFO, a
/// log) is refused instead of read for ever.
fn read_key(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(KEY_FILE_MAX + 1).read_to_end(&mut bytes))
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > KEY_FILE_MAX {
        return Err(format!(
            "larger than {KEY_FILE_MAX} bytes: a key is 32 random bytes or more, not a file of data"
        ));
    }
    Ok(bytes)
}

/// Flow sync's counters (read by the metrics and `/v1/stats`).
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Datagrams sent (to each peer counted once per peer).
    pub messages_sent: AtomicU64,
    /// Bytes sent.
    pub bytes_sent: AtomicU64,
    /// Flow records sent.
    pub flows_sent: AtomicU64,
    /// End records sent.
    pub ends_sent: AtomicU64,
    /// Datagrams accepted (acted on, or a hello that taught a ticket).
    pub messages_received: AtomicU64,
    /// Peers' flows installed as new flows.
    pub flows_installed: AtomicU64,
    /// Peers' flows that updated a copy already here.
    pub flows_updated: AtomicU64,
    /// Peers' ends that removed a copy.
    pub flows_removed: AtomicU64,
    /// Peers' flows refused: service or backend unknown here.
    pub refused_unknown: AtomicU64,
    /// Peers' flows refused: a flow of this node holds the tuple.
    pub refused_conflict: AtomicU64,
    /// Peers' records refused: they do not decode.
    pub refused_malformed: AtomicU64,
    /// Peers' flows refused: inconsistent (a SNAT address not the peer's, a state of
    /// another protocol...).
    pub refused_invalid: AtomicU64,
    /// Peers' flows refused: the table is full, or the reply tuple is taken.
    pub refused_other: AtomicU64,
    /// Datagrams refused, by [`Refused`] (index: its discriminant).
    pub rejected: [AtomicU64; Refused::ALL.len()],
    /// Datagrams dropped: the send queue was full.
    pub queue_dropped: AtomicU64,
    /// Datagrams whose send failed.
    pub send_errors: AtomicU64,
    /// Datagrams waiting.
    pub queued: AtomicU64,
    /// Dumps sent to peers.
    pub dumps_sent: AtomicU64,
    /// Dumps received from peers.
    pub dumps_received: AtomicU64,
    /// Sync lag: the age (µs) of the last flow datagram when it arrived (its sequence is
    /// the sender's clock), 0 before the first.
    pub lag_us: AtomicU64,
    /// Peers heard from within [`PEER_SILENT`].
    pub peers_up: AtomicU64,
}

impl SyncStats {
    fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }

    /// Datagrams refused for `r`.
    pub fn rejected(&self, r: Refused) -> u64 {
        self.rejected[r as usize].load(Ordering::Relaxed)
    }
}

/// The running service's handle.
#[derive(Debug, Clone)]
pub struct FlowSync {
    /// Its counters.
    pub stats: Arc<SyncStats>,
    ready: Arc<AtomicBool>,
}

impl FlowSync {
    /// Whether the start-up dumps are in (every peer finished its dump or was silent for
    /// [`DUMP_WAIT`]): the node may be announced.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The counters as `/v1/stats` shows them; `logs` are the workers' flow logs.
    pub fn view(&self, logs: &[Arc<FlowLog>]) -> crate::admin::views::PeerSyncView {
        let s = &self.stats;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        crate::admin::views::PeerSyncView {
            ready: self.ready(),
            peers_up: r(&s.peers_up),
            messages_sent: r(&s.messages_sent),
            bytes_sent: r(&s.bytes_sent),
            flows_sent: r(&s.flows_sent),
            ends_sent: r(&s.ends_sent),
            messages_received: r(&s.messages_received),
            flows_installed: r(&s.flows_installed),
            flows_updated: r(&s.flows_updated),
            flows_removed: r(&s.flows_removed),
            flows_refused: [
                ("unknown", r(&s.refused_unknown)),
                ("conflict", r(&s.refused_conflict)),
                ("malformed", r(&s.refused_malformed)),
                ("invalid", r(&s.refused_invalid)),
                ("other", r(&s.refused_other)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
            messages_rejected: Refused::ALL
                .iter()
                .map(|&why| (why.name().to_owned(), s.rejected(why)))
                .collect(),
            queue_dropped: r(&s.queue_dropped),
            send_errors: r(&s.send_errors),
            queued: r(&s.queued),
            log_dropped: logs.iter().map(|l| l.dropped()).sum(),
            dumps_sent: r(&s.dumps_sent),
            dumps_received: r(&s.dumps_received),
            lag_us: r(&s.lag_us),
        }
    }

    /// Binds `cfg.listen` and starts the service on `rt`; it stops with `stop`.
    pub fn spawn(
        rt: &tokio::runtime::Handle,
        cfg: FlowSyncConfig,
        flows: Arc<FlowTable>,
        snapshot: Arc<ArcSwap<Snapshot>>,
        logs: Vec<Arc<FlowLog>>,
        stop: CancellationToken,
    ) -> io::Result<(FlowSync, tokio::task::JoinHandle<()>)> {
        let std_sock = std::net::UdpSocket::bind(cfg.listen)
            .map_err(|e| io::Error::new(e.kind(), format!("[sync] listen {}: {e}", cfg.listen)))?;
        std_sock.set_nonblocking(true)?;
        let stats = Arc::new(SyncStats::default());
        let ready = Arc::new(AtomicBool::new(cfg.peers.is_empty()));
        let handle = FlowSync {
            stats: Arc::clone(&stats),
            ready: Arc::clone(&ready),
        };
        let task = rt.spawn(async move {
            let sock = match UdpSocket::from_std(std_sock) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "flow sync: socket");
                    return;
                }
            };
            let mut s = Service::new(cfg, flows, snapshot, logs, stats, ready);
            s.run(sock, stop).await;
        });
        Ok((handle, task))
    }
}

/// Flow sync as a [`crate::service::Service`]: the arguments of [`FlowSync::spawn`]; its
/// handle is the [`FlowSync`].
pub struct FlowSyncService {
    /// The checked `[sync]` settings.
    pub cfg: FlowSyncConfig,
    /// The table whose flows are sent and into which peers' flows are installed.
    pub flows: Arc<FlowTable>,
    /// The published snapshot (what a peer's flow is checked against).
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// One log per worker: the flows it created, changed and ended.
    pub logs: Vec<Arc<FlowLog>>,
}

impl crate::service::Service for FlowSyncService {
    type Handle = FlowSync;
    type Error = io::Error;
    const NAME: &'static str = "flow sync";

    fn start(
        self,
        rt: &tokio::runtime::Handle,
        shutdown: &CancellationToken,
    ) -> io::Result<crate::service::Running<FlowSync>> {
        let (handle, task) = FlowSync::spawn(
            rt,
            self.cfg,
            self.flows,
            self.snapshot,
            self.logs,
            shutdown.clone(),
        )?;
        Ok(crate::service::Running { handle, task })
    }
}

/// A scan of the table in progress (a dump or catch-up to one peer, or a refresh to all).
#[derive(Debug)]
struct Scan {
    /// The peer it goes to; `None`: a refresh.
    to: Option<usize>,
    /// A dump (answered with a DumpEnd).
    dump: bool,
    cursor: usize,
    sent: u64,
    /// Only own flows active since this (refreshes, catch-ups).
    since: Option<Instant>,
}

/// A datagram waiting: its body (sealed per receiver when it leaves) and `aux`.
#[derive(Debug)]
struct Outgoing {
    /// To one peer, or to all.
    to: Option<usize>,
    body: Writer,
    aux: u64,
}

struct Service {
    cfg: FlowSyncConfig,
    flows: Arc<FlowTable>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    logs: Vec<Arc<FlowLog>>,
    stats: Arc<SyncStats>,
    ready: Arc<AtomicBool>,
    peers: Vec<Peer>,
    /// This process's session.
    session: u64,
    rng: SystemRandom,
    queue: VecDeque<Outgoing>,
    tokens: f64,
    last_refill: Instant,
    last_seq: u64,
    started_us: u64,
    started: Instant,
    scans: Vec<Scan>,
    last_refresh: Instant,
    last_hello: Option<Instant>,
    log_gate: receive::LogGate,
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A random nonzero u64 (a session or ticket); the clock and the process id mixed in if the
/// system's generator fails (it does not on Linux once booted).
fn random_id(rng: &SystemRandom) -> u64 {
    let mut b = [0u8; 8];
    let v = match rng.fill(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => unix_us() ^ (u64::from(std::process::id()) << 40),
    };
    v.max(1)
}

impl Service {
    fn new(
        cfg: FlowSyncConfig,
        flows: Arc<FlowTable>,
        snapshot: Arc<ArcSwap<Snapshot>>,
        logs: Vec<Arc<FlowLog>>,
        stats: Arc<SyncStats>,
        ready: Arc<AtomicBool>,
    ) -> Service {
        let now = Instant::now();
        let rng = SystemRandom::new();
        let peers = cfg
            .peers
            .iter()
            .map(|p| Peer::new(p.address, p.snat_addresses.clone(), random_id(&rng)))
            .collect();
        Service {
            tokens: f64::from(cfg.max_messages_per_second) / 10.0,
            cfg,
            flows,
            snapshot,
            logs,
            stats,
            ready,
            peers,
            session: random_id(&rng),
            rng,
            queue: VecDeque::new(),
            last_refill: now,
            last_seq: 0,
            started_us: unix_us(),
            started: now,
            scans: Vec::new(),
            last_refresh: now,
            last_hello: None,
            log_gate: receive::LogGate::default(),
        }
    }

    async fn run(&mut self, sock: UdpSocket, stop: CancellationToken) {
        tracing::info!(listen = %self.cfg.listen, peers = self.peers.len(), session = %format_args!("{:016x}", self.session), "flow sync started; saying hello to the peers");
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buf = vec![0u8; 65536];
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                r = sock.recv_from(&mut buf) => match r {
                    Ok((n, from)) => self.receive(&buf[..n], from, Instant::now()),
                    Err(e) => tracing::debug!(error = %e, "flow sync: receive"),
                },
                _ = tick.tick() => {
                    let now = Instant::now();
                    self.tick(now);
                    self.send(&sock, now).await;
                }
            }
        }
        // What the workers logged last still goes out (best effort, within one interval).
        self.drain_logs(Instant::now());
        self.send(&sock, Instant::now()).await;
    }

    fn next_seq(&mut self) -> u64 {
        self.last_seq = (self.last_seq + 1).max(unix_us());
        self.last_seq
    }

    fn push(&mut self, to: Option<usize>, body: Writer, aux: u64) {
        if self.queue.len() >= QUEUE_MAX {
            SyncStats::add(&self.stats.queue_dropped, 1);
            return;
        }
        self.queue.push_back(Outgoing { to, body, aux });
    }

    /// Asks peer `p` for all its flows (once its ticket is known; learning it asks again).
    fn ask(&mut self, p: usize, now: Instant) {
        if self.peers[p].their_ticket == 0 {
            return;
        }
        self.peers[p].asked = Some(now);
        self.control(Some(p), Kind::DumpRequest, 0);
    }

    fn control(&mut self, to: Option<usize>, kind: Kind, aux: u64) {
        self.push(to, Writer::new(kind), aux);
    }

    fn hello(&mut self, to: Option<usize>) {
        self.control(to, Kind::Hello, self.started_us);
    }

    fn tick(&mut self, now: Instant) {
        self.drain_logs(now);
        if self
            .last_hello
            .is_none_or(|t| now.duration_since(t) >= HELLO_EVERY)
        {
            self.last_hello = Some(now);
            self.hello(None);
        }
        if now.duration_since(self.last_refresh) >= self.cfg.refresh {
            let since = self.last_refresh;
            self.last_refresh = now;
            if !self.scans.iter().any(|s| s.to.is_none()) {
                self.scans.push(Scan {
                    to: None,
                    dump: false,
                    cursor: 0,
                    sent: 0,
                    since: Some(since),
                });
            }
        }
        self.scan(now);
        let mut up = 0;
        let mut ask = Vec::new();
        let waited = now.duration_since(self.started);
        for (i, p) in self.peers.iter_mut().enumerate() {
            let silent = p.silent(now);
            if !silent {
                up += 1;
            }
            if p.dumped {
                continue;
            }
            if silent && waited >= DUMP_WAIT {
                // Nobody there: nothing to wait for.
                p.dumped = true;
            } else if waited >= DUMP_GIVE_UP {
                tracing::warn!(peer = %p.addr, "flow sync: the peer is up but sent no dump within {DUMP_GIVE_UP:?}; going on without it");
                p.dumped = true;
            } else if !silent && p.asked.is_none_or(|t| now.duration_since(t) >= DUMP_WAIT) {
                // It is there but did not answer (the request may have been lost).
                ask.push(i);
            }
        }
        for p in ask {
            self.ask(p, now);
        }
        self.stats.peers_up.store(up, Ordering::Relaxed);
        self.stats
            .queued
            .store(self.queue.len() as u64, Ordering::Relaxed);
        if !self.ready.load(Ordering::Relaxed) && self.peers.iter().all(|p| p.dumped) {
            self.ready.store(true, Ordering::Release);
            tracing::info!(
                took_ms = waited.as_millis() as u64,
                "flow sync: the peers' flows are in"
            );
        }
    }

    /// The workers' logs, as datagrams to every peer.
    fn drain_logs(&mut self, now: Instant) {
        let mut seen = HashSet::new();
        let mut flows = Writer::new(Kind::Flows);
        let mut ends = Writer::new(Kind::Ends);
        let mut nflows = 0u64;
        let mut nends = 0u64;
        for i in 0..self.logs.len() {
            while let Some(ev) = self.logs[i].pop() {
                match ev {
                    FlowEvent::Created(h) | FlowEvent::Changed(h) => {
                        if !seen.insert(h) {
                            continue;
                        }
                        let Some(v) = self.flows.get(h) else { continue };
                        flows.flow(&FlowRecord::of(&v, now));
                        nflows += 1;
                        if !flows.has_room() {
                            let full = std::mem::replace(&mut flows, Writer::new(Kind::Flows));
                            self.push(None, full, 0);
                        }
                    }
                    FlowEvent::Ended(e) => {
                        ends.end(&End {
                            proto: e.proto,
                            client: e.client,
                            vip: e.vip,
                        });
                        nends += 1;
                        if !ends.has_room() {
                            let full = std::mem::replace(&mut ends, Writer::new(Kind::Ends));
                            self.push(None, full, 0);
                        }
                    }
                }
            }
        }
        if !flows.is_empty() {
            self.push(None, flows, 0);
        }
        if !ends.is_empty() {
            self.push(None, ends, 0);
        }
        let peers = self.peers.len() as u64;
        SyncStats::add(&self.stats.flows_sent, nflows * peers);
        SyncStats::add(&self.stats.ends_sent, nends * peers);
    }

    /// Dumps, catch-ups and refreshes: one chunk of the table each per interval while the
    /// queue is short.
    fn scan(&mut self, now: Instant) {
        let cap = self.flows.capacity();
        let mut i = 0;
        while i < self.scans.len() {
            if self.queue.len() >= SCAN_BACKLOG {
                return;
            }
            let Scan {
                to, cursor, since, ..
            } = self.scans[i];
            let len = SCAN_CHUNK.min(cap - cursor);
            let mut w = Writer::new(Kind::Flows);
            let mut full = Vec::new();
            let mut n = 0u64;
            self.flows.scan(cursor, len, |v| {
                if let Some(since) = since
                    && (v.data.flags & FLAG_PEER != 0 || v.last_seen < since)
                {
                    return;
                }
                w.flow(&FlowRecord::of(&v, now));
                n += 1;
                if !w.has_room() {
                    full.push(std::mem::replace(&mut w, Writer::new(Kind::Flows)));
                }
            });
            if !w.is_empty() {
                full.push(w);
            }
            for w in full {
                self.push(to, w, 0);
            }
            let fanout = if to.is_some() {
                1
            } else {
                self.peers.len() as u64
            };
            SyncStats::add(&self.stats.flows_sent, n * fanout);
            let s = &mut self.scans[i];
            s.cursor += len;
            s.sent += n;
            if s.cursor >= cap {
                let s = self.scans.remove(i);
                if let (Some(p), true) = (s.to, s.dump) {
                    self.control(Some(p), Kind::DumpEnd, s.sent);
                    SyncStats::add(&self.stats.dumps_sent, 1);
                    tracing::info!(peer = %self.peers[p].addr, flows = s.sent, "flow sync: dump sent");
                }
            } else {
                i += 1;
            }
        }
    }

    /// `o` sealed for peer `p`; `None` when `p`'s ticket is not known yet and `o` is no
    /// hello (the peer would refuse it; what it carried reaches the peer with the catch-up
    /// that learning the ticket starts).
    fn seal_for(&mut self, p: usize, o: &Outgoing) -> Option<Vec<u8>> {
        if self.peers[p].their_ticket == 0 && o.body.kind() != Kind::Hello {
            return None;
        }
        let seq = self.next_seq();
        let peer = &self.peers[p];
        let h = Header {
            seq,
            aux: o.aux,
            session: self.session,
            issued: peer.ticket,
            presented: peer.their_ticket,
            sender: self.cfg.listen,
            receiver: peer.addr,
        };
        Some(o.body.seal(&self.cfg.key, &h))
    }

    /// The next waiting datagram, sealed for each of its receivers; `None` when none waits.
    fn next_datagrams(&mut self) -> Option<Vec<(SocketAddr, Vec<u8>)>> {
        let o = self.queue.pop_front()?;
        let targets = match o.to {
            Some(p) => p..p + 1,
            None => 0..self.peers.len(),
        };
        Some(
            targets
                .filter_map(|p| Some((self.peers[p].addr, self.seal_for(p, &o)?)))
                .collect(),
        )
    }

    /// Sends what the rate allows.
    async fn send(&mut self, sock: &UdpSocket, now: Instant) {
        let rate = f64::from(self.cfg.max_messages_per_second);
        let dt = now.duration_since(self.last_refill).as_secs_f64();
        self.last_refill = now;
        self.tokens = (self.tokens + dt * rate).min((rate / 10.0).max(16.0));
        while self.tokens >= 1.0 {
            let Some(out) = self.next_datagrams() else {
                break;
            };
            self.tokens -= 1.0;
            for (t, d) in out {
                match sock.send_to(&d, t).await {
                    Ok(_) => {
                        SyncStats::add(&self.stats.messages_sent, 1);
                        SyncStats::add(&self.stats.bytes_sent, d.len() as u64);
                    }
                    Err(e) => {
                        SyncStats::add(&self.stats.send_errors, 1);
                        tracing::debug!(peer = %t, error = %e, "flow sync: send");
                    }
                }
            }
        }
        self.stats
            .queued
            .store(self.queue.len() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
