//! `xvs sim`: the operator's dry run. Each flow of a file goes through the real pipeline
//! (`drive`: synthesized packets, as `xvs pcap` replays frames), so every rule of the
//! fastpath is the simulation's: hygiene (a martian source is dropped), admission (source
//! ranges, freeze, rate limit), the SYN proxy, rejects, Service CIDRs, ClientIP affinity and
//! the schedulers over the flow table's own connection counts. Each line says what the
//! pipeline did with it; a per-backend distribution follows.
//!
//! Input, one flow per line: `proto,src_ip,src_port,dst_ip,dst_port[,open|close]`; blank
//! lines and `#` comments are skipped; each line is one millisecond after the one before (a
//! flow idle past its timeout expires as on a node). A repeated `open` of a flow that is
//! still open is the same connection (the flow table hits) and keeps its backend; `close`
//! ends it (a client RST, an SCTP ABORT; a UDP flow is removed), which lowers the connection
//! counts that lc/wlc/sed/nq/lblc/lblcr read: an open TCP or SCTP connection (its handshake
//! played both ways) counts as active, a closed one and UDP as inactive, as IPVS counts
//! them.
//!
//! Output per line: `proto src -> frontend => backend` when forwarded, else `=> reject
//! (REASON)`, `=> drop (REASON)` or `=> pass` (not xvs's: the host gets it), REASON the
//! pipeline's name (`no_endpoints`, `source_range`, `martian_source`...); `--json` carries
//! `verdict` (`forward`, `reject`, `drop`, `pass`) and `reason`.
//!
//! The services come from the config's `[[services]]`, or with `--objects` from a dump of
//! Kubernetes objects translated by the Kubernetes source's own code (`slowpath::k8s`), as
//! this node (`--node`) would see them, its ServiceCIDRs with `[kubernetes] service_cidrs`.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use config::{Cidr, Config, Protocol};
use fastpath::pipeline::Verdict;
use fastpath::snapshot::{Frontend, L2Table, ServiceSpec, Snapshot, SnapshotBuilder};
use slowpath::k8s::{self, NodeInfo};

mod drive;
mod frames;

use drive::Driver;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Event {
    Open,
    Close,
}

struct FlowLine {
    proto: Protocol,
    src: SocketAddr,
    dst: SocketAddr,
    event: Event,
}

fn parse_line(line: &str) -> Result<FlowLine, String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() != 5 && f.len() != 6 {
        return Err(format!(
            "expected proto,src_ip,src_port,dst_ip,dst_port[,open|close], got {} fields",
            f.len()
        ));
    }
    let proto = match f[0].to_ascii_lowercase().as_str() {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        other => return Err(format!("unknown protocol {other:?} (tcp, udp or sctp)")),
    };
    let ip = |s: &str, what: &str| -> Result<IpAddr, String> {
        s.parse().map_err(|_| format!("invalid {what} {s:?}"))
    };
    let port = |s: &str, what: &str| -> Result<u16, String> {
        s.parse().map_err(|_| format!("invalid {what} {s:?}"))
    };
    let src = SocketAddr::new(ip(f[1], "src_ip")?, port(f[2], "src_port")?);
    let dst = SocketAddr::new(ip(f[3], "dst_ip")?, port(f[4], "dst_port")?);
    if src.is_ipv4() != dst.is_ipv4() {
        return Err("src_ip and dst_ip are of different address families".into());
    }
    let event = match f.get(5).map(|s| s.to_ascii_lowercase()) {
        None => Event::Open,
        Some(e) if e == "open" || e.is_empty() => Event::Open,
        Some(e) if e == "close" => Event::Close,
        Some(e) => return Err(format!("unknown event {e:?} (open or close)")),
    };
    Ok(FlowLine {
        proto,
        src,
        dst,
        event,
    })
}

/// Per-backend tally for the distribution table.
#[derive(Default, Clone)]
struct Tally {
    flows: u64,
    open: u64,
}

type FlowKey = (Protocol, SocketAddr, SocketAddr);

struct Sim {
    driver: Driver,
    snap: Arc<Snapshot>,
    /// Open flows: (service id, backend index).
    open: HashMap<FlowKey, (u32, usize)>,
    /// By service id, then backend index.
    tally: Vec<Vec<Tally>>,
}

/// What happened to one input flow.
struct Outcome {
    service: Option<u32>,
    result: Result<SocketAddr, Verdict>,
}

impl Sim {
    /// The simulation of `snap`: a driver over it and an empty tally per backend.
    fn new(cfg: &Config, snap: Snapshot, epoch: Instant) -> Result<Sim, String> {
        let ids = snap
            .services
            .iter()
            .map(|s| s.id as usize + 1)
            .max()
            .unwrap_or(0);
        let tally = (0..ids)
            .map(|id| {
                let n = snap.services.get(id).map_or(0, |s| s.backends.len());
                vec![Tally::default(); n]
            })
            .collect();
        let driver = Driver::new(cfg, snap, epoch)?;
        let snap = Arc::clone(driver.snapshot());
        Ok(Sim {
            driver,
            snap,
            open: HashMap::new(),
            tally,
        })
    }

    fn step(&mut self, f: &FlowLine, now: Instant) -> Outcome {
        let frontend = Frontend {
            vip: f.dst.ip(),
            protocol: f.proto,
            port: f.dst.port(),
        };
        let service = self.snap.service_for(&frontend).map(|s| s.id);
        let key = (f.proto, f.src, f.dst);
        let result = match f.event {
            Event::Close => {
                let r = self.driver.close(f.proto, f.src, f.dst, now);
                if let Some((s, idx)) = self.open.remove(&key) {
                    self.tally[s as usize][idx].open -= 1;
                }
                r.result
            }
            Event::Open => {
                let r = self.driver.open(f.proto, f.src, f.dst, now);
                if let (true, Ok(backend), Some(s)) = (r.new_flow, r.result, service) {
                    // A new connection (the last one of this tuple ended, or expired).
                    if let Some((old, idx)) = self.open.remove(&key) {
                        self.tally[old as usize][idx].open -= 1;
                    }
                    let svc = &self.snap.services[s as usize];
                    if let Some(idx) = svc.backends.iter().position(|b| b.addr == backend) {
                        let t = &mut self.tally[s as usize][idx];
                        t.flows += 1;
                        t.open += 1;
                        self.open.insert(key, (s, idx));
                    }
                }
                r.result
            }
        };
        Outcome { service, result }
    }
}

/// The verdict words and reason of a line: `forward`, or `reject`/`drop` with the pipeline's
/// reason, or `pass`.
fn verdict_of(r: Result<SocketAddr, Verdict>) -> (&'static str, Option<&'static str>) {
    match r {
        Ok(_) => ("forward", None),
        Err(Verdict::Reject { reason, .. }) => ("reject", Some(reason.name())),
        Err(Verdict::Drop(reason)) => ("drop", Some(reason.name())),
        // (Default routes: every next hop resolves.)
        Err(Verdict::Slow) => ("drop", Some("next_hop_unresolved")),
        Err(Verdict::Pass) => ("pass", None),
        // (A transmitted frame whose backend could not be read: none is built so.)
        Err(Verdict::Tx(_)) => ("forward", None),
    }
}

fn fmt_frontend(dst: SocketAddr) -> String {
    dst.to_string()
}

/// `xvs sim`'s arguments.
pub struct Args {
    pub config: Option<PathBuf>,
    pub objects: Option<PathBuf>,
    pub node: Option<String>,
    pub frozen: Vec<String>,
    pub flows: PathBuf,
    pub json: bool,
}

/// The services and Service CIDRs of a Kubernetes dump as this node's source would publish
/// them; problems (objects or fields ignored) go to stderr as the daemon logs them.
fn objects_specs(
    cfg: &Config,
    path: &Path,
    node: Option<&str>,
) -> Result<(Vec<ServiceSpec>, Vec<Cidr>), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read objects file {}: {e}", path.display()))?;
    let objects = k8s::dump::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let name = node.map_or_else(|| k8s::node_name(cfg), str::to_owned);
    let node_obj = objects.node(&name);
    if node_obj.is_none() && !objects.nodes.is_empty() {
        eprintln!(
            "xvs sim: no Node {name:?} in {} (it has {}): no zone from its label, no addresses from it",
            path.display(),
            objects
                .nodes
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let node_info = NodeInfo::resolve(cfg, &name, node_obj);
    for (kind, n) in &objects.skipped {
        eprintln!("xvs sim: {}: {n} {kind} object(s) skipped", path.display());
    }
    let labels = objects.services.iter().map(|s| {
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k8s::LABEL_SERVICE_PROXY_NAME))
            .map(String::as_str)
    });
    note_other_proxies(cfg, path, labels);
    let model = k8s::build_model_with(
        &objects.services,
        &objects.slices,
        &objects.service_cidrs,
        &node_info,
        cfg,
    );
    for p in &model.problems {
        eprintln!("xvs sim: {p}");
    }
    Ok((model.specs, model.service_cidrs))
}

/// Says on stderr which Services the translation skips because their
/// `service.kubernetes.io/service-proxy-name` label is not this config's
/// `[kubernetes] service_proxy_name` (the daemon skips them silently: they are another
/// proxy's; a dry run that prints nothing for them would look like a bug).
fn note_other_proxies<'a>(
    cfg: &Config,
    path: &Path,
    labels: impl Iterator<Item = Option<&'a str>>,
) {
    let ours = cfg
        .kubernetes
        .as_ref()
        .and_then(|k| k.service_proxy_name.as_deref());
    let mut skipped: std::collections::BTreeMap<&str, usize> = Default::default();
    for label in labels {
        if label != ours {
            *skipped.entry(label.unwrap_or("")).or_default() += 1;
        }
    }
    for (label, n) in skipped {
        let why = match (label, ours) {
            ("", Some(o)) => format!("without the label {}={o}", k8s::LABEL_SERVICE_PROXY_NAME),
            (l, _) => format!("labelled {}={l}", k8s::LABEL_SERVICE_PROXY_NAME),
        };
        let hint = match ours {
            None => " (another proxy's; set [kubernetes] service_proxy_name in --config to simulate them)".to_owned(),
            Some(o) => format!(" (not [kubernetes] service_proxy_name = {o:?}'s)"),
        };
        eprintln!(
            "xvs sim: {}: {n} Service(s) {why} skipped{hint}",
            path.display()
        );
    }
}

/// `xvs sim`'s sequence: load, build, replay, report.
pub fn main(args: Args) -> ExitCode {
    let (cfg, specs, service_cidrs) = match load(&args) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    // As the daemon builds: a service the builder refuses is left out, the others run.
    let mut builder = SnapshotBuilder::from_config(&cfg);
    builder.set_service_cidrs(&service_cidrs);
    let l2 = drive::with_default_routes(L2Table::from_config(&cfg));
    let (snap, refused) = builder.build_isolated(&specs, &l2);
    for r in &refused {
        eprintln!("xvs sim: service {}: refused: {r}", r.name);
    }
    let flows = args.flows.as_path();
    let input: Box<dyn BufRead> = if flows == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        match std::fs::File::open(flows) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                eprintln!("xvs sim: cannot read flows file {}: {e}", flows.display());
                return ExitCode::FAILURE;
            }
        }
    };
    let epoch = Instant::now();
    let mut sim = match Sim::new(&cfg, snap, epoch) {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("xvs sim: {e}");
            return ExitCode::from(crate::EXIT_BAD_CONFIG);
        }
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if let Err(code) = replay(&mut sim, input, flows, epoch, args.json, &mut out) {
        return code;
    }
    let _ = print_distribution(&mut out, &sim, args.json);
    let _ = out.flush();
    ExitCode::SUCCESS
}

/// The configuration and the specs to simulate (from `--objects` or the configuration's
/// services), with `--frozen` applied; the exit code when they cannot be had.
fn load(args: &Args) -> Result<(Config, Vec<ServiceSpec>, Vec<Cidr>), ExitCode> {
    let mut cfg = match &args.config {
        Some(path) => match crate::load_config(Some(path)) {
            Some(c) => c,
            None => return Err(ExitCode::from(crate::EXIT_BAD_CONFIG)),
        },
        None => Config::default(),
    };
    let (mut specs, service_cidrs) = match &args.objects {
        None => (ServiceSpec::from_config(&cfg), Vec::new()),
        Some(path) => {
            if cfg.kubernetes.is_none() {
                // The [kubernetes] defaults: no externalIPs allowed, default scheduler rr.
                cfg.kubernetes = Some(
                    serde_json::from_value(serde_json::json!({}))
                        .expect("[kubernetes] has a default for every key"),
                );
            }
            objects_specs(&cfg, path, args.node.as_deref()).map_err(|e| {
                eprintln!("xvs sim: {e}");
                ExitCode::from(crate::EXIT_BAD_CONFIG)
            })?
        }
    };
    for f in &args.frozen {
        let mut known = false;
        for s in specs
            .iter_mut()
            .filter(|s| daemon::controller::names(f, &s.name))
        {
            s.frozen = true;
            known = true;
        }
        if !known {
            eprintln!("xvs sim: --frozen {f}: no service named {f:?}");
            return Err(ExitCode::from(crate::EXIT_BAD_CONFIG));
        }
    }
    Ok((cfg, specs, service_cidrs))
}

/// Runs every line of `input` through the simulation and prints what happened to it; the
/// exit code when a line cannot be read or parsed, or stdout is closed.
fn replay(
    sim: &mut Sim,
    input: Box<dyn BufRead>,
    flows: &Path,
    epoch: Instant,
    json: bool,
    out: &mut impl Write,
) -> Result<(), ExitCode> {
    let name = if flows == Path::new("-") {
        "<stdin>".to_owned()
    } else {
        flows.display().to_string()
    };
    for (n, line) in input.lines().enumerate() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                eprintln!("xvs sim: {name}: read error: {e}");
                return Err(ExitCode::FAILURE);
            }
        };
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let flow = match parse_line(text) {
            Ok(f) => f,
            Err(e) => {
                let _ = out.flush();
                eprintln!("xvs sim: {name}:{}: {e}", n + 1);
                return Err(ExitCode::from(crate::EXIT_BAD_CONFIG));
            }
        };
        // Each input line is one millisecond after the previous one.
        let now = epoch + Duration::from_millis(n as u64);
        let o = sim.step(&flow, now);
        if print_outcome(out, sim, &flow, o, json).is_err() {
            return Err(ExitCode::FAILURE); // stdout closed (e.g. piped into head)
        }
    }
    Ok(())
}

/// One line of output: what became of `flow`.
fn print_outcome(
    out: &mut impl Write,
    sim: &Sim,
    flow: &FlowLine,
    o: Outcome,
    json: bool,
) -> std::io::Result<()> {
    let proto = flow.proto.name();
    let svc = o.service.and_then(|s| sim.snap.services.get(s as usize));
    let backend = o.result.ok();
    let (verdict, reason) = verdict_of(o.result);
    let event = if flow.event == Event::Open {
        "open"
    } else {
        "close"
    };
    if json {
        let v = serde_json::json!({
            "proto": proto,
            "src": flow.src.to_string(),
            "frontend": fmt_frontend(flow.dst),
            "event": event,
            "service": svc.map(|s| s.name.as_str()),
            "backend": backend.map(|b| b.to_string()),
            "verdict": verdict,
            "reason": reason,
        });
        return writeln!(out, "{v}");
    }
    let to = match (backend, reason) {
        (Some(b), _) => b.to_string(),
        (None, Some(why)) => format!("{verdict} ({why})"),
        (None, None) => verdict.to_owned(),
    };
    let suffix = if flow.event == Event::Close {
        " (close)"
    } else {
        ""
    };
    writeln!(
        out,
        "{proto} {} -> {} => {to}{suffix}",
        flow.src,
        fmt_frontend(flow.dst)
    )
}

fn print_distribution(out: &mut impl Write, sim: &Sim, json: bool) -> std::io::Result<()> {
    if !json {
        writeln!(out)?;
        writeln!(
            out,
            "{:<16} {:<28} {:>6} {:>8} {:>7} {:>6}",
            "service", "backend", "weight", "flows", "share", "open"
        )?;
    }
    for svc in sim.snap.services.iter() {
        let s = svc.id as usize;
        let total: u64 = sim.tally[s].iter().map(|t| t.flows).sum();
        if total == 0 {
            continue;
        }
        for (b, backend) in svc.backends.iter().enumerate() {
            let t = &sim.tally[s][b];
            let share = 100.0 * t.flows as f64 / total as f64;
            if json {
                let v = serde_json::json!({
                    "service": svc.name,
                    "backend": backend.addr.to_string(),
                    "weight": backend.weight,
                    "flows": t.flows,
                    "share_pct": (share * 100.0).round() / 100.0,
                    "open": t.open,
                });
                writeln!(out, "{v}")?;
            } else {
                writeln!(
                    out,
                    "{:<16} {:<28} {:>6} {:>8} {:>6.2}% {:>6}",
                    svc.name,
                    backend.addr.to_string(),
                    backend.weight,
                    t.flows,
                    share,
                    t.open
                )?;
            }
        }
    }
    Ok(())
}
