//! Router hygiene (`pipeline::hygiene`): a fixture case per drop reason (martian and own
//! sources, martian ICMP destinations, bad ICMP checksums, bad SCTP CRC32c, oversized
//! fragments), through `process` and `process_batch`, and proptests generating frames with
//! each bad property. Frames for no frontend stay `Pass`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use etherparse::{Icmpv4Type, Icmpv6Type, PacketBuilder, icmpv4::DestUnreachableHeader};
use fastpath::pipeline::{DropReason, Pipeline, Verdict};
use fastpath::testing::*;
use fastpath::wire::checksum;
use proptest::prelude::*;

const C4: &str = "198.18.0.1:40001";
const VIP: &str = "198.18.100.1:80";
const B1: &str = "198.18.1.1:8080";
const SNAT4: &str = "198.18.1.254:40000";
const VIPS: &str = "198.18.100.9:3868";
const BS: &str = "198.18.1.1:3868";
const C6: &str = "[2001:2::1]:40001";
const VIP6: &str = "[2001:2:0:100::1]:80";
const B6: &str = "[2001:2:0:1::1]:8080";
const SNAT6: &str = "[2001:2:0:1::fe]:40000";

fn cin(src: &str, dst: &str, l4: L4) -> Vec<u8> {
    frame(CLIENT_MAC, XVS_MAC, sa(src), sa(dst), 64, l4)
}

/// `f` through `p`, expecting `want`; a frame not transmitted must be left as it came.
fn expect(p: &mut Pipeline, desc: &str, f: &[u8], want: Verdict) -> Vec<u8> {
    let mut g = f.to_vec();
    let got = p.process(&mut g, Instant::now());
    assert_eq!(got, want, "{desc}");
    if matches!(got, Verdict::Tx(_)) {
        verify_checksums(&g, desc);
    } else {
        assert_eq!(g, f, "{desc}: frame changed");
    }
    g
}

/// The same frames through `process_batch` on a fresh pipeline: the same verdicts.
fn batch_agrees(frames: &[(Vec<u8>, Verdict)]) {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let mut bufs: Vec<Vec<u8>> = frames.iter().map(|(f, _)| f.clone()).collect();
    let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let mut verdicts = vec![Verdict::Pass; refs.len()];
    p.process_batch(&mut refs[..], epoch, &mut verdicts);
    let want: Vec<Verdict> = frames.iter().map(|(_, v)| *v).collect();
    assert_eq!(verdicts, want, "process_batch");
}

/// An IPv4 ICMP error `src` → `dst` quoting `quote`.
fn icmp4(src: &str, dst: &str, ty: Icmpv4Type, quote: &[u8]) -> Vec<u8> {
    let (s, d): (Ipv4Addr, Ipv4Addr) = (src.parse().unwrap(), dst.parse().unwrap());
    let mut v = Vec::new();
    PacketBuilder::ethernet2(B1_MAC, XVS_MAC)
        .ipv4(s.octets(), d.octets(), 64)
        .icmpv4(ty)
        .write(&mut v, quote)
        .unwrap();
    v
}

fn icmp6(src: &str, dst: &str, ty: Icmpv6Type, quote: &[u8]) -> Vec<u8> {
    let (s, d): (Ipv6Addr, Ipv6Addr) = (src.parse().unwrap(), dst.parse().unwrap());
    let mut v = Vec::new();
    PacketBuilder::ethernet2(B61_MAC, XVS_MAC)
        .ipv6(s.octets(), d.octets(), 64)
        .icmpv6(ty)
        .write(&mut v, quote)
        .unwrap();
    v
}

/// The IP packet xvs sent for `frame(src → dst)`, as an error quotes it.
fn sent(src: &str, dst: &str, l4: L4) -> Vec<u8> {
    frame(XVS_MAC, B1_MAC, sa(src), sa(dst), 63, l4)[14..].to_vec()
}

fn unreach() -> Icmpv4Type {
    Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Port)
}

const TOO_BIG: Icmpv6Type = Icmpv6Type::PacketTooBig { mtu: 1280 };

/// The ICMP(v6) checksum of an untagged error frame made right again.
fn fix_icmp(f: &mut [u8]) {
    if f[12..14] == [0x08, 0x00] {
        f[36..38].fill(0);
        let c = checksum::checksum(&f[34..]);
        f[36..38].copy_from_slice(&c.to_be_bytes());
    } else {
        f[56..58].fill(0);
        let (s, d): ([u8; 16], [u8; 16]) =
            (f[22..38].try_into().unwrap(), f[38..54].try_into().unwrap());
        let c = checksum::l4_checksum_v6(&s, &d, 58, &f[54..]);
        f[56..58].copy_from_slice(&c.to_be_bytes());
    }
}

/// An IPv6 fragment `src` → `dst` (UDP): fragment header (id `id`, byte `offset`, `more`),
/// then `data`.
fn frag6(src: &str, dst: &str, id: u32, offset: u16, more: bool, data: &[u8]) -> Vec<u8> {
    let (s, d): (Ipv6Addr, Ipv6Addr) = (src.parse().unwrap(), dst.parse().unwrap());
    let mut f = Vec::new();
    f.extend_from_slice(&XVS_MAC);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[44, 64]);
    f.extend_from_slice(&s.octets());
    f.extend_from_slice(&d.octets());
    f.extend_from_slice(&[17, 0]);
    f.extend_from_slice(&(offset | u16::from(more)).to_be_bytes());
    f.extend_from_slice(&id.to_be_bytes());
    f.extend_from_slice(data);
    f
}

#[test]
fn martian_sources_are_dropped_on_new_flows() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let mut cases = Vec::new();
    let martian = Verdict::Drop(DropReason::MartianSource);
    for src in [
        "0.0.0.0:1000",
        "0.1.2.3:1000",
        "127.0.0.1:1000",
        "224.0.0.1:1000",
        "239.1.2.3:1000",
        "240.0.0.1:1000",
        "255.255.255.255:1000",
    ] {
        cases.push((format!("SYN from {src}"), cin(src, VIP, SYN), martian));
        cases.push((
            format!("UDP from {src}"),
            cin(src, "198.18.100.53:53", L4::Udp),
            martian,
        ));
        cases.push((
            format!("mh ACK from {src}"),
            cin(src, "198.18.100.7:443", ACK),
            martian,
        ));
        cases.push((
            format!("SCTP INIT from {src}"),
            cin(src, VIPS, L4::Sctp(1)),
            martian,
        ));
        cases.push((
            format!("{src} to no frontend: the kernel's"),
            cin(src, "198.18.0.50:80", SYN),
            Verdict::Pass,
        ));
    }
    for src in [
        "[::]:1000",
        "[::1]:1000",
        "[ff02::1]:1000",
        "[ff0e::2]:1000",
        "[::ffff:198.18.0.1]:1000",
    ] {
        cases.push((format!("SYN from {src}"), cin(src, VIP6, SYN), martian));
        cases.push((
            format!("UDP from {src}"),
            cin(src, "[2001:2:0:100::53]:53", L4::Udp),
            martian,
        ));
    }
    // The same clients with a usable address: new flows.
    cases.push((
        "SYN from a client".into(),
        cin(C4, VIP, SYN),
        Verdict::Tx(0),
    ));
    cases.push((
        "SYN from a v6 client".into(),
        cin(C6, VIP6, SYN),
        Verdict::Tx(0),
    ));
    for (desc, f, want) in &cases {
        expect(&mut p, desc, f, *want);
    }
    let c = p.counters();
    assert_eq!(c.dropped(DropReason::MartianSource), 7 * 4 + 5 * 2);
    assert_eq!(c.new_flows, 2);
    let batch: Vec<_> = cases.into_iter().map(|(_, f, v)| (f, v)).collect();
    batch_agrees(&batch);
}

#[test]
fn own_addresses_as_sources_are_dropped() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let own = Verdict::Drop(DropReason::OwnAddressSource);
    let cases = vec![
        ("the VIP itself", cin("198.18.100.1:1234", VIP, SYN), own),
        ("another VIP", cin("198.18.100.2:1234", VIP, SYN), own),
        ("a UDP VIP", cin("198.18.100.53:53", VIP, SYN), own),
        ("the SNAT address", cin("198.18.1.254:1234", VIP, SYN), own),
        (
            "the SNAT address, UDP",
            cin("198.18.1.254:53", "198.18.100.53:53", L4::Udp),
            own,
        ),
        (
            "the VIP6 itself",
            cin("[2001:2:0:100::1]:1234", VIP6, SYN),
            own,
        ),
        (
            "the v6 SNAT address",
            cin("[2001:2:0:1::fe]:1234", VIP6, SYN),
            own,
        ),
        (
            "a VIP to no frontend",
            cin("198.18.100.1:1234", "198.18.0.50:80", SYN),
            Verdict::Pass,
        ),
        ("a client", cin(C4, VIP, SYN), Verdict::Tx(0)),
    ];
    for (desc, f, want) in &cases {
        expect(&mut p, desc, f, *want);
    }
    assert_eq!(p.counters().dropped(DropReason::OwnAddressSource), 7);
    let batch: Vec<_> = cases.into_iter().map(|(_, f, v)| (f, v)).collect();
    batch_agrees(&batch);
}

#[test]
fn icmp_errors_from_martian_own_or_to_martian_addresses_are_dropped() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    expect(&mut p, "flow", &cin(C4, VIP, SYN), Verdict::Tx(0));
    expect(&mut p, "v6 flow", &cin(C6, VIP6, SYN), Verdict::Tx(0));
    let q4 = sent(SNAT4, B1, SYN);
    // The v6 flow took the next SNAT port.
    let q6 = sent("[2001:2:0:1::fe]:40001", B6, SYN);
    let cases = [
        (
            "from 127.0.0.1",
            icmp4("127.0.0.1", "198.18.1.254", unreach(), &q4),
            DropReason::MartianSource,
        ),
        (
            "from 224.0.0.1",
            icmp4("224.0.0.1", "198.18.1.254", unreach(), &q4),
            DropReason::MartianSource,
        ),
        (
            "from the VIP",
            icmp4("198.18.100.1", "198.18.1.254", unreach(), &q4),
            DropReason::OwnAddressSource,
        ),
        (
            "from the SNAT address",
            icmp4("198.18.1.254", "198.18.1.254", unreach(), &q4),
            DropReason::OwnAddressSource,
        ),
        (
            "to the broadcast address",
            icmp4("198.18.1.1", "255.255.255.255", unreach(), &q4),
            DropReason::MartianDestination,
        ),
        (
            "to a multicast group",
            icmp4("198.18.1.1", "224.0.0.1", unreach(), &q4),
            DropReason::MartianDestination,
        ),
        (
            "v6 from ::1",
            icmp6("::1", "2001:2:0:1::fe", TOO_BIG, &q6),
            DropReason::MartianSource,
        ),
        (
            "v6 from the VIP",
            icmp6("2001:2:0:100::1", "2001:2:0:1::fe", TOO_BIG, &q6),
            DropReason::OwnAddressSource,
        ),
        (
            "v6 to ff02::1",
            icmp6("2001:2:0:1::1", "ff02::1", TOO_BIG, &q6),
            DropReason::MartianDestination,
        ),
    ];
    for (desc, f, r) in &cases {
        expect(&mut p, desc, f, Verdict::Drop(*r));
    }
    // About no flow of ours: passed, whatever the addresses.
    let other = sent("198.18.1.254:1234", B1, SYN);
    expect(
        &mut p,
        "no flow",
        &icmp4("127.0.0.1", "255.255.255.255", unreach(), &other),
        Verdict::Pass,
    );
    // And from a usable address, translated.
    expect(
        &mut p,
        "from the backend",
        &icmp4("198.18.1.1", "198.18.1.254", unreach(), &q4),
        Verdict::Tx(0),
    );
    expect(
        &mut p,
        "v6 from the backend",
        &icmp6("2001:2:0:1::1", "2001:2:0:1::fe", TOO_BIG, &q6),
        Verdict::Tx(0),
    );
}

#[test]
fn icmp_errors_with_a_bad_checksum_are_dropped() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    expect(&mut p, "flow", &cin(C4, VIP, SYN), Verdict::Tx(0));
    expect(&mut p, "v6 flow", &cin(C6, VIP6, SYN), Verdict::Tx(0));
    let mut e4 = icmp4(
        "198.18.1.1",
        "198.18.1.254",
        unreach(),
        &sent(SNAT4, B1, SYN),
    );
    let q6 = sent("[2001:2:0:1::fe]:40001", B6, SYN);
    let mut e6 = icmp6("2001:2:0:1::1", "2001:2:0:1::fe", TOO_BIG, &q6);
    let bad = Verdict::Drop(DropReason::BadIcmpChecksum);
    for (desc, f) in [("v4", &mut e4), ("v6", &mut e6)] {
        let at = if desc == "v4" { 36 } else { 56 };
        let mut g = f.clone();
        g[at] ^= 0x01;
        expect(&mut p, &format!("{desc}: checksum field"), &g, bad);
        let mut g = f.clone();
        let last = g.len() - 1;
        g[last] ^= 0x80;
        expect(&mut p, &format!("{desc}: quoted payload"), &g, bad);
        let mut g = f.clone();
        g[at - 2 + 5] ^= 0x04;
        expect(&mut p, &format!("{desc}: ICMP header"), &g, bad);
    }
    // ICMPv6's checksum covers the pseudo-header: the source changed without it.
    let mut g = e6.clone();
    g[14 + 8 + 15] ^= 0x02;
    expect(&mut p, "v6: pseudo-header", &g, bad);
    // An error about no flow of ours: passed as it is.
    let mut other = icmp4(
        "198.18.1.1",
        "198.18.1.254",
        unreach(),
        &sent("198.18.1.254:1234", B1, SYN),
    );
    other[36] ^= 0xff;
    expect(&mut p, "no flow", &other, Verdict::Pass);
    expect(&mut p, "intact v4", &e4, Verdict::Tx(0));
    expect(&mut p, "intact v6", &e6, Verdict::Tx(0));
    assert_eq!(p.counters().dropped(DropReason::BadIcmpChecksum), 7);
}

#[test]
fn sctp_with_a_bad_crc_is_dropped() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let bad = Verdict::Drop(DropReason::BadSctpChecksum);
    let corrupt = |mut f: Vec<u8>, at: usize| {
        f[at] ^= 0x10;
        f
    };
    let (v4_crc, v6_crc) = (14 + 20 + 8, 14 + 40 + 8);
    let vip6s = "[2001:2:0:100::9]:3868";
    expect(
        &mut p,
        "INIT with a bad CRC",
        &corrupt(cin(C4, VIPS, L4::Sctp(1)), v4_crc),
        bad,
    );
    assert_eq!(p.counters().new_flows, 0, "no flow made");
    expect(&mut p, "INIT", &cin(C4, VIPS, L4::Sctp(1)), Verdict::Tx(0));
    let data = cin(C4, VIPS, L4::Sctp(0));
    let last = data.len() - 1;
    expect(
        &mut p,
        "DATA, chunk corrupt",
        &corrupt(data.clone(), last),
        bad,
    );
    expect(&mut p, "DATA", &data, Verdict::Tx(0));
    let reply = frame(B1_MAC, XVS_MAC, sa(BS), sa(SNAT4), 64, L4::Sctp(0));
    expect(
        &mut p,
        "reply with a bad CRC",
        &corrupt(reply.clone(), 50),
        bad,
    );
    expect(&mut p, "reply", &reply, Verdict::Tx(0));
    expect(
        &mut p,
        "nat INIT with a bad CRC",
        &corrupt(cin(C4, "198.18.100.10:3868", L4::Sctp(1)), v4_crc + 3),
        bad,
    );
    expect(
        &mut p,
        "v6 INIT with a bad CRC",
        &corrupt(cin(C6, vip6s, L4::Sctp(1)), v6_crc),
        bad,
    );
    expect(
        &mut p,
        "to no frontend: the kernel's",
        &corrupt(cin(C4, "198.18.0.50:3868", L4::Sctp(1)), v4_crc),
        Verdict::Pass,
    );
    // An error quoting a whole SCTP packet recomputes its CRC32c: checked first.
    let q = sent(SNAT4, BS, L4::Sctp(1));
    let err = icmp4("198.18.1.1", "198.18.1.254", unreach(), &q);
    let mut g = err.clone();
    g[34 + 8 + 20 + 8] ^= 0x01;
    fix_icmp(&mut g);
    expect(&mut p, "error quoting a corrupt SCTP packet", &g, bad);
    let out = expect(&mut p, "error quoting an SCTP packet", &err, Verdict::Tx(0));
    let quoted = &out[34 + 8 + 20..];
    let mut z = quoted.to_vec();
    z[8..12].fill(0);
    assert_eq!(
        crc32c::crc32c(&z).to_le_bytes(),
        quoted[8..12],
        "the quoted CRC32c recomputed"
    );
    assert_eq!(p.counters().dropped(DropReason::BadSctpChecksum), 6);
}

#[test]
fn oversized_fragments_are_dropped() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let (vipf, c) = ("198.18.100.54:53", "198.18.0.1:5000");
    // A first fragment makes the flow and records the datagram.
    let mut first = cin(c, vipf, L4::Udp);
    first[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
    first[18..20].copy_from_slice(&0x4242u16.to_be_bytes());
    fix_ip4(&mut first);
    expect(&mut p, "first fragment", &first, Verdict::Tx(0));
    let over = Verdict::Drop(DropReason::OversizedFragment);
    // Offset 65,496 + 20 + 16 bytes = 65,532; + 24 bytes = 65,540.
    expect(
        &mut p,
        "ends at 65,532",
        &frag4(c, vipf, 0x4242, 65_496, 16),
        Verdict::Tx(0),
    );
    expect(
        &mut p,
        "ends at 65,535",
        &frag4(c, vipf, 0x4242, 65_496, 19),
        Verdict::Tx(0),
    );
    expect(
        &mut p,
        "ends at 65,540",
        &frag4(c, vipf, 0x4242, 65_496, 24),
        over,
    );
    expect(
        &mut p,
        "the last offset",
        &frag4(c, vipf, 0x4242, 65_528, 8),
        over,
    );
    expect(
        &mut p,
        "oversized without a first fragment",
        &frag4(c, vipf, 0x1111, 65_528, 8),
        over,
    );
    expect(
        &mut p,
        "in range without a first fragment",
        &frag4(c, vipf, 0x1111, 8, 8),
        Verdict::Drop(DropReason::FragmentNoMatch),
    );
    // IPv6: the reassembled payload (offset + this fragment's data) past 65,535.
    let (c6, vip6u) = ("2001:2::1", "2001:2:0:100::53");
    let whole = cin("[2001:2::1]:5000", "[2001:2:0:100::53]:53", L4::Udp);
    let udp = &whole[54..];
    expect(
        &mut p,
        "v6 first fragment",
        &frag6(c6, vip6u, 77, 0, true, &udp[..16]),
        Verdict::Tx(0),
    );
    expect(
        &mut p,
        "v6 ends at 65,535",
        &frag6(c6, vip6u, 77, 65_512, true, &[0x5a; 23]),
        Verdict::Tx(0),
    );
    expect(
        &mut p,
        "v6 ends at 65,536",
        &frag6(c6, vip6u, 77, 65_512, true, &[0x5a; 24]),
        over,
    );
    expect(
        &mut p,
        "v6 the last offset",
        &frag6(c6, vip6u, 77, 65_528, false, &[0x5a; 8]),
        over,
    );
    assert_eq!(p.counters().dropped(DropReason::OversizedFragment), 5);
}

/// A martian source address: IPv4 in 0/8, 127/8, 224/4, 240/4 (broadcast included) or IPv6
/// `::`, `::1`, ff00::/8, ::ffff:0:0/96.
fn martian() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from_bits(a & 0x00ff_ffff))),
        any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from_bits(0x7f00_0000 | a & 0x00ff_ffff))),
        any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from_bits(0xe000_0000 | a))),
        Just(IpAddr::V4(Ipv4Addr::BROADCAST)),
        (0u128..2).prop_map(|a| IpAddr::V6(Ipv6Addr::from_bits(a))),
        any::<u128>().prop_map(|a| IpAddr::V6(Ipv6Addr::from_bits(0xff << 120 | a >> 8))),
        any::<u32>().prop_map(|a| IpAddr::V6(Ipv6Addr::from_bits(0xffff << 32 | u128::from(a)))),
    ]
}

/// A TCP, UDP or SCTP frontend of the fixture config of `v6`'s family, and what opens a flow.
fn frontend(v6: bool, i: usize) -> (&'static str, L4) {
    let v4 = [
        (VIP, SYN),
        ("198.18.100.2:80", SYN),
        ("198.18.100.53:53", L4::Udp),
        ("198.18.100.54:53", L4::Udp),
        ("198.18.100.7:443", ACK),
        (VIPS, L4::Sctp(1)),
        ("198.18.100.10:3868", L4::Sctp(1)),
    ];
    let v6s = [
        (VIP6, SYN),
        ("[2001:2:0:100::2]:80", SYN),
        ("[2001:2:0:100::53]:53", L4::Udp),
        ("[2001:2:0:100::9]:3868", L4::Sctp(1)),
    ];
    if v6 {
        v6s[i % v6s.len()]
    } else {
        v4[i % v4.len()]
    }
}

fn run_one(f: &[u8]) -> Verdict {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let mut g = f.to_vec();
    let v = p.process(&mut g, epoch);
    if !matches!(v, Verdict::Tx(_)) {
        assert_eq!(g, f, "a frame not sent is left as it came");
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn martian_sources_never_open_flows(src in martian(), port in 1u16.., i in 0usize..8) {
        let (dst, l4) = frontend(src.is_ipv6(), i);
        let f = frame(CLIENT_MAC, XVS_MAC, SocketAddr::new(src, port), sa(dst), 64, l4);
        prop_assert_eq!(run_one(&f), Verdict::Drop(DropReason::MartianSource));
    }

    #[test]
    fn own_sources_never_open_flows(own in 0usize..16, port in 1u16.., i in 0usize..8) {
        let addrs = [
            "198.18.100.1", "198.18.100.2", "198.18.100.53", "198.18.100.54", "198.18.100.7",
            "198.18.100.9", "198.18.100.10", "198.18.100.20", "198.18.100.99", "198.18.1.254",
            "2001:2:0:100::1", "2001:2:0:100::2", "2001:2:0:100::53", "2001:2:0:100::9",
            "2001:2:0:1::fe", "198.18.100.97",
        ];
        let src: IpAddr = addrs[own].parse().unwrap();
        let (dst, l4) = frontend(src.is_ipv6(), i);
        let f = frame(CLIENT_MAC, XVS_MAC, SocketAddr::new(src, port), sa(dst), 64, l4);
        prop_assert_eq!(run_one(&f), Verdict::Drop(DropReason::OwnAddressSource));
    }

    /// The control: any other client in 198.18/15 or 2001:2::/48 opens its flow.
    #[test]
    fn other_sources_open_flows(host in 1u32..0x6400, port in 1u16.., i in 0usize..8, v6 in any::<bool>()) {
        // 198.18.0.0-198.18.99.255 (the VIPs are in 198.18.100/24) or 2001:2::/64.
        let src = if v6 {
            IpAddr::V6(Ipv6Addr::from_bits(0x2001_0002_0000_0000_0000_0000_0000_0000 | u128::from(host)))
        } else {
            IpAddr::V4(Ipv4Addr::from_bits(0xc612_0000 | host))
        };
        prop_assume!(src != "198.18.1.254".parse::<IpAddr>().unwrap());
        let (dst, l4) = frontend(v6, i);
        let f = frame(CLIENT_MAC, XVS_MAC, SocketAddr::new(src, port), sa(dst), 64, l4);
        let v = run_one(&f);
        prop_assert!(!matches!(
            v,
            Verdict::Drop(DropReason::MartianSource | DropReason::OwnAddressSource)
        ), "{:?}", v);
    }

    #[test]
    fn corrupt_sctp_is_dropped(v6 in any::<bool>(), i in 0usize..2, at in 0usize..32, bit in 0u8..8) {
        let (dst, l4) = frontend(v6, if v6 { 3 } else { 5 + i });
        let src = if v6 { C6 } else { C4 };
        let mut f = cin(src, dst, l4);
        let l4_at = if v6 { 54 } else { 34 };
        // Anything but the ports (which choose the frontend).
        let at = l4_at + 4 + at % (f.len() - l4_at - 4);
        f[at] ^= 1 << bit;
        prop_assert_eq!(run_one(&f), Verdict::Drop(DropReason::BadSctpChecksum));
    }

    #[test]
    fn corrupt_icmp_errors_are_dropped(v6 in any::<bool>(), at in 0usize..200, bit in 0u8..8) {
        let epoch = Instant::now();
        let mut p = pipeline(epoch);
        let (flow, mut e) = if v6 {
            (cin(C6, VIP6, SYN), icmp6("2001:2:0:1::1", "2001:2:0:1::fe", TOO_BIG, &sent(SNAT6, B6, SYN)))
        } else {
            (cin(C4, VIP, SYN), icmp4("198.18.1.1", "198.18.1.254", unreach(), &sent(SNAT4, B1, SYN)))
        };
        prop_assert_eq!(p.process(&mut flow.clone(), epoch), Verdict::Tx(0));
        let l4 = if v6 { 54 } else { 34 };
        // Not the type (an error stays an error) nor what makes the quote match its flow
        // (version, fragment offset, protocol, addresses, ports).
        let q = l4 + 8;
        let (qa, qp) = if v6 { (q + 8..q + 40, q + 40..q + 44) } else { (q + 12..q + 20, q + 20..q + 24) };
        let matching: &[usize] = if v6 { &[q, q + 6] } else { &[q, q + 6, q + 7, q + 9] };
        let at = l4 + 1 + at % (e.len() - l4 - 1);
        prop_assume!(!qa.contains(&at) && !qp.contains(&at) && !matching.contains(&at));
        e[at] ^= 1 << bit;
        let mut g = e.clone();
        prop_assert_eq!(p.process(&mut g, epoch), Verdict::Drop(DropReason::BadIcmpChecksum));
        prop_assert_eq!(g, e);
    }

    #[test]
    fn icmp_errors_to_martian_destinations_are_dropped(dst in martian()) {
        let epoch = Instant::now();
        let mut p = pipeline(epoch);
        let (flow, e) = match dst {
            IpAddr::V6(d) => (
                cin(C6, VIP6, SYN),
                icmp6("2001:2:0:1::1", &d.to_string(), TOO_BIG, &sent(SNAT6, B6, SYN)),
            ),
            IpAddr::V4(d) => (
                cin(C4, VIP, SYN),
                icmp4("198.18.1.1", &d.to_string(), unreach(), &sent(SNAT4, B1, SYN)),
            ),
        };
        prop_assert_eq!(p.process(&mut flow.clone(), epoch), Verdict::Tx(0));
        let mut g = e.clone();
        prop_assert_eq!(p.process(&mut g, epoch), Verdict::Drop(DropReason::MartianDestination));
        prop_assert_eq!(g, e);
    }

    #[test]
    fn oversized_fragments_are_dropped_v4(off in 1usize..8192, len in 1usize..64, id in any::<u16>()) {
        let f = frag4(C4, "198.18.100.54:53", id, off * 8, len);
        let want = if off * 8 + 20 + len > 65_535 {
            DropReason::OversizedFragment
        } else {
            DropReason::FragmentNoMatch
        };
        prop_assert_eq!(run_one(&f), Verdict::Drop(want));
    }

    #[test]
    fn oversized_fragments_are_dropped_v6(off in 1u16..8192, len in 1usize..64, id in any::<u32>(), more in any::<bool>()) {
        let f = frag6("2001:2::1", "2001:2:0:100::53", id, off * 8, more, &vec![0xa5; len]);
        let want = if usize::from(off) * 8 + len > 65_535 {
            DropReason::OversizedFragment
        } else {
            DropReason::FragmentNoMatch
        };
        prop_assert_eq!(run_one(&f), Verdict::Drop(want));
    }
}
