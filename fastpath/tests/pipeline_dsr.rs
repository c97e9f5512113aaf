//! Direct server return (`fastpath/src/pipeline/dsr.rs`): the exact frames each
//! encapsulation sends to a backend (IPIP, GUE, L2; IPv4 and IPv6), the ICMP fragmentation
//! needed / packet too big a client gets for a packet that no longer fits, the MSS clamp of
//! a forwarded SYN, a DSR flow's TCP state from the client's packets alone, and the batch
//! path giving what `process_frame` gives.
//!
//! Expected frames are built with etherparse (its own checksums), so they check the
//! pipeline's headers and checksums independently.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use fastpath::testing::*;

use etherparse::{
    IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6Header, PacketBuilder, TcpHeader, TcpOptionElement,
    UdpHeader,
};
use fastpath::pipeline::dsr::flow_hash;
use fastpath::pipeline::{DropReason, FrameBatch, Pipeline, RejectReason, Verdict};
use flowtable::{FlowKey, FlowState, Protocol, TcpState};

const DSR_CONFIG: &str = r#"
[dataplane]
mode = "fullnat"
snat_addresses = ["198.18.1.254", "2001:2:0:1::fe"]
snat_port_range = "40000-40999"

[flowtable]
capacity = 4096
backends_max = 64

[[services]]
name = "ipip4"
vip = "198.18.100.1"
port = 80
protocol = "tcp"
mode = "dsr"
backends = [{ addr = "198.18.1.1:80" }]

[[services]]
name = "gue4"
vip = "198.18.100.2"
port = 80
protocol = "tcp"
mode = "dsr"
encap = "gue"
backends = [{ addr = "198.18.1.2:80" }]

[[services]]
name = "l24"
vip = "198.18.100.3"
port = 80
protocol = "tcp"
mode = "dsr"
encap = "l2"
backends = [{ addr = "198.18.1.3:80" }]

[[services]]
name = "gue4udp"
vip = "198.18.100.2"
port = 53
protocol = "udp"
mode = "dsr"
encap = "gue"
backends = [{ addr = "198.18.1.2:53" }]

[[services]]
name = "ipip6"
vip = "2001:2:0:100::1"
port = 80
protocol = "tcp"
mode = "dsr"
backends = [{ addr = "[2001:2:0:1::1]:80" }]

[[services]]
name = "gue6"
vip = "2001:2:0:100::2"
port = 80
protocol = "tcp"
mode = "dsr"
encap = "gue"
backends = [{ addr = "[2001:2:0:1::1]:80" }]

[[services]]
name = "l26"
vip = "2001:2:0:100::3"
port = 80
protocol = "tcp"
mode = "dsr"
encap = "l2"
backends = [{ addr = "[2001:2:0:1::1]:80" }]

[[services]]
name = "plain"
vip = "198.18.100.9"
port = 80
protocol = "tcp"
backends = [{ addr = "198.18.1.1:8080" }]

[[neighbours]]
ip = "198.18.1.1"
mac = "02:00:00:00:01:01"
[[neighbours]]
ip = "198.18.1.2"
mac = "02:00:00:00:01:02"
[[neighbours]]
ip = "198.18.1.3"
mac = "02:00:00:00:01:03"
[[neighbours]]
ip = "198.18.0.1"
mac = "02:00:00:00:cc:01"
[[neighbours]]
ip = "2001:2:0:1::1"
mac = "02:00:00:00:06:01"
[[neighbours]]
ip = "2001:2::1"
mac = "02:00:00:00:cc:01"
"#;

const C4: &str = "198.18.0.1:40001";
const C6: &str = "[2001:2::1]:40001";
const SRC4: [u8; 4] = [198, 18, 1, 254];
const SRC6: &str = "2001:2:0:1::fe";

fn hex(f: &[u8]) -> String {
    f.iter().map(|b| format!("{b:02x}")).collect()
}

fn rig(extra: &str, epoch: Instant) -> Pipeline {
    pipeline_from(
        &DSR_CONFIG.replace("[dataplane]\n", &format!("[dataplane]\n{extra}")),
        epoch,
    )
}

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

fn hash_of(client: &str, vip: &str, proto: u8) -> u32 {
    let (c, v) = (sa(client), sa(vip));
    flow_hash(c.ip(), c.port(), v.ip(), v.port(), proto)
}

fn gue_sport(hash: u32) -> u16 {
    0xc000 | (hash >> 16) as u16 & 0x3fff
}

/// The frame xvs sends to `backend` (next hop `mac`) for the client frame `inner`: the
/// outer IP header (and UDP header to 6080 for `gue`) before the unchanged inner packet.
fn encapsulated(inner: &[u8], mac: [u8; 6], backend: IpAddr, gue: Option<u16>) -> Vec<u8> {
    let ip = &inner[14..];
    let udp_len = ip.len() + 8;
    let mut out = Vec::new();
    out.extend_from_slice(&mac);
    out.extend_from_slice(&XVS_MAC);
    match backend {
        IpAddr::V4(d) => {
            out.extend_from_slice(&[0x08, 0x00]);
            let (proto, len) = match gue {
                Some(_) => (IpNumber::UDP, udp_len),
                None => (IpNumber(4), ip.len()),
            };
            let mut h = Ipv4Header::new(len as u16, 64, proto, SRC4, d.octets()).unwrap();
            h.dont_fragment = ip[6] & 0x40 != 0;
            h.header_checksum = h.calc_header_checksum();
            h.write(&mut out).unwrap();
            if let Some(sport) = gue {
                // Checksum 0 over IPv4, as Katran.
                let u = UdpHeader {
                    source_port: sport,
                    destination_port: 6080,
                    length: udp_len as u16,
                    checksum: 0,
                };
                u.write(&mut out).unwrap();
            }
        }
        IpAddr::V6(d) => {
            out.extend_from_slice(&[0x86, 0xdd]);
            let s: std::net::Ipv6Addr = SRC6.parse().unwrap();
            let (next, len) = match gue {
                Some(_) => (IpNumber::UDP, udp_len),
                None => (IpNumber(41), ip.len()),
            };
            let h = Ipv6Header {
                traffic_class: 0,
                flow_label: Ipv6FlowLabel::ZERO,
                payload_length: len as u16,
                next_header: next,
                hop_limit: 64,
                source: s.octets(),
                destination: d.octets(),
            };
            h.write(&mut out).unwrap();
            if let Some(sport) = gue {
                let u = UdpHeader::with_ipv6_checksum(sport, 6080, &h, ip).unwrap();
                u.write(&mut out).unwrap();
            }
        }
    }
    out.extend_from_slice(ip);
    out
}

/// Sets the IPv6 flow label of an expected frame (the flow's hash, 20 bits).
fn with_label(mut f: Vec<u8>, hash: u32) -> Vec<u8> {
    let label = hash & 0xf_ffff;
    f[15] = (f[15] & 0xf0) | (label >> 16) as u8;
    f[16..18].copy_from_slice(&(label as u16).to_be_bytes());
    f
}

const B1: [u8; 4] = [198, 18, 1, 1];
const B2: [u8; 4] = [198, 18, 1, 2];

#[test]
fn ipip_and_gue_over_ipv4_send_the_client_packet_unchanged_inside() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    for l4 in [SYN, ACK, FIN] {
        let f = cin(C4, "198.18.100.1:80", l4);
        let want = encapsulated(&f, B1_MAC, IpAddr::from(B1), None);
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, Verdict::Tx(0), "ipip {l4:?}");
        assert_eq!(hex(&out), hex(&want), "ipip {l4:?}");
        assert_eq!(out.len(), f.len() + 20);
        verify_checksums(&out, "ipip outer");
        verify_checksums(&f, "inner as sent");
        assert_eq!(
            &out[34..],
            &f[14..],
            "inner packet unchanged (TTL included)"
        );

        let f = cin(C4, "198.18.100.2:80", l4);
        let sport = gue_sport(hash_of(C4, "198.18.100.2:80", 6));
        let want = encapsulated(&f, B2_MAC, IpAddr::from(B2), Some(sport));
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, Verdict::Tx(0), "gue {l4:?}");
        assert_eq!(hex(&out), hex(&want), "gue {l4:?}");
        assert_eq!(out.len(), f.len() + 28);
    }
    // UDP by GUE too; the source port is the flow's: another client port, another port.
    let f = cin(C4, "198.18.100.2:53", L4::Udp);
    let sport = gue_sport(hash_of(C4, "198.18.100.2:53", 17));
    let (v, out) = roomy(&mut p, &f, epoch);
    assert_eq!(v, Verdict::Tx(0));
    assert_eq!(
        hex(&out),
        hex(&encapsulated(&f, B2_MAC, IpAddr::from(B2), Some(sport)))
    );
    let ports: std::collections::HashSet<[u8; 2]> = (0..64u16)
        .map(|i| {
            let f = cin(
                &format!("198.18.0.1:{}", 41000 + i),
                "198.18.100.2:53",
                L4::Udp,
            );
            let (_, out) = roomy(&mut p, &f, epoch);
            [out[34], out[35]]
        })
        .collect();
    assert!(ports.len() > 32, "GUE source ports spread: {}", ports.len());
    // A non-DSR service next to them is translated as before.
    let f = cin(C4, "198.18.100.9:80", SYN);
    let (v, out) = roomy(&mut p, &f, epoch);
    assert_eq!(v, Verdict::Tx(0));
    assert_eq!(out.len(), f.len());
    assert_eq!(&out[30..34], &B1, "full-NAT rewrote the destination");
}

#[test]
fn ipip_and_gue_over_ipv6_send_the_client_packet_unchanged_inside() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    let b6: IpAddr = "2001:2:0:1::1".parse().unwrap();
    for l4 in [SYN, ACK] {
        let f = cin(C6, "[2001:2:0:100::1]:80", l4);
        let hash = hash_of(C6, "[2001:2:0:100::1]:80", 6);
        let want = with_label(encapsulated(&f, B61_MAC, b6, None), hash);
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, Verdict::Tx(0), "ipip6 {l4:?}");
        assert_eq!(hex(&out), hex(&want), "ipip6 {l4:?}");
        assert_eq!(out.len(), f.len() + 40);

        // The same client and backend as ipip6, another VIP: a flow of its own.
        let f = cin(C6, "[2001:2:0:100::2]:80", l4);
        let hash = hash_of(C6, "[2001:2:0:100::2]:80", 6);
        let want = encapsulated(&f, B61_MAC, b6, Some(gue_sport(hash)));
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, Verdict::Tx(0), "gue6 {l4:?}");
        // The flow label is not part of the UDP checksum's pseudo-header.
        assert_eq!(hex(&out), hex(&with_label(want, hash)), "gue6 {l4:?}");
        assert_eq!(out.len(), f.len() + 48);
        verify_checksums(&out, "gue6 outer (UDP checksum computed)");
    }
}

#[test]
fn l2_changes_only_the_macs() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    for (client, vip, mac) in [
        (C4, "198.18.100.3:80", B3_MAC),
        (C6, "[2001:2:0:100::3]:80", B61_MAC),
    ] {
        let f = cin(client, vip, SYN);
        let mut want = f.clone();
        want[..6].copy_from_slice(&mac);
        want[6..12].copy_from_slice(&XVS_MAC);
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, Verdict::Tx(0), "{vip}");
        assert_eq!(hex(&out), hex(&want), "{vip}");
        // `process` needs no room for it.
        let mut g = cin(client, vip, ACK);
        let mut want = g.clone();
        want[..6].copy_from_slice(&mac);
        want[6..12].copy_from_slice(&XVS_MAC);
        assert_eq!(p.process(&mut g, epoch), Verdict::Tx(0));
        assert_eq!(g, want);
    }
}

#[test]
fn without_room_ipip_and_gue_are_dropped_and_the_frame_kept() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    let f = cin(C4, "198.18.100.1:80", SYN);
    let mut g = f.clone();
    assert_eq!(
        p.process(&mut g, epoch),
        Verdict::Drop(DropReason::EncapNoRoom)
    );
    assert_eq!(g, f);
    assert_eq!(p.counters().drops[DropReason::EncapNoRoom as usize], 1);
}

/// An IPv4 SYN from `client` to `vip` carrying MSS option `mss`.
fn syn_with_mss(client: &str, vip: &str, mss: u16, payload: usize) -> Vec<u8> {
    let (c, v) = (sa(client), sa(vip));
    let mut t = TcpHeader::new(c.port(), v.port(), 0x1000_0001, 64240);
    t.syn = true;
    t.set_options(&[
        TcpOptionElement::MaximumSegmentSize(mss),
        TcpOptionElement::Noop,
        TcpOptionElement::WindowScale(7),
    ])
    .unwrap();
    let mut out = Vec::new();
    let eth = PacketBuilder::ethernet2(CLIENT_MAC, XVS_MAC);
    let body = vec![0x5a; payload];
    match (c.ip(), v.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .tcp_header(t)
            .write(&mut out, &body),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .tcp_header(t)
            .write(&mut out, &body),
        _ => unreachable!(),
    }
    .unwrap();
    out
}

fn mss_of(inner_l4: &[u8]) -> u16 {
    // The option list starts with the MSS (kind 2, length 4).
    assert_eq!(&inner_l4[20..22], &[2, 4]);
    u16::from_be_bytes([inner_l4[22], inner_l4[23]])
}

#[test]
fn forwarded_syns_have_their_mss_clamped_to_fit_the_encapsulation() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    // 1500 - 20 - 20 - 20 (ipip4); 1500 - 20 - 20 - 28 (gue4); 1500 - 40 - 20 - 40 (ipip6);
    // l2 adds nothing: 1460 stays.
    for (client, vip, want, outer) in [
        (C4, "198.18.100.1:80", 1440, 20),
        (C4, "198.18.100.2:80", 1432, 28),
        (C6, "[2001:2:0:100::1]:80", 1400, 40),
        (C6, "[2001:2:0:100::2]:80", 1392, 48),
    ] {
        let f = syn_with_mss(client, vip, 1460, 0);
        let (v, out) = roomy(&mut p, &f, epoch);
        assert_eq!(v, Verdict::Tx(0), "{vip}");
        let ip = if client == C4 { 20 } else { 40 };
        let l4 = 14 + outer + ip;
        assert_eq!(mss_of(&out[l4..]), want, "{vip}");
        verify_checksums(
            &out[..14]
                .iter()
                .chain(&out[14 + outer..])
                .copied()
                .collect::<Vec<_>>(),
            vip,
        );
        // Everything but the MSS and the TCP checksum is as sent.
        let mut inner = out[14 + outer..].to_vec();
        inner[ip + 22..ip + 24].copy_from_slice(&1460u16.to_be_bytes());
        inner[ip + 16..ip + 18].copy_from_slice(&f[14 + ip + 16..14 + ip + 18]);
        assert_eq!(inner, f[14..], "{vip}");
        // A SYN already below the clamp is left alone.
        let f = syn_with_mss(&client.replace("40001", "40002"), vip, 536, 0);
        let (_, out) = roomy(&mut p, &f, epoch);
        assert_eq!(&out[14 + outer..], &f[14..], "{vip}");
    }
    // An l2 SYN whose MSS does not fit 1500 (a jumbo client) is clamped to 1460.
    let f = syn_with_mss(C4, "198.18.100.3:80", 8960, 0);
    let (_, out) = roomy(&mut p, &f, epoch);
    assert_eq!(mss_of(&out[34..]), 1460);
    verify_checksums(&out, "l2 clamped");
    // Off: untouched.
    let mut p = rig("dsr_mss_clamp = false\n", epoch);
    let f = syn_with_mss(C4, "198.18.100.1:80", 1460, 0);
    let (_, out) = roomy(&mut p, &f, epoch);
    assert_eq!(&out[34..], &f[14..]);
}

#[test]
fn too_big_packets_get_fragmentation_needed_or_packet_too_big() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    // Open the flows (the client's SYN), then a full-size segment: 1500 bytes of IP.
    for (client, vip, ip, mtu) in [
        (C4, "198.18.100.1:80", 20, 1480u16),
        (C4, "198.18.100.2:80", 20, 1472),
        (C6, "[2001:2:0:100::1]:80", 40, 1460),
        (C6, "[2001:2:0:100::2]:80", 40, 1452),
    ] {
        let syn = cin(client, vip, SYN);
        assert_eq!(roomy(&mut p, &syn, epoch).0, Verdict::Tx(0), "{vip}");
        let big = syn_with_mss(client, vip, 1460, 1500 - ip - 28);
        assert_eq!(big.len(), 1514);
        let (v, out) = roomy(&mut p, &big, epoch);
        assert_eq!(
            v,
            Verdict::Reject {
                reason: RejectReason::PacketTooBig,
                port: 0
            },
            "{vip}"
        );
        verify_checksums(&out, vip);
        assert_eq!(&out[..6], &CLIENT_MAC);
        let (c, v) = (sa(client), sa(vip));
        if ip == 20 {
            assert_eq!(&out[26..30], &octets(v.ip())[..], "from the VIP");
            assert_eq!(&out[30..34], &octets(c.ip())[..], "to the client");
            assert_eq!(out[23], 1, "ICMP");
            // Type 3 code 4, next-hop MTU in bytes 6-7.
            assert_eq!(&out[34..36], &[3, 4]);
            assert_eq!(u16::from_be_bytes([out[40], out[41]]), mtu, "{vip}");
            // The quote starts with the client's IP header.
            assert_eq!(&out[42..62], &big[14..34]);
        } else {
            assert_eq!(&out[22..38], &octets(v.ip())[..], "from the VIP");
            assert_eq!(&out[38..54], &octets(c.ip())[..], "to the client");
            assert_eq!(out[20], 58, "ICMPv6");
            assert_eq!(&out[54..56], &[2, 0], "packet too big");
            assert_eq!(
                u32::from_be_bytes([out[58], out[59], out[60], out[61]]),
                u32::from(mtu),
                "{vip}"
            );
            assert_eq!(&out[62..102], &big[14..54]);
            assert!(out.len() - 14 <= 1280, "within the IPv6 minimum MTU");
        }
        // Exactly the MTU left fits.
        let fits = syn_with_mss(client, vip, 1460, usize::from(mtu) - ip - 28);
        assert_eq!(roomy(&mut p, &fits, epoch).0, Verdict::Tx(0), "{vip}");
    }
    let c = p.counters();
    assert_eq!(c.rejected(RejectReason::PacketTooBig), 4);
    // IPv4 without DF: dropped, not answered.
    let mut big = syn_with_mss(C4, "198.18.100.1:80", 1460, 1448);
    big[20] &= !0x40;
    fix_ip4(&mut big);
    assert_eq!(
        roomy(&mut p, &big, epoch).0,
        Verdict::Drop(DropReason::TooBig)
    );
    // An l2 service adds nothing: a full-size packet goes.
    let big = syn_with_mss(C4, "198.18.100.3:80", 1460, 1448);
    assert_eq!(roomy(&mut p, &big, epoch).0, Verdict::Tx(0));
    // A smaller dsr_mtu lowers what fits.
    let mut p = rig("dsr_mtu = 1400\n", epoch);
    let f = syn_with_mss(C4, "198.18.100.1:80", 1460, 1400 - 20 - 28);
    let (v, out) = roomy(&mut p, &f, epoch);
    assert!(matches!(v, Verdict::Reject { .. }), "{v:?}");
    assert_eq!(u16::from_be_bytes([out[40], out[41]]), 1380);
}

fn octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn state(p: &Pipeline, client: &str, vip: &str) -> Option<(SocketAddr, FlowState)> {
    let key = FlowKey::new(Protocol::Tcp, sa(client), sa(vip)).unwrap();
    let flows = p.flows();
    let (h, _) = flows.lookup(&key)?;
    flows.get(h).map(|v| (v.data.backend, v.state))
}

#[test]
fn dsr_tcp_state_follows_the_clients_packets_alone() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    for (client, vip) in [
        (C4, "198.18.100.1:80"),
        (C4, "198.18.100.2:80"),
        (C4, "198.18.100.3:80"),
        (C6, "[2001:2:0:100::1]:80"),
    ] {
        let tcp = |s| Some(FlowState::Tcp(s));
        let st = |p: &Pipeline| state(p, client, vip).map(|s| s.1);
        let mut t = 0;
        let mut send = |p: &mut Pipeline, l4| {
            t += 10;
            roomy(p, &cin(client, vip, l4), at(epoch, t)).0
        };
        assert_eq!(send(&mut p, SYN), Verdict::Tx(0));
        assert_eq!(st(&p), tcp(TcpState::SynRecv), "{vip}: SYN");
        // No SYN-ACK is ever seen; the client's ACK establishes the flow.
        send(&mut p, ACK);
        assert_eq!(st(&p), tcp(TcpState::Established), "{vip}: ACK");
        send(&mut p, L4::Tcp(0x18));
        assert_eq!(st(&p), tcp(TcpState::Established), "{vip}: data");
        send(&mut p, FIN);
        assert_eq!(st(&p), tcp(TcpState::FinWait), "{vip}: FIN");
        // A new SYN on the finished flow opens a new one (the old is ended for DSR).
        assert_eq!(send(&mut p, SYN), Verdict::Tx(0));
        assert_eq!(st(&p), tcp(TcpState::SynRecv), "{vip}: reopened");
        // A client RST in SYN_RECV is not believed (IPVS's input-only rows); after its ACK
        // it closes the flow.
        send(&mut p, L4::Tcp(0x04));
        assert_eq!(st(&p), tcp(TcpState::SynRecv), "{vip}: RST in SYN_RECV");
        send(&mut p, ACK);
        send(&mut p, L4::Tcp(0x04));
        assert_eq!(st(&p), tcp(TcpState::Close), "{vip}: RST");
    }
    // A full-NAT flow still waits in CLOSE_WAIT after the client's FIN (its input rows).
    let vip = "198.18.100.9:80";
    for l4 in [SYN, ACK, FIN] {
        roomy(&mut p, &cin(C4, vip, l4), epoch);
    }
    assert_eq!(
        state(&p, C4, vip).map(|s| s.1),
        Some(FlowState::Tcp(TcpState::CloseWait))
    );
}

#[test]
fn packets_matching_a_dsr_flows_reply_tuple_go_to_the_kernel() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    roomy(&mut p, &cin(C4, "198.18.100.1:80", SYN), epoch);
    // The backend's reply would never come here; one that does is not the flow's.
    let mut f = frame(B1_MAC, XVS_MAC, sa("198.18.1.1:80"), sa(C4), 64, SYNACK);
    assert_eq!(p.process(&mut f, epoch), Verdict::Pass);
}

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
fn a_batch_encapsulates_as_process_frame_does() {
    let epoch = Instant::now();
    let (mut single, mut batched) = (rig("", epoch), rig("", epoch));
    let vips = [
        "198.18.100.1:80",
        "198.18.100.2:80",
        "198.18.100.3:80",
        "198.18.100.9:80",
        "[2001:2:0:100::1]:80",
        "[2001:2:0:100::2]:80",
    ];
    let mut frames = Vec::new();
    for i in 0..48u16 {
        let vip = vips[usize::from(i) % vips.len()];
        let client = if vip.starts_with('[') {
            format!("[2001:2::1]:{}", 41000 + (i % 24) / 6)
        } else {
            format!("198.18.0.1:{}", 41000 + (i % 24) / 6)
        };
        let l4 = if i < 24 { SYN } else { ACK };
        frames.push(cin(&client, vip, l4));
    }
    let want: Vec<(Verdict, Vec<u8>)> = frames
        .iter()
        .map(|f| roomy(&mut single, f, epoch))
        .collect();
    let mut batch = Roomy {
        lens: frames.iter().map(Vec::len).collect(),
        bufs: frames
            .iter()
            .map(|f| {
                let mut b = f.clone();
                b.resize(f.len() + 1500, 0);
                b
            })
            .collect(),
    };
    let mut verdicts = vec![Verdict::Pass; frames.len()];
    batched.process_batch(&mut batch, epoch, &mut verdicts);
    for (i, (v, out)) in want.iter().enumerate() {
        assert_eq!(verdicts[i], *v, "frame {i}");
        assert_eq!(hex(&batch.bufs[i][..batch.lens[i]]), hex(out), "frame {i}");
    }
}

/// The SYN watch (passive health: SYNs sent, SYN-ACKs seen) cannot judge a DSR backend,
/// whose SYN-ACKs go to the client: its SYNs are not counted, nor is the client's ACK taken
/// for an answer; a full-NAT service's SYN to the same backend still is.
#[test]
fn dsr_syns_are_not_watched_for_passive_health() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    let watch = std::sync::Arc::new(fastpath::passive::SynWatch::new(64));
    p.set_syn_watch(watch.clone());
    let total = |w: &fastpath::passive::SynWatch| {
        (0..64u32)
            .map(|i| w.sample(lb_algos::BackendId(i)))
            .fold((0, 0), |(s, a), c| (s + c.syns, a + c.answered))
    };
    for vip in ["198.18.100.1:80", "198.18.100.2:80", "198.18.100.3:80"] {
        for l4 in [SYN, ACK] {
            assert_eq!(roomy(&mut p, &cin(C4, vip, l4), epoch).0, Verdict::Tx(0));
        }
    }
    assert_eq!(total(&watch), (0, 0));
    roomy(&mut p, &cin(C4, "198.18.100.9:80", SYN), epoch);
    assert_eq!(total(&watch), (1, 0));
}

/// An ICMP error about a DSR flow's reply (a router on the backend's way to the client
/// telling the VIP the reply was too big) goes on to the flow's backend unchanged, inside
/// the flow's encapsulation: the backend's stack sent that reply.
#[test]
fn icmp_errors_about_a_dsr_reply_go_to_its_backend() {
    let epoch = Instant::now();
    let mut p = rig("", epoch);
    assert_eq!(
        roomy(&mut p, &cin(C4, "198.18.100.1:80", SYN), epoch).0,
        Verdict::Tx(0)
    );
    // The reply the backend sent from the VIP, as a router quotes it.
    let mut reply = Vec::new();
    PacketBuilder::ipv4([198, 18, 100, 1], [198, 18, 0, 1], 60)
        .tcp(80, 40001, 7, 64240)
        .ack(2)
        .write(&mut reply, &[0u8; 32])
        .unwrap();
    let mut f = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, XVS_MAC)
        .ipv4([198, 18, 0, 1], [198, 18, 100, 1], 64)
        .icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(
            etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
        ))
        .write(&mut f, &reply[..28])
        .unwrap();
    let (v, out) = roomy(&mut p, &f, epoch);
    assert_eq!(v, Verdict::Tx(0));
    assert_eq!(
        hex(&out),
        hex(&encapsulated(&f, B1_MAC, IpAddr::from(B1), None))
    );
}
