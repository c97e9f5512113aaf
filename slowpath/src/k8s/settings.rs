//! What a Service's annotations and fields say for all of its specs: scheduler, flags,
//! mode, session affinity, weights, rate limit, SYN proxy, health check ([`common`]), and its
//! source ranges ([`source_ranges`]). An invalid value falls back to the default with a
//! [`Problem`](super::Problem); the health-check annotations fall back together ([`health`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use config::{
    Cidr, Config, Encap, Mode, ProbeKind, SchedFlag, SchedulerKind, ServiceHealth, SynproxyMode,
};
use fastpath::snapshot::{RateLimit, SynproxySetting};
use k8s_openapi::api::core::v1::{Service, ServiceSpec as K8sServiceSpec};

use super::translate::Out;
use super::{
    ANN_DSR_ENCAP, ANN_HEALTH_FALL, ANN_HEALTH_PATH, ANN_HEALTH_PORT, ANN_HEALTH_PROBE,
    ANN_HEALTH_RISE, ANN_HEALTH_STATUS, ANN_LB_SOURCE_RANGES, ANN_MODE, ANN_NEW_CONN_BURST,
    ANN_NEW_CONN_RATE, ANN_SCHEDULER, ANN_SCHEDULER_FLAGS, ANN_SYNPROXY, ANN_WEIGHTS, ProblemKind,
};

/// The session affinity timeout when a ClientIP Service does not set one (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u64 = 10800;

/// Settings shared by every spec of one Service.
pub(super) struct Common {
    pub(super) scheduler: SchedulerKind,
    pub(super) flags: Vec<SchedFlag>,
    pub(super) mode: Mode,
    pub(super) affinity_timeout: Option<Duration>,
    pub(super) weights: HashMap<IpAddr, u32>,
    pub(super) rate_limit: Option<RateLimit>,
    pub(super) synproxy: SynproxySetting,
    pub(super) health: ServiceHealth,
}

pub(super) fn common(
    svc: &Service,
    spec: &K8sServiceSpec,
    cfg: &Config,
    object: &str,
    out: &mut Out,
) -> Common {
    let ann = |k: &str| {
        svc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(|v| v.trim())
    };
    // One annotation after the other, so a Service's problems come in this order.
    let scheduler = scheduler(&ann, cfg, object, out);
    let flags = scheduler_flags(&ann, object, out);
    let mode = mode(&ann, spec, cfg, object, out);
    let affinity_timeout = affinity_timeout(spec);
    let weights = weights(&ann, object, out);
    let rate_limit = rate_limit(&ann, object, out);
    let synproxy_mode = synproxy_mode(&ann, mode, cfg, object, out);
    Common {
        health: health(&ann, object, out),
        synproxy: SynproxySetting::of(synproxy_mode, cfg),
        scheduler,
        flags,
        mode,
        affinity_timeout,
        weights,
        rate_limit,
    }
}

/// `xvs.io/scheduler`, else `[kubernetes] default_scheduler`.
fn scheduler<'a>(
    ann: &impl Fn(&str) -> Option<&'a str>,
    cfg: &Config,
    object: &str,
    out: &mut Out,
) -> SchedulerKind {
    let default_scheduler = cfg
        .kubernetes
        .as_ref()
        .map(|k| k.default_scheduler)
        .unwrap_or_default();
    match ann(ANN_SCHEDULER) {
        None => default_scheduler,
        Some(v) => match v.parse::<SchedulerKind>() {
            Ok(s) => s,
            Err(_) => {
                out.problem(
                    object,
                    ProblemKind::Invalid,
                    format!(
                        "{ANN_SCHEDULER}: unknown scheduler {v:?}; using {}",
                        default_scheduler.name()
                    ),
                );
                default_scheduler
            }
        },
    }
}

/// `xvs.io/scheduler-flags`: the known flags; an unknown one is left out.
fn scheduler_flags<'a>(
    ann: &impl Fn(&str) -> Option<&'a str>,
    object: &str,
    out: &mut Out,
) -> Vec<SchedFlag> {
    let mut flags = Vec::new();
    for f in ann(ANN_SCHEDULER_FLAGS)
        .into_iter()
        .flat_map(|v| v.split(','))
    {
        match f.trim() {
            "" => {}
            "mh-port" => flags.push(SchedFlag::MhPort),
            "mh-fallback" => flags.push(SchedFlag::MhFallback),
            other => out.problem(
                object,
                ProblemKind::Invalid,
                format!("{ANN_SCHEDULER_FLAGS}: unknown flag {other:?}; ignored"),
            ),
        }
    }
    flags
}

/// `xvs.io/mode`, else `[dataplane] mode`; `xvs.io/dsr-encap` only goes with `dsr`.
fn mode<'a>(
    ann: &impl Fn(&str) -> Option<&'a str>,
    spec: &K8sServiceSpec,
    cfg: &Config,
    object: &str,
    out: &mut Out,
) -> Mode {
    let mode = match ann(ANN_MODE) {
        None => cfg.dataplane.mode,
        Some("nat") => Mode::Nat,
        Some("fullnat") => Mode::Fullnat,
        Some("dsr") => dsr(ann, spec, cfg, object, out),
        Some(v) => {
            out.problem(
                object,
                ProblemKind::Invalid,
                format!(
                    "{ANN_MODE}: unknown mode {v:?}; using {}",
                    cfg.dataplane.mode.name()
                ),
            );
            cfg.dataplane.mode
        }
    };
    if let (Some(v), false) = (ann(ANN_DSR_ENCAP), ann(ANN_MODE) == Some("dsr")) {
        out.problem(
            object,
            ProblemKind::Invalid,
            format!("{ANN_DSR_ENCAP}: {v:?} applies to {ANN_MODE}: dsr only; ignored"),
        );
    }
    mode
}

/// The ClientIP affinity timeout of `sessionAffinityConfig`, else the default.
fn affinity_timeout(spec: &K8sServiceSpec) -> Option<Duration> {
    (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        let t = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u64::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_S);
        Duration::from_secs(t)
    })
}

/// `xvs.io/weights`; when invalid, every endpoint weighs 1 (an empty map).
fn weights<'a>(
    ann: &impl Fn(&str) -> Option<&'a str>,
    object: &str,
    out: &mut Out,
) -> HashMap<IpAddr, u32> {
    let Some(v) = ann(ANN_WEIGHTS) else {
        return HashMap::new();
    };
    parse_weights(v).unwrap_or_else(|e| {
        out.problem(
            object,
            ProblemKind::Invalid,
            format!("{ANN_WEIGHTS}: {e}; every endpoint weighs 1"),
        );
        HashMap::new()
    })
}

/// `xvs.io/new-conn-rate` and `-burst` (the burst defaults to the rate).
fn rate_limit<'a>(
    ann: &impl Fn(&str) -> Option<&'a str>,
    object: &str,
    out: &mut Out,
) -> Option<RateLimit> {
    let mut positive = |key: &str, v: &str| match v.trim().parse::<u32>() {
        Ok(n) if n > 0 => Some(n),
        _ => {
            out.problem(
                object,
                ProblemKind::Invalid,
                format!("{key}: {v:?} is not a positive integer; ignored"),
            );
            None
        }
    };
    let rate = ann(ANN_NEW_CONN_RATE).and_then(|v| positive(ANN_NEW_CONN_RATE, v));
    let burst = ann(ANN_NEW_CONN_BURST).and_then(|v| positive(ANN_NEW_CONN_BURST, v));
    rate.map(|rate| RateLimit {
        rate,
        burst: burst.unwrap_or(rate),
    })
}

/// `xvs.io/synproxy`, else `[synproxy] mode`; off for a DSR Service.
fn synproxy_mode<'a>(
    ann: &impl Fn(&str) -> Option<&'a str>,
    mode: Mode,
    cfg: &Config,
    object: &str,
    out: &mut Out,
) -> SynproxyMode {
    match ann(ANN_SYNPROXY) {
        // The SYN proxy needs the backend's replies, which a DSR Service never sees (the
        // snapshot builder turns it off for DSR specs whatever the settings say).
        Some(v) if mode.encap().is_some() && v != "off" => {
            out.problem(
                object,
                ProblemKind::Invalid,
                format!("{ANN_SYNPROXY}: {v:?} cannot apply to a DSR Service (the SYN proxy needs the replies, which go from the backend to the client); off"),
            );
            SynproxyMode::Off
        }
        None => cfg.synproxy.mode,
        Some(v) => SynproxyMode::from_name(v).unwrap_or_else(|| {
            out.problem(
                object,
                ProblemKind::Invalid,
                format!(
                    "{ANN_SYNPROXY}: unknown mode {v:?} (off, on or auto); using {}",
                    cfg.synproxy.mode.name()
                ),
            );
            cfg.synproxy.mode
        }),
    }
}

/// `xvs.io/mode: dsr`: direct server return with the encapsulation `xvs.io/dsr-encap` names
/// (default `ipip`). A Service whose DSR cannot work keeps the default mode
/// (`[dataplane] mode`) with one problem: an unknown encapsulation, or `ipip`/`gue` for a
/// family without an outer source address (`[node] addresses`, `[dataplane]
/// snat_addresses`, `ipip_source_prefix`).
fn dsr<'a>(
    ann: &impl Fn(&str) -> Option<&'a str>,
    spec: &K8sServiceSpec,
    cfg: &Config,
    object: &str,
    out: &mut Out,
) -> Mode {
    let fallback = cfg.dataplane.mode;
    let encap = match ann(ANN_DSR_ENCAP) {
        None => Encap::default(),
        Some(v) => match Encap::from_name(v) {
            Some(e) => e,
            None => {
                out.problem(
                    object,
                    ProblemKind::Invalid,
                    format!(
                        "{ANN_DSR_ENCAP}: unknown encapsulation {v:?} (ipip, gue or l2); {ANN_MODE}: dsr not applied, using {}",
                        fallback.name()
                    ),
                );
                return fallback;
            }
        },
    };
    if encap != Encap::L2 {
        // The Service's families: its ipFamilies, else its clusterIPs'.
        let ips = spec
            .cluster_ips
            .iter()
            .flatten()
            .filter_map(|s| s.parse::<IpAddr>().ok());
        let v6s = (spec.ip_families.iter().flatten().map(|f| f == "IPv6"))
            .chain(ips.map(|a| a.is_ipv6()));
        if let Some(v6) = v6s.into_iter().find(|v6| !cfg.has_dsr_source(*v6)) {
            let f = if v6 { "IPv6" } else { "IPv4" };
            out.problem(
                object,
                ProblemKind::Invalid,
                format!(
                    "{ANN_MODE}: dsr with {} needs an {f} outer source address (node.addresses, dataplane.snat_addresses or dataplane.ipip_source_prefix); using {}",
                    encap.name(),
                    fallback.name()
                ),
            );
            return fallback;
        }
    }
    Mode::Dsr(encap)
}

/// The Service's own health check from its `xvs.io/health-check-*` annotations. A Service is
/// probed only when `xvs.io/health-check-probe` says so (its endpoints' readiness is
/// otherwise the EndpointSlice's, the kubelet's probes); the other annotations say how, and
/// `[health]` fills in what they leave out. They are one setting: a check half of whose keys
/// were refused could probe the wrong port or path and take every endpoint down, so one bad
/// value (or how-to-probe annotations without `xvs.io/health-check-probe`) and none of them
/// applies: the endpoints are not probed, with a problem for each bad value.
fn health<'a>(
    ann: &impl Fn(&str) -> Option<&'a str>,
    object: &str,
    out: &mut Out,
) -> ServiceHealth {
    let not_probed = ServiceHealth {
        probe: Some(ProbeKind::None),
        ..ServiceHealth::default()
    };
    let mut h = ServiceHealth::default();
    let mut bad = Vec::new();
    let mut take = |key: &'static str, why: Result<(), String>| {
        if let Err(e) = why {
            bad.push((key, e));
        }
    };
    if let Some(v) = ann(ANN_HEALTH_PROBE) {
        take(ANN_HEALTH_PROBE, probe_kind(v).map(|k| h.probe = Some(k)));
    }
    if let Some(v) = ann(ANN_HEALTH_PORT) {
        take(ANN_HEALTH_PORT, port(v).map(|p| h.port = Some(p)));
    }
    if let Some(v) = ann(ANN_HEALTH_PATH) {
        take(
            ANN_HEALTH_PATH,
            config::health::check_path(v).map(|()| h.http_path = Some(v.to_owned())),
        );
    }
    if let Some(v) = ann(ANN_HEALTH_STATUS) {
        take(
            ANN_HEALTH_STATUS,
            config::health::parse_statuses(v).map(|s| h.http_status = Some(s)),
        );
    }
    for (key, slot) in [
        (ANN_HEALTH_RISE, &mut h.rise),
        (ANN_HEALTH_FALL, &mut h.fall),
    ] {
        if let Some(v) = ann(key) {
            take(key, positive(v).map(|n| *slot = Some(n)));
        }
    }
    if ann(ANN_HEALTH_PROBE).is_none() && h != ServiceHealth::default() {
        bad.push((
            ANN_HEALTH_PROBE,
            "not set, and the other xvs.io/health-check-* annotations only say how to probe"
                .to_owned(),
        ));
    }
    if bad.is_empty() {
        return match h.probe {
            Some(_) => h,
            None => not_probed,
        };
    }
    for (key, e) in bad {
        out.problem(
            object,
            ProblemKind::Invalid,
            format!(
                "{key}: {e}; the Service's health-check annotations are ignored (its endpoints are not probed)"
            ),
        );
    }
    not_probed
}

/// `xvs.io/health-check-probe`.
fn probe_kind(v: &str) -> Result<ProbeKind, String> {
    ProbeKind::from_name(v)
        .ok_or_else(|| format!("{v:?} is not a probe (none, tcp, http or https)"))
}

/// `xvs.io/health-check-port`.
fn port(v: &str) -> Result<u16, String> {
    match v.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("{v:?} is not a port (1-65535)")),
    }
}

/// `xvs.io/health-check-rise` and `-fall`.
fn positive(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{v:?} is not a positive integer")),
    }
}

/// Parses `IP=WEIGHT,IP=WEIGHT` (whitespace allowed around items).
pub(crate) fn parse_weights(v: &str) -> Result<HashMap<IpAddr, u32>, String> {
    let mut out = HashMap::new();
    for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (ip, w) = item
            .rsplit_once('=')
            .ok_or_else(|| format!("{item:?} is not IP=WEIGHT"))?;
        let ip: IpAddr = ip
            .trim()
            .parse()
            .map_err(|_| format!("{item:?}: not an IP"))?;
        let w: u32 = w
            .trim()
            .parse()
            .map_err(|_| format!("{item:?}: weight is not a number"))?;
        out.insert(ip, w);
    }
    Ok(out)
}

/// `loadBalancerSourceRanges` (or the legacy annotation when the field is empty), with host
/// bits cleared as kube-proxy's sloppy parser does.
pub(super) fn source_ranges(
    svc: &Service,
    spec: &K8sServiceSpec,
    object: &str,
    out: &mut Out,
) -> Vec<Cidr> {
    let from_field: Vec<&str> = spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    let items: Vec<&str> = if from_field.is_empty() {
        svc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_LB_SOURCE_RANGES))
            .map(|v| v.split(',').collect())
            .unwrap_or_default()
    } else {
        from_field
    };
    let mut ranges = Vec::new();
    for item in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        match parse_cidr_sloppy(item) {
            Some(c) => ranges.push(c),
            None => out.problem(
                object,
                ProblemKind::Invalid,
                format!("loadBalancerSourceRange {item:?} is not a CIDR; ignored"),
            ),
        }
    }
    ranges
}

fn parse_cidr_sloppy(s: &str) -> Option<Cidr> {
    let (a, p) = s.split_once('/')?;
    let addr: IpAddr = a.parse().ok()?;
    let prefix: u8 = p.parse().ok()?;
    let addr = match addr {
        IpAddr::V4(v4) if prefix <= 32 => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((u32::from(v4) & mask).to_be_bytes())
        }
        IpAddr::V6(v6) if prefix <= 128 => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((u128::from(v6) & mask).to_be_bytes())
        }
        _ => return None,
    };
    Some(Cidr { addr, prefix })
}
