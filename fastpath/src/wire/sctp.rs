//! SCTP common header and the first chunk header.
//!
//! The checksum is CRC32c (RFC 9260 appendix A) over the whole packet with the checksum field
//! zeroed, stored in the byte order of the reflected CRC (little-endian on the wire, Linux's
//! `__le32 checksum`). It covers no pseudo-header, so address rewrites leave it alone; port
//! rewrites need [`SctpPacket::fill_checksum`], there is no incremental form.

use vocab::sctp;

use super::{Error, Field, Result, read_u16, read_u32, write_u16, write_u32};

mod field {
    use super::Field;
    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const VERIFICATION_TAG: Field = 4..8;
    pub const CHECKSUM: Field = 8..12;
    pub const CHUNK_TYPE: usize = 12;
    pub const CHUNK_FLAGS: usize = 13;
    pub const CHUNK_LENGTH: Field = 14..16;
}

/// Length of the common header.
pub const HEADER_LEN: usize = 12;
/// Length of a chunk header.
pub const CHUNK_HEADER_LEN: usize = 4;

/// Chunk types the load balancer cares about (their numbers: `vocab::sctp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SctpChunkType {
    /// 0
    Data,
    /// 1
    Init,
    /// 2
    InitAck,
    /// 6
    Abort,
    /// 7
    Shutdown,
    /// 8
    ShutdownAck,
    /// 10
    CookieEcho,
    /// 11
    CookieAck,
    /// 14
    ShutdownComplete,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for SctpChunkType {
    #[inline]
    fn from(value: u8) -> Self {
        match value {
            sctp::DATA => SctpChunkType::Data,
            sctp::INIT => SctpChunkType::Init,
            sctp::INIT_ACK => SctpChunkType::InitAck,
            sctp::ABORT => SctpChunkType::Abort,
            sctp::SHUTDOWN => SctpChunkType::Shutdown,
            sctp::SHUTDOWN_ACK => SctpChunkType::ShutdownAck,
            sctp::COOKIE_ECHO => SctpChunkType::CookieEcho,
            sctp::COOKIE_ACK => SctpChunkType::CookieAck,
            sctp::SHUTDOWN_COMPLETE => SctpChunkType::ShutdownComplete,
            other => SctpChunkType::Unknown(other),
        }
    }
}

impl From<SctpChunkType> for u8 {
    #[inline]
    fn from(value: SctpChunkType) -> Self {
        match value {
            SctpChunkType::Data => sctp::DATA,
            SctpChunkType::Init => sctp::INIT,
            SctpChunkType::InitAck => sctp::INIT_ACK,
            SctpChunkType::Abort => sctp::ABORT,
            SctpChunkType::Shutdown => sctp::SHUTDOWN,
            SctpChunkType::ShutdownAck => sctp::SHUTDOWN_ACK,
            SctpChunkType::CookieEcho => sctp::COOKIE_ECHO,
            SctpChunkType::CookieAck => sctp::COOKIE_ACK,
            SctpChunkType::ShutdownComplete => sctp::SHUTDOWN_COMPLETE,
            SctpChunkType::Unknown(other) => other,
        }
    }
}

/// A view of an SCTP packet.
#[derive(Debug, Clone)]
pub struct SctpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> SctpPacket<T> {
    /// Wraps a buffer without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        SctpPacket { buffer }
    }

    /// Wraps untrusted bytes and runs [`Self::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the common header. Chunks are optional here: the chunk accessors return
    /// `None` when there is none.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::SRC_PORT.start)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::DST_PORT.start)
    }

    /// Verification tag (0 in INIT).
    #[inline]
    pub fn verification_tag(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::VERIFICATION_TAG.start)
    }

    /// The checksum as a CRC32c value (decoded from its little-endian wire order).
    #[inline]
    pub fn checksum(&self) -> u32 {
        let d = &self.buffer.as_ref()[field::CHECKSUM];
        u32::from_le_bytes([d[0], d[1], d[2], d[3]])
    }

    /// The CRC32c of the packet with the checksum field taken as zero.
    #[inline]
    pub fn compute_checksum(&self) -> u32 {
        let d = self.buffer.as_ref();
        let crc = crc32c::crc32c(&d[..field::CHECKSUM.start]);
        let crc = crc32c::crc32c_append(crc, &[0; 4]);
        crc32c::crc32c_append(crc, &d[field::CHECKSUM.end..])
    }

    /// Whether the checksum is right.
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        self.compute_checksum() == self.checksum()
    }

    /// Type of the first chunk, if the packet holds a chunk header.
    #[inline]
    pub fn first_chunk_type(&self) -> Option<SctpChunkType> {
        let d = self.buffer.as_ref();
        (d.len() >= HEADER_LEN + CHUNK_HEADER_LEN)
            .then(|| SctpChunkType::from(d[field::CHUNK_TYPE]))
    }

    /// Flags of the first chunk.
    #[inline]
    pub fn first_chunk_flags(&self) -> Option<u8> {
        let d = self.buffer.as_ref();
        (d.len() >= HEADER_LEN + CHUNK_HEADER_LEN).then(|| d[field::CHUNK_FLAGS])
    }

    /// Length field of the first chunk.
    #[inline]
    pub fn first_chunk_len(&self) -> Option<u16> {
        let d = self.buffer.as_ref();
        (d.len() >= HEADER_LEN + CHUNK_HEADER_LEN).then(|| read_u16(d, field::CHUNK_LENGTH.start))
    }

    /// An INIT: starts a new association (the SYN of SCTP).
    #[inline]
    pub fn is_init(&self) -> bool {
        self.first_chunk_type() == Some(SctpChunkType::Init)
    }

    /// Everything after the common header (the chunks).
    #[inline]
    pub fn chunks(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SctpPacket<T> {
    /// Sets the source port; follow with [`Self::fill_checksum`].
    #[inline]
    pub fn set_src_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::SRC_PORT.start, value);
    }

    /// Sets the destination port; follow with [`Self::fill_checksum`].
    #[inline]
    pub fn set_dst_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::DST_PORT.start, value);
    }

    /// Sets the verification tag.
    #[inline]
    pub fn set_verification_tag(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::VERIFICATION_TAG.start, value);
    }

    /// Stores a CRC32c value in wire order.
    #[inline]
    pub fn set_checksum(&mut self, value: u32) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&value.to_le_bytes());
    }

    /// Recomputes the CRC32c.
    #[inline]
    pub fn fill_checksum(&mut self) {
        let crc = self.compute_checksum();
        self.set_checksum(crc);
    }

    /// Rewrites both ports and recomputes the CRC32c once.
    #[inline]
    pub fn set_ports_and_fill_checksum(&mut self, src_port: u16, dst_port: u16) {
        self.set_src_port(src_port);
        self.set_dst_port(dst_port);
        self.fill_checksum();
    }

    /// The mutable chunks.
    #[inline]
    pub fn chunks_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built INIT, 38000 -> 36412, checksum field zero. The expected CRC comes from an
    /// independent bitwise CRC32c below.
    const INIT: [u8; 32] = [
        0x94, 0x70, 0x8e, 0x3c, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x00, 0x00, 0x14, 0x11, 0x22, 0x33,
        0x44, 0x00, 0x01, 0xa0, 0x00, 0x00, 0x0a, 0xff, 0xff, 0x55, 0x66, 0x77, 0x88,
    ];

    /// Bitwise reflected CRC32c (polynomial 0x82f63b78), independent of the crc32c crate.
    fn crc32c_bitwise(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for b in data {
            crc ^= u32::from(*b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn crc32c_check_value() {
        // The standard CRC-32C check value.
        assert_eq!(crc32c_bitwise(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn parse_and_checksum_init() {
        let mut buf = INIT;
        let mut p = SctpPacket::new_checked(&mut buf[..]).unwrap();
        assert_eq!(
            (p.src_port(), p.dst_port(), p.verification_tag()),
            (38000, 36412, 0)
        );
        assert!(p.is_init());
        assert_eq!(p.first_chunk_len(), Some(20));
        assert_eq!(p.first_chunk_flags(), Some(0));
        assert!(!p.verify_checksum());
        p.fill_checksum();
        assert!(p.verify_checksum());
        let expect = crc32c_bitwise(&INIT);
        assert_eq!(
            &buf[8..12],
            &expect.to_le_bytes(),
            "reflected CRC is stored LSB first"
        );

        let mut p = SctpPacket::new_checked(&mut buf[..]).unwrap();
        p.set_ports_and_fill_checksum(1, 2);
        assert!(p.verify_checksum());
        p.set_dst_port(3);
        assert!(!p.verify_checksum());
        p.fill_checksum();
        assert!(p.verify_checksum());
    }

    #[test]
    fn short_packets() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                SctpPacket::new_checked(&INIT[..n]).unwrap_err(),
                Error::Truncated
            );
        }
        let p = SctpPacket::new_checked(&INIT[..14]).unwrap();
        assert_eq!(p.first_chunk_type(), None);
        assert!(!p.is_init());
        assert_eq!(u8::from(SctpChunkType::from(99)), 99);
    }
}
