//! The `hugepages` check: will the flow table's state file take the huge pages xvs advises?
//!
//! A lookup lands anywhere in the flow table, so on 4 KiB pages most lookups also miss the
//! TLB (docs/benchmarks.md: 18.3 against 24.1 Mpps established a core at 1,000,000 flows).
//! xvs maps its tables with `MADV_HUGEPAGE`; a file on tmpfs takes huge pages for that
//! advice only when its tmpfs is mounted with `huge=advise`, `huge=within_size` or
//! `huge=always`, or when `/sys/kernel/mm/transparent_hugepage/shmem_enabled` is `force`
//! (for every tmpfs). `shmem_enabled=advise` is not enough: it governs the kernel's internal
//! shared memory, not tmpfs mounts, and `deny` refuses huge pages everywhere. On other
//! filesystems nothing is said: whether a shared file mapping takes huge pages there depends
//! on the filesystem and the kernel. A warning, never a problem: xvs forwards either way.

use std::path::Path;

/// Where the kernel says how shared memory takes huge pages.
const SHMEM_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

/// Tables smaller than one huge page cannot use one.
const HUGE_PAGE: u64 = 2 << 20;

/// The warning for a flow table of `table_bytes` in `state_dir` on this machine, if any.
pub(super) fn inspect(state_dir: &Path, table_bytes: u64) -> Option<String> {
    if table_bytes < HUGE_PAGE {
        return None;
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let existing = state_dir.ancestors().find(|p| p.exists())?;
    let existing = std::fs::canonicalize(existing).ok()?;
    let (point, fstype, options) = mount_of(&mountinfo, &existing)?;
    let shmem = std::fs::read_to_string(SHMEM_ENABLED).ok();
    advice(
        state_dir,
        &point,
        &fstype,
        &options,
        shmem.as_deref().and_then(selected),
    )
}

/// The warning for a state directory on the mount at `point` of `fstype` with the
/// super-block `options`, under `shmem_enabled`'s selected value (None: not readable).
fn advice(
    state_dir: &Path,
    point: &str,
    fstype: &str,
    options: &str,
    shmem: Option<&str>,
) -> Option<String> {
    if fstype != "tmpfs" {
        return None;
    }
    let where_ = format!(
        "dataplane.state_dir {} is on a tmpfs ({point})",
        state_dir.display()
    );
    match shmem {
        Some("force") => return None,
        Some("deny") => {
            return Some(format!(
                "{where_} and {SHMEM_ENABLED} is [deny]: the flow table gets 4 KiB pages, and most lookups also miss the TLB (about a quarter fewer packets a second at 1M flows); set it to `never` (the default) and mount the tmpfs with huge=within_size"
            ));
        }
        _ => {}
    }
    let huge = options
        .split(',')
        .find_map(|o| o.strip_prefix("huge="))
        .unwrap_or("never");
    if matches!(huge, "always" | "within_size" | "advise") {
        return None;
    }
    Some(format!(
        "{where_} mounted with huge={huge}: the flow table gets 4 KiB pages, and most lookups also miss the TLB (about a quarter fewer packets a second at 1M flows); mount it with huge=within_size (`mount -o remount,huge=within_size {point}`, or a tmpfs of its own for the state directory)"
    ))
}

/// The mount point, filesystem type and super-block options of the mount holding `path`
/// (absolute, canonical) in `mountinfo` (proc(5)): the longest mount point that is an
/// ancestor of it, the later of equal ones (it hides the earlier).
fn mount_of(mountinfo: &str, path: &Path) -> Option<(String, String, String)> {
    let mut best: Option<(String, String, String)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(point), Some(fstype), Some(options)) =
            (fields.get(4), fields.get(dash + 1), fields.get(dash + 3))
        else {
            continue;
        };
        let point = unescape(point);
        if !path.starts_with(&point) {
            continue;
        }
        if best.as_ref().is_none_or(|(b, _, _)| point.len() >= b.len()) {
            best = Some((point, (*fstype).to_owned(), (*options).to_owned()));
        }
    }
    best
}

/// A mountinfo path with its octal escapes (`\040` for a space, ...) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The bracketed (selected) value of a sysfs choice list: `always [never] deny` -> `never`.
fn selected(s: &str) -> Option<&str> {
    let start = s.find('[')? + 1;
    let end = start + s[start..].find(']')?;
    Some(&s[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:21 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=2468408k,mode=755
40 25 0:33 / /run/xvs rw,relatime shared:20 - tmpfs tmpfs rw,size=8g,huge=within_size
41 22 0:34 / /mnt/my\\040state rw - tmpfs tmpfs rw,huge=advise
";

    fn found(path: &str) -> (String, String, String) {
        mount_of(MOUNTINFO, Path::new(path)).expect("a mount")
    }

    #[test]
    fn the_mount_is_the_longest_ancestor_and_escapes_are_undone() {
        assert_eq!(found("/run/xvs").0, "/run/xvs");
        assert_eq!(found("/run/xvs/sub").2, "rw,size=8g,huge=within_size");
        assert_eq!(found("/run/xvsother").0, "/run");
        assert_eq!(found("/var/lib/xvs").1, "ext4");
        assert_eq!(found("/mnt/my state/x").0, "/mnt/my state");
    }

    #[test]
    fn a_tmpfs_without_huge_pages_is_warned_with_the_mount_to_fix() {
        let dir = Path::new("/run/xvs");
        let (point, fstype, options) = found("/run");
        let w = advice(dir, &point, &fstype, &options, Some("never")).expect("a warning");
        assert!(w.contains("huge=never"), "{w}");
        assert!(w.contains("mount -o remount,huge=within_size /run"), "{w}");
        // `advise` in shmem_enabled does not reach tmpfs mounts (checked on 6.18).
        assert!(advice(dir, &point, &fstype, &options, Some("advise")).is_some());
        assert!(advice(dir, &point, &fstype, &options, Some("force")).is_none());
    }

    #[test]
    fn huge_mount_options_and_other_filesystems_are_fine_but_deny_is_not() {
        let dir = Path::new("/run/xvs");
        let (point, fstype, options) = found("/run/xvs");
        assert_eq!(advice(dir, &point, &fstype, &options, Some("never")), None);
        let (p, f, o) = found("/mnt/my state");
        assert_eq!(advice(dir, &p, &f, &o, None), None);
        let w = advice(dir, &point, &fstype, &options, Some("deny")).expect("deny warns");
        assert!(w.contains("[deny]"), "{w}");
        let (p, f, o) = found("/var/lib/xvs");
        assert_eq!(advice(dir, &p, &f, &o, Some("deny")), None);
    }

    #[test]
    fn the_selected_value_is_the_bracketed_one() {
        assert_eq!(
            selected("always within_size advise [never] deny force\n"),
            Some("never")
        );
        assert_eq!(selected("no brackets"), None);
        assert_eq!(unescape("a\\040b\\\\"), "a b\\\\");
    }

    #[test]
    fn small_tables_need_no_huge_pages() {
        assert_eq!(inspect(Path::new("/run/xvs"), 4096), None);
    }
}
