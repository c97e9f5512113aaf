//! What every JSON result records about the run that made it (`meta`): when (UTC), on what
//! (kernel, CPU model, cores), from which source (git revision of the perf-lab checkout) and
//! how (the command line).

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The run's circumstances.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Start of the run, UTC, RFC 3339 (`2025-01-31T12:34:56Z`).
    pub timestamp_utc: String,
    /// `uname -r`.
    pub kernel: Option<String>,
    /// The first `model name` of /proc/cpuinfo.
    pub cpu_model: Option<String>,
    /// Online CPUs.
    pub cores: Option<usize>,
    /// `git describe --always --dirty --abbrev=12` of the checkout perf-lab was built from
    /// (null when that is not a git checkout).
    pub git_revision: Option<String>,
    /// The command line, each argument shell-quoted where needed.
    pub command_line: String,
}

impl Meta {
    /// The circumstances now, of this process.
    pub fn collect() -> Meta {
        let args: Vec<String> = std::env::args().collect();
        Meta {
            timestamp_utc: utc_rfc3339(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            ),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|s| s.trim().to_owned()),
            cpu_model: std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|s| cpu_model(&s)),
            cores: std::thread::available_parallelism().ok().map(Into::into),
            git_revision: git_revision(Path::new(env!("CARGO_MANIFEST_DIR"))),
            command_line: command_line(&args),
        }
    }
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian calendar).
pub fn utc_rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_owned())
    })
}

fn git_revision(dir: &Path) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// The arguments as one shell line (quoted where a shell would split or expand them).
pub fn command_line(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_timestamps() {
        assert_eq!(utc_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_rfc3339(1_735_689_599), "2024-12-31T23:59:59Z");
    }

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let args: Vec<String> = ["perf-lab", "run", "--json", "a b.json", "it's"]
            .map(str::to_owned)
            .to_vec();
        assert_eq!(
            command_line(&args),
            "perf-lab run --json 'a b.json' 'it'\\''s'"
        );
    }

    #[test]
    fn collected_here() {
        let m = Meta::collect();
        assert!(m.timestamp_utc.ends_with('Z'), "{m:?}");
        assert!(
            m.kernel.is_some() && m.cores.is_some_and(|c| c > 0),
            "{m:?}"
        );
        assert!(!m.command_line.is_empty());
        assert_eq!(
            cpu_model("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\n"),
            Some("Some CPU @ 2.0GHz".into())
        );
    }
}
