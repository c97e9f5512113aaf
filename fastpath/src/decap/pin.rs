//! The decap programs' pinned links and maps: attaching or updating them in place
//! ([`apply`]), reading them back ([`pinned`]) and removing them ([`detach`]). The layout is
//! in the module doc of [`super`].

use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray};

use super::maps::{AddrKey, PortKey, PortValue};
use super::{
    DecapCounters, DecapError, EGRESS_PROGRAM, Loaded, MAP_PINS, PortMap, Tables, XDP_PROGRAM,
    counters,
};
use crate::steer::sys;
use crate::steer::{STAGED, Staged, XdpAttach, on_bpffs};

/// The bpffs directory under which [`pin_dir_in`] keeps one directory per network namespace.
pub const PIN_ROOT: &str = "/sys/fs/bpf/xvs-decap";
/// The XDP link's pin in an interface's directory.
const XDP_LINK: &str = "xdp";
/// The tcx egress link's pin in an interface's directory.
const EGRESS_LINK: &str = "egress";

/// The pin directory of the calling thread's network namespace under `root`:
/// `root/ns-<inode of /proc/thread-self/ns/net>`.
pub fn pin_dir_in(root: &Path) -> io::Result<PathBuf> {
    let ino = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
    Ok(root.join(format!("ns-{ino}")))
}

/// One interface as [`apply`] left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedIface {
    /// The interface.
    pub ifname: String,
    /// How the XDP program was attached: "native" or "generic" for a new link, "updated"
    /// when the pinned link was kept and its program replaced.
    pub xdp: &'static str,
    /// Whether the egress program is attached (there are port translations).
    pub egress: bool,
}

/// What [`apply`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The pin directory.
    pub dir: PathBuf,
    /// The interfaces given, in order.
    pub interfaces: Vec<AttachedIface>,
    /// Interfaces an earlier run attached that were not given: detached.
    pub detached: Vec<String>,
}

/// What is pinned in this network namespace (read back from bpffs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinned {
    /// The pin directory.
    pub dir: PathBuf,
    /// Interfaces with an XDP link, and whether each has the egress link.
    pub interfaces: Vec<(String, bool)>,
    /// The VIPs decapsulated, sorted.
    pub vips: Vec<IpAddr>,
    /// The port translations, sorted.
    pub ports: Vec<PortMap>,
    /// The GUE port.
    pub gue_port: u16,
    /// The programs' counters since the last [`apply`].
    pub counters: DecapCounters,
}

/// Attaches the decap programs, with maps holding `tables`, to `interfaces` through links
/// pinned under [`pin_dir_in`]`(root)`; an interface whose pinned link is live keeps it and
/// gets the new program in place. The egress program is attached only when `tables` has
/// port translations (and detached from an interface that had it otherwise). Interfaces an
/// earlier run attached that are not in `interfaces` are detached. On an error, what was
/// done so far stays (running again finishes it; [`detach`] undoes it).
pub fn apply(
    interfaces: &[String],
    mode: vocab::XdpMode,
    tables: &Tables,
    root: &Path,
) -> Result<Applied, DecapError> {
    let dir = pin_dir_in(root).map_err(|source| DecapError::PinDir {
        path: root.to_owned(),
        source,
    })?;
    let pin_dir_err = |source| DecapError::PinDir {
        path: dir.clone(),
        source,
    };
    on_bpffs(&dir).map_err(pin_dir_err)?;
    // Every interface must exist before anything changes.
    let indices = interfaces
        .iter()
        .map(|i| if_index(i))
        .collect::<Result<Vec<u32>, DecapError>>()?;
    let loaded = Loaded::load(tables)?;
    std::fs::create_dir_all(&dir).map_err(pin_dir_err)?;

    let mut staged = Staged::pin(&dir, &loaded.map_fds()).map_err(pin_error)?;
    let xdp = loaded.program_fd(XDP_PROGRAM)?;
    let egress = loaded.program_fd(EGRESS_PROGRAM)?;
    let mut attached = Vec::with_capacity(interfaces.len());
    for (ifname, &ifindex) in interfaces.iter().zip(&indices) {
        let idir = iface_dir(&dir, ifname);
        std::fs::create_dir_all(&idir).map_err(|source| DecapError::PinDir {
            path: idir.clone(),
            source,
        })?;
        let how = attach_xdp(ifname, ifindex, &idir, xdp, mode)?;
        if tables.translates() {
            attach_egress(ifname, ifindex, &idir, egress)?;
        } else {
            detach_link(&idir.join(EGRESS_LINK))?;
        }
        attached.push(AttachedIface {
            ifname: ifname.clone(),
            xdp: how,
            egress: tables.translates(),
        });
    }
    let mut detached = Vec::new();
    for (ifname, idir) in iface_dirs(&dir)? {
        if !interfaces.contains(&ifname) {
            detach_iface(&idir)?;
            detached.push(ifname);
        }
    }
    staged.commit().map_err(pin_error)?;
    for a in &attached {
        tracing::info!(interface = %a.ifname, xdp = a.xdp, egress = a.egress, pins = %dir.display(), "xvs decap attached");
    }
    Ok(Applied {
        dir,
        interfaces: attached,
        detached,
    })
}

/// Detaches the decap programs from every interface of this network namespace and removes
/// their pins under `root`. Returns the interfaces detached; nothing pinned is `Ok(empty)`,
/// so it is idempotent.
pub fn detach(root: &Path) -> Result<Vec<String>, DecapError> {
    let dir = pin_dir_in(root).map_err(|source| DecapError::PinDir {
        path: root.to_owned(),
        source,
    })?;
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut detached = Vec::new();
    for (ifname, idir) in iface_dirs(&dir)? {
        detach_iface(&idir)?;
        detached.push(ifname);
    }
    for name in MAP_PINS {
        remove_pin(&dir.join(name))?;
        remove_pin(&dir.join(format!("{name}{STAGED}")))?;
    }
    std::fs::remove_dir(&dir).map_err(|source| DecapError::Pin { path: dir, source })?;
    Ok(detached)
}

/// What is pinned under `root` for this network namespace; `None` when nothing is.
pub fn pinned(root: &Path) -> Result<Option<Pinned>, DecapError> {
    let dir = pin_dir_in(root).map_err(|source| DecapError::PinDir {
        path: root.to_owned(),
        source,
    })?;
    if !dir.join("counters").exists() {
        return Ok(None);
    }
    let mut interfaces = Vec::new();
    for (ifname, idir) in iface_dirs(&dir)? {
        if idir.join(XDP_LINK).exists() {
            interfaces.push((ifname, idir.join(EGRESS_LINK).exists()));
        }
    }
    let vips_map: HashMap<MapData, AddrKey, u32> = open_pinned(&dir.join("vips"))?;
    let mut vips = vips_map
        .keys()
        .map(|k| k.map(|k| unmapped(k.ip)))
        .collect::<Result<Vec<_>, MapError>>()
        .map_err(pinned_map(&dir, "vips"))?;
    vips.sort();
    let ports_map: HashMap<MapData, PortKey, PortValue> = open_pinned(&dir.join("ports"))?;
    let mut ports = ports_map
        .iter()
        .map(|r| {
            r.map(|(k, v)| PortMap {
                vip: unmapped(k.ip),
                proto: k.proto,
                port: u16::from_be(k.port_be),
                target: u16::from_be(v.port_be),
            })
        })
        .collect::<Result<Vec<_>, MapError>>()
        .map_err(pinned_map(&dir, "ports"))?;
    ports.sort_by_key(|p| (p.vip, p.proto, p.port));
    let settings: aya::maps::Array<MapData, super::maps::Settings> =
        open_pinned(&dir.join("settings"))?;
    let gue_port = settings
        .get(&0, 0)
        .map(|s| u16::from_be(s.gue_port_be))
        .map_err(pinned_map(&dir, "settings"))?;
    let counters_map: PerCpuArray<MapData, u64> = open_pinned(&dir.join("counters"))?;
    Ok(Some(Pinned {
        dir,
        interfaces,
        vips,
        ports,
        gue_port,
        counters: counters::read(&counters_map)?,
    }))
}

fn pinned_map<'a>(dir: &'a Path, name: &'static str) -> impl Fn(MapError) -> DecapError + 'a {
    move |source| DecapError::Pin {
        path: dir.join(name),
        source: io::Error::other(source.to_string()),
    }
}

/// The address of a 16-byte map key (IPv4 v4-mapped).
fn unmapped(ip: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(ip);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Attaches (or updates) the XDP program on `ifname`; how, for [`AttachedIface::xdp`].
fn attach_xdp(
    ifname: &str,
    ifindex: u32,
    idir: &Path,
    prog: BorrowedFd<'_>,
    mode: vocab::XdpMode,
) -> Result<&'static str, DecapError> {
    let path = idir.join(XDP_LINK);
    if let Some(link) = live_link(&path, ifindex, sys::LINK_TYPE_XDP)? {
        sys::link_update(link.as_fd(), prog).map_err(|source| DecapError::Link { path, source })?;
        return Ok("updated");
    }
    let attach = |how: XdpAttach| {
        sys::link_create(prog, ifindex, how.flag()).map_err(|source| DecapError::Attach {
            ifname: ifname.to_owned(),
            mode: how.name(),
            source,
        })
    };
    let (link, how) = match mode {
        vocab::XdpMode::Native => (attach(XdpAttach::Native)?, XdpAttach::Native),
        vocab::XdpMode::Generic => (attach(XdpAttach::Generic)?, XdpAttach::Generic),
        vocab::XdpMode::Auto => match attach(XdpAttach::Native) {
            Ok(link) => (link, XdpAttach::Native),
            Err(native) => {
                tracing::warn!(interface = %ifname, error = %native, "native XDP failed; falling back to generic XDP");
                (attach(XdpAttach::Generic)?, XdpAttach::Generic)
            }
        },
    };
    pin_link(link.as_fd(), &path)?;
    Ok(how.name())
}

/// Attaches (or updates) the egress program on `ifname`.
fn attach_egress(
    ifname: &str,
    ifindex: u32,
    idir: &Path,
    prog: BorrowedFd<'_>,
) -> Result<(), DecapError> {
    let path = idir.join(EGRESS_LINK);
    if let Some(link) = live_link(&path, ifindex, sys::LINK_TYPE_TCX)? {
        return sys::link_update(link.as_fd(), prog)
            .map_err(|source| DecapError::Link { path, source });
    }
    let link = sys::link_create_tcx_egress(prog, ifindex).map_err(|source| DecapError::Egress {
        ifname: ifname.to_owned(),
        source,
    })?;
    pin_link(link.as_fd(), &path)
}

fn pin_link(link: BorrowedFd<'_>, path: &Path) -> Result<(), DecapError> {
    sys::obj_pin(link, path).map_err(|source| DecapError::Pin {
        path: path.to_owned(),
        source,
    })
}

/// The link pinned at `path` if it is a `link_type` link of `ifindex`. A stale one (its
/// interface gone or recreated, or not what the name says) is removed.
fn live_link(path: &Path, ifindex: u32, link_type: u32) -> Result<Option<OwnedFd>, DecapError> {
    let pin_err = |source| DecapError::Pin {
        path: path.to_owned(),
        source,
    };
    let fd = match sys::obj_get(path) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(pin_err(e)),
    };
    let info = sys::link_info(fd.as_fd()).map_err(pin_err)?;
    if info.link_type == link_type && info.ifindex == ifindex {
        return Ok(Some(fd));
    }
    tracing::warn!(link = %path.display(), "removing a stale pinned decap link: its interface is gone");
    drop(fd);
    remove_pin(path)?;
    Ok(None)
}

/// Detaches the link pinned at `path` now (whoever else holds it) and removes the pin;
/// nothing there is fine.
fn detach_link(path: &Path) -> Result<(), DecapError> {
    let fd = match sys::obj_get(path) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(DecapError::Pin {
                path: path.to_owned(),
                source,
            });
        }
    };
    match sys::link_detach(fd.as_fd()) {
        // ENOLINK: the interface is gone, and the program with it.
        Err(e) if e.raw_os_error() != Some(libc::ENOLINK) => {
            return Err(DecapError::Link {
                path: path.to_owned(),
                source: e,
            });
        }
        _ => {}
    }
    remove_pin(path)
}

fn detach_iface(idir: &Path) -> Result<(), DecapError> {
    detach_link(&idir.join(XDP_LINK))?;
    detach_link(&idir.join(EGRESS_LINK))?;
    std::fs::remove_dir(idir).map_err(|source| DecapError::Pin {
        path: idir.to_owned(),
        source,
    })
}

/// A staged pin's failure as decap's error.
fn pin_error((path, source): (PathBuf, io::Error)) -> DecapError {
    DecapError::Pin { path, source }
}

fn remove_pin(path: &Path) -> Result<(), DecapError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(DecapError::Pin {
            path: path.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// The interfaces' directories in `dir`: (interface name, directory).
fn iface_dirs(dir: &Path) -> Result<Vec<(String, PathBuf)>, DecapError> {
    let err = |source| DecapError::Pin {
        path: dir.to_owned(),
        source,
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        if entry.file_type().map_err(err)?.is_dir() {
            let name = entry.file_name().to_string_lossy().replace(':', ".");
            out.push((name, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The directory of `ifname`'s links. bpffs refuses names with a dot (VLANs: `eth0.100`):
/// a dot becomes a colon, which no interface name has.
fn iface_dir(dir: &Path, ifname: &str) -> PathBuf {
    dir.join(ifname.replace('.', ":"))
}

fn if_index(ifname: &str) -> Result<u32, DecapError> {
    let no_interface = |source| DecapError::NoInterface {
        ifname: ifname.to_owned(),
        source,
    };
    let name = std::ffi::CString::new(ifname)
        .map_err(|_| no_interface(io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: `name` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(no_interface(io::Error::last_os_error()));
    }
    Ok(index)
}

/// Opens the map pinned at `path` as `T`, checking its type and key and value sizes.
fn open_pinned<T: TryFrom<Map, Error = MapError>>(path: &Path) -> Result<T, DecapError> {
    let fd = sys::obj_get(path).map_err(|source| DecapError::Pin {
        path: path.to_owned(),
        source,
    })?;
    MapData::from_fd(fd)
        .and_then(Map::from_map_data)
        .and_then(T::try_from)
        .map_err(|source| DecapError::Pin {
            path: path.to_owned(),
            source: io::Error::other(source.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_directories_have_no_dots() {
        let dir = Path::new("/sys/fs/bpf/xvs-decap/ns-1");
        assert_eq!(iface_dir(dir, "eth0.100"), dir.join("eth0:100"));
        assert_eq!(
            unmapped(AddrKey::new("198.18.100.1".parse().unwrap()).ip),
            "198.18.100.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            unmapped(AddrKey::new("2001:2::1".parse().unwrap()).ip),
            "2001:2::1".parse::<IpAddr>().unwrap()
        );
    }

    /// Pins off bpffs are refused before anything is loaded or created.
    #[test]
    fn pins_off_bpffs_are_refused() {
        let root = std::env::temp_dir().join(format!("xvs-decap-not-bpffs-{}", std::process::id()));
        let tables = Tables {
            gue_port: 6080,
            vips: vec![],
            ports: vec![],
        };
        let err = apply(&["lo".to_owned()], vocab::XdpMode::Auto, &tables, &root).unwrap_err();
        assert!(matches!(err, DecapError::PinDir { .. }), "{err}");
        assert!(!root.exists());
    }
}
