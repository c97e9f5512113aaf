//! Stage 3: the header rewrite, both directions, with incremental checksums (RFC 1624).
//!
//! A flow has four endpoints (client, VIP, backend, SNAT; in `nat` mode SNAT = client). A
//! packet in the original direction arrives as client → VIP and leaves as SNAT → backend; a
//! reply arrives as backend → SNAT and leaves as VIP → client. [`after`] gives the outgoing
//! endpoints, [`rewrite`] applies them: MACs, TTL, addresses, ports, and every checksum that
//! covers a changed field (IPv4 header; TCP/UDP through the pseudo-header and ports; SCTP's
//! CRC32c recomputed). Only fields that change are touched.
//!
//! [`rewrite`] writes through the wire views. [`rewrite_v4`] and [`rewrite_v4_delta`], the
//! IPv4 TCP/UDP case the IPv4 shortcut shares, are the fixed-offset exception that
//! `fast.rs` documents and measures; a property test below checks them against the
//! field-by-field update.

use std::net::{IpAddr, SocketAddr};

use flowtable::{Direction, FlowData, v4_addrs_be, v4_ports_be, v4_wire_word};

use super::classify::{Frag, PROTO_SCTP, PROTO_TCP, PROTO_UDP, Packet};
use crate::wire::checksum::{self, Delta, add1c16};
use crate::wire::{
    EthernetAddress, EthernetFrame, Ipv4Packet, Ipv6Packet, SctpPacket, TcpPacket, UdpPacket,
};

/// Where a packet goes after translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Endpoints {
    /// New source address and port.
    pub src: SocketAddr,
    /// New destination address and port.
    pub dst: SocketAddr,
}

/// The outgoing endpoints of a packet of `flow` travelling in `dir`.
#[inline]
pub(crate) fn after(flow: &FlowData, dir: Direction) -> Endpoints {
    match dir {
        Direction::Original => Endpoints {
            src: flow.snat,
            dst: flow.backend,
        },
        Direction::Reply => Endpoints {
            src: flow.vip,
            dst: flow.client,
        },
    }
}

/// Address bytes (4 or 16) in a stack buffer.
#[derive(Clone, Copy)]
pub(crate) struct AddrBytes {
    buf: [u8; 16],
    len: usize,
}

impl AddrBytes {
    #[inline]
    pub fn new(ip: IpAddr) -> Self {
        let mut buf = [0u8; 16];
        let len = match ip {
            IpAddr::V4(v4) => {
                buf[..4].copy_from_slice(&v4.octets());
                4
            }
            IpAddr::V6(v6) => {
                buf = v6.octets();
                16
            }
        };
        AddrBytes { buf, len }
    }

    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Rewrites `frame` (classified as `p`) to leave as `to`: MACs, TTL − 1, addresses, and (when
/// the packet carries its L4 header) ports, with every checksum kept valid. Ports of `to` are
/// ignored for later fragments. The caller checked `p.ttl > 1`; `to` is of the packet's
/// family (a flow's four endpoints are).
///
/// Through the wire views over the offsets `classify` checked. The IPv4 TCP/UDP case goes to
/// [`rewrite_v4`], the fixed-offset form the fast path shares.
#[inline]
pub(crate) fn rewrite(
    frame: &mut [u8],
    p: &Packet,
    to: &Endpoints,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
) {
    let mut eth = EthernetFrame::new_unchecked(&mut *frame);
    eth.set_dst_addr(EthernetAddress(dst_mac));
    eth.set_src_addr(EthernetAddress(src_mac));
    let (src, dst) = (to.src.ip(), to.dst.ip());
    if let (false, true, PROTO_TCP | PROTO_UDP, IpAddr::V4(s), IpAddr::V4(d)) =
        (p.v6, p.has_l4(), p.proto, src, dst)
    {
        return rewrite_v4(
            frame,
            p.l3,
            p.l4,
            p.proto,
            pack_addrs(s.to_bits(), d.to_bits()),
            pack_ports(to.src.port(), to.dst.port()),
        );
    }
    let (src_changed, dst_changed) = (p.src != src, p.dst != dst);
    // The changed addresses' part of every checksum that covers them (the IPv4 header, the
    // L4 pseudo-header).
    let mut addrs = Delta::new();
    if src_changed {
        addrs.bytes(
            AddrBytes::new(p.src).as_slice(),
            AddrBytes::new(src).as_slice(),
        );
    }
    if dst_changed {
        addrs.bytes(
            AddrBytes::new(p.dst).as_slice(),
            AddrBytes::new(dst).as_slice(),
        );
    }
    if !rewrite_ip(frame, p, (src, dst), (src_changed, dst_changed), addrs) || !p.has_l4() {
        return;
    }
    rewrite_l4(&mut frame[p.l4..p.l4 + p.l4_len], p, to, addrs);
}

/// [`rewrite`]'s IP header: TTL − 1, the addresses that changed, the IPv4 header checksum
/// (with `addrs`, the addresses' delta). `false` when `src` and `dst` are not of the
/// packet's family (not reached: a flow's endpoints are of one family).
#[inline(always)]
fn rewrite_ip(
    frame: &mut [u8],
    p: &Packet,
    (src, dst): (IpAddr, IpAddr),
    (src_changed, dst_changed): (bool, bool),
    addrs: Delta,
) -> bool {
    match (src, dst) {
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut ip = Ipv6Packet::new_unchecked(&mut frame[p.l3..]);
            ip.set_hop_limit(p.ttl - 1);
            if src_changed {
                ip.set_src_addr(s);
            }
            if dst_changed {
                ip.set_dst_addr(d);
            }
        }
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut ip = Ipv4Packet::new_unchecked(&mut frame[p.l3..]);
            // One update for the TTL and the addresses.
            let mut header = addrs;
            let old_word = ip.ttl_protocol();
            ip.set_ttl(p.ttl - 1);
            header.word(old_word, ip.ttl_protocol());
            ip.set_checksum(header.apply(ip.checksum()));
            if src_changed {
                ip.set_src_addr(s);
            }
            if dst_changed {
                ip.set_dst_addr(d);
            }
        }
        _ => return false,
    }
    true
}

/// [`rewrite`]'s L4 header `seg`: the ports of `to`, and the checksum (TCP/UDP
/// incrementally, with `addrs`, the addresses' delta; SCTP's CRC32c recomputed when the
/// packet is whole).
#[inline(always)]
fn rewrite_l4(seg: &mut [u8], p: &Packet, to: &Endpoints, addrs: Delta) {
    let (sport, dport) = (to.src.port(), to.dst.port());
    let mut l4 = addrs;
    l4.word(p.sport, sport);
    l4.word(p.dport, dport);
    match p.proto {
        PROTO_TCP => {
            let mut tcp = TcpPacket::new_unchecked(seg);
            tcp.set_src_port(sport);
            tcp.set_dst_port(dport);
            tcp.set_checksum(l4.apply(tcp.checksum()));
        }
        PROTO_UDP => {
            let mut udp = UdpPacket::new_unchecked(seg);
            udp.set_src_port(sport);
            udp.set_dst_port(dport);
            // A zero UDP checksum (IPv4: "none") stays zero; a computed zero is sent as 0xffff.
            let old = udp.checksum();
            if old != 0 {
                udp.set_checksum(checksum::udp_nonzero(l4.apply(old)));
            }
        }
        PROTO_SCTP => {
            let mut sctp = SctpPacket::new_unchecked(seg);
            sctp.set_src_port(sport);
            sctp.set_dst_port(dport);
            if p.frag == Frag::No {
                sctp.fill_checksum();
            }
        }
        _ => {}
    }
}

/// Frame bytes `at..at + N`.
#[inline(always)]
fn ne<const N: usize>(d: &[u8], at: usize) -> [u8; N] {
    let mut b = [0u8; N];
    b.copy_from_slice(&d[at..at + N]);
    b
}

/// [`rewrite`] for the common case, an IPv4 TCP or UDP packet carrying its L4 header (`l3`,
/// `l4`: the header offsets; the caller checked the TTL > 1 and that the L4 checksum field
/// lies within the frame), to the endpoints `addrs` = new source | new destination << 32
/// (`Ipv4Addr::to_bits` values: host order), `ports` = new source port | new destination
/// port << 16. Everything but the MACs (the caller writes those).
#[inline]
pub(crate) fn rewrite_v4(
    frame: &mut [u8],
    l3: usize,
    l4: usize,
    proto: u8,
    addrs: u64,
    ports: u32,
) {
    let old_addrs = v4_wire_word(u64::from_ne_bytes(ne(frame, l3 + 12)), 32);
    let old_ports = v4_wire_word(u64::from(u32::from_ne_bytes(ne(frame, l4))), 16) as u32;
    let (addrs, ports) = (v4_addrs_be(addrs), v4_ports_be(ports));
    let delta = flowtable::v4_csum_delta_be((old_addrs, old_ports), (addrs, ports));
    let delta = flowtable::v4_forward_delta(delta);
    rewrite_v4_delta(frame, l3, l4, l4_csum_at(l4, proto), addrs, ports, delta);
}

/// Where the checksum of a TCP or UDP header at `l4` is.
#[inline(always)]
pub(crate) fn l4_csum_at(l4: usize, proto: u8) -> usize {
    if proto == PROTO_TCP { l4 + 16 } else { l4 + 6 }
}

/// [`rewrite_v4`] with the checksum adjustment known (a [`flowtable::V4Hit`]'s
/// `csum_delta`: [`flowtable::v4_csum_delta_be`] from the frame's tuple to the new one, with
/// the TTL's decrement, [`flowtable::v4_forward_delta`]), to endpoints packed as a `V4Hit`
/// gives them: `addrs` and `ports` as `rewrite_v4`'s, each in network byte order
/// ([`flowtable::v4_addrs_be`], [`flowtable::v4_ports_be`]).
///
/// Byte for byte `rewrite`'s result: `v4_csum_delta` adds the same 16-bit words `rewrite`
/// adds (and `v4_forward_delta` the TTL's), and folds them without changing what
/// `~(~HC + delta)` gives; each checksum takes one 16-bit add with its end-around carry
/// ([`add1c16`]), which reaches the value the folds reach. The sums here run on
/// the wire bytes loaded as native-endian words: a one's complement sum is byte-order
/// independent (RFC 1071 §2(B)), so the checksums come out as big-endian arithmetic gives
/// them; the adjustment comes in network byte order already, so no byte is swapped.
#[inline(always)]
pub(crate) fn rewrite_v4_delta(
    frame: &mut [u8],
    l3: usize,
    l4: usize,
    csum_at: usize,
    addrs: u64,
    ports: u32,
    delta: u32,
) {
    // l4 << 16 | ip, each in network byte order: addable to the fields as loaded.
    let (ip_delta, l4_delta) = (delta as u16, (delta >> 16) as u16);
    frame[l3 + 8] = frame[l3 + 8].wrapping_sub(1);
    let old_ip = u16::from_ne_bytes(ne(frame, l3 + 10));
    // The TTL's term is in the delta already (`v4_forward_delta`).
    let ip = add1c16(!old_ip, ip_delta);
    frame[l3 + 10..l3 + 12].copy_from_slice(&(!ip).to_ne_bytes());
    // Network order already: stored as they are (a plain store on a little-endian machine).
    frame[l3 + 12..l3 + 20].copy_from_slice(&v4_wire_word(addrs, 32).to_ne_bytes());
    let ports = v4_wire_word(u64::from(ports), 16) as u32;
    frame[l4..l4 + 4].copy_from_slice(&ports.to_ne_bytes());
    let old = u16::from_ne_bytes(ne(frame, csum_at));
    let new = !add1c16(!old, l4_delta);
    // UDP's checksum is 6 bytes in, TCP's 16.
    let new = if csum_at == l4 + 6 {
        // A zero UDP checksum (IPv4: "none") stays zero; a computed zero is sent as 0xffff.
        if old == 0 {
            0
        } else {
            checksum::udp_nonzero(new)
        }
    } else {
        new
    };
    frame[csum_at..csum_at + 2].copy_from_slice(&new.to_ne_bytes());
}

/// `src | dst << 32` of two IPv4 addresses (`Ipv4Addr::to_bits` values).
#[inline(always)]
pub(crate) fn pack_addrs(src: u32, dst: u32) -> u64 {
    u64::from(src) | u64::from(dst) << 32
}

/// `src | dst << 16` of two ports.
#[inline(always)]
pub(crate) fn pack_ports(src: u16, dst: u16) -> u32 {
    u32::from(src) | u32::from(dst) << 16
}

/// Destination then source MAC, as a frame carries them.
#[inline(always)]
pub(crate) fn macs(dst_mac: [u8; 6], src_mac: [u8; 6]) -> [u8; 12] {
    let mut m = [0u8; 12];
    m[..6].copy_from_slice(&dst_mac);
    m[6..].copy_from_slice(&src_mac);
    m
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::wire::{read_u16, write_u16};

    /// The IPv4 part of `rewrite` before `rewrite_v4` took it over: every changed 16-bit word
    /// through a `Delta`, big-endian.
    fn reference(frame: &mut [u8], l4: usize, proto: u8, addrs: u64, ports: u32) {
        let l3 = 14;
        let (src, dst) = (addrs as u32, (addrs >> 32) as u32);
        let (sport, dport) = (ports as u16, (ports >> 16) as u16);
        let old_src: [u8; 4] = frame[l3 + 12..l3 + 16].try_into().unwrap();
        let old_dst: [u8; 4] = frame[l3 + 16..l3 + 20].try_into().unwrap();
        let (old_sport, old_dport) = (read_u16(frame, l4), read_u16(frame, l4 + 2));
        let (src_changed, dst_changed) =
            (old_src != src.to_be_bytes(), old_dst != dst.to_be_bytes());
        let mut ip = Delta::new();
        let old_word = read_u16(frame, l3 + 8);
        frame[l3 + 8] -= 1;
        ip.word(old_word, read_u16(frame, l3 + 8));
        if src_changed {
            ip.bytes(&old_src, &src.to_be_bytes());
        }
        if dst_changed {
            ip.bytes(&old_dst, &dst.to_be_bytes());
        }
        let c = ip.apply(read_u16(frame, l3 + 10));
        write_u16(frame, l3 + 10, c);
        frame[l3 + 12..l3 + 16].copy_from_slice(&src.to_be_bytes());
        frame[l3 + 16..l3 + 20].copy_from_slice(&dst.to_be_bytes());
        let csum_at = if proto == PROTO_TCP { l4 + 16 } else { l4 + 6 };
        let mut d = Delta::new();
        if src_changed {
            d.bytes(&old_src, &src.to_be_bytes());
        }
        if dst_changed {
            d.bytes(&old_dst, &dst.to_be_bytes());
        }
        d.word(old_sport, sport);
        d.word(old_dport, dport);
        write_u16(frame, l4, sport);
        write_u16(frame, l4 + 2, dport);
        let old = read_u16(frame, csum_at);
        let new = if proto == PROTO_UDP {
            if old == 0 {
                0
            } else {
                checksum::udp_nonzero(d.apply(old))
            }
        } else {
            d.apply(old)
        };
        write_u16(frame, csum_at, new);
    }

    /// Addresses and ports with their edge values (0, all ones) likely.
    fn word32() -> impl Strategy<Value = u32> {
        prop_oneof![Just(0u32), Just(u32::MAX), Just(0xffff_0000), any::<u32>()]
    }

    fn word16() -> impl Strategy<Value = u16> {
        prop_oneof![Just(0u16), Just(u16::MAX), any::<u16>()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// `rewrite_v4` (and the flow table's precomputed adjustment) give the reference's
        /// bytes, checksum edge cases included.
        #[test]
        fn rewrite_v4_matches_the_word_by_word_update(
            udp in any::<bool>(),
            options in 0usize..3,
            ttl in 2u8..=255,
            old in (word32(), word32(), word16(), word16()),
            new in (word32(), word32(), word16(), word16()),
            keep in (any::<bool>(), any::<bool>(), any::<bool>()),
            ip_csum in word16(),
            l4_csum in word16(),
            rest in any::<[u8; 32]>(),
        ) {
            let proto = if udp { PROTO_UDP } else { PROTO_TCP };
            let l4 = 34 + 4 * options;
            let mut frame = vec![0u8; l4 + 20];
            frame[14..].iter_mut().zip(rest.iter().cycle()).for_each(|(b, r)| *b = *r);
            frame[14 + 8] = ttl;
            frame[14 + 9] = proto;
            write_u16(&mut frame, 14 + 10, ip_csum);
            frame[14 + 12..14 + 16].copy_from_slice(&old.0.to_be_bytes());
            frame[14 + 16..14 + 20].copy_from_slice(&old.1.to_be_bytes());
            write_u16(&mut frame, l4, old.2);
            write_u16(&mut frame, l4 + 2, old.3);
            write_u16(&mut frame, if udp { l4 + 6 } else { l4 + 16 }, l4_csum);
            // Unchanged fields are the interesting edge: keep some.
            let src = if keep.0 { old.0 } else { new.0 };
            let dst = if keep.1 { old.1 } else { new.1 };
            let sport = if keep.2 { old.2 } else { new.2 };
            let addrs = pack_addrs(src, dst);
            let ports = pack_ports(sport, new.3);
            let mut want = frame.clone();
            reference(&mut want, l4, proto, addrs, ports);
            let mut got = frame.clone();
            rewrite_v4(&mut got, 14, l4, proto, addrs, ports);
            prop_assert_eq!(&got, &want);
            // In network order, as the flow table keeps tuples and adjustments.
            let (addrs, ports) = (v4_addrs_be(addrs), v4_ports_be(ports));
            let from = (v4_addrs_be(pack_addrs(old.0, old.1)), v4_ports_be(pack_ports(old.2, old.3)));
            let delta = flowtable::v4_forward_delta(flowtable::v4_csum_delta_be(from, (addrs, ports)));
            let mut got = frame.clone();
            rewrite_v4_delta(&mut got, 14, l4, l4_csum_at(l4, proto), addrs, ports, delta);
            prop_assert_eq!(&got, &want);
        }
    }
}
