//! Preferred NAPI busy polling (`[dataplane] napi_busy_poll`): the worker, not a softirq,
//! runs the receive NAPI of its queues.
//!
//! Without it, a queue's NAPI (the driver's receive, the XDP program and, in copy mode, the
//! copy into the UMEM) runs in softirq on whichever CPU the interrupt lands on; on veth, on
//! the CPU that *sent* the frame. That work is the load balancer's, but it is done, and paid
//! for, elsewhere. With it (Linux ≥ 5.11, `Documentation/networking/napi.rst`, "Preferred
//! busy polling"):
//!
//! - every socket gets `SO_PREFER_BUSY_POLL` = 1, `SO_BUSY_POLL` = [`BUSY_POLL_USEC`] (the
//!   sockets are non-blocking, so a call polls once; any non-zero value enables it) and
//!   `SO_BUSY_POLL_BUDGET` = `batch_size` ([`enable`]);
//! - every interface needs `napi_defer_hard_irqs` and `gro_flush_timeout` above 0, so that
//!   the kernel holds the NAPI for the busy poller instead of re-arming the interrupt:
//!   [`NapiDefer::apply`] sets those still at 0 to [`DEFER_HARD_IRQS`] and
//!   [`GRO_FLUSH_TIMEOUT_NS`], keeps an operator's own values, and restores on drop;
//! - the worker calls `recvfrom(MSG_DONTWAIT)` on every socket at the top of every poll
//!   (`worker::Worker::poll`), which runs the socket's NAPI once, up to the budget, on the
//!   worker's core. A worker that does not come back within `gro_flush_timeout` (an
//!   `idle_backoff` sleep, a stall) hands the NAPI back to the kernel's softirq: traffic
//!   keeps flowing, on the interrupt's CPU, until the next poll takes it again.
//!
//! The kernel busy-polls the NAPI whose id a socket learnt from its received frames, so the
//! driver must register its XDP receive queues with their NAPI's id. veth on Linux 6.18 does
//! not (it registers the queue before the NAPI is enabled and given an id): there the
//! sockets' `SO_INCOMING_NAPI_ID` stays 0, the `recvfrom` polls nothing, and only the
//! deferral remains (the softirq receive runs from a timer, in larger batches, up to
//! `gro_flush_timeout` late). [`check_napi_id`] logs which case a socket is in. On this
//! project's veth lab only that case could be exercised; the polling itself is unmeasured.

use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;

/// `SO_BUSY_POLL` in µs. The sockets are polled with `MSG_DONTWAIT`, where the kernel polls
/// the NAPI once whatever the value; it only has to be non-zero.
pub const BUSY_POLL_USEC: i32 = 20;
/// `napi_defer_hard_irqs` set on interfaces where it is 0: how many times in a row a NAPI
/// that found nothing may keep its interrupt off (the value of the kernel's own example).
pub const DEFER_HARD_IRQS: u64 = 2;
/// `gro_flush_timeout` set on interfaces where it is 0: how long the kernel waits for the
/// busy poller before it runs the NAPI itself (200 µs, the kernel's example).
pub const GRO_FLUSH_TIMEOUT_NS: u64 = 200_000;

/// Sets the three busy-poll socket options on `fd`. The error names the option.
pub fn enable(fd: RawFd, budget: u32) -> Result<(), String> {
    let budget = i32::try_from(budget).unwrap_or(i32::MAX);
    for (name, opt, value) in [
        ("SO_PREFER_BUSY_POLL", libc::SO_PREFER_BUSY_POLL, 1),
        ("SO_BUSY_POLL", libc::SO_BUSY_POLL, BUSY_POLL_USEC),
        ("SO_BUSY_POLL_BUDGET", libc::SO_BUSY_POLL_BUDGET, budget),
    ] {
        // SAFETY: `value` is a live c_int and the length says so.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&value as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(format!(
                "setsockopt {name} = {value}: {} (napi_busy_poll needs Linux >= 5.11 and \
                 CAP_NET_ADMIN)",
                io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Reads an integer socket option (`SOL_SOCKET`), for checks and tests (the kernel reports
/// `SO_PREFER_BUSY_POLL` and `SO_BUSY_POLL`, not `SO_BUSY_POLL_BUDGET`).
pub fn sockopt(fd: RawFd, opt: libc::c_int) -> io::Result<i32> {
    let mut value: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live and sized for an int option.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut value as *mut i32).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Logs whether busy polling can reach the socket's NAPI: the kernel polls the NAPI whose id
/// the socket learnt from its received frames (`SO_INCOMING_NAPI_ID`), and a driver that
/// registers its XDP receive queue without one (veth on Linux 6.18 does) leaves it 0, so
/// the worker's `recvfrom` cannot run that receive and it stays in softirq, held back by
/// the deferral settings. Called once per socket, at its first frames.
#[cold]
pub fn check_napi_id(fd: RawFd, ifname: &str, queue: u32) {
    let (ok, report) = napi_id_report(fd, ifname, queue);
    if ok {
        tracing::info!(interface = ifname, queue, "{report}");
    } else {
        tracing::warn!(interface = ifname, queue, "{report}");
    }
}

/// What [`check_napi_id`] logs, and whether it is good news (else a warning).
pub fn napi_id_report(fd: RawFd, ifname: &str, queue: u32) -> (bool, String) {
    match sockopt(fd, libc::SO_INCOMING_NAPI_ID) {
        Ok(0) => (
            false,
            format!(
                "{ifname} queue {queue}: the driver gives this socket no NAPI id, so \
                 napi_busy_poll cannot poll its receive (it stays in softirq, with the interface's \
                 napi_defer_hard_irqs/gro_flush_timeout delaying it); turn napi_busy_poll off here"
            ),
        ),
        Ok(id) => (
            true,
            format!("{ifname} queue {queue}: busy-polling NAPI {id}"),
        ),
        Err(e) => (
            false,
            format!("{ifname} queue {queue}: SO_INCOMING_NAPI_ID: {e}"),
        ),
    }
}

/// The interfaces' NAPI deferral settings, as xvs changed them; put back on drop.
#[derive(Debug, Default)]
pub struct NapiDefer {
    /// (file, value before xvs wrote it).
    changed: Vec<(PathBuf, String)>,
}

impl NapiDefer {
    /// Sets `napi_defer_hard_irqs` and `gro_flush_timeout` of every interface in `ifnames`
    /// where they are 0 (values an operator set are kept), under `/sys/class/net` (which
    /// shows the namespace sysfs was mounted in: `ip netns exec` mounts the namespace's).
    /// Logs every change on stderr. The error names the file.
    pub fn apply(ifnames: &[&str]) -> Result<NapiDefer, String> {
        NapiDefer::apply_under(&PathBuf::from("/sys/class/net"), ifnames)
    }

    /// [`NapiDefer::apply`] under another sysfs directory (tests).
    pub fn apply_under(root: &std::path::Path, ifnames: &[&str]) -> Result<NapiDefer, String> {
        let mut done = NapiDefer::default();
        for name in ifnames {
            for (file, want) in [
                ("napi_defer_hard_irqs", DEFER_HARD_IRQS),
                ("gro_flush_timeout", GRO_FLUSH_TIMEOUT_NS),
            ] {
                let path = root.join(name).join(file);
                let old = std::fs::read_to_string(&path)
                    .map_err(|e| format!("napi_busy_poll: reading {}: {e}", path.display()))?;
                let old = old.trim().to_owned();
                if old != "0" {
                    tracing::info!(interface = %name, file, value = %old, "NAPI setting kept");
                    continue;
                }
                std::fs::write(&path, want.to_string())
                    .map_err(|e| format!("napi_busy_poll: writing {}: {e}", path.display()))?;
                tracing::info!(
                    interface = %name,
                    file,
                    value = want,
                    "NAPI setting changed from 0 (restored at exit)"
                );
                done.changed.push((path, old));
            }
        }
        Ok(done)
    }

    /// How many settings were changed.
    pub fn changed(&self) -> usize {
        self.changed.len()
    }
}

impl Drop for NapiDefer {
    fn drop(&mut self) {
        for (path, old) in self.changed.drain(..).rev() {
            if let Err(e) = std::fs::write(&path, &old) {
                tracing::warn!(file = %path.display(), value = %old, error = %e, "could not restore a NAPI setting");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sysfs(entries: &[(&str, &str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (ifname, file, value) in entries {
            let d = dir.path().join(ifname);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), format!("{value}\n")).unwrap();
        }
        dir
    }

    fn read(dir: &tempfile::TempDir, ifname: &str, file: &str) -> String {
        std::fs::read_to_string(dir.path().join(ifname).join(file))
            .unwrap()
            .trim()
            .to_owned()
    }

    #[test]
    fn sets_zeros_keeps_operator_values_and_restores() {
        let dir = fake_sysfs(&[
            ("a", "napi_defer_hard_irqs", "0"),
            ("a", "gro_flush_timeout", "0"),
            ("b", "napi_defer_hard_irqs", "10"),
            ("b", "gro_flush_timeout", "0"),
        ]);
        let d = NapiDefer::apply_under(dir.path(), &["a", "b"]).unwrap();
        assert_eq!(d.changed(), 3);
        assert_eq!(read(&dir, "a", "napi_defer_hard_irqs"), "2");
        assert_eq!(read(&dir, "a", "gro_flush_timeout"), "200000");
        assert_eq!(read(&dir, "b", "napi_defer_hard_irqs"), "10");
        assert_eq!(read(&dir, "b", "gro_flush_timeout"), "200000");
        drop(d);
        assert_eq!(read(&dir, "a", "napi_defer_hard_irqs"), "0");
        assert_eq!(read(&dir, "a", "gro_flush_timeout"), "0");
        assert_eq!(read(&dir, "b", "napi_defer_hard_irqs"), "10");
        assert_eq!(read(&dir, "b", "gro_flush_timeout"), "0");
    }

    #[test]
    fn a_missing_interface_is_named_and_earlier_changes_are_undone() {
        let dir = fake_sysfs(&[
            ("a", "napi_defer_hard_irqs", "0"),
            ("a", "gro_flush_timeout", "0"),
        ]);
        let e = NapiDefer::apply_under(dir.path(), &["a", "nope"]).unwrap_err();
        assert!(e.contains("nope/napi_defer_hard_irqs"), "{e}");
        assert_eq!(read(&dir, "a", "napi_defer_hard_irqs"), "0");
        assert_eq!(read(&dir, "a", "gro_flush_timeout"), "0");
    }

    #[test]
    fn socket_options_are_set() {
        // A UDP socket takes the same SOL_SOCKET options as an AF_XDP one.
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
        enable(fd, 64).unwrap();
        assert_eq!(sockopt(fd, libc::SO_PREFER_BUSY_POLL).unwrap(), 1);
        assert_eq!(sockopt(fd, libc::SO_BUSY_POLL).unwrap(), BUSY_POLL_USEC);
        // The kernel does not report SO_BUSY_POLL_BUDGET back, but refuses one over 65535,
        // and the error names the option.
        let e = enable(fd, 70_000).unwrap_err();
        assert!(e.contains("SO_BUSY_POLL_BUDGET = 70000"), "{e}");
        // Loopback has no NAPI: the socket has no id to busy-poll, and the report says so.
        let (ok, r) = napi_id_report(fd, "lo", 0);
        assert!(!ok, "{r}");
        assert!(
            r.contains("lo queue 0: the driver gives this socket no NAPI id"),
            "{r}"
        );
    }
}
