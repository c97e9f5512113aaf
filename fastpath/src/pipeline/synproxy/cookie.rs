//! SYN cookies (Linux's `secure_tcp_syn_cookie` scheme) and the TCP options they carry.
//!
//! A cookie is the initial sequence number xvs sends in its SYN-ACK:
//!
//! ```text
//! cookie = H0(tuple) + client_isn + (count << 24) + ((H1(tuple, count) + data) mod 2^24)
//! ```
//!
//! where `H0` and `H1` are SipHash-2-4 under two 128-bit keys ([`CookieKey`]), `count` a
//! coarse clock (one step every [`COUNT_TICKS`], 60 s) and `data` the client's options in 7
//! bits: the MSS as an index into a per-family table (2 bits), SACK-permitted (1 bit) and
//! the window scale (4 bits, 15 = none). [`check`] inverts it for the client's ACK
//! (`ack - 1`, with `seq - 1` as the client's ISN): the age must be below [`MAX_AGE`] steps
//! (a cookie lives 60 to 120 s, as Linux's `MAX_SYNCOOKIE_AGE`) and the data below 128, so a
//! forged ACK passes with probability 2^-16 per try (two counts of 2^-24 · 128).
//!
//! Timestamps are not kept: the SYN-ACK carries none, so neither side of the connection uses
//! them and nothing depends on their values.

use std::net::IpAddr;

/// Coarse-clock steps: one every 600 flow-table ticks (100 ms each): 60 s.
pub(crate) const COUNT_TICKS: u32 = 600;
/// A cookie is valid while `now`'s count minus its count is below this.
pub(crate) const MAX_AGE: u32 = 2;

/// MSS values a cookie can say (index = 2 bits), IPv4: the largest not above the client's.
const MSS_V4: [u16; 4] = [536, 1300, 1440, 1460];
/// The same for IPv6 (Linux's table: 1280 - 60, 1480 - 60, 1500 - 60, 9000 - 60).
const MSS_V6: [u16; 4] = [1220, 1420, 1440, 8940];

/// The SYN cookie secret: two SipHash keys. Shared by every worker and kept across restarts
/// (a client answered by the previous process must be accepted by the next).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CookieKey(pub [u64; 4]);

impl std::fmt::Debug for CookieKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CookieKey(..)")
    }
}

impl CookieKey {
    /// A key from the kernel's random source.
    pub fn random() -> CookieKey {
        CookieKey(std::array::from_fn(|_| shm::random_u64()))
    }

    /// The key as stored in a file: 32 bytes, little-endian words.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        for (c, w) in b.chunks_exact_mut(8).zip(self.0) {
            c.copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// The key of [`to_bytes`](Self::to_bytes) bytes.
    pub fn from_bytes(b: &[u8; 32]) -> CookieKey {
        let mut k = [0u64; 4];
        for (w, c) in k.iter_mut().zip(b.chunks_exact(8)) {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            *w = u64::from_le_bytes(a);
        }
        CookieKey(k)
    }
}

/// The client's SYN options a cookie keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SynOptions {
    /// The MSS (from the table: at most the client's; 536 / 1220 when it sent none).
    pub mss: u16,
    /// Whether the client sent an MSS option (the SYN-ACK echoes only what it sent).
    pub mss_sent: bool,
    /// The client's window scale, when it offered scaling (capped at 14).
    pub wscale: Option<u8>,
    /// SACK permitted.
    pub sack: bool,
}

impl SynOptions {
    /// The 7 cookie bits of these options (the MSS rounded down to the table).
    pub fn data(&self, v6: bool) -> u32 {
        let table = if v6 { &MSS_V6 } else { &MSS_V4 };
        let idx = table.iter().rposition(|&m| m <= self.mss).unwrap_or(0) as u32;
        let ws = self.wscale.map_or(15, |w| u32::from(w.min(14)));
        idx | u32::from(self.sack) << 2 | ws << 3
    }

    /// The options of 7 cookie bits (the MSS as the table says it: sent).
    pub fn of_data(data: u32, v6: bool) -> SynOptions {
        let table = if v6 { &MSS_V6 } else { &MSS_V4 };
        let ws = (data >> 3) & 15;
        SynOptions {
            mss: table[(data & 3) as usize],
            mss_sent: true,
            wscale: (ws != 15).then_some(ws as u8),
            sack: data & 4 != 0,
        }
    }

    /// The options of a SYN's option bytes (unknown and malformed ones ignored; parsing stops
    /// at a malformed length).
    pub fn parse(opts: &[u8], v6: bool) -> SynOptions {
        let mut o = SynOptions {
            mss: if v6 { MSS_V6[0] } else { MSS_V4[0] },
            ..SynOptions::default()
        };
        let mut i = 0;
        while let Some(&kind) = opts.get(i) {
            match kind {
                0 => break,
                1 => i += 1,
                _ => {
                    let Some(&len) = opts.get(i + 1) else { break };
                    let len = usize::from(len);
                    let Some(body) = opts.get(i + 2..i + len.max(2)) else {
                        break;
                    };
                    if len < 2 {
                        break;
                    }
                    match (kind, body) {
                        (2, [a, b]) => {
                            o.mss = u16::from_be_bytes([*a, *b]);
                            o.mss_sent = true;
                        }
                        (3, [s]) => o.wscale = Some((*s).min(14)),
                        (4, []) => o.sack = true,
                        _ => {}
                    }
                    i += len;
                }
            }
        }
        o
    }

    /// Writes these options as a SYN or SYN-ACK carries them (MSS; NOP, WS; NOP, NOP,
    /// SACK-permitted; each only when present) at the start of `out`; returns the bytes
    /// written (a multiple of 4, at most 12). `out` must hold 12 bytes.
    pub fn write(&self, out: &mut [u8]) -> usize {
        let mut n = 0;
        let mut put = |b: &[u8]| {
            if let Some(d) = out.get_mut(n..n + b.len()) {
                d.copy_from_slice(b);
                n += b.len();
            }
        };
        if self.mss_sent {
            let m = self.mss.to_be_bytes();
            put(&[2, 4, m[0], m[1]]);
        }
        if let Some(w) = self.wscale {
            put(&[1, 3, 3, w]);
        }
        if self.sack {
            put(&[1, 1, 4, 2]);
        }
        n
    }

    /// Bytes [`write`](Self::write) writes.
    pub fn len(&self) -> usize {
        4 * (usize::from(self.mss_sent)
            + usize::from(self.wscale.is_some())
            + usize::from(self.sack))
    }
}

/// SipHash-2-4 of `words` (as their little-endian bytes) under key `(k0, k1)`.
fn siphash(k0: u64, k1: u64, words: &[u64]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    #[inline(always)]
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let mut compress = |m: u64| {
        v[3] ^= m;
        round(&mut v);
        round(&mut v);
        v[0] ^= m;
    };
    for &m in words {
        compress(m);
    }
    // The last block: the length in bytes in the top byte (no tail: whole words).
    compress(((words.len() as u64 * 8) & 0xff) << 56);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// A connection's tuple as the cookie hashes it: client address and port, VIP and port.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuple {
    pub client: IpAddr,
    pub client_port: u16,
    pub vip: IpAddr,
    pub vip_port: u16,
}

impl Tuple {
    fn words(&self) -> [u64; 5] {
        let bits = |a: IpAddr| match a {
            IpAddr::V4(v4) => u128::from(v4.to_bits()) | 1 << 127,
            IpAddr::V6(v6) => v6.to_bits(),
        };
        let (c, v) = (bits(self.client), bits(self.vip));
        [
            c as u64,
            (c >> 64) as u64,
            v as u64,
            (v >> 64) as u64,
            u64::from(self.client_port) | u64::from(self.vip_port) << 16,
        ]
    }

    fn h0(&self, k: &CookieKey) -> u32 {
        siphash(k.0[0], k.0[1], &self.words()) as u32
    }

    fn h1(&self, k: &CookieKey, count: u32) -> u32 {
        let w = self.words();
        siphash(
            k.0[2],
            k.0[3],
            &[w[0], w[1], w[2], w[3], w[4], u64::from(count)],
        ) as u32
    }
}

const COOKIE_BITS: u32 = 24;
const COOKIE_MASK: u32 = (1 << COOKIE_BITS) - 1;
/// Cookie data values are below this.
const DATA_MAX: u32 = 128;

/// The coarse-clock count of flow-table tick `tick`.
#[inline]
pub(crate) fn count_of(tick: u32) -> u32 {
    tick / COUNT_TICKS
}

/// The cookie (xvs's ISN) for a client SYN of `t` with ISN `client_isn` and options data
/// `data` (< 128), at count `count`.
pub(crate) fn make(k: &CookieKey, t: &Tuple, client_isn: u32, count: u32, data: u32) -> u32 {
    debug_assert!(data < DATA_MAX);
    t.h0(k)
        .wrapping_add(client_isn)
        .wrapping_add(count << COOKIE_BITS)
        .wrapping_add(t.h1(k, count).wrapping_add(data) & COOKIE_MASK)
}

/// The options data of `cookie` (the client's ACK number minus one) for `t` whose ISN was
/// `client_isn` (its ACK's sequence number minus one), at count `count`; `None` when the
/// cookie is not one of ours or too old.
pub(crate) fn check(
    k: &CookieKey,
    t: &Tuple,
    cookie: u32,
    client_isn: u32,
    count: u32,
) -> Option<u32> {
    let c = cookie.wrapping_sub(t.h0(k)).wrapping_sub(client_isn);
    let age = count.wrapping_sub(c >> COOKIE_BITS) & (u32::MAX >> COOKIE_BITS);
    if age >= MAX_AGE {
        return None;
    }
    let data = c.wrapping_sub(t.h1(k, count.wrapping_sub(age))) & COOKIE_MASK;
    (data < DATA_MAX).then_some(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(deprecated)]
    fn siphash_is_siphash_2_4() {
        use std::hash::{Hasher, SipHasher};
        for n in 0..8usize {
            let words: Vec<u64> = (0..n as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            let mut h = SipHasher::new_with_keys(0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908);
            for w in &words {
                h.write(&w.to_le_bytes());
            }
            assert_eq!(
                siphash(0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908, &words),
                h.finish(),
                "{n} words"
            );
        }
    }

    fn tuple(port: u16) -> Tuple {
        Tuple {
            client: "198.18.0.2".parse().unwrap(),
            client_port: port,
            vip: "198.18.100.1".parse().unwrap(),
            vip_port: 80,
        }
    }

    #[test]
    fn cookies_round_trip_within_their_age_only() {
        let k = CookieKey([1, 2, 3, 4]);
        let t = tuple(40000);
        for data in [0, 1, 77, 127] {
            for isn in [0, 1, 0x7fff_ffff, u32::MAX] {
                for count in [0u32, 1, 255, 256, 1000] {
                    let c = make(&k, &t, isn, count, data);
                    assert_eq!(check(&k, &t, c, isn, count), Some(data));
                    assert_eq!(check(&k, &t, c, isn, count + 1), Some(data), "a step later");
                    assert_eq!(check(&k, &t, c, isn, count + 2), None, "two steps: too old");
                    assert_eq!(check(&k, &t, c, isn, count.wrapping_sub(1)), None, "future");
                    // (An ISN a little off only moves the data: as in Linux, the cookie
                    // binds the ISN through the count and data fields.)
                    let off = isn.wrapping_add(3 << 24);
                    assert_eq!(check(&k, &t, c, off, count), None);
                    assert_eq!(check(&k, &tuple(40001), c, isn, count), None);
                    assert_eq!(check(&CookieKey([1, 2, 3, 5]), &t, c, isn, count), None);
                }
            }
        }
    }

    #[test]
    fn forged_cookies_rarely_pass() {
        let k = CookieKey([9, 8, 7, 6]);
        let t = tuple(1234);
        let mut x = 0x1234_5678u32;
        let passed = (0..1_000_000)
            .filter(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                check(&k, &t, x, 42, 10).is_some()
            })
            .count();
        // Expected 2 * 128 / 2^24 * 10^6 = 15.
        assert!(passed < 60, "{passed}");
    }

    #[test]
    fn options_round_trip_through_the_cookie_bits() {
        for v6 in [false, true] {
            for mss in [0u16, 536, 1300, 1459, 1460, 9000] {
                for wscale in [None, Some(0), Some(7), Some(14), Some(200)] {
                    for sack in [false, true] {
                        let o = SynOptions {
                            mss,
                            mss_sent: true,
                            wscale,
                            sack,
                        };
                        let back = SynOptions::of_data(o.data(v6), v6);
                        assert!(back.mss <= mss.max(if v6 { 1220 } else { 536 }));
                        assert_eq!(back.wscale, wscale.map(|w| w.min(14)));
                        assert_eq!(back.sack, sack);
                        assert!(o.data(v6) < DATA_MAX);
                    }
                }
            }
        }
    }

    #[test]
    fn options_parse_and_write() {
        // Linux's SYN: MSS 1460, SACK-permitted, timestamps, NOP, window scale 7.
        let linux = [
            2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        let o = SynOptions::parse(&linux, false);
        assert_eq!(
            o,
            SynOptions {
                mss: 1460,
                mss_sent: true,
                wscale: Some(7),
                sack: true
            }
        );
        let mut out = [0u8; 12];
        assert_eq!(o.write(&mut out), 12);
        assert_eq!(out, [2, 4, 5, 0xb4, 1, 3, 3, 7, 1, 1, 4, 2]);
        assert_eq!(o.len(), 12);
        assert_eq!(SynOptions::parse(&out, false), o);
        // Nothing, garbage and truncation.
        assert_eq!(SynOptions::parse(&[], true).mss, 1220);
        assert!(!SynOptions::parse(&[], true).mss_sent);
        for bad in [
            &[2u8][..],
            &[2, 0, 1, 1],
            &[2, 4, 5],
            &[3, 1, 3, 3, 7],
            &[0, 2, 4, 5, 0],
        ] {
            let o = SynOptions::parse(bad, false);
            assert!(!o.mss_sent && o.wscale.is_none(), "{bad:?}: {o:?}");
        }
        let mut short = [0u8; 4];
        let n = o.write(&mut short);
        assert_eq!(n, 4, "what fits");
    }
}
