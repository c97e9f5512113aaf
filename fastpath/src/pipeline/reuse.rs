//! Port reuse: a connection-opening packet on a flow that has ended ends that flow, and is
//! then scheduled as a new flow, as Linux IPVS does with `conn_reuse_mode = 1` (`ip_vs_in`:
//! `is_new_conn` and `is_new_conn_expected`). Without it a client that reuses its source
//! port while xvs still holds the old flow (TIME_WAIT lasts 120 s) would go to the old
//! backend, even one drained to weight 0 or no longer usable.
//!
//! # Contract
//!
//! - The packet: a TCP SYN without ACK, RST and FIN ([`reopens`]) in the original direction
//!   (client → VIP). SCTP's INIT is classified with the same bit, so an INIT on an SCTP
//!   association in its closing state (after ABORT or SHUTDOWN) is one too: this covers
//!   IPVS's INIT on a CLOSED association, and, since the flow table has one closing state,
//!   an INIT during a SHUTDOWN exchange as well.
//! - The flow: TCP TIME_WAIT or CLOSE, SCTP closing ([`ended`](Pipeline::ended)); for a DSR
//!   flow, TCP FIN_WAIT too (where its client's FIN leaves it, the backend's never being
//!   seen: IPVS's `conn_reuse_mode` bit 2 for its DR and TUN connections). A SYN on a
//!   flow in any other state (a retransmitted SYN, SYN_RECV, ESTABLISHED...), a SYN-ACK, and
//!   every packet in the reply direction keep the flow, as before.
//! - The old flow is removed with [`FlowTable::remove`] (which releases its backend counts
//!   and, in full-NAT, its SNAT reply tuple), counted in [`Counters::reused`], and the packet
//!   takes the new-flow path with every check: source ranges, freeze, rate limit, the
//!   scheduler (so weight 0 and unusable backends are avoided), ClientIP affinity (kept only
//!   while its backend is still usable), next hop, SNAT port. A refused packet is dropped as a
//!   new flow would be; the old flow is gone either way (it had ended).
//! - A flow that cannot be removed (another worker is still inserting it, or removed it
//!   meanwhile) is kept and the packet forwarded on it, as before.
//! - Cost: a packet of a known flow that is not a pure SYN (every established packet) pays
//!   one flag test. A pure SYN that finds a flow leaves the hit path for a cold one, which
//!   parses the frame and looks it up again, so that the hit path keeps nothing across the
//!   call; in a batch it goes where hits on flows being inserted go, and finishes the
//!   waiting flows first (see `batch`).
//!
//! [`FlowTable::remove`]: flowtable::FlowTable::remove
//! [`Counters::reused`]: super::Counters::reused

use flowtable::{FlowHandle, FlowState, SctpState, TcpFlags, TcpState};

use super::{FLAG_DSR, Pipeline};

/// Whether a packet with these flags (TCP flags, or SCTP's mapped chunk type) may open a
/// connection again on a flow that has ended: SYN without ACK, RST and FIN (SCTP: INIT).
#[inline(always)]
pub(super) fn reopens(flags: u8) -> bool {
    TcpFlags(flags).events() == TcpFlags::SYN
}

impl Pipeline {
    /// Whether flow `h` has ended (TCP TIME_WAIT or CLOSE, SCTP closing; a DSR flow's TCP
    /// FIN_WAIT): a [`reopens`] packet in the original direction then starts a new flow.
    /// Reads only.
    #[cold]
    #[inline(never)]
    pub(super) fn ended(&self, h: FlowHandle) -> bool {
        self.flows.get(h).is_some_and(|v| {
            matches!(
                v.state,
                FlowState::Tcp(TcpState::TimeWait | TcpState::Close)
                    | FlowState::Sctp(SctpState::Closing)
            ) || (v.data.flags & FLAG_DSR != 0 && v.state == FlowState::Tcp(TcpState::FinWait))
        })
    }

    /// Removes flow `h`, which has [`ended`](Self::ended), for a new flow of its tuple, and
    /// counts it; `false` when it could not be removed (being inserted by another worker, or
    /// already gone). (Another worker's packet may change the state between the two calls;
    /// only a SYN takes a flow out of TIME_WAIT or CLOSE, and a backend's SYN on an ended
    /// flow is no connection to keep.)
    #[cold]
    #[inline(never)]
    pub(super) fn end(&mut self, h: FlowHandle) -> bool {
        if self.flows.remove(h).is_none() {
            return false;
        }
        self.counters.reused += 1;
        true
    }
}
