//! The admin HTTP API, served on up to four exposures, like kube-proxy's split between its
//! metrics and healthz addresses.
//!
//! | exposure | config | serves |
//! |---|---|---|
//! | `listen` | `[admin] listen`, default 127.0.0.1:10249 (kube-proxy's metrics address) | `/healthz`, `/livez`, `/metrics`, the read-only `/v1/*`; control endpoints answer 403 |
//! | `healthz` | `[admin] healthz_listen`, default 0.0.0.0:10256 (kube-proxy's healthz port) | only `/healthz` and `/livez`; every other path is 404 |
//! | `metrics` | `[admin] metrics_listen`, default none | only `/metrics`; every other path is 404 |
//! | `socket` | `[admin] socket`, default /run/xvs/xvs.sock, a unix socket of mode 0600 | what `listen` serves, plus the control endpoints |
//!
//! The health port is the one that must be reachable from outside the node (load balancers,
//! the kubelet's probes), so it answers nothing else: `/v1/flows` (client addresses) stays
//! on loopback, and state changes need the owner of the socket file (root), not merely a
//! route to the node. A cluster Prometheus gets `/metrics` alone on `metrics_listen`: the
//! counters and the service and backend names of the metrics' labels, nothing about
//! clients.
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /healthz` | 200 / 503 with kube-proxy's JSON body (`lastUpdated`, `currentTime`, `nodeEligible`) |
//! | `GET /livez` | 200 / 503, like `/healthz` but ignoring node deletion |
//! | `GET /metrics` | Prometheus text 0.0.4, every name prefixed `xvs_` |
//! | `GET /v1/services` | [`ServicesResponse`] |
//! | `GET /v1/flows?limit=N` | [`FlowsResponse`]; N defaults to 100, clamped to 1..=10000 |
//! | `GET /v1/stats` | [`StatsView`] |
//! | `POST /v1/freeze`, `/v1/unfreeze` (`?service=NAME`: one service), `/v1/drain`, `/v1/undrain` | on the socket: 403 unless `[admin] enable_control`, then [`AdminSource::control`]; on TCP: 403 |
//!
//! `HEAD` is accepted wherever `GET` is. Another method on a known endpoint is 405 with
//! `Allow`; any other path is 404. Every answer is JSON (`{"error": ...}` for errors) except
//! `/metrics` and the 400/431 that hyper itself gives a malformed or oversized head (no
//! body), and carries `Cache-Control: no-store`.
//!
//! # Limits (and why)
//!
//! The server runs on the daemon's tokio runtime; a connection costs a task and a few KiB,
//! not a thread, so slow or idle clients cannot starve the probes. Each connection state has a
//! bound, so nothing a client does holds a connection open for long:
//! - at most [`MAX_CONNECTIONS`] open connections per listener (`xvs_admin_connections`);
//!   over it a new connection is closed at once (counted in
//!   `xvs_admin_connections_rejected_total`). Listeners have separate budgets, so a flood on
//!   one leaves the others answering;
//! - the whole request head must arrive within [`HEADER_TIMEOUT`] (not per read: a client
//!   dripping a byte a second is cut off too). The same timer runs while a keep-alive
//!   connection waits for its next request, so idle connections close after it;
//! - a head larger than [`HEAD_MAX`] is answered 431, a body larger than [`BODY_MAX`] 413;
//! - a request (its body, the handler, the source's answer) must be done within
//!   [`REQUEST_TIMEOUT`], else 503 (counted in `xvs_admin_requests_timed_out_total`);
//! - a response write that makes no progress for [`WRITE_TIMEOUT`] ends the connection (a
//!   client that asks for 10,000 flows and never reads them);
//! - the expensive [`AdminSource`] calls (`services`, `flows`, `stats`, and `/metrics`, which
//!   calls two of them) run on tokio's blocking pool, at most [`BLOCKING_MAX`] at a time.
//!   `/healthz` and `/livez` call only [`AdminSource::health`] and answer inline, so they
//!   never queue behind a scrape.
//!
//! Keep-alive is allowed (Prometheus reuses its connection); `Connection: close` is honoured
//! (`xvs status` sends it and reads to EOF). Shutdown ([`AdminServer::run`]'s token) stops
//! accepting, lets requests in flight finish for up to [`SHUTDOWN_GRACE`], removes the socket
//! file and returns.
//!
//! # Health semantics (kube-proxy's)
//!
//! `/healthz` is 200 when all of these hold, else 503 with a `reason`:
//! - the fastpath workers run;
//! - the daemon is ready ([`HealthView::not_ready`] is `None`; e.g. the Kubernetes source has
//!   produced its first snapshot);
//! - the slowpath has synced at least once, and its last sync (`lastUpdated`) is younger than
//!   the health timeout (kube-proxy: 2 × `syncPeriod`). The daemon counts a periodic pass that
//!   finds nothing to publish as a sync, so an idle but live slowpath stays healthy, and a
//!   stuck one does not;
//! - no change has been waiting to be published for longer than the timeout (kube-proxy's
//!   `oldestPendingQueued` rule);
//! - the node is eligible (not being deleted).
//!
//! `/livez` applies the same rules except node eligibility: a deleting node must not be
//! restarted by its liveness probe.
//!
//! The server decouples from the daemon's types through [`AdminSource`]; [`views`] holds
//! helpers that turn the daemon's snapshot, flow table and counters into the JSON types.

pub mod flows;
pub mod histogram;
mod http;
pub mod metrics;
pub mod process;
mod routes;
mod socket;
pub mod sockets;
mod sync_metrics;
pub mod traffic_metrics;
pub mod views;

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

pub use flows::FlowFilter;
pub use http::{
    AdminConfig, AdminError, AdminLimits, AdminServer, BLOCKING_MAX, BODY_MAX, HEAD_MAX,
    HEADER_TIMEOUT, MAX_CONNECTIONS, REQUEST_TIMEOUT, SHUTDOWN_GRACE, WRITE_TIMEOUT,
};
pub use sockets::SocketView;
pub use views::*;

/// `/v1/flows` limit when the request has none.
pub const FLOWS_DEFAULT: usize = 100;
/// Largest `/v1/flows` limit.
pub const FLOWS_MAX: usize = 10_000;
/// The state-changing endpoints, as `/v1/<action>` (the names of [`ControlAction`]).
pub const CONTROL_ACTIONS: &[&str] = &["freeze", "unfreeze", "drain", "undrain"];
/// Content type of `/metrics`.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A state-changing action, `POST /v1/<name>` on the unix socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControlAction {
    /// Refuse new flows (of one service, or all), keep established ones.
    Freeze,
    /// Undo [`ControlAction::Freeze`].
    Unfreeze,
    /// Make `/healthz` fail so that upstream load balancers move away; stop nothing.
    Drain,
    /// Undo [`ControlAction::Drain`].
    Undrain,
}

impl ControlAction {
    /// Every action, in [`CONTROL_ACTIONS`] order.
    pub const ALL: [ControlAction; 4] = [
        ControlAction::Freeze,
        ControlAction::Unfreeze,
        ControlAction::Drain,
        ControlAction::Undrain,
    ];

    /// The name in the path and in answers: `freeze`, `unfreeze`, `drain`, `undrain`.
    pub fn name(self) -> &'static str {
        match self {
            ControlAction::Freeze => "freeze",
            ControlAction::Unfreeze => "unfreeze",
            ControlAction::Drain => "drain",
            ControlAction::Undrain => "undrain",
        }
    }

    /// The action named `name` (exactly as [`ControlAction::name`] spells it).
    pub fn parse(name: &str) -> Option<ControlAction> {
        ControlAction::ALL.into_iter().find(|a| a.name() == name)
    }
}

impl std::fmt::Display for ControlAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

// CONTROL_ACTIONS and ControlAction::ALL name the same actions in the same order.
const _: () = {
    assert!(CONTROL_ACTIONS.len() == ControlAction::ALL.len());
};

/// What [`AdminSource::control`] returns: resolves once the action took effect (`Ok`) or was
/// refused (`Err`, answered 409 with the message).
pub type ControlFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// What the admin API reads from the daemon.
///
/// `services`, `flows` and `stats` run on tokio's blocking pool, at most [`BLOCKING_MAX`] at a
/// time; each should take a few milliseconds. `health` runs inline on the runtime for every
/// probe: it must only read atomics or take uncontended locks. The future of `control` is
/// awaited on the runtime.
///
/// A request not answered within [`REQUEST_TIMEOUT`] gets 503. A blocking call cannot be
/// cancelled: it runs to its end and keeps its slot meanwhile, so a stuck source holds at
/// most [`BLOCKING_MAX`] threads. A `control` future is dropped; what it already set in
/// motion (a command sent to the controller) may still take effect.
pub trait AdminSource: Send + Sync + 'static {
    /// Services of the published snapshot, with backend connection counts.
    fn services(&self) -> Vec<ServiceView>;
    /// What the sources and the snapshot builder refuse now (`/v1/services`' `refused`).
    fn refused(&self) -> Vec<RefusedView> {
        Vec::new()
    }
    /// Up to `limit` flows of the flow table that match `filter`, and how many matched in
    /// all (see [`FlowViewJson::collect`]).
    fn flows(&self, filter: &FlowFilter, limit: usize) -> FlowsPage;
    /// Counters: workers, flow table, steering, sync loop.
    fn stats(&self) -> StatsView;
    /// What `/healthz` and `/livez` decide from. Must not block.
    fn health(&self) -> HealthView;
    /// Performs a state-changing action, for one service when `service` is given
    /// (`?service=NAME`, percent-decoded). Only called for requests on the unix socket with
    /// `[admin] enable_control` on. `Err` is answered 409 with the message.
    fn control(&self, action: ControlAction, service: Option<String>) -> ControlFuture {
        let _ = (action, service);
        Box::pin(async { Err("not supported".to_owned()) })
    }
}

/// The health rules of the module docs, at `now`. `healthz`: also require node eligibility
/// (`/healthz`); false for `/livez`. `Err` says why it fails.
pub fn evaluate(h: &HealthView, now: SystemTime, healthz: bool) -> Result<(), String> {
    let age = |t: SystemTime| now.duration_since(t).unwrap_or(Duration::ZERO);
    if !h.fastpath_running {
        return Err("fastpath workers are not running".to_owned());
    }
    if let Some(reason) = &h.not_ready {
        return Err(reason.clone());
    }
    let Some(last) = h.last_updated else {
        return Err("no sync completed yet".to_owned());
    };
    if age(last) >= h.timeout {
        return Err(format!(
            "last sync {:.1}s ago, longer than the health timeout {:.1}s",
            age(last).as_secs_f64(),
            h.timeout.as_secs_f64()
        ));
    }
    if let Some(p) = h.oldest_pending
        && age(p) >= h.timeout
    {
        return Err(format!(
            "a change has waited {:.1}s to be published, longer than the health timeout {:.1}s",
            age(p).as_secs_f64(),
            h.timeout.as_secs_f64()
        ));
    }
    if healthz && !h.node_eligible {
        return Err("the node is being deleted".to_owned());
    }
    Ok(())
}

/// `t` as RFC 3339 UTC with milliseconds, e.g. `2024-05-01T12:34:56.789Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// The raw value of query parameter `key` in `query` (the part after `?`), if present.
fn query_param<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then_some(v)
    })
}

/// Decodes `%XX` escapes and `+` (a space) in a query value; malformed escapes stay as written.
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(x) => {
                        out.push(x);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_of_query_values() {
        assert_eq!(percent_decode("ns%2Fweb%3Ahttp"), "ns/web:http");
        assert_eq!(percent_decode("a+b"), "a b");
        assert_eq!(percent_decode("ns/web:http"), "ns/web:http");
        // Malformed or cut escapes stay as written.
        assert_eq!(percent_decode("x%zz%4"), "x%zz%4");
        assert_eq!(percent_decode("%"), "%");
    }

    #[test]
    fn rfc3339_known_instants() {
        let at = |s: u64, ms: u64| {
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_714_566_896, 789), "2024-05-01T12:34:56.789Z");
    }

    #[test]
    fn health_rules() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let ok = HealthView {
            last_updated: Some(now - Duration::from_secs(1)),
            oldest_pending: None,
            timeout: Duration::from_secs(60),
            fastpath_running: true,
            node_eligible: true,
            not_ready: None,
        };
        assert_eq!(evaluate(&ok, now, true), Ok(()));
        let stale = HealthView {
            last_updated: Some(now - Duration::from_secs(61)),
            ..ok.clone()
        };
        assert!(evaluate(&stale, now, true).is_err());
        assert!(evaluate(&stale, now, false).is_err());
        let never = HealthView {
            last_updated: None,
            ..ok.clone()
        };
        assert!(evaluate(&never, now, false).is_err());
        let pending = HealthView {
            oldest_pending: Some(now - Duration::from_secs(120)),
            ..ok.clone()
        };
        assert!(evaluate(&pending, now, true).is_err());
        let young_pending = HealthView {
            oldest_pending: Some(now - Duration::from_secs(5)),
            ..ok.clone()
        };
        assert_eq!(evaluate(&young_pending, now, true), Ok(()));
        let deleting = HealthView {
            node_eligible: false,
            ..ok.clone()
        };
        assert!(evaluate(&deleting, now, true).is_err());
        assert_eq!(evaluate(&deleting, now, false), Ok(()));
        let stopped = HealthView {
            fastpath_running: false,
            ..ok.clone()
        };
        assert!(evaluate(&stopped, now, false).is_err());
        // Not ready: both probes fail with the daemon's reason, even with a fresh sync.
        let waiting = HealthView {
            not_ready: Some("waiting for the first sync of the Kubernetes source".to_owned()),
            ..ok.clone()
        };
        let why = Err("waiting for the first sync of the Kubernetes source".to_owned());
        assert_eq!(evaluate(&waiting, now, true), why);
        assert_eq!(evaluate(&waiting, now, false), why);
        // A stopped fastpath is reported first.
        let both = HealthView {
            fastpath_running: false,
            ..waiting
        };
        assert_eq!(
            evaluate(&both, now, true),
            Err("fastpath workers are not running".to_owned())
        );
    }

    #[test]
    fn query_parameters() {
        assert_eq!(query_param("x=1&limit=7", "limit"), Some("7"));
        assert_eq!(query_param("limit", "limit"), Some(""));
        assert_eq!(query_param("limits=3", "limit"), None);
        assert_eq!(query_param("", "limit"), None);
    }

    #[test]
    fn control_action_names() {
        for (a, name) in ControlAction::ALL.into_iter().zip(CONTROL_ACTIONS) {
            assert_eq!(a.name(), *name);
            assert_eq!(ControlAction::parse(name), Some(a));
            assert_eq!(a.to_string(), *name);
        }
        assert_eq!(ControlAction::parse("Freeze"), None);
        assert_eq!(ControlAction::parse("stats"), None);
    }
}
