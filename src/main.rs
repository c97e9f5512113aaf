//! `xvs`: the command line. Subcommands are thin: each loads the config through the `config`
//! crate and hands it to a library; exit codes are part of the interface:
//! 0 success, 1 runtime failure, 2 a bad configuration or bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mimalloc::MiMalloc;

mod admin_source;
mod check;
mod pcap;
mod policy;
mod run;
mod sim;
mod status;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// Exit code for a configuration that cannot be used (and for bad arguments, as clap does).
pub const EXIT_BAD_CONFIG: u8 = 2;

#[derive(Parser)]
#[command(
    name = "xvs",
    version,
    about = "Userspace L4 load balancer for Kubernetes Services on AF_XDP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config file and print what it configures.
    Check {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Dry-run flows through the schedulers: where would each flow go?
    Sim {
        /// The config file.
        #[arg(long, short)]
        config: PathBuf,
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
        /// Input capture (pcap, Ethernet).
        #[arg(long = "in")]
        input: PathBuf,
        /// Output capture: every frame xvs would transmit.
        #[arg(long = "out")]
        output: PathBuf,
        /// JSON lines, one per input frame: its verdict and drop reason.
        #[arg(long)]
        report: Option<PathBuf>,
    },
    /// Health, counters and sync state of a running xvs (from its admin API).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Services, frontends and backends of a running xvs, with health and connections.
    Services {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Flows in a running xvs's flow table.
    Flows {
        #[command(flatten)]
        admin: AdminArgs,
        /// At most this many flows.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Run the load balancer (needs root and the configured interfaces).
    Run {
        /// The config file (default: the embedded lab config, config/examples/lab.toml).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
}

/// Where a running xvs answers, and how to print it.
#[derive(clap::Args)]
struct AdminArgs {
    /// The admin API address (`[admin] listen` of the running xvs).
    #[arg(long, default_value = "127.0.0.1:10256")]
    admin: std::net::SocketAddr,
    /// Print the API's JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// Loads a config file, or prints its problems; `None` means exit with `EXIT_BAD_CONFIG`.
pub fn load_config(path: Option<&PathBuf>) -> Option<config::Config> {
    let loaded = match path {
        Some(p) => config::load(p),
        None => config::parse(config::LAB_TOML, "<embedded lab.toml>"),
    };
    match loaded {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("xvs: invalid configuration:\n{e}");
            None
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => check::main(&config),
        Command::Sim {
            config,
            flows,
            json,
        } => sim::main(&config, &flows, json),
        Command::Pcap {
            config,
            input,
            output,
            report,
        } => pcap::main(&config, &input, &output, report.as_deref()),
        Command::Status { admin } => {
            status::main(status::StatusCmd::Status, admin.admin, admin.json)
        }
        Command::Services { admin } => {
            status::main(status::StatusCmd::Services, admin.admin, admin.json)
        }
        Command::Flows { admin, limit } => {
            status::main(status::StatusCmd::Flows { limit }, admin.admin, admin.json)
        }
        Command::Run { config } => run::main(config.as_ref()),
    }
}
