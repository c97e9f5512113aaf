//! What each request gets: one axum [`Router`] per exposure, over one shared [`Api`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use tokio::sync::Semaphore;
use tracing::warn;

use super::http::{Exposure, ListenerStats};
use super::metrics::{self, ProbeCounts};
use super::process;
use super::views::{FlowsResponse, HealthzBody, ServicesResponse};
use super::{
    AdminSource, ControlAction, FLOWS_DEFAULT, FLOWS_MAX, FlowFilter, METRICS_CONTENT_TYPE,
    evaluate, percent_decode, query_param, rfc3339,
};

/// State shared by every listener of one server.
pub(super) struct Api {
    pub(super) source: Arc<dyn AdminSource>,
    pub(super) control_enabled: bool,
    pub(super) probes: Mutex<ProbeCounts>,
    /// Slots for expensive source calls ([`BLOCKING_MAX`](super::BLOCKING_MAX)).
    pub(super) blocking: Arc<Semaphore>,
    /// Every listener's connection counts, for `/metrics`.
    pub(super) listeners: Vec<Arc<ListenerStats>>,
    /// Requests answered 503 for running out of time.
    pub(super) timed_out: AtomicU64,
}

type Shared = State<Arc<Api>>;

/// The endpoints `exposure` serves; every other path is 404.
pub(super) fn router(api: Arc<Api>, exposure: Exposure) -> Router {
    let read = |m: MethodRouter<Arc<Api>>| m.fallback(method_not_allowed);
    if exposure == Exposure::Metrics {
        return Router::new()
            .route("/metrics", read(get(metrics)))
            .fallback(not_found)
            .with_state(api);
    }
    let mut r = Router::new()
        .route("/healthz", read(get(healthz)))
        .route("/livez", read(get(livez)));
    if exposure != Exposure::Healthz {
        r = r
            .route("/metrics", read(get(metrics)))
            .route("/v1/services", read(get(services)))
            .route("/v1/flows", read(get(flows)))
            .route("/v1/stats", read(get(stats)));
        for action in ControlAction::ALL {
            let act =
                move |State(api): Shared, RawQuery(q): RawQuery| control(api, exposure, action, q);
            r = r.route(
                &format!("/v1/{}", action.name()),
                post(act).fallback(method_not_allowed),
            );
        }
    }
    r.fallback(not_found).with_state(api)
}

/// A JSON response: pretty and newline-terminated, for people reading it with curl.
pub(super) fn json(status: StatusCode, body: &impl serde::Serialize) -> Response {
    let mut bytes = serde_json::to_vec_pretty(body).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    (
        status,
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        bytes,
    )
        .into_response()
}

/// A JSON error: `{"error": message}`.
pub(super) fn error(status: StatusCode, message: &str) -> Response {
    json(status, &serde_json::json!({ "error": message }))
}

/// A 405; axum adds `Allow` with the route's methods.
async fn method_not_allowed() -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such endpoint")
}

async fn healthz(State(api): Shared) -> Response {
    api.health(true)
}

async fn livez(State(api): Shared) -> Response {
    api.health(false)
}

async fn metrics(State(api): Shared) -> Response {
    api.clone()
        .blocking(move || {
            let stats = api.source.stats();
            let services = api.source.services();
            // A copy, so that the probes (inline on the runtime) never wait for the render.
            let probes = {
                let p = api.probes.lock().unwrap_or_else(|e| e.into_inner());
                ProbeCounts {
                    healthz_ok: p.healthz_ok,
                    healthz_fail: p.healthz_fail,
                    livez_ok: p.livez_ok,
                    livez_fail: p.livez_fail,
                }
            };
            let mut body = metrics::render(&stats, &services, &probes);
            api.render_server_metrics(&mut body);
            process::render(
                &mut body,
                &process::BUILD_INFO,
                &process::ProcessStats::read(),
            );
            (
                StatusCode::OK,
                [(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE))],
                body,
            )
                .into_response()
        })
        .await
}

async fn services(State(api): Shared) -> Response {
    api.clone()
        .blocking(move || {
            json(
                StatusCode::OK,
                &ServicesResponse {
                    services: api.source.services(),
                    refused: api.source.refused(),
                },
            )
        })
        .await
}

async fn flows(State(api): Shared, RawQuery(q): RawQuery) -> Response {
    let query = q.as_deref().unwrap_or("");
    let filter = match FlowFilter::from_query(query) {
        Ok(f) => f,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let limit = match query_param(query, "limit") {
        None | Some("") => FLOWS_DEFAULT,
        Some(v) => match v.parse::<usize>() {
            Ok(n) => n.clamp(1, FLOWS_MAX),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "limit must be a non-negative integer",
                );
            }
        },
    };
    api.clone()
        .blocking(move || {
            let page = api.source.flows(&filter, limit);
            let mut flows = page.flows;
            flows.truncate(limit);
            // A source's count cannot be below what it returned.
            let total_matched = page.total_matched.max(flows.len() as u64);
            json(
                StatusCode::OK,
                &FlowsResponse {
                    limit,
                    truncated: total_matched > flows.len() as u64,
                    total_matched,
                    flows,
                },
            )
        })
        .await
}

async fn stats(State(api): Shared) -> Response {
    api.clone()
        .blocking(move || json(StatusCode::OK, &api.source.stats()))
        .await
}

async fn control(
    api: Arc<Api>,
    exposure: Exposure,
    action: ControlAction,
    query: Option<String>,
) -> Response {
    if exposure != Exposure::Socket {
        return error(
            StatusCode::FORBIDDEN,
            "control is served only on the unix socket ([admin] socket); this address is read-only",
        );
    }
    if !api.control_enabled {
        return error(
            StatusCode::FORBIDDEN,
            "control endpoints are disabled; set [admin] enable_control = true",
        );
    }
    let service = query_param(query.as_deref().unwrap_or(""), "service").map(percent_decode);
    match api.source.control(action, service.clone()).await {
        Ok(()) => json(
            StatusCode::OK,
            &serde_json::json!({ "action": action.name(), "service": service, "ok": true }),
        ),
        Err(e) => error(StatusCode::CONFLICT, &e),
    }
}

impl Api {
    /// Runs `f` (which calls the source) on the blocking pool, at most
    /// [`BLOCKING_MAX`](super::BLOCKING_MAX) at a time. Waiting for a slot counts against
    /// the request's deadline; a call that overruns it keeps its slot until it returns, so
    /// a stuck source cannot pile up threads.
    async fn blocking(self: Arc<Self>, f: impl FnOnce() -> Response + Send + 'static) -> Response {
        let Ok(slot) = Arc::clone(&self.blocking).acquire_owned().await else {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the admin server is stopping",
            );
        };
        let task = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            f()
        });
        match task.await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "an admin source call failed");
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the daemon failed to answer; see its log",
                )
            }
        }
    }

    /// `/healthz` (`healthz`) or `/livez`: inline, never behind the blocking slots.
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
        let status = match verdict {
            Ok(()) => StatusCode::OK,
            Err(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        json(status, &body)
    }

    /// The admin server's own families, appended to `/metrics`.
    fn render_server_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP xvs_admin_connections Open connections of each admin listener.\n\
             # TYPE xvs_admin_connections gauge"
        );
        for l in &self.listeners {
            let _ = writeln!(
                out,
                "xvs_admin_connections{{listener=\"{}\"}} {}",
                l.exposure.name(),
                l.open.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP xvs_admin_connections_rejected_total Admin connections closed at once because their listener had its maximum open.\n\
             # TYPE xvs_admin_connections_rejected_total counter"
        );
        for l in &self.listeners {
            let _ = writeln!(
                out,
                "xvs_admin_connections_rejected_total{{listener=\"{}\"}} {}",
                l.exposure.name(),
                l.rejected.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP xvs_admin_requests_timed_out_total Admin requests answered 503 for missing their deadline.\n\
             # TYPE xvs_admin_requests_timed_out_total counter\n\
             xvs_admin_requests_timed_out_total {}",
            self.timed_out.load(Ordering::Relaxed)
        );
    }
}
