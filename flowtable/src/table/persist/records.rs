//! The record format of a graceful stop's export ([`FlowTable::export`],
//! [`FlowTable::import_records`]) and of flow sync ([`FlowRecord`]): a 48-byte header, then
//! fixed-size little-endian records.
//!
//! An export file is untrusted input like any state file: it is opened without following a
//! link, and refused whole ([`Error::Refused`], the field and the value) unless its header
//! is one this xvs reads, of this boot, written in the past, and its record count makes
//! exactly the file's size. Each record is then decoded strictly (a protocol, a state of
//! that protocol, a family byte, IPv4 addresses in their mapped form, zero reserved bytes),
//! checked like an adopted entry and by the caller's [`FlowCheck`]; a record that fails is
//! counted and skipped, and so is every record whose backend id has two addresses.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use lb_algos::BackendId;
use shm::{Existing, Refusal, StateFile, boot_id, mono_of, monotonic_ns};

use super::super::entry::{A_BACKEND, A_CLIENT, A_SNAT, A_VIP};
use super::super::{Error, FlowTable, FlowView};
use super::valid::{BackendAddrs, FlowCheck, flow_refusal, state_of};
use super::{Imported, refused, state_err};
use crate::key::{FlowData, Protocol};
use crate::state::FlowState;

/// Bytes of one flow in the record format (this version).
pub const RECORD_BYTES: usize = RECORD_LEN;

/// The record format's version. Records are little-endian and fixed-size; a new field means
/// a new version (and the reader of the old one kept).
///
/// - 1: 96-byte records.
/// - 2: 104-byte records: version 1's, then the flow's sequence word (SYN proxy). Version 1
///   records are still read (sequence word 0: no proxied flow existed then).
pub const RECORD_VERSION: u32 = 2;
const RECORD_MAGIC: &[u8; 8] = b"XVSFLOWR";
const RECORD_HEADER_LEN: usize = 48;
/// Bytes of a record of this version.
const RECORD_LEN: usize = 104;
/// Bytes of a version 1 record.
const RECORD_LEN_V1: usize = 96;
/// How far in the future an export may be dated (1 h, in ns).
const EXPORT_FUTURE_NS: u64 = 3_600_000_000_000;

impl FlowTable {
    /// Writes every live flow to `path` in the record format (see [`RECORD_VERSION`]),
    /// aside (`<path>.tmp`, made with `O_EXCL|O_NOFOLLOW`, mode 0600: a stale temporary that
    /// is not a regular file of ours refuses the export) then renamed into place; returns
    /// how many. For a graceful stop, so that a process with another layout can import them.
    pub fn export(&self, path: &Path, now: Instant) -> Result<usize, Error> {
        let tmp = path.with_extension("tmp");
        let file = shm::create_temp(&tmp).map_err(|e| state_err(&tmp, e))?;
        let written = self.write_records(file, now, &tmp);
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        let n = written?;
        std::fs::rename(&tmp, path).map_err(|e| state_err(path, e))?;
        Ok(n)
    }

    fn write_records(&self, file: std::fs::File, now: Instant, tmp: &Path) -> Result<usize, Error> {
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let boot = boot_id().map_err(|e| state_err(tmp, e))?;
        let io = |e: io::Error| state_err(tmp, e);
        // The count goes in the header once known: a placeholder first, streamed records,
        // then the header again.
        let mut head = RecordHeader {
            count: 0,
            boot,
            exported_mono_ns: mono_of(now),
            version: RECORD_VERSION,
            record_len: RECORD_LEN,
        };
        w.write_all(&head.encode()).map_err(io)?;
        let mut failed = None;
        self.scan(0, self.capacity(), |v| {
            if failed.is_none() {
                let age = now.saturating_duration_since(v.last_seen);
                match w.write_all(&encode_record(&v.data, v.state, age, v.seq)) {
                    Ok(()) => head.count += 1,
                    Err(e) => failed = Some(e),
                }
            }
        });
        if let Some(e) = failed {
            return Err(io(e));
        }
        let mut file = w.into_inner().map_err(|e| io(e.into_error()))?;
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&head.encode()).map_err(io)?;
        Ok(head.count as usize)
    }

    /// Reads flows written by [`export`](Self::export) (of this boot) into this table; their
    /// idle times continue from the export. A file that cannot be read as one is
    /// [`Error::Refused`]; records are checked one by one (see the module doc), those
    /// `check` refuses counted in [`Imported::invalid`]. The file is left for the caller to
    /// remove (or, refused, to set aside).
    pub fn import_records(
        &self,
        path: &Path,
        now: Instant,
        check: &dyn FlowCheck,
    ) -> Result<Imported, Error> {
        let file = match StateFile::open_existing(path).map_err(|e| state_err(path, e))? {
            Existing::Open(s) => s.file,
            Existing::Missing => return Err(state_err(path, "no such file")),
            Existing::Refused(r) => return Err(refused(path, r)),
        };
        let len = file.metadata().map_err(|e| state_err(path, e))?.len();
        let mut r = BufReader::new(file);
        let io = |e: io::Error| state_err(path, e);
        let mut head = [0u8; RECORD_HEADER_LEN];
        if len < RECORD_HEADER_LEN as u64 {
            return Err(refused(
                path,
                Refusal::new("size", format!("{len} bytes (a header needs 48)")),
            ));
        }
        r.read_exact(&mut head).map_err(io)?;
        let head = RecordHeader::decode(&head).map_err(|why| refused(path, why))?;
        let boot = boot_id().map_err(io)?;
        head.check(&boot, len, monotonic_ns())
            .map_err(|why| refused(path, why))?;
        // Time passed since the export counts as idle time.
        let since = Duration::from_nanos(monotonic_ns().saturating_sub(head.exported_mono_ns));
        let mut out = Imported::default();
        let mut addrs = BackendAddrs::default();
        let mut rec = [0u8; RECORD_LEN];
        for _ in 0..head.count {
            r.read_exact(&mut rec[..head.record_len]).map_err(io)?;
            out.read += 1;
            let flow = decode_record(&rec, head.version).and_then(|(d, state, age, seq)| {
                if let Some(why) = flow_refusal(&d, self.backends.len()) {
                    return Err(why);
                }
                check.check(&d, state)?;
                Ok((d, state, age, seq))
            });
            let (data, state, age, seq) = match flow {
                Ok(f) => f,
                Err(why) => {
                    out.refuse(why);
                    continue;
                }
            };
            let last_seen = now
                .checked_sub(age.saturating_add(since))
                .unwrap_or(self.epoch)
                .max(self.epoch);
            match self.restore(&data, state, self.tick(last_seen), seq) {
                Ok(_) => {
                    out.restored += 1;
                    addrs.note(data.backend_id.0, data.backend);
                }
                Err(_) => out.refused += 1,
            }
        }
        self.drop_conflicting(&addrs, &mut out);
        Ok(out)
    }

    /// Removes the imported flows whose backend id had two addresses among them.
    pub(super) fn drop_conflicting(&self, addrs: &BackendAddrs, out: &mut Imported) {
        if !addrs.any() {
            return;
        }
        let mut bad = Vec::new();
        self.scan(0, self.capacity(), |v| {
            if let Some(why) = addrs.conflict(v.data.backend_id.0) {
                bad.push((v.handle, why));
            }
        });
        for (h, why) in bad {
            if self.remove(h).is_some() {
                out.restored -= 1;
                out.refuse(why);
            }
        }
    }
}

impl Imported {
    /// Counts an invalid flow (keeping the first reason).
    pub(super) fn refuse(&mut self, r: Refusal) {
        self.invalid += 1;
        self.refusal.get_or_insert(r);
    }
}

/// One flow as the record format carries it: the flow data (with the writer's service
/// and backend ids, which a reader of another process maps to its own), its state, how
/// long it had been idle when written, and its sequence word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowRecord {
    /// The flow.
    pub data: FlowData,
    /// Its state.
    pub state: FlowState,
    /// Idle time when written (millisecond resolution).
    pub idle: Duration,
    /// Its sequence word (0: none).
    pub seq: u64,
}

impl FlowRecord {
    /// The record of `v` read at `now`.
    pub fn of(v: &FlowView, now: Instant) -> FlowRecord {
        FlowRecord {
            data: v.data,
            state: v.state,
            idle: now.saturating_duration_since(v.last_seen),
            seq: v.seq,
        }
    }

    /// Its [`RECORD_BYTES`] bytes (the format of [`FlowTable::export`]'s records, version
    /// [`RECORD_VERSION`]).
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        encode_record(&self.data, self.state, self.idle, self.seq)
    }

    /// A record back from its bytes; `None` for bytes that are no valid record: decoded
    /// strictly (see the module doc) and a flow any table could hold (one family, unicast
    /// addresses, ports, two distinct tuples; the backend id is the taker's to check).
    pub fn decode(b: &[u8; RECORD_BYTES]) -> Option<FlowRecord> {
        let (data, state, idle, seq) = decode_record(b, RECORD_VERSION).ok()?;
        if flow_refusal(&data, usize::MAX).is_some() {
            return None;
        }
        Some(FlowRecord {
            data,
            state,
            idle,
            seq,
        })
    }
}

struct RecordHeader {
    count: u64,
    boot: [u64; 2],
    exported_mono_ns: u64,
    /// The records' version and size (read back: this version's or version 1's).
    version: u32,
    record_len: usize,
}

impl RecordHeader {
    fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut b = [0u8; RECORD_HEADER_LEN];
        b[..8].copy_from_slice(RECORD_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(self.record_len as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.boot[0].to_le_bytes());
        b[32..40].copy_from_slice(&self.boot[1].to_le_bytes());
        b[40..48].copy_from_slice(&self.exported_mono_ns.to_le_bytes());
        b
    }

    fn decode(b: &[u8; RECORD_HEADER_LEN]) -> Result<RecordHeader, Refusal> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | u64::from(u32_at(i + 4)) << 32;
        if &b[..8] != RECORD_MAGIC {
            return Err(Refusal::new(
                "magic",
                format!(
                    "{:?} (not an xvs flow export)",
                    String::from_utf8_lossy(&b[..8])
                ),
            ));
        }
        let (version, len) = (u32_at(8), u32_at(12) as usize);
        if !matches!(
            (version, len),
            (1, RECORD_LEN_V1) | (RECORD_VERSION, RECORD_LEN)
        ) {
            return Err(Refusal::new(
                "version",
                format!(
                    "record version {version} of {len} bytes (this xvs reads 1 and {RECORD_VERSION})"
                ),
            ));
        }
        Ok(RecordHeader {
            count: u64_at(16),
            boot: [u64_at(24), u64_at(32)],
            exported_mono_ns: u64_at(40),
            version,
            record_len: len,
        })
    }

    /// Why a file of `file_len` bytes with this header cannot be imported at
    /// CLOCK_MONOTONIC `now_ns` in boot `boot`, if it cannot.
    fn check(&self, boot: &[u64; 2], file_len: u64, now_ns: u64) -> Result<(), Refusal> {
        if self.boot != *boot {
            return Err(Refusal::new(
                "boot_id",
                format!(
                    "{:016x}{:016x} (exported before the last reboot)",
                    self.boot[0], self.boot[1]
                ),
            ));
        }
        // Two processes of one boot share the clock; beyond a little slack (callers may
        // date an export ahead, as tests do), a time in the future is damage.
        if self.exported_mono_ns > now_ns.saturating_add(EXPORT_FUTURE_NS) {
            return Err(Refusal::new(
                "exported",
                format!(
                    "{} ns (CLOCK_MONOTONIC is {now_ns} ns: in the future)",
                    self.exported_mono_ns
                ),
            ));
        }
        let want = self
            .count
            .checked_mul(self.record_len as u64)
            .and_then(|n| n.checked_add(RECORD_HEADER_LEN as u64));
        if want != Some(file_len) {
            return Err(Refusal::new(
                "count",
                format!(
                    "{} records of {} bytes (the file has {file_len} bytes: {} records)",
                    self.count,
                    self.record_len,
                    file_len.saturating_sub(RECORD_HEADER_LEN as u64) / self.record_len as u64
                ),
            ));
        }
        Ok(())
    }
}

/// One record: `proto, state, v6, flags` (4 bytes), the four ports (8), service and backend
/// ids and snapshot generation (12), idle ms (4), four 16-byte addresses (64), 4 reserved,
/// the sequence word (8, version 2).
fn encode_record(d: &FlowData, state: FlowState, age: Duration, seq: u64) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[0] = d.proto as u8;
    b[1] = state.to_u8();
    b[2] = u8::from(d.client.is_ipv6());
    b[3] = d.flags;
    for (i, sa) in [d.client, d.vip, d.backend, d.snat].iter().enumerate() {
        b[4 + 2 * i..6 + 2 * i].copy_from_slice(&sa.port().to_le_bytes());
        let bits = crate::key::addr_bits(sa.ip()).0;
        b[28 + 16 * i..44 + 16 * i].copy_from_slice(&bits.to_le_bytes());
    }
    b[12..16].copy_from_slice(&d.service_id.to_le_bytes());
    b[16..20].copy_from_slice(&d.backend_id.0.to_le_bytes());
    b[20..24].copy_from_slice(&d.snapshot_gen.to_le_bytes());
    let ms = age.as_millis().min(u128::from(u32::MAX)) as u32;
    b[24..28].copy_from_slice(&ms.to_le_bytes());
    b[96..104].copy_from_slice(&seq.to_le_bytes());
    b
}

/// A record of `version` (its bytes at the start of `b`), decoded strictly.
fn decode_record(
    b: &[u8; RECORD_LEN],
    version: u32,
) -> Result<(FlowData, FlowState, Duration, u64), Refusal> {
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u128_at = |i: usize| {
        let mut x = [0u8; 16];
        x.copy_from_slice(&b[i..i + 16]);
        u128::from_le_bytes(x)
    };
    let proto = Protocol::from_ip_proto(b[0])
        .ok_or_else(|| Refusal::new("protocol", format!("{} (no such protocol)", b[0])))?;
    let state = state_of(b[1], proto)?;
    let v6 = match b[2] {
        0 => false,
        1 => true,
        x => return Err(Refusal::new("family", format!("{x} (0: IPv4, 1: IPv6)"))),
    };
    if u32_at(92) != 0 {
        return Err(Refusal::new("reserved", format!("{:#010x}", u32_at(92))));
    }
    let mut addrs = [std::net::SocketAddr::from(([0, 0, 0, 0], 0)); 4];
    for (i, (field, a)) in ["client", "vip", "backend", "snat"]
        .into_iter()
        .zip(addrs.iter_mut())
        .enumerate()
    {
        let bits = u128_at(28 + 16 * i);
        if !v6 && bits >> 32 != crate::key::V4_MAPPED >> 32 {
            return Err(Refusal::new(
                field,
                format!("{bits:#034x} (not an IPv4 address)"),
            ));
        }
        *a = std::net::SocketAddr::new(crate::key::bits_addr(bits, v6), u16_at(4 + 2 * i));
    }
    let data = FlowData {
        proto,
        client: addrs[A_CLIENT],
        vip: addrs[A_VIP],
        backend: addrs[A_BACKEND],
        snat: addrs[A_SNAT],
        service_id: u32_at(12),
        backend_id: BackendId(u32_at(16)),
        snapshot_gen: u32_at(20),
        flags: b[3],
    };
    let seq = if version >= 2 {
        u64::from(u32_at(96)) | u64::from(u32_at(100)) << 32
    } else {
        0
    };
    Ok((
        data,
        state,
        Duration::from_millis(u64::from(u32_at(24))),
        seq,
    ))
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn record() -> [u8; RECORD_LEN] {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        let d = FlowData {
            proto: Protocol::Tcp,
            client: sa("198.18.0.1:40000"),
            vip: sa("198.18.100.1:80"),
            backend: sa("198.18.1.1:8080"),
            snat: sa("198.18.0.254:2000"),
            service_id: 1,
            backend_id: BackendId(3),
            snapshot_gen: 1,
            flags: 1,
        };
        let state = FlowState::Tcp(crate::TcpState::Established);
        encode_record(&d, state, Duration::from_millis(5), 7)
    }

    #[test]
    fn records_decode_strictly() {
        let good = record();
        assert!(FlowRecord::decode(&good).is_some());
        let field = |f: &dyn Fn(&mut [u8; RECORD_LEN])| {
            let mut b = record();
            f(&mut b);
            assert!(FlowRecord::decode(&b).is_none());
            decode_record(&b, RECORD_VERSION)
                .err()
                .map_or("(flow)", |r| r.field)
        };
        assert_eq!(field(&|b| b[0] = 250), "protocol");
        assert_eq!(field(&|b| b[1] = 16), "state"); // UDP's state on a TCP flow
        assert_eq!(field(&|b| b[1] = 13), "state");
        assert_eq!(field(&|b| b[2] = 2), "family");
        assert_eq!(field(&|b| b[93] = 1), "reserved");
        assert_eq!(field(&|b| b[28 + 16 + 15] = 0x20), "vip");
        // Decodes, but no table could hold it: port 0, a multicast backend.
        assert_eq!(field(&|b| b[8..10].copy_from_slice(&[0, 0])), "(flow)");
        assert_eq!(field(&|b| b[28 + 32 + 3] = 224), "(flow)");
    }
}
