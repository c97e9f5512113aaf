//! What `xvs run` checks before it touches anything, and what `xvs check --host` lists: every
//! problem of the machine for a config at once, so that an operator fixes them in one round
//! instead of one per start, and `run` refuses clearly instead of failing half-way.
//!
//! The checks ([`inspect`]), each named by its [`Finding::check`]:
//! - `kernel`: Linux [`KERNEL_MIN`] or later;
//! - `cores`: `[dataplane] cores` and `slowpath_core` within the process's cpuset;
//! - `capabilities`: those of [`crate::caps::required`];
//! - `interfaces`: at least one configured, each present in this network namespace;
//! - `channels`, `xdp`, `zero_copy`, `checksum`: per interface, from the kernel
//!   ([`nic`]): its receive queues against `queues` (more channels than queues leaves
//!   frames on queues no socket serves, unless `[dataplane] allow_fewer_queues`), native
//!   XDP and AF_XDP zero-copy against `xdp_mode` and `zero_copy`, and veth's checksum
//!   offload trap (a warning);
//! - `bpffs`: `bpf_pin_root` on a bpffs;
//! - `memory`: the flow and affinity tables within memory and the state directory;
//! - `hugepages`: whether a state directory on tmpfs gives the flow table huge pages ([`huge`],
//!   a warning);
//! - `ports`: the admin and healthz listeners and flow sync's address free to bind, and a
//!   full-NAT port range the kernel does not also hand out;
//! - `sync`: flow sync's key file as `run` reads it.
//!
//! A problem stops `run`; a warning is logged by `run` and listed by `check --host`.
//! Nothing here changes the machine: ports are bound and released at once, the interfaces
//! are only queried.

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use config::Config;

use crate::caps;

mod huge;
pub mod nic;
mod xdp_features;

/// The oldest kernel xvs runs on: XDP through a `bpf_link` (5.9), one UMEM shared by the
/// sockets of several devices and queues (5.10), `CAP_BPF` and `CAP_PERFMON` (5.8), the full
/// `XDP_STATISTICS` (5.9). Tested on 6.18.
pub const KERNEL_MIN: (u32, u32) = (5, 10);

/// One thing found wrong (or worth knowing) about the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The check that found it (see the module doc): `kernel`, `cores`, `channels`, ...
    pub check: &'static str,
    /// What is wrong and what to do, in one sentence or two.
    pub text: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.check, self.text)
    }
}

/// Everything the checks found: problems stop `xvs run`, warnings do not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// What makes `xvs run` refuse to start.
    pub problems: Vec<Finding>,
    /// What is legal but likely to hurt (frames xvs will not see, copy mode...).
    pub warnings: Vec<Finding>,
}

impl Report {
    fn problem(&mut self, check: &'static str, text: impl Into<String>) {
        self.problems.push(Finding {
            check,
            text: text.into(),
        });
    }

    fn warning(&mut self, check: &'static str, text: impl Into<String>) {
        self.warnings.push(Finding {
            check,
            text: text.into(),
        });
    }

    /// A check's result: its error, if any, is a problem.
    fn check(&mut self, check: &'static str, r: Result<(), String>) {
        if let Err(e) = r {
            self.problem(check, e);
        }
    }
}

/// What `xvs run` checks before it touches anything: `Err` lists every problem (see
/// [`inspect`]); warnings are logged here.
pub fn preflight(cfg: &Config) -> Result<(), Vec<Finding>> {
    let report = inspect(cfg, true);
    for w in &report.warnings {
        tracing::warn!(check = w.check, "{}", w.text);
    }
    if report.problems.is_empty() {
        Ok(())
    } else {
        Err(report.problems)
    }
}

/// Runs every check of the module doc against this machine for `cfg`. Without
/// `require_interfaces` (`xvs check --host` with no config), an empty interface list is no
/// problem: the checks that need interfaces have nothing to look at.
pub fn inspect(cfg: &Config, require_interfaces: bool) -> Report {
    let mut r = Report::default();
    r.check("kernel", check_kernel());
    // It needs no privilege, and a pod's cpuset is the likeliest mismatch.
    r.check(
        "cores",
        cpuset().and_then(|cpuset| {
            cfg.dataplane
                .cores
                .resolve(cfg.dataplane.slowpath_core, &cpuset)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }),
    );
    r.check("capabilities", check_caps(cfg));
    if cfg.dataplane.interfaces.is_empty() && require_interfaces {
        r.problem(
            "interfaces",
            "no [dataplane] interfaces configured: nothing to forward on",
        );
    }
    for ifc in &cfg.dataplane.interfaces {
        if !Path::new("/sys/class/net").join(&ifc.name).exists() {
            r.problem(
                "interfaces",
                format!(
                    "interface {} (dataplane.interfaces) does not exist in this network namespace",
                    ifc.name
                ),
            );
            continue;
        }
        nic::inspect(&mut r, &cfg.dataplane, ifc);
    }
    r.check("bpffs", check_bpffs(&cfg.dataplane.bpf_pin_root));
    r.check("memory", check_flow_memory(cfg));
    let table = flowtable::FlowTable::file_bytes(
        cfg.flowtable.capacity as usize,
        cfg.flowtable.backends_max as usize,
    )
    .unwrap_or(0);
    if let Some(w) = huge::inspect(&cfg.dataplane.state_dir, table) {
        r.warning("hugepages", w);
    }
    check_ports(&mut r, cfg);
    if cfg.sync.enable
        && let Err(e) = slowpath::flowsync::FlowSyncConfig::from_config(cfg)
    {
        r.problem("sync", e);
    }
    r
}

fn check_caps(cfg: &Config) -> Result<(), String> {
    let needs = caps::required(cfg);
    let effective =
        caps::effective().map_err(|e| format!("reading this process's capabilities: {e}"))?;
    let missing = caps::missing(effective, &needs);
    if missing.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = missing.iter().map(ToString::to_string).collect();
    Err(format!(
        "missing capabilities: {}; run as root, or grant them (setcap, systemd AmbientCapabilities=, the DaemonSet's securityContext)",
        list.join(", ")
    ))
}

/// The running kernel's release (`uname -r`).
fn kernel_release() -> Option<String> {
    // SAFETY: uname fills the struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    // SAFETY: the kernel NUL-terminates `release`.
    let c = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    Some(c.to_string_lossy().into_owned())
}

/// `(major, minor)` of a release such as `6.18.44-fc-v657`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(['.', '-', '+']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

fn check_kernel() -> Result<(), String> {
    let Some(release) = kernel_release() else {
        return Err("cannot read the kernel's release (uname)".into());
    };
    kernel_at_least(&release, KERNEL_MIN)
}

fn kernel_at_least(release: &str, min: (u32, u32)) -> Result<(), String> {
    match kernel_version(release) {
        Some(v) if v >= min => Ok(()),
        Some(_) => Err(format!(
            "Linux {release} is older than {}.{}, the oldest xvs runs on (XDP through a bpf_link, one AF_XDP UMEM shared across devices)",
            min.0, min.1
        )),
        None => Err(format!(
            "cannot tell the kernel's version from its release {release:?}"
        )),
    }
}

/// The admin listeners and flow sync's address must be free to bind (`run` binds them
/// last, after the node's interfaces are set up); the full-NAT ports must not be the
/// kernel's.
fn check_ports(r: &mut Report, cfg: &Config) {
    let tcp = |key: &str, addr: SocketAddr| {
        std::net::TcpListener::bind(addr).map(drop).map_err(|e| {
            format!("[admin] {key} {addr} cannot be bound: {e} (another process listens there? kube-proxy serves its healthz on 10256: set [admin] healthz_listen)")
        })
    };
    r.check("ports", tcp("listen", cfg.admin.listen));
    let healthz = cfg.admin.healthz_listen();
    if healthz != cfg.admin.listen || healthz.port() == 0 {
        r.check("ports", tcp("healthz_listen", healthz));
    }
    if cfg.sync.enable
        && let Some(addr) = cfg.sync.listen
        && let Err(e) = std::net::UdpSocket::bind(addr)
    {
        r.problem(
            "ports",
            format!("[sync] listen {addr} cannot be bound: {e}"),
        );
    }
    let local = local_addresses();
    let snat_local = cfg
        .dataplane
        .snat_addresses
        .iter()
        .any(|a| local.contains(a));
    if snat_local && let Some((lo, hi)) = kernel_port_range() {
        let range = cfg.dataplane.snat_port_range;
        if u32::from(range.first) <= hi && lo <= u32::from(range.last) {
            r.problem("ports", format!(
                "dataplane.snat_port_range {range} overlaps the kernel's ephemeral ports {lo}-{hi} on a SNAT address this node also uses: replies to the kernel's own connections would be taken by xvs; choose a range outside {lo}-{hi} (or set net.ipv4.ip_local_port_range)"
            ));
        }
    }
}

/// The cores this process may run on (`sched_getaffinity`: in a pod, the cpuset the
/// kubelet gave it), ascending.
pub fn cpuset() -> Result<Vec<usize>, String> {
    let ids = core_affinity::get_core_ids().ok_or_else(|| {
        format!(
            "reading the cpuset this process may run on (sched_getaffinity): {}",
            std::io::Error::last_os_error()
        )
    })?;
    let mut v: Vec<usize> = ids.into_iter().map(|c| c.id).collect();
    v.sort_unstable();
    Ok(v)
}

fn kernel_port_range() -> Option<(u32, u32)> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<u32>().ok());
    Some((it.next()??, it.next()??))
}

/// The addresses configured on this namespace's interfaces (from /proc, no netlink needed).
fn local_addresses() -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    // SAFETY: getifaddrs fills a list we free with freeifaddrs; we only read it in between.
    unsafe {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let sa = (*cur).ifa_addr;
            if !sa.is_null() {
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(sa as *const libc::sockaddr_in);
                        out.insert(IpAddr::from(
                            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                        ));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(sa as *const libc::sockaddr_in6);
                        out.insert(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}

/// The flow table and the affinity table (files in `[dataplane] state_dir`, on a tmpfs:
/// memory) must fit in the machine's memory and in what the state directory's filesystem
/// has free (a table adopted from the previous process counts as free: it is reused; so do
/// refused flow states, which make room for a new table). Their space is reserved when they
/// are made, so a table that does not fit is refused here or there, never a fault later.
fn check_flow_memory(cfg: &Config) -> Result<(), String> {
    let capacity = cfg.flowtable.capacity;
    let flows =
        flowtable::FlowTable::file_bytes(capacity as usize, cfg.flowtable.backends_max as usize)
            .unwrap_or(u64::MAX);
    let affinity = lb_algos::AffinityTable::file_bytes(crate::state::AFFINITY_CAPACITY);
    let need = flows.saturating_add(affinity);
    let sizes = format!(
        "the flow table {}, the ClientIP affinity table {}",
        shm::bytes(flows),
        shm::bytes(affinity)
    );
    if let Some(mem) = mem_total()
        && need > mem
    {
        return Err(format!(
            "flowtable.capacity {capacity} needs {} ({sizes}); this machine has {} of memory",
            shm::bytes(need),
            shm::bytes(mem)
        ));
    }
    let dir = &cfg.dataplane.state_dir;
    let existing = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let paths = crate::state::Paths::of(dir);
    let blocks = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(p).map_or(0, |m| if m.is_file() { m.blocks() * 512 } else { 0 })
    };
    let reused: u64 = [paths.flows.clone(), paths.affinity.clone()]
        .into_iter()
        .chain(
            shm::refused_in(dir)
                .into_iter()
                .filter(|p| p.to_string_lossy().contains("/flows.refused-")),
        )
        .map(|p| blocks(&p))
        .sum();
    if let Some(free) = shm::free_bytes(existing)
        && need > free + reused
    {
        return Err(format!(
            "flowtable.capacity {capacity} needs {} ({sizes}) in dataplane.state_dir {}, whose filesystem has {} free",
            shm::bytes(need),
            dir.display(),
            shm::bytes(free + reused)
        ));
    }
    Ok(())
}

/// `MemTotal` of /proc/meminfo, in bytes.
fn mem_total() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `statfs` magic of a bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Checks that `root` (or, while it does not exist yet, its nearest existing ancestor) is on a
/// bpffs, where pinned programs outlive the process.
fn check_bpffs(root: &Path) -> Result<(), String> {
    let existing = root
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("dataplane.bpf_pin_root {} has a NUL byte", root.display()))?;
    // SAFETY: statfs fills `st`, a valid out-parameter, for a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "dataplane.bpf_pin_root {}: {}",
            root.display(),
            std::io::Error::last_os_error()
        ));
    }
    if st.f_type as i64 != BPF_FS_MAGIC {
        return Err(format!(
            "dataplane.bpf_pin_root {} is not on a bpffs ({} is not one here; `ip netns exec` mounts a new /sys, hiding /sys/fs/bpf): mount one (mount -t bpf bpf /run/xvs-bpf) and set bpf_pin_root inside it",
            root.display(),
            existing.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use flowtable::{FlowTable, FlowTableConfig};

    use super::*;

    #[test]
    fn kernels_older_than_the_minimum_are_refused() {
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("5.10.0-28-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("4.19+1"), Some((4, 19)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_at_least("6.1.0-18-amd64", KERNEL_MIN).is_ok());
        assert!(kernel_at_least("5.10.0", KERNEL_MIN).is_ok());
        let e = kernel_at_least("5.4.0-150-generic", KERNEL_MIN).unwrap_err();
        assert!(
            e.starts_with("Linux 5.4.0-150-generic is older than 5.10"),
            "{e}"
        );
        assert!(kernel_at_least("x", KERNEL_MIN).is_err());
        // This machine runs xvs's tests, so it is new enough.
        assert_eq!(check_kernel(), Ok(()));
    }

    /// Every problem is listed, not the first: two missing interfaces and a taken port.
    #[test]
    fn every_problem_is_listed() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let text = format!(
            "[dataplane]\ninterfaces = [{{ name = \"xvsnope0\" }}, {{ name = \"xvsnope1\" }}]\ncores = [0]\nmode = \"nat\"\n[admin]\nlisten = \"{}\"\nhealthz_listen = \"127.0.0.1:0\"\n",
            taken.local_addr().unwrap()
        );
        let cfg = config::parse(&text, "t.toml").unwrap();
        let r = inspect(&cfg, true);
        let of = |check: &str| r.problems.iter().filter(|p| p.check == check).count();
        assert_eq!(of("interfaces"), 2, "{r:?}");
        assert_eq!(of("ports"), 1, "{r:?}");
        assert!(
            r.problems
                .iter()
                .any(|p| p.text.starts_with("[admin] listen 127.0.0.1:")),
            "{r:?}"
        );
        // Without interfaces, only a run needs them.
        let empty = Config::default();
        let need = |r: &Report| r.problems.iter().any(|p| p.check == "interfaces");
        assert!(need(&inspect(&empty, true)));
        assert!(!need(&inspect(&empty, false)));
    }

    /// `config::FLOW_BYTES`, which `xvs check` and this preflight use, is what a table costs.
    #[test]
    fn flow_bytes_is_what_a_table_costs() {
        let t = FlowTable::new(FlowTableConfig::new(1 << 16, 1024), Instant::now()).unwrap();
        let real = t.bytes_per_flow();
        let said = config::FLOW_BYTES as f64;
        assert!(
            (real - said).abs() / said < 0.1,
            "a flow costs {real:.1} bytes, config::FLOW_BYTES says {said}"
        );
    }

    #[test]
    fn a_flow_table_larger_than_memory_is_refused() {
        let mut cfg = config::parse("", "t.toml").unwrap();
        cfg.dataplane.state_dir = std::env::temp_dir().join("xvs-preflight-none");
        assert!(check_flow_memory(&cfg).is_ok());
        cfg.flowtable.capacity = config::FLOWS_MAX;
        let mem = mem_total().unwrap();
        if mem < u64::from(config::FLOWS_MAX) * config::FLOW_BYTES {
            let e = check_flow_memory(&cfg).unwrap_err();
            assert!(
                e.starts_with("flowtable.capacity 1073741824 needs 89.6 GiB (the flow table 89.6 GiB, the ClientIP affinity table 2.5 MiB)"),
                "{e}"
            );
        }
    }

    /// A state directory on a small filesystem: the refusal gives sizes in their unit (it
    /// said "needs 0.0 GiB ... has 0.0 GiB free").
    #[test]
    fn a_small_state_filesystem_is_refused_in_its_unit() {
        if std::env::var_os("XVS_TEST_TMPFS").is_none() {
            let dir = tempfile::tempdir().unwrap();
            let out = std::process::Command::new("unshare")
                .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                .arg(r#"mount -t tmpfs -o size=1m xvs-test "$1" && exec "$2" --exact "$3" --test-threads 1"#)
                .arg("sh")
                .arg(dir.path())
                .arg(std::env::current_exe().unwrap())
                .arg("preflight::tests::a_small_state_filesystem_is_refused_in_its_unit")
                .env("XVS_TEST_TMPFS", dir.path())
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains("1 passed"),
                "{text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        let d = std::path::PathBuf::from(std::env::var_os("XVS_TEST_TMPFS").unwrap());
        let mut cfg = config::parse("", "t.toml").unwrap();
        cfg.dataplane.state_dir = d.join("state");
        cfg.flowtable.capacity = 1 << 16;
        let e = check_flow_memory(&cfg).unwrap_err();
        let flows =
            flowtable::FlowTable::file_bytes(1 << 16, cfg.flowtable.backends_max as usize).unwrap();
        assert!(
            e.contains(&format!("the flow table {}", shm::bytes(flows))),
            "{e}"
        );
        assert!(e.ends_with(" MiB free"), "{e}");
        assert!(!e.contains("0.0 GiB"), "{e}");
    }

    /// The cpuset is what the kernel says this process may run on.
    #[test]
    fn cpuset_is_the_kernels_cpus_allowed_list() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kernel = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim();
        let ours = cpuset().unwrap();
        assert_eq!(config::cpu_list(&ours), kernel);
        // "auto" resolves within it.
        let plan = config::Cores::Auto.resolve(None, &ours).unwrap();
        assert!(plan.workers.iter().all(|c| ours.contains(c)), "{plan:?}");
    }
}
