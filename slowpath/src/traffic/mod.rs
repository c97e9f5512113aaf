//! Per-service and per-backend traffic, what `ipvsadm -Ln --stats` and `--rate` show: the
//! workers' [`Traffic`] counters summed, named by the current snapshot, and rates from
//! periodic samples (IPVS's estimator samples every 2 s as well).
//!
//! Backend ids are per (service, backend address) and are reused once a backend has left, so
//! the meter remembers which backend each id counted for: when an id turns up under a new
//! owner, the counts until then (as last sampled) become the new owner's baseline. Counts of a
//! backend that leaves its service stay in the service's totals, so a service's counters only
//! grow for as long as it exists (what Prometheus counters must do).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use fastpath::snapshot::{ServiceEntry, Snapshot};
use fastpath::traffic::{self, Traffic, TrafficCounts};
use lb_algos::BackendId;

/// How often the daemon samples the counters for rates (IPVS's estimator: 2 s).
pub const SAMPLE_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// Rates over the last sampling period, per second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    /// Connections.
    pub cps: f64,
    /// Packets client → backend.
    pub in_pps: f64,
    /// Packets backend → client.
    pub out_pps: f64,
    /// Bytes client → backend.
    pub in_bps: f64,
    /// Bytes backend → client.
    pub out_bps: f64,
}

impl Rates {
    fn of(d: &TrafficCounts, secs: f64) -> Rates {
        let r = |v: u64| v as f64 / secs;
        Rates {
            cps: r(d.conns),
            in_pps: r(d.in_pkts),
            out_pps: r(d.out_pkts),
            in_bps: r(d.in_bytes),
            out_bps: r(d.out_bytes),
        }
    }

    fn add(&self, o: &Rates) -> Rates {
        Rates {
            cps: self.cps + o.cps,
            in_pps: self.in_pps + o.in_pps,
            out_pps: self.out_pps + o.out_pps,
            in_bps: self.in_bps + o.in_bps,
            out_bps: self.out_bps + o.out_bps,
        }
    }
}

/// One backend id's bookkeeping.
#[derive(Clone, Debug)]
struct Meter {
    /// The service and backend address it counts for.
    owner: (String, SocketAddr),
    /// The id's counters (summed over workers) when this owner got it.
    base: TrafficCounts,
    /// The id's counters at the last sample.
    last: TrafficCounts,
    rate: Rates,
    /// Not in the last sampled snapshot: its counts went to its service's retired ones.
    gone: bool,
}

impl Meter {
    fn counts_for(&self, owner: (&str, SocketAddr)) -> bool {
        !self.gone && self.owner.0 == owner.0 && self.owner.1 == owner.1
    }
}

/// The traffic of a service or a backend: totals since it appeared, and rates.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    /// Totals.
    pub counts: TrafficCounts,
    /// Per second, over the last sampling period.
    pub rate: Rates,
}

/// A service's traffic and its backends' (in the snapshot's backend order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceTraffic {
    /// The service: its backends' totals, plus what backends that left it counted.
    pub total: Measured,
    /// Each backend of the snapshot's entry.
    pub backends: Vec<Measured>,
}

/// Sums the workers' counters by service and backend; see the module docs.
#[derive(Debug)]
pub struct TrafficMeter {
    workers: Vec<Arc<Traffic>>,
    ids: HashMap<BackendId, Meter>,
    /// Per service name: the counts of backends that left it.
    retired: HashMap<String, TrafficCounts>,
    last_sample: Option<Instant>,
}

impl TrafficMeter {
    /// A meter over these workers' counters.
    pub fn new(workers: Vec<Arc<Traffic>>) -> TrafficMeter {
        TrafficMeter {
            workers,
            ids: HashMap::new(),
            retired: HashMap::new(),
            last_sample: None,
        }
    }

    fn read(&self, id: BackendId) -> TrafficCounts {
        traffic::sum(self.workers.iter().map(|t| &**t), id)
    }

    /// The baseline of `id` for `owner`: the id's own when it counts for `owner`, else what
    /// it had counted at the last sample (for another owner, or before it left), else zero.
    fn base(&self, id: BackendId, owner: (&str, SocketAddr)) -> TrafficCounts {
        match self.ids.get(&id) {
            Some(m) if m.counts_for(owner) => m.base,
            Some(m) => m.last,
            None => TrafficCounts::default(),
        }
    }

    /// Takes a sample at `now`: rates since the previous one, owners and baselines as
    /// `snap` names them, the counts of backends that left folded into their services.
    pub fn sample(&mut self, snap: &Snapshot, now: Instant) {
        let secs = self
            .last_sample
            .map(|t| now.saturating_duration_since(t).as_secs_f64())
            .filter(|s| *s > 0.0);
        let mut seen: HashSet<BackendId> = HashSet::with_capacity(self.ids.len());
        let mut names: HashSet<&str> = HashSet::new();
        for s in snap.services.iter() {
            names.insert(s.name.as_str());
            for b in &s.backends {
                let cur = self.read(b.id);
                let owner = (s.name.as_str(), b.addr);
                seen.insert(b.id);
                match self.ids.get_mut(&b.id) {
                    Some(m) if m.counts_for(owner) => {
                        if let Some(t) = secs {
                            m.rate = Rates::of(&cur.sub(&m.last), t);
                        }
                        m.last = cur;
                        continue;
                    }
                    Some(m) if !m.gone => {
                        // The id moved on to another owner since the last sample.
                        let r = self.retired.entry(m.owner.0.clone()).or_default();
                        *r = r.add(&m.last.sub(&m.base));
                    }
                    _ => {}
                }
                let base = self
                    .ids
                    .get(&b.id)
                    .map_or_else(TrafficCounts::default, |m| m.last);
                self.ids.insert(
                    b.id,
                    Meter {
                        owner: (s.name.clone(), b.addr),
                        base,
                        last: cur,
                        rate: Rates::default(),
                        gone: false,
                    },
                );
            }
        }
        // Backends that left: their counts stay in their services' totals.
        for (id, m) in self.ids.iter_mut() {
            if !m.gone && !seen.contains(id) {
                m.last = traffic::sum(self.workers.iter().map(|t| &**t), *id);
                let r = self.retired.entry(m.owner.0.clone()).or_default();
                *r = r.add(&m.last.sub(&m.base));
                m.gone = true;
                m.rate = Rates::default();
            }
        }
        self.retired.retain(|name, _| names.contains(name.as_str()));
        self.last_sample = Some(now);
    }

    /// `s`'s traffic now: totals read from the workers' counters at this moment, rates from
    /// the last sample.
    pub fn service(&self, s: &ServiceEntry) -> ServiceTraffic {
        let mut total = Measured {
            counts: self.retired.get(&s.name).copied().unwrap_or_default(),
            rate: Rates::default(),
        };
        let backends = s
            .backends
            .iter()
            .map(|b| {
                let owner = (s.name.as_str(), b.addr);
                let counts = self.read(b.id).sub(&self.base(b.id, owner));
                let rate = match self.ids.get(&b.id) {
                    Some(m) if m.counts_for(owner) => m.rate,
                    _ => Rates::default(),
                };
                total.counts = total.counts.add(&counts);
                total.rate = total.rate.add(&rate);
                Measured { counts, rate }
            })
            .collect();
        ServiceTraffic { total, backends }
    }
}

#[cfg(test)]
mod tests;
