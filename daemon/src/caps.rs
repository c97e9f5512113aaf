//! The Linux capabilities `xvs run` needs, by name and reason, and a check of the process's
//! effective set. Each was found necessary on Linux 6.18 by running the lab without it:
//! without `CAP_BPF` or `CAP_NET_ADMIN` the socket map cannot be created, without
//! `CAP_PERFMON` the verifier refuses the program (EPERM), without `CAP_NET_RAW` the UMEM
//! cannot be created (EPERM), without `CAP_IPC_LOCK` it exceeds `RLIMIT_MEMLOCK` (ENOBUFS). Privilege is what the kernel checks, not uid 0: a process with exactly these
//! capabilities runs (a DaemonSet that drops ALL and adds them, `setpriv`, systemd's
//! `AmbientCapabilities=`), and uid 0 without them does not.

use std::fmt;

use config::Config;

/// A capability: its number (`linux/capability.h`) and name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// The bit in the capability sets.
    pub bit: u32,
    /// `CAP_...`.
    pub name: &'static str,
}

/// Override file permission checks (the NAPI sysfs settings are root's files).
pub const CAP_DAC_OVERRIDE: Cap = Cap {
    bit: 1,
    name: "CAP_DAC_OVERRIDE",
};
/// Network administration.
pub const CAP_NET_ADMIN: Cap = Cap {
    bit: 12,
    name: "CAP_NET_ADMIN",
};
/// Raw and packet sockets.
pub const CAP_NET_RAW: Cap = Cap {
    bit: 13,
    name: "CAP_NET_RAW",
};
/// Locking memory beyond `RLIMIT_MEMLOCK`.
pub const CAP_IPC_LOCK: Cap = Cap {
    bit: 14,
    name: "CAP_IPC_LOCK",
};
/// Performance monitoring; with `CAP_BPF`, the verifier's full (non-restricted) mode.
pub const CAP_PERFMON: Cap = Cap {
    bit: 38,
    name: "CAP_PERFMON",
};
/// BPF programs and maps.
pub const CAP_BPF: Cap = Cap {
    bit: 39,
    name: "CAP_BPF",
};

/// A capability and why `xvs run` needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    /// The capability.
    pub cap: Cap,
    /// What it is for, as a phrase.
    pub why: &'static str,
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.cap.name, self.why)
    }
}

/// What `xvs run` with `cfg` needs.
pub fn required(cfg: &Config) -> Vec<Need> {
    let mut v = vec![
        Need {
            cap: CAP_BPF,
            why: "load the XDP steering program and create its maps",
        },
        Need {
            cap: CAP_PERFMON,
            why: "let the BPF verifier accept the steering program (without it the kernel refuses the load with EPERM)",
        },
        Need {
            cap: CAP_NET_ADMIN,
            why: "attach XDP to the interfaces, bind AF_XDP sockets to their queues, and write the BPF maps of sockets",
        },
        Need {
            cap: CAP_NET_RAW,
            why: "open AF_XDP sockets",
        },
        Need {
            cap: CAP_IPC_LOCK,
            why: "register and pin the UMEM frames of the AF_XDP sockets beyond RLIMIT_MEMLOCK",
        },
    ];
    if cfg.dataplane.napi_busy_poll {
        v.push(Need {
            cap: CAP_DAC_OVERRIDE,
            why: "write the interfaces' napi_defer_hard_irqs and gro_flush_timeout (dataplane.napi_busy_poll)",
        });
    }
    v
}

/// The process's effective capability set, from `/proc/self/status` (`CapEff`).
pub fn effective() -> std::io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    parse_cap_eff(&status).ok_or_else(|| std::io::Error::other("/proc/self/status has no CapEff"))
}

/// The `CapEff` mask of a `/proc/<pid>/status` text.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The needs `effective` does not cover, in `needs`' order.
pub fn missing(effective: u64, needs: &[Need]) -> Vec<Need> {
    needs
        .iter()
        .filter(|n| effective & (1u64 << n.cap.bit) == 0)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_effective_set() {
        let status = "Name:\txvs\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000000c000007000\nCapBnd:\t000001ffffffffff\n";
        let eff = parse_cap_eff(status).unwrap();
        assert_eq!(
            eff,
            (1 << 39) | (1 << 38) | (1 << 12) | (1 << 13) | (1 << 14)
        );
        assert_eq!(parse_cap_eff("Name:\txvs\n"), None);
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
    }

    #[test]
    fn names_exactly_what_is_missing() {
        let cfg = Config::default();
        let needs = required(&cfg);
        let names = |v: &[Need]| v.iter().map(|n| n.cap.name).collect::<Vec<_>>();
        assert_eq!(
            names(&needs),
            [
                "CAP_BPF",
                "CAP_PERFMON",
                "CAP_NET_ADMIN",
                "CAP_NET_RAW",
                "CAP_IPC_LOCK"
            ]
        );
        let all = needs.iter().fold(0u64, |m, n| m | 1 << n.cap.bit);
        assert!(missing(all, &needs).is_empty());
        assert!(missing(u64::MAX, &needs).is_empty());
        let without_raw = all & !(1 << CAP_NET_RAW.bit);
        assert_eq!(names(&missing(without_raw, &needs)), ["CAP_NET_RAW"]);
        assert_eq!(missing(0, &needs).len(), 5);
        // Busy polling writes root's sysfs files.
        let mut busy = Config::default();
        busy.dataplane.napi_busy_poll = true;
        assert_eq!(names(&missing(all, &required(&busy))), ["CAP_DAC_OVERRIDE"]);
    }

    #[test]
    fn this_process_has_a_readable_set() {
        // Whatever the test runs as, the set is readable and a subset of all 64 bits.
        assert!(effective().is_ok());
    }
}
