//! The daemon's logs: `tracing` events on stderr, filtered by `[log] level` (or `RUST_LOG`,
//! which replaces it), formatted as `[log] format` says:
//!
//! - `text`: `2026-11-23T10:00:00.123456Z  INFO xvs: ready services=3 workers=1`: UTC time,
//!   level, target, message, then the event's fields as `key=value`;
//! - `json`: one object per line, `{"timestamp":..,"level":"INFO","fields":{"message":..,
//!   ...},"target":..}`, for Loki or Elasticsearch.
//!
//! Operator-facing lifecycle events (ready, draining, reloaded, stopped) use the target `xvs`;
//! everything else the module path. Libraries that log through `log` (aya, xsk-rs) are
//! bridged by `tracing-log`; kube and hyper use `tracing` already. Nothing on the per-packet
//! path logs.
//!
//! One event is one line, whatever it carries: the text format escapes every control
//! character (`\n`, `\r`, `\t`, others as `\u{..}`) and the Unicode line and paragraph
//! separators in the message and in every field, however the field was recorded (`%`
//! Display, `?` Debug, a string). Names and annotations of Kubernetes objects, config
//! values and peers' data reach the log, and a raw newline in one would forge a whole log
//! line. String fields are quoted (`object="Service ns/web"`). The JSON format escapes them
//! as JSON does.

use std::fmt;
use std::io::IsTerminal;

use config::{Log, LogFormat};
use tracing::field::Field;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::{Writer, debug_fn};

/// The filter of `log`, or of `rust_log` when given (the `RUST_LOG` environment variable).
/// `Err` names what is wrong with `RUST_LOG` (the config's own filter was validated at load).
pub fn filter(log: &Log, rust_log: Option<&str>) -> Result<EnvFilter, String> {
    match rust_log.filter(|v| !v.trim().is_empty()) {
        Some(v) => EnvFilter::try_new(v).map_err(|e| format!("RUST_LOG={v:?}: {e}")),
        None => EnvFilter::try_new(&log.level).map_err(|e| format!("log.level: {e}")),
    }
}

/// A subscriber for `log` that writes to `writer`.
pub fn subscriber<W>(
    log: &Log,
    rust_log: Option<&str>,
    writer: W,
    ansi: bool,
) -> Result<Box<dyn tracing::Subscriber + Send + Sync>, String>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = filter(log, rust_log)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_target(true);
    Ok(match log.format {
        LogFormat::Text => Box::new(
            builder
                .with_ansi(ansi)
                .fmt_fields(debug_fn(escaped_field).delimited(" "))
                .finish(),
        ),
        LogFormat::Json => Box::new(
            builder
                .json()
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    })
}

/// One field of the text format, `name=value` (the message: its text alone), with the
/// characters that could end or forge a line escaped.
fn escaped_field(w: &mut Writer<'_>, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
    if field.name() != "message" {
        write!(w, "{}=", field.name())?;
    }
    fmt::write(&mut Escaped(w), format_args!("{value:?}"))
}

/// A writer that escapes control characters and line separators on their way through.
struct Escaped<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaped<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(at) = rest.find(needs_escape) {
            self.0.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                c => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

fn needs_escape(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// Installs the process's logger on stderr (once; later calls keep the first). Also routes
/// `log` records into it.
pub fn init(log: &Log) -> Result<(), String> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let sub = subscriber(
        log,
        rust_log.as_deref(),
        std::io::stderr,
        std::io::stderr().is_terminal(),
    )?;
    if tracing::subscriber::set_global_default(sub).is_ok() {
        // Only fails when another `log` logger is installed: then that one stays.
        let _ = tracing_log::LogTracer::init();
    }
    Ok(())
}

/// A log writer that keeps what it is given, for tests that read what was logged.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl<'w> MakeWriter<'w> for Captured {
    type Writer = Captured;
    fn make_writer(&'w self) -> Captured {
        self.clone()
    }
}

#[cfg(test)]
impl Captured {
    /// Everything logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emit(log: &Log, rust_log: Option<&str>) -> String {
        let buf = Captured::default();
        let sub = subscriber(log, rust_log, buf.clone(), false).unwrap();
        tracing::subscriber::with_default(sub, || {
            tracing::info!(target: "xvs", services = 3, interface = "xvs-c0", "ready");
            tracing::debug!(target: "xvs", "hidden at info");
            tracing::warn!(target: "kube_runtime::watcher", error = "refused", "watch failed");
        });
        buf.text()
    }

    #[test]
    fn json_lines_carry_level_target_and_fields() {
        let log = Log {
            level: "info".into(),
            format: LogFormat::Json,
        };
        let out = emit(&log, None);
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert_eq!(lines.len(), 2, "debug is filtered out: {out}");
        let ready = &lines[0];
        assert_eq!(ready["level"], "INFO");
        assert_eq!(ready["target"], "xvs");
        assert_eq!(ready["fields"]["message"], "ready");
        assert_eq!(ready["fields"]["services"], 3);
        assert_eq!(ready["fields"]["interface"], "xvs-c0");
        assert!(
            ready["timestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z')),
            "{ready}"
        );
        assert_eq!(lines[1]["level"], "WARN");
        assert_eq!(lines[1]["fields"]["error"], "refused");
    }

    /// Object names and annotation values with newlines (a fake or hostile API server's)
    /// make one line each in the text format, however they are logged: the Kubernetes
    /// source's problem lines (`Problem::log`), `%` Display and `?` Debug fields, the
    /// message itself.
    #[test]
    fn a_newline_from_an_object_never_reaches_the_log() {
        let forged =
            "web\n2026-01-01T00:00:00.000000Z  INFO xvs: ready services=0\r\u{2028}\u{1b}[2J";
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": forged,
                "annotations": {"xvs.io/scheduler": forged}},
            "spec": {"clusterIP": "198.18.100.1", "ports": [{"name": "http", "port": 80}]},
        }))
        .unwrap();
        let cfg = config::parse("[kubernetes]\n", "t.toml").unwrap();
        let node = slowpath::k8s::NodeInfo::default();
        let mut ok = svc.clone();
        ok.metadata.name = Some("ok".to_owned());
        let m = slowpath::k8s::build_model(&[svc, ok], &[], &node, &cfg);
        assert_eq!(m.problems.len(), 2, "{:?}", m.problems);
        let log = Log {
            level: "info".into(),
            format: LogFormat::Text,
        };
        let buf = Captured::default();
        let sub = subscriber(&log, None, buf.clone(), false).unwrap();
        tracing::subscriber::with_default(sub, || {
            for p in &m.problems {
                p.log();
            }
            tracing::warn!(object = %forged, error = ?forged, "refused {forged}");
        });
        let out = buf.text();
        assert_eq!(
            out.split('\n').count(),
            4,
            "three lines and the last newline: {out}"
        );
        assert!(out.ends_with('\n'));
        for bad in ['\r', '\u{2028}', '\u{1b}'] {
            assert!(!out.contains(bad), "{bad:?} in {out}");
        }
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.iter().all(|l| l.contains(" WARN ")), "{out}");
        // The name (escaped, in quotes) and the annotation value are there to read.
        let has = |s: &str| lines.iter().any(|l| l.contains(s));
        assert!(has(r#"object="Service ns/web\n2026"#), "{out}");
        assert!(has("unknown scheduler"), "{out}");
        assert!(lines[2].contains(r"refused web\n2026"), "{}", lines[2]);
        assert!(lines[2].contains(r"\u{1b}[2J"), "{}", lines[2]);
    }

    #[test]
    fn text_lines_and_filters() {
        let log = Log {
            level: "warn,xvs=debug".into(),
            format: LogFormat::Text,
        };
        let out = emit(&log, None);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(
            lines[0].contains("INFO xvs: ready services=3 interface=\"xvs-c0\""),
            "{out}"
        );
        assert!(lines[1].contains("DEBUG xvs: hidden at info"), "{out}");
        // RUST_LOG replaces the config's filter; a bad one is named.
        let out = emit(&log, Some("error"));
        assert!(out.is_empty(), "{out}");
        let e = filter(&log, Some("xvs=loud")).unwrap_err();
        assert!(e.contains("RUST_LOG"), "{e}");
    }
}
