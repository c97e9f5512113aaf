//! State files are untrusted input, end to end, as root: with established downloads through
//! the lab's node, xvs is stopped, its state damaged the ways an attacker or a clumsy
//! operator would (a changed hash seed, a flow of a service no config has, an `affinity` and
//! a `synproxy.key` that are directories, temporaries planted as links to a victim file, a
//! header capacity of 2^61), and started again. It keeps running, writes nothing through the
//! links, logs one refusal line naming file, field and value for each, and the downloads
//! whose flows are recoverable complete with the right bytes.

mod common;

use std::os::unix::fs::{FileExt, symlink};
use std::path::Path;
use std::process::{Command, Output};
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;

/// The lab config for restarts: a SIGTERM stops at once.
fn restart_config() -> String {
    lab_config().replace("batch_size = 64", "batch_size = 64\ndrain_timeout = \"0s\"")
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| i as u8).collect()
}

fn download(lab: &Lab, url: &str, bytes: usize) -> JoinHandle<Output> {
    let ns = lab.ns("c");
    let url = format!("{url}/bytes/{bytes}");
    std::thread::spawn(move || {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                "curl",
                "-sS",
                "--fail",
                "--max-time",
                "30",
            ])
            .args(["--limit-rate", "1M", &url])
            .output()
            .unwrap()
    })
}

fn downloads(lab: &Lab, bytes: usize) -> Vec<(String, JoinHandle<Output>)> {
    [
        "http://198.18.100.1",
        "http://198.18.100.1",
        "http://[2001:2:0:100::1]",
    ]
    .iter()
    .map(|u| (u.to_string(), download(lab, u, bytes)))
    .collect()
}

fn check_downloads(ds: Vec<(String, JoinHandle<Output>)>, bytes: usize, what: &str) {
    for (url, d) in ds {
        let out = d.join().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {url}: {err}");
        assert!(out.stdout == pattern(bytes), "{what}: {url}: wrong bytes");
    }
}

/// Starts xvs on `config` and returns its log up to "ready" (the refusals come before).
fn start(lab: &mut Lab, config: &str) -> String {
    let child = lab.spawn_xvs(config, &[]);
    match wait_ready(child) {
        Ok((child, log)) => {
            lab.xvs = Some(child);
            log
        }
        Err(log) => panic!("xvs did not start on the damaged state:\n{log}"),
    }
}

/// The one log line that has every one of `words`.
fn line_with<'a>(log: &'a str, words: &[&str]) -> &'a str {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .collect();
    assert_eq!(lines.len(), 1, "one line with {words:?} in:\n{log}");
    lines[0]
}

fn running(lab: &mut Lab) {
    let child = lab.xvs.as_mut().expect("xvs runs");
    assert!(child.try_wait().unwrap().is_none(), "xvs exited");
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

/// Header offsets of the flow state (layout version 6), checked against the file.
const CAPACITY: u64 = 16;
const SEED: u64 = 72;
/// Entries start on the page after the header, 64 bytes each.
const ENTRIES: u64 = 4096;

/// The byte offset of the LIVE entry of the UDP flow from the client's port `port` (stored in
/// network byte order).
fn udp_entry(flows: &Path, port: u16) -> u64 {
    let capacity = read(flows, CAPACITY);
    (0..capacity)
        .map(|e| ENTRIES + 64 * e)
        .find(|&at| {
            let (ctl, ports, meta) = (read(flows, at), read(flows, at + 8), read(flows, at + 24));
            (ctl >> 40) & 3 == 2 && u16::from_be(ports as u16) == port && (meta >> 32) as u8 == 17
        })
        .expect("the UDP flow's entry")
}

#[test]
fn a_damaged_state_never_stops_xvs_and_recoverable_flows_survive() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let config = restart_config();
    let state = lab.state_dir();
    let flows = state.join("flows");
    let victim = lab.dir.path().join("victim");
    std::fs::write(&victim, b"do not touch").unwrap();
    let bytes = 3 << 20;
    lab.start_xvs(&config);
    assert_eq!(read(&flows, CAPACITY), 65536, "the header offsets");

    // Round 1, a crash (SIGKILL): the table stays as it was, then is damaged.
    assert!(!lab.udp("198.18.100.1", 9000, 41000, "x").is_empty());
    let ds = downloads(&lab, bytes);
    std::thread::sleep(Duration::from_millis(1200));
    let mut child = lab.xvs.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let seed = read(&flows, SEED);
    write(&flows, SEED, seed ^ 0x5555_0000);
    let ids = udp_entry(&flows, 41000) + 16;
    write(
        &flows,
        ids,
        (read(&flows, ids) & !0xffff_ffff) | 0xffff_fff0,
    );
    for f in ["affinity", "synproxy.key"] {
        std::fs::remove_file(state.join(f)).unwrap();
        std::fs::create_dir(state.join(f)).unwrap();
    }
    symlink(&victim, state.join("flows.new")).unwrap();
    let log = start(&mut lab, &config);
    let f = flows.display().to_string();
    line_with(&log, &[&f, "seed", "rebuilt"]);
    line_with(&log, &[&f, "service_id", "4294967280"]);
    line_with(&log, &["/affinity", "a directory", "refused"]);
    line_with(&log, &["/synproxy.key", "a directory", "refused"]);
    line_with(&log, &["/flows.new", "symbolic link", "refused"]);
    check_downloads(ds, bytes, "after a crash and a damaged state");
    running(&mut lab);
    assert_eq!(std::fs::read(&victim).unwrap(), b"do not touch");

    // Round 2, a graceful stop (SIGTERM, which exports the flows) with the export's
    // temporary planted as a link; then a header capacity of 2^61 (it aborted the process,
    // at every later start): the table is set aside and the export imported.
    let ds = downloads(&lab, bytes);
    std::thread::sleep(Duration::from_millis(1200));
    symlink(&victim, state.join("flows.tmp")).unwrap();
    let mut child = lab.xvs.take().unwrap();
    // SAFETY: our child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "xvs exited with {status}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"do not touch");
    assert!(state.join("flows.export").is_file(), "exported");
    write(&flows, CAPACITY, 1 << 61);
    let log = start(&mut lab, &config);
    line_with(&log, &[&f, "capacity", "2305843009213693952", "refused"]);
    line_with(&log, &["/flows.export", "imported"]);
    check_downloads(ds, bytes, "after a graceful stop and a damaged header");
    running(&mut lab);
    let refused = shm_refused(&state);
    assert!(
        refused
            .iter()
            .any(|n| n.starts_with("flows.refused-") && n.ends_with("-capacity")),
        "{refused:?}"
    );
    let out = lab.stop_xvs();
    assert!(out.contains("flows_live="), "{out}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"do not touch");
}

/// The names of the refused files set aside in `dir`.
fn shm_refused(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(".refused-"))
        .collect()
}
