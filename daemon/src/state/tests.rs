//! The state directory as [`open`] finds it after a clumsy operator or an attacker: every
//! refusal costs only the file refused (set aside, counted), never the start and never an
//! intact flow table beside it.

use std::net::SocketAddr;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::time::Instant;

use flowtable::{BackendId, FlowData, FlowTable, Protocol, TcpFlags};

use super::*;

const CFG: &str = r#"
[dataplane]
snat_addresses = ["198.18.1.254"]
[flowtable]
capacity = 1024
[[services]]
name = "web"
vip = "198.18.100.1"
port = 80
protocol = "tcp"
backends = [{ addr = "198.18.1.1:8080" }, { addr = "198.18.1.2:8080" }]
"#;

fn config(dir: &Path) -> Config {
    let mut cfg = config::parse(CFG, "t.toml").unwrap();
    cfg.dataplane.state_dir = dir.join("state");
    cfg
}

/// A full-NAT flow of "web" from client port `port` (to backend `b`, id `b`).
fn flow(port: u16, b: u8) -> FlowData {
    let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
    FlowData {
        proto: Protocol::Tcp,
        client: SocketAddr::new([198, 18, 0, 9].into(), port),
        vip: sa("198.18.100.1:80"),
        backend: SocketAddr::new([198, 18, 1, b + 1].into(), 8080),
        snat: SocketAddr::new([198, 18, 1, 254].into(), port),
        service_id: 0,
        backend_id: BackendId(u32::from(b)),
        snapshot_gen: 1,
        flags: 1,
    }
}

/// A state directory holding `flows`, left by a clean stop.
fn left_with(cfg: &Config, flows: &[FlowData]) {
    let t = open(cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    for d in flows {
        t.flows
            .insert(d, TcpFlags::SYN, t.flows.tick(Instant::now()))
            .unwrap();
    }
    close(&t.flows, cfg, false);
}

fn count(t: &Tables, file: &str, kind: &str) -> u64 {
    t.refused
        .0
        .iter()
        .filter(|((f, k), _)| f == file && *k == kind)
        .map(|(_, n)| *n)
        .sum()
}

fn refused_names(cfg: &Config) -> Vec<String> {
    shm::refused_in(&cfg.dataplane.state_dir)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// These tests, one at a time: one of them spawns a process, and a child between its fork
/// and its exec holds every open file of this process, so another test's state file (and
/// its `flock`) could outlive its table for that moment and refuse a reopen as in use.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_state_dir_others_may_write_refuses_the_start() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    std::fs::create_dir(&cfg.dataplane.state_dir).unwrap();
    let mode = std::fs::Permissions::from_mode(0o777);
    std::fs::set_permissions(&cfg.dataplane.state_dir, mode).unwrap();
    let e = open(&cfg, Instant::now(), Handed::default(), &mut |_| {})
        .err()
        .expect("refused");
    assert!(
        format!("{e:#}").contains("writable by group or others (mode 0777)"),
        "{e:#}"
    );
    // A link to it owned by someone else is refused too.
    let link = dir.path().join("link");
    symlink(&cfg.dataplane.state_dir, &link).unwrap();
    let o = std::process::Command::new("chown")
        .args(["-h", "12345"])
        .arg(&link)
        .status()
        .unwrap();
    assert!(o.success());
    let mut via = cfg.clone();
    via.dataplane.state_dir = link;
    let e = open(&via, Instant::now(), Handed::default(), &mut |_| {})
        .err()
        .expect("refused");
    assert!(
        format!("{e:#}").contains("symbolic link owned by uid 12345"),
        "{e:#}"
    );
}

#[test]
fn a_bad_neighbour_costs_only_itself_never_the_flow_table() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    left_with(&cfg, &[flow(1000, 0), flow(1001, 1)]);
    let p = Paths::of(&cfg.dataplane.state_dir);
    std::fs::remove_file(&p.affinity).unwrap();
    std::fs::create_dir(&p.affinity).unwrap();
    std::fs::remove_file(&p.synproxy_key).unwrap();
    std::fs::create_dir(&p.synproxy_key).unwrap();
    let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    assert_eq!(t.flows.len(), 2, "the flows are adopted");
    assert_eq!(count(&t, "affinity", "file"), 1);
    assert_eq!(count(&t, "synproxy.key", "file"), 1);
    let names = refused_names(&cfg);
    assert!(
        names.iter().any(|n| n.starts_with("affinity.refused-")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("synproxy.key.refused-")),
        "{names:?}"
    );
    // New ones in their place, kept for the next start.
    assert!(p.affinity.is_file() && p.synproxy_key.is_file());
    let key = t.cookie_key.to_bytes();
    drop(t);
    let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    assert_eq!(t.cookie_key.to_bytes(), key);
    assert!(t.refused.0.is_empty(), "{:?}", t.refused);
}

#[test]
fn planted_temporaries_are_set_aside_and_their_targets_untouched() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"do not touch").unwrap();
    std::fs::create_dir(&cfg.dataplane.state_dir).unwrap();
    let p = Paths::of(&cfg.dataplane.state_dir);
    for tmp in p.temporaries() {
        symlink(&victim, &tmp).unwrap();
    }
    let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    for name in ["flows.new", "flows.tmp", "affinity.new", "synproxy.tmp"] {
        assert_eq!(count(&t, name, "file"), 1, "{name}");
    }
    t.flows
        .insert(&flow(1000, 0), TcpFlags::SYN, t.flows.tick(Instant::now()))
        .unwrap();
    // One planted again before the graceful stop's export.
    symlink(&victim, p.export.with_extension("tmp")).unwrap();
    close(&t.flows, &cfg, true);
    assert!(p.export.is_file(), "exported");
    assert_eq!(std::fs::read(&victim).unwrap(), b"do not touch");
}

#[test]
fn flows_the_config_cannot_own_are_dropped_and_counted() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut foreign_vip = flow(1002, 0);
    foreign_vip.vip = "198.18.100.2:80".parse().unwrap();
    let mut foreign_snat = flow(1003, 0);
    foreign_snat.snat = "198.18.1.253:1003".parse().unwrap();
    let mut huge_service = flow(1004, 1);
    huge_service.service_id = u32::MAX - 1;
    let mut other_backend = flow(1005, 1);
    other_backend.backend = "198.18.1.9:8080".parse().unwrap();
    other_backend.backend_id = BackendId(5);
    left_with(
        &cfg,
        &[
            flow(1000, 0),
            flow(1001, 1),
            foreign_vip,
            foreign_snat,
            huge_service,
            other_backend,
        ],
    );
    let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    assert_eq!(t.flows.len(), 2);
    assert_eq!(count(&t, "flows", "flow"), 4);
    let ids = t.adopted.unwrap();
    assert_eq!(ids.services.keys().copied().collect::<Vec<_>>(), vec![0]);
}

#[test]
fn a_bad_export_is_set_aside_and_the_start_goes_on() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    std::fs::create_dir(&cfg.dataplane.state_dir).unwrap();
    let p = Paths::of(&cfg.dataplane.state_dir);
    // An export whose header claims 2^61 records (it aborted the process).
    let t = FlowTable::new(fastpath::settings::flow_table_config(&cfg), Instant::now()).unwrap();
    t.insert(&flow(1000, 0), TcpFlags::SYN, t.tick(Instant::now()))
        .unwrap();
    t.export(&p.export, Instant::now()).unwrap();
    let mut b = std::fs::read(&p.export).unwrap();
    b[16..24].copy_from_slice(&(1u64 << 61).to_le_bytes());
    std::fs::write(&p.export, &b).unwrap();
    let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    assert_eq!(t.flows.len(), 0);
    assert_eq!(count(&t, "flows.export", "file"), 1);
    assert!(!p.export.exists());
    let names = refused_names(&cfg);
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("flows.export.refused-") && n.ends_with("-count")),
        "{names:?}"
    );
    drop(t);
    // And a good export with one foreign record: the rest imported.
    std::fs::remove_file(&p.flows).unwrap();
    let t = FlowTable::new(fastpath::settings::flow_table_config(&cfg), Instant::now()).unwrap();
    let mut foreign = flow(1001, 1);
    foreign.service_id = u32::MAX;
    for d in [flow(1000, 0), foreign] {
        t.insert(&d, TcpFlags::SYN, t.tick(Instant::now())).unwrap();
    }
    t.export(&p.export, Instant::now()).unwrap();
    let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    assert_eq!(t.flows.len(), 1);
    assert_eq!(count(&t, "flows.export", "flow"), 1);
    assert!(!p.export.exists(), "consumed");
}

#[test]
fn a_damaged_or_exposed_cookie_key_is_replaced() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    let key = t.cookie_key.to_bytes();
    drop(t);
    let p = Paths::of(&cfg.dataplane.state_dir);
    type Damage = fn(&Path);
    let cases: [(&str, Damage); 4] = [
        ("size", |k| std::fs::write(k, b"short").unwrap()),
        ("key", |k| std::fs::write(k, [0u8; 32]).unwrap()),
        ("mode", |k| {
            std::fs::set_permissions(k, std::fs::Permissions::from_mode(0o644)).unwrap()
        }),
        ("type", |k| {
            let victim = k.with_file_name("victim-key");
            std::fs::write(&victim, [7u8; 32]).unwrap();
            std::fs::remove_file(k).unwrap();
            symlink(&victim, k).unwrap();
        }),
    ];
    for (field, damage) in cases {
        damage(&p.synproxy_key);
        let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
        assert_eq!(count(&t, "synproxy.key", "file"), 1, "{field}");
        assert_ne!(t.cookie_key.to_bytes(), key, "{field}");
        assert_ne!(
            t.cookie_key.to_bytes(),
            [7u8; 32],
            "{field}: not read through a link"
        );
        let names = refused_names(&cfg);
        assert!(
            names.iter().any(
                |n| n.starts_with("synproxy.key.refused-") && n.ends_with(&format!("-{field}"))
            ),
            "{field}: {names:?}"
        );
    }
    let victim = p.synproxy_key.with_file_name("victim-key");
    assert_eq!(std::fs::read(victim).unwrap(), [7u8; 32]);
}

#[test]
fn cleanup_removes_refused_files_and_temporaries_never_a_links_target() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    left_with(&cfg, &[flow(1000, 0)]);
    let p = Paths::of(&cfg.dataplane.state_dir);
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"do not touch").unwrap();
    // A refused directory, a refused file, a planted and a stale temporary.
    std::fs::remove_file(&p.affinity).unwrap();
    std::fs::create_dir(&p.affinity).unwrap();
    std::fs::write(p.affinity.join("inside"), b"x").unwrap();
    drop(open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap());
    symlink(&victim, p.export.with_extension("tmp")).unwrap();
    std::fs::write(p.flows.with_extension("new"), b"stale").unwrap();
    assert_eq!(refused_names(&cfg).len(), 1);
    let cleaned = crate::hold::cleanup(&dir.path().join("pins"), &cfg.dataplane.state_dir).unwrap();
    let left: Vec<_> = std::fs::read_dir(&cfg.dataplane.state_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?} left after {:?}", cleaned.files);
    assert_eq!(std::fs::read(&victim).unwrap(), b"do not touch");
}

#[test]
fn a_directory_in_the_way_of_a_resize_is_set_aside_and_the_flows_imported() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    left_with(&cfg, &[flow(1000, 0), flow(1001, 1)]);
    let p = Paths::of(&cfg.dataplane.state_dir);
    std::fs::create_dir(flowtable::previous_path(&p.flows)).unwrap();
    cfg.flowtable.capacity = 2048;
    let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    assert_eq!((t.flows.capacity(), t.flows.len()), (2048, 2));
    assert_eq!(count(&t, "flows.previous", "file"), 1);
}

/// A flow table handed over by a running process: the ids its recovery pass collects are
/// those a walk of the adopted table reads (what the controller adopts), and the steps are
/// marked in order; a flow the config refuses is in neither.
#[test]
fn a_handed_table_gives_the_ids_of_its_flows_from_the_recovery_pass() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut foreign = flow(2000, 0);
    foreign.vip = "198.18.100.9:80".parse().unwrap();
    // Many flows over the two backends, repeated, and one the config cannot own.
    let flows: Vec<FlowData> = (0..40u16)
        .map(|i| flow(1000 + i, (i % 2) as u8))
        .chain([foreign])
        .collect();
    let t = open(&cfg, Instant::now(), Handed::default(), &mut |_| {}).unwrap();
    for d in &flows {
        t.flows
            .insert(d, TcpFlags::SYN, t.flows.tick(Instant::now()))
            .unwrap();
    }
    // The descriptor a takeover would receive (its flock is the open file description's).
    let fd: std::os::fd::OwnedFd = t.flows.state_file().unwrap().try_clone().unwrap().into();
    t.flows.mark_clean();
    drop(t);
    let path = Paths::of(&cfg.dataplane.state_dir).flows;
    let state = shm::StateFile::handed(fd, &path).unwrap();
    let handed = Handed {
        flows: Some(FlowTable::prepare_handed(state).unwrap()),
        affinity: None,
    };
    let mut marks = Vec::new();
    let t = open(&cfg, Instant::now(), handed, &mut |m| marks.push(m)).unwrap();
    assert_eq!(marks, ["dataplane", "recovery", "affinity", "ids"]);
    assert_eq!(t.flows.len(), 40, "the foreign flow is refused");
    let ids = t.adopted.clone().unwrap();
    assert_eq!(ids, AdoptedIds::from_flows(&t.flows));
    let web = &ids.services[&0];
    assert_eq!(web.backends.len(), 2);
    assert_eq!(web.frontends.len(), 1);
}

/// The recovery pass's check remembers what passed per backend id: a flow passes on that
/// only when the check would read the same of it. Each flow below differs from one that
/// passed just before, of the same backend id, in one thing the check reads; only the one
/// that differs in what it does not read (the client, the SNAT port) is taken, and every
/// flow taken is collected.
#[test]
fn the_remembered_checks_take_only_flows_the_check_would() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let check = StateCheck::from_config(&cfg);
    let c = Collecting::new(&check);
    let st = FlowState::Tcp(flowtable::TcpState::Established);
    let base = flow(1000, 0);
    let mut other_client = flow(1001, 0);
    other_client.snat.set_port(1999);
    let mut other_snat = flow(1002, 0);
    other_snat.snat = "198.18.1.253:1002".parse().unwrap();
    let mut other_vip = flow(1003, 0);
    other_vip.vip = "198.18.100.2:80".parse().unwrap();
    let mut other_backend = flow(1004, 0);
    other_backend.backend = "198.18.1.9:8080".parse().unwrap();
    let mut nat = flow(1005, 0);
    nat.flags = 0;
    let mut nat_own = flow(1006, 0);
    (nat_own.flags, nat_own.snat) = (0, nat_own.client);
    let mut nat_other = flow(1007, 0);
    nat_other.flags = 0;
    let mut other_service = flow(1008, 0);
    other_service.service_id = u32::MAX - 1;
    let mut other_flags = flow(1009, 0);
    other_flags.flags = 0x80;
    let cases = [
        (base, true),
        (other_client, true),
        (other_snat, false),
        (other_vip, false),
        (other_backend, false),
        (nat, false),
        (nat_own, true),
        (nat_other, false),
        (other_service, false),
        (other_flags, false),
    ];
    let mut taken = 0;
    for (i, (d, ok)) in cases.iter().enumerate() {
        // Each after a flow that passed with the same backend id.
        assert!(c.check(&base, st).is_ok());
        assert_eq!(c.check(d, st).is_ok(), *ok, "case {i}: {d:?}");
        assert_eq!(
            check.check(d, st).is_ok(),
            *ok,
            "case {i}: the check itself"
        );
        taken += 1 + usize::from(*ok);
    }
    assert_eq!(c.ids.borrow().flows(), taken);
}
