//! The sections only the slowpath reads: `[[neighbours]]`, `[health]` (and each service's
//! `health`), `[kubernetes]`, `[admin]` and `[log]`.

use std::collections::HashMap;

use super::{Found, err, fmt_ip};
use crate::schema::Config;
use crate::span::KeyPath;

pub(super) fn neighbours(c: &Config, out: &mut Found) {
    let mut seen = HashMap::new();
    for (i, n) in c.neighbours.iter().enumerate() {
        let p = KeyPath::of(&["neighbours"]).index(i);
        if let Some(first) = seen.insert(n.ip, i) {
            err(
                out,
                p.key("ip"),
                format!("{} already has neighbours[{first}]", n.ip),
            );
        }
        if n.mac.0[0] & 1 == 1 || n.mac.0 == [0; 6] {
            err(out, p.key("mac"), format!("{} is not a unicast MAC", n.mac));
        }
    }
}

pub(super) fn health(c: &Config, out: &mut Found) {
    let h = &c.health;
    let at = |k: &str| KeyPath::of(&["health", k]);
    if h.interval.get().is_zero() {
        err(out, at("interval"), "must be positive");
    }
    if h.timeout.get().is_zero() || h.timeout > h.interval {
        err(
            out,
            at("timeout"),
            "must be positive and no longer than interval",
        );
    }
    if h.rise == 0 {
        err(out, at("rise"), "must be at least 1");
    }
    if h.fall == 0 {
        err(out, at("fall"), "must be at least 1");
    }
    if let Err(e) = crate::health::check_path(&h.http_path) {
        err(out, at("http_path"), e);
    }
    if let Err(e) = crate::health::check_statuses(&h.http_status) {
        err(out, at("http_status"), e);
    }
    for (i, s) in c.services.iter().enumerate() {
        let at = |k: &str| KeyPath::of(&["services"]).index(i).key("health").key(k);
        let own = &s.health;
        if own.port == Some(0) {
            err(out, at("port"), "port 0 cannot be probed");
        }
        if let Some(p) = &own.http_path
            && let Err(e) = crate::health::check_path(p)
        {
            err(out, at("http_path"), e);
        }
        if let Some(st) = &own.http_status
            && let Err(e) = crate::health::check_statuses(st)
        {
            err(out, at("http_status"), e);
        }
        if own.http_status.as_ref().is_some_and(Vec::is_empty) {
            err(
                out,
                at("http_status"),
                "an empty list takes no status; leave the key out for any 2xx or 3xx",
            );
        }
        for (key, v) in [("rise", own.rise), ("fall", own.fall)] {
            if v == Some(0) {
                err(out, at(key), "must be at least 1");
            }
        }
    }
}

pub(super) fn kubernetes(c: &Config, out: &mut Found) {
    let Some(k) = &c.kubernetes else { return };
    let at = |key: &str| KeyPath::of(&["kubernetes", key]);
    if k.min_sync_period > k.sync_period {
        err(
            out,
            at("min_sync_period"),
            "must not be longer than sync_period",
        );
    }
    if k.sync_period.get().is_zero() {
        err(out, at("sync_period"), "must be positive");
    }
    if k.service_cidrs.len() > crate::SERVICE_CIDRS_MAX {
        err(
            out,
            at("service_cidrs"),
            format!(
                "{} CIDRs: at most {} (with the ServiceCIDR objects' together)",
                k.service_cidrs.len(),
                crate::SERVICE_CIDRS_MAX
            ),
        );
    }
    for (i, cidr) in k.service_cidrs.iter().enumerate() {
        let own = c
            .node
            .addresses
            .iter()
            .chain(&c.dataplane.snat_addresses)
            .find(|a| cidr.contains(**a));
        if let Some(a) = own {
            err(
                out,
                at("service_cidrs").index(i),
                format!(
                    "{cidr} contains {} (one of this node's own addresses: [node] addresses, [dataplane] snat_addresses): packets to it would be dropped",
                    fmt_ip(*a)
                ),
            );
        }
    }
    if !c.services.is_empty() {
        err(
            out,
            KeyPath::of(&["services"]),
            "[[services]] is the static source; remove it or remove [kubernetes]",
        );
    }
}

pub(super) fn admin(c: &Config, out: &mut Found) {
    let a = &c.admin;
    let at = |k: &str| KeyPath::of(&["admin", k]);
    let (listen, healthz) = (a.listen, a.healthz_listen());
    // Identical addresses mean one listener serves both.
    if listen != healthz && overlap(listen, healthz) {
        err(
            out,
            at("healthz_listen"),
            format!(
                "{healthz} overlaps admin.listen {listen}: both cannot be bound; give them different ports, or the same address to serve both on one listener"
            ),
        );
    }
    if let Some(metrics) = a.metrics_listen {
        // A listener of its own: even the same address as another would serve that one's
        // endpoints, which is what it exists to keep apart.
        for (key, other) in [("listen", listen), ("healthz_listen", healthz)] {
            if metrics == other || overlap(metrics, other) {
                err(
                    out,
                    at("metrics_listen"),
                    format!(
                        "{metrics} overlaps admin.{key} {other}: both cannot be bound; give metrics_listen a port of its own"
                    ),
                );
            }
        }
    }
    if let Some(socket) = &a.socket
        && (!socket.is_absolute() || socket.file_name().is_none())
    {
        err(
            out,
            at("socket"),
            format!("{} is not an absolute path to a file", socket.display()),
        );
    }
}

/// Whether binding `a` and `b` collides: the same port on the same address, or on an address
/// and the wildcard of its family (port 0 asks for a fresh port each time).
fn overlap(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Levels a `[log] level` filter may name.
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

pub(super) fn log(c: &Config, out: &mut Found) {
    let level = c.log.level.trim();
    let bad = |item: &str| -> Option<String> {
        let (target, lvl) = match item.split_once('=') {
            Some((t, l)) => (Some(t.trim()), l.trim()),
            None => (None, item.trim()),
        };
        let target_ok = target.is_none_or(|t| {
            !t.is_empty()
                && t.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | ':' | '-'))
        });
        let level_ok = LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(lvl));
        (!(target_ok && level_ok)).then(|| item.to_owned())
    };
    let problems: Vec<String> = if level.is_empty() {
        vec![String::new()]
    } else {
        level.split(',').filter_map(bad).collect()
    };
    if let Some(first) = problems.first() {
        err(
            out,
            KeyPath::of(&["log", "level"]),
            format!(
                "{first:?} is not a log filter item: use a level ({}) or target=level, separated by commas",
                LOG_LEVELS.join(", ")
            ),
        );
    }
}
