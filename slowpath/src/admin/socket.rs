//! The `[admin] socket` file: bound with mode 0600 and never reachable with a wider one,
//! refused when another process serves it, replaced when stale, removed when done.
//!
//! connect(2) on a unix socket needs write permission on its file, so the mode is the access
//! control: only root (the owner) can use the control endpoints. bind(2) creates the file
//! with mode `0777 & !umask`, and chmod can only follow; setting the umask around bind would
//! race with every other thread of the daemon. So the socket is bound inside a fresh
//! directory of mode 0700 next to the final path, made 0600 there, and renamed into place:
//! no other user can reach it before it has its final mode. A unix socket is found through
//! its inode, so the renamed file keeps reaching the bound socket.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::AdminError;

/// Mode of the socket file.
pub(super) const SOCKET_MODE: u32 = 0o600;
/// Mode of a parent directory the server creates.
const DIR_MODE: u32 = 0o755;

/// The bound socket's file. Dropping it removes the file, unless something else has
/// replaced it meanwhile.
#[derive(Debug)]
pub(super) struct SocketFile {
    path: PathBuf,
    /// (device, inode) of the file this server bound.
    id: (u64, u64),
}

impl SocketFile {
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Ok(m) = fs::symlink_metadata(&self.path)
            && (m.dev(), m.ino()) == self.id
        {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Binds `path` (a non-blocking listener) as the module docs say.
pub(super) fn bind(path: &Path) -> Result<(UnixListener, SocketFile), AdminError> {
    let fail = |what: &'static str| {
        move |source: io::Error| AdminError::Socket {
            path: path.to_owned(),
            what,
            source,
        }
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Some(name) = path.file_name() else {
        return Err(fail("the path names no file")(
            io::ErrorKind::InvalidInput.into(),
        ));
    };
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(fail("creating its directory"))?;

    clear_stale(path)?;

    // A name of our own for the private directory: the pid, and a counter for servers bound
    // by the same process (tests).
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let staging = dir.join(format!(
        ".{}.{}-{}.bind",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(fail("creating a private directory to bind in"))?;
    let tmp = staging.join("s");
    let bound = (|| {
        let l = UnixListener::bind(&tmp).map_err(fail("binding"))?;
        l.set_nonblocking(true).map_err(fail("binding"))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(fail("setting its mode to 0600"))?;
        fs::rename(&tmp, path).map_err(fail("moving it into place"))?;
        Ok(l)
    })();
    let _ = fs::remove_file(&tmp);
    let _ = fs::remove_dir(&staging);
    let listener = bound?;
    let m = fs::symlink_metadata(path).map_err(fail("inspecting it after binding"))?;
    Ok((
        listener,
        SocketFile {
            path: path.to_owned(),
            id: (m.dev(), m.ino()),
        },
    ))
}

/// What is at `path` before binding: nothing, or a socket nobody serves (left by a process
/// that died: removed). Anything else is refused.
fn clear_stale(path: &Path) -> Result<(), AdminError> {
    let fail = |what: &'static str| {
        move |source: io::Error| AdminError::Socket {
            path: path.to_owned(),
            what,
            source,
        }
    };
    match fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(AdminError::NotASocket {
                path: path.to_owned(),
            });
        }
        Ok(_) => match served(path) {
            Ok(true) => {
                return Err(AdminError::SocketInUse {
                    path: path.to_owned(),
                });
            }
            // Nobody listens: a socket left by a process that died.
            Ok(false) => match fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(fail("removing the stale socket")(e));
                }
                _ => {}
            },
            Err(e) => return Err(fail("checking whether another process serves it")(e)),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail("inspecting it")(e)),
    }
    Ok(())
}

/// Whether a process listens on the socket `path`: a non-blocking connect succeeds, or finds
/// the backlog full (a blocking one would wait for a hung server for ever), rather than being
/// refused.
fn served(path: &Path) -> io::Result<bool> {
    // SAFETY: plain socket(2); the fd is owned right below.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // One byte stays zero: the terminating NUL.
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path is too long for a unix socket",
        ));
    }
    for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes, alive for the call.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const addr).cast::<libc::sockaddr>(),
            len,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EINPROGRESS) => Ok(true),
        Some(libc::ECONNREFUSED) => Ok(false),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_tells_live_from_stale_and_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).unwrap();
        // Never accepted: the backlog fills up (its size is somaxconn), and a blocking
        // connect would then wait for ever. Each probe must still say "live".
        let backlog: usize = fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096);
        for i in 0..backlog + 16 {
            assert!(served(&path).unwrap(), "probe {i}");
        }
        drop(listener);
        assert!(
            !served(&path).unwrap(),
            "a socket nobody listens on is stale"
        );
        assert_eq!(
            served(&dir.path().join("missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
