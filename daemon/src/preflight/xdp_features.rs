//! A driver's XDP features, from the `netdev` generic netlink family (`NETDEV_CMD_DEV_GET`,
//! what `ynl --family netdev --do dev-get` prints; Linux 6.3 and later): whether it runs XDP
//! programs natively and binds AF_XDP sockets in zero-copy mode. Read-only; no privilege
//! needed. Unknown (`None`) on an older kernel or any netlink failure: the caller says so
//! rather than guess.
//!
//! The netlink stack is the workspace's (`netlink-sys` sockets, `netlink-packet-core`
//! messages and attributes, as the neighbour watcher uses); only the 4-byte generic netlink
//! header and the two commands are this file's ([`Genl`]).

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NetlinkSerializable, Nla, NlasIterator, Parseable,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};

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
/// `struct genlmsghdr`: cmd, version, reserved.
const GENL_HDR_LEN: usize = 4;

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
    let ifindex = DefaultNla::new(NETDEV_A_DEV_IFINDEX, ifindex.to_ne_bytes().to_vec());
    let reply = request(&sock, Genl::new(family, NETDEV_CMD_DEV_GET, vec![ifindex])).ok()?;
    let bits = reply
        .value(NETDEV_A_DEV_XDP_FEATURES)
        .and_then(|v| Some(u64::from_ne_bytes(v.get(..8)?.try_into().ok()?)))?;
    Some(decode(bits))
}

fn decode(bits: u64) -> XdpFeatures {
    XdpFeatures {
        native: bits & XDP_ACT_BASIC != 0,
        zero_copy: bits & XDP_ACT_XSK_ZEROCOPY != 0,
    }
}

fn socket() -> io::Result<Socket> {
    let mut sock = Socket::new(NETLINK_GENERIC)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
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

fn family_id(sock: &Socket, name: &str) -> io::Result<u16> {
    let mut value = name.as_bytes().to_vec();
    value.push(0);
    let name = DefaultNla::new(CTRL_ATTR_FAMILY_NAME, value);
    let reply = request(
        sock,
        Genl::new(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, vec![name]),
    )?;
    reply
        .value(CTRL_ATTR_FAMILY_ID)
        .and_then(|v| Some(u16::from_ne_bytes(v.get(..2)?.try_into().ok()?)))
        .ok_or_else(|| io::Error::other("no family id in the reply"))
}

/// Sends one request and returns its reply.
fn request(sock: &Socket, genl: Genl) -> io::Result<Genl> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = 1;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(genl));
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    sock.send(&buf, 0)?;
    let (datagram, _) = sock.recv_from_full()?;
    let reply = NetlinkMessage::<Genl>::deserialize(&datagram)
        .map_err(|e| io::Error::other(format!("generic netlink reply: {e}")))?;
    match reply.payload {
        NetlinkPayload::InnerMessage(genl) => Ok(genl),
        NetlinkPayload::Error(e) => Err(match e.code {
            Some(code) => io::Error::from_raw_os_error(-code.get()),
            None => io::Error::other("unexpected ACK"),
        }),
        _ => Err(io::Error::other("unexpected generic netlink reply")),
    }
}

/// A generic netlink message: the family (the netlink message type), the command and the
/// attributes; what the crates leave to each family.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Genl {
    family: u16,
    cmd: u8,
    attrs: Vec<DefaultNla>,
}

impl Genl {
    fn new(family: u16, cmd: u8, attrs: Vec<DefaultNla>) -> Genl {
        Genl { family, cmd, attrs }
    }

    /// The value of the first attribute of type `kind`.
    fn value(&self, kind: u16) -> Option<Vec<u8>> {
        self.attrs.iter().find(|a| a.kind() == kind).map(|a| {
            let mut v = vec![0; a.value_len()];
            a.emit_value(&mut v);
            v
        })
    }
}

impl NetlinkSerializable for Genl {
    fn message_type(&self) -> u16 {
        self.family
    }

    fn buffer_len(&self) -> usize {
        GENL_HDR_LEN + self.attrs.as_slice().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[..GENL_HDR_LEN].copy_from_slice(&[self.cmd, 1, 0, 0]);
        self.attrs.as_slice().emit(&mut buffer[GENL_HDR_LEN..]);
    }
}

impl NetlinkDeserializable for Genl {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Genl, DecodeError> {
        let cmd = *payload
            .first()
            .ok_or_else(|| DecodeError::from("no generic netlink header"))?;
        let rest = payload
            .get(GENL_HDR_LEN..)
            .ok_or_else(|| DecodeError::from("short generic netlink header"))?;
        // A malformed attribute refuses the whole reply: the caller then says "unknown".
        let attrs = NlasIterator::new(rest)
            .map(|nla| DefaultNla::parse(&nla?))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Genl::new(header.message_type, cmd, attrs))
    }
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
        let genl = Genl::new(
            GENL_ID_CTRL,
            CTRL_CMD_GETFAMILY,
            vec![
                DefaultNla::new(CTRL_ATTR_FAMILY_NAME, b"netdev\0".to_vec()),
                DefaultNla::new(CTRL_ATTR_FAMILY_ID, 7u16.to_ne_bytes().to_vec()),
            ],
        );
        // Header, a 7-byte value padded to 12, a 2-byte value padded to 8.
        assert_eq!(NetlinkSerializable::buffer_len(&genl), 4 + 12 + 8);
        let mut buf = vec![0; NetlinkSerializable::buffer_len(&genl)];
        genl.serialize(&mut buf);
        assert_eq!(&buf[..4], &[CTRL_CMD_GETFAMILY, 1, 0, 0]);
        let mut header = NetlinkHeader::default();
        header.message_type = GENL_ID_CTRL;
        let back = Genl::deserialize(&header, &buf).unwrap();
        assert_eq!(back, genl);
        assert_eq!(back.value(CTRL_ATTR_FAMILY_NAME).unwrap(), b"netdev\0");
        assert_eq!(back.value(CTRL_ATTR_FAMILY_ID).unwrap(), 7u16.to_ne_bytes());
        // A truncated attribute refuses the reply instead of reading past the buffer.
        assert!(Genl::deserialize(&header, &buf[..18]).is_err());
        assert!(Genl::deserialize(&header, &buf[..2]).is_err());
    }

    /// On this kernel (6.3 or later) the loopback device answers: no native XDP.
    #[test]
    fn loopback_has_no_native_xdp() {
        let f = of("lo").expect("this kernel reports XDP features");
        assert!(!f.native && !f.zero_copy, "{f:?}");
        assert_eq!(of("no-such-if0"), None);
    }
}
