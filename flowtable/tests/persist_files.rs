//! State files as things on a filesystem: symbolic links (dangling, and to a victim that
//! must stay untouched), files others could write, directories where files should be,
//! temporaries planted in the way, export files with bad records, counts or sizes, and a
//! full filesystem (a small tmpfs in a private mount namespace: refused with exact sizes at
//! open, never a SIGBUS while the table is written).
#![cfg(not(loom))]

mod common;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{BACKENDS, check, flow};
use flowtable::*;

/// The tests of this file, one at a time: one of them spawns a process, and a child between
/// its fork and its exec holds every open file of this process, so another test's state
/// file (and its `flock`) could outlive its table for that moment and refuse a reopen as
/// "in use by another process".
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn config(capacity: usize) -> FlowTableConfig {
    FlowTableConfig::new(capacity, BACKENDS as usize)
}

/// A victim file root must never write through a planted link.
fn victim(dir: &Path) -> PathBuf {
    let v = dir.join("victim");
    std::fs::write(&v, b"do not touch").unwrap();
    v
}

fn untouched(v: &Path) {
    assert_eq!(std::fs::read(v).unwrap(), b"do not touch");
}

fn refused_field(opened: &Opened) -> &'static str {
    match opened {
        Opened::Replaced {
            refusal,
            set_aside: Some(_),
            previous: None,
            ..
        } => refusal.field,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn links_directories_and_loose_files_are_set_aside_never_followed() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v = victim(d);
    let flows = d.join("flows");
    let open = || FlowTable::open(&flows, config(64), Instant::now(), &AnyFlow).unwrap();

    symlink(&v, &flows).unwrap();
    let (t, opened) = open();
    assert_eq!(refused_field(&opened), "type");
    untouched(&v);
    assert!(!flows.symlink_metadata().unwrap().file_type().is_symlink());
    drop(t);

    std::fs::remove_file(&flows).unwrap();
    symlink(d.join("nowhere"), &flows).unwrap();
    let (t, opened) = open();
    let Opened::Replaced { refusal, .. } = &opened else {
        panic!()
    };
    assert!(refusal.value.contains("symbolic link to"), "{refusal}");
    assert!(
        !d.join("nowhere").exists(),
        "a dangling link is not created through"
    );
    drop(t);

    std::fs::remove_file(&flows).unwrap();
    std::fs::create_dir(&flows).unwrap();
    let (t, opened) = open();
    assert_eq!(refused_field(&opened), "type");
    drop(t);

    std::fs::set_permissions(&flows, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (t, opened) = open();
    assert_eq!(refused_field(&opened), "mode");
    drop(t);

    // Another owner (the tests run as root, which may chown).
    std::os::unix::fs::chown(&flows, Some(12345), None).unwrap();
    let (_t, opened) = open();
    assert_eq!(refused_field(&opened), "owner");
    // Every refused thing is kept (at most a few of each name).
    assert_eq!(
        shm::refused_in(d).len(),
        shm::REFUSED_KEEP,
        "{:?}",
        shm::refused_in(d)
    );
}

#[test]
fn a_planted_temporary_is_never_written_through() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v = victim(d);
    let flows = d.join("flows");
    // The table's temporary.
    symlink(&v, d.join("flows.new")).unwrap();
    let e = FlowTable::open(&flows, config(64), Instant::now(), &AnyFlow)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("flows.new"), "{e}");
    untouched(&v);
    std::fs::remove_file(d.join("flows.new")).unwrap();
    // The export's temporary.
    let (t, _) = FlowTable::open(&flows, config(64), Instant::now(), &AnyFlow).unwrap();
    t.insert(&flow(0), TcpFlags::SYN, t.tick(Instant::now()))
        .unwrap();
    symlink(&v, d.join("flows.tmp")).unwrap();
    let e = t
        .export(&d.join("flows.export"), Instant::now())
        .unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    untouched(&v);
    assert!(!d.join("flows.export").exists());
    // A stale temporary of ours (a crash's) is replaced.
    std::fs::remove_file(d.join("flows.tmp")).unwrap();
    std::fs::write(d.join("flows.tmp"), b"half").unwrap();
    assert_eq!(
        t.export(&d.join("flows.export"), Instant::now()).unwrap(),
        1
    );
    // An export that is a link is refused, not read through.
    std::fs::remove_file(d.join("flows.export")).unwrap();
    symlink(&v, d.join("flows.export")).unwrap();
    let fresh = FlowTable::new(config(64), Instant::now()).unwrap();
    let e = fresh
        .import_records(&d.join("flows.export"), Instant::now(), &AnyFlow)
        .unwrap_err();
    assert!(
        matches!(&e, Error::Refused { refusal, .. } if refusal.field == "type"),
        "{e}"
    );
}

/// An export of flows `0..n` and its bytes.
fn export(dir: &Path, n: u32) -> (PathBuf, Vec<u8>) {
    let t = FlowTable::new(config(256), Instant::now()).unwrap();
    for i in 0..n {
        t.insert(&flow(i), TcpFlags::SYN, t.tick(Instant::now()))
            .unwrap();
    }
    let path = dir.join("flows.export");
    assert_eq!(t.export(&path, Instant::now()).unwrap(), n as usize);
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

fn import(path: &Path, check_fn: &dyn FlowCheck) -> Result<(Imported, FlowTable), Error> {
    let t = FlowTable::new(config(256), Instant::now()).unwrap();
    let i = t.import_records(path, Instant::now(), check_fn)?;
    Ok((i, t))
}

const HEAD: usize = 48;
const REC: usize = RECORD_BYTES;

#[test]
fn export_files_are_refused_whole_or_record_by_record() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let (path, good) = export(dir.path(), 40);
    let refused = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        match import(&path, &AnyFlow) {
            Err(Error::Refused { refusal, .. }) => refusal.field,
            Err(e) => panic!("{e}"),
            Ok((i, _)) => panic!("imported: {i:?}"),
        }
    };
    let mut huge = good.clone();
    huge[16..24].copy_from_slice(&(1u64 << 61).to_le_bytes());
    assert_eq!(refused(&huge), "count");
    assert_eq!(
        refused(&good[..good.len() - 10]),
        "count",
        "a truncated record"
    );
    assert_eq!(refused(&good[..HEAD + REC * 39]), "count", "a record short");
    assert_eq!(refused(&good[..20]), "size");
    let mut v = good.clone();
    v[12..16].copy_from_slice(&4096u32.to_le_bytes());
    assert_eq!(refused(&v), "version");
    let mut b = good.clone();
    b[24] ^= 1;
    assert_eq!(refused(&b), "boot_id");
    let mut m = good.clone();
    m[0] = b'Y';
    assert_eq!(refused(&m), "magic");

    // Records: a foreign service id (refused by the check), random bytes, each alone.
    let known_service = |d: &FlowData, _: FlowState| {
        if d.service_id == 7 {
            Ok(())
        } else {
            Err(Refusal::new("service_id", d.service_id))
        }
    };
    let mut bad = good.clone();
    bad[HEAD + 3 * REC + 12..HEAD + 3 * REC + 16].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut seed = 0x1234_5678_u64;
    for r in [5usize, 6, 20] {
        for byte in &mut bad[HEAD + r * REC..HEAD + (r + 1) * REC] {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *byte = (seed >> 56) as u8;
        }
    }
    std::fs::write(&path, &bad).unwrap();
    let (i, t) = import(&path, &known_service).unwrap();
    assert_eq!((i.read, i.restored, i.invalid), (40, 36, 4), "{i:?}");
    assert_eq!(check(&t).len(), 36);
    // Records naming one backend id at two addresses: every record of that id is dropped.
    let mut two = good.clone();
    let id_of =
        |b: &[u8], r: usize| u32::from_le_bytes(b[HEAD + r * REC + 16..][..4].try_into().unwrap());
    let target = id_of(&good, 0);
    let r = (1..40).find(|&r| id_of(&good, r) == target).unwrap();
    two[HEAD + r * REC + 60] ^= 0x40; // its backend address, another one
    std::fs::write(&path, &two).unwrap();
    let (i, t) = import(&path, &AnyFlow).unwrap();
    let of_id = (0..40).filter(|&r| id_of(&good, r) == target).count();
    assert_eq!(i.invalid, of_id, "{i:?}");
    assert_eq!(i.refusal.unwrap().field, "backend_id");
    assert!(check(&t).iter().all(|v| v.data.backend_id.0 != target));
}

/// Runs the test `name` of this binary again inside a private mount namespace with a tmpfs
/// of `size` mounted on a new directory (given in `XVS_TEST_TMPFS`); the mount goes with
/// the namespace however the run ends. Returns whether this is the inner run's directory.
fn in_small_tmpfs(name: &str, size: &str) -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("XVS_TEST_TMPFS") {
        return Some(PathBuf::from(d));
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount -t tmpfs -o "size=$1" xvs-test "$2" && exec "$3" --exact "$4" --test-threads 1 --nocapture"#)
        .args(["sh", size])
        .arg(dir.path())
        .arg(&exe)
        .arg(name)
        .env("XVS_TEST_TMPFS", dir.path())
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{name} in a {size} tmpfs: {}\n{text}",
        out.status
    );
    assert!(text.contains("1 passed"), "{text}");
    None
}

#[test]
fn a_full_filesystem_is_a_refusal_with_exact_sizes_never_a_sigbus() {
    let _one = serial();
    let Some(d) = in_small_tmpfs(
        "a_full_filesystem_is_a_refusal_with_exact_sizes_never_a_sigbus",
        "2m",
    ) else {
        return;
    };
    // Too big for the filesystem: refused when made, with sizes in their unit.
    let e = FlowTable::open(&d.join("big"), config(1 << 16), Instant::now(), &AnyFlow)
        .err()
        .expect("no room");
    let msg = e.to_string();
    let need = shm::bytes(FlowTable::file_bytes(1 << 16, BACKENDS as usize).unwrap());
    assert!(need.ends_with(" MiB"), "{need}");
    assert!(
        msg.contains(&format!("needs {need}, has ")) && msg.contains(" free"),
        "{msg}"
    );
    assert!(!d.join("big.new").exists(), "the temporary is removed");
    // A table that fits, then the filesystem filled to the last byte by someone else.
    let path = d.join("flows");
    let (t, _) = FlowTable::open(&path, config(2048), Instant::now(), &AnyFlow).unwrap();
    let mut filler = std::fs::File::create(d.join("filler")).unwrap();
    let chunk = vec![1u8; 64 << 10];
    use std::io::Write;
    while filler.write_all(&chunk).is_ok() {}
    let _ = filler.write_all(&chunk[..1]);
    // Every page of the table written: no SIGBUS (its space was reserved).
    for i in 0..2000 {
        let _ = t.insert(&flow(i), TcpFlags::SYN, t.tick(Instant::now()));
    }
    // Every entry taken: 2048 entries hold about 1365 flows when every other one is IPv6
    // (two entries).
    assert!(check(&t).len() > 1300);
    drop(t);
    // A state file whose pages were given back (a sparse file) cannot be adopted into a full
    // filesystem: a refusal, not a fault in the recovery pass.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let (entries, index, _, _) = FlowTable::state_layout(2048, BACKENDS as usize);
    // SAFETY: punching a hole in our own file.
    let r = unsafe {
        use std::os::fd::AsRawFd;
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            entries as i64,
            (index - entries) as i64,
        )
    };
    assert_eq!(r, 0);
    drop(f);
    std::fs::write(d.join("filler2"), vec![1u8; 4 << 20]).unwrap_or(());
    let e = FlowTable::open(&path, config(2048), Instant::now(), &AnyFlow)
        .err()
        .expect("no room to back the adopted file");
    let msg = e.to_string();
    assert!(msg.contains("reserving") && msg.contains("free"), "{msg}");
    assert!(path.exists(), "the state is kept for a start with room");
}

#[test]
fn a_directory_where_a_resized_state_goes_costs_its_flows_not_the_start() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let flows = dir.path().join("flows");
    let (t, _) = FlowTable::open(&flows, config(64), Instant::now(), &AnyFlow).unwrap();
    t.insert(&flow(0), TcpFlags::SYN, t.tick(Instant::now()))
        .unwrap();
    drop(t);
    std::fs::create_dir(previous_path(&flows)).unwrap();
    let (t, opened) = FlowTable::open(&flows, config(128), Instant::now(), &AnyFlow).unwrap();
    assert_eq!(refused_field(&opened), "capacity");
    assert_eq!((t.capacity(), t.len()), (128, 0));
    assert!(previous_path(&flows).is_dir(), "left alone");
}
