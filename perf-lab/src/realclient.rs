//! The real-client scenarios: kernel TCP stacks on both sides of the load balancer, driven
//! by ordinary tools instead of the AF_XDP generator and sinks.
//!
//! - `bulk-tcp`: iperf3 (client in the client namespace, server on backend 1) through the
//!   VIP, one run with 1 stream and one with 8 (each `--duration` seconds). The service has
//!   one backend: iperf3's control and data connections must reach the same server.
//! - `conn-rate`: ApacheBench (`ab`, HTTP/1.0, no keep-alive: one TCP connection per
//!   request) at concurrency [`AB_CONCURRENCY`] for `--duration` seconds against
//!   `perf-lab http-serve` on every backend (a 100-byte response, then the server closes).
//!
//! Both use DNAT (xvs `mode = "nat"`, the kernel targets without masquerade): the backends'
//! replies come back through the LB node by their default route, as with kube-proxy.
//! `--mode dsr` (bulk-tcp only) runs downloads (`iperf3 -R`); xvs forwards by direct server
//! return (`l2`: only the MAC changes) to backend 1, which holds the VIP and replies over a
//! veth of its own to the client ([`dsr_backend`]); the kernel targets DNAT as above. The
//! clients and servers are pinned to the rig (generator) core, so the LB core does only the
//! load balancer's work, as in the packet scenarios. Every tool runs under `timeout`.
//!
//! Each run records the tool's own figures, the packets the client sent and the backends
//! received (interface counters), the CPU split ([`crate::cpu`]) and, for xvs, the change of
//! its worker counters (`xvs_tx_ring_full_total`, ...).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::bench::{Ctx, Latency, Mode, RunOpts, RunResult, Scenario};
use crate::cpu;
use crate::rig::{
    BACKEND_PORT, CLIENT_IP, IF_BACKEND, IF_CLIENT, LB_BACKEND_IP, LB_BACKEND_MAC, VIP, mac_str,
};
use crate::sys::{metric_sum, run, sh_in};
use crate::target::{Running, Target};

/// iperf3 streams of the bulk-tcp runs, in order.
pub const IPERF_STREAMS: [u32; 2] = [1, 8];
/// ab's concurrency (connections in flight).
pub const AB_CONCURRENCY: u32 = 16;
/// Body bytes of `http-serve`'s response.
pub const RESPONSE_BYTES: usize = 100;
/// The service port the clients connect to (the scenario's one service).
const SERVICE_PORT: u16 = 1000;

/// xvs counters whose change over a run is recorded (`target_metrics`).
const XVS_METRICS: [&str; 7] = [
    "xvs_rx_packets_total",
    "xvs_tx_packets_total",
    "xvs_tx_ring_full_total",
    "xvs_tx_no_port_total",
    "xvs_drops_total",
    "xvs_slow_packets_total",
    "xvs_new_flows_total",
];

/// One iperf3 run of bulk-tcp.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BulkRun {
    /// Parallel streams (`iperf3 -P`).
    pub streams: u32,
    /// Seconds (`iperf3 -t`).
    pub seconds: f64,
    /// iperf3's goodput at the receiver (`end.sum_received`), Gbit/s.
    pub gbit_s: f64,
    /// At the sender (`end.sum_sent`), Gbit/s.
    pub sender_gbit_s: f64,
    /// TCP retransmissions of the sender (`end.sum_sent.retransmits`).
    pub retransmits: Option<u64>,
    /// Packets the client's interface sent (towards the LB) during the run.
    pub client_packets: u64,
    /// Packets the backend's interface received during the run.
    pub backend_packets: u64,
    /// The target's busy share of the run (see [`crate::cpu`]).
    pub target_busy_ratio: Option<f64>,
    /// The LB core's non-idle share.
    pub lb_core_busy_ratio: f64,
    /// The rig core's (iperf3 client and server, the veths' receive) busy share.
    pub rig_core_busy_ratio: f64,
    /// Target CPU ns per packet the backend received.
    pub cpu_ns_per_pkt: Option<f64>,
    /// The rig core's busy time per packet the backend received, ns: what the clients,
    /// servers and the veths' receive (for the AF_XDP targets: the XDP program and the copy
    /// into the UMEM, the frees of the transmitted copies) cost per forwarded packet.
    #[serde(default)]
    pub rig_ns_per_pkt: Option<f64>,
    /// xvs: the change of its worker counters over the run (empty for other targets).
    pub target_metrics: BTreeMap<String, f64>,
}

/// The conn-rate run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConnRate {
    /// The client: `ab`.
    pub client: String,
    /// Connections in flight (`ab -c`).
    pub concurrency: u32,
    /// Seconds ab ran (`Time taken for tests`).
    pub seconds: f64,
    /// Body bytes of each response.
    pub response_bytes: u64,
    /// Requests completed (`Complete requests`), one TCP connection each.
    pub completed: u64,
    /// `Failed requests` (connect, receive, length or exception errors).
    pub failed: u64,
    /// `Non-2xx responses`.
    pub non_2xx: u64,
    /// Connections (requests) per second: completed / seconds.
    pub conn_per_s: f64,
    /// Time of one request from connect to close, ms (ab's percentiles; `p999` is null:
    /// ab gives whole percents).
    pub latency_ms: Latency,
    /// The target's busy share of the run.
    pub target_busy_ratio: Option<f64>,
    /// The LB core's non-idle share.
    pub lb_core_busy_ratio: f64,
    /// The rig core's (ab, the servers, the veths' receive) busy share.
    pub rig_core_busy_ratio: f64,
    /// Target CPU µs per completed connection.
    pub cpu_us_per_conn: Option<f64>,
    /// The rig core's busy time per completed connection, µs.
    #[serde(default)]
    pub rig_us_per_conn: Option<f64>,
    /// xvs: the change of its worker counters over the run.
    pub target_metrics: BTreeMap<String, f64>,
}

/// Refuses what the real-client scenarios cannot do, before a rig is built.
pub fn check(opts: &RunOpts) -> anyhow::Result<()> {
    if opts.mode == Mode::Dsr && opts.scenario != Scenario::BulkTcp {
        bail!("--mode dsr is a variant of bulk-tcp only");
    }
    if !matches!(opts.scenario, Scenario::BulkTcp | Scenario::ConnRate) {
        return Ok(());
    }
    let name = opts.scenario.name();
    if opts.target == Target::L2fwd {
        bail!(
            "{name} runs kernel TCP through the VIP: it needs a target that translates the \
             address both ways (xvs, nft, iptables); l2fwd only rewrites MACs one way"
        );
    }
    if opts.mode == Mode::Saturation {
        bail!("{name} has no saturation mode (real clients set their own pace): --mode generator");
    }
    let tools: &[&str] = match opts.scenario {
        Scenario::BulkTcp => &["iperf3", "taskset", "timeout", "ss"],
        _ => &["ab", "taskset", "timeout"],
    };
    for t in tools {
        if run(&["sh", "-c", &format!("command -v {t}")]).is_err() {
            bail!("{name} needs {t} (scripts/deps installs it)");
        }
    }
    if opts.duration_s < 0.5 || opts.duration_s > 600.0 {
        bail!("{name}: --duration must be 0.5..600 s");
    }
    Ok(())
}

/// Processes started in the rig's namespaces, killed (and reaped) when dropped.
struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the scenario (the target is up) and returns its result.
pub(crate) fn run_scenario(ctx: &mut Ctx<'_>, target: &Running) -> anyhow::Result<RunResult> {
    let opts = ctx.opts;
    let rig = ctx.rig;
    // The backends' gateway is static like every other neighbour of the rig.
    for i in 1..=rig.backends {
        run(&[
            "ip",
            "-n",
            &rig.ns_backend(i),
            "neigh",
            "replace",
            &LB_BACKEND_IP.to_string(),
            "lladdr",
            &mac_str(LB_BACKEND_MAC),
            "dev",
            IF_BACKEND,
            "nud",
            "permanent",
        ])?;
    }
    // Short connections: the whole port range, TIME_WAIT ports reused.
    sh_in(
        &rig.ns_client(),
        "sysctl -qw net.ipv4.ip_local_port_range='1024 65000' net.ipv4.tcp_tw_reuse=1",
    )?;
    // The clients' and servers' receive (and the TCP transmits it triggers: an ACK clocks
    // out the next segments) on the rig core: a veth delivers on the sending CPU, which for
    // what the LB transmits is the LB core, where it would be charged to the target.
    let mask = format!("{:x}", 1u64 << opts.placement.gen_core);
    let rps = |ns: &str, ifname: &str| {
        sh_in(
            ns,
            &format!(
                "for f in /sys/class/net/{ifname}/queues/rx-*/rps_cpus; do echo {mask} > $f; done"
            ),
        )
    };
    rps(&rig.ns_client(), IF_CLIENT)?;
    for i in 1..=rig.backends {
        rps(&rig.ns_backend(i), IF_BACKEND)?;
    }
    let backends: Vec<u16> = (1..=ctx.svc.backends).collect();
    let counters0 = link_packets(ctx, &backends)?;
    let (lb_core, gen_core) = (opts.placement.lb_core, opts.placement.gen_core);
    let cpu0 = cpu::sample(target, lb_core, gen_core);
    let mut r = empty_result(ctx);
    match opts.scenario {
        Scenario::BulkTcp => {
            if ctx.svc.dsr {
                dsr_backend(ctx, 1)?;
            }
            let _servers = Servers(vec![iperf3_server(ctx, 1)?]);
            let mut runs = Vec::new();
            for streams in IPERF_STREAMS {
                let b = bulk_run(ctx, target, streams)?;
                eprintln!(
                    "perf-lab: bulk-tcp {} {streams} stream{}: {:.2} Gbit/s, {} retransmits, \
                     busy target {} / rig {:.0}%",
                    opts.target.name(),
                    if streams == 1 { "" } else { "s" },
                    b.gbit_s,
                    b.retransmits.map_or("-".into(), |n| n.to_string()),
                    pct(b.target_busy_ratio),
                    b.rig_core_busy_ratio * 100.0
                );
                runs.push(b);
            }
            r.flows = IPERF_STREAMS.iter().map(|s| s + 1).sum();
            r.bulk_tcp = Some(runs);
        }
        Scenario::ConnRate => {
            let mut servers = Servers(Vec::new());
            for &i in &backends {
                servers.0.push(http_server(ctx, i)?);
            }
            let c = conn_run(ctx, target)?;
            r.flows = u32::try_from(c.completed + c.failed).unwrap_or(u32::MAX);
            r.conn_rate = Some(c);
            drop(servers);
        }
        _ => bail!("{} is not a real-client scenario", opts.scenario.name()),
    }
    let cpu1 = cpu::sample(target, lb_core, gen_core);
    let counters1 = link_packets(ctx, &backends)?;
    let secs = (cpu1.wall_ns() - cpu0.wall_ns()) as f64 / 1e9;
    let sent = counters1.0 - counters0.0;
    let per_backend: Vec<u64> = counters1
        .1
        .iter()
        .zip(&counters0.1)
        .map(|(a, b)| a - b)
        .collect();
    let received: u64 = per_backend.iter().sum();
    let f = cpu::between(&cpu0, &cpu1, received);
    r.offered_pps = Some(sent as f64 / secs);
    r.forwarded_pps = received as f64 / secs;
    r.sent = sent;
    r.received = received;
    r.lost = Some(sent.saturating_sub(received));
    r.loss_ratio = Some(sent.saturating_sub(received) as f64 / sent.max(1) as f64);
    r.per_backend = per_backend;
    r.cpu_ns_per_pkt = f.ns_per_pkt;
    r.lb_process_cpu_ns = f.proc_ns;
    r.lb_core_softirq_ns = f.irq_ns;
    r.lb_core_busy_ratio = f.lb_core_busy_ratio;
    r.target_busy_ratio = f.target_busy_ratio;
    r.rig_core_busy_ratio = f.rig_busy_ratio;
    Ok(r)
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.0}%", v * 100.0))
}

/// The result's common keys for a real-client run (rates and CPU filled in by the caller).
fn empty_result(ctx: &Ctx<'_>) -> RunResult {
    let opts = ctx.opts;
    RunResult {
        scenario: opts.scenario,
        target: opts.target,
        mode: ctx.opts.mode,
        duration_s: opts.duration_s,
        kind: ctx.gspec.kind,
        size: "-".into(),
        flows: 0,
        services: ctx.svc.count,
        backends: ctx.svc.backends,
        queues: opts.queues,
        rate_pps: 0,
        offered_pps: None,
        forwarded_pps: 0.0,
        sent: 0,
        received: 0,
        lost: None,
        loss_ratio: None,
        duplicates: 0,
        other_frames: 0,
        bad_checksums: 0,
        per_backend: Vec::new(),
        latency_us: Latency::default(),
        cpu_ns_per_pkt: None,
        lb_process_cpu_ns: None,
        lb_core_softirq_ns: 0,
        lb_core_busy_ratio: 0.0,
        target_busy_ratio: None,
        rig_core_busy_ratio: 0.0,
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
    }
}

/// Packets sent by the client's interface and received by each backend's (in order).
fn link_packets(ctx: &Ctx<'_>, backends: &[u16]) -> anyhow::Result<(u64, Vec<u64>)> {
    let tx = link_counter(&ctx.rig.ns_client(), IF_CLIENT, "tx")?;
    let rx = backends
        .iter()
        .map(|&i| link_counter(&ctx.rig.ns_backend(i), IF_BACKEND, "rx"))
        .collect::<anyhow::Result<_>>()?;
    Ok((tx, rx))
}

/// `ip -s link`'s packet count of `dir` ("rx"/"tx") of `ifname` in `ns`.
fn link_counter(ns: &str, ifname: &str, dir: &str) -> anyhow::Result<u64> {
    let out = run(&["ip", "-n", ns, "-j", "-s", "link", "show", "dev", ifname])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("ip -j -s link")?;
    v[0]["stats64"][dir]["packets"]
        .as_u64()
        .with_context(|| format!("no {dir} packets for {ifname} in {ns}: {out}"))
}

/// xvs' counters of interest now (empty for other targets).
fn xvs_metrics(target: &Running) -> BTreeMap<String, f64> {
    let Some(text) = target.xvs_metrics() else {
        return BTreeMap::new();
    };
    XVS_METRICS
        .iter()
        .filter_map(|m| {
            Some((
                m.trim_end_matches("_total")
                    .trim_start_matches("xvs_")
                    .to_owned(),
                metric_sum(&text, m)?,
            ))
        })
        .collect()
}

fn metrics_delta(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    b.iter()
        .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// `ip netns exec NS taskset -c CORE ARGV...` with output to `log`.
fn spawn_in(ns: &str, core: usize, argv: &[&str], log: &Path) -> anyhow::Result<Child> {
    let f = std::fs::File::create(log)?;
    Command::new("ip")
        .args(["netns", "exec", ns, "taskset", "-c", &core.to_string()])
        .args(argv)
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
        .with_context(|| format!("starting {} in {ns}", argv.join(" ")))
}

/// Waits (at most 5 s) until something listens on TCP `port` in `ns`.
fn wait_listening(ns: &str, port: u16, child: &mut Child, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = sh_in(ns, &format!("ss -Hltn 'sport = :{port}'")).unwrap_or_default();
        if !out.trim().is_empty() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            bail!(
                "server in {ns} exited ({st}): {}",
                std::fs::read_to_string(log).unwrap_or_default().trim()
            );
        }
        if Instant::now() > deadline {
            bail!("nothing listens on port {port} in {ns} after 5 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The direct link of `--mode dsr`: backend 1's replies go straight to the client.
const IF_DSR: &str = "dsr0";
/// Its MACs (client side, backend side).
const DSR_CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0xd5, 2];
const DSR_BACKEND_MAC: [u8; 6] = [2, 0, 0, 0, 0xd5, 1];

/// Backend `b` for `--mode dsr` (xvs's `encap = "l2"`, IPVS's DR: the rig's backends share
/// the LB's segment, and its kernel may have no IPIP module to decapsulate with): the VIP on
/// `lo` (not answered for: `arp_ignore`), no reverse-path filter (the client's packets come
/// in on `b0`, their replies leave by the direct link), and a veth to the client namespace
/// that carries the replies, with static neighbours; the client takes packets from the VIP
/// on it (no reverse-path filter there either). Gone with the rig's namespaces.
fn dsr_backend(ctx: &Ctx<'_>, b: u16) -> anyhow::Result<()> {
    let (bns, cns) = (ctx.rig.ns_backend(b), ctx.rig.ns_client());
    sh_in(
        &bns,
        &format!(
            "ip addr add {VIP}/32 dev lo && \
             sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
               net.ipv4.conf.{IF_BACKEND}.rp_filter=0 net.ipv4.conf.all.arp_ignore=1 \
               net.ipv4.conf.all.arp_announce=2"
        ),
    )?;
    run(&[
        "ip",
        "-n",
        &cns,
        "link",
        "add",
        IF_DSR,
        "address",
        &mac_str(DSR_CLIENT_MAC),
        "type",
        "veth",
        "peer",
        "name",
        IF_DSR,
        "address",
        &mac_str(DSR_BACKEND_MAC),
        "netns",
        &bns,
    ])?;
    sh_in(
        &cns,
        &format!(
            "ip link set {IF_DSR} up && sysctl -qw net.ipv4.conf.all.rp_filter=0 \
             net.ipv4.conf.{IF_DSR}.rp_filter=0 net.ipv4.conf.default.rp_filter=0 && \
             ethtool -K {IF_DSR} tx off >/dev/null"
        ),
    )?;
    sh_in(
        &bns,
        &format!(
            "ip link set {IF_DSR} up && ip route add {CLIENT_IP}/32 dev {IF_DSR} && \
             ip neigh replace {CLIENT_IP} lladdr {} dev {IF_DSR} nud permanent && \
             ethtool -K {IF_DSR} tx off >/dev/null",
            mac_str(DSR_CLIENT_MAC)
        ),
    )?;
    Ok(())
}

fn iperf3_server(ctx: &Ctx<'_>, backend: u16) -> anyhow::Result<Child> {
    let ns = ctx.rig.ns_backend(backend);
    let log = ctx
        .opts
        .placement
        .dir
        .join(format!("iperf3-server-b{backend}.log"));
    // DSR: the client's packets arrive as sent, to the service's port.
    let listen = if ctx.svc.dsr {
        SERVICE_PORT
    } else {
        BACKEND_PORT
    };
    let port = listen.to_string();
    let mut c = spawn_in(
        &ns,
        ctx.opts.placement.gen_core,
        &["iperf3", "-s", "-p", &port],
        &log,
    )?;
    wait_listening(&ns, listen, &mut c, &log)?;
    Ok(c)
}

fn http_server(ctx: &Ctx<'_>, backend: u16) -> anyhow::Result<Child> {
    let ns = ctx.rig.ns_backend(backend);
    let log = ctx
        .opts
        .placement
        .dir
        .join(format!("http-serve-b{backend}.log"));
    let me = std::env::current_exe()?.to_string_lossy().into_owned();
    let (port, size) = (BACKEND_PORT.to_string(), RESPONSE_BYTES.to_string());
    let mut c = spawn_in(
        &ns,
        ctx.opts.placement.gen_core,
        &[&me, "http-serve", "--port", &port, "--size", &size],
        &log,
    )?;
    wait_listening(&ns, BACKEND_PORT, &mut c, &log)?;
    Ok(c)
}

/// Runs `argv` in the client namespace on the rig core, under `timeout` (`limit_s`, then
/// SIGKILL 2 s later); its stdout.
fn client(ctx: &Ctx<'_>, argv: &[&str], limit_s: f64) -> anyhow::Result<String> {
    let core = ctx.opts.placement.gen_core.to_string();
    let limit = format!("{limit_s:.0}");
    let mut full = vec![
        "ip",
        "netns",
        "exec",
        &ctx.rig.ns_client(),
        "timeout",
        "-k",
        "2",
        &limit,
        "taskset",
        "-c",
        &core,
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    full.extend(argv.iter().map(|s| (*s).to_owned()));
    let out = Command::new(&full[0])
        .args(&full[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", argv.join(" ")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {} {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            stdout.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        );
    }
    Ok(stdout)
}

fn bulk_run(ctx: &Ctx<'_>, target: &Running, streams: u32) -> anyhow::Result<BulkRun> {
    let opts = ctx.opts;
    let backends = [1u16];
    let c0 = link_packets(ctx, &backends)?;
    let m0 = xvs_metrics(target);
    let (lb_core, gen_core) = (opts.placement.lb_core, opts.placement.gen_core);
    let cpu0 = cpu::sample(target, lb_core, gen_core);
    let (vip, port, secs, p) = (
        VIP.to_string(),
        SERVICE_PORT.to_string(),
        format!("{}", opts.duration_s),
        streams.to_string(),
    );
    let mut argv = vec![
        "iperf3",
        "-c",
        &vip,
        "-p",
        &port,
        "-t",
        &secs,
        "-P",
        &p,
        "-J",
        "--connect-timeout",
        "3000",
    ];
    if opts.mode == Mode::Dsr {
        // Downloads: the direction DSR takes off the load balancer.
        argv.push("-R");
    }
    let json = client(ctx, &argv, opts.duration_s + 20.0)?;
    let cpu1 = cpu::sample(target, lb_core, gen_core);
    let m1 = xvs_metrics(target);
    let c1 = link_packets(ctx, &backends)?;
    let (gbit_s, sender_gbit_s, retransmits) = parse_iperf3(&json)?;
    let backend_packets = c1.1[0] - c0.1[0];
    let f = cpu::between(&cpu0, &cpu1, backend_packets);
    Ok(BulkRun {
        streams,
        seconds: opts.duration_s,
        gbit_s,
        sender_gbit_s,
        retransmits,
        client_packets: c1.0 - c0.0,
        backend_packets,
        target_busy_ratio: f.target_busy_ratio,
        lb_core_busy_ratio: f.lb_core_busy_ratio,
        rig_core_busy_ratio: f.rig_busy_ratio,
        cpu_ns_per_pkt: f.ns_per_pkt,
        rig_ns_per_pkt: rig_per(&cpu0, &cpu1, f.rig_busy_ratio, backend_packets),
        target_metrics: metrics_delta(&m0, &m1),
    })
}

/// (receiver Gbit/s, sender Gbit/s, retransmits) of `iperf3 -J` output.
pub fn parse_iperf3(json: &str) -> anyhow::Result<(f64, f64, Option<u64>)> {
    let v: serde_json::Value = serde_json::from_str(json).context("iperf3 -J output")?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let end = &v["end"];
    let rx = end["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3: no end.sum_received")?;
    let tx = end["sum_sent"]["bits_per_second"]
        .as_f64()
        .context("iperf3: no end.sum_sent")?;
    Ok((rx / 1e9, tx / 1e9, end["sum_sent"]["retransmits"].as_u64()))
}

fn conn_run(ctx: &Ctx<'_>, target: &Running) -> anyhow::Result<ConnRate> {
    let opts = ctx.opts;
    let m0 = xvs_metrics(target);
    let (lb_core, gen_core) = (opts.placement.lb_core, opts.placement.gen_core);
    let csv = opts.placement.dir.join("ab-percentiles.csv");
    let _ = std::fs::remove_file(&csv);
    let csv_s = csv.to_string_lossy().into_owned();
    let url = format!("http://{VIP}:{SERVICE_PORT}/");
    let (secs, conc) = (
        format!("{}", opts.duration_s.ceil().max(1.0)),
        AB_CONCURRENCY.to_string(),
    );
    let cpu0 = cpu::sample(target, lb_core, gen_core);
    // -t before -n: -t implies -n 50000, a later -n lifts it. -r: count receive errors
    // instead of stopping; -s: per-connection timeout.
    let out = client(
        ctx,
        &[
            "ab",
            "-q",
            "-r",
            "-s",
            "5",
            "-t",
            &secs,
            "-n",
            "100000000",
            "-c",
            &conc,
            "-e",
            &csv_s,
            &url,
        ],
        opts.duration_s + 20.0,
    )?;
    let cpu1 = cpu::sample(target, lb_core, gen_core);
    let m1 = xvs_metrics(target);
    let mut c = parse_ab(&out, &std::fs::read_to_string(&csv).unwrap_or_default())?;
    let f = cpu::between(&cpu0, &cpu1, c.completed);
    c.target_busy_ratio = f.target_busy_ratio;
    c.lb_core_busy_ratio = f.lb_core_busy_ratio;
    c.rig_core_busy_ratio = f.rig_busy_ratio;
    c.cpu_us_per_conn = f.ns_per_pkt.map(|n| n / 1000.0);
    c.rig_us_per_conn = rig_per(&cpu0, &cpu1, f.rig_busy_ratio, c.completed).map(|n| n / 1000.0);
    c.target_metrics = metrics_delta(&m0, &m1);
    Ok(c)
}

/// ab's report (stdout) and its `-e` percentile CSV.
pub fn parse_ab(out: &str, csv: &str) -> anyhow::Result<ConnRate> {
    let field = |name: &str| -> Option<f64> {
        out.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.trim_start().strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
    };
    let completed = field("Complete requests").context("ab: no `Complete requests`")? as u64;
    let seconds = field("Time taken for tests").context("ab: no `Time taken for tests`")?;
    let pct: BTreeMap<u32, f64> = csv
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (p, ms) = l.split_once(',')?;
            Some((p.trim().parse().ok()?, ms.trim().parse().ok()?))
        })
        .collect();
    Ok(ConnRate {
        client: "ab".into(),
        concurrency: AB_CONCURRENCY,
        seconds,
        response_bytes: RESPONSE_BYTES as u64,
        completed,
        failed: field("Failed requests").unwrap_or(0.0) as u64,
        non_2xx: field("Non-2xx responses").unwrap_or(0.0) as u64,
        conn_per_s: if seconds > 0.0 {
            completed as f64 / seconds
        } else {
            0.0
        },
        latency_ms: Latency {
            p50: pct.get(&50).copied(),
            p99: pct.get(&99).copied(),
            p999: None,
            max: pct.get(&100).copied(),
        },
        target_busy_ratio: None,
        lb_core_busy_ratio: 0.0,
        rig_core_busy_ratio: 0.0,
        cpu_us_per_conn: None,
        rig_us_per_conn: None,
        target_metrics: BTreeMap::new(),
    })
}

/// The rig core's busy ns per unit (packet, connection) over the window `a..b`.
fn rig_per(a: &cpu::Sample, b: &cpu::Sample, busy_ratio: f64, units: u64) -> Option<f64> {
    (units > 0).then(|| busy_ratio * b.wall_ns().saturating_sub(a.wall_ns()) as f64 / units as f64)
}

/// `perf-lab http-serve`: an HTTP/1.0 server for conn-rate's backends. `threads` threads
/// accept on one listener; each connection gets its request read (up to the blank line, 2 s
/// at most), a `200 OK` with `size` bytes, and is closed by the server. Runs until killed.
pub fn http_serve(port: u16, size: usize, threads: usize) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
        .with_context(|| format!("binding port {port}"))?;
    let mut response = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {size}\r\nConnection: \
         close\r\n\r\n"
    )
    .into_bytes();
    response.extend(std::iter::repeat_n(b'x', size));
    let response: &'static [u8] = Box::leak(response.into_boxed_slice());
    eprintln!("perf-lab http-serve: listening on port {port}");
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                let mut buf = [0u8; 4096];
                loop {
                    let Ok((mut c, _)) = l.accept() else { continue };
                    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                    let _ = c.set_nodelay(true);
                    let mut have = 0;
                    while have < buf.len() {
                        match c.read(&mut buf[have..]) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => have += n,
                        }
                        if buf[..have].windows(4).any(|w| w == b"\r\n\r\n") {
                            let _ = c.write_all(response);
                            break;
                        }
                    }
                }
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_json() {
        let json = r#"{"start":{},"end":{"sum_sent":{"bits_per_second":2.5e9,"retransmits":3},
            "sum_received":{"bits_per_second":2.4e9}}}"#;
        assert_eq!(parse_iperf3(json).unwrap(), (2.4, 2.5, Some(3)));
        let err = r#"{"start":{},"end":{},"error":"unable to connect to server"}"#;
        assert!(format!("{:#}", parse_iperf3(err).unwrap_err()).contains("unable to connect"));
    }

    #[test]
    fn ab_report_and_percentiles() {
        let out = "Concurrency Level:      16\nTime taken for tests:   2.000 seconds\n\
                   Complete requests:      10000\nFailed requests:        2\n\
                   Non-2xx responses:      1\nRequests per second:    5000.00 [#/sec] (mean)\n";
        let mut csv = String::from("Percentage served,Time in ms\n");
        for p in 0..=100 {
            csv.push_str(&format!("{p},{:.3}\n", f64::from(p) / 10.0));
        }
        let c = parse_ab(out, &csv).unwrap();
        assert_eq!((c.completed, c.failed, c.non_2xx), (10_000, 2, 1));
        assert_eq!(c.conn_per_s, 5000.0);
        assert_eq!(c.latency_ms.p50, Some(5.0));
        assert_eq!(c.latency_ms.p99, Some(9.9));
        assert_eq!(c.latency_ms.max, Some(10.0));
        assert!(parse_ab("nothing", "").is_err());
    }

    #[test]
    fn http_serve_answers_and_closes() {
        use std::io::{Read, Write};
        // An ephemeral port on loopback: bind one, free it, serve on it.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        std::thread::spawn(move || http_serve(port, 7, 1));
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = loop {
            match std::net::TcpStream::connect(("127.0.0.1", port)) {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("{e}"),
            }
        };
        c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        assert!(s.starts_with("HTTP/1.0 200 OK\r\n"), "{s}");
        assert!(s.ends_with("\r\n\r\nxxxxxxx"), "{s}");
    }
}
