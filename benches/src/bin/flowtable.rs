//! Flow-table throughput: `cargo run --release -p benches --bin flowtable -- --flows N --threads T`.
//! Prints key=value lines. Lookups are in random order over all flows (memory-bound, like real
//! traffic); the hashbrown+ahash baseline is single-threaded over the same original tuples.
//! `lookup_ratio_1t` compares one `lookup` per key with hashbrown's `get`;
//! `lookup_ratio_1t_batch` uses `lookup_batch` (32 keys, prefetched), the overlap of cache
//! misses a worker gets for its receive batch (there through `prefetch_index_v4` and
//! `prefetch_entry_v4`). Inserts and `on_packet` take one `Tick`, made before the timed loops
//! as a worker makes it once per batch.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use flowtable::{BackendId, FlowData, FlowKey, FlowTable, FlowTableConfig, Protocol, TcpFlags};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn flow(i: u32) -> FlowData {
    let a = |x: u32, p: u16| SocketAddr::new(IpAddr::V4(Ipv4Addr::from_bits(x)), p);
    FlowData {
        proto: Protocol::Tcp,
        client: a(0xc612_0000 | (i >> 8), 1024 + (i & 0xff) as u16),
        vip: a(0xc612_6401, 80),
        backend: a(0xc612_0100 | (i % 200), 8080),
        snat: a(0xc613_0000 | (i >> 14), 1024 + (i & 0x3fff) as u16),
        service_id: 1,
        backend_id: BackendId(i % 200),
        snapshot_gen: 1,
        flags: 0,
    }
}

fn shuffled(n: u32, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n).collect();
    let mut s = seed;
    for i in (1..v.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

fn mops(ops: usize, d: Duration) -> f64 {
    ops as f64 / d.as_secs_f64() / 1e6
}

fn main() {
    let mut flows = 1_000_000u32;
    let mut threads = 2usize;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), v) {
            ("--flows", Some(v)) => flows = v as u32,
            ("--threads", Some(v)) => threads = v.max(1) as usize,
            _ => {
                eprintln!("usage: flowtable [--flows N] [--threads T]");
                std::process::exit(2);
            }
        }
    }
    let epoch = Instant::now();
    let table = FlowTable::new(FlowTableConfig::new(flows as usize, 200), epoch).expect("table");
    let data: Vec<FlowData> = (0..flows).map(flow).collect();
    let keys: Vec<FlowKey> = data.iter().map(|d| d.original_key()).collect();
    let chunk = (flows as usize).div_ceil(threads);

    // Insert: threads insert disjoint shares (random order).
    let order = shuffled(flows, 0x1234_5678);
    let start = table.tick(epoch);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for part in order.chunks(chunk) {
            let (table, data) = (&table, &data);
            s.spawn(move || {
                for &i in part {
                    table
                        .insert(&data[i as usize], TcpFlags::SYN, start)
                        .expect("insert");
                }
            });
        }
    });
    let insert = mops(flows as usize, t0.elapsed());

    // Lookup: every thread looks up all flows in its own random order.
    let t0 = Instant::now();
    let found: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (table, keys) = (&table, &keys);
                s.spawn(move || {
                    let order = shuffled(flows, 0x9e37 + t as u64);
                    order
                        .iter()
                        .filter(|&&i| table.lookup(&keys[i as usize]).is_some())
                        .count()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let lookup = mops(found, t0.elapsed());
    assert_eq!(found, flows as usize * threads, "every flow found");

    // Mixed: per packet a lookup by either tuple plus on_packet (state/time update).
    let t0 = Instant::now();
    let now = table.tick(epoch + Duration::from_secs(1));
    let mixed_ops: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (table, data) = (&table, &data);
                s.spawn(move || {
                    let order = shuffled(flows, 0x7777 + t as u64);
                    let mut n = 0;
                    for (k, &i) in order.iter().enumerate() {
                        let d = &data[i as usize];
                        let key = if k % 2 == 0 {
                            d.original_key()
                        } else {
                            d.reply_key()
                        };
                        if let Some((h, dir)) = table.lookup(&key) {
                            table.on_packet(h, dir, TcpFlags::ACK, now);
                            n += 1;
                        }
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let mixed = mops(mixed_ops, t0.elapsed());

    // Baseline: hashbrown + ahash, single thread, same keys, same random order.
    let mut map: hashbrown::HashMap<FlowKey, u32, ahash::RandomState> =
        hashbrown::HashMap::with_capacity_and_hasher(flows as usize, ahash::RandomState::new());
    for (i, k) in keys.iter().enumerate() {
        map.insert(*k, i as u32);
    }
    let order = shuffled(flows, 0x9e37);
    let t0 = Instant::now();
    let hb_found = order
        .iter()
        .filter(|&&i| map.get(&keys[i as usize]).is_some())
        .count();
    let hb = mops(hb_found, t0.elapsed());
    // Ours single-threaded on the same order, for a like-for-like ratio.
    let t0 = Instant::now();
    let our1 = order
        .iter()
        .filter(|&&i| table.lookup(&keys[i as usize]).is_some())
        .count();
    let ours_1t = mops(our1, t0.elapsed());
    // The same, through `lookup_batch` (prefetches a batch's index slots and entries first),
    // as a worker overlaps the lookups of a receive batch.
    let t0 = Instant::now();
    let mut batch_keys = [keys[0]; 32];
    let mut out = [None; 32];
    let mut our_b = 0;
    for chunk in order.chunks(32) {
        for (k, &i) in batch_keys.iter_mut().zip(chunk) {
            *k = keys[i as usize];
        }
        table.lookup_batch(&batch_keys[..chunk.len()], &mut out);
        our_b += out[..chunk.len()].iter().filter(|o| o.is_some()).count();
    }
    let ours_batch = mops(our_b, t0.elapsed());
    assert_eq!(our_b, flows as usize, "every flow found (batch)");

    println!("flows={flows}");
    println!("threads={threads}");
    println!("insert_mops={insert:.2}");
    println!("lookup_mops={lookup:.2}");
    println!("lookup_1t_mops={ours_1t:.2}");
    println!("mixed_mops={mixed:.2}");
    println!("bytes_per_flow={:.1}", table.bytes_per_flow());
    println!("hashbrown_lookup_mops={hb:.2}");
    println!("lookup_ratio={:.2}", lookup / hb);
    println!("lookup_ratio_1t={:.2}", ours_1t / hb);
    println!("lookup_1t_batch_mops={ours_batch:.2}");
    println!("lookup_ratio_1t_batch={:.2}", ours_batch / hb);
}
