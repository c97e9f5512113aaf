//! SCTP chunk types (RFC 9260, section 3.2), and what the flow table makes of them.
//!
//! The flow table has one state machine for connections, TCP's: an SCTP packet is given to it
//! as the TCP flags its first chunk's type stands for ([`sctp_events`]). INIT opens an
//! association (SYN), ABORT resets it (RST), SHUTDOWN, SHUTDOWN ACK and SHUTDOWN COMPLETE
//! close it (FIN); every other chunk is no event.

use crate::TcpFlags;

/// DATA.
pub const DATA: u8 = 0;
/// INIT: opens an association.
pub const INIT: u8 = 1;
/// INIT ACK.
pub const INIT_ACK: u8 = 2;
/// ABORT: ends an association at once.
pub const ABORT: u8 = 6;
/// SHUTDOWN.
pub const SHUTDOWN: u8 = 7;
/// SHUTDOWN ACK.
pub const SHUTDOWN_ACK: u8 = 8;
/// COOKIE ECHO.
pub const COOKIE_ECHO: u8 = 10;
/// COOKIE ACK.
pub const COOKIE_ACK: u8 = 11;
/// SHUTDOWN COMPLETE.
pub const SHUTDOWN_COMPLETE: u8 = 14;

/// The flow-table events (as TCP flags) of an SCTP packet whose first chunk is of type
/// `chunk_type`: INIT → SYN, ABORT → RST, SHUTDOWN / SHUTDOWN ACK / SHUTDOWN COMPLETE → FIN,
/// anything else → none.
#[inline]
pub const fn sctp_events(chunk_type: u8) -> TcpFlags {
    match chunk_type {
        INIT => TcpFlags::SYN,
        ABORT => TcpFlags::RST,
        SHUTDOWN | SHUTDOWN_ACK | SHUTDOWN_COMPLETE => TcpFlags::FIN,
        _ => TcpFlags::NONE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_types_map_to_the_tcp_events_they_stand_for() {
        assert_eq!(sctp_events(INIT).bits(), 0x02);
        assert_eq!(sctp_events(ABORT).bits(), 0x04);
        for t in [SHUTDOWN, SHUTDOWN_ACK, SHUTDOWN_COMPLETE] {
            assert_eq!(sctp_events(t).bits(), 0x01);
        }
        for t in [DATA, INIT_ACK, COOKIE_ECHO, COOKIE_ACK, 3, 255] {
            assert_eq!(sctp_events(t), TcpFlags::NONE);
        }
        // Every event is one the state machine reads.
        for t in 0..=u8::MAX {
            assert_eq!(sctp_events(t).events(), sctp_events(t));
        }
    }
}
