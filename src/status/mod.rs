//! `xvs status`, `xvs services`, `xvs flows`: read a running xvs through its admin API and
//! print tables, or the raw JSON with `--json`; `xvs freeze|unfreeze|drain|undrain` act on it.
//!
//! Where: `--socket PATH` (the control socket, `[admin] socket`, default
//! `/run/xvs/xvs.sock`), or `--admin ADDR` (`[admin] listen`, read-only); without either, the
//! default socket when it exists, else `127.0.0.1:10249`. Control commands need the socket
//! (and `[admin] enable_control`).
//!
//! Tables scale their numbers (`1.2M`, `96.1 kB`, `3.4 Gbit/s`: SI prefixes, traffic rates
//! in bits per second) unless `--exact` is given (`render.rs`).
//!
//! Exit codes: 0 when the API answered (and, for `status`, xvs is healthy); 2 for bad
//! arguments (a malformed `xvs flows` filter, refused before any request, or a request the
//! API answers 400); 1 when xvs cannot be reached, answers something unexpected, refuses a
//! control command, or (`status`) reports itself unhealthy.

use std::fmt;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, CONNECTION, CONTENT_LENGTH, HOST, HeaderValue, USER_AGENT};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use slowpath::admin::{FlowsResponse, HealthzBody, ServicesResponse, StatsView};

mod render;
#[cfg(test)]
mod tests;

use render::{render_flows, render_services, render_status};

/// Connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait, once connected, for the response head and then for each piece of the body.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body accepted (10 000 flows are a few MiB).
const RESPONSE_MAX: usize = 64 << 20;

/// Where a running xvs answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `[admin] listen`: read-only.
    Tcp(SocketAddr),
    /// `[admin] socket`: read-only and control.
    Unix(PathBuf),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// The default control socket (`[admin] socket`).
pub const DEFAULT_SOCKET: &str = "/run/xvs/xvs.sock";
/// The default read-only address (`[admin] listen`).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:10249";

impl Endpoint {
    /// `--admin` if given, else `--socket` if given, else the default socket when it exists,
    /// else the default listen address.
    pub fn choose(admin: Option<SocketAddr>, socket: Option<PathBuf>) -> Endpoint {
        match (admin, socket) {
            (Some(a), _) => Endpoint::Tcp(a),
            (None, Some(p)) => Endpoint::Unix(p),
            (None, None) if std::path::Path::new(DEFAULT_SOCKET).exists() => {
                Endpoint::Unix(DEFAULT_SOCKET.into())
            }
            (None, None) => Endpoint::Tcp(DEFAULT_LISTEN.parse().expect("a valid address")),
        }
    }

    fn hint(&self) -> &'static str {
        match self {
            Endpoint::Tcp(_) => "its [admin] listen address",
            Endpoint::Unix(_) => "its [admin] socket",
        }
    }
}

/// Which columns `xvs services` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServicesShow {
    /// Weights, usability, active and inactive connections.
    #[default]
    Connections,
    /// Connections, packets and bytes in each direction (`ipvsadm -Ln --stats`).
    Stats,
    /// The same per second (`ipvsadm -Ln --rate`).
    Rate,
}

/// `xvs flows` filters, as given (checked with the server's own parser before asking it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowQuery {
    /// `--service NAME` (`namespace/name` takes every port of a Kubernetes Service).
    pub service: Option<String>,
    /// `--backend IP[:PORT]`.
    pub backend: Option<String>,
    /// `--client IP[/PREFIX]`.
    pub client: Option<String>,
    /// `--vip IP[:PORT]`.
    pub vip: Option<String>,
}

impl FlowQuery {
    /// The `/v1/flows` path for `limit` and these filters; an error names the option.
    fn path(&self, limit: usize) -> Result<String, Failure> {
        let mut q = format!("limit={limit}");
        for (k, v) in [
            ("service", &self.service),
            ("backend", &self.backend),
            ("client", &self.client),
            ("vip", &self.vip),
        ] {
            if let Some(v) = v {
                let _ = write!(q, "&{k}={}", percent_encode(v));
            }
        }
        slowpath::admin::FlowFilter::from_query(&q)
            .map_err(|e| Failure::Usage(format!("flows: --{e}")))?;
        Ok(format!("/v1/flows?{q}"))
    }
}

/// What to show or do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatusCmd {
    /// Health, sync state, counters.
    Status,
    /// Services and backends with connection counts, or their traffic.
    Services(ServicesShow),
    /// Flows of the flow table.
    Flows {
        /// At most this many (the server clamps to 1..=10000).
        limit: usize,
        /// Only these flows.
        filter: FlowQuery,
    },
    /// A control action (`freeze`, `unfreeze`, `drain`, `undrain`), for one service or the
    /// node.
    Control {
        /// The action, as its endpoint names it.
        action: &'static str,
        /// One service (`freeze`/`unfreeze` only).
        service: Option<String>,
    },
}

/// How to print: the API's JSON, or tables with scaled or exact numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// `--json`: the API's JSON as it answered.
    pub json: bool,
    /// `--exact`: tables with exact numbers (`1234567`, not `1.2M`).
    pub exact: bool,
}

/// Why a command failed, which decides its exit code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Bad arguments (a malformed filter; the API answered 400): exit 2.
    Usage(String),
    /// Anything else: exit 1.
    Runtime(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure::Runtime(s)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(s) | Failure::Runtime(s) => f.write_str(s),
        }
    }
}

pub fn main(cmd: StatusCmd, admin: &Endpoint, out: Output) -> ExitCode {
    match run(cmd, admin, out) {
        Ok((text, healthy)) => {
            print!("{text}");
            let _ = io::stdout().flush();
            if healthy {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("xvs: {e}");
            match e {
                Failure::Usage(_) => ExitCode::from(crate::EXIT_BAD_CONFIG),
                Failure::Runtime(_) => ExitCode::FAILURE,
            }
        }
    }
}

/// The text to print and whether the exit code is 0.
fn run(cmd: StatusCmd, admin: &Endpoint, out: Output) -> Result<(String, bool), Failure> {
    let json = out.json;
    match cmd {
        StatusCmd::Status => {
            let (hcode, hbody) = get(admin, "/healthz")?;
            let (scode, sbody) = get(admin, "/v1/stats")?;
            expect_ok(admin, "/v1/stats", scode, &sbody)?;
            let healthy = hcode == 200;
            if json {
                let h: serde_json::Value = parse(admin, "/healthz", &hbody)?;
                let s: serde_json::Value = parse(admin, "/v1/stats", &sbody)?;
                let v =
                    serde_json::json!({ "healthz": { "status": hcode, "body": h }, "stats": s });
                return Ok((pretty(&v), healthy));
            }
            let h: HealthzBody = parse(admin, "/healthz", &hbody)?;
            let s: StatsView = parse(admin, "/v1/stats", &sbody)?;
            Ok((
                render_status(admin, hcode, &h, &s, SystemTime::now(), out.exact),
                healthy,
            ))
        }
        StatusCmd::Services(show) => {
            let (code, body) = get(admin, "/v1/services")?;
            expect_ok(admin, "/v1/services", code, &body)?;
            let r: ServicesResponse = parse(admin, "/v1/services", &body)?;
            if json {
                return Ok((body, true));
            }
            Ok((render_services(&r, show, out.exact), true))
        }
        StatusCmd::Flows { limit, filter } => {
            let path = filter.path(limit)?;
            let (code, body) = get(admin, &path)?;
            expect_ok(admin, &path, code, &body)?;
            let r: FlowsResponse = parse(admin, &path, &body)?;
            if json {
                return Ok((body, true));
            }
            Ok((render_flows(&r), true))
        }
        StatusCmd::Control { action, service } => {
            let mut path = format!("/v1/{action}");
            if let Some(s) = &service {
                path.push_str("?service=");
                path.push_str(&percent_encode(s));
            }
            let (code, body) = request(admin, "POST", &path)?;
            if code != 200 {
                return Err(error_answer(admin, "POST", &path, code, &body));
            }
            if json {
                return Ok((body, true));
            }
            let what = service.map_or_else(|| "the node".to_owned(), |s| format!("service {s}"));
            Ok((format!("{action}: {what}: ok\n"), true))
        }
    }
}

/// `%XX`-escapes everything in a query value but unreserved characters.
fn percent_encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn pretty(v: &serde_json::Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

fn expect_ok(admin: &Endpoint, path: &str, code: u16, body: &str) -> Result<(), Failure> {
    if code == 200 {
        return Ok(());
    }
    Err(error_answer(admin, "GET", path, code, body))
}

/// An answer other than 200: a usage error when the API says the request was malformed.
fn error_answer(admin: &Endpoint, method: &str, path: &str, code: u16, body: &str) -> Failure {
    let detail = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| body.trim().chars().take(200).collect());
    let msg = format!("the xvs admin API at {admin} answered {code} to {method} {path}: {detail}");
    if code == 400 {
        Failure::Usage(msg)
    } else {
        Failure::Runtime(msg)
    }
}

fn parse<T: serde::de::DeserializeOwned>(
    admin: &Endpoint,
    path: &str,
    body: &str,
) -> Result<T, String> {
    serde_json::from_str(body).map_err(|e| {
        format!("unexpected answer from the xvs admin API at {admin} to GET {path}: {e}")
    })
}

/// One GET: the status code and the body.
fn get(admin: &Endpoint, path: &str) -> Result<(u16, String), String> {
    request(admin, "GET", path)
}

/// One request: the status code and the body. The client is hyper's (the admin server's
/// stack) on a one-thread runtime of its own: the CLI is otherwise synchronous.
fn request(admin: &Endpoint, method: &str, path: &str) -> Result<(u16, String), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("starting the admin API client: {e}"))?;
    rt.block_on(request_async(admin, method, path))
}

async fn request_async(
    admin: &Endpoint,
    method: &str,
    path: &str,
) -> Result<(u16, String), String> {
    let unreachable = |e: io::Error| {
        let why = match e.kind() {
            io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "timed out".to_owned(),
            io::ErrorKind::NotFound => "no such socket".to_owned(),
            io::ErrorKind::PermissionDenied => {
                "permission denied (the socket is root's)".to_owned()
            }
            _ => e.to_string(),
        };
        format!(
            "cannot reach the xvs admin API at {admin}: {why} — is xvs running? ({})",
            admin.hint()
        )
    };
    match admin {
        Endpoint::Tcp(a) => {
            let c = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a))
                .await
                .map_err(|_| unreachable(io::ErrorKind::TimedOut.into()))?
                .map_err(unreachable)?;
            exchange(c, admin, method, path, &a.to_string()).await
        }
        Endpoint::Unix(p) => {
            let c = UnixStream::connect(p).await.map_err(unreachable)?;
            exchange(c, admin, method, path, "localhost").await
        }
    }
}

/// One HTTP/1.1 exchange on `conn`: the response head within [`IO_TIMEOUT`], then the body
/// (at most [`RESPONSE_MAX`] bytes) with no pause longer than [`IO_TIMEOUT`].
async fn exchange<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    conn: S,
    admin: &Endpoint,
    method: &str,
    path: &str,
    host: &str,
) -> Result<(u16, String), String> {
    let failed = |e: hyper::Error| {
        if e.is_parse() || e.is_incomplete_message() || e.is_parse_too_large() {
            format!("malformed HTTP response from {admin} to {method} {path}: {e}")
        } else {
            format!("reading from the xvs admin API at {admin}: {e}")
        }
    };
    let timed_out = || format!("reading from the xvs admin API at {admin}: timed out");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(conn))
        .await
        .map_err(failed)?;
    // Ends with the connection (the server closes it: `Connection: close`).
    tokio::spawn(connection);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, host)
        .header(USER_AGENT, HeaderValue::from_static("xvs-cli"))
        .header(ACCEPT, HeaderValue::from_static("application/json"))
        .header(CONTENT_LENGTH, HeaderValue::from_static("0"))
        .header(CONNECTION, HeaderValue::from_static("close"))
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let resp = tokio::time::timeout(IO_TIMEOUT, sender.send_request(req))
        .await
        .map_err(|_| timed_out())?
        .map_err(failed)?;
    let code = resp.status().as_u16();
    let mut body = Limited::new(resp.into_body(), RESPONSE_MAX);
    let mut raw = Vec::new();
    loop {
        let frame = tokio::time::timeout(IO_TIMEOUT, body.frame())
            .await
            .map_err(|_| timed_out())?;
        match frame {
            None => break,
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    raw.extend_from_slice(&data);
                }
            }
            // A body cut short of its Content-Length or over the bound is malformed; a
            // failing socket is a read error.
            Some(Err(e))
                if io_cause(&*e).is_some_and(|io| io.kind() != io::ErrorKind::UnexpectedEof) =>
            {
                return Err(format!("reading from the xvs admin API at {admin}: {e}"));
            }
            Some(Err(e)) => {
                return Err(format!(
                    "malformed HTTP response from {admin} to {method} {path}: {e}"
                ));
            }
        }
    }
    Ok((code, String::from_utf8_lossy(&raw).into_owned()))
}

/// The I/O error under `e`, if any.
fn io_cause<'a>(mut e: &'a (dyn std::error::Error + 'static)) -> Option<&'a io::Error> {
    loop {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io);
        }
        e = e.source()?;
    }
}
