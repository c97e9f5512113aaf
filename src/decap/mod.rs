//! `xvs decap`: the backend side of direct server return, thin over [`fastpath::decap`]
//! (the programs and their pins) and [`config::parse_decap`] / [`config::decap_from_args`]
//! (the settings, validated alike from a file or from flags).
//!
//! - `xvs decap (--config FILE | --interface .. --vip ..)`: attaches the programs (or
//!   updates them in place: idempotent), puts the VIPs on `lo` with `vips_on_lo` or checks
//!   they are local, prints what it did as `key=value` lines and exits; the pinned programs
//!   stay attached.
//! - with `--wait`: then waits; SIGHUP applies the config again (re-reading the file: a
//!   changed ConfigMap), SIGTERM or SIGINT detaches everything (as `--detach`) and exits 0.
//! - `--detach`: detaches the programs of this network namespace, removes their pins and the
//!   VIPs `xvs decap` put on `lo` (idempotent).
//! - `--status`: what is attached, the tables and the counters, as `key=value` lines.
//!
//! Exit codes: 0 success, 1 a failure (the kernel refused, an interface is missing), 2 a bad
//! config or bad arguments.

mod lo;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use config::DecapConfig;
use fastpath::decap::{self, PortMap, Tables};

/// The command line of `xvs decap`.
#[derive(clap::Args)]
pub struct Args {
    /// The config file (config/examples/decap.toml documents it); or the flags below.
    #[arg(long, short, conflicts_with_all = ["interface", "vip", "gue_port", "xdp_mode", "vips_on_lo", "pin_root"])]
    config: Option<PathBuf>,
    /// An interface where encapsulated packets arrive and replies leave. Repeatable.
    #[arg(long, value_name = "IFNAME")]
    interface: Vec<String>,
    /// A VIP to decapsulate, `ADDR`, or with a port translation `ADDR:PORT=TARGET[/tcp|/udp]`
    /// (IPv6 in brackets). Repeatable.
    #[arg(long, value_name = "VIP")]
    vip: Vec<String>,
    /// The GUE UDP port (default 6080, the xvs nodes' `[dataplane] gue_port`).
    #[arg(long)]
    gue_port: Option<u16>,
    /// How to attach XDP: auto (default), native or generic.
    #[arg(long, value_parser = ["auto", "native", "generic"])]
    xdp_mode: Option<String>,
    /// Put the VIPs on `lo` (and take them off on --detach).
    #[arg(long)]
    vips_on_lo: bool,
    /// The bpffs directory of the pins (default /sys/fs/bpf/xvs-decap).
    #[arg(long)]
    pin_root: Option<PathBuf>,
    /// After attaching, wait: SIGHUP applies the config again, SIGTERM/SIGINT detaches.
    #[arg(long, conflicts_with_all = ["detach", "status"])]
    wait: bool,
    /// Detach the programs of this network namespace and remove their pins and the VIPs
    /// xvs decap put on `lo`.
    #[arg(long, conflicts_with = "status")]
    detach: bool,
    /// Print what is attached, the VIPs, translations and counters.
    #[arg(long)]
    status: bool,
}

pub fn main(args: Args) -> ExitCode {
    if let Err(e) = daemon::logging::init(&config::Log::default()) {
        eprintln!("xvs decap: {e}");
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    }
    if args.detach || args.status {
        let root = match pin_root(&args) {
            Ok(root) => root,
            Err(code) => return code,
        };
        return if args.detach {
            detach(&root)
        } else {
            status(&root)
        };
    }
    // Blocked before anything runs, so a signal during the attach waits for `wait`.
    let signals = args.wait.then(block_signals);
    let Some(cfg) = load(&args) else {
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    };
    if let Err(e) = attach(&cfg) {
        eprintln!("xvs decap: {e}");
        return ExitCode::FAILURE;
    }
    match signals {
        Some(set) => wait(&args, cfg, &set),
        None => ExitCode::SUCCESS,
    }
}

/// The pin root of `--detach`/`--status`: the file's, the flag's, or the default.
fn pin_root(args: &Args) -> Result<PathBuf, ExitCode> {
    if args.config.is_some() {
        return load(args)
            .map(|c| c.bpf_pin_root)
            .ok_or(ExitCode::from(crate::EXIT_BAD_CONFIG));
    }
    Ok(args
        .pin_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(config::DEFAULT_DECAP_PIN_ROOT)))
}

/// The validated settings, or `None` after printing every problem.
fn load(args: &Args) -> Option<DecapConfig> {
    if let Some(path) = &args.config {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("xvs decap: cannot read {}: {e}", path.display());
                return None;
            }
        };
        return match config::parse_decap(&text, &path.display().to_string()) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("xvs decap: invalid configuration:\n{e}");
                None
            }
        };
    }
    let xdp_mode = args.xdp_mode.as_deref().map(|m| match m {
        "native" => vocab::XdpMode::Native,
        "generic" => vocab::XdpMode::Generic,
        _ => vocab::XdpMode::Auto,
    });
    let flags = config::DecapArgs {
        interfaces: args.interface.clone(),
        vips: args.vip.clone(),
        gue_port: args.gue_port,
        xdp_mode,
        vips_on_lo: args.vips_on_lo,
        bpf_pin_root: args.pin_root.clone(),
    };
    match config::decap_from_args(flags) {
        Ok(c) => Some(c),
        Err(problems) => {
            eprintln!("xvs decap: invalid arguments:");
            for p in problems {
                eprintln!("{p}");
            }
            None
        }
    }
}

fn tables(cfg: &DecapConfig) -> Tables {
    Tables {
        gue_port: cfg.gue_port,
        vips: cfg.vips.clone(),
        ports: cfg
            .ports
            .iter()
            .map(|t| PortMap {
                vip: t.vip,
                proto: t.protocol as u8,
                port: t.port,
                target: t.target,
            })
            .collect(),
    }
}

/// Attaches (or updates) the programs and settles the VIPs on `lo`; prints what it did.
fn attach(cfg: &DecapConfig) -> anyhow::Result<()> {
    let applied = decap::apply(
        &cfg.interfaces,
        cfg.xdp_mode,
        &tables(cfg),
        &cfg.bpf_pin_root,
    )?;
    println!("pins={}", applied.dir.display());
    for a in &applied.interfaces {
        println!(
            "attached interface={} xdp={} egress={}",
            a.ifname,
            a.xdp,
            if a.egress { "yes" } else { "no" }
        );
    }
    for ifname in &applied.detached {
        println!("detached interface={ifname}");
    }
    settle_vips(cfg)
}

/// With `vips_on_lo`: adds the missing VIPs to `lo` and removes those an earlier run added
/// that are gone. Without: warns about every VIP the kernel would not take as local.
fn settle_vips(cfg: &DecapConfig) -> anyhow::Result<()> {
    let mut rtnl = lo::Rtnl::open()?;
    if cfg.vips_on_lo {
        for ip in &cfg.vips {
            let added = rtnl.add(*ip)?;
            println!("vip={ip} lo={}", if added { "added" } else { "present" });
        }
        for ip in rtnl.ours()? {
            if !cfg.vips.contains(&ip) {
                rtnl.remove(ip)?;
                println!("vip={ip} lo=removed");
            }
        }
        return Ok(());
    }
    for ip in &cfg.vips {
        let local = rtnl.is_local(*ip)?;
        println!("vip={ip} local={}", if local { "yes" } else { "no" });
        if !local {
            tracing::warn!(
                vip = %ip,
                "the VIP is not local: the kernel will not deliver decapsulated packets for it (add it to lo, e.g. `ip addr add {ip} dev lo`, or run with --vips-on-lo)"
            );
        }
    }
    Ok(())
}

fn detach(root: &Path) -> ExitCode {
    let result = decap::detach(root)
        .map_err(anyhow::Error::from)
        .and_then(|ifaces| {
            for ifname in ifaces {
                println!("detached interface={ifname}");
            }
            let mut rtnl = lo::Rtnl::open()?;
            for ip in rtnl.ours()? {
                rtnl.remove(ip)?;
                println!("vip={ip} lo=removed");
            }
            Ok(())
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xvs decap --detach: {e}");
            ExitCode::FAILURE
        }
    }
}

fn status(root: &Path) -> ExitCode {
    let pinned = match decap::pinned(root) {
        Ok(Some(p)) => p,
        Ok(None) => {
            println!("attached=0");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("xvs decap --status: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("pins={}", pinned.dir.display());
    println!("attached={}", pinned.interfaces.len());
    for (ifname, egress) in &pinned.interfaces {
        println!(
            "interface={ifname} egress={}",
            if *egress { "yes" } else { "no" }
        );
    }
    println!("gue_port={}", pinned.gue_port);
    for ip in &pinned.vips {
        println!("vip={ip}");
    }
    for p in &pinned.ports {
        let proto = if p.proto == vocab::ip_proto::UDP {
            "udp"
        } else {
            "tcp"
        };
        println!("translate={}={}", socket(p.vip, p.port, proto), p.target);
    }
    for (name, value) in pinned.counters.named() {
        println!("{name}={value}");
    }
    ExitCode::SUCCESS
}

/// `ADDR:PORT/PROTO`, IPv6 in brackets (the syntax `--vip` takes).
fn socket(ip: IpAddr, port: u16, proto: &str) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}/{proto}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}/{proto}"),
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP for the process, for [`wait`] to take them.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for signals: SIGHUP applies the config again, SIGTERM/SIGINT detach and return.
fn wait(args: &Args, mut cfg: DecapConfig, set: &libc::sigset_t) -> ExitCode {
    tracing::info!(target: "xvs", "xvs decap: attached; waiting (SIGHUP re-applies, SIGTERM detaches)");
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is an initialised signal set; `sig` is a valid out pointer.
        if unsafe { libc::sigwait(set, &mut sig) } != 0 {
            continue;
        }
        if sig == libc::SIGHUP {
            match load(args) {
                Some(new) => match attach(&new) {
                    Ok(()) => {
                        tracing::info!(target: "xvs", "xvs decap: re-applied");
                        cfg = new;
                    }
                    Err(e) => {
                        tracing::error!(target: "xvs", "xvs decap: re-applying failed, the last tables stay: {e:#}")
                    }
                },
                None => {
                    tracing::error!(target: "xvs", "xvs decap: the config is invalid, the last tables stay")
                }
            }
            continue;
        }
        tracing::info!(target: "xvs", signal = sig, "xvs decap: detaching");
        return detach(&cfg.bpf_pin_root);
    }
}
