//! Opening one AF_XDP socket with its own UMEM (xsk-rs): the generator, the sinks and l2fwd
//! use this; l2fwd adds a second socket on the same UMEM with [`Port::open_shared`].

use std::ffi::CString;
use std::num::NonZeroU32;
use std::os::fd::AsRawFd;

use anyhow::{Context, anyhow};
use xsk_rs::config::{
    BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig, XdpFlags,
};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem};

/// UMEM frame size (holds a 1514-byte frame after the XDP headroom).
pub const FRAME_SIZE: u32 = 2048;
/// Ring entries (every ring).
pub const RING: u32 = 2048;

/// One socket's rings.
pub struct Rings {
    /// Transmit ring.
    pub tx: TxQueue,
    /// Receive ring.
    pub rx: RxQueue,
    /// Fill ring.
    pub fill: FillQueue,
    /// Completion ring.
    pub comp: CompQueue,
}

/// A UMEM and its first socket.
pub struct Port {
    /// The socket (dropped before the UMEM: field order).
    pub rings: Rings,
    /// The UMEM.
    pub umem: Umem,
    /// Every frame of the UMEM, free.
    pub frames: Vec<FrameDesc>,
}

/// Which XDP program feeds the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed {
    /// None (transmit only).
    TxOnly,
    /// libxdp's default program: every frame of the queue to the socket.
    LibxdpDefault,
}

fn socket_config(feed: Feed) -> SocketConfig {
    let q = QueueSize::new(RING).expect("power of two");
    SocketConfig::builder()
        .rx_queue_size(q)
        .tx_queue_size(q)
        .libxdp_flags(match feed {
            Feed::TxOnly => LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD,
            Feed::LibxdpDefault => LibxdpFlags::empty(),
        })
        .xdp_flags(XdpFlags::empty())
        .bind_flags(BindFlags::XDP_COPY | BindFlags::XDP_USE_NEED_WAKEUP)
        .build()
}

fn socket(umem: &Umem, ifname: &str, queue: u32, feed: Feed) -> anyhow::Result<Rings> {
    let iface = Interface::new(CString::new(ifname).context("interface name")?);
    // SAFETY: the UMEM outlives the socket (xsk-rs keeps it alive through the rings).
    let (tx, rx, rings) = unsafe { Socket::new(socket_config(feed), umem, &iface, queue) }
        .map_err(|e| {
            anyhow!(
                "AF_XDP socket on {ifname} queue {queue}: {e} ({:?})",
                std::error::Error::source(&e)
            )
        })?;
    let (fill, comp) = rings.ok_or_else(|| anyhow!("no fill/completion rings on {ifname}"))?;
    // libxdp opens AF_XDP sockets without SOCK_CLOEXEC: a process perf-lab starts while a
    // socket is open (a restarted xvs) would hold it, and its queue, for its whole life.
    let fd = rx.fd().as_raw_fd();
    // SAFETY: fcntl on a descriptor this socket owns.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(anyhow!(
            "AF_XDP socket on {ifname} queue {queue}: FD_CLOEXEC: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(Rings { tx, rx, fill, comp })
}

impl Port {
    /// A UMEM of `frames` frames and a socket on (`ifname`, `queue`), in the calling
    /// thread's network namespace, copy mode.
    pub fn open(ifname: &str, queue: u32, frames: u32, feed: Feed) -> anyhow::Result<Port> {
        let q = QueueSize::new(RING).expect("power of two");
        let cfg = UmemConfig::builder()
            .frame_size(FrameSize::new(FRAME_SIZE).expect("valid"))
            .fill_queue_size(q)
            .comp_queue_size(q)
            .build()
            .context("UMEM config")?;
        let (umem, descs) = Umem::new(cfg, NonZeroU32::new(frames).context("frames")?, false)
            .map_err(|e| anyhow!("UMEM of {frames} frames: {e}"))?;
        let rings = socket(&umem, ifname, queue, feed)?;
        Ok(Port {
            rings,
            umem,
            frames: descs,
        })
    }

    /// A second socket on this port's UMEM (`XDP_SHARED_UMEM`), on another interface.
    pub fn open_shared(&self, ifname: &str, queue: u32, feed: Feed) -> anyhow::Result<Rings> {
        socket(&self.umem, ifname, queue, feed)
    }
}
