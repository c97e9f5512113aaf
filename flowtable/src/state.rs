//! Per-flow protocol state and idle timeouts.
//!
//! TCP follows Linux IPVS's `tcp_states` table (`net/netfilter/ipvs/ip_vs_proto_tcp.c`): the
//! *input* rows are packets in the original direction (client → VIP), the *output* rows packets
//! in the reply direction (backend → client/SNAT). As in IPVS, a packet's event is RST if RST is
//! set, else SYN, else FIN, else ACK; a packet with none of them moves the flow to CLOSE.
//! A one-way flow (the table's `FLAG_ONE_WAY`: direct server return, whose replies go from the
//! backend straight to the client) sees only the original direction: it follows IPVS's
//! *input-only* rows instead ([`FlowState::next_one_way`]; IPVS uses them for its DR and TUN
//! connections until an output packet shows up, `IP_VS_CONN_F_NOOUTPUT`): the client's SYN
//! makes SYN_RECV, its ACK ESTABLISHED, its FIN FIN_WAIT (not CLOSE_WAIT: the backend's FIN
//! is never seen, so FIN_WAIT's timeout ends the flow), its RST CLOSE.
//! UDP and ICMP have one state each. SCTP uses a two-state model: ESTABLISHED, and CLOSING after
//! an ABORT or a SHUTDOWN chunk: pass the flags [`vocab::sctp_events`] gives for the chunk
//! type ([`TcpFlags::RST`] for ABORT, [`TcpFlags::FIN`] for SHUTDOWN/SHUTDOWN-ACK/
//! SHUTDOWN-COMPLETE, [`TcpFlags::SYN`] for INIT, which re-opens).

use std::time::Duration;

use crate::key::{Direction, Protocol};

pub use vocab::TcpFlags;

/// IPVS's TCP connection states (`IP_VS_TCP_S_*`), in IPVS's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TcpState {
    /// No packet seen yet (only before the first packet is applied).
    None = 0,
    /// Three-way handshake completed.
    Established = 1,
    /// The backend side sent a SYN (unusual: IPVS's "output SYN").
    SynSent = 2,
    /// The client sent a SYN (the normal first state).
    SynRecv = 3,
    /// The backend sent a FIN first.
    FinWait = 4,
    /// Both sides sent FIN.
    TimeWait = 5,
    /// Reset, or a packet IPVS cannot place.
    Close = 6,
    /// The client sent a FIN first.
    CloseWait = 7,
    /// Last ACK pending.
    LastAck = 8,
    /// Listen (kept for fidelity with the IPVS table; never entered from another state).
    Listen = 9,
    /// SYN-ACK seen (IPVS's `sSA`).
    SynAck = 10,
}

const TCP_STATES: [TcpState; 11] = [
    TcpState::None,
    TcpState::Established,
    TcpState::SynSent,
    TcpState::SynRecv,
    TcpState::FinWait,
    TcpState::TimeWait,
    TcpState::Close,
    TcpState::CloseWait,
    TcpState::LastAck,
    TcpState::Listen,
    TcpState::SynAck,
];

use TcpState::{
    Close as CL, CloseWait as CW, Established as ES, FinWait as FW, LastAck as LA, Listen as LI,
    SynRecv as SR, SynSent as SS, TimeWait as TW,
};

/// `[rows][event][state] -> next state`; rows: 0 input (original direction), 1 output (reply
/// direction), 2 input-only (the original direction of a one-way flow); events: 0 SYN, 1 FIN,
/// 2 ACK, 3 RST. Columns: NO, ES, SS, SR, FW, TW, CL, CW, LA, LI, SA.
#[rustfmt::skip]
const TCP_NEXT: [[[TcpState; 11]; 4]; 3] = [
    // INPUT (original direction)
    [
        /*syn*/ [SR, ES, ES, SR, SR, SR, SR, SR, SR, SR, SR],
        /*fin*/ [CL, CW, SS, TW, TW, TW, CL, CW, LA, LI, TW],
        /*ack*/ [CL, ES, SS, ES, FW, TW, CL, CW, CL, LI, ES],
        /*rst*/ [CL, CL, CL, SR, CL, CL, CL, CL, LA, LI, SR],
    ],
    // OUTPUT (reply direction)
    [
        /*syn*/ [SS, ES, SS, SR, SS, SS, SS, SS, SS, LI, SR],
        /*fin*/ [TW, FW, SS, TW, FW, TW, CL, TW, LA, LI, TW],
        /*ack*/ [ES, ES, SS, ES, FW, TW, CL, CW, LA, ES, ES],
        /*rst*/ [CL, CL, SS, CL, CL, TW, CL, CL, CL, CL, CL],
    ],
    // INPUT-ONLY (original direction of a one-way flow; IPVS's third block)
    [
        /*syn*/ [SR, ES, ES, SR, SR, SR, SR, SR, SR, SR, SR],
        /*fin*/ [CL, FW, SS, TW, FW, TW, CL, CW, LA, LI, TW],
        /*ack*/ [CL, ES, SS, ES, FW, TW, CL, CW, CL, LI, ES],
        /*rst*/ [CL, CL, CL, SR, CL, CL, CL, CL, LA, LI, CL],
    ],
];

/// Row of [`TCP_NEXT`] for the original direction of a one-way flow.
const INPUT_ONLY: usize = 2;

impl TcpState {
    /// The state after a packet with `flags` travelling in `dir`.
    pub fn next(self, dir: Direction, flags: TcpFlags) -> TcpState {
        let d = match dir {
            Direction::Original => 0,
            Direction::Reply => 1,
        };
        self.next_in(d, flags)
    }

    /// The state after a client packet with `flags` of a one-way flow (IPVS's input-only
    /// rows).
    pub fn next_one_way(self, flags: TcpFlags) -> TcpState {
        self.next_in(INPUT_ONLY, flags)
    }

    /// The state after a packet with `flags`, from row block `d` of [`TCP_NEXT`].
    fn next_in(self, d: usize, flags: TcpFlags) -> TcpState {
        let event = if flags.contains(TcpFlags::RST) {
            3
        } else if flags.contains(TcpFlags::SYN) {
            0
        } else if flags.contains(TcpFlags::FIN) {
            1
        } else if flags.contains(TcpFlags::ACK) {
            2
        } else {
            return TcpState::Close;
        };
        TCP_NEXT[d][event][self as usize]
    }
}

/// SCTP association states (a simple model, see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SctpState {
    /// Data may flow.
    Established,
    /// ABORT or SHUTDOWN seen.
    Closing,
}

/// The state of one flow: protocol and, for TCP and SCTP, the connection state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlowState {
    /// A TCP connection.
    Tcp(TcpState),
    /// A UDP flow (one state).
    Udp,
    /// An ICMP or ICMPv6 echo flow (one state).
    Icmp,
    /// An SCTP association.
    Sctp(SctpState),
}

impl FlowState {
    /// The state of a new flow whose first packet (original direction) carries `flags`.
    pub fn initial(proto: Protocol, flags: TcpFlags) -> FlowState {
        match proto {
            Protocol::Tcp => FlowState::Tcp(TcpState::None.next(Direction::Original, flags)),
            Protocol::Udp => FlowState::Udp,
            Protocol::Icmp | Protocol::Icmpv6 => FlowState::Icmp,
            Protocol::Sctp => {
                FlowState::Sctp(SctpState::Established).next(Direction::Original, flags)
            }
        }
    }

    /// The state after a packet with `flags` travelling in `dir`.
    pub fn next(self, dir: Direction, flags: TcpFlags) -> FlowState {
        match self {
            FlowState::Tcp(s) => FlowState::Tcp(s.next(dir, flags)),
            s => s.next_datagram(flags),
        }
    }

    /// The state after a client packet with `flags` of a one-way flow: TCP by IPVS's
    /// input-only rows, every other protocol as [`next`](Self::next) has it (their models
    /// do not read the direction).
    pub fn next_one_way(self, flags: TcpFlags) -> FlowState {
        match self {
            FlowState::Tcp(s) => FlowState::Tcp(s.next_one_way(flags)),
            s => s.next_datagram(flags),
        }
    }

    /// [`next`](Self::next) for the protocols other than TCP (no direction read).
    fn next_datagram(self, flags: TcpFlags) -> FlowState {
        match self {
            FlowState::Tcp(_) => self,
            FlowState::Sctp(s) => {
                let closing = flags.contains(TcpFlags::RST) || flags.contains(TcpFlags::FIN);
                if closing {
                    FlowState::Sctp(SctpState::Closing)
                } else if flags.contains(TcpFlags::SYN) {
                    FlowState::Sctp(SctpState::Established)
                } else {
                    FlowState::Sctp(s)
                }
            }
            s => s,
        }
    }

    /// IPVS "active": an established TCP connection. Everything else live is "inactive".
    pub fn is_active(self) -> bool {
        self == FlowState::Tcp(TcpState::Established)
    }

    /// A TCP connection whose handshake has not completed: the first to be recycled when the
    /// table is full (a SYN flood must not push out established connections).
    pub fn is_embryonic(self) -> bool {
        matches!(
            self,
            FlowState::Tcp(
                TcpState::None
                    | TcpState::SynSent
                    | TcpState::SynRecv
                    | TcpState::SynAck
                    | TcpState::Listen
            )
        )
    }

    /// Compact encoding stored in the entry's control word.
    pub fn to_u8(self) -> u8 {
        match self {
            FlowState::Tcp(s) => s as u8,
            FlowState::Udp => 16,
            FlowState::Icmp => 17,
            FlowState::Sctp(SctpState::Established) => 18,
            FlowState::Sctp(SctpState::Closing) => 19,
        }
    }

    /// Inverse of [`FlowState::to_u8`]; unknown codes (never stored) decode as TCP CLOSE.
    pub(crate) fn from_u8(v: u8) -> FlowState {
        match v {
            0..=10 => FlowState::Tcp(TCP_STATES[usize::from(v)]),
            16 => FlowState::Udp,
            17 => FlowState::Icmp,
            18 => FlowState::Sctp(SctpState::Established),
            19 => FlowState::Sctp(SctpState::Closing),
            _ => FlowState::Tcp(TcpState::Close),
        }
    }
}

/// Number of distinct [`FlowState::to_u8`] codes (size of the per-state timeout table).
pub(crate) const STATE_CODES: usize = 20;

/// Idle timeouts per state. Defaults are IPVS's (and the issue's): TCP established 900 s,
/// SYN states 60 s, FIN_WAIT 120 s, CLOSE_WAIT 60 s, LAST_ACK 30 s, TIME_WAIT 120 s, CLOSE 10 s;
/// UDP 300 s; ICMP 60 s; SCTP established 900 s, closing 10 s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP ESTABLISHED.
    pub tcp_established: Duration,
    /// TCP SYN_SENT (and LISTEN).
    pub tcp_syn_sent: Duration,
    /// TCP SYN_RECV and SYN-ACK.
    pub tcp_syn_recv: Duration,
    /// Every embryonic TCP state while the table is under pressure (nearly full, or embryonic
    /// flows had to give way recently): IPVS's `secure_tcp` idea, half-open flows of a SYN
    /// flood leave quickly while established ones keep their timeouts.
    pub tcp_syn_pressure: Duration,
    /// TCP FIN_WAIT.
    pub tcp_fin_wait: Duration,
    /// TCP CLOSE_WAIT.
    pub tcp_close_wait: Duration,
    /// TCP LAST_ACK.
    pub tcp_last_ack: Duration,
    /// TCP TIME_WAIT.
    pub tcp_time_wait: Duration,
    /// TCP CLOSE (and NONE).
    pub tcp_close: Duration,
    /// UDP flows.
    pub udp: Duration,
    /// ICMP / ICMPv6 echo flows.
    pub icmp: Duration,
    /// SCTP established associations.
    pub sctp_established: Duration,
    /// SCTP associations after ABORT/SHUTDOWN.
    pub sctp_closing: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        let s = Duration::from_secs;
        Timeouts {
            tcp_established: s(900),
            tcp_syn_sent: s(60),
            tcp_syn_recv: s(60),
            tcp_syn_pressure: s(3),
            tcp_fin_wait: s(120),
            tcp_close_wait: s(60),
            tcp_last_ack: s(30),
            tcp_time_wait: s(120),
            tcp_close: s(10),
            udp: s(300),
            icmp: s(60),
            sctp_established: s(900),
            sctp_closing: s(10),
        }
    }
}

impl Timeouts {
    /// The idle timeout of a flow in `state`.
    pub fn for_state(&self, state: FlowState) -> Duration {
        match state {
            FlowState::Tcp(t) => match t {
                TcpState::Established => self.tcp_established,
                TcpState::SynSent | TcpState::Listen => self.tcp_syn_sent,
                TcpState::SynRecv | TcpState::SynAck => self.tcp_syn_recv,
                TcpState::FinWait => self.tcp_fin_wait,
                TcpState::CloseWait => self.tcp_close_wait,
                TcpState::LastAck => self.tcp_last_ack,
                TcpState::TimeWait => self.tcp_time_wait,
                TcpState::Close | TcpState::None => self.tcp_close,
            },
            FlowState::Udp => self.udp,
            FlowState::Icmp => self.icmp,
            FlowState::Sctp(SctpState::Established) => self.sctp_established,
            FlowState::Sctp(SctpState::Closing) => self.sctp_closing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Direction::{Original as In, Reply as Out};

    const S: TcpFlags = TcpFlags::SYN;
    const A: TcpFlags = TcpFlags::ACK;
    const F: TcpFlags = TcpFlags(0x11); // FIN|ACK
    const R: TcpFlags = TcpFlags::RST;
    const SA_: TcpFlags = TcpFlags(0x12); // SYN|ACK

    fn run(steps: &[(Direction, TcpFlags, TcpState)]) {
        let mut s = FlowState::initial(Protocol::Tcp, steps[0].1);
        assert_eq!(s, FlowState::Tcp(steps[0].2), "first packet");
        for (i, &(dir, flags, want)) in steps.iter().enumerate().skip(1) {
            s = s.next(dir, flags);
            assert_eq!(s, FlowState::Tcp(want), "step {i}: {dir:?} {flags:?}");
        }
    }

    #[test]
    fn handshake_and_client_close() {
        run(&[
            (In, S, SR),
            (Out, SA_, SR),
            (In, A, ES),
            (In, A, ES),
            (Out, A, ES),
            (In, F, CW),
            (Out, A, CW),
            (Out, F, TW),
            (In, A, TW),
        ]);
    }

    #[test]
    fn server_close_first() {
        run(&[
            (In, S, SR),
            (Out, SA_, SR),
            (In, A, ES),
            (Out, F, FW),
            (In, A, FW),
            (In, F, TW),
        ]);
    }

    #[test]
    fn resets() {
        run(&[(In, S, SR), (In, R, SR)]); // IPVS ignores a client RST during SYN_RECV
        run(&[(In, S, SR), (Out, R, CL)]); // backend refuses
        run(&[(In, S, SR), (Out, SA_, SR), (In, A, ES), (In, R, CL)]);
        run(&[(In, S, SR), (Out, SA_, SR), (In, A, ES), (Out, R, CL)]);
        run(&[
            (In, S, SR),
            (Out, SA_, SR),
            (In, A, ES),
            (Out, F, FW),
            (Out, R, CL),
        ]);
    }

    #[test]
    fn odd_first_packets_and_reopen() {
        run(&[(In, A, CL), (Out, A, CL), (In, S, SR)]); // mid-stream pickup, then reuse
        run(&[(In, F, CL)]);
        run(&[(In, R, CL)]);
        run(&[(In, TcpFlags::NONE, CL)]);
        run(&[
            (In, S, SR),
            (Out, SA_, SR),
            (In, A, ES),
            (In, TcpFlags::NONE, CL),
        ]);
        // TIME_WAIT reopened by a new SYN (port reuse), as in IPVS.
        run(&[
            (In, S, SR),
            (Out, SA_, SR),
            (In, A, ES),
            (In, F, CW),
            (Out, F, TW),
            (In, S, SR),
        ]);
    }

    #[test]
    fn every_cell_of_the_ipvs_table() {
        // Spot the table against the kernel's rows, one cell per (dir, event) from each state.
        for (si, &st) in TCP_STATES.iter().enumerate() {
            for (d, dir) in [In, Out].into_iter().enumerate() {
                for (e, fl) in [S, TcpFlags::FIN, A, R].into_iter().enumerate() {
                    assert_eq!(st.next(dir, fl), TCP_NEXT[d][e][si]);
                }
            }
        }
        assert_eq!(SS.next(In, S), ES);
        assert_eq!(LA.next(In, A), CL);
        assert_eq!(LA.next(Out, A), LA);
        assert_eq!(TcpState::SynAck.next(In, A), ES);
        assert_eq!(LI.next(Out, A), ES);
        assert_eq!(CW.next(Out, F), TW);
        assert_eq!(TcpState::None.next(Out, S), SS);
    }

    /// The client's packets alone take a one-way flow from SYN_RECV to ESTABLISHED and, by
    /// its FIN, to FIN_WAIT (IPVS's input-only rows), where the input rows would leave it
    /// waiting in CLOSE_WAIT for a backend FIN that never comes by.
    #[test]
    fn one_way_flows_follow_the_input_only_rows() {
        let one_way = |steps: &[(TcpFlags, TcpState)]| {
            let mut s = FlowState::initial(Protocol::Tcp, steps[0].0);
            assert_eq!(s, FlowState::Tcp(steps[0].1), "first packet");
            for (i, &(f, want)) in steps.iter().enumerate().skip(1) {
                s = s.next_one_way(f);
                assert_eq!(s, FlowState::Tcp(want), "step {i}: {f:?}");
            }
        };
        one_way(&[(S, SR), (A, ES), (A, ES), (F, FW), (A, FW), (F, FW)]);
        one_way(&[(S, SR), (A, ES), (R, CL)]);
        one_way(&[(S, SR), (S, SR), (A, ES), (F, FW), (S, SR)]);
        assert_eq!(ES.next(In, F), CW, "the input rows differ there");
        assert_eq!(FW.next(In, F), TW);
        assert_eq!(TcpState::SynAck.next_one_way(R), CL);
        // The rows agree on a new flow's first packet (the insert reads the input rows).
        for f in 0..=u8::MAX {
            assert_eq!(
                TcpState::None.next_one_way(TcpFlags(f)),
                TcpState::None.next(In, TcpFlags(f)),
                "{f:#x}"
            );
        }
        // Every cell, against the kernel's third block.
        for (si, &st) in TCP_STATES.iter().enumerate() {
            for (e, fl) in [S, TcpFlags::FIN, A, R].into_iter().enumerate() {
                assert_eq!(st.next_one_way(fl), TCP_NEXT[INPUT_ONLY][e][si]);
            }
        }
        let u = FlowState::initial(Protocol::Udp, A);
        assert_eq!(u.next_one_way(R), FlowState::Udp);
        let c = FlowState::initial(Protocol::Sctp, S).next_one_way(TcpFlags::FIN);
        assert_eq!(c, FlowState::Sctp(SctpState::Closing));
    }

    #[test]
    fn codes_round_trip_and_timeouts() {
        let t = Timeouts::default();
        let all = TCP_STATES.iter().map(|&s| FlowState::Tcp(s)).chain([
            FlowState::Udp,
            FlowState::Icmp,
            FlowState::Sctp(SctpState::Established),
            FlowState::Sctp(SctpState::Closing),
        ]);
        for s in all {
            assert_eq!(FlowState::from_u8(s.to_u8()), s);
            assert!(usize::from(s.to_u8()) < STATE_CODES);
            assert!(t.for_state(s) >= Duration::from_secs(10));
        }
        assert_eq!(t.for_state(FlowState::Tcp(ES)).as_secs(), 900);
        assert_eq!(t.for_state(FlowState::Tcp(SR)).as_secs(), 60);
        assert_eq!(t.for_state(FlowState::Tcp(TW)).as_secs(), 120);
        assert_eq!(t.for_state(FlowState::Tcp(CL)).as_secs(), 10);
        assert_eq!(t.for_state(FlowState::Udp).as_secs(), 300);
    }

    #[test]
    fn sctp_and_datagram_models() {
        let s = FlowState::initial(Protocol::Sctp, S);
        assert_eq!(s, FlowState::Sctp(SctpState::Established));
        let c = s.next(Out, TcpFlags::FIN);
        assert_eq!(c, FlowState::Sctp(SctpState::Closing));
        assert_eq!(c.next(In, TcpFlags::NONE), c);
        assert_eq!(s.next(In, R), c);
        assert_eq!(c.next(In, S), s);
        assert_eq!(
            FlowState::initial(Protocol::Udp, S).next(Out, R),
            FlowState::Udp
        );
        assert_eq!(FlowState::initial(Protocol::Icmpv6, A), FlowState::Icmp);
        assert!(FlowState::Tcp(ES).is_active() && !FlowState::Udp.is_active());
        assert!(FlowState::Tcp(SR).is_embryonic() && !FlowState::Tcp(CL).is_embryonic());
    }
}
