//! The few bpf(2) commands the pinned steering link (and the decap programs' links, see
//! `crate::decap`) need with their file descriptor in hand, which aya 0.14 keeps private:
//! open and pin objects in bpffs, create (XDP, tcx egress), update and detach a link, and
//! read a link's info. Errors are the kernel's `errno`, so messages keep it.
//!
//! None needs `CAP_SYS_ADMIN`: `BPF_OBJ_PIN`/`BPF_OBJ_GET` check only the bpffs file's
//! permissions, `BPF_LINK_CREATE` for XDP wants `CAP_NET_ADMIN` (and `CAP_BPF` for the bpf
//! syscall itself), and `BPF_LINK_UPDATE`/`BPF_LINK_DETACH` only a file descriptor of the link.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

// `enum bpf_cmd`, `enum bpf_attach_type` and `enum bpf_link_type` in linux/bpf.h (UAPI: the
// numbers never change).
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_XDP: u32 = 37;
const BPF_TCX_EGRESS: u32 = 47;
/// `BPF_LINK_TYPE_XDP`.
pub(crate) const LINK_TYPE_XDP: u32 = 6;
/// `BPF_LINK_TYPE_TCX`.
pub(crate) const LINK_TYPE_TCX: u32 = 11;

/// The head of `union bpf_attr`, wide enough for every command here; the kernel treats the
/// bytes it is not given as zero.
#[repr(C, align(8))]
struct Attr([u8; 32]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 32])
    }

    fn u32_at(mut self, offset: usize, v: u32) -> Attr {
        self.0[offset..offset + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }

    fn u64_at(mut self, offset: usize, v: u64) -> Attr {
        self.0[offset..offset + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn bpf(cmd: libc::c_long, mut attr: Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, initialised buffer of the size passed; pointers inside it
    // (paths, info buffers) outlive the call, which the callers guarantee.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            size_of::<Attr>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor (with O_CLOEXEC); nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    fd.as_raw_fd() as u32
}

/// Opens the object pinned at `path` (read-write).
pub(crate) fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    // { pathname u64, bpf_fd u32, file_flags u32 }
    let attr = Attr::new().u64_at(0, path.as_ptr() as u64);
    bpf(BPF_OBJ_GET, attr).map(owned)
}

/// Pins the object `fd` at `path`, which must not exist yet.
pub(crate) fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let path = c_path(path)?;
    let attr = Attr::new()
        .u64_at(0, path.as_ptr() as u64)
        .u32_at(8, fd_u32(fd));
    bpf(BPF_OBJ_PIN, attr).map(drop)
}

/// Attaches the XDP program `prog` to `ifindex` through a new link; `flags` is
/// `XDP_FLAGS_DRV_MODE` or `XDP_FLAGS_SKB_MODE`.
pub(crate) fn link_create(prog: BorrowedFd<'_>, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    link_create_as(prog, ifindex, BPF_XDP, flags)
}

/// Attaches the tc program `prog` to the egress of `ifindex` through a new tcx link (Linux
/// 6.6), after the programs already there.
pub(crate) fn link_create_tcx_egress(prog: BorrowedFd<'_>, ifindex: u32) -> io::Result<OwnedFd> {
    link_create_as(prog, ifindex, BPF_TCX_EGRESS, 0)
}

fn link_create_as(
    prog: BorrowedFd<'_>,
    ifindex: u32,
    attach_type: u32,
    flags: u32,
) -> io::Result<OwnedFd> {
    // { prog_fd u32, target_ifindex u32, attach_type u32, flags u32, then per type: for tcx
    // { relative_fd u32, expected_revision u64 }, zero: no ordering constraint }
    let attr = Attr::new()
        .u32_at(0, fd_u32(prog))
        .u32_at(4, ifindex)
        .u32_at(8, attach_type)
        .u32_at(12, flags);
    bpf(BPF_LINK_CREATE, attr).map(owned)
}

/// Atomically replaces the program of `link` with `prog`: every frame meets either the old
/// program or the new one.
pub(crate) fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    // { link_fd u32, new_prog_fd u32, flags u32, old_prog_fd u32 }
    let attr = Attr::new().u32_at(0, fd_u32(link)).u32_at(4, fd_u32(prog));
    bpf(BPF_LINK_UPDATE, attr).map(drop)
}

/// Detaches `link` now, whoever else holds it (pins, other processes' descriptors).
pub(crate) fn link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    let attr = Attr::new().u32_at(0, fd_u32(link));
    bpf(BPF_LINK_DETACH, attr).map(drop)
}

/// What the kernel says about a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinkInfo {
    /// `BPF_LINK_TYPE_*`.
    pub link_type: u32,
    /// The link's id (what `bpftool link` shows).
    pub id: u32,
    /// The program it runs.
    pub prog_id: u32,
    /// For an XDP link: the interface, 0 once the interface is gone (the link is defunct).
    pub ifindex: u32,
}

/// Reads `struct bpf_link_info` of `link`.
pub(crate) fn link_info(link: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    // { type u32, id u32, prog_id u32, pad u32, union { xdp { ifindex u32 }, ... } }: the
    // kernel fills as much as it is given.
    #[repr(C, align(8))]
    struct Info([u8; 48]);
    let mut info = Info([0; 48]);
    let attr = Attr::new()
        .u32_at(0, fd_u32(link))
        .u32_at(4, size_of::<Info>() as u32)
        .u64_at(8, info.0.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)?;
    let at = |o: usize| u32::from_ne_bytes(info.0[o..o + 4].try_into().expect("4 bytes"));
    Ok(LinkInfo {
        link_type: at(0),
        id: at(4),
        prog_id: at(8),
        ifindex: at(16),
    })
}

/// `BPF_PROG_TEST_RUN`: runs `prog` once on a copy of `data`, without attaching it.
/// Returns the program's return value and the packet as the program left it.
pub(crate) fn prog_test_run(prog: BorrowedFd<'_>, data: &[u8]) -> io::Result<(u32, Vec<u8>)> {
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    // The `test` member of `union bpf_attr`: { prog_fd u32, retval u32, data_size_in u32,
    // data_size_out u32, data_in u64, data_out u64, repeat u32, duration u32, ctx_size_in
    // u32, ctx_size_out u32, ctx_in u64, ctx_out u64, flags u32, cpu u32, batch_size u32 }.
    #[repr(C, align(8))]
    struct TestAttr([u8; 80]);
    let len = u32::try_from(data.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "packet too long"))?;
    // Room for a program that grows the packet.
    let mut out = vec![0u8; data.len() + 256];
    let mut attr = TestAttr([0; 80]);
    let mut put = |offset: usize, bytes: &[u8]| {
        attr.0[offset..offset + bytes.len()].copy_from_slice(bytes);
    };
    put(0, &fd_u32(prog).to_ne_bytes());
    put(8, &len.to_ne_bytes());
    put(12, &(out.len() as u32).to_ne_bytes());
    put(16, &(data.as_ptr() as u64).to_ne_bytes());
    put(24, &(out.as_mut_ptr() as u64).to_ne_bytes());
    put(32, &1u32.to_ne_bytes());
    // SAFETY: `attr` is initialised and as long as passed; `data` and `out` outlive the call
    // and `out` is writable for the length given.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            attr.0.as_mut_ptr(),
            size_of::<TestAttr>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let at = |o: usize| u32::from_ne_bytes(attr.0[o..o + 4].try_into().expect("4 bytes"));
    let (retval, size_out) = (at(4), at(12) as usize);
    out.truncate(size_out.min(out.len()));
    Ok((retval, out))
}
