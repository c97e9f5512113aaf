//! The background thread that keeps an [`L2Table`] current.
//!
//! One thread waits on three things with `poll`: a NETLINK_ROUTE socket subscribed to link,
//! neighbour and route events; an eventfd that [`NeighbourRequester::request`] and `stop`
//! ring; and the periodic re-read deadline. Events only bring the next re-read forward (at
//! most one per [`EVENT_DEBOUNCE`]), so a burst of kernel changes costs one dump. The
//! periodic read stays as the safety net for events lost to a full socket buffer.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fastpath::snapshot::L2Table;
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

use super::{read_l2, solicit};

/// How long after a re-read a netlink event may trigger the next one.
const EVENT_DEBOUNCE: Duration = Duration::from_millis(20);
/// The shortest interval between two solicitations of one next hop.
const SOLICIT_INTERVAL: Duration = Duration::from_secs(1);
/// Unresolved next hops waiting for the watcher thread; more are dropped (the fastpath
/// reports again on its next frame to them).
const REQUESTS_MAX: usize = 256;
/// Next hops remembered for rate limiting; past this, requests wait for the next prune.
const SOLICITED_MAX: usize = 4096;
/// Receive buffer for draining netlink events (their content is not read).
const EVENT_BUF_LEN: usize = 64 * 1024;

const _: () = assert!(REQUESTS_MAX <= SOLICITED_MAX);

/// rtnetlink multicast groups (`RTNLGRP_*` in linux/rtnetlink.h) that change an `L2Table`.
const GROUPS: [u32; 4] = [
    1,  // RTNLGRP_LINK
    3,  // RTNLGRP_NEIGH
    7,  // RTNLGRP_IPV4_ROUTE
    11, // RTNLGRP_IPV6_ROUTE
];

/// State shared by the watcher thread, its handle and requesters.
struct Shared {
    stop: AtomicBool,
    /// Set by whoever rang `wake` until the thread has drained the requests.
    wake_pending: AtomicBool,
    wake: OwnedFd,
    last_error: Mutex<Option<String>>,
}

impl Shared {
    fn ring(&self) {
        if !self.wake_pending.swap(true, Ordering::AcqRel) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd we own. A failure can
            // only be a saturated counter, which wakes the thread all the same.
            unsafe { libc::write(self.wake.as_raw_fd(), (&raw const one).cast(), 8) };
        }
    }

    fn set_error(&self, e: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = e;
    }
}

/// Keeps the kernel's L2 view of some interfaces current on a background thread (see the
/// module doc). Stops when dropped.
pub struct NeighbourWatcher {
    shared: Arc<Shared>,
    requester: NeighbourRequester,
    thread: Option<JoinHandle<()>>,
}

/// A cloneable handle through which the fastpath reports unresolved next hops.
#[derive(Clone)]
pub struct NeighbourRequester {
    tx: SyncSender<IpAddr>,
    shared: Arc<Shared>,
}

impl NeighbourRequester {
    /// Asks the watcher to solicit `ip` (see [`NeighbourWatcher::request`]). Never blocks.
    pub fn request(&self, ip: IpAddr) {
        match self.tx.try_send(ip) {
            Ok(()) => self.shared.ring(),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
        }
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

    /// Starts the thread in the caller's network namespace. It reads at once, then on every
    /// link/route/neighbour event and every `period`, and calls `on_change` with the table
    /// whenever it differs from the last one passed (the first read always does). A failed
    /// read keeps the last table; see [`NeighbourWatcher::last_error`].
    pub fn spawn(
        interfaces: Vec<String>,
        period: Duration,
        on_change: impl FnMut(L2Table) + Send + 'static,
    ) -> std::io::Result<Self> {
        let mut events = Socket::new(NETLINK_ROUTE)?;
        events.bind_auto()?;
        for g in GROUPS {
            events.add_membership(g)?;
        }
        events.set_non_blocking(true)?;
        // SAFETY: plain syscall; the result is checked before use.
        let fd: RawFd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            wake_pending: AtomicBool::new(false),
            wake,
            last_error: Mutex::new(None),
        });
        let (tx, rx) = std::sync::mpsc::sync_channel(REQUESTS_MAX);
        let worker = Worker {
            interfaces,
            period,
            shared: Arc::clone(&shared),
            events,
            requests: rx,
            current: None,
            solicited: HashMap::new(),
        };
        let thread = std::thread::Builder::new()
            .name("xvs-neigh".into())
            .spawn(move || worker.run(on_change))?;
        Ok(NeighbourWatcher {
            requester: NeighbourRequester {
                tx,
                shared: Arc::clone(&shared),
            },
            shared,
            thread: Some(thread),
        })
    }

    /// Reports a next hop the fastpath has no MAC for. The watcher solicits it on the
    /// interface its route leaves by (through the route's gateway, if it has one) at most
    /// once per second; requests beyond a small queue, or for destinations no route of
    /// the configured interfaces covers, are dropped. Never blocks.
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

    /// Stops the thread and waits for it.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for NeighbourWatcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_pending.store(false, Ordering::Release);
        self.shared.ring();
        if let Some(t) = self.thread.take() {
            // A panic in `on_change` already ended the thread; nothing left to do.
            let _ = t.join();
        }
    }
}

/// The watcher thread's state.
struct Worker {
    interfaces: Vec<String>,
    period: Duration,
    shared: Arc<Shared>,
    events: Socket,
    requests: Receiver<IpAddr>,
    current: Option<L2Table>,
    /// Next hop → when it was last solicited.
    solicited: HashMap<IpAddr, Instant>,
}

impl Worker {
    fn run(mut self, mut on_change: impl FnMut(L2Table)) {
        let mut last_read = Instant::now();
        let mut next_read = last_read;
        let mut buf = Vec::with_capacity(EVENT_BUF_LEN);
        while !self.shared.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= next_read {
                self.reread(&mut on_change);
                last_read = Instant::now();
                next_read = last_read + self.period;
                self.solicited
                    .retain(|_, at| last_read.duration_since(*at) < SOLICIT_INTERVAL);
            }
            self.shared.wake_pending.store(false, Ordering::Release);
            while let Ok(ip) = self.requests.try_recv() {
                self.solicit(ip);
            }
            let (event, _woken) = self.wait(next_read.saturating_duration_since(Instant::now()));
            if event {
                self.drain_events(&mut buf);
                next_read = next_read.min(last_read + EVENT_DEBOUNCE);
            }
        }
    }

    fn reread(&mut self, on_change: &mut impl FnMut(L2Table)) {
        match read_l2(&self.interfaces) {
            Ok(table) => {
                self.shared.set_error(None);
                if self.current.as_ref() != Some(&table) {
                    self.current = Some(table.clone());
                    on_change(table);
                }
            }
            Err(e) => self.shared.set_error(Some(e.to_string())),
        }
    }

    fn solicit(&mut self, ip: IpAddr) {
        let Some(table) = &self.current else { return };
        // Longest matching prefix; its gateway, if any, is the next hop to resolve.
        let Some(route) = table
            .routes
            .iter()
            .filter(|r| r.prefix.contains(ip))
            .max_by_key(|r| r.prefix.prefix)
        else {
            return;
        };
        let hop = route.gateway.unwrap_or(ip);
        if table.neighbours.iter().any(|n| n.ip == hop) {
            return;
        }
        let now = Instant::now();
        if let Some(at) = self.solicited.get(&hop)
            && now.duration_since(*at) < SOLICIT_INTERVAL
        {
            return;
        }
        if self.solicited.len() >= SOLICITED_MAX && !self.solicited.contains_key(&hop) {
            return;
        }
        self.solicited.insert(hop, now);
        let Some(interface) = self.interfaces.get(usize::from(route.port)) else {
            return;
        };
        if let Err(e) = solicit(hop, interface) {
            self.shared.set_error(Some(e.to_string()));
        }
    }

    /// Waits up to `timeout`; returns (netlink event readable, woken through the eventfd).
    fn wait(&self, timeout: Duration) -> (bool, bool) {
        let mut fds = [
            libc::pollfd {
                fd: self.events.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.shared.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Round up so that the deadline has passed when poll times out.
        let timeout_ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a live array of two pollfds.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if rc <= 0 {
            // Timeout, or EINTR: the loop re-checks everything either way.
            return (false, false);
        }
        let woken = fds[1].revents != 0;
        if woken {
            let mut count: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd we own.
            unsafe { libc::read(self.shared.wake.as_raw_fd(), (&raw mut count).cast(), 8) };
        }
        (fds[0].revents != 0, woken)
    }

    /// Empties the event socket; what changed does not matter, a re-read follows.
    fn drain_events(&self, buf: &mut Vec<u8>) {
        loop {
            buf.clear();
            match self.events.recv(buf, 0) {
                Ok(_) => {}
                // ENOBUFS: events were lost; the re-read that follows covers them.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(_) => return,
            }
        }
    }
}
