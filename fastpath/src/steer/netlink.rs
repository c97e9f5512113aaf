//! Just enough rtnetlink to find and remove an XDP program that an earlier xvs attached the
//! legacy (netlink) way. Programs attached through a `bpf_link` vanish with their process; a
//! netlink attachment outlives it, so start-up removes it by name before attaching.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = 0x3fff;

const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;

const XDP_ATTACHED_DRV: u8 = 1;
const XDP_ATTACHED_SKB: u8 = 2;
const XDP_ATTACHED_HW: u8 = 3;

/// `XDP_FLAGS_*_MODE`: which attachment point a program sits on.
pub(super) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub(super) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
pub(super) const XDP_FLAGS_HW_MODE: u32 = 1 << 3;

const NLMSG_HDR_LEN: usize = 16;
const IFINFOMSG_LEN: usize = 16;
const RECV_BUF_LEN: usize = 64 * 1024;

/// An XDP program attached to an interface: its mode flag and kernel program id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Attached {
    pub mode_flag: u32,
    pub prog_id: u32,
}

/// The XDP programs attached to `ifindex`, one per mode.
pub(super) fn attached(ifindex: u32) -> io::Result<Vec<Attached>> {
    let sock = socket()?;
    let msg = message(RTM_GETLINK, NLM_F_REQUEST, ifindex, &[]);
    send(&sock, &msg)?;
    let mut buf = vec![0u8; RECV_BUF_LEN];
    let n = recv(&sock, &mut buf)?;
    let reply = &buf[..n];
    let (ty, payload) = first_message(reply)?;
    if ty == NLMSG_ERROR {
        return Err(errno_of(payload));
    }
    if ty != RTM_NEWLINK || payload.len() < IFINFOMSG_LEN {
        return Err(io::Error::other(
            "unexpected rtnetlink reply to RTM_GETLINK",
        ));
    }
    let Some(xdp) = attrs(&payload[IFINFOMSG_LEN..]).find(|(t, _)| *t == IFLA_XDP) else {
        return Ok(Vec::new());
    };
    let mut mode = 0u8;
    let mut single = 0u32;
    let mut found = Vec::new();
    for (t, v) in attrs(xdp.1) {
        let as_u32 = || {
            v.get(..4)
                .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
        };
        match t {
            IFLA_XDP_ATTACHED => mode = v.first().copied().unwrap_or(0),
            IFLA_XDP_PROG_ID => single = as_u32().unwrap_or(0),
            IFLA_XDP_DRV_PROG_ID => push(&mut found, XDP_FLAGS_DRV_MODE, as_u32()),
            IFLA_XDP_SKB_PROG_ID => push(&mut found, XDP_FLAGS_SKB_MODE, as_u32()),
            IFLA_XDP_HW_PROG_ID => push(&mut found, XDP_FLAGS_HW_MODE, as_u32()),
            _ => {}
        }
    }
    // With one program attached the kernel reports only IFLA_XDP_PROG_ID and the mode.
    if found.is_empty() && single != 0 {
        let mode_flag = match mode {
            XDP_ATTACHED_DRV => XDP_FLAGS_DRV_MODE,
            XDP_ATTACHED_SKB => XDP_FLAGS_SKB_MODE,
            XDP_ATTACHED_HW => XDP_FLAGS_HW_MODE,
            _ => 0,
        };
        found.push(Attached {
            mode_flag,
            prog_id: single,
        });
    }
    Ok(found)
}

fn push(found: &mut Vec<Attached>, mode_flag: u32, id: Option<u32>) {
    if let Some(prog_id) = id.filter(|id| *id != 0) {
        found.push(Attached { mode_flag, prog_id });
    }
}

/// Detaches a netlink-attached program from `ifindex` in the given mode. Fails with `EBUSY`
/// when the program is held by a `bpf_link` (a live process owns it).
pub(super) fn detach_legacy(ifindex: u32, mode_flag: u32) -> io::Result<()> {
    let mut nested = Vec::new();
    put_attr(&mut nested, IFLA_XDP_FD, &(-1i32).to_ne_bytes());
    put_attr(&mut nested, IFLA_XDP_FLAGS, &mode_flag.to_ne_bytes());
    let mut attrs_buf = Vec::new();
    put_attr(&mut attrs_buf, IFLA_XDP | NLA_F_NESTED, &nested);
    let msg = message(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, ifindex, &attrs_buf);
    let sock = socket()?;
    send(&sock, &msg)?;
    let mut buf = vec![0u8; RECV_BUF_LEN];
    let n = recv(&sock, &mut buf)?;
    let (ty, payload) = first_message(&buf[..n])?;
    if ty != NLMSG_ERROR {
        return Err(io::Error::other(
            "unexpected rtnetlink reply to RTM_SETLINK",
        ));
    }
    match errno_of(payload) {
        e if e.raw_os_error() == Some(0) => Ok(()),
        e => Err(e),
    }
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is checked and owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn message(ty: u16, flags: u16, ifindex: u32, attrs: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDR_LEN + IFINFOMSG_LEN + attrs.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    // struct ifinfomsg { family u8, pad u8, type u16, index i32, flags u32, change u32 }
    m.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    m.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(attrs);
    m
}

fn put_attr(buf: &mut Vec<u8>, ty: u16, value: &[u8]) {
    let len = 4 + value.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

fn send(sock: &OwnedFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: zeroed sockaddr_nl addresses the kernel (pid 0).
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `msg` and `addr` are valid for the lengths passed.
    let n = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn recv(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// The type and payload of the first netlink message in `buf`.
fn first_message(buf: &[u8]) -> io::Result<(u16, &[u8])> {
    let short = || io::Error::other("short rtnetlink reply");
    let hdr = buf.get(..NLMSG_HDR_LEN).ok_or_else(short)?;
    let len = u32::from_ne_bytes(hdr[0..4].try_into().expect("4 bytes")) as usize;
    let ty = u16::from_ne_bytes(hdr[4..6].try_into().expect("2 bytes"));
    let payload = buf.get(NLMSG_HDR_LEN..len).ok_or_else(short)?;
    Ok((ty, payload))
}

/// The error carried by an `NLMSG_ERROR` payload (errno 0 is an ACK).
fn errno_of(payload: &[u8]) -> io::Error {
    let code = payload
        .get(..4)
        .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
        .unwrap_or(-libc::EPROTO);
    io::Error::from_raw_os_error(-code)
}

/// Iterates the (type, value) pairs of a run of netlink attributes.
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes(buf.get(0..2)?.try_into().ok()?));
        let ty = u16::from_ne_bytes(buf.get(2..4)?.try_into().ok()?) & NLA_TYPE_MASK;
        if len < 4 {
            return None;
        }
        let value = buf.get(4..len)?;
        buf = buf.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        Some((ty, value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_with_padding() {
        let mut buf = Vec::new();
        put_attr(&mut buf, IFLA_XDP_ATTACHED, &[XDP_ATTACHED_SKB]);
        put_attr(&mut buf, IFLA_XDP_PROG_ID, &42u32.to_ne_bytes());
        assert_eq!(buf.len(), 8 + 8);
        let got: Vec<_> = attrs(&buf).collect();
        assert_eq!(
            got,
            vec![
                (IFLA_XDP_ATTACHED, &[2u8][..]),
                (IFLA_XDP_PROG_ID, &42u32.to_ne_bytes()[..])
            ]
        );
    }
}
