//! The restart hold, from the daemon's side (the program's side is in `fastpath::steer`).
//!
//! - While xvs runs it refreshes every steering program's hold to `now + restart_hold`
//!   ([`refresh`]), so while no xvs runs (a restart, a crash: nothing has to run at the
//!   stop), frames xvs owns are dropped instead of answered by the kernel, until the hold
//!   runs out.
//! - A **watchdog** process ([`spawn_watchdog`], `xvs cleanup --wait-for PID`) waits for
//!   the daemon to end; if no other xvs has taken the pins over when the hold runs out, it
//!   removes them ([`remove_if_abandoned`]), detaching the programs: a node whose xvs does
//!   not come back keeps nothing of xvs attached. It exits when it removed them, when a new
//!   owner took them, or when they are gone.
//! - `xvs cleanup` without `--wait-for` removes the pins and the state files for good
//!   ([`cleanup`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fastpath::steer::{self, Steering};

/// How often the watchdog looks.
pub const WATCH_PERIOD: Duration = Duration::from_millis(500);

/// The hold every program gets now: `restart_hold` from now, owned by this process.
pub fn refresh(steers: &mut [Steering], restart_hold: Duration) -> Result<(), String> {
    let deadline = steer::monotonic_ns().saturating_add(restart_hold.as_nanos() as u64);
    for st in steers {
        st.set_hold(deadline, std::process::id())
            .map_err(|e| format!("{}: setting the restart hold: {e}", st.ifname()))?;
    }
    Ok(())
}

/// Whether process `pid` is alive (a zombie is not: it only waits to be reaped).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) S ...`: the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z' | 'X'))
}

/// The interfaces pinned under `pins`.
fn pinned_interfaces(pins: &Path) -> Vec<String> {
    std::fs::read_dir(pins)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().join("link").exists())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// What the watchdog should do now about the pins under `pins`, left by `owner`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do yet: the owner lives, or its hold has not run out.
    Wait,
    /// Another process holds them now (a new xvs): leave them.
    TakenOver,
    /// Nothing is pinned any more.
    Gone,
    /// The owner is dead and every hold has run out: remove them.
    Remove,
}

/// Decides for `pins` left by `owner` at monotonic time `now_ns`.
pub fn verdict(pins: &Path, owner: u32, now_ns: u64) -> Verdict {
    let ifaces = pinned_interfaces(pins);
    if ifaces.is_empty() {
        return Verdict::Gone;
    }
    let mut expired = true;
    for ifname in &ifaces {
        match steer::pinned_hold(pins, ifname) {
            Ok(Some((deadline, pid))) => {
                if pid != owner && pid != 0 && alive(pid) {
                    return Verdict::TakenOver;
                }
                expired &= deadline <= now_ns;
            }
            Ok(None) => {}
            // Unreadable pins (another layout): not ours to judge.
            Err(_) => return Verdict::TakenOver,
        }
    }
    if alive(owner) || !expired {
        Verdict::Wait
    } else {
        Verdict::Remove
    }
}

/// Removes the pins under `pins` if `owner` left them and their hold ran out; returns what
/// it found.
pub fn remove_if_abandoned(pins: &Path, owner: u32) -> Verdict {
    let v = verdict(pins, owner, steer::monotonic_ns());
    if v == Verdict::Remove {
        match steer::remove_pins(pins) {
            Ok(n) => {
                tracing::info!(links = n, pins = %pins.display(), "restart hold ran out with no xvs back: steering removed")
            }
            Err(e) => tracing::warn!(error = %e, "removing the pinned steering"),
        }
    }
    v
}

/// The watchdog's loop: returns once the pins were removed, taken over, or gone.
pub fn watch(pins: &Path, owner: u32) -> Verdict {
    loop {
        match remove_if_abandoned(pins, owner) {
            Verdict::Wait => std::thread::sleep(WATCH_PERIOD),
            v => return v,
        }
    }
}

/// Starts the watchdog for this process's pins under `pins`: this binary (`exe`) as
/// `xvs cleanup --wait-for <pid> --pins <pins>`, in a session of its own (a Ctrl-C to xvs
/// does not reach it), with no stdio (it outlives the pipes of whoever started xvs).
pub fn spawn_watchdog(exe: &Path, pins: &Path) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(exe);
    cmd.args([
        "cleanup",
        "--wait-for",
        &std::process::id().to_string(),
        "--pins",
    ])
    .arg(pins)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    // SAFETY: setsid and close_range are async-signal-safe syscalls. Every descriptor past
    // stdio is closed: the watchdog must not keep xvs's AF_XDP sockets (their queues would
    // stay busy for the next xvs), link fds or state-file locks alive. (The pipe through
    // which the standard library reports a failed exec is among them: such a failure goes
    // unreported, and xvs only loses its watchdog.)
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        });
    }
    cmd.spawn().map(|_child| ())
}

/// What `xvs cleanup` removed.
#[derive(Debug, Default)]
pub struct Cleaned {
    /// Pinned links removed.
    pub links: usize,
    /// State files removed.
    pub files: Vec<PathBuf>,
}

/// Removes for good the pinned steering of this network namespace under `pin_root`, and
/// the state files under `state_dir` (their temporaries and the refused ones set aside
/// included); refuses while an xvs holds the state.
pub fn cleanup(pin_root: &Path, state_dir: &Path) -> Result<Cleaned, String> {
    let flows = crate::state::Paths::of(state_dir).flows;
    match shm::StateFile::open_existing(&flows) {
        // No state, ours for a moment, or nothing an xvs would open: no xvs has it.
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            return Err(format!(
                "{} is in use: an xvs is running with this state_dir; stop it first",
                flows.display()
            ));
        }
        Err(e) => return Err(format!("{}: {e}", flows.display())),
    }
    let pins = steer::pin_dir_in(pin_root).map_err(|e| format!("{}: {e}", pin_root.display()))?;
    let links = steer::remove_pins(&pins).map_err(|e| format!("{}: {e}", pins.display()))?;
    let p = crate::state::Paths::of(state_dir);
    let mut files = Vec::new();
    // The state files, their temporaries and the refused files set aside (a link is
    // removed itself, never followed; a refused directory with its contents).
    let state = [
        p.flows.clone(),
        flowtable::previous_path(&p.flows),
        p.export.clone(),
        p.affinity.clone(),
        p.synproxy_key.clone(),
    ];
    for f in state
        .into_iter()
        .chain(p.temporaries())
        .chain(shm::refused_in(state_dir))
    {
        if shm::remove_any(&f).is_ok() {
            files.push(f);
        }
    }
    Ok(Cleaned { links, files })
}
