//! Incremental translation: [`IncrementalModel`] holds the Services and EndpointSlices and the
//! translation of each Service, and keeps the [`K8sModel`] up to date object by object, so a
//! changed EndpointSlice costs one Service's translation (plus a splice into the sorted spec
//! list), not a translation of the whole cluster.
//!
//! The merge step it shares with [`build_model`](super::build_model) is
//! [`Merge`](super::merge::Merge): this model sets only the Services that changed, a full
//! translation sets them all, and both then commit, so the two cannot drift apart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use config::Config;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;

use super::merge::{Key, Merge};
use super::translate::{NodeInfo, order_key, service_key, slice_service, translate_service};
use super::{ANN_LAST_CHANGE_TRIGGER_TIME, K8sModel};

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
/// random edits), except for a Service refused as a whole
/// ([`ProblemKind::ServiceRefused`](super::ProblemKind)): this model keeps its previous
/// translation, as the API server would have kept the previous object.
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
    /// The ServiceCIDR objects, by name (cluster-scoped).
    service_cidrs: BTreeMap<String, Arc<ServiceCIDR>>,
    dirty: HashSet<Key>,
    all_dirty: bool,
    /// The ServiceCIDRs (or the node) changed since the last model.
    cidrs_dirty: bool,
    merge: Merge,
    /// Services translated by the last update that had work.
    last_translated: usize,
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
            service_cidrs: BTreeMap::new(),
            dirty: HashSet::new(),
            all_dirty: false,
            // The config's Service CIDRs are in the first model, objects or not.
            cidrs_dirty: true,
            merge: Merge::default(),
            last_translated: 0,
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
            self.cidrs_dirty = true;
        }
    }

    /// Marks every Service for translation at the next [`model`](Self::model) (a periodic
    /// full resync). Services whose translation comes out the same cost no further work.
    pub fn mark_all_dirty(&mut self) {
        self.all_dirty = true;
    }

    /// Whether a [`model`](Self::model) call would translate anything.
    pub fn is_dirty(&self) -> bool {
        self.all_dirty || self.cidrs_dirty || !self.dirty.is_empty()
    }

    /// Adds or replaces a ServiceCIDR.
    pub fn apply_service_cidr(&mut self, cidr: Arc<ServiceCIDR>) {
        let name = cidr.metadata.name.clone().unwrap_or_default();
        match self.service_cidrs.get(&name) {
            Some(old) if Arc::ptr_eq(old, &cidr) || **old == *cidr => {}
            _ => {
                self.service_cidrs.insert(name, cidr);
                self.cidrs_dirty = true;
            }
        }
    }

    /// Removes a ServiceCIDR.
    pub fn delete_service_cidr(&mut self, name: &str) {
        if self.service_cidrs.remove(name).is_some() {
            self.cidrs_dirty = true;
        }
    }

    /// Replaces every ServiceCIDR (after a relist).
    pub fn replace_service_cidrs(&mut self, all: impl IntoIterator<Item = Arc<ServiceCIDR>>) {
        let new: BTreeMap<String, Arc<ServiceCIDR>> = all
            .into_iter()
            .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
            .collect();
        if new != self.service_cidrs {
            self.service_cidrs = new;
            self.cidrs_dirty = true;
        }
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
        self.merge.model()
    }

    /// Number of Services translated by the last [`model`](Self::model) call that had work.
    pub fn last_translated(&self) -> usize {
        self.last_translated
    }

    fn update(&mut self) {
        if !self.is_dirty() {
            return;
        }
        if std::mem::take(&mut self.cidrs_dirty) {
            let objects: Vec<&ServiceCIDR> = self.service_cidrs.values().map(|c| &**c).collect();
            self.merge
                .set_service_cidrs(&objects, &self.node, &self.cfg);
        }
        let mut keys = std::mem::take(&mut self.dirty);
        if self.all_dirty {
            self.all_dirty = false;
            keys.extend(self.services.keys().cloned());
        }
        self.last_translated = keys.len();
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
