//! One probe of one backend: a TCP connect, or an HTTP `GET` over TCP or TLS, all within the
//! check's `timeout`.
//!
//! HTTP is hyper's client connection (the stack of the admin server), one request per
//! connection: `GET http_path HTTP/1.0` with `Host`, `User-Agent: xvs-health` and
//! `Connection: close`, judged on the response's status code alone once its head has
//! arrived; the body is never read. The head is bounded ([`HEAD_MAX`]): a backend that
//! sends an endless status line or endless headers fails the probe instead of filling
//! memory, and the check's `timeout` covers connect, handshake, request and response head.
//!
//! HTTPS is keepalived's `SSL_GET`: the TLS handshake completes (the server proves it holds
//! the key of the certificate it presents, TLS 1.2 or 1.3 through rustls), but the
//! certificate itself is not verified, neither its chain nor its names: a health check asks
//! whether a backend answers, and backends behind a load balancer commonly present
//! certificates for the service's name, self-signed or from an internal CA the node does not
//! have. The request carries no secret and its answer decides only the backend's health.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use config::ProbeKind;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::header::{CONNECTION, HOST, HeaderValue, USER_AGENT};
use hyper::{Request, Version};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::Check;

/// Most bytes of a response head (status line and headers) read. Only the status counts,
/// but hyper parses the whole head: room for the long headers (policies, cookies) that
/// backends send, and still a bound (64 probes at once hold at most 4 MiB).
pub const HEAD_MAX: usize = 64 * 1024;
/// Most headers in a response head (hyper's default is 100).
const HEADERS_MAX: usize = 1024;
// hyper refuses a read buffer under 8 KiB.
const _: () = assert!(HEAD_MAX >= 8192);

/// Probes `backend` as `check` says; `Err` says why it failed.
pub async fn probe(backend: SocketAddr, check: &Check) -> Result<(), String> {
    let addr = check.probe_addr(backend);
    match check.probe {
        ProbeKind::None => Ok(()),
        ProbeKind::Tcp => probe_tcp(addr, check.timeout).await,
        ProbeKind::Http | ProbeKind::Https => probe_http(addr, check).await,
    }
}

/// A TCP connect within `timeout`.
pub async fn probe_tcp(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(_conn)) => Ok(()),
        Ok(Err(e)) => Err(format!("tcp connect: {e}")),
        Err(_) => Err("tcp connect: timed out".to_owned()),
    }
}

/// `GET http_path HTTP/1.0` to `addr` (over TLS for `https`) within the check's `timeout`
/// (connect, handshake, write and read together); healthy on a status the check takes.
pub async fn probe_http(addr: SocketAddr, check: &Check) -> Result<(), String> {
    let scheme = check.probe.name();
    let mut stage = "connecting";
    let exchange = async {
        let conn = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("{scheme} connect: {e}"))?;
        if check.probe == ProbeKind::Https {
            stage = "in the TLS handshake";
            let tls = TlsConnector::from(tls_config())
                .connect(ServerName::IpAddress(addr.ip().into()), conn)
                .await
                .map_err(|e| format!("https handshake: {e}"))?;
            http_exchange(tls, addr, check, scheme, &mut stage).await
        } else {
            http_exchange(conn, addr, check, scheme, &mut stage).await
        }
    };
    let result = tokio::time::timeout(check.timeout, exchange).await;
    result.unwrap_or_else(|_| Err(format!("{scheme}: timed out {stage}")))
}

/// One HTTP exchange on `conn`, without a deadline; `stage` says how far it got.
async fn http_exchange<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    conn: S,
    addr: SocketAddr,
    check: &Check,
    scheme: &str,
    stage: &mut &'static str,
) -> Result<(), String> {
    *stage = "writing the request";
    let mut builder = http1::Builder::new();
    // Only the status counts: headers a strict parser would refuse do not fail a probe.
    builder
        .max_buf_size(HEAD_MAX)
        .max_headers(HEADERS_MAX)
        .ignore_invalid_headers_in_responses(true)
        .allow_obsolete_multiline_headers_in_responses(true)
        .title_case_headers(true);
    let (mut sender, connection) = builder
        .handshake::<_, Empty<Bytes>>(TokioIo::new(conn))
        .await
        .map_err(|e| format!("{scheme} write: {e}"))?;
    let request = request(addr, check).map_err(|e| format!("{scheme}: {e}"))?;
    *stage = "waiting for the status line";
    let send = sender.send_request(request);
    tokio::pin!(connection, send);
    // The connection does the I/O and hands the response head, or why there is none, to
    // `send`; it may finish first (`Connection: close`), so `send` is then still asked.
    let response = tokio::select! {
        biased;
        r = send.as_mut() => r,
        r = connection.as_mut() => match r {
            Err(e) => return Err(answer_error(&e, scheme)),
            Ok(()) => send.await,
        },
    };
    match response {
        Ok(resp) => status_verdict(resp.status().as_u16(), check, scheme),
        Err(e) => Err(answer_error(&e, scheme)),
    }
}

/// `GET http_path HTTP/1.0` to `addr`.
fn request(addr: SocketAddr, check: &Check) -> Result<Request<Empty<Bytes>>, hyper::http::Error> {
    // The path was checked (config::health::check_path): it is a valid origin-form target.
    Request::get(check.http_path.as_str())
        .version(Version::HTTP_10)
        .header(HOST, addr.to_string())
        .header(USER_AGENT, HeaderValue::from_static("xvs-health"))
        .header(CONNECTION, HeaderValue::from_static("close"))
        .body(Empty::new())
}

/// Why no usable response head arrived.
fn answer_error(e: &hyper::Error, scheme: &str) -> String {
    if e.is_parse_too_large() {
        format!("{scheme}: response head longer than {HEAD_MAX} bytes")
    } else if e.is_parse() {
        format!("{scheme}: not an HTTP response: {e}")
    } else if e.is_incomplete_message() {
        format!("{scheme}: no status line")
    } else {
        format!("{scheme} read: {e}")
    }
}

/// Judges a response's status: healthy on a status `check` takes.
pub(super) fn status_verdict(code: u16, check: &Check, scheme: &str) -> Result<(), String> {
    if check.status_ok(code) {
        Ok(())
    } else {
        Err(format!("{scheme}: status {code}"))
    }
}

/// The client config of every HTTPS probe, made once: ring's algorithms, TLS 1.2 and 1.3,
/// no certificate verification (see the module doc), no client certificate.
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(AnyCertificate {
            algorithms: provider.signature_verification_algorithms,
        });
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|b| {
                b.dangerous()
                    .with_custom_certificate_verifier(verifier)
                    .with_no_client_auth()
            });
        // ring's provider supports the default versions; a failure here is a build error.
        Arc::new(config.unwrap_or_else(|e| panic!("rustls with ring: {e}")))
    }))
}

/// Takes any certificate (keepalived's `SSL_GET` does not verify), but still checks the
/// handshake's signatures, so the peer holds the key of what it presented.
#[derive(Debug)]
struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(statuses: &[u16]) -> Check {
        Check {
            probe: ProbeKind::Http,
            port: None,
            http_path: "/".to_owned(),
            http_status: statuses.to_vec(),
            rise: 1,
            fall: 1,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        }
    }

    /// Serves one connection on a fresh port with `answer` (then closes); returns the
    /// probe's verdict for `check`.
    async fn probe_against(answer: &'static [u8], check: &Check) -> Result<(), String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut c, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 512];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = c.write_all(answer).await;
        });
        let verdict = probe_http(addr, check).await;
        server.abort();
        verdict
    }

    /// 300 headers: more than hyper takes by default.
    const HEADERS_300: &[u8] = &{
        const LINE: &[u8] = b"X-A: b\r\n";
        const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\n";
        let mut out = [0u8; 17 + 300 * 8 + 2];
        let mut i = 0;
        while i < HEAD.len() {
            out[i] = HEAD[i];
            i += 1;
        }
        let mut n = 0;
        while n < 300 {
            let mut j = 0;
            while j < LINE.len() {
                out[HEAD.len() + n * LINE.len() + j] = LINE[j];
                j += 1;
            }
            n += 1;
        }
        out[out.len() - 2] = b'\r';
        out[out.len() - 1] = b'\n';
        out
    };

    #[tokio::test]
    async fn status_lines_are_judged_by_their_code() {
        let any = check(&[]);
        for ok in [
            &b"HTTP/1.0 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 204 No Content\r\nServer: x\r\n\r\n",
            b"HTTP/1.0 302 Found\n\n",
            b"HTTP/1.0 399 \r\n\r\nbody",
            b"HTTP/1.1 200 OK\r\nno colon here\r\nBad Name: x\r\n\r\n",
            HEADERS_300,
        ] {
            assert_eq!(
                probe_against(ok, &any).await,
                Ok(()),
                "{:?}",
                String::from_utf8_lossy(ok)
            );
        }
        let any = &any;
        let err = |head: &'static [u8]| async move { probe_against(head, any).await.unwrap_err() };
        assert_eq!(err(b"HTTP/1.0 500 Oops\r\n\r\n").await, "http: status 500");
        // 1xx is interim: the final answer never comes before the server closes.
        assert_eq!(
            err(b"HTTP/1.0 199 Early\r\n\r\n").await,
            "http: no status line"
        );
        assert_eq!(
            err(b"HTTP/1.0 404 Not Found\r\n\r\n").await,
            "http: status 404"
        );
        assert_eq!(err(b"").await, "http: no status line");
        assert_eq!(err(b"HTTP/1.0 200 OK\r\n").await, "http: no status line");
        let e = err(b"SSH-2.0 OpenSSH\r\n\r\n").await;
        assert!(e.starts_with("http: not an HTTP response"), "{e}");
        let e = err(b"HTTP/1.0 abc\r\n\r\n").await;
        assert!(e.starts_with("http: not an HTTP response"), "{e}");
    }

    #[test]
    fn a_status_list_takes_exactly_its_statuses() {
        let only = check(&[200, 418]);
        assert_eq!(status_verdict(418, &only, "https"), Ok(()));
        assert_eq!(status_verdict(200, &only, "https"), Ok(()));
        assert_eq!(
            status_verdict(204, &only, "https"),
            Err("https: status 204".to_owned()),
            "a 2xx outside the list fails"
        );
        let not_found_is_fine = check(&[404]);
        assert_eq!(status_verdict(404, &not_found_is_fine, "http"), Ok(()));
    }

    #[tokio::test]
    async fn an_endless_status_line_fails_within_the_head_bound() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut c, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 512];
            let _ = c.read(&mut buf).await;
            let _ = c.write_all(b"HTTP/1.1 200 ").await;
            // Bounded: far more than the head limit, far less than the test's patience.
            let chunk = [b'x'; 4096];
            for _ in 0..1024 {
                if c.write_all(&chunk).await.is_err() {
                    return true;
                }
            }
            false
        });
        let mut long = check(&[]);
        long.timeout = Duration::from_secs(30);
        let e = probe_http(addr, &long).await.unwrap_err();
        assert_eq!(
            e,
            format!("http: response head longer than {HEAD_MAX} bytes")
        );
        assert!(
            server.await.unwrap(),
            "the probe hung up on the endless line"
        );
    }
}
