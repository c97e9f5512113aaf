//! The task that keeps an [`L2Table`] current.
//!
//! One task on the slowpath runtime waits on four things: a NETLINK_ROUTE socket subscribed to
//! link, neighbour and route events (non-blocking, through [`AsyncFd`]); a bounded queue of
//! the next hops [`NeighbourRequester::request`] reports; the periodic re-read deadline; and
//! the shutdown token. Events only bring the next re-read forward (at most one per
//! [`EVENT_DEBOUNCE`] after the last), so a burst of kernel changes costs one dump. The
//! periodic read stays as the safety net for events lost to a full socket buffer.
//!
//! Requests beyond [`REQUESTS_MAX`] queued are dropped (the fastpath reports again on its
//! next frame to that destination). Each next hop is solicited at most once per
//! [`SOLICIT_INTERVAL`]; at most [`SOLICITED_MAX`] next hops are remembered for that, and
//! past it new ones wait until a re-read prunes the expired entries.
//!
//! # Network namespaces
//!
//! A socket belongs to the network namespace of the thread that opened it, for its whole
//! life, whichever thread uses it later; but the runtime's worker and blocking threads need
//! not be in the namespace of the thread that calls [`NeighbourWatcher::spawn`]. In the
//! daemon they are (xvs runs whole under `ip netns exec`), in the tests they are not (one
//! thread enters a namespace with `setns`). So `spawn` opens, synchronously and on the
//! caller's thread, every socket the watcher will ever use: the event socket, the dump
//! socket the re-reads use and one UDP socket per address family for solicitations. The
//! task opens none and resolves interface names only through those sockets
//! (`SO_BINDTODEVICE`, `SIOCGIFINDEX`), so it watches the caller's namespace whatever
//! thread runs it, without a thread of its own.
//!
//! A dump is a few milliseconds of blocking socket I/O: it runs in `spawn_blocking`, the
//! dump socket moved there and back, so it never holds a runtime worker. The task ends when
//! the shutdown token is cancelled (or the watcher dropped), also in the middle of a dump;
//! `on_change` runs on the task only, so once [`NeighbourWatcher::join`] returns it has been
//! dropped and is never called again.

use std::collections::HashMap;
use std::net::{IpAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fastpath::snapshot::L2Table;
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};
use tokio::io::Interest;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::dump::Dumper;
use super::{NeighError, read_l2_on, solicit_on, solicit_socket};

/// How long after a re-read a netlink event may trigger the next one.
const EVENT_DEBOUNCE: Duration = Duration::from_millis(20);
/// The shortest interval between two solicitations of one next hop.
const SOLICIT_INTERVAL: Duration = Duration::from_secs(1);
/// Unresolved next hops waiting for the watcher task; more are dropped (the fastpath
/// reports again on its next frame to them).
const REQUESTS_MAX: usize = 256;
/// Next hops remembered for rate limiting; past this, requests wait for the next prune.
const SOLICITED_MAX: usize = 4096;
/// Receive buffer for draining netlink events (their content is not read).
const EVENT_BUF_LEN: usize = 64 * 1024;
/// The shortest re-read period (a zero one would spin).
const PERIOD_MIN: Duration = Duration::from_millis(1);

const _: () = assert!(REQUESTS_MAX <= SOLICITED_MAX);

/// rtnetlink multicast groups (`RTNLGRP_*` in linux/rtnetlink.h) that change an `L2Table`.
const GROUPS: [u32; 4] = [
    1,  // RTNLGRP_LINK
    3,  // RTNLGRP_NEIGH
    7,  // RTNLGRP_IPV4_ROUTE
    11, // RTNLGRP_IPV6_ROUTE
];

/// State shared by the watcher task and its handle.
#[derive(Default)]
struct Shared {
    last_error: Mutex<Option<String>>,
}

impl Shared {
    fn set_error(&self, e: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = e;
    }
}

/// Keeps the kernel's L2 view of some interfaces current on a task of the slowpath runtime
/// (see the module doc). Dropping it stops the task without waiting.
pub struct NeighbourWatcher {
    shared: Arc<Shared>,
    requester: NeighbourRequester,
    /// A child of the caller's `shutdown`: cancelled by it, or by dropping the watcher.
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// A cloneable handle through which the fastpath reports unresolved next hops.
#[derive(Clone)]
pub struct NeighbourRequester {
    tx: mpsc::Sender<IpAddr>,
}

impl NeighbourRequester {
    /// Asks the watcher to solicit `ip` (see [`NeighbourWatcher::request`]). Never blocks.
    pub fn request(&self, ip: IpAddr) {
        // Full: dropped, the fastpath asks again. Closed: the watcher has ended.
        let _ = self.tx.try_send(ip);
    }
}

impl std::fmt::Debug for NeighbourWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeighbourWatcher").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for NeighbourRequester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeighbourRequester").finish_non_exhaustive()
    }
}

impl NeighbourWatcher {
    /// The re-read period to use when there is no reason to pick another.
    pub const DEFAULT_PERIOD: Duration = Duration::from_secs(1);

    /// Starts the watcher task on `rt` (the slowpath runtime, with its I/O and time drivers
    /// enabled). It reads at once, then on every link/route/neighbour event (debounced) and
    /// every `period`, and calls `on_change` with the table whenever it differs from the
    /// last one passed (the first good read always does). A failed read keeps the last
    /// table; see [`NeighbourWatcher::last_error`]. The task ends when `shutdown` is
    /// cancelled.
    ///
    /// Watches the network namespace of the calling thread: every socket is opened here,
    /// synchronously (see the module doc). Fails when they cannot be opened; a missing
    /// interface is not an error here but a failed read, retried.
    pub fn spawn(
        rt: &tokio::runtime::Handle,
        interfaces: Vec<String>,
        period: Duration,
        on_change: impl FnMut(L2Table) + Send + 'static,
        shutdown: CancellationToken,
    ) -> std::io::Result<Self> {
        let (mut watcher, task) = Self::start_parts(rt, interfaces, period, on_change, &shutdown)?;
        watcher.task = Some(task);
        Ok(watcher)
    }

    /// [`NeighbourWatcher::spawn`], the task apart (for [`NeighbourService`]).
    fn start_parts(
        rt: &tokio::runtime::Handle,
        interfaces: Vec<String>,
        period: Duration,
        on_change: impl FnMut(L2Table) + Send + 'static,
        shutdown: &CancellationToken,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let mut events = Socket::new(NETLINK_ROUTE)?;
        events.bind_auto()?;
        for g in GROUPS {
            events.add_membership(g)?;
        }
        events.set_non_blocking(true)?;
        let dumper = Dumper::open().map_err(|e| match e {
            NeighError::Socket(io) => io,
            other => std::io::Error::other(other),
        })?;
        let solicitor = Solicitor {
            v4: solicit_socket(false),
            v6: solicit_socket(true),
        };
        for (family, sock) in [("IPv4", &solicitor.v4), ("IPv6", &solicitor.v6)] {
            if let Err(e) = sock {
                tracing::warn!(family, error = %e, "no UDP socket to solicit next hops with");
            }
        }
        let events = {
            // Registers with `rt`'s reactor; the caller need not be inside the runtime.
            let _entered = rt.enter();
            // SAFETY: `Socket` owns its descriptor, closes it only when dropped, and its
            // `as_raw_fd` always returns that one; the `AsyncFd` owns the `Socket`.
            unsafe { AsyncFd::register_with_interest(events, Interest::READABLE) }?
        };
        let (tx, requests) = mpsc::channel(REQUESTS_MAX);
        let shared = Arc::<Shared>::default();
        let worker = Worker {
            interfaces: interfaces.into(),
            period: period.max(PERIOD_MIN),
            shared: Arc::clone(&shared),
            events,
            dumper: Some(dumper),
            solicitor,
            requests,
            current: None,
            read_error: None,
            solicited: HashMap::new(),
        };
        let stop = shutdown.child_token();
        let task = rt.spawn(worker.run(on_change, stop.clone()));
        let watcher = NeighbourWatcher {
            shared,
            requester: NeighbourRequester { tx },
            stop,
            task: None,
        };
        Ok((watcher, task))
    }

    /// Reports a next hop the fastpath has no MAC for. The watcher solicits it on the
    /// interface its route leaves by (through the route's gateway, if it has one) at most
    /// once per second; requests beyond a small queue, or for destinations no route of
    /// the configured interfaces covers, are dropped. Never blocks; callable from any
    /// thread.
    pub fn request(&self, ip: IpAddr) {
        self.requester.request(ip);
    }

    /// A handle for [`NeighbourWatcher::request`] that other threads can own.
    pub fn requester(&self) -> NeighbourRequester {
        self.requester.clone()
    }

    /// Why the last read or solicitation failed, if it did; cleared by a good read.
    pub fn last_error(&self) -> Option<String> {
        self.shared
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits for the watcher task to end (after `shutdown` is cancelled: this does not stop
    /// it). Once it returns, `on_change` has been dropped. A panic of `on_change` is resumed
    /// here.
    pub async fn join(mut self) {
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// The neighbour watcher as a [`crate::service::Service`]: the arguments of
/// [`NeighbourWatcher::spawn`]; its handle is the [`NeighbourWatcher`] (without its task,
/// which the driver awaits).
pub struct NeighbourService<F> {
    /// The interfaces whose routes and neighbours are watched.
    pub interfaces: Vec<String>,
    /// How often the tables are read again without an event.
    pub period: Duration,
    /// Gets every new table.
    pub on_change: F,
}

impl<F> crate::service::Service for NeighbourService<F>
where
    F: FnMut(L2Table) + Send + 'static,
{
    type Handle = NeighbourWatcher;
    type Error = std::io::Error;
    const NAME: &'static str = "the neighbour watcher";

    fn start(
        self,
        rt: &tokio::runtime::Handle,
        shutdown: &CancellationToken,
    ) -> std::io::Result<crate::service::Running<NeighbourWatcher>> {
        let (handle, task) = NeighbourWatcher::start_parts(
            rt,
            self.interfaces,
            self.period,
            self.on_change,
            shutdown,
        )?;
        Ok(crate::service::Running { handle, task })
    }
}

impl Drop for NeighbourWatcher {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One UDP socket per address family, opened in the watcher's namespace (or why not).
struct Solicitor {
    v4: std::io::Result<UdpSocket>,
    v6: std::io::Result<UdpSocket>,
}

impl Solicitor {
    fn solicit(&self, hop: IpAddr, interface: &str) -> Result<(), NeighError> {
        let sock = if hop.is_ipv6() { &self.v6 } else { &self.v4 };
        match sock {
            Ok(sock) => solicit_on(sock, hop, interface),
            Err(e) => Err(NeighError::Solicit {
                ip: hop,
                interface: interface.to_owned(),
                source: match e.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(e.kind(), e.to_string()),
                },
            }),
        }
    }
}

/// The watcher task's state.
struct Worker {
    interfaces: Arc<[String]>,
    period: Duration,
    shared: Arc<Shared>,
    events: AsyncFd<Socket>,
    /// `None` only while a dump runs (the socket is on the blocking thread).
    dumper: Option<Dumper>,
    solicitor: Solicitor,
    requests: mpsc::Receiver<IpAddr>,
    current: Option<L2Table>,
    /// The last read's error, to log a failure once rather than every period.
    read_error: Option<String>,
    /// Next hop → when it was last solicited.
    solicited: HashMap<IpAddr, Instant>,
}

impl Worker {
    async fn run(mut self, mut on_change: impl FnMut(L2Table), stop: CancellationToken) {
        let mut buf = Vec::with_capacity(EVENT_BUF_LEN);
        let mut last_read = Instant::now();
        let mut next_read = last_read;
        loop {
            if Instant::now() >= next_read {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = self.reread(&mut on_change) => {}
                }
                last_read = Instant::now();
                next_read = last_read + self.period;
                self.solicited
                    .retain(|_, at| last_read.duration_since(*at) < SOLICIT_INTERVAL);
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                ready = self.events.readable() => {
                    let Ok(guard) = ready else {
                        // Only when the runtime's reactor is gone: the runtime is ending.
                        return;
                    };
                    if let Err(e) = drain_events(guard, &mut buf) {
                        tracing::warn!(error = %e, "reading netlink events failed");
                    }
                    next_read = next_read.min(last_read + EVENT_DEBOUNCE);
                }
                Some(ip) = self.requests.recv() => {
                    self.solicit(ip);
                    while let Ok(ip) = self.requests.try_recv() {
                        self.solicit(ip);
                    }
                }
                () = tokio::time::sleep_until(next_read) => {}
            }
        }
    }

    async fn reread(&mut self, on_change: &mut impl FnMut(L2Table)) {
        let Some(mut dumper) = self.dumper.take() else {
            // A dump was abandoned with the runtime shutting down: nothing to read with.
            return;
        };
        let interfaces = Arc::clone(&self.interfaces);
        let dumped = tokio::task::spawn_blocking(move || {
            let table = read_l2_on(&mut dumper, &interfaces);
            (dumper, table)
        })
        .await;
        let read = match dumped {
            Ok((dumper, read)) => {
                self.dumper = Some(dumper);
                read
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => return,
        };
        match read {
            Ok(table) => {
                if self.read_error.take().is_some() {
                    tracing::info!(interfaces = ?self.interfaces, "reading the L2 table works again");
                }
                self.shared.set_error(None);
                if self.current.as_ref() != Some(&table) {
                    tracing::debug!(
                        routes = table.routes.len(),
                        neighbours = table.neighbours.len(),
                        "L2 table changed"
                    );
                    self.current = Some(table.clone());
                    on_change(table);
                }
            }
            Err(e) => {
                let e = e.to_string();
                if self.read_error.as_ref() != Some(&e) {
                    tracing::warn!(interfaces = ?self.interfaces, error = %e, "reading the L2 table failed");
                }
                self.read_error = Some(e.clone());
                self.shared.set_error(Some(e));
            }
        }
    }

    fn solicit(&mut self, ip: IpAddr) {
        let Some(table) = &self.current else { return };
        let Some((hop, port)) = next_hop(table, ip) else {
            return;
        };
        if !admit(&mut self.solicited, hop, Instant::now()) {
            return;
        }
        let Some(interface) = self.interfaces.get(usize::from(port)) else {
            return;
        };
        tracing::debug!(next_hop = %hop, interface = %interface, "soliciting");
        if let Err(e) = self.solicitor.solicit(hop, interface) {
            tracing::warn!(next_hop = %hop, interface = %interface, error = %e, "solicitation failed");
            self.shared.set_error(Some(e.to_string()));
        }
    }
}

/// The next hop to resolve for `ip` and the port it is on: the gateway of the longest
/// matching route, or `ip` itself on a connected route. `None` when no route covers `ip`
/// or the kernel already has the next hop's MAC.
fn next_hop(table: &L2Table, ip: IpAddr) -> Option<(IpAddr, u16)> {
    let route = table
        .routes
        .iter()
        .filter(|r| r.prefix.contains(ip))
        .max_by_key(|r| r.prefix.prefix)?;
    let hop = route.gateway.unwrap_or(ip);
    if table.neighbours.iter().any(|n| n.ip == hop) {
        return None;
    }
    Some((hop, route.port))
}

/// Whether `hop` may be solicited at `now`, recording it if so: at most once per
/// [`SOLICIT_INTERVAL`], and only while fewer than [`SOLICITED_MAX`] hops are remembered.
fn admit(solicited: &mut HashMap<IpAddr, Instant>, hop: IpAddr, now: Instant) -> bool {
    match solicited.get(&hop) {
        Some(at) if now.duration_since(*at) < SOLICIT_INTERVAL => return false,
        Some(_) => {}
        None if solicited.len() >= SOLICITED_MAX => return false,
        None => {}
    }
    solicited.insert(hop, now);
    true
}

/// Empties the event socket; what changed does not matter, a re-read follows.
fn drain_events(
    mut guard: AsyncFdReadyGuard<'_, Socket>,
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    loop {
        buf.clear();
        match guard.try_io(|sock| sock.get_ref().recv(buf, 0)) {
            Ok(Ok(_)) => {}
            // ENOBUFS: events were lost; the re-read that follows covers them.
            Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => {
                // Wait for the next readiness event rather than spin on the error.
                guard.clear_ready();
                return Err(e);
            }
            // Would block: drained, readiness cleared.
            Err(_would_block) => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use fastpath::snapshot::{Neighbour, Route};

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn table() -> L2Table {
        L2Table {
            routes: vec![
                Route {
                    prefix: "0.0.0.0/0".parse().unwrap(),
                    port: 0,
                    gateway: Some(ip("198.18.0.254")),
                },
                Route {
                    prefix: "198.18.0.0/24".parse().unwrap(),
                    port: 0,
                    gateway: None,
                },
                Route {
                    prefix: "198.18.1.0/24".parse().unwrap(),
                    port: 1,
                    gateway: None,
                },
            ],
            neighbours: vec![Neighbour {
                ip: ip("198.18.1.7"),
                mac: [2, 0, 0, 0, 0, 7],
                port: Some(1),
            }],
            port_macs: vec![[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]],
        }
    }

    #[test]
    fn next_hop_is_the_longest_match_gateway_or_the_address() {
        let t = table();
        assert_eq!(next_hop(&t, ip("198.18.1.9")), Some((ip("198.18.1.9"), 1)));
        assert_eq!(next_hop(&t, ip("198.18.0.9")), Some((ip("198.18.0.9"), 0)));
        assert_eq!(
            next_hop(&t, ip("203.0.113.1")),
            Some((ip("198.18.0.254"), 0)),
            "off-link: the default route's gateway"
        );
        assert_eq!(next_hop(&t, ip("198.18.1.7")), None, "already resolved");
        assert_eq!(next_hop(&t, ip("2001:2::1")), None, "no route");
    }

    #[test]
    fn admit_rate_limits_each_hop_and_bounds_the_memory() {
        let t0 = Instant::now();
        let mut solicited = HashMap::new();
        let hop = ip("198.18.0.2");
        assert!(admit(&mut solicited, hop, t0));
        assert!(!admit(&mut solicited, hop, t0 + SOLICIT_INTERVAL / 2));
        assert!(admit(&mut solicited, hop, t0 + SOLICIT_INTERVAL));

        let mut full: HashMap<IpAddr, Instant> = (0..SOLICITED_MAX as u32)
            .map(|i| (IpAddr::V4(i.into()), t0))
            .collect();
        assert!(
            !admit(&mut full, hop, t0),
            "a new hop waits once SOLICITED_MAX are remembered"
        );
        let known = IpAddr::V4(0u32.into());
        assert!(
            admit(&mut full, known, t0 + SOLICIT_INTERVAL),
            "a remembered hop is still solicited again"
        );
        assert_eq!(full.len(), SOLICITED_MAX);
    }
}
