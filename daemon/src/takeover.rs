//! The zero-loss upgrade: `xvs run --takeover` receives the running xvs's AF_XDP sockets
//! and UMEMs ([`fastpath::xsk::handover`]) over a unix socket, so the kernel keeps
//! receiving into the same rings while one process hands over to the other.
//!
//! # Protocol
//!
//! The running xvs listens on `<[dataplane] state_dir>/takeover.sock` (mode 0600; the state
//! directory is root's). A stream of frames, each a 4-byte big-endian length and a JSON
//! object, plus one SCM_RIGHTS message:
//!
//! 1. new → old: `{"hello":"xvs-takeover","version":1,"state":true}`. The old checks the
//!    peer's credentials (`SO_PEERCRED`: root or its own uid) first.
//! 2. old → new: the offer, every worker's [`SetMeta`], the names of the state files
//!    ([`STATE_FILES`], only to a hello with `state`) and `export` (it can export its flows
//!    at the switch; a new process that refused the flow table declines an old one that
//!    cannot, rather than start without the flows); then one byte carrying the
//!    descriptors (per set: its UMEM, then its sockets in port order; then the state
//!    files). The new process checks the descriptors' count and kinds and the descriptions
//!    against its own config, and maps the UMEMs and rings ([`XskSet::adopt`]). Each state
//!    file is checked as untrusted ([`shm::StateFile::handed`]: the very file of its name
//!    in the state directory, a regular file nobody else may write, on that directory's
//!    file system, open for writing; its `flock` is taken, and being the open file
//!    description's, it is the old process's lock: no wait for its exit); the flow
//!    table's header is checked and the whole file mapped and faulted in
//!    (`FlowTable::prepare_handed`). A refused state file is one log line; that file is
//!    opened by its path once the old process is gone, as at a restart. Nothing has
//!    changed for the old process yet: a refusal of the sockets leaves it running. Still
//!    before the switch ([`Pending`]), the new process does everything that need not see
//!    the old one stopped: it adopts the pinned steering with these sockets already in
//!    the new programs' XSK maps (the same kernel objects the old programs redirect to)
//!    and reads the routes and neighbours.
//! 3. new → old: `{"switch":true,"export":E}`. The switch: the old process stops its
//!    workers (each after a whole poll, its fill rings topped up), puts back the NAPI
//!    settings it changed, marks the flow table clean and sends every worker's
//!    [`FrameState`]; then it exits at once, without withdrawing BGP routes or awaiting its
//!    services (nothing is its business any more), and without exporting the flows unless
//!    `E` asks: the new process asks when it did not take the flow table's descriptor (it
//!    refused the file: another layout version, a damaged or untrusted one), and then
//!    imports the export (`flows.export`, written before the old process exits, which the
//!    new one awaits before opening that file by its path).
//! 4. the new process takes the frame states ([`XskSet::resume`]) and, without waiting for
//!    the old one ([`Pending::switch`]; only a state file that was not handed over waits
//!    for its lock), adopts the flow table from the prepared mapping with the full
//!    recovery pass (the clean mark is not trusted more than at a restart), opens the rest
//!    of the state, publishes the first snapshot and starts its workers on the adopted
//!    sockets, from the rings' indices as the old workers left them. Meanwhile (the pause:
//!    no worker polls; its parts are the "takeover: the workers poll again" log line) a
//!    thread of the new process keeps the rings moving from the moment the frame states
//!    are in ([`GapKeeper`]): it holds what the rx rings receive and gives the fill rings
//!    the free frames, so what arrives waits in the whole UMEM rather than in one rx ring;
//!    the workers process the held frames first, in order. Then it waits for the old
//!    process to be gone ([`OldProcess::wait`]) before it binds what that one listened on
//!    (flow sync, the admin servers).
//!
//! Everything received is untrusted: each refusal is one log line naming the peer, the
//! field and the value, and is counted ([`REFUSED`], `xvs_refused_total{kind="takeover"}`). The old side refuses and keeps
//! running; the new side falls back to today's restart (a normal start, which waits for
//! the old process's sockets and state as a restart does).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fastpath::xsk::gap::GapKeeper;
use fastpath::xsk::handover::{Export, FrameState, SetMeta};
use fastpath::xsk::{XskSet, XskSettings};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

use crate::state::Handed;

/// The protocol's version.
const VERSION: u32 = 1;
/// The hello's and switch's frames are small.
const SMALL_MAX: usize = 4096;
/// An offer or a frame state (a free list per worker) is at most this long.
const FRAME_MAX: usize = 64 << 20;
/// Most descriptors one hand-over carries.
pub const FDS_MAX: usize = 253;
/// How long either side waits for the other's next message.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the new process waits for the old one to exit after the switch.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// Hand-over requests and messages refused, by either side, since the process started
/// (`xvs_refused_total{kind="takeover"}`).
pub static REFUSED: AtomicU64 = AtomicU64::new(0);
/// The kind of [`REFUSED`] in the refusal metrics.
pub const REFUSED_KIND: &str = "takeover";

/// The hand-over socket of a state directory.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("takeover.sock")
}

#[derive(Serialize, Deserialize)]
struct Hello {
    hello: String,
    version: u32,
    /// The new process takes the state files' descriptors too (absent from a process that
    /// does not: it is offered none, and waits for the old one's locks).
    #[serde(default)]
    state: bool,
}

#[derive(Serialize, Deserialize)]
struct Switch {
    switch: bool,
    /// The new process refused the flow table handed over (another layout version, a
    /// damaged or untrusted file): the old one exports its flows as records (`flows.export`,
    /// as at a graceful stop) after the frame states and before it exits, and the new one
    /// imports them. (Absent from an older new process: no export.)
    #[serde(default)]
    export: bool,
}

/// A takeover that reached its switch, the old side: the connection to the new process
/// and whether it asked for the flows' export ([`Switch::export`]).
#[derive(Debug)]
pub struct Switching {
    /// The connection, open until this process exits.
    pub conn: UnixStream,
    /// Export the flows after sending the frame states.
    pub export: bool,
}

#[derive(Serialize, Deserialize)]
struct WireMeta {
    queue: u32,
    mode: String,
    frame_size: u32,
    umem_len: u64,
    rx_ring_size: u32,
    tx_ring_size: u32,
    fill_target: u32,
    ports: Vec<Option<String>>,
}

#[derive(Serialize, Deserialize)]
struct Offer {
    version: u32,
    sets: Vec<WireMeta>,
    /// The state files whose descriptors follow the sets' (names in the state directory).
    #[serde(default)]
    state: Vec<String>,
    /// The old process exports its flows at the switch when asked ([`Switch::export`]);
    /// absent (false) from one that predates it.
    #[serde(default)]
    export: bool,
}

#[derive(Serialize, Deserialize)]
struct WireState {
    free: Vec<u64>,
    in_fill: Vec<u32>,
}

#[derive(Serialize, Deserialize)]
struct States {
    sets: Vec<WireState>,
}

impl From<&SetMeta> for WireMeta {
    fn from(m: &SetMeta) -> WireMeta {
        WireMeta {
            queue: m.queue,
            mode: m.mode.clone(),
            frame_size: m.frame_size,
            umem_len: m.umem_len,
            rx_ring_size: m.rx_ring_size,
            tx_ring_size: m.tx_ring_size,
            fill_target: m.fill_target,
            ports: m.ports.clone(),
        }
    }
}

impl From<WireMeta> for SetMeta {
    fn from(m: WireMeta) -> SetMeta {
        SetMeta {
            queue: m.queue,
            mode: m.mode,
            frame_size: m.frame_size,
            umem_len: m.umem_len,
            rx_ring_size: m.rx_ring_size,
            tx_ring_size: m.tx_ring_size,
            fill_target: m.fill_target,
            ports: m.ports,
        }
    }
}

/// One refusal: the log line and the counter.
fn refused(side: &str, peer: &str, what: &str) {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(target: "xvs", side, peer, refused = what, "takeover refused");
}

fn write_frame(s: &mut UnixStream, v: &impl Serialize) -> io::Result<()> {
    let body = serde_json::to_vec(v).map_err(io::Error::other)?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(&body);
    s.write_all(&buf)
}

/// Reads one frame of at most `max` bytes and parses it as `T`; the error says which.
fn read_frame<T: for<'de> Deserialize<'de>>(
    s: &mut UnixStream,
    max: usize,
    what: &str,
) -> Result<T, String> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)
        .map_err(|e| format!("{what}: reading its length: {e}"))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(format!("{what}: length {len} over {max}"));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)
        .map_err(|e| format!("{what}: reading {len} bytes: {e}"))?;
    serde_json::from_slice(&body).map_err(|e| format!("{what}: {e}"))
}

/// The peer's `(pid, uid)`.
fn peer_cred(s: &UnixStream) -> io::Result<(i32, u32)> {
    // SAFETY: plain data; zero is a valid value.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` is writable for `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut c).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((c.pid, c.uid))
}

/// Whether `uid` may take over from (or hand over to) this process: root, or our own uid.
fn trusted_uid(uid: u32) -> bool {
    // SAFETY: no arguments, cannot fail.
    uid == 0 || uid == unsafe { libc::geteuid() }
}

/// Sends one byte carrying `fds`.
fn send_fds(s: &UnixStream, fds: &[RawFd]) -> io::Result<()> {
    let iov = [io::IoSlice::new(b"F")];
    let rights = [ControlMessage::ScmRights(fds)];
    match sendmsg::<()>(s.as_raw_fd(), &iov, &rights, MsgFlags::MSG_NOSIGNAL, None)? {
        1 => Ok(()),
        n => Err(io::Error::other(format!("{n} bytes sent, not 1"))),
    }
}

/// Receives the byte that carries descriptors; every descriptor received is owned (closed
/// on any refusal). A truncated control message is refused.
fn recv_fds(s: &UnixStream) -> Result<Vec<OwnedFd>, String> {
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; FDS_MAX]);
    let (n, truncated, fds) = {
        let mut iov = [io::IoSliceMut::new(&mut byte)];
        // MSG_CMSG_CLOEXEC keeps the descriptors from children.
        let msg = recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| format!("descriptors: {e}"))?;
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(|e| format!("descriptors: {e}"))? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these descriptors in this process
                // for this message; nothing else owns them.
                fds.extend(unsafe { fastpath::xsk::handover::own(&raw) });
            }
        }
        (msg.bytes, msg.flags.contains(MsgFlags::MSG_CTRUNC), fds)
    };
    if n != 1 || byte[0] != b'F' {
        return Err(format!(
            "descriptors: a message of {n} bytes ({:?}), not the one byte F",
            &byte[..n]
        ));
    }
    if truncated {
        return Err(format!(
            "descriptors: more than {FDS_MAX} (control message truncated)"
        ));
    }
    Ok(fds)
}

/// The old side: what the running process offers, and where the switch goes.
pub struct Offered {
    /// Every worker's export, in worker order.
    pub exports: Vec<Export>,
    /// The locked state files, by name in the state directory ([`STATE_FILES`]), whose
    /// descriptors (and so their locks) go with the sockets'. They stay open as long as
    /// this process runs.
    pub state: Vec<(&'static str, RawFd)>,
}

/// The state files a takeover hands over, by name in the state directory.
pub const STATE_FILES: [&str; 2] = ["flows", "affinity"];

/// Starts listening on `path` for a process that takes over (the old side, on a thread of
/// its own). A connection that passes every check up to the switch is sent to `switch`;
/// the listener then stops. Returns `None` (and says why) when it cannot listen: the
/// daemon runs on, and an upgrade is a restart.
pub fn listen(
    path: &Path,
    offered: Offered,
    switch: tokio::sync::mpsc::UnboundedSender<Switching>,
) -> Option<std::thread::JoinHandle<()>> {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            refused(
                "old",
                "-",
                &format!(
                    "{}: not a socket (file type {:?}); not listening for a takeover",
                    path.display(),
                    m.file_type()
                ),
            );
            return None;
        }
        let _ = std::fs::remove_file(path);
    }
    let listener = match UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot listen for a takeover: an upgrade will be a restart");
            return None;
        }
    };
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
    tracing::info!(path = %path.display(), "listening for a takeover (xvs run --takeover)");
    let spawned = std::thread::Builder::new()
        .name("xvs-takeover".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                match offer(&mut conn, &offered) {
                    Ok(export) => {
                        let _ = switch.send(Switching { conn, export });
                        return;
                    }
                    Err((peer, why)) => refused("old", &peer, &why),
                }
            }
        });
    spawned.ok()
}

/// Steps 1 to 3 with one client: whether it asks for the flows' export; `Err((peer, why))`
/// refuses it.
fn offer(conn: &mut UnixStream, offered: &Offered) -> Result<bool, (String, String)> {
    let (pid, uid) = peer_cred(conn).map_err(|e| ("?".to_owned(), format!("SO_PEERCRED: {e}")))?;
    let peer = format!("pid {pid} uid {uid}");
    let fail = |why: String| (peer.clone(), why);
    if !trusted_uid(uid) {
        return Err(fail(format!(
            "uid {uid}: neither root nor this process's uid"
        )));
    }
    let _ = conn.set_read_timeout(Some(STEP_TIMEOUT));
    let _ = conn.set_write_timeout(Some(STEP_TIMEOUT));
    let hello: Hello = read_frame(conn, SMALL_MAX, "hello").map_err(fail)?;
    if hello.hello != "xvs-takeover" || hello.version != VERSION {
        return Err(fail(format!(
            "hello {:?} version {}: not xvs-takeover version {VERSION}",
            hello.hello, hello.version
        )));
    }
    // A process that does not ask for the state files waits for their locks instead.
    let state: &[(&str, RawFd)] = if hello.state { &offered.state } else { &[] };
    let offer = Offer {
        version: VERSION,
        sets: offered
            .exports
            .iter()
            .map(|e| WireMeta::from(&e.meta))
            .collect(),
        state: state.iter().map(|(name, _)| (*name).to_owned()).collect(),
        export: true,
    };
    write_frame(conn, &offer).map_err(|e| fail(format!("sending the offer: {e}")))?;
    let fds: Vec<RawFd> = offered
        .exports
        .iter()
        .flat_map(|e| std::iter::once(e.umem.as_raw_fd()).chain(e.sockets.iter().copied()))
        .chain(state.iter().map(|(_, fd)| *fd))
        .collect();
    send_fds(conn, &fds).map_err(|e| fail(format!("sending the descriptors: {e}")))?;
    let sw: Switch = read_frame(conn, SMALL_MAX, "switch").map_err(fail)?;
    if !sw.switch {
        return Err(fail("switch false: the new process declined".into()));
    }
    Ok(sw.export)
}

/// The old side after the switch: sends every stopped worker's frame state (in worker
/// order). The connection stays open until this process exits.
pub fn send_states(conn: &mut UnixStream, states: &[FrameState]) -> io::Result<()> {
    let msg = States {
        sets: states
            .iter()
            .map(|s| WireState {
                free: s.free.clone(),
                in_fill: s.in_fill.clone(),
            })
            .collect(),
    };
    write_frame(conn, &msg)
}

/// The new side before the switch: the running xvs's sockets adopted (and its state files,
/// checked and the flow table mapped), the old process still polling them. Whatever can
/// happen before the switch (the steering adopted with these sockets already in its XSK
/// map) happens while the old process forwards; then [`Pending::switch`].
pub struct Pending {
    conn: UnixStream,
    pid: i32,
    peer: String,
    sets: Vec<XskSet>,
    state_dir: PathBuf,
    state: Handed,
}

/// A takeover after its switch: what the new process starts from.
pub struct Switched {
    /// The adopted sets, resumed from the frame states the old workers left, one per
    /// queue in queue order, kept receiving from the moment they were resumed until the
    /// workers start ([`GapKeeper`]).
    pub kept: GapKeeper,
    /// The state files handed over (the rest are unlocked: the old process is gone).
    pub state: Handed,
    /// The process taken over, which exits on its own.
    pub old: OldProcess,
    /// When the switch was sent: the start of the pause in which nobody polls.
    pub at: Instant,
    /// When the frame states were received and the sets resumed from them.
    pub resumed: Instant,
}

/// The process taken over, exiting after the switch.
pub struct OldProcess {
    pid: i32,
}

impl OldProcess {
    /// Waits (up to 30 s) for it to be gone: what it still held (its listening sockets,
    /// the BGP liveness device) is free then. Its leader can be a zombie (not yet reaped by
    /// its parent, which may wait for this process to be ready) while its other threads
    /// still run and its files are open: gone is the leader exited and no other thread
    /// left (the last thread to exit closes the files).
    pub fn wait(&self) {
        wait_exit(self.pid);
        let deadline = Instant::now() + EXIT_WAIT;
        let task = format!("/proc/{}/task", self.pid);
        while Instant::now() < deadline {
            let others = std::fs::read_dir(&task).map_or(0, |d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_str() != Some(&self.pid.to_string()))
                    .count()
            });
            if others == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        tracing::warn!(
            pid = self.pid,
            "threads of the process taken over still run {EXIT_WAIT:?} after the switch; starting anyway"
        );
    }
}

impl Pending {
    /// The adopted sets, one per queue in queue order.
    pub fn sets(&self) -> &[XskSet] {
        &self.sets
    }

    /// Step 3 and 4: the switch. `Some`: the adopted sets resumed and the handed state
    /// files; a state file that was not handed over is unlocked (the old process is gone
    /// then), one that was needs no wait: its lock came with it. `None`: the switch failed
    /// (refused and logged): the sets and files are closed and the old process awaited,
    /// start as a restart does.
    pub fn switch(self) -> Option<Switched> {
        let Pending {
            mut conn,
            pid,
            peer,
            mut sets,
            state_dir,
            state,
        } = self;
        let t0 = Instant::now();
        // A flow table not handed over (refused, or not offered) is opened by its path
        // once the old process is gone: ask for its flows as records, which a file of
        // another layout (or a refused one) would lose.
        let export = state.flows.is_none();
        let switch = Switch {
            switch: true,
            export,
        };
        let switched = write_frame(&mut conn, &switch)
            .map_err(|e| format!("sending the switch: {e}"))
            .and_then(|()| read_frame::<States>(&mut conn, FRAME_MAX, "frame states"))
            .and_then(|st| resume(&mut sets, st));
        if let Err(why) = switched {
            refused(
                "new",
                &peer,
                &format!("{why}; starting normally once the old process is gone"),
            );
            drop((sets, state));
            wait_exit(pid);
            wait_unlocked(&self_locks(&state_dir));
            return None;
        }
        let workers = sets.len();
        let kept = GapKeeper::start(sets);
        let resumed = Instant::now();
        let states_ms = resumed.duration_since(t0).as_secs_f64() * 1e3;
        let [flows, affinity] = self_locks(&state_dir);
        let unlocked: Vec<PathBuf> = [
            (flows, state.flows.is_some()),
            (affinity, state.affinity.is_some()),
        ]
        .into_iter()
        .filter_map(|(p, handed)| (!handed).then_some(p))
        .collect();
        if !unlocked.is_empty() {
            // The leader of a process that exits can be a zombie before its other threads
            // have closed its files: the locks are what the state's opening needs.
            wait_exit(pid);
            wait_unlocked(&unlocked);
        }
        tracing::info!(target: "xvs", old_pid = pid, workers, states_ms, export_asked = export, state_handed = ?state.names(), waited_ms = t0.elapsed().as_secs_f64() * 1e3, "took over the AF_XDP sockets of the running xvs");
        Some(Switched {
            kept,
            state,
            old: OldProcess { pid },
            at: t0,
            resumed,
        })
    }
}

/// The new side up to the switch: connects to the running xvs and adopts the sockets (and
/// the state files) it offers. `None`: there is none, or it or what it sent was refused
/// (logged): start normally; the old process runs on.
pub fn connect(settings: &XskSettings, state_dir: &Path) -> Option<Pending> {
    let path = socket_path(state_dir);
    let mut conn = match UnixStream::connect(&path) {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(path = %path.display(), error = %e, "no running xvs to take over; starting normally");
            return None;
        }
    };
    let (pid, uid) = match peer_cred(&conn) {
        Ok(c) => c,
        Err(e) => {
            refused("new", "?", &format!("SO_PEERCRED: {e}"));
            return None;
        }
    };
    let peer = format!("pid {pid} uid {uid}");
    if !trusted_uid(uid) {
        refused(
            "new",
            &peer,
            &format!("uid {uid}: neither root nor this process's uid"),
        );
        return None;
    }
    let _ = conn.set_read_timeout(Some(STEP_TIMEOUT));
    let _ = conn.set_write_timeout(Some(STEP_TIMEOUT));
    let (sets, files, can_export) = match receive_offer(&mut conn, settings) {
        Ok(o) => o,
        Err(why) => {
            refused("new", &peer, &why);
            return None;
        }
    };
    let offered_flows = files.iter().any(|(name, _)| name == STATE_FILES[0]);
    let state = take_state(state_dir, &peer, files);
    if loses_flows(offered_flows, state.flows.is_some(), can_export) {
        refused(
            "new",
            &peer,
            "this process refused the flow table handed over, and the running xvs cannot export its flows at the switch (it predates that): a takeover would end every flow; upgrade it with a graceful restart instead (its stop exports the flows)",
        );
        return None;
    }
    Some(Pending {
        conn,
        pid,
        peer,
        sets,
        state,
        state_dir: state_dir.to_owned(),
    })
}

/// Whether a takeover would start without the flows: the old process offered its flow
/// table, this one refused it, and the old one cannot export the flows instead.
fn loses_flows(offered_flows: bool, handed_flows: bool, can_export: bool) -> bool {
    offered_flows && !handed_flows && !can_export
}

/// Descriptors by the name the offer gives them (the state files').
type NamedFds = Vec<(String, OwnedFd)>;

/// Steps 1 and 2: the offer, checked and adopted; the state files' descriptors, by name,
/// for [`take_state`]; whether the old process can export its flows at the switch.
fn receive_offer(
    conn: &mut UnixStream,
    settings: &XskSettings,
) -> Result<(Vec<XskSet>, NamedFds, bool), String> {
    write_frame(
        conn,
        &Hello {
            hello: "xvs-takeover".into(),
            version: VERSION,
            state: true,
        },
    )
    .map_err(|e| format!("sending the hello: {e}"))?;
    let offer: Offer = read_frame(conn, FRAME_MAX, "offer")?;
    let fds = recv_fds(conn)?;
    if offer.version != VERSION {
        return Err(format!(
            "offer version {}: this process speaks {VERSION}",
            offer.version
        ));
    }
    let workers = fastpath::xsk::worker_count(settings);
    if offer.sets.len() != workers {
        return Err(format!(
            "offer sets = {}: this process's config has {workers} workers",
            offer.sets.len()
        ));
    }
    let want: usize = offer
        .sets
        .iter()
        .map(|m| 1 + m.ports.iter().flatten().count())
        .sum::<usize>()
        + offer.state.len();
    if fds.len() != want {
        return Err(format!(
            "descriptors = {}: the offer describes {want}",
            fds.len()
        ));
    }
    let mut fds = fds.into_iter();
    let mut sets = Vec::with_capacity(workers);
    for (q, m) in offer.sets.into_iter().enumerate() {
        let meta = SetMeta::from(m);
        let umem = fds.next().expect("counted");
        let sockets: Vec<OwnedFd> = fds
            .by_ref()
            .take(meta.ports.iter().flatten().count())
            .collect();
        let set = XskSet::adopt(settings, q as u32, &meta, umem, sockets)
            .map_err(|e| format!("worker {q}: {e}"))?;
        sets.push(set);
    }
    Ok((
        sets,
        offer.state.into_iter().zip(fds).collect(),
        offer.export,
    ))
}

/// The handed state files, each checked as untrusted (`shm::StateFile::handed`: the very
/// file of its name in `state_dir`, a regular file nobody else may write, on the state
/// directory's file system, open for writing, its lock ours) and the flow table's header
/// checked, mapped and faulted in (`FlowTable::prepare_handed`). Each refusal is one log
/// line naming the file, the field and the value, and is counted; that file is then opened
/// as at a restart, once the old process is gone.
fn take_state(state_dir: &Path, peer: &str, files: NamedFds) -> Handed {
    let paths = crate::state::Paths::of(state_dir);
    let mut out = Handed::default();
    for (name, fd) in files {
        let t0 = Instant::now();
        let refuse = |what: String| {
            refused(
                "new",
                peer,
                &format!("state file {name:?}: {what}; opened once the old process is gone"),
            );
        };
        let (path, taken) = match name.as_str() {
            "flows" if out.flows.is_none() => (&paths.flows, true),
            "affinity" if out.affinity.is_none() => (&paths.affinity, false),
            _ => {
                refuse(format!("name: not one of {STATE_FILES:?}, or twice"));
                continue;
            }
        };
        let state = match shm::StateFile::handed(fd, path) {
            Ok(s) => s,
            Err(r) => {
                refuse(format!("{}: {r}", path.display()));
                continue;
            }
        };
        if !taken {
            out.affinity = Some(state);
            continue;
        }
        match flowtable::FlowTable::prepare_handed(state) {
            Ok(h) => {
                tracing::info!(target: "xvs", file = %path.display(), took_ms = t0.elapsed().as_secs_f64() * 1e3, "the flow table handed over: checked, mapped and faulted in before the switch");
                out.flows = Some(h);
            }
            Err(r) => refuse(format!("{}: {r}", path.display())),
        }
    }
    out
}

fn resume(sets: &mut [XskSet], st: States) -> Result<(), String> {
    if st.sets.len() != sets.len() {
        return Err(format!(
            "frame states = {}: {} sets were adopted",
            st.sets.len(),
            sets.len()
        ));
    }
    for (q, (set, s)) in sets.iter_mut().zip(st.sets).enumerate() {
        set.resume(FrameState {
            free: s.free,
            in_fill: s.in_fill,
        })
        .map_err(|e| format!("worker {q}: {e}"))?;
    }
    Ok(())
}

/// The state files the old process holds locked until it is gone.
fn self_locks(state_dir: &Path) -> [PathBuf; 2] {
    let paths = crate::state::Paths::of(state_dir);
    [paths.flows, paths.affinity]
}

/// Waits (up to [`EXIT_WAIT`]) until nobody holds `paths`' `flock`s. Only the lock is
/// taken (and dropped at once): nothing of the files is read here; a missing file, or one
/// that cannot be opened, is the state's opening's business.
fn wait_unlocked(paths: &[PathBuf]) {
    use std::os::unix::fs::OpenOptionsExt;
    let deadline = Instant::now() + EXIT_WAIT;
    for path in paths {
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
        else {
            continue;
        };
        loop {
            // SAFETY: flock on our own open file; closing it drops the lock.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(file = %path.display(), "still locked {EXIT_WAIT:?} after the switch; starting anyway");
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Waits (up to [`EXIT_WAIT`]) for process `pid` to end: its state files' locks and its
/// sockets' other references go with it.
fn wait_exit(pid: i32) {
    let deadline = Instant::now() + EXIT_WAIT;
    while Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        let gone = match &stat {
            Err(_) => true,
            Ok(s) => s
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_none_or(|c| matches!(c, 'Z' | 'X')),
        };
        if gone {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    tracing::warn!(
        pid,
        "the process taken over has not exited after {EXIT_WAIT:?}; starting anyway"
    );
}

#[cfg(test)]
mod tests;
