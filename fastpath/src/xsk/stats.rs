//! What the kernel counts for each AF_XDP socket (`getsockopt(SOL_XDP, XDP_STATISTICS)`):
//! frames it dropped before any worker saw them (a full rx ring, no frame to receive into)
//! and descriptors it refused. Read off the fastpath: a [`StatsReader`] holds a duplicate of
//! the socket's descriptor, so the slowpath reads the statistics when it is asked (a scrape)
//! even while the worker is stuck, which is when they matter; the worker never makes the
//! call.
//!
//! A reader keeps its socket open (a descriptor of it): whoever holds readers drops them
//! when the workers stop, so that the socket is released (and leaves the steering program's
//! socket map) as the worker intended.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `struct xdp_statistics` (Linux 5.9 and later: all six counters), totals since the socket
/// was bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpStatistics {
    /// Frames dropped on receive: larger than a UMEM frame, or no free frame to copy into
    /// (copy mode).
    pub rx_dropped: u64,
    /// Invalid descriptors on the fill ring (an xvs bug: none expected).
    pub rx_invalid_descs: u64,
    /// Invalid descriptors on the tx ring, skipped unsent (an xvs bug: none expected).
    pub tx_invalid_descs: u64,
    /// Frames dropped because the rx ring was full: the worker did not keep up.
    pub rx_ring_full: u64,
    /// Times the kernel found the fill ring empty when it needed a frame to receive into.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the kernel found the tx ring empty when it was woken to send.
    pub tx_ring_empty_descs: u64,
}

impl XdpStatistics {
    /// Reads the statistics of the AF_XDP socket `fd`.
    pub fn read(fd: RawFd) -> io::Result<XdpStatistics> {
        // SAFETY: `xdp_statistics` is six u64 counters.
        let (s, _) = unsafe {
            super::sockopt::<libc::xdp_statistics>(fd, libc::SOL_XDP, libc::XDP_STATISTICS)?
        };
        // A kernel before 5.9 fills only the first three; the rest stay 0.
        Ok(XdpStatistics {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: s.tx_ring_empty_descs,
        })
    }
}

/// One socket's statistics, readable from any thread (see the module doc).
#[derive(Debug)]
pub struct StatsReader {
    /// The socket's interface.
    pub interface: String,
    /// The socket's queue.
    pub queue: u32,
    fd: OwnedFd,
}

impl StatsReader {
    /// A reader of the socket `fd` (duplicated: the reader owns its copy).
    pub fn new(interface: &str, queue: u32, fd: RawFd) -> io::Result<StatsReader> {
        // SAFETY: plain syscall on a descriptor the caller holds open.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(StatsReader {
            interface: interface.to_owned(),
            queue,
            // SAFETY: a fresh descriptor nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(dup) },
        })
    }

    /// The socket's statistics now.
    pub fn read(&self) -> io::Result<XdpStatistics> {
        XdpStatistics::read(self.fd.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that is not AF_XDP is refused by the kernel, not misread.
    #[test]
    fn a_socket_that_is_not_af_xdp_is_an_error() {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let r = StatsReader::new("lo", 0, udp.as_raw_fd()).unwrap();
        assert!(r.read().is_err());
        assert!(StatsReader::new("lo", 0, -1).is_err());
    }
}
