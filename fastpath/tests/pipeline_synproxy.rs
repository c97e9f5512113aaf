//! The SYN proxy on built frames: SYN → SYN-ACK with a cookie and the client's options,
//! the client's ACK → the SYN to the backend, the backend's SYN-ACK → the ACK back to it,
//! then data both ways with sequence numbers, SACK blocks and windows translated; IPv4 and
//! IPv6, nat and fullnat; forged and old cookies; `auto` and `off`. Every transmitted frame's
//! checksums are recomputed from scratch.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
use fastpath::pipeline::{DropReason, FrameBatch, Pipeline, Verdict};
use fastpath::testing::*;

/// The fixture config with the SYN proxy on for every TCP service.
fn config_on() -> String {
    format!("{CONFIG}\n[synproxy]\nmode = \"on\"\n")
}

/// A TCP frame `src → dst` with these fields, options and payload.
#[allow(clippy::too_many_arguments)]
fn tcp(
    smac: [u8; 6],
    src: SocketAddr,
    dst: SocketAddr,
    flags: u8,
    seq: u32,
    ack: u32,
    window: u16,
    opts: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(smac, XVS_MAC);
    let mut out = Vec::new();
    macro_rules! l4 {
        ($ip:expr) => {{
            let mut b = $ip.tcp(src.port(), dst.port(), seq, window);
            if flags & 2 != 0 {
                b = b.syn();
            }
            if flags & 0x10 != 0 {
                b = b.ack(ack);
            }
            if flags & 4 != 0 {
                b = b.rst();
            }
            if flags & 8 != 0 {
                b = b.psh();
            }
            if flags & 1 != 0 {
                b = b.fin();
            }
            b.options_raw(opts).unwrap().write(&mut out, payload)
        }};
    }
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => l4!(eth.ipv4(s.octets(), d.octets(), 64)),
        (IpAddr::V6(s), IpAddr::V6(d)) => l4!(eth.ipv6(s.octets(), d.octets(), 64)),
        _ => panic!("mixed families"),
    }
    .unwrap();
    out
}

/// What a transmitted TCP frame says.
#[derive(Debug)]
struct Seen {
    dst_mac: [u8; 6],
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    opts: Vec<u8>,
    payload: usize,
}

fn seen(f: &[u8], what: &str) -> Seen {
    verify_checksums(f, what);
    let p = SlicedPacket::from_ethernet(f).unwrap();
    let (s, d): (IpAddr, IpAddr) = match p.net.unwrap() {
        etherparse::NetSlice::Ipv4(v4) => (
            v4.header().source_addr().into(),
            v4.header().destination_addr().into(),
        ),
        etherparse::NetSlice::Ipv6(v6) => (
            v6.header().source_addr().into(),
            v6.header().destination_addr().into(),
        ),
        _ => panic!("{what}: not IP"),
    };
    let Some(TransportSlice::Tcp(t)) = p.transport else {
        panic!("{what}: not TCP")
    };
    Seen {
        dst_mac: f[..6].try_into().unwrap(),
        src: SocketAddr::new(s, t.source_port()),
        dst: SocketAddr::new(d, t.destination_port()),
        seq: t.sequence_number(),
        ack: t.acknowledgment_number(),
        flags: f[14 + if s.is_ipv6() { 40 } else { 20 } + 13],
        window: t.window_size(),
        opts: t.options().to_vec(),
        payload: t.payload().len(),
    }
}

/// Linux's SYN options with window scale `ws`: MSS 1460, SACK-permitted, timestamps, NOP, WS.
fn linux_syn_opts(ws: u8) -> Vec<u8> {
    vec![
        2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, ws,
    ]
}

/// One service of the fixture: its VIP, backend (and MAC), SNAT address (None: nat).
struct Svc {
    name: &'static str,
    client: SocketAddr,
    vip: SocketAddr,
    backend: SocketAddr,
    backend_mac: [u8; 6],
    snat: Option<IpAddr>,
}

fn services() -> Vec<Svc> {
    vec![
        Svc {
            name: "web (IPv4 fullnat)",
            client: sa("198.18.0.1:40001"),
            vip: sa("198.18.100.1:80"),
            backend: sa("198.18.1.1:8080"),
            backend_mac: B1_MAC,
            snat: Some("198.18.1.254".parse().unwrap()),
        },
        Svc {
            name: "webnat (IPv4 nat)",
            client: sa("198.18.0.1:40002"),
            vip: sa("198.18.100.2:80"),
            backend: sa("198.18.1.2:8080"),
            backend_mac: B2_MAC,
            snat: None,
        },
        Svc {
            name: "web6 (IPv6 fullnat)",
            client: sa("[2001:2::1]:40003"),
            vip: sa("[2001:2:0:100::1]:80"),
            backend: sa("[2001:2:0:1::1]:8080"),
            backend_mac: B61_MAC,
            snat: Some("2001:2:0:1::fe".parse().unwrap()),
        },
        Svc {
            name: "web6nat (IPv6 nat)",
            client: sa("[2001:2::1]:40004"),
            vip: sa("[2001:2:0:100::2]:80"),
            backend: sa("[2001:2:0:1::1]:8081"),
            backend_mac: B61_MAC,
            snat: None,
        },
    ]
}

/// `p.process_frame` on `f` in a buffer with room; the transmitted (or unchanged) frame.
fn run(p: &mut Pipeline, f: &[u8], now: Instant) -> (Verdict, Vec<u8>) {
    let mut buf = f.to_vec();
    buf.resize(f.len() + 64, 0xee);
    let mut len = f.len();
    let v = p.process_frame(&mut buf, &mut len, now);
    buf.truncate(len);
    (v, buf)
}

const CLIENT_ISN: u32 = 0xffff_fff0; // wraps on the way
const BACKEND_ISN: u32 = 0x1234_5678;

/// What a proxied handshake established: the cookie, and where the backend side goes.
struct Shook {
    cookie: u32,
    /// The source the backend sees (SNAT address and port, or the client).
    seen_by_backend: SocketAddr,
}

/// SYN, ACK and the backend's SYN-ACK through `p` for `s`, with every frame checked.
fn handshake(p: &mut Pipeline, s: &Svc, now: Instant) -> Shook {
    let flows_before = p.flows().len();
    // (An embryonic flow that gave way its SNAT port to this one is gone.)
    let gave_way_before = p.flows().stats().gave_way;
    // 1. SYN → SYN-ACK with a cookie, the client's MSS and SACK, our window scale, no TS.
    let syn = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x02,
        CLIENT_ISN,
        0,
        64240,
        &linux_syn_opts(6),
        &[],
    );
    let (v, out) = run(p, &syn, now);
    assert_eq!(v, Verdict::Tx(0), "{}: SYN", s.name);
    let sa_ = seen(&out, &format!("{}: SYN-ACK", s.name));
    assert_eq!(sa_.dst_mac, CLIENT_MAC);
    assert_eq!((sa_.src, sa_.dst), (s.vip, s.client), "{}", s.name);
    assert_eq!(sa_.flags, 0x12);
    assert_eq!(sa_.ack, CLIENT_ISN.wrapping_add(1));
    let mss: u16 = if s.client.is_ipv6() { 1440 } else { 1460 };
    let m = mss.to_be_bytes();
    assert_eq!(
        sa_.opts,
        vec![2, 4, m[0], m[1], 1, 3, 3, 7, 1, 1, 4, 2],
        "{}",
        s.name
    );
    assert_eq!(
        p.flows().len(),
        flows_before,
        "{}: a SYN makes no flow",
        s.name
    );
    let cookie = sa_.seq;

    // 2. ACK with the cookie → the SYN to the backend with the client's options.
    let ack = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x10,
        CLIENT_ISN.wrapping_add(1),
        cookie.wrapping_add(1),
        502,
        &[],
        &[],
    );
    let (v, out) = run(p, &ack, now);
    assert_eq!(v, Verdict::Tx(0), "{}: ACK", s.name);
    let syn_b = seen(&out, &format!("{}: SYN to the backend", s.name));
    assert_eq!(syn_b.dst_mac, s.backend_mac);
    assert_eq!(syn_b.dst, s.backend, "{}", s.name);
    match s.snat {
        Some(a) => assert_eq!(syn_b.src.ip(), a),
        None => assert_eq!(syn_b.src, s.client),
    }
    assert_eq!(syn_b.flags, 0x02);
    assert_eq!(syn_b.seq, CLIENT_ISN, "{}: the client's ISN", s.name);
    assert_eq!(
        syn_b.opts,
        vec![2, 4, m[0], m[1], 1, 3, 3, 6, 1, 1, 4, 2],
        "{}: the client's MSS, window scale and SACK",
        s.name
    );
    assert_eq!(
        syn_b.window,
        502 << 6,
        "{}: the client's window, unscaled",
        s.name
    );
    let gave_way = (p.flows().stats().gave_way - gave_way_before) as usize;
    assert_eq!(p.flows().len(), flows_before + 1 - gave_way, "{}", s.name);

    // 3. The backend's SYN-ACK → the ACK back to the backend.
    let synack = tcp(
        s.backend_mac,
        s.backend,
        syn_b.src,
        0x12,
        BACKEND_ISN,
        CLIENT_ISN.wrapping_add(1),
        65160,
        &[2, 4, 5, 0x78, 4, 2, 1, 3, 3, 9],
        &[],
    );
    let (v, out) = run(p, &synack, now);
    assert_eq!(v, Verdict::Tx(0), "{}: SYN-ACK", s.name);
    let a = seen(&out, &format!("{}: ACK to the backend", s.name));
    assert_eq!(a.dst_mac, s.backend_mac);
    assert_eq!((a.src, a.dst), (syn_b.src, s.backend), "{}", s.name);
    assert_eq!(a.flags, 0x10);
    assert_eq!(a.seq, CLIENT_ISN.wrapping_add(1));
    assert_eq!(a.ack, BACKEND_ISN.wrapping_add(1));
    assert_eq!(a.window, 502, "{}: the client's window", s.name);
    assert!(a.opts.is_empty());
    Shook {
        cookie,
        seen_by_backend: syn_b.src,
    }
}

#[test]
fn a_proxied_connection_translates_both_ways() {
    let epoch = Instant::now();
    let now = at(epoch, 1000);
    let mut p = pipeline_from(&config_on(), epoch);
    for s in services() {
        let h = handshake(&mut p, &s, now);
        both_ways(&mut p, &s, &h, now);
    }
    let c = p.counters();
    assert_eq!((c.synproxy_syns, c.synproxy_acks, c.new_flows), (4, 4, 4));
    assert_eq!(c.drops_total(), 0, "{c:?}");
    let established = fastpath_flows_established(&p);
    assert_eq!(established, 4);
    assert_eq!(p.flows().embryonic(), 0);
}

/// Data both ways on the proxied flow `h` of `s` (just established): sequence numbers, SACK
/// edges and windows translated; then a retransmitted SYN-ACK is answered again.
fn both_ways(p: &mut Pipeline, s: &Svc, h: &Shook, now: Instant) {
    // Client → backend: ack and SACK edges move by the delta.
    let delta = BACKEND_ISN.wrapping_sub(h.cookie);
    let sack_l = h.cookie.wrapping_add(201);
    let sack_r = h.cookie.wrapping_add(301);
    let mut opts = vec![1, 1, 5, 10];
    opts.extend_from_slice(&sack_l.to_be_bytes());
    opts.extend_from_slice(&sack_r.to_be_bytes());
    let data = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x18,
        CLIENT_ISN.wrapping_add(1),
        h.cookie.wrapping_add(101),
        502,
        &opts,
        PAYLOAD,
    );
    let (v, out) = run(p, &data, now);
    assert_eq!(v, Verdict::Tx(0), "{}", s.name);
    let d = seen(&out, &format!("{}: client data", s.name));
    assert_eq!((d.src, d.dst), (h.seen_by_backend, s.backend));
    assert_eq!(d.seq, CLIENT_ISN.wrapping_add(1), "sequence numbers stay");
    assert_eq!(d.ack, BACKEND_ISN.wrapping_add(101), "{}", s.name);
    let mut want = vec![1, 1, 5, 10];
    want.extend_from_slice(&sack_l.wrapping_add(delta).to_be_bytes());
    want.extend_from_slice(&sack_r.wrapping_add(delta).to_be_bytes());
    assert_eq!(d.opts, want, "{}: SACK edges", s.name);
    assert_eq!((d.window, d.payload), (502, PAYLOAD.len()));

    // Backend → client: seq moves back; the window from scale 9 to ours, 7.
    let reply = tcp(
        s.backend_mac,
        s.backend,
        h.seen_by_backend,
        0x18,
        BACKEND_ISN.wrapping_add(1),
        CLIENT_ISN.wrapping_add(1 + PAYLOAD.len() as u32),
        100,
        &[],
        PAYLOAD,
    );
    let (v, out) = run(p, &reply, now);
    assert_eq!(v, Verdict::Tx(0), "{}", s.name);
    let r = seen(&out, &format!("{}: backend data", s.name));
    assert_eq!((r.src, r.dst), (s.vip, s.client), "{}", s.name);
    assert_eq!(r.dst_mac, CLIENT_MAC);
    assert_eq!(r.seq, h.cookie.wrapping_add(1), "{}", s.name);
    assert_eq!(r.ack, CLIENT_ISN.wrapping_add(1 + PAYLOAD.len() as u32));
    assert_eq!(r.window, 400, "{}: 100 << 9 >> 7", s.name);

    // The flow is established; a retransmitted SYN-ACK is answered again.
    let synack = tcp(
        s.backend_mac,
        s.backend,
        h.seen_by_backend,
        0x12,
        BACKEND_ISN,
        CLIENT_ISN.wrapping_add(1),
        65160,
        &[],
        &[],
    );
    let (v, out) = run(p, &synack, now);
    assert_eq!(v, Verdict::Tx(0));
    let a = seen(&out, "re-ACK");
    assert_eq!((a.flags, a.ack), (0x10, BACKEND_ISN.wrapping_add(1)));
}

/// Full-NAT with the fewest SNAT ports a worker may have (64), all held by embryonic
/// proxied flows (their backend never answered): a later client's proxied handshake takes
/// a port when one of those flows gives way, and its connection is proxied and translated
/// exactly as one made without give-way (the backend's SYN-ACK answered, data both ways
/// translated).
#[test]
fn a_proxied_flow_on_a_port_given_way_is_proxied_as_any_other() {
    const PORTS: u16 = 64;
    let few_ports = config_on().replace(
        "snat_port_range = \"40000-40999\"",
        "snat_port_range = \"40000-40063\"",
    );
    assert_ne!(few_ports, config_on(), "the fixture's port range changed");
    // The fullnat services, IPv4 and IPv6.
    for s in services().into_iter().filter(|s| s.snat.is_some()) {
        let epoch = Instant::now();
        let mut p = pipeline_from(&few_ports, epoch);
        let t0 = at(epoch, 1000);

        // Other clients' proxied handshakes stop at the SYN to the backend, one per port.
        let mut held = Vec::new();
        for i in 0..PORTS {
            let client = SocketAddr::new(s.client.ip(), 50000 + i);
            let isn = 7000 + u32::from(i);
            let syn = tcp(CLIENT_MAC, client, s.vip, 0x02, isn, 0, 64240, &[], &[]);
            let cookie = seen(&run(&mut p, &syn, t0).1, "SYN-ACK").seq;
            let ack = tcp(
                CLIENT_MAC,
                client,
                s.vip,
                0x10,
                isn + 1,
                cookie.wrapping_add(1),
                502,
                &[],
                &[],
            );
            let (v, out) = run(&mut p, &ack, t0);
            assert_eq!(v, Verdict::Tx(0), "{}: ACK of {client}", s.name);
            let syn_b = seen(&out, "SYN to the backend");
            assert_eq!((syn_b.flags, syn_b.src.ip()), (0x02, s.snat.unwrap()));
            held.push(syn_b.src.port());
        }
        held.sort_unstable();
        held.dedup();
        assert_eq!(
            held,
            (40000..40000 + PORTS).collect::<Vec<_>>(),
            "{}",
            s.name
        );
        assert_eq!(p.flows().embryonic(), u64::from(PORTS));

        // Half a second later (past the give-way idle threshold): the client's handshake,
        // checked frame by frame as any proxied handshake.
        let later = at(epoch, 1500);
        let h = handshake(&mut p, &s, later);
        assert_eq!(p.flows().stats().gave_way, 1, "{}: a flow gave way", s.name);
        assert!(held.contains(&h.seen_by_backend.port()), "{}", s.name);
        assert_eq!(p.flows().len(), usize::from(PORTS), "{}", s.name);
        both_ways(&mut p, &s, &h, later);
        assert_eq!(fastpath_flows_established(&p), 1, "{}", s.name);
        let c = p.counters();
        assert_eq!(c.synproxy_acks, u64::from(PORTS) + 1, "{}", s.name);
        assert_eq!(c.new_flows, u64::from(PORTS) + 1, "{}", s.name);
        assert_eq!(c.drops_total(), 0, "{}: {c:?}", s.name);
    }
}

fn fastpath_flows_established(p: &Pipeline) -> usize {
    let mut n = 0;
    p.flows().scan(0, p.flows().capacity(), |v| {
        if v.state == flowtable::FlowState::Tcp(flowtable::TcpState::Established) {
            n += 1;
        }
    });
    n
}

#[test]
fn forged_and_old_cookies_are_dropped_and_make_no_flow() {
    let epoch = Instant::now();
    let now = at(epoch, 1000);
    let mut p = pipeline_from(&config_on(), epoch);
    let s = &services()[0];
    let syn = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x02,
        1000,
        0,
        64240,
        &linux_syn_opts(7),
        &[],
    );
    let (_, out) = run(&mut p, &syn, now);
    let cookie = seen(&out, "SYN-ACK").seq;
    let ack = |seq: u32, ack: u32| tcp(CLIENT_MAC, s.client, s.vip, 0x10, seq, ack, 502, &[], &[]);
    for (what, f, when) in [
        ("forged", ack(1001, cookie ^ 0x0100_0000), now),
        // (An ISN a little off passes, as in Linux: the cookie binds the ISN through the
        // 24-bit data and count fields only; 3 * 2^24 off moves the count out of range.)
        (
            "another ISN",
            ack(1001 + 0x0300_0000, cookie.wrapping_add(1)),
            now,
        ),
        (
            "three minutes old",
            ack(1001, cookie.wrapping_add(1)),
            now + Duration::from_secs(180),
        ),
    ] {
        let (v, out) = run(&mut p, &f, when);
        assert_eq!(v, Verdict::Drop(DropReason::SynCookieInvalid), "{what}");
        assert_eq!(out, f, "{what}: a dropped frame is left as it came");
    }
    assert_eq!(p.flows().len(), 0);
    assert_eq!(p.counters().dropped(DropReason::SynCookieInvalid), 3);
    // A minute later it is still good.
    let (v, _) = run(
        &mut p,
        &ack(1001, cookie.wrapping_add(1)),
        now + Duration::from_secs(70),
    );
    assert_eq!(v, Verdict::Tx(0));
    assert_eq!(p.flows().len(), 1);
}

#[test]
fn pending_flows_drop_client_data_and_forward_a_backend_reset() {
    let epoch = Instant::now();
    let now = at(epoch, 1000);
    let mut p = pipeline_from(&config_on(), epoch);
    let s = &services()[0];
    let syn = tcp(CLIENT_MAC, s.client, s.vip, 0x02, 1000, 0, 64240, &[], &[]);
    let (_, out) = run(&mut p, &syn, now);
    let sa_ = seen(&out, "SYN-ACK without options");
    assert!(
        sa_.opts.is_empty(),
        "only what the client sent: {:?}",
        sa_.opts
    );
    let cookie = sa_.seq;
    // The ACK carries data: the SYN goes without it.
    let ack = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x18,
        1001,
        cookie.wrapping_add(1),
        502,
        &[],
        PAYLOAD,
    );
    let (v, out) = run(&mut p, &ack, now);
    assert_eq!(v, Verdict::Tx(0));
    let syn_b = seen(&out, "SYN");
    assert_eq!((syn_b.flags, syn_b.payload), (0x02, 0));
    assert_eq!(
        syn_b.opts,
        vec![2, 4, 2, 0x18],
        "MSS 536: the client sent none"
    );
    assert!(out.len() < ack.len(), "the frame shrank");
    // More client data before the backend answered: dropped, unchanged.
    let (v, out) = run(&mut p, &ack, now);
    assert_eq!(v, Verdict::Drop(DropReason::SynproxyPending));
    assert_eq!(out, ack);
    // The backend refuses: the client gets a reset it accepts (seq = cookie + 1).
    let rst = tcp(
        s.backend_mac,
        s.backend,
        syn_b.src,
        0x14,
        0,
        1001,
        0,
        &[],
        &[],
    );
    let (v, out) = run(&mut p, &rst, now);
    assert_eq!(v, Verdict::Tx(0));
    let r = seen(&out, "reset to the client");
    assert_eq!((r.src, r.dst), (s.vip, s.client));
    assert_eq!(
        (r.flags, r.seq, r.ack),
        (0x14, cookie.wrapping_add(1), 1001)
    );
}

#[test]
fn without_room_the_ack_is_dropped_and_the_frame_kept() {
    let epoch = Instant::now();
    let now = at(epoch, 1000);
    let mut p = pipeline_from(&config_on(), epoch);
    let s = &services()[0];
    let mut syn = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x02,
        1000,
        0,
        64240,
        &linux_syn_opts(7),
        &[],
    );
    assert_eq!(
        p.process(&mut syn, now),
        Verdict::Tx(0),
        "a SYN-ACK needs no room"
    );
    let cookie = seen(&syn, "SYN-ACK").seq;
    let ack = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x10,
        1001,
        cookie.wrapping_add(1),
        502,
        &[],
        &[],
    );
    let mut f = ack.clone();
    assert_eq!(
        p.process(&mut f, now),
        Verdict::Drop(DropReason::SynproxyNoRoom)
    );
    assert_eq!(f, ack);
    assert_eq!(p.flows().len(), 0);
}

#[test]
fn off_and_auto_below_the_threshold_leave_syns_to_the_backends() {
    let epoch = Instant::now();
    let now = at(epoch, 1000);
    // The default: auto, threshold 1000.
    for cfg in [
        CONFIG.to_owned(),
        format!("{CONFIG}\n[synproxy]\nmode = \"off\"\n"),
    ] {
        let mut p = pipeline_from(&cfg, epoch);
        for s in services() {
            let syn = tcp(
                CLIENT_MAC,
                s.client,
                s.vip,
                0x02,
                1000,
                0,
                64240,
                &linux_syn_opts(7),
                &[],
            );
            let (v, out) = run(&mut p, &syn, now);
            assert_eq!(v, Verdict::Tx(0));
            let o = seen(&out, s.name);
            assert_eq!(
                (o.dst, o.flags, o.seq),
                (s.backend, 0x02, 1000),
                "{}",
                s.name
            );
            assert_eq!(o.opts, linux_syn_opts(7), "options untouched");
        }
        assert_eq!(p.flows().len(), 4);
        assert_eq!(p.counters().synproxy_syns, 0);
        // An ACK without a flow is what it was: no_flow.
        let s = &services()[0];
        let ack = tcp(
            CLIENT_MAC,
            s.client,
            sa("198.18.100.20:80"),
            0x10,
            5,
            6,
            502,
            &[],
            &[],
        );
        assert_eq!(run(&mut p, &ack, now).0, Verdict::Drop(DropReason::NoFlow));
    }
}

#[test]
fn auto_engages_above_the_threshold_and_lets_go_below_half() {
    let epoch = Instant::now();
    let now = at(epoch, 1000);
    let cfg = format!("{CONFIG}\n[synproxy]\nmode = \"auto\"\nauto_threshold = 4\n");
    let mut p = pipeline_from(&cfg, epoch);
    let vip = sa("198.18.100.1:80");
    let syn = |port: u16| {
        tcp(
            CLIENT_MAC,
            SocketAddr::new("198.18.0.2".parse().unwrap(), port),
            vip,
            0x02,
            7,
            0,
            1000,
            &[],
            &[],
        )
    };
    let flag = |v: &[u8]| seen(v, "out").flags;
    // 1..=5 embryonic: not above 4 until the fifth is in.
    for port in 1..=5 {
        let (v, out) = run(&mut p, &syn(port), now);
        assert_eq!(
            (v, flag(&out)),
            (Verdict::Tx(0), 0x02),
            "SYN {port} goes to the backend"
        );
    }
    assert_eq!(p.flows().embryonic(), 5);
    let (v, out) = run(&mut p, &syn(6), now);
    assert_eq!((v, flag(&out)), (Verdict::Tx(0), 0x12), "5 > 4: cookies");
    assert_eq!(p.flows().embryonic(), 5, "and no flow");
    // Down to 2 (half of 4 is not below it): still engaged; then 1: off.
    let mut handles = Vec::new();
    p.flows()
        .scan(0, p.flows().capacity(), |v| handles.push(v.handle));
    for h in &handles[..3] {
        p.flows().remove(*h).unwrap();
    }
    assert_eq!(p.flows().embryonic(), 2);
    assert_eq!(flag(&run(&mut p, &syn(7), now).1), 0x12);
    p.flows().remove(handles[3]).unwrap();
    assert_eq!(flag(&run(&mut p, &syn(8), now).1), 0x02, "1 < 2: off again");
}

/// A batch whose frames have room, as the workers' UMEM frames do.
struct Roomy {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
}

impl FrameBatch for Roomy {
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
fn batches_proxy_like_single_frames() {
    let epoch = Instant::now();
    let now = at(epoch, 1000);
    let s = &services()[0];
    let client = |i: u16| SocketAddr::new(s.client.ip(), 30000 + i);
    let syns: Vec<Vec<u8>> = (0..40)
        .map(|i| {
            tcp(
                CLIENT_MAC,
                client(i),
                s.vip,
                0x02,
                100 + u32::from(i),
                0,
                64240,
                &linux_syn_opts(7),
                &[],
            )
        })
        .collect();
    let roomy = |frames: &[Vec<u8>]| Roomy {
        bufs: frames
            .iter()
            .map(|f| {
                let mut b = f.clone();
                b.resize(2048, 0);
                b
            })
            .collect(),
        lens: frames.iter().map(Vec::len).collect(),
    };
    let mut p = pipeline_from(&config_on(), epoch);
    let mut b = roomy(&syns);
    let mut verdicts = vec![Verdict::Pass; syns.len()];
    p.process_batch(&mut b, now, &mut verdicts);
    assert!(
        verdicts.iter().all(|v| *v == Verdict::Tx(0)),
        "{verdicts:?}"
    );
    let acks: Vec<Vec<u8>> = (0..40u16)
        .map(|i| {
            let o = seen(&b.bufs[usize::from(i)][..b.lens[usize::from(i)]], "SYN-ACK");
            tcp(
                CLIENT_MAC,
                client(i),
                s.vip,
                0x10,
                101 + u32::from(i),
                o.seq.wrapping_add(1),
                502,
                &[],
                &[],
            )
        })
        .collect();
    let mut b = roomy(&acks);
    p.process_batch(&mut b, now, &mut verdicts);
    assert!(
        verdicts.iter().all(|v| *v == Verdict::Tx(0)),
        "{verdicts:?}"
    );
    for (i, ack) in acks.iter().enumerate() {
        let o = seen(&b.bufs[i][..b.lens[i]], "SYN to the backend");
        assert_eq!((o.flags, o.seq, o.dst), (0x02, 100 + i as u32, s.backend));
        assert_eq!(b.lens[i], ack.len() + 12);
    }
    assert_eq!(p.flows().len(), 40);
    assert_eq!(p.counters().synproxy_acks, 40);
}

#[test]
fn the_cookie_key_decides() {
    // A pipeline with another key (another process without the kept key) refuses the cookie
    // of this one; one with the same key (the next process) accepts it.
    let epoch = Instant::now();
    let now = at(epoch, 1000);
    let mut a = pipeline_from(&config_on(), epoch);
    let s = &services()[0];
    let syn = tcp(CLIENT_MAC, s.client, s.vip, 0x02, 1000, 0, 64240, &[], &[]);
    let cookie = seen(&run(&mut a, &syn, now).1, "SYN-ACK").seq;
    let ack = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x10,
        1001,
        cookie.wrapping_add(1),
        502,
        &[],
        &[],
    );
    let with_key = |key| {
        let cfg = config::parse(&config_on(), "t.toml").unwrap();
        let snapshot = fastpath::snapshot::SnapshotBuilder::from_config(&cfg)
            .build_config(&cfg)
            .unwrap();
        let flows =
            flowtable::FlowTable::new(fastpath::settings::flow_table_config(&cfg), epoch).unwrap();
        let mut pc = fastpath::pipeline::PipelineConfig::from_config(&cfg, 0, 1);
        pc.mac = XVS_MAC;
        pc.synproxy_key = key;
        Pipeline::new(
            pc,
            std::sync::Arc::new(flows),
            std::sync::Arc::new(lb_algos::AffinityTable::new(64, epoch)),
            std::sync::Arc::new(snapshot),
        )
    };
    let mut same = with_key(a.config().synproxy_key);
    assert_eq!(run(&mut same, &ack, now).0, Verdict::Tx(0));
    let mut other = with_key(fastpath::pipeline::CookieKey([1, 2, 3, 4]));
    assert_eq!(
        run(&mut other, &ack, now).0,
        Verdict::Drop(DropReason::SynCookieInvalid)
    );
}

mod prop {
    use std::cell::RefCell;

    use proptest::prelude::*;

    use super::*;

    fn seeds() -> Vec<Vec<u8>> {
        let s = services();
        let mut v = Vec::new();
        for x in &s {
            v.push(tcp(
                CLIENT_MAC,
                x.client,
                x.vip,
                0x02,
                1,
                0,
                1000,
                &linux_syn_opts(7),
                &[],
            ));
            v.push(tcp(
                CLIENT_MAC,
                x.client,
                x.vip,
                0x10,
                2,
                3,
                1000,
                &[1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2],
                PAYLOAD,
            ));
            v.push(tcp(
                x.backend_mac,
                x.backend,
                x.client,
                0x12,
                9,
                2,
                1000,
                &[2, 4, 5, 0, 1, 3, 3, 9],
                &[],
            ));
        }
        v
    }

    /// The pipeline, its epoch and frames of its proxied flows.
    type Lab = (Pipeline, Instant, Vec<Vec<u8>>);

    thread_local! {
        static PIPE: RefCell<Option<Lab>> = const { RefCell::new(None) };
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

        /// With the proxy on and real handshakes in the table, mutated frames (handshake
        /// frames and established ones among them) never panic, and a frame not
        /// transmitted is left as it came.
        #[test]
        fn process_frame_never_panics_with_the_proxy_on(
            seed in 0usize..64,
            muts in proptest::collection::vec((0usize..120, any::<u8>(), 0u8..3), 1..5),
            ms in 0u64..200_000,
        ) {
            PIPE.with(|cell| {
                let mut cell = cell.borrow_mut();
                let (p, epoch, extra) = cell.get_or_insert_with(|| {
                    let epoch = Instant::now();
                    let mut p = pipeline_from(&config_on(), epoch);
                    let mut extra = Vec::new();
                    for s in services() {
                        let h = handshake(&mut p, &s, at(epoch, 10));
                        extra.push(tcp(CLIENT_MAC, s.client, s.vip, 0x10, CLIENT_ISN.wrapping_add(1), h.cookie.wrapping_add(1), 500, &[1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2], PAYLOAD));
                        extra.push(tcp(s.backend_mac, s.backend, h.seen_by_backend, 0x12, BACKEND_ISN, CLIENT_ISN.wrapping_add(1), 500, &[], &[]));
                    }
                    (p, epoch, extra)
                });
                let all: Vec<&Vec<u8>> = extra.iter().collect();
                let seeds = seeds();
                let mut f = if seed % 2 == 0 { all[seed / 2 % all.len()].clone() } else { seeds[seed / 2 % seeds.len()].clone() };
                for (at_, b, kind) in muts {
                    match kind {
                        0 => if let Some(x) = f.get_mut(at_) { *x ^= b.max(1) },
                        1 => f.truncate(at_),
                        _ => f.extend(std::iter::repeat_n(b, at_ % 16)),
                    }
                }
                let before = f.clone();
                let mut buf = f.clone();
                buf.resize(f.len() + 64, 0);
                let mut len = f.len();
                let v = p.process_frame(&mut buf, &mut len, at(*epoch, ms));
                if !matches!(v, Verdict::Tx(_)) {
                    prop_assert_eq!(len, before.len());
                    prop_assert_eq!(&buf[..len], &before[..], "non-Tx verdict {:?} modified the frame", v);
                } else {
                    prop_assert!(len <= buf.len());
                }
                Ok(())
            })?;
        }
    }
}

/// The state guard on a proxied flow: the backend's SYN-ACK is the proxy's to answer, so one
/// with a wrong checksum is dropped (the proxy is its receiver) and changes nothing; the real
/// one completes the handshake.
#[test]
fn a_backend_syn_ack_with_a_bad_checksum_is_dropped_and_changes_nothing() {
    let epoch = Instant::now();
    let now = at(epoch, 1000);
    let mut p = pipeline_from(&config_on(), epoch);
    let s = &services()[0];
    let syn = tcp(CLIENT_MAC, s.client, s.vip, 0x02, 1000, 0, 64240, &[], &[]);
    let cookie = seen(&run(&mut p, &syn, now).1, "SYN-ACK").seq;
    let ack = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x10,
        1001,
        cookie.wrapping_add(1),
        502,
        &[],
        &[],
    );
    let (v, out) = run(&mut p, &ack, now);
    assert_eq!(v, Verdict::Tx(0));
    let syn_b = seen(&out, "SYN to the backend");
    let synack = tcp(
        s.backend_mac,
        s.backend,
        syn_b.src,
        0x12,
        BACKEND_ISN,
        1001,
        65160,
        &[],
        &[],
    );
    let mut bad = synack.clone();
    let l4 = if s.client.is_ipv6() { 54 } else { 34 };
    bad[l4 + 16] ^= 0x40;
    let (v, out) = run(&mut p, &bad, now);
    assert_eq!(v, Verdict::Drop(DropReason::BadTcpChecksum));
    assert_eq!(out, bad, "left as it came");
    // Still pending: client data is still held back.
    let data = tcp(
        CLIENT_MAC,
        s.client,
        s.vip,
        0x18,
        1001,
        cookie.wrapping_add(1),
        502,
        &[],
        PAYLOAD,
    );
    assert_eq!(
        run(&mut p, &data, now).0,
        Verdict::Drop(DropReason::SynproxyPending)
    );
    let (v, out) = run(&mut p, &synack, now);
    assert_eq!(v, Verdict::Tx(0));
    let a = seen(&out, "ACK to the backend");
    assert_eq!((a.flags, a.ack), (0x10, BACKEND_ISN.wrapping_add(1)));
    assert_eq!(p.counters().held.iter().sum::<u64>(), 0);
}
