//! State files are untrusted input: what a process finds under `state_dir` may have been
//! left half-written by a crash, damaged, or planted by someone else. So:
//!
//! - [`StateFile::open_existing`] never follows a symbolic link (`lstat` first, then
//!   `O_NOFOLLOW`) and opens only a regular file with one link, owned by root or by this
//!   process's uid and writable by nobody else ([`untrusted`]); anything else is
//!   [`Existing::Refused`], with the field and the value, for the caller to [`set_aside`].
//! - [`StateFile::create`] and [`create_temp`] make temporaries with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600. A stale temporary is removed only when it is a
//!   regular file of this uid ([`stale_temp`]); anything else at its path refuses the
//!   creation (nothing is ever opened through it).
//! - [`reserve`] allocates a file's whole size (`fallocate`), so a full filesystem is a
//!   refusal with exact sizes when the file is made or adopted, never a SIGBUS when a worker
//!   first writes a page of it.
//! - [`set_aside`] renames a refused file to `<name>.refused-<unix time>-<field>` (a
//!   symbolic link is renamed, never followed) and keeps the [`REFUSED_KEEP`] newest of each
//!   name, so a crash loop cannot fill the filesystem.
//! - [`check_dir`] refuses a state directory that others could write to.
//!
//! Every refusal is a [`Refusal`]: the field that failed and the value found, on one line
//! (control characters escaped), so the caller's log line names file, field and value.

use std::fmt;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a state file, a field of one or a record in one is not used: the field and the
/// value found (with, in parentheses, what was expected).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The field (`magic`, `capacity`, `seed`, `service_id`, `type`, `mode`...).
    pub field: &'static str,
    /// The value found, on one line.
    pub value: String,
}

impl Refusal {
    /// `field` refused with `value` (control characters escaped: a file name or a value
    /// read from a file never breaks a log line).
    pub fn new(field: &'static str, value: impl fmt::Display) -> Refusal {
        let raw = value.to_string();
        let value = if raw.chars().any(char::is_control) {
            raw.chars().flat_map(char::escape_debug).collect()
        } else {
            raw
        };
        Refusal { field, value }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field, self.value)
    }
}

/// An open, exclusively locked state file.
#[derive(Debug)]
pub struct StateFile {
    /// The file (its lock lives as long as it is open).
    pub file: File,
    /// Its path.
    pub path: PathBuf,
}

/// What [`StateFile::open_existing`] found at a path.
#[derive(Debug)]
pub enum Existing {
    /// Nothing.
    Missing,
    /// A regular file that may be trusted, open and locked.
    Open(StateFile),
    /// Something that is not opened: a symbolic link, a directory, a file of another owner
    /// or writable by others.
    Refused(Refusal),
}

impl StateFile {
    /// Opens `path` for reading and writing and takes its exclusive lock, if it is a file
    /// that may be trusted (see the module doc); an error naming the path when it is locked
    /// by another process.
    pub fn open_existing(path: &Path) -> io::Result<Existing> {
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::Missing),
            Err(e) => return Err(e),
            Ok(m) => {
                if let Some(r) = untrusted_at(path, &m) {
                    return Ok(Existing::Refused(r));
                }
            }
        }
        // O_NONBLOCK: should a FIFO be swapped in after the lstat, the open does not hang.
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path);
        let file = match opened {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::Missing),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Ok(Existing::Refused(Refusal::new("type", "a symbolic link")));
            }
            Err(e) => return Err(e),
            Ok(f) => f,
        };
        if let Some(r) = untrusted(&file.metadata()?) {
            return Ok(Existing::Refused(r));
        }
        lock(&file)?;
        Ok(Existing::Open(StateFile {
            file,
            path: path.to_owned(),
        }))
    }

    /// Creates a new file of `len` zero bytes, reserved ([`reserve`]) and locked, at
    /// `<path>.new` ([`create_temp`]), for the caller to fill and then
    /// [`StateFile::commit`] into place.
    pub fn create(path: &Path, len: usize) -> io::Result<StateFile> {
        let tmp = path.with_extension("new");
        let file = create_temp(&tmp)?;
        let made = lock(&file).and_then(|()| reserve(&file, len as u64));
        if let Err(e) = made {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(StateFile {
            file,
            path: path.to_owned(),
        })
    }

    /// Renames a file made by [`StateFile::create`] to its path.
    pub fn commit(&self) -> io::Result<()> {
        std::fs::rename(self.path.with_extension("new"), &self.path)
    }

    /// The file's size in bytes.
    pub fn size(&self) -> io::Result<usize> {
        Ok(self.file.metadata()?.len() as usize)
    }
}

/// Takes `file`'s exclusive `flock`, or says it is in use.
pub(crate) fn lock(file: &File) -> io::Result<()> {
    // SAFETY: flock on our own open file.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "in use by another process (another xvs with the same state_dir?)",
            ));
        }
        return Err(e);
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `uid` may own state: root or this process's uid.
fn owner_ok(uid: u32) -> bool {
    uid == 0 || uid == euid()
}

fn kind(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "a regular file"
    }
}

/// Why a state file with metadata `m` (from `lstat` or `fstat`) cannot be trusted, if it
/// cannot: not a regular file, another owner than root or this uid, writable by group or
/// others, or more than one link (a hard link to a file elsewhere).
pub fn untrusted(m: &Metadata) -> Option<Refusal> {
    if !m.file_type().is_file() {
        return Some(Refusal::new("type", kind(m)));
    }
    if !owner_ok(m.uid()) {
        return Some(Refusal::new(
            "owner",
            format!(
                "uid {} (neither root nor this process's uid {})",
                m.uid(),
                euid()
            ),
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Some(Refusal::new(
            "mode",
            format!("{:04o} (writable by group or others)", m.mode() & 0o7777),
        ));
    }
    if m.nlink() != 1 {
        return Some(Refusal::new(
            "links",
            format!("{} (a hard link)", m.nlink()),
        ));
    }
    None
}

/// [`untrusted`] for `path`'s `lstat` metadata, naming a symbolic link's target.
pub fn untrusted_at(path: &Path, m: &Metadata) -> Option<Refusal> {
    if m.file_type().is_symlink() {
        let target = std::fs::read_link(path).unwrap_or_default();
        return Some(Refusal::new(
            "type",
            format!("a symbolic link to {}", target.display()),
        ));
    }
    untrusted(m)
}

/// Creates the temporary `tmp` (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600), for reading and
/// writing. A stale one is removed first when it is a regular file of this uid; anything
/// else there refuses the creation (an error naming it), and is left for the caller to
/// [`set_aside`] ([`stale_temp`] says what it is).
pub fn create_temp(tmp: &Path) -> io::Result<File> {
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)
    };
    match open() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match stale_temp(tmp)? {
            None => open(),
            Some(r) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} is in the way ({r}): refused", tmp.display()),
            )),
        },
        r => r,
    }
}

/// Clears the way for the temporary `tmp`: nothing there, or a regular file of this uid (a
/// crash's leftover, removed), is `None`; anything else (a symbolic link, a directory, a
/// file of someone else) is left in place and described, for the caller to set aside.
pub fn stale_temp(tmp: &Path) -> io::Result<Option<Refusal>> {
    let m = match std::fs::symlink_metadata(tmp) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
        Ok(m) => m,
    };
    if m.file_type().is_file() && m.uid() == euid() && m.nlink() == 1 {
        // unlink never follows: at worst it removes a file that replaced ours meanwhile.
        std::fs::remove_file(tmp)?;
        return Ok(None);
    }
    Ok(Some(untrusted_at(tmp, &m).unwrap_or_else(|| {
        Refusal::new("owner", format!("uid {} (not this process's)", m.uid()))
    })))
}

/// Allocates the first `len` bytes of `file` (extending it), so that writing them through a
/// shared mapping never faults for want of space. A full filesystem is an error saying
/// exactly what was needed and what is free; a filesystem that cannot allocate ahead
/// (`EOPNOTSUPP`) gets a sparse file as before.
pub fn reserve(file: &File, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let have = file.metadata()?.blocks() * 512;
    // SAFETY: fallocate on our own open file, mode 0 (allocate and extend).
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            if file.metadata()?.len() < len {
                file.set_len(len)?;
            }
            Ok(())
        }
        Some(libc::ENOSPC | libc::EDQUOT) => {
            let free = free_bytes_of(file).map_or_else(|| "?".to_owned(), bytes);
            Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "needs {}, has {free} free",
                    bytes(len.saturating_sub(have).max(1))
                ),
            ))
        }
        _ => Err(e),
    }
}

/// Bytes an unprivileged writer may still use on the filesystem of `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills `st`, a valid out-parameter, for a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

fn free_bytes_of(file: &File) -> Option<u64> {
    // SAFETY: fstatvfs fills `st`, a valid out-parameter, for our open file.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// A size as a person reads it, to a tenth of its unit: `512 bytes`, `1.0 KiB`, `38.5 MiB`,
/// `2.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if n >= size {
            return format!("{:.1} {unit}", n as f64 / size as f64);
        }
    }
    format!("{n} bytes")
}

/// How many refused files of one name [`set_aside`] keeps.
pub const REFUSED_KEEP: usize = 3;

/// Where [`set_aside`] put a refused file, and the older refused files of its name it
/// removed to keep [`REFUSED_KEEP`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetAside {
    /// The file's new path.
    pub to: PathBuf,
    /// Older refused files removed.
    pub pruned: Vec<PathBuf>,
}

/// Renames the refused `path` (whatever it is: a file, a symbolic link, a directory) to
/// `<name>.refused-<unix time>-<field>` beside it, never replacing anything, then removes
/// the oldest refused files of that name beyond [`REFUSED_KEEP`].
pub fn set_aside(path: &Path, refusal: &Refusal) -> io::Result<SetAside> {
    let dir = parent(path);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("no file name"))?
        .to_string_lossy()
        .into_owned();
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let slug: String = refusal
        .field
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let base = format!("{name}.refused-{unix}-{slug}");
    let from = cstr(path)?;
    // After the newest of this second, so that the order of names is the order of refusals.
    let mut n = refused_of(dir, &name)
        .iter()
        .filter_map(|p| {
            let f = p.file_name()?.to_str()?;
            let rest = f.strip_prefix(&base)?;
            if rest.is_empty() {
                Some(1)
            } else {
                rest.strip_prefix('-')?.parse::<u32>().ok()
            }
        })
        .max()
        .map_or(1, |m| m + 1);
    let to = loop {
        let to = dir.join(if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        let c_to = cstr(&to)?;
        // SAFETY: two NUL-terminated paths; RENAME_NOREPLACE never replaces a file.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                c_to.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if r == 0 {
            break to;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) || n >= 10_000 {
            return Err(e);
        }
        n += 1;
    };
    let pruned = prune(dir, &name, REFUSED_KEEP);
    Ok(SetAside { to, pruned })
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn cstr(p: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// The refused files of `name` in `dir` (see [`set_aside`]), oldest first: by time, then
/// by the counter of a second's second and later refusals.
fn refused_of(dir: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("{name}.refused-");
    let mut found: Vec<(u64, u32, String)> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| {
                let n = e.ok()?.file_name().to_str()?.to_owned();
                let mut parts = n.strip_prefix(&prefix)?.split('-');
                let t = parts.next()?.parse().ok()?;
                let _field = parts.next()?;
                let k = match parts.next() {
                    None => 1,
                    Some(k) => k.parse().ok()?,
                };
                Some((t, k, n))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    found.sort();
    found.into_iter().map(|(_, _, n)| dir.join(n)).collect()
}

/// Removes the oldest refused files of `name` beyond `keep`; returns those removed.
fn prune(dir: &Path, name: &str, keep: usize) -> Vec<PathBuf> {
    let found = refused_of(dir, name);
    let excess = found.len().saturating_sub(keep);
    found
        .into_iter()
        .take(excess)
        .filter(|p| remove_any(p).is_ok())
        .collect()
}

/// Removes `p` whatever it is (a directory with its contents; a symbolic link itself).
pub fn remove_any(p: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(p)?.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
}

/// Every refused file in `dir` (`*.refused-<unix time>-*`), for a cleanup.
pub fn refused_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name();
            let n = n.to_str()?;
            let (_, rest) = n.split_once(".refused-")?;
            rest.split('-').next()?.parse::<u64>().ok()?;
            Some(e.path())
        })
        .collect();
    out.sort();
    out
}

/// Why `dir` cannot hold state, if it cannot: a symbolic link owned by someone else than
/// root or this uid, not a directory, or a directory of someone else or writable by group
/// or others (who could plant or swap files in it).
pub fn check_dir(dir: &Path) -> Result<(), String> {
    let named = |e: io::Error| format!("{}: {e}", dir.display());
    let link = std::fs::symlink_metadata(dir).map_err(named)?;
    if link.file_type().is_symlink() && !owner_ok(link.uid()) {
        return Err(format!(
            "{} is a symbolic link owned by uid {} (neither root nor this process's uid {})",
            dir.display(),
            link.uid(),
            euid()
        ));
    }
    let m = std::fs::metadata(dir).map_err(named)?;
    if !m.is_dir() {
        return Err(format!(
            "{} is {}, not a directory",
            dir.display(),
            kind(&m)
        ));
    }
    if !owner_ok(m.uid()) {
        return Err(format!(
            "{} is owned by uid {} (neither root nor this process's uid {})",
            dir.display(),
            m.uid(),
            euid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others (mode {:04o})",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn sizes_read_in_their_unit() {
        assert_eq!(bytes(0), "0 bytes");
        assert_eq!(bytes(1023), "1023 bytes");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(1 << 20), "1.0 MiB");
        assert_eq!(bytes(38 * (1 << 20) + (1 << 19)), "38.5 MiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn a_symbolic_link_is_refused_never_followed() {
        let d = dir();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = d.path().join("flows");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let Existing::Refused(r) = StateFile::open_existing(&path).unwrap() else {
            panic!("a symbolic link was opened")
        };
        assert_eq!(r.field, "type");
        assert!(r.value.contains("symbolic link to"), "{r}");
        // A dangling one too.
        let dangling = d.path().join("affinity");
        std::os::unix::fs::symlink(d.path().join("nowhere"), &dangling).unwrap();
        assert!(matches!(
            StateFile::open_existing(&dangling).unwrap(),
            Existing::Refused(_)
        ));
        // A temporary through a link is not created, and the link's target is untouched.
        let tmp = d.path().join("flows.new");
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        let e = StateFile::create(&path, 4096).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(
            stale_temp(&tmp).unwrap().map(|r| r.field),
            Some("type"),
            "left for the caller to set aside"
        );
        // Set aside: the link itself moves; the target stays as it was.
        let a = set_aside(&path, &r).unwrap();
        assert!(a.to.symlink_metadata().unwrap().file_type().is_symlink());
        assert!(!path.exists() && path.symlink_metadata().is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn directories_and_loose_modes_are_refused() {
        let d = dir();
        let path = d.path().join("synproxy.key");
        std::fs::create_dir(&path).unwrap();
        let Existing::Refused(r) = StateFile::open_existing(&path).unwrap() else {
            panic!()
        };
        assert_eq!((r.field, r.value.as_str()), ("type", "a directory"));
        let f = d.path().join("flows");
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let Existing::Refused(r) = StateFile::open_existing(&f).unwrap() else {
            panic!()
        };
        assert_eq!(r.field, "mode");
        assert!(r.value.starts_with("0666"), "{r}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.path().join("hard");
        std::fs::hard_link(&f, &link).unwrap();
        let Existing::Refused(r) = StateFile::open_existing(&f).unwrap() else {
            panic!()
        };
        assert_eq!(r.field, "links");
        std::fs::remove_file(&link).unwrap();
        assert!(matches!(
            StateFile::open_existing(&f).unwrap(),
            Existing::Open(_)
        ));
        assert!(matches!(
            StateFile::open_existing(&d.path().join("none")).unwrap(),
            Existing::Missing
        ));
    }

    #[test]
    fn set_aside_keeps_a_few_of_each_name() {
        let d = dir();
        let path = d.path().join("flows");
        let r = Refusal::new("capacity", "2305843009213693952\n(forged line)");
        assert!(!r.value.contains('\n'), "{r}");
        let mut kept = Vec::new();
        for i in 0..REFUSED_KEEP + 2 {
            std::fs::write(&path, [i as u8]).unwrap();
            let a = set_aside(&path, &r).unwrap();
            assert!(
                a.to.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with("flows.refused-")
            );
            assert!(a.to.to_str().unwrap().contains("-capacity"), "{a:?}");
            assert!(!path.exists());
            kept.push(a);
        }
        // A neighbour's refused files are not counted against this name.
        let other = d.path().join("flows.export");
        std::fs::write(&other, b"y").unwrap();
        set_aside(&other, &r).unwrap();
        let left = refused_of(d.path(), "flows");
        assert_eq!(left.len(), REFUSED_KEEP);
        // The newest stay (same second: by the counter suffix order of creation).
        assert!(kept.last().unwrap().to.exists());
        assert_eq!(refused_in(d.path()).len(), REFUSED_KEEP + 1);
    }

    #[test]
    fn stale_temporaries_of_ours_are_replaced() {
        let d = dir();
        let path = d.path().join("flows");
        std::fs::write(path.with_extension("new"), b"half-written").unwrap();
        let f = StateFile::create(&path, 8192).unwrap();
        assert_eq!(f.size().unwrap(), 8192);
        let m = f.file.metadata().unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        assert!(m.blocks() * 512 >= 8192, "reserved: {} blocks", m.blocks());
        f.commit().unwrap();
        assert!(path.exists());
    }

    #[test]
    fn state_dirs_others_may_write_are_refused() {
        let d = dir();
        let s = d.path().join("state");
        std::fs::create_dir(&s).unwrap();
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert_eq!(check_dir(&s), Ok(()));
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_dir(&s).unwrap_err();
        assert!(e.contains("writable by group or others (mode 0777)"), "{e}");
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o750)).unwrap();
        let f = d.path().join("file");
        std::fs::write(&f, b"").unwrap();
        assert!(check_dir(&f).unwrap_err().contains("not a directory"));
    }
}
