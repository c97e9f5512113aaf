//! The driver's serving phase: the loop that feeds the controller its events and performs
//! its actions (see the driver's module doc for what wakes it).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use fastpath::snapshot::Snapshot;
use fastpath::steer::Steering;
use slowpath::bgp::{Include, Speaker};
use slowpath::health::HealthChecker;
use slowpath::k8s::HealthCheckNodePort;
use slowpath::neigh::NeighbourWatcher;
use slowpath::traffic;
use tokio::sync::mpsc;

use super::{BGP_FINISH, Slowpath, TICK};
use crate::admin::{CommandMsg, DaemonState, StatusView, SyncStats};
use crate::controller::{Action, Controller, Event, Reload, Sample, Signal, SteerSet, StopReason};
use crate::hold;
use crate::watch::{FileWatch, Stamp};

/// What wakes the loop besides its tick.
pub(super) struct Channels {
    pub events: mpsc::UnboundedReceiver<Event>,
    pub commands: mpsc::UnboundedReceiver<CommandMsg>,
    /// A newer process at the switch of a takeover ([`crate::takeover`]).
    pub takeover: mpsc::UnboundedReceiver<crate::takeover::Switching>,
}

/// Runs the loop until the controller stops, then lets BIRD take the file that announces
/// nothing (the liveness device closed at the stop action); after a takeover BIRD is left
/// as it is, for the new process. Returns why it stopped.
pub(super) fn serve<T>(
    slow: &Slowpath,
    io: &mut Io<'_>,
    ctl: &mut Controller,
    channels: Channels,
    state: &DaemonState,
    workers: &[JoinHandle<T>],
) -> StopReason {
    let stopped = slow.rt.block_on(io.run(ctl, channels, state, workers));
    if stopped == StopReason::TakenOver {
        return stopped;
    }
    if let Bgp::On(speaker) = std::mem::take(&mut io.bgp)
        && !slow.rt.block_on(speaker.finish(BGP_FINISH))
    {
        tracing::warn!(
            "BGP: BIRD did not take the final (empty) file within {BGP_FINISH:?}; the routes are withdrawn anyway (the liveness device is gone)"
        );
    }
    stopped
}

/// The I/O the controller's actions need, and the loop around it.
pub(super) struct Io<'a> {
    /// The snapshot the workers read.
    pub current: Arc<ArcSwap<Snapshot>>,
    pub steers: Vec<Steering>,
    pub sync: Arc<SyncStats>,
    pub status: Arc<ArcSwap<StatusView>>,
    pub health: HealthChecker,
    neighbours: NeighbourWatcher,
    hcnp: Option<mpsc::UnboundedSender<Vec<HealthCheckNodePort>>>,
    path: Option<&'a Path>,
    watch: FileWatch,
    stop: Option<StopReason>,
    /// The connection of the process that takes over, at the switch.
    pub handed: Option<crate::takeover::Switching>,
    pub restart_hold: Duration,
    pub bgp: Bgp,
}

/// The BGP speaker ([`Speaker`]), started once the workers run.
#[derive(Default)]
pub(super) enum Bgp {
    /// `[bgp]` off, or nothing announced yet.
    #[default]
    Off,
    /// The workers do not run yet: the last include file the controller emitted.
    Waiting(Include),
    /// Started.
    On(Speaker),
}

impl Bgp {
    fn announce(&mut self, include: Include) {
        match self {
            Bgp::On(s) => s.announce(include),
            other => *other = Bgp::Waiting(include),
        }
    }

    pub(super) fn start(&mut self, mut speaker: Speaker) {
        if let Bgp::Waiting(include) = std::mem::take(self) {
            speaker.announce(include);
        }
        *self = Bgp::On(speaker);
    }

    fn withdraw(&self) {
        if let Bgp::On(s) = self {
            s.withdraw();
        }
    }
}

impl<'a> Io<'a> {
    /// The I/O around `initial`, the first snapshot (not yet published).
    pub(super) fn new(
        initial: Snapshot,
        steers: Vec<Steering>,
        health: HealthChecker,
        neighbours: NeighbourWatcher,
        hcnp: Option<mpsc::UnboundedSender<Vec<HealthCheckNodePort>>>,
        path: Option<&'a Path>,
        restart_hold: Duration,
    ) -> Io<'a> {
        Io {
            current: Arc::new(ArcSwap::from_pointee(initial)),
            steers,
            sync: Arc::new(SyncStats::default()),
            status: Arc::new(ArcSwap::from_pointee(StatusView::default())),
            health,
            neighbours,
            hcnp,
            path,
            watch: FileWatch::new(path.and_then(Stamp::of)),
            stop: None,
            handed: None,
            restart_hold,
            bgp: Bgp::default(),
        }
    }

    /// Feeds the controller until it stops; returns why.
    async fn run<T>(
        &mut self,
        ctl: &mut Controller,
        channels: Channels,
        state: &DaemonState,
        workers: &[JoinHandle<T>],
    ) -> StopReason {
        let Channels {
            mut events,
            mut commands,
            mut takeover,
        } = channels;
        let mut next_second = Instant::now();
        let mut next_traffic = Instant::now();
        loop {
            // A change an action brought in (a reloaded config) is published at once.
            let wait = if ctl.publish_due() {
                Duration::ZERO
            } else {
                TICK
            };
            tokio::select! {
                Some(ev) = events.recv() => ctl.handle(Instant::now(), ev),
                Some((cmd, reply)) = commands.recv() => {
                    let _ = reply.send(ctl.command(Instant::now(), cmd));
                }
                Some(conn) = takeover.recv() => {
                    tracing::info!(target: "xvs", "handing the sockets over to the new process; stopping");
                    self.handed = Some(conn);
                    return StopReason::TakenOver;
                }
                () = tokio::time::sleep(wait) => {}
            }
            // Everything else that is queued goes into the same tick.
            while let Ok(ev) = events.try_recv() {
                ctl.handle(Instant::now(), ev);
            }
            while let Ok((cmd, reply)) = commands.try_recv() {
                let _ = reply.send(ctl.command(Instant::now(), cmd));
            }
            let now = Instant::now();
            if let Some(p) = self.path
                && self.watch.observe(now, Stamp::of(p))
            {
                ctl.handle(now, Event::Signal(Signal::Reload));
            }
            if now >= next_traffic {
                next_traffic = now + traffic::SAMPLE_PERIOD;
                if let Ok(mut m) = state.traffic.lock() {
                    m.sample(&state.snapshot.load(), now);
                }
            }
            if now >= next_second {
                next_second = now + Duration::from_secs(1);
                self.every_second(state);
            }
            let running = !workers.iter().any(JoinHandle::is_finished);
            if !running {
                state.fastpath_running.store(false, Ordering::Relaxed);
            }
            let tx_frames = state.workers.iter().map(|w| w.read().tx).sum();
            if let Some((fs, _)) = &state.peer_sync {
                ctl.set_peers_ready(fs.ready());
            }
            ctl.tick(
                now,
                Sample {
                    tx_frames,
                    workers_running: running,
                },
            );
            self.perform(ctl, now);
            if let Some(why) = self.stop.take() {
                return why;
            }
        }
    }

    /// The steering counters read, the restart hold refreshed.
    fn every_second(&mut self, state: &DaemonState) {
        if let Ok(mut s) = state.steer.lock() {
            *s = self
                .steers
                .iter()
                .filter_map(|st| Some((st.ifname().to_owned(), st.counters().ok()?)))
                .collect();
        }
        if let Err(e) = hold::refresh(&mut self.steers, self.restart_hold) {
            tracing::warn!(error = %e, "refreshing the restart hold");
        }
    }

    /// Performs the controller's queued actions; `t0` is when this round of work began (a
    /// publish's sync duration counts from there).
    pub(super) fn perform(&mut self, ctl: &mut Controller, t0: Instant) {
        while let Some(action) = ctl.poll_action() {
            match action {
                Action::Publish {
                    snapshot,
                    steering,
                    trigger_times,
                } => {
                    let generation = snapshot.generation;
                    // New frontends are steered after the snapshot that knows them is
                    // published; gone ones stop being steered at the same moment (their
                    // flows would be refused anyway).
                    self.current.store(snapshot);
                    let steer_error = steer_all(&mut self.steers, &steering)
                        .err()
                        .map(|e| format!("{e:#}"));
                    self.sync.synced(Some(t0.elapsed()));
                    // Live: the workers load it at their next poll.
                    self.sync.programmed(&trigger_times, SystemTime::now());
                    ctl.handle(
                        Instant::now(),
                        Event::Published {
                            generation,
                            steer_error,
                        },
                    );
                }
                Action::Synced => self.sync.synced(None),
                Action::HealthTargets(plan) => self.health.set_plan(plan),
                Action::HealthFailure(addr) => self.health.report_failure(addr),
                Action::Solicit(ip) => self.neighbours.request(ip),
                Action::HealthCheckNodePorts(ports) => {
                    if let Some(tx) = &self.hcnp {
                        let _ = tx.send(ports);
                    }
                }
                Action::LoadConfig => {
                    let reload = match self.path {
                        None => Reload::NoFile,
                        Some(p) => {
                            // The file as this reload reads it: a later change reloads again.
                            self.watch.read(Stamp::of(p));
                            match config::load_written(p) {
                                Ok((c, written)) => Reload::Loaded(Box::new(c), written),
                                Err(e) => Reload::Invalid(e.to_string()),
                            }
                        }
                    };
                    ctl.handle(Instant::now(), Event::Reload(reload));
                }
                Action::Status(s) => {
                    let view = StatusView::new(s, Instant::now(), SystemTime::now());
                    self.status.store(Arc::new(view));
                }
                Action::Announce(include) => self.bgp.announce(include),
                Action::Stop(why) => {
                    // First of all: BIRD withdraws every route of this node.
                    self.bgp.withdraw();
                    match &why {
                        StopReason::Drained(_) => {}
                        StopReason::Signal => tracing::info!(target: "xvs", "stopping"),
                        StopReason::WorkerExited => {
                            tracing::error!("a worker thread ended unexpectedly; stopping")
                        }
                        StopReason::TakenOver => {}
                    }
                    self.stop = Some(why);
                }
            }
        }
    }
}

/// Points every steering program at `set`.
fn steer_all(steers: &mut [Steering], set: &SteerSet) -> anyhow::Result<()> {
    for st in steers.iter_mut() {
        st.set_frontends(&set.frontends, &set.cluster_ips)?;
        st.set_service_cidrs(&set.service_cidrs)?;
        st.set_backends(&set.backends)?;
        st.set_snat(&set.snat_addresses, set.snat_ports)?;
    }
    Ok(())
}
