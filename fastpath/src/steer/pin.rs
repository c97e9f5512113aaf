//! Pinned steering: the link and maps in bpffs that keep the program attached across a
//! restart, and the next process's adoption of them. The layout and its cleanup are
//! described in the module doc of [`super`].

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use aya::Pod;
use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{Array, HashMap, IterableMap, Map, MapData, MapError, PerCpuArray};

use super::maps::{Hold, LpmAddr};
use super::sys::{self, LinkInfo};
use super::{
    Link, Maps, Mirrored, MirroredCidrs, SteerCounters, SteerError, Steering, XdpAttach, counters,
    if_index, netlink, program, remove_leftovers, with_mode,
};

/// The bpffs directory under which [`pin_dir`] keeps one directory per network namespace.
pub const PIN_ROOT: &str = "/sys/fs/bpf/xvs";
/// The pinned `bpf_link`, per interface.
const LINK: &str = "link";
/// The maps pinned next to the link.
const MAP_PINS: [&str; 7] = [
    "frontends",
    "vips",
    "backends",
    "snat",
    "cidrs",
    "counters",
    "hold",
];
/// Appended to a map's name while a new program's maps wait for it to take over the link
/// (bpffs refuses names with a dot).
pub(crate) const STAGED: &str = "-new";

/// The pin directory of the calling thread's network namespace:
/// `/sys/fs/bpf/xvs/ns-<inode of /proc/thread-self/ns/net>` (for a thread that did not
/// `setns`, the inode of `/proc/self/ns/net`). [`Steering::attach_pinned`] creates it on
/// demand.
pub fn pin_dir() -> io::Result<PathBuf> {
    pin_dir_in(Path::new(PIN_ROOT))
}

/// [`pin_dir`] under another bpffs directory `root` (tests use their own).
pub fn pin_dir_in(root: &Path) -> io::Result<PathBuf> {
    // thread-self, not self: a thread that entered another namespace gets that one's.
    let ino = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
    Ok(root.join(format!("ns-{ino}")))
}

/// The directory of `ifname`'s pins in `pins`. bpffs refuses names with a dot, which VLAN
/// interfaces have (`eth0.100`): a dot becomes a colon, which no interface name has.
fn iface_dir(pins: &Path, ifname: &str) -> PathBuf {
    pins.join(ifname.replace('.', ":"))
}

impl Steering {
    /// Loads the program and its maps and attaches them to `ifname`, pinned under `pins`
    /// (normally [`pin_dir`]) so that they stay attached when this process exits or dies.
    ///
    /// If `pins/<ifname>/link` holds a live xvs link for this interface, the link is
    /// adopted: the old program's ownership maps (`frontends`, `vips`, `backends`, `snat`)
    /// and its hold are copied into the new program's, then the new program replaces the old
    /// one on the link atomically (`BPF_LINK_UPDATE`), so every frame meets one program or
    /// the other, both knowing what xvs owns and holding what has no socket; the new maps'
    /// pins then replace the old ones. The link keeps its attach mode (a different
    /// configured mode is logged; changing it needs the pins removed, a gap). Otherwise (no
    /// pin, or a stale one whose interface is gone) a new link is attached, with the same
    /// native/generic/`Auto` rules and legacy-leftover removal as [`Steering::attach`], and
    /// pinned there. Returns whether an existing link was adopted.
    ///
    /// Nothing guards against two live processes on one interface: the second adopts the
    /// link from under the first.
    pub fn attach_pinned(
        ifname: &str,
        mode: vocab::XdpMode,
        pins: &Path,
    ) -> Result<(Steering, bool), SteerError> {
        Self::attach_pinned_with(ifname, mode, pins, &[])
    }

    /// [`Steering::attach_pinned`] with `sockets` (`(queue, AF_XDP socket)`) already in the
    /// new program's XSK map when it takes the link: a takeover's sockets are the same
    /// kernel objects the old program redirects to, so the adopted link never meets a queue
    /// without its socket (no frame held, none passed) while the old process still polls.
    pub fn attach_pinned_with(
        ifname: &str,
        mode: vocab::XdpMode,
        pins: &Path,
        sockets: &[(u32, std::os::fd::RawFd)],
    ) -> Result<(Steering, bool), SteerError> {
        let ifindex = if_index(ifname)?;
        let dir = iface_dir(pins, ifname);
        check_bpffs(&dir)?;
        std::fs::create_dir_all(&dir).map_err(|source| SteerError::PinDir {
            path: dir.clone(),
            source,
        })?;
        let link_path = dir.join(LINK);
        let old = live_link(ifname, ifindex, &dir)?;
        if old.is_none() {
            remove_leftovers(ifname, ifindex)?;
        }

        let mut ebpf = super::load_program()?;
        let mut maps = Maps::take(&mut ebpf)?;
        for &(queue, fd) in sockets {
            maps.register_socket(queue, fd)?;
        }
        let mut staged = Staged::pin(&dir, &maps.pinnable()).map_err(pin_error)?;
        let prog = program(&mut ebpf)?;
        let prog_fd = prog.fd().map_err(SteerError::Verify)?.as_fd();

        let (fd, attached, adopted) = match old {
            Some((fd, info)) => {
                let attached = adopted_mode(ifname, ifindex, &info, mode, &link_path)?;
                maps.copy_from(&dir)?;
                sys::link_update(fd.as_fd(), prog_fd).map_err(|source| SteerError::Adopt {
                    path: link_path.clone(),
                    source,
                })?;
                staged.commit().map_err(pin_error)?;
                tracing::info!(
                    interface = %ifname,
                    mode = attached.name(),
                    link = info.id,
                    pins = %dir.display(),
                    "XDP steering adopted the pinned link"
                );
                (fd, attached, true)
            }
            None => {
                let (fd, attached) = with_mode(ifname, mode, |how| {
                    sys::link_create(prog_fd, ifindex, how.flag()).map_err(|source| {
                        SteerError::Link {
                            ifname: ifname.to_owned(),
                            mode: how.name(),
                            source,
                        }
                    })
                })?;
                // Maps first: a pinned link always has its maps beside it.
                staged.commit().map_err(pin_error)?;
                sys::obj_pin(fd.as_fd(), &link_path).map_err(|source| SteerError::Pin {
                    path: link_path.clone(),
                    source,
                })?;
                tracing::info!(
                    interface = %ifname,
                    mode = attached.name(),
                    pins = %dir.display(),
                    "XDP steering attached and pinned"
                );
                (fd, attached, false)
            }
        };
        let steering = Steering {
            ifname: ifname.to_owned(),
            attached,
            link: Some(Link::Pinned { fd, dir }),
            maps,
            _ebpf: ebpf,
        };
        Ok((steering, adopted))
    }
}

/// The hold of the program pinned for `ifname` under `pins`, `(deadline_ns, owner_pid)`
/// as the last [`Steering::set_hold`] left it (or as copied by an adopting process that has
/// not set its own yet); `None` when nothing is pinned for `ifname`.
pub fn pinned_hold(pins: &Path, ifname: &str) -> Result<Option<(u64, u32)>, SteerError> {
    let dir = iface_dir(pins, ifname);
    if !is_pinned(&dir)? {
        return Ok(None);
    }
    let path = dir.join("hold");
    let hold: Array<MapData, Hold> = open_pinned(&path)?;
    let h = hold
        .get(&0, 0)
        .map_err(|source| SteerError::PinnedMap { path, source })?;
    Ok(Some((h.deadline_ns, h.owner_pid)))
}

/// The counters of the program pinned for `ifname` under `pins` (since that program was
/// loaded: an adopting process starts from zero); `None` when nothing is pinned.
pub fn pinned_counters(pins: &Path, ifname: &str) -> Result<Option<SteerCounters>, SteerError> {
    let dir = iface_dir(pins, ifname);
    if !is_pinned(&dir)? {
        return Ok(None);
    }
    let path = dir.join("counters");
    let map: PerCpuArray<MapData, u64> = open_pinned(&path)?;
    counters::read(&map).map(Some)
}

/// Removes every xvs pin under `pins` (a [`pin_dir`]): each interface's link, maps and
/// directory, then `pins` itself. Removing a link's pin detaches its program (moments
/// later: the kernel frees the link from a work item) unless a live process still holds the
/// link. Returns how many links were removed; a missing `pins` is `Ok(0)`, so it is
/// idempotent. Files xvs does not know are left, and then `pins` cannot be removed (an
/// error names it).
///
/// Callers removing the state of an xvs that may come back (a watchdog) should first check
/// [`pinned_hold`]: a hold refreshed by another process means a new xvs adopted the link.
pub fn remove_pins(pins: &Path) -> io::Result<usize> {
    let entries = match std::fs::read_dir(pins) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        r => r.map_err(named(pins))?,
    };
    let mut links = 0;
    for entry in entries {
        let entry = entry.map_err(named(pins))?;
        if entry.file_type().map_err(named(&entry.path()))?.is_dir() {
            links += usize::from(remove_iface(&entry.path())?);
        }
    }
    remove_dir(pins)?;
    if links > 0 {
        tracing::info!(pins = %pins.display(), links, "removed xvs's pinned XDP steering");
    }
    Ok(links)
}

/// [`SteerError::Pinned`] when xvs's pinned link in [`pin_dir`] holds `ifindex`'s XDP.
pub(super) fn refuse_pinned(ifname: &str, ifindex: u32) -> Result<(), SteerError> {
    let Ok(dir) = pin_dir() else {
        return Ok(());
    };
    let path = iface_dir(&dir, ifname).join(LINK);
    let Ok(fd) = sys::obj_get(&path) else {
        return Ok(());
    };
    match sys::link_info(fd.as_fd()) {
        Ok(info) if holds(&info, ifindex) => Err(SteerError::Pinned {
            ifname: ifname.to_owned(),
            path,
        }),
        _ => Ok(()),
    }
}

/// Detaches the pinned link `fd` now, whoever else holds it, and removes the interface's
/// pins in `dir`.
pub(super) fn detach(ifname: &str, fd: BorrowedFd<'_>, dir: &Path) -> Result<(), SteerError> {
    match sys::link_detach(fd) {
        // ENOLINK: the interface is gone, and the program with it.
        Err(e) if e.raw_os_error() != Some(libc::ENOLINK) => {
            return Err(SteerError::Adopt {
                path: dir.join(LINK),
                source: e,
            });
        }
        _ => {}
    }
    remove_iface(dir).map_err(|source| SteerError::Pin {
        path: dir.to_owned(),
        source,
    })?;
    tracing::info!(
        interface = %ifname,
        pins = %dir.display(),
        "XDP steering detached and unpinned"
    );
    Ok(())
}

/// Whether `info` is an XDP link attached to `ifindex`.
fn holds(info: &LinkInfo, ifindex: u32) -> bool {
    info.link_type == sys::LINK_TYPE_XDP && info.ifindex == ifindex
}

/// The pinned link in `dir` if it holds `ifindex`'s XDP. A stale one (its interface gone or
/// recreated) is removed with its maps.
fn live_link(
    ifname: &str,
    ifindex: u32,
    dir: &Path,
) -> Result<Option<(OwnedFd, LinkInfo)>, SteerError> {
    let path = dir.join(LINK);
    let pin_err = |source| SteerError::Pin {
        path: path.clone(),
        source,
    };
    let fd = match sys::obj_get(&path) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(pin_err(e)),
    };
    let info = sys::link_info(fd.as_fd()).map_err(pin_err)?;
    if holds(&info, ifindex) {
        return Ok(Some((fd, info)));
    }
    tracing::warn!(
        interface = %ifname,
        link = %path.display(),
        "removing a stale pinned XDP link: its interface is gone"
    );
    drop(fd);
    remove_files(dir).map_err(pin_err)?;
    Ok(None)
}

/// The mode of the adopted link's program, from the interface's netlink attributes.
fn adopted_mode(
    ifname: &str,
    ifindex: u32,
    info: &LinkInfo,
    mode: vocab::XdpMode,
    link_path: &Path,
) -> Result<XdpAttach, SteerError> {
    let adopt_err = |source| SteerError::Adopt {
        path: link_path.to_owned(),
        source,
    };
    let attached = netlink::attached(ifindex).map_err(adopt_err)?;
    let a = attached
        .iter()
        .find(|a| a.prog_id == info.prog_id)
        .ok_or_else(|| {
            adopt_err(io::Error::other(
                "the interface does not show the pinned link's program",
            ))
        })?;
    let got = if a.mode_flag == netlink::XDP_FLAGS_SKB_MODE {
        XdpAttach::Generic
    } else {
        XdpAttach::Native
    };
    let wanted = match mode {
        vocab::XdpMode::Native => Some(XdpAttach::Native),
        vocab::XdpMode::Generic => Some(XdpAttach::Generic),
        vocab::XdpMode::Auto => None,
    };
    if wanted.is_some_and(|w| w != got) {
        tracing::warn!(
            interface = %ifname,
            mode = got.name(),
            "the pinned XDP link keeps its mode; to change it, remove the pinned state (a gap \
             in which the kernel sees xvs's frames) and restart"
        );
    }
    Ok(got)
}

impl Maps {
    /// The maps pinned next to the link, by pin name.
    fn pinnable(&self) -> [(&'static str, BorrowedFd<'_>); 7] {
        fn fd(m: &MapData) -> BorrowedFd<'_> {
            m.fd().as_fd()
        }
        [
            ("frontends", fd(self.frontends.map.map())),
            ("vips", fd(self.vips.map.map())),
            ("backends", fd(self.backends.map.map())),
            ("snat", fd(self.snat.map.map())),
            ("cidrs", fd(self.cidrs.map.map())),
            ("counters", fd(self.counters.map())),
            ("hold", fd(self.hold.map())),
        ]
    }

    /// Copies what the old program's pinned maps in `dir` hold (ownership and hold) into
    /// these, so the new program steers and holds exactly as the old one did.
    fn copy_from(&mut self, dir: &Path) -> Result<(), SteerError> {
        copy_hash(&mut self.frontends, dir)?;
        copy_hash(&mut self.vips, dir)?;
        copy_hash(&mut self.backends, dir)?;
        copy_hash(&mut self.snat, dir)?;
        copy_cidrs(&mut self.cidrs, dir)?;
        let path = dir.join("hold");
        let old: Array<MapData, Hold> = open_pinned(&path)?;
        let hold = old
            .get(&0, 0)
            .map_err(|source| SteerError::PinnedMap { path, source })?;
        self.hold.set(0, hold, 0).map_err(|source| SteerError::Map {
            map: "hold",
            source,
        })
    }
}

fn copy_hash<K: Pod + Eq + std::hash::Hash, V: Pod + PartialEq>(
    into: &mut Mirrored<K, V>,
    dir: &Path,
) -> Result<(), SteerError> {
    let path = dir.join(into.name);
    let old: HashMap<MapData, K, V> = open_pinned(&path)?;
    let entries = old
        .iter()
        .collect::<Result<Vec<(K, V)>, MapError>>()
        .map_err(|source| SteerError::PinnedMap { path, source })?;
    into.replace(&entries)
}

/// The Service CIDRs of the old program's pinned `cidrs` trie, into `into`; nothing when
/// there is none (an xvs from before the trie existed pinned that state).
fn copy_cidrs(into: &mut MirroredCidrs, dir: &Path) -> Result<(), SteerError> {
    let path = dir.join("cidrs");
    if !path.exists() {
        return Ok(());
    }
    let old: LpmTrie<MapData, LpmAddr, u32> = open_pinned(&path)?;
    let keys = old
        .keys()
        .collect::<Result<Vec<_>, MapError>>()
        .map_err(|source| SteerError::PinnedMap { path, source })?;
    let err = |source| SteerError::Map {
        map: "cidrs",
        source,
    };
    for k in keys {
        into.map.insert(&k, 1, 0).map_err(err)?;
        into.entries.insert((k.prefix_len(), k.data()));
    }
    Ok(())
}

/// Opens the map pinned at `path` as `T`, checking its type and key and value sizes.
fn open_pinned<T: TryFrom<Map, Error = MapError>>(path: &Path) -> Result<T, SteerError> {
    let fd = sys::obj_get(path).map_err(|source| SteerError::Pin {
        path: path.to_owned(),
        source,
    })?;
    MapData::from_fd(fd)
        .and_then(Map::from_map_data)
        .and_then(T::try_from)
        .map_err(|source| SteerError::PinnedMap {
            path: path.to_owned(),
            source,
        })
}

/// New maps pinned as `<name>-new` in a directory until [`Staged::commit`] renames them over
/// the live names; dropped uncommitted, it removes them. Shared by the steering's pins and
/// `xvs decap`'s (`crate::decap`); errors are the pin's path and what failed.
pub(crate) struct Staged {
    dir: PathBuf,
    names: Vec<&'static str>,
    committed: bool,
}

impl Staged {
    pub(crate) fn pin(
        dir: &Path,
        maps: &[(&'static str, BorrowedFd<'_>)],
    ) -> Result<Staged, (PathBuf, io::Error)> {
        let staged = Staged {
            dir: dir.to_owned(),
            names: maps.iter().map(|(name, _)| *name).collect(),
            committed: false,
        };
        for (name, fd) in maps {
            let path = staged.path(name);
            // A crashed attach may have left one behind.
            if let Err(e) = remove_if_exists(&path) {
                return Err((path, e));
            }
            if let Err(e) = sys::obj_pin(*fd, &path) {
                return Err((path, e));
            }
        }
        Ok(staged)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}{STAGED}"))
    }

    /// Replaces each live pin with its staged one (a rename: the name never goes missing).
    pub(crate) fn commit(&mut self) -> Result<(), (PathBuf, io::Error)> {
        for name in &self.names {
            let live = self.dir.join(name);
            std::fs::rename(self.path(name), &live).map_err(|source| (live, source))?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            for name in &self.names {
                let _ = remove_if_exists(&self.path(name));
            }
        }
    }
}

/// Fails unless `dir`, or what exists of its path, is on a bpf file system: a pin
/// elsewhere cannot be made, and one on a bpffs instance that dies with the process's mount
/// namespace would not outlive it. (Under `ip netns exec`, which mounts a new `/sys`,
/// `/sys/fs/bpf` is an empty sysfs directory.)
fn check_bpffs(dir: &Path) -> Result<(), SteerError> {
    on_bpffs(dir).map_err(|source| SteerError::PinDir {
        path: dir.to_owned(),
        source,
    })
}

/// Fails unless `dir`, or what exists of its path, is on a bpf file system (the decap
/// programs' pins have the same needs).
pub(crate) fn on_bpffs(dir: &Path) -> io::Result<()> {
    const BPF_FS_MAGIC: u32 = 0xcafe_4a11;
    let existing = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is NUL-terminated; `st` is a valid statfs to write.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // f_type's width and signedness vary by architecture; the magic fits 32 bits.
    if st.f_type as u32 != BPF_FS_MAGIC {
        return Err(io::Error::other(format!(
            "{} is not on a bpf file system",
            existing.display()
        )));
    }
    Ok(())
}

/// Whether `dir` holds a `link` pin.
fn is_pinned(dir: &Path) -> Result<bool, SteerError> {
    let path = dir.join(LINK);
    match std::fs::symlink_metadata(&path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(SteerError::Pin { path, source }),
    }
}

/// Removes an interface's pins and its directory; returns whether a link was pinned.
fn remove_iface(dir: &Path) -> io::Result<bool> {
    let link = remove_files(dir)?;
    remove_dir(dir)?;
    Ok(link)
}

/// Removes an interface's pins (link first, then maps, staged or not); returns whether a
/// link was pinned.
fn remove_files(dir: &Path) -> io::Result<bool> {
    let link = remove_if_exists(&dir.join(LINK))?;
    for name in MAP_PINS {
        remove_if_exists(&dir.join(name))?;
        remove_if_exists(&dir.join(format!("{name}{STAGED}")))?;
    }
    Ok(link)
}

/// Removes a file; `Ok(false)` when it was not there.
fn remove_if_exists(path: &Path) -> io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(named(path)(e)),
    }
}

fn remove_dir(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(named(path)(e)),
        _ => Ok(()),
    }
}

/// Prefixes an error with the path it is about.
/// A [`Staged`] failure as the steering's error.
fn pin_error((path, source): (PathBuf, io::Error)) -> SteerError {
    SteerError::Pin { path, source }
}

fn named(path: &Path) -> impl Fn(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_directories_have_no_dots() {
        let pins = Path::new("/sys/fs/bpf/xvs/ns-1");
        assert_eq!(iface_dir(pins, "eth0"), pins.join("eth0"));
        assert_eq!(iface_dir(pins, "eth0.100"), pins.join("eth0:100"));
    }

    /// Pins off bpffs (a plain directory, or `/sys/fs/bpf` under `ip netns exec`) are
    /// refused before anything is loaded or created.
    #[test]
    fn pins_off_bpffs_are_refused() {
        let pins = std::env::temp_dir().join(format!("xvs-not-bpffs-{}", std::process::id()));
        let err = Steering::attach_pinned("lo", vocab::XdpMode::Auto, &pins).unwrap_err();
        assert!(matches!(err, SteerError::PinDir { .. }), "{err}");
        assert!(
            err.to_string().contains("not on a bpf file system"),
            "{err}"
        );
        assert!(!pins.exists());
    }

    #[test]
    fn pin_dir_names_the_namespace() {
        let dir = pin_dir_in(Path::new("/x")).unwrap();
        let ino = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        assert_eq!(dir, Path::new("/x").join(format!("ns-{ino}")));
        assert_eq!(pin_dir().unwrap().parent(), Some(Path::new(PIN_ROOT)));
    }
}
