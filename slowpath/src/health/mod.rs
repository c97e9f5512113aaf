//! Active and passive health checks of backends (`[health]`, and each service's own check
//! over it: `[[services]] health`, a Kubernetes Service's `xvs.io/health-check-*`).
//!
//! # Semantics
//!
//! - **Targets.** What is probed is a [`Plan`]: each service with a check ([`Check`]: its
//!   own keys over `[health]`'s) and its backends. A [`Target`] is a backend with a check;
//!   services with equal checks share a backend's target (one probe, one judgement), a
//!   service with another check probes it on its own, and that judgement applies to that
//!   service only. A service whose probe is `none` has no targets: its backends are never
//!   judged, their source's readiness alone decides.
//! - **Start up.** A target the checker has not judged yet is [`Judgement::Unknown`]:
//!   *usable*, as IPVS and kube-proxy treat every endpoint without a health check (a restart
//!   of xvs must not take every backend out of service until probes finish), but not
//!   *verified*: the daemon announces a VIP over BGP only once one of its backends has passed
//!   a probe ([`Judgement::Up`]), so a node never draws a router's traffic on a backend it
//!   has not seen alive. The first passing probe makes it up; `fall` failed probes before
//!   one passes make it down (`fall × interval`). Nothing carries over a restart: the first
//!   probe of each process judges anew.
//! - **Rise and fall** (the target's check's). An up target goes down after `fall`
//!   *consecutive* failures; a down one comes back after `rise` consecutive successes. A
//!   success resets the failure run and a failure resets the success run, so a flapping
//!   backend stays where it is (pingora's and HAProxy's rule).
//! - **Probes** ([`probe()`]), to the backend's address, on the check's `port` when it has
//!   one. `tcp`: a TCP connect within `timeout`. `http`: connect, send
//!   `GET <http_path> HTTP/1.0`, read the status line; healthy on a status of `http_status`,
//!   or any 2xx or 3xx without one; everything (connect, write, read) within one `timeout`.
//!   `https`: the same over TLS, the certificate not verified (keepalived's `SSL_GET`), the
//!   handshake within the same `timeout`.
//! - **Schedule.** Each backend is probed every `interval` from the start of its last probe,
//!   never twice at once (not even when it leaves and comes back while a probe of it is
//!   still running); new backends' first probes are spread over one interval.
//! - **Passive.** [`HealthChecker::report_failure`] counts as one failed probe of every
//!   target of that backend address (the daemon feeds SYNs that got no SYN-ACK).
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

mod plan;
mod probe;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use plan::{Check, Plan, Target};
pub use probe::{probe, probe_http, probe_tcp};

/// Concurrent probes at most (the probe semaphore's permits).
pub const PROBES_MAX: usize = 64;
/// Passive reports waiting for the scheduler at most; more are dropped.
pub const PASSIVE_PENDING_MAX: usize = 1024;

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

/// What the handle tells the scheduler, in the order it was told.
enum Inbound {
    Targets(Arc<Plan>),
    Passive(SocketAddr),
}

/// State shared by the handle and the scheduler task.
#[derive(Default)]
struct Shared {
    /// As of the last event the scheduler handled.
    status: Mutex<HashMap<Target, TargetStatus>>,
    /// The plan last set (what the reader maps services' backends to targets with).
    plan: Mutex<Arc<Plan>>,
    /// Passive reports sent and not yet received by the scheduler.
    passive_pending: AtomicUsize,
}

impl Shared {
    fn status(&self) -> std::sync::MutexGuard<'_, HashMap<Target, TargetStatus>> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn plan(&self) -> Arc<Plan> {
        Arc::clone(&self.plan.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The health checker: a scheduler task and at most [`PROBES_MAX`] probe tasks on the
/// slowpath runtime (see the module doc). Dropping it stops the tasks without waiting.
pub struct HealthChecker {
    inbox: mpsc::UnboundedSender<Inbound>,
    shared: Arc<Shared>,
    /// A child of the caller's `shutdown`: cancelled by it, or by dropping the checker.
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HealthChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthChecker").finish_non_exhaustive()
    }
}

impl HealthChecker {
    /// Starts the checker on `rt` (the slowpath runtime) with nothing to probe yet (see
    /// [`HealthChecker::set_plan`]). `on_change` gets every target's judgement whenever one
    /// changes. The tasks end when `shutdown` is cancelled.
    pub fn spawn(
        rt: &tokio::runtime::Handle,
        on_change: impl FnMut(HashMap<Target, Judgement>) + Send + 'static,
        shutdown: CancellationToken,
    ) -> HealthChecker {
        let (mut checker, task) = HealthChecker::start_parts(rt, on_change, &shutdown);
        checker.task = Some(task);
        checker
    }

    /// [`HealthChecker::spawn`], the task apart (for [`HealthService`]).
    fn start_parts(
        rt: &tokio::runtime::Handle,
        on_change: impl FnMut(HashMap<Target, Judgement>) + Send + 'static,
        shutdown: &CancellationToken,
    ) -> (HealthChecker, JoinHandle<()>) {
        let (inbox, rx) = mpsc::unbounded_channel();
        let shared = Arc::<Shared>::default();
        let stop = shutdown.child_token();
        let scheduler = Scheduler {
            targets: HashMap::new(),
            by_addr: HashMap::new(),
            orphans: HashSet::new(),
            shared: Arc::clone(&shared),
            permits: Arc::new(Semaphore::new(PROBES_MAX)),
            probes: JoinSet::new(),
            due: Vec::new(),
        };
        let task = rt.spawn(scheduler.run(rx, on_change, stop.clone()));
        let checker = HealthChecker {
            inbox,
            shared,
            stop,
            task: None,
        };
        (checker, task)
    }

    /// Sets what to probe. Targets already known keep their state; new ones start unknown.
    /// Never blocks; callable from any thread.
    pub fn set_plan(&self, plan: Arc<Plan>) {
        *self.shared.plan.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&plan);
        // Fails only once the scheduler has ended, when nothing is checked any more.
        let _ = self.inbox.send(Inbound::Targets(plan));
    }

    /// A passive failure of backend `addr` (e.g. a SYN that got no SYN-ACK): counted as one
    /// failed probe of each of its targets. Ignored for an address no target has, and when
    /// [`PASSIVE_PENDING_MAX`] reports already wait. Never blocks; callable from any thread.
    pub fn report_failure(&self, addr: SocketAddr) {
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
    pub fn status(&self) -> HashMap<Target, TargetStatus> {
        self.shared.status().clone()
    }

    /// A cheap handle that reads the judgements (for the admin API).
    pub fn reader(&self) -> HealthReader {
        HealthReader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Whether `target` takes new flows (unknown or up); targets the checker does not know do.
    pub fn is_up(&self, target: &Target) -> bool {
        self.shared
            .status()
            .get(target)
            .is_none_or(|s| s.tracker.up)
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

/// The health checker as a [`crate::service::Service`]: its handle is the
/// [`HealthChecker`] (without its task, which the driver awaits), `on_change` as in
/// [`HealthChecker::spawn`].
pub struct HealthService<F> {
    /// Gets every target's judgement whenever one changes.
    pub on_change: F,
}

impl<F> crate::service::Service for HealthService<F>
where
    F: FnMut(HashMap<Target, Judgement>) + Send + 'static,
{
    type Handle = HealthChecker;
    type Error = std::convert::Infallible;
    const NAME: &'static str = "the health checker";

    fn start(
        self,
        rt: &tokio::runtime::Handle,
        shutdown: &CancellationToken,
    ) -> Result<crate::service::Running<HealthChecker>, Self::Error> {
        let (handle, task) = HealthChecker::start_parts(rt, self.on_change, shutdown);
        Ok(crate::service::Running { handle, task })
    }
}

/// Reads the checker's judgements from anywhere (see [`HealthChecker::reader`]).
#[derive(Clone)]
pub struct HealthReader {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for HealthReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthReader").finish_non_exhaustive()
    }
}

impl HealthReader {
    /// The judgement of every target, as of the last event the scheduler handled, with the
    /// plan that says which target judges which service's backend.
    pub fn judgements(&self) -> Judged {
        let states = self
            .shared
            .status()
            .iter()
            .map(|(t, s)| (t.clone(), s.tracker.judgement()))
            .collect();
        Judged {
            plan: self.shared.plan(),
            states,
        }
    }
}

/// What [`HealthReader::judgements`] returns.
#[derive(Clone, Debug, Default)]
pub struct Judged {
    /// The plan the targets come from.
    pub plan: Arc<Plan>,
    /// Each target's judgement.
    pub states: HashMap<Target, Judgement>,
}

impl Judged {
    /// The judgement of backend `addr` of `service`; `None` when it is not probed.
    pub fn get(&self, service: &str, addr: SocketAddr) -> Option<Judgement> {
        let t = self.plan.target(service, addr)?;
        Some(self.states.get(&t).copied().unwrap_or(Judgement::Unknown))
    }
}

impl Drop for HealthChecker {
    fn drop(&mut self) {
        // Nobody can set targets or read the status any more: probing on is pointless.
        self.stop.cancel();
    }
}

struct TargetState {
    status: TargetStatus,
    next_due: Instant,
    in_flight: bool,
}

/// The outcome of one probe task.
struct Probed {
    target: Target,
    outcome: Result<(), String>,
}

struct Scheduler {
    targets: HashMap<Target, TargetState>,
    /// The targets of each backend address (for passive reports).
    by_addr: HashMap<SocketAddr, Vec<Target>>,
    /// Targets whose probe is still running although they left: a target that comes back
    /// waits for that probe to end (never two probes of one target). At most
    /// [`PROBES_MAX`] entries, one per probe task.
    orphans: HashSet<Target>,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    probes: JoinSet<Probed>,
    /// Scratch: the targets due now, earliest first.
    due: Vec<(Instant, Target)>,
}

impl Scheduler {
    async fn run(
        mut self,
        mut inbox: mpsc::UnboundedReceiver<Inbound>,
        mut on_change: impl FnMut(HashMap<Target, Judgement>),
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
                        .map(|(t, s)| (t.clone(), s.status.tracker.judgement()))
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
        for (target, t) in &self.targets {
            if t.in_flight {
                continue;
            }
            if t.next_due <= now {
                self.due.push((t.next_due, target.clone()));
            } else {
                wake = Some(wake.map_or(t.next_due, |w| w.min(t.next_due)));
            }
        }
        self.due.sort_unstable();
        for (_, target) in self.due.drain(..) {
            let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
                // Saturated: the rest stay due; the next probe to finish frees a permit.
                break;
            };
            let Some(t) = self.targets.get_mut(&target) else {
                continue;
            };
            t.in_flight = true;
            t.next_due = now + target.check.interval;
            self.probes.spawn(async move {
                let outcome = probe(target.addr, &target.check).await;
                drop(permit);
                Probed { target, outcome }
            });
        }
        wake
    }

    /// Applies one message; returns true when a target's judgement changed.
    fn handle(&mut self, msg: Inbound) -> bool {
        match msg {
            Inbound::Targets(plan) => {
                self.set_targets(plan.targets());
                false
            }
            Inbound::Passive(addr) => {
                self.shared.passive_pending.fetch_sub(1, Ordering::AcqRel);
                let Some(list) = self.by_addr.get(&addr) else {
                    return false;
                };
                let mut changed = false;
                for target in list {
                    if let Some(t) = self.targets.get_mut(target) {
                        let why = Err("passive: connection attempt failed".to_owned());
                        changed |= record(target, t, why);
                    }
                }
                changed
            }
        }
    }

    /// Applies one finished probe; returns true when a target's judgement changed.
    fn finished(&mut self, done: Result<Probed, tokio::task::JoinError>) -> bool {
        let Probed { target, outcome } = match done {
            Ok(p) => p,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only `shutdown()` aborts probes, and it waits for them itself.
            Err(_) => return false,
        };
        if self.orphans.remove(&target) {
            // The probe of a target that left; a comeback may probe now.
            if let Some(t) = self.targets.get_mut(&target) {
                t.in_flight = false;
            }
            return false;
        }
        self.targets.get_mut(&target).is_some_and(|t| {
            t.in_flight = false;
            record(&target, t, outcome)
        })
    }

    fn set_targets(&mut self, list: &[Target]) {
        let keep: HashSet<&Target> = list.iter().collect();
        let orphans = &mut self.orphans;
        self.targets.retain(|target, t| {
            let kept = keep.contains(target);
            if !kept && t.in_flight {
                orphans.insert(target.clone());
            }
            kept
        });
        // `list` is sorted: the spread below does not depend on hashing.
        let new: Vec<&Target> = list
            .iter()
            .filter(|t| !self.targets.contains_key(*t))
            .collect();
        let now = Instant::now();
        let n = new.len() as u32;
        for (i, target) in new.into_iter().enumerate() {
            // Spread first probes over one interval instead of probing everyone at once.
            let offset = target.check.interval * i as u32 / n.max(1);
            self.targets.insert(
                target.clone(),
                TargetState {
                    status: TargetStatus::new(),
                    next_due: now + offset,
                    in_flight: self.orphans.contains(target),
                },
            );
        }
        self.by_addr.clear();
        for target in list {
            self.by_addr
                .entry(target.addr)
                .or_default()
                .push(target.clone());
        }
    }

    fn publish(&self) {
        let snapshot = self
            .targets
            .iter()
            .map(|(target, t)| (target.clone(), t.status.clone()))
            .collect();
        *self.shared.status() = snapshot;
    }
}

/// Records one outcome for `target`; returns true when its judgement changed.
fn record(target: &Target, t: &mut TargetState, outcome: Result<(), String>) -> bool {
    t.status.checks += 1;
    let ok = outcome.is_ok();
    t.status.last_error = outcome.err();
    let before = t.status.tracker.judgement();
    let changed = t
        .status
        .tracker
        .record(ok, target.check.rise, target.check.fall);
    let error = t.status.last_error.as_deref().unwrap_or_default();
    let checks = t.status.checks;
    let (addr, probe) = (target.addr, target.check.probe.name());
    match (changed, before, t.status.tracker.judgement()) {
        // Every backend passes its first probe after a start: not worth a line each.
        (true, Judgement::Unknown, Judgement::Up) => {
            tracing::debug!(backend = %addr, probe, checks, "backend verified: its first probe passed");
        }
        (true, _, Judgement::Up) => tracing::info!(backend = %addr, probe, checks, "backend up"),
        (true, _, _) => tracing::warn!(backend = %addr, probe, checks, error, "backend down"),
        (false, _, _) if !ok => {
            tracing::debug!(backend = %addr, probe, error, "health check failed")
        }
        (false, _, _) => {}
    }
    changed
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
}
