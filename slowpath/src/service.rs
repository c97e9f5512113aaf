//! The one shape of a slowpath service: what the daemon's driver starts on its tokio runtime.
//!
//! A service is a value that holds everything it needs to start (its settings, the shared
//! state it reads, the callback its events go to) and implements [`Service`]. The driver
//! starts every service the same way, [`Service::start`] with the runtime and the one
//! [`CancellationToken`] that stops them all, and gets back a [`Running`]: the service's
//! handle (what the driver talks to it through: a checker to set targets on, a sender of
//! ports, stats; `()` when there is nothing to say) and its task.
//!
//! Contract:
//! - `start` does what can fail synchronously (binding sockets, registering signal handlers)
//!   before it returns, so a start-up failure is an `Err` naming what could not be set up,
//!   never a task that logs and ends; it never blocks on the network.
//! - Events go out through the callback the value was built with, from the runtime's
//!   threads; the callback must not block.
//! - The task ends soon after `shutdown` is cancelled (a child token is the service's own
//!   business). The driver awaits every task at shut-down, bounded in time; a task that
//!   panicked is a bug, and its panic is resumed there.
//! - A handle may be dropped before the task ends; dropping it never blocks.
//!
//! The implementations live beside the services: [`crate::health::HealthService`],
//! [`crate::neigh::NeighbourService`], [`crate::k8s::hcnp::HealthCheckNodePortService`],
//! [`crate::k8s::WatchService`], [`crate::admin::AdminServer`],
//! [`crate::flowsync::FlowSyncService`], [`crate::bgp::SpeakerService`]; the daemon's signal
//! handling is one too (it speaks the daemon's events).

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A slowpath service, started once by the driver (see the module doc).
pub trait Service: Sized {
    /// What the driver keeps to talk to the running service.
    type Handle;
    /// Why it could not start.
    type Error: std::error::Error + Send + Sync + 'static;
    /// What it is, for the start-up error's context ("starting {NAME}").
    const NAME: &'static str;

    /// Starts the service's task on `rt`; it ends when `shutdown` is cancelled.
    ///
    /// # Errors
    /// What could not be set up (a socket, a signal handler), before any task runs.
    fn start(
        self,
        rt: &Handle,
        shutdown: &CancellationToken,
    ) -> Result<Running<Self::Handle>, Self::Error>;
}

/// A started service: its handle and its task.
#[derive(Debug)]
pub struct Running<H> {
    /// What the driver talks to the service through.
    pub handle: H,
    /// The service's task; it ends once `shutdown` is cancelled.
    pub task: JoinHandle<()>,
}
