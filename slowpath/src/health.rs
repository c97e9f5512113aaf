//! Active and passive health checks of backends (`[health]`).
//!
//! # Semantics
//!
//! - **Start up.** A backend the checker has not judged yet is *up*, as IPVS and kube-proxy
//!   treat every endpoint without a health check: a restart of xvs must not take every
//!   backend out of service until probes finish. A backend that is really down is taken out
//!   after `fall` failed probes (`fall × interval`).
//! - **Rise and fall.** An up backend goes down after `fall` *consecutive* failures; a down
//!   backend comes back after `rise` consecutive successes. A success resets the failure
//!   run and a failure resets the success run, so a flapping backend stays where it is
//!   (pingora's and HAProxy's rule).
//! - **Probes.** `tcp`: a TCP connect within `timeout`. `http`: connect, send
//!   `GET <http_path> HTTP/1.0`, read the status line; 2xx and 3xx are healthy; everything
//!   (connect, write, read) within one `timeout`. `none`: no probes at all, every backend is
//!   up and passive reports are ignored (nothing would bring a backend back).
//! - **Schedule.** Each backend is probed every `interval` from the start of its last probe,
//!   never twice at once; new backends' first probes are spread over one interval.
//! - **Passive.** [`HealthChecker::report_failure`] counts as one failed probe (the daemon
//!   feeds SYNs that got no SYN-ACK).
//! - **Bounded.** One scheduler thread and [`PROBE_THREADS`] probe threads, whatever the
//!   number of backends; a pool saturated by timeouts delays probes, it never spawns more.
//! - **Callback.** `on_change` runs on the scheduler thread whenever a backend flips, with the
//!   state of *every* current target (`true` = up); the daemon maps it onto
//!   `BackendSpec::usable` and publishes a snapshot. Adding or removing targets does not call
//!   it (new targets start up; removed ones are simply gone).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use config::ProbeKind;

/// Probe threads (concurrent probes at most).
pub const PROBE_THREADS: usize = 4;
/// Longest an HTTP status line may be.
const STATUS_LINE_MAX: usize = 1024;
/// Longest the scheduler sleeps without looking at the clock.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// The rise/fall state of one backend; pure, no clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracker {
    /// Current judgement.
    pub up: bool,
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
    /// A backend not judged yet: up.
    pub const fn new() -> Tracker {
        Tracker {
            up: true,
            successes: 0,
            failures: 0,
        }
    }

    /// Records one probe outcome; returns true when `up` flipped.
    pub fn record(&mut self, ok: bool, rise: u32, fall: u32) -> bool {
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            if !self.up && self.successes >= rise {
                self.up = true;
                return true;
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.up && self.failures >= fall {
                self.up = false;
                return true;
            }
        }
        false
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

enum Event {
    Result {
        addr: SocketAddr,
        generation: u64,
        outcome: Result<(), String>,
    },
    Passive(SocketAddr),
    Targets(Vec<SocketAddr>),
    Stop,
}

struct Job {
    addr: SocketAddr,
    generation: u64,
}

type Status = Arc<Mutex<HashMap<SocketAddr, TargetStatus>>>;

/// The health checker: a scheduler thread and a fixed pool of probe threads.
pub struct HealthChecker {
    events: Sender<Event>,
    status: Status,
    probe: ProbeKind,
    threads: Vec<JoinHandle<()>>,
}

impl HealthChecker {
    /// Starts checking with `cfg` (no targets yet: see [`HealthChecker::set_targets`]).
    /// `on_change` gets every target's state whenever one flips. With `probe = "none"` no
    /// thread starts and `on_change` is never called.
    pub fn spawn(
        cfg: &config::Health,
        on_change: impl FnMut(HashMap<SocketAddr, bool>) + Send + 'static,
    ) -> io::Result<HealthChecker> {
        let settings = Settings {
            probe: cfg.probe,
            interval: cfg.interval.get().max(Duration::from_millis(1)),
            timeout: cfg.timeout.get().max(Duration::from_millis(1)),
            rise: cfg.rise.max(1),
            fall: cfg.fall.max(1),
            http_path: cfg.http_path.clone(),
        };
        let (events, rx) = mpsc::channel();
        let status: Status = Arc::default();
        let mut threads = Vec::new();
        if settings.probe != ProbeKind::None {
            let (job_tx, job_rx) = mpsc::channel::<Job>();
            let job_rx = Arc::new(Mutex::new(job_rx));
            for i in 0..PROBE_THREADS {
                let job_rx = Arc::clone(&job_rx);
                let events = events.clone();
                let s = settings.clone();
                threads.push(
                    std::thread::Builder::new()
                        .name(format!("xvs-probe-{i}"))
                        .spawn(move || probe_loop(&job_rx, &events, &s))?,
                );
            }
            let status = Arc::clone(&status);
            threads.push(
                std::thread::Builder::new()
                    .name("xvs-health".into())
                    .spawn(move || {
                        Scheduler {
                            settings,
                            targets: HashMap::new(),
                            next_gen: 0,
                            status,
                            jobs: job_tx,
                        }
                        .run(&rx, on_change)
                    })?,
            );
        }
        Ok(HealthChecker {
            events,
            status,
            probe: cfg.probe,
            threads,
        })
    }

    /// Sets the backends to check. Known ones keep their state; new ones start up.
    pub fn set_targets(&self, targets: Vec<SocketAddr>) {
        if self.probe == ProbeKind::None {
            let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
            st.retain(|a, _| targets.contains(a));
            for t in targets {
                st.entry(t).or_insert_with(|| TargetStatus {
                    tracker: Tracker::new(),
                    checks: 0,
                    last_error: None,
                });
            }
            return;
        }
        let _ = self.events.send(Event::Targets(targets));
    }

    /// A passive failure (e.g. a SYN that got no SYN-ACK): counted as one failed probe.
    /// Ignored for unknown targets and with `probe = "none"`.
    pub fn report_failure(&self, addr: SocketAddr) {
        if self.probe != ProbeKind::None {
            let _ = self.events.send(Event::Passive(addr));
        }
    }

    /// Every target's current status (as of the last event the scheduler handled).
    pub fn status(&self) -> HashMap<SocketAddr, TargetStatus> {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether `addr` is up; targets the checker does not know are up.
    pub fn is_up(&self, addr: SocketAddr) -> bool {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&addr)
            .is_none_or(|s| s.tracker.up)
    }

    /// Stops the checker and joins its threads (within one probe `timeout`).
    pub fn stop(mut self) {
        let _ = self.events.send(Event::Stop);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for HealthChecker {
    fn drop(&mut self) {
        // Without this the probe threads' event senders would keep the scheduler alive.
        let _ = self.events.send(Event::Stop);
    }
}

struct Target {
    status: TargetStatus,
    generation: u64,
    next_due: Instant,
    in_flight: bool,
}

struct Scheduler {
    settings: Settings,
    targets: HashMap<SocketAddr, Target>,
    next_gen: u64,
    status: Status,
    jobs: Sender<Job>,
}

impl Scheduler {
    fn run(mut self, rx: &Receiver<Event>, mut on_change: impl FnMut(HashMap<SocketAddr, bool>)) {
        loop {
            let now = Instant::now();
            let mut wait = IDLE_WAIT;
            for (addr, t) in &mut self.targets {
                if t.in_flight {
                    continue;
                }
                if t.next_due <= now {
                    t.in_flight = true;
                    t.next_due = now + self.settings.interval;
                    let job = Job {
                        addr: *addr,
                        generation: t.generation,
                    };
                    if self.jobs.send(job).is_err() {
                        return;
                    }
                } else {
                    wait = wait.min(t.next_due - now);
                }
            }
            let first = match rx.recv_timeout(wait) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            // Handle everything queued, then publish once.
            let mut flipped = false;
            let mut changed = false;
            let mut next = Some(first);
            while let Some(ev) = next {
                match ev {
                    Event::Stop => return,
                    Event::Targets(list) => {
                        self.set_targets(list);
                        changed = true;
                    }
                    Event::Result {
                        addr,
                        generation,
                        outcome,
                    } => {
                        if let Some(t) = self.targets.get_mut(&addr)
                            && t.generation == generation
                        {
                            t.in_flight = false;
                            flipped |= record(t, outcome, &self.settings);
                            changed = true;
                        }
                    }
                    Event::Passive(addr) => {
                        if let Some(t) = self.targets.get_mut(&addr) {
                            let why = Err("passive: connection attempt failed".to_owned());
                            flipped |= record(t, why, &self.settings);
                            changed = true;
                        }
                    }
                }
                next = rx.try_recv().ok();
            }
            if changed {
                let snapshot = self
                    .targets
                    .iter()
                    .map(|(a, t)| (*a, t.status.clone()))
                    .collect();
                *self.status.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
            }
            if flipped {
                on_change(
                    self.targets
                        .iter()
                        .map(|(a, t)| (*a, t.status.tracker.up))
                        .collect(),
                );
            }
        }
    }

    fn set_targets(&mut self, list: Vec<SocketAddr>) {
        self.targets.retain(|a, _| list.contains(a));
        let new: Vec<SocketAddr> = list
            .into_iter()
            .filter(|a| !self.targets.contains_key(a))
            .collect();
        let now = Instant::now();
        let n = new.len() as u32;
        for (i, addr) in new.into_iter().enumerate() {
            self.next_gen += 1;
            // Spread first probes over one interval instead of probing everyone at once.
            let offset = self.settings.interval * i as u32 / n.max(1);
            self.targets.insert(
                addr,
                Target {
                    status: TargetStatus {
                        tracker: Tracker::new(),
                        checks: 0,
                        last_error: None,
                    },
                    generation: self.next_gen,
                    next_due: now + offset,
                    in_flight: false,
                },
            );
        }
    }
}

fn record(t: &mut Target, outcome: Result<(), String>, s: &Settings) -> bool {
    t.status.checks += 1;
    let ok = outcome.is_ok();
    t.status.last_error = outcome.err();
    t.status.tracker.record(ok, s.rise, s.fall)
}

fn probe_loop(jobs: &Mutex<Receiver<Job>>, events: &Sender<Event>, s: &Settings) {
    loop {
        let job = {
            let Ok(rx) = jobs.lock() else { return };
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        let outcome = probe(job.addr, s);
        let ev = Event::Result {
            addr: job.addr,
            generation: job.generation,
            outcome,
        };
        if events.send(ev).is_err() {
            return;
        }
    }
}

fn probe(addr: SocketAddr, s: &Settings) -> Result<(), String> {
    match s.probe {
        ProbeKind::None => Ok(()),
        ProbeKind::Tcp => probe_tcp(addr, s.timeout),
        ProbeKind::Http => probe_http(addr, s.timeout, &s.http_path),
    }
}

/// A TCP connect within `timeout`.
pub fn probe_tcp(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    TcpStream::connect_timeout(&addr, timeout)
        .map(drop)
        .map_err(|e| format!("tcp connect: {e}"))
}

/// `GET path HTTP/1.0` within `timeout`; healthy on a 2xx or 3xx status line.
pub fn probe_http(addr: SocketAddr, timeout: Duration, path: &str) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| "http: timed out".to_owned())
    };
    let mut conn =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("http connect: {e}"))?;
    conn.set_write_timeout(Some(left()?))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: xvs-health\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(req.as_bytes())
        .map_err(|e| format!("http write: {e}"))?;
    let mut buf = Vec::with_capacity(128);
    let mut chunk = [0u8; 256];
    while !buf.contains(&b'\n') && buf.len() < STATUS_LINE_MAX {
        conn.set_read_timeout(Some(left()?))
            .map_err(|e| e.to_string())?;
        match conn.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err("http: timed out waiting for the status line".to_owned());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("http read: {e}")),
        }
    }
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
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
    fn starts_up_falls_after_exactly_fall_failures() {
        let mut t = Tracker::new();
        assert!(t.up);
        assert!(!t.record(false, 2, 3));
        assert!(!t.record(false, 2, 3));
        assert!(t.up);
        assert!(t.record(false, 2, 3));
        assert!(!t.up);
        assert!(!t.record(false, 2, 3), "already down: no flip");
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
