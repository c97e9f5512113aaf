//! The controller on a fake clock: a [`Harness`] plays the driver (it stores each published
//! snapshot in an in-memory pipeline and acknowledges it), and frames go through that
//! pipeline so flows exist in the shared table. No root, no sockets, no threads.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fastpath::pipeline::{Pipeline, PipelineConfig, Verdict};
use fastpath::settings::flow_table_config;
use fastpath::snapshot::{L2Table, Neighbour, Snapshot};
use lb_algos::AffinityTable;

use slowpath::health::Judgement;

use super::testlab::{CFG, dst_of, frame, ip};
use super::*;

/// The controller with a pretend driver around it.
pub(super) struct Harness {
    pub(super) ctl: Controller,
    pub(super) pipeline: Option<Pipeline>,
    pub(super) syn: Arc<SynWatch>,
    pub(super) flows: Arc<FlowTable>,
    pub(super) now: Instant,
    /// Frames the pipeline transmitted (the sample's `tx_frames`).
    pub(super) tx: u64,
    /// Every action performed, in order (publishes as `Published(generation)`).
    pub(super) log: Vec<Seen>,
    pub(super) status: Status,
    pub(super) stopped: Option<StopReason>,
    pub(super) workers_running: bool,
    /// The trigger times of each publish, by generation.
    pub(super) triggers: Vec<(u64, Vec<std::time::SystemTime>)>,
    /// The steering of the last publish.
    pub(super) steering: Option<SteerSet>,
}

/// An action as the harness saw it.
#[derive(Debug, PartialEq)]
pub(super) enum Seen {
    Published(u64),
    Synced,
    HealthTargets(Vec<SocketAddr>),
    HealthFailure(SocketAddr),
    Solicit(IpAddr),
    HealthCheckNodePorts(usize),
    LoadConfig,
    Announce(slowpath::bgp::Include),
}

/// The checker's judgements of backend addresses: every target of the controller's plan
/// with that address (the tests' services share one check).
pub(super) fn judged(h: &Harness, list: &[(&str, Judgement)]) -> Event {
    let plan = Arc::clone(h.ctl.health.plan());
    let mut states = HashMap::new();
    for (a, j) in list {
        let a: SocketAddr = a.parse().unwrap();
        let targets: Vec<_> = plan.targets().iter().filter(|t| t.addr == a).collect();
        assert!(!targets.is_empty(), "{a} is not probed");
        for t in targets {
            states.insert(t.clone(), *j);
        }
    }
    Event::Health(states)
}

pub(super) fn lab_l2() -> L2Table {
    L2Table {
        neighbours: ["198.18.1.1", "198.18.1.2", "198.18.1.3", "198.18.0.2"]
            .iter()
            .map(|ip| Neighbour {
                ip: ip.parse().unwrap(),
                mac: [2, 0, 0, 0, 0, 1],
                port: None,
            })
            .collect(),
        ..L2Table::default()
    }
}

impl Harness {
    pub(super) fn new(text: &str) -> Harness {
        let cfg = config::parse(text, "t.toml").unwrap();
        let now = Instant::now();
        let flows = Arc::new(FlowTable::new(flow_table_config(&cfg), now).unwrap());
        let syn = Arc::new(SynWatch::new(cfg.flowtable.backends_max as usize));
        let ctl = Controller::new(cfg, Arc::clone(&flows), Arc::clone(&syn), lab_l2(), now);
        let mut h = Harness {
            ctl,
            pipeline: None,
            syn,
            flows,
            now,
            tx: 0,
            log: Vec::new(),
            status: Status::default(),
            stopped: None,
            workers_running: true,
            triggers: Vec::new(),
            steering: None,
        };
        h.status = h.ctl.status();
        h
    }

    /// The next process after `first` on config `text`: it adopts `first`'s flow table,
    /// whose flows hold `adopted`.
    pub(super) fn adopting(text: &str, first: &Harness, adopted: &AdoptedIds) -> Harness {
        let cfg = config::parse(text, "t.toml").unwrap();
        let syn = Arc::new(SynWatch::new(cfg.flowtable.backends_max as usize));
        let ctl = Controller::adopting(
            cfg,
            Arc::clone(&first.flows),
            Arc::clone(&syn),
            lab_l2(),
            first.now,
            Some(adopted),
        );
        let mut h = Harness {
            ctl,
            pipeline: None,
            syn,
            flows: Arc::clone(&first.flows),
            now: first.now,
            tx: 0,
            log: Vec::new(),
            status: Status::default(),
            stopped: None,
            workers_running: true,
            triggers: Vec::new(),
            steering: None,
        };
        h.status = h.ctl.status();
        h
    }

    /// Advances the fake clock by `d`, ticks, and performs the actions.
    pub(super) fn step(&mut self, d: Duration) {
        self.now += d;
        let sample = Sample {
            tx_frames: self.tx,
            workers_running: self.workers_running,
        };
        self.ctl.tick(self.now, sample);
        self.perform();
    }

    pub(super) fn event(&mut self, ev: Event) {
        self.ctl.handle(self.now, ev);
        self.perform();
    }

    pub(super) fn perform(&mut self) {
        while let Some(a) = self.ctl.poll_action() {
            match a {
                Action::Publish {
                    snapshot,
                    trigger_times,
                    steering,
                } => {
                    self.steering = Some(steering);
                    let g = snapshot.generation;
                    self.triggers.push((g, trigger_times));
                    self.install(snapshot);
                    self.log.push(Seen::Published(g));
                    self.ctl.handle(
                        self.now,
                        Event::Published {
                            generation: g,
                            steer_error: None,
                        },
                    );
                }
                Action::Synced => self.log.push(Seen::Synced),
                Action::HealthTargets(plan) => self.log.push(Seen::HealthTargets(
                    plan.targets().iter().map(|t| t.addr).collect(),
                )),
                Action::HealthFailure(a) => self.log.push(Seen::HealthFailure(a)),
                Action::Solicit(ip) => self.log.push(Seen::Solicit(ip)),
                Action::HealthCheckNodePorts(p) => {
                    self.log.push(Seen::HealthCheckNodePorts(p.len()))
                }
                Action::LoadConfig => self.log.push(Seen::LoadConfig),
                Action::Status(s) => self.status = s,
                Action::Announce(inc) => self.log.push(Seen::Announce(inc)),
                Action::Stop(why) => self.stopped = Some(why),
            }
        }
    }

    fn install(&mut self, snap: Arc<Snapshot>) {
        match &mut self.pipeline {
            Some(p) => p.set_snapshot(snap),
            None => {
                let cfg = self.ctl.config();
                let mut p = Pipeline::new(
                    PipelineConfig::from_config(cfg, 0, 1),
                    Arc::clone(&self.flows),
                    Arc::new(AffinityTable::new(64, self.now)),
                    snap,
                );
                p.set_syn_watch(Arc::clone(&self.syn));
                self.pipeline = Some(p);
            }
        }
    }

    /// Sends a frame through the pipeline; the backend it went to, if transmitted.
    pub(super) fn send(&mut self, f: &[u8]) -> Option<IpAddr> {
        let mut f = f.to_vec();
        let p = self.pipeline.as_mut().expect("nothing published yet");
        match p.process(&mut f, self.now) {
            Verdict::Tx(_) => {
                self.tx += 1;
                Some(dst_of(&f))
            }
            _ => None,
        }
    }

    pub(super) fn published(&self) -> usize {
        self.log
            .iter()
            .filter(|s| matches!(s, Seen::Published(_)))
            .count()
    }

    pub(super) fn reload(&mut self, text: &str) {
        let r = match config::parse_written(text, "t.toml") {
            Ok((c, written)) => Reload::Loaded(Box::new(c), written),
            Err(e) => Reload::Invalid(e.to_string()),
        };
        self.event(Event::Reload(r));
    }

    /// Backend ids of service `name` in the last snapshot, by address.
    pub(super) fn ids(&self, name: &str) -> HashMap<SocketAddr, u32> {
        let snap = self.ctl.snapshot().unwrap();
        let s = snap.services.iter().find(|s| s.name == name).unwrap();
        s.backends.iter().map(|b| (b.addr, b.id.0)).collect()
    }
}

pub(super) const TICK: Duration = Duration::from_millis(100);

pub(super) fn steps(h: &mut Harness, n: usize) {
    for _ in 0..n {
        h.step(TICK);
    }
}
pub(super) const DNS: [u8; 4] = [198, 18, 100, 53];
pub(super) const WEB: [u8; 4] = [198, 18, 100, 80];
pub(super) const SYN: u8 = 0x02;
pub(super) const ACK: u8 = 0x10;

pub(super) fn without_backend_1(text: &str) -> String {
    text.replace("{ addr = \"198.18.1.1:53\" }, ", "")
        .replace("{ addr = \"198.18.1.1:80\" }, ", "")
}

#[test]
fn static_source_is_ready_once_its_first_snapshot_is_published() {
    let mut h = Harness::new(CFG);
    assert_eq!(
        h.status.not_ready.as_deref(),
        Some("the first snapshot is not published yet")
    );
    h.step(TICK);
    assert_eq!(h.published(), 1);
    assert_eq!(h.status.not_ready, None);
    assert_eq!(h.status.pending_since, None);
    // Nothing to probe ([health] probe = "none"): the health checker is told nothing.
    assert!(
        !h.log.iter().any(|s| matches!(s, Seen::HealthTargets(_))),
        "{:?}",
        h.log
    );
    // With probes it gets every backend first.
    let mut p = Harness::new(&(CFG.to_owned() + "[health]\nprobe = \"tcp\"\n"));
    p.step(TICK);
    assert_eq!(
        p.log[0],
        Seen::HealthTargets(
            [
                "198.18.1.1:53",
                "198.18.1.1:80",
                "198.18.1.2:53",
                "198.18.1.2:80"
            ]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect()
        )
    );
    assert_eq!(
        p.log
            .iter()
            .filter(|s| matches!(s, Seen::HealthTargets(_)))
            .count(),
        1,
        "told again only when the plan changes"
    );
    // Nothing changes: no publish, but a sync every sync_period (30 s) keeps healthz fresh.
    for _ in 0..299 {
        h.step(TICK);
    }
    assert_eq!(h.published(), 1);
    assert!(!h.log.contains(&Seen::Synced));
    h.step(TICK);
    assert_eq!(h.log.last(), Some(&Seen::Synced));
}

pub(super) const K8S_CFG: &str = r#"
[dataplane]
mode = "nat"
[kubernetes]
kubeconfig = "/nonexistent"
"#;

#[test]
fn trigger_times_go_out_with_the_first_publish_that_carries_their_change() {
    use std::time::SystemTime;
    let mut h = Harness::new(K8S_CFG);
    h.step(TICK);
    let cfg = config::parse(CFG, "t.toml").unwrap();
    let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let model = |times: Vec<SystemTime>| slowpath::k8s::K8sModel {
        specs: ServiceSpec::from_config(&cfg),
        trigger_times: times,
        ..slowpath::k8s::K8sModel::default()
    };
    // Two models before one tick: one publish carries both models' changes.
    h.event(Event::Model(Box::new(model(vec![t(1), t(2)]))));
    h.event(Event::Model(Box::new(model(vec![t(3)]))));
    h.step(TICK);
    let (generation, times) = h.triggers.last().cloned().unwrap();
    assert_eq!(times, vec![t(1), t(2), t(3)]);
    // The next publish (a neighbour change) carries none of them again.
    h.event(Event::L2(lab_l2()));
    h.step(TICK);
    let (next, times) = h.triggers.last().cloned().unwrap();
    assert!(next > generation);
    assert!(times.is_empty(), "{times:?}");
}

#[test]
fn kubernetes_source_is_not_ready_until_its_first_model_is_published() {
    let mut h = Harness::new(K8S_CFG);
    let waiting =
        Some("waiting for the first sync of the Kubernetes source (every watch listed)".to_owned());
    assert_eq!(h.status.not_ready, waiting);
    // Neighbour changes publish snapshots meanwhile (0 services), but the node is not
    // ready, and no periodic sync pretends otherwise.
    h.step(TICK);
    h.event(Event::L2(L2Table::default()));
    for _ in 0..400 {
        h.step(TICK);
    }
    assert_eq!(h.published(), 2);
    assert_eq!(h.status.not_ready, waiting);
    assert!(!h.log.contains(&Seen::Synced));
    // The first model (the API server answered every list) makes it ready once published.
    let cfg = config::parse(CFG, "t.toml").unwrap();
    let model = slowpath::k8s::K8sModel {
        specs: ServiceSpec::from_config(&cfg),
        source_ranges: HashMap::new(),
        health_check_node_ports: Vec::new(),
        problems: Vec::new(),
        trigger_times: Vec::new(),
        service_cidrs: Vec::new(),
    };
    h.event(Event::Model(Box::new(model)));
    assert_eq!(
        h.status.not_ready.as_deref(),
        Some("the first snapshot is not published yet")
    );
    assert_eq!(h.log.last(), Some(&Seen::HealthCheckNodePorts(0)));
    h.step(TICK);
    assert_eq!(h.status.not_ready, None);
    assert_eq!(h.ctl.snapshot().unwrap().services.len(), 2);
}

#[test]
fn a_bad_reload_keeps_the_running_services() {
    let mut h = Harness::new(CFG);
    h.step(TICK);
    h.reload("[[services]]\nname = \"x\"\nvip = \"not an address\"\n");
    h.event(Event::Reload(Reload::NoFile));
    assert_eq!((h.status.reloads_ok, h.status.reloads_failed), (0, 2));
    h.step(TICK);
    assert_eq!(h.published(), 1, "nothing to publish");
    assert_eq!(h.ctl.snapshot().unwrap().services.len(), 2);
    // SIGHUP asks the driver for the file; a good one applies.
    h.event(Event::Signal(Signal::Reload));
    assert_eq!(h.log.last(), Some(&Seen::LoadConfig));
    h.reload(&CFG.replace("name = \"dns\"", "name = \"dns2\""));
    h.step(TICK);
    assert_eq!(h.status.reloads_ok, 1);
    let snap = h.ctl.snapshot().unwrap();
    assert!(snap.services.iter().any(|s| s.name == "dns2"));
}

/// The reload guards: what a refused reload says, and that nothing changes.
fn refused(h: &mut Harness, text: &str) -> String {
    let (cfg, written) = config::parse_written(text, "t.toml").unwrap();
    let why = h.ctl.refusal(&cfg, &written);
    let (failed, published) = (h.status.reloads_failed, h.published());
    let before = h.ctl.snapshot().unwrap().generation;
    h.reload(text);
    h.step(TICK);
    assert_eq!(h.status.reloads_failed, failed + 1, "not refused: {text:?}");
    assert_eq!(h.published(), published, "refused, yet published");
    assert_eq!(h.ctl.snapshot().unwrap().generation, before);
    why.unwrap()
}

#[test]
fn empty_truncated_or_dataplane_changing_files_are_refused() {
    let mut h = Harness::new(CFG);
    h.step(TICK);
    // A long-lived flow to .1 that a wrongly applied reload would end (removal_grace: 3 s).
    assert_eq!(
        h.send(&frame(false, 2000, WEB, 80, SYN)),
        Some(ip("198.18.1.1"))
    );
    let flows = h.flows.len();
    for empty in ["", "\n\n", "  # nothing here\n# at all\n"] {
        assert!(refused(&mut h, empty).contains("empty"));
    }
    // Cut mid-line: may still parse (port = 5 of port = 53).
    let whole = format!("{CFG}[timeouts]\nudp = \"300s\"\n");
    let cut = &whole[..whole.len() - "0s\"\n".len()];
    assert!(
        config::parse(cut, "t.toml").is_err(),
        "a cut string does not parse"
    );
    let whole = format!("{CFG}[health]\nrise = 20\n");
    let cut = &whole[..whole.len() - 2];
    assert_eq!(
        config::parse(cut, "t.toml").unwrap().health.rise,
        2,
        "a cut number does"
    );
    assert!(refused(&mut h, cut).contains("no newline"), "{cut}");
    // A [dataplane] change names its keys, and needs a restart.
    let why = refused(
        &mut h,
        &CFG.replace(
            "mode = \"nat\"",
            "mode = \"nat\"\nbatch_size = 32\ncores = [1]",
        ),
    );
    assert!(
        why.contains("dataplane.cores, dataplane.batch_size") && why.contains("restart"),
        "{why}"
    );
    // A file cut before its [dataplane] (here: one without it).
    let no_dataplane = CFG
        .replace("[dataplane]\nmode = \"nat\"\n", "")
        .replace("scheduler = \"rr\"", "scheduler = \"rr\"\nmode = \"nat\"");
    let why = refused(&mut h, &no_dataplane);
    assert!(
        why.contains("no [dataplane] table") && why.contains("dataplane.mode"),
        "{why}"
    );
    // Cut before the first [[services]]: no services. Said explicitly, that is fine.
    let head = &CFG[..CFG.find("[[services]]").unwrap()];
    assert!(refused(&mut h, head).contains("services = []"));
    let why = refused(&mut h, "[kubernetes]\n[dataplane]\nmode = \"nat\"\n");
    assert!(why.contains("from static to Kubernetes"), "{why}");
    // Every cut of the file is refused, but at a line end after a service's required keys
    // (a valid file with fewer services or backends: only an atomic write prevents that).
    let mut accepted = Vec::new();
    for n in 0..CFG.len() {
        let prefix = &CFG[..n];
        let refusal = match config::parse_written(prefix, "t.toml") {
            Ok((cfg, written)) => h.ctl.refusal(&cfg, &written),
            Err(e) => Some(e.to_string()),
        };
        if refusal.is_none() {
            accepted.push(prefix.lines().last().unwrap_or_default().to_owned());
        }
    }
    for last in &accepted {
        assert!(
            last.starts_with("protocol")
                || last.starts_with("scheduler")
                || last.starts_with("backends"),
            "accepted a cut after {last:?}"
        );
    }
    assert_eq!(h.status.reloads_ok, 0);
    assert_eq!(h.ctl.snapshot().unwrap().services.len(), 2);
    assert_eq!(h.flows.len(), flows, "flows unchanged");
    steps(&mut h, 50);
    assert_eq!(h.flows.len(), flows, "and no removal after the grace");
    // `services = []` says it: every service goes.
    h.reload("services = []\n[dataplane]\nmode = \"nat\"\n");
    h.step(TICK);
    assert_eq!(h.status.reloads_ok, 1);
    assert!(h.ctl.snapshot().unwrap().services.is_empty());
}

#[test]
fn drain_ends_when_idle_for_a_second() {
    let mut h = Harness::new(CFG);
    h.step(TICK);
    assert_eq!(
        h.send(&frame(false, 2000, WEB, 80, SYN)),
        Some(ip("198.18.1.1"))
    );
    h.event(Event::Signal(Signal::Stop));
    assert!(h.status.draining, "healthz turns 503 at once");
    // Traffic continues: the drain waits.
    for _ in 0..20 {
        h.step(TICK);
        h.send(&frame(false, 2000, WEB, 80, ACK));
    }
    assert_eq!(h.stopped, None);
    // The client closes (RST ends the flow at once); a second of quiet ends the drain.
    h.send(&frame(false, 2000, WEB, 80, 0x04));
    for _ in 0..9 {
        h.step(TICK);
    }
    assert_eq!(h.stopped, None);
    h.step(TICK);
    h.step(TICK);
    assert!(
        matches!(&h.stopped, Some(StopReason::Drained(why)) if why.starts_with("idle")),
        "{:?}",
        h.stopped
    );
}

#[test]
fn drain_gives_up_at_the_timeout_and_a_second_signal_stops_at_once() {
    let mut h =
        Harness::new(&CFG.replace("mode = \"nat\"", "mode = \"nat\"\ndrain_timeout = \"3s\""));
    h.step(TICK);
    h.send(&frame(false, 2000, WEB, 80, SYN));
    h.send(&frame(false, 2000, WEB, 80, ACK));
    h.event(Event::Signal(Signal::Stop));
    for _ in 0..29 {
        h.step(TICK);
    }
    assert_eq!(h.stopped, None, "an established flow holds the drain");
    h.step(TICK);
    assert!(
        matches!(&h.stopped, Some(StopReason::Drained(why)) if why.contains("timeout") && why.contains("1 established")),
        "{:?}",
        h.stopped
    );
    let mut h = Harness::new(CFG);
    h.step(TICK);
    h.event(Event::Signal(Signal::Stop));
    h.event(Event::Signal(Signal::Stop));
    assert_eq!(h.stopped, Some(StopReason::Signal));
    // drain_timeout 0: the first signal stops.
    let mut h =
        Harness::new(&CFG.replace("mode = \"nat\"", "mode = \"nat\"\ndrain_timeout = \"0s\""));
    h.step(TICK);
    h.event(Event::Signal(Signal::Stop));
    assert_eq!(h.stopped, Some(StopReason::Signal));
    assert!(!h.status.draining);
}

#[test]
fn a_worker_that_ends_stops_the_daemon() {
    let mut h = Harness::new(CFG);
    h.step(TICK);
    h.workers_running = false;
    h.step(TICK);
    assert_eq!(h.stopped, Some(StopReason::WorkerExited));
}

#[test]
fn freeze_publishes_and_admin_drain_only_turns_healthz() {
    let mut h = Harness::new(CFG);
    h.step(TICK);
    assert_eq!(
        h.ctl.command(h.now, Command::Freeze(Some("nope".into()))),
        Err("no service named \"nope\"".into())
    );
    h.ctl
        .command(h.now, Command::Freeze(Some("web".into())))
        .unwrap();
    h.perform();
    h.step(TICK);
    assert_eq!(h.published(), 2);
    assert_eq!(h.status.frozen_services, ["web"]);
    assert_eq!(h.send(&frame(false, 2000, WEB, 80, SYN)), None, "frozen");
    assert!(h.send(&frame(true, 1000, DNS, 53, 0)).is_some());
    h.ctl
        .command(h.now, Command::Unfreeze(Some("web".into())))
        .unwrap();
    assert_eq!(
        h.ctl.command(h.now, Command::Unfreeze(Some("web".into()))),
        Err("service \"web\" is not frozen".into())
    );
    h.ctl.command(h.now, Command::Drain).unwrap();
    h.perform();
    h.step(TICK);
    assert!(h.status.draining);
    assert_eq!(h.stopped, None);
    assert!(h.send(&frame(false, 2000, WEB, 80, SYN)).is_some());
    h.ctl.command(h.now, Command::Undrain).unwrap();
    h.perform();
    assert!(!h.status.draining);
}

#[test]
fn health_changes_and_passive_failures() {
    let text = CFG.to_owned() + "[health]\nprobe = \"tcp\"\n";
    let mut h = Harness::new(&text);
    h.step(TICK);
    // The checker marks .1:80 down: the next snapshot takes no new flows to it.
    let ev = judged(&h, &[("198.18.1.1:80", Judgement::Down)]);
    h.event(ev);
    h.step(TICK);
    for p in 0..4 {
        assert_eq!(
            h.send(&frame(false, 3000 + p, WEB, 80, SYN)),
            Some(ip("198.18.1.2"))
        );
    }
    // .2 never answers those SYNs: after a second to be answered, a passive failure.
    for _ in 0..25 {
        h.step(TICK);
    }
    assert!(
        h.log
            .contains(&Seen::HealthFailure("198.18.1.2:80".parse().unwrap())),
        "{:?}",
        h.log
    );
}

#[test]
fn unresolved_next_hops_are_solicited() {
    let mut h = Harness::new(CFG);
    h.event(Event::L2(L2Table::default()));
    h.step(TICK);
    let solicited: Vec<&Seen> = h
        .log
        .iter()
        .filter(|s| matches!(s, Seen::Solicit(_)))
        .collect();
    assert_eq!(
        solicited,
        [
            &Seen::Solicit(ip("198.18.1.1")),
            &Seen::Solicit(ip("198.18.1.2"))
        ]
    );
    // At most once per second.
    h.step(TICK);
    assert_eq!(
        h.log
            .iter()
            .filter(|s| matches!(s, Seen::Solicit(_)))
            .count(),
        2
    );
}

#[test]
fn an_adopted_table_keeps_its_flows_and_ends_those_of_backends_gone() {
    // The first process: flows to both backends of both services.
    let mut first = Harness::new(CFG);
    first.step(TICK);
    for p in 0..4u16 {
        first.send(&frame(false, 2000 + p, WEB, 80, SYN));
        first.send(&frame(true, 1000 + p, DNS, 53, 0));
    }
    assert_eq!(first.flows.len(), 8);
    let old_web = first.ids("web");
    let adopted = AdoptedIds::from_flows(&first.flows);
    // The next process adopts the table; its config lost backend .1.
    let mut h = Harness::adopting(&without_backend_1(CFG), &first, &adopted);
    h.step(TICK);
    // .2 keeps its id, so its flows' counts and the schedulers agree.
    let two: SocketAddr = "198.18.1.2:80".parse().unwrap();
    assert_eq!(h.ids("web")[&two], old_web[&two]);
    // Every adopted flow is forwarded as before, .1's too while its grace runs.
    assert_eq!(
        h.send(&frame(false, 2000, WEB, 80, ACK)),
        Some(ip("198.18.1.1"))
    );
    assert_eq!(
        h.send(&frame(false, 2001, WEB, 80, ACK)),
        Some(ip("198.18.1.2"))
    );
    // After the grace, .1 is handled as removed: TCP ended, UDP re-steered.
    steps(&mut h, 31);
    assert_eq!((h.status.flows_resteered, h.status.flows_ended), (2, 2));
    assert_eq!(h.send(&frame(false, 2000, WEB, 80, ACK)), None);
    assert_eq!(
        h.send(&frame(true, 1000, DNS, 53, 0)),
        Some(ip("198.18.1.2"))
    );
    assert_eq!(
        h.send(&frame(false, 2001, WEB, 80, ACK)),
        Some(ip("198.18.1.2"))
    );
}

#[test]
fn a_models_clusterips_and_service_cidrs_reach_the_snapshot_and_the_steering() {
    let mut h = Harness::new(K8S_CFG);
    let cfg = config::parse(CFG, "t.toml").unwrap();
    let mut specs = ServiceSpec::from_config(&cfg);
    specs[0].cluster_ip = true;
    let vip = specs[0].frontends[0].vip;
    let other = specs[1].frontends[0].vip;
    let cidr: config::Cidr = "198.18.96.0/20".parse().unwrap();
    let model = slowpath::k8s::K8sModel {
        specs,
        service_cidrs: vec![cidr],
        ..slowpath::k8s::K8sModel::default()
    };
    h.event(Event::Model(Box::new(model)));
    h.step(TICK);
    let snap = h.ctl.snapshot().unwrap();
    assert!(snap.is_cluster_ip(vip) && !snap.is_cluster_ip(other));
    assert!(snap.in_service_cidr("198.18.100.9".parse().unwrap()));
    let st = h.steering.clone().unwrap();
    assert_eq!(st.cluster_ips, [vip]);
    assert_eq!(st.service_cidrs, [cidr]);
    // A model without them takes them away.
    h.event(Event::Model(Box::default()));
    h.step(TICK);
    let st = h.steering.clone().unwrap();
    assert!(
        st.cluster_ips.is_empty() && st.service_cidrs.is_empty(),
        "{st:?}"
    );
}
