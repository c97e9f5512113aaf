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
//! 1. new → old: `{"hello":"xvs-takeover","version":1}`. The old checks the peer's
//!    credentials (`SO_PEERCRED`: root or its own uid) first.
//! 2. old → new: the offer, every worker's [`SetMeta`]; then one byte carrying the
//!    descriptors (per set: its UMEM, then its sockets in port order). The new process
//!    checks the descriptors' count and kinds and the descriptions against its own config,
//!    and maps the UMEMs and rings ([`XskSet::adopt`]). Nothing has changed for the old
//!    process yet: a refusal here leaves it running. Still before the switch ([`Pending`]),
//!    the new process does everything that need not see the old one stopped: it adopts the
//!    pinned steering with these sockets already in the new programs' XSK maps (the same
//!    kernel objects the old programs redirect to) and reads the routes and neighbours.
//! 3. new → old: `{"switch":true}`. The switch: the old process stops its workers (each
//!    after a whole poll, its fill rings topped up), marks the flow table clean and sends
//!    every worker's [`FrameState`]; then it exits at once, without exporting the flows,
//!    withdrawing BGP routes or awaiting its services (nothing is its business any more).
//! 4. the new process takes the frame states ([`XskSet::resume`]), waits for the old one
//!    to be gone and its state files' locks with it ([`Pending::switch`]), adopts the flow
//!    table as a restart does (the full recovery pass) and starts its workers on the
//!    adopted sockets, from the rings' indices as the old workers left them. Meanwhile
//!    (the pause: nobody polls) the kernel receives into the frames the fill rings hold.
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

use fastpath::xsk::handover::{Export, FrameState, SetMeta};
use fastpath::xsk::{XskSet, XskSettings};
use serde::{Deserialize, Serialize};

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
}

#[derive(Serialize, Deserialize)]
struct Switch {
    switch: bool,
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
    let byte = [b'F'];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr().cast_mut().cast(),
        iov_len: 1,
    };
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: plain data; zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer has room for one header and `fds` (CMSG_SPACE).
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
    }
    // SAFETY: `msg` points at live buffers.
    if unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } != 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives the byte that carries descriptors; every descriptor received is owned (closed
/// on any refusal). A truncated control message is refused.
fn recv_fds(s: &UnixStream) -> Result<Vec<OwnedFd>, String> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is arithmetic.
    let space =
        unsafe { libc::CMSG_SPACE((FDS_MAX * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: plain data; zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at live buffers; MSG_CMSG_CLOEXEC keeps them from children.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(format!("descriptors: {}", io::Error::last_os_error()));
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let raw: Vec<RawFd> = (0..bytes / std::mem::size_of::<RawFd>())
                    .map(|i| data.add(i).read_unaligned())
                    .collect();
                fds.extend(fastpath::xsk::handover::own(&raw));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n != 1 || byte[0] != b'F' {
        return Err(format!(
            "descriptors: a message of {n} bytes ({:?}), not the one byte F",
            &byte[..n.max(0) as usize]
        ));
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
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
}

/// Starts listening on `path` for a process that takes over (the old side, on a thread of
/// its own). A connection that passes every check up to the switch is sent to `switch`;
/// the listener then stops. Returns `None` (and says why) when it cannot listen: the
/// daemon runs on, and an upgrade is a restart.
pub fn listen(
    path: &Path,
    offered: Offered,
    switch: tokio::sync::mpsc::UnboundedSender<UnixStream>,
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
                    Ok(()) => {
                        let _ = switch.send(conn);
                        return;
                    }
                    Err((peer, why)) => refused("old", &peer, &why),
                }
            }
        });
    spawned.ok()
}

/// Steps 1 to 3 with one client; `Err((peer, why))` refuses it.
fn offer(conn: &mut UnixStream, offered: &Offered) -> Result<(), (String, String)> {
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
    let offer = Offer {
        version: VERSION,
        sets: offered
            .exports
            .iter()
            .map(|e| WireMeta::from(&e.meta))
            .collect(),
    };
    write_frame(conn, &offer).map_err(|e| fail(format!("sending the offer: {e}")))?;
    let fds: Vec<RawFd> = offered
        .exports
        .iter()
        .flat_map(|e| std::iter::once(e.umem.as_raw_fd()).chain(e.sockets.iter().copied()))
        .collect();
    send_fds(conn, &fds).map_err(|e| fail(format!("sending the descriptors: {e}")))?;
    let sw: Switch = read_frame(conn, SMALL_MAX, "switch").map_err(fail)?;
    if !sw.switch {
        return Err(fail("switch false: the new process declined".into()));
    }
    Ok(())
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

/// The new side before the switch: the running xvs's sockets adopted, the old process
/// still polling them. Whatever can happen before the switch (the steering adopted with
/// these sockets already in its XSK map) happens while the old process forwards; then
/// [`Pending::switch`].
pub struct Pending {
    conn: UnixStream,
    pid: i32,
    peer: String,
    sets: Vec<XskSet>,
    state_dir: PathBuf,
}

impl Pending {
    /// The adopted sets, one per queue in queue order.
    pub fn sets(&self) -> &[XskSet] {
        &self.sets
    }

    /// Step 3 and 4: the switch. `Some`: the adopted sets, resumed from the frame states
    /// the old workers left, ready for the workers; the old process is gone (its state
    /// files' locks with it). `None`: the switch failed (refused and logged): the sets are
    /// closed and the old process awaited, start as a restart does.
    pub fn switch(self) -> Option<Vec<XskSet>> {
        let Pending {
            mut conn,
            pid,
            peer,
            mut sets,
            state_dir,
        } = self;
        let t0 = Instant::now();
        let switched = write_frame(&mut conn, &Switch { switch: true })
            .map_err(|e| format!("sending the switch: {e}"))
            .and_then(|()| read_frame::<States>(&mut conn, FRAME_MAX, "frame states"))
            .and_then(|st| resume(&mut sets, st));
        if let Err(why) = switched {
            refused(
                "new",
                &peer,
                &format!("{why}; starting normally once the old process is gone"),
            );
            drop(sets);
            wait_exit(pid);
            return None;
        }
        let states_ms = t0.elapsed().as_secs_f64() * 1e3;
        wait_exit(pid);
        // The leader of a process that exits can be a zombie before its other threads
        // have closed its files: the locks are what the state's opening needs.
        wait_unlocked(&self_locks(&state_dir));
        tracing::info!(target: "xvs", old_pid = pid, workers = sets.len(), states_ms, waited_ms = t0.elapsed().as_secs_f64() * 1e3, "took over the AF_XDP sockets of the running xvs");
        Some(sets)
    }
}

/// The new side up to the switch: connects to the running xvs and adopts the sockets it
/// offers. `None`: there is none, or it or what it sent was refused (logged): start
/// normally; the old process runs on.
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
    match receive_offer(&mut conn, settings) {
        Ok(sets) => Some(Pending {
            conn,
            pid,
            peer,
            sets,
            state_dir: state_dir.to_owned(),
        }),
        Err(why) => {
            refused("new", &peer, &why);
            None
        }
    }
}

/// Steps 1 and 2: the offer, checked and adopted.
fn receive_offer(conn: &mut UnixStream, settings: &XskSettings) -> Result<Vec<XskSet>, String> {
    write_frame(
        conn,
        &Hello {
            hello: "xvs-takeover".into(),
            version: VERSION,
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
        .sum();
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
    Ok(sets)
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
