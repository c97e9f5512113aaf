//! What the kernel says about one configured interface, and what of it `xvs run` refuses or
//! warns about: its receive queues against `queues`, its driver's native XDP and AF_XDP
//! zero-copy against `xdp_mode` and `zero_copy`, and veth's checksum-offload trap.
//!
//! - **Queues.** The steering program redirects a frame to the socket of the queue it
//!   arrived on; a queue without a socket (the interface has more receive queues than
//!   `queues`) passes xvs's frames to the kernel, counted only as
//!   `xvs_steer_frames_total{class="no_socket"}`: connections through those queues fail.
//!   So more channels than queues is a problem unless `[dataplane] allow_fewer_queues`
//!   (then a warning), and fewer is always one (AF_XDP cannot bind a queue the interface
//!   does not have). The count comes from `ETHTOOL_GCHANNELS` (combined plus rx-only
//!   channels), else from `/sys/class/net/IF/queues/rx-*` (drivers without channels);
//!   the hint is the `ethtool -L` command in the driver's terms (`combined N`, or
//!   `rx N tx N` for a driver such as veth that counts them apart).
//! - **XDP features** come from the `netdev` generic netlink family (Linux 6.3 and later;
//!   see [`super::xdp_features`]); on an older kernel they are unknown and only
//!   `zero_copy = "on"` gets a warning.
//! - **veth** (`ETHTOOL_GDRVINFO` driver `veth`): AF_XDP in copy mode sees a frame as its
//!   sender left it, so a sender with tx checksum offload on (the default) leaves a partial
//!   checksum that xvs forwards as it is and the receiver drops. The sender is the peer,
//!   often in another namespace, so this is always a warning that names the command.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use config::{Dataplane, Interface, XdpMode, ZeroCopy};

use super::Report;
use super::xdp_features::{self, XdpFeatures};

/// `SIOCETHTOOL` (`linux/sockios.h`).
const SIOCETHTOOL: libc::c_ulong = 0x8946;
/// `ETHTOOL_GDRVINFO`.
const ETHTOOL_GDRVINFO: u32 = 0x03;
/// `ETHTOOL_GCHANNELS`.
const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// `struct ethtool_channels`.
#[repr(C)]
#[derive(Debug, Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// `struct ethtool_drvinfo`.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// Where a channel count came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `ETHTOOL_GCHANNELS` (what `ethtool -l` prints).
    Ethtool,
    /// `/sys/class/net/IF/queues/rx-*` (the driver has no channel settings).
    Sysfs,
}

/// An interface's channels: its receive queues, and how `ethtool -L` changes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Channels {
    /// Where the counts came from.
    pub source: Source,
    /// Combined (rx and tx) channels.
    pub combined: u32,
    /// Receive-only channels (veth counts all its queues here).
    pub rx: u32,
    /// The most combined channels the driver allows (0: unknown or none).
    pub max_combined: u32,
    /// The most receive-only channels the driver allows.
    pub max_rx: u32,
}

impl Channels {
    /// Receive queues: frames arrive on queues `0..rx_queues()`.
    pub fn rx_queues(&self) -> u32 {
        self.combined + self.rx
    }

    /// The most receive queues `ethtool -L` can give (`None`: unknown).
    pub fn max_rx_queues(&self) -> Option<u32> {
        match self.source {
            Source::Ethtool if self.max_combined + self.max_rx > 0 => {
                Some(self.max_combined + self.max_rx)
            }
            _ => None,
        }
    }

    /// The `ethtool -L` command that gives `ifname` `n` receive queues, in the driver's
    /// terms: `rx N tx N` for a driver that counts only rx/tx channels (veth), else
    /// `combined N` (and `rx 0` when it also has rx-only channels).
    pub fn set_command(&self, ifname: &str, n: u32) -> String {
        if self.source == Source::Ethtool && self.max_combined == 0 && self.max_rx > 0 {
            format!("ethtool -L {ifname} rx {n} tx {n}")
        } else if self.rx > 0 {
            format!("ethtool -L {ifname} combined {n} rx 0")
        } else {
            format!("ethtool -L {ifname} combined {n}")
        }
    }
}

/// A socket for ethtool ioctls.
fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `ioctl(SIOCETHTOOL)` on `ifname` with `data` (whose first field is the command).
fn ethtool<T>(ifname: &str, data: &mut T) -> io::Result<()> {
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let sock = ioctl_socket()?;
    // SAFETY: an all-zero ifreq is valid; the name is copied with its NUL kept.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (data as *mut T).cast();
    // SAFETY: `ifr` names the interface and points at `data`, which lives across the call
    // and is the struct the command reads and fills.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut ifr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The channels of `ifname` (in this network namespace): ethtool's, else sysfs's queue
/// directories.
pub fn channels(ifname: &str) -> io::Result<Channels> {
    let mut c = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    match ethtool(ifname, &mut c) {
        Ok(()) if c.combined_count + c.rx_count > 0 => Ok(Channels {
            source: Source::Ethtool,
            combined: c.combined_count,
            rx: c.rx_count,
            max_combined: c.max_combined,
            max_rx: c.max_rx,
        }),
        Ok(()) => sysfs_channels(ifname),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => sysfs_channels(ifname),
        Err(e) => Err(e),
    }
}

fn sysfs_channels(ifname: &str) -> io::Result<Channels> {
    let dir = Path::new("/sys/class/net").join(ifname).join("queues");
    let mut n = 0;
    for e in std::fs::read_dir(&dir)? {
        if e?.file_name().to_string_lossy().starts_with("rx-") {
            n += 1;
        }
    }
    Ok(Channels {
        source: Source::Sysfs,
        combined: n,
        rx: 0,
        max_combined: 0,
        max_rx: 0,
    })
}

/// The driver of `ifname` (`ethtool -i`), e.g. `veth`, `mlx5_core`.
pub fn driver(ifname: &str) -> io::Result<String> {
    // SAFETY: all-zero is a valid ethtool_drvinfo.
    let mut d: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    d.cmd = ETHTOOL_GDRVINFO;
    ethtool(ifname, &mut d)?;
    let end = d.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&d.driver[..end]).into_owned())
}

/// What `queues` against the interface's channels means: `None` when they match, else
/// `(is_problem, text)`.
pub fn compare_queues(ifc: &Interface, ch: &Channels, allow_fewer: bool) -> Option<(bool, String)> {
    let (name, want, have) = (&ifc.name, u32::from(ifc.queues), ch.rx_queues());
    let counted = match ch.source {
        Source::Ethtool => "ethtool -l",
        Source::Sysfs => "its queues in sysfs",
    };
    if have > want {
        let what = format!(
            "interface {name} has {have} receive queues ({counted}) but dataplane.interfaces sets queues = {want}: frames for xvs that arrive on {} reach no xvs socket, so the steering program passes them to the kernel (counted as xvs_steer_frames_total{{class=\"no_socket\"}}) and their connections fail",
            queue_range(want, have - 1)
        );
        return Some(if allow_fewer {
            (
                false,
                format!(
                    "{what}; allowed by [dataplane] allow_fewer_queues (steer xvs's traffic to {} only: `ethtool -X {name} equal {want}`, or flow rules)",
                    queue_range(0, want - 1)
                ),
            )
        } else {
            (
                true,
                format!(
                    "{what}; run `{}`, or set queues = {have}, or [dataplane] allow_fewer_queues = true if the NIC steers xvs's traffic to {} only",
                    ch.set_command(name, want),
                    queue_range(0, want - 1)
                ),
            )
        });
    }
    if have < want {
        let fix = match ch.max_rx_queues() {
            Some(max) if max < want => format!(
                "the driver allows at most {max}: set queues = {have} (or up to {max} after `{}`)",
                ch.set_command(name, max)
            ),
            _ => format!(
                "run `{}`, or set queues = {have}",
                ch.set_command(name, want)
            ),
        };
        return Some((
            true,
            format!(
                "interface {name} has {have} receive queues ({counted}) but dataplane.interfaces sets queues = {want}: AF_XDP cannot bind {}; {fix}",
                queue_range(have, want - 1)
            ),
        ));
    }
    None
}

/// Every per-interface check of the module doc for `ifc`, which exists.
pub(super) fn inspect(r: &mut Report, dp: &Dataplane, ifc: &Interface) {
    let name = &ifc.name;
    match channels(name) {
        Ok(ch) => match compare_queues(ifc, &ch, dp.allow_fewer_queues) {
            Some((true, text)) => r.problem("channels", text),
            Some((false, text)) => r.warning("channels", text),
            None => {}
        },
        Err(e) => r.warning(
            "channels",
            format!("cannot read the receive queues of {name} ({e}): queues = {} is not checked against them", ifc.queues),
        ),
    }
    let features = xdp_features::of(name);
    check_features(r, dp, name, features);
    if driver(name).is_ok_and(|d| d == "veth") {
        r.warning("checksum", veth_warning(name));
    }
}

/// Native XDP and zero-copy against `xdp_mode` and `zero_copy`.
fn check_features(r: &mut Report, dp: &Dataplane, name: &str, f: Option<XdpFeatures>) {
    let Some(f) = f else {
        if dp.zero_copy == ZeroCopy::On {
            r.warning("zero_copy", format!(
                "cannot tell whether {name} supports AF_XDP zero-copy (the kernel reports XDP features from Linux 6.3): with zero_copy = \"on\" `xvs run` fails when it binds if not"
            ));
        }
        return;
    };
    match (f.native, dp.xdp_mode) {
        (false, XdpMode::Native) => r.problem("xdp", format!(
            "the driver of {name} has no native XDP, but xdp_mode = \"native\": set xdp_mode = \"auto\" (generic XDP, much slower) or use a NIC whose driver has it"
        )),
        (false, XdpMode::Auto) => r.warning("xdp", format!(
            "the driver of {name} has no native XDP: xdp_mode = \"auto\" attaches in generic mode, which copies every frame through an skb (much slower)"
        )),
        _ => {}
    }
    match (f.zero_copy, dp.zero_copy) {
        (false, ZeroCopy::On) => r.problem("zero_copy", format!(
            "the driver of {name} has no AF_XDP zero-copy, but zero_copy = \"on\": set zero_copy = \"auto\" (copy mode) or use a NIC whose driver has it"
        )),
        (false, ZeroCopy::Auto) => r.warning("zero_copy", format!(
            "the driver of {name} has no AF_XDP zero-copy: its sockets bind in copy mode (the kernel copies every frame into the UMEM)"
        )),
        _ => {}
    }
}

/// The veth checksum-offload warning, with the peer's ifindex (`iflink`: its index in its own
/// namespace, so no name is guessed from this one's).
fn veth_warning(name: &str) -> String {
    let peer = std::fs::read_to_string(Path::new("/sys/class/net").join(name).join("iflink"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map_or_else(String::new, |i| {
            format!(" (ifindex {i} in the peer's network namespace)")
        });
    format!(
        "{name} is a veth: whoever sends into it must turn tx checksum offload off, else xvs forwards frames with the partial checksum the sender left (AF_XDP in copy mode sees a frame as it was sent) and the receiver drops them; run `ethtool -K PEER tx off` on its peer{peer}; xvs cannot see the peer's setting from here"
    )
}

/// `queue N` or `queues A-B`.
fn queue_range(first: u32, last: u32) -> String {
    if first == last {
        format!("queue {first}")
    } else {
        format!("queues {first}-{last}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifc(queues: u16) -> Interface {
        Interface {
            name: "eth1".into(),
            queues,
        }
    }

    const MLX: Channels = Channels {
        source: Source::Ethtool,
        combined: 8,
        rx: 0,
        max_combined: 16,
        max_rx: 0,
    };
    const VETH: Channels = Channels {
        source: Source::Ethtool,
        combined: 0,
        rx: 4,
        max_combined: 0,
        max_rx: 4,
    };

    #[test]
    fn more_channels_than_queues_is_refused_with_the_ethtool_command() {
        let (problem, text) = compare_queues(&ifc(4), &MLX, false).unwrap();
        assert!(problem);
        assert!(text.contains("has 8 receive queues (ethtool -l)"), "{text}");
        assert!(text.contains("on queues 4-7 reach no xvs socket"), "{text}");
        assert!(
            text.contains("xvs_steer_frames_total{class=\"no_socket\"}"),
            "{text}"
        );
        assert!(text.contains("run `ethtool -L eth1 combined 4`"), "{text}");
        assert!(text.contains("allow_fewer_queues = true"), "{text}");
        // veth counts rx and tx channels apart.
        let (_, text) = compare_queues(&ifc(1), &VETH, false).unwrap();
        assert!(text.contains("run `ethtool -L eth1 rx 1 tx 1`"), "{text}");
        assert!(text.contains("on queues 1-3 reach"), "{text}");
        assert!(text.contains("to queue 0 only"), "{text}");
    }

    #[test]
    fn allowed_fewer_queues_is_a_warning() {
        let (problem, text) = compare_queues(&ifc(4), &MLX, true).unwrap();
        assert!(!problem);
        assert!(
            text.contains("allowed by [dataplane] allow_fewer_queues"),
            "{text}"
        );
        assert!(text.contains("no_socket"), "{text}");
    }

    #[test]
    fn fewer_channels_than_queues_is_refused_even_when_allowed() {
        let (problem, text) = compare_queues(&ifc(10), &MLX, true).unwrap();
        assert!(problem);
        assert!(text.contains("AF_XDP cannot bind queues 8-9"), "{text}");
        assert!(text.contains("run `ethtool -L eth1 combined 10`"), "{text}");
        // Beyond what the driver allows: say so.
        let (_, text) = compare_queues(&ifc(8), &VETH, false).unwrap();
        assert!(text.contains("the driver allows at most 4"), "{text}");
        assert!(text.contains("set queues = 4"), "{text}");
    }

    #[test]
    fn matching_queues_are_fine_and_sysfs_counts_are_combined() {
        assert_eq!(compare_queues(&ifc(8), &MLX, false), None);
        let sysfs = Channels {
            source: Source::Sysfs,
            combined: 2,
            rx: 0,
            max_combined: 0,
            max_rx: 0,
        };
        assert_eq!(compare_queues(&ifc(2), &sysfs, false), None);
        let (_, text) = compare_queues(&ifc(1), &sysfs, false).unwrap();
        assert!(text.contains("(its queues in sysfs)"), "{text}");
        assert!(text.contains("`ethtool -L eth1 combined 1`"), "{text}");
        assert_eq!(sysfs.max_rx_queues(), None);
    }

    /// The loopback device of this namespace: one receive queue, no veth, no channels.
    #[test]
    fn loopback_has_one_queue() {
        let ch = channels("lo").unwrap();
        assert_eq!(ch.rx_queues(), 1, "{ch:?}");
        assert!(channels("no-such-if0").is_err());
        assert!(channels("a/b\0").is_err());
    }
}
