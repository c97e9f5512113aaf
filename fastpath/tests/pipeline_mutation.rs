//! No corrupt input leaves with a valid checksum.
//!
//! Valid frames of existing flows (ICMP and ICMPv6 errors quoting whole and cut packets,
//! SCTP in both directions and modes, and TCP/UDP, whose checksums are updated
//! incrementally) get every bit of their L4 part flipped, one at a time, each on a fresh
//! pipeline holding the same flows. A mutated frame whose checksums no longer all verify
//! (the outer ones and those of the packet an error quotes) must be dropped or passed, or
//! leave with a checksum that still does not verify. ICMP errors are also mutated inside
//! the quote with the ICMP checksum made right again (a corrupt quote in a valid error).
//! Frames recomputed from scratch (ICMP, SCTP) must not be transmitted at all.

use std::sync::Arc;
use std::time::Instant;

use etherparse::{Icmpv4Type, Icmpv6Type, PacketBuilder, icmpv4::DestUnreachableHeader};
use fastpath::pipeline::{Pipeline, PipelineConfig, Verdict};
use fastpath::settings::flow_table_config;
use fastpath::snapshot::{Snapshot, SnapshotBuilder};
use fastpath::testing::*;
use fastpath::wire::checksum;
use flowtable::FlowTable;
use lb_algos::AffinityTable;

fn be16(d: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([d[at], d[at + 1]]))
}

/// Whether an L4 segment of protocol `proto` between `src` and `dst` (4 or 16 bytes each)
/// verifies; for ICMP errors, the quoted packet's checksums too.
fn l4_valid(src: &[u8], dst: &[u8], proto: u8, l4: &[u8]) -> bool {
    let pseudo = |p: u8| match (
        src.len(),
        <[u8; 4]>::try_from(src),
        <[u8; 4]>::try_from(dst),
    ) {
        (4, Ok(s), Ok(d)) => checksum::l4_checksum_v4(&s, &d, p, l4),
        _ => checksum::l4_checksum_v6(&src.try_into().unwrap(), &dst.try_into().unwrap(), p, l4),
    };
    match proto {
        6 => l4.len() >= 20 && pseudo(6) == 0,
        // IPv4: a zero checksum is "none".
        17 => l4.len() >= 8 && ((src.len() == 4 && l4[6..8] == [0, 0]) || pseudo(17) == 0),
        132 => {
            if l4.len() < 12 {
                return false;
            }
            let mut z = l4.to_vec();
            z[8..12].fill(0);
            crc32c::crc32c(&z).to_le_bytes() == l4[8..12]
        }
        1 => l4.len() >= 8 && checksum::checksum(l4) == 0 && quote_valid(&l4[8..], false),
        58 => l4.len() >= 8 && pseudo(58) == 0 && quote_valid(&l4[8..], true),
        _ => true,
    }
}

/// Whether what an ICMP error quotes verifies as far as it can be checked: an IPv4 header's
/// checksum, and the L4 checksum of a packet quoted whole.
fn quote_valid(q: &[u8], v6: bool) -> bool {
    if v6 {
        if q.len() < 40 {
            return true;
        }
        let end = 40 + be16(q, 4);
        end > q.len() || l4_valid(&q[8..24], &q[24..40], q[6], &q[40..end])
    } else {
        if q.len() < 20 {
            return true;
        }
        let hl = usize::from(q[0] & 0x0f) * 4;
        if hl < 20 || hl > q.len() {
            return true;
        }
        if checksum::checksum(&q[..hl]) != 0 {
            return false;
        }
        let end = be16(q, 2);
        end < hl
            || end > q.len()
            || matches!(q[9], 1 | 58)
            || l4_valid(&q[12..16], &q[16..20], q[9], &q[hl..end])
    }
}

/// Whether every checksum of an untagged frame verifies.
fn valid(f: &[u8]) -> bool {
    let ip = &f[14..];
    if f[12..14] == [0x08, 0x00] {
        let hl = usize::from(ip[0] & 0x0f) * 4;
        checksum::checksum(&ip[..hl]) == 0
            && l4_valid(&ip[12..16], &ip[16..20], ip[9], &ip[hl..be16(ip, 2)])
    } else {
        l4_valid(&ip[8..24], &ip[24..40], ip[6], &ip[40..40 + be16(ip, 4)])
    }
}

/// The flows every pipeline starts with; `process` gives these frames as sent.
struct Rig {
    snapshot: Arc<Snapshot>,
    cfg: config::Config,
    setup: Vec<Vec<u8>>,
}

const VIPS: &str = "198.18.100.9:3868";
const VIPSN: &str = "198.18.100.10:3868";
const VIP6S: &str = "[2001:2:0:100::9]:3868";
const VIPF: &str = "198.18.100.54:53";
const VIP6U: &str = "[2001:2:0:100::53]:53";
const C4: &str = "198.18.0.1:40001";
const C6: &str = "[2001:2::1]:40001";

fn cin(src: &str, dst: &str, l4: L4) -> Vec<u8> {
    frame(CLIENT_MAC, XVS_MAC, sa(src), sa(dst), 64, l4)
}

impl Rig {
    fn new() -> Rig {
        let cfg = config::parse(CONFIG, "fixture.toml").unwrap();
        let snapshot = Arc::new(
            SnapshotBuilder::from_config(&cfg)
                .build_config(&cfg)
                .unwrap(),
        );
        let setup = vec![
            cin(C4, "198.18.100.1:80", SYN),
            cin(C4, "198.18.100.2:80", SYN),
            cin(C6, "[2001:2:0:100::1]:80", SYN),
            cin(C4, VIPS, L4::Sctp(1)),
            cin(C4, VIPSN, L4::Sctp(1)),
            cin(C6, VIP6S, L4::Sctp(1)),
            cin(C4, VIPF, L4::Udp),
            cin(C6, VIP6U, L4::Udp),
        ];
        Rig {
            snapshot,
            cfg,
            setup,
        }
    }

    /// A pipeline holding the flows, and the frames their first packets left as.
    fn pipeline(&self) -> (Pipeline, Instant, Vec<Vec<u8>>) {
        let epoch = Instant::now();
        let flows = FlowTable::new(flow_table_config(&self.cfg), epoch).unwrap();
        let mut pc = PipelineConfig::from_config(&self.cfg, 0, 1);
        pc.mac = XVS_MAC;
        let mut p = Pipeline::new(
            pc,
            Arc::new(flows),
            Arc::new(AffinityTable::new(16, epoch)),
            Arc::clone(&self.snapshot),
        );
        let sent = self
            .setup
            .iter()
            .map(|f| {
                let mut g = f.clone();
                assert_eq!(p.process(&mut g, epoch), Verdict::Tx(0));
                g
            })
            .collect();
        (p, epoch, sent)
    }
}

/// The source and destination of an untagged frame as `ip:port` (`[ip]:port`) strings.
fn ends(f: &[u8]) -> (String, String) {
    let (s, d, l4) = if f[12..14] == [0x08, 0x00] {
        let a = |at: usize| std::net::Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3]);
        (a(26).to_string(), a(30).to_string(), 34)
    } else {
        let a = |at: usize| {
            let b: [u8; 16] = f[at..at + 16].try_into().unwrap();
            format!("[{}]", std::net::Ipv6Addr::from(b))
        };
        (a(22), a(38), 54)
    };
    (
        format!("{s}:{}", be16(f, l4)),
        format!("{d}:{}", be16(f, l4 + 2)),
    )
}

/// The backend's reply to a frame xvs sent (`sent`), with `l4`.
fn reply(sent: &[u8], smac: [u8; 6], l4: L4) -> Vec<u8> {
    let (s, d) = ends(sent);
    frame(smac, XVS_MAC, sa(&d), sa(&s), 64, l4)
}

fn icmp4(src: [u8; 4], dst: [u8; 4], ty: Icmpv4Type, quote: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(B1_MAC, XVS_MAC)
        .ipv4(src, dst, 64)
        .icmpv4(ty)
        .write(&mut v, quote)
        .unwrap();
    v
}

fn icmp6(src: [u8; 16], dst: [u8; 16], quote: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(B61_MAC, XVS_MAC)
        .ipv6(src, dst, 64)
        .icmpv6(Icmpv6Type::PacketTooBig { mtu: 1280 })
        .write(&mut v, quote)
        .unwrap();
    v
}

/// What a seed is: the rules for its mutants.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// An ICMP(v6) error: recomputed, so a corrupt one is never sent.
    Icmp,
    /// SCTP: its CRC32c is recomputed; never sent corrupt.
    Sctp,
    /// TCP/UDP: updated incrementally; may be sent, with a checksum that stays wrong.
    Incremental,
}

/// The ICMP checksum of an untagged error frame made right again.
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

fn seeds(sent: &[Vec<u8>]) -> Vec<(&'static str, Kind, Vec<u8>)> {
    let unreach = Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Port);
    let frag = Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
        next_hop_mtu: 1400,
    });
    let (b1, snat4) = ([198, 18, 1, 1], [198, 18, 1, 254]);
    let b6: [u8; 16] = "2001:2:0:1::1"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets();
    let snat6: [u8; 16] = "2001:2:0:1::fe"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets();
    let ip = |f: &Vec<u8>, n: usize| f[14..(14 + n).min(f.len())].to_vec();
    // The client side's view of the fullnat TCP flow (VIP → client), as a router quotes it.
    let to_client = frame(
        XVS_MAC,
        CLIENT_MAC,
        sa("198.18.100.1:80"),
        sa(C4),
        63,
        SYNACK,
    );
    use Kind::*;
    vec![
        (
            "v4 error, whole TCP quote",
            Icmp,
            icmp4(b1, snat4, unreach.clone(), &ip(&sent[0], 1000)),
        ),
        (
            "v4 error, 28-byte quote",
            Icmp,
            icmp4(b1, snat4, frag.clone(), &ip(&sent[0], 28)),
        ),
        (
            "v4 error, 40-byte quote (TCP checksum)",
            Icmp,
            icmp4(b1, snat4, frag.clone(), &ip(&sent[0], 40)),
        ),
        (
            "v4 error from the client side",
            Icmp,
            icmp4(
                [198, 18, 0, 2],
                [198, 18, 100, 1],
                frag.clone(),
                &ip(&to_client, 1000),
            ),
        ),
        (
            "v4 error, nat flow",
            Icmp,
            icmp4(
                [198, 18, 1, 2],
                [198, 18, 0, 1],
                unreach.clone(),
                &ip(&sent[1], 1000),
            ),
        ),
        (
            "v6 error, whole TCP quote",
            Icmp,
            icmp6(b6, snat6, &ip(&sent[2], 1000)),
        ),
        (
            "v6 error, 48-byte quote",
            Icmp,
            icmp6(b6, snat6, &ip(&sent[2], 48)),
        ),
        (
            "v4 error, whole SCTP quote",
            Icmp,
            icmp4(b1, snat4, unreach.clone(), &ip(&sent[3], 1000)),
        ),
        (
            "v6 error, whole SCTP quote",
            Icmp,
            icmp6(b6, snat6, &ip(&sent[5], 1000)),
        ),
        (
            "v4 error, whole UDP quote",
            Icmp,
            icmp4([198, 18, 1, 2], snat4, unreach.clone(), &ip(&sent[6], 1000)),
        ),
        ("SCTP DATA", Sctp, cin(C4, VIPS, L4::Sctp(0))),
        ("SCTP reply", Sctp, reply(&sent[3], B1_MAC, L4::Sctp(0))),
        ("SCTP nat DATA", Sctp, cin(C4, VIPSN, L4::Sctp(0))),
        ("SCTP nat reply", Sctp, reply(&sent[4], B2_MAC, L4::Sctp(0))),
        ("SCTP v6 DATA", Sctp, cin(C6, VIP6S, L4::Sctp(0))),
        ("SCTP v6 reply", Sctp, reply(&sent[5], B61_MAC, L4::Sctp(0))),
        (
            "TCP ACK (fast path)",
            Incremental,
            cin(C4, "198.18.100.1:80", ACK),
        ),
        ("TCP reply", Incremental, reply(&sent[0], B1_MAC, ACK)),
        ("TCP nat ACK", Incremental, cin(C4, "198.18.100.2:80", ACK)),
        (
            "TCP v6 ACK",
            Incremental,
            cin(C6, "[2001:2:0:100::1]:80", ACK),
        ),
        ("UDP", Incremental, cin(C4, VIPF, L4::Udp)),
        ("UDP reply", Incremental, reply(&sent[6], B2_MAC, L4::Udp)),
        ("UDP v6", Incremental, cin(C6, VIP6U, L4::Udp)),
    ]
}

#[derive(Debug, Default)]
struct Tally {
    mutants: usize,
    /// Mutants that still verified (a bit no checksum covers): not corrupt, skipped.
    intact: usize,
    dropped: usize,
    passed: usize,
    /// Transmitted, with a checksum that does not verify.
    sent_invalid: usize,
    /// Answered with a reject (a fresh frame: the corrupt input only quoted).
    rejected: usize,
}

#[test]
fn no_corrupt_input_leaves_with_a_valid_checksum() {
    let rig = Rig::new();
    let (_, _, sent) = rig.pipeline();
    let mut tallies = Vec::new();
    for (name, kind, seed) in seeds(&sent) {
        // The seed itself is valid and goes out valid.
        assert!(valid(&seed), "{name}: seed");
        let (mut p, epoch, _) = rig.pipeline();
        let mut out = seed.clone();
        assert_eq!(p.process(&mut out, epoch), Verdict::Tx(0), "{name}: seed");
        assert!(valid(&out), "{name}: seed's output");
        let l4 = if seed[12..14] == [0x08, 0x00] { 34 } else { 54 };
        let mut t = Tally::default();
        let mut t_quote = Tally::default();
        for bit in l4 * 8..seed.len() * 8 {
            let mut m = seed.clone();
            m[bit / 8] ^= 0x80 >> (bit % 8);
            check(&rig, name, kind, &m, bit, &mut t);
            if kind == Kind::Icmp && bit >= (l4 + 8) * 8 {
                // A corrupt quote in an error whose own checksum is right.
                fix_icmp(&mut m);
                check(&rig, name, Kind::Incremental, &m, bit, &mut t_quote);
            }
        }
        assert!(t.mutants > 0 && t.intact < t.mutants, "{name}: {t:?}");
        eprintln!("{name}: {t:?}");
        if kind == Kind::Icmp {
            eprintln!("{name}, quote with the ICMP checksum fixed: {t_quote:?}");
            tallies.push(t_quote);
        }
        tallies.push(t);
    }
    // Both outcomes were exercised: dropped, and sent with a checksum left wrong.
    assert!(tallies.iter().map(|t| t.dropped).sum::<usize>() > 1000);
    assert!(tallies.iter().map(|t| t.sent_invalid).sum::<usize>() > 100);
}

/// One mutant `m` (bit `bit` flipped) through a fresh pipeline.
fn check(rig: &Rig, name: &str, kind: Kind, m: &[u8], bit: usize, t: &mut Tally) {
    t.mutants += 1;
    if valid(m) {
        t.intact += 1;
        return;
    }
    let (mut p, epoch, _) = rig.pipeline();
    let mut out = m.to_vec();
    match p.process(&mut out, epoch) {
        Verdict::Tx(_) => {
            assert_ne!(
                kind,
                Kind::Icmp,
                "{name}, bit {bit}: a corrupt error was sent"
            );
            assert_ne!(
                kind,
                Kind::Sctp,
                "{name}, bit {bit}: a corrupt SCTP packet was sent"
            );
            assert!(
                !valid(&out),
                "{name}, bit {bit}: corrupt input left with valid checksums"
            );
            t.sent_invalid += 1;
        }
        Verdict::Drop(_) => t.dropped += 1,
        Verdict::Reject { .. } => t.rejected += 1,
        Verdict::Pass | Verdict::Slow => t.passed += 1,
    }
}
