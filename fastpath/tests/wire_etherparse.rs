//! `fastpath::wire` against `etherparse` as the oracle: frames built with
//! `etherparse::PacketBuilder` must parse to the same fields, our full checksums must equal
//! the ones etherparse wrote, and every truncated prefix must be an error.

use etherparse::{
    IpNumber, Ipv6FragmentHeader, Ipv6Header, Ipv6RawExtHeader, NetHeaders, PacketBuilder,
    PacketHeaders, TcpHeader, TransportHeader, VlanId,
};
use fastpath::wire::{
    self, EtherType, EthernetFrame, Icmpv4Message, Icmpv4Packet, Icmpv6Message, Icmpv6Packet,
    IpProtocol, Ipv4Packet, Ipv6Packet, L3Info, TcpFlags, TcpPacket, UdpPacket, parse_frame,
};
use std::net::{Ipv4Addr, Ipv6Addr};

const MAC_SRC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_DST: [u8; 6] = [2, 0, 0, 0, 0, 2];
const V4_SRC: [u8; 4] = [198, 18, 0, 1];
const V4_DST: [u8; 4] = [198, 18, 100, 1];
const PAYLOAD: &[u8] = b"hello, xvs fastpath";

fn v6(last: u16) -> [u8; 16] {
    Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, last).octets()
}

#[derive(Clone, Copy, Debug)]
enum L4 {
    Tcp,
    Udp,
    Icmp,
}

fn build(v6_ip: bool, vlan: Option<u16>, l4: L4) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(MAC_SRC, MAC_DST);
    let mut out = Vec::new();
    macro_rules! finish {
        ($ip:expr) => {{
            let ip = $ip;
            match (l4, v6_ip) {
                (L4::Tcp, _) => ip
                    .tcp(40000, 80, 0x01020304, 64240)
                    .syn()
                    .ack(0x0a0b0c0d)
                    .psh()
                    .write(&mut out, PAYLOAD)
                    .unwrap(),
                (L4::Udp, _) => ip.udp(5353, 53).write(&mut out, PAYLOAD).unwrap(),
                (L4::Icmp, false) => ip
                    .icmpv4_echo_request(0x4242, 7)
                    .write(&mut out, PAYLOAD)
                    .unwrap(),
                (L4::Icmp, true) => ip
                    .icmpv6_echo_request(0x4242, 7)
                    .write(&mut out, PAYLOAD)
                    .unwrap(),
            }
        }};
    }
    match (vlan, v6_ip) {
        (None, false) => finish!(eth.ipv4(V4_SRC, V4_DST, 64)),
        (None, true) => finish!(eth.ipv6(v6(1), v6(0x100), 64)),
        (Some(id), false) => {
            finish!(
                eth.single_vlan(VlanId::try_new(id).unwrap())
                    .ipv4(V4_SRC, V4_DST, 64)
            )
        }
        (Some(id), true) => {
            finish!(
                eth.single_vlan(VlanId::try_new(id).unwrap())
                    .ipv6(v6(1), v6(0x100), 64)
            )
        }
    }
    out
}

fn all_frames() -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    for v6_ip in [false, true] {
        for vlan in [None, Some(100)] {
            for l4 in [L4::Tcp, L4::Udp, L4::Icmp] {
                v.push((
                    format!("v6={v6_ip} vlan={vlan:?} {l4:?}"),
                    build(v6_ip, vlan, l4),
                ));
            }
        }
    }
    v
}

#[test]
fn parse_agrees_with_etherparse() {
    for (name, frame) in all_frames() {
        let oracle = PacketHeaders::from_ethernet_slice(&frame).unwrap();
        let info = parse_frame(&frame).unwrap();
        let eth = EthernetFrame::new_checked(&frame[..]).unwrap();
        assert_eq!(eth.src_addr().0, MAC_SRC, "{name}");
        assert_eq!(eth.dst_addr().0, MAC_DST, "{name}");
        let oracle_vlan = oracle.vlan().map(|v| match v {
            etherparse::VlanHeader::Single(s) => s.vlan_id.value(),
            etherparse::VlanHeader::Double(d) => d.outer.vlan_id.value(),
        });
        assert_eq!(eth.vlan_id(), oracle_vlan, "{name}");
        assert_eq!(
            info.l3_offset,
            if oracle_vlan.is_some() { 18 } else { 14 },
            "{name}"
        );

        let l4_bytes = &frame[info.l4_range()];
        match oracle.net.as_ref().unwrap() {
            NetHeaders::Ipv4(h, _) => {
                assert_eq!(info.ethertype, EtherType::Ipv4);
                let ip = Ipv4Packet::new_checked(&frame[info.l3_offset..]).unwrap();
                assert_eq!(ip.src_addr().octets(), h.source, "{name}");
                assert_eq!(ip.dst_addr().octets(), h.destination, "{name}");
                assert_eq!(ip.ttl(), h.time_to_live);
                assert_eq!(ip.total_len(), h.total_len);
                assert_eq!(ip.ident(), h.identification);
                assert_eq!(ip.dont_frag(), h.dont_fragment);
                assert_eq!(ip.checksum(), h.header_checksum, "{name}");
                assert!(ip.verify_checksum(), "{name}");
                assert_eq!(u8::from(ip.protocol()), h.protocol.0);
                assert_eq!(info.l4_offset, info.l3_offset + h.header_len());
            }
            NetHeaders::Ipv6(h, _) => {
                assert_eq!(info.ethertype, EtherType::Ipv6);
                let ip = Ipv6Packet::new_checked(&frame[info.l3_offset..]).unwrap();
                assert_eq!(ip.src_addr().octets(), h.source, "{name}");
                assert_eq!(ip.dst_addr().octets(), h.destination, "{name}");
                assert_eq!(ip.hop_limit(), h.hop_limit);
                assert_eq!(ip.payload_len(), h.payload_length);
                assert_eq!(ip.flow_label(), h.flow_label.value());
                assert_eq!(u8::from(ip.next_header()), h.next_header.0);
                assert_eq!(info.l4_offset, info.l3_offset + 40);
            }
            NetHeaders::Arp(_) => unreachable!(),
        }

        match oracle.transport.as_ref().unwrap() {
            TransportHeader::Tcp(t) => {
                assert_eq!(info.protocol(), Some(IpProtocol::Tcp));
                let tcp = TcpPacket::new_checked(l4_bytes).unwrap();
                assert_eq!(
                    (tcp.src_port(), tcp.dst_port()),
                    (t.source_port, t.destination_port)
                );
                assert_eq!(tcp.seq_number(), t.sequence_number);
                assert_eq!(tcp.ack_number(), t.acknowledgment_number);
                assert_eq!(tcp.window_len(), t.window_size);
                assert_eq!(tcp.checksum(), t.checksum);
                assert_eq!(tcp.header_len(), t.header_len());
                assert_eq!(tcp.flags().contains(TcpFlags::SYN), t.syn);
                assert_eq!(tcp.flags().contains(TcpFlags::ACK), t.ack);
                assert_eq!(tcp.flags().contains(TcpFlags::PSH), t.psh);
                assert!(
                    !tcp.flags()
                        .intersects(TcpFlags::FIN | TcpFlags::RST | TcpFlags::URG)
                );
                assert_eq!(tcp.payload(), PAYLOAD);
            }
            TransportHeader::Udp(u) => {
                assert_eq!(info.protocol(), Some(IpProtocol::Udp));
                let udp = UdpPacket::new_checked(l4_bytes).unwrap();
                assert_eq!(
                    (udp.src_port(), udp.dst_port()),
                    (u.source_port, u.destination_port)
                );
                assert_eq!((udp.len(), udp.checksum()), (u.length, u.checksum));
                assert_eq!(udp.payload(), PAYLOAD);
            }
            TransportHeader::Icmpv4(i) => {
                assert_eq!(info.protocol(), Some(IpProtocol::Icmp));
                let icmp = Icmpv4Packet::new_checked(l4_bytes).unwrap();
                assert_eq!(icmp.msg_type(), Icmpv4Message::EchoRequest);
                assert_eq!((icmp.echo_ident(), icmp.echo_seq_no()), (0x4242, 7));
                assert_eq!(icmp.checksum(), i.checksum);
                assert!(icmp.verify_checksum());
                assert_eq!(icmp.data(), PAYLOAD);
            }
            TransportHeader::Icmpv6(i) => {
                assert_eq!(info.protocol(), Some(IpProtocol::Icmpv6));
                let icmp = Icmpv6Packet::new_checked(l4_bytes).unwrap();
                assert_eq!(icmp.msg_type(), Icmpv6Message::EchoRequest);
                assert_eq!((icmp.echo_ident(), icmp.echo_seq_no()), (0x4242, 7));
                assert_eq!(icmp.checksum(), i.checksum);
                assert!(icmp.verify_checksum(Ipv6Addr::from(v6(1)), Ipv6Addr::from(v6(0x100))));
            }
            TransportHeader::Igmp(_) => unreachable!(),
        }
    }
}

/// Zero every checksum, refill it with our full computation, and expect etherparse's bytes.
#[test]
fn full_checksums_equal_etherparse() {
    for (name, frame) in all_frames() {
        let info = parse_frame(&frame).unwrap();
        let mut mine = frame.clone();
        let (l3, rest) = mine.split_at_mut(info.l4_offset);
        let l3 = &mut l3[info.l3_offset..];
        let l4 = &mut rest[..info.l4_len];
        match info.ethertype {
            EtherType::Ipv4 => {
                // `l3` ends at the L4 offset: a header-only view.
                let mut ip = Ipv4Packet::new_quoted(&mut *l3).unwrap();
                ip.set_checksum(0);
                ip.fill_checksum();
                let (s, d) = (ip.src_addr(), ip.dst_addr());
                match info.protocol().unwrap() {
                    IpProtocol::Tcp => {
                        let mut t = TcpPacket::new_checked(l4).unwrap();
                        t.set_checksum(0xdead);
                        assert!(!t.verify_checksum_v4(s, d));
                        t.fill_checksum_v4(s, d);
                        assert!(t.verify_checksum_v4(s, d));
                    }
                    IpProtocol::Udp => UdpPacket::new_checked(l4).unwrap().fill_checksum_v4(s, d),
                    _ => Icmpv4Packet::new_checked(l4).unwrap().fill_checksum(),
                }
            }
            _ => {
                let ip = Ipv6Packet::new_quoted(&*l3).unwrap();
                let (s, d) = (ip.src_addr(), ip.dst_addr());
                match info.protocol().unwrap() {
                    IpProtocol::Tcp => TcpPacket::new_checked(l4).unwrap().fill_checksum_v6(s, d),
                    IpProtocol::Udp => {
                        let mut u = UdpPacket::new_checked(l4).unwrap();
                        u.fill_checksum_v6(s, d);
                        assert!(u.verify_checksum_v6(s, d));
                    }
                    _ => Icmpv6Packet::new_checked(l4).unwrap().fill_checksum(s, d),
                }
            }
        }
        assert_eq!(mine, frame, "{name}");
    }
}

#[test]
fn every_truncated_prefix_is_an_error() {
    for (name, frame) in all_frames() {
        for n in 0..frame.len() {
            assert!(
                parse_frame(&frame[..n]).is_err(),
                "{name}: prefix {n} parsed"
            );
        }
        // Ethernet padding after the IP packet is not an error and is not L4 data.
        let mut padded = frame.clone();
        padded.extend_from_slice(&[0u8; 30]);
        let info = parse_frame(&padded).unwrap();
        assert_eq!(info, parse_frame(&frame).unwrap(), "{name}");
        assert_eq!(info.l4_offset + info.l4_len, frame.len(), "{name}");
    }
}

#[test]
fn l4_length_errors() {
    let frame = build(false, None, L4::Tcp);
    let info = parse_frame(&frame).unwrap();
    let mut bad = frame.clone();
    bad[info.l4_offset + 12] = 0x40; // data offset 4
    assert_eq!(
        TcpPacket::new_checked(&bad[info.l4_range()]).unwrap_err(),
        wire::Error::BadDataOffset
    );
    bad[info.l4_offset + 12] = 0xf0; // 60 bytes, segment is 20 + 19
    assert_eq!(
        TcpPacket::new_checked(&bad[info.l4_range()]).unwrap_err(),
        wire::Error::BadDataOffset
    );

    let frame = build(true, Some(7), L4::Udp);
    let info = parse_frame(&frame).unwrap();
    let mut bad = frame.clone();
    let len_at = info.l4_offset + 4;
    bad[len_at..len_at + 2].copy_from_slice(&200u16.to_be_bytes());
    assert_eq!(
        UdpPacket::new_checked(&bad[info.l4_range()]).unwrap_err(),
        wire::Error::BadLength
    );
    bad[len_at..len_at + 2].copy_from_slice(&3u16.to_be_bytes());
    assert_eq!(
        UdpPacket::new_checked(&bad[info.l4_range()]).unwrap_err(),
        wire::Error::BadLength
    );

    let frame = build(false, Some(7), L4::Udp);
    let l3 = 18;
    let mut bad = frame.clone();
    bad[l3] = 0x43;
    assert_eq!(parse_frame(&bad), Err(wire::Error::BadIhl));
    let mut bad = frame.clone();
    bad[l3 + 2..l3 + 4].copy_from_slice(&19u16.to_be_bytes());
    assert_eq!(parse_frame(&bad), Err(wire::Error::BadLength));
    bad[l3 + 2..l3 + 4].copy_from_slice(&1000u16.to_be_bytes());
    assert_eq!(parse_frame(&bad), Err(wire::Error::Truncated));
}

/// IPv6 with hop-by-hop, fragment (first fragment, MF set) and TCP: our walk against
/// etherparse's extension-header parser.
#[test]
fn ipv6_ext_walk_hop_by_hop_fragment_tcp() {
    let tcp_payload = b"first fragment data";
    let mut tcp = TcpHeader::new(40000, 443, 9, 1000);
    tcp.syn = true;
    tcp.checksum = tcp
        .calc_checksum_ipv6_raw(v6(1), v6(0x100), tcp_payload)
        .unwrap();

    let hbh = Ipv6RawExtHeader::new_raw(IpNumber::IPV6_FRAGMENTATION_HEADER, &[1, 4, 0, 0, 0, 0])
        .unwrap();
    let frag = Ipv6FragmentHeader::new(
        IpNumber::TCP,
        etherparse::IpFragOffset::try_new(0).unwrap(),
        true,
        0xcafe_f00d,
    );
    let mut ext = Vec::new();
    ext.extend_from_slice(&hbh.to_bytes());
    ext.extend_from_slice(&frag.to_bytes());
    let mut l4 = tcp.to_bytes().to_vec();
    l4.extend_from_slice(tcp_payload);
    let ip = Ipv6Header {
        traffic_class: 0,
        flow_label: Default::default(),
        payload_length: (ext.len() + l4.len()) as u16,
        next_header: IpNumber::IPV6_HEADER_HOP_BY_HOP,
        hop_limit: 64,
        source: v6(1),
        destination: v6(0x100),
    };
    let mut frame = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd];
    frame.extend_from_slice(&ip.to_bytes());
    frame.extend_from_slice(&ext);
    frame.extend_from_slice(&l4);

    let oracle = PacketHeaders::from_ethernet_slice(&frame).unwrap();
    let Some(NetHeaders::Ipv6(_, exts)) = oracle.net else {
        panic!("oracle: not IPv6")
    };
    let ofrag = exts.fragment.clone().unwrap();
    assert!(exts.hop_by_hop_options.is_some());

    let p = Ipv6Packet::new_checked(&frame[14..]).unwrap();
    let walk = p.walk_ext_headers().unwrap();
    assert_eq!(walk.protocol, IpProtocol::Tcp);
    assert_eq!(walk.ext_count, 2);
    assert_eq!(walk.l4_offset, 40 + exts.header_len());
    let f = walk.fragment.unwrap();
    assert_eq!(f.offset, ofrag.fragment_offset.value() * 8);
    assert_eq!(f.more_frags, ofrag.more_fragments);
    assert_eq!(f.ident, ofrag.identification);
    assert_eq!(f.header_offset, 48);

    let info = parse_frame(&frame).unwrap();
    assert!(matches!(
        info.l3,
        L3Info::Ipv6 {
            protocol: IpProtocol::Tcp,
            fragment: Some(_)
        }
    ));
    assert!(
        info.has_l4_header(),
        "first fragment carries the TCP header"
    );
    let t = TcpPacket::new_checked(&frame[info.l4_range()]).unwrap();
    assert_eq!((t.src_port(), t.dst_port()), (40000, 443));
    assert!(t.verify_checksum_v6(p.src_addr(), p.dst_addr()));
    assert_eq!(t.payload(), tcp_payload);

    // A later fragment (offset 1448) has no L4 header.
    let mut later = frame.clone();
    let fo = 14 + 48 + 2;
    later[fo..fo + 2].copy_from_slice(&(1448u16 | 1).to_be_bytes());
    let info = parse_frame(&later).unwrap();
    assert!(!info.has_l4_header());
    match info.l3 {
        L3Info::Ipv6 {
            fragment: Some(f), ..
        } => assert_eq!((f.offset, f.more_frags), (1448, true)),
        other => panic!("{other:?}"),
    }

    for n in 0..frame.len() {
        assert!(parse_frame(&frame[..n]).is_err(), "prefix {n}");
    }
}

#[test]
fn ipv4_fragment_fields_agree() {
    let mut frame = build(false, None, L4::Udp);
    let l3 = 14;
    // MF set, offset 185 * 8 = 1480 bytes; ident 0xbeef; refill the header checksum.
    frame[l3 + 4..l3 + 6].copy_from_slice(&0xbeefu16.to_be_bytes());
    frame[l3 + 6..l3 + 8].copy_from_slice(&(0x2000u16 | 185).to_be_bytes());
    Ipv4Packet::new_checked(&mut frame[l3..])
        .unwrap()
        .fill_checksum();
    let oracle = etherparse::Ipv4HeaderSlice::from_slice(&frame[l3..]).unwrap();
    let ip = Ipv4Packet::new_checked(&frame[l3..]).unwrap();
    assert_eq!(ip.more_frags(), oracle.more_fragments());
    assert_eq!(ip.frag_offset(), oracle.fragments_offset().value() * 8);
    assert_eq!(ip.ident(), oracle.identification());
    assert_eq!(ip.checksum(), oracle.to_header().calc_header_checksum());
    let info = parse_frame(&frame).unwrap();
    assert_eq!(
        info.l3,
        L3Info::Ipv4 {
            protocol: IpProtocol::Udp,
            fragment: true,
            later_fragment: true
        }
    );
    assert!(!info.has_l4_header());
    let v4 = Ipv4Addr::from(V4_SRC);
    assert_eq!(ip.src_addr(), v4);
}
