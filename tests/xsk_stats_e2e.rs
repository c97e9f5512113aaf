//! End to end, as root, in the netns lab of `scripts/lab`: frames the kernel drops before a
//! worker sees them are exported. A worker that does not keep up (here: xvs stopped with
//! SIGSTOP while a bounded burst arrives, and small rings) leaves the kernel nothing to
//! receive into; the socket's `XDP_STATISTICS` say so in `/metrics` (`xvs_xsk_*`, labelled
//! by interface and queue) and the losses are in `xvs_drops_total`. Once the worker runs
//! again it refills its ring and forwards.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// A sample's value in a Prometheus text (`None` when absent).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

fn metrics(lab: &Lab) -> String {
    let (code, body) = admin(lab, "GET", "/metrics");
    assert_eq!(code, "200", "{body}");
    body
}

/// Resumes a stopped process when dropped (the test may fail while xvs is stopped).
struct Stopped(i32);

impl Drop for Stopped {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

const C0: &str = "{interface=\"xvs-c0\",queue=\"0\"}";

#[test]
fn a_worker_that_does_not_keep_up_shows_in_the_sockets_statistics_and_drops() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    // 64-frame rings: the kernel has 64 frames to receive into while the worker sleeps.
    let config = lab_config().replace("batch_size = 64", "batch_size = 64\nrx_ring_size = 64");
    lab.start_xvs(&config);
    let reply = lab.udp("198.18.100.1", 9000, 40201, "before");
    assert!(reply.ends_with(" before"), "{reply}");

    let m = metrics(&lab);
    for family in [
        "xvs_xsk_rx_dropped_total",
        "xvs_xsk_rx_ring_full_total",
        "xvs_xsk_rx_fill_ring_empty_descs_total",
    ] {
        assert_eq!(sample(&m, &format!("{family}{C0}")), Some(0.0), "{m}");
    }
    assert_eq!(
        sample(&m, "xvs_drops_total{reason=\"xsk_rx_dropped\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample(&m, &format!("xvs_xsk_fill_ring_frames{C0}")),
        Some(64.0)
    );

    // The worker stops; 2000 datagrams (at most 5 s of sending) arrive.
    let pid = lab.xvs.as_ref().unwrap().id() as i32;
    let stopped = Stopped(pid);
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let sent = lab.exec(
        "c",
        &[
            "python3",
            "-c",
            "import socket, time\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             end, n = time.monotonic() + 5, 0\n\
             while n < 2000 and time.monotonic() < end:\n\
             \x20   s.sendto(b'x' * 64, ('198.18.100.1', 9000)); n += 1\n\
             print(n)",
        ],
    );
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let sent: f64 = String::from_utf8_lossy(&sent.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(sent > 200.0, "sent {sent}");
    drop(stopped);

    // Running again, it refills its fill ring; the statistics stay.
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = metrics(&lab);
        if sample(&m, &format!("xvs_xsk_fill_ring_frames{C0}")) == Some(64.0)
            || Instant::now() > deadline
        {
            break m;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let dropped = sample(&m, &format!("xvs_xsk_rx_dropped_total{C0}")).unwrap();
    let ring_full = sample(&m, &format!("xvs_xsk_rx_ring_full_total{C0}")).unwrap();
    let empty = sample(&m, &format!("xvs_xsk_rx_fill_ring_empty_descs_total{C0}")).unwrap();
    // The kernel had 64 frames to receive into: the rest of the burst was lost, counted as
    // one or the other (copy mode counts a frame it had no buffer for as rx_dropped; with
    // a fill ring no deeper than the rx ring, the rx ring cannot overflow first).
    let lost = dropped + ring_full;
    assert!(lost > 0.0 && lost <= sent, "lost {lost} of {sent}:\n{m}");
    assert!(empty > 0.0, "the fill ring ran empty:\n{m}");
    assert_eq!(
        sample(&m, "xvs_drops_total{reason=\"xsk_rx_dropped\"}"),
        Some(dropped),
        "{m}"
    );
    assert_eq!(
        sample(&m, "xvs_drops_total{reason=\"xsk_rx_ring_full\"}"),
        Some(ring_full),
        "{m}"
    );
    assert_eq!(
        sample(&m, &format!("xvs_xsk_fill_ring_frames{C0}")),
        Some(64.0),
        "{m}"
    );
    // The backend side received nothing of it.
    assert_eq!(
        sample(
            &m,
            "xvs_xsk_rx_dropped_total{interface=\"xvs-b0\",queue=\"0\"}"
        ),
        Some(0.0),
        "{m}"
    );
    // And it forwards again.
    let reply = lab.udp("198.18.100.1", 9000, 40202, "after");
    assert!(reply.ends_with(" after"), "{reply}");
    lab.stop_xvs();
}
