//! Rejects (`fastpath/src/pipeline/reject.rs`): the exact frames a client gets when its new
//! flow cannot be served (TCP RST with and without ACK, ICMP and ICMPv6 port unreachable for
//! UDP and SCTP, quotes cut at 576 and 1280 bytes), the verdicts that stay silent drops
//! (`externalTrafficPolicy: Local` without local endpoints, source ranges, hygiene, bad
//! checksums, an RST), the ports a ClusterIP does not serve, the Service CIDRs, the rate
//! limit, frames without room, and the batch path giving what `process_frame` gives.
//!
//! Expected frames are built with etherparse (its own checksums), so they check the
//! pipeline's headers and checksums independently.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use etherparse::{
    IpDscp, IpHeaders, IpNumber, Ipv4Header, Ipv6Header, PacketBuilder, TcpHeader, icmpv4, icmpv6,
};
use fastpath::limit::RateLimit;
use fastpath::pipeline::{DropReason, FrameBatch, Pipeline, PipelineConfig, RejectReason, Verdict};
use fastpath::settings::flow_table_config;
use fastpath::snapshot::{
    BackendSpec, Frontend, L2Table, NoEndpoints, ServiceSpec, SnapshotBuilder, SynproxySetting,
};
use fastpath::testing::*;
use flowtable::FlowTable;
use lb_algos::AffinityTable;
use vocab::{Mode, Protocol, SchedulerKind};

const C4: &str = "198.18.0.1:40001";

fn hex(f: &[u8]) -> String {
    f.iter().map(|b| format!("{b:02x}")).collect()
}

const C6: &str = "[2001:2::1]:40001";
/// A service without endpoints that rejects (TCP 80, UDP 53, SCTP 3868; v4 and v6).
const EMPTY4: &str = "198.18.100.99";
const EMPTY6: &str = "2001:2:0:100::99";
/// Without endpoints, but `Local` elsewhere: drops.
const LOCAL: &str = "198.18.100.98:80";
/// Without endpoints, and the client outside its source ranges: drops.
const RANGED: &str = "198.18.100.97:80";
/// ClusterIPs serving TCP 80, inside the Service CIDRs.
const CLUSTER4: &str = "198.18.96.10";
const CLUSTER6: &str = "2001:2:0:96::10";
/// An externalIP serving TCP 80: its other ports are the host's.
const EXTERNAL: &str = "198.18.100.50";
const CIDRS: [&str; 2] = ["198.18.96.0/22", "2001:2:0:96::/112"];

fn fe(vip: &str, protocol: Protocol, port: u16) -> Frontend {
    Frontend {
        vip: vip.parse().unwrap(),
        protocol,
        port,
    }
}

fn spec(name: &str, frontends: Vec<Frontend>, backends: &[&str]) -> ServiceSpec {
    ServiceSpec {
        name: name.to_owned(),
        frontends,
        scheduler: SchedulerKind::Rr,
        flags: Vec::new(),
        mode: Mode::Fullnat,
        affinity_timeout: None,
        backends: backends
            .iter()
            .map(|b| BackendSpec {
                addr: b.parse().unwrap(),
                weight: 1,
                usable: true,
            })
            .collect(),
        source_ranges: Vec::new(),
        rate_limit: None,
        frozen: false,
        synproxy: SynproxySetting::Off,
        no_endpoints: NoEndpoints::Reject,
        health: Default::default(),
        cluster_ip: false,
    }
}

fn specs() -> Vec<ServiceSpec> {
    use Protocol::{Sctp, Tcp, Udp};
    let mut local = spec("local", vec![fe("198.18.100.98", Tcp, 80)], &[]);
    local.no_endpoints = NoEndpoints::Drop;
    let mut ranged = spec("ranged", vec![fe("198.18.100.97", Tcp, 80)], &[]);
    ranged.source_ranges = vec!["198.19.0.0/16".parse().unwrap()];
    let mut cluster = spec("cluster", vec![fe(CLUSTER4, Tcp, 80)], &["198.18.1.1:8080"]);
    cluster.cluster_ip = true;
    let mut cluster6 = spec(
        "cluster6",
        vec![fe(CLUSTER6, Tcp, 80)],
        &["[2001:2:0:1::1]:8080"],
    );
    cluster6.cluster_ip = true;
    let mut proxied = spec("proxied", vec![fe("198.18.100.96", Tcp, 80)], &[]);
    proxied.synproxy = SynproxySetting::On;
    vec![
        spec(
            "empty",
            vec![
                fe(EMPTY4, Tcp, 80),
                fe(EMPTY4, Udp, 53),
                fe(EMPTY4, Sctp, 3868),
            ],
            &[],
        ),
        spec(
            "empty6",
            vec![fe(EMPTY6, Tcp, 80), fe(EMPTY6, Udp, 53)],
            &[],
        ),
        local,
        ranged,
        cluster,
        cluster6,
        spec(
            "external",
            vec![fe(EXTERNAL, Tcp, 80)],
            &["198.18.1.1:8080"],
        ),
        proxied,
    ]
}

/// A pipeline over [`specs`], the Service CIDRs and the fixture's neighbours, with reject
/// limit `limit`.
fn rig(epoch: Instant, limit: RateLimit) -> Pipeline {
    let cfg = config::parse(CONFIG, "fixture.toml").unwrap();
    let mut b = SnapshotBuilder::from_config(&cfg);
    let cidrs: Vec<vocab::Cidr> = CIDRS.iter().map(|c| c.parse().unwrap()).collect();
    b.set_service_cidrs(&cidrs);
    let snapshot = b.build(&specs(), &L2Table::from_config(&cfg)).unwrap();
    let flows = FlowTable::new(flow_table_config(&cfg), epoch).unwrap();
    let pc = PipelineConfig {
        port: 0,
        mac: XVS_MAC,
        reject_limit: limit,
        ..PipelineConfig::from_config(&cfg, 0, 1)
    };
    Pipeline::new(
        pc,
        Arc::new(flows),
        Arc::new(AffinityTable::new(1024, epoch)),
        Arc::new(snapshot),
    )
}

const PLENTY: RateLimit = RateLimit {
    rate: 1_000_000,
    burst: 1_000_000,
};

fn cin(src: &str, dst: &str, l4: L4) -> Vec<u8> {
    frame(CLIENT_MAC, XVS_MAC, sa(src), sa(dst), 64, l4)
}

/// `f` through `process_frame` with 1500 bytes of room: the verdict and the frame.
fn roomy(p: &mut Pipeline, f: &[u8], now: Instant) -> (Verdict, Vec<u8>) {
    let mut buf = f.to_vec();
    buf.resize(f.len() + 1500, 0);
    let mut len = f.len();
    let v = p.process_frame(&mut buf, &mut len, now);
    buf.truncate(len);
    (v, buf)
}

const NO_ENDPOINTS: Verdict = Verdict::Reject {
    reason: RejectReason::NoEndpoints,
    port: 0,
};
const UNSERVED: Verdict = Verdict::Reject {
    reason: RejectReason::UnservedPort,
    port: 0,
};

/// The RST xvs sends from `from` to `to`.
fn rst(from: SocketAddr, to: SocketAddr, seq: u32, ack: Option<u32>) -> Vec<u8> {
    let mut t = TcpHeader::new(from.port(), to.port(), seq, 0);
    t.rst = true;
    if let Some(a) = ack {
        t.ack = true;
        t.acknowledgment_number = a;
    }
    let eth = PacketBuilder::ethernet2(XVS_MAC, CLIENT_MAC);
    let mut out = Vec::new();
    match (from.ip(), to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth.ipv4(s.octets(), d.octets(), 64).tcp_header(t),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth.ipv6(s.octets(), d.octets(), 64).tcp_header(t),
        _ => unreachable!(),
    }
    .write(&mut out, &[])
    .unwrap();
    out
}

/// The port unreachable xvs sends from `from` to `to`, quoting `quote`.
fn unreachable(from: IpAddr, to: IpAddr, quote: &[u8]) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(XVS_MAC, CLIENT_MAC);
    let mut out = Vec::new();
    match (from, to) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h = Ipv4Header::new(0, 64, IpNumber::ICMP, s.octets(), d.octets()).unwrap();
            h.dont_fragment = false;
            h.dscp = IpDscp::try_new(0xc0 >> 2).unwrap();
            eth.ip(IpHeaders::Ipv4(h, Default::default()))
                .icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(
                    icmpv4::DestUnreachableHeader::Port,
                ))
                .write(&mut out, quote)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let h = Ipv6Header {
                traffic_class: 0,
                flow_label: Default::default(),
                payload_length: 0,
                next_header: IpNumber::IPV6_ICMP,
                hop_limit: 64,
                source: s.octets(),
                destination: d.octets(),
            };
            eth.ip(IpHeaders::Ipv6(h, Default::default()))
                .icmpv6(etherparse::Icmpv6Type::DestinationUnreachable(
                    icmpv6::DestUnreachableCode::Port,
                ))
                .write(&mut out, quote)
        }
        _ => unreachable!(),
    }
    .unwrap();
    out
}

/// The fixture frames' TCP sequence number and acknowledgment (`tcp_header`).
const SEQ: u32 = 0x1000_0001;
const ACKNO: u32 = 0x2000_0002;

#[test]
fn a_syn_to_a_service_without_endpoints_gets_an_rst_ack() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    let vip = format!("{EMPTY4}:80");
    let syn = cin(C4, &vip, SYN);
    // SEG.LEN: the payload and the SYN.
    let want = rst(sa(&vip), sa(C4), 0, Some(SEQ + PAYLOAD.len() as u32 + 1));
    let (v, out) = roomy(&mut p, &syn, epoch);
    assert_eq!(v, NO_ENDPOINTS);
    assert_eq!(hex(&out), hex(&want));
    verify_checksums(&out, "rst");
    // Without room: the same RST, the frame keeps its length (zeroed after the segment).
    let mut f = syn.clone();
    assert_eq!(p.process(&mut f, epoch), NO_ENDPOINTS);
    assert_eq!(hex(&f[..want.len()]), hex(&want));
    assert!(f[want.len()..].iter().all(|b| *b == 0));
    let c = p.counters();
    assert_eq!(c.rejected(RejectReason::NoEndpoints), 2);
    assert_eq!(
        (c.tx, c.drops_total()),
        (0, 0),
        "a reject is neither: {c:?}"
    );
    assert_eq!(c.new_flows, 0);

    let vip6 = format!("[{EMPTY6}]:80");
    let (v, out) = roomy(&mut p, &cin(C6, &vip6, SYN), epoch);
    assert_eq!(v, NO_ENDPOINTS);
    let want = rst(sa(&vip6), sa(C6), 0, Some(SEQ + PAYLOAD.len() as u32 + 1));
    assert_eq!(hex(&out), hex(&want));
    verify_checksums(&out, "rst6");
}

#[test]
fn segments_with_ack_get_rst_at_their_ack_and_fin_counts_in_the_length() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    let port81 = format!("{CLUSTER4}:81");
    // An ACK (no flow anywhere): RST, seq = its acknowledgment, no ACK.
    let (v, out) = roomy(&mut p, &cin(C4, &port81, ACK), epoch);
    assert_eq!(v, UNSERVED);
    assert_eq!(hex(&out), hex(&rst(sa(&port81), sa(C4), ACKNO, None)));
    // FIN|ACK: the same.
    let (v, out) = roomy(&mut p, &cin(C4, &port81, FIN), epoch);
    assert_eq!(v, UNSERVED);
    assert_eq!(hex(&out), hex(&rst(sa(&port81), sa(C4), ACKNO, None)));
    // A bare FIN with data: RST|ACK acknowledging the data and the FIN.
    let (v, out) = roomy(&mut p, &cin(C4, &port81, L4::Tcp(0x01)), epoch);
    assert_eq!(v, UNSERVED);
    let ack = SEQ + PAYLOAD.len() as u32 + 1;
    assert_eq!(hex(&out), hex(&rst(sa(&port81), sa(C4), 0, Some(ack))));
    // An RST is never answered.
    let f = cin(C4, &port81, L4::Tcp(0x04));
    let (v, out) = roomy(&mut p, &f, epoch);
    assert_eq!(v, Verdict::Drop(DropReason::NoFlow));
    assert_eq!(out, f, "left as it came");
}

#[test]
fn udp_and_sctp_get_port_unreachable_quoting_the_whole_packet() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    for (src, dst, l4) in [
        (C4, format!("{EMPTY4}:53"), L4::Udp),
        (C4, format!("{EMPTY4}:3868"), L4::Sctp(1)),
        (C6, format!("[{EMPTY6}]:53"), L4::Udp),
    ] {
        let f = cin(src, &dst, l4);
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, NO_ENDPOINTS, "{dst} {l4:?}");
        let want = unreachable(sa(&dst).ip(), sa(src).ip(), &f[14..]);
        assert_eq!(hex(&out), hex(&want), "{dst} {l4:?}");
        verify_checksums(&out, &dst);
    }
    assert_eq!(p.counters().rejected(RejectReason::NoEndpoints), 3);
}

#[test]
fn quotes_stop_at_576_and_1280_bytes() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    let big = vec![0x5a; 1400];
    for (src, dst, total) in [
        (C4, format!("{EMPTY4}:53"), 576usize),
        (C6, format!("[{EMPTY6}]:53"), 1280),
    ] {
        let mut f = Vec::new();
        let eth = PacketBuilder::ethernet2(CLIENT_MAC, XVS_MAC);
        match (sa(src).ip(), sa(&dst).ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => eth.ipv4(s.octets(), d.octets(), 64).udp(1, 53),
            (IpAddr::V6(s), IpAddr::V6(d)) => eth.ipv6(s.octets(), d.octets(), 64).udp(1, 53),
            _ => unreachable!(),
        }
        .write(&mut f, &big)
        .unwrap();
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, NO_ENDPOINTS);
        assert_eq!(out.len(), 14 + total, "{dst}");
        let hdr = if total == 576 { 28 } else { 48 };
        let want = unreachable(sa(&dst).ip(), sa(src).ip(), &f[14..14 + total - hdr]);
        assert_eq!(hex(&out), hex(&want), "{dst}");
        // Longer than the reply: it fits in place, the rest zeroed.
        let mut g = f.clone();
        assert_eq!(p.process(&mut g, epoch), NO_ENDPOINTS);
        assert_eq!(hex(&g[..out.len()]), hex(&want));
        assert!(g[out.len()..].iter().all(|b| *b == 0));
    }
}

#[test]
fn without_room_a_port_unreachable_is_refused_then_made_with_room() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    let f = cin(C4, &format!("{EMPTY4}:53"), L4::Udp);
    let mut g = f.clone();
    assert_eq!(
        p.process(&mut g, epoch),
        Verdict::Drop(DropReason::RejectNoRoom)
    );
    assert_eq!(g, f, "left as it came");
    let (v, _) = roomy(&mut p, &f, epoch);
    assert_eq!(v, NO_ENDPOINTS);
    let c = p.counters();
    assert_eq!(c.dropped(DropReason::RejectNoRoom), 1, "process's own");
    assert_eq!(c.rejected(RejectReason::NoEndpoints), 1);
}

#[test]
fn local_policy_and_source_ranges_drop_silently() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    for (dst, want) in [
        (LOCAL, Verdict::Drop(DropReason::NoBackend)),
        (RANGED, Verdict::Drop(DropReason::SourceRange)),
        (&format!("{EMPTY4}:80") as &str, NO_ENDPOINTS),
    ] {
        let f = cin(C4, dst, SYN);
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, want, "{dst}");
        if let Verdict::Drop(_) = v {
            assert_eq!(out, f, "{dst}: left as it came");
        }
    }
}

#[test]
fn a_clusterip_rejects_the_ports_and_protocols_it_does_not_serve() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    // Its own port is served.
    let (v, _) = roomy(&mut p, &cin(C4, &format!("{CLUSTER4}:80"), SYN), epoch);
    assert_eq!(v, Verdict::Tx(0));
    for (src, dst, l4) in [
        (C4, format!("{CLUSTER4}:443"), SYN),
        (C4, format!("{CLUSTER4}:80"), L4::Udp),
        (C4, format!("{CLUSTER4}:80"), L4::Sctp(1)),
        (C6, format!("[{CLUSTER6}]:8443"), SYN),
        (C6, format!("[{CLUSTER6}]:80"), L4::Udp),
    ] {
        let f = cin(src, &dst, l4);
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, UNSERVED, "{dst} {l4:?}");
        let want = match l4 {
            L4::Tcp(_) => rst(sa(&dst), sa(src), 0, Some(SEQ + PAYLOAD.len() as u32 + 1)),
            _ => unreachable(sa(&dst).ip(), sa(src).ip(), &f[14..]),
        };
        assert_eq!(hex(&out), hex(&want), "{dst} {l4:?}");
    }
    // An externalIP's other ports, and addresses of no Service outside the CIDRs: the host's.
    for dst in [format!("{EXTERNAL}:443"), "198.18.112.1:80".to_owned()] {
        let f = cin(C4, &dst, SYN);
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, Verdict::Pass, "{dst}");
        assert_eq!(out, f);
    }
    assert_eq!(p.counters().rejected(RejectReason::UnservedPort), 5);
    // A corrupt SCTP packet: dropped where xvs would have answered, the host's elsewhere.
    for (dst, want) in [
        (
            format!("{CLUSTER4}:80"),
            Verdict::Drop(DropReason::BadSctpChecksum),
        ),
        (
            "198.18.96.99:80".to_owned(),
            Verdict::Drop(DropReason::BadSctpChecksum),
        ),
        ("198.18.112.1:80".to_owned(), Verdict::Pass),
    ] {
        let mut f = cin(C4, &dst, L4::Sctp(1));
        let n = f.len();
        f[n - 1] ^= 1;
        assert_eq!(roomy(&mut p, &f, epoch).0, want, "{dst}");
    }
}

#[test]
fn an_unallocated_address_of_a_service_cidr_is_dropped() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    for (src, dst, l4) in [
        (C4, "198.18.96.11:80", SYN),
        (C4, "198.18.99.255:53", L4::Udp),
        (C6, "[2001:2:0:96::11]:80", SYN),
    ] {
        let f = cin(src, dst, l4);
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, Verdict::Drop(DropReason::ServiceCidr), "{dst}");
        assert_eq!(out, f, "{dst}: left as it came");
    }
    assert_eq!(p.counters().dropped(DropReason::ServiceCidr), 3);
}

#[test]
fn hygiene_and_checksums_come_before_any_answer() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    let empty = format!("{EMPTY4}:80");
    let unserved = format!("{CLUSTER4}:81");
    let mut cases = Vec::new();
    for dst in [&empty, &unserved] {
        cases.push((
            "martian source",
            frame(CLIENT_MAC, XVS_MAC, sa("127.0.0.1:1"), sa(dst), 64, SYN),
            Verdict::Drop(DropReason::MartianSource),
        ));
        cases.push((
            "a VIP as source",
            frame(CLIENT_MAC, XVS_MAC, sa("198.18.100.50:1"), sa(dst), 64, SYN),
            Verdict::Drop(DropReason::OwnAddressSource),
        ));
        cases.push((
            "TTL 1",
            frame(CLIENT_MAC, XVS_MAC, sa(C4), sa(dst), 1, SYN),
            Verdict::Drop(DropReason::TtlExceeded),
        ));
        let mut bad = cin(C4, dst, SYN);
        let n = bad.len();
        bad[n - 1] ^= 0xff;
        cases.push((
            "TCP checksum",
            bad,
            Verdict::Drop(DropReason::BadTcpChecksum),
        ));
    }
    let mut bad = cin(C4, &format!("{EMPTY4}:53"), L4::Udp);
    let n = bad.len();
    bad[n - 1] ^= 0xff;
    cases.push((
        "UDP checksum",
        bad,
        Verdict::Drop(DropReason::BadUdpChecksum),
    ));
    for (what, f, want) in cases {
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, want, "{what}");
        assert_eq!(out, f, "{what}: left as it came");
    }
    assert_eq!(p.counters().rejects_total(), 0);
}

#[test]
fn rejects_are_rate_limited_per_worker() {
    let epoch = Instant::now();
    let mut p = rig(
        epoch,
        RateLimit {
            rate: 100,
            burst: 5,
        },
    );
    let f = cin(C4, &format!("{EMPTY4}:80"), SYN);
    let verdicts: Vec<Verdict> = (0..8).map(|_| roomy(&mut p, &f, epoch).0).collect();
    assert_eq!(verdicts[..5], [NO_ENDPOINTS; 5]);
    assert_eq!(
        verdicts[5..],
        [Verdict::Drop(DropReason::RejectRateLimited); 3]
    );
    // 10 ms later, one token (100/s).
    let later = at(epoch, 10);
    assert_eq!(roomy(&mut p, &f, later).0, NO_ENDPOINTS);
    let (v, out) = roomy(&mut p, &f, later);
    assert_eq!(v, Verdict::Drop(DropReason::RejectRateLimited));
    assert_eq!(out, f, "a limited reject leaves the frame as it came");
    let c = p.counters();
    assert_eq!(c.rejected(RejectReason::NoEndpoints), 6);
    assert_eq!(c.dropped(DropReason::RejectRateLimited), 4);
    // Rate 0: never.
    let mut off = rig(epoch, RateLimit { rate: 0, burst: 50 });
    assert_eq!(
        roomy(&mut off, &f, epoch).0,
        Verdict::Drop(DropReason::RejectRateLimited)
    );
}

#[test]
fn a_vlan_tag_stays_on_the_reject() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    let plain = cin(C4, &format!("{EMPTY4}:53"), L4::Udp);
    let mut tagged = plain[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
    tagged.extend_from_slice(&plain[12..]);
    let (v, out) = roomy(&mut p, &tagged, epoch);
    assert_eq!(v, NO_ENDPOINTS);
    let want = unreachable(sa(EMPTY4_53).ip(), sa(C4).ip(), &plain[14..]);
    assert_eq!(&out[12..16], &[0x81, 0x00, 0x00, 0x2a]);
    let mut untagged = out[..12].to_vec();
    untagged.extend_from_slice(&out[16..]);
    assert_eq!(hex(&untagged), hex(&want));
}

const EMPTY4_53: &str = "198.18.100.99:53";

#[test]
fn the_syn_proxy_resets_a_client_whose_cookie_finds_no_backend() {
    let epoch = Instant::now();
    let mut p = rig(epoch, PLENTY);
    let vip = "198.18.100.96:80";
    let (v, synack) = roomy(&mut p, &cin(C4, vip, SYN), epoch);
    assert_eq!(v, Verdict::Tx(0), "the proxy answers the SYN itself");
    let cookie = u32::from_be_bytes(synack[38..42].try_into().unwrap());
    // The client's ACK: seq = ISN + 1, ack = cookie + 1 (the fixture ACK, rewritten).
    let mut ack = Vec::new();
    let mut t = TcpHeader::new(40001, 80, SEQ + 1, 64240);
    t.ack = true;
    t.acknowledgment_number = cookie.wrapping_add(1);
    PacketBuilder::ethernet2(CLIENT_MAC, XVS_MAC)
        .ipv4([198, 18, 0, 1], [198, 18, 100, 96], 64)
        .tcp_header(t)
        .write(&mut ack, &[])
        .unwrap();
    let (v, out) = roomy(&mut p, &ack, epoch);
    assert_eq!(v, NO_ENDPOINTS);
    assert_eq!(
        hex(&out),
        hex(&rst(sa(vip), sa(C4), cookie.wrapping_add(1), None))
    );
    assert_eq!(p.counters().new_flows, 0);
}

/// Frames with room after each, as UMEM frames have.
struct Roomy<'a> {
    bufs: &'a mut [Vec<u8>],
    lens: &'a mut [usize],
}

impl FrameBatch for Roomy<'_> {
    fn frames_len(&self) -> usize {
        self.bufs.len()
    }
    fn frame(&mut self, i: usize) -> &mut [u8] {
        &mut self.bufs[i][..self.lens[i]]
    }
    fn buffer(&mut self, i: usize) -> &mut [u8] {
        &mut self.bufs[i]
    }
    fn set_len(&mut self, i: usize, len: usize) {
        self.lens[i] = len;
    }
}

#[test]
fn a_batch_rejects_as_process_frame_does() {
    let epoch = Instant::now();
    let (mut single, mut batched) = (rig(epoch, PLENTY), rig(epoch, PLENTY));
    let mut frames = Vec::new();
    for i in 0..40u16 {
        let c4 = format!("198.18.0.1:{}", 41000 + i);
        let c6 = format!("[2001:2::1]:{}", 41000 + i);
        frames.push(match i % 8 {
            0 => cin(&c4, &format!("{EMPTY4}:80"), SYN),
            1 => cin(&c4, &format!("{EMPTY4}:53"), L4::Udp),
            2 => cin(&c6, &format!("[{EMPTY6}]:53"), L4::Udp),
            3 => cin(&c4, &format!("{CLUSTER4}:81"), ACK),
            4 => cin(&c4, &format!("{CLUSTER4}:80"), SYN),
            5 => cin(&c4, "198.18.96.77:80", SYN),
            6 => cin(&c4, LOCAL, SYN),
            _ => cin(&c6, &format!("[{CLUSTER6}]:53"), L4::Udp),
        });
    }
    let mut bufs: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let mut b = f.clone();
            b.resize(f.len() + 1500, 0);
            b
        })
        .collect();
    let mut lens: Vec<usize> = frames.iter().map(Vec::len).collect();
    let mut verdicts = vec![Verdict::Pass; frames.len()];
    batched.process_batch(
        &mut Roomy {
            bufs: &mut bufs,
            lens: &mut lens,
        },
        epoch,
        &mut verdicts,
    );
    for (i, f) in frames.iter().enumerate() {
        let (v, out) = roomy(&mut single, f, epoch);
        assert_eq!(verdicts[i], v, "frame {i}");
        assert_eq!(lens[i], out.len(), "frame {i}: length");
        assert_eq!(hex(&bufs[i][..lens[i]]), hex(&out), "frame {i}");
    }
    assert_eq!(single.counters(), batched.counters());
    assert_eq!(batched.counters().rejects_total(), 25);
}
