//! `[[services]]`: each static service's frontend, scheduler, policies and backends.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use vocab::{Mode, SchedulerKind};

use super::{Found, MH_TABLE_SIZE_MAX, err, fmt_ip, is_prime};
use crate::schema::{Config, SchedFlag, Service};
use crate::span::KeyPath;

/// Longest wrr sequence (sum of weights / their gcd) the snapshot builder builds
/// (lb-algos' `wrr::SEQUENCE_MAX`).
pub const WRR_SEQUENCE_MAX: u64 = 1 << 20;
/// Kubernetes caps sessionAffinityConfig.clientIP.timeoutSeconds at one day.
const AFFINITY_TIMEOUT_MAX_S: u64 = 86400;

pub(super) fn services(c: &Config, out: &mut Found) {
    let mut names = HashMap::new();
    let mut frontends = HashMap::new();
    for (i, s) in c.services.iter().enumerate() {
        let p = KeyPath::of(&["services"]).index(i);
        if s.name.is_empty() {
            err(out, p.key("name"), "a service needs a name");
        } else if let Some(first) = names.insert(s.name.as_str(), i) {
            err(
                out,
                p.key("name"),
                format!("name {:?} is already used by services[{first}]", s.name),
            );
        }
        if let Some(first) = frontends.insert((s.vip, s.port, s.protocol), i) {
            err(
                out,
                p.key("vip"),
                format!(
                    "duplicate frontend {}:{}/{}: services[{first}] already uses it",
                    fmt_ip(s.vip),
                    s.port,
                    s.protocol.name()
                ),
            );
        }
        service_settings(c, s, &p, out);
        service_backends(c, s, &p, out);
    }
}

/// One service's frontend and scheduler flags, then its policies.
fn service_settings(c: &Config, s: &Service, p: &KeyPath, out: &mut Found) {
    if s.port == 0 {
        err(out, p.key("port"), "port 0 is not a valid frontend port");
    }
    if let Some(why) = crate::special_address(s.vip) {
        err(
            out,
            p.key("vip"),
            format!("{} cannot be a virtual IP: it is {why}", s.vip),
        );
    } else if c.node.addresses.contains(&s.vip) {
        err(
            out,
            p.key("vip"),
            format!(
                "{} is this node's own address (node.addresses): a service may not take it",
                s.vip
            ),
        );
    }
    for (j, f) in s.flags.iter().enumerate() {
        if s.scheduler != SchedulerKind::Mh {
            let name = match f {
                SchedFlag::MhPort => "mh-port",
                SchedFlag::MhFallback => "mh-fallback",
            };
            err(
                out,
                p.key("flags").index(j),
                format!(
                    "flag {name} only applies to scheduler mh, not {}",
                    s.scheduler.name()
                ),
            );
        }
    }
    service_policies(c, s, p, out);
}

/// One service's affinity timeout, rate limit and forwarding mode.
fn service_policies(c: &Config, s: &Service, p: &KeyPath, out: &mut Found) {
    let default_mode = c.dataplane.mode;
    let has_snat = |v4: bool| c.dataplane.snat_addresses.iter().any(|a| a.is_ipv4() == v4);
    if let Some(t) = s.session_affinity_timeout {
        let secs = t.get().as_secs();
        if secs == 0 || secs > AFFINITY_TIMEOUT_MAX_S {
            err(
                out,
                p.key("session_affinity_timeout"),
                format!("must be between 1s and {AFFINITY_TIMEOUT_MAX_S}s (Kubernetes' limit)"),
            );
        }
    }
    match (s.new_conn_rate, s.new_conn_burst) {
        (Some(0), _) => err(
            out,
            p.key("new_conn_rate"),
            "must be at least 1 (new connections per second); remove it for no limit".to_owned(),
        ),
        (_, Some(0)) => err(
            out,
            p.key("new_conn_burst"),
            "must be at least 1".to_owned(),
        ),
        (None, Some(_)) => err(
            out,
            p.key("new_conn_burst"),
            "needs new_conn_rate (the burst of which rate?)".to_owned(),
        ),
        _ => {}
    }
    if s.mode_or(default_mode) == Mode::Fullnat && !has_snat(s.vip.is_ipv4()) {
        let family = if s.vip.is_ipv4() { "IPv4" } else { "IPv6" };
        err(
            out,
            p.key("mode"),
            format!(
                "full-NAT needs an {family} address in dataplane.snat_addresses (or mode = \"nat\")"
            ),
        );
    }
}

/// One service's backends: in the VIP's family, usable, listed once, weighted within
/// bounds, and as many as its scheduler takes.
fn service_backends(c: &Config, s: &Service, p: &KeyPath, out: &mut Found) {
    let mut backends = HashSet::new();
    for (j, b) in s.backends.iter().enumerate() {
        let bp = p.key("backends").index(j);
        if b.addr.is_ipv4() != s.vip.is_ipv4() {
            err(
                out,
                bp.key("addr"),
                format!("{} is not in the VIP's address family", b.addr),
            );
        } else if b.addr.port() == 0 {
            err(
                out,
                bp.key("addr"),
                format!("{}: port 0 is not a valid backend port", b.addr),
            );
        } else if let Some(why) = bad_backend(c, b.addr.ip()) {
            err(
                out,
                bp.key("addr"),
                format!("{} cannot be a backend: {why}", b.addr),
            );
        } else if !backends.insert(b.addr) {
            err(out, bp.key("addr"), format!("{} is listed twice", b.addr));
        }
        if b.weight > 65535 {
            err(
                out,
                bp.key("weight"),
                format!("{} is above the maximum weight 65535", b.weight),
            );
        }
    }
    if let Some(msg) = scheduler_limit(s, c.dataplane.mh_table_size) {
        err(out, p.key("backends"), msg);
    }
}

/// Why `ip` cannot be a backend's address: a special address, the node's own, or a VIP (the
/// rules the Kubernetes source applies to endpoints).
fn bad_backend(c: &Config, ip: IpAddr) -> Option<String> {
    if let Some(why) = crate::special_address(ip) {
        return Some(format!("it is {why}"));
    }
    if c.node.addresses.contains(&ip) {
        return Some("it is this node's own address (node.addresses)".to_owned());
    }
    let (i, s) = c.services.iter().enumerate().find(|(_, s)| s.vip == ip)?;
    Some(format!("it is the VIP of services[{i}] ({})", s.name))
}

/// What the snapshot builder (lb-algos) would refuse in a scheduler for these weights: a
/// wrr sequence longer than [`WRR_SEQUENCE_MAX`], or more Maglev turns per round than table
/// slots. The arithmetic is lb-algos' (`wrr::sequence`, `Maglev::build`); `xvs check` also
/// runs the builder itself.
fn scheduler_limit(s: &crate::schema::Service, mh_table_size: u32) -> Option<String> {
    fn gcd(mut a: u64, mut b: u64) -> u64 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
    let weights = || s.backends.iter().map(|b| u64::from(b.weight.min(65535)));
    match s.scheduler {
        SchedulerKind::Wrr => {
            let g = weights().filter(|&w| w > 0).fold(0, gcd);
            let len: u64 = if g == 0 {
                0
            } else {
                weights().map(|w| w / g).sum()
            };
            (len > WRR_SEQUENCE_MAX).then(|| {
                format!(
                    "the wrr sequence (sum of weights / their gcd) has {len} entries, above {WRR_SEQUENCE_MAX}: reduce the weights or their spread"
                )
            })
        }
        SchedulerKind::Mh if is_prime(mh_table_size) && mh_table_size <= MH_TABLE_SIZE_MAX => {
            let fallback = s.has_flag(SchedFlag::MhFallback);
            let members: Vec<u64> = weights().filter(|&w| fallback || w > 0).collect();
            if !weights().any(|w| w > 0) {
                return None;
            }
            let g = members.iter().fold(0, |g, &w| gcd(g, w)).max(1);
            let max_reduced = members.iter().max().copied().unwrap_or(0) / g;
            let shift =
                (64 - max_reduced.leading_zeros()).saturating_sub(mh_table_size.ilog2() / 2);
            let round: u64 = members.iter().map(|&w| ((w / g) >> shift).max(1)).sum();
            (round > u64::from(mh_table_size)).then(|| {
                format!(
                    "{round} Maglev turns per round (backends x reduced weights) exceed dataplane.mh_table_size {mh_table_size}: some backends would get no slot; raise mh_table_size (about 100 x backends)"
                )
            })
        }
        _ => None,
    }
}
