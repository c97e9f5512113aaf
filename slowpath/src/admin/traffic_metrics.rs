//! The `/metrics` families of the traffic statistics (`ipvsadm --stats` per service and per
//! backend; see [`crate::traffic`]): counters only, rates are Prometheus's `rate()`.
//!
//! Labels are the service's name and the backend's address, as on the other per-backend
//! families, and `direction` (`in`: client to backend, `out`: backend to client). So that a
//! large cluster does not flood a scrape, per-backend series stop after
//! [`BACKEND_SERIES_MAX`] backends (in snapshot order); `xvs_traffic_backends_omitted` says
//! how many were left out, and their traffic is still in their services' series.

use super::metrics::Out;
use super::views::{ServiceView, TrafficView};

/// Most backends with traffic series of their own in one scrape.
pub const BACKEND_SERIES_MAX: usize = 1000;

/// A family of [`TrafficView`] counters: its name's stem, help, and its value (client to
/// backend, backend to client when `directed`).
struct Family {
    stem: &'static str,
    help: &'static str,
    directed: bool,
    get: fn(&TrafficView) -> (u64, u64),
}

const FAMILIES: [Family; 3] = [
    Family {
        stem: "connections",
        help: "Connections (flows) created",
        directed: false,
        get: |t| (t.conns, 0),
    },
    Family {
        stem: "packets",
        help: "Packets forwarded, by direction (in: client to backend, out: backend to client)",
        directed: true,
        get: |t| (t.in_pkts, t.out_pkts),
    },
    Family {
        stem: "bytes",
        help: "Bytes forwarded (IP length), by direction (in: client to backend, out: backend to client)",
        directed: true,
        get: |t| (t.in_bytes, t.out_bytes),
    },
];

fn samples(o: &mut Out, name: &str, labels: &[(&str, &str)], fam: &Family, t: &TrafficView) {
    let (a, b) = (fam.get)(t);
    if !fam.directed {
        o.sample(name, labels, a as f64);
        return;
    }
    for (dir, v) in [("in", a), ("out", b)] {
        let mut l = labels.to_vec();
        l.push(("direction", dir));
        o.sample(name, &l, v as f64);
    }
}

/// Writes the service and backend traffic families.
pub(super) fn render(o: &mut Out, services: &[ServiceView]) {
    for fam in &FAMILIES {
        let name = format!("xvs_service_{}_total", fam.stem);
        o.family(&name, "counter", &format!("{} per service.", fam.help));
        for s in services {
            samples(o, &name, &[("service", &s.name)], fam, &s.stats);
        }
    }
    let backends: usize = services.iter().map(|s| s.backends.len()).sum();
    for fam in &FAMILIES {
        let name = format!("xvs_backend_{}_total", fam.stem);
        o.family(&name, "counter", &format!("{} per backend.", fam.help));
        let each = services
            .iter()
            .flat_map(|s| s.backends.iter().map(move |b| (s, b)))
            .take(BACKEND_SERIES_MAX);
        for (s, b) in each {
            let addr = b.addr.to_string();
            samples(
                o,
                &name,
                &[("service", &s.name), ("backend", &addr)],
                fam,
                &b.stats,
            );
        }
    }
    o.single(
        "xvs_traffic_backends_omitted",
        "gauge",
        "Backends without per-backend traffic series in this scrape (over the limit of 1000; their traffic is in their services' series).",
        backends.saturating_sub(BACKEND_SERIES_MAX) as f64,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::BackendView;

    #[test]
    fn backend_series_stop_at_the_limit_and_say_how_many_were_left_out() {
        let backend = |i: usize| BackendView {
            addr: format!("198.18.{}.{}:80", i / 250, i % 250 + 1)
                .parse()
                .unwrap(),
            weight: 1,
            usable: true,
            health: None,
            active: 0,
            inactive: 0,
            stats: TrafficView {
                conns: 1,
                ..TrafficView::default()
            },
            rate: Default::default(),
        };
        let services: Vec<ServiceView> = (0..3)
            .map(|k| ServiceView {
                name: format!("s{k}"),
                backends: (0..400).map(|i| backend(k * 400 + i)).collect(),
                stats: TrafficView {
                    conns: 400,
                    ..TrafficView::default()
                },
                ..ServiceView::default()
            })
            .collect();
        let mut o = Out(String::new());
        render(&mut o, &services);
        let lines = |p: &str| o.0.lines().filter(|l| l.starts_with(p)).count();
        assert_eq!(lines("xvs_backend_connections_total{"), BACKEND_SERIES_MAX);
        assert_eq!(lines("xvs_backend_packets_total{"), 2 * BACKEND_SERIES_MAX);
        assert_eq!(lines("xvs_service_connections_total{"), 3);
        assert!(
            o.0.contains("xvs_traffic_backends_omitted 200\n"),
            "{}",
            o.0
        );
        assert!(o.0.contains("xvs_service_connections_total{service=\"s2\"} 400\n"));
    }
}
