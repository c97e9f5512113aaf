//! Process plumbing: commands, network namespaces, clocks, CPU accounting.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;

use anyhow::{Context, bail};

/// Runs `argv`, failing with its stderr when it exits non-zero.
pub fn run(argv: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .with_context(|| format!("running {}", argv.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a shell line (`sh -c`), failing when it exits non-zero.
pub fn sh(line: &str) -> anyhow::Result<String> {
    run(&["sh", "-c", line])
}

/// Runs a shell line inside namespace `ns` (`ip netns exec`, which also mounts that
/// namespace's /sys).
pub fn sh_in(ns: &str, line: &str) -> anyhow::Result<String> {
    run(&["ip", "netns", "exec", ns, "sh", "-c", line])
}

/// Moves the calling thread into network namespace `ns` (other threads stay where they are).
pub fn enter_netns(ns: &str) -> anyhow::Result<()> {
    let file =
        File::open(format!("/run/netns/{ns}")).with_context(|| format!("opening netns {ns}"))?;
    // SAFETY: setns on a valid namespace fd; CLONE_NEWNET affects only the calling thread.
    let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        bail!("setns({ns}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pins the calling thread to `core` (best effort: a missing core is reported, not fatal).
pub fn pin(core: usize) {
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        eprintln!("perf-lab: cannot pin a thread to core {core}");
    }
}

/// CLOCK_MONOTONIC in ns: the clock of the send timestamps (generator and sinks share it).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1_000_000_000 / hz.max(1) as u64
}

/// CPU time of process `pid` (utime + stime of all its threads), ns, from /proc/PID/stat.
pub fn proc_cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at state (field 3).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) * tick_ns())
}

/// Time CPU `core` spent in (irq, softirq) and its busy (non-idle) time, ns, from /proc/stat.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreTimes {
    /// irq + softirq.
    pub irq_ns: u64,
    /// Everything but idle and iowait (tick samples: see [`crate::cpu`]).
    pub busy_ns: u64,
    /// Idle + iowait (accounted exactly by the kernel).
    pub idle_ns: u64,
    /// All columns.
    pub total_ns: u64,
}

/// [`CoreTimes`] of `core` now.
pub fn core_times(core: usize) -> CoreTimes {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let name = format!("cpu{core}");
    let t = tick_ns();
    for line in stat.lines() {
        let mut it = line.split_whitespace();
        if it.next() != Some(name.as_str()) {
            continue;
        }
        // user nice system idle iowait irq softirq steal guest guest_nice
        let v: Vec<u64> = it.map(|x| x.parse().unwrap_or(0)).collect();
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        let total: u64 = v.iter().take(8).sum();
        return CoreTimes {
            irq_ns: (get(5) + get(6)) * t,
            busy_ns: (total - get(3) - get(4)) * t,
            idle_ns: (get(3) + get(4)) * t,
            total_ns: total * t,
        };
    }
    CoreTimes::default()
}

/// Runs `ip -n NS -batch -` with `lines` (one `ip` command per line, without the `ip`).
pub fn ip_batch(ns: &str, lines: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new("ip")
        .args(["-n", ns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running ip -batch")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(lines.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "ip -n {ns} -batch failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Switches `ifname` in namespace `ns` to threaded NAPI and pins its NAPI threads to `core`,
/// so that interface's receive work runs on `core` whichever CPU sent to it (a veth's NAPI
/// otherwise runs on the sender's CPU). Returns how many threads were pinned.
pub fn thread_napi(ns: &str, ifname: &str, core: usize) -> anyhow::Result<usize> {
    let before = napi_threads(ifname);
    sh_in(ns, &format!("echo 1 > /sys/class/net/{ifname}/threaded"))
        .with_context(|| format!("threaded NAPI on {ifname}"))?;
    let ours: Vec<i32> = napi_threads(ifname)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    if ours.is_empty() {
        bail!("no NAPI thread appeared for {ifname} (does it have NAPI, i.e. an XDP program?)");
    }
    for &pid in &ours {
        // SAFETY: a zeroed cpu_set_t is valid; CPU_SET and sched_setaffinity only read it.
        let r = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(core, &mut set);
            libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if r != 0 {
            bail!(
                "pinning NAPI thread {pid} of {ifname} to core {core}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(ours.len())
}

/// Pids of the kernel threads named `napi/IFNAME-*` (names are per namespace, so a parallel
/// rig's threads show up too: callers diff before and after).
fn napi_threads(ifname: &str) -> Vec<i32> {
    let prefix = format!("napi/{ifname}-");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        comm.trim_end().starts_with(&prefix).then_some(pid)
    })
    .collect()
}

/// `GET path` from `addr` inside namespace `ns` (HTTP/1.0, the body), with a 2 s timeout.
pub fn http_get_in(ns: &str, addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let ns = ns.to_owned();
    let path = path.to_owned();
    std::thread::scope(|s| {
        s.spawn(move || {
            enter_netns(&ns)?;
            let t = std::time::Duration::from_secs(2);
            let mut c = std::net::TcpStream::connect_timeout(&addr, t)
                .with_context(|| format!("connecting to {addr} in {ns}"))?;
            c.set_read_timeout(Some(t))?;
            write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
            let mut out = String::new();
            c.read_to_string(&mut out)?;
            match out.split_once("\r\n\r\n") {
                Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200") => {
                    Ok(body.to_owned())
                }
                _ => bail!(
                    "GET {path} from {addr}: {}",
                    out.lines().next().unwrap_or("")
                ),
            }
        })
        .join()
        .map_err(|_| anyhow::anyhow!("http thread panicked"))?
    })
}

/// The sum of every sample of metric `name` in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
        *found.get_or_insert(0.0) += v;
    }
    found
}

/// libbpf's and libxdp's messages below warning level (libbpf: "elf: skipping unrecognized
/// data section(7) xdp_metadata", libxdp: "Falling back to loading single prog without
/// dispatcher": informational, but printed on stderr by default, where they read as
/// failures) are dropped; warnings are still printed as the libraries print them.
pub fn quiet_libbpf() {
    // Both libraries: level 0 is WARN, 1 INFO, 2 DEBUG. The va_list reaches the callback as a
    // pointer (x86_64: the array decays; aarch64: a struct that large is passed by
    // reference), and goes on to vdprintf the same way.
    unsafe extern "C" fn warnings_only(
        level: libc::c_int,
        fmt: *const libc::c_char,
        ap: *mut libc::c_void,
    ) -> libc::c_int {
        if level != 0 {
            return 0;
        }
        // SAFETY: the format and arguments the library passed, forwarded unchanged.
        unsafe { vdprintf(2, fmt, ap) }
    }
    type PrintFn = Option<
        unsafe extern "C" fn(libc::c_int, *const libc::c_char, *mut libc::c_void) -> libc::c_int,
    >;
    unsafe extern "C" {
        fn vdprintf(
            fd: libc::c_int,
            fmt: *const libc::c_char,
            ap: *mut libc::c_void,
        ) -> libc::c_int;
        fn libbpf_set_print(f: PrintFn) -> PrintFn;
        fn libxdp_set_print(f: PrintFn) -> PrintFn;
    }
    // SAFETY: both only store the function pointer (a static function of this program).
    unsafe {
        libbpf_set_print(Some(warnings_only));
        libxdp_set_print(Some(warnings_only));
    }
}

#[cfg(test)]
mod tests {
    use super::metric_sum;

    #[test]
    fn metric_sum_adds_every_labelled_sample_of_one_name() {
        let text = "# HELP xvs_worker_busy_seconds_total x\n\
                    xvs_worker_busy_seconds_total{worker=\"0\"} 1.5\n\
                    xvs_worker_busy_seconds_total{worker=\"1\"} 0.25\n\
                    xvs_worker_busy_seconds_totalx 9\n\
                    xvs_rx_packets_total{worker=\"0\"} 7\n";
        assert_eq!(
            metric_sum(text, "xvs_worker_busy_seconds_total"),
            Some(1.75)
        );
        assert_eq!(metric_sum(text, "xvs_rx_packets_total"), Some(7.0));
        assert_eq!(metric_sum(text, "xvs_missing"), None);
    }
}
