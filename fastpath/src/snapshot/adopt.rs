//! Ids that outlive the process: a flow table adopted from an earlier process holds service
//! and backend ids of that process's builder (in its flows, the per-backend counts and the
//! ClientIP affinity entries). The new builder hands the same ids to the same services and
//! backends, recognised by what the flows record: a service by the frontends its flows were
//! addressed to, a backend by its address within that service.
//!
//! - [`AdoptedIds::from_flows`] reads them off the table; [`SnapshotBuilder::adopt`] reserves
//!   them before the first build, so no new service or backend takes one.
//! - A new service one of whose frontends an adopted service id had takes that id; a new
//!   backend of it at an adopted address takes that backend's id.
//! - [`SnapshotBuilder::settle_adopted`], once the source has described every service (its
//!   first model), retires the adopted backend ids nothing claimed, so the endpoint-removal
//!   policy handles their flows like any removed backend's and the ids come back once no
//!   flow holds them; unclaimed service ids are freed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use flowtable::FlowTable;
use lb_algos::BackendId;

use super::builder::Undo;
use super::{Frontend, SERVICE_IDS_MAX, SnapshotBuilder};

/// The ids an adopted flow table's flows hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdoptedIds {
    /// By service id: the frontends its flows were addressed to, and its backends' ids by
    /// address.
    pub services: BTreeMap<u32, AdoptedService>,
}

/// One adopted service id's flows, summarised.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdoptedService {
    /// Frontends (VIP, protocol, port) its flows were addressed to.
    pub frontends: BTreeSet<Frontend>,
    /// Backend ids by backend address.
    pub backends: BTreeMap<SocketAddr, BackendId>,
}

impl AdoptedIds {
    /// The ids of every live flow of `flows`. A backend id seen at two addresses (which a
    /// consistent table never shows) keeps the first.
    pub fn from_flows(flows: &FlowTable) -> AdoptedIds {
        let mut ids = IdsCollector::default();
        flows.scan(0, flows.capacity(), |v| ids.add(&v.data));
        ids.finish()
    }

    /// Backend ids in all.
    pub fn backends(&self) -> usize {
        self.services.values().map(|s| s.backends.len()).sum()
    }
}

type FastMap<K, V> = HashMap<K, V, ahash::RandomState>;

/// [`AdoptedIds::from_flows`] a flow at a time, in table order: a recovery pass that sees
/// every flow it keeps collects the ids as it goes (a takeover's pause then has no second
/// walk of the table). The many flows of one (service, frontend, backend) are summarised
/// once, in one cheap hash lookup each, with the same outcome as summarising every flow.
#[derive(Default)]
pub struct IdsCollector {
    out: AdoptedIds,
    /// Flows added.
    flows: usize,
    /// The first address seen for each backend id: the one that keeps it.
    first_at: HashMap<BackendId, SocketAddr>,
    /// Each (service id, frontend, backend id, backend) summarised, and whether its
    /// backend id was taken at that address.
    done: FastMap<(u32, Option<Frontend>, BackendId, SocketAddr), bool>,
    /// The backend id last taken at (service id, address): what `backends` holds there.
    id_at: FastMap<(u32, SocketAddr), BackendId>,
    /// Bumped whenever `add` changes more than `flows`.
    changes: u64,
    /// By backend id modulo [`RECENT`]: what `add` read of the last flow it saw there, and
    /// `changes` after it. Once `add` has seen a flow, the same flow again changes nothing
    /// until something else changes: such a repeat (the many flows of one backend) costs a
    /// compare, not the hash lookups.
    recent: Vec<Option<(Seen, u64)>>,
}

/// Slots of [`IdsCollector::recent`].
const RECENT: usize = 256;

/// What [`IdsCollector::add`] reads of a flow.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Seen {
    service_id: u32,
    proto: flowtable::Protocol,
    vip: SocketAddr,
    backend_id: BackendId,
    backend: SocketAddr,
}

impl IdsCollector {
    /// Adds flow `d` (flows in table order).
    pub fn add(&mut self, d: &flowtable::FlowData) {
        self.flows += 1;
        if self.recent.is_empty() {
            self.recent = vec![None; RECENT];
        }
        let seen = Seen {
            service_id: d.service_id,
            proto: d.proto,
            vip: d.vip,
            backend_id: d.backend_id,
            backend: d.backend,
        };
        let slot = d.backend_id.0 as usize % RECENT;
        if self.recent[slot] == Some((seen, self.changes)) {
            return;
        }
        self.add_new(d);
        self.recent[slot] = Some((seen, self.changes));
    }

    /// [`add`](Self::add) of a flow that may change something.
    fn add_new(&mut self, d: &flowtable::FlowData) {
        let frontend = Frontend::of_flow(d);
        let key = (d.service_id, frontend, d.backend_id, d.backend);
        let at = (d.service_id, d.backend);
        let taken = match self.done.get(&key) {
            // A repeat changes nothing unless another id took its address since.
            Some(&taken) => {
                if !taken || self.id_at.get(&at) == Some(&d.backend_id) {
                    return;
                }
                taken
            }
            None => {
                self.changes += 1;
                let s = self.out.services.entry(d.service_id).or_default();
                if let Some(f) = frontend {
                    s.frontends.insert(f);
                }
                let taken = *self.first_at.entry(d.backend_id).or_insert(d.backend) == d.backend;
                self.done.insert(key, taken);
                taken
            }
        };
        if taken {
            self.changes += 1;
            (self.out.services.entry(d.service_id).or_default().backends)
                .insert(d.backend, d.backend_id);
            self.id_at.insert(at, d.backend_id);
        }
    }

    /// Flows added.
    pub fn flows(&self) -> usize {
        self.flows
    }

    /// The ids of the flows added.
    pub fn finish(self) -> AdoptedIds {
        self.out
    }
}

/// What the builder keeps of adopted ids until they are claimed or settled.
#[derive(Debug, Default)]
pub(super) struct Adopted {
    /// Unclaimed adopted service ids by frontend.
    by_frontend: HashMap<Frontend, u32>,
    /// Unclaimed adopted service ids, with their frontends.
    unclaimed: BTreeMap<u32, BTreeSet<Frontend>>,
    /// Adopted backend ids not yet given to a backend, by (service id, address).
    backends: HashMap<(u32, SocketAddr), BackendId>,
}

/// What a build took from the adopted ids (given back if it fails).
#[derive(Debug, Default)]
pub(super) struct AdoptedUndo {
    services: Vec<(u32, BTreeSet<Frontend>)>,
    backends: Vec<((u32, SocketAddr), BackendId)>,
}

impl AdoptedUndo {
    /// How many backend ids were claimed so far.
    pub(super) fn backends_taken(&self) -> usize {
        self.backends.len()
    }

    /// The backend ids claimed after the first `taken`, taken out of this undo.
    pub(super) fn backends_since(&mut self, taken: usize) -> AdoptedUndo {
        AdoptedUndo {
            services: Vec::new(),
            backends: self.backends.split_off(taken),
        }
    }
}

impl SnapshotBuilder {
    /// Reserves the ids of an adopted flow table (see the module doc). Call before the first
    /// build; backend ids at or above `backends_max` are ignored (their flows cannot be
    /// counted). A service id at or above [`SERVICE_IDS_MAX`] is not reserved (a slot is
    /// kept for every id below the highest: a damaged table must not make that unbounded)
    /// and no service takes it; its backend ids are reserved, then retired at the settle,
    /// so the removal pass ends or re-steers its flows.
    pub fn adopt(&mut self, ids: &AdoptedIds) {
        let max_sid = ids.services.range(..SERVICE_IDS_MAX).next_back();
        if let Some((&max, _)) = max_sid {
            let n = max as usize + 1;
            while self.slots.len() < n {
                self.slots.push(None);
                self.seen.push(0);
            }
            let taken: BTreeSet<u32> = ids.services.keys().copied().collect();
            // Lowest first out of the free list.
            self.free_ids = (0..n as u32).rev().filter(|i| !taken.contains(i)).collect();
        }
        let backend_ids: BTreeSet<u32> = ids
            .services
            .values()
            .flat_map(|s| s.backends.values().map(|b| b.0))
            .filter(|b| *b < self.backends_max)
            .collect();
        if let Some(&max) = backend_ids.iter().next_back() {
            self.next = self.next.max(max + 1);
            self.free = (0..self.next)
                .rev()
                .filter(|i| !backend_ids.contains(i))
                .map(BackendId)
                .collect();
        }
        for (&sid, s) in &ids.services {
            if sid < SERVICE_IDS_MAX {
                for f in &s.frontends {
                    self.adopted.by_frontend.entry(*f).or_insert(sid);
                }
                self.adopted.unclaimed.insert(sid, s.frontends.clone());
            }
            for (&addr, &id) in &s.backends {
                if id.0 < self.backends_max {
                    self.adopted.backends.insert((sid, addr), id);
                }
            }
        }
    }

    /// The adopted service id a new service with `frontends` takes, if any.
    pub(super) fn claim_adopted_service(
        &mut self,
        frontends: &[Frontend],
        undo: &mut Undo,
    ) -> Option<u32> {
        if self.adopted.unclaimed.is_empty() {
            return None;
        }
        let sid = frontends
            .iter()
            .find_map(|f| self.adopted.by_frontend.get(f).copied())
            .filter(|sid| self.adopted.unclaimed.contains_key(sid))?;
        let fronts = self.adopted.unclaimed.remove(&sid)?;
        for f in &fronts {
            self.adopted.by_frontend.remove(f);
        }
        undo.adopted.services.push((sid, fronts));
        Some(sid)
    }

    /// The adopted id of a backend new to service `sid` at `addr`, if any.
    pub(super) fn claim_adopted_backend(
        &mut self,
        sid: u32,
        addr: SocketAddr,
        undo: &mut Undo,
    ) -> Option<BackendId> {
        if self.adopted.backends.is_empty() {
            return None;
        }
        let id = self.adopted.backends.remove(&(sid, addr))?;
        undo.adopted.backends.push(((sid, addr), id));
        Some(id)
    }

    /// Gives back what a failed build claimed.
    pub(super) fn unclaim_adopted(&mut self, undo: AdoptedUndo) {
        for (sid, fronts) in undo.services {
            for f in &fronts {
                self.adopted.by_frontend.insert(*f, sid);
            }
            self.adopted.unclaimed.insert(sid, fronts);
        }
        self.adopted.backends.extend(undo.backends);
    }

    /// Ends the adoption once the source has described every service: adopted backend ids
    /// nothing claimed are retired (the removal policy handles their flows; the ids return
    /// when no flow holds them), unclaimed service ids are freed. Returns how many backend
    /// ids were retired.
    pub fn settle_adopted(&mut self) -> usize {
        let backends = std::mem::take(&mut self.adopted.backends);
        let n = backends.len();
        for ((sid, addr), id) in backends {
            // Under the name of the service that has the id now, so that a backend coming
            // back to it gets its id again; a placeholder no service is named for the rest.
            let name = match self.slots.get(sid as usize).and_then(Option::as_ref) {
                Some(slot) => slot.spec.name.clone(),
                None => format!("\u{0}adopted:{sid}"),
            };
            self.retired.insert((name, addr), id);
        }
        let unclaimed = std::mem::take(&mut self.adopted.unclaimed);
        self.adopted.by_frontend.clear();
        self.free_ids.extend(unclaimed.into_keys().rev());
        n
    }

    /// Whether adopted ids wait to be claimed or settled.
    pub fn adopting(&self) -> bool {
        !self.adopted.unclaimed.is_empty() || !self.adopted.backends.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use flowtable::{FlowData, FlowTableConfig, TcpFlags};

    use super::*;
    use crate::snapshot::{BackendSpec, L2Table, ServiceSpec, Snapshot};

    const CFG: &str = r#"
[dataplane]
snat_addresses = ["198.18.1.254"]
[[services]]
name = "a"
vip = "198.18.100.1"
port = 80
protocol = "tcp"
backends = [{ addr = "198.18.1.1:8080" }, { addr = "198.18.1.2:8080" }]
[[services]]
name = "b"
vip = "198.18.100.2"
port = 53
protocol = "udp"
backends = [{ addr = "198.18.1.3:53" }, { addr = "198.18.1.4:53" }, { addr = "198.18.1.5:53" }]
"#;

    fn ids(snap: &Snapshot, name: &str) -> (u32, Vec<(SocketAddr, u32)>) {
        let s = snap.services.iter().find(|s| s.name == name).unwrap();
        (s.id, s.backends.iter().map(|b| (b.addr, b.id.0)).collect())
    }

    /// One flow to every backend of `snap`.
    fn table_of(snap: &Snapshot) -> FlowTable {
        let t = FlowTable::new(FlowTableConfig::new(256, 64), Instant::now()).unwrap();
        for (i, s) in snap.services.iter().enumerate() {
            let f = s.frontends[0];
            for (j, b) in s.backends.iter().enumerate() {
                let d = FlowData {
                    proto: f.protocol,
                    client: SocketAddr::new([198, 18, 0, 2].into(), 1000 + (10 * i + j) as u16),
                    vip: SocketAddr::new(f.vip, f.port),
                    backend: b.addr,
                    snat: SocketAddr::new([198, 18, 1, 254].into(), 2000 + (10 * i + j) as u16),
                    service_id: s.id,
                    backend_id: b.id,
                    snapshot_gen: 1,
                    flags: 0,
                };
                t.insert(&d, TcpFlags::SYN, t.tick(Instant::now())).unwrap();
            }
        }
        t
    }

    /// The summary of repeated flows ends as a flow-by-flow one does: an address two ids
    /// held takes the id of the last flow at it in table order, though that flow repeats
    /// an earlier one; a backend id's first address keeps it (a second is not taken).
    #[test]
    fn the_ids_of_repeated_flows_are_those_of_the_last_flow_at_an_address() {
        let t = FlowTable::new(FlowTableConfig::new(64, 64), Instant::now()).unwrap();
        let x: SocketAddr = "198.18.1.1:80".parse().unwrap();
        let y: SocketAddr = "198.18.1.2:80".parse().unwrap();
        // Backend ids at x: 1, 2, then 1 again (a repeat of the first flow's tuple); id 3
        // first at y, then at x.
        for (i, (addr, id)) in [(x, 1), (x, 2), (x, 1), (y, 3), (x, 3)].iter().enumerate() {
            let d = FlowData {
                proto: flowtable::Protocol::Tcp,
                client: SocketAddr::new([198, 18, 0, 2].into(), 1000 + i as u16),
                vip: "198.18.100.1:80".parse().unwrap(),
                backend: *addr,
                snat: SocketAddr::new([198, 18, 0, 2].into(), 1000 + i as u16),
                service_id: 7,
                backend_id: BackendId(*id),
                snapshot_gen: 1,
                flags: 0,
            };
            t.insert(&d, TcpFlags::SYN, t.tick(Instant::now())).unwrap();
        }
        let mut order = Vec::new();
        t.scan(0, t.capacity(), |v| order.push(v.data.backend_id.0));
        assert_eq!(order, [1, 2, 1, 3, 3], "flows fill the entries in order");
        let ids = AdoptedIds::from_flows(&t);
        // Fed again and again (what the collector remembers of recent flows, by backend
        // id, must not hide that another id took an address since): the same ids, every
        // flow counted.
        let mut c = IdsCollector::default();
        for _ in 0..3 {
            t.scan(0, t.capacity(), |v| c.add(&v.data));
        }
        assert_eq!(c.flows(), 15);
        assert_eq!(c.finish(), ids);
        let s = &ids.services[&7];
        assert_eq!(s.backends.get(&x), Some(&BackendId(1)));
        assert_eq!(s.backends.get(&y), Some(&BackendId(3)));
        assert_eq!(s.frontends.len(), 1);
        assert_eq!(ids.backends(), 2);
    }

    #[test]
    fn ids_no_service_has_are_bounded_and_retired() {
        // A damaged (or foreign) table: a service id far past any real one, one no config
        // has, backend ids nothing claims.
        let cfg = config::parse(CFG, "t.toml").unwrap();
        let mut ids = AdoptedIds::default();
        let front = |port| Frontend {
            vip: "198.18.100.9".parse().unwrap(),
            protocol: flowtable::Protocol::Tcp,
            port,
        };
        for (sid, bid, port) in [
            (SERVICE_IDS_MAX + 7, 3, 1),
            (SERVICE_IDS_MAX, 4, 2),
            (40, 5, 3),
        ] {
            let s = ids.services.entry(sid).or_default();
            s.frontends.insert(front(port));
            let addr = SocketAddr::new("198.18.9.9".parse().unwrap(), port);
            s.backends.insert(addr, BackendId(bid));
        }
        let mut b = SnapshotBuilder::from_config(&cfg);
        b.adopt(&ids);
        // Slots for ids up to 40 only, not for the ids past the bound.
        assert_eq!(b.slots.len(), 41);
        let snap = b.build_config(&cfg).unwrap();
        assert!(snap.services.iter().all(|s| s.id < 40), "40 stays reserved");
        let taken: Vec<u32> = snap
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(|b| b.id.0))
            .collect();
        assert!(taken.iter().all(|id| !(3..=5).contains(id)), "{taken:?}");
        // Every backend id retired: the removal pass ends their flows, then frees them.
        assert_eq!(b.settle_adopted(), 3);
        let mut retired: Vec<BackendId> = b.retired().collect();
        retired.sort();
        assert_eq!(retired, vec![BackendId(3), BackendId(4), BackendId(5)]);
        // After the settle, 40 is free again and the builder keeps working.
        b.build_config(&cfg).unwrap();
    }

    #[test]
    fn a_new_builder_gives_adopted_flows_their_ids_back() {
        let cfg = config::parse(CFG, "t.toml").unwrap();
        let specs = ServiceSpec::from_config(&cfg);
        // The first process: a service "x" first, so "a" and "b" do not get ids 0 and 1.
        let mut first = SnapshotBuilder::from_config(&cfg);
        let mut with_x = specs.clone();
        let mut x = specs[0].clone();
        x.name = "x".into();
        x.frontends[0].port = 8080;
        x.backends = vec![BackendSpec {
            addr: "198.18.1.9:80".parse().unwrap(),
            weight: 1,
            usable: true,
        }];
        with_x.insert(0, x);
        let old = first.build(&with_x, &L2Table::default()).unwrap();
        let table = table_of(&old);
        let adopted = AdoptedIds::from_flows(&table);
        assert_eq!(adopted.services.len(), 3);
        assert_eq!(adopted.backends(), 6);

        // The next process: no "x" yet, the services in another order, "b" lost .5 and
        // gained .6, and a new service "c".
        let mut next = SnapshotBuilder::from_config(&cfg);
        next.adopt(&adopted);
        assert!(next.adopting());
        let mut now = specs.clone();
        now.reverse();
        now[0]
            .backends
            .retain(|b| b.addr.port() != 53 || b.addr.ip().to_string() != "198.18.1.5");
        now[0].backends.push(BackendSpec {
            addr: "198.18.1.6:53".parse().unwrap(),
            weight: 1,
            usable: true,
        });
        let mut c = specs[0].clone();
        c.name = "c".into();
        c.frontends[0].port = 443;
        c.backends[0].addr = "198.18.1.7:443".parse().unwrap();
        c.backends.truncate(1);
        now.push(c);
        let new = next.build(&now, &L2Table::default()).unwrap();
        for name in ["a", "b"] {
            let (old_sid, old_b) = ids(&old, name);
            let (new_sid, new_b) = ids(&new, name);
            assert_eq!(old_sid, new_sid, "service {name} keeps its id");
            for (addr, id) in &new_b {
                match old_b.iter().find(|(a, _)| a == addr) {
                    Some((_, old_id)) => assert_eq!(id, old_id, "{name} {addr} keeps its id"),
                    None => assert!(
                        old.services
                            .iter()
                            .all(|s| s.backends.iter().all(|b| b.id.0 != *id)),
                        "new backend {addr} took an adopted id {id}"
                    ),
                }
            }
        }
        let (c_sid, c_b) = ids(&new, "c");
        assert!(
            old.services.iter().all(|s| s.id != c_sid),
            "c took an adopted service id"
        );
        assert!(
            old.services
                .iter()
                .all(|s| s.backends.iter().all(|b| b.id != BackendId(c_b[0].1)))
        );
        // Nothing retired yet: unclaimed ids stay reserved until the source settles.
        assert_eq!(next.retired().count(), 0);
        assert_eq!(next.settle_adopted(), 2, "x's backend and b's .5");
        let (_, x_b) = ids(&old, "x");
        let (_, b_b) = ids(&old, "b");
        let gone: BTreeSet<u32> = [
            x_b[0].1,
            b_b.iter()
                .find(|(a, _)| a.port() == 53 && a.ip().to_string() == "198.18.1.5")
                .unwrap()
                .1,
        ]
        .into_iter()
        .collect();
        let retired: BTreeSet<u32> = next.retired().map(|b| b.0).collect();
        assert_eq!(retired, gone);
        assert!(!next.adopting());
        // .5 comes back to b: its old id again.
        now[0].backends.push(BackendSpec {
            addr: "198.18.1.5:53".parse().unwrap(),
            weight: 1,
            usable: true,
        });
        let back = next.build(&now, &L2Table::default()).unwrap();
        let (_, b_back) = ids(&back, "b");
        let five = b_back
            .iter()
            .find(|(a, _)| a.ip().to_string() == "198.18.1.5")
            .unwrap()
            .1;
        assert!(gone.contains(&five));
    }
}
