//! The driver's last phase: shutting down in the order that loses nothing (see the driver's
//! module doc).

use std::sync::atomic::Ordering;
use std::time::Duration;

use config::Config;
use fastpath::worker::WorkerCounters;

use super::serve::Io;
use super::start::Workers;
use super::{Outcome, SERVICES_STOP, Slowpath};
use crate::admin::DaemonState;
use crate::controller::StopReason;
use crate::hold;

/// The steering stays attached for the next process: from the last refresh of the hold,
/// frames xvs owns are dropped (not answered by the kernel) for `restart_hold`, then the
/// watchdog removes the programs if no xvs came back. Then the workers stop, the flow table
/// is closed, the slowpath services stop, and the final counters are read.
pub(super) fn shut_down(
    slow: Slowpath,
    mut io: Io<'_>,
    workers: Workers,
    state: &DaemonState,
    cfg: &Config,
    stopped: StopReason,
    napi_defer: Option<fastpath::xsk::napi::NapiDefer>,
) -> Outcome {
    let steer: Vec<_> = io
        .steers
        .iter()
        .map(|s| (s.ifname().to_owned(), s.counters().ok()))
        .collect();
    if let Err(e) = hold::refresh(&mut io.steers, io.restart_hold) {
        tracing::warn!(error = %e, "refreshing the restart hold at the stop");
    }
    for st in std::mem::take(&mut io.steers) {
        st.release();
    }
    workers.stop.store(true, Ordering::SeqCst);
    let sets: Vec<_> = workers
        .handles
        .into_iter()
        .map(|h| h.join().ok().flatten())
        .collect();
    // The NAPI settings go back before the frame states are sent: the new process changes
    // them again once it has them (without waiting for this one's exit), and so puts them
    // back at its own end.
    let napi_defer = if io.handed.is_some() {
        drop(napi_defer);
        None
    } else {
        napi_defer
    };
    if let Some(sw) = io.handed.as_mut()
        && hand_over(&mut sw.conn, &state.flows, &sets)
    {
        if sw.export {
            // The new process refused the flow table handed over (another layout): it
            // imports these records once this process is gone (it waits for the exit).
            crate::state::export(&state.flows, cfg);
        }
        // The new process holds the state files (their locks came with their descriptors)
        // and adopts the flow table at once, while nothing polls: what is left here (the
        // services' ends, the sockets closed, the takeover socket removed) is no longer
        // this process's business, so it ends now; the new one binds what this one
        // listened on once it is gone. The flow table's recovery pass in the new process
        // does not trust the clean mark anyway.
        tracing::info!(target: "xvs", "handed over; exiting");
        std::process::exit(0);
    }
    // The new process holds its own references to the sockets: closing ours is no loss.
    drop(sets);
    if let Ok(mut readers) = state.sockets.lock() {
        readers.clear();
    }
    state.fastpath_running.store(false, Ordering::Relaxed);
    // The flows stay in the state file for the next process; a graceful stop also exports
    // them for one with another layout.
    let graceful = !matches!(stopped, StopReason::WorkerExited | StopReason::TakenOver);
    crate::state::close(&state.flows, cfg, graceful);
    drop(io);
    stop_services(slow);
    drop(napi_defer);
    let mut counters = WorkerCounters::default();
    for s in &workers.stats {
        counters.add(&s.read());
    }
    tracing::info!(target: "xvs", "stopped");
    Outcome {
        counters,
        flows_live: state.flows.len(),
        steer,
        failure: match stopped {
            StopReason::WorkerExited => Some(anyhow::anyhow!("a worker thread ended unexpectedly")),
            _ => None,
        },
    }
}

/// The switch of a takeover, the old side: the workers have stopped; the flow table is
/// marked clean (the new process adopts it once this one is gone) and every worker's
/// frames are accounted for to the new process. A worker that did not hand its sockets
/// back leaves the new process nothing to resume: it refuses and starts as a restart.
/// Returns whether the states were sent.
fn hand_over(
    conn: &mut std::os::unix::net::UnixStream,
    flows: &flowtable::FlowTable,
    sets: &[Option<fastpath::xsk::XskSet>],
) -> bool {
    flows.mark_clean();
    let states: Option<Vec<_>> = sets
        .iter()
        .map(|s| s.as_ref().map(|s| s.frame_state()))
        .collect();
    let Some(states) = states else {
        tracing::error!(
            "a worker did not hand its sockets back; the new process starts as after a restart"
        );
        return false;
    };
    match crate::takeover::send_states(conn, &states) {
        Ok(()) => {
            tracing::info!(target: "xvs", workers = states.len(), "sockets handed over");
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "sending the frame states to the new process");
            false
        }
    }
}

/// Cancels the services and waits (up to [`SERVICES_STOP`]) for their tasks; a task that
/// panicked has its panic resumed (a bug, see [`slowpath::service`]).
fn stop_services(slow: Slowpath) {
    let Slowpath {
        cancel_on_exit,
        shutdown: _,
        tasks,
        rt,
    } = slow;
    drop(cancel_on_exit);
    rt.block_on(async {
        let all = async {
            for (_, t) in tasks {
                if let Err(e) = t.await
                    && e.is_panic()
                {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        };
        if tokio::time::timeout(SERVICES_STOP, all).await.is_err() {
            tracing::warn!("slowpath services did not stop within {SERVICES_STOP:?}");
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
}
