//! `perf-lab`: the xvs benchmark rig. See the crate docs and perf-lab/README.md.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use perf_lab::bench::{self, Mode, RunOpts, Scenario};
use perf_lab::generator::{Kind, Size};
use perf_lab::rig::Rig;
use perf_lab::target::{Placement, Target};

#[derive(Parser)]
#[command(
    name = "perf-lab",
    about = "xvs benchmark rig: netns lab, AF_XDP generator and sink, baselines, reports"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
struct RigArgs {
    /// Namespace name prefix (namespaces PREFIX-c, -x, -s, -b1..N).
    #[arg(long, default_value = "plab")]
    prefix: String,
    /// Backends (sinks).
    #[arg(long, default_value_t = 3)]
    backends: u16,
    /// Queues per veth (numtxqueues/numrxqueues).
    #[arg(long, default_value_t = 1)]
    queues: u16,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create the rig (removing any leftover of the same prefix first).
    Up(RigArgs),
    /// Remove the rig (idempotent).
    Down(RigArgs),
    /// Run one scenario against one target on a fresh rig and write the JSON result.
    Run(RunArgs),
    /// Markdown tables and SVG plots from JSON results.
    Report {
        /// JSON results of `perf-lab run`.
        #[arg(required = true)]
        results: Vec<PathBuf>,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// The AF_XDP forwarder target (started by `run --target l2fwd` inside the LB namespace).
    #[command(hide = true)]
    L2fwd {
        #[arg(long = "in")]
        in_if: String,
        #[arg(long = "out")]
        out_if: String,
        #[arg(long, default_value_t = 1)]
        queues: u16,
        #[arg(long, default_value_t = 3)]
        backends: u16,
        #[arg(long, default_value_t = 1)]
        core: usize,
        /// Rewrites `busy_ns=`, `rx=`, `tx=` lines here every 100 ms.
        #[arg(long)]
        stats: Option<PathBuf>,
        /// Run the sockets' NAPI from the poll loop (as xvs' `napi_busy_poll`).
        #[arg(long)]
        napi_busy_poll: bool,
    },
    /// The HTTP/1.0 backend of conn-rate (started by `run` in each backend namespace).
    #[command(hide = true)]
    HttpServe {
        #[arg(long, default_value_t = perf_lab::rig::BACKEND_PORT)]
        port: u16,
        /// Response body bytes.
        #[arg(long, default_value_t = perf_lab::realclient::RESPONSE_BYTES)]
        size: usize,
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    rig: RigArgs,
    /// Scenario.
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// Target.
    #[arg(long, value_enum)]
    target: Target,
    /// generator (offered rate, sinks measure) or saturation (reflectors, burst circulates).
    #[arg(long, value_enum, default_value = "generator")]
    mode: Mode,
    /// Seconds of traffic.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// Offered rate in packets/s (0 = as fast as the generator can).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Also search the no-drop rate (loss <= 0.1%), binary search.
    #[arg(long)]
    ndr: bool,
    /// The restart scenario: after its SIGKILL and SIGTERM restarts, a third trial
    /// upgrades xvs with `xvs run --takeover` halfway (signal `takeover`).
    #[arg(long)]
    takeover: bool,
    /// Generator mode: a further trial at this one rate for every target, for latency at a
    /// load all of them carry (0 = none); change-under-load's main run uses it too unless
    /// --rate is given.
    #[arg(long, default_value_t = bench::LATENCY_RATE_PPS)]
    latency_rate: u64,
    /// NDR trials at most.
    #[arg(long, default_value_t = 7)]
    ndr_trials: u32,
    /// Seconds per NDR trial.
    #[arg(long, default_value_t = 2.0)]
    ndr_trial_secs: f64,
    /// Flows (default: the scenario's).
    #[arg(long)]
    flows: Option<u32>,
    /// Traffic kind (default: the scenario's).
    #[arg(long, value_enum)]
    kind: Option<Kind>,
    /// Frame size 64..1500 or imix.
    #[arg(long, default_value = "64")]
    size: Size,
    /// Saturation: packets injected.
    #[arg(long, default_value_t = 2048)]
    burst: u64,
    /// Verify IPv4/L4 checksums at the sinks.
    #[arg(long)]
    verify: bool,
    /// NAPI busy polling for the AF_XDP targets (xvs' `napi_busy_poll`, l2fwd's own); off
    /// by default: on this rig's veths it cannot engage (see the README).
    #[arg(long)]
    napi_busy_poll: bool,
    /// The xvs binary (default: target/release/xvs, else target/debug/xvs).
    #[arg(long)]
    xvs: Option<PathBuf>,
    /// A further xvs `[dataplane]` setting, as a TOML line (repeatable), e.g.
    /// `--xvs-set 'tx_ring_size = 8192'`; replaces perf-lab's own value of that key.
    #[arg(long = "xvs-set", value_name = "KEY = VALUE")]
    xvs_set: Vec<String>,
    /// Core for the LB under test.
    #[arg(long, default_value_t = 1)]
    lb_core: usize,
    /// Core for the generator and sinks.
    #[arg(long, default_value_t = 0)]
    gen_core: usize,
    /// Scratch directory for configs and logs (default: next to --json).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("perf-lab: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    perf_lab::sys::quiet_libbpf();
    match Cli::parse().cmd {
        Cmd::Up(a) => {
            let rig = Rig::new(&a.prefix, a.backends, a.queues)?;
            rig.up()?;
            eprintln!(
                "perf-lab: rig {} up: {}",
                a.prefix,
                rig.namespaces().join(" ")
            );
        }
        Cmd::Down(a) => {
            Rig::new(&a.prefix, a.backends, a.queues)?.down()?;
        }
        Cmd::Report { results, out } => {
            let w = perf_lab::report::report(&results, &out)?;
            println!("{}", w.markdown.display());
            for s in w.svgs {
                println!("{}", s.display());
            }
        }
        Cmd::L2fwd {
            in_if,
            out_if,
            queues,
            backends,
            core,
            stats,
            napi_busy_poll,
        } => perf_lab::l2fwd::run(
            &in_if,
            &out_if,
            queues,
            backends,
            core,
            stats.as_deref(),
            napi_busy_poll,
        )?,
        Cmd::Run(a) => {
            let dir = a.work_dir.clone().unwrap_or_else(|| {
                let stem = a
                    .json
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                a.json.with_file_name(format!("{stem}.work"))
            });
            let opts = RunOpts {
                scenario: a.scenario,
                target: a.target,
                mode: a.mode,
                duration_s: a.duration,
                rate_pps: a.rate,
                ndr: a.ndr,
                takeover: a.takeover,
                latency_rate_pps: a.latency_rate,
                ndr_trials: a.ndr_trials,
                ndr_trial_s: a.ndr_trial_secs,
                flows: a.flows,
                kind: a.kind,
                size: a.size,
                burst: a.burst,
                verify: a.verify,
                prefix: a.rig.prefix,
                backends: a.rig.backends,
                queues: a.rig.queues,
                placement: Placement {
                    lb_core: a.lb_core,
                    gen_core: a.gen_core,
                    napi_busy_poll: a.napi_busy_poll,
                    xvs: a.xvs.unwrap_or_else(bench::default_xvs),
                    dir,
                    state_dir: None,
                    drain_timeout_s: None,
                    xvs_dataplane: a.xvs_set,
                },
            };
            let mut r = bench::run(&opts)?;
            bench::write_result(&mut r, &a.json)?;
            if let Some(restarts) = &r.restart {
                print!("{}", perf_lab::restart::key_values(restarts));
            }
            eprintln!("{}", bench::summary_line(&r));
            if let Some(files) = &r.latency_hgrm {
                let names: Vec<&str> = files.values().map(String::as_str).collect();
                eprintln!("perf-lab: latency distributions: {}", names.join(", "));
            }
        }
        Cmd::HttpServe {
            port,
            size,
            threads,
        } => perf_lab::realclient::http_serve(port, size, threads)?,
    }
    Ok(())
}
