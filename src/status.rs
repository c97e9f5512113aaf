//! `xvs status`, `xvs services`, `xvs flows`: read a running xvs through its admin API and
//! print tables, or the raw JSON with `--json`; `xvs freeze|unfreeze|drain|undrain` act on it.
//!
//! Where: `--socket PATH` (the control socket, `[admin] socket`, default
//! `/run/xvs/xvs.sock`), or `--admin ADDR` (`[admin] listen`, read-only); without either, the
//! default socket when it exists, else `127.0.0.1:10249`. Control commands need the socket
//! (and `[admin] enable_control`).
//!
//! Exit codes: 0 when the API answered (and, for `status`, xvs is healthy); 1 when xvs cannot
//! be reached, answers something unexpected, or (`status`) reports itself unhealthy.

use std::fmt;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use slowpath::admin::{
    FlowsResponse, HealthzBody, RateView, ServicesResponse, StatsView, TrafficView,
};

/// Connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Read/write timeout once connected.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response accepted (10 000 flows are a few MiB).
const RESPONSE_MAX: u64 = 64 << 20;

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
    fn path(&self, limit: usize) -> Result<String, String> {
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
        slowpath::admin::FlowFilter::from_query(&q).map_err(|e| format!("flows: --{e}"))?;
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

pub fn main(cmd: StatusCmd, admin: &Endpoint, json: bool) -> ExitCode {
    match run(cmd, admin, json) {
        Ok((out, healthy)) => {
            print!("{out}");
            let _ = io::stdout().flush();
            if healthy {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("xvs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The text to print and whether the exit code is 0.
fn run(cmd: StatusCmd, admin: &Endpoint, json: bool) -> Result<(String, bool), String> {
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
                render_status(admin, hcode, &h, &s, SystemTime::now()),
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
            Ok((render_services(&r, show), true))
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

fn expect_ok(admin: &Endpoint, path: &str, code: u16, body: &str) -> Result<(), String> {
    if code == 200 {
        return Ok(());
    }
    Err(error_answer(admin, "GET", path, code, body))
}

fn error_answer(admin: &Endpoint, method: &str, path: &str, code: u16, body: &str) -> String {
    let detail = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| body.trim().chars().take(200).collect());
    format!("the xvs admin API at {admin} answered {code} to {method} {path}: {detail}")
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

/// A connection to the admin API.
trait Conn: Read + Write {}
impl<T: Read + Write> Conn for T {}

/// One request: the status code and the body.
fn request(admin: &Endpoint, method: &str, path: &str) -> Result<(u16, String), String> {
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
    let io_err = |e: io::Error| format!("reading from the xvs admin API at {admin}: {e}");
    let mut conn: Box<dyn Conn> = match admin {
        Endpoint::Tcp(a) => {
            let c = TcpStream::connect_timeout(a, CONNECT_TIMEOUT).map_err(unreachable)?;
            c.set_read_timeout(Some(IO_TIMEOUT)).map_err(io_err)?;
            c.set_write_timeout(Some(IO_TIMEOUT)).map_err(io_err)?;
            Box::new(c)
        }
        Endpoint::Unix(p) => {
            let c = UnixStream::connect(p).map_err(unreachable)?;
            c.set_read_timeout(Some(IO_TIMEOUT)).map_err(io_err)?;
            c.set_write_timeout(Some(IO_TIMEOUT)).map_err(io_err)?;
            Box::new(c)
        }
    };
    let host = match admin {
        Endpoint::Tcp(a) => a.to_string(),
        Endpoint::Unix(_) => "localhost".to_owned(),
    };
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: xvs-cli\r\nAccept: application/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(io_err)?;
    let mut raw = Vec::new();
    conn.take(RESPONSE_MAX)
        .read_to_end(&mut raw)
        .map_err(io_err)?;
    parse_response(&raw)
        .ok_or_else(|| format!("malformed HTTP response from {admin} to {method} {path}"))
}

/// Splits an HTTP/1.x response into status and body (honouring Content-Length when present).
fn parse_response(raw: &[u8]) -> Option<(u16, String)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next()?;
    if !status.starts_with("HTTP/1.") {
        return None;
    }
    let code = status.split(' ').nth(1)?.parse().ok()?;
    for l in lines {
        if let Some((k, v)) = l.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            let n: usize = v.trim().parse().ok()?;
            body = body.get(..n)?;
        }
    }
    Some((code, String::from_utf8_lossy(body).into_owned()))
}

/// Left-aligned columns, two spaces apart, each line indented by `indent`.
fn table(indent: &str, header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::from(indent);
        for (i, (c, w)) in cells.zip(&width).enumerate() {
            if i + 1 == width.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

fn render_status(
    admin: &Endpoint,
    code: u16,
    h: &HealthzBody,
    s: &StatsView,
    now: SystemTime,
) -> String {
    let mut o = String::new();
    let state = if code == 200 {
        "healthy".to_owned()
    } else {
        format!(
            "UNHEALTHY ({code}): {}",
            h.reason.as_deref().unwrap_or("no reason given")
        )
    };
    let _ = writeln!(o, "xvs at {admin}: {state}");
    let fastpath = if h.fastpath_running {
        "running"
    } else {
        "NOT running"
    };
    let _ = writeln!(o, "fastpath:   {fastpath}, {} workers", s.workers.len());
    let last = match s.sync.last_sync_unix_s {
        Some(t) => {
            let now_s = slowpath::admin::unix_s(now);
            format!(
                "last {} ({:.1}s ago), took {:.1} ms",
                if h.last_updated.is_empty() {
                    "?"
                } else {
                    &h.last_updated
                },
                (now_s - t).max(0.0),
                s.sync.last_duration_s * 1e3
            )
        }
        None => "never".to_owned(),
    };
    let _ = writeln!(
        o,
        "sync:       generation {}, {last}; {} syncs; reloads {} ok, {} failed",
        s.generation, s.sync.syncs, s.sync.reloads_ok, s.sync.reloads_failed
    );
    if let Some(b) = &s.bgp {
        let _ = writeln!(
            o,
            "bgp:        {}, BIRD {}; announcing {} VIPs, {} SNAT, {} backups; {} reconfigures, {} errors{}",
            if b.live { "live" } else { "NOT live" },
            if b.in_sync { "in sync" } else { "NOT in sync" },
            b.vips,
            b.snat,
            b.backups,
            b.reconfigures,
            b.errors,
            b.last_error
                .as_deref()
                .map_or_else(String::new, |e| format!("; last error: {e}"))
        );
    }
    let t = &s.flowtable;
    let pct = if t.capacity == 0 {
        0.0
    } else {
        t.flows as f64 * 100.0 / t.capacity as f64
    };
    let _ = writeln!(
        o,
        "flow table: {} / {} flows ({pct:.1}%), {:.0} bytes per flow; inserted {}, refused full {}, recycled {}, expired {}",
        t.flows, t.capacity, t.bytes_per_flow, t.inserted, t.full, t.recycled, t.expired
    );
    if !s.workers.is_empty() {
        o.push_str("\nworkers:\n");
        let rows: Vec<Vec<String>> = s
            .workers
            .iter()
            .map(|w| {
                vec![
                    w.index.to_string(),
                    w.rx.to_string(),
                    w.tx.to_string(),
                    w.pass.to_string(),
                    w.slow.to_string(),
                    w.drops.values().sum::<u64>().to_string(),
                    w.new_flows.to_string(),
                    w.generation.to_string(),
                ]
            })
            .collect();
        o.push_str(&table(
            "  ",
            &[
                "WORKER",
                "RX",
                "TX",
                "PASS",
                "SLOW",
                "DROPS",
                "NEW_FLOWS",
                "GEN",
            ],
            &rows,
        ));
    }
    let mut drops: std::collections::BTreeMap<&str, u64> = Default::default();
    for w in &s.workers {
        for (r, n) in &w.drops {
            *drops.entry(r).or_default() += n;
        }
    }
    let nonzero: Vec<Vec<String>> = drops
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| vec![(*r).to_owned(), n.to_string()])
        .collect();
    if !nonzero.is_empty() {
        o.push_str("\ndrops:\n");
        o.push_str(&table("  ", &["REASON", "FRAMES"], &nonzero));
    }
    let mut rejects: std::collections::BTreeMap<&str, u64> = Default::default();
    for w in &s.workers {
        for (r, n) in &w.rejects {
            *rejects.entry(r).or_default() += n;
        }
    }
    let nonzero: Vec<Vec<String>> = rejects
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| vec![(*r).to_owned(), n.to_string()])
        .collect();
    if !nonzero.is_empty() {
        o.push_str("\nrejects (answered with an RST or a port unreachable):\n");
        o.push_str(&table("  ", &["REASON", "FRAMES"], &nonzero));
    }
    if !s.steering.is_empty() {
        o.push_str("\nsteering:\n");
        let rows: Vec<Vec<String>> = s
            .steering
            .iter()
            .map(|x| {
                vec![
                    x.interface.clone(),
                    x.redirected.to_string(),
                    x.passed.to_string(),
                ]
            })
            .collect();
        o.push_str(&table("  ", &["INTERFACE", "REDIRECTED", "PASSED"], &rows));
    }
    o
}

/// A service's backends and its total (`(service)`), with their traffic
/// (`ipvsadm -Ln --stats`) or its rates (`--rate`).
fn traffic_table(s: &slowpath::admin::ServiceView, rates: bool) -> String {
    let cells = |t: &TrafficView, r: &RateView| -> [String; 5] {
        if rates {
            [r.cps, r.in_pps, r.out_pps, r.in_bps, r.out_bps].map(|v| format!("{v:.0}"))
        } else {
            [t.conns, t.in_pkts, t.out_pkts, t.in_bytes, t.out_bytes].map(|v| v.to_string())
        }
    };
    let row = |name: String, t: &TrafficView, r: &RateView| {
        std::iter::once(name).chain(cells(t, r)).collect::<Vec<_>>()
    };
    let mut rows: Vec<Vec<String>> = s
        .backends
        .iter()
        .map(|b| row(b.addr.to_string(), &b.stats, &b.rate))
        .collect();
    rows.push(row("(service)".to_owned(), &s.stats, &s.rate));
    let head: &[&str] = if rates {
        &["BACKEND", "CPS", "INPPS", "OUTPPS", "INBPS", "OUTBPS"]
    } else {
        &[
            "BACKEND", "CONNS", "INPKTS", "OUTPKTS", "INBYTES", "OUTBYTES",
        ]
    };
    table("  ", head, &rows)
}

fn render_services(r: &ServicesResponse, show: ServicesShow) -> String {
    if r.services.is_empty() {
        return "no services\n".to_owned();
    }
    let mut o = String::new();
    for (i, s) in r.services.iter().enumerate() {
        if i > 0 {
            o.push('\n');
        }
        let frontends: Vec<String> = s
            .frontends
            .iter()
            .map(|f| {
                let ip = match f.vip {
                    std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                    v4 => v4.to_string(),
                };
                format!("{ip}:{}/{}", f.port, f.protocol)
            })
            .collect();
        let _ = write!(
            o,
            "{}  {}  {} {}",
            s.name,
            frontends.join(" "),
            s.scheduler,
            s.mode
        );
        if let Some(t) = s.affinity_timeout_s {
            let _ = write!(o, "  affinity {t}s");
        }
        if let Some(l) = s.rate_limit {
            let _ = write!(
                o,
                "  limit {}/s burst {} ({} refused)",
                l.rate, l.burst, s.rate_limited
            );
        }
        if s.frozen {
            o.push_str("  FROZEN");
        }
        o.push('\n');
        if s.backends.is_empty() {
            o.push_str("  (no backends)\n");
            continue;
        }
        match show {
            ServicesShow::Connections => {
                let rows: Vec<Vec<String>> = s
                    .backends
                    .iter()
                    .map(|b| {
                        vec![
                            b.addr.to_string(),
                            b.weight.to_string(),
                            if b.usable { "yes" } else { "no" }.to_owned(),
                            b.active.to_string(),
                            b.inactive.to_string(),
                        ]
                    })
                    .collect();
                o.push_str(&table(
                    "  ",
                    &["BACKEND", "WEIGHT", "USABLE", "ACTIVE", "INACTIVE"],
                    &rows,
                ));
            }
            ServicesShow::Stats => o.push_str(&traffic_table(s, false)),
            ServicesShow::Rate => o.push_str(&traffic_table(s, true)),
        }
    }
    o
}

fn render_flows(r: &FlowsResponse) -> String {
    let rows: Vec<Vec<String>> = r
        .flows
        .iter()
        .map(|f| {
            vec![
                f.protocol.clone(),
                f.client.to_string(),
                f.vip.to_string(),
                f.backend.to_string(),
                f.snat.to_string(),
                f.state.clone(),
                format!("{:.1}s", f.idle_s),
                f.service.clone(),
            ]
        })
        .collect();
    let mut o = table(
        "",
        &[
            "PROTO", "CLIENT", "VIP", "BACKEND", "SNAT", "STATE", "IDLE", "SERVICE",
        ],
        &rows,
    );
    if r.truncated {
        let _ = writeln!(
            o,
            "showing {} of {} flows; use --limit (at most 10000) or narrow the filters",
            r.flows.len(),
            r.total_matched
        );
    } else if r.total_matched > 0 || r.flows.is_empty() {
        let _ = writeln!(o, "{} flows shown (all that matched)", r.flows.len());
    } else {
        // An older xvs, which does not count.
        let _ = writeln!(
            o,
            "{} flows shown (limit {}{})",
            r.flows.len(),
            r.limit,
            if r.flows.len() >= r.limit {
                "; there may be more"
            } else {
                ""
            }
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread::JoinHandle;

    use slowpath::admin::{BackendView, FlowViewJson, FrontendView, ServiceView, WorkerView};

    /// Serves `n` connections: each gets `(status, body)` of the first route whose path
    /// prefix matches the request target, 404 otherwise. Returns the address.
    fn server(routes: Vec<(&'static str, u16, String)>, n: usize) -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            for conn in l.incoming().take(n) {
                let mut conn = conn.unwrap();
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    let k = conn.read(&mut chunk).unwrap();
                    if k == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..k]);
                }
                let head = String::from_utf8_lossy(&buf);
                let target = head.split(' ').nth(1).unwrap_or("").to_owned();
                let (code, body) = routes
                    .iter()
                    .find(|(p, _, _)| target.starts_with(p))
                    .map(|(_, c, b)| (*c, b.clone()))
                    .unwrap_or((404, "{\"error\":\"no such endpoint\"}".into()));
                let _ = write!(
                    conn,
                    "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (addr, t)
    }

    fn services() -> ServicesResponse {
        ServicesResponse {
            services: vec![ServiceView {
                name: "web".into(),
                frontends: vec![FrontendView {
                    vip: [198, 18, 100, 1].into(),
                    port: 80,
                    protocol: "tcp".into(),
                }],
                scheduler: "wrr".into(),
                mode: "fullnat".into(),
                affinity_timeout_s: Some(10800),
                backends: vec![BackendView {
                    addr: "198.18.1.1:8080".parse().unwrap(),
                    weight: 4,
                    usable: true,
                    health: None,
                    active: 12,
                    inactive: 3,
                    stats: TrafficView {
                        conns: 5,
                        in_pkts: 100,
                        out_pkts: 80,
                        in_bytes: 6_000,
                        out_bytes: 96_000,
                    },
                    rate: RateView {
                        cps: 2.5,
                        in_pps: 50.0,
                        out_pps: 40.0,
                        in_bps: 3_000.0,
                        out_bps: 48_000.0,
                    },
                }],
                frozen: true,
                rate_limit: Some(slowpath::admin::RateLimitView {
                    rate: 100,
                    burst: 20,
                }),
                rate_limited: 7,
                stats: TrafficView {
                    conns: 6,
                    in_pkts: 101,
                    out_pkts: 81,
                    in_bytes: 6_060,
                    out_bytes: 96_060,
                },
                rate: RateView::default(),
            }],
            refused: Vec::new(),
        }
    }

    #[test]
    fn unreachable_is_a_clear_error() {
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let e = run(StatusCmd::Status, &Endpoint::Tcp(addr), false).unwrap_err();
        assert_eq!(
            e,
            format!(
                "cannot reach the xvs admin API at {addr}: connection refused — is xvs running? (its [admin] listen address)"
            )
        );
        assert_eq!(
            main(
                StatusCmd::Services(ServicesShow::Connections),
                &Endpoint::Tcp(addr),
                false
            ),
            ExitCode::FAILURE
        );
    }

    #[test]
    fn services_table_and_json() {
        let body = serde_json::to_string(&services()).unwrap();
        let (addr, t) = server(vec![("/v1/services", 200, body.clone())], 2);
        let (out, ok) = run(
            StatusCmd::Services(ServicesShow::Connections),
            &Endpoint::Tcp(addr),
            false,
        )
        .unwrap();
        assert!(ok);
        assert!(
            out.starts_with("web  198.18.100.1:80/tcp  wrr fullnat  affinity 10800s  limit 100/s burst 20 (7 refused)  FROZEN\n"),
            "{out}"
        );
        assert!(
            out.contains("  BACKEND          WEIGHT  USABLE  ACTIVE  INACTIVE\n"),
            "{out}"
        );
        assert!(
            out.contains("  198.18.1.1:8080  4       yes     12      3\n"),
            "{out}"
        );
        let (raw, _) = run(
            StatusCmd::Services(ServicesShow::Connections),
            &Endpoint::Tcp(addr),
            true,
        )
        .unwrap();
        assert_eq!(raw, body);
        t.join().unwrap();
    }

    fn one_flow() -> FlowViewJson {
        FlowViewJson {
            protocol: "udp".into(),
            client: "198.18.0.1:5353".parse().unwrap(),
            vip: "198.18.100.1:53".parse().unwrap(),
            backend: "198.18.1.1:53".parse().unwrap(),
            snat: "198.18.0.254:20001".parse().unwrap(),
            service: "dns".into(),
            state: "UDP".into(),
            idle_s: 1.25,
            peer: false,
        }
    }

    #[test]
    fn services_stats_and_rates_like_ipvsadm() {
        let body = serde_json::to_string(&services()).unwrap();
        let (addr, t) = server(vec![("/v1/services", 200, body)], 2);
        let (out, _) = run(
            StatusCmd::Services(ServicesShow::Stats),
            &Endpoint::Tcp(addr),
            false,
        )
        .unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "BACKEND", "CONNS", "INPKTS", "OUTPKTS", "INBYTES", "OUTBYTES"
            ],
            "{out}"
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["198.18.1.1:8080", "5", "100", "80", "6000", "96000"],
            "{out}"
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["(service)", "6", "101", "81", "6060", "96060"],
            "{out}"
        );
        let (out, _) = run(
            StatusCmd::Services(ServicesShow::Rate),
            &Endpoint::Tcp(addr),
            false,
        )
        .unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["BACKEND", "CPS", "INPPS", "OUTPPS", "INBPS", "OUTBPS"],
            "{out}"
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["198.18.1.1:8080", "2", "50", "40", "3000", "48000"],
            "{out}"
        );
        t.join().unwrap();
    }

    #[test]
    fn flows_table() {
        let flows = FlowsResponse {
            limit: 1,
            flows: vec![one_flow()],
            total_matched: 123_456,
            truncated: true,
        };
        let (addr, t) = server(
            vec![(
                "/v1/flows?limit=1",
                200,
                serde_json::to_string(&flows).unwrap(),
            )],
            1,
        );
        let cmd = StatusCmd::Flows {
            limit: 1,
            filter: FlowQuery::default(),
        };
        let (out, _) = run(cmd, &Endpoint::Tcp(addr), false).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("PROTO  CLIENT"), "{out}");
        assert!(lines[1].starts_with("udp    198.18.0.1:5353"), "{out}");
        assert!(lines[1].ends_with("UDP    1.2s  dns"), "{out}");
        assert_eq!(
            lines[2],
            "showing 1 of 123456 flows; use --limit (at most 10000) or narrow the filters"
        );
        t.join().unwrap();
    }

    #[test]
    fn flows_filters_go_to_the_server_and_bad_ones_name_the_option() {
        let flows = FlowsResponse {
            limit: 5,
            flows: vec![one_flow()],
            total_matched: 1,
            truncated: false,
        };
        let (addr, t) = server(
            vec![(
                "/v1/flows?limit=5&service=kube-system%2Fkube-dns%3Adns&backend=198.18.1.1%3A53&client=198.18.0.0%2F24&vip=%5B2001%3A2%3A%3A53%5D%3A53",
                200,
                serde_json::to_string(&flows).unwrap(),
            )],
            1,
        );
        let filter = FlowQuery {
            service: Some("kube-system/kube-dns:dns".into()),
            backend: Some("198.18.1.1:53".into()),
            client: Some("198.18.0.0/24".into()),
            vip: Some("[2001:2::53]:53".into()),
        };
        let cmd = StatusCmd::Flows { limit: 5, filter };
        let (out, _) = run(cmd, &Endpoint::Tcp(addr), false).unwrap();
        assert!(
            out.ends_with("\n1 flows shown (all that matched)\n"),
            "{out}"
        );
        t.join().unwrap();

        // Refused before any request (nothing listens there).
        let nowhere = Endpoint::Tcp("127.0.0.1:9".parse().unwrap());
        for (filter, want) in [
            (
                FlowQuery {
                    backend: Some("198.18.1".into()),
                    ..FlowQuery::default()
                },
                "flows: --backend: \"198.18.1\" is not an IP address or IP:PORT",
            ),
            (
                FlowQuery {
                    client: Some("198.18.0.0/99".into()),
                    ..FlowQuery::default()
                },
                "flows: --client: prefix \"99\" is not 0 to 32",
            ),
        ] {
            let e = run(StatusCmd::Flows { limit: 5, filter }, &nowhere, false).unwrap_err();
            assert_eq!(e, want);
        }
    }

    #[test]
    fn status_reports_health_and_counters() {
        let stats = StatsView {
            generation: 7,
            workers: vec![WorkerView {
                index: 0,
                rx: 1000,
                tx: 990,
                drops: [
                    ("no_service".to_owned(), 10),
                    ("bad_checksum".to_owned(), 0),
                ]
                .into_iter()
                .collect(),
                ..WorkerView::default()
            }],
            ..StatsView::default()
        };
        let healthy = r#"{"lastUpdated":"2024-05-01T12:34:56.789Z","currentTime":"2024-05-01T12:34:57.000Z","nodeEligible":true,"fastpathRunning":true}"#;
        let sick = r#"{"lastUpdated":"","currentTime":"2024-05-01T12:34:57.000Z","nodeEligible":true,"fastpathRunning":false,"reason":"fastpath workers are not running"}"#;
        let s = serde_json::to_string(&stats).unwrap();
        let (addr, t) = server(
            vec![
                ("/healthz", 200, healthy.into()),
                ("/v1/stats", 200, s.clone()),
            ],
            4,
        );
        let (out, ok) = run(StatusCmd::Status, &Endpoint::Tcp(addr), false).unwrap();
        assert!(ok);
        assert!(
            out.starts_with(&format!("xvs at {addr}: healthy\n")),
            "{out}"
        );
        assert!(out.contains("generation 7"), "{out}");
        assert!(out.contains("  0       1000  990"), "{out}");
        assert!(out.contains("  no_service  10\n"), "{out}");
        assert!(
            !out.contains("bad_checksum"),
            "zero drops are not listed: {out}"
        );
        let (raw, _) = run(StatusCmd::Status, &Endpoint::Tcp(addr), true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(v["healthz"]["status"], 200);
        assert_eq!(v["stats"]["generation"], 7);
        t.join().unwrap();

        let (addr, t) = server(
            vec![("/healthz", 503, sick.into()), ("/v1/stats", 200, s)],
            2,
        );
        let (out, ok) = run(StatusCmd::Status, &Endpoint::Tcp(addr), false).unwrap();
        assert!(!ok, "unhealthy: exit 1");
        assert!(
            out.contains("UNHEALTHY (503): fastpath workers are not running"),
            "{out}"
        );
        t.join().unwrap();
    }

    #[test]
    fn error_answers_are_reported() {
        let (addr, t) = server(vec![], 1);
        let e = run(
            StatusCmd::Services(ServicesShow::Connections),
            &Endpoint::Tcp(addr),
            false,
        )
        .unwrap_err();
        assert!(
            e.contains("answered 404 to GET /v1/services: no such endpoint"),
            "{e}"
        );
        t.join().unwrap();
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}xx"),
            Some((200, "{}".to_owned()))
        );
        assert_eq!(parse_response(b"garbage"), None);
    }

    /// Answers one connection on a unix socket with `(code, body)`; returns the request
    /// line it got.
    fn unix_server(path: &std::path::Path, code: u16, body: &'static str) -> JoinHandle<String> {
        let l = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = l.accept().unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let k = conn.read(&mut chunk).unwrap();
                if k == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..k]);
            }
            let _ = write!(
                conn,
                "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            String::from_utf8_lossy(&buf)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        })
    }

    #[test]
    fn control_commands_go_to_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("xvs.sock");
        let t = unix_server(&sock, 200, "{\"ok\":true}");
        let ep = Endpoint::Unix(sock.clone());
        let freeze = StatusCmd::Control {
            action: "freeze",
            service: Some("ns/web:http".into()),
        };
        let (out, ok) = run(freeze.clone(), &ep, false).unwrap();
        assert!(ok);
        assert_eq!(out, "freeze: service ns/web:http: ok\n");
        assert_eq!(
            t.join().unwrap(),
            "POST /v1/freeze?service=ns%2Fweb%3Ahttp HTTP/1.1"
        );
        // A refusal is an error with the server's reason.
        std::fs::remove_file(&sock).unwrap();
        let t = unix_server(
            &sock,
            403,
            "{\"error\":\"control endpoints are disabled; set [admin] enable_control = true\"}",
        );
        let e = run(freeze, &ep, false).unwrap_err();
        assert!(e.contains("answered 403 to POST /v1/freeze?service=ns%2Fweb%3Ahttp: control endpoints are disabled"), "{e}");
        t.join().unwrap();
        // No server: says which socket and which key.
        std::fs::remove_file(&sock).unwrap();
        let drain = StatusCmd::Control {
            action: "drain",
            service: None,
        };
        let e = run(drain, &ep, false).unwrap_err();
        assert_eq!(
            e,
            format!(
                "cannot reach the xvs admin API at unix:{}: no such socket — is xvs running? (its [admin] socket)",
                sock.display()
            )
        );
    }

    #[test]
    fn endpoint_choice() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(Endpoint::choose(Some(a), None), Endpoint::Tcp(a));
        assert_eq!(
            Endpoint::choose(None, Some("/x.sock".into())),
            Endpoint::Unix("/x.sock".into())
        );
    }
}
