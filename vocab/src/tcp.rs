//! TCP header flags.
//!
//! Test what a packet means through the methods, not a mask of the raw byte: a SYN is
//! `TcpFlags(f).handshake() == TcpFlags::SYN` (a SYN-ACK `== TcpFlags::SYN | TcpFlags::ACK`),
//! a pure ACK `events() == TcpFlags::ACK`.

/// TCP header flag bits as they appear in the header's flags byte (pass the byte as is). The
/// one definition: the flow table's state machine (`flowtable::TcpFlags`), the wire views
/// (`fastpath::wire::TcpFlags`) and the pipeline use it. SCTP packets are given to the flow
/// table as the flags [`sctp_events`](crate::sctp_events) maps their chunk type to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// No flags (UDP, ICMP, or a TCP packet with no flag set).
    pub const NONE: TcpFlags = TcpFlags(0);
    /// FIN: no more data from the sender.
    pub const FIN: TcpFlags = TcpFlags(0x01);
    /// SYN: synchronise sequence numbers.
    pub const SYN: TcpFlags = TcpFlags(0x02);
    /// RST: reset the connection.
    pub const RST: TcpFlags = TcpFlags(0x04);
    /// PSH.
    pub const PSH: TcpFlags = TcpFlags(0x08);
    /// ACK: the acknowledgement field is significant.
    pub const ACK: TcpFlags = TcpFlags(0x10);
    /// URG: the urgent pointer is significant.
    pub const URG: TcpFlags = TcpFlags(0x20);
    /// ECE: ECN echo.
    pub const ECE: TcpFlags = TcpFlags(0x40);
    /// CWR: congestion window reduced.
    pub const CWR: TcpFlags = TcpFlags(0x80);

    /// No flags.
    #[inline]
    pub const fn empty() -> Self {
        TcpFlags(0)
    }

    /// The raw byte.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The bits that say which step of a handshake a segment is (SYN, RST, ACK): a client's
    /// SYN is `handshake() == SYN`, a SYN-ACK `SYN | ACK`, a plain ACK `ACK`.
    #[inline]
    pub const fn handshake(self) -> TcpFlags {
        TcpFlags(self.0 & (Self::SYN.0 | Self::RST.0 | Self::ACK.0))
    }

    /// The bits the flow table's state machine reads, IPVS's events (FIN, SYN, RST, ACK):
    /// a pure ACK is `events() == ACK`; a segment that may open a connection again (and
    /// an SCTP INIT) `events() == SYN`.
    #[inline]
    pub const fn events(self) -> TcpFlags {
        TcpFlags(self.0 & (Self::FIN.0 | Self::SYN.0 | Self::RST.0 | Self::ACK.0))
    }

    /// Whether every bit of `other` is set in `self`.
    #[inline]
    pub const fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any bit of `other` is set in `self`.
    #[inline]
    pub const fn intersects(self, other: TcpFlags) -> bool {
        self.0 & other.0 != 0
    }
}

impl std::ops::BitOr for TcpFlags {
    type Output = TcpFlags;
    #[inline]
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for TcpFlags {
    #[inline]
    fn bitor_assign(&mut self, rhs: TcpFlags) {
        self.0 |= rhs.0;
    }
}

impl std::ops::BitAnd for TcpFlags {
    type Output = TcpFlags;
    #[inline]
    fn bitand(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 & rhs.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masks_are_the_header_bits() {
        assert_eq!(TcpFlags::SYN.bits(), 0x02);
        assert_eq!((TcpFlags::SYN | TcpFlags::ACK).bits(), 0x12);
        for f in 0..=u8::MAX {
            let f = TcpFlags(f);
            assert_eq!(f.handshake().bits(), f.bits() & 0x16);
            assert_eq!(f.events().bits(), f.bits() & 0x17);
            assert_eq!(
                f.contains(TcpFlags::SYN | TcpFlags::ACK),
                f.bits() & 0x12 == 0x12
            );
        }
        let psh_ack = TcpFlags::PSH | TcpFlags::ACK;
        assert_eq!(psh_ack.events(), TcpFlags::ACK);
        assert_eq!((TcpFlags::SYN | TcpFlags::ECE).events(), TcpFlags::SYN);
        assert!(psh_ack.intersects(TcpFlags::ACK | TcpFlags::FIN));
        assert_eq!(TcpFlags::empty(), TcpFlags::NONE);
    }
}
