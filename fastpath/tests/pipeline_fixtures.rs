//! Katran-style fixture table for `Pipeline::process`: scenarios of steps (description, input
//! frame built field by field, expected verdict, expected output frame), each scenario on one
//! pipeline configured through `config::parse` → `SnapshotBuilder`, with a fake clock.
//! Every transmitted frame is compared byte for byte and its checksums recomputed in full.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use etherparse::{
    Icmpv4Type, Icmpv6Type, PacketBuilder, icmpv4::DestUnreachableHeader,
    icmpv6::DestUnreachableCode,
};
use fastpath::pipeline::{DropReason, Pipeline, RejectReason, Verdict};
use fastpath::snapshot::{ServiceSpec, SnapshotBuilder};
use fastpath::testing::*;
use fastpath::wire::checksum;

struct Step {
    desc: &'static str,
    ms: u64,
    input: Vec<u8>,
    want: Verdict,
    /// Expected frame after `process` (for non-Tx verdicts: the input, unchanged).
    output: Option<Vec<u8>>,
}

fn tx(desc: &'static str, input: Vec<u8>, output: Vec<u8>) -> Step {
    Step {
        desc,
        ms: 0,
        input,
        want: Verdict::Tx(0),
        output: Some(output),
    }
}
fn drop(desc: &'static str, input: Vec<u8>, reason: DropReason) -> Step {
    Step {
        desc,
        ms: 0,
        input,
        want: Verdict::Drop(reason),
        output: None,
    }
}
/// A reject of `input` (its bytes are `pipeline_reject.rs`'s to check).
fn reject(desc: &'static str, input: Vec<u8>, reason: RejectReason) -> Step {
    Step {
        desc,
        ms: 0,
        input,
        want: Verdict::Reject { reason, port: 0 },
        output: None,
    }
}
fn pass(desc: &'static str, input: Vec<u8>) -> Step {
    Step {
        desc,
        ms: 0,
        input,
        want: Verdict::Pass,
        output: None,
    }
}
fn slow(desc: &'static str, input: Vec<u8>) -> Step {
    Step {
        desc,
        ms: 0,
        input,
        want: Verdict::Slow,
        output: None,
    }
}
impl Step {
    fn at(mut self, ms: u64) -> Step {
        self.ms = ms;
        self
    }
}

fn run_on(p: &mut Pipeline, epoch: Instant, scenario: &str, steps: Vec<Step>) {
    for (i, s) in steps.into_iter().enumerate() {
        let mut f = s.input.clone();
        let got = p.process(&mut f, at(epoch, s.ms));
        let what = format!("{scenario} step {i} ({})", s.desc);
        assert_eq!(got, s.want, "{what}: verdict");
        match (got, s.output) {
            (Verdict::Tx(_), Some(want)) => {
                verify_checksums(&f, &what);
                assert_eq!(hex(&f), hex(&want), "{what}: output frame");
            }
            (Verdict::Tx(_) | Verdict::Reject { .. }, None) => verify_checksums(&f, &what),
            (_, Some(want)) => assert_eq!(f, want, "{what}: output frame"),
            (_, None) => assert_eq!(f, s.input, "{what}: frame must be left unchanged"),
        }
    }
}

fn run(scenario: &str, steps: Vec<Step>) {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    run_on(&mut p, epoch, scenario, steps);
}

fn hex(f: &[u8]) -> String {
    f.chunks(16)
        .map(|c| c.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

// Addresses.
const C4: &str = "198.18.0.1:40001";
const C4B: &str = "198.18.0.1:40002";
const VIP: &str = "198.18.100.1:80";
const B1: &str = "198.18.1.1:8080";
const SNAT4: &str = "198.18.1.254:40000";
const SNAT4B: &str = "198.18.1.254:40001";
const C6: &str = "[2001:2::1]:40001";
const VIP6: &str = "[2001:2:0:100::1]:80";
const B6: &str = "[2001:2:0:1::1]:8080";
const SNAT6: &str = "[2001:2:0:1::fe]:40000";
/// The SNAT port cursor is shared by both families.
const SNAT6_2: &str = "[2001:2:0:1::fe]:40001";

/// client → xvs.
fn cin(src: &str, dst: &str, ttl: u8, l4: L4) -> Vec<u8> {
    frame(CLIENT_MAC, XVS_MAC, sa(src), sa(dst), ttl, l4)
}
/// xvs → some MAC.
fn out(dmac: [u8; 6], src: &str, dst: &str, ttl: u8, l4: L4) -> Vec<u8> {
    frame(XVS_MAC, dmac, sa(src), sa(dst), ttl, l4)
}
/// backend (mac) → xvs.
fn bin(smac: [u8; 6], src: &str, dst: &str, ttl: u8, l4: L4) -> Vec<u8> {
    frame(smac, XVS_MAC, sa(src), sa(dst), ttl, l4)
}

#[test]
fn fullnat_tcp_v4_handshake_reply_and_second_flow() {
    run(
        "fullnat tcp v4",
        vec![
            tx(
                "SYN to VIP: DNAT + SNAT",
                cin(C4, VIP, 64, SYN),
                out(B1_MAC, SNAT4, B1, 63, SYN),
            ),
            tx(
                "SYN-ACK from backend back to client",
                bin(B1_MAC, B1, SNAT4, 64, SYNACK),
                out(CLIENT_MAC, VIP, C4, 63, SYNACK),
            ),
            tx(
                "ACK: same flow, same backend and port",
                cin(C4, VIP, 64, ACK),
                out(B1_MAC, SNAT4, B1, 63, ACK),
            ),
            tx(
                "a second client port gets the next SNAT port",
                cin(C4B, VIP, 64, SYN),
                out(B1_MAC, SNAT4B, B1, 63, SYN),
            ),
            tx(
                "reply of the second flow",
                bin(B1_MAC, B1, SNAT4B, 64, ACK),
                out(CLIENT_MAC, VIP, C4B, 63, ACK),
            ),
            tx(
                "FIN from the client",
                cin(C4, VIP, 30, FIN),
                out(B1_MAC, SNAT4, B1, 29, FIN),
            ),
            drop(
                "TTL 1 on an established flow",
                cin(C4, VIP, 1, ACK),
                DropReason::TtlExceeded,
            ),
            drop(
                "reply with hop limit exhausted",
                bin(B1_MAC, B1, SNAT4, 1, ACK),
                DropReason::TtlExceeded,
            ),
        ],
    );
}

#[test]
fn nat_tcp_v4_dnat_only() {
    let vip = "198.18.100.2:80";
    let b = "198.18.1.2:8080";
    run(
        "nat tcp v4",
        vec![
            tx(
                "SYN: destination only",
                cin(C4, vip, 64, SYN),
                out(B2_MAC, C4, b, 63, SYN),
            ),
            tx(
                "reply: source back to the VIP",
                bin(B2_MAC, b, C4, 64, SYNACK),
                out(CLIENT_MAC, vip, C4, 63, SYNACK),
            ),
            tx("ACK", cin(C4, vip, 64, ACK), out(B2_MAC, C4, b, 63, ACK)),
        ],
    );
}

#[test]
fn udp_v4_nat_fullnat_and_zero_checksum() {
    let (vip, b) = ("198.18.100.53:53", "198.18.1.1:53");
    let (vipf, bf) = ("198.18.100.54:53", "198.18.1.2:5353");
    let c = "198.18.0.1:5000";
    let zero = |mut f: Vec<u8>| {
        f[14 + 20 + 6..14 + 20 + 8].fill(0);
        f
    };
    run(
        "udp v4",
        vec![
            tx(
                "nat query",
                cin(c, vip, 64, L4::Udp),
                out(B1_MAC, c, b, 63, L4::Udp),
            ),
            tx(
                "nat answer",
                bin(B1_MAC, b, c, 64, L4::Udp),
                out(CLIENT_MAC, vip, c, 63, L4::Udp),
            ),
            tx(
                "fullnat query",
                cin(c, vipf, 64, L4::Udp),
                out(B2_MAC, SNAT4, bf, 63, L4::Udp),
            ),
            tx(
                "fullnat answer",
                bin(B2_MAC, bf, SNAT4, 64, L4::Udp),
                out(CLIENT_MAC, vipf, c, 63, L4::Udp),
            ),
            tx(
                "zero UDP checksum stays zero (IPv4: none)",
                zero(cin(c, vipf, 64, L4::Udp)),
                zero(out(B2_MAC, SNAT4, bf, 63, L4::Udp)),
            ),
        ],
    );
}

#[test]
fn sctp_v4_fullnat_and_nat() {
    let (vip, b) = ("198.18.100.9:3868", "198.18.1.1:3868");
    let (vipn, bn) = ("198.18.100.10:3868", "198.18.1.2:3869");
    let c = "198.18.0.1:5000";
    run(
        "sctp v4",
        vec![
            drop(
                "DATA without association",
                cin(c, vip, 64, L4::Sctp(0)),
                DropReason::NoFlow,
            ),
            tx(
                "INIT fullnat",
                cin(c, vip, 64, L4::Sctp(1)),
                out(B1_MAC, SNAT4, b, 63, L4::Sctp(1)),
            ),
            tx(
                "INIT ACK back",
                bin(B1_MAC, b, SNAT4, 64, L4::Sctp(2)),
                out(CLIENT_MAC, vip, c, 63, L4::Sctp(2)),
            ),
            tx(
                "DATA",
                cin(c, vip, 64, L4::Sctp(0)),
                out(B1_MAC, SNAT4, b, 63, L4::Sctp(0)),
            ),
            tx(
                "INIT nat",
                cin(c, vipn, 64, L4::Sctp(1)),
                out(B2_MAC, c, bn, 63, L4::Sctp(1)),
            ),
            tx(
                "nat reply",
                bin(B2_MAC, bn, c, 64, L4::Sctp(2)),
                out(CLIENT_MAC, vipn, c, 63, L4::Sctp(2)),
            ),
        ],
    );
}

#[test]
fn ipv6_tcp_udp_sctp_both_modes() {
    let (vipn, bn) = ("[2001:2:0:100::2]:80", "[2001:2:0:1::1]:8081");
    let (vipu, bu) = ("[2001:2:0:100::53]:53", "[2001:2:0:1::1]:53");
    let (vips, bs) = ("[2001:2:0:100::9]:3868", "[2001:2:0:1::1]:3868");
    let snat6b = "[2001:2:0:1::fe]:40001";
    let snat6c = "[2001:2:0:1::fe]:40002";
    let mut zero6 = cin(C6, vipu, 64, L4::Udp);
    zero6[14 + 40 + 6..14 + 40 + 8].fill(0);
    run(
        "ipv6",
        vec![
            tx(
                "fullnat SYN",
                cin(C6, VIP6, 64, SYN),
                out(B61_MAC, SNAT6, B6, 63, SYN),
            ),
            tx(
                "fullnat SYN-ACK",
                bin(B61_MAC, B6, SNAT6, 64, SYNACK),
                out(CLIENT_MAC, VIP6, C6, 63, SYNACK),
            ),
            tx(
                "fullnat ACK",
                cin(C6, VIP6, 64, ACK),
                out(B61_MAC, SNAT6, B6, 63, ACK),
            ),
            tx(
                "nat SYN",
                cin(C6, vipn, 64, SYN),
                out(B61_MAC, C6, bn, 63, SYN),
            ),
            tx(
                "nat reply",
                bin(B61_MAC, bn, C6, 64, SYNACK),
                out(CLIENT_MAC, vipn, C6, 63, SYNACK),
            ),
            tx(
                "udp fullnat",
                cin(C6, vipu, 64, L4::Udp),
                out(B61_MAC, snat6b, bu, 63, L4::Udp),
            ),
            tx(
                "udp reply",
                bin(B61_MAC, bu, snat6b, 64, L4::Udp),
                out(CLIENT_MAC, vipu, C6, 63, L4::Udp),
            ),
            drop(
                "udp with zero checksum is invalid over IPv6",
                zero6,
                DropReason::UdpZeroChecksumV6,
            ),
            tx(
                "sctp INIT",
                cin(C6, vips, 64, L4::Sctp(1)),
                out(B61_MAC, snat6c, bs, 63, L4::Sctp(1)),
            ),
            tx(
                "sctp reply",
                bin(B61_MAC, bs, snat6c, 64, L4::Sctp(2)),
                out(CLIENT_MAC, vips, C6, 63, L4::Sctp(2)),
            ),
            drop(
                "hop limit 1",
                cin("[2001:2::1]:40009", VIP6, 1, SYN),
                DropReason::TtlExceeded,
            ),
            drop(
                "ACK without flow",
                cin("[2001:2::1]:40010", VIP6, 64, ACK),
                DropReason::NoFlow,
            ),
        ],
    );
}

#[test]
fn new_flow_rules_and_non_frontend_traffic() {
    let mh_vip = "198.18.100.7:443";
    let mh_b = "198.18.1.3:8443";
    let mut arp = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, [0xff; 6])
        .arp(
            etherparse::ArpPacket::new(
                etherparse::ArpHardwareId::ETHERNET,
                etherparse::EtherType::IPV4,
                etherparse::ArpOperation::REQUEST,
                &CLIENT_MAC,
                &[198, 18, 0, 1],
                &[0; 6],
                &[198, 18, 100, 1],
            )
            .unwrap(),
        )
        .write(&mut arp)
        .unwrap();
    let mut echo = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, XVS_MAC)
        .ipv4([198, 18, 0, 1], [198, 18, 100, 1], 64)
        .icmpv4_echo_request(7, 1)
        .write(&mut echo, PAYLOAD)
        .unwrap();
    run(
        "new-flow rules",
        vec![
            drop(
                "TCP ACK without a flow",
                cin(C4, VIP, 64, ACK),
                DropReason::NoFlow,
            ),
            drop(
                "TCP SYN-ACK without a flow",
                cin(C4, VIP, 64, SYNACK),
                DropReason::NoFlow,
            ),
            tx(
                "mh: ACK without a flow is scheduled anyway",
                cin(C4, mh_vip, 64, ACK),
                out(B3_MAC, SNAT4, mh_b, 63, ACK),
            ),
            drop(
                "SYN with TTL 1 creates nothing",
                cin(C4B, VIP, 1, SYN),
                DropReason::TtlExceeded,
            ),
            tx(
                "the same client port then works",
                cin(C4B, VIP, 64, SYN),
                out(B1_MAC, SNAT4B, B1, 63, SYN),
            ),
            reject(
                "service without backends (as IPVS: ip_vs_leave)",
                cin(C4, "198.18.100.99:80", 64, SYN),
                RejectReason::NoEndpoints,
            ),
            reject(
                "every backend drained",
                cin(C4, "198.18.100.98:80", 64, SYN),
                RejectReason::NoEndpoints,
            ),
            slow(
                "backend without a neighbour entry",
                cin(C4, "198.18.100.97:80", 64, SYN),
            ),
            pass("not a frontend (port)", cin(C4, "198.18.100.1:81", 64, SYN)),
            pass(
                "not a frontend (address)",
                cin(C4, "198.18.0.50:80", 64, SYN),
            ),
            pass("not a frontend (protocol)", cin(C4, VIP, 64, L4::Udp)),
            pass("ARP", arp),
            pass("ICMP echo to a VIP goes to the kernel", echo),
        ],
    );
}

#[test]
fn malformed_frames_are_dropped() {
    let good = cin(C4, VIP, 64, SYN);
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = good.clone();
        f(&mut v);
        v
    };
    let fix_ip_csum = |v: &mut Vec<u8>| {
        v[24..26].fill(0);
        let c = checksum::checksum(&v[14..34]);
        v[24..26].copy_from_slice(&c.to_be_bytes());
    };
    run(
        "malformed",
        vec![
            drop(
                "truncated Ethernet",
                good[..10].to_vec(),
                DropReason::Truncated,
            ),
            drop(
                "truncated IPv4 header",
                good[..30].to_vec(),
                DropReason::Truncated,
            ),
            drop(
                "bad IHL",
                with(&|v| {
                    v[14] = 0x44;
                    fix_ip_csum(v)
                }),
                DropReason::BadIhl,
            ),
            drop(
                "total length beyond the frame",
                with(&|v| {
                    v[16..18].copy_from_slice(&2000u16.to_be_bytes());
                    fix_ip_csum(v)
                }),
                DropReason::Truncated,
            ),
            drop(
                "total length below the header",
                with(&|v| {
                    v[16..18].copy_from_slice(&10u16.to_be_bytes());
                    fix_ip_csum(v)
                }),
                DropReason::BadLength,
            ),
            drop(
                "bad IPv4 header checksum",
                with(&|v| v[24] ^= 0x55),
                DropReason::BadIpChecksum,
            ),
            drop(
                "wrong version",
                with(&|v| {
                    v[14] = 0x65;
                    fix_ip_csum(v)
                }),
                DropReason::BadVersion,
            ),
            drop(
                "truncated TCP header",
                with(&|v| {
                    v.truncate(14 + 20 + 10);
                    v[16..18].copy_from_slice(&30u16.to_be_bytes());
                    fix_ip_csum(v)
                }),
                DropReason::Truncated,
            ),
            drop(
                "TCP data offset below 5",
                with(&|v| v[14 + 20 + 12] = 0x40),
                DropReason::BadL4Header,
            ),
        ],
    );
}

/// Splits an IPv4 frame (no options) into two fragments at `split` payload bytes, id `id`.
fn fragment(f: &[u8], split: usize, id: u16) -> (Vec<u8>, Vec<u8>) {
    assert_eq!(split % 8, 0);
    let (hdr, payload) = (&f[..34], &f[34..]);
    let mk = |part: &[u8], off: usize, mf: bool| {
        let mut v = hdr.to_vec();
        v.extend_from_slice(part);
        v[16..18].copy_from_slice(&((20 + part.len()) as u16).to_be_bytes());
        v[18..20].copy_from_slice(&id.to_be_bytes());
        let fo = (off / 8) as u16 | if mf { 0x2000 } else { 0 };
        v[20..22].copy_from_slice(&fo.to_be_bytes());
        v[24..26].fill(0);
        let c = checksum::checksum(&v[14..34]);
        v[24..26].copy_from_slice(&c.to_be_bytes());
        v
    };
    (
        mk(&payload[..split], 0, true),
        mk(&payload[split..], split, false),
    )
}

#[test]
fn ipv4_fragments_follow_the_first() {
    let (vipf, bf) = ("198.18.100.54:53", "198.18.1.2:5353");
    let c = "198.18.0.1:5000";
    let (i1, i2) = fragment(&cin(c, vipf, 64, L4::Udp), 16, 0x1234);
    let (o1, o2) = fragment(&out(B2_MAC, SNAT4, bf, 63, L4::Udp), 16, 0x1234);
    let (j1, j2) = fragment(&cin(c, vipf, 64, L4::Udp), 16, 0x9999);
    let (_, k2) = fragment(&cin(c, vipf, 64, L4::Udp), 16, 0x4321);
    let (r1, r2) = fragment(&bin(B2_MAC, bf, SNAT4, 64, L4::Udp), 16, 0x7777);
    let (q1, q2) = fragment(&out(CLIENT_MAC, vipf, c, 63, L4::Udp), 16, 0x7777);
    let (s1, _) = fragment(&cin(c, "198.18.100.9:3868", 64, L4::Sctp(1)), 16, 0x5555);
    run(
        "fragments",
        vec![
            drop(
                "later fragment before any first",
                k2,
                DropReason::FragmentNoMatch,
            ),
            tx("first fragment scheduled", i1, o1),
            tx("later fragment follows", i2, o2).at(500),
            tx("reply first fragment", r1, q1).at(600),
            tx("reply later fragment", r2, q2).at(700),
            tx(
                "another datagram of the flow",
                j1,
                fragment(&out(B2_MAC, SNAT4, bf, 63, L4::Udp), 16, 0x9999).0,
            )
            .at(1000),
            drop(
                "its later fragment after the fragment timeout",
                j2,
                DropReason::FragmentNoMatch,
            )
            .at(3500),
            drop("fragmented SCTP", s1, DropReason::SctpFragment),
        ],
    );
}

/// An IPv4 ICMP error from `src` to `dst` quoting `quote` (an IP packet, possibly cut).
fn icmp4(
    smac: [u8; 6],
    dmac: [u8; 6],
    src: &str,
    dst: &str,
    ttl: u8,
    ty: Icmpv4Type,
    quote: &[u8],
) -> Vec<u8> {
    let (s, d): (std::net::Ipv4Addr, std::net::Ipv4Addr) =
        (src.parse().unwrap(), dst.parse().unwrap());
    let mut v = Vec::new();
    PacketBuilder::ethernet2(smac, dmac)
        .ipv4(s.octets(), d.octets(), ttl)
        .icmpv4(ty)
        .write(&mut v, quote)
        .unwrap();
    v
}

fn icmp6(
    smac: [u8; 6],
    dmac: [u8; 6],
    src: &str,
    dst: &str,
    ttl: u8,
    ty: Icmpv6Type,
    quote: &[u8],
) -> Vec<u8> {
    let (s, d): (std::net::Ipv6Addr, std::net::Ipv6Addr) =
        (src.parse().unwrap(), dst.parse().unwrap());
    let mut v = Vec::new();
    PacketBuilder::ethernet2(smac, dmac)
        .ipv6(s.octets(), d.octets(), ttl)
        .icmpv6(ty)
        .write(&mut v, quote)
        .unwrap();
    v
}

/// The IP packet inside a frame, cut to `len` bytes.
fn ip_of(f: &[u8], len: usize) -> Vec<u8> {
    f[14..(14 + len).min(f.len())].to_vec()
}

#[test]
fn icmp_errors_are_translated() {
    // Quoted packets keep the TTL they left xvs with (as in IPVS): only addresses, ports and
    // checksums are put back.
    let frag_needed =
        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
            next_hop_mtu: 1400,
        });
    let port_unreach = Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Port);
    let router = "198.18.0.2";
    let too_big = Icmpv6Type::PacketTooBig { mtu: 1280 };
    let unreach6 = Icmpv6Type::DestinationUnreachable(DestUnreachableCode::Port);
    let vipn = "198.18.100.2:80";
    let bn = "198.18.1.2:8080";
    let full = 1000;
    run(
        "icmp",
        vec![
            tx(
                "flow",
                cin(C4, VIP, 64, SYN),
                out(B1_MAC, SNAT4, B1, 63, SYN),
            ),
            tx(
                "backend: port unreachable about SNAT→backend, whole quote",
                icmp4(
                    B1_MAC,
                    XVS_MAC,
                    "198.18.1.1",
                    "198.18.1.254",
                    64,
                    port_unreach.clone(),
                    &ip_of(&out(B1_MAC, SNAT4, B1, 63, SYN), full),
                ),
                icmp4(
                    XVS_MAC,
                    CLIENT_MAC,
                    "198.18.100.1",
                    "198.18.0.1",
                    63,
                    port_unreach,
                    &ip_of(&cin(C4, VIP, 63, SYN), full),
                ),
            ),
            tx(
                "router on the client side: frag needed about VIP→client, 8-byte quote",
                icmp4(
                    CLIENT_MAC,
                    XVS_MAC,
                    router,
                    "198.18.100.1",
                    64,
                    frag_needed.clone(),
                    &ip_of(&out(CLIENT_MAC, VIP, C4, 63, ACK), 28),
                ),
                icmp4(
                    XVS_MAC,
                    B1_MAC,
                    "198.18.1.254",
                    "198.18.1.1",
                    63,
                    frag_needed.clone(),
                    &ip_of(&bin(B1_MAC, B1, SNAT4, 63, ACK), 28),
                ),
            ),
            tx(
                "quote holding the TCP checksum: updated incrementally",
                icmp4(
                    CLIENT_MAC,
                    XVS_MAC,
                    router,
                    "198.18.100.1",
                    64,
                    frag_needed.clone(),
                    &ip_of(&out(CLIENT_MAC, VIP, C4, 63, ACK), 40),
                ),
                icmp4(
                    XVS_MAC,
                    B1_MAC,
                    "198.18.1.254",
                    "198.18.1.1",
                    63,
                    frag_needed.clone(),
                    &ip_of(&bin(B1_MAC, B1, SNAT4, 63, ACK), 40),
                ),
            ),
            tx(
                "nat flow",
                cin(C4, vipn, 64, SYN),
                out(B2_MAC, C4, bn, 63, SYN),
            ),
            tx(
                "nat: router between backend and xvs, about client→backend",
                icmp4(
                    B2_MAC,
                    XVS_MAC,
                    router,
                    "198.18.0.1",
                    64,
                    frag_needed.clone(),
                    &ip_of(&out(B2_MAC, C4, bn, 63, SYN), full),
                ),
                icmp4(
                    XVS_MAC,
                    CLIENT_MAC,
                    "198.18.100.2",
                    "198.18.0.1",
                    63,
                    frag_needed.clone(),
                    &ip_of(&cin(C4, vipn, 63, SYN), full),
                ),
            ),
            pass(
                "an error about no flow of ours",
                icmp4(
                    B1_MAC,
                    XVS_MAC,
                    "198.18.1.1",
                    "198.18.1.254",
                    64,
                    frag_needed.clone(),
                    &ip_of(&out(B1_MAC, "198.18.1.254:1234", B1, 63, SYN), full),
                ),
            ),
            drop(
                "TTL 1",
                icmp4(
                    B1_MAC,
                    XVS_MAC,
                    "198.18.1.1",
                    "198.18.1.254",
                    1,
                    frag_needed,
                    &ip_of(&out(B1_MAC, SNAT4, B1, 63, SYN), full),
                ),
                DropReason::TtlExceeded,
            ),
            tx(
                "v6 flow",
                cin(C6, VIP6, 64, SYN),
                out(B61_MAC, SNAT6_2, B6, 63, SYN),
            ),
            tx(
                "ICMPv6 packet too big from the backend",
                icmp6(
                    B61_MAC,
                    XVS_MAC,
                    "2001:2:0:1::1",
                    "2001:2:0:1::fe",
                    64,
                    too_big,
                    &ip_of(&out(B61_MAC, SNAT6_2, B6, 63, SYN), full),
                ),
                icmp6(
                    XVS_MAC,
                    CLIENT_MAC,
                    "2001:2:0:100::1",
                    "2001:2::1",
                    63,
                    too_big,
                    &ip_of(&cin(C6, VIP6, 63, SYN), full),
                ),
            ),
            tx(
                "ICMPv6 unreachable from the client side, about VIP→client, cut quote",
                icmp6(
                    CLIENT_MAC,
                    XVS_MAC,
                    "2001:2::1",
                    "2001:2:0:100::1",
                    64,
                    unreach6,
                    &ip_of(&out(CLIENT_MAC, VIP6, C6, 63, ACK), 48),
                ),
                icmp6(
                    XVS_MAC,
                    B61_MAC,
                    "2001:2:0:1::fe",
                    "2001:2:0:1::1",
                    63,
                    unreach6,
                    &ip_of(&bin(B61_MAC, B6, SNAT6_2, 63, ACK), 48),
                ),
            ),
        ],
    );
}

#[test]
fn same_flow_same_backend_and_removed_backends_keep_their_flows() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let vip = "198.18.100.20:80";
    let backend_of = |f: &[u8]| {
        SocketAddr::new(
            std::net::Ipv4Addr::new(f[30], f[31], f[32], f[33]).into(),
            u16::from_be_bytes([f[36], f[37]]),
        )
    };
    let send = |p: &mut Pipeline, src: &str, l4: L4, ms: u64| {
        let mut f = cin(src, vip, 64, l4);
        assert_eq!(p.process(&mut f, at(epoch, ms)), Verdict::Tx(0), "{src}");
        verify_checksums(&f, src);
        backend_of(&f)
    };
    let a = send(&mut p, "198.18.0.1:1000", SYN, 0);
    let b = send(&mut p, "198.18.0.1:1001", SYN, 0);
    assert_ne!(a, b, "rr spreads two flows over two backends");
    for i in 0..5 {
        assert_eq!(send(&mut p, "198.18.0.1:1000", ACK, i), a);
        assert_eq!(send(&mut p, "198.18.0.1:1001", ACK, i), b);
    }
    // Drain `a` (weight 0), then remove it entirely: its flow keeps going, new flows avoid it.
    let mut cfg = config::parse(CONFIG, "fixture.toml").unwrap();
    let svc = cfg.services.iter_mut().find(|s| s.name == "two").unwrap();
    svc.backends
        .iter_mut()
        .find(|x| x.addr == a)
        .unwrap()
        .weight = 0;
    let mut builder = SnapshotBuilder::from_config(&cfg);
    p.set_snapshot(Arc::new(builder.build_config(&cfg).unwrap()));
    assert_eq!(
        send(&mut p, "198.18.0.1:1000", ACK, 10),
        a,
        "drained backend keeps its flow"
    );
    for port in 2000..2010 {
        assert_eq!(
            send(&mut p, &format!("198.18.0.1:{port}"), SYN, 10),
            b,
            "new flows avoid it"
        );
    }
    let svc = cfg.services.iter_mut().find(|s| s.name == "two").unwrap();
    svc.backends.retain(|x| x.addr != a);
    p.set_snapshot(Arc::new(builder.build_config(&cfg).unwrap()));
    assert_eq!(
        send(&mut p, "198.18.0.1:1000", ACK, 20),
        a,
        "removed backend keeps its flow"
    );
    assert_eq!(send(&mut p, "198.18.0.1:3000", SYN, 20), b);
}

#[test]
fn flow_table_full_and_snat_exhaustion() {
    let small = CONFIG.replace("capacity = 4096", "capacity = 100").replace(
        "snat_port_range = \"40000-40999\"",
        "snat_port_range = \"40000-40063\"",
    );
    let epoch = Instant::now();
    let mut p = pipeline_from(&small, epoch);
    let vipf = "198.18.100.54:53";
    for i in 0..64 {
        let mut f = cin(&format!("198.18.0.1:{}", 6000 + i), vipf, 64, L4::Udp);
        assert_eq!(p.process(&mut f, epoch), Verdict::Tx(0), "flow {i}");
    }
    let mut f = cin("198.18.0.1:7000", vipf, 64, L4::Udp);
    assert_eq!(
        p.process(&mut f, epoch),
        Verdict::Drop(DropReason::SnatPortsExhausted),
        "64 ports, 64 flows to one backend"
    );
    // The same ports still serve another backend (the reply tuple differs).
    let mut f = cin("198.18.0.1:7001", VIP, 64, SYN);
    assert_eq!(p.process(&mut f, epoch), Verdict::Tx(0));
    // nat flows need no port; UDP flows are not embryonic, so nothing is recycled: full.
    let mut verdicts = Vec::new();
    for i in 0..100 {
        let mut f = cin(
            &format!("198.18.0.2:{}", 8000 + i),
            "198.18.100.53:53",
            64,
            L4::Udp,
        );
        verdicts.push(p.process(&mut f, epoch));
    }
    assert_eq!(verdicts[0], Verdict::Tx(0));
    assert_eq!(
        verdicts[99],
        Verdict::Drop(DropReason::FlowTableFull),
        "{verdicts:?}"
    );
    let c = p.counters();
    assert_eq!(c.dropped(DropReason::SnatPortsExhausted), 1);
    assert!(c.dropped(DropReason::FlowTableFull) >= 1);
    assert_eq!(c.new_flows, c.tx);
    assert_eq!(c.tx + c.drops_total(), 64 + 1 + 1 + 100);
}

#[test]
fn drop_reason_names_are_unique_and_counters_sum() {
    let mut names: Vec<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
    assert_eq!(names.len(), DropReason::COUNT);
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), DropReason::COUNT);
    for (i, r) in DropReason::ALL.iter().enumerate() {
        assert_eq!(*r as usize, i);
    }
}

#[test]
fn load_balancer_source_ranges_admit_only_their_clients() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let vip = "198.18.100.20:80";
    // The same service, now restricted to 198.18.0.0/30 (as loadBalancerSourceRanges).
    let cfg = config::parse(CONFIG, "fixture.toml").unwrap();
    let mut specs = fastpath::snapshot::ServiceSpec::from_config(&cfg);
    for s in specs.iter_mut().filter(|s| s.name == "two") {
        s.source_ranges = vec!["198.18.0.0/30".parse().unwrap()];
    }
    let snap = SnapshotBuilder::from_config(&cfg)
        .build(&specs, &fastpath::snapshot::L2Table::from_config(&cfg))
        .unwrap();
    p.set_snapshot(Arc::new(snap));
    let mut inside = cin("198.18.0.1:1000", vip, 64, SYN);
    assert_eq!(p.process(&mut inside, epoch), Verdict::Tx(0));
    let mut outside = cin("198.18.0.9:1000", vip, 64, SYN);
    let before = outside.clone();
    assert_eq!(
        p.process(&mut outside, epoch),
        Verdict::Drop(DropReason::SourceRange)
    );
    assert_eq!(outside, before, "a dropped frame is left as it was");
    assert_eq!(p.counters().dropped(DropReason::SourceRange), 1);
}

/// The "two" service of the fixture config with `edit` applied, swapped into `p`.
fn with_service_two(p: &mut Pipeline, edit: impl Fn(&mut ServiceSpec), frozen: bool) {
    let cfg = config::parse(CONFIG, "fixture.toml").unwrap();
    let mut specs = ServiceSpec::from_config(&cfg);
    specs.iter_mut().filter(|s| s.name == "two").for_each(edit);
    let mut b = SnapshotBuilder::from_config(&cfg);
    b.set_frozen(frozen);
    let snap = b
        .build(&specs, &fastpath::snapshot::L2Table::from_config(&cfg))
        .unwrap();
    p.set_snapshot(Arc::new(snap));
}

#[test]
fn freeze_refuses_new_flows_and_keeps_established_ones() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let vip = "198.18.100.20:80";
    let mut syn = cin("198.18.0.1:1000", vip, 64, SYN);
    assert_eq!(p.process(&mut syn, epoch), Verdict::Tx(0));
    for global in [false, true] {
        with_service_two(&mut p, |s| s.frozen = !global, global);
        // The established flow continues...
        let mut ack = cin("198.18.0.1:1000", vip, 64, ACK);
        assert_eq!(
            p.process(&mut ack, epoch),
            Verdict::Tx(0),
            "global {global}"
        );
        // ...a new one is refused, frame untouched.
        let mut new = cin("198.18.0.1:1001", vip, 64, SYN);
        let before = new.clone();
        assert_eq!(
            p.process(&mut new, epoch),
            Verdict::Drop(DropReason::Frozen),
            "global {global}"
        );
        assert_eq!(new, before);
    }
    assert_eq!(p.counters().dropped(DropReason::Frozen), 2);
    // Unfrozen: new flows again.
    with_service_two(&mut p, |_| {}, false);
    let mut new = cin("198.18.0.1:1001", vip, 64, SYN);
    assert_eq!(p.process(&mut new, epoch), Verdict::Tx(0));
}

#[test]
fn rate_limit_drops_excess_syns_but_not_established_packets() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let vip = "198.18.100.20:80";
    with_service_two(
        &mut p,
        |s| s.rate_limit = Some(fastpath::snapshot::RateLimit { rate: 10, burst: 3 }),
        false,
    );
    let verdicts: Vec<Verdict> = (0..5u16)
        .map(|i| {
            let mut f = cin(&format!("198.18.0.1:{}", 2000 + i), vip, 64, SYN);
            p.process(&mut f, epoch)
        })
        .collect();
    let limited = Verdict::Drop(DropReason::RateLimited);
    assert_eq!(
        verdicts,
        [
            Verdict::Tx(0),
            Verdict::Tx(0),
            Verdict::Tx(0),
            limited,
            limited
        ]
    );
    // Established flows are never limited.
    for _ in 0..10 {
        let mut ack = cin("198.18.0.1:2000", vip, 64, ACK);
        assert_eq!(p.process(&mut ack, epoch), Verdict::Tx(0));
    }
    // 100 ms later one token is back (10/s).
    let later = at(epoch, 100);
    let mut a = cin("198.18.0.1:3000", vip, 64, SYN);
    let mut b = cin("198.18.0.1:3001", vip, 64, SYN);
    assert_eq!(p.process(&mut a, later), Verdict::Tx(0));
    assert_eq!(p.process(&mut b, later), limited);
    let svc = &p
        .snapshot()
        .services
        .iter()
        .find(|s| s.name == "two")
        .unwrap()
        .clone();
    assert_eq!(
        svc.rate_limited.load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    assert_eq!(p.counters().dropped(DropReason::RateLimited), 3);
}

#[test]
fn rate_limit_from_the_config() {
    let text = CONFIG.replace(
        "name = \"two\"\n",
        "name = \"two\"\nnew_conn_rate = 5\nnew_conn_burst = 2\n",
    );
    assert_ne!(text, CONFIG);
    let epoch = Instant::now();
    let mut p = pipeline_from(&text, epoch);
    let vip = "198.18.100.20:80";
    let v: Vec<Verdict> = (0..3u16)
        .map(|i| {
            let mut f = cin(&format!("198.18.0.1:{}", 4000 + i), vip, 64, SYN);
            p.process(&mut f, epoch)
        })
        .collect();
    assert_eq!(
        v,
        [
            Verdict::Tx(0),
            Verdict::Tx(0),
            Verdict::Drop(DropReason::RateLimited)
        ]
    );
}

/// A flow's next hop follows the snapshot: once a new snapshot moves its backend's
/// neighbour to another MAC, the flow's next packet leaves for the new MAC (the next-hop
/// cache, whose IPv4 slots are keyed by the address alone, is cleared when the snapshot
/// changes), and setting the same snapshot again keeps the cache.
#[test]
fn a_changed_neighbour_takes_the_next_packet_of_a_flow() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let cfg = config::parse(CONFIG, "fixture.toml").unwrap();
    let specs = ServiceSpec::from_config(&cfg);
    let backends: Vec<_> = specs
        .iter()
        .find(|s| s.name == "two")
        .unwrap()
        .backends
        .iter()
        .map(|b| b.addr.ip())
        .collect();
    let mut builder = SnapshotBuilder::from_config(&cfg);
    let mut with_mac = |mac: [u8; 6]| {
        let mut l2 = fastpath::snapshot::L2Table::from_config(&cfg);
        l2.neighbours.retain(|n| !backends.contains(&n.ip));
        l2.neighbours
            .extend(backends.iter().map(|&ip| fastpath::snapshot::Neighbour {
                ip,
                mac,
                port: None,
            }));
        Arc::new(builder.build(&specs, &l2).unwrap())
    };
    let (old, new) = ([2, 0, 0, 0, 0, 0xa1], [2, 0, 0, 0, 0, 0xb2]);
    let first = with_mac(old);
    p.set_snapshot(Arc::clone(&first));
    let vip = "198.18.100.20:80";
    let send = |p: &mut Pipeline, l4: L4| {
        let mut f = cin("198.18.0.1:1000", vip, 64, l4);
        assert_eq!(p.process(&mut f, epoch), Verdict::Tx(0));
        <[u8; 6]>::try_from(&f[..6]).unwrap()
    };
    assert_eq!(send(&mut p, SYN), old);
    assert_eq!(send(&mut p, ACK), old);
    p.set_snapshot(Arc::clone(&first));
    assert_eq!(
        send(&mut p, ACK),
        old,
        "the same snapshot: the same next hop"
    );
    p.set_snapshot(with_mac(new));
    assert_eq!(send(&mut p, ACK), new, "the neighbour's new MAC");
    assert_eq!(send(&mut p, ACK), new);
}
