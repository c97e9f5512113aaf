//! ARP, only as far as classifying it: the fastpath always passes ARP to the kernel.

use super::{Error, EtherType, Field, Result, read_u16};

mod field {
    use super::Field;
    pub const HTYPE: Field = 0..2;
    pub const PTYPE: Field = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Field = 6..8;
}

/// Length of the fixed part, before the addresses.
pub const HEADER_LEN: usize = 8;

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOperation {
    /// 1
    Request,
    /// 2
    Reply,
    /// Anything else.
    Unknown(u16),
}

impl From<u16> for ArpOperation {
    #[inline]
    fn from(value: u16) -> Self {
        match value {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            other => ArpOperation::Unknown(other),
        }
    }
}

impl From<ArpOperation> for u16 {
    #[inline]
    fn from(value: ArpOperation) -> Self {
        match value {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
            ArpOperation::Unknown(other) => other,
        }
    }
}

/// A view of an ARP packet with any address sizes.
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wraps a buffer without checking it.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    /// Wraps untrusted bytes and runs [`Self::check_len`].
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the fixed part and that all four addresses fit in the buffer.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let data = self.buffer.as_ref();
        if data.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if data.len() < HEADER_LEN + 2 * (self.hardware_len() + self.protocol_len()) {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Hardware type (1 for Ethernet).
    #[inline]
    pub fn hardware_type(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::HTYPE.start)
    }

    /// Protocol type (IPv4 for the ARP we see).
    #[inline]
    pub fn protocol_type(&self) -> EtherType {
        EtherType::from(read_u16(self.buffer.as_ref(), field::PTYPE.start))
    }

    /// Hardware address length.
    #[inline]
    pub fn hardware_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::HLEN])
    }

    /// Protocol address length.
    #[inline]
    pub fn protocol_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::PLEN])
    }

    /// Operation.
    #[inline]
    pub fn operation(&self) -> ArpOperation {
        ArpOperation::from(read_u16(self.buffer.as_ref(), field::OPER.start))
    }

    /// Ethernet/IPv4 ARP (hardware 1, protocol 0x0800, lengths 6 and 4).
    #[inline]
    pub fn is_ethernet_ipv4(&self) -> bool {
        self.hardware_type() == 1
            && self.protocol_type() == EtherType::Ipv4
            && self.hardware_len() == 6
            && self.protocol_len() == 4
    }

    /// Bytes `start..start + len`; in bounds after `check_len`.
    fn bytes(&self, start: usize, len: usize) -> &[u8] {
        &self.buffer.as_ref()[start..start + len]
    }

    /// Sender hardware address.
    pub fn source_hardware_addr(&self) -> &[u8] {
        self.bytes(HEADER_LEN, self.hardware_len())
    }

    /// Sender protocol address.
    pub fn source_protocol_addr(&self) -> &[u8] {
        self.bytes(HEADER_LEN + self.hardware_len(), self.protocol_len())
    }

    /// Target hardware address.
    pub fn target_hardware_addr(&self) -> &[u8] {
        let (h, p) = (self.hardware_len(), self.protocol_len());
        self.bytes(HEADER_LEN + h + p, h)
    }

    /// Target protocol address.
    pub fn target_protocol_addr(&self) -> &[u8] {
        let (h, p) = (self.hardware_len(), self.protocol_len());
        self.bytes(HEADER_LEN + 2 * h + p, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x02, 0, 0, 0, 0, 0x01, 198, 18, 0, 1, 0,
        0, 0, 0, 0, 0, 198, 18, 0, 2,
    ];

    #[test]
    fn request_fixture() {
        let p = ArpPacket::new_checked(&REQUEST[..]).unwrap();
        assert!(p.is_ethernet_ipv4());
        assert_eq!(p.operation(), ArpOperation::Request);
        assert_eq!(p.source_hardware_addr(), &[2, 0, 0, 0, 0, 1]);
        assert_eq!(p.source_protocol_addr(), &[198, 18, 0, 1]);
        assert_eq!(p.target_hardware_addr(), &[0; 6]);
        assert_eq!(p.target_protocol_addr(), &[198, 18, 0, 2]);
    }

    #[test]
    fn truncated_and_odd_lengths() {
        for n in 0..REQUEST.len() {
            assert_eq!(
                ArpPacket::new_checked(&REQUEST[..n]).unwrap_err(),
                Error::Truncated
            );
        }
        let mut big = REQUEST;
        big[4] = 255;
        assert_eq!(
            ArpPacket::new_checked(&big[..]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(u16::from(ArpOperation::from(7)), 7);
    }
}
