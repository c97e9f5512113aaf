//! Tables in state files: adoption by the next "process" (a new `open` of the same file),
//! geometry changes (`import_state`), the export record format, and refusals. The crash case
//! (a SIGKILL in the middle of operations) is `persist_crash.rs`.
#![cfg(not(loom))]

mod common;

use std::path::{Path, PathBuf};
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
        let h = t.insert(&d, TcpFlags::SYN, t.tick(now)).unwrap();
        if d.proto == Protocol::Tcp && i % 4 == 1 {
            t.on_packet(
                h,
                Direction::Reply,
                TcpFlags::SYN | TcpFlags::ACK,
                t.tick(now),
            );
            t.on_packet(h, Direction::Original, TcpFlags::ACK, t.tick(now));
        }
    }
}

#[test]
fn the_next_open_adopts_every_flow_with_its_state_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let t0 = Instant::now();
    let (t, opened) = FlowTable::open(&path, config(4096), t0, &AnyFlow).unwrap();
    assert_eq!(opened, Opened::Created);
    assert!(t.is_persistent());
    fill(&t, 0..1000, t0 + Duration::from_secs(1));
    let before = check(&t);
    assert_eq!(before.len(), 1000);
    assert!(before.iter().any(|v| v.state.is_active()));
    let epoch = t.epoch();
    t.mark_clean();
    drop(t);

    let (t, opened) = FlowTable::open(&path, config(4096), Instant::now(), &AnyFlow).unwrap();
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
    t.sweep(t.tick(far), t.capacity(), |_| {});
    assert_eq!(check(&t).len(), 0);
}

#[test]
fn the_file_is_locked_while_a_table_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let (_t, _) = FlowTable::open(&path, config(64), Instant::now(), &AnyFlow).unwrap();
    let e = FlowTable::open(&path, config(64), Instant::now(), &AnyFlow)
        .err()
        .unwrap();
    assert!(e.to_string().contains("in use by another process"), "{e}");
}

#[test]
fn another_capacity_is_imported_from_the_previous_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let now = Instant::now();
    let (t, _) = FlowTable::open(&path, config(1024), now, &AnyFlow).unwrap();
    fill(&t, 0..500, now);
    let before = check(&t);
    drop(t); // a crash would leave the same file

    let (t, opened) = FlowTable::open(&path, config(4096), Instant::now(), &AnyFlow).unwrap();
    let Opened::Replaced {
        refusal,
        previous: Some(prev),
        set_aside: None,
        flows,
    } = opened
    else {
        panic!("{opened:?}")
    };
    assert_eq!(refusal.field, "capacity");
    assert!(refusal.value.starts_with("1024 "), "{refusal}");
    assert_eq!(flows, Some(500));
    assert_eq!(t.capacity(), 4096);
    let imported = t.import_state(&prev, &AnyFlow).unwrap();
    assert_eq!(
        imported,
        Imported {
            read: 500,
            restored: 500,
            ..Imported::default()
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
    let (t, opened) = FlowTable::open(&path, config(4096), Instant::now(), &AnyFlow).unwrap();
    assert!(
        matches!(&opened, Opened::Adopted(r) if r.flows == 500),
        "{opened:?}"
    );
    assert_eq!(t.capacity(), 4096);
}

#[test]
fn a_damaged_state_starts_a_new_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let (t, _) = FlowTable::open(&path, config(64), Instant::now(), &AnyFlow).unwrap();
    fill(&t, 0..10, Instant::now());
    drop(t);
    // Scribble over the magic.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].copy_from_slice(b"garbage!");
    std::fs::write(&path, bytes).unwrap();
    let (t, opened) = FlowTable::open(&path, config(64), Instant::now(), &AnyFlow).unwrap();
    let Opened::Replaced {
        refusal,
        previous: None,
        set_aside: Some(aside),
        flows: None,
    } = opened
    else {
        panic!("{opened:?}")
    };
    assert_eq!(refusal.field, "magic");
    assert!(refusal.value.contains("not an xvs flow state"), "{refusal}");
    // Set aside, not removed: the scribbled file is there under its new name.
    assert_eq!(&std::fs::read(&aside.to).unwrap()[..8], b"garbage!");
    assert_eq!(check(&t).len(), 0);
    // A truncated file too.
    drop(t);
    std::fs::write(&path, b"short").unwrap();
    let (_, opened) = FlowTable::open(&path, config(64), Instant::now(), &AnyFlow).unwrap();
    assert!(
        matches!(&opened, Opened::Replaced { previous: None, refusal, .. } if refusal.field == "size"),
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
    let imported = b.import_records(&out, later, &AnyFlow).unwrap();
    assert_eq!(
        imported,
        Imported {
            read: 800,
            restored: 800,
            ..Imported::default()
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
    let imported = c.import_records(&out, later, &AnyFlow).unwrap();
    assert_eq!(imported.read, 800);
    assert_eq!(imported.restored + imported.refused, 800);
    assert!(
        imported.refused > 0 && imported.restored > 0,
        "{imported:?}"
    );
    // Garbage is named.
    std::fs::write(&out, [0u8; 64]).unwrap();
    let e = c.import_records(&out, later, &AnyFlow).unwrap_err();
    assert!(e.to_string().contains("magic"), "{e}");
}

#[test]
fn restore_refuses_a_state_of_another_protocol() {
    let t = FlowTable::new(config(64), Instant::now()).unwrap();
    let udp = flow(0); // UDP
    assert_eq!(
        t.restore(
            &udp,
            FlowState::Tcp(TcpState::Established),
            t.tick(Instant::now()),
            0
        ),
        Err(InsertError::Invalid("state of another protocol"))
    );
    let h = t
        .restore(&udp, FlowState::Udp, t.tick(Instant::now()), 0)
        .unwrap();
    assert_eq!(
        t.restore(&udp, FlowState::Udp, t.tick(Instant::now()), 0),
        Err(InsertError::Exists(h))
    );
}

/// A sequence word for flow `i` (what the SYN proxy stores: a 32-bit delta and flags).
fn seq_of(i: u32) -> u64 {
    1 << 52 | u64::from(i.wrapping_mul(0x9e37_79b9)) | u64::from(i % 7) << 32
}

/// Flows 0..n, every TCP one with a sequence word (IPv4 and IPv6 alternate in `flow`).
fn fill_proxied(t: &FlowTable, n: u32, now: Instant) -> usize {
    let mut proxied = 0;
    for i in 0..n {
        let d = flow(i);
        let h = t.insert(&d, TcpFlags::SYN, t.tick(now)).unwrap();
        if d.proto == Protocol::Tcp {
            assert!(t.set_seq(h, seq_of(i)));
            assert_eq!(t.seq(h), Some(seq_of(i)));
            proxied += 1;
        } else {
            assert_eq!(t.seq(h), None, "no word stored");
        }
    }
    proxied
}

/// Every TCP flow of `t` has its sequence word, the others none.
fn check_seq(t: &FlowTable, n: u32) {
    let views = check(t);
    assert_eq!(views.len(), n as usize);
    for v in views {
        let i = (0..n).find(|&i| flow(i) == v.data).expect("a known flow");
        let want = (v.data.proto == Protocol::Tcp).then(|| seq_of(i));
        assert_eq!(t.seq(v.handle), want, "flow {i}");
        assert_eq!(v.seq, want.unwrap_or(0), "flow {i}'s view");
    }
}

#[test]
fn sequence_words_survive_adoption_export_and_import() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let now = Instant::now();
    let (t, _) = FlowTable::open(&path, config(1024), now, &AnyFlow).unwrap();
    let proxied = fill_proxied(&t, 300, now);
    assert!(proxied > 150);
    // Every flow inserted with a SYN is embryonic (UDP flows are not).
    assert_eq!(t.embryonic(), proxied as u64);
    check_seq(&t, 300);
    drop(t); // as a crash leaves it

    // Adopted in place: the words stay, the gauge is recounted.
    let (t, opened) = FlowTable::open(&path, config(1024), Instant::now(), &AnyFlow).unwrap();
    assert!(matches!(opened, Opened::Adopted(_)), "{opened:?}");
    check_seq(&t, 300);
    assert_eq!(t.embryonic(), proxied as u64);

    // Exported and imported into another layout.
    let out = dir.path().join("flows.export");
    assert_eq!(t.export(&out, Instant::now()).unwrap(), 300);
    let b = FlowTable::new(config(512), now).unwrap();
    let imported = b.import_records(&out, Instant::now(), &AnyFlow).unwrap();
    assert_eq!((imported.restored, imported.refused), (300, 0));
    check_seq(&b, 300);

    // Another capacity: imported from the state file.
    drop(t);
    let (c, opened) = FlowTable::open(&path, config(2048), Instant::now(), &AnyFlow).unwrap();
    let Opened::Replaced {
        previous: Some(prev),
        ..
    } = opened
    else {
        panic!("{opened:?}")
    };
    assert_eq!(c.import_state(&prev, &AnyFlow).unwrap().restored, 300);
    check_seq(&c, 300);

    // A word outlives neither its flow nor a stale handle.
    let v = check(&c).into_iter().find(|v| v.seq != 0).unwrap();
    assert!(c.remove(v.handle).is_some());
    assert_eq!(c.seq(v.handle), None);
    assert!(!c.set_seq(v.handle, 5));
    let h = c.insert(&v.data, TcpFlags::SYN, c.tick(now)).unwrap();
    assert_eq!(
        c.seq(h),
        None,
        "the earlier flow's word is not the new one's"
    );
    assert!(
        !c.update_seq(h, 1, 2),
        "compare-and-swap of a word never stored"
    );
    assert!(c.set_seq(h, 1) && c.update_seq(h, 1, 2));
    assert_eq!(c.seq(h), Some(2));
    assert!(!c.update_seq(h, 1, 3));
}

#[test]
fn slow_flows_escape_the_ipv4_shortcut_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows");
    let now = Instant::now();
    let (t, _) = FlowTable::open(&path, config(64), now, &AnyFlow).unwrap();
    assert!(!t.has_slow_flows());
    let plain = flow(2); // IPv4 TCP
    let slow = FlowData {
        flags: FLAG_SLOW | 1,
        ..flow(4)
    };
    assert!(!slow.client.is_ipv6() && slow.proto == Protocol::Tcp);
    let hp = t.insert(&plain, TcpFlags::SYN, t.tick(now)).unwrap();
    assert!(!t.has_slow_flows());
    let hs = t.insert(&slow, TcpFlags::SYN, t.tick(now)).unwrap();
    assert!(t.has_slow_flows());
    let v4 = |d: &FlowData, reply: bool| {
        let (a, b) = if reply {
            (d.backend, d.snat)
        } else {
            (d.client, d.vip)
        };
        let bits = |s: std::net::SocketAddr| match s.ip() {
            std::net::IpAddr::V4(v) => v.to_bits(),
            _ => unreachable!(),
        };
        t.v4_key(
            d.proto,
            flowtable::v4_addrs_be(u64::from(bits(a)) | u64::from(bits(b)) << 32),
            flowtable::v4_ports_be(u32::from(a.port()) | u32::from(b.port()) << 16),
        )
    };
    for reply in [false, true] {
        assert_eq!(
            t.lookup_v4(&v4(&plain, reply)).map(|h| h.handle()),
            Some(hp)
        );
        assert_eq!(
            t.lookup_v4(&v4(&slow, reply)),
            None,
            "the shortcut skips it"
        );
        let k = if reply {
            slow.reply_key()
        } else {
            slow.original_key()
        };
        assert_eq!(t.lookup(&k).map(|x| x.0), Some(hs));
        assert_eq!(t.lookup_hit(&k).map(|h| h.handle), Some(hs));
    }
    // Inserting its tuple again finds it.
    assert_eq!(
        t.insert(&slow, TcpFlags::SYN, t.tick(now)),
        Err(InsertError::Exists(hs))
    );
    drop(t);
    let (t, _) = FlowTable::open(&path, config(64), now, &AnyFlow).unwrap();
    assert!(t.has_slow_flows(), "adopted");
}

#[test]
fn version_1_records_import_without_sequence_words() {
    let dir = tempfile::tempdir().unwrap();
    let now = Instant::now();
    let a = FlowTable::new(config(256), now).unwrap();
    fill_proxied(&a, 50, now);
    let out = dir.path().join("flows.export");
    assert_eq!(a.export(&out, now).unwrap(), 50);
    // Rewrite the file as version 1 wrote it: header version 1, 96-byte records.
    let v2 = std::fs::read(&out).unwrap();
    let (head, recs) = v2.split_at(48);
    let mut v1 = head.to_vec();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    v1[12..16].copy_from_slice(&96u32.to_le_bytes());
    for r in recs.chunks(104) {
        v1.extend_from_slice(&r[..96]);
    }
    std::fs::write(&out, v1).unwrap();
    let b = FlowTable::new(config(256), now).unwrap();
    let imported = b.import_records(&out, now, &AnyFlow).unwrap();
    assert_eq!((imported.restored, imported.refused), (50, 0));
    for v in check(&b) {
        assert_eq!(
            (v.seq, b.seq(v.handle)),
            (0, None),
            "delta 0, never misread"
        );
    }
    // A version this xvs does not know is refused, by name.
    let mut v9 = std::fs::read(&out).unwrap();
    v9[8..12].copy_from_slice(&9u32.to_le_bytes());
    std::fs::write(&out, v9).unwrap();
    let e = b.import_records(&out, now, &AnyFlow).unwrap_err();
    assert!(e.to_string().contains("record version 9"), "{e}");
}

#[test]
fn the_embryonic_gauge_follows_handshakes() {
    let now = Instant::now();
    let t = FlowTable::new(config(256), now).unwrap();
    let tcp: Vec<_> = (0..30)
        .filter(|i| flow(*i).proto == Protocol::Tcp)
        .collect();
    let hs: Vec<_> = tcp
        .iter()
        .map(|&i| t.insert(&flow(i), TcpFlags::SYN, t.tick(now)).unwrap())
        .collect();
    assert_eq!(t.embryonic(), tcp.len() as u64);
    // Established, reset, removed: each leaves the gauge.
    t.on_packet(
        hs[0],
        Direction::Reply,
        TcpFlags::SYN | TcpFlags::ACK,
        t.tick(now),
    );
    assert_eq!(t.embryonic(), tcp.len() as u64, "SYN_RECV is embryonic");
    t.on_packet(hs[0], Direction::Original, TcpFlags::ACK, t.tick(now));
    t.on_packet(hs[1], Direction::Reply, TcpFlags::RST, t.tick(now));
    t.remove(hs[2]).unwrap();
    assert_eq!(t.embryonic(), tcp.len() as u64 - 3);
    assert_eq!(t.stats().embryonic, tcp.len() as u64 - 3);
    // Expiry too.
    t.sweep(
        t.tick(now + Duration::from_secs(4000)),
        t.capacity(),
        |_| {},
    );
    assert_eq!(t.embryonic(), 0);
}

/// A state file in `dir` filled by `fill` (100 flows), exported (`flows.export`) and
/// stopped cleanly, then given the layout version `version` in its header, as an older xvs
/// would have left it: its path, the export's, the flows before, and the file open for more.
fn exported_as_version(
    dir: &tempfile::TempDir,
    version: u64,
    fill: impl FnOnce(&FlowTable),
) -> (PathBuf, PathBuf, Vec<FlowView>, std::fs::File) {
    let path = dir.path().join("flows");
    let export = dir.path().join("flows.export");
    let now = Instant::now();
    let (old, _) = FlowTable::open(&path, config(256), now, &AnyFlow).unwrap();
    fill(&old);
    let before = check(&old);
    assert_eq!(old.export(&export, now).unwrap(), 100);
    old.mark_clean();
    drop(old);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&version.to_le_bytes(), 8).unwrap();
    (path, export, before, f)
}

/// The state file at `path` opened again: refused by its layout version (`version`, the
/// refusal's value), set aside, none of its 100 flows adopted; then `export` imported into
/// the new table, all 100 restored.
fn refused_then_imported(path: &Path, export: &Path, now: Instant, version: &str) -> FlowTable {
    let (new, opened) = FlowTable::open(path, config(256), now, &AnyFlow).unwrap();
    let Opened::Replaced {
        refusal,
        set_aside: Some(_),
        previous: None,
        flows: Some(100),
    } = opened
    else {
        panic!("not refused as another layout: {opened:?}")
    };
    assert_eq!(
        (refusal.field, refusal.value.as_str()),
        ("version", version)
    );
    assert_eq!(new.len(), 0);
    let imported = new.import_records(export, now, &AnyFlow).unwrap();
    assert_eq!(
        (imported.restored, imported.refused, imported.invalid),
        (100, 0, 0)
    );
    new
}

/// An upgrade across a layout change (layout 2, a cold half-line per entry and a `seq6`
/// slab, to layout 3, IPv6 flows in two entries) loses nothing: the new process refuses the
/// old state file by its version and imports the export the old one's graceful stop wrote,
/// IPv6 flows and sequence words included.
#[test]
fn a_layout_2_state_file_is_refused_and_its_export_imported() {
    let dir = tempfile::tempdir().unwrap();
    let now = Instant::now();
    let (path, export, before, f) = exported_as_version(&dir, 2, |t| {
        fill_proxied(t, 100, now);
    });
    // The state file as layout 2 left it: its version (above) and entry sizes (64-byte hot
    // lines, 32-byte cold half-lines), and its size (a cold slab and a `seq6` slab more).
    use std::os::unix::fs::FileExt;
    f.write_all_at(&(64u64 << 32 | 32).to_le_bytes(), 40)
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len + 256 * 40).unwrap();
    drop(f);

    let new = refused_then_imported(&path, &export, now, "2 (this xvs uses 6)");
    check_seq(&new, 100);
    let after = check(&new);
    for b in &before {
        assert!(
            after
                .iter()
                .any(|a| a.data == b.data && a.state == b.state && a.seq == b.seq),
            "{:?} lost",
            b.data
        );
    }
    assert!(before.iter().any(|b| b.data.client.is_ipv6()));
}

/// An upgrade across layout 3 (ports and IPv4 addresses in host order) to layout 4 (in
/// network byte order) loses nothing: the old state file is refused by its version, not read
/// with its words misordered, and the export (whose record format did not change) is
/// imported, each IPv4 flow found again by the per-packet shortcut with its way out in
/// network order.
#[test]
fn a_layout_3_state_file_is_refused_and_its_export_imported() {
    refused_layout_found_by_the_shortcut(3);
}

/// An upgrade across layout 4 (index tags with bit 0 set and bit 1 clear) to layout 5 (the
/// hash's bits as they are) loses nothing: the old file is refused by its version, not
/// probed with tags its words do not carry (a flow whose tag the old layout changed would
/// be missed, and its packets taken for a new flow's), and the export is imported.
#[test]
fn a_layout_4_state_file_is_refused_and_its_export_imported() {
    refused_layout_found_by_the_shortcut(4);
}

/// An upgrade across layout 5 (checksum adjustments of the tuple alone) to layout 6 (with
/// the TTL's decrement) loses nothing: the old file is refused by its version, not adopted
/// with adjustments that would leave every forwarded packet's header checksum off by the
/// TTL's term, and the export is imported, its adjustments computed anew.
#[test]
fn a_layout_5_state_file_is_refused_and_its_export_imported() {
    refused_layout_found_by_the_shortcut(5);
}

/// A state file of layout `version` with 100 flows (half IPv4) refused, its export imported,
/// and every IPv4 flow found again by the per-packet shortcut with its way out and its
/// checksum adjustment (a forwarded packet's).
fn refused_layout_found_by_the_shortcut(version: u64) {
    let dir = tempfile::tempdir().unwrap();
    let now = Instant::now();
    let (path, export, before, f) = exported_as_version(&dir, version, |t| fill(t, 0..100, now));
    drop(f);

    let new = refused_then_imported(&path, &export, now, &format!("{version} (this xvs uses 6)"));
    let after = check(&new);
    let (mut v4, bits) = (0, |s: std::net::SocketAddr| match s.ip() {
        std::net::IpAddr::V4(v) => u64::from(v.to_bits()),
        _ => unreachable!(),
    });
    let port = |s: std::net::SocketAddr| u32::from(s.port());
    for b in &before {
        let a = after.iter().find(|a| a.data == b.data).expect("imported");
        assert_eq!(a.state, b.state, "{:?}", b.data);
        let d = &b.data;
        if d.client.is_ipv6() {
            continue;
        }
        let key = new.v4_key(
            d.proto,
            v4_addrs_be(bits(d.client) | bits(d.vip) << 32),
            v4_ports_be(port(d.client) | port(d.vip) << 16),
        );
        let hit = new.lookup_v4(&key).expect("the shortcut finds it");
        assert_eq!(hit.handle(), a.handle);
        assert_eq!(
            hit.addrs(),
            v4_addrs_be(bits(d.snat) | bits(d.backend) << 32)
        );
        assert_eq!(hit.ports, v4_ports_be(port(d.snat) | port(d.backend) << 16));
        let (from, to) = ((key.addrs(), key.ports()), (hit.addrs(), hit.ports));
        assert_eq!(hit.csum_delta, v4_forward_delta(v4_csum_delta_be(from, to)));
        v4 += 1;
    }
    assert_eq!(v4, 50);
}
