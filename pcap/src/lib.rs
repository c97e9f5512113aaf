//! Capture files: enough for `xvs pcap` to replay a capture through the pipeline and write
//! what it transmits, and for tests to build and read captures. A leaf crate (no xvs
//! dependency): the replay itself is the CLI's (`src/pcap/replay.rs` in the root crate).
//!
//! Reads classic pcap ([`PcapReader`]: both byte orders, both timestamp resolutions, magic
//! `a1b2c3d4`: microseconds, `a1b23c4d`: nanoseconds) and pcapng ([`ng`]); [`CaptureReader`]
//! tells them apart by their first bytes. Every link type is read; a replay takes those
//! of [`link::SUPPORTED`] and turns each packet into an Ethernet frame ([`link`]). Writes
//! classic little-endian Ethernet pcap, in the resolution the writer was created with.
//! Timestamps are kept as a [`Duration`] since the Unix epoch, whatever the file's
//! resolution. No external crate: the formats are a few fixed headers, and hand-written
//! readers give the exact errors and bounds this module promises (no panic, no allocation
//! beyond [`ng::BLOCK_LEN_MAX`] on a corrupt file).
// Product functions stay within clippy.toml's 70 lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod link;
pub mod ng;

use std::io::{self, Read, Write};
use std::time::Duration;

/// Magic of a microsecond-resolution file, as written in the file's own byte order.
pub const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
/// Magic of a nanosecond-resolution file.
pub const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
pub use link::LINKTYPE_ETHERNET;
/// Largest record we accept: a guard against a corrupt length allocating gigabytes.
pub const RECORD_LEN_MAX: u32 = 256 * 1024;
/// Snap length written in our file headers.
pub const SNAPLEN: u32 = 65535;

/// Why a pcap file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    /// The underlying reader or writer failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The file does not start with a classic pcap magic number (nor, for
    /// [`CaptureReader`], with a pcapng Section Header block).
    #[error("not a pcap or pcapng file (magic {0:#010x})")]
    BadMagic(u32),
    /// The file ended inside a header or record.
    #[error("truncated pcap file: {0}")]
    Truncated(&'static str),
    /// A link type a replay cannot turn into Ethernet frames.
    #[error("unsupported link type {0} (supported: {supported})", supported = link::SUPPORTED)]
    LinkType(u32),
    /// A pcapng block is malformed.
    #[error("pcapng block {block}: {what}")]
    BadBlock {
        /// 0-based block index.
        block: u64,
        /// What is wrong with it.
        what: String,
    },
    /// A record is longer than [`RECORD_LEN_MAX`] or than its original length allows.
    #[error("record {index}: bad length {len}")]
    BadRecordLen {
        /// 0-based record index.
        index: u64,
        /// The captured length found.
        len: u32,
    },
}

/// Timestamp resolution of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Microseconds (the classic format).
    Micros,
    /// Nanoseconds.
    Nanos,
}

/// One captured frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Time since the Unix epoch.
    pub ts: Duration,
    /// Length of the frame on the wire (may exceed `data.len()` when the capture truncated it).
    pub orig_len: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
}

/// Reads records from a classic pcap stream (any link type: see [`linktype`](Self::linktype)).
#[derive(Debug)]
pub struct PcapReader<R: Read> {
    inner: R,
    swapped: bool,
    resolution: Resolution,
    snaplen: u32,
    linktype: u32,
    index: u64,
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream before the first
/// byte, `Truncated` on an end in the middle.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8], what: &'static str) -> Result<bool, PcapError> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if done == 0 => return Ok(false),
            Ok(0) => return Err(PcapError::Truncated(what)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

impl<R: Read> PcapReader<R> {
    /// Reads and checks the file header.
    pub fn new(mut inner: R) -> Result<Self, PcapError> {
        let mut magic = [0u8; 4];
        if !read_full(&mut inner, &mut magic, "file header")? {
            return Err(PcapError::Truncated("empty file"));
        }
        Self::with_magic_read(magic, inner)
    }

    /// Reads the rest of the file header, whose first 4 bytes were `magic`.
    fn with_magic_read(magic: [u8; 4], mut inner: R) -> Result<Self, PcapError> {
        let mut hdr = [0u8; 24];
        hdr[..4].copy_from_slice(&magic);
        if !read_full(&mut inner, &mut hdr[4..], "file header")? {
            return Err(PcapError::Truncated("file header"));
        }
        let le = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        let (swapped, resolution) = match le {
            MAGIC_MICROS => (false, Resolution::Micros),
            MAGIC_NANOS => (false, Resolution::Nanos),
            m if m.swap_bytes() == MAGIC_MICROS => (true, Resolution::Micros),
            m if m.swap_bytes() == MAGIC_NANOS => (true, Resolution::Nanos),
            m => return Err(PcapError::BadMagic(m)),
        };
        let field = |at: usize| {
            let v = u32::from_le_bytes([hdr[at], hdr[at + 1], hdr[at + 2], hdr[at + 3]]);
            if swapped { v.swap_bytes() } else { v }
        };
        let snaplen = field(16);
        let linktype = field(20) & 0x0fff_ffff; // upper bits: FCS length flags
        Ok(PcapReader {
            inner,
            swapped,
            resolution,
            snaplen,
            linktype,
            index: 0,
        })
    }

    /// The file's link type (`LINKTYPE_*`, its FCS flags cleared).
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    /// The file's timestamp resolution.
    pub fn resolution(&self) -> Resolution {
        self.resolution
    }

    /// The file's snap length.
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// The next record, `None` at a clean end of file.
    pub fn next_record(&mut self) -> Result<Option<Record>, PcapError> {
        let mut hdr = [0u8; 16];
        if !read_full(&mut self.inner, &mut hdr, "record header")? {
            return Ok(None);
        }
        let field = |at: usize| {
            let v = u32::from_le_bytes([hdr[at], hdr[at + 1], hdr[at + 2], hdr[at + 3]]);
            if self.swapped { v.swap_bytes() } else { v }
        };
        let (secs, frac, incl, orig) = (field(0), field(4), field(8), field(12));
        let index = self.index;
        self.index += 1;
        if incl > RECORD_LEN_MAX {
            return Err(PcapError::BadRecordLen { index, len: incl });
        }
        let nanos = match self.resolution {
            Resolution::Micros => u64::from(frac) * 1_000,
            Resolution::Nanos => u64::from(frac),
        };
        let ts = Duration::from_secs(u64::from(secs)) + Duration::from_nanos(nanos);
        let mut data = vec![0u8; incl as usize];
        if !read_full(&mut self.inner, &mut data, "record data")? && incl > 0 {
            return Err(PcapError::Truncated("record data"));
        }
        Ok(Some(Record {
            ts,
            orig_len: orig,
            data,
        }))
    }
}

impl<R: Read> Iterator for PcapReader<R> {
    type Item = Result<Record, PcapError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

/// Reads a classic pcap or a pcapng stream, told apart by its first 4 bytes.
#[derive(Debug)]
pub enum CaptureReader<R: Read> {
    /// Classic pcap.
    Pcap(PcapReader<R>),
    /// pcapng.
    Ng(ng::PcapNgReader<R>),
}

impl<R: Read> CaptureReader<R> {
    /// Reads the file header (pcap) or the blocks up to the first interface (pcapng).
    pub fn new(mut inner: R) -> Result<Self, PcapError> {
        let mut magic = [0u8; 4];
        if !read_full(&mut inner, &mut magic, "file header")? {
            return Err(PcapError::Truncated("empty file"));
        }
        if u32::from_le_bytes(magic) == ng::BLOCK_SHB {
            ng::PcapNgReader::with_type_read(inner).map(CaptureReader::Ng)
        } else {
            PcapReader::with_magic_read(magic, inner).map(CaptureReader::Pcap)
        }
    }

    /// The resolution an output capture should keep (pcapng: its first interface's).
    pub fn resolution(&self) -> Resolution {
        match self {
            CaptureReader::Pcap(r) => r.resolution(),
            CaptureReader::Ng(r) => r.resolution(),
        }
    }

    /// The next packet and its link type, `None` at a clean end of file.
    pub fn next_packet(&mut self) -> Result<Option<ng::NgPacket>, PcapError> {
        match self {
            CaptureReader::Pcap(r) => {
                let linktype = r.linktype();
                Ok(r.next_record()?
                    .map(|record| ng::NgPacket { linktype, record }))
            }
            CaptureReader::Ng(r) => r.next_packet(),
        }
    }
}

/// Writes a classic little-endian pcap stream with the Ethernet link type.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    inner: W,
    resolution: Resolution,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header.
    pub fn new(mut inner: W, resolution: Resolution) -> Result<Self, PcapError> {
        let magic = match resolution {
            Resolution::Micros => MAGIC_MICROS,
            Resolution::Nanos => MAGIC_NANOS,
        };
        let mut hdr = [0u8; 24];
        hdr[0..4].copy_from_slice(&magic.to_le_bytes());
        hdr[4..6].copy_from_slice(&2u16.to_le_bytes());
        hdr[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs stay 0.
        hdr[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        hdr[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        inner.write_all(&hdr)?;
        Ok(PcapWriter { inner, resolution })
    }

    /// Appends one frame captured at `ts` (since the Unix epoch), full length.
    pub fn write(&mut self, ts: Duration, data: &[u8]) -> Result<(), PcapError> {
        let frac = match self.resolution {
            Resolution::Micros => ts.subsec_micros(),
            Resolution::Nanos => ts.subsec_nanos(),
        };
        // Classic pcap has 32-bit seconds; saturate rather than wrap.
        let secs = u32::try_from(ts.as_secs()).unwrap_or(u32::MAX);
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let mut hdr = [0u8; 16];
        hdr[0..4].copy_from_slice(&secs.to_le_bytes());
        hdr[4..8].copy_from_slice(&frac.to_le_bytes());
        hdr[8..12].copy_from_slice(&len.to_le_bytes());
        hdr[12..16].copy_from_slice(&len.to_le_bytes());
        self.inner.write_all(&hdr)?;
        self.inner.write_all(data)?;
        Ok(())
    }

    /// Flushes and returns the inner writer.
    pub fn finish(mut self) -> Result<W, PcapError> {
        self.inner.flush()?;
        Ok(self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<(Duration, Vec<u8>)> {
        vec![
            (
                Duration::new(1_700_000_000, 123_456_789),
                vec![1, 2, 3, 4, 5],
            ),
            (Duration::new(1_700_000_001, 0), vec![0xaa; 60]),
            (Duration::new(1_700_000_001, 999), Vec::new()),
        ]
    }

    #[test]
    fn round_trip_both_resolutions() {
        for res in [Resolution::Micros, Resolution::Nanos] {
            let mut w = PcapWriter::new(Vec::new(), res).unwrap();
            for (ts, data) in frames() {
                w.write(ts, &data).unwrap();
            }
            let bytes = w.finish().unwrap();
            let r = PcapReader::new(&bytes[..]).unwrap();
            assert_eq!(r.resolution(), res);
            let got: Vec<Record> = r.collect::<Result<_, _>>().unwrap();
            assert_eq!(got.len(), 3);
            for (rec, (ts, data)) in got.iter().zip(frames()) {
                let want = match res {
                    Resolution::Micros => Duration::new(ts.as_secs(), ts.subsec_micros() * 1000),
                    Resolution::Nanos => ts,
                };
                assert_eq!(rec.ts, want);
                assert_eq!(rec.data, data);
                assert_eq!(rec.orig_len as usize, data.len());
            }
        }
    }

    #[test]
    fn big_endian_files_are_read() {
        let mut be = Vec::new();
        be.extend_from_slice(&MAGIC_MICROS.to_be_bytes());
        be.extend_from_slice(&2u16.to_be_bytes());
        be.extend_from_slice(&4u16.to_be_bytes());
        be.extend_from_slice(&[0; 8]);
        be.extend_from_slice(&SNAPLEN.to_be_bytes());
        be.extend_from_slice(&1u32.to_be_bytes());
        for v in [7u32, 500, 3, 3] {
            be.extend_from_slice(&v.to_be_bytes());
        }
        be.extend_from_slice(&[9, 8, 7]);
        let recs: Vec<Record> = PcapReader::new(&be[..])
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            recs,
            vec![Record {
                ts: Duration::new(7, 500_000),
                orig_len: 3,
                data: vec![9, 8, 7]
            }]
        );
    }

    #[test]
    fn errors_are_clear() {
        assert!(matches!(
            PcapReader::new(&[][..]),
            Err(PcapError::Truncated(_))
        ));
        let junk = [
            0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let e = PcapReader::new(&junk[..]).unwrap_err();
        assert!(e.to_string().contains("not a pcap"), "{e}");
        let e = CaptureReader::new(&junk[..]).unwrap_err();
        assert!(e.to_string().contains("pcapng block 0"), "{e}");
        let mut w = PcapWriter::new(Vec::new(), Resolution::Micros).unwrap();
        w.write(Duration::ZERO, &[1; 10]).unwrap();
        let mut bytes = w.finish().unwrap();
        bytes.truncate(bytes.len() - 1);
        let mut r = PcapReader::new(&bytes[..]).unwrap();
        assert!(matches!(r.next_record(), Err(PcapError::Truncated(_))));
        let mut linux_sll = PcapWriter::new(Vec::new(), Resolution::Micros)
            .unwrap()
            .finish()
            .unwrap();
        linux_sll[20] = 113;
        assert_eq!(PcapReader::new(&linux_sll[..]).unwrap().linktype(), 113);
        let mut w = PcapWriter::new(Vec::new(), Resolution::Micros).unwrap();
        w.write(Duration::ZERO, &[1; 10]).unwrap();
        let mut bytes = w.finish().unwrap();
        bytes[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut r = PcapReader::new(&bytes[..]).unwrap();
        assert!(matches!(
            r.next_record(),
            Err(PcapError::BadRecordLen { index: 0, .. })
        ));
    }
}
