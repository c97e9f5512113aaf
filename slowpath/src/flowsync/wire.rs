//! Flow sync's datagrams: a header, records, and an HMAC-SHA256 tag over both.
//!
//! ```text
//! 0   magic "XVSY"        4   version (2)   5  kind        6  records (u16 le)
//! 8   sequence (u64 le): the sender's clock in µs since the Unix epoch, strictly increasing
//! 16  aux (u64 le): DumpEnd: flows the dump sent; Hello: when the sender started (µs)
//! 24  session (u64 le): the sender's, random per process
//! 32  issued (u64 le): the sender's ticket for the receiver (random, nonzero): what the
//!     receiver's datagrams must present to be acted on
//! 40  presented (u64 le): the receiver's ticket for the sender, as the sender last learnt
//!     it (0: not yet)
//! 48  sender (node id, 20 bytes): the sender's sync address ([`NODE_ID_BYTES`])
//! 68  receiver (node id): the receiver's sync address, as the sender lists it
//! 88  records: Flows: FlowRecord bytes each (flowtable's record format, the one a graceful
//!     stop exports); Ends: [`END_BYTES`] each (the original tuple)
//! ..  tag: HMAC-SHA256(key, everything before it), 32 bytes
//! ```
//!
//! [`open`] checks, in order: the length and magic ([`Refused::Malformed`]), the version
//! ([`Refused::Version`]: another version's layout is not read at all), the tag, in
//! constant time ([`Refused::Auth`]), then the kind, the record count and the node ids
//! (malformed). Everything else (who sent it to whom, sessions, tickets, sequences) is the
//! receiver's to judge (`super`); [`Replay`] is its per-session window. Records are checked
//! one by one when installed: a record that does not decode is counted, the others are
//! still read.
//!
//! Version 1 (no node ids, sessions or tickets) is not read: both nodes of a tier must run
//! the same version.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use flowtable::{FlowRecord, Protocol, RECORD_BYTES};
use ring::hmac;

/// Datagrams stay under a 1,500-byte MTU with room for IPv6 and UDP headers.
pub const MAX_DATAGRAM: usize = 1400;
/// Bytes of a node id: family (4 or 6), 0, port (u16 le), address (u128 le).
pub const NODE_ID_BYTES: usize = 20;
const HEADER: usize = 48 + 2 * NODE_ID_BYTES;
const TAG: usize = 32;
const MAGIC: &[u8; 4] = b"XVSY";
/// The wire version this build speaks (and the only one it reads).
pub const VERSION: u8 = 2;
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

const _: () = assert!(FLOWS_PER_DATAGRAM >= 12 && ENDS_PER_DATAGRAM >= 32);

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
    /// Liveness, every second (`aux`: when the sender started); also how a node learns its
    /// peer's session and ticket.
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

/// A datagram's header fields after the kind (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The sender's clock (µs), strictly increasing.
    pub seq: u64,
    /// See [`Kind`].
    pub aux: u64,
    /// The sender's session (random per process).
    pub session: u64,
    /// The sender's ticket for the receiver.
    pub issued: u64,
    /// The receiver's ticket for the sender, as the sender knows it (0: not yet).
    pub presented: u64,
    /// The sender's node id (its sync address).
    pub sender: SocketAddr,
    /// The receiver's node id, as the sender lists it.
    pub receiver: SocketAddr,
}

/// A datagram, decoded and verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// What it carries.
    pub kind: Kind,
    /// Its header.
    pub head: Header,
    /// Flows (kind `Flows`).
    pub flows: Vec<FlowRecord>,
    /// Ended flows (kind `Ends`).
    pub ends: Vec<End>,
    /// Records that did not decode (counted by the caller).
    pub invalid: usize,
}

/// Why a datagram was refused: the `reason` label of
/// `xvs_peer_sync_messages_rejected_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not from a listed peer's address and port.
    UnknownPeer = 0,
    /// Too short, bad magic or kind, a length that is no whole number of records, or a
    /// node id that is no address.
    Malformed = 1,
    /// Another wire version (a tier whose nodes run different versions syncs nothing).
    Version = 2,
    /// The tag does not verify: forged, damaged, or another key.
    Auth = 3,
    /// It names this node as its sender: one of this node's own datagrams sent back to it.
    Reflected = 4,
    /// It names another node as its receiver (meant for another peer, or sent back).
    WrongReceiver = 5,
    /// It names another node as its sender than the peer whose address it came from.
    WrongSender = 6,
    /// It presents a ticket this node no longer issues (made before this node restarted, or
    /// for a previous session of the peer), or comes from a session of the peer older than
    /// the one this node follows.
    StaleSession = 7,
    /// A sequence already seen in the peer's session, below its window, or too far from
    /// this node's clock.
    Replay = 8,
}

impl Refused {
    /// Every reason, in label order.
    pub const ALL: [Refused; 9] = [
        Refused::UnknownPeer,
        Refused::Malformed,
        Refused::Version,
        Refused::Auth,
        Refused::Reflected,
        Refused::WrongReceiver,
        Refused::WrongSender,
        Refused::StaleSession,
        Refused::Replay,
    ];

    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Refused::UnknownPeer => "unknown_peer",
            Refused::Malformed => "malformed",
            Refused::Version => "version",
            Refused::Auth => "auth",
            Refused::Reflected => "reflected",
            Refused::WrongReceiver => "wrong_receiver",
            Refused::WrongSender => "wrong_sender",
            Refused::StaleSession => "stale_session",
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

/// Builds datagrams of one kind, records appended until full; sealed (once per receiver)
/// with [`seal`](Writer::seal).
#[derive(Clone, Debug)]
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

    /// Its kind.
    pub fn kind(&self) -> Kind {
        self.kind
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

    /// The datagram for one receiver: `h` written into the header, signed.
    pub fn seal(&self, key: &Key, h: &Header) -> Vec<u8> {
        let mut buf = Vec::with_capacity(self.buf.len() + TAG);
        buf.extend_from_slice(&self.buf);
        buf[6..8].copy_from_slice(&self.count.to_le_bytes());
        for (at, v) in [
            (8, h.seq),
            (16, h.aux),
            (24, h.session),
            (32, h.issued),
            (40, h.presented),
        ] {
            buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        buf[48..48 + NODE_ID_BYTES].copy_from_slice(&node_id(h.sender));
        buf[68..68 + NODE_ID_BYTES].copy_from_slice(&node_id(h.receiver));
        let tag = hmac::sign(&key.0, &buf);
        buf.extend_from_slice(tag.as_ref());
        buf
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

/// A node id's bytes (see [`NODE_ID_BYTES`]).
pub fn node_id(a: SocketAddr) -> [u8; NODE_ID_BYTES] {
    let mut b = [0u8; NODE_ID_BYTES];
    b[0] = if a.is_ipv6() { 6 } else { 4 };
    b[2..4].copy_from_slice(&a.port().to_le_bytes());
    b[4..20].copy_from_slice(&ip_bits(a.ip()).to_le_bytes());
    b
}

/// A node id back from its bytes; `None` for bytes no [`node_id`] writes.
fn read_node_id(b: &[u8]) -> Option<SocketAddr> {
    let bits = u128::from_le_bytes(b[4..20].try_into().ok()?);
    let v6 = match b[0] {
        4 if bits >> 32 == 0 => false,
        6 => true,
        _ => return None,
    };
    if b[1] != 0 {
        return None;
    }
    Some(SocketAddr::new(
        bits_ip(bits, v6),
        u16::from_le_bytes([b[2], b[3]]),
    ))
}

fn u64_at(d: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Checks `d`'s form, version and tag, and decodes it; who sent it to whom, its session,
/// ticket and sequence are the caller's to check (see the module doc).
pub fn open(key: &Key, d: &[u8]) -> Result<Message, Refused> {
    if d.len() < 6 || &d[..4] != MAGIC {
        return Err(Refused::Malformed);
    }
    if d[4] != VERSION {
        return Err(Refused::Version);
    }
    if d.len() < HEADER + TAG {
        return Err(Refused::Malformed);
    }
    let (body, tag) = d.split_at(d.len() - TAG);
    hmac::verify(&key.0, body, tag).map_err(|_| Refused::Auth)?;
    let kind = Kind::of(d[5]).ok_or(Refused::Malformed)?;
    let count = usize::from(u16::from_le_bytes([d[6], d[7]]));
    let head = Header {
        seq: u64_at(d, 8),
        aux: u64_at(d, 16),
        session: u64_at(d, 24),
        issued: u64_at(d, 32),
        presented: u64_at(d, 40),
        sender: read_node_id(&d[48..68]).ok_or(Refused::Malformed)?,
        receiver: read_node_id(&d[68..88]).ok_or(Refused::Malformed)?,
    };
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
        head,
        flows: Vec::new(),
        ends: Vec::new(),
        invalid: 0,
    };
    match kind {
        Kind::Flows => flows_into(&mut m, records),
        Kind::Ends => ends_into(&mut m, records),
        _ => {}
    }
    Ok(m)
}

/// Decodes a `Flows` datagram's records into `m`; a record that does not decode is counted
/// in `m.invalid`, the others kept.
fn flows_into(m: &mut Message, records: &[u8]) {
    for r in records.chunks_exact(RECORD_BYTES) {
        let Ok(r) = <&[u8; RECORD_BYTES]>::try_from(r) else {
            m.invalid += 1;
            continue;
        };
        match FlowRecord::decode(r) {
            Some(f) => m.flows.push(f),
            None => m.invalid += 1,
        }
    }
}

/// Decodes an `Ends` datagram's records into `m`, counting the ones that do not decode.
fn ends_into(m: &mut Message, records: &[u8]) {
    for b in records.chunks_exact(END_BYTES) {
        let v6 = b[1] == 1;
        let port = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let bits = |i: usize| {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[i..i + 16]);
            u128::from_le_bytes(a)
        };
        let fits = v6 || (bits(8) >> 32 == 0 && bits(24) >> 32 == 0);
        match Protocol::from_ip_proto(b[0]) {
            Some(proto) if b[1] <= 1 && fits => m.ends.push(End {
                proto,
                client: SocketAddr::new(bits_ip(bits(8), v6), port(2)),
                vip: SocketAddr::new(bits_ip(bits(24), v6), port(4)),
            }),
            _ => m.invalid += 1,
        }
    }
}

/// Whether sequence `seq` (the sender's clock) is within [`FRESH`] of `now_us`.
pub fn fresh(seq: u64, now_us: u64) -> bool {
    seq.abs_diff(now_us) <= FRESH.as_micros() as u64
}

/// The replay window of one session of one peer: the highest sequence seen and which of
/// the [`WINDOW`] below it were seen. Sequences are clock readings (µs), so they also say
/// how old a datagram is: one older than [`FRESH`] is refused whatever the window holds.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    top: u64,
    seen: Vec<u64>,
}

impl Replay {
    /// Accepts `seq` (and remembers it) if it is fresh at `now_us` and new.
    pub fn check(&mut self, seq: u64, now_us: u64) -> Result<(), Refused> {
        if !fresh(seq, now_us) {
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

    fn head(seq: u64, aux: u64) -> Header {
        Header {
            seq,
            aux,
            session: 0x1111,
            issued: 0x2222,
            presented: 0x3333,
            sender: "198.18.2.11:7946".parse().unwrap(),
            receiver: "[2001:2:0:2::12]:7946".parse().unwrap(),
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
        let d = w.seal(&k, &head(77, 5));
        assert!(d.len() <= MAX_DATAGRAM, "{}", d.len());
        let m = open(&k, &d).unwrap();
        assert_eq!((m.kind, m.head, m.invalid), (Kind::Flows, head(77, 5), 0));
        assert_eq!(m.flows.len(), FLOWS_PER_DATAGRAM);
        assert_eq!(m.flows[3], record(1003));
        // Sealed twice (two receivers), the writer is unchanged.
        let again = w.seal(&k, &head(78, 5));
        assert_eq!(open(&k, &again).unwrap().flows.len(), FLOWS_PER_DATAGRAM);

        let mut w = Writer::new(Kind::Ends);
        let e = End {
            proto: Protocol::Udp,
            client: "[2001:2::2]:5353".parse().unwrap(),
            vip: "[2001:2:0:100::1]:53".parse().unwrap(),
        };
        w.end(&e);
        let m = open(&k, &w.seal(&k, &head(78, 0))).unwrap();
        assert_eq!(m.ends, vec![e]);
        let m = open(&k, &Writer::new(Kind::Hello).seal(&k, &head(79, 9))).unwrap();
        assert_eq!((m.kind, m.head.aux), (Kind::Hello, 9));
    }

    /// `d` with its body changed by `f` and signed again with `k`: what a peer holding the
    /// key (compromised or buggy) can send.
    fn resigned(k: &Key, d: &[u8], f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut body = d[..d.len() - TAG].to_vec();
        f(&mut body);
        let tag = hmac::sign(&k.0, &body);
        body.extend_from_slice(tag.as_ref());
        body
    }

    #[test]
    fn forged_damaged_and_foreign_datagrams_are_refused() {
        let k = key(1);
        let mut w = Writer::new(Kind::Flows);
        w.flow(&record(1));
        let d = w.seal(&k, &head(1, 0));
        assert_eq!(open(&key(2), &d), Err(Refused::Auth), "another key");
        for i in [0, 5, 9, 30, 50, 70, 100, d.len() - 1] {
            let mut bad = d.clone();
            bad[i] ^= 0x40;
            let r = open(&k, &bad);
            assert!(
                matches!(r, Err(Refused::Auth | Refused::Malformed)),
                "byte {i}: {r:?}"
            );
        }
        assert_eq!(open(&k, &d[..20]), Err(Refused::Malformed));
        assert_eq!(open(&k, b"XVS"), Err(Refused::Malformed));
        // A tag that verifies over a lie about the record count is still refused.
        assert_eq!(
            open(&k, &resigned(&k, &d, |b| b[6] = 2)),
            Err(Refused::Malformed)
        );
        // ... and so are node ids that are no address.
        assert_eq!(
            open(&k, &resigned(&k, &d, |b| b[48] = 5)),
            Err(Refused::Malformed)
        );
        assert_eq!(
            open(&k, &resigned(&k, &d, |b| b[48 + 19] = 1)),
            Err(Refused::Malformed),
            "an IPv4 id with bits above 32"
        );
        // A record that does not decode is counted, the others still read.
        let mut w = Writer::new(Kind::Flows);
        w.flow(&record(1));
        w.flow(&record(2));
        let d = w.seal(&k, &head(3, 0));
        let m = open(&k, &resigned(&k, &d, |b| b[HEADER] = 200)).unwrap();
        assert_eq!((m.flows.len(), m.invalid), (1, 1));
        assert_eq!(m.flows[0], record(2));
    }

    #[test]
    fn every_reason_has_its_own_counter_and_label() {
        let mut names = std::collections::HashSet::new();
        for (i, r) in Refused::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?}: ALL is in discriminant order");
            assert!(names.insert(r.name()), "{} twice", r.name());
        }
    }

    #[test]
    fn a_datagram_of_another_version_is_refused_as_such() {
        let k = key(1);
        let d = Writer::new(Kind::Hello).seal(&k, &head(1, 0));
        for v in [1u8, 3, 255] {
            // Signed right (a peer of another version holds the key too): still refused.
            let other = resigned(&k, &d, |b| b[4] = v);
            assert_eq!(open(&k, &other), Err(Refused::Version), "version {v}");
        }
        // A version 1 datagram is shorter than this version's header: still "version".
        let mut v1 = b"XVSY\x01\x05\x00\x00".to_vec();
        v1.resize(24 + TAG, 0);
        assert_eq!(open(&k, &v1), Err(Refused::Version));
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
