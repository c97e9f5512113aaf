//! The `check_len` contract under random input: random bytes and mutated valid frames go
//! through every `new_checked` (and `new_quoted`), then every accessor and the setters that
//! keep lengths; nothing may panic. A panic fails the proptest case.

use etherparse::PacketBuilder;
use fastpath::wire::{
    EtherType, EthernetAddress, EthernetFrame, Icmpv4Packet, Icmpv6Packet, IpProtocol, Ipv4Packet,
    Ipv6Packet, SctpPacket, TcpFlags, TcpPacket, UdpPacket, checksum, l4_update_for_addr_change,
    parse_frame,
};
use proptest::collection::vec;
use proptest::prelude::*;
use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

const V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 9);
const V6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 9);

fn ethernet(buf: &mut [u8]) {
    if let Ok(mut f) = EthernetFrame::new_checked(&mut *buf) {
        black_box((
            f.dst_addr(),
            f.src_addr(),
            f.ethertype(),
            f.inner_ethertype(),
        ));
        black_box((f.vlan_tci(), f.vlan_id(), f.header_len(), f.payload().len()));
        f.set_dst_addr(EthernetAddress([1; 6]));
        f.set_src_addr(EthernetAddress::BROADCAST);
        f.set_vlan_tci(7);
        f.set_inner_ethertype(f.inner_ethertype());
        black_box(f.payload_mut().len());
    }
}

fn ipv4(buf: &mut [u8]) {
    if let Ok(mut p) = Ipv4Packet::new_checked(&mut *buf) {
        black_box((
            p.version(),
            p.header_len(),
            p.dscp(),
            p.ecn(),
            p.total_len(),
            p.ident(),
        ));
        black_box((
            p.dont_frag(),
            p.more_frags(),
            p.frag_offset(),
            p.is_fragment(),
        ));
        black_box((p.is_later_fragment(), p.ttl(), p.protocol(), p.checksum()));
        black_box((
            p.src_addr(),
            p.dst_addr(),
            p.options(),
            p.payload(),
            p.verify_checksum(),
        ));
        black_box((p.pseudo_header_sum(), p.payload_quoted()));
        let proto = p.protocol();
        let old = p.set_src_addr_incremental(V4);
        let _ = l4_update_for_addr_change(proto, p.payload_mut(), &old.octets(), &V4.octets());
        p.set_dst_addr_incremental(V4);
        p.decrement_ttl();
        p.set_ttl_incremental(3);
        p.set_frag(true, true, 8);
        p.fill_checksum();
        black_box(p.options_mut().len());
        l4(proto, p.payload_mut(), false);
    }
    if let Ok(mut p) = Ipv4Packet::new_quoted(&mut *buf) {
        black_box((p.src_addr(), p.dst_addr(), p.header(), p.payload_quoted()));
        p.set_src_addr_incremental(V4);
        black_box(p.payload_quoted_mut().len());
    }
}

fn ipv6(buf: &mut [u8]) {
    if let Ok(mut p) = Ipv6Packet::new_checked(&mut *buf) {
        black_box((
            p.version(),
            p.traffic_class(),
            p.flow_label(),
            p.payload_len(),
        ));
        black_box((
            p.next_header(),
            p.hop_limit(),
            p.src_addr(),
            p.dst_addr(),
            p.payload(),
        ));
        black_box(p.pseudo_header_sum(IpProtocol::Tcp, 20));
        if let Ok(ext) = p.walk_ext_headers() {
            assert!(ext.l4_offset <= 40 + usize::from(p.payload_len()));
            let old = p.set_dst_addr(V6);
            let l4_bytes = &mut p.payload_mut()[ext.l4_offset - 40..];
            let _ = l4_update_for_addr_change(ext.protocol, l4_bytes, &old.octets(), &V6.octets());
            l4(ext.protocol, l4_bytes, true);
        }
        p.decrement_hop_limit();
        p.set_version_tc_flow(1, 2);
    }
    if let Ok(p) = Ipv6Packet::new_quoted(&*buf) {
        let _ = black_box((p.payload_quoted(), p.walk_ext_headers()));
    }
}

fn l4(proto: IpProtocol, buf: &mut [u8], v6: bool) {
    match proto {
        IpProtocol::Tcp => tcp(buf, v6),
        IpProtocol::Udp => udp(buf, v6),
        IpProtocol::Sctp => sctp(buf),
        IpProtocol::Icmp => icmpv4(buf),
        IpProtocol::Icmpv6 => icmpv6(buf),
        _ => {}
    }
}

fn tcp(buf: &mut [u8], v6: bool) {
    if let Ok(mut t) = TcpPacket::new_checked(&mut *buf) {
        black_box((
            t.src_port(),
            t.dst_port(),
            t.seq_number(),
            t.ack_number(),
            t.header_len(),
        ));
        black_box((
            t.flags().contains(TcpFlags::SYN),
            t.window_len(),
            t.checksum(),
        ));
        black_box((t.urgent_at(), t.options(), t.payload()));
        black_box((t.verify_checksum_v4(V4, V4), t.verify_checksum_v6(V6, V6)));
        t.set_src_port_incremental(1);
        t.set_dst_port_incremental(2);
        t.set_flags(TcpFlags::RST);
        if v6 {
            t.fill_checksum_v6(V6, V6)
        } else {
            t.fill_checksum_v4(V4, V4)
        }
        black_box(t.payload_mut().len());
    }
}

fn udp(buf: &mut [u8], v6: bool) {
    if let Ok(mut u) = UdpPacket::new_checked(&mut *buf) {
        black_box((
            u.src_port(),
            u.dst_port(),
            u.len(),
            u.checksum(),
            u.payload(),
            u.datagram(),
        ));
        black_box((u.verify_checksum_v4(V4, V4), u.verify_checksum_v6(V6, V6)));
        u.set_src_port_incremental(1);
        u.set_dst_port_incremental(2);
        if v6 {
            u.fill_checksum_v6(V6, V6)
        } else {
            u.fill_checksum_v4(V4, V4)
        }
        assert_ne!(u.checksum(), 0);
        black_box(u.payload_mut().len());
    }
}

fn sctp(buf: &mut [u8]) {
    if let Ok(mut s) = SctpPacket::new_checked(&mut *buf) {
        black_box((
            s.src_port(),
            s.dst_port(),
            s.verification_tag(),
            s.checksum(),
        ));
        black_box((
            s.first_chunk_type(),
            s.first_chunk_flags(),
            s.first_chunk_len(),
        ));
        black_box((s.is_init(), s.chunks(), s.verify_checksum()));
        s.set_ports_and_fill_checksum(1, 2);
        assert!(s.verify_checksum());
        black_box(s.chunks_mut().len());
    }
}

fn icmpv4(buf: &mut [u8]) {
    if let Ok(mut i) = Icmpv4Packet::new_checked(&mut *buf) {
        black_box((
            i.msg_type(),
            i.msg_code(),
            i.dst_unreachable(),
            i.checksum(),
        ));
        black_box((
            i.echo_ident(),
            i.echo_seq_no(),
            i.next_hop_mtu(),
            i.is_error(),
        ));
        black_box((i.data(), i.verify_checksum()));
        if let Some(inner) = i.embedded() {
            let mut inner = inner.to_vec();
            ipv4(&mut inner);
        }
        i.set_echo_ident_incremental(9);
        i.fill_checksum();
        assert!(i.verify_checksum());
        black_box(i.data_mut().len());
    }
}

fn icmpv6(buf: &mut [u8]) {
    if let Ok(mut i) = Icmpv6Packet::new_checked(&mut *buf) {
        black_box((
            i.msg_type(),
            i.msg_code(),
            i.checksum(),
            i.echo_ident(),
            i.echo_seq_no(),
        ));
        black_box((i.mtu(), i.is_error(), i.data(), i.verify_checksum(V6, V6)));
        if let Some(inner) = i.embedded() {
            let mut inner = inner.to_vec();
            ipv6(&mut inner);
        }
        i.set_echo_ident_incremental(9);
        i.fill_checksum(V6, V6);
        assert!(i.verify_checksum(V6, V6));
        black_box(i.data_mut().len());
    }
}

/// Everything, on the frame and on the bytes at a few offsets.
fn exercise(bytes: &[u8]) {
    if let Ok(info) = parse_frame(bytes) {
        assert!(info.l4_offset + info.l4_len <= bytes.len());
        let mut frame = bytes.to_vec();
        if let Some(proto) = info.protocol() {
            l4(
                proto,
                &mut frame[info.l4_range()],
                info.ethertype == EtherType::Ipv6,
            );
        }
    }
    black_box(checksum::checksum(bytes));
    let mut copy = bytes.to_vec();
    ethernet(&mut copy);
    for start in [0usize, 14, 18] {
        let Some(tail) = bytes.get(start..) else {
            continue;
        };
        let mut t = tail.to_vec();
        ipv4(&mut t);
        let mut t = tail.to_vec();
        ipv6(&mut t);
        for v6 in [false, true] {
            let mut t = tail.to_vec();
            tcp(&mut t, v6);
            let mut t = tail.to_vec();
            udp(&mut t, v6);
        }
        let mut t = tail.to_vec();
        sctp(&mut t);
        let mut t = tail.to_vec();
        icmpv4(&mut t);
        let mut t = tail.to_vec();
        icmpv6(&mut t);
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let payload = [0x45u8; 24];
    let mac = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let v6a = V6.octets();
    let mut out = Vec::new();
    PacketBuilder::ethernet2(mac.0, mac.1)
        .ipv4([1, 2, 3, 4], [5, 6, 7, 8], 9)
        .tcp(1, 2, 3, 4)
        .write(&mut out, &payload)
        .unwrap();
    v.push(std::mem::take(&mut out));
    PacketBuilder::ethernet2(mac.0, mac.1)
        .single_vlan(etherparse::VlanId::try_new(5).unwrap())
        .ipv6(v6a, v6a, 9)
        .udp(1, 2)
        .write(&mut out, &payload)
        .unwrap();
    v.push(std::mem::take(&mut out));
    PacketBuilder::ethernet2(mac.0, mac.1)
        .ipv4([1, 2, 3, 4], [5, 6, 7, 8], 9)
        .icmpv4_raw(3, 4, [0, 0, 5, 0x78])
        .write(&mut out, &payload)
        .unwrap();
    v.push(std::mem::take(&mut out));
    PacketBuilder::ethernet2(mac.0, mac.1)
        .ipv6(v6a, v6a, 9)
        .icmpv6_raw(2, 0, [0, 0, 5, 0])
        .write(&mut out, &[0x60; 48])
        .unwrap();
    v.push(std::mem::take(&mut out));
    // IPv6 hop-by-hop -> fragment -> SCTP INIT, by hand.
    let mut f = vec![
        2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd, 0x60, 0, 0, 0, 0, 36, 0, 64,
    ];
    f.extend_from_slice(&v6a);
    f.extend_from_slice(&v6a);
    f.extend_from_slice(&[44, 0, 1, 4, 0, 0, 0, 0, 132, 0, 0, 1, 0, 0, 0, 1]);
    f.extend_from_slice(&[0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 8, 0, 0, 0, 0]);
    v.push(f);
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..160)) {
        exercise(&bytes);
    }

    /// Random bytes behind a plausible Ethernet + IP prefix, so the deeper parsers run.
    #[test]
    fn random_ip_payloads_never_panic(
        v6 in any::<bool>(),
        vlan in any::<bool>(),
        proto in prop_oneof![Just(0u8), Just(1), Just(6), Just(17), Just(43), Just(44),
                             Just(51), Just(58), Just(60), Just(132), any::<u8>()],
        len in any::<u16>(),
        ihl in 0u8..16,
        rest in vec(any::<u8>(), 0..120),
    ) {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        if vlan { f.extend_from_slice(&[0x81, 0, 0, 1]); }
        if v6 {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend_from_slice(&(len % 160).to_be_bytes());
            f.extend_from_slice(&[proto, 64]);
            f.extend_from_slice(&[0u8; 32]);
        } else {
            f.extend_from_slice(&[0x08, 0x00, 0x40 | ihl, 0]);
            f.extend_from_slice(&(len % 200).to_be_bytes());
            f.extend_from_slice(&[0, 0, 0, 0, 64, proto, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        }
        f.extend_from_slice(&rest);
        exercise(&f);
    }

    #[test]
    fn mutated_valid_frames_never_panic(
        seed in 0usize..5,
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut frame = seeds().swap_remove(seed);
        for (at, value) in edits {
            let i = at.index(frame.len());
            frame[i] = value;
        }
        exercise(&frame);
        let n = cut.index(frame.len() + 1);
        exercise(&frame[..n]);
    }
}

#[test]
fn seeds_parse() {
    for (i, s) in seeds().iter().enumerate() {
        let info = parse_frame(s).unwrap_or_else(|e| panic!("seed {i}: {e}"));
        assert!(info.protocol().is_some(), "seed {i}");
        exercise(s);
    }
}
