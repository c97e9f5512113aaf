//! The healthCheckNodePort server of `externalTrafficPolicy: Local` LoadBalancer Services:
//! cloud load balancers probe `http://NODE:PORT/` and send traffic only to nodes that answer
//! 200, i.e. nodes with at least one ready local endpoint. Like kube-proxy, any path answers;
//! the body is JSON:
//! `{"service":{"namespace":"ns","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}`,
//! with status 200 when `localEndpoints > 0` and 503 otherwise.
//!
//! One listener per port, each its own task on the caller's tokio runtime. Each connection
//! is one hyper HTTP/1.1 exchange (the admin server's stack): one request head, bounded in
//! size ([`READ_BUF_MAX`]) and time ([`REQUEST_TIMEOUT`]), gets one response with
//! `Connection: close`; a malformed or oversized head gets hyper's 400/431 and the
//! connection closes. Headers are written title-case, as kube-proxy's Go server does:
//! `Content-Type: application/json`, `X-Content-Type-Options: nosniff`, `Content-Length`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::convert::Infallible;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::HealthCheckNodePort;

/// A connection's read buffer, which bounds the request head (hyper's minimum is 8 KiB).
const READ_BUF_MAX: usize = 8 * 1024;
/// Time for a whole request head to arrive; then the connection is closed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What one health-check port reports; shared between the listener and the updater.
#[derive(Debug)]
pub struct HcState {
    service: Mutex<String>,
    local_endpoints: AtomicU32,
}

impl HcState {
    /// State for `service` (`ns/name`) with `local_endpoints` local endpoints.
    pub fn new(service: &str, local_endpoints: u32) -> Arc<HcState> {
        Arc::new(HcState {
            service: Mutex::new(service.to_owned()),
            local_endpoints: AtomicU32::new(local_endpoints),
        })
    }

    /// Updates the reported service and count.
    pub fn set(&self, service: &str, local_endpoints: u32) {
        if let Ok(mut s) = self.service.lock()
            && *s != service
        {
            *s = service.to_owned();
        }
        self.local_endpoints
            .store(local_endpoints, Ordering::Relaxed);
    }

    /// The status code and body a probe gets now.
    pub fn response(&self) -> (u16, String) {
        let service = self.service.lock().map(|s| s.clone()).unwrap_or_default();
        let (ns, name) = service.split_once('/').unwrap_or(("", &service));
        let n = self.local_endpoints.load(Ordering::Relaxed);
        let body = format!(
            "{{\"service\":{{\"namespace\":{},\"name\":{}}},\"localEndpoints\":{n},\"serviceProxyHealthy\":true}}",
            json_string(ns),
            json_string(name)
        );
        (if n > 0 { 200 } else { 503 }, body)
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Serves health checks on `listener` until the task is aborted.
pub async fn serve(listener: TcpListener, state: Arc<HcState>) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            // Out of descriptors and the like: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _ = answer(conn, &state).await;
        });
    }
}

async fn answer(conn: TcpStream, state: &Arc<HcState>) -> hyper::Result<()> {
    let state = Arc::clone(state);
    let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
        std::future::ready(Ok::<_, Infallible>(http_response(&state)))
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .max_buf_size(READ_BUF_MAX)
        .title_case_headers(true)
        .keep_alive(false);
    builder.serve_connection(TokioIo::new(conn), svc).await
}

/// What every request gets: [`HcState::response`] as JSON.
fn http_response(state: &HcState) -> Response<Full<Bytes>> {
    let (code, body) = state.response();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// The healthCheckNodePort servers of `externalTrafficPolicy: Local` Services as a
/// [`crate::service::Service`]: they follow the latest list of ports sent to the handle. A
/// port that cannot be bound is retried at the next list, its failure logged with backoff.
#[derive(Debug, Default)]
pub struct HealthCheckNodePortService;

impl crate::service::Service for HealthCheckNodePortService {
    type Handle = tokio::sync::mpsc::UnboundedSender<Vec<HealthCheckNodePort>>;
    type Error = std::convert::Infallible;
    const NAME: &'static str = "the healthCheckNodePort servers";

    fn start(
        self,
        rt: &tokio::runtime::Handle,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Result<crate::service::Running<Self::Handle>, Self::Error> {
        let (handle, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = rt.spawn(follow(rx, shutdown.clone()));
        Ok(crate::service::Running { handle, task })
    }
}

/// Serves the ports of the latest list received on `rx` until `shutdown`.
async fn follow(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Vec<HealthCheckNodePort>>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    // kube-proxy binds these on every address of the node.
    let mut servers = HealthCheckServers::new(std::net::Ipv6Addr::UNSPECIFIED.into());
    // A port that cannot be bound fails again at every model: logged with backoff.
    let mut failing: HashMap<u16, crate::repeat::RepeatLog> = HashMap::new();
    loop {
        let ports = tokio::select! {
            p = rx.recv() => match p {
                Some(p) => p,
                None => return,
            },
            () = shutdown.cancelled() => return,
        };
        let failed = servers.update(&ports).await;
        let now = std::time::Instant::now();
        for (port, e) in &failed {
            if let Some(errors) = failing.entry(*port).or_default().failed(now) {
                tracing::warn!(port, errors, error = %e, "healthCheckNodePort not served (retried at the next sync)");
            }
        }
        failing.retain(|port, log| {
            if failed.iter().any(|(p, _)| p == port) {
                return true;
            }
            if let Some(errors) = log.recovered()
                && servers.ports().contains(port)
            {
                tracing::info!(port, errors, "healthCheckNodePort served");
            }
            false
        });
    }
}

/// The set of health-check listeners, kept in line with the model's
/// [`HealthCheckNodePort`]s. Must be used inside a tokio runtime.
#[derive(Debug)]
pub struct HealthCheckServers {
    bind: IpAddr,
    servers: HashMap<u16, (Arc<HcState>, SocketAddr, JoinHandle<()>)>,
}

impl HealthCheckServers {
    /// Listeners will bind `bind` (usually `0.0.0.0` or a node address).
    pub fn new(bind: IpAddr) -> Self {
        HealthCheckServers {
            bind,
            servers: HashMap::new(),
        }
    }

    /// Opens listeners for new ports, updates the counts of existing ones and closes the
    /// ones no longer listed. Returns the ports that could not be bound (retried next time).
    pub async fn update(&mut self, ports: &[HealthCheckNodePort]) -> Vec<(u16, io::Error)> {
        let mut failed = Vec::new();
        let wanted: HashMap<u16, &HealthCheckNodePort> =
            ports.iter().map(|p| (p.port, p)).collect();
        self.servers.retain(|port, (_, _, task)| {
            let keep = wanted.contains_key(port);
            if !keep {
                task.abort();
            }
            keep
        });
        for (port, hc) in wanted {
            if let Some((state, _, _)) = self.servers.get(&port) {
                state.set(&hc.service, hc.local_endpoints);
                continue;
            }
            match TcpListener::bind(SocketAddr::new(self.bind, port)).await {
                Ok(listener) => {
                    let addr = listener
                        .local_addr()
                        .unwrap_or(SocketAddr::new(self.bind, port));
                    let state = HcState::new(&hc.service, hc.local_endpoints);
                    let task = tokio::spawn(serve(listener, state.clone()));
                    self.servers.insert(port, (state, addr, task));
                }
                Err(e) => failed.push((port, e)),
            }
        }
        failed
    }

    /// The ports served now, sorted.
    pub fn ports(&self) -> Vec<u16> {
        let mut p: Vec<u16> = self.servers.keys().copied().collect();
        p.sort_unstable();
        p
    }
}

impl Drop for HealthCheckServers {
    fn drop(&mut self) {
        for (_, _, task) in self.servers.values() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr) -> String {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn answers_200_with_local_endpoints_and_503_without() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = HcState::new("prod/web", 2);
        let task = tokio::spawn(serve(listener, state.clone()));
        let r = get(addr).await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("\r\nContent-Type: application/json\r\n"), "{r}");
        assert!(r.contains("\r\nX-Content-Type-Options: nosniff\r\n"), "{r}");
        assert!(r.contains("\r\nConnection: close\r\n"), "{r}");
        assert!(r.contains("\r\nContent-Length: 91\r\n"), "{r}");
        assert!(
            r.ends_with(
                "{\"service\":{\"namespace\":\"prod\",\"name\":\"web\"},\"localEndpoints\":2,\"serviceProxyHealthy\":true}"
            ),
            "{r}"
        );
        state.set("prod/web", 0);
        let r = get(addr).await;
        assert!(r.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{r}");
        assert!(r.contains("\"localEndpoints\":0"), "{r}");
        task.abort();
    }

    #[tokio::test]
    async fn servers_follow_the_model() {
        // Find a free port, then let the server set bind it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut servers = HealthCheckServers::new(IpAddr::from([127, 0, 0, 1]));
        let hc = |n| HealthCheckNodePort {
            port,
            service: "ns/a".to_owned(),
            local_endpoints: n,
        };
        assert!(servers.update(&[hc(1)]).await.is_empty());
        assert_eq!(servers.ports(), vec![port]);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        assert!(get(addr).await.starts_with("HTTP/1.1 200"));
        assert!(servers.update(&[hc(0)]).await.is_empty());
        assert!(get(addr).await.starts_with("HTTP/1.1 503"));
        assert!(servers.update(&[]).await.is_empty());
        assert!(servers.ports().is_empty());
    }

    /// Sends `request` and reads what comes back until the server closes.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).await.unwrap();
        // The server may close before reading everything (an oversized head).
        let _ = c.write_all(request).await;
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn garbage_and_oversized_heads_are_refused_and_the_port_keeps_answering() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = HcState::new("prod/web", 1);
        let task = tokio::spawn(serve(listener, state));
        let r = exchange(addr, b"\x16\x03\x01\x02\x00garbage\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{r:?}");
        assert!(!r.contains("localEndpoints"), "{r:?}");
        let mut huge = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
        huge.resize(64 * 1024, b'a');
        let r = exchange(addr, &huge).await;
        assert!(
            !r.contains("localEndpoints"),
            "an endless head is not answered: {r:?}"
        );
        let r = get(addr).await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        task.abort();
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
