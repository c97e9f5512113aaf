//! The fixed-offset IPv4 fast path (`fast.rs`, taken by `Pipeline::process` and
//! `Pipeline::process_batch`) against the general path (`classify`, then `forward` or
//! `new_flow`; `Pipeline::process_frame_general`): two pipelines over identical tables and
//! snapshots get the same random frames at the same times, and must give the same verdicts,
//! the same output bytes (the whole buffer, room included), the same counters and traffic
//! counts, and end with the same flows (handle, data, state, last seen, sequence word).
//!
//! The frames are random steps on a few connections (client → VIP, and the backend's reply
//! to the flow's reply tuple, read from the general pipeline's table): fullnat and nat, TCP
//! and UDP, an `mh` service (which schedules non-SYNs), a SYN-proxied service (its client
//! ACKs carry the cookie of the last SYN-ACK the client got), DSR services (IPIP TCP, GUE
//! UDP: the frame grows into the room), a service without backends,
//! one whose backend has no neighbour, a non-VIP and a VIP's other port. TCP flags follow
//! a handshake script (SYN, SYN-ACK, ACK, data, FINs, a reopening SYN) or are random
//! combinations; frames get TTLs 0/1/2, IP options, fragment bits, bad IP or L4 checksums,
//! a zero UDP checksum, a bad TCP data offset, a VLAN tag, Ethernet padding, truncation;
//! the clock jumps past flow timeouts now and then.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use etherparse::{IpNumber, PacketBuilder, TcpHeader};
use fastpath::pipeline::{FrameBatch, Pipeline, Verdict};
use fastpath::testing::*;
use fastpath::wire::checksum;
use flowtable::{FlowKey, FlowView, Protocol};
use lb_algos::BackendId;
use proptest::prelude::*;

/// Room after each frame, for the SYN proxy's SYN to a backend (12 bytes longer).
const ROOM: usize = 64;

/// The fixture config with a smaller flow table (each case builds two), plus a SYN-proxied
/// TCP service.
fn config() -> String {
    let small = CONFIG.replace("capacity = 4096", "capacity = 256");
    assert_ne!(small, CONFIG, "the fixture's flow table capacity moved");
    format!(
        "{small}
[[services]]
name = \"proxied\"
vip = \"198.18.100.30\"
port = 80
protocol = \"tcp\"
scheduler = \"rr\"
synproxy = \"on\"
backends = [{{ addr = \"198.18.1.1:9090\" }}]

[[services]]
name = \"dsr\"
vip = \"198.18.100.40\"
port = 80
protocol = \"tcp\"
mode = \"dsr\"
backends = [{{ addr = \"198.18.1.2:80\" }}]

[[services]]
name = \"dsrgue\"
vip = \"198.18.100.40\"
port = 53
protocol = \"udp\"
mode = \"dsr\"
encap = \"gue\"
backends = [{{ addr = \"198.18.1.3:53\" }}]
"
    )
}

/// A frontend of the test: where client frames go, and the backend a reply comes from when
/// the flow is unknown (`None`: none).
struct Target {
    dst: &'static str,
    tcp: bool,
    backend: Option<&'static str>,
    fullnat: bool,
}

const TARGETS: &[Target] = &[
    // web: fullnat TCP.
    Target {
        dst: "198.18.100.1:80",
        tcp: true,
        backend: Some("198.18.1.1:8080"),
        fullnat: true,
    },
    // webnat: nat TCP.
    Target {
        dst: "198.18.100.2:80",
        tcp: true,
        backend: Some("198.18.1.2:8080"),
        fullnat: false,
    },
    // dns: nat UDP.
    Target {
        dst: "198.18.100.53:53",
        tcp: false,
        backend: Some("198.18.1.1:53"),
        fullnat: false,
    },
    // dnsfull: fullnat UDP.
    Target {
        dst: "198.18.100.54:53",
        tcp: false,
        backend: Some("198.18.1.2:5353"),
        fullnat: true,
    },
    // mh: fullnat TCP, schedules any packet.
    Target {
        dst: "198.18.100.7:443",
        tcp: true,
        backend: Some("198.18.1.3:8443"),
        fullnat: true,
    },
    // two: rr over two backends.
    Target {
        dst: "198.18.100.20:80",
        tcp: true,
        backend: Some("198.18.1.2:80"),
        fullnat: true,
    },
    // proxied: the SYN proxy on.
    Target {
        dst: "198.18.100.30:80",
        tcp: true,
        backend: Some("198.18.1.1:9090"),
        fullnat: true,
    },
    // dsr: IPIP to the backend, client direction only.
    Target {
        dst: "198.18.100.40:80",
        tcp: true,
        backend: Some("198.18.1.2:80"),
        fullnat: false,
    },
    // dsrgue: GUE, UDP.
    Target {
        dst: "198.18.100.40:53",
        tcp: false,
        backend: Some("198.18.1.3:53"),
        fullnat: false,
    },
    // noneigh: its backend's next hop is unknown (Slow).
    Target {
        dst: "198.18.100.97:80",
        tcp: true,
        backend: Some("198.18.1.4:80"),
        fullnat: true,
    },
    // empty: no backend.
    Target {
        dst: "198.18.100.99:80",
        tcp: true,
        backend: None,
        fullnat: true,
    },
    // Not a VIP.
    Target {
        dst: "198.18.100.50:80",
        tcp: true,
        backend: None,
        fullnat: true,
    },
    // A VIP, another port.
    Target {
        dst: "198.18.100.1:81",
        tcp: true,
        backend: None,
        fullnat: true,
    },
];

/// Clients: two with a neighbour entry, one without, a martian.
const CLIENTS: &[&str] = &["198.18.0.1", "198.18.0.2", "198.18.0.3", "127.0.0.1"];

/// A connection: client (index, port) to a target.
#[derive(Clone, Copy, Debug)]
struct Conn {
    client: usize,
    port: u16,
    target: usize,
}

/// Frames of a connection's handshake script: (from the backend, TCP flags).
const SCRIPT: &[(bool, u8)] = &[
    (false, 0x02), // SYN
    (true, 0x12),  // SYN-ACK
    (false, 0x10), // ACK
    (false, 0x18), // data
    (true, 0x18),  // data back
    (false, 0x11), // FIN
    (true, 0x11),  // FIN
    (false, 0x10), // last ACK
    (false, 0x02), // a new SYN on the same tuple (port reuse)
];

/// TCP flags of a step.
#[derive(Clone, Copy, Debug)]
enum Flags {
    /// The connection's next frame in [`SCRIPT`] (also decides the direction).
    Script,
    /// These flags, in the step's direction.
    Raw(u8),
}

/// How a frame is damaged or dressed (applied in this order).
#[derive(Clone, Debug, Default)]
struct Mangle {
    /// 32-bit words of IP options (NOPs).
    options: u8,
    /// The IPv4 flags/fragment-offset field (DF, MF, offset).
    frag: Option<u16>,
    /// The TCP data offset nibble.
    doff: Option<u8>,
    /// UDP: checksum 0 (none, valid in IPv4).
    udp_zero: bool,
    /// A wrong L4 checksum.
    bad_l4: bool,
    /// A wrong IPv4 header checksum.
    bad_ip: bool,
    /// A VLAN tag.
    vlan: Option<u16>,
    /// Ethernet padding bytes.
    pad: u8,
    /// Cut the frame to this share (per mille) of its length.
    truncate: Option<u16>,
    /// Another IP protocol than the target's (UDP to a TCP frontend and back, or GRE).
    other_proto: Option<u8>,
}

#[derive(Clone, Debug)]
struct Step {
    conn: usize,
    from_backend: bool,
    flags: Flags,
    ttl: u8,
    mangle: Mangle,
    /// Milliseconds the clock moves before this frame.
    advance: u64,
}

fn conn() -> impl Strategy<Value = Conn> {
    (0..CLIENTS.len(), 40001u16..40004, 0..TARGETS.len()).prop_map(|(client, port, target)| {
        // Mostly the clients with neighbours.
        let client = if client >= 2 && port != 40001 {
            client - 2
        } else {
            client
        };
        Conn {
            client,
            port,
            target,
        }
    })
}

fn flags() -> impl Strategy<Value = Flags> {
    prop_oneof![
        6 => Just(Flags::Script),
        1 => prop::sample::select(vec![
            0x02u8, 0x12, 0x10, 0x18, 0x11, 0x01, 0x04, 0x14, 0x03, 0x06, 0x13, 0x00, 0x16, 0x1a
        ])
        .prop_map(Flags::Raw),
        1 => any::<u8>().prop_map(Flags::Raw),
    ]
}

fn mangle() -> impl Strategy<Value = Mangle> {
    let some = (
        prop_oneof![3 => Just(0u8), 1 => 1u8..=10],
        prop::option::weighted(
            0.2,
            prop::sample::select(vec![0x4000u16, 0x2000, 0x0001, 0x2010, 0x00b9, 0x1fff]),
        ),
        prop::option::weighted(0.15, 0u8..16),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::option::weighted(0.15, 0u16..4096),
        prop_oneof![3 => Just(0u8), 1 => 1u8..=20],
        prop::option::weighted(0.1, 0u16..1000),
        prop::option::weighted(0.1, prop::sample::select(vec![6u8, 17, 47, 1])),
    )
        .prop_map(
            |(options, frag, doff, udp_zero, bad_l4, bad_ip, vlan, pad, truncate, other_proto)| {
                Mangle {
                    options,
                    frag,
                    doff,
                    udp_zero,
                    bad_l4,
                    bad_ip,
                    vlan,
                    pad,
                    truncate,
                    other_proto,
                }
            },
        );
    prop_oneof![3 => Just(Mangle::default()), 2 => some]
}

fn step(conns: usize) -> impl Strategy<Value = Step> {
    (
        0..conns,
        prop::bool::weighted(0.3),
        flags(),
        prop_oneof![8 => Just(64u8), 1 => 0u8..=2, 1 => any::<u8>()],
        mangle(),
        prop_oneof![
            6 => Just(0u64),
            3 => 1u64..2_000,
            1 => prop::sample::select(vec![31_000u64, 61_000, 121_000, 301_000, 901_000]),
        ],
    )
        .prop_map(|(conn, from_backend, flags, ttl, mangle, advance)| Step {
            conn,
            from_backend,
            flags,
            ttl,
            mangle,
            advance,
        })
}

/// A case: 1-4 connections and up to 32 steps on them.
fn case() -> impl Strategy<Value = (Vec<Conn>, Vec<Step>)> {
    prop::collection::vec(conn(), 1..=4).prop_flat_map(|conns| {
        let n = conns.len();
        (Just(conns), prop::collection::vec(step(n), 1..=32))
    })
}

/// What the runner remembers per connection.
#[derive(Clone, Copy, Debug, Default)]
struct ConnState {
    /// Next [`SCRIPT`] position.
    script: usize,
    /// The sequence number of the last SYN-ACK the client received (the SYN proxy's cookie).
    cookie: Option<u32>,
}

const CLIENT_ISN: u32 = 0x1000_0000;
const BACKEND_ISN: u32 = 0x7000_0000;

fn ip4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn set_ip_checksum(f: &mut [u8], l3: usize) {
    let ihl = usize::from(f[l3] & 0x0f) * 4;
    f[l3 + 10..l3 + 12].fill(0);
    let c = checksum::checksum(&f[l3..l3 + ihl]);
    f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

/// The frame of `step` on `conn`, given what the general pipeline's table says of the flow.
fn materialize(general: &Pipeline, conns: &[Conn], states: &mut [ConnState], s: &Step) -> Vec<u8> {
    let c = conns[s.conn];
    let t = &TARGETS[c.target];
    let st = &mut states[s.conn];
    let (from_backend, flags) = match s.flags {
        Flags::Script => {
            let (b, f) = SCRIPT[st.script % SCRIPT.len()];
            st.script += 1;
            (b, f)
        }
        Flags::Raw(f) => (s.from_backend, f),
    };
    let client = SocketAddr::new(IpAddr::V4(ip4(CLIENTS[c.client])), c.port);
    let vip = sa(t.dst);
    let proto = if t.tcp { Protocol::Tcp } else { Protocol::Udp };
    let key = FlowKey::new(proto, client, vip).unwrap();
    let (src, dst, smac) = if from_backend {
        // The flow's reply tuple, or the one it would have.
        let flows = general.flows();
        let (backend, to) = match flows.lookup(&key).and_then(|(h, _)| flows.get(h)) {
            Some(v) => (v.data.backend, v.data.snat),
            None => {
                let b = sa(t.backend.unwrap_or("198.18.1.1:8080"));
                let to = if t.fullnat {
                    sa("198.18.1.254:40000")
                } else {
                    client
                };
                (b, to)
            }
        };
        (backend, to, B1_MAC)
    } else {
        (client, vip, CLIENT_MAC)
    };
    let (IpAddr::V4(s4), IpAddr::V4(d4)) = (src.ip(), dst.ip()) else {
        unreachable!("IPv4 fixture")
    };
    let ip = PacketBuilder::ethernet2(smac, XVS_MAC).ipv4(s4.octets(), d4.octets(), s.ttl);
    let mut out = Vec::new();
    let m = &s.mangle;
    let tcp = match m.other_proto {
        Some(6) => true,
        Some(_) => false,
        None => t.tcp,
    };
    match m.other_proto {
        Some(p) if p != 6 && p != 17 => {
            ip.write(&mut out, IpNumber(p), PAYLOAD).unwrap();
        }
        _ if tcp => {
            let isn = if from_backend {
                BACKEND_ISN
            } else {
                CLIENT_ISN
            };
            let seq = if flags & 0x02 != 0 { isn } else { isn + 1 };
            let mut h = TcpHeader::new(src.port(), dst.port(), seq, 64240);
            h.fin = flags & 0x01 != 0;
            h.syn = flags & 0x02 != 0;
            h.rst = flags & 0x04 != 0;
            h.psh = flags & 0x08 != 0;
            h.ack = flags & 0x10 != 0;
            h.urg = flags & 0x20 != 0;
            h.ece = flags & 0x40 != 0;
            h.cwr = flags & 0x80 != 0;
            if h.ack {
                h.acknowledgment_number = match (from_backend, st.cookie) {
                    (false, Some(cookie)) => cookie.wrapping_add(1),
                    (false, None) => BACKEND_ISN + 1,
                    (true, _) => CLIENT_ISN + 1,
                };
            }
            ip.tcp_header(h).write(&mut out, PAYLOAD).unwrap();
        }
        _ => {
            ip.udp(src.port(), dst.port())
                .write(&mut out, PAYLOAD)
                .unwrap();
        }
    }
    mangle_frame(&mut out, m, tcp);
    out
}

/// Applies `m` to an untagged IPv4 frame whose L4 is TCP when `tcp`, else UDP (or other).
fn mangle_frame(f: &mut Vec<u8>, m: &Mangle, tcp: bool) {
    const L3: usize = 14;
    let proto = f[L3 + 9];
    if m.options > 0 {
        let n = usize::from(m.options) * 4;
        let at = L3 + 20;
        f.splice(at..at, std::iter::repeat_n(1u8, n));
        f[L3] = 0x40 | (5 + m.options);
        let total = u16::from_be_bytes([f[L3 + 2], f[L3 + 3]]) + n as u16;
        f[L3 + 2..L3 + 4].copy_from_slice(&total.to_be_bytes());
    }
    if let Some(v) = m.frag {
        f[L3 + 6..L3 + 8].copy_from_slice(&v.to_be_bytes());
    }
    set_ip_checksum(f, L3);
    let l4 = L3 + usize::from(f[L3] & 0x0f) * 4;
    if let Some(d) = m.doff
        && tcp
        && proto == 6
    {
        f[l4 + 12] = d << 4 | (f[l4 + 12] & 0x0f);
    }
    if m.udp_zero && proto == 17 {
        f[l4 + 6..l4 + 8].fill(0);
    }
    if m.bad_l4 {
        let at = match proto {
            6 => l4 + 16,
            17 => l4 + 6,
            _ => l4,
        };
        f[at] ^= 0x5a;
    }
    if m.bad_ip {
        f[L3 + 10] ^= 0x21;
    }
    if let Some(tci) = m.vlan {
        let tag = [0x81, 0x00, (tci >> 8) as u8, tci as u8];
        f.splice(12..12, tag);
    }
    f.extend(std::iter::repeat_n(0u8, usize::from(m.pad)));
    if let Some(permille) = m.truncate {
        let n = f.len() * usize::from(permille) / 1000;
        f.truncate(n);
    }
}

/// After a transmitted frame: a SYN-ACK to a client is remembered as its cookie (the SYN
/// proxy's, or the backend's through a nat/fullnat flow: its ACK number is then echoed).
fn note_output(conns: &[Conn], states: &mut [ConnState], buf: &[u8], len: usize) {
    let f = &buf[..len];
    if f.len() < 54 || f[12..14] != [0x08, 0x00] || f[23] != 6 || f[14] != 0x45 {
        return;
    }
    let flags = f[47];
    if flags & 0x12 != 0x12 {
        return;
    }
    let src = SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(f[26], f[27], f[28], f[29])),
        u16::from_be_bytes([f[34], f[35]]),
    );
    let dst = Ipv4Addr::new(f[30], f[31], f[32], f[33]);
    let dport = u16::from_be_bytes([f[36], f[37]]);
    let seq = u32::from_be_bytes([f[38], f[39], f[40], f[41]]);
    for (c, st) in conns.iter().zip(states.iter_mut()) {
        if ip4(CLIENTS[c.client]) == dst && c.port == dport && sa(TARGETS[c.target].dst) == src {
            st.cookie = Some(seq);
        }
    }
}

/// Every live flow of `p`'s table, in entry order.
fn flows(p: &Pipeline) -> Vec<FlowView> {
    let mut v = Vec::new();
    p.flows().scan(0, p.flows().capacity(), |f| v.push(f));
    v
}

/// Everything two pipelines that saw the same frames must agree on.
fn assert_same_state(fast: &Pipeline, general: &Pipeline, what: &str) {
    assert_eq!(
        fast.counters(),
        general.counters(),
        "{what}: counters (fast vs general)"
    );
    assert_eq!(
        flows(fast),
        flows(general),
        "{what}: flows (fast vs general)"
    );
    assert_eq!(
        fast.flows().len(),
        general.flows().len(),
        "{what}: flow count"
    );
    for id in 0..64 {
        assert_eq!(
            fast.traffic().get(BackendId(id)),
            general.traffic().get(BackendId(id)),
            "{what}: traffic of backend {id}"
        );
    }
}

fn pipeline(epoch: Instant) -> Pipeline {
    pipeline_from(&config(), epoch)
}

fn describe(conns: &[Conn], s: &Step, frame: &[u8]) -> String {
    format!(
        "step {s:?} on {:?}\nframe {}",
        conns[s.conn],
        frame.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// Frames with room after them, for `process_batch`.
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

/// Three pipelines over the same steps, in batches of `sizes` (cycled; a batch's frames
/// share its clock): the general one frame by frame with `process_frame_general` (the
/// reference; the frames are made from its flows), one with `process_frame` frame by frame,
/// one with `process_batch`. Both are compared with the reference after every frame (the
/// batch: after every batch).
fn run(conns: &[Conn], steps: &[Step], sizes: &[usize]) {
    let epoch = Instant::now();
    let (mut general, mut fast, mut batched) = (pipeline(epoch), pipeline(epoch), pipeline(epoch));
    let mut states = vec![ConnState::default(); conns.len()];
    let mut now = epoch;
    let mut i = 0;
    for &size in sizes.iter().cycle() {
        if i >= steps.len() {
            break;
        }
        let batch = &steps[i..(i + size).min(steps.len())];
        now += Duration::from_millis(batch[0].advance);
        let mut bufs = Vec::new();
        let mut lens = Vec::new();
        let mut whats = Vec::new();
        let mut expect = Vec::new();
        for (k, s) in batch.iter().enumerate() {
            let at = i + k;
            let frame = materialize(&general, conns, &mut states, s);
            let what = describe(conns, s, &frame);
            let mut buf = frame.clone();
            buf.resize(frame.len() + ROOM, 0);
            bufs.push(buf.clone());
            lens.push(frame.len());
            let mut fast_buf = buf.clone();
            let (mut len, mut fast_len) = (frame.len(), frame.len());
            let v = general.process_frame_general(&mut buf, &mut len, now);
            let fast_v = fast.process_frame(&mut fast_buf, &mut fast_len, now);
            assert_eq!(fast_v, v, "frame {at}: verdict (fast vs general)\n{what}");
            assert_eq!(
                fast_len, len,
                "frame {at}: length (fast vs general)\n{what}"
            );
            assert_eq!(fast_buf, buf, "frame {at}: bytes (fast vs general)\n{what}");
            match v {
                Verdict::Tx(_) => note_output(conns, &mut states, &buf, len),
                Verdict::Reject { .. } => assert_answers(&frame, &buf[..len], &what),
                _ => assert_eq!(
                    &buf[..frame.len()],
                    &frame[..],
                    "frame {at}: left as it came"
                ),
            }
            assert_same_state(&fast, &general, &format!("after frame {at}\n{what}"));
            whats.push(what);
            expect.push((v, buf, len));
        }
        let mut verdicts = vec![Verdict::Pass; batch.len()];
        batched.process_batch(
            &mut Roomy {
                bufs: &mut bufs,
                lens: &mut lens,
            },
            now,
            &mut verdicts,
        );
        for (k, (v, buf, len)) in expect.iter().enumerate() {
            let at = i + k;
            let what = &whats[k];
            assert_eq!(
                verdicts[k], *v,
                "frame {at} (batch of {size}): verdict (batch vs general)\n{what}"
            );
            // A transmitted frame's length is set; others keep theirs.
            assert_eq!(
                lens[k], *len,
                "frame {at}: length (batch vs general)\n{what}"
            );
            assert_eq!(
                &bufs[k], buf,
                "frame {at} (batch of {size}): bytes (batch vs general)\n{what}"
            );
        }
        assert_same_state(
            &batched,
            &general,
            &format!("after the batch of {size} at frame {i} (batch vs general)"),
        );
        i += batch.len();
    }
}

/// A reject `reply` answers `frame`: addressed back to its sender from the address it was
/// sent to, with valid checksums.
fn assert_answers(frame: &[u8], reply: &[u8], what: &str) {
    let addrs = |f: &[u8]| {
        let p = etherparse::SlicedPacket::from_ethernet(f).expect("parses");
        match p.net {
            Some(etherparse::NetSlice::Ipv4(v4)) => (
                IpAddr::V4(v4.header().source_addr()),
                IpAddr::V4(v4.header().destination_addr()),
            ),
            Some(etherparse::NetSlice::Ipv6(v6)) => (
                IpAddr::V6(v6.header().source_addr()),
                IpAddr::V6(v6.header().destination_addr()),
            ),
            _ => panic!("not IP: {what}"),
        }
    };
    let (src, dst) = addrs(frame);
    assert_eq!(
        addrs(reply),
        (dst, src),
        "a reject answers its sender\n{what}"
    );
    if frame.get(12..14) == Some(&[0x08, 0x00]) {
        verify_checksums(reply, what);
    }
}

proptest! {
    // (Each case builds three pipelines, whose traffic counters alone are 72 MB to zero:
    // 96 cases keep the test within seconds.)
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn fast_path_and_batch_equal_general_path(
        (conns, steps) in case(),
        sizes in prop::collection::vec(1usize..=40, 1..=4),
    ) {
        run(&conns, &steps, &sizes);
    }
}

/// The generators reach what the property is about: new flows of both modes, hits both
/// ways, the SYN proxy's cookie answered, port reuse, and the general path's own verdicts.
#[test]
fn the_scripted_handshakes_reach_every_path() {
    let epoch = Instant::now();
    let (mut fast, mut general) = (pipeline(epoch), pipeline(epoch));
    let conns: Vec<Conn> = (0..9)
        .map(|target| Conn {
            client: target % 2,
            port: 40001 + target as u16,
            target,
        })
        .collect();
    let mut steps = Vec::new();
    for _ in 0..SCRIPT.len() {
        for conn in 0..conns.len() {
            steps.push(Step {
                conn,
                from_backend: false,
                flags: Flags::Script,
                ttl: 64,
                mangle: Mangle::default(),
                advance: 10,
            });
        }
    }
    let mut states = vec![ConnState::default(); conns.len()];
    let mut now = epoch;
    for s in &steps {
        now += Duration::from_millis(s.advance);
        let frame = materialize(&general, &conns, &mut states, s);
        let mut a = frame.clone();
        a.resize(frame.len() + ROOM, 0);
        let mut b = a.clone();
        let (mut la, mut lb) = (frame.len(), frame.len());
        let va = fast.process_frame(&mut a, &mut la, now);
        let vb = general.process_frame_general(&mut b, &mut lb, now);
        assert_eq!((va, la, &a), (vb, lb, &b));
        if let Verdict::Tx(_) = vb {
            note_output(&conns, &mut states, &b, lb);
        }
    }
    assert_same_state(&fast, &general, "scripted");
    let c = general.counters();
    assert!(c.tx >= 40, "most scripted frames are forwarded: {c:?}");
    assert!(c.new_flows >= 7, "a flow per service at least: {c:?}");
    assert!(
        c.reused >= 4,
        "the closing SYNs reopen the TCP flows: {c:?}"
    );
    assert!(c.synproxy_syns >= 1 && c.synproxy_acks >= 1, "{c:?}");
    let dsr = flows(&general)
        .iter()
        .filter(|v| v.data.flags & fastpath::pipeline::FLAG_DSR != 0)
        .count();
    assert!(dsr >= 2, "the DSR services' flows: {dsr}");
}
