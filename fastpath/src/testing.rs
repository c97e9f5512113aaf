//! Test fixtures (the `testing` feature; never in a product build): the fixture config,
//! frame builders (etherparse), a full checksum verifier, and a pipeline built through the
//! real config → snapshot path. Shared by fastpath's pipeline tests and the `xvs pcap`
//! replay's tests. Panics on bad fixtures: a fixture is the test's own input.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pipeline::{Pipeline, PipelineConfig};
use crate::settings::flow_table_config;
use crate::snapshot::SnapshotBuilder;
use crate::wire::checksum;
use etherparse::{IpNumber, PacketBuilder, SlicedPacket, TcpHeader};
use flowtable::FlowTable;
use lb_algos::AffinityTable;

/// The xvs port MAC (source of every transmitted frame).
pub const XVS_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// The router / client side MAC.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xcc, 0x01];
pub const B1_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x01];
pub const B2_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x02];
pub const B3_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x03];
pub const B61_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x06, 0x01];

pub const CONFIG: &str = r#"
[dataplane]
mode = "fullnat"
snat_addresses = ["198.18.1.254", "2001:2:0:1::fe"]
snat_port_range = "40000-40999"
mh_table_size = 251

[flowtable]
capacity = 4096
backends_max = 64

[timeouts]
fragment = "2s"

[[services]]
name = "web"
vip = "198.18.100.1"
port = 80
protocol = "tcp"
scheduler = "rr"
backends = [{ addr = "198.18.1.1:8080" }]

[[services]]
name = "webnat"
vip = "198.18.100.2"
port = 80
protocol = "tcp"
scheduler = "rr"
mode = "nat"
backends = [{ addr = "198.18.1.2:8080" }]

[[services]]
name = "dns"
vip = "198.18.100.53"
port = 53
protocol = "udp"
scheduler = "rr"
mode = "nat"
backends = [{ addr = "198.18.1.1:53" }]

[[services]]
name = "dnsfull"
vip = "198.18.100.54"
port = 53
protocol = "udp"
scheduler = "rr"
backends = [{ addr = "198.18.1.2:5353" }]

[[services]]
name = "mh"
vip = "198.18.100.7"
port = 443
protocol = "tcp"
scheduler = "mh"
backends = [{ addr = "198.18.1.3:8443" }]

[[services]]
name = "sctp"
vip = "198.18.100.9"
port = 3868
protocol = "sctp"
scheduler = "rr"
backends = [{ addr = "198.18.1.1:3868" }]

[[services]]
name = "sctpnat"
vip = "198.18.100.10"
port = 3868
protocol = "sctp"
scheduler = "rr"
mode = "nat"
backends = [{ addr = "198.18.1.2:3869" }]

[[services]]
name = "two"
vip = "198.18.100.20"
port = 80
protocol = "tcp"
scheduler = "rr"
backends = [{ addr = "198.18.1.1:80" }, { addr = "198.18.1.2:80" }]

[[services]]
name = "drained"
vip = "198.18.100.98"
port = 80
protocol = "tcp"
scheduler = "wrr"
backends = [{ addr = "198.18.1.1:80", weight = 0 }]

[[services]]
name = "empty"
vip = "198.18.100.99"
port = 80
protocol = "tcp"

[[services]]
name = "noneigh"
vip = "198.18.100.97"
port = 80
protocol = "tcp"
backends = [{ addr = "198.18.1.4:80" }]

[[services]]
name = "web6"
vip = "2001:2:0:100::1"
port = 80
protocol = "tcp"
scheduler = "rr"
backends = [{ addr = "[2001:2:0:1::1]:8080" }]

[[services]]
name = "web6nat"
vip = "2001:2:0:100::2"
port = 80
protocol = "tcp"
scheduler = "rr"
mode = "nat"
backends = [{ addr = "[2001:2:0:1::1]:8081" }]

[[services]]
name = "udp6"
vip = "2001:2:0:100::53"
port = 53
protocol = "udp"
scheduler = "rr"
backends = [{ addr = "[2001:2:0:1::1]:53" }]

[[services]]
name = "sctp6"
vip = "2001:2:0:100::9"
port = 3868
protocol = "sctp"
scheduler = "rr"
backends = [{ addr = "[2001:2:0:1::1]:3868" }]

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
ip = "198.18.0.2"
mac = "02:00:00:00:cc:01"
[[neighbours]]
ip = "2001:2:0:1::1"
mac = "02:00:00:00:06:01"
[[neighbours]]
ip = "2001:2::1"
mac = "02:00:00:00:cc:01"
"#;

pub fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A pipeline (worker 0 of 1) over fresh tables, built from `toml` through `config::parse` and
/// `SnapshotBuilder`.
pub fn pipeline_from(toml: &str, epoch: Instant) -> Pipeline {
    let cfg = config::parse(toml, "fixture.toml").unwrap();
    let snapshot = SnapshotBuilder::from_config(&cfg)
        .build_config(&cfg)
        .unwrap();
    let flows = FlowTable::new(flow_table_config(&cfg), epoch).unwrap();
    let affinity = AffinityTable::new(1024, epoch);
    let mut pc = PipelineConfig::from_config(&cfg, 0, 1);
    pc.port = 0;
    pc.mac = XVS_MAC;
    Pipeline::new(pc, Arc::new(flows), Arc::new(affinity), Arc::new(snapshot))
}

pub fn pipeline(epoch: Instant) -> Pipeline {
    pipeline_from(CONFIG, epoch)
}

/// L4 of a built frame.
#[derive(Clone, Copy, Debug)]
pub enum L4 {
    /// TCP with this flags byte (FIN 1, SYN 2, RST 4, PSH 8, ACK 16).
    Tcp(u8),
    Udp,
    /// SCTP with this first chunk type (1 INIT, 0 DATA, 6 ABORT).
    Sctp(u8),
}

pub const SYN: L4 = L4::Tcp(0x02);
pub const SYNACK: L4 = L4::Tcp(0x12);
pub const ACK: L4 = L4::Tcp(0x10);
pub const FIN: L4 = L4::Tcp(0x11);
pub const PAYLOAD: &[u8] = b"xvs fixture payload";

fn tcp_header(sport: u16, dport: u16, flags: u8) -> TcpHeader {
    let mut h = TcpHeader::new(sport, dport, 0x1000_0001, 64240);
    h.fin = flags & 1 != 0;
    h.syn = flags & 2 != 0;
    h.rst = flags & 4 != 0;
    h.psh = flags & 8 != 0;
    h.ack = flags & 16 != 0;
    if h.ack {
        h.acknowledgment_number = 0x2000_0002;
    }
    h
}

/// SCTP common header + one chunk (type `chunk`), CRC32c filled.
pub fn sctp_bytes(sport: u16, dport: u16, chunk: u8) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(&sport.to_be_bytes());
    s.extend_from_slice(&dport.to_be_bytes());
    s.extend_from_slice(&0x0102_0304u32.to_be_bytes());
    s.extend_from_slice(&[0; 4]);
    s.extend_from_slice(&[chunk, 0, 0, 20]);
    s.extend_from_slice(&[0xab; 16]);
    let crc = crc32c::crc32c(&s);
    s[8..12].copy_from_slice(&crc.to_le_bytes());
    s
}

/// An Ethernet frame src → dst with `ttl`, carrying `l4` and [`PAYLOAD`].
pub fn frame(
    smac: [u8; 6],
    dmac: [u8; 6],
    src: SocketAddr,
    dst: SocketAddr,
    ttl: u8,
    l4: L4,
) -> Vec<u8> {
    let mut out = Vec::new();
    let eth = PacketBuilder::ethernet2(smac, dmac);
    macro_rules! l4 {
        ($ip:expr) => {
            match l4 {
                L4::Tcp(f) => $ip
                    .tcp_header(tcp_header(src.port(), dst.port(), f))
                    .write(&mut out, PAYLOAD),
                L4::Udp => $ip.udp(src.port(), dst.port()).write(&mut out, PAYLOAD),
                L4::Sctp(c) => $ip.write(
                    &mut out,
                    IpNumber(132),
                    &sctp_bytes(src.port(), dst.port(), c),
                ),
            }
        };
    }
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => l4!(eth.ipv4(s.octets(), d.octets(), ttl)),
        (IpAddr::V6(s), IpAddr::V6(d)) => l4!(eth.ipv6(s.octets(), d.octets(), ttl)),
        _ => panic!("mixed families"),
    }
    .unwrap();
    out
}

/// Recomputes every checksum of `f` from scratch (our own RFC 1071 code) and checks it, and
/// that etherparse parses the frame. Panics with `what` on a mismatch.
pub fn verify_checksums(f: &[u8], what: &str) {
    let p = SlicedPacket::from_ethernet(f).unwrap_or_else(|e| panic!("{what}: etherparse: {e:?}"));
    let Some(net) = p.net else { return };
    let ip = &f[14..];
    match net {
        etherparse::NetSlice::Ipv4(v4) => {
            let h = v4.header().slice();
            assert_eq!(checksum::checksum(h), 0, "{what}: IPv4 header checksum");
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let l4 = &ip[h.len()..total];
            let (s, d): ([u8; 4], [u8; 4]) = (
                ip[12..16].try_into().unwrap(),
                ip[16..20].try_into().unwrap(),
            );
            let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
            if frag {
                return;
            }
            match ip[9] {
                6 => assert_eq!(
                    checksum::l4_checksum_v4(&s, &d, 6, l4),
                    0,
                    "{what}: TCP checksum"
                ),
                17 if u16::from_be_bytes([l4[6], l4[7]]) != 0 => {
                    assert_eq!(
                        checksum::l4_checksum_v4(&s, &d, 17, l4),
                        0,
                        "{what}: UDP checksum"
                    )
                }
                1 => assert_eq!(checksum::checksum(l4), 0, "{what}: ICMP checksum"),
                132 => verify_sctp(l4, what),
                _ => {}
            }
        }
        etherparse::NetSlice::Ipv6(_) => {
            let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let l4 = &ip[40..40 + plen];
            let (s, d): ([u8; 16], [u8; 16]) = (
                ip[8..24].try_into().unwrap(),
                ip[24..40].try_into().unwrap(),
            );
            match ip[6] {
                6 | 17 | 58 => assert_eq!(
                    checksum::l4_checksum_v6(&s, &d, ip[6], l4),
                    0,
                    "{what}: L4 checksum"
                ),
                132 => verify_sctp(l4, what),
                _ => {}
            }
        }
        _ => {}
    }
}

fn verify_sctp(l4: &[u8], what: &str) {
    let mut c = l4.to_vec();
    let want = u32::from_le_bytes(c[8..12].try_into().unwrap());
    c[8..12].fill(0);
    assert_eq!(crc32c::crc32c(&c), want, "{what}: SCTP CRC32c");
}

/// The fake clock.
pub fn at(epoch: Instant, ms: u64) -> Instant {
    epoch + Duration::from_millis(ms)
}

/// The IPv4 header checksum of `f` (untagged) made right again.
pub fn fix_ip4(f: &mut [u8]) {
    f[24..26].fill(0);
    let c = checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

/// An IPv4 later fragment `src` → `dst` (UDP), id `id`, at byte `offset` (a multiple of
/// 8), carrying `len` bytes.
pub fn frag4(src: &str, dst: &str, id: u16, offset: usize, len: usize) -> Vec<u8> {
    let (s, d): (SocketAddr, SocketAddr) = (sa(src), sa(dst));
    let (IpAddr::V4(s), IpAddr::V4(d)) = (s.ip(), d.ip()) else {
        panic!("v4")
    };
    let mut f = vec![0u8; 34 + len];
    f[..6].copy_from_slice(&XVS_MAC);
    f[6..12].copy_from_slice(&CLIENT_MAC);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((20 + len) as u16).to_be_bytes());
    f[18..20].copy_from_slice(&id.to_be_bytes());
    f[20..22].copy_from_slice(&((offset / 8) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&s.octets());
    f[30..34].copy_from_slice(&d.octets());
    f[34..].fill(0x5a);
    fix_ip4(&mut f);
    f
}
