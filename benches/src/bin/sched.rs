//! Scheduler micro-benchmarks: prints `key=value` lines.
//!
//! - `pick_ns_<sched>_<n>`: mean ns per `Scheduler::pick` over varied flows (4096 distinct
//!   source address/port pairs, 64 destinations), with non-zero connection counts, for n = 10,
//!   100, 1000 backends (weights 1..4). Best of 5 runs.
//! - `maglev_build_ms_1000`: building a Maglev table for 1000 backends, M = 65537 (best of 5).
//! - `maglev_max_share_dev_pct`: that table's largest deviation of a backend's slot share from
//!   its weighted share, in percent.
//! - `affinity_lookup_ns`: `AffinityTable::lookup` hits over 10,000 clients.
//!
//! Run with `cargo run --release -p benches --bin sched`.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use lb_algos::{
    AffinityTable, Backend, BackendId, ConnCounts, FlowTuple, SchedFlags, SchedParams, Scheduler,
    SchedulerKind,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const FLOWS: usize = 4096;
const RUNS: usize = 5;
const RUN_TARGET: Duration = Duration::from_millis(30);

struct Counts(Vec<(u32, u32)>);

impl ConnCounts for Counts {
    #[inline]
    fn active(&self, id: BackendId) -> u32 {
        self.0[id.0 as usize].0
    }
    #[inline]
    fn inactive(&self, id: BackendId) -> u32 {
        self.0[id.0 as usize].1
    }
    #[inline]
    fn counts_run(&self, first: BackendId, out: &mut [[u32; 2]]) -> bool {
        let Some(src) = self.0.get(first.0 as usize..first.0 as usize + out.len()) else {
            return false;
        };
        for (o, &(a, i)) in out.iter_mut().zip(src) {
            *o = [a, i];
        }
        true
    }
    #[inline]
    fn packed_run(&self, first: BackendId, out: &mut [u64]) -> bool {
        let Some(src) = self.0.get(first.0 as usize..first.0 as usize + out.len()) else {
            return false;
        };
        for (o, &(a, i)) in out.iter_mut().zip(src) {
            *o = u64::from(a) << 32 | u64::from(i);
        }
        true
    }
}

fn backends(n: usize, weighted: bool) -> Vec<Backend> {
    (0..n as u32)
        .map(|i| Backend {
            id: BackendId(i),
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0xC612_0000 + 0x100 + i)), 8080),
            weight: if weighted { i % 4 + 1 } else { 1 },
        })
        .collect()
}

fn counts(n: usize) -> Counts {
    Counts(
        (0..n as u32)
            .map(|i| (i.wrapping_mul(7919) % 13 + 1, i % 5 + 1))
            .collect(),
    )
}

fn flows() -> Vec<FlowTuple> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..FLOWS)
        .map(|_| {
            // xorshift: varied but reproducible flows.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            FlowTuple {
                src: IpAddr::V4(Ipv4Addr::from(0xC613_0000 | (x as u32 & 0xffff))),
                src_port: (x >> 16) as u16 | 1024,
                dst: IpAddr::V4(Ipv4Addr::from(0xC612_6400 + ((x >> 32) as u32 & 63))),
                dst_port: 80,
            }
        })
        .collect()
}

/// Mean ns per call of `f(i)` for i = 0, 1, ...; best of `RUNS` runs of ~`RUN_TARGET`.
fn time_ns(mut f: impl FnMut(usize)) -> f64 {
    let mut iters = 1000usize;
    loop {
        let t = Instant::now();
        for i in 0..iters {
            f(i);
        }
        if t.elapsed() >= RUN_TARGET / 10 || iters >= 1 << 30 {
            let per = t.elapsed().as_secs_f64() / iters as f64;
            iters = ((RUN_TARGET.as_secs_f64() / per) as usize).max(1000);
            break;
        }
        iters *= 10;
    }
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            for i in 0..iters {
                f(i);
            }
            t.elapsed().as_secs_f64() * 1e9 / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let flows = flows();
    let now = Instant::now();
    let params = SchedParams {
        flags: SchedFlags {
            mh_port: true,
            mh_fallback: false,
        },
        ..SchedParams::default()
    };

    for &kind in SchedulerKind::ALL {
        for n in [10usize, 100, 1000] {
            let b = backends(n, true);
            let c = counts(n);
            let s = Scheduler::build(kind, &b, &params).expect("build");
            let ns = time_ns(|i| {
                let flow = black_box(&flows[i % FLOWS]);
                black_box(s.pick(flow, &c, now));
            });
            println!("pick_ns_{kind}_{n}={ns:.1}");
        }
    }

    let b = backends(1000, false);
    let mh_params = SchedParams {
        mh_table_size: 65537,
        ..params
    };
    let build_ms = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            let s = Scheduler::build(SchedulerKind::Mh, black_box(&b), &mh_params).expect("mh");
            let ms = t.elapsed().as_secs_f64() * 1e3;
            black_box(s);
            ms
        })
        .fold(f64::INFINITY, f64::min);
    println!("maglev_build_ms_1000={build_ms:.2}");

    let Scheduler::Mh(mh) = Scheduler::build(SchedulerKind::Mh, &b, &mh_params).expect("mh") else {
        unreachable!("built mh");
    };
    let mut slots = vec![0u64; b.len()];
    mh.table().iter().for_each(|&i| slots[i as usize] += 1);
    let want = mh.table().len() as f64 / b.len() as f64;
    let dev = slots
        .iter()
        .map(|&c| (c as f64 - want).abs() / want * 100.0)
        .fold(0.0, f64::max);
    println!("maglev_max_share_dev_pct={dev:.3}");

    let table = AffinityTable::new(1 << 16, now);
    let clients: Vec<IpAddr> = (0..10_000u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0xC613_0000 + i * 17)))
        .collect();
    for (i, &c) in clients.iter().enumerate() {
        table.insert(7, c, BackendId(i as u32), now);
    }
    let timeout = Duration::from_secs(10800);
    let ns = time_ns(|i| {
        let c = black_box(clients[i % clients.len()]);
        black_box(table.lookup(7, c, now, timeout));
    });
    println!("affinity_lookup_ns={ns:.1}");
}
