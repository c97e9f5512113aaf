//! Zero allocations per packet: a counting global allocator (this test binary only) counts
//! allocations made by the test thread while 1M frames of established flows and their replies
//! go through `Pipeline::process`, and while batches go through `Pipeline::process_batch`.
//! The batches also check that `process_batch` gives what `process` gives frame by frame,
//! new flows (staged inserts) included.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use fastpath::pipeline::{Counters, DropReason, Pipeline, PipelineConfig, Verdict};
use fastpath::settings::flow_table_config;
use fastpath::snapshot::SnapshotBuilder;
use fastpath::testing::*;
use flowtable::FlowTable;
use lb_algos::AffinityTable;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNTING.with(|c| c.get()) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Established flows in both modes and families, their replies, UDP, a drop and a pass;
/// the SYNs that open the TCP flows go through `p`.
fn traffic(p: &mut fastpath::pipeline::Pipeline, epoch: Instant) -> Vec<Vec<u8>> {
    // Established flows in both modes and families, their replies, and a few other verdicts.
    let mut frames = Vec::new();
    for i in 0..64u16 {
        let c4 = format!("198.18.0.1:{}", 20000 + i);
        let c6 = format!("[2001:2::1]:{}", 20000 + i);
        let mut syn = frame(CLIENT_MAC, XVS_MAC, sa(&c4), sa("198.18.100.1:80"), 64, SYN);
        assert_eq!(p.process(&mut syn, epoch), Verdict::Tx(0));
        let snat = format!("198.18.1.254:{}", u16::from_be_bytes([syn[34], syn[35]]));
        frames.push(frame(
            CLIENT_MAC,
            XVS_MAC,
            sa(&c4),
            sa("198.18.100.1:80"),
            64,
            ACK,
        ));
        frames.push(frame(
            B1_MAC,
            XVS_MAC,
            sa("198.18.1.1:8080"),
            sa(&snat),
            64,
            ACK,
        ));
        let mut syn = frame(CLIENT_MAC, XVS_MAC, sa(&c4), sa("198.18.100.2:80"), 64, SYN);
        assert_eq!(p.process(&mut syn, epoch), Verdict::Tx(0));
        frames.push(frame(
            CLIENT_MAC,
            XVS_MAC,
            sa(&c4),
            sa("198.18.100.2:80"),
            64,
            ACK,
        ));
        frames.push(frame(
            B2_MAC,
            XVS_MAC,
            sa("198.18.1.2:8080"),
            sa(&c4),
            64,
            ACK,
        ));
        let mut syn = frame(
            CLIENT_MAC,
            XVS_MAC,
            sa(&c6),
            sa("[2001:2:0:100::1]:80"),
            64,
            SYN,
        );
        assert_eq!(p.process(&mut syn, epoch), Verdict::Tx(0));
        frames.push(frame(
            CLIENT_MAC,
            XVS_MAC,
            sa(&c6),
            sa("[2001:2:0:100::1]:80"),
            64,
            ACK,
        ));
        frames.push(frame(
            CLIENT_MAC,
            XVS_MAC,
            sa(&c4),
            sa("198.18.100.54:53"),
            64,
            L4::Udp,
        ));
    }
    frames.push(frame(
        CLIENT_MAC,
        XVS_MAC,
        sa("198.18.0.9:1"),
        sa("198.18.100.1:80"),
        64,
        ACK,
    )); // drop
    frames.push(frame(
        CLIENT_MAC,
        XVS_MAC,
        sa("198.18.0.9:1"),
        sa("198.18.0.7:80"),
        64,
        ACK,
    )); // pass
    frames
}

#[test]
fn one_million_frames_allocate_nothing() {
    let epoch = Instant::now();
    let mut p = pipeline(epoch);
    let frames = traffic(&mut p, epoch);
    let mut buf = vec![0u8; 2048];
    // Warm-up pass (UDP flows get created here).
    for f in &frames {
        buf[..f.len()].copy_from_slice(f);
        p.process(&mut buf[..f.len()], epoch);
    }
    let n = 1_000_000usize;
    let mut tx = 0u64;
    COUNTING.with(|c| c.set(true));
    for i in 0..n {
        let f = &frames[i % frames.len()];
        buf[..f.len()].copy_from_slice(f);
        let now = at(epoch, (i / 1000) as u64);
        if let Verdict::Tx(_) = p.process(&mut buf[..f.len()], now) {
            tx += 1;
        }
    }
    COUNTING.with(|c| c.set(false));
    let allocs = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(allocs, 0, "allocations during {n} frames");
    assert!(tx as usize > n * 9 / 10, "{tx} of {n} transmitted");
}

#[test]
fn batches_match_single_frames_and_allocate_nothing() {
    let epoch = Instant::now();
    let (mut single, mut batched) = (pipeline(epoch), pipeline(epoch));
    let frames = traffic(&mut single, epoch);
    assert_eq!(traffic(&mut batched, epoch), frames);
    let mut bufs = vec![[0u8; 256]; 37];
    let mut verdicts = [Verdict::Pass; 37];
    let mut k = 0;
    for round in 0..200usize {
        let now = at(epoch, round as u64 * 7);
        // Odd batch sizes, so chunks end mid-way and flows repeat within a batch.
        let n = 1 + round % 37;
        let idx: Vec<usize> = (0..n).map(|j| (k + j * 5) % frames.len()).collect();
        k += n;
        let lens: Vec<usize> = idx.iter().map(|&i| frames[i].len()).collect();
        for (b, &i) in bufs.iter_mut().zip(&idx) {
            b[..frames[i].len()].copy_from_slice(&frames[i]);
        }
        {
            let mut views: Vec<&mut [u8]> = bufs
                .iter_mut()
                .zip(&lens)
                .map(|(b, &len)| &mut b[..len])
                .collect();
            COUNTING.with(|c| c.set(true));
            batched.process_batch(&mut views[..], now, &mut verdicts[..n]);
            COUNTING.with(|c| c.set(false));
        }
        for (j, &i) in idx.iter().enumerate() {
            let mut f = frames[i].clone();
            let v = single.process(&mut f, now);
            assert_eq!(verdicts[j], v, "round {round} frame {j}");
            assert_eq!(&bufs[j][..f.len()], &f[..], "round {round} frame {j}");
        }
    }
    assert_eq!(single.counters(), batched.counters());
    assert_eq!(
        ALLOCS.load(Ordering::Relaxed),
        0,
        "allocations in process_batch"
    );
}

/// `process_at` with one `clock` reading for many frames gives what `process` gives frame
/// by frame at the same instant (verdicts, bytes, counters, flows with their last-seen
/// times), and allocates nothing. The clock moves 250 ms a round, so every round is a new
/// flow-table tick.
#[test]
fn process_at_matches_process_and_allocates_nothing() {
    let epoch = Instant::now();
    let (mut single, mut clocked) = (pipeline(epoch), pipeline(epoch));
    let frames = traffic(&mut single, epoch);
    assert_eq!(traffic(&mut clocked, epoch), frames);
    let mut buf = vec![0u8; 2048];
    for round in 0..120usize {
        let now = at(epoch, round as u64 * 250);
        let clock = clocked.clock(now);
        assert_eq!(clock.instant(), now);
        for (j, f) in frames.iter().enumerate().skip(round % 3) {
            buf[..f.len()].copy_from_slice(f);
            COUNTING.with(|c| c.set(true));
            let v = clocked.process_at(&mut buf[..f.len()], clock);
            COUNTING.with(|c| c.set(false));
            let mut want = f.clone();
            assert_eq!(v, single.process(&mut want, now), "round {round} frame {j}");
            assert_eq!(&buf[..f.len()], &want[..], "round {round} frame {j}");
        }
    }
    assert_eq!(single.counters(), clocked.counters());
    let flows = |p: &fastpath::pipeline::Pipeline| {
        let mut v = Vec::new();
        p.flows().scan(0, p.flows().capacity(), |f| v.push(f));
        v
    };
    let (a, b) = (flows(&single), flows(&clocked));
    assert!(!a.is_empty());
    assert_eq!(a, b, "flows (states, last-seen times)");
    assert_eq!(
        ALLOCS.load(Ordering::Relaxed),
        0,
        "allocations in process_at"
    );
}

/// UDP datagrams in frames of 42 to 53 bytes (no Ethernet padding), too short for the fixed-
/// offset shortcut since it wants a TCP header's room (`fast::parse`): through `process` they
/// take the general path and get exactly what `process_general` gives them, new flow and hit.
#[test]
fn frames_too_short_for_the_shortcut_get_the_general_paths_result() {
    let epoch = Instant::now();
    let (mut p, mut general) = (pipeline(epoch), pipeline(epoch));
    for round in 0..2 {
        for payload in 0..12usize {
            let mut f = Vec::new();
            etherparse::PacketBuilder::ethernet2(CLIENT_MAC, XVS_MAC)
                .ipv4([198, 18, 0, 1], [198, 18, 100, 53], 64)
                .udp(30000 + payload as u16, 53)
                .write(&mut f, &vec![0x5a; payload])
                .unwrap();
            assert_eq!(f.len(), 42 + payload);
            let mut g = f.clone();
            let v = p.process(&mut f, epoch);
            assert_eq!(v, general.process_general(&mut g, epoch), "{payload} bytes");
            assert_eq!(v, Verdict::Tx(0), "round {round}, {payload} bytes");
            assert_eq!(f, g, "round {round}, {payload} bytes");
        }
    }
    assert_eq!(p.counters(), general.counters());
    assert_eq!(p.counters().new_flows, 12);
    assert_eq!(p.flows().len(), general.flows().len());
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Frames for the staged new-flow path of `process_batch`: SYNs of new flows (fullnat, nat,
/// two backends, IPv6), UDP, mh non-SYNs, their duplicates, RSTs and ACKs right behind
/// them, replies to SNAT ports that flows of the same batch may just have taken, FINs both
/// ways (so that flows reach TIME_WAIT, or CLOSE after a reset, and a later SYN of the same
/// client port reuses them), and a few drops, passes and slow frames; clients from a small
/// pool so that all of these meet within batches.
fn new_flow_frame(rng: &mut Rng) -> Vec<u8> {
    let c = rng.below(48);
    let c4 = format!("198.18.0.{}:{}", 1 + c % 6, 30000 + c);
    let c6 = format!("[2001:2::{}]:{}", 1 + c % 6, 30000 + c);
    let client = |vip: &str, l4: L4| frame(CLIENT_MAC, XVS_MAC, sa(&c4), sa(vip), 64, l4);
    match rng.below(20) {
        16 => client("198.18.100.1:80", FIN),
        17 => {
            // The web backend closing on a SNAT port of the first ones taken.
            let snat = format!("198.18.1.254:{}", 40000 + rng.below(48));
            frame(B1_MAC, XVS_MAC, sa("198.18.1.1:8080"), sa(&snat), 64, FIN)
        }
        18 => {
            // nat: client FIN, the backend's FIN (to the client), or an ACK opening the
            // client's flow.
            let vip = "198.18.100.2:80";
            match rng.below(3) {
                0 => client(vip, FIN),
                1 => frame(B2_MAC, XVS_MAC, sa("198.18.1.2:8080"), sa(&c4), 64, FIN),
                _ => client(vip, ACK),
            }
        }
        19 => client("198.18.100.7:443", SYN), // mh: reuses the CLOSE flows ACKs open
        0..=2 => client("198.18.100.1:80", SYN),
        3 => client("198.18.100.1:80", L4::Tcp(0x04)), // RST
        4 => client("198.18.100.1:80", ACK),
        5 => client("198.18.100.2:80", SYN),  // nat
        6 => client("198.18.100.20:80", SYN), // two backends
        7 => client("198.18.100.7:443", ACK), // mh: a non-SYN opens
        8 => client("198.18.100.53:53", L4::Udp),
        9 => client("198.18.100.54:53", L4::Udp),
        10 | 11 => {
            // The web backend answering on a SNAT port of the first ones taken.
            let snat = format!("198.18.1.254:{}", 40000 + rng.below(48));
            frame(B1_MAC, XVS_MAC, sa("198.18.1.1:8080"), sa(&snat), 64, ACK)
        }
        12 => frame(
            CLIENT_MAC,
            XVS_MAC,
            sa(&c6),
            sa("[2001:2:0:100::1]:80"),
            64,
            SYN,
        ),
        13 => client("198.18.100.1:80", L4::Tcp(0x12)), // SYN-ACK: no flow opens
        14 => frame(CLIENT_MAC, XVS_MAC, sa(&c4), sa("198.18.100.1:80"), 1, SYN), // TTL
        _ => client("198.18.100.97:80", SYN),           // next hop unknown: slow
    }
}

/// `batches` batches of 1, 2, ... 40 frames from `next_frame`, every fifth frame a
/// duplicate of the one before.
fn random_batches(batches: usize, mut next_frame: impl FnMut() -> Vec<u8>) -> Vec<Vec<Vec<u8>>> {
    (0..batches)
        .map(|round| {
            let mut frames: Vec<Vec<u8>> = Vec::new();
            for j in 0..1 + round % 40 {
                let f = if j % 5 == 4 {
                    frames[j - 1].clone()
                } else {
                    next_frame()
                };
                frames.push(f);
            }
            frames
        })
        .collect()
}

/// Runs `batches` through `batched` (`process_batch`) and `single` (`process`, frame by
/// frame) and checks they agree frame by frame (verdicts, bytes, counters, flow count) and
/// that `process_batch` allocates nothing; returns the counters.
fn batched_new_flows_match(
    mut single: Pipeline,
    mut batched: Pipeline,
    batches: &[Vec<Vec<u8>>],
    new_flows_min: u64,
) -> Counters {
    let epoch = single.flows().epoch();
    let mut bufs = vec![[0u8; 256]; 40];
    let mut verdicts = [Verdict::Pass; 40];
    for (round, frames) in batches.iter().enumerate() {
        let now = at(epoch, round as u64);
        let n = frames.len();
        for (b, f) in bufs.iter_mut().zip(frames) {
            b[..f.len()].copy_from_slice(f);
        }
        {
            let mut views: Vec<&mut [u8]> = bufs
                .iter_mut()
                .zip(frames)
                .map(|(b, f)| &mut b[..f.len()])
                .collect();
            COUNTING.with(|c| c.set(true));
            batched.process_batch(&mut views[..], now, &mut verdicts[..n]);
            COUNTING.with(|c| c.set(false));
        }
        for (j, f) in frames.iter().enumerate() {
            let mut f = f.clone();
            let v = single.process(&mut f, now);
            assert_eq!(verdicts[j], v, "round {round} frame {j}");
            assert_eq!(&bufs[j][..f.len()], &f[..], "round {round} frame {j}");
            if let Verdict::Tx(_) = v {
                verify_checksums(&f, &format!("round {round} frame {j}"));
            }
        }
        assert_eq!(single.counters(), batched.counters(), "round {round}");
        assert_eq!(single.flows().len(), batched.flows().len(), "round {round}");
    }
    let c = batched.counters();
    assert!(c.new_flows >= new_flows_min, "{c:?}");
    assert_eq!(
        ALLOCS.load(Ordering::Relaxed),
        0,
        "allocations in process_batch"
    );
    c.clone()
}

/// Two pipelines from `toml`; `ports` overrides the SNAT port slice.
fn two_pipelines(toml: &str, ports: Option<(u16, u16)>) -> (Pipeline, Pipeline) {
    let epoch = Instant::now();
    let make = || {
        let cfg = config::parse(toml, "fixture.toml").unwrap();
        let snapshot = SnapshotBuilder::from_config(&cfg)
            .build_config(&cfg)
            .unwrap();
        let flows = FlowTable::new(flow_table_config(&cfg), epoch).unwrap();
        let mut pc = PipelineConfig::from_config(&cfg, 0, 1);
        pc.mac = XVS_MAC;
        if let Some(p) = ports {
            pc.snat_ports = p;
        }
        let affinity = AffinityTable::new(1024, epoch);
        Pipeline::new(pc, Arc::new(flows), Arc::new(affinity), Arc::new(snapshot))
    };
    (make(), make())
}

/// `f` (IPv4) with four NOP option bytes in its IP header: a frame for the general path.
fn with_ip_options(f: &[u8]) -> Vec<u8> {
    let mut out = f[..34].to_vec();
    out.extend_from_slice(&[1, 1, 1, 1]);
    out.extend_from_slice(&f[34..]);
    out[14] = 0x46;
    let total = u16::from_be_bytes([out[16], out[17]]) + 4;
    out[16..18].copy_from_slice(&total.to_be_bytes());
    out[24..26].fill(0);
    let c = fastpath::wire::checksum::checksum(&out[14..38]);
    out[24..26].copy_from_slice(&c.to_be_bytes());
    out
}

fn syn(client: &str, vip: &str) -> Vec<u8> {
    frame(CLIENT_MAC, XVS_MAC, sa(client), sa(vip), 64, SYN)
}

#[test]
fn batched_new_flows_match_single_frames_and_allocate_nothing() {
    // Fewer fullnat flows than SNAT ports (1000): no port is ever found taken by an older
    // flow, the one case where a batch may pick another port (see `process_batch`).
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let batches = random_batches(120, || new_flow_frame(&mut rng));
    let (single, batched) = two_pipelines(CONFIG, None);
    let c = batched_new_flows_match(single, batched, &batches, 200);
    // Port reuse (TIME_WAIT or CLOSE flows ended by a SYN) happened in batches too.
    assert!(c.reused >= 10, "{c:?}");
}

#[test]
fn a_reply_and_a_reset_behind_their_syns_in_one_batch() {
    let reply = |port: u16| {
        let snat = format!("198.18.1.254:{port}");
        frame(B1_MAC, XVS_MAC, sa("198.18.1.1:8080"), sa(&snat), 64, ACK)
    };
    let batches = vec![
        // The first flow takes SNAT port 40000; the backend's answer right behind it.
        vec![syn("198.18.0.1:1000", "198.18.100.1:80"), reply(40000)],
        // A SYN, its duplicate and its reset; then a SYN whose flow another one resets.
        vec![
            syn("198.18.0.1:1001", "198.18.100.1:80"),
            syn("198.18.0.1:1001", "198.18.100.1:80"),
            frame(
                CLIENT_MAC,
                XVS_MAC,
                sa("198.18.0.1:1001"),
                sa("198.18.100.1:80"),
                64,
                L4::Tcp(0x04),
            ),
            syn("198.18.0.1:1002", "198.18.100.1:80"),
            reply(40002),
        ],
        // The answer to a new flow, with IP options (the general path).
        vec![
            syn("198.18.0.1:1003", "198.18.100.1:80"),
            with_ip_options(&reply(40003)),
        ],
    ];
    let (single, batched) = two_pipelines(CONFIG, None);
    batched_new_flows_match(single, batched, &batches, 4);
}

#[test]
fn batched_new_flows_sharing_reply_tuples_match_single_frames() {
    // Two nat services share a backend: a client port opening both has one reply tuple for
    // two flows, often within one chunk. Four SNAT ports (a slice smaller than the config
    // allows, as a hand-made `PipelineConfig` may have): a chunk's fifth fullnat flow wants
    // the port of one still waiting; later ones find every port taken.
    let toml = CONFIG.to_string()
        + r#"
[[services]]
name = "webnat2"
vip = "198.18.100.3"
port = 80
protocol = "tcp"
scheduler = "rr"
mode = "nat"
backends = [{ addr = "198.18.1.2:8080" }]
"#;
    let mut rng = Rng(7);
    let batches = random_batches(40, || {
        let c = rng.below(300);
        let vip = ["198.18.100.1:80", "198.18.100.2:80", "198.18.100.3:80"][rng.below(3) as usize];
        syn(&format!("198.18.0.{}:{}", 1 + c % 3, 20000 + c), vip)
    });
    let (single, batched) = two_pipelines(&toml, Some((40000, 40003)));
    batched_new_flows_match(single, batched, &batches, 30);
}

/// A client → VIP frame with TCP flags `l4`.
fn from_client(client: &str, vip: &str, l4: L4) -> Vec<u8> {
    frame(CLIENT_MAC, XVS_MAC, sa(client), sa(vip), 64, l4)
}

/// The web backend → a SNAT port, TCP flags `l4`.
fn from_web(port: u16, l4: L4) -> Vec<u8> {
    let snat = format!("198.18.1.254:{port}");
    frame(B1_MAC, XVS_MAC, sa("198.18.1.1:8080"), sa(&snat), 64, l4)
}

#[test]
fn a_syn_reusing_a_time_wait_flow_in_a_batch_matches_single_frames() {
    // Two SNAT ports. The first flow takes 40000 and closes to TIME_WAIT, a second one
    // takes 40001 (and stays): the cursor is back at 40000.
    let web = "198.18.100.1:80";
    let mh = "198.18.100.7:443";
    let (a, b, late) = ("198.18.0.1:1000", "198.18.0.1:1001", "198.18.0.1:2000");
    let batches = vec![
        vec![syn(a, web)],
        vec![
            from_web(40000, SYNACK),
            from_client(a, web, ACK),
            from_client(a, web, FIN),
            from_web(40000, ACK),
            from_web(40000, FIN),
            from_client(a, web, ACK),
        ],
        vec![
            syn(b, web),
            from_web(40001, SYNACK),
            from_client(b, web, ACK),
        ],
        // A new flow waits with port 40000 (still the TIME_WAIT flow's), then `a` reuses its
        // tuple. `process` refuses the new flow (40000 taken, 40001 too) before the reuse frees
        // 40000, which the reusing SYN then takes; a batch must finish the waiting flow
        // before the removal, or it would get 40000 itself. Then the backend's answer on
        // 40000 (the new flow's now) and a retransmitted SYN of `b` (ESTABLISHED: no reuse).
        vec![
            syn(late, web),
            syn(a, web),
            from_web(40000, SYNACK),
            syn(b, web),
        ],
        // mh: an ACK opens a flow in CLOSE (it waits, half inserted); the SYN right behind
        // it finds it being inserted, finishes it and reuses it.
        vec![
            from_client("198.18.0.1:3000", mh, ACK),
            from_client("198.18.0.1:3000", mh, SYN),
            from_client("198.18.0.1:3000", mh, ACK),
        ],
    ];
    let (single, batched) = two_pipelines(CONFIG, Some((40000, 40001)));
    let c = batched_new_flows_match(single, batched, &batches, 4);
    assert_eq!(c.reused, 2, "{c:?}");
    assert_eq!(c.dropped(DropReason::SnatPortsExhausted), 1, "{c:?}");
}

/// Frames with room after each, as UMEM frames have.
struct Roomy<'a> {
    bufs: &'a mut [Vec<u8>],
    lens: &'a mut [usize],
}

impl fastpath::pipeline::FrameBatch for Roomy<'_> {
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
fn rejects_and_their_rate_limit_allocate_nothing() {
    // RSTs (TCP to a service without backends), ICMP port unreachable (UDP to one), over the
    // default rate limit (1000/s, bursts of 50) too: frame by frame and in batches.
    let cfg = format!(
        "{CONFIG}\n[[services]]\nname = \"emptyudp\"\nvip = \"198.18.100.95\"\nport = 53\nprotocol = \"udp\"\n"
    );
    let epoch = Instant::now();
    let mut p = pipeline_from(&cfg, epoch);
    let frames = [
        from_client("198.18.0.1:1000", "198.18.100.99:80", SYN),
        from_client("198.18.0.1:1000", "198.18.100.95:53", L4::Udp),
        frame(
            CLIENT_MAC,
            XVS_MAC,
            sa("[2001:2::1]:1000"),
            sa("[2001:2:0:100::1]:80"),
            64,
            ACK,
        ),
    ];
    let mut buf = vec![0u8; 2048];
    let n = 100_000usize;
    COUNTING.with(|c| c.set(true));
    for i in 0..n {
        let f = &frames[i % 2];
        buf[..f.len()].copy_from_slice(f);
        let mut len = f.len();
        p.process_frame(&mut buf, &mut len, at(epoch, i as u64 / 20));
    }
    COUNTING.with(|c| c.set(false));
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 2048]; 64];
    let mut lens = vec![0usize; 64];
    let mut verdicts = [Verdict::Pass; 64];
    for round in 0..100u64 {
        for (k, b) in bufs.iter_mut().enumerate() {
            let f = &frames[k % 3];
            b[..f.len()].copy_from_slice(f);
            lens[k] = f.len();
        }
        COUNTING.with(|c| c.set(true));
        p.process_batch(
            &mut Roomy {
                bufs: &mut bufs,
                lens: &mut lens,
            },
            at(epoch, 10_000 + round * 20),
            &mut verdicts,
        );
        COUNTING.with(|c| c.set(false));
    }
    assert_eq!(ALLOCS.load(Ordering::Relaxed), 0, "allocations in rejects");
    let c = p.counters();
    assert!(c.rejects_total() > 5_000, "{c:?}");
    assert!(c.dropped(DropReason::RejectRateLimited) > 50_000, "{c:?}");
}

#[test]
fn dsr_encapsulation_and_too_big_answers_allocate_nothing() {
    // IPIP, GUE and L2 (IPv4 and IPv6): new flows, their established packets, and segments
    // too big once encapsulated (ICMP fragmentation needed / packet too big), frame by frame
    // and in batches.
    let dsr = |name: &str, vip: &str, port: u16, encap: &str, backend: &str| {
        format!(
            "[[services]]\nname = \"{name}\"\nvip = \"{vip}\"\nport = {port}\nprotocol = \"tcp\"\nmode = \"dsr\"\nencap = \"{encap}\"\nbackends = [{{ addr = \"{backend}\" }}]\n"
        )
    };
    let cfg = format!(
        "{CONFIG}\n{}{}{}{}",
        dsr("d1", "198.18.100.41", 80, "ipip", "198.18.1.1:80"),
        dsr("d2", "198.18.100.42", 80, "gue", "198.18.1.2:80"),
        dsr("d3", "198.18.100.43", 80, "l2", "198.18.1.3:80"),
        dsr("d6", "2001:2:0:100::41", 80, "gue", "[2001:2:0:1::1]:80"),
    );
    let epoch = Instant::now();
    let mut p = pipeline_from(&cfg, epoch);
    let big = |src: &str, dst: &str| {
        let (s, d) = (sa(src), sa(dst));
        let mut out = Vec::new();
        let eth = etherparse::PacketBuilder::ethernet2(CLIENT_MAC, XVS_MAC);
        let payload = [0x5au8; 1440];
        match (s.ip(), d.ip()) {
            (std::net::IpAddr::V4(a), std::net::IpAddr::V4(b)) => eth
                .ipv4(a.octets(), b.octets(), 64)
                .tcp(s.port(), d.port(), 1, 64240)
                .ack(2)
                .write(&mut out, &payload),
            (std::net::IpAddr::V6(a), std::net::IpAddr::V6(b)) => eth
                .ipv6(a.octets(), b.octets(), 64)
                .tcp(s.port(), d.port(), 1, 64240)
                .ack(2)
                .write(&mut out, &payload[..1420]),
            _ => unreachable!(),
        }
        .unwrap();
        out
    };
    let mut frames = Vec::new();
    for (client, vip) in [
        ("198.18.0.1", "198.18.100.41:80"),
        ("198.18.0.1", "198.18.100.42:80"),
        ("198.18.0.1", "198.18.100.43:80"),
        ("[2001:2::1]", "[2001:2:0:100::41]:80"),
    ] {
        for port in 1000..1016u16 {
            let c = format!("{client}:{port}");
            frames.push(from_client(&c, vip, SYN));
            frames.push(from_client(&c, vip, ACK));
            frames.push(big(&c, vip));
        }
    }
    let mut buf = vec![0u8; 2048];
    COUNTING.with(|c| c.set(true));
    for (i, f) in frames.iter().cycle().take(100_000).enumerate() {
        buf[..f.len()].copy_from_slice(f);
        let mut len = f.len();
        p.process_frame(&mut buf, &mut len, at(epoch, i as u64 / 20));
    }
    COUNTING.with(|c| c.set(false));
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 2048]; 64];
    let mut lens = vec![0usize; 64];
    let mut verdicts = [Verdict::Pass; 64];
    for round in 0..100usize {
        for (k, b) in bufs.iter_mut().enumerate() {
            let f = &frames[(round * 64 + k) % frames.len()];
            b[..f.len()].copy_from_slice(f);
            lens[k] = f.len();
        }
        COUNTING.with(|c| c.set(true));
        p.process_batch(
            &mut Roomy {
                bufs: &mut bufs,
                lens: &mut lens,
            },
            at(epoch, 10_000 + round as u64 * 20),
            &mut verdicts,
        );
        COUNTING.with(|c| c.set(false));
    }
    assert_eq!(ALLOCS.load(Ordering::Relaxed), 0, "allocations in DSR");
    let c = p.counters();
    assert!(c.tx > 50_000, "{c:?}");
    assert!(
        c.rejected(fastpath::pipeline::RejectReason::PacketTooBig) > 100,
        "{c:?}"
    );
}
