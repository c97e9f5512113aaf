//! The transport: listeners bound at start-up, one accept loop per listener on the caller's
//! tokio runtime, and a hyper HTTP/1.1 connection per accepted client with the limits of the
//! module docs. What each request gets is [`routes`](super::routes)' business.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::header::{CACHE_CONTROL, CONNECTION, CONTENT_LENGTH};
use axum::http::{HeaderValue, Request, StatusCode};
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, error, info, warn};

use super::AdminSource;
use super::metrics::ProbeCounts;
use super::routes::{self, Api};
use super::socket::{self, SocketFile};

/// Open connections per listener; a connection over it is closed at once.
pub const MAX_CONNECTIONS: usize = 512;
/// Time for a whole request head to arrive, and for an idle keep-alive connection to send
/// its next one.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for a request to be read and answered (body, handler, source calls); then 503.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a response write may make no progress before the connection is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`AdminServer::run`] lets requests in flight finish after shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Most bytes of request line + headers (more: 431).
pub const HEAD_MAX: usize = 8 * 1024;
/// Most bytes of a request body (more: 413).
pub const BODY_MAX: usize = 8 * 1024;
/// Expensive [`AdminSource`] calls running at once (on tokio's blocking pool).
pub const BLOCKING_MAX: usize = 4;
/// A connection's read buffer: a full head, then the body streams through it.
const READ_BUF_MAX: usize = 16 * 1024;
/// First and longest pause after an accept error (EMFILE and friends).
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

// hyper refuses a read buffer under 8 KiB; the head limit must fit in the buffer.
const _: () = assert!(READ_BUF_MAX >= 8192 && HEAD_MAX <= READ_BUF_MAX);
const _: () = assert!(MAX_CONNECTIONS > 0 && BLOCKING_MAX > 0);
const _: () = assert!(ACCEPT_BACKOFF_MIN.as_millis() < ACCEPT_BACKOFF_MAX.as_millis());

/// Where and what the admin API serves (the `[admin]` table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminConfig {
    /// `[admin] listen` (default 127.0.0.1:10249, kube-proxy's metrics address): /metrics,
    /// read-only /v1/*, and /healthz, /livez.
    pub listen: SocketAddr,
    /// `[admin] healthz_listen` (default 0.0.0.0:10256): ONLY /healthz and /livez. None: not
    /// served separately. If equal to `listen` (and not port 0), one listener serves the
    /// `listen` set.
    pub healthz_listen: Option<SocketAddr>,
    /// `[admin] metrics_listen` (default none): ONLY /metrics, for a Prometheus elsewhere.
    pub metrics_listen: Option<SocketAddr>,
    /// `[admin] socket` (default /run/xvs/xvs.sock): a unix socket, mode 0600, serving
    /// everything `listen` serves plus the control endpoints. None: no socket.
    pub socket: Option<PathBuf>,
    /// `[admin] enable_control`: control endpoints act (only on the socket); otherwise 403
    /// naming the key.
    pub control_enabled: bool,
}

/// The server's limits. [`Default`] is the constants of this module; tests shorten them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminLimits {
    /// Open connections per listener ([`MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// Whole-head and keep-alive idle timeout ([`HEADER_TIMEOUT`]).
    pub header_timeout: Duration,
    /// Per-request deadline ([`REQUEST_TIMEOUT`]).
    pub request_timeout: Duration,
    /// Longest stalled response write ([`WRITE_TIMEOUT`]).
    pub write_timeout: Duration,
    /// Shutdown grace for requests in flight ([`SHUTDOWN_GRACE`]).
    pub shutdown_grace: Duration,
}

impl Default for AdminLimits {
    fn default() -> AdminLimits {
        AdminLimits {
            max_connections: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
            shutdown_grace: SHUTDOWN_GRACE,
        }
    }
}

/// Why the admin server could not start. Every message names the `[admin]` key at fault.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A TCP address (`listen`, `healthz_listen`, `metrics_listen`) could not be bound.
    #[error("[admin] {key} {addr}: {source}")]
    Listen {
        /// The config key: `listen`, `healthz_listen` or `metrics_listen`.
        key: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// What bind(2) said.
        source: io::Error,
    },
    /// Another process accepts connections on the socket path.
    #[error(
        "[admin] socket {}: in use by another process (another xvs?); stop it or choose another path",
        path.display()
    )]
    SocketInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket path exists and is not a socket; it is left alone.
    #[error(
        "[admin] socket {}: exists and is not a unix socket; remove it or choose another path",
        path.display()
    )]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// A step of preparing or binding the socket failed.
    #[error("[admin] socket {}: {what}: {source}", path.display())]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// The step: "creating its directory", "binding"...
        what: &'static str,
        /// The system's error.
        source: io::Error,
    },
}

/// Which set of endpoints a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Exposure {
    /// `[admin] listen`: read-only API and probes.
    Listen,
    /// `[admin] healthz_listen`: probes only.
    Healthz,
    /// `[admin] metrics_listen`: `/metrics` only.
    Metrics,
    /// `[admin] socket`: everything, control included.
    Socket,
}

impl Exposure {
    /// The `listener` label of the server's metrics.
    pub(super) fn name(self) -> &'static str {
        match self {
            Exposure::Listen => "listen",
            Exposure::Healthz => "healthz",
            Exposure::Metrics => "metrics",
            Exposure::Socket => "socket",
        }
    }
}

/// Connection counts of one listener.
#[derive(Debug)]
pub(super) struct ListenerStats {
    pub(super) exposure: Exposure,
    /// Connections open now.
    pub(super) open: AtomicUsize,
    /// Connections closed at once because `open` was at the bound.
    pub(super) rejected: AtomicU64,
}

impl ListenerStats {
    fn try_open(self: &Arc<Self>, max: usize) -> Option<ConnSlot> {
        let mut n = self.open.load(Ordering::Relaxed);
        loop {
            if n >= max {
                return None;
            }
            match self
                .open
                .compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(ConnSlot(Arc::clone(self))),
                Err(now) => n = now,
            }
        }
    }
}

/// One of a listener's `max_connections` slots, given back on drop.
struct ConnSlot(Arc<ListenerStats>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

enum StdListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

struct Bound {
    listener: StdListener,
    stats: Arc<ListenerStats>,
}

/// The admin server, bound and not yet serving. Dropping it without [`AdminServer::run`]
/// closes the listeners and removes the socket file.
pub struct AdminServer {
    bound: Vec<Bound>,
    local: SocketAddr,
    healthz: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    socket: Option<SocketFile>,
    api: Arc<Api>,
    limits: AdminLimits,
}

impl AdminServer {
    /// Binds every listener now (std listeners set non-blocking; no runtime needed), so errors
    /// are immediate and name the key and address, e.g. `[admin] healthz_listen
    /// 0.0.0.0:10256: Address already in use`.
    pub fn bind(
        cfg: &AdminConfig,
        source: Arc<dyn AdminSource>,
    ) -> Result<AdminServer, AdminError> {
        AdminServer::bind_with(cfg, source, AdminLimits::default())
    }

    /// [`AdminServer::bind`] with other limits than the defaults.
    pub fn bind_with(
        cfg: &AdminConfig,
        source: Arc<dyn AdminSource>,
        limits: AdminLimits,
    ) -> Result<AdminServer, AdminError> {
        let (tcp, stats) = (bind_tcp, listener_stats);
        let mut bound = Vec::with_capacity(4);
        let (listen, local) = tcp("listen", cfg.listen)?;
        bound.push(Bound {
            listener: StdListener::Tcp(listen),
            stats: stats(Exposure::Listen),
        });
        // Port 0 asks for a port of its own each time, so two port-0 addresses never share.
        let healthz = match cfg.healthz_listen {
            None => None,
            Some(a) if a == cfg.listen && a.port() != 0 => Some(local),
            Some(a) => {
                let (l, addr) = tcp("healthz_listen", a)?;
                bound.push(Bound {
                    listener: StdListener::Tcp(l),
                    stats: stats(Exposure::Healthz),
                });
                Some(addr)
            }
        };
        // Always a listener of its own (the config refuses an address another one has).
        let metrics = match cfg.metrics_listen {
            None => None,
            Some(a) => {
                let (l, addr) = tcp("metrics_listen", a)?;
                bound.push(Bound {
                    listener: StdListener::Tcp(l),
                    stats: stats(Exposure::Metrics),
                });
                Some(addr)
            }
        };
        let socket = match &cfg.socket {
            None => None,
            Some(path) => {
                let (l, file) = socket::bind(path)?;
                bound.push(Bound {
                    listener: StdListener::Unix(l),
                    stats: stats(Exposure::Socket),
                });
                Some(file)
            }
        };
        let api = Arc::new(Api {
            source,
            control_enabled: cfg.control_enabled,
            probes: Mutex::new(ProbeCounts::default()),
            blocking: Arc::new(Semaphore::new(BLOCKING_MAX)),
            listeners: bound.iter().map(|b| Arc::clone(&b.stats)).collect(),
            timed_out: AtomicU64::new(0),
        });
        Ok(AdminServer {
            bound,
            local,
            healthz,
            metrics,
            socket,
            api,
            limits,
        })
    }

    /// The `listen` address (the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Where `/healthz` is served for outside: the `healthz_listen` address (the `listen`
    /// one when both are equal), or None without `healthz_listen`.
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz
    }

    /// The `metrics_listen` address (the real port when 0 was asked), when there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics
    }

    /// The unix socket's path, when there is one.
    pub fn socket_path(&self) -> Option<&Path> {
        self.socket.as_ref().map(SocketFile::path)
    }

    /// Serves until `shutdown` is cancelled, then stops accepting, lets requests in flight
    /// finish (at most [`SHUTDOWN_GRACE`], then their connections are dropped), removes the
    /// socket file and returns. Must be spawned on a multi-thread tokio runtime (the
    /// expensive source calls use its blocking pool).
    pub async fn run(self, shutdown: CancellationToken) {
        let AdminServer {
            bound,
            local,
            healthz,
            metrics,
            socket,
            api,
            limits,
        } = self;
        info!(
            listen = %local,
            healthz = ?healthz,
            metrics = ?metrics,
            socket = ?socket.as_ref().map(SocketFile::path),
            control = api.control_enabled,
            "admin API serving"
        );
        let loops = bound
            .into_iter()
            .map(|b| accept_loop(b, Arc::clone(&api), limits, shutdown.clone()));
        futures::future::join_all(loops).await;
        // The listeners are closed; now the socket file goes.
        drop(socket);
        debug!("admin API stopped");
    }
}

/// A non-blocking TCP listener on `addr` (`[admin] key`), and the address it got.
fn bind_tcp(
    key: &'static str,
    addr: SocketAddr,
) -> Result<(std::net::TcpListener, SocketAddr), AdminError> {
    let l = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| AdminError::Listen { key, addr, source })?;
    let local = l
        .local_addr()
        .map_err(|source| AdminError::Listen { key, addr, source })?;
    Ok((l, local))
}

/// The counters of a new listener of `exposure`.
fn listener_stats(exposure: Exposure) -> Arc<ListenerStats> {
    Arc::new(ListenerStats {
        exposure,
        open: AtomicUsize::new(0),
        rejected: AtomicU64::new(0),
    })
}

/// The admin servers, once bound ([`AdminServer::bind`]), as a [`crate::service::Service`]:
/// binding is what can fail, so it happens first and `start` only runs them.
impl crate::service::Service for AdminServer {
    type Handle = ();
    type Error = Infallible;
    const NAME: &'static str = "the admin servers";

    fn start(
        self,
        rt: &tokio::runtime::Handle,
        shutdown: &CancellationToken,
    ) -> Result<crate::service::Running<()>, Infallible> {
        let task = rt.spawn(self.run(shutdown.clone()));
        Ok(crate::service::Running { handle: (), task })
    }
}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

enum Accepted {
    Tcp(tokio::net::TcpStream, SocketAddr),
    Unix(tokio::net::UnixStream),
}

impl Listener {
    fn from_std(l: StdListener) -> io::Result<Listener> {
        Ok(match l {
            StdListener::Tcp(l) => Listener::Tcp(tokio::net::TcpListener::from_std(l)?),
            StdListener::Unix(l) => Listener::Unix(tokio::net::UnixListener::from_std(l)?),
        })
    }

    async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, a)| Accepted::Tcp(s, a)),
            Listener::Unix(l) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
        }
    }
}

/// Errors of accept(2) that concern one connection, not the listener: retry at once.
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

async fn accept_loop(b: Bound, api: Arc<Api>, limits: AdminLimits, shutdown: CancellationToken) {
    let stats = b.stats;
    let name = stats.exposure.name();
    let listener = match Listener::from_std(b.listener) {
        Ok(l) => l,
        Err(e) => {
            error!(listener = name, error = %e, "cannot register the admin listener with the runtime");
            return;
        }
    };
    let router = routes::router(Arc::clone(&api), stats.exposure);
    let mut conns = JoinSet::new();
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(done) = conns.join_next(), if !conns.is_empty() => {
                if let Err(e) = done
                    && e.is_panic()
                {
                    warn!(listener = name, "an admin connection task panicked");
                }
                continue;
            }
            r = listener.accept() => r,
        };
        let conn = match accepted {
            Ok(c) => {
                backoff = ACCEPT_BACKOFF_MIN;
                c
            }
            Err(e) if per_connection(&e) => {
                debug!(listener = name, error = %e, "admin accept");
                continue;
            }
            Err(e) => {
                // EMFILE, ENFILE, ENOBUFS...: the condition lasts, so wait instead of spinning.
                warn!(listener = name, error = %e, backoff_ms = backoff.as_millis() as u64, "admin accept failed; pausing");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let Some(slot) = stats.try_open(limits.max_connections) else {
            drop(conn);
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            debug!(
                listener = name,
                max = limits.max_connections,
                "admin connection refused: too many open"
            );
            continue;
        };
        let (router, api, shutdown) = (router.clone(), Arc::clone(&api), shutdown.clone());
        match conn {
            Accepted::Tcp(s, peer) => {
                let peer = peer.to_string();
                conns.spawn(serve_conn(s, peer, router, api, limits, shutdown, slot))
            }
            Accepted::Unix(s) => {
                let peer = "unix".to_owned();
                conns.spawn(serve_conn(s, peer, router, api, limits, shutdown, slot))
            }
        };
    }
    // Stop accepting now: new clients get refused rather than queued behind the shutdown.
    drop(listener);
    drain(conns, limits.shutdown_grace, name).await;
}

/// Waits up to `grace` for the connections in flight, then drops the rest.
async fn drain(mut conns: JoinSet<()>, grace: Duration, name: &str) {
    let drained = tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} })
        .await
        .is_ok();
    if !drained {
        debug!(
            listener = name,
            left = conns.len(),
            "admin connections still busy after the shutdown grace; dropping them"
        );
        conns.shutdown().await;
    }
}

async fn serve_conn<I>(
    io: I,
    peer: String,
    router: Router,
    api: Arc<Api>,
    limits: AdminLimits,
    shutdown: CancellationToken,
    _slot: ConnSlot,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(WriteDeadline::new(io, limits.write_timeout));
    let svc = hyper::service::service_fn(move |req| {
        handle(
            req,
            router.clone(),
            Arc::clone(&api),
            limits.request_timeout,
        )
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(HEAD_MAX)
        .max_buf_size(READ_BUF_MAX)
        .keep_alive(true);
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = shutdown.cancelled() => {
            // Finishes the request in flight, if any, then closes; idle connections close now.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        // Timeouts, resets, malformed requests: the client's problem, not the server's.
        debug!(peer, error = %e, "admin connection ended");
    }
}

/// One request: the body (bounded), the router, all within the request deadline.
async fn handle(
    req: Request<Incoming>,
    router: Router,
    api: Arc<Api>,
    deadline: Duration,
) -> Result<Response, Infallible> {
    let mut resp = match tokio::time::timeout(deadline, dispatch(req, router)).await {
        Ok(r) => r,
        Err(_) => {
            api.timed_out.fetch_add(1, Ordering::Relaxed);
            debug!(
                deadline_ms = deadline.as_millis() as u64,
                "admin request timed out"
            );
            routes::error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "the request was not answered within {:.1}s; try again later",
                    deadline.as_secs_f64()
                ),
            )
        }
    };
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

async fn dispatch(req: Request<Incoming>, router: Router) -> Response {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_MAX as u64) {
        return closing(routes::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
        ));
    }
    // Read the whole (small) body before routing: no handler sees a half-read request, and
    // the connection stays usable for the next one.
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, BODY_MAX).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return closing(routes::error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large",
            ));
        }
        Err(e) => {
            return closing(routes::error(
                StatusCode::BAD_REQUEST,
                &format!("reading the request body: {e}"),
            ));
        }
    };
    match router
        .oneshot(Request::from_parts(parts, Body::from(body)))
        .await
    {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// `resp` with `Connection: close`: the rest of the request was not read, so the connection
/// cannot carry another.
fn closing(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// A stream whose writes fail with `TimedOut` once one has made no progress for `limit`:
/// hyper has no write timeout, and a client that never reads would otherwise hold its
/// connection (and its slot) for ever.
pub(super) struct WriteDeadline<I> {
    io: I,
    limit: Duration,
    /// Armed by the first write that could not proceed; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<I> WriteDeadline<I> {
    pub(super) fn new(io: I, limit: Duration) -> WriteDeadline<I> {
        WriteDeadline {
            io,
            limit,
            stalled: None,
        }
    }

    /// After the inner write returned `r`: disarm on progress; on `Pending`, arm (once) and
    /// fail when the deadline has passed.
    fn check<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {:.1}s", limit.as_secs_f64()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteDeadline<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.check(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.check(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.check(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.check(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_stalled_write_fails_after_the_limit() {
        // 64 bytes of buffer, and the reader never reads.
        let (near, mut far) = tokio::io::duplex(64);
        let mut w = WriteDeadline::new(near, Duration::from_millis(50));
        let err = w.write_all(&[7; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // What fitted was written.
        let mut got = vec![0; 64];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(got, vec![7; 64]);
    }

    #[tokio::test]
    async fn a_slow_reader_is_not_a_stalled_one() {
        // The reader takes 64 bytes every 20 ms: each pause is shorter than the limit, the
        // whole write much longer. Progress disarms the deadline.
        let (near, mut far) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let mut total = 0;
            let mut buf = [0; 64];
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                match far.read(&mut buf).await.unwrap() {
                    0 => return total,
                    n => total += n,
                }
            }
        });
        let mut w = WriteDeadline::new(near, Duration::from_millis(500));
        w.write_all(&[1; 64 * 40]).await.unwrap();
        w.shutdown().await.unwrap();
        drop(w);
        assert_eq!(reader.await.unwrap(), 64 * 40);
    }
}
