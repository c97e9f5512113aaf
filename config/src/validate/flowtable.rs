//! `[flowtable]`, `[timeouts]` and `[synproxy]`: the flow table's size and what its flows
//! may hold.

use super::{Found, err};
use crate::schema::Config;
use crate::span::KeyPath;

/// Largest flow table `xvs` accepts: 2^30 flows (about 90 GiB). Below the flow table's own
/// limit (2^31, entry numbers in 31 bits), which the daemon checks at compile time; the memory
/// a machine has is checked by `xvs run`.
pub const FLOWS_MAX: u32 = 1 << 30;
/// Bytes a flow costs in the flow table (a 64-byte entry, an IPv6 flow two; 3.2 index words
/// of 8 bytes), to say what a capacity needs; the daemon's tests keep it honest.
pub const FLOW_BYTES: u64 = 90;
/// Largest `[flowtable] backends_max`: lb-algos' limit of backends per scheduler. Each one
/// has a connection counter and a SYN-watch word allocated at start-up.
pub const BACKENDS_MAX: u32 = 1 << 20;

pub(super) fn flowtable(c: &Config, out: &mut Found) {
    let ft = &c.flowtable;
    if ft.capacity == 0 || ft.capacity > FLOWS_MAX {
        let gib = |flows: u64| (flows * FLOW_BYTES) as f64 / f64::from(1u32 << 30);
        err(
            out,
            KeyPath::of(&["flowtable", "capacity"]),
            format!(
                "{} flows is outside 1..={FLOWS_MAX}: the table is allocated at start-up, {FLOW_BYTES} bytes a flow ({:.1} GiB here, {:.0} GiB at most)",
                ft.capacity,
                gib(u64::from(ft.capacity)),
                gib(u64::from(FLOWS_MAX))
            ),
        );
    }
    if ft.backends_max == 0 || ft.backends_max > BACKENDS_MAX {
        err(
            out,
            KeyPath::of(&["flowtable", "backends_max"]),
            format!(
                "{} is outside 1..={BACKENDS_MAX} (counters for every backend are allocated at start-up)",
                ft.backends_max
            ),
        );
    }
    if let Some(g) = ft.removal_grace {
        let min_sync = c
            .kubernetes
            .as_ref()
            .map_or(std::time::Duration::from_secs(1), |k| {
                k.min_sync_period.get()
            });
        if g.get() <= 2 * min_sync {
            err(
                out,
                KeyPath::of(&["flowtable", "removal_grace"]),
                format!(
                    "{g} is not longer than two min_sync_periods ({:?}): an endpoint that moves between EndpointSlices would lose its flows",
                    2 * min_sync
                ),
            );
        }
    }
    let backends: usize = c.services.iter().map(|s| s.backends.len()).sum();
    if backends > ft.backends_max as usize {
        err(
            out,
            KeyPath::of(&["flowtable", "backends_max"]),
            format!(
                "{backends} static backends exceed backends_max = {}",
                ft.backends_max
            ),
        );
    }
}

pub(super) fn timeouts(c: &Config, out: &mut Found) {
    let t = &c.timeouts;
    for (key, d) in [
        ("tcp_established", t.tcp_established),
        ("tcp_syn", t.tcp_syn),
        ("tcp_syn_pressure", t.tcp_syn_pressure),
        ("tcp_fin_wait", t.tcp_fin_wait),
        ("tcp_close_wait", t.tcp_close_wait),
        ("tcp_last_ack", t.tcp_last_ack),
        ("tcp_time_wait", t.tcp_time_wait),
        ("tcp_close", t.tcp_close),
        ("udp", t.udp),
        ("icmp", t.icmp),
        ("sctp", t.sctp),
        ("fragment", t.fragment),
    ] {
        if d.get().as_secs() == 0 && d.get().subsec_millis() == 0 {
            err(
                out,
                KeyPath::of(&["timeouts", key]),
                "a timeout must be at least 1ms",
            );
        } else if d.get().as_secs() > u64::from(u32::MAX) / 1000 {
            err(
                out,
                KeyPath::of(&["timeouts", key]),
                "a timeout must be under 49 days",
            );
        }
    }
}

pub(super) fn synproxy(c: &Config, out: &mut Found) {
    let Some(t) = c.synproxy.auto_threshold else {
        return synproxy_services(c, out);
    };
    if t == 0 || t >= c.flowtable.capacity {
        err(
            out,
            KeyPath::of(&["synproxy", "auto_threshold"]),
            format!(
                "{t} embryonic flows: must be between 1 and flowtable.capacity - 1 ({}); use mode = \"on\" or \"off\" instead",
                c.flowtable.capacity.saturating_sub(1)
            ),
        );
    }
    synproxy_services(c, out);
}

fn synproxy_services(c: &Config, out: &mut Found) {
    for (i, s) in c.services.iter().enumerate() {
        if s.synproxy == Some(crate::schema::SynproxyMode::On) && s.protocol != vocab::Protocol::Tcp
        {
            err(
                out,
                KeyPath::of(&["services"]).index(i).key("synproxy"),
                format!(
                    "the SYN proxy is for TCP services, not {}",
                    s.protocol.name()
                ),
            );
        }
    }
}
