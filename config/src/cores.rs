//! `[dataplane] cores`: the cores the fastpath workers are pinned to, either listed
//! (`[2, 3]`) or `"auto"`: the cpuset the process was given (in a Guaranteed pod, the
//! exclusive CPUs the kubelet's static CPU manager handed it).
//!
//! Contract: parsing is pure and accepts only a list of core numbers or the string `"auto"`.
//! [`Cores::resolve`] is pure too: it takes the cpuset as an argument (the daemon reads it
//! with `sched_getaffinity` before pinning anything) and either returns the [`CorePlan`]
//! every core of which is in that cpuset, or a [`CoreError`] that names the key, the cores
//! and the cpuset. So a core the process may not run on is refused at start, loudly, instead
//! of leaving a worker unpinned.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

/// `[dataplane] cores`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cores {
    /// `"auto"`: the cpuset of the process at start (see [`Cores::resolve`]).
    Auto,
    /// The listed cores; worker i runs on `cores[i % len]`. Empty: workers are not pinned.
    List(Vec<usize>),
}

impl Default for Cores {
    fn default() -> Self {
        Cores::List(Vec::new())
    }
}

impl Cores {
    /// The listed cores (empty for `"auto"`, which only the cpuset resolves).
    pub fn listed(&self) -> &[usize] {
        match self {
            Cores::Auto => &[],
            Cores::List(v) => v,
        }
    }

    /// Whether workers have cores to run on: `"auto"` or a non-empty list.
    pub fn is_set(&self) -> bool {
        match self {
            Cores::Auto => true,
            Cores::List(v) => !v.is_empty(),
        }
    }

    /// The cores of the workers and of the slowpath, given `cpuset` (the cores the process
    /// may run on, any order) and `[dataplane] slowpath_core`.
    ///
    /// - A list: every listed core and `slowpath_core` must be in `cpuset`.
    /// - `"auto"`: the workers get the cpuset's cores in ascending order, less
    ///   `slowpath_core` when it is set (which must be in the cpuset). When it is not set and
    ///   the cpuset has two cores or more, its lowest core goes to the slowpath, so the
    ///   busy-polling workers never share a core with it; a one-core cpuset runs both on it.
    pub fn resolve(
        &self,
        slowpath_core: Option<usize>,
        cpuset: &[usize],
    ) -> Result<CorePlan, CoreError> {
        let mut set = cpuset.to_vec();
        set.sort_unstable();
        set.dedup();
        if set.is_empty() {
            return Err(CoreError::EmptyCpuset);
        }
        if let Some(core) = slowpath_core
            && set.binary_search(&core).is_err()
        {
            return Err(CoreError::SlowpathOutside {
                core,
                cpuset: cpu_list(&set),
            });
        }
        match self {
            Cores::List(cores) => {
                let outside: Vec<usize> = cores
                    .iter()
                    .copied()
                    .filter(|c| set.binary_search(c).is_err())
                    .collect();
                if !outside.is_empty() {
                    return Err(CoreError::WorkersOutside {
                        cores: outside,
                        cpuset: cpu_list(&set),
                    });
                }
                Ok(CorePlan {
                    workers: cores.clone(),
                    slowpath: slowpath_core,
                })
            }
            Cores::Auto => {
                let (workers, slowpath) = match slowpath_core {
                    Some(sc) => (set.iter().copied().filter(|c| *c != sc).collect(), Some(sc)),
                    None if set.len() >= 2 => (set[1..].to_vec(), Some(set[0])),
                    None => (set.clone(), None),
                };
                if workers.is_empty() {
                    return Err(CoreError::NoWorkerCore {
                        slowpath_core: slowpath_core.unwrap_or_default(),
                        cpuset: cpu_list(&set),
                    });
                }
                Ok(CorePlan { workers, slowpath })
            }
        }
    }
}

impl fmt::Display for Cores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cores::Auto => f.write_str("auto (the process's cpuset)"),
            Cores::List(v) => write!(f, "{v:?}"),
        }
    }
}

/// Where the workers and the slowpath run, all within the process's cpuset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorePlan {
    /// Worker i is pinned to `workers[i % len]` (empty: not pinned).
    pub workers: Vec<usize>,
    /// The slowpath's core (`None`: not pinned).
    pub slowpath: Option<usize>,
}

/// Why the configured cores cannot be used with the process's cpuset.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// The process may run on no core (an empty affinity mask was read).
    #[error("the cpuset this process may run on is empty")]
    EmptyCpuset,
    /// Listed worker cores the process may not run on.
    #[error(
        "dataplane.cores: {} not in the cpuset this process may run on ({cpuset}); list cores of that set, or use cores = \"auto\"",
        which_cores(cores)
    )]
    WorkersOutside {
        /// The listed cores outside the cpuset.
        cores: Vec<usize>,
        /// The cpuset, in the kernel's cpulist format (`2-3,6`).
        cpuset: String,
    },
    /// `slowpath_core` is outside the cpuset.
    #[error(
        "dataplane.slowpath_core: core {core} is not in the cpuset this process may run on ({cpuset})"
    )]
    SlowpathOutside {
        /// The configured slowpath core.
        core: usize,
        /// The cpuset, in the kernel's cpulist format.
        cpuset: String,
    },
    /// `cores = "auto"` with a cpuset that is only `slowpath_core`.
    #[error(
        "dataplane.cores = \"auto\": the cpuset this process may run on ({cpuset}) has no core for the workers besides slowpath_core {slowpath_core}"
    )]
    NoWorkerCore {
        /// The configured slowpath core.
        slowpath_core: usize,
        /// The cpuset, in the kernel's cpulist format.
        cpuset: String,
    },
}

/// "core 2 is" / "cores 2, 3 are".
fn which_cores(cores: &[usize]) -> String {
    let list: Vec<String> = cores.iter().map(usize::to_string).collect();
    match list.len() {
        1 => format!("core {} is", list[0]),
        _ => format!("cores {} are", list.join(", ")),
    }
}

/// `cores` in the kernel's cpulist format (`Cpus_allowed_list`): `0-3,6`.
pub fn cpu_list(cores: &[usize]) -> String {
    let mut v = cores.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(",")
}

impl<'de> Deserialize<'de> for Cores {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Cores;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"auto\" or a list of core numbers")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Cores, E> {
                if s == "auto" {
                    Ok(Cores::Auto)
                } else {
                    Err(E::custom(format!(
                        "invalid value {s:?}: expected \"auto\" or a list of core numbers"
                    )))
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Cores, A::Error> {
                let mut v = Vec::new();
                while let Some(c) = seq.next_element::<usize>()? {
                    v.push(c);
                }
                Ok(Cores::List(v))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_like_the_kernel() {
        assert_eq!(cpu_list(&[3, 0, 1, 2, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(cpu_list(&[]), "");
    }

    #[test]
    fn a_list_is_checked_against_the_cpuset() {
        let plan = Cores::List(vec![3, 2])
            .resolve(Some(1), &[1, 2, 3])
            .unwrap();
        assert_eq!(plan.workers, vec![3, 2], "the listed order is kept");
        assert_eq!(plan.slowpath, Some(1));
        let e = Cores::List(vec![2, 3, 7])
            .resolve(None, &[4, 5, 6, 7])
            .unwrap_err();
        assert_eq!(
            e,
            CoreError::WorkersOutside {
                cores: vec![2, 3],
                cpuset: "4-7".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "dataplane.cores: cores 2, 3 are not in the cpuset this process may run on (4-7); \
             list cores of that set, or use cores = \"auto\""
        );
        let e = Cores::List(vec![5]).resolve(Some(1), &[4, 5]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "dataplane.slowpath_core: core 1 is not in the cpuset this process may run on (4-5)"
        );
        // No cores listed (no interfaces): nothing to pin, nothing to refuse.
        let plan = Cores::default().resolve(None, &[0]).unwrap();
        assert!(plan.workers.is_empty() && plan.slowpath.is_none());
    }

    #[test]
    fn auto_takes_the_cpuset_and_keeps_one_core_for_the_slowpath() {
        // A Guaranteed pod given CPUs 6, 4, 5, 7 (any order): slowpath on 4, workers 5-7.
        let plan = Cores::Auto.resolve(None, &[6, 4, 5, 7]).unwrap();
        assert_eq!(plan.workers, vec![5, 6, 7]);
        assert_eq!(plan.slowpath, Some(4));
        // slowpath_core set: the rest of the set are workers.
        let plan = Cores::Auto.resolve(Some(6), &[4, 5, 6, 7]).unwrap();
        assert_eq!(plan.workers, vec![4, 5, 7]);
        assert_eq!(plan.slowpath, Some(6));
        // One core: workers and slowpath share it (the slowpath unpinned within the set).
        let plan = Cores::Auto.resolve(None, &[3]).unwrap();
        assert_eq!(plan.workers, vec![3]);
        assert_eq!(plan.slowpath, None);
        let e = Cores::Auto.resolve(Some(3), &[3]).unwrap_err();
        assert!(e.to_string().contains("no core for the workers"), "{e}");
        let e = Cores::Auto.resolve(Some(0), &[3, 4]).unwrap_err();
        assert!(
            matches!(e, CoreError::SlowpathOutside { core: 0, .. }),
            "{e}"
        );
        assert_eq!(
            Cores::Auto.resolve(None, &[]).unwrap_err(),
            CoreError::EmptyCpuset
        );
    }
}
