//! The decap programs (`bpf/decap.c`) on hand-made packets, through `BPF_PROG_TEST_RUN`:
//! loaded and verified by the kernel, never attached. Needs root (CAP_BPF):
//! `cargo test -p fastpath --test decap_prog`.
//!
//! Each case builds the frame an xvs node in DSR mode would send (IPIP or GUE around the
//! client's packet, or the plain packet in L2 mode), runs the XDP program on it and checks the
//! frame that comes out byte for byte against the inner packet, with the destination port
//! translated and the checksums verified from scratch; the egress program gets the reply the
//! backend would send. Addresses: 198.18.0.0/15 and 2001:2::/48 only.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::PacketBuilder;
use fastpath::decap::{DecapCounters, Loaded, PortMap, Tables};

const XDP_PASS: u32 = 2;
const TC_ACT_OK: u32 = 0;

const BACKEND_MAC: [u8; 6] = [2, 0, 0, 0, 1, 1];
const NODE_MAC: [u8; 6] = [2, 0, 0, 0, 1, 0xfe];
const CLIENT4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const NODE4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 254);
const BACKEND4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
const VIP4: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 1);
const OTHER_VIP4: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 99);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 2);
const NODE6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 0xfe);
const BACKEND6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 1);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0x100, 0, 0, 0, 1);
const GUE_PORT: u16 = 6080;
const TCP: u8 = 6;
const UDP: u8 = 17;

fn tables() -> Tables {
    let map = |vip: IpAddr, proto, port, target| PortMap {
        vip,
        proto,
        port,
        target,
    };
    Tables {
        gue_port: GUE_PORT,
        vips: vec![IpAddr::V4(VIP4), IpAddr::V6(VIP6)],
        ports: vec![
            map(IpAddr::V4(VIP4), TCP, 80, 8080),
            map(IpAddr::V4(VIP4), UDP, 53, 5353),
            map(IpAddr::V6(VIP6), TCP, 80, 8080),
            map(IpAddr::V6(VIP6), UDP, 53, 5353),
        ],
    }
}

fn load() -> Loaded {
    Loaded::load(&tables()).expect("the kernel loads and verifies the decap programs (root)")
}

// ---- packets, by hand ----

fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&BACKEND_MAC);
    f.extend_from_slice(&NODE_MAC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn ethertype_of(ip: &[u8]) -> u16 {
    if ip[0] >> 4 == 6 { 0x86dd } else { 0x0800 }
}

fn sum16(bytes: &[u8]) -> u32 {
    bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// An IPv4 header (no options) with a correct checksum, then `payload`.
fn ipv4(proto: u8, src: Ipv4Addr, dst: Ipv4Addr, tos: u8, frag: u16, payload: &[u8]) -> Vec<u8> {
    let len = (20 + payload.len()) as u16;
    let mut h = vec![0x45, tos];
    h.extend_from_slice(&len.to_be_bytes());
    h.extend_from_slice(&[0x12, 0x34]);
    h.extend_from_slice(&frag.to_be_bytes());
    h.extend_from_slice(&[64, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let c = !fold(sum16(&h));
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h.extend_from_slice(payload);
    h
}

fn ipv6(next: u8, src: Ipv6Addr, dst: Ipv6Addr, tclass: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0x60 | (tclass >> 4), tclass << 4, 0, 0];
    h.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    h.extend_from_slice(&[next, 64]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(payload);
    h
}

/// The outer UDP header of GUE (checksum 0, as Katran sends it over IPv4).
fn gue(sport: u16, inner: &[u8]) -> Vec<u8> {
    let mut u = sport.to_be_bytes().to_vec();
    u.extend_from_slice(&GUE_PORT.to_be_bytes());
    u.extend_from_slice(&((8 + inner.len()) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(inner);
    u
}

/// The client's packet: an IP packet with TCP (or UDP) and a payload, checksums computed by
/// etherparse.
fn client_packet(src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
    let builder = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 63),
        (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 63),
        _ => unreachable!("one family"),
    };
    let payload = b"GET / HTTP/1.1\r\nHost: vip\r\n\r\n";
    let mut out = Vec::new();
    if proto == TCP {
        builder
            .tcp(sport, dport, 1000, 64000)
            .ack(77)
            .psh()
            .write(&mut out, payload)
            .unwrap();
    } else {
        builder.udp(sport, dport).write(&mut out, payload).unwrap();
    }
    out
}

// ---- checks ----

/// Where the L4 header starts and its protocol (no IPv6 extension headers).
fn l4_of(ip: &[u8]) -> (usize, u8) {
    if ip[0] >> 4 == 4 {
        (usize::from(ip[0] & 0xf) * 4, ip[9])
    } else {
        (40, ip[6])
    }
}

/// Whether the TCP/UDP checksum of `ip` verifies (an IPv4 UDP checksum of 0: none).
fn l4_checksum_ok(ip: &[u8]) -> bool {
    let (off, proto) = l4_of(ip);
    let seg = &ip[off..];
    let pseudo = if ip[0] >> 4 == 4 {
        if proto == UDP && seg[6..8] == [0, 0] {
            return true;
        }
        sum16(&ip[12..20]) + u32::from(proto) + seg.len() as u32
    } else {
        sum16(&ip[8..40]) + u32::from(proto) + seg.len() as u32
    };
    fold(pseudo + sum16(seg)) == 0xffff
}

fn ipv4_header_ok(ip: &[u8]) -> bool {
    fold(sum16(&ip[..usize::from(ip[0] & 0xf) * 4])) == 0xffff
}

fn dport(ip: &[u8]) -> u16 {
    let (off, _) = l4_of(ip);
    u16::from_be_bytes([ip[off + 2], ip[off + 3]])
}

fn sport(ip: &[u8]) -> u16 {
    let (off, _) = l4_of(ip);
    u16::from_be_bytes([ip[off], ip[off + 1]])
}

/// `ip` with its destination (`which` = 2) or source (0) port set to `port`, the checksum
/// recomputed from scratch: what the programs must produce incrementally.
fn with_port(ip: &[u8], which: usize, port: u16) -> Vec<u8> {
    let mut out = ip.to_vec();
    let (off, proto) = l4_of(ip);
    out[off + which..off + which + 2].copy_from_slice(&port.to_be_bytes());
    let check = off + if proto == TCP { 16 } else { 6 };
    if proto == UDP && ip[0] >> 4 == 4 && ip[check..check + 2] == [0, 0] {
        return out;
    }
    out[check..check + 2].copy_from_slice(&[0, 0]);
    let seg = out[off..].to_vec();
    let pseudo = if ip[0] >> 4 == 4 {
        sum16(&out[12..20])
    } else {
        sum16(&out[8..40])
    } + u32::from(proto)
        + seg.len() as u32;
    let mut c = !fold(pseudo + sum16(&seg));
    if c == 0 && proto == UDP {
        c = 0xffff;
    }
    out[check..check + 2].copy_from_slice(&c.to_be_bytes());
    out
}

/// Runs the XDP program on `frame`; panics unless it passed the frame.
fn xdp(loaded: &Loaded, frame: &[u8]) -> Vec<u8> {
    let (action, out) = loaded.run_xdp(frame).expect("test run");
    assert_eq!(
        action, XDP_PASS,
        "the program passes every frame it does not fail on"
    );
    out
}

fn counters(loaded: &Loaded) -> DecapCounters {
    loaded.counters().unwrap()
}

// ---- decapsulation with port translation ----

/// Runs one encapsulated client packet through the program: the output must be the L2
/// header with the inner EtherType, then the inner packet with the port translated to
/// `target` (checksum recomputed from scratch equals the incremental one).
fn decaps_to(outer_frame: &[u8], inner: &[u8], target: u16) -> DecapCounters {
    let loaded = load();
    let out = xdp(&loaded, outer_frame);
    let want = eth(ethertype_of(inner), &with_port(inner, 2, target));
    assert_eq!(out, want, "decapsulated and translated frame");
    let ip = &out[14..];
    assert!(l4_checksum_ok(ip), "the L4 checksum verifies");
    if ip[0] >> 4 == 4 {
        assert!(ipv4_header_ok(ip));
    }
    assert_eq!(dport(ip), target);
    counters(&loaded)
}

#[test]
fn ipip_v4_is_decapsulated_and_translated() {
    let inner = client_packet(CLIENT4.into(), VIP4.into(), TCP, 40000, 80);
    let frame = eth(0x0800, &ipv4(4, NODE4, BACKEND4, 0, 0, &inner));
    let c = decaps_to(&frame, &inner, 8080);
    assert_eq!((c.decap_ipip, c.decap_gue, c.in_translated), (1, 0, 1));
}

#[test]
fn ipip_v6_is_decapsulated_and_translated() {
    let inner = client_packet(CLIENT6.into(), VIP6.into(), TCP, 40000, 80);
    let frame = eth(0x86dd, &ipv6(41, NODE6, BACKEND6, 0, &inner));
    let c = decaps_to(&frame, &inner, 8080);
    assert_eq!((c.decap_ipip, c.in_translated), (1, 1));
}

#[test]
fn gue_v4_is_decapsulated_and_translated() {
    let inner = client_packet(CLIENT4.into(), VIP4.into(), UDP, 40000, 53);
    let frame = eth(
        0x0800,
        &ipv4(17, NODE4, BACKEND4, 0, 0, &gue(51234, &inner)),
    );
    let c = decaps_to(&frame, &inner, 5353);
    assert_eq!((c.decap_ipip, c.decap_gue, c.in_translated), (0, 1, 1));
}

#[test]
fn gue_v6_is_decapsulated_and_translated() {
    let inner = client_packet(CLIENT6.into(), VIP6.into(), TCP, 40000, 80);
    let frame = eth(0x86dd, &ipv6(17, NODE6, BACKEND6, 0, &gue(51234, &inner)));
    let c = decaps_to(&frame, &inner, 8080);
    assert_eq!((c.decap_gue, c.in_translated), (1, 1));
}

/// IPv6 inside IPv4 (protocol 41) and IPv4 inside IPv6 (next header 4): the EtherType
/// follows the inner packet.
#[test]
fn mixed_families_take_the_inner_ethertype() {
    let inner6 = client_packet(CLIENT6.into(), VIP6.into(), UDP, 40000, 53);
    let frame = eth(0x0800, &ipv4(41, NODE4, BACKEND4, 0, 0, &inner6));
    decaps_to(&frame, &inner6, 5353);
    let inner4 = client_packet(CLIENT4.into(), VIP4.into(), TCP, 40000, 80);
    let frame = eth(0x86dd, &ipv6(4, NODE6, BACKEND6, 0, &inner4));
    decaps_to(&frame, &inner4, 8080);
}

/// A port with no translation is decapsulated and left as it is.
#[test]
fn an_untranslated_port_is_only_decapsulated() {
    let loaded = load();
    let inner = client_packet(CLIENT4.into(), VIP4.into(), TCP, 40000, 443);
    let out = xdp(
        &loaded,
        &eth(0x0800, &ipv4(4, NODE4, BACKEND4, 0, 0, &inner)),
    );
    assert_eq!(out, eth(0x0800, &inner));
    let c = counters(&loaded);
    assert_eq!((c.decap_ipip, c.in_translated), (1, 0));
}

/// One 802.1Q tag stays in front of the inner packet, with the inner EtherType after it.
#[test]
fn a_vlan_tag_is_kept() {
    let loaded = load();
    let inner = client_packet(CLIENT6.into(), VIP6.into(), TCP, 40000, 80);
    let mut tagged = BACKEND_MAC.to_vec();
    tagged.extend_from_slice(&NODE_MAC);
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x64, 0x86, 0xdd]);
    tagged.extend_from_slice(&ipv6(41, NODE6, BACKEND6, 0, &inner));
    let out = xdp(&loaded, &tagged);
    let mut want = tagged[..18].to_vec();
    want.extend_from_slice(&with_port(&inner, 2, 8080));
    assert_eq!(out, want);
}

/// An outer CE mark moves onto an ECN-capable inner packet (the IPv4 header checksum
/// follows), not onto one that is not ECN-capable.
#[test]
fn outer_ce_marks_an_ecn_capable_inner_packet() {
    let loaded = load();
    let mut inner = client_packet(CLIENT4.into(), VIP4.into(), TCP, 40000, 443);
    inner[1] = 0x02; // ECT(0)
    inner[10..12].copy_from_slice(&[0, 0]);
    let c = !fold(sum16(&inner[..20]));
    inner[10..12].copy_from_slice(&c.to_be_bytes());
    let out = xdp(
        &loaded,
        &eth(0x0800, &ipv4(4, NODE4, BACKEND4, 0x03, 0, &inner)),
    );
    assert_eq!(out[14 + 1], 0x03, "inner CE");
    assert!(ipv4_header_ok(&out[14..]));

    let inner6 = client_packet(CLIENT6.into(), VIP6.into(), TCP, 40000, 443);
    let out = xdp(
        &loaded,
        &eth(0x86dd, &ipv6(41, NODE6, BACKEND6, 0x03, &inner6)),
    );
    assert_eq!(
        out[14..],
        inner6[..],
        "a Not-ECT inner packet is left alone"
    );
}

// ---- what passes untouched ----

/// Frames the program must hand to the kernel exactly as they came, and the counter each
/// lands in.
#[test]
fn others_pass_untouched_and_counted() {
    let to_other = client_packet(CLIENT4.into(), OTHER_VIP4.into(), TCP, 40000, 80);
    let inner = client_packet(CLIENT4.into(), VIP4.into(), TCP, 40000, 80);
    let inner6 = client_packet(CLIENT6.into(), VIP6.into(), TCP, 40000, 80);
    let mut truncated = eth(0x0800, &ipv4(4, NODE4, BACKEND4, 0, 0, &inner));
    truncated.truncate(14 + 20 + 10);
    let field = |c: &DecapCounters, name: &str| {
        c.named()
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .unwrap()
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "IPIP for a VIP that is not configured",
            eth(0x0800, &ipv4(4, NODE4, BACKEND4, 0, 0, &to_other)),
            "pass_not_vip",
        ),
        (
            "GUE for a VIP that is not configured",
            eth(0x0800, &ipv4(17, NODE4, BACKEND4, 0, 0, &gue(1, &to_other))),
            "pass_not_vip",
        ),
        (
            "IPIP with its inner header cut short",
            truncated,
            "pass_inner_malformed",
        ),
        (
            "protocol 4 around an IPv6 packet",
            eth(0x0800, &ipv4(4, NODE4, BACKEND4, 0, 0, &inner6)),
            "pass_inner_malformed",
        ),
        (
            "GUE whose payload is not IP",
            eth(
                0x0800,
                &ipv4(17, NODE4, BACKEND4, 0, 0, &gue(1, &[0xff; 40])),
            ),
            "pass_inner_malformed",
        ),
        (
            "an outer first fragment (MF)",
            eth(0x0800, &ipv4(4, NODE4, BACKEND4, 0, 0x2000, &inner)),
            "pass_outer_fragment",
        ),
        (
            "UDP to another port than GUE's",
            eth(
                0x0800,
                &ipv4(17, NODE4, BACKEND4, 0, 0, &{
                    let mut u = gue(1, &inner);
                    u[2..4].copy_from_slice(&6081u16.to_be_bytes());
                    u
                }),
            ),
            "pass_plain",
        ),
        (
            "an IPv4 header cut short",
            eth(0x0800, &[0x45, 0, 0, 40, 0]),
            "pass_malformed",
        ),
        (
            "an IPv4 header length below 5",
            eth(0x0800, &[0x44; 40]),
            "pass_malformed",
        ),
        (
            "an IPv6 header cut short",
            eth(0x86dd, &[0x60; 20]),
            "pass_malformed",
        ),
        ("ARP", eth(0x0806, &[0; 28]), "pass_not_ip"),
        (
            "a plain packet to no VIP",
            eth(0x0800, &to_other),
            "pass_plain",
        ),
    ];
    for (what, frame, counter) in cases {
        let loaded = load();
        let out = xdp(&loaded, &frame);
        assert_eq!(out, frame, "{what}: passed untouched");
        let c = counters(&loaded);
        assert_eq!(field(&c, counter), 1, "{what}: counted {counter}: {c:?}");
        let total: u64 = c.named().iter().map(|(_, v)| v).sum();
        assert_eq!(total, 1, "{what}: counted once: {c:?}");
    }
}

/// A runt frame shorter than an Ethernet header is passed (counted malformed).
#[test]
fn a_runt_is_passed() {
    let loaded = load();
    // The kernel's test run wants at least an Ethernet header; a header with nothing
    // behind it is the shortest frame that reaches the program.
    let frame = eth(0x0800, &[]);
    assert_eq!(xdp(&loaded, &frame), frame);
    assert_eq!(counters(&loaded).pass_malformed, 1);
}

// ---- L2 DSR: plain packets ----

#[test]
fn plain_packets_to_a_vip_port_are_translated() {
    let loaded = load();
    for inner in [
        client_packet(CLIENT4.into(), VIP4.into(), TCP, 40000, 80),
        client_packet(CLIENT4.into(), VIP4.into(), UDP, 40000, 53),
        client_packet(CLIENT6.into(), VIP6.into(), UDP, 40000, 53),
        client_packet(CLIENT6.into(), VIP6.into(), TCP, 40000, 80),
    ] {
        let out = xdp(&loaded, &eth(ethertype_of(&inner), &inner));
        let target = if dport(&inner) == 80 { 8080 } else { 5353 };
        assert_eq!(out[14..], with_port(&inner, 2, target)[..]);
        assert!(l4_checksum_ok(&out[14..]));
    }
    let c = counters(&loaded);
    assert_eq!((c.pass_plain, c.in_translated, c.decapsulated()), (4, 4, 0));
}

/// An IPv4 UDP datagram without a checksum keeps none (0 would otherwise become a wrong
/// value, and the kernel would drop the datagram).
#[test]
fn a_zero_udp_checksum_stays_zero() {
    let loaded = load();
    let mut inner = client_packet(CLIENT4.into(), VIP4.into(), UDP, 40000, 53);
    inner[26..28].copy_from_slice(&[0, 0]);
    let out = xdp(
        &loaded,
        &eth(0x0800, &ipv4(4, NODE4, BACKEND4, 0, 0, &inner)),
    );
    assert_eq!(dport(&out[14..]), 5353);
    assert_eq!(out[14 + 26..14 + 28], [0, 0]);
}

// ---- egress: the replies ----

#[test]
fn replies_get_the_service_port_back() {
    let loaded = load();
    for reply in [
        client_packet(VIP4.into(), CLIENT4.into(), TCP, 8080, 40000),
        client_packet(VIP4.into(), CLIENT4.into(), UDP, 5353, 40000),
        client_packet(VIP6.into(), CLIENT6.into(), TCP, 8080, 40000),
        client_packet(VIP6.into(), CLIENT6.into(), UDP, 5353, 40000),
    ] {
        let frame = eth(ethertype_of(&reply), &reply);
        let (action, out) = loaded.run_egress(&frame).unwrap();
        assert_eq!(action, TC_ACT_OK);
        let service = if sport(&reply) == 8080 { 80 } else { 53 };
        assert_eq!(out[14..], with_port(&reply, 0, service)[..]);
        assert!(l4_checksum_ok(&out[14..]));
    }
    assert_eq!(counters(&loaded).out_translated, 4);
}

/// Only the VIP's target ports are rewritten: the backend's own traffic, another port of
/// the VIP, and the requests' direction are left alone.
#[test]
fn other_egress_traffic_is_left_alone() {
    let loaded = load();
    for pkt in [
        client_packet(BACKEND4.into(), CLIENT4.into(), TCP, 8080, 40000),
        client_packet(VIP4.into(), CLIENT4.into(), TCP, 8081, 40000),
        client_packet(VIP4.into(), CLIENT4.into(), UDP, 8080, 40000),
        client_packet(CLIENT4.into(), VIP4.into(), TCP, 40000, 8080),
        client_packet(BACKEND6.into(), CLIENT6.into(), TCP, 8080, 40000),
    ] {
        let frame = eth(ethertype_of(&pkt), &pkt);
        let (action, out) = loaded.run_egress(&frame).unwrap();
        assert_eq!((action, out), (TC_ACT_OK, frame));
    }
    let (_, out) = loaded.run_egress(&eth(0x0806, &[0; 28])).unwrap();
    assert_eq!(out, eth(0x0806, &[0; 28]));
    let c = counters(&loaded);
    assert_eq!((c.out_translated, c.out_error), (0, 0));
}
