//! rtnetlink dumps over a blocking NETLINK_ROUTE socket: one request, then every message up
//! to NLMSG_DONE. A dump the kernel marks inconsistent (NLM_F_DUMP_INTR: the table changed
//! underneath) is retried.

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::RouteMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use super::NeighError;

/// How many times a dump interrupted by concurrent changes is restarted.
const DUMP_TRIES_MAX: u32 = 4;

/// A NETLINK_ROUTE socket for dumps.
pub(super) struct Dumper {
    sock: Socket,
    seq: u32,
}

impl Dumper {
    pub(super) fn open() -> Result<Self, NeighError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(NeighError::Socket)?;
        sock.bind_auto().map_err(NeighError::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(NeighError::Socket)?;
        Ok(Dumper { sock, seq: 0 })
    }

    pub(super) fn links(&mut self) -> Result<Vec<LinkMessage>, NeighError> {
        self.dump(
            "links",
            || RouteNetlinkMessage::GetLink(LinkMessage::default()),
            |m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(l),
                _ => None,
            },
        )
    }

    pub(super) fn routes(&mut self) -> Result<Vec<RouteMessage>, NeighError> {
        self.dump(
            "routes",
            || RouteNetlinkMessage::GetRoute(RouteMessage::default()),
            |m| match m {
                RouteNetlinkMessage::NewRoute(r) => Some(r),
                _ => None,
            },
        )
    }

    pub(super) fn neighbours(&mut self) -> Result<Vec<NeighbourMessage>, NeighError> {
        self.dump(
            "neighbours",
            || RouteNetlinkMessage::GetNeighbour(NeighbourMessage::default()),
            |m| match m {
                RouteNetlinkMessage::NewNeighbour(n) => Some(n),
                _ => None,
            },
        )
    }

    fn dump<T>(
        &mut self,
        what: &'static str,
        request: impl Fn() -> RouteNetlinkMessage,
        pick: impl Fn(RouteNetlinkMessage) -> Option<T>,
    ) -> Result<Vec<T>, NeighError> {
        for _ in 0..DUMP_TRIES_MAX {
            if let Some(all) = self.dump_once(what, request(), &pick)? {
                return Ok(all);
            }
        }
        Err(NeighError::Interrupted { what })
    }

    /// One dump; `None` when the kernel flagged it inconsistent.
    fn dump_once<T>(
        &mut self,
        what: &'static str,
        request: RouteNetlinkMessage,
        pick: &impl Fn(RouteNetlinkMessage) -> Option<T>,
    ) -> Result<Option<Vec<T>>, NeighError> {
        let io = |source| NeighError::Dump { what, source };
        let decode = |message: String| NeighError::Decode { what, message };
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = seq;
        let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        self.sock.send(&buf, 0).map_err(io)?;

        let mut out = Vec::new();
        let mut interrupted = false;
        loop {
            let (datagram, _) = self.sock.recv_from_full().map_err(io)?;
            let mut rest = datagram.as_slice();
            while !rest.is_empty() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest)
                    .map_err(|e| decode(e.to_string()))?;
                let len = (m.header.length as usize).next_multiple_of(4);
                if len == 0 {
                    return Err(decode("zero-length message".into()));
                }
                rest = rest.get(len..).unwrap_or_default();
                if m.header.sequence_number != seq {
                    // A reply to an earlier, abandoned request.
                    continue;
                }
                interrupted |= m.header.flags & NLM_F_DUMP_INTR != 0;
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok((!interrupted).then_some(out)),
                    NetlinkPayload::Error(e) => {
                        let source = match e.code {
                            Some(code) => std::io::Error::from_raw_os_error(-code.get()),
                            None => std::io::Error::other("unexpected ACK"),
                        };
                        return Err(io(source));
                    }
                    NetlinkPayload::InnerMessage(inner) => out.extend(pick(inner)),
                    _ => {}
                }
            }
        }
    }
}
