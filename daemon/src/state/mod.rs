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
//! | `*.refused-<time>-<field>` | a state file that was refused, set aside (the newest few of each name) |
//!
//! [`open`] adopts what an earlier process of this boot left (after the flow table's
//! recovery pass), imports what it can when the layout changed, and says what it did;
//! [`close`] marks the table clean and exports its flows at a graceful stop.
//!
//! Everything here is untrusted input (see `shm`'s file module and `flowtable`'s persist
//! module): a state directory others could write to refuses the start; the flow table keeps
//! only the flows the running config can own ([`StateCheck`]); a file that fails (a
//! symbolic link, a directory, a file of someone else, a damaged header, a bad export) is
//! set aside with one log line naming the file, the field and the value, and xvs goes on
//! without it; a bad neighbour (`affinity`, `synproxy.key`) never costs the flow table.
//! What was refused is counted ([`Refusals`], the `xvs_state_refused_total` metric).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use config::Config;
use fastpath::pipeline::CookieKey;
use fastpath::settings::flow_table_config;
use fastpath::snapshot::{AdoptedIds, IdsCollector, StateCheck};
use flowtable::{
    Error as TableError, FlowCheck, FlowData, FlowState, FlowTable, Imported, Opened, Recovery,
    Refusal,
};
use lb_algos::{AffinityOpened, AffinityTable};
use shm::SetAside;

mod key;
#[cfg(test)]
mod tests;

pub use key::cookie_key;

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

    /// The temporaries made beside the state files (each `O_EXCL|O_NOFOLLOW`).
    pub fn temporaries(&self) -> [PathBuf; 4] {
        [
            self.flows.with_extension("new"),
            self.export.with_extension("tmp"),
            self.affinity.with_extension("new"),
            self.synproxy_key.with_extension("tmp"),
        ]
    }
}

/// What was refused while opening the state: counts by file name and kind (`file`: the
/// file set aside; `flow`: flows or records dropped; `index`: the index rebuilt).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refusals(pub BTreeMap<(String, &'static str), u64>);

impl Refusals {
    /// As the admin API shows them.
    pub fn view(&self) -> slowpath::admin::StateView {
        slowpath::admin::StateView {
            refused: self
                .0
                .iter()
                .map(|((file, kind), n)| slowpath::admin::StateRefusal {
                    file: file.clone(),
                    kind: (*kind).to_owned(),
                    count: *n,
                })
                .collect(),
        }
    }

    fn add(&mut self, file: &Path, kind: &'static str, n: u64) {
        if n == 0 {
            return;
        }
        let name = file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        *self.0.entry((name, kind)).or_default() += n;
    }
}

/// State files a running process handed over (`xvs run --takeover`, see
/// [`crate::takeover`]), checked and locked: [`open`] adopts them instead of opening their
/// paths (which would wait for the old process's locks).
#[derive(Debug, Default)]
pub struct Handed {
    /// The flow table's file, mapped and faulted in before the switch.
    pub flows: Option<flowtable::Handed>,
    /// The affinity table's file.
    pub affinity: Option<shm::StateFile>,
}

impl Handed {
    /// The names of the files handed over, for the log.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.flows.is_some() {
            v.push("flows");
        }
        if self.affinity.is_some() {
            v.push("affinity");
        }
        v
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
    /// What was refused.
    pub refused: Refusals,
}

/// Logs one refused state file and counts it: the file, the field, the value, where it was
/// set aside, and what xvs does instead.
fn refused_file(
    refused: &mut Refusals,
    file: &Path,
    r: &Refusal,
    aside: Option<&SetAside>,
    instead: &str,
) {
    refused.add(file, "file", 1);
    tracing::warn!(
        target: "xvs",
        file = %file.display(),
        field = r.field,
        value = ?r.value,
        set_aside = %aside.map_or_else(|| "-".to_owned(), |a| a.to.display().to_string()),
        "state file refused; {instead}"
    );
    for p in aside.iter().flat_map(|a| &a.pruned) {
        tracing::info!(target: "xvs", file = %p.display(), kept = shm::REFUSED_KEEP, "older refused state file removed");
    }
}

/// Sets `path` aside for `r` and logs it (a failed rename is logged too: the file stays).
fn set_aside(refused: &mut Refusals, path: &Path, r: &Refusal, instead: &str) {
    match shm::set_aside(path, r) {
        Ok(a) => refused_file(refused, path, r, Some(&a), instead),
        Err(e) => {
            refused_file(refused, path, r, None, instead);
            tracing::warn!(target: "xvs", file = %path.display(), error = %e, "could not set the refused state file aside");
        }
    }
}

/// Opens (adopting or importing) the flow and affinity tables of `cfg`'s state directory,
/// creating it (mode 0750: flows show clients) when missing; `handed`'s files are adopted
/// as their paths would be. Refuses a state directory others could write to; logs what it
/// found. `mark` is called as each step ends: `dataplane` (what came before), `recovery`
/// (the flow table), `affinity`, `ids` (the adopted ids and the cookie secret).
pub fn open(
    cfg: &Config,
    now: Instant,
    handed: Handed,
    mark: &mut dyn FnMut(&'static str),
) -> anyhow::Result<Tables> {
    mark("dataplane");
    let dir = &cfg.dataplane.state_dir;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .with_context(|| format!("creating [dataplane] state_dir {}", dir.display()))?;
    }
    shm::check_dir(dir).map_err(|e| anyhow::anyhow!("[dataplane] state_dir: {e}"))?;
    let paths = Paths::of(dir);
    let mut refused = Refusals::default();
    clear_temporaries(&paths, &mut refused);
    let check = StateCheck::from_config(cfg);
    let collecting = Collecting::new(&check);
    let (flows, opened) = match handed.flows {
        Some(h) => FlowTable::open_handed(h, flow_table_config(cfg), now, &collecting)
            .context("opening the flow table handed over ([dataplane] state_dir)")?,
        None => open_flows(cfg, &paths, now, &check)?,
    };
    let collected = collecting.ids.into_inner();
    match &opened {
        Opened::Adopted(r) => {
            adopted(r, &paths.flows, &mut refused);
            // The adopted table is newer than any export.
            let _ = std::fs::remove_file(&paths.export);
        }
        Opened::Created | Opened::Replaced { .. } => {
            if let Opened::Replaced {
                refusal,
                set_aside: aside,
                ..
            } = &opened
            {
                match aside {
                    Some(a) => refused_file(
                        &mut refused,
                        &paths.flows,
                        refusal,
                        Some(a),
                        "starting with a new flow table",
                    ),
                    None => {
                        tracing::warn!(target: "xvs", file = %paths.flows.display(), field = refusal.field, value = ?refusal.value, "the flow state has another geometry; importing its flows")
                    }
                }
            }
            import(&flows, &opened, &paths, now, &check, &mut refused);
        }
    }
    mark("recovery");
    let affinity = open_affinity(&paths.affinity, handed.affinity, now, &mut refused);
    mark("affinity");
    let adopted = adopted_ids(&flows, &opened, collected);
    let cookie_key = cookie_key(&paths.synproxy_key, &mut refused);
    mark("ids");
    Ok(Tables {
        flows,
        affinity,
        adopted,
        cookie_key,
        refused,
    })
}

/// The ids `flows`'s flows hold, if any. Those its recovery pass `collected` (of every flow
/// the check took, in table order) are these when it kept all of them (it freed none after
/// the check: no second claim of an IPv6 extension, backend address or tuple); else the
/// table is read again.
fn adopted_ids(flows: &FlowTable, opened: &Opened, collected: IdsCollector) -> Option<AdoptedIds> {
    if flows.is_empty() {
        return None;
    }
    Some(match opened {
        Opened::Adopted(r) if r.flows == collected.flows() => collected.finish(),
        _ => AdoptedIds::from_flows(flows),
    })
}

/// The config's check of adopted flows, collecting the ids of those it takes, in table
/// order (the recovery pass's walk): [`AdoptedIds::from_flows`] without a second walk of
/// the table in a takeover's pause.
struct Collecting<'a> {
    check: &'a StateCheck,
    ids: std::cell::RefCell<IdsCollector>,
    /// By backend id modulo [`PASSED`]: what the config's check read of the last flow it
    /// took there. [`StateCheck`] is a function of what it reads and the config, so a flow
    /// that reads the same passes again without its hash lookups (the many flows of one
    /// backend differ only in what it does not read).
    passed: std::cell::RefCell<Vec<Option<Checked>>>,
}

/// Slots of [`Collecting::passed`].
const PASSED: usize = 256;

/// What [`StateCheck`] reads of a flow: all of it but the client and the SNAT port, and of
/// those only whether the SNAT address is the client's.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Checked {
    flags: u8,
    service_id: u32,
    backend_id: u32,
    proto: flowtable::Protocol,
    vip: std::net::SocketAddr,
    backend: std::net::SocketAddr,
    snat: std::net::IpAddr,
    snat_is_client: bool,
}

impl Checked {
    fn of(d: &FlowData) -> Checked {
        Checked {
            flags: d.flags,
            service_id: d.service_id,
            backend_id: d.backend_id.0,
            proto: d.proto,
            vip: d.vip,
            backend: d.backend,
            snat: d.snat.ip(),
            snat_is_client: d.snat == d.client,
        }
    }
}

impl<'a> Collecting<'a> {
    fn new(check: &'a StateCheck) -> Collecting<'a> {
        Collecting {
            check,
            ids: Default::default(),
            passed: std::cell::RefCell::new(vec![None; PASSED]),
        }
    }
}

impl FlowCheck for Collecting<'_> {
    fn check(&self, d: &FlowData, state: FlowState) -> Result<(), Refusal> {
        let seen = Checked::of(d);
        let mut passed = self.passed.borrow_mut();
        let slot = &mut passed[d.backend_id.0 as usize % PASSED];
        if *slot != Some(seen) {
            self.check.check(d, state)?;
            *slot = Some(seen);
        }
        self.ids.borrow_mut().add(d);
        Ok(())
    }
}

/// Removes stale temporaries of ours; sets aside anything else found at their paths (a
/// planted link is never written through).
fn clear_temporaries(paths: &Paths, refused: &mut Refusals) {
    for tmp in paths.temporaries() {
        match shm::stale_temp(&tmp) {
            Ok(None) => {}
            Ok(Some(r)) => set_aside(refused, &tmp, &r, "not used"),
            Err(e) => {
                tracing::warn!(target: "xvs", file = %tmp.display(), error = %e, "could not check a state temporary")
            }
        }
    }
    // Files that are renamed onto (a graceful stop's export, a resized table kept for
    // import): anything there that is no file of ours (a directory would fail the rename)
    // is set aside first.
    for f in [flowtable::previous_path(&paths.flows), paths.export.clone()] {
        if let Ok(m) = std::fs::symlink_metadata(&f)
            && let Some(r) = shm::untrusted_at(&f, &m)
        {
            set_aside(refused, &f, &r, "not used");
        }
    }
}

/// The flow table; with no room for it, the refused flow states are removed (logged) and
/// it is tried once more.
fn open_flows(
    cfg: &Config,
    paths: &Paths,
    now: Instant,
    check: &StateCheck,
) -> anyhow::Result<(FlowTable, Opened)> {
    let open = || FlowTable::open(&paths.flows, flow_table_config(cfg), now, check);
    let first = match open() {
        Err(e @ TableError::NoSpace { .. }) => e,
        r => return r.context("opening the flow table ([dataplane] state_dir)"),
    };
    let dir = paths.flows.parent().unwrap_or(Path::new("."));
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut freed = 0;
    for p in shm::refused_in(dir) {
        if name(&p).is_some_and(|n| n.starts_with("flows.refused-")) && shm::remove_any(&p).is_ok()
        {
            freed += 1;
            tracing::warn!(target: "xvs", file = %p.display(), "refused flow state removed: the new flow table needs its room");
        }
    }
    if freed == 0 {
        return Err(first).context("opening the flow table ([dataplane] state_dir)");
    }
    open().context("opening the flow table ([dataplane] state_dir)")
}

/// Logs an adoption and what its recovery pass refused.
fn adopted(r: &Recovery, file: &Path, refused: &mut Refusals) {
    tracing::info!(
        target: "xvs",
        flows = r.flows,
        torn_down = r.torn_down,
        refused = r.refused,
        index_words_reset = r.words_reset,
        previous_pid = r.previous_pid,
        clean_stop = r.clean,
        took_ms = r.took.as_secs_f64() * 1e3,
        "adopted the flow table of the previous process"
    );
    if let Some(first) = &r.refusal {
        refused.add(file, "flow", r.refused as u64);
        tracing::warn!(target: "xvs", file = %file.display(), field = first.field, value = ?first.value, refused = r.refused, "adopted flows refused (the first's field and value)");
    }
    if let Some(fault) = &r.index {
        refused.add(file, "index", 1);
        tracing::warn!(target: "xvs", file = %file.display(), field = fault.field, value = ?fault.value, "the flow table's index disagreed with its flows; rebuilt");
    }
}

/// Logs an import and what it refused.
fn imported(i: &Imported, file: &Path, what: &str, refused: &mut Refusals) {
    tracing::info!(target: "xvs", file = %file.display(), read = i.read, restored = i.restored, refused = i.refused, invalid = i.invalid, "imported the flows of {what}");
    if let Some(first) = &i.refusal {
        refused.add(file, "flow", i.invalid as u64);
        tracing::warn!(target: "xvs", file = %file.display(), field = first.field, value = ?first.value, invalid = i.invalid, "imported flows refused (the first's field and value)");
    }
}

/// An import that failed: a refused file is set aside; an I/O error is logged, and the
/// file set aside too (it is not read again at every start).
fn import_failed(e: TableError, file: &Path, refused: &mut Refusals) {
    let r = match e {
        TableError::Refused { refusal, .. } => refusal,
        e => Refusal::new("read", e),
    };
    set_aside(refused, file, &r, "its flows are not imported");
}

/// Imports into a new table: the previous state of another geometry, else the export of a
/// graceful stop; says how many flows a crash across a layout change lost.
fn import(
    flows: &FlowTable,
    opened: &Opened,
    paths: &Paths,
    now: Instant,
    check: &StateCheck,
    refused: &mut Refusals,
) {
    if let Opened::Replaced {
        previous: Some(prev),
        ..
    } = opened
    {
        match flows.import_state(prev, check) {
            Ok(i) => {
                imported(&i, prev, "the previous state", refused);
                let _ = std::fs::remove_file(&paths.export);
                return;
            }
            Err(e) => import_failed(e, prev, refused),
        }
    }
    if paths.export.symlink_metadata().is_ok() {
        match flows.import_records(&paths.export, now, check) {
            Ok(i) => {
                imported(&i, &paths.export, "the last stop's export", refused);
                let _ = std::fs::remove_file(&paths.export);
            }
            Err(e) => import_failed(e, &paths.export, refused),
        }
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

/// The affinity table; when its file cannot be used it is set aside (by the table) and a new
/// one made; when no file can be made, a table of this process only.
fn open_affinity(
    path: &Path,
    handed: Option<shm::StateFile>,
    now: Instant,
    refused: &mut Refusals,
) -> AffinityTable {
    let opened = match handed {
        Some(state) => AffinityTable::open_handed(state, AFFINITY_CAPACITY, now),
        None => AffinityTable::open(path, AFFINITY_CAPACITY, now),
    };
    match opened {
        Ok((t, AffinityOpened::Adopted { entries, cleared })) => {
            tracing::info!(entries, cleared, "adopted the ClientIP affinity table");
            if cleared > 0 {
                refused.add(path, "flow", cleared as u64);
            }
            t
        }
        Ok((t, AffinityOpened::Replaced { refusal, set_aside })) => {
            let instead = "starting with a new ClientIP affinity table";
            refused_file(refused, path, &refusal, Some(&set_aside), instead);
            t
        }
        Ok((t, AffinityOpened::Created)) => t,
        Err(e) => {
            tracing::warn!(target: "xvs", file = %path.display(), error = %e, "the ClientIP affinity table cannot be kept in the state directory; this process keeps its own (clients may change backends at the next restart)");
            AffinityTable::new(AFFINITY_CAPACITY, now)
        }
    }
}

/// At a stop, after the workers stopped: marks the flow table clean and, for a graceful stop,
/// exports its flows for a process with another layout.
pub fn close(flows: &FlowTable, cfg: &Config, graceful: bool) {
    flows.mark_clean();
    if graceful {
        export(flows, cfg);
    }
}

/// Exports the flows (the workers stopped) to `flows.export`, for a process with another
/// layout: at a graceful stop, and at a takeover whose new process asked for it.
pub fn export(flows: &FlowTable, cfg: &Config) {
    let paths = Paths::of(&cfg.dataplane.state_dir);
    clear_temporaries(&paths, &mut Refusals::default());
    match flows.export(&paths.export, Instant::now()) {
        Ok(n) => tracing::info!(flows = n, path = %paths.export.display(), "flows exported"),
        Err(e) => tracing::warn!(error = %e, "exporting the flows failed"),
    }
}
