//! The liveness device: a TUN device that exists exactly as long as this process holds it.
//!
//! It is not persistent, so when the process ends, however it ends (`kill -9` included), the
//! kernel closes the descriptor and deletes the device; BIRD learns it through `protocol
//! device` (netlink) and withdraws every static route `via` it at once (about 2 ms measured
//! on this VM, from the kill to the router's kernel route changing). xvs opens it when it is
//! ready to serve and drops it when it stops.
//!
//! The device has no address, no IPv6 link-local address (`addr_gen_mode` 1) and is up;
//! nothing reads it (packets routed into it are dropped by the kernel's queue limit).
//! Opening one whose name another process holds fails (`EBUSY`): a second xvs in the same
//! network namespace.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// The open liveness device; dropping it deletes the device.
#[derive(Debug)]
pub struct LiveDevice {
    _fd: OwnedFd,
    name: String,
}

fn ifr(name: &str, flags: libc::c_short) -> io::Result<IfReqFlags> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?}: not a device name"),
        ));
    }
    let mut n = [0u8; libc::IFNAMSIZ];
    n[..b.len()].copy_from_slice(b);
    Ok(IfReqFlags {
        name: n,
        flags,
        _pad: [0; 22],
    })
}

fn ioctl<T>(fd: i32, req: libc::c_ulong, arg: *mut T) -> io::Result<()> {
    // SAFETY: `arg` points to a properly sized ifreq-shaped struct for `req` (or is the
    // by-value argument TUNSETPERSIST takes).
    if unsafe { libc::ioctl(fd, req as _, arg) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn with_context(e: io::Error, what: String) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl LiveDevice {
    /// Creates (or takes over an unused) TUN device `name`, not persistent, and brings it up.
    pub fn open(name: &str) -> io::Result<LiveDevice> {
        // SAFETY: plain open of a path.
        let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(with_context(
                io::Error::last_os_error(),
                "/dev/net/tun".to_owned(),
            ));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut req = ifr(name, IFF_TUN | IFF_NO_PI)?;
        ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req).map_err(|e| {
            with_context(
                e,
                format!("TUNSETIFF {name} (another xvs in this network namespace?)"),
            )
        })?;
        // A persistent device of that name left by someone else becomes ours: make sure it
        // goes with this process.
        ioctl::<libc::c_void>(fd.as_raw_fd(), TUNSETPERSIST, std::ptr::null_mut())
            .map_err(|e| with_context(e, format!("TUNSETPERSIST {name}")))?;
        // No IPv6 link-local address (set before it is up); best effort.
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/addr_gen_mode"), "1");
        // SAFETY: plain socket call.
        let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if sock < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let sock = unsafe { OwnedFd::from_raw_fd(sock) };
        let mut flags = ifr(name, 0)?;
        ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut flags)?;
        flags.flags |= libc::IFF_UP as libc::c_short;
        ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut flags)
            .map_err(|e| with_context(e, format!("{name} up")))?;
        Ok(LiveDevice {
            _fd: fd,
            name: name.to_owned(),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Whether a device `name` exists in this network namespace.
pub fn exists(name: &str) -> bool {
    CString::new(name)
        // SAFETY: a valid C string.
        .map(|c| unsafe { libc::if_nametoindex(c.as_ptr()) } != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a network namespace of its own (a thread can have one), as root; skipped otherwise.
    #[test]
    fn the_device_lives_as_long_as_its_holder() {
        let t = std::thread::spawn(|| {
            // SAFETY: unshare affects only this thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!("skipped: no new network namespace (not root?)");
                return;
            }
            assert!(!exists("xvs-live-t"));
            let dev = LiveDevice::open("xvs-live-t").unwrap();
            assert_eq!(dev.name(), "xvs-live-t");
            assert!(exists("xvs-live-t"));
            // One holder at a time.
            let e = LiveDevice::open("xvs-live-t").unwrap_err();
            assert!(e.to_string().contains("another xvs"), "{e}");
            drop(dev);
            assert!(!exists("xvs-live-t"));
            assert!(LiveDevice::open("").is_err());
            assert!(LiveDevice::open("a-name-too-long-for-linux").is_err());
        });
        t.join().unwrap();
    }
}
