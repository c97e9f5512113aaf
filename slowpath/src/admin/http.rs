//! A small blocking HTTP/1.1 server: one acceptor thread and a fixed pool of handler threads.
//!
//! Limits: request head at most [`HEAD_MAX`] bytes, body at most [`BODY_MAX`] bytes (read and
//! discarded), [`IO_TIMEOUT`] per read/write, at most [`QUEUE_MAX`] accepted connections
//! waiting for a handler (more are answered 503 at once). One request per connection
//! (`Connection: close`): admin clients are scrapers and CLIs, not browsers.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Most bytes of request line + headers.
pub const HEAD_MAX: usize = 8 * 1024;
/// Most bytes of a request body.
pub const BODY_MAX: usize = 8 * 1024;
/// Read and write timeout of a connection.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Handler threads.
pub const HANDLERS: usize = 2;
/// Accepted connections waiting for a handler.
pub const QUEUE_MAX: usize = 32;
/// Longest wait for the client's FIN after a response.
const LINGER: Duration = Duration::from_millis(500);
/// Most bytes discarded while waiting for it.
const LINGER_BYTES: u64 = 64 * 1024;
/// How often the acceptor looks at the stop flag.
const STOP_POLL_MS: i32 = 100;

/// A parsed request.
#[derive(Debug)]
pub struct Request {
    /// Method, as sent (`GET`, `POST`...).
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// The query string (after `?`), possibly empty.
    pub query: String,
}

impl Request {
    /// The value of query parameter `key`, if present.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == key).then_some(v)
        })
    }
}

/// A response.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Content-Type.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
    /// Extra headers (name, value).
    pub headers: Vec<(&'static str, String)>,
}

impl Response {
    /// A JSON response.
    pub fn json(status: u16, body: &impl serde::Serialize) -> Response {
        let mut body = serde_json::to_vec_pretty(body).unwrap_or_else(|_| b"{}".to_vec());
        body.push(b'\n');
        Response {
            status,
            content_type: "application/json",
            body,
            headers: Vec::new(),
        }
    }

    /// A JSON error: `{"error": message}`.
    pub fn error(status: u16, message: &str) -> Response {
        Response::json(status, &serde_json::json!({ "error": message }))
    }

    /// A plain-text response.
    pub fn text(status: u16, content_type: &'static str, body: String) -> Response {
        Response {
            status,
            content_type,
            body: body.into_bytes(),
            headers: Vec::new(),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// Handles one request; must not block for long (it holds one of [`HANDLERS`] threads).
pub type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// The running server.
pub struct Server {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds `listen` and serves `handler` until [`Server::stop`].
    pub fn start(listen: SocketAddr, name: &str, handler: Arc<Handler>) -> io::Result<Server> {
        let listener = TcpListener::bind(listen)?;
        let local = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::sync_channel::<TcpStream>(QUEUE_MAX);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(HANDLERS + 1);
        for i in 0..HANDLERS {
            let rx = Arc::clone(&rx);
            let handler = Arc::clone(&handler);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || handle_loop(&rx, &*handler))?,
            );
        }
        let stop2 = Arc::clone(&stop);
        threads.push(
            std::thread::Builder::new()
                .name(format!("{name}-accept"))
                .spawn(move || accept_loop(listener, tx, &stop2))?,
        );
        Ok(Server {
            local,
            stop,
            threads,
        })
    }

    /// The bound address (the port chosen when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops accepting, lets the handlers finish their connections, and joins every thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, tx: SyncSender<TcpStream>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, STOP_POLL_MS) };
        if n <= 0 {
            continue;
        }
        let Ok((conn, _)) = listener.accept() else {
            // EMFILE and friends: back off instead of spinning.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let _ = conn.set_read_timeout(Some(IO_TIMEOUT));
        let _ = conn.set_write_timeout(Some(IO_TIMEOUT));
        match tx.try_send(conn) {
            Ok(()) => {}
            Err(TrySendError::Full(mut conn)) => {
                let _ =
                    write_response(&mut conn, &Response::error(503, "admin server busy"), false);
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
    // Dropping `tx` ends the handlers once the queue is drained.
}

fn handle_loop(rx: &Mutex<Receiver<TcpStream>>, handler: &Handler) {
    loop {
        let conn = {
            let Ok(rx) = rx.lock() else { return };
            match rx.recv() {
                Ok(c) => c,
                Err(_) => return,
            }
        };
        serve_one(conn, handler);
    }
}

fn serve_one(mut conn: TcpStream, handler: &Handler) {
    let (resp, head_only) = match read_request(&mut conn) {
        Ok(req) => {
            let head = req.method == "HEAD";
            (handler(&req), head)
        }
        Err(ReadError::Io(_)) => return,
        Err(ReadError::Bad(status, msg)) => (Response::error(status, msg), false),
    };
    let _ = write_response(&mut conn, &resp, head_only);
    let _ = conn.shutdown(std::net::Shutdown::Write);
    // Lingering close: closing with unread input (a refused oversized request) would send a
    // RST that can destroy the response before the client reads it. Wait briefly for the
    // client's FIN, discarding a bounded amount of input.
    let _ = conn.set_read_timeout(Some(LINGER));
    let _ = io::copy(&mut (&mut conn).take(LINGER_BYTES), &mut io::sink());
}

enum ReadError {
    Io(#[allow(dead_code)] io::Error),
    Bad(u16, &'static str),
}

fn read_request(conn: &mut TcpStream) -> Result<Request, ReadError> {
    let mut r = BufReader::new(conn.take(HEAD_MAX as u64 + 1));
    let mut head_len = 0usize;
    let mut line = Vec::new();
    let mut read_line = |line: &mut Vec<u8>| -> Result<(), ReadError> {
        line.clear();
        let n = r.read_until(b'\n', line).map_err(ReadError::Io)?;
        head_len += n;
        if head_len > HEAD_MAX {
            return Err(ReadError::Bad(431, "request head too large"));
        }
        if n == 0 || line.last() != Some(&b'\n') {
            return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        Ok(())
    };
    read_line(&mut line)?;
    let request_line = String::from_utf8(line.clone())
        .map_err(|_| ReadError::Bad(400, "request line is not UTF-8"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Bad(400, "malformed request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(ReadError::Bad(505, "only HTTP/1.x is served"));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ReadError::Bad(400, "malformed method"));
    }
    let mut content_length = 0usize;
    loop {
        read_line(&mut line)?;
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(ReadError::Bad(400, "malformed header"));
        };
        let name = &line[..colon];
        if name.eq_ignore_ascii_case(b"content-length") {
            content_length = std::str::from_utf8(&line[colon + 1..])
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or(ReadError::Bad(400, "malformed Content-Length"))?;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return Err(ReadError::Bad(
                400,
                "chunked request bodies are not accepted",
            ));
        }
    }
    if content_length > BODY_MAX {
        return Err(ReadError::Bad(413, "request body too large"));
    }
    // The body carries nothing the admin API reads; consume it so the client sees a clean close.
    // Part of it may already sit in the reader's buffer.
    let buffered = r.buffer().len().min(content_length);
    r.consume(buffered);
    let mut body = r
        .into_inner()
        .into_inner()
        .take((content_length - buffered) as u64);
    io::copy(&mut body, &mut io::sink()).map_err(ReadError::Io)?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        query: query.to_owned(),
    })
}

fn write_response(conn: &mut TcpStream, resp: &Response, head_only: bool) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n",
        resp.status,
        reason(resp.status),
        resp.content_type,
        resp.body.len()
    );
    for (k, v) in &resp.headers {
        head.push_str(k);
        head.push_str(": ");
        head.push_str(v);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if !head_only {
        out.extend_from_slice(&resp.body);
    }
    conn.write_all(&out)?;
    conn.flush()
}
