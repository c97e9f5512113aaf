//! Tables in state files: adoption by the next "process" (a new `open` of the same file),
//! geometry changes (`import_state`), the export record format, and refusals. The crash case
//! (a SIGKILL in the middle of operations) is `persist_crash.rs`.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::{check, flow};
use flowtable::*;

fn config(capacity: usize) -> FlowTableConfig {
    FlowTableConfig::new(capacity, common::BACKENDS as usize)
}

/// Flows `range` in `t`; every fourth TCP flow established.
fn fill(t: &FlowTable, range: std::ops::Range<u32>, now: Instant) {
    for i in range {
        let d = flow(i);
        let h = t.insert(&d, TcpFlags::SYN, now).unwrap();
        if d.proto == Protocol::Tcp && i % 4 == 1 {
            t.on_packet(h, Direction::Reply, TcpFlags::SYN | TcpFlags::ACK, now);
            t.on_packet(h, Direction::Original, TcpFlags::ACK, now);
        }
    }
}

#[test]
fn the_next_open_adopts_every_flow_with_its_state_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let t0 = Instant::now();
    let (t, opened) = FlowTable::open(&path, config(4096), t0).unwrap();
    assert_eq!(opened, Opened::Created);
    assert!(t.is_persistent());
    fill(&t, 0..1000, t0 + Duration::from_secs(1));
    let before = check(&t);
    assert_eq!(before.len(), 1000);
    assert!(before.iter().any(|v| v.state.is_active()));
    let epoch = t.epoch();
    t.mark_clean();
    drop(t);

    let (t, opened) = FlowTable::open(&path, config(4096), Instant::now()).unwrap();
    let Opened::Adopted(r) = opened else {
        panic!("not adopted: {opened:?}")
    };
    assert_eq!((r.flows, r.torn_down, r.words_reset), (1000, 0, 0));
    assert!(r.clean);
    assert_eq!(r.previous_pid, std::process::id());
    // The same clock: the epoch is the first process's (to the nanosecond conversion).
    let drift = if t.epoch() > epoch {
        t.epoch() - epoch
    } else {
        epoch - t.epoch()
    };
    assert!(drift < Duration::from_millis(500), "{drift:?}");
    let after = check(&t);
    let key = |v: &FlowView| {
        (
            v.data,
            v.state,
            v.last_seen.duration_since(t.epoch()).as_millis(),
        )
    };
    let mut a: Vec<_> = before.iter().map(key).collect();
    let mut b: Vec<_> = after.iter().map(key).collect();
    a.sort_by_key(|x| format!("{x:?}"));
    b.sort_by_key(|x| format!("{x:?}"));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((x.0, x.1), (y.0, y.1));
        assert!(x.2.abs_diff(y.2) <= 1, "last seen moved: {x:?} {y:?}");
    }
    // The adopted table works: more flows, removals, expiry.
    fill(&t, 1000..1500, Instant::now());
    assert_eq!(check(&t).len(), 1500);
    let v = after[0];
    assert!(t.remove(v.handle).is_some());
    assert_eq!(check(&t).len(), 1499);
    let far = Instant::now() + Duration::from_secs(4000);
    t.sweep(far, t.capacity(), |_| {});
    assert_eq!(check(&t).len(), 0);
}

#[test]
fn the_file_is_locked_while_a_table_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let (_t, _) = FlowTable::open(&path, config(64), Instant::now()).unwrap();
    let e = FlowTable::open(&path, config(64), Instant::now())
        .err()
        .unwrap();
    assert!(e.to_string().contains("in use by another process"), "{e}");
}

#[test]
fn another_capacity_is_imported_from_the_previous_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let now = Instant::now();
    let (t, _) = FlowTable::open(&path, config(1024), now).unwrap();
    fill(&t, 0..500, now);
    let before = check(&t);
    drop(t); // a crash would leave the same file

    let (t, opened) = FlowTable::open(&path, config(4096), Instant::now()).unwrap();
    let Opened::Replaced {
        reason,
        previous: Some(prev),
        flows,
    } = opened
    else {
        panic!("{opened:?}")
    };
    assert!(reason.contains("capacity 1024"), "{reason}");
    assert_eq!(flows, Some(500));
    assert_eq!(t.capacity(), 4096);
    let imported = t.import_state(&prev).unwrap();
    assert_eq!(
        imported,
        Imported {
            read: 500,
            restored: 500,
            refused: 0
        }
    );
    assert!(
        !prev.exists(),
        "the previous state is removed once imported"
    );
    let after = check(&t);
    let mut a: Vec<_> = before
        .iter()
        .map(|v| format!("{:?} {:?}", v.data, v.state))
        .collect();
    let mut b: Vec<_> = after
        .iter()
        .map(|v| format!("{:?} {:?}", v.data, v.state))
        .collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    // And the new file is adopted next time at its new size.
    drop(t);
    let (t, opened) = FlowTable::open(&path, config(4096), Instant::now()).unwrap();
    assert!(
        matches!(opened, Opened::Adopted(r) if r.flows == 500),
        "{opened:?}"
    );
    assert_eq!(t.capacity(), 4096);
}

#[test]
fn a_damaged_state_starts_a_new_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let (t, _) = FlowTable::open(&path, config(64), Instant::now()).unwrap();
    fill(&t, 0..10, Instant::now());
    drop(t);
    // Scribble over the magic.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].copy_from_slice(b"garbage!");
    std::fs::write(&path, bytes).unwrap();
    let (t, opened) = FlowTable::open(&path, config(64), Instant::now()).unwrap();
    assert_eq!(
        opened,
        Opened::Replaced {
            reason: "not an xvs flow state (bad magic)".into(),
            previous: None,
            flows: None,
        }
    );
    assert_eq!(check(&t).len(), 0);
    // A truncated file too.
    drop(t);
    std::fs::write(&path, b"short").unwrap();
    let (_, opened) = FlowTable::open(&path, config(64), Instant::now()).unwrap();
    assert!(
        matches!(opened, Opened::Replaced { previous: None, .. }),
        "{opened:?}"
    );
}

#[test]
fn exported_records_import_into_another_layout() {
    let dir = tempfile::tempdir().unwrap();
    let now = Instant::now();
    let a = FlowTable::new(config(2048), now).unwrap();
    fill(&a, 0..800, now);
    // Some flows idle for a while before the export.
    let later = now + Duration::from_secs(30);
    let idle_before = check(&a);
    let out = dir.path().join("flows.export");
    assert_eq!(a.export(&out, later).unwrap(), 800);

    // (A table's times start at its epoch: the importer's is not after the flows' times.)
    let b = FlowTable::new(config(1024), now).unwrap();
    let imported = b.import_records(&out, later).unwrap();
    assert_eq!(
        imported,
        Imported {
            read: 800,
            restored: 800,
            refused: 0
        }
    );
    let after = check(&b);
    let idle = |v: &FlowView| later.saturating_duration_since(v.last_seen);
    for v in &after {
        let old = idle_before
            .iter()
            .find(|w| w.data == v.data)
            .expect("every flow came back");
        assert_eq!(old.state, v.state);
        // Idle time continues (30 s), to the record's millisecond plus the time since.
        let d = idle(v).as_millis().abs_diff(idle(old).as_millis());
        assert!(d < 500, "idle {:?} vs {:?}", idle(v), idle(old));
    }
    // A table too small refuses the rest, counted.
    let c = FlowTable::new(config(100), now).unwrap();
    let imported = c.import_records(&out, later).unwrap();
    assert_eq!(imported.read, 800);
    assert_eq!(imported.restored + imported.refused, 800);
    assert!(
        imported.refused > 0 && imported.restored > 0,
        "{imported:?}"
    );
    // Garbage is named.
    std::fs::write(&out, [0u8; 64]).unwrap();
    let e = c.import_records(&out, later).unwrap_err();
    assert!(e.to_string().contains("bad magic"), "{e}");
}

#[test]
fn restore_refuses_a_state_of_another_protocol() {
    let t = FlowTable::new(config(64), Instant::now()).unwrap();
    let udp = flow(0); // UDP
    assert_eq!(
        t.restore(&udp, FlowState::Tcp(TcpState::Established), Instant::now()),
        Err(InsertError::Invalid("state of another protocol"))
    );
    let h = t.restore(&udp, FlowState::Udp, Instant::now()).unwrap();
    assert_eq!(
        t.restore(&udp, FlowState::Udp, Instant::now()),
        Err(InsertError::Exists(h))
    );
}
