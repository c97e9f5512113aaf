//! The new side's checks of the state files a running process hands over: each refusal is
//! one log line naming the file, the field and the value, counted, and only that file falls
//! back to the path (opened once the old process is gone); an accepted flow table is mapped
//! before the switch, adopted after it with its flows, its lock held throughout.

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::atomic::Ordering;
use std::time::Instant;

use flowtable::{AnyFlow, FlowTable, FlowTableConfig, Opened, TcpFlags};
use lb_algos::AffinityTable;
use shm::StateFile;

use super::{REFUSED, take_state};
use crate::state::Paths;

/// `f`'s log lines at warn and above.
fn logged<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    let buf = crate::logging::Captured::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(buf.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let out = tracing::subscriber::with_default(sub, f);
    (out, buf.text().lines().map(str::to_owned).collect())
}

fn config() -> FlowTableConfig {
    FlowTableConfig::new(1024, 16)
}

fn rw(path: &std::path::Path) -> OwnedFd {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
        .into()
}

fn flow(i: u32) -> flowtable::FlowData {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let a =
        |c: u8, d: u8, port: u16| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, c, d)), port);
    flowtable::FlowData {
        proto: flowtable::Protocol::Tcp,
        client: a(0, 1, 10_000 + i as u16),
        vip: a(100, 1, 80),
        backend: a(1, 1, 8080),
        snat: a(200, 1, 10_000 + i as u16),
        service_id: 1,
        backend_id: flowtable::BackendId(1),
        snapshot_gen: 1,
        flags: 0,
    }
}

// One test: `REFUSED` is the process's counter, and each case adds exactly one.
#[test]
fn handed_state_files_are_checked_refused_one_by_one_and_adopted_with_their_locks() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::of(dir.path());
    let now = Instant::now();
    // The running process's tables.
    let (old, _) = FlowTable::open(&paths.flows, config(), now, &AnyFlow).unwrap();
    for i in 0..100 {
        old.insert(&flow(i), TcpFlags::SYN, old.tick(now)).unwrap();
    }
    let (aff, _) = AffinityTable::open(&paths.affinity, 64, now).unwrap();
    let fd = |f: &std::fs::File| -> OwnedFd { f.try_clone().unwrap().into() };

    let other = dir.path().join("other");
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&other)
        .unwrap();
    let refusals: Vec<(&str, super::NamedFds, &str)> = vec![
        // Not the state file: another file of the directory (another inode).
        ("flows", vec![("flows".into(), rw(&other))], "inode"),
        // Not a file at all.
        (
            "flows",
            vec![("flows".into(), rw("/dev/null".as_ref()))],
            "type",
        ),
        // A name that is no state file.
        ("passwd", vec![("passwd".into(), rw(&other))], "name"),
        // The affinity table's file offered as the flow table: its header is no flow table's.
        (
            "flows",
            vec![("flows".into(), fd(aff.state_file().unwrap()))],
            "inode",
        ),
    ];
    for (name, files, field) in refusals {
        let before = REFUSED.load(Ordering::Relaxed);
        let (got, lines) = logged(|| take_state(dir.path(), "pid 1 uid 0", files));
        assert!(got.flows.is_none() && got.affinity.is_none(), "{name}");
        assert_eq!(REFUSED.load(Ordering::Relaxed) - before, 1, "{name}");
        assert_eq!(lines.len(), 1, "one line: {lines:?}");
        assert!(
            lines[0].contains("takeover refused")
                && lines[0].contains(name)
                && lines[0].contains(field),
            "{field}: {}",
            lines[0]
        );
    }

    // A file others can write: refused, though it is the very file.
    std::fs::set_permissions(&paths.flows, std::fs::Permissions::from_mode(0o666)).unwrap();
    let before = REFUSED.load(Ordering::Relaxed);
    let (got, lines) = logged(|| {
        take_state(
            dir.path(),
            "pid 1 uid 0",
            vec![("flows".into(), fd(old.state_file().unwrap()))],
        )
    });
    assert!(got.flows.is_none());
    assert_eq!(REFUSED.load(Ordering::Relaxed) - before, 1);
    assert!(
        lines.len() == 1 && lines[0].contains("mode 0666"),
        "{lines:?}"
    );
    std::fs::set_permissions(&paths.flows, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Both files, as a running xvs hands them over.
    let both = || {
        logged(|| {
            take_state(
                dir.path(),
                "pid 1 uid 0",
                vec![
                    ("flows".into(), fd(old.state_file().unwrap())),
                    ("affinity".into(), fd(aff.state_file().unwrap())),
                ],
            )
        })
    };

    // A wrong header (the magic): refused before the switch; the affinity file beside it
    // is taken regardless.
    let file = old.state_file().unwrap();
    let mut magic = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut magic, 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(file, &[0; 8], 0).unwrap();
    let before = REFUSED.load(Ordering::Relaxed);
    let (got, lines) = both();
    assert!(got.flows.is_none());
    assert!(got.affinity.is_some());
    assert_eq!(REFUSED.load(Ordering::Relaxed) - before, 1);
    assert!(lines.len() == 1 && lines[0].contains("magic"), "{lines:?}");
    drop(got);
    std::os::unix::fs::FileExt::write_all_at(file, &magic, 0).unwrap();

    // The real thing: both taken, no refusal; the old process goes; the lock stays.
    let before = REFUSED.load(Ordering::Relaxed);
    let (got, lines) = both();
    assert_eq!(REFUSED.load(Ordering::Relaxed), before);
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(got.names(), ["flows", "affinity"]);
    old.mark_clean();
    drop((old, aff));
    let e = StateFile::open_existing(&paths.flows).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    let (t, opened) =
        FlowTable::open_handed(got.flows.unwrap(), config(), Instant::now(), &AnyFlow).unwrap();
    assert!(
        matches!(opened, Opened::Adopted(ref r) if r.flows == 100),
        "{opened:?}"
    );
    assert!((0..100).all(|i| t.lookup(&flow(i).original_key()).is_some()));
    assert!(AffinityTable::open(&paths.affinity, 64, Instant::now()).is_err());
}

/// A new process that refused the flow table handed over declines an old process that
/// cannot export its flows at the switch (one from before `export`: the field absent from
/// its offer), rather than start without them; an old process that can, a table handed
/// over, or none offered go ahead.
#[test]
fn a_takeover_that_would_end_every_flow_is_declined() {
    use super::{Offer, Switch, loses_flows};
    let old: Offer = serde_json::from_str(r#"{"version":1,"sets":[],"state":["flows"]}"#).unwrap();
    assert!(!old.export, "an offer without the field cannot export");
    assert!(loses_flows(true, false, old.export));
    assert!(
        !loses_flows(true, false, true),
        "the old one exports instead"
    );
    assert!(!loses_flows(true, true, false), "the table was handed over");
    assert!(
        !loses_flows(false, false, false),
        "no table offered: none to lose"
    );
    // A switch from a new process that predates `export` asks for none.
    let sw: Switch = serde_json::from_str(r#"{"switch":true}"#).unwrap();
    assert!(sw.switch && !sw.export);
}
