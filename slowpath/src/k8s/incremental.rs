//! Incremental translation: [`IncrementalModel`] holds the Services and EndpointSlices and the
//! translation of each Service, and keeps the [`K8sModel`] up to date object by object, so a
//! changed EndpointSlice costs one Service's translation (plus a splice into the sorted spec
//! list), not a translation of the whole cluster.
//!
//! The merge step shared with [`build_model`](super::build_model) lives here too ([`Merge`]):
//! each Service is translated on its own ([`translate_service`]), then frontends claimed by
//! several Services are settled (the older Service wins) and the specs are kept sorted by
//! name. A full translation is "every Service set, then one commit", so the incremental model
//! and the pure function cannot drift apart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use config::Config;
use fastpath::snapshot::{Frontend, ServiceSpec};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::translate::{
    NodeInfo, OrderKey, Translated, fmt_ip_port, order_key, service_key, slice_service,
    translate_service,
};
use super::{ANN_LAST_CHANGE_TRIGGER_TIME, K8sModel, Problem};

/// (namespace, name) of a Service or of an EndpointSlice.
type Key = (String, String);

fn key_of(ns: &str, name: &str) -> Key {
    (ns.to_owned(), name.to_owned())
}

/// The Kubernetes model, maintained incrementally.
///
/// Feed it objects as the watchers see them ([`apply_service`](Self::apply_service),
/// [`delete_slice`](Self::delete_slice)..., or whole lists after a relist with
/// [`replace_services`](Self::replace_services) / [`replace_slices`](Self::replace_slices)),
/// then call [`model`](Self::model): only the Services whose Service object or
/// EndpointSlices changed since the last call are translated again. The result always equals
/// [`build_model`](super::build_model) of the same objects (a property the tests check after
/// random edits).
///
/// Objects are held as `Arc`s; re-applying an unchanged object costs one comparison.
#[derive(Debug)]
pub struct IncrementalModel {
    cfg: Config,
    node: NodeInfo,
    services: HashMap<Key, Arc<Service>>,
    /// EndpointSlices by the Service they belong to, then by slice name.
    slices: HashMap<Key, BTreeMap<String, Arc<EndpointSlice>>>,
    /// Slice (namespace, name) → the Service it is filed under.
    slice_owner: HashMap<Key, Key>,
    dirty: HashSet<Key>,
    all_dirty: bool,
    merge: Merge,
    /// What changed since the last model: for kube-proxy's pending-changes gauges.
    changes: Changes,
}

/// Changes of the objects, counted like kube-proxy's change trackers.
#[derive(Debug, Default)]
struct Changes {
    /// Services changed since the last model.
    pending_services: HashSet<Key>,
    /// EndpointSlices changed since the last model.
    pending_slices: HashSet<Key>,
    /// Service changes since the start.
    services: u64,
    /// EndpointSlice changes since the start.
    slices: u64,
    /// Trigger times older than this are ignored (`None`: none are recorded).
    triggers_since: Option<SystemTime>,
    /// Trigger times of the changed slices, by the Service they belong to.
    triggers: HashMap<Key, Vec<SystemTime>>,
    /// Trigger times of the changes in models already returned, not yet taken.
    modelled: Vec<SystemTime>,
}

/// The `endpoints.kubernetes.io/last-change-trigger-time` of `slice`: when the change of
/// Pods or Services that made the endpoints controller write it happened (RFC 3339).
pub fn last_change_trigger_time(slice: &EndpointSlice) -> Option<SystemTime> {
    let v = slice
        .metadata
        .annotations
        .as_ref()?
        .get(ANN_LAST_CHANGE_TRIGGER_TIME)?;
    let ts: k8s_openapi::jiff::Timestamp = v.parse().ok()?;
    let ns = u64::try_from(ts.as_nanosecond()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
}

impl IncrementalModel {
    /// An empty model translating with `cfg` (`[kubernetes]`, `[dataplane] mode`) for `node`.
    pub fn new(cfg: &Config, node: NodeInfo) -> Self {
        IncrementalModel {
            cfg: cfg.clone(),
            node,
            services: HashMap::new(),
            slices: HashMap::new(),
            slice_owner: HashMap::new(),
            dirty: HashSet::new(),
            all_dirty: false,
            merge: Merge::default(),
            changes: Changes::default(),
        }
    }

    /// Records the `last-change-trigger-time` of every EndpointSlice change from now on,
    /// those later than `since` (the source's start: kube-proxy ignores older ones, which
    /// the initial list would report with the age of the cluster). Without this call none
    /// are recorded.
    pub fn record_trigger_times_since(&mut self, since: SystemTime) {
        self.changes.triggers_since = Some(since);
    }

    /// The trigger times of the EndpointSlice changes in the models returned so far, once:
    /// for network programming latency. A slice deleted before its model was built
    /// takes its trigger times with it (kube-proxy's rule: a deletion's time is not a
    /// change's).
    pub fn take_trigger_times(&mut self) -> Vec<SystemTime> {
        std::mem::take(&mut self.changes.modelled)
    }

    /// Distinct (Services, EndpointSlices) changed since the last [`model`](Self::model):
    /// kube-proxy's `sync_proxy_rules_{service,endpoint}_changes_pending`.
    pub fn pending_changes(&self) -> (usize, usize) {
        (
            self.changes.pending_services.len(),
            self.changes.pending_slices.len(),
        )
    }

    /// (Service, EndpointSlice) changes since the start: adds, updates and deletes that
    /// changed an object held (a relist counts only what differs).
    pub fn changes_total(&self) -> (u64, u64) {
        (self.changes.services, self.changes.slices)
    }

    fn service_changed(&mut self, key: &Key) {
        self.changes.services += 1;
        self.changes.pending_services.insert(key.clone());
    }

    fn slice_changed(&mut self, slice_key: &Key) {
        self.changes.slices += 1;
        self.changes.pending_slices.insert(slice_key.clone());
    }

    /// This node. A change retranslates every Service.
    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// Sets this node; a different one marks every Service for translation.
    pub fn set_node(&mut self, node: NodeInfo) {
        if node != self.node {
            self.node = node;
            self.all_dirty = true;
        }
    }

    /// Marks every Service for translation at the next [`model`](Self::model) (a periodic
    /// full resync). Services whose translation comes out the same cost no further work.
    pub fn mark_all_dirty(&mut self) {
        self.all_dirty = true;
    }

    /// Whether a [`model`](Self::model) call would translate anything.
    pub fn is_dirty(&self) -> bool {
        self.all_dirty || !self.dirty.is_empty()
    }

    /// Number of Services held.
    pub fn services(&self) -> usize {
        self.services.len()
    }

    /// Number of (usable) EndpointSlices held.
    pub fn endpoint_slices(&self) -> usize {
        self.slice_owner.len()
    }

    /// Adds or replaces a Service.
    pub fn apply_service(&mut self, svc: Arc<Service>) {
        let (ns, name) = service_key(&svc);
        let key = key_of(ns, name);
        match self.services.get(&key) {
            Some(old) if Arc::ptr_eq(old, &svc) || **old == *svc => {}
            _ => {
                self.service_changed(&key);
                self.services.insert(key.clone(), svc);
                self.dirty.insert(key);
            }
        }
    }

    /// Removes a Service.
    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        let key = key_of(namespace, name);
        if self.services.remove(&key).is_some() {
            self.service_changed(&key);
            self.dirty.insert(key);
        }
    }

    /// Adds or replaces an EndpointSlice. Slices without a `kubernetes.io/service-name`
    /// label or with an address type other than IPv4/IPv6 are not kept.
    pub fn apply_slice(&mut self, slice: Arc<EndpointSlice>) {
        let ns = slice.metadata.namespace.as_deref().unwrap_or("default");
        let name = slice.metadata.name.as_deref().unwrap_or("");
        let skey = key_of(ns, name);
        let owner = slice_service(&slice).map(|(ns, svc)| key_of(ns, svc));
        let prev = self.slice_owner.get(&skey);
        if prev.is_some() && prev != owner.as_ref() {
            self.delete_slice(ns, name);
        }
        let Some(owner) = owner else {
            return;
        };
        let slices = self.slices.entry(owner.clone()).or_default();
        match slices.get(name) {
            Some(old) if Arc::ptr_eq(old, &slice) || **old == *slice => {}
            _ => {
                let trigger = last_change_trigger_time(&slice);
                slices.insert(skey.1.clone(), slice);
                self.slice_changed(&skey);
                if let (Some(t), Some(since)) = (trigger, self.changes.triggers_since)
                    && t > since
                {
                    self.changes
                        .triggers
                        .entry(owner.clone())
                        .or_default()
                        .push(t);
                }
                self.slice_owner.insert(skey, owner.clone());
                self.dirty.insert(owner);
            }
        }
    }

    /// Removes an EndpointSlice.
    pub fn delete_slice(&mut self, namespace: &str, name: &str) {
        let skey = key_of(namespace, name);
        let Some(owner) = self.slice_owner.remove(&skey) else {
            return;
        };
        self.slice_changed(&skey);
        self.changes.triggers.remove(&owner);
        if let Some(slices) = self.slices.get_mut(&owner) {
            slices.remove(name);
            if slices.is_empty() {
                self.slices.remove(&owner);
            }
        }
        self.dirty.insert(owner);
    }

    /// Replaces every Service with `all` (a relist): new and changed ones are applied, the
    /// ones missing from `all` deleted.
    pub fn replace_services(&mut self, all: impl IntoIterator<Item = Arc<Service>>) {
        let mut seen: HashSet<Key> = HashSet::new();
        for svc in all {
            let (ns, name) = service_key(&svc);
            seen.insert(key_of(ns, name));
            self.apply_service(svc);
        }
        let gone: Vec<Key> = self
            .services
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for (ns, name) in gone {
            self.delete_service(&ns, &name);
        }
    }

    /// Replaces every EndpointSlice with `all` (a relist).
    pub fn replace_slices(&mut self, all: impl IntoIterator<Item = Arc<EndpointSlice>>) {
        let mut seen: HashSet<Key> = HashSet::new();
        for s in all {
            let ns = s.metadata.namespace.as_deref().unwrap_or("default");
            let name = s.metadata.name.as_deref().unwrap_or("");
            seen.insert(key_of(ns, name));
            self.apply_slice(s);
        }
        let gone: Vec<Key> = self
            .slice_owner
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for (ns, name) in gone {
            self.delete_slice(&ns, &name);
        }
    }

    /// Brings the model up to date (translating the Services that changed) and returns it.
    pub fn model(&mut self) -> &K8sModel {
        self.update();
        let c = &mut self.changes;
        c.pending_services.clear();
        c.pending_slices.clear();
        c.modelled.extend(c.triggers.drain().flat_map(|(_, t)| t));
        &self.merge.model
    }

    /// Number of Services translated by the last [`model`](Self::model) call that had work.
    pub fn last_translated(&self) -> usize {
        self.merge.last_translated
    }

    fn update(&mut self) {
        if !self.is_dirty() {
            return;
        }
        let mut keys = std::mem::take(&mut self.dirty);
        if self.all_dirty {
            self.all_dirty = false;
            keys.extend(self.services.keys().cloned());
        }
        self.merge.last_translated = keys.len();
        let no_slices = BTreeMap::new();
        for key in keys {
            match self.services.get(&key) {
                Some(svc) => {
                    let slices: Vec<&EndpointSlice> = self
                        .slices
                        .get(&key)
                        .unwrap_or(&no_slices)
                        .values()
                        .map(|s| &**s)
                        .collect();
                    let t = translate_service(svc, &slices, &self.node, &self.cfg);
                    self.merge.set(key, order_key(svc), t);
                }
                None => self.merge.remove(key),
            }
        }
        self.merge.commit();
    }
}

/// A (slot, spec index) claiming a frontend.
type Claimant = (u32, u32);

#[derive(Debug)]
enum Claim {
    One(Claimant),
    Many(Vec<Claimant>),
}

impl Claim {
    fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        let s: &[Claimant] = match self {
            Claim::One(c) => std::slice::from_ref(c),
            Claim::Many(v) => v,
        };
        s.iter().map(|c| c.0)
    }
}

/// One Service in the merge.
#[derive(Debug, Default)]
struct Slot {
    key: Key,
    order: OrderKey,
    out: Translated,
    /// Queued for the next commit.
    queued: bool,
    /// How many specs the model holds for this Service (a run of `model.specs`: every name
    /// starts with `ns/name:`).
    published: usize,
    /// Names of its specs in `model.source_ranges`.
    lb_names: Vec<String>,
    /// Its problems as published (translation problems, then lost frontends).
    problems: Vec<Problem>,
}

/// The merge of per-Service translations into one model (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Merge {
    index: HashMap<Key, u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    claims: HashMap<Frontend, Claim>,
    /// Slots set since the last commit.
    changed: Vec<u32>,
    /// Frontends whose claims changed since the last commit.
    touched: Vec<Frontend>,
    /// Slots with problems.
    with_problems: HashSet<u32>,
    last_translated: usize,
    model: K8sModel,
}

/// Above this many Services to republish, the spec list is rebuilt in one merge pass
/// instead of spliced Service by Service.
const SPLICE_MAX: usize = 8;

impl Merge {
    /// Sets the translation of one Service.
    pub(crate) fn set(&mut self, key: Key, order: OrderKey, out: Translated) {
        let i = match self.index.get(&key) {
            Some(i) => *i,
            None if out == Translated::default() => return,
            None => {
                let slot = Slot {
                    key: key.clone(),
                    ..Slot::default()
                };
                let i = match self.free.pop() {
                    Some(i) => {
                        self.slots[i as usize] = slot;
                        i
                    }
                    None => {
                        self.slots.push(slot);
                        u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 Services")
                    }
                };
                self.index.insert(key, i);
                i
            }
        };
        let slot = &mut self.slots[i as usize];
        if slot.out == out && slot.order == order {
            return;
        }
        for (j, r) in slot.out.specs.iter().enumerate() {
            for f in &r.spec.frontends {
                unclaim(&mut self.claims, f, (i, j as u32));
                self.touched.push(*f);
            }
        }
        for (j, r) in out.specs.iter().enumerate() {
            for f in &r.spec.frontends {
                claim(&mut self.claims, f, (i, j as u32));
                self.touched.push(*f);
            }
        }
        slot.out = out;
        slot.order = order;
        if !slot.queued {
            slot.queued = true;
            self.changed.push(i);
        }
    }

    /// Removes a Service.
    pub(crate) fn remove(&mut self, key: Key) {
        if self.index.contains_key(&key) {
            self.set(key, OrderKey::default(), Translated::default());
        }
    }

    /// Publishes every change since the last commit into the model.
    pub(crate) fn commit(&mut self) {
        let mut affected = std::mem::take(&mut self.changed);
        // Other claimants of the frontends that changed hands may win or lose them now.
        for f in std::mem::take(&mut self.touched) {
            if let Some(c) = self.claims.get(&f) {
                for s in c.slots() {
                    let slot = &mut self.slots[s as usize];
                    if !slot.queued {
                        slot.queued = true;
                        affected.push(s);
                    }
                }
            }
        }
        if affected.is_empty() {
            return;
        }
        let mut problems_changed = false;
        let mut finals: Vec<(u32, Vec<ServiceSpec>)> = Vec::with_capacity(affected.len());
        for &i in &affected {
            let (specs, problems, lb) = self.finalize(i);
            let slot = &mut self.slots[i as usize];
            slot.queued = false;
            for name in slot.lb_names.drain(..) {
                self.model.source_ranges.remove(&name);
            }
            for (name, ranges) in lb {
                slot.lb_names.push(name.clone());
                self.model.source_ranges.insert(name, ranges);
            }
            let id = format!("{}/{}", slot.key.0, slot.key.1);
            let hcnp = &mut self.model.health_check_node_ports;
            hcnp.retain(|h| h.service != id);
            if let Some(h) = &slot.out.hcnp {
                let at = hcnp.partition_point(|x| (x.port, &x.service) < (h.port, &h.service));
                hcnp.insert(at, h.clone());
            }
            if slot.problems != problems {
                problems_changed = true;
                if problems.is_empty() {
                    self.with_problems.remove(&i);
                } else {
                    self.with_problems.insert(i);
                }
                slot.problems = problems;
            }
            finals.push((i, specs));
        }
        if finals.len() <= SPLICE_MAX {
            for (i, specs) in finals {
                let range = self.range(i);
                self.slots[i as usize].published = specs.len();
                self.model.specs.splice(range, specs);
            }
        } else {
            self.remerge(finals);
        }
        if problems_changed {
            let mut with: Vec<u32> = self.with_problems.iter().copied().collect();
            with.sort_by(|a, b| {
                let (x, y) = (&self.slots[*a as usize], &self.slots[*b as usize]);
                (&x.order, a).cmp(&(&y.order, b))
            });
            self.model.problems = with
                .iter()
                .flat_map(|i| self.slots[*i as usize].problems.iter().cloned())
                .collect();
        }
        // Forget Services that are gone (nothing published, nothing claimed).
        for i in affected {
            let slot = &self.slots[i as usize];
            if slot.out == Translated::default() && slot.published == 0 {
                let key = std::mem::take(&mut self.slots[i as usize].key);
                self.index.remove(&key);
                self.slots[i as usize] = Slot::default();
                self.free.push(i);
            }
        }
    }

    /// The run of `model.specs` slot `i` published.
    fn range(&self, i: u32) -> std::ops::Range<usize> {
        let slot = &self.slots[i as usize];
        let prefix = format!("{}/{}:", slot.key.0, slot.key.1);
        let start = self
            .model
            .specs
            .partition_point(|s| s.name.as_str() < prefix.as_str());
        let range = start..start + slot.published;
        debug_assert!(
            self.model.specs[range.clone()]
                .iter()
                .all(|s| s.name.starts_with(&prefix))
        );
        range
    }

    /// Replaces the runs of many slots in one pass: the rest of the list is moved, not
    /// cloned, and merged with the new specs by name.
    fn remerge(&mut self, finals: Vec<(u32, Vec<ServiceSpec>)>) {
        let mut ranges: Vec<std::ops::Range<usize>> = finals
            .iter()
            .map(|(i, _)| self.range(*i))
            .filter(|r| !r.is_empty())
            .collect();
        ranges.sort_unstable_by_key(|r| r.start);
        let mut incoming: Vec<ServiceSpec> = Vec::new();
        for (i, specs) in finals {
            self.slots[i as usize].published = specs.len();
            incoming.extend(specs);
        }
        incoming.sort_by(|a, b| a.name.cmp(&b.name));
        let old = std::mem::take(&mut self.model.specs);
        let removed: usize = ranges.iter().map(|r| r.len()).sum();
        // Headroom: the next Service added is spliced in without moving the whole list.
        let len = old.len() - removed + incoming.len();
        let mut out = Vec::with_capacity(len + len / 8 + 16);
        let mut ranges = ranges.into_iter().peekable();
        let mut incoming = incoming.into_iter().peekable();
        for (j, s) in old.into_iter().enumerate() {
            while ranges.peek().is_some_and(|r| r.end <= j) {
                ranges.next();
            }
            if ranges.peek().is_some_and(|r| r.contains(&j)) {
                continue;
            }
            while let Some(n) = incoming.next_if(|n| n.name < s.name) {
                out.push(n);
            }
            out.push(s);
        }
        out.extend(incoming);
        self.model.specs = out;
    }

    /// Slot `i`'s specs (sorted by name) with the frontends it lost taken away, its problems,
    /// and its `/lb` source ranges.
    #[allow(clippy::type_complexity)]
    fn finalize(
        &self,
        i: u32,
    ) -> (
        Vec<ServiceSpec>,
        Vec<Problem>,
        Vec<(String, Vec<config::Cidr>)>,
    ) {
        let slot = &self.slots[i as usize];
        let mut specs = Vec::with_capacity(slot.out.specs.len());
        let mut problems = slot.out.problems.clone();
        let mut lb = Vec::new();
        for (j, r) in slot.out.specs.iter().enumerate() {
            let me = (i, j as u32);
            let lost = |f: &Frontend| self.winner(f).is_some_and(|w| w != me);
            let spec = if r.spec.frontends.iter().any(lost) {
                let mut spec = r.spec.clone();
                spec.frontends.retain(|f| match self.winner(f) {
                    Some(w) if w != me => {
                        let (ws, wj) = (w.0 as usize, w.1 as usize);
                        let owner = &self.slots[ws].out.specs[wj].spec.name;
                        problems.push(Problem {
                            object: format!("Service {}/{}", slot.key.0, slot.key.1),
                            reason: format!(
                                "frontend {} {}/{} is already used by {owner}; ignored",
                                fmt_ip_port(f.vip, f.port),
                                f.protocol.name(),
                                r.spec.name
                            ),
                        });
                        false
                    }
                    _ => true,
                });
                if spec.frontends.is_empty() {
                    continue;
                }
                spec
            } else {
                r.spec.clone()
            };
            if r.lb {
                lb.push((spec.name.clone(), spec.source_ranges.clone()));
            }
            specs.push(spec);
        }
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        (specs, problems, lb)
    }

    /// Who owns a frontend: its oldest claimant.
    fn winner(&self, f: &Frontend) -> Option<Claimant> {
        match self.claims.get(f)? {
            Claim::One(c) => Some(*c),
            Claim::Many(v) => v
                .iter()
                .min_by(|a, b| {
                    let (x, y) = (&self.slots[a.0 as usize], &self.slots[b.0 as usize]);
                    (&x.order, a.0, a.1).cmp(&(&y.order, b.0, b.1))
                })
                .copied(),
        }
    }

    pub(crate) fn into_model(self) -> K8sModel {
        self.model
    }
}

fn claim(claims: &mut HashMap<Frontend, Claim>, f: &Frontend, c: Claimant) {
    match claims.get_mut(f) {
        None => {
            claims.insert(*f, Claim::One(c));
        }
        Some(Claim::One(first)) => {
            let first = *first;
            claims.insert(*f, Claim::Many(vec![first, c]));
        }
        Some(Claim::Many(v)) => v.push(c),
    }
}

fn unclaim(claims: &mut HashMap<Frontend, Claim>, f: &Frontend, c: Claimant) {
    match claims.get_mut(f) {
        Some(Claim::One(x)) if *x == c => {
            claims.remove(f);
        }
        Some(Claim::Many(v)) => {
            v.retain(|x| *x != c);
            if let [one] = v.as_slice() {
                let one = *one;
                claims.insert(*f, Claim::One(one));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod change_tests {
    //! kube-proxy's change tracking: pending changes and trigger times.

    use serde_json::json;

    use super::*;

    fn service(name: &str, ip: &str) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": name},
                "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                         "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
            }))
            .unwrap(),
        )
    }

    /// A slice of `ns/svc` with one ready endpoint, triggered at `trigger` (RFC 3339).
    fn slice(name: &str, svc: &str, addr: &str, trigger: Option<&str>) -> Arc<EndpointSlice> {
        let mut meta = json!({"namespace": "ns", "name": name,
                              "labels": {"kubernetes.io/service-name": svc}});
        if let Some(t) = trigger {
            meta["annotations"] = json!({ ANN_LAST_CHANGE_TRIGGER_TIME: t });
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": meta,
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
                "endpoints": [{"addresses": [addr], "conditions": {"ready": true}}],
            }))
            .unwrap(),
        )
    }

    fn model() -> IncrementalModel {
        let cfg = config::parse("[kubernetes]\n", "t.toml").unwrap();
        IncrementalModel::new(&cfg, NodeInfo::default())
    }

    fn at(s: u64, nanos: u32) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::new(s, nanos)
    }

    #[test]
    fn the_trigger_time_annotation_parses_as_rfc3339() {
        let t = |v| last_change_trigger_time(&slice("s", "web", "198.18.1.1", Some(v)));
        assert_eq!(t("2024-05-01T12:34:56Z"), Some(at(1_714_566_896, 0)));
        assert_eq!(
            t("2024-05-01T12:34:56.789123Z"),
            Some(at(1_714_566_896, 789_123_000))
        );
        assert_eq!(t("2024-05-01T14:34:56+02:00"), Some(at(1_714_566_896, 0)));
        assert_eq!(t("yesterday"), None);
        assert_eq!(
            last_change_trigger_time(&slice("s", "web", "198.18.1.1", None)),
            None
        );
    }

    #[test]
    fn pending_changes_count_distinct_objects_until_the_next_model() {
        let mut m = model();
        m.apply_service(service("web", "198.18.100.1"));
        m.apply_slice(slice("web-a", "web", "198.18.1.1", None));
        m.apply_slice(slice("web-a", "web", "198.18.1.2", None));
        m.apply_slice(slice("web-b", "web", "198.18.1.3", None));
        // Re-applying an unchanged object is no change.
        m.apply_slice(slice("web-b", "web", "198.18.1.3", None));
        assert_eq!(m.pending_changes(), (1, 2));
        assert_eq!(m.changes_total(), (1, 3));
        m.model();
        assert_eq!(m.pending_changes(), (0, 0));
        m.delete_slice("ns", "web-a");
        m.delete_service("ns", "web");
        // Deleting what is not there changes nothing.
        m.delete_slice("ns", "nope");
        assert_eq!(m.pending_changes(), (1, 1));
        assert_eq!(m.changes_total(), (2, 4));
    }

    #[test]
    fn trigger_times_after_the_start_reach_the_next_model_once() {
        let mut m = model();
        m.apply_service(service("web", "198.18.100.1"));
        // Not recording yet: nothing is kept.
        m.apply_slice(slice(
            "web-a",
            "web",
            "198.18.1.1",
            Some("2024-05-01T12:00:00Z"),
        ));
        m.record_trigger_times_since(at(1_714_564_800, 0));
        // Older than the start (the initial list of an old cluster): ignored.
        m.apply_slice(slice(
            "web-b",
            "web",
            "198.18.1.2",
            Some("2024-05-01T11:00:00Z"),
        ));
        m.apply_slice(slice(
            "web-a",
            "web",
            "198.18.1.4",
            Some("2024-05-01T12:00:01Z"),
        ));
        m.apply_slice(slice(
            "web-b",
            "web",
            "198.18.1.5",
            Some("2024-05-01T12:00:02Z"),
        ));
        // Taken only once a model has them.
        assert_eq!(m.take_trigger_times(), vec![]);
        m.model();
        let mut t = m.take_trigger_times();
        t.sort();
        assert_eq!(t, vec![at(1_714_564_801, 0), at(1_714_564_802, 0)]);
        assert_eq!(m.take_trigger_times(), vec![]);
        // A deletion drops the Service's pending trigger times (kube-proxy's rule).
        m.apply_slice(slice(
            "web-a",
            "web",
            "198.18.1.6",
            Some("2024-05-01T12:00:03Z"),
        ));
        m.delete_slice("ns", "web-b");
        m.model();
        assert_eq!(m.take_trigger_times(), vec![]);
    }
}
