//! AF_XDP sockets (xsk-rs over libxdp): the I/O half of a fastpath worker.
//!
//! # Model
//!
//! - **Worker q serves queue q of every interface.** An [`XskSet`] is the sockets of one
//!   worker: one socket per interface of `[dataplane] interfaces` that has a queue `q`,
//!   indexed by *port* (the interface's index in that list, the number in
//!   [`Verdict::Tx`](crate::pipeline::Verdict::Tx)). So there are [`worker_count`] = *max*
//!   queues workers, not the sum: with the lab's two single-queue interfaces (client side,
//!   backend side) ONE worker owns both sockets. A worker's
//!   `PipelineConfig::from_config(c, q, worker_count)` slices the SNAT ports accordingly.
//! - **Settings.** A set is opened with [`XskSettings`], the `[dataplane]` keys it reads,
//!   built once from the config (`XskSettings::from_config`, [`crate::settings`]).
//! - **One UMEM per worker, shared by its sockets** (`XDP_SHARED_UMEM` across interfaces).
//!   A frame received on port 0 and transmitted on port 1 moves as a descriptor from socket 0's
//!   rx ring to socket 1's tx ring: no copy. Each socket has its own fill and completion rings
//!   (the kernel wants one pair per (device, queue)); all of them draw on and return to one
//!   free-frame stack ([`pool::FramePool`]). The UMEM holds `umem_frames` frames *per socket*
//!   (the config's unit), each `frame_size` bytes; fill rings have `rx_ring_size` entries and
//!   are kept at most half the frames deep, so the rest can be in flight on rx and tx.
//!   Completed tx frames go back to the free stack and from there to a fill ring; xsk-rs'
//!   `CompQueue::consume` zeroes their lengths, which only matters to whoever resubmits a
//!   completed frame to a *tx* ring (it must set the length first): the fill ring ignores it.
//! - **Bind mode** per `[dataplane] zero_copy`: `auto` tries `XDP_ZEROCOPY` for the whole set
//!   and falls back to `XDP_COPY`, `on` fails with [`XskError::ZeroCopyUnavailable`], `off`
//!   binds copy mode. Sockets sharing a UMEM inherit its mode, so the choice is per worker.
//!   Every socket uses `XDP_USE_NEED_WAKEUP`. The choice is logged on stderr.
//! - **NAPI busy polling** per `[dataplane] napi_busy_poll`: the sockets get the preferred
//!   busy-poll options ([`napi`]), so the worker's poll loop runs the receive NAPI.
//! - **No libxdp program.** With [`Program::Steering`] (what xvs runs) libxdp's default XDP
//!   program is inhibited: the steering program (`fastpath::steer`) redirects VIP and SNAT
//!   traffic into its XSKMAP, where the caller registers [`XskSet::fds`] *before* the worker
//!   starts. [`Program::LibxdpDefault`] lets libxdp attach its own program, which sends every
//!   frame of the queue to the socket: for an interface dedicated to xvs, and for tests.
//!
//! - **Statistics.** The kernel's counters of each socket (`XDP_STATISTICS`: frames dropped
//!   on a full rx ring, an empty fill ring...) are read off the fastpath, through duplicated
//!   descriptors ([`XskSet::stats_readers`], [`stats`]); what the worker gave to and took
//!   from each ring it counts itself ([`crate::worker::RingStats`]).
//!
//! Everything here runs at start-up; the per-packet loop is in [`crate::worker`].

use std::ffi::CString;
use std::fmt;
use std::io;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use vocab::{XdpMode, ZeroCopy};
use xsk_rs::config::{
    BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig, XdpFlags,
};
use xsk_rs::{CompQueue, FillQueue, RxQueue, Socket, TxQueue, Umem};

pub use ring::{Desc, RingSizes};

pub mod gap;
pub mod handover;
pub mod napi;
pub mod pool;
pub mod ring;
pub mod stats;
pub mod tap;

/// Which XDP program feeds the sockets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Program {
    /// xvs' steering program, attached separately; libxdp loads nothing
    /// (`XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD`).
    #[default]
    Steering,
    /// libxdp's default program (every frame of the queue to the socket), attached in
    /// `[dataplane] xdp_mode` and removed when the last socket closes.
    LibxdpDefault,
}

/// How the sockets of a set are bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindMode {
    /// `XDP_ZEROCOPY`: the NIC DMAs into the UMEM.
    ZeroCopy,
    /// `XDP_COPY`: the kernel copies between skbs or driver buffers and the UMEM.
    Copy,
}

impl BindMode {
    /// `"zero-copy"` or `"copy"`.
    pub fn name(self) -> &'static str {
        match self {
            BindMode::ZeroCopy => "zero-copy",
            BindMode::Copy => "copy",
        }
    }

    fn flags(self) -> BindFlags {
        let mode = match self {
            BindMode::ZeroCopy => BindFlags::XDP_ZEROCOPY,
            BindMode::Copy => BindFlags::XDP_COPY,
        };
        mode | BindFlags::XDP_USE_NEED_WAKEUP
    }
}

impl fmt::Display for BindMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an [`XskSet`] could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    /// A `[dataplane]` size that AF_XDP cannot use.
    #[error("[dataplane] {key} = {value}: {why}")]
    Config {
        /// The key.
        key: &'static str,
        /// Its value.
        value: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// No interface has this queue.
    #[error("no interface in [dataplane] interfaces has queue {queue}")]
    NoInterface {
        /// The queue.
        queue: u32,
    },
    /// An interface name that cannot be passed to the kernel.
    #[error("interface name {name:?} contains a NUL byte")]
    BadName {
        /// The name.
        name: String,
    },
    /// The UMEM could not be created (memory, `RLIMIT_MEMLOCK`, no AF_XDP support).
    #[error("UMEM of {frames} frames of {frame_size} bytes: {detail}")]
    Umem {
        /// Frames asked for.
        frames: u32,
        /// Frame size.
        frame_size: u32,
        /// The error, with its OS cause.
        detail: String,
    },
    /// A socket could not be created or bound.
    #[error("AF_XDP socket on {ifname} queue {queue} ({mode} mode): {detail}")]
    Socket {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// The mode tried.
        mode: BindMode,
        /// The error, with its OS cause.
        detail: String,
    },
    /// `zero_copy = "on"` but binding in zero-copy mode failed (the driver lacks it?).
    #[error(
        "[dataplane] zero_copy = \"on\" but {ifname} queue {queue} cannot bind in zero-copy \
         mode ({detail}); set zero_copy = \"auto\" or \"off\" to use copy mode"
    )]
    ZeroCopyUnavailable {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// The bind error.
        detail: String,
    },
}

/// One socket of a set: its four rings, as this process mapped them ([`ring`]).
#[derive(Debug)]
pub struct PortSocket {
    /// Interface name.
    pub ifname: String,
    pub(crate) rings: ring::Rings,
    fd: RawFd,
}

impl PortSocket {
    /// The socket's file descriptor (for the steering program's XSKMAP).
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Gives the fill ring as many of `pool`'s frames as it has room for, so that the kernel
    /// has the most to receive into while nobody polls (a hand-over's stop, a takeover's
    /// pause), and wakes the kernel when it asks; returns how many moved.
    ///
    /// # Safety
    ///
    /// `pool` must hold free frames of this socket's UMEM.
    pub(crate) unsafe fn fill_all(&mut self, pool: &mut pool::FramePool) -> usize {
        let room = self.rings.fill.nb_free_exact() as usize;
        // SAFETY: the caller's contract; `self.rings.fill` is a ring of that UMEM.
        let done = unsafe { pool.fill(&mut self.rings.fill, room) };
        if done > 0 && self.rings.fill.needs_wakeup() {
            wake_rx(self.fd);
        }
        done
    }
}

/// The AF_XDP sockets of one worker: one per interface that has the worker's queue, on one
/// shared UMEM. Created before the worker thread so that the fds can be registered in the
/// steering XSKMAP; then moved into the worker.
#[derive(Debug)]
pub struct XskSet {
    queue: u32,
    mode: BindMode,
    // Field order is drop order: our ring mappings and the UMEM's view before what owns
    // the sockets and the UMEM (`keep`).
    pub(crate) ports: Vec<Option<PortSocket>>,
    pub(crate) area: ring::Area,
    /// Free frames (all of them when opened here; what the previous owner had free when
    /// adopted).
    pub(crate) frames: Vec<Desc>,
    /// Per port: frames given to the fill ring and not yet received (zero when opened).
    pub(crate) in_fill: Vec<u32>,
    /// Fill-ring depth kept per socket.
    pub(crate) fill_target: u32,
    /// Entries of each tx ring.
    pub(crate) tx_ring_size: u32,
    /// Entries of each rx ring.
    pub(crate) rx_ring_size: u32,
    /// Per port: this worker's queue of the interface's exception device ([`tap`]), once
    /// [`XskSet::open_pass`] opened it; `Pass` frames go there.
    pub(crate) pass: Vec<Option<tap::PassTap>>,
    /// Per port, after a takeover's pause ([`gap`]): frames taken off the rx ring that no
    /// worker has processed yet, and what was moved through the rings meanwhile (empty:
    /// none).
    pub(crate) held: Vec<gap::Held>,
    _keep: Keep,
}

/// What owns the sockets and the UMEM's memory.
#[derive(Debug)]
enum Keep {
    /// Opened here by xsk-rs: its sockets (ring objects unused) and UMEM.
    Opened {
        _sockets: Vec<(TxQueue, RxQueue, FillQueue, CompQueue)>,
        _umem: Umem,
    },
    /// Received from the previous process ([`handover`]).
    Adopted {
        _sockets: Vec<OwnedFd>,
        _mem: handover::Mem,
    },
}

/// What the sockets of a worker are opened with: the `[dataplane]` keys of AF_XDP, XDP and
/// NAPI (each field is the key of that name), from the config by `XskSettings::from_config`
/// ([`crate::settings`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XskSettings {
    /// `(name, queues)` of every interface, in port order (`[dataplane] interfaces`).
    pub interfaces: Vec<(String, u16)>,
    /// UMEM frames per socket (power of two).
    pub umem_frames: u32,
    /// UMEM frame size in bytes.
    pub frame_size: u32,
    /// RX and fill ring entries (power of two).
    pub rx_ring_size: u32,
    /// TX and completion ring entries (power of two).
    pub tx_ring_size: u32,
    /// Frames handled per poll (the NAPI busy-poll budget too).
    pub batch_size: u32,
    /// How libxdp's default program is attached ([`Program::LibxdpDefault`]).
    pub xdp_mode: XdpMode,
    /// Zero-copy or copy binding.
    pub zero_copy: ZeroCopy,
    /// Preferred NAPI busy polling on the sockets ([`napi`]).
    pub napi_busy_poll: bool,
}

/// Workers needed for `s`: the most queues of any interface (worker q serves queue q of
/// every interface that has it).
pub fn worker_count(s: &XskSettings) -> usize {
    s.interfaces
        .iter()
        .map(|&(_, queues)| usize::from(queues))
        .max()
        .unwrap_or(0)
}

impl XskError {
    /// Whether the queue is still bound by another socket (EBUSY): a process that just died
    /// holds it until the kernel has released its sockets, which takes a moment.
    pub fn is_busy(&self) -> bool {
        matches!(self, XskError::Socket { detail, .. } if detail.contains(&format!("(os error {})", libc::EBUSY)))
    }
}

impl XskSet {
    /// Opens queue `queue` of every interface of `dp` that has it, for xvs' steering program
    /// (libxdp loads no program).
    pub fn open(dp: &XskSettings, queue: u32) -> Result<XskSet, XskError> {
        XskSet::open_with(dp, queue, Program::Steering)
    }

    /// [`XskSet::open`] with a choice of XDP program.
    pub fn open_with(dp: &XskSettings, queue: u32, program: Program) -> Result<XskSet, XskError> {
        let names: Vec<Option<&str>> = dp
            .interfaces
            .iter()
            .map(|(name, queues)| (queue < u32::from(*queues)).then_some(name.as_str()))
            .collect();
        let sockets = names.iter().flatten().count() as u32;
        if sockets == 0 {
            return Err(XskError::NoInterface { queue });
        }
        let sizes = Sizes::check(dp, sockets)?;
        let mut tries: &[BindMode] = match dp.zero_copy {
            ZeroCopy::Auto => &[BindMode::ZeroCopy, BindMode::Copy],
            ZeroCopy::On => &[BindMode::ZeroCopy],
            ZeroCopy::Off => &[BindMode::Copy],
        };
        loop {
            let mode = tries[0];
            tries = &tries[1..];
            match XskSet::try_open(dp, &names, queue, program, &sizes, mode) {
                Ok(set) => {
                    let ifs: Vec<&str> = names.iter().flatten().copied().collect();
                    tracing::info!(
                        queue,
                        interfaces = %ifs.join(", "),
                        mode = %mode,
                        zero_copy = ?dp.zero_copy,
                        umem_frames = sizes.frames,
                        frame_size = dp.frame_size,
                        sockets,
                        fill_depth = set.fill_target,
                        "AF_XDP sockets open (need_wakeup, one UMEM shared by the sockets)"
                    );
                    return Ok(set);
                }
                Err(e) if !tries.is_empty() => {
                    tracing::warn!(queue, error = %e, "AF_XDP zero-copy failed; falling back to copy mode");
                }
                Err(XskError::Socket {
                    ifname,
                    queue,
                    mode: BindMode::ZeroCopy,
                    detail,
                }) => {
                    return Err(XskError::ZeroCopyUnavailable {
                        ifname,
                        queue,
                        detail,
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one socket's set-up sequence (UMEM, rings, bind) whose order the kernel imposes"
    )]
    fn try_open(
        dp: &XskSettings,
        names: &[Option<&str>],
        queue: u32,
        program: Program,
        sizes: &Sizes,
        mode: BindMode,
    ) -> Result<XskSet, XskError> {
        let (umem, frames) =
            Umem::new(sizes.umem, sizes.frames_nz, false).map_err(|e| XskError::Umem {
                frames: sizes.frames,
                frame_size: dp.frame_size,
                detail: with_source(&e),
            })?;
        let libxdp = match program {
            Program::Steering => LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD,
            Program::LibxdpDefault => LibxdpFlags::empty(),
        };
        let xdp = match dp.xdp_mode {
            XdpMode::Auto => XdpFlags::empty(),
            XdpMode::Native => XdpFlags::XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => XdpFlags::XDP_FLAGS_SKB_MODE,
        };
        let socket_config = SocketConfig::builder()
            .rx_queue_size(sizes.rx)
            .tx_queue_size(sizes.tx)
            .libxdp_flags(libxdp)
            .xdp_flags(xdp)
            .bind_flags(mode.flags())
            .build();
        let mut ports = Vec::with_capacity(names.len());
        let mut owned = Vec::with_capacity(names.len());
        let ring_sizes = RingSizes {
            rx: sizes.rx.get(),
            tx: sizes.tx.get(),
        };
        for name in names {
            let Some(name) = name else {
                ports.push(None);
                continue;
            };
            let ifname = Interface::new(CString::new(*name).map_err(|_| XskError::BadName {
                name: (*name).to_owned(),
            })?);
            // SAFETY: the UMEM outlives the socket (xsk-rs keeps it alive through the
            // rings), and every socket of the set is created with its own fill/comp rings.
            let made = unsafe { Socket::new(socket_config, &umem, &ifname, queue) };
            let (tx, rx, rings) = made.map_err(|e| XskError::Socket {
                ifname: (*name).to_owned(),
                queue,
                mode,
                detail: with_source(&e),
            })?;
            let Some((fill, comp)) = rings else {
                // xsk-rs only omits them for a second socket on the same (device, queue).
                return Err(XskError::Socket {
                    ifname: (*name).to_owned(),
                    queue,
                    mode,
                    detail: "no fill/completion rings (interface listed twice?)".into(),
                });
            };
            let fd = rx.fd().as_raw_fd();
            if dp.napi_busy_poll {
                napi::enable(fd, dp.batch_size).map_err(|detail| XskError::Socket {
                    ifname: (*name).to_owned(),
                    queue,
                    mode,
                    detail,
                })?;
            }
            let rings = ring::Rings::map(fd, ring_sizes).map_err(|e| XskError::Socket {
                ifname: (*name).to_owned(),
                queue,
                mode,
                detail: format!("mapping its rings: {e}"),
            })?;
            owned.push((tx, rx, fill, comp));
            ports.push(Some(PortSocket {
                ifname: (*name).to_owned(),
                rings,
                fd,
            }));
        }
        let area = umem_area(&umem, &frames, dp.frame_size as usize);
        let free = frames
            .iter()
            .map(|f| Desc {
                addr: f.addr() as u64,
                len: 0,
                options: 0,
            })
            .collect();
        Ok(XskSet {
            queue,
            mode,
            in_fill: vec![0; ports.len()],
            ports,
            area,
            frames: free,
            fill_target: sizes.fill_target,
            tx_ring_size: sizes.tx.get(),
            rx_ring_size: sizes.rx.get(),
            pass: Vec::new(),
            held: Vec::new(),
            _keep: Keep::Opened {
                _sockets: owned,
                _umem: umem,
            },
        })
    }

    /// Opens this worker's queue of every port's exception device ([`tap`]), so that frames
    /// the steering program redirected but xvs does not own reach the kernel. Returns the
    /// ports that failed (`(interface, error)`): their `Pass` frames are dropped, as before.
    pub fn open_pass(&mut self) -> Vec<(String, io::Error)> {
        let mut failed = Vec::new();
        self.pass = self
            .ports
            .iter()
            .map(|p| {
                let p = p.as_ref()?;
                tap::PassTap::open(&p.ifname)
                    .map_err(|e| failed.push((p.ifname.clone(), e)))
                    .ok()
            })
            .collect();
        failed
    }

    /// `(port, fd)` of every socket, for `Steering::register_socket(queue, fd)` on that
    /// port's interface.
    pub fn fds(&self) -> Vec<(usize, RawFd)> {
        self.ports
            .iter()
            .enumerate()
            .filter_map(|(port, s)| s.as_ref().map(|s| (port, s.fd)))
            .collect()
    }

    /// A reader of the kernel's statistics of every socket ([`stats`]), for the slowpath.
    pub fn stats_readers(&self) -> io::Result<Vec<stats::StatsReader>> {
        self.ports
            .iter()
            .flatten()
            .map(|s| stats::StatsReader::new(&s.ifname, self.queue, s.fd))
            .collect()
    }

    /// The sockets by port (`None`: that interface has no such queue).
    pub fn ports(&self) -> &[Option<PortSocket>] {
        &self.ports
    }

    /// The queue these sockets serve.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// The bind mode chosen.
    pub fn bind_mode(&self) -> BindMode {
        self.mode
    }

    /// `"zero-copy"` or `"copy"`.
    pub fn mode(&self) -> &str {
        self.mode.name()
    }

    /// Frames in the shared UMEM.
    pub fn frames(&self) -> usize {
        self.area.len() / self.area.frame_size()
    }
}

/// The UMEM xsk-rs mapped, as an [`ring::Area`]: its first frame's data address less that
/// frame's offset is the mapping's start; the frames fill it.
fn umem_area(umem: &Umem, frames: &[xsk_rs::FrameDesc], frame_size: usize) -> ring::Area {
    let first = &frames[0];
    // SAFETY: a frame of this UMEM that nobody uses yet; only its address is read.
    let data = unsafe { umem.data(first) }.contents().as_ptr();
    let base = data.wrapping_sub(first.addr()).cast_mut();
    let base = NonNull::new(base).expect("a mapping does not start at 0");
    // SAFETY: xsk-rs' mapping of `frames.len()` frames stays mapped while `Keep::Opened`
    // holds the UMEM, which the set drops after the area.
    unsafe { ring::Area::new(base, frames.len() * frame_size, frame_size) }
}

/// The sizes of a set, checked.
struct Sizes {
    umem: UmemConfig,
    rx: QueueSize,
    tx: QueueSize,
    frames: u32,
    frames_nz: NonZeroU32,
    fill_target: u32,
}

impl Sizes {
    fn check(dp: &XskSettings, sockets: u32) -> Result<Sizes, XskError> {
        let pow2 = |key: &'static str, value: u32| {
            if value.is_power_of_two() {
                Ok(value)
            } else {
                Err(XskError::Config {
                    key,
                    value: u64::from(value),
                    why: "must be a power of two",
                })
            }
        };
        let rx = QueueSize::new(pow2("rx_ring_size", dp.rx_ring_size)?).expect("power of two");
        let tx = QueueSize::new(pow2("tx_ring_size", dp.tx_ring_size)?).expect("power of two");
        pow2("umem_frames", dp.umem_frames)?;
        pow2("frame_size", dp.frame_size)?;
        if dp.umem_frames < 2 * dp.batch_size.max(1) {
            return Err(XskError::Config {
                key: "umem_frames",
                value: u64::from(dp.umem_frames),
                why: "must be at least twice batch_size",
            });
        }
        let frame_size = FrameSize::new(dp.frame_size).map_err(|_| XskError::Config {
            key: "frame_size",
            value: u64::from(dp.frame_size),
            why: "must be at least 2048",
        })?;
        let umem = UmemConfig::builder()
            .frame_size(frame_size)
            .fill_queue_size(rx)
            .comp_queue_size(tx)
            .build()
            .map_err(|_| XskError::Config {
                key: "frame_size",
                value: u64::from(dp.frame_size),
                why: "leaves no room for data after the XDP headroom",
            })?;
        let frames = dp
            .umem_frames
            .checked_mul(sockets)
            .ok_or(XskError::Config {
                key: "umem_frames",
                value: u64::from(dp.umem_frames),
                why: "times the number of interfaces overflows",
            })?;
        Ok(Sizes {
            umem,
            rx,
            tx,
            frames,
            frames_nz: NonZeroU32::new(frames).expect("checked above"),
            fill_target: dp.rx_ring_size.min(dp.umem_frames / 2),
        })
    }
}

/// An error and its cause (xsk-rs' errors keep the OS error as `source`).
fn with_source(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

/// A non-blocking `recvfrom`, as libxdp's samples do: tells the kernel the fill ring has
/// frames (need_wakeup) and, on a busy-polling socket, runs its NAPI once. Returns false on
/// an unexpected error.
pub fn wake_rx(fd: RawFd) -> bool {
    // SAFETY: a zero-length receive with null buffers is valid on an AF_XDP socket.
    let r = unsafe {
        libc::recvfrom(
            fd,
            std::ptr::null_mut(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    r >= 0 || {
        let e = io::Error::last_os_error().raw_os_error();
        matches!(
            e,
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN)
        )
    }
}

/// A non-blocking zero-length `sendto`: tells the kernel the tx ring has frames
/// (need_wakeup). Returns false on an unexpected error.
pub fn wake_tx(fd: RawFd) -> bool {
    // SAFETY: a zero-length send with null buffers is valid on an AF_XDP socket.
    let r = unsafe {
        libc::sendto(
            fd,
            std::ptr::null(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null(),
            0,
        )
    };
    r >= 0 || {
        let e = io::Error::last_os_error().raw_os_error();
        matches!(
            e,
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN)
        )
    }
}

/// Reads socket option `name` at `level` of `fd` as a `T`; returns it with the number of
/// bytes the kernel wrote (an older kernel may write fewer than `size_of::<T>()`).
///
/// # Safety
///
/// `T` must be plain data for which every bit pattern, all zeros included, is valid (the
/// kernel's option structs and integers).
pub(crate) unsafe fn sockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<(T, usize)> {
    // SAFETY: the caller promises that zero is a valid `T`.
    let mut v: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` is writable for `len` bytes; the kernel writes at most that.
    let r = unsafe { libc::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((v, len as usize))
}
