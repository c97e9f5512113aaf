//! The generator's packets: Ethernet / IPv4 (no options) / UDP or TCP (no options) / a 20-byte
//! payload, zero padding up to the frame size.
//!
//! Payload, big-endian (the reflector `bpf/reflect.c` reads the last three fields):
//!
//! | offset | field |
//! |---|---|
//! | 0  | sequence number, u32 (global across flows) |
//! | 4  | send time, CLOCK_MONOTONIC ns, u64 |
//! | 12 | client address (the packet's original source) |
//! | 16 | client port |
//! | 18 | service port (the packet's original destination port) |
//!
//! Frame sizes are the bytes the AF_XDP ring carries (no FCS). A size below a kind's minimum
//! (62 for UDP, 74 for TCP: headers plus payload) is raised to it; above 1514 is an error.
//! Checksums are computed in full over the non-zero bytes (headers and payload); the zero
//! padding adds nothing to a one's-complement sum, so a 1500-byte frame costs the same as a
//! 64-byte one.

use std::net::Ipv4Addr;

/// Payload bytes.
pub const PAYLOAD_LEN: usize = 20;
/// Ethernet + IPv4 header bytes.
pub const L3_END: usize = 14 + 20;
/// Smallest UDP frame.
pub const UDP_MIN: usize = L3_END + 8 + PAYLOAD_LEN;
/// Smallest TCP frame.
pub const TCP_MIN: usize = L3_END + 20 + PAYLOAD_LEN;
/// Largest frame (1500-byte IP MTU).
pub const FRAME_MAX: usize = 1514;

/// What one packet is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// UDP datagram.
    Udp,
    /// TCP SYN.
    Syn,
    /// TCP ACK (established-like, PSH|ACK with data).
    Ack,
}

impl Proto {
    fn min_len(self) -> usize {
        match self {
            Proto::Udp => UDP_MIN,
            Proto::Syn | Proto::Ack => TCP_MIN,
        }
    }
}

/// The fields of one packet.
#[derive(Clone, Copy, Debug)]
pub struct Pkt {
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Protocol and TCP flags.
    pub proto: Proto,
    /// Sequence number.
    pub seq: u32,
    /// Send time, ns.
    pub ts_ns: u64,
}

/// One's-complement sum of `b` (16-bit big-endian words; an odd tail byte is padded).
fn sum16(b: &[u8], mut acc: u32) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// The Internet checksum of `b` (for tests and checks).
pub fn checksum(b: &[u8]) -> u16 {
    fold(sum16(b, 0))
}

/// Writes `p` into `buf` as a frame of `len` bytes (raised to the kind's minimum) and returns
/// the length used. `buf` must be at least [`FRAME_MAX`] bytes. Bytes between the payload and
/// the end of the longest header+payload are zeroed, so a frame reused for a shorter header
/// carries no stale bytes; bytes beyond [`TCP_MIN`] are never written and must be zero.
pub fn write(buf: &mut [u8], p: &Pkt, len: usize) -> usize {
    let len = len.clamp(p.proto.min_len(), FRAME_MAX);
    buf[0..6].copy_from_slice(&p.dst_mac);
    buf[6..12].copy_from_slice(&p.src_mac);
    buf[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut buf[14..34];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0u16.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[8] = 64;
    ip[9] = if p.proto == Proto::Udp { 17 } else { 6 };
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&p.src.octets());
    ip[16..20].copy_from_slice(&p.dst.octets());
    let c = checksum(&buf[14..34]);
    buf[24..26].copy_from_slice(&c.to_be_bytes());

    let l4_len = len - L3_END;
    let hdr = if p.proto == Proto::Udp { 8 } else { 20 };
    let l4 = &mut buf[L3_END..L3_END + hdr];
    l4[0..2].copy_from_slice(&p.sport.to_be_bytes());
    l4[2..4].copy_from_slice(&p.dport.to_be_bytes());
    match p.proto {
        Proto::Udp => {
            l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            l4[6..8].copy_from_slice(&[0, 0]);
        }
        Proto::Syn | Proto::Ack => {
            l4[4..8].copy_from_slice(&p.seq.to_be_bytes());
            let ack: u32 = if p.proto == Proto::Ack { 1 } else { 0 };
            l4[8..12].copy_from_slice(&ack.to_be_bytes());
            l4[12] = 5 << 4;
            l4[13] = if p.proto == Proto::Syn { 0x02 } else { 0x18 };
            l4[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
            l4[16..20].copy_from_slice(&[0, 0, 0, 0]);
        }
    }
    let pl_start = L3_END + hdr;
    let pl = &mut buf[pl_start..pl_start + PAYLOAD_LEN];
    pl[0..4].copy_from_slice(&p.seq.to_be_bytes());
    pl[4..12].copy_from_slice(&p.ts_ns.to_be_bytes());
    pl[12..16].copy_from_slice(&p.src.octets());
    pl[16..18].copy_from_slice(&p.sport.to_be_bytes());
    pl[18..20].copy_from_slice(&p.dport.to_be_bytes());
    let end = pl_start + PAYLOAD_LEN;
    let stale_end = TCP_MIN.min(len);
    if end < stale_end {
        buf[end..stale_end].fill(0);
    }

    // Pseudo-header + header + payload; the padding is zero.
    let mut acc = sum16(&buf[26..34], 0);
    acc += u32::from(buf[23]) + l4_len as u32;
    acc = sum16(&buf[L3_END..end], acc);
    let mut c = fold(acc);
    let at = if p.proto == Proto::Udp {
        L3_END + 6
    } else {
        L3_END + 16
    };
    if p.proto == Proto::Udp && c == 0 {
        c = 0xffff;
    }
    buf[at..at + 2].copy_from_slice(&c.to_be_bytes());
    len
}

/// What a sink reads from a received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Sequence number.
    pub seq: u32,
    /// Send time, ns.
    pub ts_ns: u64,
}

/// Parses a received frame: IPv4 UDP/TCP with a perf-lab payload, or `None`.
pub fn parse(f: &[u8]) -> Option<Received> {
    if f.len() < UDP_MIN || f[12..14] != [0x08, 0x00] || f[14] != 0x45 {
        return None;
    }
    let pl = match f[23] {
        17 => L3_END + 8,
        6 => L3_END + usize::from(f[L3_END + 12] >> 4) * 4,
        _ => return None,
    };
    let p = f.get(pl..pl + PAYLOAD_LEN)?;
    Some(Received {
        seq: u32::from_be_bytes(p[0..4].try_into().ok()?),
        ts_ns: u64::from_be_bytes(p[4..12].try_into().ok()?),
    })
}

/// Whether the IPv4 header and L4 checksums of `f` verify (for tests and `--verify`).
pub fn checksums_ok(f: &[u8]) -> bool {
    if f.len() < L3_END + 8 || checksum(&f[14..34]) != 0 {
        return false;
    }
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let Some(l4) = f.get(L3_END..14 + total) else {
        return false;
    };
    if f[23] == 17 && l4[6..8] == [0, 0] {
        return true;
    }
    let mut acc = sum16(&f[26..34], 0);
    acc += u32::from(f[23]) + l4.len() as u32;
    fold(sum16(l4, acc)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(proto: Proto) -> Pkt {
        Pkt {
            src_mac: [2, 0, 0, 0, 0, 2],
            dst_mac: [2, 0, 0, 0, 0, 1],
            src: Ipv4Addr::new(198, 18, 0, 17),
            dst: Ipv4Addr::new(198, 18, 100, 1),
            sport: 1234,
            dport: 9000,
            proto,
            seq: 0xdead_beef,
            ts_ns: 123_456_789_000,
        }
    }

    #[test]
    fn every_kind_and_size_checksums_and_parses() {
        for proto in [Proto::Udp, Proto::Syn, Proto::Ack] {
            for size in [60, 64, 74, 128, 576, 1500, 1514] {
                let mut buf = vec![0u8; 2048];
                let len = write(&mut buf, &pkt(proto), size);
                assert!(len >= size.min(FRAME_MAX));
                assert!(checksums_ok(&buf[..len]), "{proto:?} {size}");
                let r = parse(&buf[..len]).unwrap();
                assert_eq!(r.seq, 0xdead_beef);
                assert_eq!(r.ts_ns, 123_456_789_000);
            }
        }
    }

    #[test]
    fn reusing_a_tcp_frame_for_udp_leaves_no_stale_bytes() {
        let mut buf = vec![0u8; 2048];
        write(&mut buf, &pkt(Proto::Ack), 128);
        let len = write(&mut buf, &pkt(Proto::Udp), 128);
        assert!(checksums_ok(&buf[..len]));
        assert!(buf[UDP_MIN..len].iter().all(|&b| b == 0));
    }

    #[test]
    fn payload_offsets_match_the_reflector() {
        let mut buf = vec![0u8; 2048];
        let len = write(&mut buf, &pkt(Proto::Udp), 64);
        let pl = &buf[L3_END + 8..len];
        assert_eq!(&pl[12..16], &[198, 18, 0, 17]);
        assert_eq!(u16::from_be_bytes([pl[16], pl[17]]), 1234);
        assert_eq!(u16::from_be_bytes([pl[18], pl[19]]), 9000);
    }
}
