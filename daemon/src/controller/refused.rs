//! What the daemon does not program as its source describes it, and why: the Kubernetes
//! source's problems (objects or parts of objects it skipped; the source logs them) and the
//! specs the snapshot builder refused at the last publish (logged here, one line each).
//!
//! Both are listed in `/v1/services` (`refused`), gauged by kind (`xvs_refused`) and counted
//! once per change that brings them (`xvs_refused_total`): a refusal that stays is neither
//! counted nor logged again at the next sync or publish; one that goes and comes back is.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use fastpath::snapshot::Refused;
use slowpath::k8s::{Problem, ProblemKind};

/// The kind of the snapshot builder's refusals.
pub const KIND_SNAPSHOT_BUILD: &str = "snapshot_build";

/// One refusal in effect.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Refusal {
    /// `Service ns/name`, `EndpointSlice ns/name`, or `service NAME` (a snapshot service).
    pub object: String,
    /// Its kind: a [`ProblemKind`] label, or [`KIND_SNAPSHOT_BUILD`].
    pub kind: &'static str,
    /// What was wrong and what was done instead.
    pub reason: String,
}

/// Every kind of refusal, for metrics that list each kind (zero included).
pub fn kinds() -> impl Iterator<Item = &'static str> {
    ProblemKind::ALL
        .into_iter()
        .map(ProblemKind::label)
        .chain([KIND_SNAPSHOT_BUILD])
}

/// The refusals in effect and the count of those reported.
#[derive(Debug, Default)]
pub struct Refusals {
    source: Vec<Refusal>,
    built: Vec<Refusal>,
    /// `source` then `built`, shared with every status emitted.
    list: Arc<Vec<Refusal>>,
    total: BTreeMap<&'static str, u64>,
}

impl Refusals {
    /// The source's problems, as its last model has them.
    pub fn set_source(&mut self, problems: &[Problem]) {
        let new: Vec<Refusal> = problems
            .iter()
            .map(|p| Refusal {
                object: p.object.clone(),
                kind: p.kind.label(),
                reason: p.reason.clone(),
            })
            .collect();
        if new != self.source {
            self.count_new(&self.source.clone(), &new, false);
            self.source = new;
            self.rebuild();
        }
    }

    /// The snapshot builder's refusals at the last publish.
    pub fn set_built(&mut self, refused: &[Refused]) {
        let new: Vec<Refusal> = refused
            .iter()
            .map(|r| Refusal {
                object: format!("service {}", r.name),
                kind: KIND_SNAPSHOT_BUILD,
                reason: r.to_string(),
            })
            .collect();
        if new != self.built {
            self.count_new(&self.built.clone(), &new, true);
            self.built = new;
            self.rebuild();
        }
    }

    /// Counts (and, when `log`, logs) the refusals of `new` that `old` did not have.
    fn count_new(&mut self, old: &[Refusal], new: &[Refusal], log: bool) {
        let old: HashSet<&Refusal> = old.iter().collect();
        for r in new.iter().filter(|r| !old.contains(r)) {
            *self.total.entry(r.kind).or_default() += 1;
            if log {
                tracing::error!(
                    object = r.object.as_str(),
                    kind = r.kind,
                    reason = r.reason.as_str(),
                    "the snapshot builder refused a service"
                );
            }
        }
    }

    fn rebuild(&mut self) {
        let mut v = Vec::with_capacity(self.source.len() + self.built.len());
        v.extend(self.source.iter().cloned());
        v.extend(self.built.iter().cloned());
        self.list = Arc::new(v);
    }

    /// Every refusal in effect: the source's, then the builder's.
    pub fn list(&self) -> Arc<Vec<Refusal>> {
        Arc::clone(&self.list)
    }

    /// Refusals reported since the start, by kind.
    pub fn total(&self) -> BTreeMap<&'static str, u64> {
        self.total.clone()
    }
}
