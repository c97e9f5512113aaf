//! The admin HTTP API, on `[admin] listen` (default 127.0.0.1:10256, kube-proxy's healthz port).
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /healthz` | 200 / 503 with kube-proxy's JSON body (`lastUpdated`, `currentTime`, `nodeEligible`) |
//! | `GET /livez` | 200 / 503, like `/healthz` but ignoring node deletion |
//! | `GET /metrics` | Prometheus text 0.0.4, every name prefixed `xvs_` |
//! | `GET /v1/services` | [`ServicesResponse`] |
//! | `GET /v1/flows?limit=N` | [`FlowsResponse`]; N defaults to 100, clamped to 1..=10000 |
//! | `GET /v1/stats` | [`StatsView`] |
//! | `POST /v1/freeze`, `/v1/unfreeze` (`?service=NAME`: one service), `/v1/drain`, `/v1/undrain` | 403 unless `[admin] enable_control`; then [`AdminSource::control`] |
//!
//! `HEAD` is accepted wherever `GET` is. Another method on a read endpoint is 405, on a
//! control endpoint (other than POST) also 405; any other path is 404.
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

mod http;
pub mod metrics;
pub mod views;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

pub use http::{BODY_MAX, HANDLERS, HEAD_MAX, IO_TIMEOUT, QUEUE_MAX};
pub use views::*;

use http::{Request, Response, Server};
use metrics::ProbeCounts;

/// `/v1/flows` limit when the request has none.
pub const FLOWS_DEFAULT: usize = 100;
/// Largest `/v1/flows` limit.
pub const FLOWS_MAX: usize = 10_000;
/// The state-changing endpoints, as `/v1/<action>`.
pub const CONTROL_ACTIONS: &[&str] = &["freeze", "unfreeze", "drain", "undrain"];
/// Content type of `/metrics`.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the admin API reads from the daemon. Called on the admin server's threads, at most
/// [`HANDLERS`] at a time; each call should take a few milliseconds.
pub trait AdminSource: Send + Sync + 'static {
    /// Services of the published snapshot, with backend connection counts.
    fn services(&self) -> Vec<ServiceView>;
    /// Up to `limit` flows of the flow table (see [`FlowViewJson::collect`]).
    fn flows(&self, limit: usize) -> Vec<FlowViewJson>;
    /// Counters: workers, flow table, steering, sync loop.
    fn stats(&self) -> StatsView;
    /// What `/healthz` and `/livez` decide from.
    fn health(&self) -> HealthView;
    /// Performs a state-changing action (`freeze`, `unfreeze`, `drain`, `undrain`), for one
    /// service when `service` is given (`?service=NAME`, percent-decoded). Only called when
    /// `[admin] enable_control` is on. `Err` is answered 409 with the message.
    fn control(&self, action: &str, service: Option<&str>) -> Result<(), String> {
        let _ = (action, service);
        Err("not supported".to_owned())
    }
}

/// A running admin server. Dropping it leaves the server running; call [`AdminHandle::stop`].
pub struct AdminHandle {
    server: Server,
}

impl AdminHandle {
    /// The bound address (the chosen port when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Stops accepting, finishes requests in progress and joins the server's threads
    /// (within about 100 ms plus [`IO_TIMEOUT`] for a stalled client).
    pub fn stop(self) {
        self.server.stop();
    }
}

/// Binds `listen` and serves the admin API from `source` on its own threads (one acceptor,
/// [`HANDLERS`] handlers). Fails only when the address cannot be bound.
pub fn serve(
    listen: SocketAddr,
    source: Arc<dyn AdminSource>,
    control_enabled: bool,
) -> std::io::Result<AdminHandle> {
    let api = Api {
        source,
        control_enabled,
        probes: Mutex::new(ProbeCounts::default()),
    };
    let server = Server::start(
        listen,
        "xvs-admin",
        Arc::new(move |r: &Request| api.route(r)),
    )?;
    Ok(AdminHandle { server })
}

struct Api {
    source: Arc<dyn AdminSource>,
    control_enabled: bool,
    probes: Mutex<ProbeCounts>,
}

impl Api {
    fn route(&self, req: &Request) -> Response {
        let read = matches!(req.method.as_str(), "GET" | "HEAD");
        let path = req.path.as_str();
        if let Some(action) = path.strip_prefix("/v1/")
            && CONTROL_ACTIONS.contains(&action)
        {
            if req.method != "POST" {
                return not_allowed("POST");
            }
            if !self.control_enabled {
                return Response::error(
                    403,
                    "control endpoints are disabled; set [admin] enable_control = true",
                );
            }
            let service = req.param("service").map(percent_decode);
            return match self.source.control(action, service.as_deref()) {
                Ok(()) => Response::json(
                    200,
                    &serde_json::json!({ "action": action, "service": service, "ok": true }),
                ),
                Err(e) => Response::error(409, &e),
            };
        }
        let known = matches!(
            path,
            "/healthz" | "/livez" | "/metrics" | "/v1/services" | "/v1/flows" | "/v1/stats"
        );
        if !known {
            return Response::error(404, "no such endpoint");
        }
        if !read {
            return not_allowed("GET, HEAD");
        }
        match path {
            "/healthz" => self.health(true),
            "/livez" => self.health(false),
            "/metrics" => {
                let stats = self.source.stats();
                let services = self.source.services();
                let body = {
                    let p = self.probes.lock().unwrap_or_else(|e| e.into_inner());
                    metrics::render(&stats, &services, &p)
                };
                Response::text(200, METRICS_CONTENT_TYPE, body)
            }
            "/v1/services" => Response::json(
                200,
                &ServicesResponse {
                    services: self.source.services(),
                },
            ),
            "/v1/flows" => {
                let limit = match req.param("limit") {
                    None | Some("") => FLOWS_DEFAULT,
                    Some(v) => match v.parse::<usize>() {
                        Ok(n) => n.clamp(1, FLOWS_MAX),
                        Err(_) => {
                            return Response::error(400, "limit must be a non-negative integer");
                        }
                    },
                };
                let mut flows = self.source.flows(limit);
                flows.truncate(limit);
                Response::json(200, &FlowsResponse { limit, flows })
            }
            "/v1/stats" => Response::json(200, &self.source.stats()),
            _ => Response::error(404, "no such endpoint"),
        }
    }

    fn health(&self, healthz: bool) -> Response {
        let h = self.source.health();
        let now = SystemTime::now();
        let verdict = evaluate(&h, now, healthz);
        {
            let mut p = self.probes.lock().unwrap_or_else(|e| e.into_inner());
            match (healthz, verdict.is_ok()) {
                (true, true) => p.healthz_ok += 1,
                (true, false) => p.healthz_fail += 1,
                (false, true) => p.livez_ok += 1,
                (false, false) => p.livez_fail += 1,
            }
        }
        let body = HealthzBody {
            last_updated: h.last_updated.map(rfc3339).unwrap_or_default(),
            current_time: rfc3339(now),
            node_eligible: healthz.then_some(h.node_eligible),
            fastpath_running: h.fastpath_running,
            reason: verdict.as_ref().err().cloned(),
        };
        Response::json(if verdict.is_ok() { 200 } else { 503 }, &body)
    }
}

fn not_allowed(allow: &str) -> Response {
    let mut r = Response::error(405, "method not allowed");
    r.headers.push(("Allow", allow.to_owned()));
    r
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
}
