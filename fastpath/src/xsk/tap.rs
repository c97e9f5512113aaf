//! The kernel exception path: frames the steering program redirected to xvs that xvs does not
//! own (`Verdict::Pass`) are written into a TAP device, so the kernel receives them as if they
//! had arrived on the interface (DPVS's KNI does the same for DPDK). Without it they were
//! dropped: in nat mode every backend ip:port is steered (to catch the backends' replies), so a
//! backend's packets of a connection that does not go through a VIP (a client reaching the
//! backend's port through the node) were lost while xvs ran.
//!
//! One TAP device per interface, `xvsp<ifindex>` (a name of at most 15 bytes that no other
//! interface of the namespace has), multi-queue: every worker attaches its own queue, so
//! workers write without sharing anything. The device takes the interface's MAC (frames
//! addressed to the interface are the kernel's own, `PACKET_HOST`, on the TAP too), is up,
//! has no address, no IPv6 link-local address (`addr_gen_mode` none) and reverse-path
//! filtering off (a backend's reply arrives on the TAP while the route back to the backend
//! leaves by another interface; the kernel uses the stricter of `all` and the device's
//! setting, so a node with `net.ipv4.conf.all.rp_filter = 1` drops them: use 0 or 2).
//!
//! The device is persistent, like the pinned steering: a restarted xvs attaches its queues to
//! the same device. (A device that went with the process would be unregistered by the kernel
//! while the next process starts, holding the RTNL lock the steering attach needs: it made a
//! restart's gap about a second longer.) `xvs cleanup` removes it ([`remove`]).
//!
//! Writes are non-blocking: a full TAP queue drops the frame (counted).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;

/// One worker's queue of an interface's exception TAP device.
#[derive(Debug)]
pub struct PassTap {
    fd: OwnedFd,
    name: String,
}

/// The exception device's name for interface index `ifindex`.
pub fn tap_name(ifindex: u32) -> String {
    format!("xvsp{ifindex}")
}

#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

#[repr(C)]
struct IfReqAddr {
    name: [u8; libc::IFNAMSIZ],
    addr: libc::sockaddr,
    _pad: [u8; 8],
}

fn ifr_name(name: &str) -> [u8; libc::IFNAMSIZ] {
    let mut n = [0u8; libc::IFNAMSIZ];
    let b = name.as_bytes();
    let len = b.len().min(libc::IFNAMSIZ - 1);
    n[..len].copy_from_slice(&b[..len]);
    n
}

fn ioctl<T>(fd: i32, req: libc::c_ulong, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is a valid, properly sized ifreq-shaped struct for `req`.
    if unsafe { libc::ioctl(fd, req as _, arg as *mut T) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A throwaway socket for interface ioctls.
fn ctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Writes `value` to `/proc/sys/<path>`, best effort (a missing file or a refusal is logged by
/// the caller through the returned error).
fn sysctl(path: &str, value: &str) -> io::Result<()> {
    std::fs::write(format!("/proc/sys/{path}"), value)
}

/// The index of interface `name`, or 0 when there is none.
fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid C string.
    Ok(unsafe { libc::if_nametoindex(c.as_ptr()) })
}

/// A new queue of multi-queue TAP device `name` (created if absent), non-blocking, with the
/// device's persistence set to `persist`.
fn attach(name: &str, persist: bool) -> io::Result<OwnedFd> {
    // SAFETY: plain open of a path.
    let fd = unsafe {
        libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("/dev/net/tun: {e}")));
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReqFlags {
        name: ifr_name(name),
        flags: IFF_TAP | IFF_NO_PI | IFF_MULTI_QUEUE,
        _pad: [0; 22],
    };
    ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req)
        .map_err(|e| io::Error::new(e.kind(), format!("TUNSETIFF {name}: {e}")))?;
    // SAFETY: TUNSETPERSIST takes its argument by value.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            TUNSETPERSIST as _,
            libc::c_ulong::from(persist),
        )
    } < 0
    {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("TUNSETPERSIST {name}: {e}"),
        ));
    }
    Ok(fd)
}

impl PassTap {
    /// Attaches a queue of interface `ifname`'s exception device, creating and configuring the
    /// device if this is the first queue.
    pub fn open(ifname: &str) -> io::Result<PassTap> {
        let index = ifindex(ifname)?;
        if index == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {ifname}"),
            ));
        }
        let name = tap_name(index);
        let fd = attach(&name, true)?;
        let tap = PassTap { fd, name };
        tap.configure(ifname)?;
        Ok(tap)
    }

    /// The interface's MAC on the device, no IPv6 address generation, no reverse-path
    /// filter, up. Idempotent: every queue's opener runs it.
    fn configure(&self, ifname: &str) -> io::Result<()> {
        let sock = ctl_socket()?;
        let mut mac = IfReqAddr {
            name: ifr_name(ifname),
            // SAFETY: sockaddr is plain data; all zeros is valid.
            addr: unsafe { std::mem::zeroed() },
            _pad: [0; 8],
        };
        ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut mac)
            .map_err(|e| io::Error::new(e.kind(), format!("MAC of {ifname}: {e}")))?;
        mac.name = ifr_name(&self.name);
        ioctl(sock.as_raw_fd(), libc::SIOCSIFHWADDR, &mut mac)
            .map_err(|e| io::Error::new(e.kind(), format!("MAC of {}: {e}", self.name)))?;
        // Before it is up, so no link-local address is ever made; best effort (the writes need
        // /proc/sys writable).
        for (key, value) in [
            ("ipv6/conf/{}/addr_gen_mode", "1"),
            ("ipv6/conf/{}/accept_ra", "0"),
            ("ipv4/conf/{}/rp_filter", "0"),
        ] {
            let path = format!("net/{}", key.replace("{}", &self.name));
            if let Err(e) = sysctl(&path, value) {
                tracing::warn!(device = %self.name, sysctl = %path, error = %e, "could not set a sysctl of the exception device (its defaults apply)");
            }
        }
        let mut flags = IfReqFlags {
            name: ifr_name(&self.name),
            flags: 0,
            _pad: [0; 22],
        };
        ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut flags)?;
        flags.flags |= libc::IFF_UP as libc::c_short;
        ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut flags)
            .map_err(|e| io::Error::new(e.kind(), format!("{} up: {e}", self.name)))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Hands `frame` to the kernel's receive path; `false` if it was not taken (queue full).
    #[inline]
    pub fn inject(&self, frame: &[u8]) -> bool {
        // SAFETY: writes `frame.len()` bytes from a valid slice to our descriptor.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        n == frame.len() as isize
    }
}

/// Removes interface `ifname`'s exception device, if there is one; `Ok(true)` if it was
/// there. For `xvs cleanup`: while an xvs runs, its queues keep the device until it exits.
pub fn remove(ifname: &str) -> io::Result<bool> {
    let index = ifindex(ifname)?;
    if index == 0 {
        return Ok(false);
    }
    let name = tap_name(index);
    if ifindex(&name)? == 0 {
        return Ok(false);
    }
    // Our queue, the last one, removes the device when it closes (dropped here).
    attach(&name, false)?;
    Ok(true)
}
