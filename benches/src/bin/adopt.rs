//! Adopting a flow table after a crash: `cargo run --release -p benches --bin adopt --
//! --flows 1000000` (and `--flows 4000000`). Prints `key=value` lines.
//!
//! In a scratch directory on tmpfs (`--dir`, default `/dev/shm`: the state file must be in
//! memory, as `[dataplane] state_dir` is in production), a state-file table
//! ([`FlowTable::open`]) of `--capacity` flows (default: the next power of two of 1.25 ×
//! flows) and the daemon's default `backends_max` is filled with `--flows` flows: 80% IPv4
//! TCP, 10% IPv4 UDP, 5% IPv6 TCP, 5% IPv6 UDP (full-NAT tuples, 200 backends), every TCP
//! flow taken through its handshake to ESTABLISHED (a SYN, then the client's ACK) as a worker
//! does. The table is then dropped without `mark_clean`, as a killed process leaves it, and
//! opened again:
//!
//! - `adoption_ms`: wall time of that [`FlowTable::open`] (map, check, recovery pass);
//!   `recovery_ms`: the recovery pass alone (`Recovery::took`, what xvs logs as `took_ms`;
//!   the mapping is faulted in before it, as a takeover's is before the switch);
//!   `adoption_cpu_ms`: the CPU time the opening thread spent in that open (its own clock:
//!   on a machine other work shares it stays near the quiet wall time, where the wall time
//!   does not).
//! - `adopted_flows` (`Recovery::flows`), `lost_flows` = flows − adopted, `torn_down`.
//! - `lookups_ok` of `lookups_sampled`: flows spread over the table looked up after the
//!   adoption by both tuples, each found in the right direction and state.
//! - `export_ms`, `import_ms`: [`FlowTable::export`] of the adopted table into the record
//!   format and [`FlowTable::import_records`] into a new table of the same capacity, what a
//!   graceful stop and a start with another layout version do; `imported_flows`.
//! - `file_mib` (the state file's size), `export_mib`.
//!
//! The scratch directory is removed at the end, also when a step fails.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use flowtable::{
    AnyFlow, BackendId, Direction, FlowData, FlowState, FlowTable, FlowTableConfig, Opened,
    Protocol, TcpFlags, TcpState,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser)]
#[command(about = "flow-table adoption after a crash, export and import; prints key=value")]
struct Args {
    /// Flows in the table when the process "dies".
    #[arg(long, default_value_t = 1_000_000)]
    flows: u32,
    /// Table capacity (default: next power of two of 1.25 × flows).
    #[arg(long)]
    capacity: Option<u32>,
    /// `backends_max` of the table (xvs' default).
    #[arg(long, default_value_t = 1 << 16)]
    backends_max: u32,
    /// Where the scratch directory goes: a tmpfs.
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Threads filling the table.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Flows looked up after the adoption (spread over all of them).
    #[arg(long, default_value_t = 100_000)]
    sample: u32,
}

const BACKENDS: u32 = 200;

/// Flow `i` of the mix: by `i % 20`, 0..=15 IPv4 TCP, 16..=17 IPv4 UDP, 18 IPv6 TCP, 19 IPv6
/// UDP. Clients and SNAT ports are unique per flow, so every tuple is.
fn flow(i: u32) -> FlowData {
    let kind = i % 20;
    let proto = if matches!(kind, 16 | 17 | 19) {
        Protocol::Udp
    } else {
        Protocol::Tcp
    };
    let b = i % BACKENDS;
    // SNAT: 32k ports per address.
    let (snat_hi, snat_port) = (i >> 15, 1024 + (i & 0x7fff) as u16);
    let client_port = 1024 + (i & 0x3fff) as u16;
    if kind >= 18 {
        let v6 = |net: u128, host: u128| IpAddr::V6(Ipv6Addr::from_bits(net << 64 | host));
        let sa = SocketAddr::new;
        FlowData {
            proto,
            client: sa(v6(0x2001_0db8_0001_0000, u128::from(i >> 14)), client_port),
            vip: sa(v6(0x2001_0db8_0064_0000, 1), 443),
            backend: sa(v6(0x2001_0db8_0002_0000, u128::from(b + 1)), 8443),
            snat: sa(v6(0x2001_0db8_0003_0000, u128::from(snat_hi)), snat_port),
            service_id: 2,
            backend_id: BackendId(b),
            snapshot_gen: 1,
            flags: 0,
        }
    } else {
        let v4 = |x: u32, p: u16| SocketAddr::new(IpAddr::V4(Ipv4Addr::from_bits(x)), p);
        FlowData {
            proto,
            client: v4(0x0a00_0000 | (i >> 14), client_port),
            vip: v4(0xc612_6401, if proto == Protocol::Tcp { 443 } else { 53 }),
            backend: v4(0xc612_0100 + b, 8443),
            snat: v4(0xc613_0000 | snat_hi, snat_port),
            service_id: 1,
            backend_id: BackendId(b),
            snapshot_gen: 1,
            flags: 0,
        }
    }
}

fn expected_state(d: &FlowData) -> FlowState {
    match d.proto {
        Protocol::Tcp => FlowState::Tcp(TcpState::Established),
        _ => FlowState::Udp,
    }
}

/// The scratch directory, removed when dropped (the release profile aborts on panic, so the
/// steps return errors instead of panicking).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("adopt: removing {}: {e}", self.0.display());
        }
    }
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the struct we pass; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn mib(path: &Path) -> Res<f64> {
    Ok(std::fs::metadata(path)?.len() as f64 / f64::from(1 << 20))
}

/// Inserts flows `0..flows` (threads take interleaved shares), each TCP flow through its
/// handshake. Returns how many were refused.
fn fill(table: &FlowTable, flows: u32, threads: usize, now: Instant) -> usize {
    let threads = threads.max(1) as u32;
    let tick = table.tick(now);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut refused = 0;
                    for i in (t..flows).step_by(threads as usize) {
                        let d = flow(i);
                        match table.insert(&d, TcpFlags::SYN, tick) {
                            Ok(h) => {
                                if d.proto == Protocol::Tcp {
                                    table.on_packet(h, Direction::Original, TcpFlags::ACK, tick);
                                }
                            }
                            Err(_) => refused += 1,
                        }
                    }
                    refused
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(usize::MAX)).sum()
    })
}

/// Looks up `sample` flows spread over `0..flows` by both tuples; how many were found in the
/// right direction and state.
fn check(table: &FlowTable, flows: u32, sample: u32) -> (u32, u32) {
    let n = sample.clamp(1, flows.max(1));
    let step = (flows / n).max(1);
    let mut ok = 0;
    for k in 0..n {
        let d = flow((k * step) % flows);
        // By each tuple: the flow (a copy) and the direction matched.
        let view = |k| {
            let (h, dir) = table.lookup(&k)?;
            Some((table.get(h)?, dir))
        };
        let orig = view(d.original_key());
        let reply = view(d.reply_key());
        let good = matches!((orig, reply), (Some((o, Direction::Original)), Some((r, Direction::Reply)))
            if o.handle == r.handle && o.data == d && o.state == expected_state(&d));
        ok += u32::from(good);
    }
    (ok, n)
}

fn run(args: &Args, dir: &Path) -> Res<()> {
    let flows = args.flows;
    let capacity = args
        .capacity
        .unwrap_or_else(|| (u64::from(flows) * 5 / 4).next_power_of_two() as u32);
    if (capacity as usize) < flows as usize {
        return Err(format!("--capacity {capacity} is below --flows {flows}").into());
    }
    let config = FlowTableConfig::new(capacity as usize, args.backends_max as usize);
    let path = dir.join("flows");
    println!("flows={flows}");
    println!("capacity={capacity}");

    // The first process: a new state file, filled, then "killed" (no mark_clean).
    let t0 = Instant::now();
    let (table, opened) = FlowTable::open(&path, config, Instant::now(), &AnyFlow)?;
    if opened != Opened::Created {
        return Err(format!("expected a new table, got {opened:?}").into());
    }
    let create = t0.elapsed();
    let t0 = Instant::now();
    let refused = fill(&table, flows, args.threads, Instant::now());
    let filled = t0.elapsed();
    let live = table.len();
    drop(table);
    println!("create_ms={}", ms(create));
    println!("fill_s={:.2}", filled.as_secs_f64());
    println!("refused_flows={refused}");
    println!("file_mib={:.1}", mib(&path)?);

    // The next process adopts it.
    let (t0, cpu0) = (Instant::now(), thread_cpu());
    let (table, opened) = FlowTable::open(&path, config, Instant::now(), &AnyFlow)?;
    let adoption = t0.elapsed();
    let adoption_cpu = thread_cpu().saturating_sub(cpu0);
    let Opened::Adopted(r) = opened else {
        return Err(format!("the state was not adopted: {opened:?}").into());
    };
    println!("adopted_flows={}", r.flows);
    println!(
        "lost_flows={}",
        u64::from(flows).saturating_sub(r.flows as u64)
    );
    println!("live_before={live}");
    println!("torn_down={}", r.torn_down);
    println!("previous_clean={}", r.clean);
    println!("adoption_ms={}", ms(adoption));
    println!("adoption_cpu_ms={}", ms(adoption_cpu));
    println!("recovery_ms={}", ms(r.took));
    let t0 = Instant::now();
    let (ok, sampled) = check(&table, flows, args.sample);
    println!("lookups_sampled={sampled}");
    println!("lookups_ok={ok}");
    println!(
        "lookup_after_adoption_ns={:.0}",
        t0.elapsed().as_nanos() as f64 / f64::from(2 * sampled)
    );

    // Export (a graceful stop) and import into a new table (a start with another layout).
    let export = dir.join("flows.export");
    let t0 = Instant::now();
    let exported = table.export(&export, Instant::now())?;
    println!("export_ms={}", ms(t0.elapsed()));
    println!("exported_flows={exported}");
    println!("export_mib={:.1}", mib(&export)?);
    drop(table);
    std::fs::remove_file(&path)?;
    let (fresh, _) = FlowTable::open(&dir.join("flows.new"), config, Instant::now(), &AnyFlow)?;
    let t0 = Instant::now();
    let imported = fresh.import_records(&export, Instant::now(), &AnyFlow)?;
    println!("import_ms={}", ms(t0.elapsed()));
    println!("imported_flows={}", imported.restored);
    println!("import_refused={}", imported.refused);
    let (ok, sampled) = check(&fresh, flows, args.sample);
    println!("import_lookups_ok={ok}");
    if ok != sampled {
        return Err(format!(
            "{} of {sampled} sampled flows missing after the import",
            sampled - ok
        )
        .into());
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    let dir = args
        .dir
        .join(format!("xvs-adopt-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("adopt: creating {}: {e}", dir.display());
        std::process::exit(1);
    }
    let scratch = Scratch(dir);
    let result = run(&args, &scratch.0);
    drop(scratch);
    if let Err(e) = result {
        eprintln!("adopt: {e}");
        std::process::exit(1);
    }
}
