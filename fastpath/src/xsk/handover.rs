//! Handing a worker's AF_XDP sockets and UMEM to another process (`xvs run --takeover`),
//! and adopting them there. The transport (a unix socket, SCM_RIGHTS) is the daemon's.
//!
//! # Contract
//!
//! - **What goes over.** [`XskSet::export`] gives the set's description ([`SetMeta`]), a
//!   descriptor of its UMEM's memory and its sockets' descriptors, in port order. The UMEM
//!   xsk-rs maps is shared anonymous memory (`MAP_SHARED | MAP_ANONYMOUS`), which the
//!   kernel backs with a shmem file: `/proc/self/map_files/<start>-<end>` opens that file
//!   (which takes `CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE`), so no copy of xsk-rs is
//!   needed to make the UMEM passable. The receiver maps it `MAP_SHARED` and sees the very
//!   pages the kernel's UMEM pinned; it registers nothing again.
//! - **Who owns which frame.** Once the old worker stopped (after a whole poll: nothing
//!   staged, nothing peeked or reserved), every frame is in exactly one place: its free
//!   stack, a fill ring or the kernel's receive path (they come back on an rx ring), an rx
//!   ring, a tx ring or the kernel's send path (they come back on a completion ring). The
//!   rings' indices are in the shared ring memory, so the new owner maps the same rings
//!   ([`super::ring`]) and continues from the same producer and consumer indices; the one
//!   thing it cannot see is the free stack and how many frames each fill ring holds, which
//!   [`XskSet::frame_state`] gives and [`XskSet::resume`] takes ([`FrameState`]).
//! - **Untrusted.** Everything received is checked before use ([`XskSet::adopt`],
//!   [`XskSet::resume`]): the description against this process's own settings (same
//!   interfaces in the same ports, same queue, frame size, ring sizes and UMEM size), every
//!   socket descriptor is an AF_XDP socket, the UMEM descriptor a regular file at least as
//!   large as the UMEM, every free frame inside the UMEM and no chunk twice, fill counts
//!   within a full fill ring and a full rx ring. A refusal ([`Refused`]) names the field and the value.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::ring::{self, Desc, RingSizes};
use super::{BindMode, Keep, PortSocket, XskSet, XskSettings};

/// A set's description, as the old process sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetMeta {
    /// The queue.
    pub queue: u32,
    /// `"zero-copy"` or `"copy"`.
    pub mode: String,
    /// UMEM chunk size.
    pub frame_size: u32,
    /// UMEM bytes.
    pub umem_len: u64,
    /// Rx and fill ring entries.
    pub rx_ring_size: u32,
    /// Tx and completion ring entries.
    pub tx_ring_size: u32,
    /// Fill depth the worker keeps.
    pub fill_target: u32,
    /// Per port: the interface whose queue this socket is bound to, or none.
    pub ports: Vec<Option<String>>,
}

/// What a stopped worker leaves that the rings do not show: its free frames and, per port,
/// how many frames it gave the fill ring that have not come back on the rx ring.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrameState {
    /// Free frames' addresses.
    pub free: Vec<u64>,
    /// Per port: frames given to the fill ring and not yet taken off the rx ring (in the
    /// fill ring, the kernel, or the rx ring).
    pub in_fill: Vec<u32>,
}

/// An exported set: its description and the descriptors to pass, the UMEM's first, then one
/// per socket in port order. The socket descriptors are borrowed from the set, valid while
/// it lives.
#[derive(Debug)]
pub struct Export {
    /// The description.
    pub meta: SetMeta,
    /// The UMEM's memory.
    pub umem: OwnedFd,
    /// The sockets, in port order (ports without a socket skipped).
    pub sockets: Vec<RawFd>,
}

/// Why something received was refused: the field and the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value}: {why}")]
pub struct Refused {
    /// What was checked.
    pub field: &'static str,
    /// The value received.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

fn refuse(field: &'static str, value: impl fmt::Display, why: impl Into<String>) -> Refused {
    Refused {
        field,
        value: value.to_string(),
        why: why.into(),
    }
}

/// The UMEM's memory as the adopting process maps it; unmapped on drop.
#[derive(Debug)]
pub struct Mem {
    map: ring::Map,
    _fd: OwnedFd,
}

impl XskSet {
    /// The description and descriptors that let another process adopt this set.
    pub fn export(&self) -> io::Result<Export> {
        let start = self.area.base().as_ptr() as usize;
        let path = format!(
            "/proc/self/map_files/{start:x}-{:x}",
            start + self.area.len()
        );
        let umem: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening the UMEM through {path}: {e}")))?
            .into();
        Ok(Export {
            meta: SetMeta {
                queue: self.queue,
                mode: self.mode.name().to_owned(),
                frame_size: self.area.frame_size() as u32,
                umem_len: self.area.len() as u64,
                rx_ring_size: self.rx_ring_size,
                tx_ring_size: self.tx_ring_size,
                fill_target: self.fill_target,
                ports: self
                    .ports
                    .iter()
                    .map(|p| p.as_ref().map(|p| p.ifname.clone()))
                    .collect(),
            },
            umem,
            sockets: self.fds().into_iter().map(|(_, fd)| fd).collect(),
        })
    }

    /// The frames a stopped worker left free and in its fill rings.
    pub fn frame_state(&self) -> FrameState {
        FrameState {
            free: self.frames.iter().map(|d| d.addr).collect(),
            in_fill: self.in_fill.clone(),
        }
    }

    /// What `settings` would open for `queue`, as a description to compare a received one
    /// with (the mode aside: the old process chose it).
    pub fn expected(settings: &XskSettings, queue: u32) -> Result<SetMeta, super::XskError> {
        let ports: Vec<Option<String>> = settings
            .interfaces
            .iter()
            .map(|(n, q)| (queue < u32::from(*q)).then(|| n.clone()))
            .collect();
        let sockets = ports.iter().flatten().count() as u32;
        let sizes = super::Sizes::check(settings, sockets.max(1))?;
        Ok(SetMeta {
            queue,
            mode: String::new(),
            frame_size: settings.frame_size,
            umem_len: u64::from(sizes.frames) * u64::from(settings.frame_size),
            rx_ring_size: sizes.rx.get(),
            tx_ring_size: sizes.tx.get(),
            fill_target: sizes.fill_target,
            ports,
        })
    }

    /// Adopts a set another process exported for `queue` of `settings`: checks `meta`
    /// against what this process would open, the descriptors' kinds and sizes, maps the
    /// UMEM and every socket's rings. The set has no free frame until [`XskSet::resume`].
    pub fn adopt(
        settings: &XskSettings,
        queue: u32,
        meta: &SetMeta,
        umem: OwnedFd,
        sockets: Vec<OwnedFd>,
    ) -> Result<XskSet, Refused> {
        let mode = check_meta(settings, queue, meta)?;
        let names: Vec<&String> = meta.ports.iter().flatten().collect();
        if sockets.len() != names.len() {
            return Err(refuse(
                "sockets",
                sockets.len(),
                format!("the description names {} sockets", names.len()),
            ));
        }
        let len = meta.umem_len as usize;
        let mem = map_umem(umem, len)?;
        // SAFETY: `mem` maps `len` bytes of the UMEM and is kept with the set (`Keep`),
        // which drops it after the area.
        let area = unsafe { ring::Area::new(mem.map.ptr(), len, meta.frame_size as usize) };
        let sizes = RingSizes {
            rx: meta.rx_ring_size,
            tx: meta.tx_ring_size,
        };
        let mut next = sockets.iter();
        let mut ports = Vec::with_capacity(meta.ports.len());
        for name in &meta.ports {
            let Some(name) = name else {
                ports.push(None);
                continue;
            };
            let fd = next.next().expect("counted above").as_raw_fd();
            check_xdp_socket(fd).map_err(|why| refuse("socket", name, why))?;
            let rings = ring::Rings::map(fd, sizes)
                .map_err(|e| refuse("socket", name, format!("mapping its rings: {e}")))?;
            ports.push(Some(PortSocket {
                ifname: name.clone(),
                rings,
                fd,
            }));
        }
        Ok(XskSet {
            queue,
            mode,
            in_fill: vec![0; ports.len()],
            ports,
            area,
            frames: Vec::new(),
            fill_target: meta.fill_target,
            tx_ring_size: meta.tx_ring_size,
            rx_ring_size: meta.rx_ring_size,
            pass: Vec::new(),
            held: Vec::new(),
            _keep: Keep::Adopted {
                _sockets: sockets,
                _mem: mem,
            },
        })
    }

    /// Takes the stopped worker's [`FrameState`]: its free frames become this set's, its
    /// fill counts the new worker's. Checked: every frame inside the UMEM, no chunk twice,
    /// no more than the UMEM holds, one count per port, each within a full fill ring and
    /// a full rx ring.
    pub fn resume(&mut self, state: FrameState) -> Result<(), Refused> {
        let fs = self.area.frame_size();
        let chunks = self.area.len() / fs;
        if state.free.len() > chunks {
            return Err(refuse(
                "free",
                state.free.len(),
                format!("more frames than the UMEM's {chunks}"),
            ));
        }
        if state.in_fill.len() != self.ports.len() {
            return Err(refuse(
                "in_fill",
                format!("{:?}", state.in_fill),
                format!("not one count per port ({})", self.ports.len()),
            ));
        }
        // Given to the fill ring and not yet taken off the rx ring: at most a full fill
        // ring and a full rx ring (what the kernel holds between them comes from the first).
        let most = self.rx_ring_size.saturating_mul(2);
        if let Some(n) = state.in_fill.iter().find(|&&n| n > most) {
            return Err(refuse(
                "in_fill",
                n,
                format!("more than a full fill ring and a full rx ring ({most})"),
            ));
        }
        let mut seen = vec![false; chunks];
        let mut free = Vec::with_capacity(chunks);
        for &addr in &state.free {
            let chunk = usize::try_from(addr).unwrap_or(usize::MAX) / fs;
            if chunk >= chunks {
                return Err(refuse("free", addr, "outside the UMEM"));
            }
            if std::mem::replace(&mut seen[chunk], true) {
                return Err(refuse("free", addr, "its chunk is listed twice"));
            }
            free.push(Desc {
                addr,
                len: 0,
                options: 0,
            });
        }
        // The old worker moved the indices after the rings were mapped (at the offer):
        // read them again now that it has stopped.
        for p in self.ports.iter_mut().flatten() {
            p.rings.resync();
        }
        self.frames = free;
        self.in_fill = state.in_fill;
        Ok(())
    }
}

/// `meta` against what `settings` would open for `queue`; its bind mode.
fn check_meta(settings: &XskSettings, queue: u32, meta: &SetMeta) -> Result<BindMode, Refused> {
    let want =
        XskSet::expected(settings, queue).map_err(|e| refuse("settings", queue, e.to_string()))?;
    let same = |field: &'static str, got: u64, want: u64| {
        if got == want {
            Ok(())
        } else {
            Err(refuse(field, got, format!("this process would use {want}")))
        }
    };
    same("queue", u64::from(meta.queue), u64::from(want.queue))?;
    same(
        "frame_size",
        u64::from(meta.frame_size),
        u64::from(want.frame_size),
    )?;
    same("umem_len", meta.umem_len, want.umem_len)?;
    same(
        "rx_ring_size",
        u64::from(meta.rx_ring_size),
        u64::from(want.rx_ring_size),
    )?;
    same(
        "tx_ring_size",
        u64::from(meta.tx_ring_size),
        u64::from(want.tx_ring_size),
    )?;
    same(
        "fill_target",
        u64::from(meta.fill_target),
        u64::from(want.fill_target),
    )?;
    if meta.ports != want.ports {
        return Err(refuse(
            "ports",
            format!("{:?}", meta.ports),
            format!(
                "this process's interfaces with queue {queue} are {:?}",
                want.ports
            ),
        ));
    }
    let mode = match meta.mode.as_str() {
        "zero-copy" => BindMode::ZeroCopy,
        "copy" => BindMode::Copy,
        other => return Err(refuse("mode", other, "neither zero-copy nor copy")),
    };
    Ok(mode)
}

/// Maps the UMEM's memory from `fd`: a regular file (the shmem behind a shared anonymous
/// mapping) of at least `len` bytes.
fn map_umem(fd: OwnedFd, len: usize) -> Result<Mem, Refused> {
    let st = fstat(fd.as_raw_fd()).map_err(|e| refuse("umem", "fd", e.to_string()))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(refuse(
            "umem",
            format!("mode {:o}", st.st_mode),
            "not a regular file",
        ));
    }
    if (st.st_size as u64) < len as u64 || len == 0 {
        return Err(refuse(
            "umem",
            st.st_size,
            format!("smaller than the UMEM's {len} bytes"),
        ));
    }
    let map = ring::Map::new(fd.as_raw_fd(), len, 0)
        .map_err(|e| refuse("umem", len, format!("mmap: {e}")))?;
    Ok(Mem { map, _fd: fd })
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: plain data; zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is writable.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Whether `fd` is an AF_XDP socket.
fn check_xdp_socket(fd: RawFd) -> Result<(), String> {
    let st = fstat(fd).map_err(|e| e.to_string())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!("mode {:o}: not a socket", st.st_mode));
    }
    // SAFETY: an int.
    let (domain, _) =
        unsafe { super::sockopt::<libc::c_int>(fd, libc::SOL_SOCKET, libc::SO_DOMAIN) }
            .map_err(|e| format!("SO_DOMAIN: {e}"))?;
    if domain != libc::AF_XDP {
        return Err(format!("address family {domain}, not AF_XDP"));
    }
    Ok(())
}

/// Takes ownership of descriptors received over SCM_RIGHTS.
///
/// # Safety
///
/// Each fd must be open and owned by nobody else (freshly received).
pub unsafe fn own(fds: &[RawFd]) -> Vec<OwnedFd> {
    // SAFETY: caller's contract.
    fds.iter()
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect()
}
