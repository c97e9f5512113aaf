//! [`SnapshotBuilder::build_isolated`]: a build in which one spec that cannot be built is
//! left out (or kept at its previous version) instead of failing the whole list.
//!
//! Contract:
//! - The snapshot has every spec the builder can build. A spec it refuses (its scheduler
//!   refuses its weights, no backend id is left for it, its name or a frontend is taken
//!   twice) is replaced by its previous version, the last one this builder built under
//!   that name, when there is one and that one still fits; otherwise it is left out. Each
//!   refusal is returned as a [`Refused`] with the builder's reason.
//! - A previous version keeps only the frontends no other spec of the list has: a spec the
//!   source describes as it is never loses a frontend to the old version of a refused one
//!   (a frontend that moved from the refused service to another goes to the other).
//! - Of two specs with one name, or two claiming one frontend, the later in the list is
//!   refused: the one the list already had keeps what it has.
//! - Without refusals it costs what [`SnapshotBuilder::build`] costs. Each round of
//!   refusals costs one more build attempt (every spec the builder found wrong in a stage is
//!   settled in the same round), at most two per spec, so the loop ends.

use std::collections::HashSet;

use super::{BuildError, Frontend, L2Table, ServiceSpec, Snapshot, SnapshotBuilder};

/// A spec [`SnapshotBuilder::build_isolated`] did not build, and why.
#[derive(Debug)]
pub struct Refused {
    /// The spec's name.
    pub name: String,
    /// Why the builder refused it.
    pub error: BuildError,
    /// The snapshot carries the spec's previous version (the last one built); else it has
    /// no spec of that name.
    pub kept_previous: bool,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outcome = if self.kept_previous {
            "its previous version stays"
        } else {
            "not programmed"
        };
        write!(f, "{}; {outcome}", self.error)
    }
}

impl SnapshotBuilder {
    /// Builds the next snapshot from `services` and `l2` as [`build`](Self::build) does,
    /// leaving out (or keeping at their previous version) the specs it cannot build; see the
    /// module doc. Never fails.
    pub fn build_isolated(
        &mut self,
        services: &[ServiceSpec],
        l2: &L2Table,
    ) -> (Snapshot, Vec<Refused>) {
        let mut refused = Vec::new();
        // Copied at the first refusal only.
        let mut list: Option<Vec<ServiceSpec>> = None;
        let mut substituted: HashSet<String> = HashSet::new();
        loop {
            let specs = list.as_deref().unwrap_or(services);
            let mut errors = match self.try_build(specs, l2) {
                Ok(snap) => return (snap, refused),
                Err(e) => e,
            };
            let v = list.get_or_insert_with(|| services.to_vec());
            // From the back, so that removing one keeps the positions of the others.
            errors.sort_by_key(|e| std::cmp::Reverse(e.0));
            errors.dedup_by_key(|e| e.0);
            for (p, error) in errors {
                let name = v[p].name.clone();
                let previous = match error {
                    // The other spec of that name is the one the snapshot has.
                    BuildError::DuplicateName { .. } => None,
                    _ if substituted.contains(&name) => None,
                    _ => self.previous(&name).filter(|old| **old != v[p]).cloned(),
                };
                let previous = previous.map(|mut old| {
                    let others: HashSet<Frontend> = v
                        .iter()
                        .enumerate()
                        .filter(|(q, _)| *q != p)
                        .flat_map(|(_, s)| s.frontends.iter().copied())
                        .collect();
                    old.frontends.retain(|f| !others.contains(f));
                    old
                });
                let previous = previous.filter(|old| !old.frontends.is_empty());
                let kept_previous = previous.is_some();
                match previous {
                    Some(old) => {
                        v[p] = old;
                        substituted.insert(name.clone());
                    }
                    None => {
                        v.remove(p);
                    }
                }
                refused.push(Refused {
                    name,
                    error,
                    kept_previous,
                });
            }
        }
    }
}
