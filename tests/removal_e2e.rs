//! End to end, as root, in the netns lab of `scripts/lab` (see `lab_e2e.rs`): what a removal
//! the operator makes does to a live UDP stream. The removal grace is for endpoints that move
//! between EndpointSlices; a backend taken out of a static `[[services]]` entry by a reload
//! is re-steered at once.
//!
//! The times printed (`cargo test --test removal_e2e -- --nocapture`) are measurements, not
//! assertions: what is asserted is that the stream moved before the (30 s) grace could have
//! ended, which only the rule for explicit removals explains.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use common::*;

/// A datagram every 10 ms from client port 40100 to the echo service; prints the first
/// reply's backend at once, then, when 20 replies came from another backend (or after 15 s),
/// a JSON summary. Times are Unix seconds.
const STREAM: &str = r#"
import json, socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("", 40100))
s.setblocking(False)
start = time.time()
end = start + 15
sent, next_send, replies = 0, start, {}
first = last_first = first_other = None
other = 0
while time.time() < end and other < 20:
    now = time.time()
    if now >= next_send:
        s.sendto(b"%d" % sent, ("198.18.100.1", 9000))
        sent += 1
        next_send += 0.01
    try:
        while True:
            name = s.recv(2048).split(b" ")[0].decode()
            t = time.time()
            replies[name] = replies.get(name, 0) + 1
            if first is None:
                first = name
                print(name, flush=True)
            if name == first:
                last_first = t
            else:
                other += 1
                if first_other is None:
                    first_other = t
    except (BlockingIOError, ConnectionRefusedError):
        pass
    time.sleep(0.001)
print(json.dumps({"sent": sent, "replies": replies, "first": first,
                  "last_first": last_first, "first_other": first_other}), flush=True)
"#;

fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn a_reload_that_removes_a_dead_backend_resteers_its_udp_stream_at_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    // A grace far longer than the stream lasts: only an explicit removal can move it.
    let config = lab_config().replace(
        "capacity = 65536",
        "capacity = 65536\nremoval_grace = \"30s\"",
    );
    assert_ne!(config, lab_config());
    lab.start_xvs(&config);
    let pid = lab.xvs.as_ref().unwrap().id() as i32;

    let mut stream = Command::new("ip")
        .args(["netns", "exec", &lab.ns("c"), "python3", "-c", STREAM])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(stream.stdout.take().unwrap());
    let mut owner = String::new();
    out.read_line(&mut owner).unwrap();
    let owner = owner.trim().to_owned();
    assert!(
        owner.starts_with("backend-"),
        "no reply to the stream: {owner}"
    );
    let n = owner.trim_start_matches("backend-").to_owned();
    // Let the stream run a moment on its backend, then the backend dies...
    std::thread::sleep(Duration::from_millis(300));
    stop_servers(&lab, &format!("b{n}"));
    let ns = lab.ns(&format!("b{n}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !run(Command::new("ip").args(["netns", "pids", &ns]))
        .stdout
        .is_empty()
    {
        assert!(std::time::Instant::now() < deadline, "{owner} does not die");
        std::thread::sleep(Duration::from_millis(10));
    }
    // ...and the operator removes it from the echo service.
    let without = config.replacen(&format!("  {{ addr = \"198.18.1.{n}:9000\" }},\n"), "", 1);
    assert_ne!(without, config, "backend {n} not found in the echo service");
    std::fs::write(lab.dir.path().join("xvs.toml"), lab.with_state(&without)).unwrap();
    let reloaded = SystemTime::now();
    unsafe { libc::kill(pid, libc::SIGHUP) };

    let mut summary = String::new();
    out.read_to_string(&mut summary).unwrap();
    assert!(stream.wait().unwrap().success(), "{summary}");
    let v: serde_json::Value = serde_json::from_str(summary.trim()).expect(&summary);
    let moved = v["first_other"].as_f64();
    assert!(
        moved.is_some(),
        "the stream never left the removed {owner} within 15 s (the grace is 30 s): {v}"
    );
    let sent = v["sent"].as_u64().unwrap();
    let got: u64 = v["replies"]
        .as_object()
        .unwrap()
        .values()
        .map(|c| c.as_u64().unwrap())
        .sum();
    let gap = moved.unwrap() - v["last_first"].as_f64().unwrap();
    println!(
        "stream of {sent} datagrams: replies {}, lost {} (from the kill of {owner} to the re-steer); \
         silent for {:.0} ms between {owner}'s last reply and another backend's first; \
         re-steered {:.0} ms after the reload signal",
        v["replies"],
        sent - got,
        gap * 1e3,
        (moved.unwrap() - unix(reloaded)) * 1e3,
    );
    // The removal pass acted on the flow (and only on it).
    let (_, stats) = admin(&lab, "GET", "/v1/stats");
    let s: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(s["governance"]["flows_resteered"], 1, "{s}");
    lab.stop_xvs();
}
