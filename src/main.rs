//! `xvs`: the command line. Subcommands are thin: each loads the config through the `config`
//! crate and hands it to a library; exit codes are part of the interface, the same for
//! every command: 0 success; 1 a runtime failure (the machine cannot run it, a file given as
//! input or output cannot be read or written, a running xvs cannot be reached, refuses a
//! control command or, for `status`, is unhealthy); 2 a bad configuration (what `xvs check`
//! refuses; with `check --strict`, also a warning) or bad arguments (clap's usage errors, a
//! malformed `xvs flows` filter, a bad line of `xvs sim --flows`).
// Product functions stay within clippy.toml's 70 lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mimalloc::MiMalloc;

mod check;
mod decap;
mod host;
mod pcap;
mod run;
mod sim;
mod status;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// Exit code for a configuration that cannot be used (and for bad arguments, as clap does).
pub const EXIT_BAD_CONFIG: u8 = 2;

/// `xvs --version`: the version and the git revision it was built from (`src/build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("XVS_REVISION"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "xvs",
    version = VERSION,
    about = "Userspace L4 load balancer for Kubernetes Services on AF_XDP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config file and print what it configures: refuses (exit 2) everything
    /// `xvs run` or a reload would refuse without looking at the host, and warns about what
    /// is valid but dangerous; with --host, check this machine for it as `xvs run` would
    /// (every problem at once).
    #[command(group(
        clap::ArgGroup::new("what")
            .required(true)
            .multiple(true)
            .args(["path", "config", "host"])
    ))]
    Check {
        /// The config file.
        #[arg(value_name = "FILE", conflicts_with = "config")]
        path: Option<PathBuf>,
        /// The config file (as `xvs run --config`).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Refuse warnings too (exit 2), as a CI gate would.
        #[arg(long)]
        strict: bool,
        /// Check the machine instead: kernel, capabilities, cores, interfaces and their
        /// queues, XDP and zero-copy support, bpffs, memory, ports (exit 1 when `xvs run`
        /// would refuse to start).
        #[arg(long)]
        host: bool,
    },
    /// Dry-run flows through the pipeline: where would each flow go, or why not?
    Sim {
        /// The config file: its [[services]], or with --objects only its settings
        /// ([dataplane], [flowtable], [node], [kubernetes]).
        #[arg(long, short, required_unless_present = "objects")]
        config: Option<PathBuf>,
        /// Kubernetes objects instead of the config's services: what `kubectl get
        /// svc,endpointslices,nodes,servicecidrs -A -o yaml` (or `-o json`) prints.
        #[arg(long)]
        objects: Option<PathBuf>,
        /// With --objects: this node's name (default: [node] name, else the host name); its
        /// Node object in the dump gives the zone and addresses [node] does not.
        #[arg(long, requires = "objects")]
        node: Option<String>,
        /// Treat this service as frozen (as `xvs freeze --service NAME`; a Kubernetes
        /// `namespace/name` covers all of its ports). Repeatable.
        #[arg(long = "frozen", value_name = "SERVICE")]
        frozen: Vec<String>,
        /// Flows, one per line: proto,src_ip,src_port,dst_ip,dst_port[,open|close]; `-` for stdin.
        #[arg(long)]
        flows: PathBuf,
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Replay a capture through the pipeline: what would xvs transmit, and why did it drop?
    Pcap {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Input capture: pcap or pcapng; Ethernet, Linux cooked (SLL, SLL2) or raw IP.
        #[arg(long = "in")]
        input: PathBuf,
        /// Output capture (pcap, Ethernet): every frame xvs would transmit.
        #[arg(long = "out")]
        output: PathBuf,
        /// JSON lines, one per input frame: its verdict and drop reason (`-`: stdout).
        #[arg(long)]
        report: Option<PathBuf>,
    },
    /// Health, counters and sync state of a running xvs (from its admin API).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
        /// Exact numbers instead of scaled ones (1234567 instead of 1.2M).
        #[arg(long)]
        exact: bool,
    },
    /// Services, frontends and backends of a running xvs, with health and connections.
    Services {
        #[command(flatten)]
        admin: AdminArgs,
        /// Connections, packets and bytes in each direction per service and backend, since
        /// each appeared (like `ipvsadm -Ln --stats`).
        #[arg(long, conflicts_with = "rate")]
        stats: bool,
        /// The same per second, over the last 2 s (like `ipvsadm -Ln --rate`; traffic in
        /// bits per second).
        #[arg(long)]
        rate: bool,
        /// Exact numbers instead of scaled ones (1234567 instead of 1.2M, 3400000000
        /// instead of 3.4 Gbit/s).
        #[arg(long)]
        exact: bool,
    },
    /// Flows in a running xvs's flow table.
    Flows {
        #[command(flatten)]
        admin: AdminArgs,
        /// At most this many flows (the server allows 1 to 10000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Only flows of this service, as `xvs services` names it (`namespace/name` takes
        /// every port of a Kubernetes Service).
        #[arg(long)]
        service: Option<String>,
        /// Only flows to this backend: IP or IP:PORT.
        #[arg(long)]
        backend: Option<String>,
        /// Only flows from this client: IP or IP/PREFIX.
        #[arg(long)]
        client: Option<String>,
        /// Only flows to this frontend: IP or IP:PORT.
        #[arg(long)]
        vip: Option<String>,
    },
    /// Refuse new flows (of the node, or of one service) while established ones continue
    /// (control socket, `[admin] enable_control`).
    Freeze {
        #[command(flatten)]
        admin: AdminArgs,
        /// Only this service (a Kubernetes `namespace/name` covers all its ports).
        #[arg(long)]
        service: Option<String>,
    },
    /// Undo `xvs freeze` (of the node, or of one service).
    Unfreeze {
        #[command(flatten)]
        admin: AdminArgs,
        /// Only this service.
        #[arg(long)]
        service: Option<String>,
    },
    /// Turn /healthz 503 so upstream load balancers move away; traffic keeps flowing.
    Drain {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Undo `xvs drain`.
    Undrain {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Remove for good what outlives `xvs run`: the pinned steering programs of this network
    /// namespace (which otherwise hold xvs's frames for `restart_hold` after it stops, then
    /// are removed by its watchdog) and the state files (flow and affinity tables, exports).
    /// Refuses while an xvs runs with that state. What it removes is not undone: the next
    /// xvs starts with an empty flow table, so it names its target explicitly.
    Cleanup {
        /// The config whose `[dataplane] state_dir`, `bpf_pin_root` and interfaces to clean:
        /// required (the embedded demo config's is `--config config/examples/lab.toml`).
        #[arg(long, short, required_unless_present = "wait_for")]
        config: Option<PathBuf>,
        /// The watchdog that `xvs run` starts: wait for process PID to end, then remove the
        /// pins under --pins once their restart hold ran out, unless another xvs took them.
        #[arg(long, requires = "pins")]
        wait_for: Option<u32>,
        /// The pin directory to watch (with --wait-for).
        #[arg(long, requires = "wait_for")]
        pins: Option<PathBuf>,
    },
    /// The backend side of direct server return, on a backend host or Kubernetes node:
    /// decapsulate IPIP/GUE for the VIPs and translate ports (XDP in, tc out), pinned so it
    /// stays attached; --detach removes it (config/examples/decap.toml documents the file).
    Decap(decap::Args),
    /// Run the load balancer (needs the capabilities `xvs run` names, and the configured
    /// interfaces).
    Run {
        /// The config file. Without it xvs runs the embedded DEMO config
        /// (config/examples/lab.toml, the netns lab of scripts/demo) and says so loudly.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Take over from the xvs running on the same state directory without losing a
        /// packet: receive its AF_XDP sockets and UMEMs, adopt its flow table once it has
        /// stopped, and go on from its rings (docs/operations.md, "Upgrades"). With no xvs
        /// running, or one that refuses, it starts as without the flag.
        #[arg(long)]
        takeover: bool,
    },
}

/// Where a running xvs answers, and how to print it.
#[derive(clap::Args)]
struct AdminArgs {
    /// The admin API's TCP address (`[admin] listen` of the running xvs; read-only).
    #[arg(long, conflicts_with = "socket")]
    admin: Option<std::net::SocketAddr>,
    /// The control socket (`[admin] socket`). Default: /run/xvs/xvs.sock when it exists,
    /// else --admin 127.0.0.1:10249.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Print the API's JSON instead of tables.
    #[arg(long)]
    json: bool,
}

impl AdminArgs {
    fn endpoint(&self) -> status::Endpoint {
        status::Endpoint::choose(self.admin, self.socket.clone())
    }

    fn output(&self, exact: bool) -> status::Output {
        status::Output {
            json: self.json,
            exact,
        }
    }
}

/// A config that loaded, with the text it was read from (to locate later findings).
pub struct Loaded {
    /// The config.
    pub config: config::Config,
    /// Its text.
    pub text: String,
    /// Its name in messages: the path, or the embedded demo config's.
    pub file: String,
    /// Whether it was read from a file (not the embedded demo config).
    pub from_file: bool,
}

/// Loads a config file, or prints its problems; `None` means exit with `EXIT_BAD_CONFIG`.
pub fn load_config(path: Option<&PathBuf>) -> Option<config::Config> {
    load(path).map(|l| l.config)
}

/// [`load_config`], keeping the text.
pub fn load(path: Option<&PathBuf>) -> Option<Loaded> {
    let (text, file) = match path {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => (t, p.display().to_string()),
            Err(source) => {
                let e = config::Error::Read {
                    path: p.clone(),
                    source,
                };
                eprintln!("xvs: invalid configuration:\n{e}");
                return None;
            }
        },
        None => (
            config::LAB_TOML.to_owned(),
            "<embedded demo config lab.toml>".to_owned(),
        ),
    };
    match config::parse(&text, &file).and_then(|c| builds(&text, &file, c)) {
        Ok(config) => Some(Loaded {
            config,
            text,
            file,
            from_file: path.is_some(),
        }),
        Err(e) => {
            eprintln!("xvs: invalid configuration:\n{e}");
            None
        }
    }
}

/// The config, if the snapshot builder takes its static services (validation checks what it
/// can name; this runs the builder itself, so `check` refuses whatever `run` could not
/// publish).
fn builds(text: &str, file: &str, c: config::Config) -> Result<config::Config, config::Error> {
    use fastpath::snapshot::{BuildError, L2Table, ServiceSpec, SnapshotBuilder};
    let specs = ServiceSpec::from_config(&c);
    let Err(e) = SnapshotBuilder::from_config(&c).build(&specs, &L2Table::from_config(&c)) else {
        return Ok(c);
    };
    let service = |name: &str| {
        let i = c.services.iter().position(|s| s.name == name).unwrap_or(0);
        config::KeyPath::of(&["services"]).index(i)
    };
    let key = match &e {
        BuildError::DuplicateName { name } => service(name).key("name"),
        BuildError::DuplicateFrontend { second, .. } => service(second).key("vip"),
        BuildError::TooManyBackends { .. } => config::KeyPath::of(&["flowtable", "backends_max"]),
        BuildError::Scheduler { service: name, .. } => service(name).key("backends"),
    };
    Err(config::Error::Invalid {
        file: file.to_owned(),
        problems: vec![config::problem_at(
            text,
            &key,
            format!("the snapshot builder refuses it: {e}"),
        )],
    })
}

fn cleanup(config: Option<&PathBuf>, watch: Option<(u32, PathBuf)>) -> ExitCode {
    if let Some((pid, pins)) = watch {
        // The watchdog: silent (no stdio), until the pins are removed, taken or gone.
        daemon::hold::watch(&pins, pid);
        return ExitCode::SUCCESS;
    }
    let Some(cfg) = load_config(config) else {
        return ExitCode::from(EXIT_BAD_CONFIG);
    };
    let dp = &cfg.dataplane;
    let mut taps = 0;
    for i in &dp.interfaces {
        match fastpath::xsk::tap::remove(&i.name) {
            Ok(removed) => taps += usize::from(removed),
            Err(e) => eprintln!("xvs cleanup: the exception device of {}: {e}", i.name),
        }
    }
    match daemon::hold::cleanup(&dp.bpf_pin_root, &dp.state_dir) {
        Ok(c) => {
            println!(
                "removed {} pinned steering link(s) under {}, {} state file(s) in {} and {taps} exception device(s)",
                c.links,
                dp.bpf_pin_root.display(),
                c.files.len(),
                dp.state_dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xvs cleanup: {e}");
            ExitCode::FAILURE
        }
    }
}

fn control(admin: &AdminArgs, action: &'static str, service: Option<String>) -> ExitCode {
    status::main(
        status::StatusCmd::Control { action, service },
        &admin.endpoint(),
        admin.output(false),
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            path,
            config,
            strict,
            host,
        } => check(path.or(config), strict, host),
        Command::Sim {
            config,
            objects,
            node,
            frozen,
            flows,
            json,
        } => sim::main(sim::Args {
            config,
            objects,
            node,
            frozen,
            flows,
            json,
        }),
        Command::Pcap {
            config,
            input,
            output,
            report,
        } => pcap::main(&config, &input, &output, report.as_deref()),
        Command::Status { admin, exact } => status::main(
            status::StatusCmd::Status,
            &admin.endpoint(),
            admin.output(exact),
        ),
        Command::Services {
            admin,
            stats,
            rate,
            exact,
        } => services(&admin, stats, rate, exact),
        Command::Flows {
            admin,
            limit,
            service,
            backend,
            client,
            vip,
        } => {
            let filter = status::FlowQuery {
                service,
                backend,
                client,
                vip,
            };
            let cmd = status::StatusCmd::Flows { limit, filter };
            status::main(cmd, &admin.endpoint(), admin.output(false))
        }
        Command::Freeze { admin, service } => control(&admin, "freeze", service),
        Command::Unfreeze { admin, service } => control(&admin, "unfreeze", service),
        Command::Drain { admin } => control(&admin, "drain", None),
        Command::Undrain { admin } => control(&admin, "undrain", None),
        Command::Run { config, takeover } => run::main(config.as_ref(), takeover),
        Command::Decap(args) => decap::main(args),
        Command::Cleanup {
            config,
            wait_for,
            pins,
        } => cleanup(config.as_ref(), wait_for.zip(pins)),
    }
}

/// `xvs check FILE` (`--strict`), or `xvs check --host [FILE]`.
fn check(file: Option<PathBuf>, strict: bool, host: bool) -> ExitCode {
    match (file, host) {
        (file, true) => host::main(file.as_ref()),
        (Some(file), false) => check::main(&file, strict),
        // clap requires a file without --host.
        (None, false) => ExitCode::from(EXIT_BAD_CONFIG),
    }
}

/// `xvs services`: connections per backend, or (`--stats`, `--rate`) traffic.
fn services(admin: &AdminArgs, stats: bool, rate: bool, exact: bool) -> ExitCode {
    let show = match (stats, rate) {
        (true, _) => status::ServicesShow::Stats,
        (_, true) => status::ServicesShow::Rate,
        _ => status::ServicesShow::Connections,
    };
    status::main(
        status::StatusCmd::Services(show),
        &admin.endpoint(),
        admin.output(exact),
    )
}
