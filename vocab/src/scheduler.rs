//! Scheduler kinds, by their IPVS names.

use std::fmt;
use std::str::FromStr;

/// Which scheduler a service uses; the names are IPVS's (`ipvsadm -s NAME`), and the config
/// file's (`scheduler = "wrr"`, `[kubernetes] default_scheduler`) and the `xvs.io/scheduler`
/// annotation's. Every kind is implemented in `lb-algos` (one file each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum SchedulerKind {
    /// Round robin (the default, like kube-proxy's IPVS mode).
    #[default]
    Rr,
    /// Weighted round robin (IPVS's interleaved gcd sequence).
    Wrr,
    /// Least connections.
    Lc,
    /// Weighted least connections (the IPVS default).
    Wlc,
    /// Shortest expected delay.
    Sed,
    /// Never queue.
    Nq,
    /// Maglev consistent hashing.
    Mh,
    /// Source hashing.
    Sh,
    /// Destination hashing.
    Dh,
    /// Locality-based least connections.
    Lblc,
    /// Locality-based least connections with replication.
    Lblcr,
}

impl SchedulerKind {
    /// Every scheduler, in the order IPVS documents them (the order of the names below).
    pub const ALL: &'static [SchedulerKind] = &[
        SchedulerKind::Rr,
        SchedulerKind::Wrr,
        SchedulerKind::Lc,
        SchedulerKind::Wlc,
        SchedulerKind::Sed,
        SchedulerKind::Nq,
        SchedulerKind::Mh,
        SchedulerKind::Sh,
        SchedulerKind::Dh,
        SchedulerKind::Lblc,
        SchedulerKind::Lblcr,
    ];

    /// The IPVS name (`"rr"`, `"wrr"`, ...), as the config file spells it.
    pub const fn name(self) -> &'static str {
        match self {
            SchedulerKind::Rr => "rr",
            SchedulerKind::Wrr => "wrr",
            SchedulerKind::Lc => "lc",
            SchedulerKind::Wlc => "wlc",
            SchedulerKind::Sed => "sed",
            SchedulerKind::Nq => "nq",
            SchedulerKind::Mh => "mh",
            SchedulerKind::Sh => "sh",
            SchedulerKind::Dh => "dh",
            SchedulerKind::Lblc => "lblc",
            SchedulerKind::Lblcr => "lblcr",
        }
    }
}

impl fmt::Display for SchedulerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `SchedulerKind::from_str` was given a name that is not a scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownScheduler {
    /// The name that was given.
    pub name: String,
}

impl fmt::Display for UnknownScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown scheduler {:?}; valid: rr, wrr, lc, wlc, sed, nq, mh, sh, dh, lblc, lblcr",
            self.name
        )
    }
}

impl std::error::Error for UnknownScheduler {}

impl FromStr for SchedulerKind {
    type Err = UnknownScheduler;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SchedulerKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownScheduler { name: s.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_rr() {
        assert_eq!(SchedulerKind::default(), SchedulerKind::Rr);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn the_config_names_are_the_ipvs_names() {
        use serde::Deserialize;
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};
        let de = |s: &str| {
            let d: StrDeserializer<'_, Error> = s.into_deserializer();
            SchedulerKind::deserialize(d).map_err(|e| e.to_string())
        };
        for &k in SchedulerKind::ALL {
            assert_eq!(de(k.name()), Ok(k));
        }
        assert_eq!(
            de("fifo").unwrap_err(),
            "unknown variant `fifo`, expected one of `rr`, `wrr`, `lc`, `wlc`, `sed`, `nq`, \
             `mh`, `sh`, `dh`, `lblc`, `lblcr`"
        );
    }
}
