//! Flow sync's datagrams: a header, records, and an HMAC-SHA256 tag over both.
//!
//! ```text
//! 0   magic "XVSY"        4   version (1)   5  kind        6  records (u16 le)
//! 8   sequence (u64 le): the sender's clock in µs since the Unix epoch, strictly increasing
//! 16  aux (u64 le): DumpEnd: flows the dump sent; Hello: when the sender started (µs)
//! 24  records: Flows: FlowRecord bytes each (flowtable's record format, the one a graceful
//!     stop exports); Ends: [`END_BYTES`] each (the original tuple)
//! ..  tag: HMAC-SHA256(key, everything before it), 32 bytes
//! ```
//!
//! A receiver checks, in order: the length and magic, the tag (constant time), then that the
//! sequence is fresh ([`Replay`]): within [`FRESH`] of its own clock, and not seen before from
//! that peer. Records are checked one by one when installed.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use flowtable::{FlowRecord, Protocol, RECORD_BYTES};
use ring::hmac;

/// Datagrams stay under a 1,500-byte MTU with room for IPv6 and UDP headers.
pub const MAX_DATAGRAM: usize = 1400;
const HEADER: usize = 24;
const TAG: usize = 32;
const MAGIC: &[u8; 4] = b"XVSY";
const VERSION: u8 = 1;
/// Bytes of an end record.
pub const END_BYTES: usize = 40;
/// Flow records in one datagram.
pub const FLOWS_PER_DATAGRAM: usize = (MAX_DATAGRAM - HEADER - TAG) / RECORD_BYTES;
/// End records in one datagram.
pub const ENDS_PER_DATAGRAM: usize = (MAX_DATAGRAM - HEADER - TAG) / END_BYTES;
/// How far a sequence (a clock reading) may be from the receiver's clock.
pub const FRESH: Duration = Duration::from_secs(60);
/// Sequences a receiver remembers below the highest seen (reordering it tolerates).
pub const WINDOW: u64 = 1024;

/// What a datagram carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Flows created, changed or refreshed (or sent in a dump).
    Flows = 1,
    /// Flows that ended.
    Ends = 2,
    /// "Send me every flow you have."
    DumpRequest = 3,
    /// The end of a dump (`aux`: flows sent).
    DumpEnd = 4,
    /// Liveness, every second (`aux`: when the sender started).
    Hello = 5,
}

impl Kind {
    fn of(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Flows,
            2 => Kind::Ends,
            3 => Kind::DumpRequest,
            4 => Kind::DumpEnd,
            5 => Kind::Hello,
            _ => return None,
        })
    }
}

/// An ended flow: its original tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct End {
    /// Transport protocol.
    pub proto: Protocol,
    /// Client address and port.
    pub client: SocketAddr,
    /// VIP and port.
    pub vip: SocketAddr,
}

/// A datagram, decoded and verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// What it carries.
    pub kind: Kind,
    /// Its sequence (the sender's clock, µs).
    pub seq: u64,
    /// See [`Kind`].
    pub aux: u64,
    /// Flows (kind `Flows`).
    pub flows: Vec<FlowRecord>,
    /// Ended flows (kind `Ends`).
    pub ends: Vec<End>,
    /// Records that did not decode (counted by the caller).
    pub invalid: usize,
}

/// Why a datagram was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Too short, bad magic, version or kind, or a length that is no whole number of
    /// records.
    Malformed,
    /// The tag does not verify: forged, damaged, or another key.
    Auth,
    /// A sequence already seen, or too old or too far ahead of this clock.
    Replay,
}

impl Refused {
    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Refused::Malformed => "malformed",
            Refused::Auth => "auth",
            Refused::Replay => "replay",
        }
    }
}

/// The shared key.
pub struct Key(hmac::Key);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// A key from its bytes (at least 32).
    pub fn new(bytes: &[u8]) -> Result<Key, String> {
        if bytes.len() < 32 {
            return Err(format!(
                "{} bytes: a sync key needs at least 32 (e.g. `head -c 32 /dev/urandom > FILE`)",
                bytes.len()
            ));
        }
        Ok(Key(hmac::Key::new(hmac::HMAC_SHA256, bytes)))
    }
}

/// Builds datagrams of one kind, records appended until full.
#[derive(Debug)]
pub struct Writer {
    buf: Vec<u8>,
    kind: Kind,
    count: u16,
    per: usize,
}

impl Writer {
    /// An empty datagram of `kind`.
    pub fn new(kind: Kind) -> Writer {
        let mut buf = Vec::with_capacity(MAX_DATAGRAM);
        buf.extend_from_slice(MAGIC);
        buf.push(VERSION);
        buf.push(kind as u8);
        buf.extend_from_slice(&[0; HEADER - 6]);
        let per = match kind {
            Kind::Flows => FLOWS_PER_DATAGRAM,
            Kind::Ends => ENDS_PER_DATAGRAM,
            _ => 0,
        };
        Writer {
            buf,
            kind,
            count: 0,
            per,
        }
    }

    /// Records so far.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether another record fits.
    pub fn has_room(&self) -> bool {
        usize::from(self.count) < self.per
    }

    /// Appends a flow (kind `Flows`; the caller checks [`has_room`](Self::has_room)).
    pub fn flow(&mut self, r: &FlowRecord) {
        debug_assert!(self.kind == Kind::Flows && self.has_room());
        self.buf.extend_from_slice(&r.encode());
        self.count += 1;
    }

    /// Appends an ended flow (kind `Ends`).
    pub fn end(&mut self, e: &End) {
        debug_assert!(self.kind == Kind::Ends && self.has_room());
        let mut b = [0u8; END_BYTES];
        b[0] = e.proto as u8;
        b[1] = u8::from(e.client.is_ipv6());
        b[2..4].copy_from_slice(&e.client.port().to_le_bytes());
        b[4..6].copy_from_slice(&e.vip.port().to_le_bytes());
        b[8..24].copy_from_slice(&ip_bits(e.client.ip()).to_le_bytes());
        b[24..40].copy_from_slice(&ip_bits(e.vip.ip()).to_le_bytes());
        self.buf.extend_from_slice(&b);
        self.count += 1;
    }

    /// The datagram, sequenced and signed.
    pub fn seal(mut self, key: &Key, seq: u64, aux: u64) -> Vec<u8> {
        self.buf[6..8].copy_from_slice(&self.count.to_le_bytes());
        self.buf[8..16].copy_from_slice(&seq.to_le_bytes());
        self.buf[16..24].copy_from_slice(&aux.to_le_bytes());
        let tag = hmac::sign(&key.0, &self.buf);
        self.buf.extend_from_slice(tag.as_ref());
        self.buf
    }
}

fn ip_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(a.to_bits()),
        IpAddr::V6(a) => a.to_bits(),
    }
}

fn bits_ip(bits: u128, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(std::net::Ipv6Addr::from_bits(bits))
    } else {
        IpAddr::V4(std::net::Ipv4Addr::from_bits(bits as u32))
    }
}

/// Checks `d`'s form and tag; the sequence is the caller's to check ([`Replay`]).
pub fn open(key: &Key, d: &[u8]) -> Result<Message, Refused> {
    if d.len() < HEADER + TAG || &d[..4] != MAGIC || d[4] != VERSION {
        return Err(Refused::Malformed);
    }
    let (body, tag) = d.split_at(d.len() - TAG);
    hmac::verify(&key.0, body, tag).map_err(|_| Refused::Auth)?;
    let kind = Kind::of(d[5]).ok_or(Refused::Malformed)?;
    let count = usize::from(u16::from_le_bytes([d[6], d[7]]));
    let seq = u64::from_le_bytes(d[8..16].try_into().expect("8 bytes"));
    let aux = u64::from_le_bytes(d[16..24].try_into().expect("8 bytes"));
    let records = &body[HEADER..];
    let size = match kind {
        Kind::Flows => RECORD_BYTES,
        Kind::Ends => END_BYTES,
        _ => 1,
    };
    if records.len() != count * size && !(size == 1 && count == 0 && records.is_empty()) {
        return Err(Refused::Malformed);
    }
    let mut m = Message {
        kind,
        seq,
        aux,
        flows: Vec::new(),
        ends: Vec::new(),
        invalid: 0,
    };
    match kind {
        Kind::Flows => {
            for r in records.chunks_exact(RECORD_BYTES) {
                match FlowRecord::decode(r.try_into().expect("a record")) {
                    Some(f) => m.flows.push(f),
                    None => m.invalid += 1,
                }
            }
        }
        Kind::Ends => {
            for b in records.chunks_exact(END_BYTES) {
                let v6 = b[1] == 1;
                let port = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
                let bits = |i: usize| u128::from_le_bytes(b[i..i + 16].try_into().expect("16"));
                match Protocol::from_ip_proto(b[0]) {
                    Some(proto) if b[1] <= 1 => m.ends.push(End {
                        proto,
                        client: SocketAddr::new(bits_ip(bits(8), v6), port(2)),
                        vip: SocketAddr::new(bits_ip(bits(24), v6), port(4)),
                    }),
                    _ => m.invalid += 1,
                }
            }
        }
        _ => {}
    }
    Ok(m)
}

/// One peer's replay window: the highest sequence seen and which of the [`WINDOW`] below
/// it were seen. Sequences are clock readings (µs), so they also say how old a datagram
/// is: one older than [`FRESH`] is refused even by a receiver that just started (and
/// remembers nothing).
#[derive(Clone, Debug, Default)]
pub struct Replay {
    top: u64,
    seen: Vec<u64>,
}

impl Replay {
    /// Accepts `seq` (and remembers it) if it is fresh at `now_us` and new.
    pub fn check(&mut self, seq: u64, now_us: u64) -> Result<(), Refused> {
        let fresh = FRESH.as_micros() as u64;
        if seq.abs_diff(now_us) > fresh {
            return Err(Refused::Replay);
        }
        if self.seen.is_empty() {
            self.seen = vec![0; (WINDOW / 64) as usize];
        }
        let words = self.seen.len() as u64;
        let bit = |s: u64| ((s / 64 % words) as usize, 1u64 << (s % 64));
        if seq > self.top {
            // Forget what slides out of the window.
            let from = self
                .top
                .saturating_add(1)
                .max(seq.saturating_sub(WINDOW - 1));
            if seq - from >= WINDOW {
                self.seen.iter_mut().for_each(|w| *w = 0);
            } else {
                for s in from..=seq {
                    let (w, b) = bit(s);
                    self.seen[w] &= !b;
                }
            }
            self.top = seq;
        } else if self.top - seq >= WINDOW {
            return Err(Refused::Replay);
        }
        let (w, b) = bit(seq);
        if self.seen[w] & b != 0 {
            return Err(Refused::Replay);
        }
        self.seen[w] |= b;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowtable::{BackendId, FlowData, FlowState, TcpState};

    fn key(b: u8) -> Key {
        Key::new(&[b; 32]).unwrap()
    }

    fn record(port: u16) -> FlowRecord {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        FlowRecord {
            data: FlowData {
                proto: Protocol::Tcp,
                client: SocketAddr::new(sa("198.18.0.2:0").ip(), port),
                vip: sa("198.18.100.1:80"),
                backend: sa("198.18.1.1:8080"),
                snat: sa("198.18.3.1:40000"),
                service_id: 1,
                backend_id: BackendId(2),
                snapshot_gen: 3,
                flags: 1,
            },
            state: FlowState::Tcp(TcpState::Established),
            idle: Duration::from_millis(250),
            seq: 0,
        }
    }

    #[test]
    fn a_datagram_opens_as_sealed_and_fits_the_mtu() {
        let k = key(1);
        let mut w = Writer::new(Kind::Flows);
        let mut n = 0;
        while w.has_room() {
            w.flow(&record(1000 + n));
            n += 1;
        }
        assert_eq!(usize::from(n), FLOWS_PER_DATAGRAM);
        let d = w.seal(&k, 77, 5);
        assert!(d.len() <= MAX_DATAGRAM, "{}", d.len());
        let m = open(&k, &d).unwrap();
        assert_eq!((m.kind, m.seq, m.aux, m.invalid), (Kind::Flows, 77, 5, 0));
        assert_eq!(m.flows.len(), FLOWS_PER_DATAGRAM);
        assert_eq!(m.flows[3], record(1003));

        let mut w = Writer::new(Kind::Ends);
        let e = End {
            proto: Protocol::Udp,
            client: "[2001:2::2]:5353".parse().unwrap(),
            vip: "[2001:2:0:100::1]:53".parse().unwrap(),
        };
        w.end(&e);
        let m = open(&k, &w.seal(&k, 78, 0)).unwrap();
        assert_eq!(m.ends, vec![e]);
        let m = open(&k, &Writer::new(Kind::Hello).seal(&k, 79, 9)).unwrap();
        assert_eq!((m.kind, m.aux), (Kind::Hello, 9));
    }

    #[test]
    fn forged_damaged_and_foreign_datagrams_are_refused() {
        let k = key(1);
        let mut w = Writer::new(Kind::Flows);
        w.flow(&record(1));
        let d = w.seal(&k, 1, 0);
        assert_eq!(open(&key(2), &d), Err(Refused::Auth), "another key");
        for i in [0, 5, 9, 30, d.len() - 1] {
            let mut bad = d.clone();
            bad[i] ^= 0x40;
            let r = open(&k, &bad);
            assert!(
                matches!(r, Err(Refused::Auth | Refused::Malformed)),
                "byte {i}: {r:?}"
            );
        }
        assert_eq!(open(&k, &d[..20]), Err(Refused::Malformed));
        // A tag that verifies over a lie about the record count is still refused.
        let mut w = Writer::new(Kind::Flows);
        w.flow(&record(1));
        let mut body = w.seal(&k, 2, 0);
        body.truncate(body.len() - TAG);
        body[6] = 2;
        let tag = hmac::sign(&k.0, &body);
        body.extend_from_slice(tag.as_ref());
        assert_eq!(open(&k, &body), Err(Refused::Malformed));
    }

    #[test]
    fn the_window_refuses_repeats_and_stale_sequences() {
        let now = 1_000_000_000_000u64;
        let mut r = Replay::default();
        assert_eq!(r.check(now, now), Ok(()));
        assert_eq!(r.check(now, now), Err(Refused::Replay), "a repeat");
        assert_eq!(
            r.check(now - 5, now),
            Ok(()),
            "reordered, inside the window"
        );
        assert_eq!(r.check(now - 5, now), Err(Refused::Replay));
        assert_eq!(r.check(now + 10, now), Ok(()));
        assert_eq!(
            r.check(now - WINDOW, now),
            Err(Refused::Replay),
            "below the window"
        );
        let old = now - FRESH.as_micros() as u64 - 1;
        let mut fresh = Replay::default();
        assert_eq!(fresh.check(old, now), Err(Refused::Replay), "too old");
        assert_eq!(
            fresh.check(now + FRESH.as_micros() as u64 + 1, now),
            Err(Refused::Replay),
            "too far ahead"
        );
        // A big step forward forgets everything below the new window.
        assert_eq!(r.check(now + 10 * WINDOW, now), Ok(()));
        assert_eq!(r.check(now + 10 * WINDOW - 1, now), Ok(()));
        assert_eq!(r.check(now + 10, now), Err(Refused::Replay));
    }
}
