//! `perf-lab run`: one scenario against one target on a fresh rig, measured; the NDR search;
//! the JSON result.
//!
//! Measures (generator mode): offered rate = packets the generator handed to the kernel per
//! second of sending; forwarded rate = distinct packets the sinks received per second of
//! sending; loss = sent - distinct received; latency = sink receive time - payload send time.
//!
//! CPU per packet (`cpu_ns_per_pkt`): see [`crate::cpu`] (kernel targets: the LB core's busy
//! time; busy-polling targets: the time of their polls that moved frames).
//!
//! Saturation mode: the reflector (`bpf/reflect.c`) on the switch's uplink replaces the sinks;
//! a burst is injected once, circulates client -> LB -> reflector -> LB..., and the forwarded
//! rate is the reflector's count per second over the run (no loss or latency: there is no
//! sequence to check). The reflector's NAPI runs in a thread pinned to the generator core.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::cpu;
use crate::generator::{self, GenSpec, Kind, Size};
use crate::hgrm;
use crate::meta::Meta;
use crate::realclient::{self, BulkRun, ConnRate};
use crate::reflect::Reflector;
use crate::restart::{self, Restart, Restarts};
use crate::rig::{IF_LB_BACKEND, Rig, RigGuard, VIP};
use crate::sink::{self, SeqBitmap};
use crate::sys::{mono_ns, sh_in, thread_napi};
use crate::target::{Placement, Running, Services, Stop, Target};

/// Loss allowed at the no-drop rate (RFC 2544 uses 0; veth copy mode never quite gets there).
pub const NDR_LOSS_MAX: f64 = 0.001;

/// Default rate of the latency trial (`--latency-rate`): well under what the rig carries
/// for any target here (about 250 kpps for the AF_XDP targets, whose receive copies run on
/// the generator's core), so queues stay short and the latencies compare the targets, not
/// the backlog of an overloaded rig.
pub const LATENCY_RATE_PPS: u64 = 100_000;

/// Seconds of the latency trial, at most.
const LATENCY_TRIAL_S: f64 = 3.0;

/// A benchmark scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// 1 UDP service, 3 backends, 1,000 flows.
    OneService,
    /// 1 service, 1,000,000 flows (DNAT only: SNAT ports would run out).
    #[value(name = "flows-1m")]
    #[serde(rename = "flows-1m", alias = "flows1m")]
    Flows1m,
    /// TCP SYN flood: every packet a SYN of a new flow (1M flows).
    SynFlood,
    /// 10,000 UDP services, one flow each.
    #[value(name = "services-10k")]
    #[serde(rename = "services-10k", alias = "services10k")]
    Services10k,
    /// one-service, and halfway through the run the service set is rewritten (xvs: new
    /// config + SIGHUP; kernel targets: atomic rule-set replacement).
    ChangeUnderLoad,
    /// xvs only: 100,000 established TCP flows at a fixed rate; after a run without a
    /// restart, a run in which xvs is killed halfway (SIGKILL, a new xvs at once) and one in
    /// which it is stopped (SIGTERM, drain_timeout 0s, then a new xvs). See
    /// [`crate::restart`].
    Restart,
    /// Real clients: iperf3 through the VIP to one backend, 1 stream then 8 streams, each
    /// `--duration` seconds (kernel TCP on both sides; see [`crate::realclient`]).
    BulkTcp,
    /// Real clients: ab's short HTTP/1.0 connections (one TCP connection per request)
    /// through the VIP to every backend for `--duration` seconds.
    ConnRate,
}

impl Scenario {
    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::OneService => "one-service",
            Scenario::Flows1m => "flows-1m",
            Scenario::SynFlood => "syn-flood",
            Scenario::Services10k => "services-10k",
            Scenario::ChangeUnderLoad => "change-under-load",
            Scenario::Restart => "restart",
            Scenario::BulkTcp => "bulk-tcp",
            Scenario::ConnRate => "conn-rate",
        }
    }

    /// Whether real clients (kernel TCP, iperf3 or ab) replace the generator and sinks.
    pub fn real_client(self) -> bool {
        matches!(self, Scenario::BulkTcp | Scenario::ConnRate)
    }

    /// (services, flows, kind, snat)
    fn shape(self) -> (u32, u32, Kind, bool) {
        match self {
            Scenario::OneService | Scenario::ChangeUnderLoad => (1, 1000, Kind::Udp, true),
            Scenario::Flows1m => (1, 1_000_000, Kind::Udp, false),
            Scenario::SynFlood => (1, 1_000_000, Kind::Syn, false),
            Scenario::Services10k => (10_000, 10_000, Kind::Udp, true),
            // DNAT: 100,000 flows would need more SNAT ports than one address has.
            Scenario::Restart => (1, 100_000, Kind::Ack, false),
            // DNAT, as kube-proxy for a client outside the cluster; the flows size the flow
            // table (conn-rate opens tens of thousands of connections).
            Scenario::BulkTcp => (1, 16, Kind::Ack, false),
            Scenario::ConnRate => (1, 262_144, Kind::Ack, false),
        }
    }
}

/// Generator-limited or saturation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The generator offers a rate; sinks measure.
    Generator,
    /// A burst circulates through reflectors; the LB is the only bottleneck.
    Saturation,
    /// `bulk-tcp` only, downloads (`iperf3 -R`): xvs forwards by direct server return (`l2`:
    /// backend 1 holds the VIP and replies on a direct link to the client, so the replies
    /// cross neither xvs nor the LB node); the kernel targets DNAT as in generator mode,
    /// their replies through the LB node (see `realclient`).
    Dsr,
}

/// Everything `perf-lab run` takes.
#[derive(Clone, Debug)]
pub struct RunOpts {
    /// Scenario.
    pub scenario: Scenario,
    /// Target.
    pub target: Target,
    /// Mode.
    pub mode: Mode,
    /// Seconds of traffic.
    pub duration_s: f64,
    /// Offered rate (0 = as fast as the generator goes).
    pub rate_pps: u64,
    /// Run the NDR search after the main run.
    pub ndr: bool,
    /// The restart scenario also upgrades xvs with `xvs run --takeover`.
    pub takeover: bool,
    /// Generator mode: the rate of the latency trial every target gets (0 = none), and of
    /// change-under-load's main run when `rate_pps` is 0.
    pub latency_rate_pps: u64,
    /// NDR trials (bounded).
    pub ndr_trials: u32,
    /// Seconds per NDR trial.
    pub ndr_trial_s: f64,
    /// Override the scenario's flows.
    pub flows: Option<u32>,
    /// Override the scenario's kind.
    pub kind: Option<Kind>,
    /// Frame size.
    pub size: Size,
    /// Saturation burst.
    pub burst: u64,
    /// Verify checksums at the sinks.
    pub verify: bool,
    /// Rig prefix, backends, queues.
    pub prefix: String,
    /// Backends.
    pub backends: u16,
    /// Queues.
    pub queues: u16,
    /// Cores and paths.
    pub placement: Placement,
}

/// Latency percentiles, µs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p999: Option<f64>,
    /// Maximum.
    pub max: Option<f64>,
}

/// One NDR trial.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NdrTrial {
    /// Rate asked.
    pub rate_pps: u64,
    /// Rate offered.
    pub offered_pps: f64,
    /// Rate forwarded.
    pub forwarded_pps: f64,
    /// Loss ratio.
    pub loss_ratio: f64,
}

/// Latency at one offered rate, the same for every target (`--latency-rate`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RateLatency {
    /// The trial's rates and loss (flattened: the same keys as an NDR trial's).
    #[serde(flatten)]
    pub trial: NdrTrial,
    /// One-way latency.
    pub latency_us: Latency,
}

/// Loss around a configuration change.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Swap {
    /// Packets missing from 100 ms before the change to 1 s after it.
    pub loss_pkts: u64,
    /// Packets sent in that window.
    pub window_pkts: u64,
    /// Packets missing from an equal window ending 100 ms before the change (the loss
    /// without a change: anything more in `loss_pkts` is the change's); null when the run
    /// had too little traffic before the change.
    #[serde(default)]
    pub before_loss_pkts: Option<u64>,
    /// Seconds into the run the change was made.
    pub at_s: f64,
}

/// The JSON result of one `perf-lab run`. Every key is always present (null when it does not
/// apply).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    /// Scenario.
    pub scenario: Scenario,
    /// Target.
    pub target: Target,
    /// Mode.
    pub mode: Mode,
    /// Seconds of traffic.
    pub duration_s: f64,
    /// Traffic kind.
    pub kind: Kind,
    /// Frame size.
    pub size: String,
    /// Flows.
    pub flows: u32,
    /// Services.
    pub services: u32,
    /// Backends.
    pub backends: u16,
    /// Queues per veth.
    pub queues: u16,
    /// Rate asked (0 = unlimited).
    pub rate_pps: u64,
    /// Rate offered (generator mode).
    pub offered_pps: Option<f64>,
    /// Rate forwarded.
    pub forwarded_pps: f64,
    /// Packets sent (generator mode) or injected (saturation).
    pub sent: u64,
    /// Packets received (distinct) or reflected.
    pub received: u64,
    /// Packets lost (generator mode).
    pub lost: Option<u64>,
    /// Loss ratio (generator mode).
    pub loss_ratio: Option<f64>,
    /// Duplicates seen.
    pub duplicates: u64,
    /// Non-perf-lab frames at the sinks.
    pub other_frames: u64,
    /// Frames whose checksums failed (with --verify).
    pub bad_checksums: u64,
    /// Packets per backend.
    pub per_backend: Vec<u64>,
    /// One-way latency.
    pub latency_us: Latency,
    /// CPU ns per forwarded packet (see the method).
    pub cpu_ns_per_pkt: Option<f64>,
    /// LB process CPU over the window, ns.
    pub lb_process_cpu_ns: Option<u64>,
    /// LB core irq+softirq over the window, ns.
    pub lb_core_softirq_ns: u64,
    /// LB core busy share over the window (wall - idle; 1.0 for busy-polling targets).
    pub lb_core_busy_ratio: f64,
    /// The target's busy share over the window (see the method): near 1.0 means the target
    /// bounded the run.
    #[serde(default)]
    pub target_busy_ratio: Option<f64>,
    /// The rig (generator) core's busy share over the window: near 1.0 means the rig did,
    /// and the forwarded rate is a lower bound of the target's capacity.
    #[serde(default)]
    pub rig_core_busy_ratio: f64,
    /// How CPU was measured.
    pub cpu_method: String,
    /// AF_XDP targets: whether they ran with NAPI busy polling (null for kernel targets,
    /// and in results from before the option).
    #[serde(default)]
    pub napi_busy_poll: Option<bool>,
    /// No-drop rate (loss <= 0.1%).
    pub ndr_pps: Option<f64>,
    /// The NDR trials.
    pub ndr_trials: Vec<NdrTrial>,
    /// Latency at `--latency-rate` (generator mode; null when 0 or another mode).
    #[serde(default)]
    pub latency_at_rate: Option<RateLatency>,
    /// Loss around the configuration change (change-under-load).
    pub swap: Option<Swap>,
    /// The restarts (the restart scenario; null otherwise and in results from before it).
    #[serde(default)]
    pub restart: Option<Restarts>,
    /// The target's own counters at exit.
    pub target_counters: BTreeMap<String, u64>,
    /// Caveats.
    pub notes: Vec<String>,
    /// When, where and how the run was made (null in results from before it).
    #[serde(default)]
    pub meta: Option<Meta>,
    /// The latency histograms' percentile distributions written beside the JSON (HdrHistogram
    /// text format, µs), by trial: `main`, `latency_at_rate`; file names relative to the
    /// JSON's directory (null: none written, e.g. saturation mode).
    #[serde(default)]
    pub latency_hgrm: Option<BTreeMap<String, String>>,
    /// bulk-tcp: the iperf3 runs (null for other scenarios).
    #[serde(default)]
    pub bulk_tcp: Option<Vec<BulkRun>>,
    /// conn-rate: the ab run (null for other scenarios).
    #[serde(default)]
    pub conn_rate: Option<ConnRate>,
    /// The latency histograms (ns) by trial, for the `.hgrm` files; not in the JSON.
    #[serde(skip)]
    pub histograms: Vec<(String, Histogram<u64>)>,
}

/// What one generator-mode trial measured.
pub(crate) struct Trial {
    pub(crate) sent: u64,
    offered_pps: f64,
    pub(crate) unique: u64,
    forwarded_pps: f64,
    duplicates: u64,
    other: u64,
    bad: u64,
    per_backend: Vec<u64>,
    hist: Histogram<u64>,
    cpu: cpu::Figures,
    swap: Option<Swap>,
    pub(crate) restart: Option<Restart>,
}

impl Trial {
    /// The trial's rates and loss, for a trial asked to run at `rate_pps`.
    fn summary(&self, rate_pps: u64) -> NdrTrial {
        NdrTrial {
            rate_pps,
            offered_pps: self.offered_pps,
            forwarded_pps: self.forwarded_pps,
            loss_ratio: self.loss_ratio(),
        }
    }

    fn loss_ratio(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            self.sent.saturating_sub(self.unique) as f64 / self.sent as f64
        }
    }
}

pub(crate) struct Ctx<'a> {
    pub(crate) opts: &'a RunOpts,
    pub(crate) rig: &'a Rig,
    pub(crate) svc: Services,
    pub(crate) gspec: GenSpec,
    seq: u32,
}

fn svc_for(opts: &RunOpts) -> (Services, GenSpec) {
    let (services, flows, kind, snat) = opts.scenario.shape();
    let flows = opts.flows.unwrap_or(flows).max(services);
    let kind = opts.kind.unwrap_or(kind);
    let protos = match kind {
        Kind::Udp => vec!["udp"],
        Kind::Syn | Kind::Ack => vec!["tcp"],
        Kind::Mix => vec!["udp", "tcp"],
    };
    let svc = Services {
        count: services,
        base_port: 1000,
        protos,
        // iperf3's control and data connections must reach the same server.
        backends: if opts.scenario == Scenario::BulkTcp {
            1
        } else {
            opts.backends
        },
        snat,
        flows,
        scheduler: "rr",
        extra: 0,
        dsr: opts.mode == Mode::Dsr && opts.target == Target::Xvs,
    };
    let gspec = GenSpec {
        ns: String::new(),
        queues: opts.queues,
        core: opts.placement.gen_core,
        rate_pps: opts.rate_pps,
        flows,
        services,
        base_port: 1000,
        vip: VIP,
        size: opts.size,
        kind,
        // Conntrack marks an ACK after a SYN it saw no answer to as invalid; with loose
        // pick-up (the default) an ACK-only stream is tracked. xvs needs the SYN.
        syn_first: opts.target == Target::Xvs,
        duration: Duration::from_secs_f64(opts.duration_s),
        count: None,
        seq_start: 0,
        idle_sleep: opts.scenario == Scenario::Restart,
    };
    (svc, gspec)
}

/// What happens halfway through a trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// Nothing.
    None,
    /// The service set changes (change-under-load).
    Change,
    /// xvs restarts (the restart scenario).
    Restart(Stop),
}

/// Runs one scenario against one target on a fresh rig (torn down on every exit path).
pub fn run(opts: &RunOpts) -> anyhow::Result<RunResult> {
    let meta = Meta::collect();
    let restart_rate = restart::check(opts)?;
    realclient::check(opts)?;
    let rig = Rig::new(&opts.prefix, opts.backends, opts.queues)?;
    rig.up().context("bringing the rig up")?;
    let _guard = RigGuard(rig.clone());
    // Bridge and backend work off the LB core: up0's receive goes to the generator core.
    sh_in(
        &rig.ns_switch(),
        &format!(
            "for f in /sys/class/net/up0/queues/rx-*/rps_cpus; do echo {:x} > $f; done",
            1u64 << opts.placement.gen_core
        ),
    )?;
    let (svc, mut gspec) = svc_for(opts);
    gspec.ns = rig.ns_client();
    // The restart scenario's xvs keeps its state on tmpfs (removed when this returns, after
    // the target stopped) and stops at once on SIGTERM.
    let (placement, _state) = restart::placement(opts);
    let mut target = Running::start(opts.target, &rig, &svc, &placement)
        .with_context(|| format!("starting target {}", opts.target.name()))?;
    let mut ctx = Ctx {
        opts,
        rig: &rig,
        svc,
        gspec,
        seq: 0,
    };
    let mut notes =
        vec!["veth copy-mode AF_XDP on a shared 2-core machine; numbers are noisy".to_owned()];
    if opts.scenario.real_client() {
        let mut r = realclient::run_scenario(&mut ctx, &target)?;
        if opts.mode == Mode::Dsr {
            notes.push(
                "--mode dsr: downloads (iperf3 -R); xvs by direct server return (l2, the VIP on \
                 the backend's lo, replies on a direct backend-client link), kernel targets by \
                 DNAT with replies through the LB node"
                    .into(),
            );
        }
        notes.push(
            "real clients: kernel TCP in the client and backend namespaces, pinned to the rig \
             core; DNAT (xvs mode nat); checksum offload off on every sender (no TSO)"
                .into(),
        );
        if opts.ndr {
            notes.push("--ndr applies to the packet scenarios only".into());
        }
        r.target_counters = target.stop();
        r.napi_busy_poll = matches!(opts.target, Target::Xvs | Target::L2fwd)
            .then_some(opts.placement.napi_busy_poll);
        r.notes = notes;
        r.meta = Some(meta);
        return Ok(r);
    }
    let mut result = match opts.mode {
        Mode::Generator => {
            let mut rate = opts.rate_pps;
            if rate == 0 && opts.scenario == Scenario::ChangeUnderLoad && opts.latency_rate_pps > 0
            {
                // A swap's loss is only the swap's at a load the target carries without it.
                rate = opts.latency_rate_pps;
                notes.push(format!(
                    "change-under-load: the main run offers {rate} pps (--latency-rate), a load \
                     every target carries, so loss around the change is the change's"
                ));
            }
            let event = match opts.scenario {
                Scenario::ChangeUnderLoad => Event::Change,
                _ => Event::None,
            };
            if let Some(r) = restart_rate {
                rate = r;
                notes.push(restart::note(r, &placement));
            }
            let t = trial(&mut ctx, &mut target, rate, opts.duration_s, event)?;
            let mut r = result_from(opts, &ctx, &t);
            r.rate_pps = rate;
            if restart_rate.is_some() {
                r.restart = Some(restart::run(&mut ctx, &mut target, rate, &t)?);
            }
            r
        }
        Mode::Saturation => saturation(&mut ctx, &target)?,
        // (Refused before the rig is built: `realclient::check`.)
        Mode::Dsr => anyhow::bail!("--mode dsr is for bulk-tcp only"),
    };
    if opts.ndr && opts.mode == Mode::Generator {
        let mut max_offered = result.offered_pps.unwrap_or(0.0);
        if opts.rate_pps == 0 && result.rate_pps > 0 {
            // The main run was paced (change-under-load): the search starts from what the
            // generator offers unpaced, as in every other scenario.
            max_offered =
                trial(&mut ctx, &mut target, 0, opts.ndr_trial_s, Event::None)?.offered_pps;
        }
        let (ndr, trials) = ndr(&mut ctx, &mut target, max_offered)?;
        result.ndr_pps = ndr;
        result.ndr_trials = trials;
    } else if opts.ndr {
        notes.push("--ndr applies to generator mode only".into());
    }
    if opts.mode == Mode::Generator && opts.latency_rate_pps > 0 {
        let rate = opts.latency_rate_pps;
        let t = trial(
            &mut ctx,
            &mut target,
            rate,
            opts.duration_s.min(LATENCY_TRIAL_S),
            Event::None,
        )?;
        result.latency_at_rate = Some(RateLatency {
            trial: t.summary(rate),
            latency_us: latency(&t),
        });
        result
            .histograms
            .push(("latency_at_rate".into(), t.hist.clone()));
    }
    if opts.target == Target::Xvs && ctx.gspec.kind != Kind::Udp {
        notes.push("xvs: a SYN is sent first on each TCP flow".into());
    }
    result.target_counters = target.stop();
    result.napi_busy_poll =
        matches!(opts.target, Target::Xvs | Target::L2fwd).then_some(opts.placement.napi_busy_poll);
    result.notes = notes;
    result.meta = Some(meta);
    Ok(result)
}

/// A trial's latency percentiles.
fn latency(t: &Trial) -> Latency {
    let us = |q: f64| (!t.hist.is_empty()).then(|| t.hist.value_at_quantile(q) as f64 / 1000.0);
    Latency {
        p50: us(0.5),
        p99: us(0.99),
        p999: us(0.999),
        max: (!t.hist.is_empty()).then(|| t.hist.max() as f64 / 1000.0),
    }
}

fn result_from(opts: &RunOpts, ctx: &Ctx<'_>, t: &Trial) -> RunResult {
    let forwarded = t.unique;
    RunResult {
        scenario: opts.scenario,
        target: opts.target,
        mode: opts.mode,
        duration_s: opts.duration_s,
        kind: ctx.gspec.kind,
        size: opts.size.to_string(),
        flows: ctx.gspec.flows,
        services: ctx.svc.count,
        backends: opts.backends,
        queues: opts.queues,
        rate_pps: opts.rate_pps,
        offered_pps: Some(t.offered_pps),
        forwarded_pps: t.forwarded_pps,
        sent: t.sent,
        received: forwarded,
        lost: Some(t.sent.saturating_sub(forwarded)),
        loss_ratio: Some(t.loss_ratio()),
        duplicates: t.duplicates,
        other_frames: t.other,
        bad_checksums: t.bad,
        per_backend: t.per_backend.clone(),
        latency_us: latency(t),
        cpu_ns_per_pkt: t.cpu.ns_per_pkt,
        lb_process_cpu_ns: t.cpu.proc_ns,
        lb_core_softirq_ns: t.cpu.irq_ns,
        lb_core_busy_ratio: t.cpu.lb_core_busy_ratio,
        target_busy_ratio: t.cpu.target_busy_ratio,
        rig_core_busy_ratio: t.cpu.rig_busy_ratio,
        cpu_method: cpu::METHOD.into(),
        napi_busy_poll: None,
        ndr_pps: None,
        ndr_trials: Vec::new(),
        latency_at_rate: None,
        swap: t.swap.clone(),
        restart: None,
        target_counters: BTreeMap::new(),
        notes: Vec::new(),
        meta: None,
        latency_hgrm: None,
        bulk_tcp: None,
        conn_rate: None,
        histograms: vec![("main".into(), t.hist.clone())],
    }
}

pub(crate) fn trial(
    ctx: &mut Ctx<'_>,
    target: &mut Running,
    rate: u64,
    secs: f64,
    event: Event,
) -> anyhow::Result<Trial> {
    let opts = ctx.opts;
    let mut gspec = ctx.gspec.clone();
    gspec.rate_pps = rate;
    gspec.duration = Duration::from_secs_f64(secs);
    gspec.seq_start = ctx.seq;
    // Sized for what the generator can send (~2 Mpps here) when the rate is unlimited.
    let expect = (if rate == 0 { 3_000_000 } else { rate } as f64 * secs * 1.2) as u64;
    let bitmap = Arc::new(SeqBitmap::new(expect, ctx.seq));
    let stop = Arc::new(AtomicBool::new(false));
    let mut sinks = Vec::new();
    let mut counts = Vec::new();
    for i in 1..=ctx.rig.backends {
        let c = Arc::new(AtomicU64::new(0));
        counts.push(Arc::clone(&c));
        sinks.push(sink::spawn(
            ctx.rig.ns_backend(i),
            ctx.rig.queues,
            opts.placement.gen_core,
            opts.verify,
            Arc::clone(&bitmap),
            Arc::clone(&stop),
            c,
        )?);
    }
    let gen_stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let (lb_core, gen_core) = (opts.placement.lb_core, opts.placement.gen_core);
    let cpu0 = cpu::sample(target, lb_core, gen_core);
    let h = generator::spawn(gspec, Arc::clone(&gen_stop), Arc::clone(&progress))?;
    let (mut swap_at, mut restart_at) = (None, None);
    match event {
        Event::None => {}
        Event::Change => {
            std::thread::sleep(Duration::from_secs_f64(secs / 2.0));
            let seq_at = progress.load(Ordering::Relaxed);
            let t = mono_ns();
            let mut svc = ctx.svc.clone();
            svc.extra = 1000;
            target.reload(ctx.rig, &svc, &opts.placement)?;
            swap_at = Some((seq_at, t));
        }
        Event::Restart(how) => {
            std::thread::sleep(Duration::from_secs_f64(secs / 2.0));
            restart_at = Some(restart::during(
                target,
                how,
                &progress,
                &opts.placement.dir,
            )?);
        }
    }
    let g = h
        .join()
        .map_err(|_| anyhow::anyhow!("generator panicked"))??;
    let cpu1 = cpu::sample(target, lb_core, gen_core);
    // In-flight packets land.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let mut per_backend = Vec::new();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
    let (mut received, mut dups, mut other, mut bad) = (0, 0, 0, 0);
    for s in sinks {
        let st = s.join().map_err(|_| anyhow::anyhow!("sink panicked"))??;
        per_backend.push(st.received - st.duplicates);
        received += st.received;
        dups += st.duplicates;
        other += st.other;
        bad += st.bad_checksum;
        hist.add(&st.latency_ns).expect("same bounds");
    }
    ctx.seq = ctx.seq.wrapping_add(g.sent as u32);
    let unique = received - dups;
    let elapsed_s = g.elapsed_ns as f64 / 1e9;
    let swap = swap_at.map(|(seq_at, t)| {
        let pps = g.pps();
        let from = seq_at.saturating_sub((pps * 0.1) as u64);
        let n = ((pps * 1.1) as u64).min(g.sent.saturating_sub(from));
        // The same number of packets just before the window.
        let before = from.checked_sub(n).map(|b| bitmap.missing(b, n));
        Swap {
            loss_pkts: bitmap.missing(from, n),
            window_pkts: n,
            before_loss_pkts: before,
            at_s: (t - g.start_ns) as f64 / 1e9,
        }
    });
    let restart = restart_at.map(|r| {
        restart::finish(
            r,
            &bitmap,
            g.sent,
            g.start_ns,
            g.pps(),
            ctx.gspec.flows,
            unique,
        )
    });
    Ok(Trial {
        sent: g.sent,
        offered_pps: g.pps(),
        unique,
        forwarded_pps: if elapsed_s > 0.0 {
            unique as f64 / elapsed_s
        } else {
            0.0
        },
        duplicates: dups,
        other,
        bad,
        per_backend,
        hist,
        // The packets the sinks counted over the generator's sending window.
        cpu: cpu::between(&cpu0, &cpu1, unique),
        swap,
        restart,
    })
}

fn ndr(
    ctx: &mut Ctx<'_>,
    target: &mut Running,
    max_offered: f64,
) -> anyhow::Result<(Option<f64>, Vec<NdrTrial>)> {
    let opts = ctx.opts;
    let mut trials = Vec::new();
    let mut hi = if opts.rate_pps > 0 {
        opts.rate_pps
    } else {
        max_offered as u64
    };
    let mut lo = 0u64;
    let mut best: Option<f64> = None;
    for k in 0..opts.ndr_trials.max(1) {
        let rate = if k == 0 { hi } else { (lo + hi) / 2 };
        if rate < 1000 {
            break;
        }
        let t = trial(ctx, target, rate, opts.ndr_trial_s, Event::None)?;
        let ok = t.loss_ratio() <= NDR_LOSS_MAX;
        eprintln!(
            "perf-lab: NDR trial {k}: {rate} pps asked, {:.0} offered, {:.0} forwarded, loss {:.4}% -> {}",
            t.offered_pps,
            t.forwarded_pps,
            t.loss_ratio() * 100.0,
            if ok { "pass" } else { "fail" }
        );
        trials.push(t.summary(rate));
        if ok {
            best = Some(best.unwrap_or(0.0).max(t.offered_pps));
            lo = rate;
            if k == 0 {
                break;
            }
        } else {
            hi = rate;
        }
    }
    Ok((best, trials))
}

fn saturation(ctx: &mut Ctx<'_>, target: &Running) -> anyhow::Result<RunResult> {
    let opts = ctx.opts;
    // The reflector sits on up0, the LB's backend-side peer, so the loop is LB -> up0 -> LB
    // with no bridge; up0's NAPI (the reflector) runs in a thread pinned to the generator
    // core, and the XDP_TX'd frames' receive on xvs-b0 follows it there. The LB core does
    // only the LB's work. A veth takes XDP_TX frames only when it has NAPI, i.e. an XDP
    // program: the AF_XDP targets have theirs, the kernel targets get `xdp_pass`.
    let pass = match opts.target {
        Target::Nft | Target::Iptables => {
            Some(Reflector::attach_pass(&ctx.rig.ns_lb(), IF_LB_BACKEND)?)
        }
        Target::Xvs | Target::L2fwd => None,
    };
    let mut reflector = Reflector::attach(&ctx.rig.ns_switch(), "up0", VIP)?;
    thread_napi(&ctx.rig.ns_switch(), "up0", opts.placement.gen_core)
        .context("moving the reflector off the LB core")?;
    let mut gspec = ctx.gspec.clone();
    gspec.rate_pps = 0;
    gspec.count = Some(opts.burst);
    gspec.duration = Duration::from_secs(5);
    let h = generator::spawn(
        gspec,
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    )?;
    let g = h
        .join()
        .map_err(|_| anyhow::anyhow!("generator panicked"))??;
    // Let the burst settle into the loop, then measure.
    std::thread::sleep(Duration::from_millis(300));
    let r0 = reflector.reflected();
    let passed = reflector.passed();
    eprintln!(
        "perf-lab: saturation: {} injected, {r0} reflected and {passed} passed before measuring",
        g.sent
    );
    let per0 = reflector.per_backend(ctx.rig.backends);
    let (lb_core, gen_core) = (opts.placement.lb_core, opts.placement.gen_core);
    let cpu0 = cpu::sample(target, lb_core, gen_core);
    let t0 = mono_ns();
    std::thread::sleep(Duration::from_secs_f64(opts.duration_s));
    let r1 = reflector.reflected();
    let t1 = mono_ns();
    let cpu1 = cpu::sample(target, lb_core, gen_core);
    let per: Vec<u64> = reflector
        .per_backend(ctx.rig.backends)
        .iter()
        .zip(&per0)
        .map(|(p1, p0)| p1 - p0)
        .collect();
    let fwd = r1 - r0;
    let cpu = cpu::between(&cpu0, &cpu1, fwd);
    // Stop the loop and count what still circulates: every injected packet not among those
    // was lost somewhere (LB or rig) during the run.
    reflector.drain()?;
    std::thread::sleep(Duration::from_millis(300));
    let remaining = reflector.drained();
    eprintln!("perf-lab: saturation: {remaining} packets were still circulating at the end");
    let lost = g.sent.saturating_sub(remaining);
    let offered = reflector.reflected() + remaining + lost;
    drop(reflector);
    drop(pass);
    Ok(RunResult {
        scenario: opts.scenario,
        target: opts.target,
        mode: Mode::Saturation,
        duration_s: opts.duration_s,
        kind: ctx.gspec.kind,
        size: opts.size.to_string(),
        flows: ctx.gspec.flows,
        services: ctx.svc.count,
        backends: opts.backends,
        queues: opts.queues,
        rate_pps: 0,
        offered_pps: None,
        forwarded_pps: fwd as f64 * 1e9 / (t1 - t0).max(1) as f64,
        sent: g.sent,
        received: fwd,
        lost: Some(lost),
        loss_ratio: Some(lost as f64 / offered.max(1) as f64),
        duplicates: 0,
        other_frames: 0,
        bad_checksums: 0,
        per_backend: per,
        latency_us: Latency::default(),
        cpu_ns_per_pkt: cpu.ns_per_pkt,
        lb_process_cpu_ns: cpu.proc_ns,
        lb_core_softirq_ns: cpu.irq_ns,
        lb_core_busy_ratio: cpu.lb_core_busy_ratio,
        target_busy_ratio: cpu.target_busy_ratio,
        rig_core_busy_ratio: cpu.rig_busy_ratio,
        cpu_method: cpu::METHOD.into(),
        napi_busy_poll: None,
        ndr_pps: None,
        ndr_trials: Vec::new(),
        latency_at_rate: None,
        swap: None,
        restart: None,
        target_counters: BTreeMap::new(),
        notes: Vec::new(),
        meta: None,
        latency_hgrm: None,
        bulk_tcp: None,
        conn_rate: None,
        histograms: Vec::new(),
    })
}

/// Writes the latency histograms of `r` beside `path` (`STEM.hgrm` for the main run,
/// `STEM.TRIAL.hgrm` for the others), records them in `r.latency_hgrm`, and writes `r` as
/// JSON to `path`.
pub fn write_result(r: &mut RunResult, path: &Path) -> anyhow::Result<()> {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "result".into());
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(d) = dir {
        std::fs::create_dir_all(d)?;
    }
    let mut files = BTreeMap::new();
    for (name, h) in &r.histograms {
        if h.is_empty() {
            continue;
        }
        let file = if name == "main" {
            format!("{stem}.hgrm")
        } else {
            format!("{stem}.{}.hgrm", name.replace('_', "-"))
        };
        let p = dir.map_or_else(|| PathBuf::from(&file), |d| d.join(&file));
        std::fs::write(&p, hgrm::percentile_distribution(h))
            .with_context(|| format!("writing {}", p.display()))?;
        files.insert(name.clone(), file);
    }
    r.latency_hgrm = (!files.is_empty()).then_some(files);
    write_json(r, path)
}

/// The one-line human summary `run` prints on stderr.
pub fn summary_line(r: &RunResult) -> String {
    let n0 = |v: f64| group_thousands(v.round() as u64);
    let mode = match r.mode {
        Mode::Generator => "generator",
        Mode::Saturation => "saturation",
        Mode::Dsr => "dsr",
    };
    let mut parts = vec![];
    if let Some(runs) = &r.bulk_tcp {
        for b in runs {
            parts.push(format!(
                "{} stream{}: {:.2} Gbit/s, {} retransmits",
                b.streams,
                if b.streams == 1 { "" } else { "s" },
                b.gbit_s,
                b.retransmits.map_or("unknown".into(), |n| n.to_string())
            ));
        }
    }
    if let Some(c) = &r.conn_rate {
        parts.push(format!(
            "{} connections/s ({} completed, {} failed), p50 {} / p99 {} ms",
            n0(c.conn_per_s),
            group_thousands(c.completed),
            group_thousands(c.failed),
            c.latency_ms.p50.map_or("–".into(), |v| format!("{v:.3}")),
            c.latency_ms.p99.map_or("–".into(), |v| format!("{v:.3}")),
        ));
    }
    if let Some(o) = r.offered_pps {
        parts.push(format!("offered {} pps", n0(o)));
    }
    parts.push(format!("forwarded {} pps", n0(r.forwarded_pps)));
    if let Some(l) = r.loss_ratio {
        parts.push(format!("loss {:.3}%", l * 100.0));
    }
    let us = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.1}"));
    if r.latency_us.p50.is_some() {
        parts.push(format!(
            "latency p50/p99/p99.9 {}/{}/{} µs",
            us(r.latency_us.p50),
            us(r.latency_us.p99),
            us(r.latency_us.p999)
        ));
    }
    if let Some(l) = &r.latency_at_rate {
        parts.push(format!(
            "at {} pps: p50/p99 {}/{} µs",
            n0(l.trial.rate_pps as f64),
            us(l.latency_us.p50),
            us(l.latency_us.p99)
        ));
    }
    if let Some(c) = r.cpu_ns_per_pkt {
        parts.push(format!("{} ns/pkt", n0(c)));
    }
    match r.target_busy_ratio {
        Some(t) => parts.push(format!(
            "busy target {:.0}% / rig {:.0}%",
            t * 100.0,
            r.rig_core_busy_ratio * 100.0
        )),
        None => parts.push(format!("busy rig {:.0}%", r.rig_core_busy_ratio * 100.0)),
    }
    if !r.ndr_trials.is_empty() {
        parts.push(match r.ndr_pps {
            Some(n) => format!("NDR {} pps", n0(n)),
            None => "NDR not found (every trial lost more than 0.1%)".into(),
        });
    }
    format!(
        "perf-lab: {} {} {mode}: {}",
        r.scenario.name(),
        r.target.name(),
        parts.join(", ")
    )
}

/// `1234567` as `1,234,567`.
pub fn group_thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Writes `r` as pretty JSON to `path`.
pub fn write_json(r: &RunResult, path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(r)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// The xvs binary next to the workspace's target directory: release, else debug.
pub fn default_xvs() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let release = root.join("target/release/xvs");
    if release.exists() {
        release
    } else {
        root.join("target/debug/xvs")
    }
}
