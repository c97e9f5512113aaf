//! `xvs check`: validate a config and print a summary an operator can eyeball.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use config::Config;

pub fn main(path: &PathBuf) -> ExitCode {
    let Some(cfg) = crate::load_config(Some(path)) else {
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    };
    print!("{}", summary(&path.display().to_string(), &cfg));
    ExitCode::SUCCESS
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
    s
}

fn log_format(f: config::LogFormat) -> &'static str {
    match f {
        config::LogFormat::Text => "text",
        config::LogFormat::Json => "json",
    }
}
