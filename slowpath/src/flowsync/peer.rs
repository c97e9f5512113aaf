//! A peer as this node sees it, and the rules that admit its datagrams once their tag
//! verified and they name the right sender and receiver (`super::Service::judge`).
//!
//! Every process has a random **session** (64 bits) and issues each peer a random
//! **ticket**; every datagram carries its sender's session, the ticket its sender issues the
//! receiver, and the receiver's ticket as the sender last learnt it ("presented"). A node
//! acts on a datagram (installs, removes, dumps, counts the peer as heard) only when it
//! presents the ticket this node currently issues that peer, and its sequence is new in the
//! peer's session ([`Replay`]):
//!
//! - **Receiver restarts.** Its tickets are new random numbers: everything captured before
//!   presents an old one and is refused (`stale_session`).
//! - **Sender restarts.** The receiver sees a new session and follows it only if its
//!   sequence is above every sequence it accepted from that peer (the sender's clock moved
//!   on), or the session it followed has been silent for [`PEER_SILENT`] (a clock that
//!   stepped back across the restart); datagrams of an older session are refused
//!   (`stale_session`). Following a new session **re-issues the ticket**, so no datagram made
//!   before (any session's) can present it: the datagram that announced the session is
//!   never acted on itself, even if it was an old one replayed while the peer was silent.
//! - **Hellos** that do not present the current ticket (a node that just started, or whose
//!   peer just re-issued) are not refused: their sequence is checked like any other's and
//!   they teach this node the sender's ticket, nothing else. That is how two nodes that
//!   restarted together (each re-issuing when it sees the other's new session) converge
//!   instead of each holding the other's outdated ticket.
//!
//! Sans-IO: the caller passes the clock and draws the tickets.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use super::PEER_SILENT;
use super::wire::{self, Kind, Message, Refused, Replay};

/// Why a datagram was refused, for its counter and its one log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The reason (its counter).
    pub reason: Refused,
    /// The header field that failed.
    pub field: &'static str,
    /// Its value.
    pub value: Value,
}

/// A refused field's value, as the log shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// An address (a node id, a source address).
    Addr(SocketAddr),
    /// A session or ticket (shown in hex).
    Id(u64),
    /// A number (a sequence, a version, a length).
    Num(u64),
    /// Nothing worth showing (a tag).
    None,
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Addr(a) => write!(f, "{a}"),
            Value::Id(v) => write!(f, "{v:016x}"),
            Value::Num(v) => write!(f, "{v}"),
            Value::None => f.write_str("-"),
        }
    }
}

impl Refusal {
    pub(super) fn new(reason: Refused, field: &'static str, value: Value) -> Refusal {
        Refusal {
            reason,
            field,
            value,
        }
    }
}

/// What admitting a datagram did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admitted {
    /// It presents this node's ticket: act on it.
    pub act: bool,
    /// It announced a session of the peer this node did not follow (the peer started or
    /// restarted, or this node did).
    pub new_session: bool,
    /// ... and this node re-issued the peer's ticket (it followed another session before).
    pub reissued: bool,
    /// It carried a ticket for this node other than the one known: learnt.
    pub learnt: bool,
}

/// A peer of `[sync] peers`.
#[derive(Debug)]
pub struct Peer {
    /// Its sync address: where it is reached, where its datagrams come from, its node id.
    pub addr: SocketAddr,
    /// Its SNAT addresses as `[sync]` lists them.
    pub snat: Vec<IpAddr>,
    /// This node's ticket for it (nonzero).
    pub ticket: u64,
    /// Its ticket for this node, as last learnt (0: not yet; nothing but hellos goes to it).
    pub their_ticket: u64,
    /// The session of its this node follows.
    session: Option<u64>,
    /// That session's window.
    replay: Replay,
    /// The highest sequence accepted from it, in any session.
    top: u64,
    /// When a datagram of it was last acted on.
    pub heard: Option<Instant>,
    /// Its dump to us finished (or it was given up on).
    pub dumped: bool,
    /// Its dump to us finished.
    pub dump_in: bool,
    /// When we last asked it for a dump.
    pub asked: Option<Instant>,
}

impl Peer {
    /// A peer at `addr` with SNAT addresses `snat`, issued `ticket`.
    pub fn new(addr: SocketAddr, snat: Vec<IpAddr>, ticket: u64) -> Peer {
        Peer {
            addr,
            snat,
            ticket,
            their_ticket: 0,
            session: None,
            replay: Replay::default(),
            top: 0,
            heard: None,
            dumped: false,
            dump_in: false,
            asked: None,
        }
    }

    /// Whether nothing of it was acted on for [`PEER_SILENT`] (or ever).
    pub fn silent(&self, now: Instant) -> bool {
        self.heard
            .is_none_or(|h| now.saturating_duration_since(h) >= PEER_SILENT)
    }

    /// The session of it this node follows.
    pub fn session(&self) -> Option<u64> {
        self.session
    }

    /// Admits `m` (tag verified, sender and receiver checked) at `now` (`now_us`: the Unix
    /// clock in µs), drawing a new ticket from `reissue` when it must (see the module doc).
    pub fn admit(
        &mut self,
        m: &Message,
        now: Instant,
        now_us: u64,
        reissue: &mut dyn FnMut() -> u64,
    ) -> Result<Admitted, Refusal> {
        let h = &m.head;
        let mut out = Admitted::default();
        if self.session != Some(h.session) {
            if h.seq <= self.top && !self.silent(now) {
                return Err(Refusal::new(
                    Refused::StaleSession,
                    "session",
                    Value::Id(h.session),
                ));
            }
            if !wire::fresh(h.seq, now_us) {
                return Err(Refusal::new(Refused::Replay, "sequence", Value::Num(h.seq)));
            }
            if self.session.is_some() {
                self.ticket = reissue();
                out.reissued = true;
            }
            self.session = Some(h.session);
            self.replay = Replay::default();
            out.new_session = true;
        }
        let bound = h.presented == self.ticket;
        if !bound && m.kind != Kind::Hello {
            return Err(Refusal::new(
                Refused::StaleSession,
                "presented ticket",
                Value::Id(h.presented),
            ));
        }
        self.replay
            .check(h.seq, now_us)
            .map_err(|r| Refusal::new(r, "sequence", Value::Num(h.seq)))?;
        self.top = self.top.max(h.seq);
        if h.issued != 0 && h.issued != self.their_ticket {
            self.their_ticket = h.issued;
            out.learnt = true;
        }
        out.act = bound;
        Ok(out)
    }
}
