//! Active and passive health checks of backends (`[health]`).
//!
//! # Semantics
//!
//! - **Start up.** A backend the checker has not judged yet is [`Judgement::Unknown`]:
//!   *usable*, as IPVS and kube-proxy treat every endpoint without a health check (a restart
//!   of xvs must not take every backend out of service until probes finish), but not
//!   *verified*: the daemon announces a VIP over BGP only once one of its backends has passed
//!   a probe ([`Judgement::Up`]), so a node never draws a router's traffic on a backend it
//!   has not seen alive. The first passing probe makes it up; `fall` failed probes before
//!   one passes make it down (`fall × interval`). Nothing carries over a restart: the first
//!   probe of each process judges anew.
//! - **Rise and fall.** An up backend goes down after `fall` *consecutive* failures; a down
//!   backend comes back after `rise` consecutive successes. A success resets the failure
//!   run and a failure resets the success run, so a flapping backend stays where it is
//!   (pingora's and HAProxy's rule).
//! - **Probes.** `tcp`: a TCP connect within `timeout`. `http`: connect, send
//!   `GET <http_path> HTTP/1.0`, read the status line; 2xx and 3xx are healthy; everything
//!   (connect, write, read) within one `timeout`. `none`: no probes at all, every backend is
//!   up and passive reports are ignored (nothing would bring a backend back).
//! - **Schedule.** Each backend is probed every `interval` from the start of its last probe,
//!   never twice at once (not even when it leaves and comes back while a probe of it is
//!   still running); new backends' first probes are spread over one interval.
//! - **Passive.** [`HealthChecker::report_failure`] counts as one failed probe (the daemon
//!   feeds SYNs that got no SYN-ACK).
//! - **Bounded.** One scheduler task and at most [`PROBES_MAX`] probe tasks, whatever the
//!   number of backends: the scheduler takes a permit of a [`Semaphore`] *before* it spawns
//!   a probe, so a pool saturated by timeouts delays probes (earliest due first), it never
//!   spawns more. At most [`PASSIVE_PENDING_MAX`] passive reports wait for the scheduler;
//!   more are dropped (the active probes still judge the backend).
//! - **Callback.** `on_change` runs on the scheduler task whenever a backend's judgement
//!   changes (a flip between up and down, and the first passing probe: unknown → up), with
//!   the judgement of *every* current target; the daemon maps down onto
//!   `BackendSpec::usable` (and publishes a snapshot) and up onto what BGP may announce.
//!   Adding or removing targets does not call it (new targets start unknown; removed ones
//!   are simply gone). It must not block for long: it runs on a runtime worker.
//! - **Shutdown.** The tasks end when the `shutdown` token is cancelled (or the checker is
//!   dropped); probes in flight are aborted, not waited for. Once
//!   [`HealthChecker::join`] returns, `on_change` has been dropped: it is never called again.
//!
//! The tasks run on the slowpath's tokio runtime, which needs its I/O and time drivers
//! (`enable_all`). Every clock read is `tokio::time`'s.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use config::ProbeKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Concurrent probes at most (the probe semaphore's permits).
pub const PROBES_MAX: usize = 64;
/// Passive reports waiting for the scheduler at most; more are dropped.
pub const PASSIVE_PENDING_MAX: usize = 1024;
/// Longest an HTTP status line may be.
const STATUS_LINE_MAX: usize = 1024;

const _: () = assert!(PROBES_MAX > 0 && PROBES_MAX <= Semaphore::MAX_PERMITS);

/// What the checker says of one backend (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Judgement {
    /// Not judged yet: no probe has passed since it became a target, and it has not failed
    /// `fall` in a row either. Usable (it takes new flows), not verified (it announces
    /// nothing).
    Unknown,
    /// A probe passed, and it has not been judged down since.
    Up,
    /// `fall` consecutive failures, and not `rise` consecutive successes since.
    Down,
}

impl Judgement {
    /// Whether it may take new flows: anything but down.
    pub fn usable(self) -> bool {
        self != Judgement::Down
    }

    /// Whether a probe has shown it alive: up.
    pub fn verified(self) -> bool {
        self == Judgement::Up
    }

    /// `unknown`, `up` or `down`.
    pub fn name(self) -> &'static str {
        match self {
            Judgement::Unknown => "unknown",
            Judgement::Up => "up",
            Judgement::Down => "down",
        }
    }
}

/// The rise/fall state of one backend; pure, no clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracker {
    /// Current judgement for forwarding: not down (unknown or up).
    pub up: bool,
    /// A probe has passed since it became a target (what makes an `up` backend verified).
    pub passed: bool,
    /// Consecutive successes (reset by a failure).
    pub successes: u32,
    /// Consecutive failures (reset by a success).
    pub failures: u32,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker::new()
    }
}

impl Tracker {
    /// A backend not judged yet: unknown (usable, not verified).
    pub const fn new() -> Tracker {
        Tracker {
            up: true,
            passed: false,
            successes: 0,
            failures: 0,
        }
    }

    /// The judgement: down, up once a probe has passed, else unknown.
    pub fn judgement(&self) -> Judgement {
        match (self.up, self.passed) {
            (false, _) => Judgement::Down,
            (true, true) => Judgement::Up,
            (true, false) => Judgement::Unknown,
        }
    }

    /// Records one probe outcome; returns true when the judgement changed (`up` flipped, or
    /// the first success made an unknown backend up).
    pub fn record(&mut self, ok: bool, rise: u32, fall: u32) -> bool {
        let before = self.judgement();
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            self.passed = true;
            if !self.up && self.successes >= rise {
                self.up = true;
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.up && self.failures >= fall {
                self.up = false;
            }
        }
        self.judgement() != before
    }
}

/// What the checker knows about one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetStatus {
    /// Rise/fall state.
    pub tracker: Tracker,
    /// Outcomes recorded (active probes and passive reports).
    pub checks: u64,
    /// The last failure's cause, if the last outcome was a failure.
    pub last_error: Option<String>,
}

impl TargetStatus {
    const fn new() -> TargetStatus {
        TargetStatus {
            tracker: Tracker::new(),
            checks: 0,
            last_error: None,
        }
    }
}

/// Probe settings (from `[health]`).
#[derive(Clone, Debug)]
struct Settings {
    probe: ProbeKind,
    interval: Duration,
    timeout: Duration,
    rise: u32,
    fall: u32,
    http_path: String,
}

/// What the handle tells the scheduler, in the order it was told.
enum Inbound {
    Targets(Vec<SocketAddr>),
    Passive(SocketAddr),
}

/// State shared by the handle and the scheduler task.
#[derive(Default)]
struct Shared {
    /// As of the last event the scheduler handled.
    status: Mutex<HashMap<SocketAddr, TargetStatus>>,
    /// Passive reports sent and not yet received by the scheduler.
    passive_pending: AtomicUsize,
}

impl Shared {
    fn status(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, TargetStatus>> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The health checker: a scheduler task and at most [`PROBES_MAX`] probe tasks on the
/// slowpath runtime (see the module doc). Dropping it stops the tasks without waiting.
pub struct HealthChecker {
    inbox: mpsc::UnboundedSender<Inbound>,
    shared: Arc<Shared>,
    probe: ProbeKind,
    /// A child of the caller's `shutdown`: cancelled by it, or by dropping the checker.
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HealthChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthChecker")
            .field("probe", &self.probe)
            .finish_non_exhaustive()
    }
}

impl HealthChecker {
    /// Starts checking with `cfg` on `rt` (the slowpath runtime; no targets yet: see
    /// [`HealthChecker::set_targets`]). `on_change` gets every target's judgement whenever
    /// one changes. The tasks end when `shutdown` is cancelled. With `probe = "none"` no task
    /// starts and `on_change` is dropped at once, never called.
    pub fn spawn(
        rt: &tokio::runtime::Handle,
        cfg: &config::Health,
        on_change: impl FnMut(HashMap<SocketAddr, Judgement>) + Send + 'static,
        shutdown: CancellationToken,
    ) -> HealthChecker {
        let settings = Settings {
            probe: cfg.probe,
            interval: cfg.interval.get().max(Duration::from_millis(1)),
            timeout: cfg.timeout.get().max(Duration::from_millis(1)),
            rise: cfg.rise.max(1),
            fall: cfg.fall.max(1),
            http_path: cfg.http_path.clone(),
        };
        let (inbox, rx) = mpsc::unbounded_channel();
        let shared = Arc::<Shared>::default();
        let stop = shutdown.child_token();
        let task = (settings.probe != ProbeKind::None).then(|| {
            let scheduler = Scheduler {
                settings: Arc::new(settings),
                targets: HashMap::new(),
                orphans: HashSet::new(),
                shared: Arc::clone(&shared),
                permits: Arc::new(Semaphore::new(PROBES_MAX)),
                probes: JoinSet::new(),
                due: Vec::new(),
            };
            rt.spawn(scheduler.run(rx, on_change, stop.clone()))
        });
        HealthChecker {
            inbox,
            shared,
            probe: cfg.probe,
            stop,
            task,
        }
    }

    /// Sets the backends to check. Known ones keep their state; new ones start unknown. Never
    /// blocks; callable from any thread.
    pub fn set_targets(&self, targets: Vec<SocketAddr>) {
        if self.probe == ProbeKind::None {
            let mut st = self.shared.status();
            st.retain(|a, _| targets.contains(a));
            for t in targets {
                st.entry(t).or_insert_with(TargetStatus::new);
            }
            return;
        }
        // Fails only once the scheduler has ended, when nothing is checked any more.
        let _ = self.inbox.send(Inbound::Targets(targets));
    }

    /// A passive failure (e.g. a SYN that got no SYN-ACK): counted as one failed probe.
    /// Ignored for unknown targets, with `probe = "none"`, and when
    /// [`PASSIVE_PENDING_MAX`] reports already wait. Never blocks; callable from any thread.
    pub fn report_failure(&self, addr: SocketAddr) {
        if self.probe == ProbeKind::None {
            return;
        }
        let pending = &self.shared.passive_pending;
        if pending.fetch_add(1, Ordering::AcqRel) >= PASSIVE_PENDING_MAX {
            pending.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        if self.inbox.send(Inbound::Passive(addr)).is_err() {
            pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Every target's current status (as of the last event the scheduler handled).
    pub fn status(&self) -> HashMap<SocketAddr, TargetStatus> {
        self.shared.status().clone()
    }

    /// A cheap handle that reads the judgements (for the admin API).
    pub fn reader(&self) -> HealthReader {
        HealthReader {
            shared: Arc::clone(&self.shared),
            probing: self.probe != ProbeKind::None,
        }
    }

    /// Whether `addr` takes new flows (unknown or up); targets the checker does not know do.
    pub fn is_up(&self, addr: SocketAddr) -> bool {
        self.shared.status().get(&addr).is_none_or(|s| s.tracker.up)
    }

    /// Waits for the checker's tasks to end (after `shutdown` is cancelled: this does not
    /// stop them). Probes in flight are aborted, so this takes no probe `timeout`. Once it
    /// returns, `on_change` has been dropped. A panic of `on_change` is resumed here.
    pub async fn join(mut self) {
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// Reads the checker's judgements from anywhere (see [`HealthChecker::reader`]).
#[derive(Clone)]
pub struct HealthReader {
    shared: Arc<Shared>,
    probing: bool,
}

impl std::fmt::Debug for HealthReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthReader")
            .field("probing", &self.probing)
            .finish_non_exhaustive()
    }
}

impl HealthReader {
    /// The judgement of every target, as of the last event the scheduler handled; empty
    /// when nothing is probed (`probe = "none"`).
    pub fn judgements(&self) -> HashMap<SocketAddr, Judgement> {
        if !self.probing {
            return HashMap::new();
        }
        self.shared
            .status()
            .iter()
            .map(|(a, s)| (*a, s.tracker.judgement()))
            .collect()
    }
}

impl Drop for HealthChecker {
    fn drop(&mut self) {
        // Nobody can set targets or read the status any more: probing on is pointless.
        self.stop.cancel();
    }
}

struct Target {
    status: TargetStatus,
    next_due: Instant,
    in_flight: bool,
}

/// The outcome of one probe task.
struct Probed {
    addr: SocketAddr,
    outcome: Result<(), String>,
}

struct Scheduler {
    settings: Arc<Settings>,
    targets: HashMap<SocketAddr, Target>,
    /// Addresses whose probe is still running although they left the targets: a target
    /// that comes back waits for that probe to end (never two probes of one address).
    /// At most [`PROBES_MAX`] entries, one per probe task.
    orphans: HashSet<SocketAddr>,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    probes: JoinSet<Probed>,
    /// Scratch: the targets due now, earliest first.
    due: Vec<(Instant, SocketAddr)>,
}

impl Scheduler {
    async fn run(
        mut self,
        mut inbox: mpsc::UnboundedReceiver<Inbound>,
        mut on_change: impl FnMut(HashMap<SocketAddr, Judgement>),
        stop: CancellationToken,
    ) {
        loop {
            let wake = self.start_due_probes(Instant::now());
            let mut changed = false;
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                msg = inbox.recv() => {
                    // `None`: every handle is gone, and dropping the last one cancels `stop`.
                    let Some(msg) = msg else { break };
                    changed |= self.handle(msg);
                    // Handle everything queued, then publish once.
                    while let Ok(msg) = inbox.try_recv() {
                        changed |= self.handle(msg);
                    }
                }
                Some(done) = self.probes.join_next(), if !self.probes.is_empty() => {
                    changed |= self.finished(done);
                    while let Some(done) = self.probes.try_join_next() {
                        changed |= self.finished(done);
                    }
                }
                // The next idle target falls due. Without one (all in flight, or due and
                // waiting for a permit) a finishing probe or a message wakes the loop.
                () = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)),
                    if wake.is_some() => continue,
            }
            self.publish();
            if changed {
                on_change(
                    self.targets
                        .iter()
                        .map(|(a, t)| (*a, t.status.tracker.judgement()))
                        .collect(),
                );
            }
        }
        // Aborts the probes in flight and waits until they are gone (their sockets closed).
        self.probes.shutdown().await;
    }

    /// Starts every due probe a permit is free for, earliest due first; returns when the
    /// next idle target falls due, if one is not due yet.
    fn start_due_probes(&mut self, now: Instant) -> Option<Instant> {
        let mut wake: Option<Instant> = None;
        self.due.clear();
        for (addr, t) in &self.targets {
            if t.in_flight {
                continue;
            }
            if t.next_due <= now {
                self.due.push((t.next_due, *addr));
            } else {
                wake = Some(wake.map_or(t.next_due, |w| w.min(t.next_due)));
            }
        }
        self.due.sort_unstable();
        for &(_, addr) in &self.due {
            let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
                // Saturated: the rest stay due; the next probe to finish frees a permit.
                break;
            };
            let Some(t) = self.targets.get_mut(&addr) else {
                continue;
            };
            t.in_flight = true;
            t.next_due = now + self.settings.interval;
            let settings = Arc::clone(&self.settings);
            self.probes.spawn(async move {
                let outcome = probe(addr, &settings).await;
                drop(permit);
                Probed { addr, outcome }
            });
        }
        wake
    }

    /// Applies one message; returns true when a backend's judgement changed.
    fn handle(&mut self, msg: Inbound) -> bool {
        match msg {
            Inbound::Targets(list) => {
                self.set_targets(list);
                false
            }
            Inbound::Passive(addr) => {
                self.shared.passive_pending.fetch_sub(1, Ordering::AcqRel);
                let s = &self.settings;
                self.targets.get_mut(&addr).is_some_and(|t| {
                    let why = Err("passive: connection attempt failed".to_owned());
                    record(addr, t, why, s.rise, s.fall)
                })
            }
        }
    }

    /// Applies one finished probe; returns true when a backend's judgement changed.
    fn finished(&mut self, done: Result<Probed, tokio::task::JoinError>) -> bool {
        let Probed { addr, outcome } = match done {
            Ok(p) => p,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only `shutdown()` aborts probes, and it waits for them itself.
            Err(_) => return false,
        };
        if self.orphans.remove(&addr) {
            // The probe of a target that left; a comeback may probe now.
            if let Some(t) = self.targets.get_mut(&addr) {
                t.in_flight = false;
            }
            return false;
        }
        let s = &self.settings;
        self.targets.get_mut(&addr).is_some_and(|t| {
            t.in_flight = false;
            record(addr, t, outcome, s.rise, s.fall)
        })
    }

    fn set_targets(&mut self, list: Vec<SocketAddr>) {
        let keep: HashSet<SocketAddr> = list.iter().copied().collect();
        let orphans = &mut self.orphans;
        self.targets.retain(|a, t| {
            let kept = keep.contains(a);
            if !kept && t.in_flight {
                orphans.insert(*a);
            }
            kept
        });
        let mut new: Vec<SocketAddr> = keep
            .into_iter()
            .filter(|a| !self.targets.contains_key(a))
            .collect();
        // A stable order, so the spread does not depend on hashing.
        new.sort_unstable();
        let now = Instant::now();
        let n = new.len() as u32;
        for (i, addr) in new.into_iter().enumerate() {
            // Spread first probes over one interval instead of probing everyone at once.
            let offset = self.settings.interval * i as u32 / n.max(1);
            self.targets.insert(
                addr,
                Target {
                    status: TargetStatus::new(),
                    next_due: now + offset,
                    in_flight: self.orphans.contains(&addr),
                },
            );
        }
    }

    fn publish(&self) {
        let snapshot = self
            .targets
            .iter()
            .map(|(a, t)| (*a, t.status.clone()))
            .collect();
        *self.shared.status() = snapshot;
    }
}

/// Records one outcome for `t`; returns true when its judgement changed.
fn record(
    addr: SocketAddr,
    t: &mut Target,
    outcome: Result<(), String>,
    rise: u32,
    fall: u32,
) -> bool {
    t.status.checks += 1;
    let ok = outcome.is_ok();
    t.status.last_error = outcome.err();
    let before = t.status.tracker.judgement();
    let changed = t.status.tracker.record(ok, rise, fall);
    let error = t.status.last_error.as_deref().unwrap_or_default();
    let checks = t.status.checks;
    match (changed, before, t.status.tracker.judgement()) {
        // Every backend passes its first probe after a start: not worth a line each.
        (true, Judgement::Unknown, Judgement::Up) => {
            tracing::debug!(backend = %addr, checks, "backend verified: its first probe passed");
        }
        (true, _, Judgement::Up) => tracing::info!(backend = %addr, checks, "backend up"),
        (true, _, _) => tracing::warn!(backend = %addr, checks, error, "backend down"),
        (false, _, _) if !ok => tracing::debug!(backend = %addr, error, "health check failed"),
        (false, _, _) => {}
    }
    changed
}

async fn probe(addr: SocketAddr, s: &Settings) -> Result<(), String> {
    match s.probe {
        ProbeKind::None => Ok(()),
        ProbeKind::Tcp => probe_tcp(addr, s.timeout).await,
        ProbeKind::Http => probe_http(addr, s.timeout, &s.http_path).await,
    }
}

/// A TCP connect within `timeout`.
pub async fn probe_tcp(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(_conn)) => Ok(()),
        Ok(Err(e)) => Err(format!("tcp connect: {e}")),
        Err(_) => Err("tcp connect: timed out".to_owned()),
    }
}

/// `GET path HTTP/1.0` within `timeout` (connect, write and read together); healthy on a
/// 2xx or 3xx status line.
pub async fn probe_http(addr: SocketAddr, timeout: Duration, path: &str) -> Result<(), String> {
    let mut stage = "connecting";
    let result = tokio::time::timeout(timeout, http_exchange(addr, path, &mut stage)).await;
    result.unwrap_or_else(|_| Err(format!("http: timed out {stage}")))
}

/// One HTTP exchange, without a deadline; `stage` says how far it got.
async fn http_exchange(
    addr: SocketAddr,
    path: &str,
    stage: &mut &'static str,
) -> Result<(), String> {
    let mut conn = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("http connect: {e}"))?;
    *stage = "writing the request";
    let req = format!(
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: xvs-health\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("http write: {e}"))?;
    *stage = "waiting for the status line";
    let mut buf = Vec::with_capacity(128);
    let mut chunk = [0u8; 256];
    while !buf.contains(&b'\n') && buf.len() < STATUS_LINE_MAX {
        match conn.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("http read: {e}")),
        }
    }
    status_verdict(&buf)
}

/// Judges the start of a response: healthy on a 2xx or 3xx status line.
fn status_verdict(head: &[u8]) -> Result<(), String> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Err("http: no status line".to_owned());
    };
    if !version.starts_with("HTTP/") {
        return Err(format!(
            "http: not an HTTP status line: {:?}",
            line.trim_end()
        ));
    }
    match code.parse::<u16>() {
        Ok(200..=399) => Ok(()),
        Ok(c) => Err(format!("http: status {c}")),
        Err(_) => Err(format!("http: bad status code {code:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_unknown_falls_after_exactly_fall_failures() {
        let mut t = Tracker::new();
        assert_eq!(t.judgement(), Judgement::Unknown);
        assert!(t.up, "unknown is usable");
        assert!(!t.record(false, 2, 3));
        assert!(!t.record(false, 2, 3));
        assert_eq!(t.judgement(), Judgement::Unknown);
        assert!(t.record(false, 2, 3));
        assert_eq!(t.judgement(), Judgement::Down);
        assert!(!t.up);
        assert!(!t.record(false, 2, 3), "already down: no change");
    }

    #[test]
    fn the_first_passing_probe_verifies_an_unknown_backend() {
        let mut t = Tracker::new();
        // One failure (fall 3) leaves it unknown; the first success makes it up at once,
        // whatever `rise` (which is how many a down backend needs to come back).
        assert!(!t.record(false, 5, 3));
        assert!(t.record(true, 5, 3), "unknown -> up is a change");
        assert_eq!(t.judgement(), Judgement::Up);
        assert!(t.judgement().verified() && t.judgement().usable());
        assert!(!t.record(true, 5, 3));
        // Down, then back up: `rise` successes, and verified again.
        for _ in 0..2 {
            assert!(!t.record(false, 5, 3));
        }
        assert!(t.record(false, 5, 3));
        assert!(!t.judgement().usable() && !t.judgement().verified());
        for _ in 0..4 {
            assert!(!t.record(true, 5, 3));
        }
        assert!(t.record(true, 5, 3));
        assert_eq!(t.judgement(), Judgement::Up);
        assert!(!Judgement::Unknown.verified() && Judgement::Unknown.usable());
    }

    #[test]
    fn rises_after_exactly_rise_successes() {
        let mut t = Tracker::new();
        assert!(t.record(false, 2, 1));
        assert!(!t.record(true, 2, 1));
        assert!(!t.up);
        assert!(t.record(true, 2, 1));
        assert!(t.up);
    }

    #[test]
    fn interleaved_outcomes_reset_the_runs() {
        let mut t = Tracker::new();
        assert!(t.record(true, 3, 3), "verified by its first probe");
        for _ in 0..10 {
            assert!(!t.record(false, 3, 3));
            assert!(!t.record(false, 3, 3));
            assert!(!t.record(true, 3, 3));
        }
        assert!(t.up, "never three failures in a row");
        assert!(!t.record(false, 3, 3));
        assert!(!t.record(false, 3, 3));
        assert!(t.record(false, 3, 3));
        for _ in 0..10 {
            assert!(!t.record(true, 3, 3));
            assert!(!t.record(true, 3, 3));
            assert!(!t.record(false, 3, 3));
        }
        assert!(!t.up, "never three successes in a row");
    }

    #[test]
    fn status_lines_are_judged_by_their_code() {
        for ok in [
            &b"HTTP/1.0 200 OK\r\n"[..],
            b"HTTP/1.1 204 No Content\r\nServer: x\r\n",
            b"HTTP/1.0 302 Found\n",
            b"HTTP/1.0 399",
        ] {
            assert_eq!(
                status_verdict(ok),
                Ok(()),
                "{:?}",
                String::from_utf8_lossy(ok)
            );
        }
        let err = |head: &[u8]| status_verdict(head).unwrap_err();
        assert_eq!(err(b"HTTP/1.0 500 Oops\r\n"), "http: status 500");
        assert_eq!(err(b"HTTP/1.0 199 Early\r\n"), "http: status 199");
        assert_eq!(err(b"HTTP/1.0 404 Not Found\r\n"), "http: status 404");
        assert_eq!(err(b""), "http: no status line");
        assert_eq!(err(b"HTTP/1.0\r\n"), "http: no status line");
        assert!(err(b"SSH-2.0 OpenSSH\r\n").contains("not an HTTP status line"));
        assert!(err(b"HTTP/1.0 abc\r\n").contains("bad status code"));
    }
}
