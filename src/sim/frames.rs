//! The frames `xvs sim` sends through the pipeline, and what it reads back from the frames
//! the pipeline transmits: untagged Ethernet, IPv4 without options (TTL 64, DF) or IPv6
//! without extension headers (hop limit 64), a TCP segment without options or payload, a
//! UDP datagram of [`UDP_PAYLOAD`], or an SCTP packet of one chunk; every checksum right
//! (the pipeline verifies TCP's on state changes, UDP's before a reject, SCTP's CRC32c on
//! every packet).

use std::net::{IpAddr, SocketAddr};

use config::Protocol;
use fastpath::wire::{SctpPacket, checksum};

/// What a simulated UDP datagram carries.
pub const UDP_PAYLOAD: &[u8] = b"xvs sim\n";

/// The MACs of simulated frames (the pipeline does not check them).
const MAC_XVS: [u8; 6] = fastpath::pipeline::DEFAULT_MAC;
const MAC_PEER: [u8; 6] = [0x02, 0, 0, 0, 0x51, 0x01];

/// One packet to build.
#[derive(Clone, Copy, Debug)]
pub struct Seg {
    pub proto: Protocol,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// TCP: flags, sequence and acknowledgment numbers.
    pub flags: u8,
    pub seq: u32,
    pub ack: u32,
    /// SCTP: the chunk type.
    pub chunk: u8,
}

impl Seg {
    /// A packet of `proto` from `src` to `dst`, flags and numbers zero.
    pub fn new(proto: Protocol, src: SocketAddr, dst: SocketAddr) -> Seg {
        Seg {
            proto,
            src,
            dst,
            flags: 0,
            seq: 0,
            ack: 0,
            chunk: 0,
        }
    }
}

/// Writes `s` as an Ethernet frame into `out` (cleared first).
pub fn build(out: &mut Vec<u8>, s: &Seg) {
    out.clear();
    out.extend_from_slice(&MAC_XVS);
    out.extend_from_slice(&MAC_PEER);
    let l4 = l4_bytes(s);
    let proto = s.proto.ip_proto();
    match (s.src.ip(), s.dst.ip()) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            out.extend_from_slice(&[0x08, 0x00]);
            let total = (20 + l4.len()) as u16;
            let mut h = [0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0];
            h[2..4].copy_from_slice(&total.to_be_bytes());
            let at = out.len();
            out.extend_from_slice(&h);
            out.extend_from_slice(&a.octets());
            out.extend_from_slice(&b.octets());
            let c = checksum::checksum(&out[at..at + 20]);
            out[at + 10..at + 12].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            out.extend_from_slice(&[0x86, 0xdd]);
            let mut h = [0x60, 0, 0, 0, 0, 0, proto, 64];
            h[4..6].copy_from_slice(&(l4.len() as u16).to_be_bytes());
            out.extend_from_slice(&h);
            out.extend_from_slice(&a.octets());
            out.extend_from_slice(&b.octets());
        }
        // (The input's parser refuses mixed families.)
        _ => {}
    }
    let at = out.len();
    out.extend_from_slice(&l4);
    fill_l4_checksum(out, at, s);
}

/// The L4 bytes of `s`, checksum zero.
fn l4_bytes(s: &Seg) -> Vec<u8> {
    let (sp, dp) = (s.src.port().to_be_bytes(), s.dst.port().to_be_bytes());
    let mut v = Vec::with_capacity(32);
    v.extend_from_slice(&sp);
    v.extend_from_slice(&dp);
    match s.proto {
        Protocol::Tcp => {
            v.extend_from_slice(&s.seq.to_be_bytes());
            v.extend_from_slice(&s.ack.to_be_bytes());
            v.extend_from_slice(&[0x50, s.flags, 0xff, 0xff, 0, 0, 0, 0]);
        }
        Protocol::Udp => {
            v.extend_from_slice(&((8 + UDP_PAYLOAD.len()) as u16).to_be_bytes());
            v.extend_from_slice(&[0, 0]);
            v.extend_from_slice(UDP_PAYLOAD);
        }
        _ => {
            // Verification tag, checksum, then one chunk: type, flags, length, and 16 bytes
            // of its fields (an INIT's initiate tag, window, streams and TSN).
            v.extend_from_slice(&[0; 8]);
            let len: u16 = if matches!(s.chunk, 1 | 2) { 20 } else { 4 };
            v.extend_from_slice(&[s.chunk, 0]);
            v.extend_from_slice(&len.to_be_bytes());
            if len == 20 {
                v.extend_from_slice(&[0x5a; 16]);
            }
        }
    }
    v
}

fn fill_l4_checksum(out: &mut [u8], at: usize, s: &Seg) {
    let proto = s.proto.ip_proto();
    let c = match (s.src.ip(), s.dst.ip()) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            checksum::l4_checksum_v4(&a.octets(), &b.octets(), proto, &out[at..])
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            checksum::l4_checksum_v6(&a.octets(), &b.octets(), proto, &out[at..])
        }
        _ => 0,
    };
    match s.proto {
        Protocol::Tcp => out[at + 16..at + 18].copy_from_slice(&c.to_be_bytes()),
        Protocol::Udp => {
            out[at + 6..at + 8].copy_from_slice(&checksum::udp_nonzero(c).to_be_bytes())
        }
        _ => SctpPacket::new_unchecked(&mut out[at..]).fill_checksum(),
    }
}

/// What the pipeline transmitted, read back: its addresses and, for TCP, its sequence
/// number. `None` for anything but untagged IPv4/IPv6 with ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
}

/// Reads a transmitted frame. A DSR frame (IPIP, or GUE: UDP to `gue_port`) reads as the
/// client's packet inside it, sent to its backend (the outer destination) on the packet's
/// destination port (the backend's decapsulation serves it there, or translates it).
pub fn read(f: &[u8], gue_port: u16) -> Option<Sent> {
    let ethertype = f.get(12..14)?;
    let ip = read_ip(f, 14, ethertype == [0x86, 0xdd])?;
    let (src, dst, l4) = (ip.0, ip.1, ip.3);
    let gue = ip.2 == 17 && f.get(l4 + 2..l4 + 4) == Some(&gue_port.to_be_bytes()[..]);
    let inner = match ip.2 {
        4 | 41 => Some(l4),
        _ if gue => Some(l4 + 8),
        _ => None,
    };
    if let Some(at) = inner {
        let v6 = f.get(at)? >> 4 == 6;
        let mut frame = f[..12].to_vec();
        frame.extend_from_slice(if v6 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
        frame.extend_from_slice(f.get(at..)?);
        let sent = read(&frame, 0)?;
        return Some(Sent {
            dst: SocketAddr::new(dst, sent.dst.port()),
            ..sent
        });
    }
    let port = |at: usize| f.get(at..at + 2).map(|p| u16::from_be_bytes([p[0], p[1]]));
    let seq = f
        .get(l4 + 4..l4 + 8)
        .map_or(0, |s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]));
    Some(Sent {
        src: SocketAddr::new(src, port(l4)?),
        dst: SocketAddr::new(dst, port(l4 + 2)?),
        seq,
    })
}

/// The IP header at `at` (`v6`, else IPv4): source, destination, protocol, where L4 starts.
fn read_ip(f: &[u8], at: usize, v6: bool) -> Option<(IpAddr, IpAddr, u8, usize)> {
    if v6 {
        let a: [u8; 16] = f.get(at + 8..at + 24)?.try_into().ok()?;
        let b: [u8; 16] = f.get(at + 24..at + 40)?.try_into().ok()?;
        return Some((IpAddr::from(a), IpAddr::from(b), *f.get(at + 6)?, at + 40));
    }
    if f.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let ihl = usize::from(f.get(at)? & 0x0f) * 4;
    let a: [u8; 4] = f.get(at + 12..at + 16)?.try_into().ok()?;
    let b: [u8; 4] = f.get(at + 16..at + 20)?.try_into().ok()?;
    Some((IpAddr::from(a), IpAddr::from(b), *f.get(at + 9)?, at + ihl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_frames_have_right_checksums_and_read_back() {
        let mut out = Vec::new();
        for (src, dst) in [
            ("198.18.0.2:1000", "198.18.100.1:80"),
            ("[2001:2::5]:999", "[2001:2:0:100::1]:3868"),
        ] {
            let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            for (proto, chunk) in [(Protocol::Tcp, 0), (Protocol::Udp, 0), (Protocol::Sctp, 1)] {
                let s = Seg {
                    flags: 0x02,
                    seq: 7,
                    chunk,
                    ..Seg::new(proto, src, dst)
                };
                build(&mut out, &s);
                let l4 = if src.is_ipv4() { 34 } else { 54 };
                if src.is_ipv4() {
                    assert_eq!(checksum::checksum(&out[14..34]), 0);
                }
                match proto {
                    Protocol::Sctp => {
                        assert!(SctpPacket::new_unchecked(&out[l4..]).verify_checksum())
                    }
                    _ => {
                        let c = match (src.ip(), dst.ip()) {
                            (IpAddr::V4(a), IpAddr::V4(b)) => checksum::l4_checksum_v4(
                                &a.octets(),
                                &b.octets(),
                                proto.ip_proto(),
                                &out[l4..],
                            ),
                            (IpAddr::V6(a), IpAddr::V6(b)) => checksum::l4_checksum_v6(
                                &a.octets(),
                                &b.octets(),
                                proto.ip_proto(),
                                &out[l4..],
                            ),
                            _ => unreachable!(),
                        };
                        assert_eq!(c, 0, "{proto:?}");
                    }
                }
                let r = read(&out, 6080).unwrap();
                assert_eq!((r.src, r.dst), (src, dst));
                if proto == Protocol::Tcp {
                    assert_eq!(r.seq, 7);
                }
            }
        }
    }

    /// A DSR frame reads as the client's packet to the backend: IPIP (IPv4, IPv6) and GUE.
    #[test]
    fn dsr_frames_read_as_the_inner_packet_to_the_backend() {
        let (src, dst): (SocketAddr, SocketAddr) = (
            "198.18.0.2:1000".parse().unwrap(),
            "198.18.100.1:80".parse().unwrap(),
        );
        let mut inner = Vec::new();
        build(
            &mut inner,
            &Seg {
                flags: 0x02,
                seq: 7,
                ..Seg::new(Protocol::Tcp, src, dst)
            },
        );
        let ip = &inner[14..];
        let mut ipip = inner[..14].to_vec();
        ipip.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0, 0, 64, 4, 0, 0]);
        ipip.extend_from_slice(&[198, 18, 1, 254, 198, 18, 1, 7]);
        ipip.extend_from_slice(ip);
        let mut gue = ipip.clone();
        gue[23] = 17;
        let udp = [0xc0, 1, 0x17, 0xc0, 0, 0, 0, 0]; // to 6080
        gue.splice(34..34, udp);
        for f in [&ipip, &gue] {
            let r = read(f, 6080).unwrap();
            assert_eq!(r.src, src);
            assert_eq!(r.dst, "198.18.1.7:80".parse().unwrap());
            assert_eq!(r.seq, 7);
        }
        // UDP to another port is no GUE.
        assert_ne!(read(&gue, 6081).unwrap().dst.port(), 80);
    }
}
