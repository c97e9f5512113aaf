//! The merge of per-Service translations into one [`K8sModel`], and [`build_model`], the
//! whole-cluster translation built on it.
//!
//! Each Service is translated on its own ([`translate_service`]); [`Merge`] then settles
//! what needs every Service: frontends claimed by several Services (ClusterIPs first, then
//! load-balancer IPs with source ranges, then the older Service), endpoints on a Service's
//! VIP (refused), and Services refused as a whole (their previous translation stays); and it
//! keeps the specs sorted by name. A full translation ([`build_model`]) is "every Service set,
//! then one commit", and the incremental model
//! ([`IncrementalModel`](super::IncrementalModel)) sets only the Services that changed before
//! committing, so the two cannot drift apart (except that a full translation has no previous
//! translation to keep for a refused Service).
//!
//! Layering (no cycles): `translate` (one Service) ← `merge` (this module) ← `incremental`.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use config::Config;
use fastpath::snapshot::{Frontend, ServiceSpec};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;

use super::translate::{
    NodeInfo, OrderKey, Translated, fmt_ip_port, order_key, service_key, slice_service,
    translate_service,
};
use super::{K8sModel, Problem, ProblemKind};

/// (namespace, name) of a Service.
pub(crate) type Key = (String, String);

/// [`build_model`], keeping only the specs and the problems.
pub fn build_specs(
    services: &[Service],
    slices: &[EndpointSlice],
    node: &NodeInfo,
    cfg: &Config,
) -> (Vec<ServiceSpec>, Vec<Problem>) {
    let m = build_model(services, slices, node, cfg);
    (m.specs, m.problems)
}

/// Translates Services and EndpointSlices into a model. Pure: no I/O, no clock.
///
/// Rules (kube-proxy's unless said otherwise):
/// - Ownership: with `[kubernetes] service_proxy_name`, only Services whose
///   `service.kubernetes.io/service-proxy-name` label equals it; without, only Services
///   without that label. Headless (`clusterIP: None`) and ExternalName Services are skipped.
/// - Specs: one per (Service, port, frontend group, address family), named
///   `ns/name:PORT` (PORT = the port's name, or its number when unnamed), plus `/ext` for the
///   external group, `/lb` for load-balancer ingress IPs of a Service with source ranges,
///   and `/v6` for IPv6. A spec always has one address family, frontends and backends alike.
/// - Internal group: every `clusterIPs` entry, policy `internalTrafficPolicy`.
/// - External group, policy `externalTrafficPolicy`: NodePorts (on every node address of the
///   family), `status.loadBalancer.ingress[].ip` (except `ipMode: Proxy`), and
///   `externalIPs` inside `external_ip_cidrs` (others are a [`Problem`]: CVE-2020-8554).
/// - Families: only those the Service has a ClusterIP of (`clusterIPs`, `ipFamilies`);
///   external and load-balancer IPs of another family are no frontends (left to the host).
/// - Endpoints: from the slices labelled `kubernetes.io/service-name`, matched by port name
///   and protocol, the number taken from each slice (named targetPorts), one address family
///   per spec; selection as described in `endpoints`.
/// - `sessionAffinity: ClientIP` → `affinity_timeout` (`timeoutSeconds`, default 10800).
/// - Annotations: `xvs.io/scheduler`, `xvs.io/scheduler-flags`, `xvs.io/mode`,
///   `xvs.io/weights` (`IP=WEIGHT,...`); an invalid one falls back to the default with a
///   [`Problem`].
/// - Refused (each a [`Problem`], the rest of the Service translated): frontends (but
///   NodePorts) on special addresses (loopback, multicast, broadcast, unspecified,
///   link-local) or on this node's own addresses; endpoints on special addresses, on the
///   node's own addresses, or on any Service's VIP (a ClusterIP, externalIP or
///   load-balancer IP).
/// - A Service the API server would refuse (names that are no DNS labels, two ports with
///   one name) is not translated, with a [`Problem`]; the incremental model keeps its
///   previous translation.
/// - A frontend claimed by two Services goes to a ClusterIP over any other claim, then to a
///   load-balancer IP with source ranges over the rest (so the ranges always apply), then to
///   the older Service (creation time, then name); the other loses that frontend, with a
///   [`Problem`]. In one Service, an address that is both an externalIP and a
///   load-balancer IP with source ranges is served with the ranges.
/// - Determinism: a Service's slices are read in name order; specs are sorted by name;
///   problems come Service by Service, oldest first (lost frontends after the others).
/// - No usable endpoint: a spec rejects new flows (`NoEndpoints::Reject`) unless its traffic
///   policy is `Local` and the Service has endpoints on other nodes (`Drop`), as kube-proxy's
///   no-endpoint rules; the ClusterIP specs are marked `cluster_ip`, so their addresses
///   reject the ports and protocols no frontend serves.
/// - Service CIDRs: `[kubernetes] service_cidrs` and the ServiceCIDR objects'
///   ([`build_model_with`]), checked in `cidrs` (a bad object skipped, a CIDR holding one of
///   this node's addresses refused).
/// - `healthCheckNodePort` of `externalTrafficPolicy: Local` Services is listed with its
///   count of local ready endpoints.
pub fn build_model(
    services: &[Service],
    slices: &[EndpointSlice],
    node: &NodeInfo,
    cfg: &Config,
) -> K8sModel {
    build_model_with(services, slices, &[], node, cfg)
}

/// [`build_model`] with the cluster's ServiceCIDR objects too: the model's Service CIDRs
/// are theirs and `[kubernetes] service_cidrs` (see `cidrs`).
pub fn build_model_with(
    services: &[Service],
    slices: &[EndpointSlice],
    service_cidrs: &[ServiceCIDR],
    node: &NodeInfo,
    cfg: &Config,
) -> K8sModel {
    let services: Vec<&Service> = services.iter().collect();
    let slices: Vec<&EndpointSlice> = slices.iter().collect();
    let cidrs: Vec<&ServiceCIDR> = service_cidrs.iter().collect();
    build_model_refs(&services, &slices, &cidrs, node, cfg)
}

/// [`build_model`] over borrowed objects: every Service translated on its own, then merged
/// (frontend claims, sorting) by the same code the incremental model uses.
pub(crate) fn build_model_refs(
    services: &[&Service],
    slices: &[&EndpointSlice],
    service_cidrs: &[&ServiceCIDR],
    node: &NodeInfo,
    cfg: &Config,
) -> K8sModel {
    let mut by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for s in slices {
        if let Some((ns, svc)) = slice_service(s) {
            by_service.entry((ns, svc)).or_default().push(*s);
        }
    }
    for v in by_service.values_mut() {
        v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }
    let mut merge = Merge::default();
    for svc in services {
        let (ns, name) = service_key(svc);
        let no_slices = Vec::new();
        let slices = by_service.get(&(ns, name)).unwrap_or(&no_slices);
        merge.set(
            (ns.to_owned(), name.to_owned()),
            order_key(svc),
            translate_service(svc, slices, node, cfg),
        );
    }
    merge.commit();
    merge.set_service_cidrs(service_cidrs, node, cfg);
    merge.into_model()
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
    /// Claims of every address that is a frontend (a VIP): an endpoint may not be on one.
    vips: Counts,
    /// Addresses that became or stopped being VIPs since the last commit.
    touched_vips: Vec<IpAddr>,
    /// How many Services list an endpoint at each address.
    endpoints: Counts,
    /// The problems of the Service CIDRs (after the Services' in `model.problems`).
    cidr_problems: Vec<Problem>,

    model: K8sModel,
}

/// Above this many Services to republish, the spec list is rebuilt in one merge pass
/// instead of spliced Service by Service.
const SPLICE_MAX: usize = 8;

impl Merge {
    /// A slot for a Service not seen before (a freed one, or a new one).
    fn new_slot(&mut self, key: Key) -> u32 {
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

    /// Sets the translation of one Service. A Service refused as a whole keeps the specs it
    /// had, with its new problems.
    pub(crate) fn set(&mut self, key: Key, order: OrderKey, mut out: Translated) {
        if out.refused
            && let Some(&i) = self.index.get(&key)
        {
            let prev = &self.slots[i as usize].out;
            out.specs = prev.specs.clone();
            out.hcnp = prev.hcnp.clone();
        }
        let i = match self.index.get(&key) {
            Some(i) => *i,
            None if out == Translated::default() => return,
            None => self.new_slot(key),
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
        // New claims counted before old ones are dropped: an address the Service keeps
        // never drops to no claim, which would look like a VIP going and coming.
        let (vips, touched) = (&mut self.vips, &mut self.touched_vips);
        for f in out.specs.iter().flat_map(|r| &r.spec.frontends) {
            if count(vips, f.vip, true) {
                touched.push(f.vip);
            }
        }
        for f in slot.out.specs.iter().flat_map(|r| &r.spec.frontends) {
            if count(vips, f.vip, false) {
                touched.push(f.vip);
            }
        }
        let (old, new) = (endpoint_ips(&slot.out), endpoint_ips(&out));
        if old != new {
            for ip in &old {
                count(&mut self.endpoints, *ip, false);
            }
            for ip in &new {
                count(&mut self.endpoints, *ip, true);
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
        let affected = self.affected();
        if affected.is_empty() {
            return;
        }
        let mut problems_changed = false;
        let mut finals: Vec<(u32, Vec<ServiceSpec>)> = Vec::with_capacity(affected.len());
        for &i in &affected {
            let (specs, changed) = self.settle(i);
            problems_changed |= changed;
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
                .chain(self.cidr_problems.iter().cloned())
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

    /// The slots to settle in this commit: the changed ones, and those whose frontend claims
    /// or endpoints the changes touched (each once; their `queued` is set until settled).
    fn affected(&mut self) -> Vec<u32> {
        let mut affected = std::mem::take(&mut self.changed);
        // Other claimants of the frontends that changed hands may win or lose them now.
        let mut queue = |slots: &mut Vec<Slot>, s: u32| {
            let slot = &mut slots[s as usize];
            if !slot.queued {
                slot.queued = true;
                affected.push(s);
            }
        };
        for f in std::mem::take(&mut self.touched) {
            if let Some(c) = self.claims.get(&f) {
                for s in c.slots() {
                    queue(&mut self.slots, s);
                }
            }
        }
        // Services with an endpoint on an address that became or stopped being a VIP (rare:
        // a pass over every endpoint then, rather than an index of which Service lists
        // which address, kept always).
        let touched_vips: HashSet<IpAddr> = std::mem::take(&mut self.touched_vips)
            .into_iter()
            .filter(|ip| self.endpoints.contains_key(ip))
            .collect();
        if !touched_vips.is_empty() {
            for s in 0..self.slots.len() {
                let on_touched = self.slots[s].out.specs.iter().any(|r| {
                    r.spec
                        .backends
                        .iter()
                        .any(|b| touched_vips.contains(&b.addr.ip()))
                });
                if on_touched {
                    queue(&mut self.slots, s as u32);
                }
            }
        }
        affected
    }

    /// Settles slot `i`: its LoadBalancer source ranges and healthCheckNodePort go into the
    /// model, its problems are kept. Its specs to publish, and whether its problems changed.
    fn settle(&mut self, i: u32) -> (Vec<ServiceSpec>, bool) {
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
        if slot.problems == problems {
            return (specs, false);
        }
        if problems.is_empty() {
            self.with_problems.remove(&i);
        } else {
            self.with_problems.insert(i);
        }
        slot.problems = problems;
        (specs, true)
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
        let object = || format!("Service {}/{}", slot.key.0, slot.key.1);
        let mut vip_endpoints: Vec<std::net::SocketAddr> = Vec::new();
        for (j, r) in slot.out.specs.iter().enumerate() {
            let me = (i, j as u32);
            let lost = |f: &Frontend| self.winner(f).is_some_and(|w| w != me);
            let on_vip = |b: &fastpath::snapshot::BackendSpec| self.vips.contains_key(&b.addr.ip());
            let mut spec = if r.spec.frontends.iter().any(lost) {
                let mut spec = r.spec.clone();
                spec.frontends.retain(|f| match self.winner(f) {
                    Some(w) if w != me => {
                        let (ws, wj) = (w.0 as usize, w.1 as usize);
                        let owner = &self.slots[ws].out.specs[wj].spec.name;
                        problems.push(Problem {
                            object: object(),
                            kind: ProblemKind::FrontendInUse,
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
            if spec.backends.iter().any(on_vip) {
                spec.backends.retain(|b| {
                    let vip = on_vip(b);
                    if vip && !vip_endpoints.contains(&b.addr) {
                        vip_endpoints.push(b.addr);
                    }
                    !vip
                });
            }
            if r.lb {
                lb.push((spec.name.clone(), spec.source_ranges.clone()));
            }
            specs.push(spec);
        }
        for addr in vip_endpoints {
            problems.push(Problem {
                object: object(),
                kind: ProblemKind::EndpointVip,
                reason: format!("endpoint {addr}: it is a Service's VIP; endpoint ignored"),
            });
        }
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        (specs, problems, lb)
    }

    /// Who owns a frontend: its claimant of the lowest rank (a ClusterIP, then a
    /// load-balancer IP with source ranges), then the oldest.
    fn winner(&self, f: &Frontend) -> Option<Claimant> {
        match self.claims.get(f)? {
            Claim::One(c) => Some(*c),
            Claim::Many(v) => v
                .iter()
                .min_by(|a, b| {
                    let (x, y) = (&self.slots[a.0 as usize], &self.slots[b.0 as usize]);
                    let (xr, yr) = (
                        x.out.specs[a.1 as usize].rank,
                        y.out.specs[b.1 as usize].rank,
                    );
                    (xr, &x.order, a.0, a.1).cmp(&(yr, &y.order, b.0, b.1))
                })
                .copied(),
        }
    }

    /// The model as of the last commit.
    pub(crate) fn model(&self) -> &K8sModel {
        &self.model
    }

    /// Sets the model's Service CIDRs from the ServiceCIDR `objects` and `cfg`'s
    /// `[kubernetes] service_cidrs`, as `node` may take them (see `cidrs`), and their
    /// problems after the Services'.
    pub(crate) fn set_service_cidrs(
        &mut self,
        objects: &[&ServiceCIDR],
        node: &NodeInfo,
        cfg: &Config,
    ) {
        let configured = cfg
            .kubernetes
            .as_ref()
            .map(|k| k.service_cidrs.as_slice())
            .unwrap_or(&[]);
        let (cidrs, problems) = super::cidrs::service_cidrs(objects, configured, node);
        self.model.service_cidrs = cidrs;
        if problems != self.cidr_problems {
            let services = self.model.problems.len() - self.cidr_problems.len();
            self.model.problems.truncate(services);
            self.model.problems.extend(problems.iter().cloned());
            self.cidr_problems = problems;
        }
    }

    pub(crate) fn into_model(self) -> K8sModel {
        self.model
    }
}

/// A count per address (ahash: every endpoint of the cluster is counted).
type Counts = HashMap<IpAddr, u32, ahash::RandomState>;

/// Counts `ip` once more (`add`) or once less in `counts`; true when it came or went.
fn count(counts: &mut Counts, ip: IpAddr, add: bool) -> bool {
    if add {
        let n = counts.entry(ip).or_insert(0);
        *n += 1;
        *n == 1
    } else if let Some(n) = counts.get_mut(&ip) {
        *n -= 1;
        if *n == 0 {
            counts.remove(&ip);
            return true;
        }
        false
    } else {
        false
    }
}

/// The distinct endpoint addresses of a translation, sorted.
fn endpoint_ips(t: &Translated) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = t
        .specs
        .iter()
        .flat_map(|r| r.spec.backends.iter().map(|b| b.addr.ip()))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
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
