//! `xvs run --takeover` end to end, as root, in the netns lab: a download through xvs
//! survives a takeover byte for byte (its sha256 checked), the old process exits and the
//! new one serves, also when the new one refuses the flow table handed over (the flows come
//! over as records); the hand-over socket of a running xvs refuses what is not a takeover
//! (garbage, a wrong hello, descriptors sent to it, a client that never switches, another
//! uid) and xvs keeps serving and can still be taken over; a process that poses as the old
//! xvs and sends a wrong number of descriptors is refused, and the new xvs starts normally.
//!
//! Every scenario builds its own lab (its own state directory and pins) and removes it on
//! every exit path.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;

/// The lab config; a SIGTERM stops at once.
fn config() -> String {
    lab_config().replace("batch_size = 64", "batch_size = 64\ndrain_timeout = \"0s\"")
}

/// `xvs run --takeover` on the lab's config file (written by `start_xvs`), logging to
/// `log` (a file, so that the whole log can be shown when a check fails).
fn spawn_takeover(lab: &Lab, log: &Path) -> Child {
    let file = std::fs::File::create(log).unwrap();
    Command::new("ip")
        .args(["netns", "exec", &lab.ns("x")])
        .args([env!("CARGO_BIN_EXE_xvs"), "run", "--takeover", "--config"])
        .arg(lab.dir.path().join("xvs.toml"))
        .stdout(Stdio::piped())
        .stderr(file)
        .spawn()
        .expect("start xvs --takeover")
}

/// Waits (30 s at most) for the `xvs: ready` line in `log`; `Err` with the log when the
/// child exits or the time runs out first.
fn ready_in(child: &mut Child, log: &Path) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.lines().any(is_ready_line) {
            return Ok(text);
        }
        if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(text);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn takeover_socket(lab: &Lab) -> PathBuf {
    lab.state_dir().join("takeover.sock")
}

/// Waits (bounded) for `child` to exit; its status.
fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A rate-limited download of `bytes` into `file`, in the client namespace.
fn download(lab: &Lab, bytes: usize, file: &Path) -> JoinHandle<Output> {
    let ns = lab.ns("c");
    let url = format!("http://198.18.100.1/bytes/{bytes}");
    let file = file.to_owned();
    std::thread::spawn(move || {
        Command::new("ip")
            .args(["netns", "exec", &ns, "curl", "-sS", "--fail"])
            .args(["--max-time", "60", "--limit-rate", "8M", "-o"])
            .arg(&file)
            .arg(&url)
            .output()
            .unwrap()
    })
}

fn sha256_of_file(file: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(file));
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// The sha256 of what the lab backend's `GET /bytes/N` returns.
fn sha256_of_pattern(n: usize) -> String {
    let script = format!(
        "import hashlib; b = bytes(range(256)) * ({n} // 256 + 1); print(hashlib.sha256(b[:{n}]).hexdigest())"
    );
    let out = run(Command::new("python3").args(["-c", &script]));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Takes over from the running xvs: the new one becomes ready having taken the sockets
/// (its log says so), the old one exits with success; the new one is the lab's xvs.
fn take_over(lab: &mut Lab) -> PathBuf {
    let mut old = lab.xvs.take().expect("xvs runs");
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = lab.dir.path().join(format!("takeover-{n}.log"));
    let mut new = spawn_takeover(lab, &path);
    let log = ready_in(&mut new, &path)
        .unwrap_or_else(|log| panic!("xvs --takeover did not become ready:\n{log}"));
    lab.xvs = Some(new);
    for l in log.lines().filter(|l| l.contains("took over")) {
        eprintln!("new xvs: {l}");
    }
    assert!(
        log.contains("took over the AF_XDP sockets"),
        "the new process started without taking over:\n{log}"
    );
    assert_steering_before_switch(&log);
    // The state files came with the sockets (their locks too): no wait for the old
    // process's exit before the flow table's adoption.
    let took = log
        .lines()
        .find(|l| l.contains("took over the AF_XDP sockets"))
        .unwrap_or_default();
    assert!(
        took.contains("flows") && took.contains("affinity"),
        "the state files were not handed over: {took}\n{log}"
    );
    let pause = log
        .lines()
        .find(|l| l.contains("takeover: the workers poll again"))
        .unwrap_or_else(|| panic!("no pause line:\n{log}"));
    // A thread kept the sockets receiving through the pause, and gave them back before
    // the workers started (`fastpath::xsk::gap`).
    assert!(
        pause.contains(" held_frames=") && pause.contains(" kept="),
        "the pause was not kept: {pause}"
    );
    let status = wait_exit(&mut old, Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "the old xvs did not exit cleanly: {status:?}"
    );
    path
}

/// The pause in which nobody polls holds only what must see the old process stopped: the
/// new process adopted every interface's steering, with the handed-over sockets already
/// in its XSK map, before the switch (the "took over" line ends it), not after.
fn assert_steering_before_switch(log: &str) {
    let lines: Vec<&str> = log.lines().collect();
    let switch = lines
        .iter()
        .position(|l| l.contains("took over the AF_XDP sockets"))
        .expect("took over");
    let steering: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains("steering program pinned"))
        .collect();
    assert_eq!(steering.len(), 2, "one per interface:\n{log}");
    for i in steering {
        assert!(
            i < switch,
            "the steering was adopted after the switch:\n{log}"
        );
        assert!(
            lines[i].contains("adopted=true") && lines[i].contains("sockets=1"),
            "the pinned link adopted with the handed-over socket in its map: {}",
            lines[i]
        );
    }
}

#[test]
fn a_download_survives_a_takeover_byte_for_byte() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    lab.start_xvs(&config());
    let bytes = 40 << 20;
    let file = lab.dir.path().join("download");
    let d = download(&lab, bytes, &file);
    std::thread::sleep(Duration::from_millis(1500));
    let log = take_over(&mut lab);
    let out = d.join().unwrap();
    if !out.status.success() {
        let st = lab.xvs.as_mut().unwrap().try_wait();
        eprintln!(
            "DIAG new xvs status {st:?}, log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let m = lab.exec("x", &["curl", "-sS", "http://127.0.0.1:10249/metrics"]);
        for l in String::from_utf8_lossy(&m.stdout).lines() {
            if (l.contains("xsk")
                || l.contains("steer")
                || l.contains("ring")
                || l.contains("fill")
                || l.contains("worker")
                || l.contains("drop"))
                && !l.starts_with('#')
                && !l.ends_with(" 0")
                && !l.contains("bucket")
            {
                eprintln!("DIAG {l}");
            }
        }
        let r = lab.exec(
            "c",
            &["curl", "-sS", "--max-time", "3", "http://198.18.100.1/"],
        );
        eprintln!(
            "DIAG new conn: {:?} {}",
            r.status,
            String::from_utf8_lossy(&r.stdout)
        );
    }
    assert!(
        out.status.success(),
        "download: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), bytes as u64);
    assert_eq!(sha256_of_file(&file), sha256_of_pattern(bytes));
    // The new process serves new connections, and can itself be taken over.
    check_rr(&lab, "http://198.18.100.1/");
    take_over(&mut lab);
    check_rr(&lab, "http://198.18.100.1/");
    lab.stop_xvs();
}

/// A flow table the new process refuses is not lost with the takeover: here the state file
/// is made writable by others, so neither its handed descriptor nor its path is trusted
/// (as a file of another layout version would be refused). The new process asks for the
/// flows' export at the switch, the old one writes it after the frame states and before it
/// exits, and the new one imports it: a download through the takeover completes byte for
/// byte, its flow restored from the record.
#[test]
fn a_refused_flow_table_comes_over_as_records() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    lab.start_xvs(&config());
    let bytes = 24 << 20;
    let file = lab.dir.path().join("download");
    let d = download(&lab, bytes, &file);
    std::thread::sleep(Duration::from_millis(1500));
    let flows = lab.state_dir().join("flows");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&flows, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let mut old = lab.xvs.take().expect("xvs runs");
    let path = lab.dir.path().join("takeover-refused.log");
    let mut new = spawn_takeover(&lab, &path);
    let log = ready_in(&mut new, &path)
        .unwrap_or_else(|log| panic!("xvs --takeover did not become ready:\n{log}"));
    lab.xvs = Some(new);
    let took = log
        .lines()
        .find(|l| l.contains("took over the AF_XDP sockets"))
        .unwrap_or_else(|| panic!("no takeover:\n{log}"));
    assert!(took.contains("export_asked=true"), "{took}\n{log}");
    let imported = log
        .lines()
        .find(|l| l.contains("imported the flows of the last stop's export"))
        .unwrap_or_else(|| panic!("the export was not imported:\n{log}"));
    assert!(!imported.contains("restored=0 "), "{imported}");
    let status = wait_exit(&mut old, Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "old xvs: {status:?}");
    let out = d.join().unwrap();
    assert!(
        out.status.success(),
        "download: {}\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sha256_of_file(&file), sha256_of_pattern(bytes));
    check_rr(&lab, "http://198.18.100.1/");
    lab.stop_xvs();
}

/// Runs a python client against `sock`; its stdout.
fn client(sock: &Path, script: &str, wrapper: &[&str]) -> String {
    let out = run(Command::new(wrapper.first().copied().unwrap_or("python3"))
        .args(wrapper.iter().skip(1))
        .args(if wrapper.is_empty() {
            vec![]
        } else {
            // The system's interpreter: another uid may not read root's shims.
            vec!["/usr/bin/python3"]
        })
        .args(["-c", script])
        .arg(sock));
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

const PRELUDE: &str = r#"
import json, socket, struct, sys, os
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(15)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect refused:", e)
    sys.exit(0)
def frame(obj):
    b = json.dumps(obj).encode()
    return struct.pack(">I", len(b)) + b
def closed():
    try:
        return s.recv(10) == b""
    except ConnectionResetError:
        return True
def read_frame():
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    return json.loads(s.recv(n, socket.MSG_WAITALL))
"#;

#[test]
fn the_takeover_socket_refuses_what_is_not_a_takeover() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    lab.start_xvs(&config());
    let sock = takeover_socket(&lab);
    assert!(sock.exists(), "xvs listens on {}", sock.display());
    let attacks = [
        // Not the protocol at all.
        "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print('closed' if closed() else 'answered')",
        // A length far over the hello's, then nothing.
        "s.sendall(struct.pack('>I', 0xffffffff)); print('closed' if closed() else 'answered')",
        // Not JSON, and the wrong hello.
        "s.sendall(struct.pack('>I', 3) + b'{{{'); print('closed' if closed() else 'answered')",
        "s.sendall(frame({'hello': 'xvs-takeover', 'version': 99})); print('closed' if closed() else 'answered')",
        // Descriptors sent to the old process with the hello; then no switch.
        "socket.send_fds(s, [frame({'hello': 'xvs-takeover', 'version': 1})], [0, 1, 2]); o = read_frame(); print('offer', len(o['sets']))",
        // The whole offer taken, and the switch declined.
        "s.sendall(frame({'hello': 'xvs-takeover', 'version': 1})); o = read_frame(); m, fds, _, _ = socket.recv_fds(s, 1, 16); s.sendall(frame({'switch': False})); print('declined', len(fds))",
    ];
    for a in attacks {
        let out = client(&sock, &format!("{PRELUDE}\n{a}"), &[]);
        eprintln!("attack {a:?}: {}", out.trim());
        assert!(
            !out.contains("Traceback"),
            "the attack script failed: {out}"
        );
        let xvs = lab.xvs.as_mut().unwrap();
        assert!(xvs.try_wait().unwrap().is_none(), "xvs exited after {a:?}");
        check_rr(&lab, "http://198.18.100.1/");
    }
    // Each was refused once, and counted.
    let metrics = lab.exec("x", &["curl", "-sS", "http://127.0.0.1:10249/metrics"]);
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics.contains("xvs_refused_total{kind=\"takeover\"} 6\n"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("refused"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Another uid cannot even connect (the socket is root's, 0600).
    let out = client(
        &sock,
        &format!("{PRELUDE}\nprint('connected')"),
        &[
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
        ],
    );
    assert!(out.contains("connect refused"), "{out}");
    // After all that, a real takeover still works.
    take_over(&mut lab);
    check_rr(&lab, "http://198.18.100.1/");
    lab.stop_xvs();
}

#[test]
fn a_fake_old_process_is_refused_and_xvs_starts_normally() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    // No xvs runs; something else listens where xvs would, and sends one descriptor for
    // an offer that names a UMEM and two sockets.
    std::fs::create_dir_all(lab.state_dir()).unwrap();
    let sock = takeover_socket(&lab);
    let fake = r#"
import json, socket, struct, sys
l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
l.bind(sys.argv[1]); l.listen(1); l.settimeout(60)
c, _ = l.accept()
n = struct.unpack(">I", c.recv(4, socket.MSG_WAITALL))[0]; c.recv(n, socket.MSG_WAITALL)
meta = {"queue": 0, "mode": "copy", "frame_size": 4096, "umem_len": 1 << 24, "rx_ring_size": 2048,
        "tx_ring_size": 2048, "fill_target": 1024, "ports": ["x0", "x1"]}
b = json.dumps({"version": 1, "sets": [meta]}).encode()
c.sendall(struct.pack(">I", len(b)) + b)
socket.send_fds(c, [b"F"], [0])
print("switch" if c.recv(64) else "closed", flush=True)
"#;
    let mut faker = Command::new("python3")
        .args(["-c", fake])
        .arg(&sock)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(lab.dir.path().join("xvs.toml"), lab.with_state(&config())).unwrap();
    let path = lab.dir.path().join("takeover.log");
    let mut new = spawn_takeover(&lab, &path);
    let log = ready_in(&mut new, &path)
        .unwrap_or_else(|log| panic!("xvs --takeover did not start normally:\n{log}"));
    lab.xvs = Some(new);
    assert!(log.contains("takeover refused"), "{log}");
    assert!(log.contains("descriptors = 1"), "{log}");
    assert!(!log.contains("took over the AF_XDP sockets"), "{log}");
    let status = wait_exit(&mut faker, Duration::from_secs(30));
    let mut said = String::new();
    std::io::Read::read_to_string(&mut faker.stdout.take().unwrap(), &mut said).unwrap();
    assert!(status.is_some(), "the fake did not end");
    assert_eq!(said.trim(), "closed", "the refused offer was switched to");
    check_rr(&lab, "http://198.18.100.1/");
    lab.stop_xvs();
}
