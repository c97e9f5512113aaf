//! pcapng files (the format of Wireshark, dumpcap and `tshark`): enough to replay them.
//!
//! Reads Section Header, Interface Description, Enhanced Packet, Simple Packet and the
//! obsolete Packet blocks, in either byte order (each section declares its own), with any
//! number of sections and interfaces of different link types. Every other block (name
//! resolution, interface statistics, decryption secrets, custom) is skipped without being
//! held in memory. Timestamps honour each interface's `if_tsresol` (powers of 10 or 2) and
//! `if_tsoffset`; a Simple Packet block has no timestamp and takes the previous packet's.
//! Every length is checked against the block holding it: a corrupt file is an error, never a
//! panic or an allocation larger than [`BLOCK_LEN_MAX`].

use std::io::{self, Read};
use std::time::Duration;

use super::{PcapError, RECORD_LEN_MAX, Record, Resolution, read_full};

/// Block type of a Section Header block (a palindrome: the same in either byte order).
pub const BLOCK_SHB: u32 = 0x0a0d_0d0a;
/// Interface Description block.
pub const BLOCK_IDB: u32 = 1;
/// Obsolete Packet block.
pub const BLOCK_PB: u32 = 2;
/// Simple Packet block.
pub const BLOCK_SPB: u32 = 3;
/// Enhanced Packet block.
pub const BLOCK_EPB: u32 = 6;
/// The byte-order magic of a Section Header block.
pub const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;
/// Largest block we read into memory (a packet of [`RECORD_LEN_MAX`] and its options);
/// longer blocks of the types we skip are skipped without being read into memory.
pub const BLOCK_LEN_MAX: u32 = RECORD_LEN_MAX + 64 * 1024;
/// Most interfaces one section may describe.
pub const INTERFACES_MAX: usize = 65_536;

/// `if_tsresol`.
const OPT_IF_TSRESOL: u16 = 9;
/// `if_tsoffset`.
const OPT_IF_TSOFFSET: u16 = 14;

/// What a packet's timestamp counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TsUnit {
    /// 10^-n seconds.
    Dec(u8),
    /// 2^-n seconds.
    Bin(u8),
}

/// One Interface Description block of the current section.
#[derive(Clone, Copy, Debug)]
struct Interface {
    linktype: u32,
    snaplen: u32,
    unit: TsUnit,
    offset_s: i64,
}

/// One packet: its interface's link type and the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NgPacket {
    /// The link type of the interface it was captured on.
    pub linktype: u32,
    /// Timestamp, lengths and bytes.
    pub record: Record,
}

/// Reads packets from a pcapng stream.
#[derive(Debug)]
pub struct PcapNgReader<R: Read> {
    inner: R,
    big_endian: bool,
    interfaces: Vec<Interface>,
    /// 0-based index of the next block, for error messages.
    block: u64,
    /// The last packet's timestamp, for Simple Packet blocks.
    last_ts: Duration,
    /// The first interface's resolution, for an output capture.
    resolution: Resolution,
    buf: Vec<u8>,
}

fn bad(block: u64, what: impl Into<String>) -> PcapError {
    PcapError::BadBlock {
        block,
        what: what.into(),
    }
}

impl<R: Read> PcapNgReader<R> {
    /// Reads a stream whose first 4 bytes (the Section Header block's type) were already
    /// read by the caller, then every block up to the first interface description (so that
    /// [`resolution`](Self::resolution) is known).
    pub(super) fn with_type_read(inner: R) -> Result<Self, PcapError> {
        let mut r = PcapNgReader {
            inner,
            big_endian: false,
            interfaces: Vec::new(),
            block: 0,
            last_ts: Duration::ZERO,
            resolution: Resolution::Micros,
            buf: Vec::new(),
        };
        r.section_header()?;
        r.block += 1;
        while r.interfaces.is_empty() {
            match r.next_block()? {
                None => break,
                // Not reached: a packet block before any interface is an error.
                Some(Some(_)) => return Err(bad(r.block, "a packet before any interface")),
                Some(None) => {}
            }
        }
        if let Some(i) = r.interfaces.first() {
            r.resolution = match i.unit {
                TsUnit::Dec(n) if n <= 6 => Resolution::Micros,
                TsUnit::Bin(n) if n <= 20 => Resolution::Micros,
                _ => Resolution::Nanos,
            };
        }
        Ok(r)
    }

    /// The timestamp resolution of the first interface (micro- or nanoseconds).
    pub fn resolution(&self) -> Resolution {
        self.resolution
    }

    /// The next packet, `None` at a clean end of file.
    pub fn next_packet(&mut self) -> Result<Option<NgPacket>, PcapError> {
        loop {
            match self.next_block()? {
                None => return Ok(None),
                Some(Some(p)) => return Ok(Some(p)),
                Some(None) => {}
            }
        }
    }

    fn u16_at(&self, b: &[u8], at: usize) -> u16 {
        let v = [b[at], b[at + 1]];
        if self.big_endian {
            u16::from_be_bytes(v)
        } else {
            u16::from_le_bytes(v)
        }
    }

    fn u32_at(&self, b: &[u8], at: usize) -> u32 {
        let v = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if self.big_endian {
            u32::from_be_bytes(v)
        } else {
            u32::from_le_bytes(v)
        }
    }

    fn read_u32(&mut self, what: &'static str) -> Result<u32, PcapError> {
        let mut b = [0u8; 4];
        if !read_full(&mut self.inner, &mut b, what)? {
            return Err(PcapError::Truncated(what));
        }
        Ok(self.u32_at(&b, 0))
    }

    /// The rest of a Section Header block whose type was read: learns the byte order and
    /// forgets the previous section's interfaces.
    fn section_header(&mut self) -> Result<(), PcapError> {
        let mut b = [0u8; 8];
        if !read_full(&mut self.inner, &mut b, "section header")? {
            return Err(PcapError::Truncated("section header"));
        }
        let magic = [b[4], b[5], b[6], b[7]];
        self.big_endian = if u32::from_le_bytes(magic) == BYTE_ORDER_MAGIC {
            false
        } else if u32::from_be_bytes(magic) == BYTE_ORDER_MAGIC {
            true
        } else {
            return Err(bad(
                self.block,
                format!(
                    "section header without the byte-order magic (found {:#010x})",
                    u32::from_le_bytes(magic)
                ),
            ));
        };
        let len = self.u32_at(&b, 0);
        // type, length, magic, version (4), section length (8), trailing length.
        if !(28..=BLOCK_LEN_MAX).contains(&len) || !len.is_multiple_of(4) {
            return Err(bad(self.block, format!("section header length {len}")));
        }
        // Read so far: type, length, magic; the trailing length follows the body.
        self.read_body(len - 16, "section header")?;
        let major = self.u16_at(&self.buf, 0);
        if major != 1 {
            return Err(bad(
                self.block,
                format!("pcapng version {major} (only version 1 is defined)"),
            ));
        }
        self.trailer(len)?;
        self.interfaces.clear();
        Ok(())
    }

    /// Reads `n` body bytes into `self.buf`.
    fn read_body(&mut self, n: u32, what: &'static str) -> Result<(), PcapError> {
        self.buf.clear();
        self.buf.resize(n as usize, 0);
        if !read_full(&mut self.inner, &mut self.buf, what)? && n > 0 {
            return Err(PcapError::Truncated(what));
        }
        Ok(())
    }

    /// The trailing copy of the block's length.
    fn trailer(&mut self, len: u32) -> Result<(), PcapError> {
        let end = self.read_u32("block trailer")?;
        if end != len {
            return Err(bad(
                self.block,
                format!("trailing length {end} differs from the leading length {len}"),
            ));
        }
        Ok(())
    }

    /// One block: `None` at the end of the file, `Some(None)` for a block that is not a
    /// packet, `Some(Some(packet))` for a packet.
    fn next_block(&mut self) -> Result<Option<Option<NgPacket>>, PcapError> {
        let mut ty = [0u8; 4];
        if !read_full(&mut self.inner, &mut ty, "block header")? {
            return Ok(None);
        }
        let ty = self.u32_at(&ty, 0);
        let result = self.block_of_type(ty);
        self.block += 1;
        result.map(Some)
    }

    fn block_of_type(&mut self, ty: u32) -> Result<Option<NgPacket>, PcapError> {
        if ty == BLOCK_SHB {
            self.section_header()?;
            return Ok(None);
        }
        let len = self.read_u32("block header")?;
        if len < 12 || !len.is_multiple_of(4) {
            return Err(bad(
                self.block,
                format!("block type {ty:#x} of length {len}"),
            ));
        }
        let parsed = matches!(ty, BLOCK_IDB | BLOCK_PB | BLOCK_SPB | BLOCK_EPB);
        if !parsed {
            let skip = u64::from(len - 12);
            let n = io::copy(&mut (&mut self.inner).take(skip), &mut io::sink())?;
            if n != skip {
                return Err(PcapError::Truncated("block"));
            }
            self.trailer(len)?;
            return Ok(None);
        }
        if len > BLOCK_LEN_MAX {
            return Err(bad(
                self.block,
                format!("block type {ty:#x} of length {len} (at most {BLOCK_LEN_MAX})"),
            ));
        }
        self.read_body(len - 12, "block body")?;
        self.trailer(len)?;
        match ty {
            BLOCK_IDB => self.interface().map(|()| None),
            _ => self.packet(ty).map(Some),
        }
    }

    fn interface(&mut self) -> Result<(), PcapError> {
        let b = &self.buf;
        if b.len() < 8 {
            return Err(bad(
                self.block,
                "interface description shorter than 8 bytes",
            ));
        }
        if self.interfaces.len() >= INTERFACES_MAX {
            return Err(bad(
                self.block,
                format!("more than {INTERFACES_MAX} interfaces in one section"),
            ));
        }
        let mut i = Interface {
            linktype: u32::from(self.u16_at(b, 0)),
            snaplen: self.u32_at(b, 4),
            unit: TsUnit::Dec(6),
            offset_s: 0,
        };
        let mut at = 8;
        while at + 4 <= b.len() {
            let code = self.u16_at(b, at);
            let olen = usize::from(self.u16_at(b, at + 2));
            let value = at + 4;
            if code == 0 {
                break;
            }
            if value + olen > b.len() {
                return Err(bad(
                    self.block,
                    format!("interface option {code} runs past the block"),
                ));
            }
            match (code, olen) {
                (OPT_IF_TSRESOL, 1) => {
                    let v = b[value];
                    let n = v & 0x7f;
                    i.unit = if v & 0x80 == 0 {
                        // 10^19 still fits a u64 count; 10^-20 s could not be told apart.
                        if n > 19 {
                            return Err(bad(self.block, format!("if_tsresol 10^-{n}")));
                        }
                        TsUnit::Dec(n)
                    } else {
                        if n > 63 {
                            return Err(bad(self.block, format!("if_tsresol 2^-{n}")));
                        }
                        TsUnit::Bin(n)
                    };
                }
                (OPT_IF_TSOFFSET, 8) => {
                    let lo = u64::from(self.u32_at(b, value));
                    let hi = u64::from(self.u32_at(b, value + 4));
                    // An 8-byte option in the section's byte order.
                    let v = if self.big_endian {
                        (lo << 32) | hi
                    } else {
                        (hi << 32) | lo
                    };
                    i.offset_s = v as i64;
                }
                _ => {}
            }
            at = value + olen.next_multiple_of(4);
        }
        self.interfaces.push(i);
        Ok(())
    }

    fn iface(&self, id: u32) -> Result<Interface, PcapError> {
        self.interfaces.get(id as usize).copied().ok_or_else(|| {
            bad(
                self.block,
                format!(
                    "packet of interface {id}, but the section describes {}",
                    self.interfaces.len()
                ),
            )
        })
    }

    fn packet(&mut self, ty: u32) -> Result<NgPacket, PcapError> {
        let b = &self.buf;
        let (iface, ts, caplen, orig_len, data_at) = match ty {
            BLOCK_SPB => {
                if b.len() < 4 {
                    return Err(bad(self.block, "simple packet block shorter than 4 bytes"));
                }
                let iface = self.iface(0)?;
                let orig = self.u32_at(b, 0);
                let mut cap = orig.min((b.len() - 4) as u32);
                if iface.snaplen != 0 {
                    cap = cap.min(iface.snaplen);
                }
                (iface, self.last_ts, cap, orig, 4)
            }
            _ => {
                // EPB: interface (4), ts high, ts low, captured, original.
                // PB: interface (2), drops (2), then the same.
                if b.len() < 20 {
                    return Err(bad(self.block, "packet block shorter than 20 bytes"));
                }
                let id = if ty == BLOCK_EPB {
                    self.u32_at(b, 0)
                } else {
                    u32::from(self.u16_at(b, 0))
                };
                let iface = self.iface(id)?;
                let raw = (u64::from(self.u32_at(b, 4)) << 32) | u64::from(self.u32_at(b, 8));
                let ts = timestamp(raw, iface.unit, iface.offset_s);
                let (cap, orig) = (self.u32_at(b, 12), self.u32_at(b, 16));
                if cap as usize > b.len() - 20 {
                    return Err(bad(
                        self.block,
                        format!("captured length {cap} runs past the block"),
                    ));
                }
                (iface, ts, cap, orig, 20)
            }
        };
        if caplen > RECORD_LEN_MAX {
            return Err(PcapError::BadRecordLen {
                index: self.block,
                len: caplen,
            });
        }
        let data = b[data_at..data_at + caplen as usize].to_vec();
        self.last_ts = ts;
        Ok(NgPacket {
            linktype: iface.linktype,
            record: Record { ts, orig_len, data },
        })
    }
}

/// A count of `unit`s plus `offset_s` seconds, as a time since the Unix epoch (saturating
/// at 0 and at the largest [`Duration`]).
fn timestamp(count: u64, unit: TsUnit, offset_s: i64) -> Duration {
    let (secs, nanos) = match unit {
        TsUnit::Dec(n) => {
            let per_s = 10u64.pow(u32::from(n));
            let frac = u128::from(count % per_s) * 1_000_000_000 / u128::from(per_s);
            (count / per_s, frac as u32)
        }
        TsUnit::Bin(n) => {
            let frac = (u128::from(count & ((1u64 << n) - 1)) * 1_000_000_000) >> n;
            (count >> n, frac as u32)
        }
    };
    let secs = secs.saturating_add_signed(offset_s);
    Duration::new(secs, nanos)
}

#[cfg(test)]
mod tests {
    use super::super::CaptureReader;
    use super::*;

    /// Builds pcapng blocks in one byte order.
    struct Ng {
        be: bool,
        out: Vec<u8>,
    }

    impl Ng {
        fn u16(&self, v: u16) -> [u8; 2] {
            if self.be {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        }
        fn u32(&self, v: u32) -> [u8; 4] {
            if self.be {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        }
        fn block(&mut self, ty: u32, body: &[u8]) -> &mut Self {
            let mut body = body.to_vec();
            body.resize(body.len().next_multiple_of(4), 0);
            let len = body.len() as u32 + 12;
            let (t, l) = (self.u32(ty), self.u32(len));
            self.out.extend_from_slice(&t);
            self.out.extend_from_slice(&l);
            self.out.extend_from_slice(&body);
            self.out.extend_from_slice(&l);
            self
        }
        fn shb(&mut self) -> &mut Self {
            let mut b = self.u32(BYTE_ORDER_MAGIC).to_vec();
            b.extend_from_slice(&self.u16(1));
            b.extend_from_slice(&self.u16(0));
            b.extend_from_slice(&[0xff; 8]); // section length unknown
            // shb_userappl ("xvs"), then the end of options.
            b.extend_from_slice(&self.u16(4));
            b.extend_from_slice(&self.u16(3));
            b.extend_from_slice(b"xvs\0");
            b.extend_from_slice(&[0; 4]);
            self.block(BLOCK_SHB, &b)
        }
        fn idb(&mut self, linktype: u16, snaplen: u32, opts: &[(u16, &[u8])]) -> &mut Self {
            let mut b = self.u16(linktype).to_vec();
            b.extend_from_slice(&[0, 0]);
            b.extend_from_slice(&self.u32(snaplen));
            for (code, v) in opts {
                b.extend_from_slice(&self.u16(*code));
                b.extend_from_slice(&self.u16(v.len() as u16));
                b.extend_from_slice(v);
                b.resize(b.len().next_multiple_of(4), 0);
            }
            if !opts.is_empty() {
                b.extend_from_slice(&[0; 4]);
            }
            self.block(BLOCK_IDB, &b)
        }
        fn epb(&mut self, iface: u32, ts: u64, data: &[u8], orig: u32) -> &mut Self {
            let mut b = self.u32(iface).to_vec();
            b.extend_from_slice(&self.u32((ts >> 32) as u32));
            b.extend_from_slice(&self.u32(ts as u32));
            b.extend_from_slice(&self.u32(data.len() as u32));
            b.extend_from_slice(&self.u32(orig));
            b.extend_from_slice(data);
            b.resize(b.len().next_multiple_of(4), 0);
            // epb_flags (inbound), then the end of options.
            b.extend_from_slice(&self.u16(2));
            b.extend_from_slice(&self.u16(4));
            b.extend_from_slice(&self.u32(1));
            b.extend_from_slice(&[0; 4]);
            self.block(BLOCK_EPB, &b)
        }
        fn spb(&mut self, data: &[u8]) -> &mut Self {
            let mut b = self.u32(data.len() as u32).to_vec();
            b.extend_from_slice(data);
            self.block(BLOCK_SPB, &b)
        }
    }

    fn ng(be: bool) -> Ng {
        Ng {
            be,
            out: Vec::new(),
        }
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<NgPacket>, PcapError> {
        let mut r = CaptureReader::new(bytes)?;
        let mut v = Vec::new();
        while let Some(p) = r.next_packet()? {
            v.push(p);
        }
        Ok(v)
    }

    fn pkt(linktype: u32, ts: Duration, data: &[u8], orig: u32) -> NgPacket {
        NgPacket {
            linktype,
            record: Record {
                ts,
                orig_len: orig,
                data: data.to_vec(),
            },
        }
    }

    #[test]
    fn both_byte_orders_several_interfaces_and_skipped_blocks() {
        for be in [false, true] {
            let mut f = ng(be);
            f.shb()
                .block(0x0000_0bad, &[1, 2, 3, 4, 5, 6, 7, 8]) // custom block: skipped
                .idb(1, 0, &[(2, b"eth0"), (OPT_IF_TSRESOL, &[6])])
                .idb(276, 65535, &[(OPT_IF_TSRESOL, &[9]), (2, b"any")])
                .epb(0, 1_700_000_000_000_001, &[1, 2, 3, 4, 5], 5)
                .block(5, &[0; 16]) // interface statistics: skipped
                .epb(1, 1_700_000_001_000_000_007, &[9; 7], 70);
            let got = read_all(&f.out).unwrap();
            assert_eq!(
                got,
                vec![
                    pkt(1, Duration::new(1_700_000_000, 1_000), &[1, 2, 3, 4, 5], 5),
                    pkt(276, Duration::new(1_700_000_001, 7), &[9; 7], 70),
                ],
                "big endian: {be}"
            );
            let r = CaptureReader::new(&f.out[..]).unwrap();
            assert_eq!(r.resolution(), Resolution::Micros);
        }
    }

    #[test]
    fn sections_reset_interfaces_and_simple_packets_take_the_last_time() {
        let mut f = ng(false);
        f.shb()
            .idb(113, 4, &[(OPT_IF_TSRESOL, &[9])])
            .epb(0, 2_000_000_000, &[1], 1)
            .spb(&[1, 2, 3, 4, 5, 6]); // cut to the snap length 4
        let mut g = ng(true);
        g.shb().idb(101, 0, &[]).spb(&[7, 7, 7]);
        f.out.extend_from_slice(&g.out);
        assert_eq!(
            CaptureReader::new(&f.out[..]).unwrap().resolution(),
            Resolution::Nanos
        );
        assert_eq!(
            read_all(&f.out).unwrap(),
            vec![
                pkt(113, Duration::new(2, 0), &[1], 1),
                pkt(113, Duration::new(2, 0), &[1, 2, 3, 4], 6),
                pkt(101, Duration::new(2, 0), &[7, 7, 7], 3),
            ]
        );
    }

    /// Every truncation and every single-byte corruption of a valid file reads to an end or
    /// an error, never a panic.
    #[test]
    fn no_panic_on_damaged_files() {
        for be in [false, true] {
            let mut f = ng(be);
            f.shb()
                .idb(
                    1,
                    0,
                    &[(OPT_IF_TSRESOL, &[0x94]), (OPT_IF_TSOFFSET, &[1; 8])],
                )
                .epb(0, u64::MAX, &[1, 2, 3, 4, 5], 9)
                .spb(&[6; 6])
                .block(4, &[0; 8]);
            for n in 0..f.out.len() {
                let _ = read_all(&f.out[..n]);
            }
            for i in 0..f.out.len() {
                for v in [0x00, 0x7f, 0xff] {
                    let mut bad = f.out.clone();
                    bad[i] = v;
                    let _ = read_all(&bad);
                }
            }
        }
    }

    #[test]
    fn corrupt_files_are_errors() {
        let mut f = ng(false);
        f.shb().idb(1, 0, &[]).epb(1, 0, &[1], 1);
        let e = read_all(&f.out).unwrap_err().to_string();
        assert!(
            e.contains("packet of interface 1") && e.contains("block 2"),
            "{e}"
        );

        let mut f = ng(false);
        f.shb().epb(0, 0, &[1], 1);
        let e = read_all(&f.out).unwrap_err().to_string();
        assert!(
            e.contains("packet of interface 0, but the section describes 0"),
            "{e}"
        );

        let mut f = ng(false);
        f.shb().idb(1, 0, &[]).epb(0, 0, &[1, 2, 3], 3);
        let mut bad_len = f.out.clone();
        let n = bad_len.len();
        bad_len[n - 4] ^= 4;
        assert!(
            read_all(&bad_len)
                .unwrap_err()
                .to_string()
                .contains("trailing length")
        );
        let mut cut = f.out.clone();
        cut.truncate(n - 2);
        assert!(matches!(read_all(&cut), Err(PcapError::Truncated(_))));
        // A captured length past the block.
        let mut long = f.out.clone();
        let at = n - 4 - 12 - 4 - 8; // trailer, options, data, original length
        long[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        let e = read_all(&long).unwrap_err().to_string();
        assert!(e.contains("captured length 1000"), "{e}");

        let mut f = ng(false);
        f.shb();
        f.out[8] = 0; // byte-order magic
        let e = read_all(&f.out).unwrap_err().to_string();
        assert!(e.contains("byte-order magic"), "{e}");
        let mut f = ng(false);
        f.shb().idb(1, 0, &[(OPT_IF_TSRESOL, &[77])]);
        assert!(
            read_all(&f.out)
                .unwrap_err()
                .to_string()
                .contains("if_tsresol")
        );
        // Only a section header: no packets, no error.
        let mut f = ng(true);
        f.shb();
        assert_eq!(read_all(&f.out).unwrap(), vec![]);
    }

    #[test]
    fn timestamps_in_every_unit() {
        assert_eq!(
            timestamp(1_700_000_000_123_456, TsUnit::Dec(6), 0),
            Duration::new(1_700_000_000, 123_456_000)
        );
        assert_eq!(
            timestamp(1_700_000_000_123_456_789, TsUnit::Dec(9), 0),
            Duration::new(1_700_000_000, 123_456_789)
        );
        assert_eq!(
            timestamp(15, TsUnit::Dec(1), 0),
            Duration::new(1, 500_000_000)
        );
        assert_eq!(timestamp(1, TsUnit::Dec(0), -5), Duration::ZERO);
        assert_eq!(
            timestamp(3 << 20 | 1 << 19, TsUnit::Bin(20), 10),
            Duration::new(13, 500_000_000)
        );
        assert_eq!(timestamp(u64::MAX, TsUnit::Dec(19), 0).as_secs(), 1);
    }
}
