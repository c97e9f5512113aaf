//! `xvs run`: loads the config, refuses what `xvs check` refuses of it (every problem at
//! once: [`crate::check::findings`]), sets up logging, logs `check`'s warnings, checks the
//! machine, runs the daemon ([`daemon::driver::run`]) and prints its final counters to stdout
//! as `key=value` lines. Exit codes: 2 for a bad config, 1 for a machine that cannot run it
//! (every problem of [`daemon::preflight`] is logged: a missing capability or interface,
//! queues that do not match the NIC's channels...) or a runtime failure. Once the config is
//! checked, every message (errors included) goes through the daemon's logger on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use daemon::driver::{self, Outcome};
use fastpath::pipeline::{DropReason, RejectReason};

pub fn main(path: Option<&PathBuf>, takeover: bool) -> ExitCode {
    let Some(loaded) = crate::load(path) else {
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    };
    let found = crate::check::findings(&loaded, false);
    if !found.refused.is_empty() {
        let e = config::Error::Invalid {
            file: loaded.file.clone(),
            problems: found.refused,
        };
        eprintln!("xvs: invalid configuration:\n{e}");
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    }
    let cfg = loaded.config;
    if let Err(e) = daemon::logging::init(&cfg.log) {
        eprintln!("xvs run: {e}");
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    }
    for w in &found.warnings {
        tracing::warn!(target: "xvs", "{}", crate::check::render(&loaded.file, w));
    }
    match path {
        Some(p) => tracing::info!(target: "xvs", config = %p.display(), "starting"),
        // Loudly: a node started without --config forwards the demo lab's services.
        None => tracing::warn!(
            target: "xvs",
            config = %driver::describe(None),
            "no --config given: running the embedded DEMO config, meant for the netns lab of scripts/demo, not for a real node"
        ),
    }
    // The process taken over holds the admin ports until it exits, which it does before
    // this one binds them: `--takeover` does not refuse to start for them.
    let preflight = daemon::preflight::preflight(&cfg).or_else(|problems| {
        let rest: Vec<_> = problems
            .into_iter()
            .filter(|p| !(takeover && p.check == "ports"))
            .collect();
        if rest.is_empty() { Ok(()) } else { Err(rest) }
    });
    if let Err(problems) = preflight {
        // Every problem at once, so one round of fixes is enough.
        for p in &problems {
            tracing::error!(target: "xvs", check = p.check, "cannot run: {}", p.text);
        }
        tracing::error!(
            target: "xvs",
            problems = problems.len(),
            "not started (`xvs check --host --config FILE` lists the same problems)"
        );
        return ExitCode::FAILURE;
    }
    match driver::run(cfg, path.map(PathBuf::as_path), takeover) {
        Ok(outcome) => {
            print_counters(&outcome);
            match outcome.failure {
                None => ExitCode::SUCCESS,
                Some(e) => {
                    tracing::error!(target: "xvs", "failed: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            tracing::error!(target: "xvs", "could not start: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_counters(o: &Outcome) {
    let c = &o.counters;
    println!("rx={}", c.rx);
    println!("tx={}", c.tx);
    println!("tx_ring_full={}", c.tx_ring_full);
    println!("tx_no_port={}", c.tx_no_port);
    println!("pass={}", c.pass);
    println!("slow={}", c.slow);
    println!("new_flows={}", c.new_flows);
    println!("reused_flows={}", c.reused);
    println!("synproxy_syns={}", c.synproxy_syns);
    println!("synproxy_acks={}", c.synproxy_acks);
    println!("expired_flows={}", c.expired);
    println!("busy_ns={}", c.busy_ns);
    println!("flows_live={}", o.flows_live);
    for r in DropReason::ALL {
        let n = c.dropped(*r);
        if n > 0 {
            println!("drop_{}={n}", r.name());
        }
    }
    for r in RejectReason::ALL {
        let n = c.rejects[*r as usize];
        if n > 0 {
            println!("reject_{}={n}", r.name());
        }
    }
    for (name, s) in &o.steer {
        if let Some(s) = s {
            println!("steer_{name}_redirected={}", s.redirected);
            println!("steer_{name}_passed={}", s.passed());
        }
    }
}
