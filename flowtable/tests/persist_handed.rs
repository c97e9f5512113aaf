//! A state file handed over by a running process (`xvs run --takeover`): prepared (checked,
//! mapped, faulted in) while its owner still writes it, adopted after the switch with the
//! full recovery pass, its lock held by the new owner throughout.
#![cfg(not(loom))]

mod common;

use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use common::{check, flow};
use flowtable::*;
use shm::{Existing, StateFile};

fn config(capacity: usize) -> FlowTableConfig {
    FlowTableConfig::new(capacity, common::BACKENDS as usize)
}

fn fill(t: &FlowTable, range: std::ops::Range<u32>, now: Instant) {
    for i in range {
        t.insert(&flow(i), TcpFlags::SYN, t.tick(now)).unwrap();
    }
}

/// What the old process sends: a duplicate of its locked state file's descriptor.
fn handed(t: &FlowTable, path: &std::path::Path) -> StateFile {
    let fd: OwnedFd = t.state_file().unwrap().try_clone().unwrap().into();
    StateFile::handed(fd, path).unwrap()
}

#[test]
fn a_handed_state_is_adopted_with_every_flow_and_its_lock_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let now = Instant::now();
    let (old, _) = FlowTable::open(&path, config(4096), now, &AnyFlow).unwrap();
    fill(&old, 0..600, now);
    // Before the switch: the old table still takes flows after the new side mapped it.
    let prepared = FlowTable::prepare_handed(handed(&old, &path)).unwrap();
    fill(&old, 600..1000, now + Duration::from_millis(5));
    let before = check(&old);
    assert_eq!(before.len(), 1000);
    // The switch: the old one stops, marks the table clean and exits.
    old.mark_clean();
    drop(old);
    // Nobody else can open the file meanwhile: the lock went with the descriptor.
    let e = StateFile::open_existing(&path).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");

    let (t, opened) =
        FlowTable::open_handed(prepared, config(4096), Instant::now(), &AnyFlow).unwrap();
    let Opened::Adopted(r) = opened else {
        panic!("not adopted: {opened:?}")
    };
    assert_eq!((r.flows, r.torn_down, r.refused), (1000, 0, 0));
    assert!(r.clean);
    let mut a: Vec<_> = before.iter().map(|v| format!("{:?}", v.data)).collect();
    let mut b: Vec<_> = check(&t).iter().map(|v| format!("{:?}", v.data)).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    // Every flow is found through the adopted index.
    for i in 0..1000 {
        assert!(t.lookup(&flow(i).original_key()).is_some(), "flow {i}");
    }
    let e = StateFile::open_existing(&path).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    drop(t);
    assert!(matches!(
        StateFile::open_existing(&path).unwrap(),
        Existing::Open(_)
    ));
}

#[test]
fn the_recovery_pass_runs_though_the_handed_state_is_marked_clean() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let now = Instant::now();
    let (old, _) = FlowTable::open(&path, config(4096), now, &AnyFlow).unwrap();
    fill(&old, 0..100, now);
    let prepared = FlowTable::prepare_handed(handed(&old, &path)).unwrap();
    old.mark_clean();
    drop(old);
    // The config the new process runs refuses some of the flows: the pass checks each one,
    // whatever the clean mark says.
    struct Even;
    impl FlowCheck for Even {
        fn check(&self, d: &FlowData, _: FlowState) -> Result<(), Refusal> {
            match d.backend_id.0 % 2 {
                0 => Ok(()),
                n => Err(Refusal::new("backend_id", n)),
            }
        }
    }
    let (t, opened) =
        FlowTable::open_handed(prepared, config(4096), Instant::now(), &Even).unwrap();
    let Opened::Adopted(r) = opened else {
        panic!("not adopted: {opened:?}")
    };
    assert!(r.refused > 0, "{r:?}");
    assert_eq!(r.flows + r.refused, 100);
    assert_eq!(t.len(), r.flows);
}

#[test]
fn a_handed_state_with_a_wrong_header_is_refused_before_the_switch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let now = Instant::now();
    let (old, _) = FlowTable::open(&path, config(4096), now, &AnyFlow).unwrap();
    fill(&old, 0..10, now);
    let file = old.state_file().unwrap().try_clone().unwrap();
    let magic = {
        let mut b = [0u8; 8];
        file.read_exact_at(&mut b, 0).unwrap();
        b
    };
    file.write_all_at(&[0xff; 8], 0).unwrap();
    let r = FlowTable::prepare_handed(handed(&old, &path)).unwrap_err();
    assert_eq!(r.field, "magic", "{r}");
    file.write_all_at(&magic, 0).unwrap();
    assert!(FlowTable::prepare_handed(handed(&old, &path)).is_ok());
    // A file cut short (its size no longer what its geometry makes).
    let len = file.metadata().unwrap().len();
    file.set_len(len - 4096).unwrap();
    let r = FlowTable::prepare_handed(handed(&old, &path)).unwrap_err();
    assert_eq!(r.field, "size", "{r}");
}
