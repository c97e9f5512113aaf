//! A driver's XDP features, from the `netdev` generic netlink family (`NETDEV_CMD_DEV_GET`,
//! what `ynl --family netdev --do dev-get` prints; Linux 6.3 and later): whether it runs XDP
//! programs natively and binds AF_XDP sockets in zero-copy mode. Read-only; no privilege
//! needed. Unknown (`None`) on an older kernel or any netlink failure: the caller says so
//! rather than guess.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
/// `NETDEV_XDP_ACT_BASIC`: the driver runs XDP programs (native mode).
const XDP_ACT_BASIC: u64 = 1;
/// `NETDEV_XDP_ACT_XSK_ZEROCOPY`: AF_XDP sockets bind in zero-copy mode.
const XDP_ACT_XSK_ZEROCOPY: u64 = 8;

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_HDR_LEN: usize = 16;
const GENL_HDR_LEN: usize = 4;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// What a driver can do with XDP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpFeatures {
    /// Native (driver) XDP.
    pub native: bool,
    /// AF_XDP zero-copy.
    pub zero_copy: bool,
}

/// The XDP features of `ifname` in this network namespace; `None` when the kernel does not
/// say (older than 6.3, or the query failed).
pub fn of(ifname: &str) -> Option<XdpFeatures> {
    let name = CString::new(ifname).ok()?;
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return None;
    }
    let sock = socket().ok()?;
    let family = family_id(&sock, "netdev").ok()?;
    let reply = request(
        &sock,
        family,
        NETDEV_CMD_DEV_GET,
        &attr(NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes()),
    )
    .ok()?;
    let bits = attrs(&reply)
        .find(|(t, _)| *t == NETDEV_A_DEV_XDP_FEATURES)
        .and_then(|(_, v)| Some(u64::from_ne_bytes(v.get(..8)?.try_into().ok()?)))?;
    Some(decode(bits))
}

fn decode(bits: u64) -> XdpFeatures {
    XdpFeatures {
        native: bits & XDP_ACT_BASIC != 0,
        zero_copy: bits & XDP_ACT_XSK_ZEROCOPY != 0,
    }
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is checked and owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_GENERIC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // A kernel that never answers must not hang the check.
    let tv = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: `tv` is a valid timeval for SO_RCVTIMEO.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
    Ok(sock)
}

fn family_id(sock: &OwnedFd, name: &str) -> io::Result<u16> {
    let mut value = name.as_bytes().to_vec();
    value.push(0);
    let reply = request(
        sock,
        GENL_ID_CTRL,
        CTRL_CMD_GETFAMILY,
        &attr(CTRL_ATTR_FAMILY_NAME, &value),
    )?;
    attrs(&reply)
        .find(|(t, _)| *t == CTRL_ATTR_FAMILY_ID)
        .and_then(|(_, v)| Some(u16::from_ne_bytes(v.get(..2)?.try_into().ok()?)))
        .ok_or_else(|| io::Error::other("no family id in the reply"))
}

/// Sends one request and returns the attributes of its reply (after the genl header).
fn request(sock: &OwnedFd, ty: u16, cmd: u8, attrs: &[u8]) -> io::Result<Vec<u8>> {
    let len = NLMSG_HDR_LEN + GENL_HDR_LEN + attrs.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    m.extend_from_slice(&[cmd, 1, 0, 0]); // genlmsghdr: cmd, version, reserved
    m.extend_from_slice(attrs);
    // SAFETY: zeroed sockaddr_nl addresses the kernel (pid 0).
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `m` and `addr` are valid for the lengths passed.
    let n = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            m.as_ptr().cast(),
            m.len(),
            0,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let buf = &buf[..n as usize];
    let short = || io::Error::other("short generic netlink reply");
    let hdr = buf.get(..NLMSG_HDR_LEN).ok_or_else(short)?;
    let mlen = u32::from_ne_bytes(hdr[0..4].try_into().expect("4 bytes")) as usize;
    let mty = u16::from_ne_bytes(hdr[4..6].try_into().expect("2 bytes"));
    let payload = buf.get(NLMSG_HDR_LEN..mlen).ok_or_else(short)?;
    if mty == NLMSG_ERROR {
        let code = payload.get(..4).map_or(-libc::EPROTO, |b| {
            i32::from_ne_bytes(b.try_into().expect("4 bytes"))
        });
        return Err(io::Error::from_raw_os_error(-code));
    }
    Ok(payload.get(GENL_HDR_LEN..).ok_or_else(short)?.to_vec())
}

fn attr(ty: u16, value: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(4 + value.len() + 3);
    buf.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(buf.len().next_multiple_of(4), 0);
    buf
}

/// The (type, value) pairs of a run of netlink attributes; stops at the first malformed one.
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
    fn feature_bits_are_the_kernels() {
        // NETDEV_XDP_ACT_BASIC | REDIRECT | NDO_XMIT | RX_SG: what veth reports.
        assert_eq!(
            decode(1 | 2 | 4 | 32),
            XdpFeatures {
                native: true,
                zero_copy: false
            }
        );
        assert!(decode(1 | 8).zero_copy);
        assert!(!decode(0).native);
    }

    #[test]
    fn attributes_are_padded_and_read_back() {
        let mut buf = attr(CTRL_ATTR_FAMILY_NAME, b"netdev\0");
        assert_eq!(buf.len(), 12);
        buf.extend(attr(CTRL_ATTR_FAMILY_ID, &7u16.to_ne_bytes()));
        let got: Vec<_> = attrs(&buf).collect();
        assert_eq!(got[0], (CTRL_ATTR_FAMILY_NAME, &b"netdev\0"[..]));
        assert_eq!(got[1], (CTRL_ATTR_FAMILY_ID, &7u16.to_ne_bytes()[..]));
        // A truncated attribute ends the walk instead of reading past the buffer.
        assert_eq!(attrs(&buf[..14]).count(), 1);
    }

    /// On this kernel (6.3 or later) the loopback device answers: no native XDP.
    #[test]
    fn loopback_has_no_native_xdp() {
        let f = of("lo").expect("this kernel reports XDP features");
        assert!(!f.native && !f.zero_copy, "{f:?}");
        assert_eq!(of("no-such-if0"), None);
    }
}
