//! `process_*` metrics as the Prometheus client libraries' process collector defines them
//! (client_golang's `NewProcessCollector`, from `/proc/self`), and `xvs_build_info`.
//!
//! Reading is separate from rendering: [`ProcessStats::read`] does the I/O (a few small
//! files of `/proc/self`, on the admin server's blocking pool, once per scrape), the parsers
//! take the files' text, so the tests feed them fixtures. A file that cannot be read or
//! parsed leaves its metrics out of the scrape rather than showing a made-up 0.

use std::path::Path;

use super::metrics::Out;

/// The process's resources, as the process collector reports them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU time, seconds (`process_cpu_seconds_total`).
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes (`process_resident_memory_bytes`).
    pub resident_bytes: Option<u64>,
    /// Virtual memory size, bytes (`process_virtual_memory_bytes`).
    pub virtual_bytes: Option<u64>,
    /// Start time, seconds since the Unix epoch (`process_start_time_seconds`).
    pub start_time_seconds: Option<f64>,
    /// Open file descriptors (`process_open_fds`).
    pub open_fds: Option<u64>,
    /// The soft limit on open file descriptors (`process_max_fds`).
    pub max_fds: Option<u64>,
}

/// Fields of `/proc/<pid>/stat` the collector uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// User time, clock ticks.
    pub utime: u64,
    /// System time, clock ticks.
    pub stime: u64,
    /// Start time after boot, clock ticks.
    pub starttime: u64,
    /// Virtual memory size, bytes.
    pub vsize: u64,
    /// Resident set size, pages.
    pub rss: u64,
}

impl Stat {
    /// Parses the text of `/proc/<pid>/stat`. The command name (field 2) is in parentheses
    /// and may hold spaces and parentheses itself: fields are counted after the last `)`.
    pub fn parse(text: &str) -> Option<Stat> {
        let rest = &text[text.rfind(')')? + 1..];
        // After the name: state is field 3, so field N is at index N - 3.
        let f: Vec<&str> = rest.split_whitespace().collect();
        let n = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
        Some(Stat {
            utime: n(14)?,
            stime: n(15)?,
            starttime: n(22)?,
            vsize: n(23)?,
            // Signed in the kernel's format: a negative one fails to parse (not a size).
            rss: n(24)?,
        })
    }
}

/// The boot time (`btime`, Unix seconds) from the text of `/proc/stat`.
pub fn parse_btime(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft "Max open files" limit from the text of `/proc/<pid>/limits` (`None` when
/// unlimited or missing).
pub fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl ProcessStats {
    /// The stats of `stat`, `/proc/stat`'s boot time, the open descriptor count and the
    /// limits file, with the system's clock tick rate and page size.
    pub fn from_parts(
        stat: Option<Stat>,
        btime: Option<u64>,
        open_fds: Option<u64>,
        max_fds: Option<u64>,
        ticks_per_s: u64,
        page_bytes: u64,
    ) -> ProcessStats {
        let ticks = ticks_per_s.max(1) as f64;
        ProcessStats {
            cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / ticks),
            resident_bytes: stat.map(|s| s.rss.saturating_mul(page_bytes)),
            virtual_bytes: stat.map(|s| s.vsize),
            start_time_seconds: stat
                .zip(btime)
                .map(|(s, b)| b as f64 + s.starttime as f64 / ticks),
            open_fds,
            max_fds,
        }
    }

    /// This process's stats, from `/proc/self`.
    pub fn read() -> ProcessStats {
        let text = |p: &str| std::fs::read_to_string(p).ok();
        let stat = text("/proc/self/stat").as_deref().and_then(Stat::parse);
        let btime = text("/proc/stat").as_deref().and_then(parse_btime);
        let max_fds = text("/proc/self/limits").as_deref().and_then(parse_max_fds);
        let open_fds = count_fds(Path::new("/proc/self/fd"));
        // SAFETY: sysconf only reads configuration values.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        ProcessStats::from_parts(
            stat,
            btime,
            open_fds,
            max_fds,
            u64::try_from(ticks).unwrap_or(100),
            u64::try_from(page).unwrap_or(4096),
        )
    }
}

/// Entries of a descriptor directory, less the one the listing itself holds open.
fn count_fds(dir: &Path) -> Option<u64> {
    let n = std::fs::read_dir(dir).ok()?.count() as u64;
    Some(n.saturating_sub(1))
}

/// What this binary is: `xvs_build_info`'s labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    /// The crate version (`Cargo.toml`'s workspace version).
    pub version: &'static str,
    /// The git commit it was built from (`unknown` outside a checkout; `XVS_REVISION` at
    /// build time overrides it, for image builds without `.git`).
    pub revision: &'static str,
    /// `rustc --version` of the compiler that built it.
    pub rustc: &'static str,
}

/// This binary's [`BuildInfo`].
pub const BUILD_INFO: BuildInfo = BuildInfo {
    version: env!("CARGO_PKG_VERSION"),
    revision: env!("XVS_REVISION"),
    rustc: env!("XVS_RUSTC"),
};

/// Appends `xvs_build_info` and the `process_*` families to `out`.
pub fn render(out: &mut String, build: &BuildInfo, p: &ProcessStats) {
    let mut o = Out(std::mem::take(out));
    o.family(
        "xvs_build_info",
        "gauge",
        "A metric with a constant 1 labelled by the version, git revision and compiler of the xvs binary.",
    );
    o.sample(
        "xvs_build_info",
        &[
            ("version", build.version),
            ("revision", build.revision),
            ("rustc", build.rustc),
        ],
        1u8,
    );
    let families: [(&str, &str, &str, Option<f64>); 6] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            p.cpu_seconds,
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            p.open_fds.map(|v| v as f64),
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            p.max_fds.map(|v| v as f64),
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            p.virtual_bytes.map(|v| v as f64),
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            p.resident_bytes.map(|v| v as f64),
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            p.start_time_seconds,
        ),
    ];
    for (name, kind, help, v) in families {
        if let Some(v) = v {
            o.single(name, kind, help, v);
        }
    }
    *out = o.0;
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line of `cat /proc/self/stat`, with a name holding a space and a parenthesis.
    const STAT: &str = "17097 (xvs (test) x) R 17093 17093 10494 0 -1 4194304 101 0 0 0 250 \
        50 0 0 20 0 1 0 3200274 3133440 394 18446744073709551615 94569345757184 \
        94569345777065 140732500703840 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";

    #[test]
    fn stat_fields_after_the_name() {
        let s = Stat::parse(STAT).expect("parses");
        assert_eq!(
            s,
            Stat {
                utime: 250,
                stime: 50,
                starttime: 3_200_274,
                vsize: 3_133_440,
                rss: 394,
            }
        );
        assert_eq!(Stat::parse("1 (x) R 1 2"), None);
        assert_eq!(Stat::parse("garbage"), None);
    }

    #[test]
    fn boot_time_and_fd_limit() {
        assert_eq!(
            parse_btime("cpu  1 2 3\nbtime 1795470298\nprocesses 9\n"),
            Some(1_795_470_298)
        );
        assert_eq!(parse_btime("cpu 1\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_fds(unlimited), None);
    }

    #[test]
    fn stats_in_the_collectors_units() {
        let p = ProcessStats::from_parts(
            Stat::parse(STAT),
            Some(1_795_470_298),
            Some(12),
            Some(1024),
            100,
            4096,
        );
        assert_eq!(p.cpu_seconds, Some(3.0));
        assert_eq!(p.resident_bytes, Some(394 * 4096));
        assert_eq!(p.virtual_bytes, Some(3_133_440));
        assert_eq!(p.start_time_seconds, Some(1_795_470_298.0 + 32_002.74));
        let mut out = String::new();
        render(&mut out, &BUILD_INFO, &p);
        assert!(out.contains("process_cpu_seconds_total 3\n"), "{out}");
        assert!(out.contains("process_open_fds 12\n"));
        assert!(out.contains("process_max_fds 1024\n"));
        assert!(out.contains("# TYPE xvs_build_info gauge\n"));
        // Missing sources leave their families out.
        let mut out = String::new();
        render(&mut out, &BUILD_INFO, &ProcessStats::default());
        assert!(!out.contains("process_"), "{out}");
    }

    #[test]
    fn this_process_is_readable() {
        let p = ProcessStats::read();
        assert!(p.resident_bytes.is_some_and(|b| b > 0), "{p:?}");
        assert!(p.virtual_bytes >= p.resident_bytes);
        assert!(p.open_fds.is_some_and(|n| n >= 3), "{p:?}");
        assert!(p.start_time_seconds.is_some_and(|t| t > 1.0e9), "{p:?}");
        assert!(p.cpu_seconds.is_some());
    }

    #[test]
    fn build_info_names_the_version() {
        assert_eq!(BUILD_INFO.version, env!("CARGO_PKG_VERSION"));
        assert!(!BUILD_INFO.revision.is_empty());
        assert!(
            BUILD_INFO.rustc.starts_with("rustc "),
            "{}",
            BUILD_INFO.rustc
        );
    }
}
