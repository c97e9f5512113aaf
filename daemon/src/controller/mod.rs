//! The sans-IO controller: what the daemon decides, with no threads, sockets, files or clock.
//!
//! Events come in ([`Controller::handle`]: a model from the Kubernetes source, health and
//! neighbour changes, a reloaded config, a signal, the driver's acknowledgement of a publish;
//! [`Controller::command`]: an admin command), time passes ([`Controller::tick`] with `now` and
//! a sample of the workers' counters), and actions go out ([`Controller::poll_action`]):
//! publish a snapshot and steer for it, tell the health checker its targets or a passive
//! failure, solicit a next hop, serve health-check node ports, load the config file, update
//! the status `/healthz` answers from, stop. The driver ([`crate::driver`]) does the I/O.
//!
//! The flow table, the SYN watch and the published snapshots are shared memory, not I/O: the
//! controller reads them and applies the endpoint-removal policy ([`removal`]) to the flow
//! table itself, so the whole policy runs in tests on an in-memory table, with a fake clock
//! and without root, like quinn-proto's connection tests.
//!
//! # Rules
//!
//! - **Publish.** Every change (model, health, neighbours, reload, freeze) marks the state
//!   dirty; the next `tick` builds one snapshot of everything and emits
//!   [`Action::Publish`]. The driver stores it, steers for it and answers
//!   [`Event::Published`]; only then is the publish a sync, and the first removal pass runs.
//!   The build leaves out each spec the builder cannot build (keeping its previous version
//!   when it had one: `SnapshotBuilder::build_isolated`), so one bad service never holds
//!   back the others; what was refused, by the builder or by the source, is in
//!   [`Status::refused`] ([`refused`]).
//! - **Endpoint removal** ([`removal`]): a backend that vanished from the Kubernetes source
//!   acts as removed only once it has been absent for `[flowtable] removal_grace`
//!   (control-plane churn must not end flows); one the operator removed (a static reload) or
//!   that health checks judged down is removed at the publish that drops it, with no grace.
//!   Then its flows are handled at once and by a second pass [`SECOND_PASS`] later
//!   (catching flows a worker inserted with the previous snapshot meanwhile); only after the
//!   second pass are its id handed back to the builder, if no flow holds it. Passes also run
//!   after every publish, for the ids already past their grace.
//! - **Adoption** ([`Controller::adopting`]): a flow table adopted from an earlier process
//!   keeps its ids: the builder gives them back to the same services and backends; once the
//!   source is ready, the ids nothing claimed are retired like removed backends.
//! - **Ready.** Until the configured source has produced its first model and that model was
//!   published, [`Status::not_ready`] says why, and `/healthz` and `/livez` answer 503
//!   (kube-proxy waits for its first sync the same way). The static source is ready at once.
//! - **Sync age.** With nothing to publish, a periodic pass every `sync_period` emits
//!   [`Action::Synced`], so an idle but live slowpath stays healthy (kube-proxy's
//!   `lastUpdated`), and [`Status::pending_since`] says how long a change has waited.
//! - **Drain.** The first stop signal drains ([`drain`]): `/healthz` turns 503, traffic keeps
//!   flowing, and the daemon stops when no established flow is left and nothing was forwarded
//!   for a second, or at `[dataplane] drain_timeout`. A second signal (or a zero timeout)
//!   stops at once. `drain` through the admin API turns `/healthz` 503 without stopping.
//!   Either withdraws every BGP route of the node.
//! - **BGP** (`[bgp]`, see [`bgp`]): once ready, the include file for BIRD is emitted
//!   ([`Action::Announce`]) whenever what the node announces changes; nothing while
//!   draining, and nothing before a stop.
//! - **Reload.** SIGHUP or a change of the file asks the driver to load it
//!   ([`Action::LoadConfig`]). Only a complete, valid file replaces the running config; any
//!   other is refused (logged with the reason, counted in `reloads_failed`) and the running
//!   one stays, services and flows untouched. Refused ([`Controller::refusal`]): a file that
//!   does not load; an empty one (only whitespace or comments); one whose last line has no
//!   newline (cut mid-line: `port = 8` of `port = 8080` still parses); one that adds or
//!   removes `[kubernetes]`; one that changes `[bgp] enable` or `liveness_device`; one whose
//!   `[dataplane]` differs from the running one (named key
//!   by key: the dataplane changes only with a restart; a file cut before its `[dataplane]`
//!   lands here too); and, for the static source, one with no services while services run,
//!   unless it says `services = []` (a file cut before its first `[[services]]`). Services and
//!   pinned neighbours take effect. With the Kubernetes source the services come from the
//!   API, so a reload does not touch them.
//! - **Passive health and neighbours**, once a second: backends whose SYNs got no SYN-ACK
//!   ([`passive`]) are reported to the health checker; next hops the snapshot cannot resolve
//!   are solicited.

mod bgp;
mod drain;
mod health;
pub mod passive;
pub mod refused;
pub mod removal;
mod steer;
#[cfg(test)]
mod testlab;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_adopt;
#[cfg(test)]
mod tests_bgp;
#[cfg(test)]
mod tests_refused;
#[cfg(test)]
mod tests_removal;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use config::{Config, RemovedBackendPolicy, Written};
use fastpath::passive::SynWatch;
use fastpath::snapshot::{AdoptedIds, L2Table, Neighbour, ServiceSpec, Snapshot, SnapshotBuilder};
use flowtable::FlowTable;
use lb_algos::ConnCounts;
use slowpath::k8s::{HealthCheckNodePort, K8sModel};

pub use drain::{Drain, QUIET};
pub use passive::{PASSIVE_MIN_SYNS, PassiveHealth};
pub use refused::{Refusal, Refusals};
pub use removal::{Removal, Retirees, end_removed_flows, reclaim_ids};
pub use steer::{SteerKey, SteerSet};

/// The second removal pass runs this long after a publish.
pub const SECOND_PASS: Duration = Duration::from_secs(1);
/// Passive health samples and neighbour solicitations run this often.
pub const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// The periodic sync pass of the static source (kube-proxy's default `--sync-period`).
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);

/// What happens to the controller.
#[derive(Debug)]
pub enum Event {
    /// A new model from the Kubernetes source.
    Model(Box<K8sModel>),
    /// The health checker's judgements changed: every target's ([`health`]).
    Health(HashMap<slowpath::health::Target, slowpath::health::Judgement>),
    /// Routes and neighbours changed.
    L2(L2Table),
    /// The config file, as the driver read it after [`Action::LoadConfig`].
    Reload(Reload),
    /// A signal.
    Signal(Signal),
    /// The driver stored the snapshot of generation `generation` (from [`Action::Publish`])
    /// where the workers load it, and steered for it; `steer_error` says why steering failed,
    /// if it did (the snapshot is live either way).
    Published {
        /// The snapshot's generation.
        generation: u64,
        /// Why writing the steering maps failed.
        steer_error: Option<String>,
    },
}

/// The config file, read.
#[derive(Debug)]
pub enum Reload {
    /// It loaded and validated; what it wrote explicitly says whether it is complete.
    Loaded(Box<Config>, Written),
    /// It did not: the problems, as `config` words them (key, line, column).
    Invalid(String),
    /// The daemon runs on the embedded config: there is no file.
    NoFile,
}

/// Signals the daemon acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM or SIGINT: the first drains, the second stops.
    Stop,
    /// SIGHUP, or the file changed: reload.
    Reload,
}

/// An admin command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Refuse every new flow, or (with a name) those of one service: its name, or a
    /// Kubernetes `namespace/name` covering every port of it.
    Freeze(Option<String>),
    /// Undo a freeze (of the node, or of the named service).
    Unfreeze(Option<String>),
    /// `/healthz` answers 503 and the BGP routes are withdrawn; traffic still flows.
    Drain,
    /// Undo [`Command::Drain`].
    Undrain,
}

/// What the workers' counters said at a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Frames transmitted by all workers so far.
    pub tx_frames: u64,
    /// Every worker thread still runs.
    pub workers_running: bool,
}

/// Why the daemon stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The drain after a stop signal finished: why.
    Drained(String),
    /// A stop signal with no drain (a second signal, or `drain_timeout = "0s"`).
    Signal,
    /// A worker thread ended: a failure.
    WorkerExited,
    /// A newer process took the sockets over (`xvs run --takeover`): the driver's
    /// business, never the controller's.
    TakenOver,
}

/// What the controller asks the driver to do, in order.
#[derive(Debug)]
pub enum Action {
    /// Store `snapshot` where the workers load it, write `steering` into the steering maps,
    /// then answer [`Event::Published`].
    Publish {
        /// The new snapshot.
        snapshot: Arc<Snapshot>,
        /// What the steering programs must redirect for it.
        steering: SteerSet,
        /// The `last-change-trigger-time`s of the EndpointSlice changes this snapshot is the
        /// first to carry: the driver observes network programming latency from each to the
        /// moment the snapshot is stored (wall clock, like kube-proxy).
        trigger_times: Vec<std::time::SystemTime>,
    },
    /// A periodic pass found nothing to publish: record it as a sync.
    Synced,
    /// What the health checker probes (sent when it changes).
    HealthTargets(Arc<slowpath::health::Plan>),
    /// A passive health failure of one backend (counts as one failed probe).
    HealthFailure(SocketAddr),
    /// Ask the kernel to resolve this next hop.
    Solicit(IpAddr),
    /// The health-check node ports to serve (`externalTrafficPolicy: Local`).
    HealthCheckNodePorts(Vec<HealthCheckNodePort>),
    /// Read the config file and answer [`Event::Reload`].
    LoadConfig,
    /// The status changed: what `/healthz`, `/livez` and `/v1/stats` show.
    Status(Status),
    /// Write this include file for BIRD and have BIRD reconfigure; open the liveness device
    /// (once) after the first ([`bgp`]).
    Announce(slowpath::bgp::Include),
    /// Stop the daemon (and close the liveness device first: BIRD withdraws everything).
    Stop(StopReason),
}

/// What the admin surface shows of the controller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// Why the node is not ready yet (no first snapshot from its source): `/healthz` and
    /// `/livez` answer 503 with this.
    pub not_ready: Option<String>,
    /// `/healthz` answers 503: an admin drain, or the drain after a stop signal.
    pub draining: bool,
    /// Every new flow refused.
    pub frozen: bool,
    /// Services refused new flows, by name.
    pub frozen_services: Vec<String>,
    /// Since when a change has waited to be published.
    pub pending_since: Option<Instant>,
    /// UDP flows removed so they are scheduled again.
    pub flows_resteered: u64,
    /// TCP/SCTP flows of removed backends ended.
    pub flows_ended: u64,
    /// Reloads applied.
    pub reloads_ok: u64,
    /// Reloads refused (the running config stayed).
    pub reloads_failed: u64,
    /// Publishes whose steering failed.
    pub publish_failures: u64,
    /// What is not programmed as the source describes it, and why (see [`refused`]).
    pub refused: Arc<Vec<Refusal>>,
    /// Refusals reported since the start, by kind.
    pub refused_total: std::collections::BTreeMap<&'static str, u64>,
}

/// The daemon's decisions (see the module doc).
pub struct Controller {
    cfg: Config,
    builder: SnapshotBuilder,
    /// Services as the source describes them, before health and freezes are applied.
    specs: Vec<ServiceSpec>,
    /// The health checker's judgements ([`health`]).
    health: health::HealthState,
    /// `[health]` as the daemon started with it: every service's health-check defaults
    /// (the checker's settings are not reloaded; a service's own keys are).
    health_defaults: config::Health,
    l2: L2Table,
    /// The last snapshot built (and, once acknowledged, published).
    current: Option<Arc<Snapshot>>,
    flows: Arc<FlowTable>,
    syn_watch: Arc<SynWatch>,
    passive: PassiveHealth,
    frozen: bool,
    frozen_services: BTreeSet<String>,
    admin_drain: bool,
    stop_signals: u32,
    drain: Option<Drain>,
    stopping: bool,
    /// Since when a change waits for the next publish.
    dirty_since: Option<Instant>,
    /// Trigger times of the models received since the last snapshot built.
    trigger_times: Vec<std::time::SystemTime>,
    /// The publish the driver has not acknowledged yet: (generation, since when its
    /// changes waited).
    awaiting: Option<(u64, Instant)>,
    second_pass: Option<Instant>,
    /// Retired backend ids in or past their removal grace.
    retirees: Retirees,
    /// Ids the snapshot awaiting its acknowledgement removed explicitly: no grace
    /// ([`removal`]).
    expedite: HashSet<lb_algos::BackendId>,
    /// `[flowtable] removal_grace`.
    grace: Duration,
    last_sync: Option<Instant>,
    next_housekeeping: Instant,
    sync_period: Duration,
    /// The configured source has produced its first model.
    source_ready: bool,
    /// ...and it has been published.
    synced_once: bool,
    /// Flow sync's start-up dumps are in (always, without `[sync]`).
    peers_ready: bool,
    counters: Status,
    refusals: Refusals,
    /// The status last emitted.
    emitted: Option<Status>,
    /// This node's interface addresses (never announced: NodePort frontends).
    node_addresses: Vec<IpAddr>,
    /// The include file last emitted ([`bgp`]).
    announced: Option<slowpath::bgp::Include>,
    /// What it was rendered from: snapshot generation, draining, reloads applied, the
    /// health epoch.
    announce_inputs: Option<(u64, bool, u64, u64)>,
    actions: VecDeque<Action>,
}

impl Controller {
    /// A controller for `cfg` at `now`, over the shared flow table and SYN watch, with the
    /// kernel's routes and neighbours as read at start. The first [`Controller::tick`]
    /// publishes the first snapshot.
    pub fn new(
        cfg: Config,
        flows: Arc<FlowTable>,
        syn_watch: Arc<SynWatch>,
        l2: L2Table,
        now: Instant,
    ) -> Controller {
        Self::adopting(cfg, flows, syn_watch, l2, now, None)
    }

    /// [`Controller::new`] over a flow table adopted from an earlier process, whose flows
    /// hold `adopted` ids: the builder gives them back to the same services and backends,
    /// and once the source has described every service, those that did not come back go
    /// through the removal policy (after the grace, like any removed backend).
    pub fn adopting(
        cfg: Config,
        flows: Arc<FlowTable>,
        syn_watch: Arc<SynWatch>,
        l2: L2Table,
        now: Instant,
        adopted: Option<&AdoptedIds>,
    ) -> Controller {
        let specs = ServiceSpec::from_config(&cfg);
        let mut builder = SnapshotBuilder::from_config(&cfg);
        if let Some(ids) = adopted {
            builder.adopt(ids);
        }
        let sync_period = cfg
            .kubernetes
            .as_ref()
            .map_or(DEFAULT_SYNC_PERIOD, |k| k.sync_period.get());
        let source_ready = cfg.kubernetes.is_none();
        let mut c = Controller {
            builder,
            specs,
            health: health::HealthState::default(),
            health_defaults: cfg.health.clone(),
            l2,
            current: None,
            flows,
            syn_watch,
            passive: PassiveHealth::default(),
            frozen: false,
            frozen_services: BTreeSet::new(),
            admin_drain: false,
            stop_signals: 0,
            drain: None,
            stopping: false,
            dirty_since: Some(now),
            trigger_times: Vec::new(),
            awaiting: None,
            second_pass: None,
            retirees: Retirees::default(),
            expedite: HashSet::new(),
            grace: cfg.removal_grace(),
            last_sync: None,
            next_housekeeping: now,
            sync_period,
            source_ready,
            synced_once: false,
            peers_ready: !cfg.sync.enable,
            counters: Status::default(),
            refusals: Refusals::default(),
            emitted: None,
            node_addresses: Vec::new(),
            announced: None,
            announce_inputs: None,
            actions: VecDeque::new(),
            cfg,
        };
        c.send_health_targets();
        c
    }

    /// The next action to perform, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether a change waits for the next tick to be published (one an action brought in,
    /// such as the config an [`Action::LoadConfig`] read): the driver ticks again at once
    /// instead of sleeping, so a reload takes effect within milliseconds.
    pub fn publish_due(&self) -> bool {
        self.dirty_since.is_some() && self.awaiting.is_none() && !self.stopping
    }

    /// The snapshot last built.
    pub fn snapshot(&self) -> Option<&Arc<Snapshot>> {
        self.current.as_ref()
    }

    /// How often a sync happens with nothing to publish (`[kubernetes] sync_period`, else
    /// [`DEFAULT_SYNC_PERIOD`]); `/healthz` allows twice this.
    pub fn sync_period(&self) -> Duration {
        self.sync_period
    }

    /// The running config (its `[dataplane]` is the one the daemon started with).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The status as of now (also emitted as [`Action::Status`] when it changes).
    pub fn status(&self) -> Status {
        let mut s = self.counters.clone();
        s.not_ready = self.not_ready();
        s.draining = self.admin_drain || self.drain.is_some();
        s.frozen = self.frozen;
        s.frozen_services = self.frozen_services.iter().cloned().collect();
        s.refused = self.refusals.list();
        s.refused_total = self.refusals.total();
        s.pending_since = match (self.dirty_since, self.awaiting) {
            (Some(d), Some((_, a))) => Some(d.min(a)),
            (d, a) => d.or(a.map(|(_, since)| since)),
        };
        s
    }

    fn not_ready(&self) -> Option<String> {
        if !self.source_ready {
            Some(
                "waiting for the first sync of the Kubernetes source (every watch listed)"
                    .to_owned(),
            )
        } else if !self.synced_once {
            Some("the first snapshot is not published yet".to_owned())
        } else {
            None
        }
    }

    fn mark_dirty(&mut self, now: Instant) {
        self.dirty_since.get_or_insert(now);
    }

    /// Takes in one event at `now`.
    pub fn handle(&mut self, now: Instant, event: Event) {
        match event {
            Event::Model(model) => {
                let model = *model;
                self.trigger_times.extend(model.trigger_times);
                self.actions
                    .push_back(Action::HealthCheckNodePorts(model.health_check_node_ports));
                self.refusals.set_source(&model.problems);
                self.builder.set_service_cidrs(&model.service_cidrs);
                self.specs = model.specs;
                self.send_health_targets();
                self.source_ready = true;
                self.mark_dirty(now);
            }
            Event::Health(states) => {
                // A first passing probe changes only what is announced (emitted below).
                if self.health.judged(states) {
                    self.mark_dirty(now);
                }
            }
            Event::L2(l2) => {
                self.l2 = l2;
                self.mark_dirty(now);
            }
            Event::Reload(r) => self.reload(now, r),
            Event::Signal(Signal::Reload) => self.actions.push_back(Action::LoadConfig),
            Event::Signal(Signal::Stop) => self.stop_signal(now),
            Event::Published {
                generation,
                steer_error,
            } => self.published(now, generation, steer_error),
        }
        self.emit_status();
    }

    /// Performs an admin command at `now`; `Err` says why it was refused.
    pub fn command(&mut self, now: Instant, cmd: Command) -> Result<(), String> {
        match cmd {
            Command::Freeze(None) => self.frozen = true,
            Command::Unfreeze(None) => self.frozen = false,
            Command::Freeze(Some(name)) => {
                let known = self
                    .current
                    .as_ref()
                    .is_some_and(|s| s.services.iter().any(|e| names(&name, &e.name)));
                if !known {
                    return Err(format!("no service named {name:?}"));
                }
                self.frozen_services.insert(name);
            }
            Command::Unfreeze(Some(name)) => {
                if !self.frozen_services.remove(&name) {
                    return Err(format!("service {name:?} is not frozen"));
                }
            }
            Command::Drain | Command::Undrain => {
                self.admin_drain = cmd == Command::Drain;
                self.emit_status();
                return Ok(());
            }
        }
        // Freezes live in the snapshot: publish one.
        self.mark_dirty(now);
        self.emit_status();
        Ok(())
    }

    /// Time passes: publishes what changed, runs the removal pass that is due, the periodic
    /// sync, passive health and solicitations, and the drain.
    pub fn tick(&mut self, now: Instant, sample: Sample) {
        if self.stopping {
            return;
        }
        if !sample.workers_running {
            self.stop(StopReason::WorkerExited);
            return;
        }
        if let Some(d) = &mut self.drain {
            let established = self.current.as_deref().map_or(0, |snap| {
                snap.services
                    .iter()
                    .flat_map(|s| s.backends.iter())
                    .map(|b| u64::from(self.flows.active(b.id)))
                    .sum()
            });
            if let Some(why) = d.done(now, sample.tx_frames, established) {
                tracing::info!(target: "xvs", reason = %why, "drain finished");
                self.stop(StopReason::Drained(why));
                return;
            }
        }
        if self.awaiting.is_none() {
            if let Some(since) = self.dirty_since.take() {
                self.publish(since);
            } else if self.synced_once
                && self
                    .last_sync
                    .is_some_and(|t| now.saturating_duration_since(t) >= self.sync_period)
            {
                // A periodic pass that finds nothing to publish still counts as a sync.
                debug_assert!(
                    self.dirty_since.is_none() && self.awaiting.is_none(),
                    "sync-age rule: a periodic sync only when nothing waits to be published"
                );
                self.last_sync = Some(now);
                self.actions.push_back(Action::Synced);
            }
        }
        if self.second_pass.is_some_and(|t| now >= t) {
            debug_assert!(
                self.current.is_some(),
                "removal rule: a second pass follows a publish"
            );
            self.second_pass = None;
            let due = self.end_removed_flows(now);
            let n = reclaim_ids(&self.flows, &mut self.builder, &due);
            if n > 0 {
                self.retirees.update(self.builder.retired(), now);
            }
        } else if self.second_pass.is_none() && self.retirees.newly_due(now, self.grace) {
            // A backend's grace just ended: handle it as removed now (and a second later).
            self.end_removed_flows(now);
            self.second_pass = Some(now + SECOND_PASS);
        }
        if now >= self.next_housekeeping {
            self.next_housekeeping = now + HOUSEKEEPING;
            self.housekeeping();
        }
        self.emit_status();
    }

    fn publish(&mut self, since: Instant) {
        debug_assert!(
            self.awaiting.is_none() && !self.stopping,
            "publish rule: one snapshot at a time (none while one awaits its acknowledgement), none once stopping"
        );
        // Health and per-service freezes are applied to a copy, made only when there is
        // something to apply (10,000 Services: the copy alone would cost milliseconds).
        let adjusted;
        let health = &self.health;
        let specs: &[ServiceSpec] = if !health.any_down() && self.frozen_services.is_empty() {
            &self.specs
        } else {
            let mut v = self.specs.clone();
            for s in &mut v {
                // Health applies to what the source says is usable (readiness stays).
                for b in &mut s.backends {
                    b.usable &= !health.is_down(&s.name, b.addr);
                }
                s.frozen |= self.frozen_services.iter().any(|f| names(f, &s.name));
            }
            adjusted = v;
            &adjusted
        };
        self.builder.set_frozen(self.frozen);
        let l2 = merge_pins(self.l2.clone(), &self.cfg);
        let (snap, refused) = self.builder.build_isolated(specs, &l2);
        self.refusals.set_built(&refused);
        let snap = Arc::new(snap);
        self.note_explicit_removals();
        self.health.forget_left();
        self.awaiting = Some((snap.generation, since));
        self.current = Some(Arc::clone(&snap));
        let mut steering = SteerSet::of(&snap, &self.cfg.dataplane);
        // Replies to the peers' SNAT addresses: their flows, once served here.
        steering
            .snat_addresses
            .extend(self.cfg.sync.peer_snat_addresses());
        self.actions.push_back(Action::Publish {
            snapshot: snap,
            steering,
            trigger_times: std::mem::take(&mut self.trigger_times),
        });
    }

    fn published(&mut self, now: Instant, generation: u64, steer_error: Option<String>) {
        if self.awaiting.is_none_or(|(g, _)| g != generation) {
            tracing::warn!(
                generation,
                "acknowledgement of a publish that was not asked for"
            );
            return;
        }
        debug_assert!(
            self.current
                .as_ref()
                .is_some_and(|s| s.generation == generation),
            "publish rule: the acknowledged snapshot is the one last built"
        );
        self.awaiting = None;
        if let Some(e) = steer_error {
            self.counters.publish_failures += 1;
            tracing::error!(error = %e, generation, "steering for a new snapshot failed");
        }
        if self.source_ready {
            self.synced_once = true;
            if self.builder.adopting() {
                // Every service the source has is in this snapshot: adopted ids that no
                // service or backend claimed belong to what is gone.
                let n = self.builder.settle_adopted();
                debug_assert!(
                    !self.builder.adopting(),
                    "adoption rule: once the source's first model is published, no adopted id waits to be claimed"
                );
                tracing::info!(
                    backends = n,
                    "adopted backend ids of backends that are gone retired"
                );
            }
        }
        debug_assert!(
            self.source_ready || !self.synced_once,
            "ready rule: ready only once the source's first model was published"
        );
        self.last_sync = Some(now);
        self.retirees.update(self.builder.retired(), now);
        self.retirees.expedite(&std::mem::take(&mut self.expedite));
        self.end_removed_flows(now);
        self.second_pass = Some(now + SECOND_PASS);
    }

    /// The endpoint-removal policy over the flow table (see [`removal`]), for the retired
    /// ids whose grace is over at `now`; returns them.
    fn end_removed_flows(&mut self, now: Instant) -> HashSet<lb_algos::BackendId> {
        let due = self.retirees.due(now, self.grace);
        self.retirees.passed(now, self.grace);
        let Some(snap) = &self.current else {
            return due;
        };
        let r = end_removed_flows(
            &self.flows,
            &due,
            snap,
            self.cfg.flowtable.removed_backend_tcp,
        );
        self.counters.flows_resteered += r.resteered;
        self.counters.flows_ended += r.ended;
        if r.resteered + r.ended > 0 {
            tracing::info!(
                resteered_udp = r.resteered,
                ended_tcp_sctp = r.ended,
                "flows of removed backends"
            );
        }
        due
    }

    fn housekeeping(&mut self) {
        debug_assert!(
            !self.stopping,
            "passive-health rule: no housekeeping once stopping"
        );
        let Some(snap) = self.current.clone() else {
            return;
        };
        for ip in unresolved(&snap, &self.l2) {
            self.actions.push_back(Action::Solicit(ip));
        }
        if !self.health.plan().is_empty() {
            for addr in self.passive.sample(&self.syn_watch, &snap) {
                self.actions.push_back(Action::HealthFailure(addr));
            }
        }
    }

    fn stop_signal(&mut self, now: Instant) {
        self.stop_signals += 1;
        let timeout = self.cfg.dataplane.drain_timeout.get();
        if self.stop_signals == 1 && !timeout.is_zero() {
            tracing::info!(
                target: "xvs",
                timeout = ?timeout,
                "draining: /healthz answers 503; stopping when established flows end and traffic stops (signal again to stop now)"
            );
            self.drain = Some(Drain::new(now, timeout));
        } else {
            self.stop(StopReason::Signal);
        }
    }

    fn stop(&mut self, why: StopReason) {
        if !self.stopping {
            self.withdraw_all();
            debug_assert!(
                !self.cfg.bgp.enable
                    || self
                        .announced
                        .as_ref()
                        .is_none_or(|a| a.vips + a.snat + a.backups == 0),
                "drain rule: a stop withdraws every BGP route of the node first"
            );
            self.stopping = true;
            self.actions.push_back(Action::Stop(why));
        }
    }

    /// Why the file `new` (which wrote `written`) cannot replace the running config, if it
    /// cannot: the reload rules of the module doc.
    pub fn refusal(&self, new: &Config, written: &Written) -> Option<String> {
        if let Some(why) = written.incomplete() {
            return Some(why.to_owned());
        }
        if new.kubernetes.is_some() != self.cfg.kubernetes.is_some() {
            let (was, is) = if new.kubernetes.is_some() {
                ("static", "Kubernetes")
            } else {
                ("Kubernetes", "static")
            };
            return Some(format!(
                "the file switches the source from {was} to {is} ([kubernetes]): that needs a restart"
            ));
        }
        if new.bgp.enable != self.cfg.bgp.enable
            || new.bgp.liveness_device != self.cfg.bgp.liveness_device
        {
            return Some(
                "the file changes [bgp] enable or liveness_device: that needs a restart (the other [bgp] keys reload)"
                    .to_owned(),
            );
        }
        if new.sync != self.cfg.sync {
            return Some(
                "the file changes [sync]: flow sync's socket, key and peers change only with a restart"
                    .to_owned(),
            );
        }
        let changed = self.cfg.dataplane.differences(&new.dataplane);
        if !changed.is_empty() {
            let keys = changed.join(", ");
            return Some(if written.has("dataplane") {
                format!(
                    "[dataplane] differs from the running one in {keys}: the dataplane changes only with a restart (put the running values back, or restart xvs)"
                )
            } else {
                format!(
                    "the file has no [dataplane] table while the running one sets {keys} (a truncated file?): the dataplane changes only with a restart"
                )
            });
        }
        if new.kubernetes.is_none()
            && new.services.is_empty()
            && !self.cfg.services.is_empty()
            && !written.has("services")
        {
            return Some(format!(
                "the file has no [[services]] while {} run (a truncated file?): to remove every service, write `services = []`",
                self.cfg.services.len()
            ));
        }
        None
    }

    fn reload(&mut self, now: Instant, r: Reload) {
        let new = match r {
            Reload::Loaded(new, written) => {
                if let Some(why) = self.refusal(&new, &written) {
                    self.counters.reloads_failed += 1;
                    tracing::error!(reason = %why, "reload refused; the running config stays");
                    return;
                }
                *new
            }
            Reload::Invalid(problems) => {
                self.counters.reloads_failed += 1;
                tracing::error!(%problems, "reload refused; the running config stays");
                return;
            }
            Reload::NoFile => {
                self.counters.reloads_failed += 1;
                tracing::warn!("running on the embedded config: there is no file to reload");
                return;
            }
        };
        // `refusal` made sure the dataplane and the source are the running ones.
        debug_assert!(
            self.cfg.dataplane.differences(&new.dataplane).is_empty()
                && new.kubernetes.is_some() == self.cfg.kubernetes.is_some(),
            "reload rule: a reload never changes the dataplane or the source"
        );
        let kubernetes = self.cfg.kubernetes.take();
        self.cfg = new;
        if kubernetes.is_some() {
            // The source was started with its settings; its models stay the services.
            self.cfg.kubernetes = kubernetes;
        } else {
            self.specs = ServiceSpec::from_config(&self.cfg);
            self.send_health_targets();
        }
        self.grace = self.cfg.removal_grace();
        self.counters.reloads_ok += 1;
        tracing::info!(target: "xvs", services = self.specs.len(), "reloaded");
        self.mark_dirty(now);
    }

    fn emit_status(&mut self) {
        let s = self.status();
        if self.emitted.as_ref() != Some(&s) {
            self.emitted = Some(s.clone());
            self.actions.push_back(Action::Status(s));
        }
        self.emit_announcement();
    }

    /// Tells the health checker what to probe when that changed: the backends of every
    /// service whose check (its own keys over `[health]`) is not `none`.
    fn send_health_targets(&mut self) {
        let plan = slowpath::health::Plan::of(&self.specs, &self.health_defaults);
        if self.health.set_plan(plan) {
            let plan = Arc::clone(self.health.plan());
            self.actions.push_back(Action::HealthTargets(plan));
        }
    }

    /// The policy the removal passes apply.
    pub fn removal_policy(&self) -> RemovedBackendPolicy {
        self.cfg.flowtable.removed_backend_tcp
    }
}

/// Whether `filter` names service `name`: the name itself, or (Kubernetes) the
/// `namespace/name` before its `:port`.
pub fn names(filter: &str, name: &str) -> bool {
    name == filter || name.split_once(':').is_some_and(|(svc, _)| svc == filter)
}

/// The kernel's view merged with the config's pinned `[[neighbours]]`: a pin overrides the
/// MAC the kernel has and keeps the port the kernel learnt it on.
fn merge_pins(mut l2: L2Table, cfg: &Config) -> L2Table {
    for pin in &cfg.neighbours {
        match l2.neighbours.iter_mut().find(|n| n.ip == pin.ip) {
            Some(n) => n.mac = pin.mac.0,
            None => l2.neighbours.push(Neighbour {
                ip: pin.ip,
                mac: pin.mac.0,
                port: None,
            }),
        }
    }
    l2
}

/// Next hops the fastpath will need that the kernel has not resolved yet: every backend and
/// every gateway of the configured interfaces' routes (clients off-link are behind one).
fn unresolved(snap: &Snapshot, l2: &L2Table) -> Vec<IpAddr> {
    let gateways = l2.routes.iter().filter_map(|r| r.gateway);
    let mut v: Vec<IpAddr> = snap
        .services
        .iter()
        .flat_map(|s| s.backends.iter().map(|b| b.addr.ip()))
        .chain(gateways)
        .filter(|ip| snap.next_hop(*ip, 0).is_none())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}
