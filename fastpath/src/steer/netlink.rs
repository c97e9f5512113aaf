//! Just enough rtnetlink to find and remove an XDP program that an earlier xvs attached the
//! legacy (netlink) way. Programs attached through a `bpf_link` vanish with their process; a
//! netlink attachment outlives it, so start-up removes it by name before attaching.
//!
//! The netlink stack is the workspace's (`netlink-sys` sockets, `netlink-packet-route`
//! messages, as the neighbour watcher and `xvs decap` use). Every reply is the kernel's word
//! and still checked: it must decode, answer this request (sequence number) and, for a query,
//! describe the interface asked about; anything else is an error, never a panic.

use std::io;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// `XDP_FLAGS_*_MODE`: which attachment point a program sits on.
pub(super) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub(super) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
pub(super) const XDP_FLAGS_HW_MODE: u32 = 1 << 3;

/// The one request on each fresh socket.
const SEQ: u32 = 1;

/// An XDP program attached to an interface: its mode flag and kernel program id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Attached {
    pub mode_flag: u32,
    pub prog_id: u32,
}

/// The XDP programs attached to `ifindex`, one per mode.
pub(super) fn attached(ifindex: u32) -> io::Result<Vec<Attached>> {
    let mut query = LinkMessage::default();
    query.header.index = ifindex;
    link_reply(request(RouteNetlinkMessage::GetLink(query), 0)?, ifindex)
}

/// The programs in the kernel's answer to RTM_GETLINK for `ifindex`: a link message about
/// that interface, or an error.
fn link_reply(reply: Option<RouteNetlinkMessage>, ifindex: u32) -> io::Result<Vec<Attached>> {
    match reply {
        Some(RouteNetlinkMessage::NewLink(link)) if link.header.index == ifindex => {
            Ok(xdp_of(&link))
        }
        Some(RouteNetlinkMessage::NewLink(link)) => Err(io::Error::other(format!(
            "rtnetlink answered RTM_GETLINK for interface {ifindex} about interface {}",
            link.header.index
        ))),
        _ => Err(io::Error::other(
            "unexpected rtnetlink reply to RTM_GETLINK",
        )),
    }
}

/// The programs a link message reports in its `IFLA_XDP` attribute.
fn xdp_of(link: &LinkMessage) -> Vec<Attached> {
    let Some(xdp) = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Xdp(xdp) => Some(xdp),
        _ => None,
    }) else {
        return Vec::new();
    };
    let mut mode = XdpAttached::None;
    let mut single = 0u32;
    let mut found = Vec::new();
    for attr in xdp {
        match *attr {
            LinkXdp::Attached(m) => mode = m,
            LinkXdp::ProgId(id) => single = id,
            LinkXdp::DrvProgId(id) => push(&mut found, XDP_FLAGS_DRV_MODE, id),
            LinkXdp::SkbProgId(id) => push(&mut found, XDP_FLAGS_SKB_MODE, id),
            LinkXdp::HwProgId(id) => push(&mut found, XDP_FLAGS_HW_MODE, id),
            _ => {}
        }
    }
    // With one program attached the kernel reports only IFLA_XDP_PROG_ID and the mode.
    if found.is_empty() && single != 0 {
        let mode_flag = match mode {
            XdpAttached::Driver => XDP_FLAGS_DRV_MODE,
            XdpAttached::SocketBuffer => XDP_FLAGS_SKB_MODE,
            XdpAttached::Hardware => XDP_FLAGS_HW_MODE,
            _ => 0,
        };
        found.push(Attached {
            mode_flag,
            prog_id: single,
        });
    }
    found
}

fn push(found: &mut Vec<Attached>, mode_flag: u32, prog_id: u32) {
    if prog_id != 0 {
        found.push(Attached { mode_flag, prog_id });
    }
}

/// Detaches a netlink-attached program from `ifindex` in the given mode. Fails with `EBUSY`
/// when the program is held by a `bpf_link` (a live process owns it).
pub(super) fn detach_legacy(ifindex: u32, mode_flag: u32) -> io::Result<()> {
    let mut m = LinkMessage::default();
    m.header.index = ifindex;
    m.attributes.push(LinkAttribute::Xdp(vec![
        LinkXdp::Fd(-1),
        LinkXdp::Flags(mode_flag),
    ]));
    match request(RouteNetlinkMessage::SetLink(m), NLM_F_ACK)? {
        None => Ok(()),
        Some(_) => Err(io::Error::other(
            "unexpected rtnetlink reply to RTM_SETLINK",
        )),
    }
}

/// Sends `msg` on a fresh socket and returns the kernel's answer: `None` for an ACK, the
/// message otherwise; a NACK is its errno.
fn request(msg: RouteNetlinkMessage, flags: u16) -> io::Result<Option<RouteNetlinkMessage>> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = SEQ;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    sock.send(&buf, 0)?;
    let (datagram, _) = sock.recv_from_full()?;
    answer(&datagram)
}

/// The answer in the first message of `datagram` (see [`request`]).
fn answer(datagram: &[u8]) -> io::Result<Option<RouteNetlinkMessage>> {
    let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(datagram)
        .map_err(|e| io::Error::other(format!("rtnetlink reply: {e}")))?;
    if m.header.sequence_number != SEQ {
        return Err(io::Error::other(format!(
            "rtnetlink reply with sequence number {}, not {SEQ}",
            m.header.sequence_number
        )));
    }
    match m.payload {
        NetlinkPayload::InnerMessage(inner) => Ok(Some(inner)),
        NetlinkPayload::Error(e) => match e.code {
            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
            None => Ok(None),
        },
        _ => Err(io::Error::other("unexpected rtnetlink reply")),
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::ErrorMessage;

    use super::*;

    fn encode(seq: u32, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        let mut m = NetlinkMessage::new(header, payload);
        m.finalize();
        let mut buf = vec![0; m.buffer_len()];
        m.serialize(&mut buf);
        buf
    }

    fn link(xdp: Vec<LinkXdp>) -> LinkMessage {
        let mut l = LinkMessage::default();
        l.header.index = 7;
        l.attributes.push(LinkAttribute::Xdp(xdp));
        l
    }

    #[test]
    fn one_program_is_read_from_its_id_and_mode() {
        let l = link(vec![
            LinkXdp::Attached(XdpAttached::SocketBuffer),
            LinkXdp::ProgId(42),
        ]);
        let want = Attached {
            mode_flag: XDP_FLAGS_SKB_MODE,
            prog_id: 42,
        };
        assert_eq!(xdp_of(&l), vec![want]);
    }

    #[test]
    fn several_programs_are_read_per_mode_and_zero_ids_skipped() {
        let l = link(vec![
            LinkXdp::Attached(XdpAttached::Multiple),
            LinkXdp::ProgId(5),
            LinkXdp::DrvProgId(5),
            LinkXdp::SkbProgId(0),
            LinkXdp::HwProgId(9),
        ]);
        let got: Vec<_> = xdp_of(&l)
            .iter()
            .map(|a| (a.mode_flag, a.prog_id))
            .collect();
        assert_eq!(got, vec![(XDP_FLAGS_DRV_MODE, 5), (XDP_FLAGS_HW_MODE, 9)]);
        assert!(xdp_of(&LinkMessage::default()).is_empty());
    }

    #[test]
    fn a_link_reply_round_trips_through_the_wire_format() {
        let l = link(vec![
            LinkXdp::Attached(XdpAttached::Driver),
            LinkXdp::ProgId(3),
        ]);
        let bytes = encode(
            SEQ,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)),
        );
        let Some(RouteNetlinkMessage::NewLink(got)) = answer(&bytes).expect("decodes") else {
            panic!("not a link message");
        };
        assert_eq!(got.header.index, 7);
        assert_eq!(xdp_of(&got)[0].mode_flag, XDP_FLAGS_DRV_MODE);
    }

    #[test]
    fn a_reply_about_another_interface_or_of_another_kind_is_refused() {
        let about = |index| {
            let mut l = link(vec![LinkXdp::ProgId(3)]);
            l.header.index = index;
            Some(RouteNetlinkMessage::NewLink(l))
        };
        assert_eq!(link_reply(about(7), 7).expect("its own").len(), 1);
        let other = link_reply(about(8), 7).unwrap_err();
        assert!(other.to_string().contains("about interface 8"), "{other}");
        assert!(
            link_reply(None, 7).is_err(),
            "an ACK is no answer to a query"
        );
        let kind = RouteNetlinkMessage::DelLink(LinkMessage::default());
        assert!(link_reply(Some(kind), 7).is_err());
    }

    #[test]
    fn nack_is_its_errno_and_ack_is_none() {
        let mut nack = ErrorMessage::default();
        nack.code = std::num::NonZeroI32::new(-libc::EBUSY);
        let err = answer(&encode(SEQ, NetlinkPayload::Error(nack))).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBUSY));
        let ack = encode(SEQ, NetlinkPayload::Error(ErrorMessage::default()));
        assert!(answer(&ack).expect("an ACK").is_none());
    }

    #[test]
    fn odd_replies_are_errors_not_panics() {
        let good = encode(
            SEQ,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link(vec![
                LinkXdp::ProgId(1),
            ]))),
        );
        // Every truncation, and every single-byte corruption, of a good reply.
        for n in 0..good.len() {
            let _ = answer(&good[..n]);
            assert!(answer(&good[..n.min(15)]).is_err(), "{n} bytes");
            for b in [0x00, 0x7f, 0xff] {
                let mut odd = good.clone();
                odd[n] = b;
                let _ = answer(&odd);
            }
        }
        let stale = encode(SEQ + 1, NetlinkPayload::Error(ErrorMessage::default()));
        assert!(answer(&stale).is_err(), "a reply to another request");
    }
}
