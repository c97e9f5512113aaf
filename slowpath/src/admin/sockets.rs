//! The AF_XDP sockets as `/v1/stats` (`sockets`) and `/metrics` (`xvs_xsk_*`) show them: per
//! socket (`interface`, `queue`), the kernel's `XDP_STATISTICS` (frames it dropped before
//! any worker saw them, descriptors it refused) and the state of the socket's rings from
//! what its worker gave and took (see `fastpath::worker::RingStats`).
//!
//! The kernel's losses are frames xvs lost, so [`drops`] adds them to `xvs_drops_total`:
//! `xsk_rx_ring_full` (the worker did not keep up), `xsk_rx_dropped` (no free frame, or a
//! frame too large) and `xsk_tx_invalid_descs` (a transmit the kernel skipped). The others
//! are not frame counts: `rx_fill_ring_empty_descs` counts times the kernel found nothing
//! to receive into (in zero-copy mode the NIC then drops in its own counters, `ethtool -S`),
//! `tx_ring_empty_descs` wake-ups with nothing to send.

use serde::{Deserialize, Serialize};

use super::metrics::Out;

/// One AF_XDP socket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketView {
    /// Its interface.
    pub interface: String,
    /// Its queue (= the worker that owns it).
    pub queue: u32,
    /// Kernel: frames dropped on receive (no free frame to copy into, or too large).
    pub rx_dropped: u64,
    /// Kernel: invalid descriptors on the fill ring.
    pub rx_invalid_descs: u64,
    /// Kernel: invalid descriptors on the tx ring, skipped unsent.
    pub tx_invalid_descs: u64,
    /// Kernel: frames dropped because the rx ring was full.
    pub rx_ring_full: u64,
    /// Kernel: times the fill ring was empty when a frame was to be received.
    pub rx_fill_ring_empty_descs: u64,
    /// Kernel: times the tx ring was empty when the kernel was woken to send.
    pub tx_ring_empty_descs: u64,
    /// Worker: frames given to the fill ring.
    pub filled: u64,
    /// Worker: frames taken from the rx ring.
    pub received: u64,
    /// Worker: frames placed on the tx ring.
    pub transmitted: u64,
    /// Worker: frames taken back from the completion ring.
    pub completed: u64,
}

impl SocketView {
    /// Frames the kernel has to receive into: on the fill ring, in the driver, or received
    /// and waiting on the rx ring.
    pub fn fill_frames(&self) -> u64 {
        self.filled.saturating_sub(self.received)
    }

    /// Frames placed on the tx ring that the kernel has not completed yet.
    pub fn tx_inflight_frames(&self) -> u64 {
        self.transmitted.saturating_sub(self.completed)
    }
}

/// The `xvs_drops_total` reasons of the sockets' kernel losses, summed over sockets (every
/// reason present).
pub fn drops(sockets: &[SocketView]) -> [(&'static str, u64); 3] {
    let sum = |f: fn(&SocketView) -> u64| sockets.iter().map(f).sum();
    [
        ("xsk_rx_ring_full", sum(|s| s.rx_ring_full)),
        ("xsk_rx_dropped", sum(|s| s.rx_dropped)),
        ("xsk_tx_invalid_descs", sum(|s| s.tx_invalid_descs)),
    ]
}

type Field = fn(&SocketView) -> u64;

const COUNTERS: [(&str, &str, Field); 8] = [
    (
        "xvs_xsk_rx_ring_full_total",
        "Frames the kernel dropped because the socket's rx ring was full: its worker did not keep up (XDP_STATISTICS rx_ring_full; in xvs_drops_total as xsk_rx_ring_full).",
        |s| s.rx_ring_full,
    ),
    (
        "xvs_xsk_rx_dropped_total",
        "Frames the kernel dropped on receive: no free UMEM frame to copy into, or larger than a frame (XDP_STATISTICS rx_dropped; in xvs_drops_total as xsk_rx_dropped).",
        |s| s.rx_dropped,
    ),
    (
        "xvs_xsk_rx_fill_ring_empty_descs_total",
        "Times the kernel found the socket's fill ring empty when it needed a frame to receive into (XDP_STATISTICS rx_fill_ring_empty_descs).",
        |s| s.rx_fill_ring_empty_descs,
    ),
    (
        "xvs_xsk_rx_invalid_descs_total",
        "Invalid descriptors the kernel found on the fill ring (XDP_STATISTICS rx_invalid_descs; an xvs bug).",
        |s| s.rx_invalid_descs,
    ),
    (
        "xvs_xsk_tx_invalid_descs_total",
        "Invalid descriptors the kernel skipped unsent on the tx ring (XDP_STATISTICS tx_invalid_descs; an xvs bug; in xvs_drops_total as xsk_tx_invalid_descs).",
        |s| s.tx_invalid_descs,
    ),
    (
        "xvs_xsk_tx_ring_empty_descs_total",
        "Times the kernel was woken to send and found the tx ring empty (XDP_STATISTICS tx_ring_empty_descs).",
        |s| s.tx_ring_empty_descs,
    ),
    (
        "xvs_xsk_fill_frames_total",
        "Frames the worker gave the socket's fill ring to receive into.",
        |s| s.filled,
    ),
    (
        "xvs_xsk_completed_frames_total",
        "Frames the kernel handed back on the socket's completion ring (sent).",
        |s| s.completed,
    ),
];

const GAUGES: [(&str, &str, Field); 2] = [
    (
        "xvs_xsk_fill_ring_frames",
        "Frames the kernel has to receive into: on the fill ring, in the driver, or received and not yet taken by the worker (as of the worker's last poll that moved frames); 0 means it has none.",
        SocketView::fill_frames,
    ),
    (
        "xvs_xsk_tx_inflight_frames",
        "Frames on the socket's tx ring or being sent, not yet handed back on its completion ring.",
        SocketView::tx_inflight_frames,
    ),
];

/// The `xvs_xsk_*` families (always, empty before the workers run).
pub(super) fn render(o: &mut Out, sockets: &[SocketView]) {
    for (kind, families) in [("counter", &COUNTERS[..]), ("gauge", &GAUGES[..])] {
        for (name, help, get) in families {
            o.family(name, kind, help);
            for s in sockets {
                let queue = s.queue.to_string();
                o.sample(
                    name,
                    &[("interface", &s.interface), ("queue", &queue)],
                    get(s) as f64,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket(interface: &str, rx_ring_full: u64) -> SocketView {
        SocketView {
            interface: interface.into(),
            queue: 1,
            rx_ring_full,
            rx_dropped: 2,
            tx_invalid_descs: 1,
            rx_fill_ring_empty_descs: 9,
            filled: 100,
            received: 40,
            transmitted: 30,
            completed: 25,
            ..SocketView::default()
        }
    }

    #[test]
    fn kernel_losses_are_drops_and_ring_state_is_the_difference() {
        let s = [socket("eth0", 5), socket("eth1", 7)];
        assert_eq!(
            drops(&s),
            [
                ("xsk_rx_ring_full", 12),
                ("xsk_rx_dropped", 4),
                ("xsk_tx_invalid_descs", 2)
            ]
        );
        assert_eq!(s[0].fill_frames(), 60);
        assert_eq!(s[0].tx_inflight_frames(), 5);
        let mut o = Out(String::new());
        render(&mut o, &s);
        for line in [
            "xvs_xsk_rx_ring_full_total{interface=\"eth1\",queue=\"1\"} 7\n",
            "xvs_xsk_rx_fill_ring_empty_descs_total{interface=\"eth0\",queue=\"1\"} 9\n",
            "xvs_xsk_fill_ring_frames{interface=\"eth0\",queue=\"1\"} 60\n",
            "xvs_xsk_tx_inflight_frames{interface=\"eth0\",queue=\"1\"} 5\n",
            "# TYPE xvs_xsk_fill_ring_frames gauge\n",
        ] {
            assert!(o.0.contains(line), "{line} in {}", o.0);
        }
        // A counter a worker has not published yet never makes a negative gauge.
        let early = SocketView {
            received: 3,
            ..SocketView::default()
        };
        assert_eq!(early.fill_frames(), 0);
    }
}
