//! A worker's log of flow events for the tier's flow sync: flows this worker created, state
//! changes of flows it forwards, and flows its sweeps ended. The slowpath drains every
//! worker's log in batches and sends the flows to the peers (`slowpath::flowsync`).
//!
//! - One log per worker: a bounded lock-free queue allocated up front (the worker pushes,
//!   the slowpath pops); recording allocates nothing and takes no lock.
//! - State changes are recorded by the table itself, where it changes a flow's state
//!   (`touch`'s out-of-line write), into the log of the thread doing it
//!   ([`set_thread_log`]): the packet path without flow sync pays nothing, not even a test.
//!   Creations are recorded by the worker's pipeline, ends by its sweeps.
//! - A created or changed flow is logged by its handle only: the slowpath reads the flow
//!   from the table when it sends it (its state then, the latest), and skips it if it is
//!   gone by then. An ended flow is logged with its tuple, since its entry may be reused.
//! - A full log drops the event and counts it ([`FlowLog::dropped`]): the slowpath's
//!   periodic refresh sends every live flow again, so a dropped event delays a peer's copy,
//!   it does not lose it.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_queue::ArrayQueue;
use std::net::SocketAddr;

use std::cell::RefCell;
use std::sync::Arc;

use crate::{FlowData, FlowHandle, Protocol};

/// Events a log holds by default (per worker): 10 ms of 1.6 M new flows a second.
pub const DEFAULT_CAPACITY: usize = 1 << 14;

/// One logged event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowEvent {
    /// A flow this worker inserted (read it from the table by its handle).
    Created(FlowHandle),
    /// A flow whose protocol state a packet through this worker changed.
    Changed(FlowHandle),
    /// A flow this worker's sweep expired.
    Ended(EndedFlow),
}

/// What a peer needs to find its copy of an ended flow: the original tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndedFlow {
    /// Transport protocol.
    pub proto: Protocol,
    /// The client's address and port.
    pub client: SocketAddr,
    /// The VIP and port it addressed.
    pub vip: SocketAddr,
}

impl EndedFlow {
    /// The ended flow `d`.
    pub fn of(d: &FlowData) -> EndedFlow {
        EndedFlow {
            proto: d.proto,
            client: d.client,
            vip: d.vip,
        }
    }
}

/// One worker's log (shared with the slowpath through an `Arc`).
#[derive(Debug)]
pub struct FlowLog {
    queue: ArrayQueue<FlowEvent>,
    dropped: AtomicU64,
}

impl FlowLog {
    /// A log of `capacity` events (at least 1).
    pub fn new(capacity: usize) -> FlowLog {
        FlowLog {
            queue: ArrayQueue::new(capacity.max(1)),
            dropped: AtomicU64::new(0),
        }
    }

    /// Records `event` (the worker's side); a full log drops it and counts it.
    #[inline]
    pub fn record(&self, event: FlowEvent) {
        if self.queue.push(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The oldest event, if any (the slowpath's side).
    pub fn pop(&self) -> Option<FlowEvent> {
        self.queue.pop()
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Events dropped because the log was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

thread_local! {
    static THREAD_LOG: RefCell<Option<Arc<FlowLog>>> = const { RefCell::new(None) };
}

/// Makes `log` the log of the calling thread: the state changes the table makes on this
/// thread go there (`None`: nowhere). A worker calls it on its own thread.
pub fn set_thread_log(log: Option<Arc<FlowLog>>) {
    THREAD_LOG.with(|l| *l.borrow_mut() = log);
}

/// Records that flow `h`'s state changed, in the calling thread's log if it has one.
#[cold]
pub(crate) fn changed(h: FlowHandle) {
    THREAD_LOG.with(|l| {
        if let Ok(l) = l.try_borrow()
            && let Some(log) = l.as_ref()
        {
            log.record(FlowEvent::Changed(h));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_in_order_and_a_full_log_counts_what_it_drops() {
        let log = FlowLog::new(2);
        let (a, b, c) = (
            FlowHandle::from_bits(1),
            FlowHandle::from_bits(2),
            FlowHandle::from_bits(3),
        );
        log.record(FlowEvent::Created(a));
        log.record(FlowEvent::Changed(b));
        log.record(FlowEvent::Created(c));
        assert_eq!((log.len(), log.dropped()), (2, 1));
        assert_eq!(log.pop(), Some(FlowEvent::Created(a)));
        assert_eq!(log.pop(), Some(FlowEvent::Changed(b)));
        assert_eq!(log.pop(), None);
        assert!(log.is_empty());
    }
}
