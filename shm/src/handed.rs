//! State files handed over by another process (`xvs run --takeover`): the running process
//! sends the descriptors of its locked state files over SCM_RIGHTS, so the new one holds
//! their locks (a `flock` belongs to the open file description) without waiting for the old
//! one's exit. A received descriptor is untrusted input, checked as [`StateFile::handed`]
//! says; a refusal names the field and the value.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::{Refusal, StateFile};

impl StateFile {
    /// A state file another process handed over (`xvs run --takeover`: its descriptor came
    /// over SCM_RIGHTS), taken as the file at `path` and locked. The descriptor is
    /// untrusted: it must be a regular file that may be trusted ([`untrusted`] of its
    /// `fstat`), on the file system of `path`'s directory, the very file at `path` (`fstat`
    /// and `lstat` agree on device and inode: no link followed), open for reading and
    /// writing; and its `flock` must be ours to take (a lock travels with the open file
    /// description, so the sender's lock is the receiver's: no wait for the sender's exit).
    /// Anything else is a [`Refusal`] naming the field and the value, and the descriptor is
    /// closed.
    pub fn handed(fd: std::os::fd::OwnedFd, path: &Path) -> Result<StateFile, Refusal> {
        let file = File::from(fd);
        let fm = file.metadata().map_err(|e| Refusal::new("fstat", e))?;
        if let Some(r) = crate::file::untrusted(&fm) {
            return Err(r);
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let dm = std::fs::metadata(dir).map_err(|e| Refusal::new("directory", e))?;
        if fm.dev() != dm.dev() {
            return Err(Refusal::new(
                "device",
                format!(
                    "{:#x} (the state directory is on {:#x})",
                    fm.dev(),
                    dm.dev()
                ),
            ));
        }
        let pm = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) => return Err(Refusal::new("path", format!("{}: {e}", path.display()))),
        };
        if (pm.dev(), pm.ino()) != (fm.dev(), fm.ino()) {
            return Err(Refusal::new(
                "inode",
                format!(
                    "{} (the file at {} is inode {})",
                    fm.ino(),
                    path.display(),
                    pm.ino()
                ),
            ));
        }
        // SAFETY: F_GETFL on our own open file.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDWR {
            return Err(Refusal::new(
                "access",
                format!("flags {flags:#x} (not open for reading and writing)"),
            ));
        }
        crate::file::lock(&file).map_err(|e| Refusal::new("lock", e))?;
        Ok(StateFile {
            file,
            path: path.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::os::fd::OwnedFd;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    use super::*;
    use crate::Existing;

    /// A state file at `path`, mode 0600, opened for reading and writing (not locked).
    fn made(path: &Path) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap()
    }

    fn refusal(fd: impl Into<OwnedFd>, path: &Path) -> Refusal {
        StateFile::handed(fd.into(), path).unwrap_err()
    }

    #[test]
    fn the_handed_file_is_taken_with_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flows");
        // The sender's open file, locked as a running xvs holds it.
        let Existing::Open(sender) = ({
            made(&path);
            StateFile::open_existing(&path).unwrap()
        }) else {
            panic!("not opened")
        };
        let dup = sender.file.try_clone().unwrap();
        let got = StateFile::handed(dup.into(), &path).unwrap();
        assert_eq!(got.path, path);
        // The sender goes (its exit closes its descriptor): the lock stays with the
        // receiver, so nobody else opens the file.
        drop(sender);
        let e = StateFile::open_existing(&path).unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");
        drop(got);
        assert!(matches!(
            StateFile::open_existing(&path).unwrap(),
            Existing::Open(_)
        ));
    }

    #[test]
    fn a_handed_descriptor_that_is_not_the_state_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flows");
        made(&path);
        // Another file of the same directory: another inode.
        let other = made(&dir.path().join("other"));
        let r = refusal(other, &path);
        assert_eq!(r.field, "inode", "{r}");
        let rw = |p: &Path| OpenOptions::new().read(true).write(true).open(p).unwrap();
        // The file was replaced at its path after the sender opened it: the sender's is
        // removed (no link left).
        let old = rw(&path);
        std::fs::remove_file(&path).unwrap();
        made(&path);
        let r = refusal(old, &path);
        assert_eq!((r.field, r.value.as_str()), ("links", "0 (a hard link)"));
        // The file was moved away from its path, nothing in its place...
        let f = rw(&path);
        let moved = dir.path().join("moved");
        std::fs::rename(&path, &moved).unwrap();
        assert_eq!(refusal(f, &path).field, "path");
        // ... and another file put there.
        made(&path);
        assert_eq!(refusal(rw(&moved), &path).field, "inode");
        // Not a regular file.
        let null = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .unwrap();
        let r = refusal(null, &path);
        assert_eq!((r.field, r.value.as_str()), ("type", "a character device"));
        // A file of another file system than the state directory's (where the machine has
        // a tmpfs apart from the temporary directory's file system).
        if let Ok(f) = tempfile::NamedTempFile::new_in("/dev/shm") {
            let d = std::fs::metadata(dir.path()).unwrap().dev();
            if f.as_file().metadata().unwrap().dev() != d {
                let r = refusal(f.as_file().try_clone().unwrap(), &path);
                assert_eq!(r.field, "device", "{r}");
            }
        }
    }

    #[test]
    fn a_handed_file_others_can_write_or_read_only_or_locked_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flows");
        let f = made(&path);
        f.set_permissions(std::fs::Permissions::from_mode(0o666))
            .unwrap();
        let r = refusal(f, &path);
        assert_eq!(
            (r.field, r.value.as_str()),
            ("mode", "0666 (writable by group or others)")
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // A hard link elsewhere.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        std::fs::hard_link(&path, dir.path().join("link")).unwrap();
        assert_eq!(refusal(f, &path).field, "links");
        std::fs::remove_file(dir.path().join("link")).unwrap();
        // Open for reading only: it could not be mapped for writing.
        let ro = File::open(&path).unwrap();
        assert_eq!(refusal(ro, &path).field, "access");
        // Locked by another open file (a third process): not the sender's lock.
        let Existing::Open(holder) = StateFile::open_existing(&path).unwrap() else {
            panic!("not opened")
        };
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let r = refusal(f, &path);
        assert_eq!(r.field, "lock", "{r}");
        drop(holder);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        assert!(StateFile::handed(f.into(), &path).is_ok());
    }
}
