//! `xvs sim`: the operator's dry run. Flows from a file go through the same snapshot,
//! affinity table and schedulers the fastpath uses, and each line says where the flow would
//! go; a per-backend distribution follows.
//!
//! Input, one flow per line: `proto,src_ip,src_port,dst_ip,dst_port[,open|close]`; blank
//! lines and `#` comments are skipped. A repeated `open` of a flow that is still open is the
//! same connection (the flow table would hit) and keeps its backend; `close` ends it, which
//! lowers the connection counts that lc/wlc/sed/nq/lblc/lblcr read. TCP and SCTP flows count
//! as active connections, UDP as inactive, as IPVS counts them.
//!
//! The services come from the config's `[[services]]`, or with `--objects` from a dump of
//! Kubernetes objects translated by the Kubernetes source's own code (`slowpath::k8s`), as
//! this node (`--node`) would see them. A new flow passes the pipeline's admission
//! (`ServiceEntry::admit_new_flow`: source ranges, freeze, rate limit) before it is
//! scheduled; a refusal prints the pipeline's drop reason.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use config::Config;
use config::Protocol;
use fastpath::snapshot::{Frontend, L2Table, ServiceSpec, Snapshot, SnapshotBuilder};
use lb_algos::{AffinityTable, BackendId, ConnCounts, FlowTuple};
use slowpath::k8s::{self, NodeInfo};

/// Affinity entries the simulation can hold.
const AFFINITY_CAPACITY: usize = 1 << 16;

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

/// Connection counts kept by the simulation: [active, inactive] per backend id.
struct Counts(Vec<[u32; 2]>);

impl ConnCounts for Counts {
    fn active(&self, id: BackendId) -> u32 {
        self.0.get(id.0 as usize).map_or(0, |c| c[0])
    }
    fn inactive(&self, id: BackendId) -> u32 {
        self.0.get(id.0 as usize).map_or(0, |c| c[1])
    }
}

/// Per-backend tally for the distribution table.
#[derive(Default, Clone)]
struct Tally {
    flows: u64,
    open: u64,
}

type FlowKey = (Protocol, SocketAddr, SocketAddr);

struct Sim<'a> {
    snap: &'a Snapshot,
    counts: Counts,
    affinity: AffinityTable,
    open: HashMap<FlowKey, (u32, usize)>,
    tally: Vec<Vec<Tally>>,
}

/// What happened to one input flow.
struct Outcome {
    service: Option<u32>,
    backend: Result<usize, &'static str>,
}

impl Sim<'_> {
    fn counter_slot(&self, svc: u32, idx: usize, proto: Protocol) -> (usize, usize) {
        let id = self.snap.services[svc as usize].backends[idx].id.0 as usize;
        (id, if proto == Protocol::Udp { 1 } else { 0 })
    }

    fn step(&mut self, f: &FlowLine, now: Instant) -> Outcome {
        let frontend = Frontend {
            vip: f.dst.ip(),
            protocol: f.proto,
            port: f.dst.port(),
        };
        let Some(svc) = self.snap.service_for(&frontend) else {
            return Outcome {
                service: None,
                backend: Err("no service"),
            };
        };
        let key = (f.proto, f.src, f.dst);
        match f.event {
            Event::Close => match self.open.remove(&key) {
                Some((s, idx)) => {
                    let (id, which) = self.counter_slot(s, idx, f.proto);
                    self.counts.0[id][which] -= 1;
                    self.tally[s as usize][idx].open -= 1;
                    Outcome {
                        service: Some(s),
                        backend: Ok(idx),
                    }
                }
                None => Outcome {
                    service: Some(svc.id),
                    backend: Err("no such open flow"),
                },
            },
            Event::Open => {
                if let Some(&(s, idx)) = self.open.get(&key) {
                    return Outcome {
                        service: Some(s),
                        backend: Ok(idx),
                    };
                }
                if let Err(why) = svc.admit_new_flow(self.snap.frozen, f.src.ip(), now) {
                    return Outcome {
                        service: Some(svc.id),
                        backend: Err(why.name()),
                    };
                }
                let tuple = FlowTuple {
                    src: f.src.ip(),
                    src_port: f.src.port(),
                    dst: f.dst.ip(),
                    dst_port: f.dst.port(),
                };
                match svc.schedule(&tuple, &self.counts, &self.affinity, now) {
                    Ok(idx) => {
                        let (id, which) = self.counter_slot(svc.id, idx, f.proto);
                        self.counts.0[id][which] += 1;
                        let t = &mut self.tally[svc.id as usize][idx];
                        t.flows += 1;
                        t.open += 1;
                        self.open.insert(key, (svc.id, idx));
                        Outcome {
                            service: Some(svc.id),
                            backend: Ok(idx),
                        }
                    }
                    Err(why) => Outcome {
                        service: Some(svc.id),
                        backend: Err(why.reason()),
                    },
                }
            }
        }
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

/// The services of a Kubernetes dump as this node's source would publish them; problems
/// (objects or fields ignored) go to stderr as the daemon logs them.
fn objects_specs(
    cfg: &Config,
    path: &Path,
    node: Option<&str>,
) -> Result<Vec<ServiceSpec>, String> {
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
    let model = k8s::build_model(&objects.services, &objects.slices, &node_info, cfg);
    for p in &model.problems {
        eprintln!("xvs sim: {p}");
    }
    Ok(model.specs)
}

pub fn main(args: Args) -> ExitCode {
    let mut cfg = match &args.config {
        Some(path) => match crate::load_config(Some(path)) {
            Some(c) => c,
            None => return ExitCode::from(crate::EXIT_BAD_CONFIG),
        },
        None => Config::default(),
    };
    let mut specs = match &args.objects {
        None => ServiceSpec::from_config(&cfg),
        Some(path) => {
            if cfg.kubernetes.is_none() {
                // The [kubernetes] defaults: no externalIPs allowed, default scheduler rr.
                cfg.kubernetes = Some(
                    serde_json::from_value(serde_json::json!({}))
                        .expect("[kubernetes] has a default for every key"),
                );
            }
            match objects_specs(&cfg, path, args.node.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("xvs sim: {e}");
                    return ExitCode::from(crate::EXIT_BAD_CONFIG);
                }
            }
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
            return ExitCode::from(crate::EXIT_BAD_CONFIG);
        }
    }
    // As the daemon builds: a service the builder refuses is left out, the others run.
    let (snap, refused) =
        SnapshotBuilder::from_config(&cfg).build_isolated(&specs, &L2Table::from_config(&cfg));
    for r in &refused {
        eprintln!("xvs sim: service {}: refused: {r}", r.name);
    }
    let flows = args.flows.as_path();
    let json = args.json;
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
    let mut sim = Sim {
        snap: &snap,
        counts: Counts(vec![[0, 0]; cfg.flowtable.backends_max as usize]),
        affinity: AffinityTable::new(AFFINITY_CAPACITY, epoch),
        open: HashMap::new(),
        tally: snap
            .services
            .iter()
            .map(|s| vec![Tally::default(); s.backends.len()])
            .collect(),
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
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
                return ExitCode::FAILURE;
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
                return ExitCode::from(crate::EXIT_BAD_CONFIG);
            }
        };
        // Each input line is one millisecond after the previous one.
        let now = epoch + Duration::from_millis(n as u64);
        let o = sim.step(&flow, now);
        let proto = flow.proto.name();
        let svc = o.service.map(|s| &snap.services[s as usize]);
        let backend = o
            .backend
            .map(|i| svc.map(|s| s.backends[i].addr))
            .ok()
            .flatten();
        let event = if flow.event == Event::Open {
            "open"
        } else {
            "close"
        };
        let res = if json {
            let v = serde_json::json!({
                "proto": proto,
                "src": flow.src.to_string(),
                "frontend": fmt_frontend(flow.dst),
                "event": event,
                "service": svc.map(|s| s.name.as_str()),
                "backend": backend.map(|b| b.to_string()),
                "reason": o.backend.err(),
            });
            writeln!(out, "{v}")
        } else {
            let to = match (backend, o.backend) {
                (Some(b), _) => b.to_string(),
                (None, Err(why)) => format!("none ({why})"),
                (None, Ok(_)) => "none".to_owned(),
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
        };
        if res.is_err() {
            return ExitCode::FAILURE; // stdout closed (e.g. piped into head)
        }
    }
    let _ = print_distribution(&mut out, &sim, json);
    let _ = out.flush();
    ExitCode::SUCCESS
}

fn print_distribution(out: &mut impl Write, sim: &Sim<'_>, json: bool) -> std::io::Result<()> {
    if !json {
        writeln!(out)?;
        writeln!(
            out,
            "{:<16} {:<28} {:>6} {:>8} {:>7} {:>6}",
            "service", "backend", "weight", "flows", "share", "open"
        )?;
    }
    for (s, svc) in sim.snap.services.iter().enumerate() {
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
