//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Vocabulary: a *sum* is the folded 16-bit one's-complement sum of some data (not
//! complemented), a *checksum* is the complemented sum as stored in a header. Sums combine
//! with [`add`]; [`finish`] turns a sum into a checksum.
//!
//! The incremental updates use RFC 1624 equation 3, `HC' = ~(~HC + ~m + m')`, which gives the
//! same representation as a full recomputation for any header whose sum is non-zero (always
//! true for IPv4, TCP, UDP and ICMP headers), so tests can compare them bit for bit.

/// Folds a wide one's-complement accumulator to 16 bits.
#[inline(always)]
fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// One's-complement sum of `data` as big-endian 16-bit words (an odd last byte is padded
/// with a zero byte), folded to 16 bits. Reads 8 bytes at a time.
#[inline]
pub fn sum(data: &[u8]) -> u16 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_be_bytes(word);
        // Two 32-bit halves into a 64-bit accumulator: no overflow below 2^32 chunks.
        acc += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut rest = chunks.remainder().chunks_exact(2);
    for pair in &mut rest {
        acc += u64::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = rest.remainder() {
        acc += u64::from(*last) << 8;
    }
    fold(acc)
}

/// One's-complement addition of two sums.
#[inline(always)]
pub fn add(a: u16, b: u16) -> u16 {
    fold(u64::from(a) + u64::from(b))
}

/// Turns a sum into the checksum stored in a header.
#[inline(always)]
pub fn finish(sum: u16) -> u16 {
    !sum
}

/// The RFC 1071 checksum of `data` (with its checksum field zeroed when computing; over the
/// whole header when verifying, where a valid header gives 0).
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    finish(sum(data))
}

/// Sum of the IPv4 pseudo-header: addresses, protocol and L4 length.
#[inline]
pub fn pseudo_header_v4(src: &[u8; 4], dst: &[u8; 4], protocol: u8, l4_len: u16) -> u16 {
    let acc = u64::from(u16::from_be_bytes([src[0], src[1]]))
        + u64::from(u16::from_be_bytes([src[2], src[3]]))
        + u64::from(u16::from_be_bytes([dst[0], dst[1]]))
        + u64::from(u16::from_be_bytes([dst[2], dst[3]]))
        + u64::from(protocol)
        + u64::from(l4_len);
    fold(acc)
}

/// Sum of the IPv6 pseudo-header (RFC 8200 section 8.1): addresses, upper-layer length and
/// next header.
#[inline]
pub fn pseudo_header_v6(src: &[u8; 16], dst: &[u8; 16], next_header: u8, l4_len: u32) -> u16 {
    let acc = u64::from(sum(src))
        + u64::from(sum(dst))
        + u64::from(l4_len >> 16)
        + u64::from(l4_len & 0xffff)
        + u64::from(next_header);
    fold(acc)
}

/// The full TCP/UDP/ICMPv6-style checksum over an IPv4 pseudo-header plus `l4` (the L4
/// header and payload, with the checksum field zeroed when computing). Returns 0 for a valid
/// segment when verifying.
#[inline]
pub fn l4_checksum_v4(src: &[u8; 4], dst: &[u8; 4], protocol: u8, l4: &[u8]) -> u16 {
    // An L4 length above 65535 cannot be carried by IPv4; truncating keeps this total.
    let pseudo = pseudo_header_v4(src, dst, protocol, l4.len() as u16);
    finish(add(pseudo, sum(l4)))
}

/// As [`l4_checksum_v4`] with the IPv6 pseudo-header.
#[inline]
pub fn l4_checksum_v6(src: &[u8; 16], dst: &[u8; 16], next_header: u8, l4: &[u8]) -> u16 {
    let pseudo = pseudo_header_v6(src, dst, next_header, l4.len() as u32);
    finish(add(pseudo, sum(l4)))
}

/// RFC 1624 incremental update of checksum `csum` after a 16-bit word changed from `old` to
/// `new`.
#[inline(always)]
pub fn update_u16(csum: u16, old: u16, new: u16) -> u16 {
    !fold(u64::from(!csum) + u64::from(!old) + u64::from(new))
}

/// Incremental update after an aligned 32-bit word changed from `old` to `new`.
#[inline(always)]
pub fn update_u32(csum: u16, old: u32, new: u32) -> u16 {
    let acc = u64::from(!csum)
        + u64::from(!(old >> 16) & 0xffff)
        + u64::from(!old & 0xffff)
        + u64::from(new >> 16)
        + u64::from(new & 0xffff);
    !fold(acc)
}

/// Incremental update after a 16-bit-aligned byte string (an IPv4 or IPv6 address) changed
/// from `old` to `new`. Both must have the same even length; extra bytes of the longer one are
/// ignored.
#[inline]
pub fn update_addr(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    let mut acc = u64::from(!csum);
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        acc += u64::from(!u16::from_be_bytes([o[0], o[1]]));
        acc += u64::from(u16::from_be_bytes([n[0], n[1]]));
    }
    !fold(acc)
}

/// A one's-complement accumulator for an incremental checksum update (RFC 1624 eq. 3):
/// start from the old checksum, feed every changed 16-bit word, finish.
#[derive(Clone, Copy, Default)]
pub struct Delta(u64);

impl Delta {
    #[inline]
    pub fn new() -> Self {
        Delta(0)
    }

    #[inline]
    pub fn word(&mut self, old: u16, new: u16) {
        self.0 += u64::from(!old) + u64::from(new);
    }

    #[inline]
    pub fn bytes(&mut self, old: &[u8], new: &[u8]) {
        for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
            self.word(
                u16::from_be_bytes([o[0], o[1]]),
                u16::from_be_bytes([n[0], n[1]]),
            );
        }
    }

    /// The updated checksum.
    #[inline]
    pub fn apply(self, csum: u16) -> u16 {
        // The sums here stay far below 2^48 (a few dozen 17-bit terms); four folds then
        // reach 16 bits for any such value, the same result as folding until it fits.
        let mut acc = u64::from(!csum) + self.0;
        debug_assert!(acc < 1 << 48);
        acc = (acc & 0xffff_ffff) + (acc >> 32);
        acc = (acc & 0xffff) + (acc >> 16);
        acc = (acc & 0xffff) + (acc >> 16);
        acc = (acc & 0xffff) + (acc >> 16);
        !(acc as u16)
    }
}

/// `a + b` with the carry wrapped around: a one's complement sum on 64 bits. Congruent
/// modulo 0xffff to the sum of the 16-bit words of `a` and `b` (2^16 ≡ 1), and zero only when
/// both are.
#[inline(always)]
pub fn add1c(a: u64, b: u64) -> u64 {
    let (s, c) = a.overflowing_add(b);
    // With a carry, s <= 2^64 - 2.
    s + u64::from(c)
}

/// The one's complement sum of two 16-bit words, the end-around carry added back: `a + b`
/// folded to 16 bits, the same residue modulo 0xffff, zero only when both are; so the same
/// value [`Delta::apply`]'s folds reach.
#[inline(always)]
pub fn add1c16(a: u16, b: u16) -> u16 {
    let (s, c) = a.overflowing_add(b);
    // With a carry, s <= 0xfffe.
    s + u16::from(c)
}

/// The UDP checksum rule for a *computed* checksum: 0 is sent as 0xffff (RFC 768), because
/// 0 means "no checksum" over IPv4 and is invalid over IPv6.
#[inline(always)]
pub fn udp_nonzero(csum: u16) -> u16 {
    if csum == 0 { 0xffff } else { csum }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `add1c16` is the 32-bit sum folded, for every pair of words in a sample that
    /// includes both zeros (0 and 0xffff) and the carries' edges.
    #[test]
    fn add1c16_is_the_folded_sum() {
        let edges = [0u16, 1, 2, 0x7fff, 0x8000, 0xfeff, 0xfffe, 0xffff];
        let sample = (0..=0xffffu32).step_by(97).map(|x| x as u16);
        for a in sample.chain(edges) {
            for b in (0..=0xffffu32).step_by(89).map(|x| x as u16).chain(edges) {
                assert_eq!(
                    add1c16(a, b),
                    fold(u64::from(a) + u64::from(b)),
                    "{a:#x} + {b:#x}"
                );
            }
        }
    }

    /// The byte-by-byte definition, as a reference for the 8-bytes-at-a-time loop.
    fn sum_reference(data: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        for (i, b) in data.iter().enumerate() {
            acc += if i % 2 == 0 {
                u32::from(*b) << 8
            } else {
                u32::from(*b)
            };
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        assert_eq!(
            sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0xddf2
        );
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
    }

    #[test]
    fn fast_sum_matches_reference_for_every_length_and_alignment() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 151 + 7) as u8 | 0x80).collect();
        for start in 0..9 {
            for end in start..data.len() {
                let s = &data[start..end];
                let (a, b) = (sum(s), sum_reference(s));
                // 0 and 0xffff are the same value in one's complement.
                assert!(
                    a == b || (a % 0xffff == b % 0xffff),
                    "{start}..{end}: {a:#x} {b:#x}"
                );
            }
        }
        assert_eq!(sum(&[0xff; 64]), 0xffff);
        assert_eq!(sum(&[]), 0);
        assert_eq!(sum(&[0xab]), 0xab00);
    }

    #[test]
    fn known_ipv4_header_checksum() {
        // A classic example header with checksum 0xb861.
        let mut hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&hdr), 0xb861);
        hdr[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(checksum(&hdr), 0);
    }

    #[test]
    fn incremental_equals_full() {
        let mut hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        let csum = checksum(&hdr);
        // Change TTL/proto word, then the source address.
        let old_word = u16::from_be_bytes([hdr[8], hdr[9]]);
        hdr[8] = 0x3f;
        let c1 = update_u16(csum, old_word, u16::from_be_bytes([hdr[8], hdr[9]]));
        assert_eq!(c1, checksum(&hdr));
        let old_src: [u8; 4] = hdr[12..16].try_into().unwrap();
        hdr[12..16].copy_from_slice(&[10, 0, 0, 255]);
        let c2 = update_addr(c1, &old_src, &hdr[12..16]);
        assert_eq!(c2, checksum(&hdr));
        let c3 = update_u32(
            c1,
            u32::from_be_bytes(old_src),
            u32::from_be_bytes([10, 0, 0, 255]),
        );
        assert_eq!(c3, c2);
    }

    #[test]
    fn udp_zero_rule() {
        assert_eq!(udp_nonzero(0), 0xffff);
        assert_eq!(udp_nonzero(0x1234), 0x1234);
    }
}
