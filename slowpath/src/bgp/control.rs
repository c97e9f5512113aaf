//! BIRD's control socket, spoken directly (what `birdc` does), so xvs needs no BIRD binary.
//!
//! The protocol (BIRD 2's `doc/reply_codes`): BIRD greets with `0001 BIRD 2.0.12 ready.`;
//! each command is one line; a reply is lines of a four-digit code followed by `-` (more
//! lines follow) or a space (the last line), continuation lines start with a space, and `+`
//! lines are spontaneous printouts. Codes `0xxx` are success, `1xxx`/`2xxx` table rows and
//! headings, `8xxx` run-time errors, `9xxx` parse errors. `configure` answers (as seen from
//! BIRD 2.0.12):
//!
//! ```text
//! 0002-Reading configuration from /etc/bird/bird.conf
//! 0003 Reconfigured                        (done)
//! 0004 Reconfiguration in progress         (accepted; protocols are restarting)
//! 0005 Reconfiguration already in progress, queueing
//! 8002 /run/xvs/bird-xvs.conf:5:47 syntax error ...   (refused: the old config runs on)
//! ```
//!
//! A refused configuration leaves BIRD on its previous one.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Lines of one reply at most (a reply longer than this is cut and is an error).
pub const REPLY_LINES_MAX: usize = 10_000;
/// Bytes of one reply line at most.
const LINE_MAX: usize = 64 * 1024;

/// A control-socket failure.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket could not be reached (BIRD not running?).
    #[error("cannot connect to BIRD's control socket {path}: {source}")]
    Connect {
        /// The socket.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Reading or writing failed after connecting.
    #[error("BIRD's control socket: {0}")]
    Io(#[from] std::io::Error),
    /// BIRD did not answer in time.
    #[error("BIRD did not answer within {0:?}")]
    Timeout(Duration),
    /// BIRD said something that is not its protocol.
    #[error("unexpected answer from BIRD: {0:?}")]
    Protocol(String),
    /// BIRD answered with an error code (or a success that is not one for this command).
    #[error("BIRD refused ({code:04}): {message}")]
    Refused {
        /// The reply code.
        code: u16,
        /// Its text (for `configure`: the file, line and column of the problem).
        message: String,
    },
}

/// One line of a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// Its code (that of the last coded line, for a continuation).
    pub code: u16,
    /// Its text.
    pub text: String,
    /// The reply's last line.
    pub last: bool,
}

/// Parses one reply line; `prev` is the code of the line before (for continuations).
pub fn parse_line(line: &str, prev: Option<u16>) -> Result<Line, ControlError> {
    let line = line.trim_end_matches(['\n', '\r']);
    if let Some(text) = line.strip_prefix(' ').or_else(|| line.strip_prefix('+')) {
        return Ok(Line {
            code: prev.unwrap_or(0),
            text: text.to_owned(),
            last: false,
        });
    }
    let bytes = line.as_bytes();
    if bytes.len() >= 5 && bytes[..4].iter().all(u8::is_ascii_digit) {
        let code = line[..4].parse().map_err(|_| bad(line))?;
        let last = match bytes[4] {
            b' ' => true,
            b'-' => false,
            _ => return Err(bad(line)),
        };
        return Ok(Line {
            code,
            text: line[5..].to_owned(),
            last,
        });
    }
    // "0001" alone (no text) ends a reply too.
    if bytes.len() == 4 && bytes.iter().all(u8::is_ascii_digit) {
        return Ok(Line {
            code: line.parse().map_err(|_| bad(line))?,
            text: String::new(),
            last: true,
        });
    }
    Err(bad(line))
}

fn bad(line: &str) -> ControlError {
    ControlError::Protocol(line.chars().take(200).collect())
}

/// What `configure` answered, when BIRD took the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Configured {
    /// `3` reconfigured, `4` in progress, `5` queued...
    pub code: u16,
    /// Its text.
    pub text: String,
}

/// Whether a `configure` reply's final code means BIRD took the configuration.
pub fn configure_accepted(code: u16) -> bool {
    // 0003 reconfigured, 0004 in progress, 0005 queued, 0018 confirmed, 0019 nothing to do,
    // 0020 configuration OK. 0006 (ignored, shutting down) is not.
    matches!(code, 3 | 4 | 5 | 18 | 19 | 20)
}

/// The outcome of a `configure` reply.
pub fn configure_result(lines: &[Line]) -> Result<Configured, ControlError> {
    let Some(last) = lines.last().filter(|l| l.last) else {
        return Err(ControlError::Protocol("no final line".to_owned()));
    };
    if configure_accepted(last.code) {
        Ok(Configured {
            code: last.code,
            text: last.text.clone(),
        })
    } else {
        // An error's text is on its line and any continuations.
        let message = lines
            .iter()
            .filter(|l| l.code == last.code)
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        Err(ControlError::Refused {
            code: last.code,
            message,
        })
    }
}

/// Sends `command` to the BIRD at `socket` and returns its reply, all within `timeout`.
pub async fn command(
    socket: &Path,
    command: &str,
    timeout: Duration,
) -> Result<Vec<Line>, ControlError> {
    match tokio::time::timeout(timeout, exchange(socket, command)).await {
        Ok(r) => r,
        Err(_) => Err(ControlError::Timeout(timeout)),
    }
}

/// Asks the BIRD at `socket` to read its configuration again (`configure`).
pub async fn configure(socket: &Path, timeout: Duration) -> Result<Configured, ControlError> {
    configure_result(&command(socket, "configure", timeout).await?)
}

async fn exchange(socket: &Path, command: &str) -> Result<Vec<Line>, ControlError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| ControlError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let greeting = read_reply(&mut rd).await?;
    if greeting.last().is_none_or(|l| l.code != 1) {
        return Err(ControlError::Protocol(format!(
            "greeting {:?}",
            greeting.last().map(|l| l.text.as_str()).unwrap_or("")
        )));
    }
    wr.write_all(format!("{command}\n").as_bytes()).await?;
    read_reply(&mut rd).await
}

async fn read_reply<R: tokio::io::AsyncBufRead + Unpin>(
    rd: &mut R,
) -> Result<Vec<Line>, ControlError> {
    let mut lines = Vec::new();
    let mut buf = Vec::new();
    let mut prev = None;
    for _ in 0..REPLY_LINES_MAX {
        buf.clear();
        let n = (&mut *rd)
            .take(LINE_MAX as u64)
            .read_until(b'\n', &mut buf)
            .await?;
        if n == 0 {
            return Err(ControlError::Protocol(
                "connection closed in the middle of a reply".to_owned(),
            ));
        }
        let text = String::from_utf8_lossy(&buf);
        let line = parse_line(&text, prev)?;
        prev = Some(line.code);
        let last = line.last;
        lines.push(line);
        if last {
            return Ok(lines);
        }
    }
    Err(ControlError::Protocol(format!(
        "a reply of more than {REPLY_LINES_MAX} lines"
    )))
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::UnixListener;

    use super::*;

    fn lines(text: &str) -> Vec<Line> {
        let mut prev = None;
        text.lines()
            .map(|l| {
                let line = parse_line(l, prev).unwrap();
                prev = Some(line.code);
                line
            })
            .collect()
    }

    #[test]
    fn parses_bird_lines() {
        let l = parse_line("0001 BIRD 2.0.12 ready.\n", None).unwrap();
        assert_eq!(
            (l.code, l.text.as_str(), l.last),
            (1, "BIRD 2.0.12 ready.", true)
        );
        let l = parse_line("0002-Reading configuration from /x", None).unwrap();
        assert_eq!((l.code, l.last), (2, false));
        let l = parse_line(" Hostname is vm", Some(1011)).unwrap();
        assert_eq!(
            (l.code, l.text.as_str(), l.last),
            (1011, "Hostname is vm", false)
        );
        assert!(parse_line("hello", None).is_err());
        assert!(parse_line("00x1 no", None).is_err());
        assert!(parse_line("0001+x", None).is_err());
    }

    #[test]
    fn configure_replies() {
        for reply in [
            "0002-Reading configuration from /etc/bird/bird.conf\n0003 Reconfigured\n",
            "0002-Reading configuration from /etc/bird/bird.conf\n0004 Reconfiguration in progress\n",
            "0005 Reconfiguration already in progress, queueing\n",
        ] {
            assert!(configure_result(&lines(reply)).is_ok(), "{reply}");
        }
        let e = configure_result(&lines(
            "0002-Reading configuration from /tmp/n.conf\n8002 /tmp/xvs.conf:1:62 syntax error, unexpected '}'\n",
        ))
        .unwrap_err();
        match e {
            ControlError::Refused { code, message } => {
                assert_eq!(code, 8002);
                assert_eq!(message, "/tmp/xvs.conf:1:62 syntax error, unexpected '}'");
            }
            e => panic!("{e}"),
        }
        assert!(matches!(
            configure_result(&lines("0006 Reconfiguration ignored, shutting down\n")),
            Err(ControlError::Refused { code: 6, .. })
        ));
        assert!(matches!(
            configure_result(&lines("9001 Parse error\n")),
            Err(ControlError::Refused { code: 9001, .. })
        ));
        assert!(configure_result(&lines("0002-Reading\n")).is_err());
    }

    /// A fake BIRD: greets, reads one command, answers `reply`; returns the command.
    async fn fake_bird(listener: UnixListener, reply: &'static str) -> String {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(b"0001 BIRD 2.0.12 ready.\n").await.unwrap();
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        while !got.ends_with(b"\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        s.write_all(reply.as_bytes()).await.unwrap();
        String::from_utf8(got).unwrap()
    }

    #[tokio::test]
    async fn speaks_to_a_bird_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bird.ctl");
        let t = Duration::from_secs(5);
        let server = tokio::spawn(fake_bird(
            UnixListener::bind(&path).unwrap(),
            "0002-Reading configuration from /etc/bird/bird.conf\n0003 Reconfigured\n",
        ));
        let ok = configure(&path, t).await.unwrap();
        assert_eq!((ok.code, ok.text.as_str()), (3, "Reconfigured"));
        assert_eq!(server.await.unwrap(), "configure\n");
        std::fs::remove_file(&path).unwrap();

        let server = tokio::spawn(fake_bird(
            UnixListener::bind(&path).unwrap(),
            "0002-Reading configuration from /etc/bird/bird.conf\n8002 /run/xvs/bird-xvs.conf:3:1 syntax error\n",
        ));
        let e = configure(&path, t).await.unwrap_err();
        assert!(e.to_string().contains("bird-xvs.conf:3:1"), "{e}");
        server.await.unwrap();
        std::fs::remove_file(&path).unwrap();

        // Nobody listening: a clear connect error.
        let e = configure(&path, t).await.unwrap_err();
        assert!(matches!(e, ControlError::Connect { .. }), "{e}");
        // A BIRD that never answers: a timeout.
        let _silent = UnixListener::bind(&path).unwrap();
        let e = configure(&path, Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(e, ControlError::Timeout(_)), "{e}");
    }
}
