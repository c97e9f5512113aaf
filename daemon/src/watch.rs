//! The config file watch: a change reloads the file only once the file has stopped changing.
//!
//! The driver stats the file every tick and hands the [`Stamp`] (modification time, size,
//! inode) to [`FileWatch::observe`] with `now`; a stamp other than the one last read must be
//! seen unchanged for [`SETTLE`] before the watch says "reload". A writer that rewrites the
//! file in place (an editor, `cat >`, a slow copy) would otherwise have a half-written file
//! loaded; the reload guards ([`crate::controller`]) refuse what still gets through. Replacing
//! the file atomically (write a temporary file, rename it over this one; Kubernetes ConfigMap
//! volumes swap a symlink) never shows a partial file. Sans-IO: tested on a fake clock.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// How long a changed file must stay unchanged before it is reloaded.
pub const SETTLE: Duration = Duration::from_millis(500);

/// What identifies one version of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Modification time.
    pub mtime: SystemTime,
    /// Size in bytes.
    pub len: u64,
    /// Inode (a rename over the file changes it, whatever the time and size).
    pub ino: u64,
}

impl Stamp {
    /// The stamp of the file at `path` (following symlinks, as a ConfigMap mount needs);
    /// `None` while it cannot be read.
    pub fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            mtime: m.modified().ok()?,
            len: m.len(),
            ino: m.ino(),
        })
    }
}

/// Decides when a changed file is reloaded (see the module doc).
#[derive(Debug)]
pub struct FileWatch {
    /// The version last read.
    read: Option<Stamp>,
    /// A newer version, and since when it has been seen unchanged.
    settling: Option<(Stamp, Instant)>,
}

impl FileWatch {
    /// A watch of a file whose current version (`stamp`) is the one running.
    pub fn new(stamp: Option<Stamp>) -> FileWatch {
        FileWatch {
            read: stamp,
            settling: None,
        }
    }

    /// The file's stamp at `now`; `true`: it changed and has been stable for [`SETTLE`],
    /// reload it. A missing file is waited for (a writer may delete then create it).
    pub fn observe(&mut self, now: Instant, stamp: Option<Stamp>) -> bool {
        let Some(stamp) = stamp else {
            self.settling = None;
            return false;
        };
        if Some(stamp) == self.read {
            self.settling = None;
            return false;
        }
        match self.settling {
            Some((s, since)) if s == stamp => now.saturating_duration_since(since) >= SETTLE,
            _ => {
                self.settling = Some((stamp, now));
                false
            }
        }
    }

    /// The file was read at version `stamp` (a reload, whatever asked for it): only a later
    /// change reloads again.
    pub fn read(&mut self, stamp: Option<Stamp>) {
        self.read = stamp;
        self.settling = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(ms: u64, len: u64) -> Option<Stamp> {
        Some(Stamp {
            mtime: SystemTime::UNIX_EPOCH + Duration::from_millis(ms),
            len,
            ino: 7,
        })
    }

    #[test]
    fn a_change_reloads_once_it_has_settled() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = FileWatch::new(stamp(0, 100));
        assert!(!w.observe(at(0), stamp(0, 100)), "unchanged");
        // A writer appends in steps: every step restarts the wait.
        assert!(!w.observe(at(100), stamp(100, 10)));
        assert!(!w.observe(at(200), stamp(200, 50)));
        assert!(
            !w.observe(at(600), stamp(200, 50)),
            "stable for 400 ms only"
        );
        assert!(w.observe(at(700), stamp(200, 50)), "stable for 500 ms");
        // The driver reads it: no reload again until it changes.
        w.read(stamp(200, 50));
        assert!(!w.observe(at(800), stamp(200, 50)));
        assert!(!w.observe(at(5000), stamp(200, 50)));
    }

    #[test]
    fn a_same_sized_rewrite_or_a_rename_is_a_change() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = FileWatch::new(stamp(0, 100));
        let renamed = stamp(0, 100).map(|s| Stamp { ino: 8, ..s });
        assert!(!w.observe(at(0), renamed));
        assert!(w.observe(at(500), renamed));
        w.read(renamed);
        assert!(!w.observe(at(600), stamp(600, 100)));
        assert!(w.observe(at(1100), stamp(600, 100)));
    }

    #[test]
    fn a_missing_file_is_waited_for_and_a_sighup_read_counts() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = FileWatch::new(stamp(0, 100));
        assert!(!w.observe(at(0), stamp(10, 0)));
        assert!(!w.observe(at(100), None), "deleted: wait");
        assert!(!w.observe(at(700), None));
        assert!(!w.observe(at(800), stamp(800, 100)), "back: settle again");
        // SIGHUP read it meanwhile: that version is the one running.
        w.read(stamp(800, 100));
        assert!(!w.observe(at(1500), stamp(800, 100)));
    }
}
