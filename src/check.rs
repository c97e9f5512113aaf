//! `xvs check`: validate a config and print a summary an operator can eyeball.
//!
//! It refuses (exit 2) what `xvs run` refuses of a config without looking at the host, by
//! running the same code: the loader and validation (`config`), the snapshot builder over
//! the static services ([`crate::load`]), the daemon's start-up checks
//! ([`daemon::startcheck`]); and what any reload would refuse (an empty file, a cut last
//! line: [`config::Written::incomplete`]). Valid but dangerous settings are `warning:`
//! lines on stderr ([`config::warnings`], and the start-up checks' file warnings): exit 0,
//! or 2 with `--strict`. `xvs run` logs the same warnings at start-up.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use config::{Config, Problem};

use crate::Loaded;

pub fn main(path: &PathBuf, strict: bool) -> ExitCode {
    let Some(loaded) = crate::load(Some(path)) else {
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    };
    let f = findings(&loaded, true);
    let (mut refused, mut warnings) = (f.refused, f.warnings);
    if strict {
        refused.append(&mut warnings);
    }
    for w in &warnings {
        eprintln!("warning: {}", render(&loaded.file, w));
    }
    if !refused.is_empty() {
        let e = config::Error::Invalid {
            file: loaded.file.clone(),
            problems: refused,
        };
        let why = if strict {
            " (--strict: warnings too)"
        } else {
            ""
        };
        eprintln!("xvs: invalid configuration{why}:\n{e}");
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    }
    let mut out = summary(&path.display().to_string(), &loaded.config);
    let n = warnings.len();
    if n > 0 {
        let plural = if n == 1 { "" } else { "s" };
        out = out.replacen(": OK\n", &format!(": OK ({n} warning{plural})\n"), 1);
    }
    print!("{out}");
    ExitCode::SUCCESS
}

/// What [`findings`] found, located in the config's text.
pub struct Findings {
    /// Refused: exit 2.
    pub refused: Vec<Problem>,
    /// Warnings.
    pub warnings: Vec<Problem>,
}

/// What `xvs run` refuses of a loaded config before it looks at the host, and what is
/// dangerous in it. `reload_too`: also refuse what every reload would (`xvs check`); without
/// it (`xvs run`, which can start from such a file) that is a warning.
pub fn findings(l: &Loaded, reload_too: bool) -> Findings {
    let at = |(key, message): (config::KeyPath, String)| config::problem_at(&l.text, &key, message);
    let start = daemon::startcheck::check(&l.config);
    let mut refused: Vec<Problem> = start.refused.into_iter().map(at).collect();
    let mut warnings = config::warnings(&l.text, &l.config);
    warnings.extend(start.warnings.into_iter().map(at));
    if l.from_file
        && let Ok((_, written)) = config::parse_written(&l.text, &l.file)
        && let Some(why) = written.incomplete()
    {
        let lines = l.text.lines().count().max(1);
        let p = Problem {
            key: "(file)".to_owned(),
            line: if written.keys.is_empty() { 1 } else { lines },
            column: 1,
            message: why.to_owned(),
        };
        if reload_too {
            refused.insert(0, p);
        } else {
            warnings.insert(0, p);
        }
    }
    Findings { refused, warnings }
}

/// One problem as `file:line:column: key: message`.
pub fn render(file: &str, p: &Problem) -> String {
    config::Error::Invalid {
        file: file.to_owned(),
        problems: vec![p.clone()],
    }
    .to_string()
}

/// The readable summary of a valid config.
pub fn summary(name: &str, c: &Config) -> String {
    let mut s = String::new();
    let dp = &c.dataplane;
    let _ = writeln!(s, "{name}: OK");
    if let Some(k) = &c.kubernetes {
        let kc = k
            .kubeconfig
            .as_ref()
            .map_or("in-cluster".to_owned(), |p| p.display().to_string());
        let _ = writeln!(
            s,
            "source: kubernetes ({kc}; service-proxy-name {}; default scheduler {}; min sync {})",
            k.service_proxy_name.as_deref().unwrap_or("<unset>"),
            k.default_scheduler.name(),
            k.min_sync_period
        );
    } else {
        let _ = writeln!(s, "source: static ({} services)", c.services.len());
    }
    let ifaces: Vec<String> = dp
        .interfaces
        .iter()
        .map(|i| format!("{} x{} queues", i.name, i.queues))
        .collect();
    let _ = writeln!(
        s,
        "dataplane: mode {}, interfaces [{}], {} workers on cores {}, batch {}, snat {:?} ports {}",
        dp.mode.name(),
        ifaces.join(", "),
        dp.workers(),
        dp.cores,
        dp.batch_size,
        dp.snat_addresses,
        dp.snat_port_range
    );
    let _ = writeln!(
        s,
        "flowtable: capacity {} flows, removal grace {:?}",
        c.flowtable.capacity,
        c.removal_grace()
    );
    let _ = writeln!(
        s,
        "state: {} (restart hold {}, steering pinned under {})",
        dp.state_dir.display(),
        dp.restart_hold,
        dp.bpf_pin_root.display()
    );
    let _ = writeln!(
        s,
        "admin: http://{} (metrics, read-only API), healthz http://{}, socket {} (control {})",
        c.admin.listen,
        c.admin.healthz_listen(),
        c.admin_socket().display(),
        if c.admin.enable_control { "on" } else { "off" }
    );
    if let Some(m) = c.admin.metrics_listen {
        let _ = writeln!(s, "metrics: http://{m}/metrics (nothing else)");
    }
    let _ = writeln!(s, "log: {} ({})", c.log.level, log_format(c.log.format));
    if c.services.is_empty() {
        return s;
    }
    let _ = writeln!(s, "services:");
    for svc in &c.services {
        service_lines(&mut s, c, svc);
    }
    s
}

/// A service's lines of the summary: what it is, its health check, its backends.
fn service_lines(s: &mut String, c: &Config, svc: &config::Service) {
    let dp = &c.dataplane;
    let frontend = match svc.vip {
        std::net::IpAddr::V4(a) => format!("{a}:{}", svc.port),
        std::net::IpAddr::V6(a) => format!("[{a}]:{}", svc.port),
    };
    let mut sched = svc.scheduler.name().to_owned();
    for f in &svc.flags {
        sched.push_str(match f {
            config::SchedFlag::MhPort => "+mh-port",
            config::SchedFlag::MhFallback => "+mh-fallback",
        });
    }
    let affinity = svc
        .session_affinity_timeout
        .map_or(String::new(), |t| format!(", ClientIP affinity {t}"));
    let limit = svc.new_conn_rate.map_or(String::new(), |r| {
        format!(
            ", at most {r} new connections/s (burst {})",
            svc.new_conn_burst.unwrap_or(r)
        )
    });
    let _ = writeln!(
        s,
        "  {} {}/{} scheduler {} mode {}, {} backends{}{}",
        svc.name,
        frontend,
        svc.protocol.name(),
        sched,
        svc.mode_or(dp.mode).name(),
        svc.backends.len(),
        affinity,
        limit
    );
    if let Some(check) = slowpath::health::Check::resolve(&c.health, &svc.health) {
        let _ = writeln!(s, "    health: {}", check.describe());
    }
    for b in &svc.backends {
        let drain = if b.weight == 0 { " (drain)" } else { "" };
        let _ = writeln!(s, "    -> {} weight {}{}", b.addr, b.weight, drain);
    }
}

fn log_format(f: config::LogFormat) -> &'static str {
    match f {
        config::LogFormat::Text => "text",
        config::LogFormat::Json => "json",
    }
}
