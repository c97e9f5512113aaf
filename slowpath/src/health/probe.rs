//! One probe of one backend: a TCP connect, or an HTTP `GET` over TCP or TLS, all within the
//! check's `timeout`.
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
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::Check;

/// Longest an HTTP status line may be.
const STATUS_LINE_MAX: usize = 1024;

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
async fn http_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    addr: SocketAddr,
    check: &Check,
    scheme: &str,
    stage: &mut &'static str,
) -> Result<(), String> {
    *stage = "writing the request";
    // The path was checked (config::health::check_path): it cannot end the request line.
    let req = format!(
        "GET {} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: xvs-health\r\nConnection: close\r\n\r\n",
        check.http_path
    );
    conn.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("{scheme} write: {e}"))?;
    conn.flush()
        .await
        .map_err(|e| format!("{scheme} write: {e}"))?;
    *stage = "waiting for the status line";
    let mut buf = Vec::with_capacity(128);
    let mut chunk = [0u8; 256];
    while !buf.contains(&b'\n') && buf.len() < STATUS_LINE_MAX {
        match conn.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A server that closes without TLS's close_notify after its answer: what came
            // before is still its answer.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("{scheme} read: {e}")),
        }
    }
    status_verdict(&buf, check, scheme)
}

/// Judges the start of a response: healthy on a status `check` takes.
pub(super) fn status_verdict(head: &[u8], check: &Check, scheme: &str) -> Result<(), String> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Err(format!("{scheme}: no status line"));
    };
    if !version.starts_with("HTTP/") {
        return Err(format!(
            "{scheme}: not an HTTP status line: {:?}",
            line.trim_end()
        ));
    }
    match code.parse::<u16>() {
        Ok(c) if check.status_ok(c) => Ok(()),
        Ok(c) => Err(format!("{scheme}: status {c}")),
        Err(_) => Err(format!("{scheme}: bad status code {code:?}")),
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

    #[test]
    fn status_lines_are_judged_by_their_code() {
        let any = check(&[]);
        for ok in [
            &b"HTTP/1.0 200 OK\r\n"[..],
            b"HTTP/1.1 204 No Content\r\nServer: x\r\n",
            b"HTTP/1.0 302 Found\n",
            b"HTTP/1.0 399",
        ] {
            assert_eq!(
                status_verdict(ok, &any, "http"),
                Ok(()),
                "{:?}",
                String::from_utf8_lossy(ok)
            );
        }
        let err = |head: &[u8]| status_verdict(head, &any, "http").unwrap_err();
        assert_eq!(err(b"HTTP/1.0 500 Oops\r\n"), "http: status 500");
        assert_eq!(err(b"HTTP/1.0 199 Early\r\n"), "http: status 199");
        assert_eq!(err(b"HTTP/1.0 404 Not Found\r\n"), "http: status 404");
        assert_eq!(err(b""), "http: no status line");
        assert_eq!(err(b"HTTP/1.0\r\n"), "http: no status line");
        assert!(err(b"SSH-2.0 OpenSSH\r\n").contains("not an HTTP status line"));
        assert!(err(b"HTTP/1.0 abc\r\n").contains("bad status code"));
    }

    #[test]
    fn a_status_list_takes_exactly_its_statuses() {
        let only = check(&[200, 418]);
        assert_eq!(
            status_verdict(b"HTTP/1.1 418 Teapot\r\n", &only, "https"),
            Ok(())
        );
        assert_eq!(
            status_verdict(b"HTTP/1.1 200 OK\r\n", &only, "https"),
            Ok(())
        );
        assert_eq!(
            status_verdict(b"HTTP/1.1 204 No Content\r\n", &only, "https"),
            Err("https: status 204".to_owned()),
            "a 2xx outside the list fails"
        );
        let not_found_is_fine = check(&[404]);
        assert_eq!(
            status_verdict(b"HTTP/1.0 404 Not Found\r\n", &not_found_is_fine, "http"),
            Ok(())
        );
    }
}
