//! The load balancers under test, set up in the rig's LB namespace.
//!
//! - `xvs`: the real binary, `xvs run --config` with a config generated for the rig (worker
//!   pinned to the LB core, slowpath on the generator core); ready when it prints
//!   `xvs: ready`; stopped with SIGTERM, its `key=value` counters kept.
//! - `nft`: nftables DNAT + conntrack, shaped like kube-proxy's nftables mode: a
//!   `service-ips` verdict map keyed on `ip daddr . meta l4proto . th dport` jumping to
//!   per-service chains that pick an endpoint with `numgen random mod N` into per-endpoint
//!   DNAT chains; with SNAT (like xvs' full-NAT) marked packets are masqueraded.
//! - `iptables`: kube-proxy's iptables mode: KUBE-SERVICES -> KUBE-SVC-* (`-m statistic
//!   --mode random --probability`) -> KUBE-SEP-* DNAT; KUBE-MARK-MASQ / KUBE-POSTROUTING.
//! - `l2fwd`: `perf-lab l2fwd` (see [`crate::l2fwd`]) pinned to the LB core.
//!
//! Kernel targets turn on `ip_forward` and steer the LB veths' receive processing to the LB
//! core with RPS (`rps_cpus`), so all their work lands on that core.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::rig::{
    self, BACKEND_PORT, CLIENT_IP, IF_LB_BACKEND, IF_LB_CLIENT, LB_BACKEND_IP, LB_CLIENT_IP, Rig,
    VIP,
};
use crate::sys::{http_get_in, metric_sum, run, sh_in};

/// A load balancer under test.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// xvs (AF_XDP userspace).
    Xvs,
    /// nftables DNAT + conntrack (kube-proxy nftables mode).
    Nft,
    /// iptables DNAT + conntrack (kube-proxy iptables mode).
    Iptables,
    /// AF_XDP MAC-rewrite forwarder (ceiling).
    L2fwd,
}

impl Target {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Xvs => "xvs",
            Target::Nft => "nft",
            Target::Iptables => "iptables",
            Target::L2fwd => "l2fwd",
        }
    }

    /// Every target.
    pub const ALL: [Target; 4] = [Target::Xvs, Target::Nft, Target::Iptables, Target::L2fwd];
}

/// The services a target must serve.
#[derive(Clone, Debug)]
pub struct Services {
    /// Services per protocol (ports `base_port..base_port+count`).
    pub count: u32,
    /// First port.
    pub base_port: u16,
    /// Protocols ("udp", "tcp").
    pub protos: Vec<&'static str>,
    /// Backends of every service (1..=n of the rig).
    pub backends: u16,
    /// Source NAT too (xvs full-NAT, kernel masquerade).
    pub snat: bool,
    /// Flows expected (sizes the xvs flow table).
    pub flows: u32,
    /// xvs scheduler.
    pub scheduler: &'static str,
    /// Extra services (change-under-load adds some).
    pub extra: u32,
    /// xvs: every service `mode = "dsr"` with `encap = "l2"` (the rig's backends are on the
    /// LB's segment), each backend on the service's own port (L2 translates no port).
    pub dsr: bool,
}

/// Where and how the targets run.
#[derive(Clone, Debug)]
pub struct Placement {
    /// Core for the LB's work.
    pub lb_core: usize,
    /// Core for the generator, sinks and slowpaths.
    pub gen_core: usize,
    /// AF_XDP targets run their receive NAPI from their poll loop (preferred busy polling).
    pub napi_busy_poll: bool,
    /// The xvs binary.
    pub xvs: PathBuf,
    /// Scratch directory (configs, logs).
    pub dir: PathBuf,
    /// xvs' `[dataplane] state_dir` (default: `state` in `dir`).
    pub state_dir: Option<PathBuf>,
    /// xvs' `[dataplane] drain_timeout`, seconds (default: xvs' own).
    pub drain_timeout_s: Option<u32>,
    /// Further `[dataplane]` settings of xvs, `key = value` TOML lines (`--xvs-set`); a key
    /// perf-lab sets itself is replaced.
    pub xvs_dataplane: Vec<String>,
}

impl Placement {
    /// xvs' state directory.
    pub fn xvs_state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| self.dir.join("state"))
    }
}

/// How [`Running::restart`] ends the running xvs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL (a crash, an OOM kill), then a new xvs at once.
    Kill,
    /// SIGTERM (a graceful stop: with `drain_timeout = "0s"` it stops at once), the exit
    /// awaited, then a new xvs.
    Term,
    /// No signal: `xvs run --takeover` started beside the running xvs, which hands its
    /// sockets over and exits (an upgrade).
    Takeover,
}

impl Stop {
    /// `kill` or `term`.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Kill => "kill",
            Stop::Term => "term",
            Stop::Takeover => "takeover",
        }
    }
}

/// Waits (up to 30 s) for `child` to exit, then kills it.
fn reap(child: &mut Child, how: Stop) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(500))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("xvs did not exit within 30 s of the {}", how.name());
            }
        }
    }
}

/// When a [`Running::restart`] did what (CLOCK_MONOTONIC ns), and where the new xvs logs.
#[derive(Clone, Debug)]
pub struct Restarted {
    /// The signal was sent.
    pub signal_ns: u64,
    /// The same instant on the wall clock (xvs' log timestamps), ns since the epoch.
    pub signal_wall_ns: u64,
    /// The old process was reaped.
    pub exited_ns: u64,
    /// The new process was started.
    pub started_ns: u64,
    /// perf-lab read its `xvs: ready` line.
    pub ready_ns: u64,
    /// The new process's log.
    pub log: PathBuf,
    /// Processes started until one was ready (a supervisor's restarts).
    pub attempts: u32,
    /// Why the failed ones failed (the last line of each one's log).
    pub failures: Vec<String>,
}

/// How long a supervisor waits before starting xvs again after it failed to start
/// (systemd's default `RestartSec`).
pub const RESTART_DELAY: Duration = Duration::from_millis(100);

/// How long [`Running::restart`] keeps starting xvs again.
const RESTART_GIVE_UP: Duration = Duration::from_secs(20);

/// A started target.
pub struct Running {
    /// Which.
    pub target: Target,
    child: Option<Child>,
    stdout: Option<std::process::ChildStdout>,
    config: PathBuf,
    rig: Rig,
    /// l2fwd's stats file.
    stats: Option<PathBuf>,
    /// How xvs was started, for [`Running::restart`].
    argv: Vec<String>,
    /// Restarts so far (names the logs).
    restarts: u32,
}

/// The port of xvs' metrics endpoint, `[admin] listen` (127.0.0.1 in the LB namespace).
pub const XVS_ADMIN_PORT: u16 = 10249;

fn mask(core: usize) -> String {
    format!("{:x}", 1u64 << core)
}

impl Running {
    /// Sets up `target` on `rig` for `svc`.
    pub fn start(
        target: Target,
        rig: &Rig,
        svc: &Services,
        at: &Placement,
    ) -> anyhow::Result<Running> {
        std::fs::create_dir_all(&at.dir)?;
        let ns = rig.ns_lb();
        let config = at.dir.join(format!("{}.conf", target.name()));
        let mut r = Running {
            target,
            child: None,
            stdout: None,
            config: config.clone(),
            rig: rig.clone(),
            stats: None,
            argv: Vec::new(),
            restarts: 0,
        };
        match target {
            Target::Xvs => {
                // A fresh flow table: a state left in the directory by an earlier run (same
                // work directory) would be adopted, its flows with it.
                let state = at.xvs_state_dir();
                if state.exists() {
                    std::fs::remove_dir_all(&state)
                        .with_context(|| format!("removing {}", state.display()))?;
                }
                std::fs::write(&config, xvs_config(rig, svc, at))?;
                config::load(&config).map_err(|e| anyhow::anyhow!("generated xvs config: {e}"))?;
                if !at.xvs.exists() {
                    bail!(
                        "xvs binary {} not found (cargo build --release -p xvs, or --xvs PATH)",
                        at.xvs.display()
                    );
                }
                let xvs = at.xvs.to_string_lossy().into_owned();
                let cfg = config.to_string_lossy().into_owned();
                r.argv = ["ip", "netns", "exec", &ns, &xvs, "run", "--config", &cfg]
                    .map(str::to_owned)
                    .to_vec();
                let argv = r.argv.clone();
                let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                r.spawn_ready(&argv, "xvs: ready", &at.dir.join("xvs.log"))?;
            }
            Target::L2fwd => {
                let me = std::env::current_exe()?.to_string_lossy().into_owned();
                let stats = at.dir.join("l2fwd.stats");
                let _ = std::fs::remove_file(&stats);
                let stats_arg = stats.to_string_lossy().into_owned();
                r.stats = Some(stats);
                let (q, b, c) = (
                    rig.queues.to_string(),
                    rig.backends.to_string(),
                    at.lb_core.to_string(),
                );
                let mut argv = vec![
                    "ip",
                    "netns",
                    "exec",
                    &ns,
                    &me,
                    "l2fwd",
                    "--in",
                    IF_LB_CLIENT,
                    "--out",
                    IF_LB_BACKEND,
                    "--queues",
                    &q,
                    "--backends",
                    &b,
                    "--core",
                    &c,
                    "--stats",
                    &stats_arg,
                ];
                if at.napi_busy_poll {
                    argv.push("--napi-busy-poll");
                }
                r.spawn_ready(&argv, "perf-lab l2fwd: ready", &at.dir.join("l2fwd.log"))?;
            }
            Target::Nft | Target::Iptables => {
                rig.set_lb_rps(&mask(at.lb_core))?;
                r.load_rules(svc)?;
                sh_in(&ns, "sysctl -qw net.ipv4.ip_forward=1")?;
            }
        }
        Ok(r)
    }

    fn load_rules(&self, svc: &Services) -> anyhow::Result<()> {
        let ns = self.rig.ns_lb();
        let path = self.config.to_string_lossy().into_owned();
        match self.target {
            Target::Nft => {
                std::fs::write(&self.config, nft_rules(svc))?;
                run(&["ip", "netns", "exec", &ns, "nft", "-f", &path])
                    .context("loading nft rules")?;
            }
            Target::Iptables => {
                std::fs::write(&self.config, iptables_rules(svc))?;
                sh_in(&ns, &format!("iptables-restore < {path}"))
                    .context("loading iptables rules")?;
            }
            _ => {}
        }
        Ok(())
    }

    fn spawn_ready(&mut self, argv: &[&str], ready: &str, log: &Path) -> anyhow::Result<()> {
        let mut child = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", argv.join(" ")))?;
        let stderr = child.stderr.take().expect("piped");
        self.stdout = child.stdout.take();
        self.child = Some(child);
        let (tx, rx) = mpsc::channel();
        let ready = ready.to_owned();
        let mut logf = std::fs::File::create(log)?;
        std::thread::spawn(move || {
            use std::io::Write;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(logf, "{line}");
                if line.contains(&ready) {
                    let _ = tx.send(());
                }
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            // Short: a restart that fails is retried, and this is how soon it is seen.
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(()) => return Ok(()),
                Err(_) => {
                    let status = self
                        .child
                        .as_mut()
                        .and_then(|c| c.try_wait().ok().flatten());
                    if status.is_none() && std::time::Instant::now() < deadline {
                        continue;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                    let tail = std::fs::read_to_string(log).unwrap_or_default();
                    let tail: Vec<&str> = tail.lines().rev().take(15).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    bail!(
                        "{} did not become ready ({}); its log {}:\n{}",
                        self.target.name(),
                        status.map_or("timed out".to_owned(), |s| s.to_string()),
                        log.display(),
                        tail.join("\n")
                    )
                }
            }
        }
    }

    /// Whether the target busy-polls its core (xvs, l2fwd).
    pub fn busy_polls(&self) -> bool {
        matches!(self.target, Target::Xvs | Target::L2fwd)
    }

    /// The busy time a busy-polling target reports (ns since it started): xvs'
    /// `xvs_worker_busy_seconds_total` from its admin endpoint, l2fwd's stats file. `None`
    /// for the kernel targets or when it cannot be read.
    pub fn busy_ns(&self) -> Option<u64> {
        match self.target {
            Target::Xvs => {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], XVS_ADMIN_PORT));
                let text = http_get_in(&self.rig.ns_lb(), addr, "/metrics").ok()?;
                metric_sum(&text, "xvs_worker_busy_seconds_total").map(|s| (s * 1e9) as u64)
            }
            Target::L2fwd => crate::l2fwd::read_stat(self.stats.as_deref()?, "busy_ns"),
            Target::Nft | Target::Iptables => None,
        }
    }

    /// The LB process, if the target is one.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Applies a new service set while running: xvs rewrites its config and gets SIGHUP,
    /// kernel targets replace their rule set atomically (one nft transaction, one
    /// iptables-restore). l2fwd has nothing to change.
    pub fn reload(&mut self, rig: &Rig, svc: &Services, at: &Placement) -> anyhow::Result<()> {
        match self.target {
            Target::Xvs => {
                std::fs::write(&self.config, xvs_config(rig, svc, at))?;
                if let Some(pid) = self.pid() {
                    // SAFETY: kill has no memory preconditions.
                    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
                }
                Ok(())
            }
            Target::Nft | Target::Iptables => self.load_rules(svc),
            Target::L2fwd => Ok(()),
        }
    }

    /// Ends the running xvs as `how` says and starts a new one with the same config (and
    /// state directory) at once, returning when it logged `xvs: ready`. Its log goes to
    /// `xvs-restart<N>.log` in `dir`. A new xvs that exits without becoming ready is started
    /// again [`RESTART_DELAY`] later, as a supervisor would (each further attempt logs to
    /// `xvs-restart<N>-try<K>.log`).
    pub fn restart(&mut self, how: Stop, dir: &Path) -> anyhow::Result<Restarted> {
        if self.target != Target::Xvs || self.argv.is_empty() {
            bail!("only a running xvs can be restarted");
        }
        let mut child = self.child.take().context("xvs is not running")?;
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let signal_ns = crate::sys::mono_ns();
        if how == Stop::Takeover {
            return self.take_over(child, dir, wall, signal_ns);
        }
        let sig = match how {
            Stop::Kill => libc::SIGKILL,
            Stop::Term | Stop::Takeover => libc::SIGTERM,
        };
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(child.id() as i32, sig) };
        reap(&mut child, how)?;
        let exited_ns = crate::sys::mono_ns();
        self.stdout = None;
        self.restarts += 1;
        let argv: Vec<String> = self.argv.clone();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut failures = Vec::new();
        let started_ns = crate::sys::mono_ns();
        for attempt in 1.. {
            let log = match attempt {
                1 => dir.join(format!("xvs-restart{}.log", self.restarts)),
                k => dir.join(format!("xvs-restart{}-try{k}.log", self.restarts)),
            };
            match self.spawn_ready(&argv, "xvs: ready", &log) {
                Ok(()) => {
                    return Ok(Restarted {
                        signal_ns,
                        signal_wall_ns: wall,
                        exited_ns,
                        started_ns,
                        ready_ns: crate::sys::mono_ns(),
                        log,
                        attempts: attempt,
                        failures,
                    });
                }
                Err(e) => {
                    if let Some(mut c) = self.child.take() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let last = text.lines().last().unwrap_or("").to_owned();
                    let elapsed = crate::sys::mono_ns().saturating_sub(signal_ns);
                    if elapsed > RESTART_GIVE_UP.as_nanos() as u64 {
                        return Err(
                            e.context(format!("xvs did not come back in {attempt} attempts"))
                        );
                    }
                    failures.push(last);
                    std::thread::sleep(RESTART_DELAY);
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// [`Running::restart`] as an upgrade: the new xvs is started with `--takeover` while
    /// `old` runs; ready, then the old one reaped (its stdout kept open until then, so its
    /// final counters do not meet a closed pipe).
    fn take_over(
        &mut self,
        mut old: Child,
        dir: &Path,
        wall: u64,
        signal_ns: u64,
    ) -> anyhow::Result<Restarted> {
        self.restarts += 1;
        let old_stdout = self.stdout.take();
        let mut argv: Vec<String> = self.argv.clone();
        let run = argv
            .iter()
            .position(|a| a == "run")
            .context("xvs argv without `run`")?;
        argv.insert(run + 1, "--takeover".to_owned());
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let log = dir.join(format!("xvs-takeover{}.log", self.restarts));
        let started_ns = crate::sys::mono_ns();
        let ready = self.spawn_ready(&argv, "xvs: ready", &log);
        let ready_ns = crate::sys::mono_ns();
        reap(&mut old, Stop::Takeover)?;
        let exited_ns = crate::sys::mono_ns();
        drop(old_stdout);
        ready?;
        Ok(Restarted {
            signal_ns,
            signal_wall_ns: wall,
            exited_ns,
            started_ns,
            ready_ns,
            log,
            attempts: 1,
            failures: Vec::new(),
        })
    }

    /// xvs' Prometheus metrics, when they can be read.
    pub fn xvs_metrics(&self) -> Option<String> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], XVS_ADMIN_PORT));
        (self.target == Target::Xvs)
            .then(|| http_get_in(&self.rig.ns_lb(), addr, "/metrics").ok())
            .flatten()
    }

    /// Stops the target; returns its counters (xvs and l2fwd print `key=value` lines).
    pub fn stop(mut self) -> BTreeMap<String, u64> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> BTreeMap<String, u64> {
        let mut counters = BTreeMap::new();
        if let Some(mut child) = self.child.take() {
            // SAFETY: as above.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
            let mut out = String::new();
            if let Some(mut s) = self.stdout.take() {
                let _ = s.read_to_string(&mut out);
            }
            for line in out.lines() {
                if let Some((k, v)) = line.split_once('=')
                    && let Ok(v) = v.trim().parse()
                {
                    counters.insert(k.trim().to_owned(), v);
                }
            }
        }
        if matches!(self.target, Target::Nft | Target::Iptables) {
            let ns = self.rig.ns_lb();
            let _ = sh_in(&ns, "sysctl -qw net.ipv4.ip_forward=0");
            let _ = match self.target {
                Target::Nft => sh_in(&ns, "nft delete table ip perf-lab-kp"),
                _ => sh_in(&ns, "iptables -t nat -F && iptables -t nat -X"),
            };
        }
        counters
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop_inner();
        }
    }
}

fn all_services(svc: &Services) -> impl Iterator<Item = (u32, &'static str, u16)> + '_ {
    let n = svc.count + svc.extra;
    svc.protos
        .iter()
        .flat_map(move |p| (0..n).map(move |i| (i, *p, svc.base_port.wrapping_add(i as u16))))
}

/// The xvs config for the rig.
pub fn xvs_config(rig: &Rig, svc: &Services, at: &Placement) -> String {
    // The SYN proxy is off: the scenarios measure forwarding, and the generator's SYN loads
    // are floods by `auto`'s standard (the proxy's own cost: `benches --mix synproxy`).
    // The state (flow table, control socket) lives with the run's files, so rigs never
    // share one.
    let state = at.xvs_state_dir();
    let q = rig.queues;
    let capacity = (u64::from(svc.flows) * 2).max(65536).next_power_of_two();
    let mut s = format!(
        "# Generated by perf-lab for rig {prefix}.\n\
         [node]\nname = \"perf-lab\"\naddresses = [\"{LB_CLIENT_IP}\"]\n\n\
         [dataplane]\n\
         interfaces = [\n  {{ name = \"{IF_LB_CLIENT}\", queues = {q} }},\n  {{ name = \"{IF_LB_BACKEND}\", queues = {q} }},\n]\n\
         cores = [{lb}]\nslowpath_core = {gen}\nmode = \"{mode}\"\n\
         snat_addresses = [\"{LB_BACKEND_IP}\"]\nsnat_port_range = \"1024-32767\"\n\
         xdp_mode = \"auto\"\nzero_copy = \"off\"\nbatch_size = 64\nnapi_busy_poll = {busy}\nstate_dir = {state:?}\nbpf_pin_root = \"{pins}/xvs\"\n{drain}\n\
         [flowtable]\ncapacity = {capacity}\n\n\
         [admin]\nlisten = \"127.0.0.1:{XVS_ADMIN_PORT}\"\n\n\
         [synproxy]\nmode = \"off\"\n",
        prefix = rig.prefix,
        state = state.display().to_string(),
        pins = crate::rig::LAB_BPFFS,
        lb = at.lb_core,
        gen = at.gen_core,
        mode = if svc.snat { "fullnat" } else { "nat" },
        busy = at.napi_busy_poll,
        drain = at
            .drain_timeout_s
            .map_or(String::new(), |s| format!("drain_timeout = \"{s}s\"\n")),
    );
    if !at.xvs_dataplane.is_empty() {
        s = set_dataplane(&s, &at.xvs_dataplane);
    }
    let backends: Vec<String> = (1..=svc.backends)
        .map(|i| format!("{{ addr = \"{}:{BACKEND_PORT}\" }}", rig::backend_ip(i)))
        .collect();
    let backends = backends.join(", ");
    for (i, proto, port) in all_services(svc) {
        let (mode, backends) = if svc.dsr {
            let own: Vec<String> = (1..=svc.backends)
                .map(|b| format!("{{ addr = \"{}:{port}\" }}", rig::backend_ip(b)))
                .collect();
            ("mode = \"dsr\"\nencap = \"l2\"\n", own.join(", "))
        } else {
            ("", backends.clone())
        };
        let _ = write!(
            s,
            "\n[[services]]\nname = \"s{i}-{proto}\"\nvip = \"{VIP}\"\nport = {port}\nprotocol = \"{proto}\"\n\
             scheduler = \"{}\"\n{mode}backends = [{backends}]\n",
            svc.scheduler
        );
    }
    for i in 1..=rig.backends {
        let _ = write!(
            s,
            "\n[[neighbours]]\nip = \"{}\"\nmac = \"{}\"\n",
            rig::backend_ip(i),
            rig::mac_str(rig::backend_mac(i))
        );
    }
    let _ = write!(
        s,
        "\n[[neighbours]]\nip = \"{CLIENT_IP}\"\nmac = \"{}\"\n",
        rig::mac_str(rig::CLIENT_MAC)
    );
    s
}

/// `config` with each `key = value` of `lines` in its `[dataplane]` table, replacing a line
/// of the same key there.
fn set_dataplane(config: &str, lines: &[String]) -> String {
    let key = |l: &str| l.split('=').next().unwrap_or("").trim().to_owned();
    let keys: Vec<String> = lines.iter().map(|l| key(l)).collect();
    let mut out = String::new();
    let mut in_dp = false;
    for l in config.lines() {
        if l.starts_with('[') {
            if in_dp {
                for x in lines {
                    let _ = writeln!(out, "{}", x.trim());
                }
            }
            in_dp = l == "[dataplane]";
        }
        if in_dp && l.contains('=') && !l.starts_with(' ') && keys.contains(&key(l)) {
            continue;
        }
        let _ = writeln!(out, "{l}");
    }
    out
}

/// The nftables rule set (kube-proxy nftables-mode shape).
pub fn nft_rules(svc: &Services) -> String {
    let mut s = String::from(
        "table ip perf-lab-kp {}\ndelete table ip perf-lab-kp\ntable ip perf-lab-kp {\n\
         \tchain mark-for-masquerade {\n\t\tmeta mark set meta mark | 0x4000\n\t}\n\
         \tchain masquerading {\n\t\tmeta mark & 0x4000 == 0 return\n\t\tmeta mark set meta mark ^ 0x4000\n\t\tmasquerade fully-random\n\t}\n\
         \tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n\
         \tchain nat-postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tjump masquerading\n\t}\n",
    );
    let mut elements = Vec::new();
    for (i, proto, port) in all_services(svc) {
        let chain = format!("service-{i}-{proto}");
        elements.push(format!("{VIP} . {proto} . {port} : goto {chain}"));
        let vmap: Vec<String> = (0..svc.backends)
            .map(|b| format!("{b} : goto endpoint-{i}-{proto}-{b}"))
            .collect();
        let masq = if svc.snat {
            "\t\tjump mark-for-masquerade\n"
        } else {
            ""
        };
        let _ = write!(
            s,
            "\tchain {chain} {{\n{masq}\t\tnumgen random mod {} vmap {{ {} }}\n\t}}\n",
            svc.backends,
            vmap.join(", ")
        );
        for b in 0..svc.backends {
            let _ = write!(
                s,
                "\tchain endpoint-{i}-{proto}-{b} {{\n\t\tmeta l4proto {proto} dnat to {}:{BACKEND_PORT}\n\t}}\n",
                rig::backend_ip(b + 1)
            );
        }
    }
    let _ = write!(
        s,
        "\tmap service-ips {{\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = {{ {} }}\n\t}}\n\
         \tchain services {{\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}}\n}}\n",
        elements.join(",\n\t\t\t")
    );
    s
}

/// The iptables-restore input (kube-proxy iptables-mode shape).
pub fn iptables_rules(svc: &Services) -> String {
    let mut chains = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
         :KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
    );
    let mut rules = String::from(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
         -A KUBE-POSTROUTING -j MASQUERADE --random-fully\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n",
    );
    for (i, proto, port) in all_services(svc) {
        let up = proto.to_uppercase();
        let svc_chain = format!("KUBE-SVC-{i}-{up}");
        let _ = writeln!(chains, ":{svc_chain} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {VIP}/32 -p {proto} -m {proto} --dport {port} -j {svc_chain}"
        );
        if svc.snat {
            let _ = writeln!(rules, "-A {svc_chain} -j KUBE-MARK-MASQ");
        }
        let n = svc.backends;
        for b in 0..n {
            let sep = format!("KUBE-SEP-{i}-{up}-{b}");
            let _ = writeln!(chains, ":{sep} - [0:0]");
            if b + 1 < n {
                let p = 1.0 / f64::from(n - b);
                let _ = writeln!(
                    rules,
                    "-A {svc_chain} -m statistic --mode random --probability {p:.11} -j {sep}"
                );
            } else {
                let _ = writeln!(rules, "-A {svc_chain} -j {sep}");
            }
            let _ = writeln!(
                rules,
                "-A {sep} -p {proto} -m {proto} -j DNAT --to-destination {}:{BACKEND_PORT}",
                rig::backend_ip(b + 1)
            );
        }
    }
    format!("{chains}{rules}COMMIT\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xvs_set_replaces_or_adds_dataplane_keys() {
        let rig = Rig::new("t", 3, 1).unwrap();
        let svc = Services {
            count: 1,
            base_port: 1000,
            protos: vec!["tcp"],
            backends: 3,
            snat: false,
            flows: 10,
            scheduler: "rr",
            extra: 0,
            dsr: false,
        };
        let mut at = Placement {
            lb_core: 1,
            gen_core: 0,
            napi_busy_poll: false,
            xvs: PathBuf::from("xvs"),
            dir: PathBuf::from("/tmp/x"),
            state_dir: None,
            drain_timeout_s: None,
            xvs_dataplane: vec![
                "tx_ring_size = 8192".into(),
                "umem_frames = 16384".into(),
                "batch_size=128".into(),
            ],
        };
        let c = xvs_config(&rig, &svc, &at);
        config::parse(&c, "xvs.conf").expect("a valid config");
        let dp = c
            .split("[dataplane]")
            .nth(1)
            .unwrap()
            .split("\n[")
            .next()
            .unwrap();
        assert!(dp.lines().any(|l| l == "tx_ring_size = 8192"), "{c}");
        assert!(dp.lines().any(|l| l == "batch_size=128"), "{c}");
        assert!(!dp.contains("batch_size = 64"), "{c}");
        assert_eq!(c.matches("batch_size").count(), 1, "{c}");
        at.xvs_dataplane.clear();
        assert!(xvs_config(&rig, &svc, &at).contains("batch_size = 64"));
    }

    /// `--mode dsr`: every service DSR by L2, each backend on the service's port, and the
    /// config valid.
    #[test]
    fn dsr_services_are_l2_to_the_service_port() {
        let rig = Rig::new("t", 2, 1).unwrap();
        let svc = Services {
            count: 1,
            base_port: 1000,
            protos: vec!["tcp"],
            backends: 2,
            snat: false,
            flows: 10,
            scheduler: "rr",
            extra: 0,
            dsr: true,
        };
        let at = Placement {
            lb_core: 1,
            gen_core: 0,
            napi_busy_poll: false,
            xvs: PathBuf::from("xvs"),
            dir: PathBuf::from("/tmp/x"),
            state_dir: None,
            drain_timeout_s: None,
            xvs_dataplane: Vec::new(),
        };
        let c = config::parse(&xvs_config(&rig, &svc, &at), "xvs.conf").expect("a valid config");
        let s = &c.services[0];
        assert_eq!(
            s.mode_or(c.dataplane.mode),
            config::Mode::Dsr(config::Encap::L2)
        );
        let ports: Vec<u16> = s.backends.iter().map(|b| b.addr.port()).collect();
        assert_eq!(ports, [1000, 1000]);
    }
}
