//! The state guard: a packet that would move a known flow's state must be one its receiver
//! would take, or it moves nothing.
//!
//! # Contract
//!
//! - **Which packets.** A TCP segment carrying SYN, FIN or RST that finds a flow
//!   ([`guarded`]): the packets that end a flow (RST), start its close (FIN) or reopen its
//!   tuple (a SYN on an ended flow, `reuse`). Everything else, every established data packet
//!   and pure ACK among them, pays one flag test, the one port reuse paid before. SCTP's
//!   state-moving chunks (ABORT, SHUTDOWN*, INIT) need nothing more: the general path
//!   verifies every SCTP packet's CRC32c before its lookup.
//! - **Checksum.** Its TCP checksum is verified (IPv4 and IPv6 pseudo-headers). A first
//!   fragment cannot be verified (its checksum covers the whole datagram): it is held as
//!   `fragment`.
//! - **RST window.** An RST must lie within the window of its direction's last sequence
//!   sample (`FlowTable::rst_window`: 1 MiB behind to 16 MiB ahead; before the reply
//!   direction's first sample, a backend's RST must acknowledge the client's sample). The
//!   samples are taken by the flow table's writers: the first packet of each 100 ms tick
//!   and every state change record their sequence number, so established packets that
//!   write nothing read nothing either. A flow with no sample to judge by (the SYN proxy's,
//!   one restored from an older record) takes the RST on its checksum alone.
//! - **Held.** A packet that fails is still forwarded, translated as its flow says (the
//!   receiver drops it, as it would have without xvs), but its flow's state and last-seen
//!   time stay as they were, and it is counted in `Counters::held` by [`HoldReason`]. So a
//!   spoofed RST, FIN or SYN can no longer end a client's flow in xvs or send its next SYN
//!   to another backend.
//!
//! Linux IPVS takes every RST (`set_tcp_state` moves the connection to CLOSE) and verifies
//! no checksum; Linux conntrack verifies checksums (`nf_conntrack_checksum`) and accepts an
//! RST only at the exact sequence number the peer last acknowledged, from window tracking
//! it updates on every packet (`tcp_in_window`). xvs samples instead of tracking, so that
//! the established path writes nothing; its window is wider than conntrack's and narrower
//! than IPVS's none (a blind attacker who knows the tuple hits it once in about 250 tries
//! instead of every time).

use flowtable::{Direction, FlowHandle, RstWindow};
use vocab::TcpFlags;

use super::Pipeline;
use crate::wire::checksum;

/// Whether a TCP packet with these flags that finds a flow goes through the guard: it
/// carries SYN, FIN or RST. (The pipeline calls it for UDP too, whose flags are 0.)
#[inline(always)]
pub(super) fn guarded(flags: u8) -> bool {
    flags & (TcpFlags::SYN.bits() | TcpFlags::FIN.bits() | TcpFlags::RST.bits()) != 0
}

macro_rules! hold_reasons {
    ($( $(#[doc = $doc:literal])* $variant:ident = $name:literal, )*) => {
        /// Why a packet of a known flow was forwarded without its state change; indexes
        /// [`Counters::held`](super::Counters::held).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum HoldReason {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl HoldReason {
            /// Every reason, in counter-index order.
            pub const ALL: &'static [HoldReason] = &[$(HoldReason::$variant,)*];
            /// Number of reasons (size of the counter array).
            pub const COUNT: usize = Self::ALL.len();

            /// A stable snake_case name (metrics label).
            pub const fn name(self) -> &'static str {
                match self {
                    $( HoldReason::$variant => $name, )*
                }
            }
        }
    };
}

hold_reasons! {
    /// Its TCP checksum is wrong.
    BadChecksum = "bad_checksum",
    /// An RST outside the window of its direction's last sequence sample.
    RstOutsideWindow = "rst_outside_window",
    /// A first fragment, whose checksum cannot be verified.
    Fragment = "fragment",
}

/// Where a guarded TCP segment is in its frame.
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the TCP header.
    pub l4: usize,
    /// TCP bytes (header and payload).
    pub l4_len: usize,
    /// IPv6?
    pub v6: bool,
    /// A first fragment (its payload is not all here).
    pub fragment: bool,
}

/// Whether the TCP segment `s` of `frame` has a correct checksum; `false` when it does not
/// lie within the frame.
fn checksum_ok(frame: &[u8], s: &Segment) -> bool {
    let Some(l4) = frame.get(s.l4..s.l4 + s.l4_len) else {
        return false;
    };
    let tcp = vocab::ip_proto::TCP;
    if s.v6 {
        let (Some(src), Some(dst)) = (
            frame.get(s.l3 + 8..s.l3 + 24),
            frame.get(s.l3 + 24..s.l3 + 40),
        ) else {
            return false;
        };
        let (src, dst) = (
            src.try_into().unwrap_or([0; 16]),
            dst.try_into().unwrap_or([0; 16]),
        );
        checksum::l4_checksum_v6(&src, &dst, tcp, l4) == 0
    } else {
        let (Some(src), Some(dst)) = (
            frame.get(s.l3 + 12..s.l3 + 16),
            frame.get(s.l3 + 16..s.l3 + 20),
        ) else {
            return false;
        };
        let (src, dst) = (
            src.try_into().unwrap_or([0; 4]),
            dst.try_into().unwrap_or([0; 4]),
        );
        checksum::l4_checksum_v4(&src, &dst, tcp, l4) == 0
    }
}

/// The big-endian word at `at` of `frame`, 0 past its end.
#[inline(always)]
pub(super) fn word_at(frame: &[u8], at: usize) -> u32 {
    match frame.get(at..at + 4) {
        Some(b) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        None => 0,
    }
}

impl Pipeline {
    /// The guard's verdict on TCP segment `s` of `frame` (flags `flags`), a packet of flow
    /// `h` in direction `dir`: `None` when it may move the flow's state, else why not (the
    /// caller counts it as it forwards it). Reads only.
    #[cold]
    #[inline(never)]
    pub(super) fn guard(
        &self,
        frame: &[u8],
        s: &Segment,
        flags: u8,
        h: FlowHandle,
        dir: Direction,
    ) -> Option<HoldReason> {
        if s.fragment {
            Some(HoldReason::Fragment)
        } else if !checksum_ok(frame, s) {
            Some(HoldReason::BadChecksum)
        } else if TcpFlags(flags).contains(TcpFlags::RST) {
            let seq = word_at(frame, s.l4 + 4);
            let ack = TcpFlags(flags)
                .contains(TcpFlags::ACK)
                .then(|| word_at(frame, s.l4 + 8));
            (self.flows.rst_window(h, dir, seq, ack) == RstWindow::Outside)
                .then_some(HoldReason::RstOutsideWindow)
        } else {
            None
        }
    }
}
