//! Zero allocations per packet: a counting global allocator (this test binary only) counts
//! allocations made by the test thread while 1M frames of established flows and their replies
//! go through `Pipeline::process`.

mod pipeline_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use fastpath::pipeline::Verdict;
use pipeline_common::*;

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
