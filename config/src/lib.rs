//! The xvs configuration: one TOML file, typed with serde, with defaults, and validated as a
//! whole before anything runs.
//!
//! Contract: [`load`] and [`parse`] either return a [`Config`] that passed every check in
//! `validate`, or an [`Error`] whose problems each name the key (`services[1].backends[0].addr`)
//! and the line and column in the file. Unknown keys are errors, so a misspelt key never
//! silently falls back to a default. The library reads no environment and touches no network:
//! checks that need the machine (interfaces exist, root) belong to `xvs run`.
// Product functions stay within clippy.toml's 70 lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod address;
mod cores;
mod decap;
mod dsr;
pub mod health;
mod reload;
mod schema;
mod span;
mod types;
mod validate;
mod warn;
mod wording;

use std::fmt;
use std::path::{Path, PathBuf};

pub use address::special_address;
pub use cores::{CoreError, CorePlan, Cores, cpu_list};
pub use decap::{
    DECAP_INTERFACES_MAX, DECAP_PORTS_MAX, DECAP_VIPS_MAX, DEFAULT_DECAP_PIN_ROOT, DecapArgs,
    DecapConfig, PortTranslation, VipEntry, decap_from_args, parse_decap,
};
pub use dsr::{DSR_MTU_MAX, DSR_MTU_MIN};
pub use reload::{Written, load_written, parse_written};
pub use schema::*;
pub use span::KeyPath;
pub use types::{Dur, Mac, PortRange};
pub use validate::{
    BACKENDS_MAX, BFD_INTERVAL_MAX, BFD_INTERVAL_MIN, BFD_MULTIPLIER_MAX, BGP_BACKUP_PREPEND_MAX,
    FLOW_BYTES, FLOWS_MAX, IDLE_BACKOFF_MAX, MH_TABLE_SIZE_MAX, UMEM_FRAMES_MAX, WRR_SEQUENCE_MAX,
};
pub use vocab::{Cidr, Encap, Mode, Protocol, SchedulerKind, XdpMode, ZeroCopy};

/// Most Service CIDRs xvs takes, `[kubernetes] service_cidrs` and the ServiceCIDR objects'
/// together (the steering program's LPM trie holds this many; a cluster has one or two per
/// family).
pub const SERVICE_CIDRS_MAX: usize = 64;

/// The configuration `xvs run` uses when no file is given: the netns lab of the README demo (docs/operations.md, "The demo lab").
pub const LAB_TOML: &str = include_str!("../examples/lab.toml");

/// One thing wrong with a configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Dotted path of the offending key, e.g. `services[0].vip`; empty for a syntax error
    /// that is not inside a key; `(file)` for the file as a whole (an empty file).
    pub key: String,
    /// 1-based line in the file.
    pub line: usize,
    /// 1-based column in the file (in characters).
    pub column: usize,
    /// What is wrong, as a sentence.
    pub message: String,
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, does not fit the schema, or fails validation.
    #[error("{}", Invalid { file, problems })]
    Invalid {
        /// The file name, or `<config>` for a string.
        file: String,
        /// Every problem found (at least one).
        problems: Vec<Problem>,
    },
}

impl Error {
    /// The problems, for callers that show them one by one (empty for a read error).
    pub fn problems(&self) -> &[Problem] {
        match self {
            Error::Read { .. } => &[],
            Error::Invalid { problems, .. } => problems,
        }
    }
}

struct Invalid<'a> {
    file: &'a str,
    problems: &'a [Problem],
}

impl fmt::Display for Invalid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            let key = if p.key.is_empty() { "(syntax)" } else { &p.key };
            write!(
                f,
                "{}:{}:{}: {}: {}",
                self.file, p.line, p.column, key, p.message
            )?;
        }
        Ok(())
    }
}

/// Reads and validates a configuration file.
pub fn load(path: &Path) -> Result<Config, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates configuration text; `file` names it in error messages.
pub fn parse(text: &str, file: &str) -> Result<Config, Error> {
    let invalid = |problems| Error::Invalid {
        file: file.to_owned(),
        problems,
    };
    let doc = toml::de::DeTable::parse(text).map_err(|e| invalid(vec![span::syntax(text, &e)]))?;
    let de = toml::de::Deserializer::from(doc.clone());
    let config: Config = serde_path_to_error::deserialize(de)
        .map_err(|e| invalid(vec![span::schema(text, &doc, &e)]))?;
    let problems: Vec<Problem> = validate::validate(&config)
        .into_iter()
        .map(|(key, message)| span::locate(text, &doc, &key, message))
        .collect();
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(invalid(problems))
    }
}

/// A problem found outside this crate (`xvs check` also runs the snapshot builder) at `key` of
/// `text`, located as validation's are: at the key, or its nearest ancestor in the file.
pub fn problem_at(text: &str, key: &KeyPath, message: String) -> Problem {
    match toml::de::DeTable::parse(text) {
        Ok(doc) => span::locate(text, &doc, key, message),
        Err(_) => Problem {
            key: key.to_string(),
            line: 1,
            column: 1,
            message,
        },
    }
}

/// The warnings of `c`, a valid config read from `text`: settings that are valid but
/// dangerous (see `warn`'s module doc), located as validation's problems are. `xvs check`
/// prints them (`--strict` refuses them); `xvs run` logs them.
pub fn warnings(text: &str, c: &Config) -> Vec<Problem> {
    let found = warn::warnings(c);
    if found.is_empty() {
        return Vec::new();
    }
    match toml::de::DeTable::parse(text) {
        Ok(doc) => found
            .into_iter()
            .map(|(key, message)| span::locate(text, &doc, &key, message))
            .collect(),
        Err(_) => found
            .into_iter()
            .map(|(key, message)| problem_at(text, &key, message))
            .collect(),
    }
}

impl Config {
    /// Whether services come from Kubernetes rather than `[[services]]`.
    pub fn uses_kubernetes(&self) -> bool {
        self.kubernetes.is_some()
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bfd;
#[cfg(test)]
mod tests_dsr;
#[cfg(test)]
mod tests_health;
#[cfg(test)]
mod tests_reject;
