//! Signal handling as a slowpath service: SIGTERM and SIGINT stop (the second stops at
//! once: the controller's business), SIGHUP reloads; each is an [`Event::Signal`].

use anyhow::Context;
use slowpath::service::{Running, Service};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::controller::{Event, Signal};

/// The signal handler: its events go to `events`.
pub(super) struct Signals {
    pub events: mpsc::UnboundedSender<Event>,
}

/// Registering a handler can fail; the error is boxed so that its context survives.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub(super) struct SignalError(anyhow::Error);

impl Service for Signals {
    type Handle = ();
    type Error = SignalError;
    const NAME: &'static str = "signal handling";

    fn start(
        self,
        rt: &tokio::runtime::Handle,
        shutdown: &CancellationToken,
    ) -> Result<Running<()>, SignalError> {
        let _enter = rt.enter();
        let register = |kind, what| signal(kind).context(what).map_err(SignalError);
        let mut term = register(SignalKind::terminate(), "handling SIGTERM")?;
        let mut int = register(SignalKind::interrupt(), "handling SIGINT")?;
        let mut hup = register(SignalKind::hangup(), "handling SIGHUP")?;
        let (tx, shutdown) = (self.events, shutdown.clone());
        let task = rt.spawn(async move {
            loop {
                let sig = tokio::select! {
                    _ = term.recv() => Signal::Stop,
                    _ = int.recv() => Signal::Stop,
                    _ = hup.recv() => Signal::Reload,
                    () = shutdown.cancelled() => return,
                };
                if tx.send(Event::Signal(sig)).is_err() {
                    return;
                }
            }
        });
        Ok(Running { handle: (), task })
    }
}
