//! The state that outlives the process, under `[dataplane] state_dir` (a tmpfs: `/run/xvs`):
//!
//! | file | what |
//! |---|---|
//! | `flows` | the flow table (a shared mapping; see `flowtable`'s `FlowTable::open`) |
//! | `flows.previous` | a flow state of another geometry, kept until imported |
//! | `flows.export` | the live flows in the record format, written at a graceful stop |
//! | `affinity` | the ClientIP affinity table (a shared mapping) |
//! | `synproxy.key` | the SYN proxy's cookie secret (32 random bytes, mode 0600): a client answered by one process completes its handshake with the next |
//! | `xvs.sock` | the control socket (`[admin] socket` by default) |
//!
//! [`open`] adopts what an earlier process of this boot left (after the flow table's
//! recovery pass), imports what it can when the layout changed, and says what it did;
//! [`close`] marks the table clean and exports its flows at a graceful stop.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use config::Config;
use fastpath::pipeline::CookieKey;
use fastpath::settings::flow_table_config;
use fastpath::snapshot::AdoptedIds;
use flowtable::{FlowTable, Opened};
use lb_algos::{AffinityOpened, AffinityTable};

/// ClientIP affinity entries shared by all workers.
pub const AFFINITY_CAPACITY: usize = 1 << 16;

/// The files of a state directory.
pub struct Paths {
    /// The flow table.
    pub flows: PathBuf,
    /// Flows exported at a graceful stop.
    pub export: PathBuf,
    /// The affinity table.
    pub affinity: PathBuf,
    /// The SYN cookie secret.
    pub synproxy_key: PathBuf,
}

impl Paths {
    /// The files under `dir`.
    pub fn of(dir: &Path) -> Paths {
        Paths {
            flows: dir.join("flows"),
            export: dir.join("flows.export"),
            affinity: dir.join("affinity"),
            synproxy_key: dir.join("synproxy.key"),
        }
    }
}

/// The tables, opened.
pub struct Tables {
    /// The flow table.
    pub flows: FlowTable,
    /// The affinity table.
    pub affinity: AffinityTable,
    /// The ids the flow table's flows hold, when it holds any (adopted or imported).
    pub adopted: Option<AdoptedIds>,
    /// The SYN cookie secret (kept, or new).
    pub cookie_key: CookieKey,
}

/// Opens (adopting or importing) the flow and affinity tables of `cfg`'s state directory,
/// creating it (mode 0750: flows show clients) when missing. Logs what it found.
pub fn open(cfg: &Config, now: Instant) -> anyhow::Result<Tables> {
    let dir = &cfg.dataplane.state_dir;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .with_context(|| format!("creating [dataplane] state_dir {}", dir.display()))?;
    }
    let paths = Paths::of(dir);
    let (flows, opened) = FlowTable::open(&paths.flows, flow_table_config(cfg), now)
        .context("opening the flow table ([dataplane] state_dir)")?;
    match &opened {
        Opened::Adopted(r) => {
            tracing::info!(
                target: "xvs",
                flows = r.flows,
                torn_down = r.torn_down,
                index_words_reset = r.words_reset,
                previous_pid = r.previous_pid,
                clean_stop = r.clean,
                took_ms = r.took.as_secs_f64() * 1e3,
                "adopted the flow table of the previous process"
            );
            // The adopted table is newer than any export.
            let _ = std::fs::remove_file(&paths.export);
        }
        Opened::Created | Opened::Replaced { .. } => {
            if let Opened::Replaced { reason, .. } = &opened {
                tracing::warn!(target: "xvs", %reason, "the flow state could not be adopted; importing what can be");
            }
            import(&flows, &opened, &paths, now);
        }
    }
    let (affinity, aff) = AffinityTable::open(&paths.affinity, AFFINITY_CAPACITY, now)
        .context("opening the affinity table ([dataplane] state_dir)")?;
    match aff {
        AffinityOpened::Adopted { entries, cleared } => {
            tracing::info!(entries, cleared, "adopted the ClientIP affinity table");
        }
        AffinityOpened::Replaced { reason } => {
            tracing::warn!(%reason, "the ClientIP affinity table could not be adopted; starting empty");
        }
        AffinityOpened::Created => {}
    }
    let adopted = (!flows.is_empty()).then(|| AdoptedIds::from_flows(&flows));
    let cookie_key = cookie_key(&paths.synproxy_key)?;
    Ok(Tables {
        flows,
        affinity,
        adopted,
        cookie_key,
    })
}

/// The SYN cookie secret in `path`: the one an earlier process left, else a new random one
/// written there (aside, mode 0600, then renamed into place). A file of another size is
/// replaced.
pub fn cookie_key(path: &Path) -> anyhow::Result<CookieKey> {
    match std::fs::read(path) {
        Ok(b) => match <&[u8; 32]>::try_from(b.as_slice()) {
            Ok(b) => return Ok(CookieKey::from_bytes(b)),
            Err(_) => {
                tracing::warn!(path = %path.display(), bytes = b.len(), "the SYN cookie secret is damaged; making a new one (clients in the middle of a proxied handshake retry)")
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("reading the SYN cookie secret {}", path.display()));
        }
    }
    let key = CookieKey::random();
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&key.to_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().with_context(|| format!("writing the SYN cookie secret {}", path.display()))?;
    Ok(key)
}

/// Imports into a new table: the previous state of another geometry, else the export of a
/// graceful stop; says how many flows a crash across a layout change lost.
fn import(flows: &FlowTable, opened: &Opened, paths: &Paths, now: Instant) {
    if let Opened::Replaced {
        previous: Some(prev),
        ..
    } = opened
    {
        match flows.import_state(prev) {
            Ok(i) => {
                tracing::info!(target: "xvs", read = i.read, restored = i.restored, refused = i.refused, "imported the flows of the previous state");
                let _ = std::fs::remove_file(&paths.export);
                return;
            }
            Err(e) => tracing::warn!(error = %e, "importing the previous flow state failed"),
        }
    }
    if paths.export.exists() {
        match flows.import_records(&paths.export, now) {
            Ok(i) => {
                tracing::info!(target: "xvs", read = i.read, restored = i.restored, refused = i.refused, "imported the flows exported at the last stop")
            }
            Err(e) => tracing::warn!(error = %e, "importing the exported flows failed"),
        }
        let _ = std::fs::remove_file(&paths.export);
        return;
    }
    if let Opened::Replaced {
        flows: Some(lost), ..
    } = opened
        && *lost > 0
    {
        tracing::warn!(target: "xvs", flows = lost, "flows lost: the previous process died and its state has another layout");
    }
}

/// At a stop, after the workers stopped: marks the flow table clean and, for a graceful stop,
/// exports its flows for a process with another layout.
pub fn close(flows: &FlowTable, cfg: &Config, graceful: bool) {
    flows.mark_clean();
    if !graceful {
        return;
    }
    let path = Paths::of(&cfg.dataplane.state_dir).export;
    match flows.export(&path, Instant::now()) {
        Ok(n) => tracing::info!(flows = n, path = %path.display(), "flows exported"),
        Err(e) => tracing::warn!(error = %e, "exporting the flows failed"),
    }
}
