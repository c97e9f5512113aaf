//! The SYN proxy's cookie secret, `synproxy.key`: 32 random bytes, mode 0600, kept across
//! restarts so that a client answered by one process completes its handshake with the next.
//!
//! It is untrusted input like any state file, and a secret: a symbolic link, a directory,
//! a file of someone else, one that others may read or write, one of another size or all
//! zeros is set aside (one log line: file, field, value) and a new key made. A key that
//! cannot be written is kept in memory for this process only: the start never fails for it.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use fastpath::pipeline::CookieKey;
use flowtable::Refusal;

use super::{Refusals, set_aside};

/// The SYN cookie secret in `path`: the one an earlier process left, else a new random one
/// written there (aside, `O_EXCL|O_NOFOLLOW` mode 0600, then renamed into place).
pub fn cookie_key(path: &Path, refused: &mut Refusals) -> CookieKey {
    match read(path) {
        Ok(Some(k)) => return k,
        Ok(None) => {}
        Err(r) => set_aside(
            refused,
            path,
            &r,
            "making a new one (clients in the middle of a proxied handshake retry)",
        ),
    }
    let key = CookieKey::random();
    if let Err(e) = write(path, &key) {
        tracing::warn!(target: "xvs", file = %path.display(), error = %e, "the SYN cookie secret cannot be kept in the state directory; this process keeps its own");
    }
    key
}

/// The key in `path`: `None` when there is none, `Err` for a file that cannot be one.
fn read(path: &Path) -> Result<Option<CookieKey>, Refusal> {
    let m = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Refusal::new("read", e)),
        Ok(m) => m,
    };
    if let Some(r) = shm::untrusted_at(path, &m) {
        return Err(r);
    }
    if m.mode() & 0o077 != 0 {
        return Err(Refusal::new(
            "mode",
            format!(
                "{:04o} (others may read it: no secret any more)",
                m.mode() & 0o7777
            ),
        ));
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Refusal::new("read", e))?;
    let mut b = Vec::with_capacity(33);
    f.by_ref()
        .take(33)
        .read_to_end(&mut b)
        .map_err(|e| Refusal::new("read", e))?;
    let Ok(k) = <[u8; 32]>::try_from(b.as_slice()) else {
        return Err(Refusal::new(
            "size",
            format!(
                "{} bytes (32)",
                f.metadata().map_or(b.len() as u64, |m| m.len())
            ),
        ));
    };
    if k == [0; 32] {
        return Err(Refusal::new("key", "32 zero bytes"));
    }
    Ok(Some(CookieKey::from_bytes(&k)))
}

fn write(path: &Path, key: &CookieKey) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = shm::create_temp(&tmp)?;
    let written = f
        .write_all(&key.to_bytes())
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
