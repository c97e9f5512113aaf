//! The speaker: the task that makes BIRD announce what the controller decided.
//!
//! [`Speaker::announce`] hands it the include file's text (only the latest counts); the task
//! writes it (aside, then renamed over the old one), asks BIRD to `configure`, and after the
//! first attempt opens the liveness device ([`LiveDevice`]), so BIRD's routes go live only
//! once the file says what this process wants (a file left by a killed process may list
//! more). BIRD not running, or refusing the file, is logged (the first time at once, repeats
//! with backoff), counted, and retried every [`RETRY_MIN`] to [`RETRY_MAX`]; forwarding never
//! waits for it. A BIRD that starts later reads the file by itself.
//!
//! [`Speaker::withdraw`] drops the device at once (BIRD withdraws everything); it is the
//! first thing a stopping daemon does. [`Speaker::finish`] waits, bounded, for the last file
//! to be written and configured.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::control::{self, ControlError};
use super::live::LiveDevice;
use crate::repeat::RepeatLog;

/// How long BIRD gets to answer `configure`.
pub const CONFIGURE_TIMEOUT: Duration = Duration::from_secs(5);
/// The first retry after a failure comes this soon; each later one twice as late.
pub const RETRY_MIN: Duration = Duration::from_secs(1);
/// Retries come at least this often while failures last.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// The include file as the controller rendered it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Include {
    /// Where it goes (`[bgp] include`).
    pub path: PathBuf,
    /// Its text.
    pub text: String,
    /// VIPs it announces.
    pub vips: usize,
    /// SNAT addresses of this node it announces.
    pub snat: usize,
    /// Backups (peers' SNAT addresses) it announces.
    pub backups: usize,
}

/// What the admin API shows of the speaker.
#[derive(Debug, Default)]
pub struct BgpStats {
    /// VIPs in the file BIRD last took.
    pub vips: AtomicU64,
    /// This node's SNAT addresses in it.
    pub snat: AtomicU64,
    /// Backups in it.
    pub backups: AtomicU64,
    /// The liveness device is open: BIRD's routes are live.
    pub live: AtomicBool,
    /// BIRD has taken the latest file.
    pub in_sync: AtomicBool,
    /// Files written.
    pub writes: AtomicU64,
    /// `configure`s BIRD accepted.
    pub reconfigures: AtomicU64,
    /// Failures: writing the file, reaching BIRD, BIRD refusing it, opening the device.
    pub errors: AtomicU64,
    /// The last failure, until the next success.
    pub last_error: Mutex<Option<String>>,
}

impl BgpStats {
    fn failed(&self, e: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.last_error.lock() {
            *l = Some(e.to_owned());
        }
    }

    /// The last failure, if the latest attempt failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|l| l.clone())
    }
}

enum Device {
    /// Not opened yet: the process is not ready, or the first file is not written.
    NotYet,
    Live(#[allow(dead_code)] LiveDevice),
    /// Withdrawn for good: the process stops.
    Stopped,
}

/// The handle of the speaker task.
pub struct Speaker {
    tx: watch::Sender<Option<(u64, Arc<Include>)>>,
    applied: watch::Receiver<u64>,
    seq: u64,
    device: Arc<Mutex<Device>>,
    stats: Arc<BgpStats>,
    /// Cancelled when the task has ended (whoever holds its `JoinHandle`).
    ended: CancellationToken,
    stop: CancellationToken,
}

impl Speaker {
    /// Starts the task on `rt`: BIRD at `socket`, liveness device `device`. It ends with
    /// `shutdown` or [`Speaker::finish`].
    pub fn spawn(
        rt: &tokio::runtime::Handle,
        socket: PathBuf,
        device: String,
        stats: Arc<BgpStats>,
        shutdown: &CancellationToken,
    ) -> Speaker {
        // The task ends with `shutdown` or `finish`; nobody needs its handle.
        Speaker::start_parts(rt, socket, device, stats, shutdown).0
    }

    /// [`Speaker::spawn`], the task's handle apart (for [`SpeakerService`]).
    fn start_parts(
        rt: &tokio::runtime::Handle,
        socket: PathBuf,
        device: String,
        stats: Arc<BgpStats>,
        shutdown: &CancellationToken,
    ) -> (Speaker, tokio::task::JoinHandle<()>) {
        let (tx, rx) = watch::channel(None);
        let (applied_tx, applied) = watch::channel(0);
        let dev = Arc::new(Mutex::new(Device::NotYet));
        let stop = shutdown.child_token();
        let ended = CancellationToken::new();
        let on_end = ended.clone().drop_guard();
        let t = Task {
            socket,
            device_name: device,
            device: Arc::clone(&dev),
            stats: Arc::clone(&stats),
            rx,
            applied: applied_tx,
            stop: stop.clone(),
        };
        let task = rt.spawn(async move {
            let _on_end = on_end;
            run(t).await;
        });
        let speaker = Speaker {
            tx,
            applied,
            seq: 0,
            device: dev,
            stats,
            ended,
            stop,
        };
        (speaker, task)
    }

    /// Announce `include` (replacing whatever was asked before).
    pub fn announce(&mut self, include: Include) {
        self.seq += 1;
        self.tx.send_replace(Some((self.seq, Arc::new(include))));
    }

    /// Drops the liveness device now, for good: BIRD withdraws every route of xvs.
    pub fn withdraw(&self) {
        if let Ok(mut d) = self.device.lock()
            && !matches!(*d, Device::Stopped)
        {
            let was_live = matches!(*d, Device::Live(_));
            *d = Device::Stopped;
            self.stats.live.store(false, Ordering::Relaxed);
            if was_live {
                tracing::info!(target: "xvs", "BGP: liveness device closed, BIRD withdraws every route");
            }
        }
    }

    /// Waits up to `timeout` for the last [`Speaker::announce`] to be written and configured,
    /// then ends the task. Returns whether it was.
    pub async fn finish(mut self, timeout: Duration) -> bool {
        let want = self.seq;
        let done = tokio::time::timeout(timeout, self.applied.wait_for(|s| *s >= want))
            .await
            .is_ok_and(|r| r.is_ok());
        self.stop.cancel();
        self.ended.cancelled().await;
        done
    }

    /// The stats the task updates.
    pub fn stats(&self) -> &Arc<BgpStats> {
        &self.stats
    }
}

/// The BGP speaker as a [`crate::service::Service`]: the arguments of [`Speaker::spawn`];
/// its handle is the [`Speaker`].
pub struct SpeakerService {
    /// BIRD's control socket.
    pub socket: PathBuf,
    /// The liveness device BIRD's routes depend on.
    pub device: String,
    /// The stats the task updates.
    pub stats: Arc<BgpStats>,
}

impl crate::service::Service for SpeakerService {
    type Handle = Speaker;
    type Error = std::convert::Infallible;
    const NAME: &'static str = "the BGP speaker";

    fn start(
        self,
        rt: &tokio::runtime::Handle,
        shutdown: &CancellationToken,
    ) -> Result<crate::service::Running<Speaker>, Self::Error> {
        let (handle, task) =
            Speaker::start_parts(rt, self.socket, self.device, self.stats, shutdown);
        Ok(crate::service::Running { handle, task })
    }
}

struct Task {
    socket: PathBuf,
    device_name: String,
    device: Arc<Mutex<Device>>,
    stats: Arc<BgpStats>,
    rx: watch::Receiver<Option<(u64, Arc<Include>)>>,
    applied: watch::Sender<u64>,
    stop: CancellationToken,
}

async fn run(mut t: Task) {
    let mut written: Option<Arc<Include>> = None;
    let mut failing = RepeatLog::default();
    let mut retry: Option<(Instant, Duration)> = None;
    loop {
        let retry_at = retry.map(|(at, _)| at);
        tokio::select! {
            r = t.rx.changed() => if r.is_err() { return },
            () = sleep_until(retry_at) => {}
            () = t.stop.cancelled() => return,
        }
        let Some((seq, want)) = t.rx.borrow_and_update().clone() else {
            continue;
        };
        match apply(&mut t, &mut written, &want).await {
            Ok(()) => {
                retry = None;
                if let Some(n) = failing.recovered() {
                    tracing::info!(target: "xvs", failures = n, "BGP: BIRD took xvs's routes again");
                }
                t.applied.send_replace(seq);
            }
            Err(e) => {
                t.stats.failed(&e);
                let backoff = retry.map_or(RETRY_MIN, |(_, b)| (b * 2).min(RETRY_MAX));
                retry = Some((Instant::now() + backoff, backoff));
                if let Some(n) = failing.failed(Instant::now()) {
                    tracing::error!(failures = n, retry_in = ?backoff, error = %e, "BGP: announcing through BIRD failed (forwarding goes on; retried)");
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Writes `want` (unless it is what was written), configures BIRD, opens the device.
async fn apply(
    t: &mut Task,
    written: &mut Option<Arc<Include>>,
    want: &Arc<Include>,
) -> Result<(), String> {
    if written.as_deref() != Some(want) {
        t.stats.in_sync.store(false, Ordering::Relaxed);
        write_aside(&want.path, &want.text)
            .map_err(|e| format!("writing {}: {e}", want.path.display()))?;
        t.stats.writes.fetch_add(1, Ordering::Relaxed);
        *written = Some(Arc::clone(want));
    }
    let configured = control::configure(&t.socket, CONFIGURE_TIMEOUT).await;
    // The file says what this process wants: the routes may go live, whatever BIRD said (a
    // BIRD that is down reads the file when it starts).
    let device = open_device(t);
    let configured = match configured {
        Ok(c) => {
            t.stats.reconfigures.fetch_add(1, Ordering::Relaxed);
            t.stats.in_sync.store(true, Ordering::Relaxed);
            t.stats.vips.store(want.vips as u64, Ordering::Relaxed);
            t.stats.snat.store(want.snat as u64, Ordering::Relaxed);
            t.stats
                .backups
                .store(want.backups as u64, Ordering::Relaxed);
            tracing::debug!(code = c.code, reply = %c.text, vips = want.vips, snat = want.snat, backups = want.backups, "BGP: BIRD reconfigured");
            Ok(())
        }
        Err(e @ ControlError::Refused { .. }) => Err(format!(
            "{e} (BIRD keeps its previous configuration; check {} and bird.conf)",
            want.path.display()
        )),
        Err(e) => Err(e.to_string()),
    };
    match (configured, device) {
        (Ok(()), Ok(())) => {
            if let Ok(mut l) = t.stats.last_error.lock() {
                *l = None;
            }
            Ok(())
        }
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(bird), Err(dev)) => Err(format!("{bird}; {dev}")),
    }
}

fn open_device(t: &Task) -> Result<(), String> {
    let Ok(mut d) = t.device.lock() else {
        return Ok(());
    };
    if matches!(*d, Device::NotYet) {
        let dev = LiveDevice::open(&t.device_name)
            .map_err(|e| format!("opening the liveness device: {e}"))?;
        tracing::info!(target: "xvs", device = %t.device_name, "BGP: liveness device up, BIRD's routes are live");
        *d = Device::Live(dev);
        t.stats.live.store(true, Ordering::Relaxed);
    }
    Ok(())
}

/// Writes `text` to `path` atomically: a temporary file in the same directory (created,
/// mode 0755, when missing), renamed over it. Mode 0644: BIRD may run as its own user.
pub fn write_aside(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)?;
    // Whatever the umask: BIRD may run as its own user.
    f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixListener;

    use super::*;

    /// A fake BIRD that answers every `configure` with `reply` and counts them.
    fn fake_bird(
        path: &Path,
        reply: &'static str,
    ) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
        let listener = UnixListener::bind(path).unwrap();
        let n = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&n);
        let task = tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                s.write_all(b"0001 BIRD 2.0.12 ready.\n").await.unwrap();
                let mut buf = [0u8; 64];
                let _ = s.read(&mut buf).await.unwrap();
                count.fetch_add(1, Ordering::Relaxed);
                s.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        (n, task)
    }

    fn include(path: &Path, text: &str) -> Include {
        Include {
            path: path.to_owned(),
            text: text.to_owned(),
            vips: 2,
            snat: 1,
            backups: 0,
        }
    }

    /// Without a network namespace of its own the test must not create devices: a device
    /// name that is too long makes opening fail, which the speaker counts and retries.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_configures_retries_and_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("bird.ctl");
        let path = dir.path().join("sub/bird-xvs.conf");
        let stats = Arc::new(BgpStats::default());
        let shutdown = CancellationToken::new();
        let mut sp = Speaker::spawn(
            &tokio::runtime::Handle::current(),
            sock.clone(),
            "a-name-too-long-for-linux".to_owned(),
            Arc::clone(&stats),
            &shutdown,
        );
        // BIRD not running: the file is written anyway, the failure counted.
        sp.announce(include(&path, "one\n"));
        let deadline = Instant::now() + Duration::from_secs(5);
        while stats.errors.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(stats.errors.load(Ordering::Relaxed) >= 1);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\n");
        let e = stats.last_error().unwrap();
        assert!(e.contains("cannot connect"), "{e}");
        assert!(!stats.in_sync.load(Ordering::Relaxed));

        // BIRD comes up: the retry configures it (the device still fails: counted).
        let (configures, bird) = fake_bird(&sock, "0003 Reconfigured\n");
        let deadline = Instant::now() + Duration::from_secs(5);
        while configures.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(configures.load(Ordering::Relaxed) >= 1);
        let e = stats.last_error().unwrap();
        assert!(e.contains("liveness device"), "{e}");
        assert!(!sp.finish(Duration::from_millis(200)).await);
        bird.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_file_is_an_error_with_birds_words() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("bird.ctl");
        let path = dir.path().join("bird-xvs.conf");
        let (_n, bird) = fake_bird(
            &sock,
            "0002-Reading configuration from /etc/bird/bird.conf\n8002 /x/bird-xvs.conf:3:1 syntax error\n",
        );
        let stats = Arc::new(BgpStats::default());
        let mut sp = Speaker::spawn(
            &tokio::runtime::Handle::current(),
            sock,
            "a-name-too-long-for-linux".to_owned(),
            Arc::clone(&stats),
            &CancellationToken::new(),
        );
        sp.announce(include(&path, "two\n"));
        let deadline = Instant::now() + Duration::from_secs(5);
        while stats.last_error().is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let e = stats.last_error().unwrap();
        assert!(
            e.contains("BIRD refused (8002): /x/bird-xvs.conf:3:1 syntax error"),
            "{e}"
        );
        assert!(e.contains("liveness device"), "{e}");
        sp.finish(Duration::from_millis(10)).await;
        bird.abort();
    }

    #[test]
    fn write_aside_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b/f.conf");
        write_aside(&p, "x\n").unwrap();
        write_aside(&p, "y\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "y\n");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }
}
