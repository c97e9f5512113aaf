//! State files as an attacker or a clumsy operator leaves them: every header field, the
//! index and the entries damaged by hand, and random bytes. Opening never panics; a header
//! that fails sets the file aside and starts a new table; an entry that fails is dropped
//! and counted; an index that disagrees with the entries is rebuilt; every flow adopted is
//! one the table (and the caller's check) finds valid. Files, links, permissions, exports
//! and full filesystems are `persist_files.rs`.
#![cfg(not(loom))]

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{BACKENDS, check, flow};
use flowtable::*;
use proptest::prelude::*;

const CAP: usize = 256;
const FLOWS: u32 = 120;

fn config() -> FlowTableConfig {
    FlowTableConfig::new(CAP, BACKENDS as usize)
}

/// Header fields' byte offsets (layout version 3; checked against a real file below).
const MAGIC: u64 = 0;
const VERSION: u64 = 8;
const CAPACITY: u64 = 16;
const HOMES: u64 = 24;
const BACKENDS_MAX: u64 = 32;
const ENTRY_BYTES: u64 = 40;
const BOOT_ID: u64 = 48;
const EPOCH: u64 = 64;
const SEED: u64 = 72;
const STATUS: u64 = 80;
const OWNER_PID: u64 = 88;

/// A state file of `FLOWS` flows, left as a crash leaves it; returns its path and flows.
fn state(dir: &Path) -> (PathBuf, Vec<FlowView>) {
    let path = dir.join("flows");
    let now = Instant::now();
    let (t, _) = FlowTable::open(&path, config(), now, &AnyFlow).unwrap();
    for i in 0..FLOWS {
        t.insert(&flow(i), TcpFlags::SYN, t.tick(now)).unwrap();
    }
    let views = check(&t);
    drop(t);
    assert_eq!(read(&path, MAGIC), u64::from_le_bytes(*b"XVSFLOWT"));
    assert_eq!(read(&path, CAPACITY), CAP as u64, "the offsets above");
    assert_eq!(read(&path, BACKENDS_MAX), u64::from(BACKENDS));
    (path, views)
}

fn read(path: &Path, at: u64) -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    u64::from_le_bytes(b)
}

fn write(path: &Path, at: u64, v: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&v.to_le_bytes(), at).unwrap();
}

/// `(entries, index, index slots, total)` of the test tables.
fn layout() -> (u64, u64, u64, u64) {
    let (e, i, n, t) = FlowTable::state_layout(CAP, BACKENDS as usize);
    (e as u64, i as u64, n as u64, t as u64)
}

/// Word 6 of an IPv6 flow's entry: the number of its extension entry.
const W_EXT: u64 = 6;

/// The byte offset of word `w` of IPv6 flow `i`'s extension entry (VIP in words 1-2,
/// backend 3-4, SNAT 5-6, each lo then hi).
fn ext_word(path: &Path, i: u32, w: u64) -> u64 {
    let (entries, ..) = layout();
    entries + 64 * read(path, entry_word(path, i, W_EXT)) + 8 * w
}

/// The byte offset of word `w` of the entry holding flow `i` (found by its client port,
/// `1024 + i`, stored in network byte order, in a LIVE entry).
fn entry_word(path: &Path, i: u32, w: u64) -> u64 {
    let (entries, ..) = layout();
    (0..CAP as u64)
        .map(|e| entries + 64 * e)
        .find(|&at| {
            (read(path, at) >> 40) & 3 == 2
                && u16::from_be(read(path, at + 8) as u16) == 1024 + i as u16
        })
        .map(|at| at + 8 * w)
        .expect("flow's entry")
}

fn adopted(path: &Path, check_fn: &dyn FlowCheck) -> (FlowTable, Recovery) {
    let (t, opened) = FlowTable::open(path, config(), Instant::now(), check_fn).unwrap();
    match opened {
        Opened::Adopted(r) => (t, r),
        other => panic!("not adopted: {other:?}"),
    }
}

#[test]
fn every_header_field_that_fails_sets_the_file_aside() {
    let cases: &[(&str, u64, u64, &str)] = &[
        ("magic", MAGIC, 0x1234, "magic"),
        ("version", VERSION, 99, "version"),
        ("capacity 2^61", CAPACITY, 1 << 61, "capacity"),
        ("capacity 0", CAPACITY, 0, "capacity"),
        ("capacity smaller", CAPACITY, CAP as u64 / 4, "capacity"),
        ("capacity larger", CAPACITY, 1 << 20, "capacity"),
        ("homes", HOMES, 7, "homes"),
        ("backends_max 2^61", BACKENDS_MAX, 1 << 61, "backends_max"),
        ("backends_max 0", BACKENDS_MAX, 0, "backends_max"),
        ("backends_max a page larger", BACKENDS_MAX, 4096, "size"),
        ("entry_bytes", ENTRY_BYTES, 1, "entry_bytes"),
        ("boot_id", BOOT_ID, 1, "boot_id"),
        ("epoch in the future", EPOCH, u64::MAX / 2, "epoch"),
        ("status", STATUS, 7, "status"),
        ("owner_pid", OWNER_PID, 1 << 40, "owner_pid"),
    ];
    for &(what, at, value, field) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = state(dir.path());
        write(&path, at, value);
        let (t, opened) = FlowTable::open(&path, config(), Instant::now(), &AnyFlow)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let Opened::Replaced {
            refusal,
            previous: None,
            set_aside: Some(aside),
            ..
        } = opened
        else {
            panic!("{what}: {opened:?}")
        };
        assert_eq!(refusal.field, field, "{what}: {refusal}");
        assert!(
            refusal.value.contains(&value.to_string()) || field == "magic" || field == "boot_id",
            "{what}: the value found is named: {refusal}"
        );
        // Set aside with its damage, never removed; a new, empty table in its place.
        assert_eq!(read(&aside.to, at), value, "{what}");
        let name = aside.to.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(
            name.starts_with("flows.refused-") && name.ends_with(&format!("-{field}")),
            "{name}"
        );
        assert_eq!(t.len(), 0, "{what}");
        t.insert(&flow(1), TcpFlags::SYN, t.tick(Instant::now()))
            .unwrap();
        assert_eq!(check(&t).len(), 1);
    }
}

#[test]
fn a_file_of_another_size_is_refused_not_mapped_past_its_end() {
    // A sparse terabyte too: only its first page is mapped before its size is refused.
    for len in [0u64, 100, 4096, layout().3 / 2, layout().3 + 4096, 1 << 40] {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = state(dir.path());
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len).unwrap();
        drop(f);
        let (t, opened) = FlowTable::open(&path, config(), Instant::now(), &AnyFlow).unwrap();
        assert!(
            matches!(&opened, Opened::Replaced { refusal, set_aside: Some(_), .. } if refusal.field == "size"),
            "{len}: {opened:?}"
        );
        assert_eq!(t.len(), 0);
    }
}

#[test]
fn a_smaller_backends_max_in_the_same_size_imports_valid_flows_only() {
    // backends_max 4 makes the same file as 8 (one page of counts): it reads as another
    // geometry, imported; flows to backends 4..8 are valid in the new table (8 backends).
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = state(dir.path());
    write(&path, BACKENDS_MAX, 4);
    let (t, opened) = FlowTable::open(&path, config(), Instant::now(), &AnyFlow).unwrap();
    let Opened::Replaced {
        previous: Some(prev),
        ..
    } = opened
    else {
        panic!("{opened:?}")
    };
    let i = t.import_state(&prev, &AnyFlow).unwrap();
    assert_eq!(
        (i.read, i.restored, i.invalid),
        (before.len(), before.len(), 0)
    );
    assert_eq!(check(&t).len(), before.len());
}

/// Every adopted flow is findable and counted, and each one was in the table before.
fn same_flows(t: &FlowTable, before: &[FlowView], dropped: usize) {
    let after = check(t);
    assert_eq!(after.len(), before.len() - dropped);
    for v in &after {
        assert!(
            before
                .iter()
                .any(|b| b.data == v.data && b.state == v.state),
            "{:?} was not in the table",
            v.data
        );
    }
}

#[test]
fn an_index_that_disagrees_with_the_entries_is_rebuilt() {
    let (_, index, slots, _) = layout();
    type Damage = fn(&Path, u64, u64);
    let cases: &[(&str, Damage, &str)] = &[
        (
            "seed changed",
            |p, _, _| write(p, SEED, read(p, SEED) ^ 0x5555),
            "seed",
        ),
        (
            "index zeroed",
            |p, at, n| (0..n).for_each(|s| write(p, at + 8 * s, 0)),
            "index",
        ),
        (
            "index garbage",
            |p, at, n| {
                (0..n)
                    .for_each(|s| write(p, at + 8 * s, (s + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            },
            "index",
        ),
        (
            "a stray word",
            |p, at, n| {
                // A copy of a live word in an empty slot far from its home.
                let words: Vec<u64> = (0..n).map(|s| read(p, at + 8 * s)).collect();
                let live = *words.iter().find(|w| **w != 0 && **w != u64::MAX).unwrap();
                let empty = (0..n).rev().find(|&s| words[s as usize] == 0).unwrap();
                write(p, at + 8 * empty, live);
            },
            "index",
        ),
    ];
    for &(what, damage, field) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (path, before) = state(dir.path());
        damage(&path, index, slots);
        let (t, r) = adopted(&path, &AnyFlow);
        let fault = r
            .index
            .clone()
            .unwrap_or_else(|| panic!("{what}: not seen"));
        assert_eq!(fault.field, field, "{what}: {fault}");
        assert_eq!((r.flows, r.refused), (before.len(), 0), "{what}");
        same_flows(&t, &before, 0);
        // Rebuilt for good: the next adoption finds it consistent.
        t.mark_clean();
        drop(t);
        let (t, r) = adopted(&path, &AnyFlow);
        assert_eq!((r.index, r.flows), (None, before.len()), "{what}");
        same_flows(&t, &before, 0);
    }
}

/// A check like the daemon's on a static config: service 7, the eight test backends.
fn config_check(d: &FlowData, _: FlowState) -> Result<(), Refusal> {
    if d.service_id != 7 {
        return Err(Refusal::new("service_id", d.service_id));
    }
    if !(0..BACKENDS).any(|b| flow(b).backend == d.backend) {
        return Err(Refusal::new("backend", d.backend));
    }
    Ok(())
}

#[test]
fn an_entry_that_fails_is_dropped_and_counted_alone() {
    type Damage = fn(&Path);
    let cases: &[(&str, Damage, &str)] = &[
        (
            "an IPv4 backend address rewritten in place",
            |p| {
                let at = entry_word(p, 0, 5);
                write(p, at, read(p, at) ^ 0x0100);
            },
            "checksum",
        ),
        (
            "an IPv6 backend address rewritten in place",
            |p| {
                // Flow 1's backend is in its extension entry (IPv6).
                let w = ext_word(p, 1, 3);
                write(p, w, read(p, w) ^ 0x7700);
            },
            "backend",
        ),
        (
            "a foreign service id",
            |p| {
                let at = entry_word(p, 2, 2);
                write(p, at, (read(p, at) & !0xffff_ffff) | 0xffff_fff0);
            },
            "service_id",
        ),
        (
            "a state code of no state",
            |p| {
                let at = entry_word(p, 4, 0);
                write(p, at, (read(p, at) & !(0xff << 32)) | 13 << 32);
            },
            "state",
        ),
        (
            "UDP's state on a TCP flow",
            |p| {
                let at = entry_word(p, 4, 0);
                write(p, at, (read(p, at) & !(0xff << 32)) | 16 << 32);
            },
            "state",
        ),
        (
            "unused meta bits",
            |p| {
                let at = entry_word(p, 4, 3);
                write(p, at, read(p, at) | 1 << 60);
            },
            "meta",
        ),
        (
            "no such protocol",
            |p| {
                let at = entry_word(p, 4, 3);
                write(p, at, (read(p, at) & !(0xff << 32)) | 99 << 32);
            },
            "protocol",
        ),
        (
            "a backend id past backends_max",
            |p| {
                let at = entry_word(p, 4, 2);
                write(p, at, (read(p, at) & 0xffff_ffff) | 1000 << 32);
            },
            "backend_id",
        ),
        (
            "a last-seen time in the future",
            |p| {
                let at = entry_word(p, 4, 0);
                write(p, at, (read(p, at) & !0xffff_ffff) | 0xffff_fff0);
            },
            "last_seen",
        ),
        (
            "a port zeroed",
            |p| {
                let at = entry_word(p, 4, 1);
                write(p, at, read(p, at) & !(0xffff << 16));
            },
            "vip",
        ),
        (
            "an IPv6 flow's extension past the entries",
            |p| write(p, entry_word(p, 1, W_EXT), CAP as u64 + 3),
            "extension",
        ),
        (
            "an IPv6 flow's extension number with high bits",
            |p| {
                let at = entry_word(p, 1, W_EXT);
                write(p, at, read(p, at) | 1 << 40);
            },
            "extension",
        ),
        (
            "an IPv6 flow's extension its own entry",
            |p| {
                let (entries, ..) = layout();
                let at = entry_word(p, 1, W_EXT);
                write(p, at, (at - 8 * W_EXT - entries) / 64);
            },
            "extension",
        ),
        (
            "an IPv6 flow's extension another flow's entry",
            |p| {
                let (entries, ..) = layout();
                let other = (entry_word(p, 2, 0) - entries) / 64;
                write(p, entry_word(p, 1, W_EXT), other);
            },
            "extension",
        ),
    ];
    for &(what, damage, field) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (path, before) = state(dir.path());
        damage(&path);
        let (t, r) = adopted(&path, &config_check);
        let refusal = r.refusal.clone().unwrap_or_else(|| panic!("{what}: kept"));
        assert_eq!((refusal.field, r.refused), (field, 1), "{what}: {refusal}");
        assert_eq!(r.flows, before.len() - 1, "{what}");
        same_flows(&t, &before, 1);
    }
}

#[test]
fn an_extension_named_by_two_flows_refuses_both_and_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = state(dir.path());
    // Flow 3 names flow 1's extension: whose it is cannot be told.
    let (e1, e3) = (entry_word(&path, 1, W_EXT), entry_word(&path, 3, W_EXT));
    let (own3, shared) = (read(&path, e3), read(&path, e1));
    write(&path, e3, shared);
    let (t, r) = adopted(&path, &config_check);
    assert_eq!(r.refused, 2, "{r:?}");
    let refusal = r.refusal.clone().unwrap();
    assert_eq!(refusal.field, "extension");
    assert!(refusal.value.contains(&shared.to_string()), "{refusal}");
    assert_eq!(r.flows, before.len() - 2);
    same_flows(&t, &before, 2);
    // Both extensions (the shared one and flow 3's own) went back to the free list, once
    // each: new IPv6 flows (two entries each) take every free entry before the first finds
    // the table full (or has to recycle a flow).
    assert_ne!(own3, shared);
    let now = t.tick(Instant::now());
    // 60 IPv4 flows of one entry, 60 IPv6 flows of two, flows 1 and 3 gone.
    let free = CAP - (60 + 2 * 58);
    let mut added = 0;
    for i in 0..CAP as u32 {
        let r = t.insert(&flow(1001 + 2 * i), TcpFlags::NONE, now);
        if matches!(r, Err(InsertError::Full)) || t.stats().recycled > 0 {
            break;
        }
        r.unwrap();
        added += 1;
    }
    assert_eq!(added, free / 2, "every free entry used, none twice");
    check(&t);
}

#[test]
fn a_backend_id_at_two_addresses_drops_its_flows_and_two_flows_of_one_tuple_one() {
    // With no config to tell the real address (Kubernetes mode at open): every flow of the
    // id is suspect.
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = state(dir.path());
    let w = ext_word(&path, 1, 3);
    write(&path, w, read(&path, w) ^ 0x7700);
    let (t, r) = adopted(&path, &AnyFlow);
    let id = flow(1).backend_id;
    let of_id = before.iter().filter(|v| v.data.backend_id == id).count();
    assert_eq!(r.refused, of_id);
    assert_eq!(r.refusal.as_ref().unwrap().field, "backend_id");
    // The rest of the index is sound: not reported, not rebuilt.
    assert_eq!(r.index, None);
    assert!(check(&t).iter().all(|v| v.data.backend_id != id));
    same_flows(&t, &before, of_id);

    // Entry of flow 2 copied over flow 8's: two LIVE entries, one tuple.
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = state(dir.path());
    let (from, to) = (entry_word(&path, 2, 0), entry_word(&path, 8, 0));
    for w in 0..8 {
        write(&path, to + 8 * w, read(&path, from + 8 * w));
    }
    let (t, r) = adopted(&path, &AnyFlow);
    assert_eq!(r.refused, 1, "{r:?}");
    assert_eq!(r.refusal.as_ref().unwrap().field, "tuple");
    assert!(
        r.index.is_some(),
        "flow 8's words point at a copy of flow 2"
    );
    // Flow 8 is gone (its entry holds flow 2 now), flow 2 is there once.
    same_flows(&t, &before, 1);
    assert!(check(&t).iter().all(|v| v.data != flow(8)));
}

#[test]
fn a_valid_table_is_adopted_untouched_by_the_checks() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = state(dir.path());
    let (t, r) = adopted(&path, &config_check);
    assert_eq!((r.flows, r.refused, r.index), (before.len(), 0, None));
    same_flows(&t, &before, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random bytes over the header, the entries, the cold lines and the index: open never
    /// panics, and whatever it adopts or makes is a consistent table of valid flows.
    #[test]
    fn random_bytes_never_panic_and_every_adopted_flow_is_valid(
        pokes in proptest::collection::vec((0u64..1 << 20, any::<u64>()), 1..40),
        region in 0usize..4,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (path, before) = state(dir.path());
        let (entries, index, slots, _) = layout();
        let (start, len) = match region {
            0 => (0, 128),
            1 => (entries, CAP as u64 * 64),
            // The extension numbers of the IPv6 flows: small values name other entries.
            2 => {
                for &(i, v) in &pokes {
                    let flow = 1 + 2 * (i as u32 % (FLOWS / 2));
                    write(&path, entry_word(&path, flow, W_EXT), v % (2 * CAP as u64));
                }
                (0, 0)
            }
            _ => (index, slots * 8),
        };
        for &(at, v) in pokes.iter().filter(|_| len > 0) {
            write(&path, start + (at % len) / 8 * 8, v);
        }
        let (t, opened) = FlowTable::open(&path, config(), Instant::now(), &config_check).unwrap();
        let views = check(&t);
        for v in &views {
            prop_assert!(config_check(&v.data, v.state).is_ok());
            prop_assert!(v.data.backend_id.0 < BACKENDS);
        }
        match &opened {
            Opened::Adopted(r) => {
                prop_assert_eq!(r.flows, views.len());
                prop_assert!(r.flows + r.refused <= before.len() + pokes.len());
            }
            _ => prop_assert!(views.is_empty()),
        }
        // The table works afterwards.
        let now = t.tick(Instant::now() + Duration::from_secs(1));
        let _ = t.insert(&flow(FLOWS + 1), TcpFlags::SYN, now);
        check(&t);
    }
}
