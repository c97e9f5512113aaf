//! `xvs check --host [--config F]`: every check `xvs run` makes of the machine before it
//! touches anything ([`daemon::preflight::inspect`]), listed at once: one `problem:` line
//! per problem `run` would refuse, one `warning:` line per risk it would only log, each
//! naming its check and what to run. Exit codes: 0 when `run` would start (warnings
//! allowed), 1 when it would refuse, 2 for a bad config or bad arguments. Without a config,
//! the defaults are checked and an empty interface list is no problem.

use std::path::PathBuf;
use std::process::ExitCode;

use daemon::preflight::{self, Report};

pub fn main(path: Option<&PathBuf>) -> ExitCode {
    let (cfg, what) = match path {
        Some(p) => match crate::load_config(Some(p)) {
            Some(c) => (c, p.display().to_string()),
            None => return ExitCode::from(crate::EXIT_BAD_CONFIG),
        },
        None => (
            config::Config::default(),
            "no --config: the defaults, no interfaces".to_owned(),
        ),
    };
    let report = preflight::inspect(&cfg, path.is_some());
    print!("{}", render(&what, &report));
    if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The report as printed: a `problem:`/`warning:` line for each finding, then a verdict.
pub fn render(what: &str, r: &Report) -> String {
    let mut s = format!("host checks for {what}\n");
    for p in &r.problems {
        s.push_str(&format!("problem: {p}\n"));
    }
    for w in &r.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let counts = format!(
        "{}, {}",
        plural(r.problems.len(), "problem"),
        plural(r.warnings.len(), "warning")
    );
    if r.problems.is_empty() {
        s.push_str(&format!("host: OK ({counts}): `xvs run` would start\n"));
    } else {
        s.push_str(&format!(
            "host: {counts}: `xvs run` would refuse to start\n"
        ));
    }
    s
}
