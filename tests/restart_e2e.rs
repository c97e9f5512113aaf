//! Flows outlive the process, end to end, as root: real clients in the netns lab keep their
//! connections, UDP flows and ClientIP affinity while xvs is stopped (SIGTERM) or killed
//! (SIGKILL) and started again at once, in full-NAT and in NAT, over IPv4 and IPv6; a new
//! flow-table capacity imports the flows at a graceful restart.
//!
//! Every scenario builds its own lab (its own state directory and pins) and removes it on
//! every exit path.

mod common;

use std::process::{Command, Output};
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;

/// The lab config for restarts: a SIGTERM stops at once (a restart, not a node leaving).
fn restart_config(mode: &str) -> String {
    lab_config()
        .replace("mode = \"fullnat\"", &format!("mode = \"{mode}\""))
        .replace("batch_size = 64", "batch_size = 64\ndrain_timeout = \"0s\"")
}

/// The bytes `GET /bytes/N` of a lab backend returns.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| i as u8).collect()
}

/// A rate-limited download of `bytes` from `url` in the client namespace, in the background.
fn download(lab: &Lab, url: &str, bytes: usize, rate: &str) -> JoinHandle<Output> {
    let ns = lab.ns("c");
    let url = format!("{url}/bytes/{bytes}");
    let rate = rate.to_owned();
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
            .args(["--limit-rate", &rate, &url])
            .output()
            .unwrap()
    })
}

fn check_download(out: Output, bytes: usize, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), bytes, "{what}: length");
    assert!(out.stdout == pattern(bytes), "{what}: corrupted body");
}

/// SIGTERM (`graceful`) or SIGKILL, then start again at once.
fn restart(lab: &mut Lab, config: &str, graceful: bool) {
    let mut child = lab.xvs.take().expect("xvs runs");
    if graceful {
        // SAFETY: our child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    } else {
        child.kill().unwrap();
    }
    let status = child.wait().unwrap();
    if graceful {
        assert!(status.success(), "xvs exited with {status}");
    }
    lab.start_xvs(config);
}

#[test]
fn downloads_survive_sigterm_and_sigkill_in_both_modes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let bytes = 3 << 20;
    for mode in ["fullnat", "nat"] {
        let config = restart_config(mode);
        lab.start_xvs(&config);
        for graceful in [true, false] {
            let what = format!("{mode}, {}", if graceful { "SIGTERM" } else { "SIGKILL" });
            // rr spreads them over the backends; both families.
            let downloads: Vec<_> = ["http://198.18.100.1", "http://[2001:2:0:100::1]"]
                .iter()
                .flat_map(|url| (0..2).map(move |_| url))
                .map(|url| (url.to_string(), download(&lab, url, bytes, "1M")))
                .collect();
            std::thread::sleep(Duration::from_millis(1200));
            restart(&mut lab, &config, graceful);
            for (url, d) in downloads {
                check_download(d.join().unwrap(), bytes, &format!("{what}: {url}"));
            }
        }
        lab.stop_xvs();
    }
}

/// A UDP client that sends a datagram every 10 ms from each of `ports` for `secs` seconds and
/// prints, per port, the backends that answered (in order, deduplicated).
fn udp_client(lab: &Lab, ports: &[u16], secs: f64) -> JoinHandle<Output> {
    let ns = lab.ns("c");
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let script = format!(
        r#"
import socket, time
ports = [{ports}]
socks = []
for p in ports:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("", p))
    s.setblocking(False)
    socks.append(s)
seen = {{p: [] for p in ports}}
end = time.time() + {secs}
while time.time() < end:
    for p, s in zip(ports, socks):
        s.sendto(b"x", ("198.18.100.1", 9000))
    time.sleep(0.01)
    for p, s in zip(ports, socks):
        try:
            while True:
                who = s.recv(2048).split()[0].decode()
                if not seen[p] or seen[p][-1] != who:
                    seen[p].append(who)
        except BlockingIOError:
            pass
for p in ports:
    print(p, " ".join(seen[p]))
"#,
        ports = ports.join(",")
    );
    std::thread::spawn(move || {
        Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-c", &script])
            .output()
            .unwrap()
    })
}

#[test]
fn udp_flows_and_client_affinity_keep_their_backends_across_restarts() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    // The echo service round-robin (lab.toml's is Maglev, which would pick the same
    // backend without any state), and a web service with ClientIP affinity.
    let config = restart_config("fullnat").replace(
        "scheduler = \"mh\"\nflags = [\"mh-port\"]",
        "scheduler = \"rr\"",
    ) + "\n[[services]]\nname = \"sticky\"\nvip = \"198.18.100.1\"\nport = 81\nprotocol = \"tcp\"\nscheduler = \"rr\"\nsession_affinity_timeout = \"1h\"\nbackends = [{ addr = \"198.18.1.1:8080\" }, { addr = \"198.18.1.2:8080\" }, { addr = \"198.18.1.3:8080\" }]\n";
    lab.start_xvs(&config);
    // Move the round-robin cursors off the first backend, so that a restart that lost the
    // state (cursors back at the first backend) would be seen.
    lab.udp("198.18.100.1", 9000, 41000, "warm");
    lab.exec("c", &["ip", "addr", "add", "198.18.0.3/24", "dev", "c0"]);
    // The node learns the new address's MAC (xvs solicits backends and gateways, not
    // on-link clients: the kernel must know them).
    let ping = lab.exec("x", &["ping", "-c", "1", "-W", "2", "198.18.0.3"]);
    assert!(ping.status.success());
    let other = lab.curl("http://198.18.100.1:81/", &["--interface", "198.18.0.3"]);
    let sticky = String::from_utf8(lab.curl("http://198.18.100.1:81/", &[]))
        .unwrap()
        .trim()
        .to_owned();
    assert_ne!(String::from_utf8(other).unwrap().trim(), sticky);
    // 100 datagrams/s from three ports, across a SIGTERM and a SIGKILL restart.
    let ports = [41001, 41002, 41003];
    let client = udp_client(&lab, &ports, 6.0);
    std::thread::sleep(Duration::from_millis(1500));
    restart(&mut lab, &config, true);
    std::thread::sleep(Duration::from_millis(1500));
    restart(&mut lab, &config, false);
    let out = client.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8(out.stdout).unwrap();
    let mut backends = Vec::new();
    for line in report.lines() {
        let seen: Vec<&str> = line.split_whitespace().skip(1).collect();
        assert_eq!(seen.len(), 1, "a UDP flow changed backend: {line}");
        backends.push(seen[0].to_owned());
    }
    assert_eq!(backends.len(), 3, "{report}");
    // New connections of the sticky client still go to its backend.
    for _ in 0..3 {
        let b = String::from_utf8(lab.curl("http://198.18.100.1:81/", &[]))
            .unwrap()
            .trim()
            .to_owned();
        assert_eq!(b, sticky, "ClientIP affinity lost across restarts");
    }
    lab.stop_xvs();
}

#[test]
fn a_new_flow_table_capacity_imports_the_flows_at_a_graceful_restart() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let config = restart_config("fullnat");
    lab.start_xvs(&config);
    let bytes = 3 << 20;
    let downloads: Vec<_> = (0..3)
        .map(|_| download(&lab, "http://198.18.100.1", bytes, "1M"))
        .collect();
    std::thread::sleep(Duration::from_millis(1200));
    // The next process has another capacity: its table cannot be the old one's memory.
    let bigger = config.replace("capacity = 65536", "capacity = 131072");
    assert_ne!(bigger, config);
    restart(&mut lab, &bigger, true);
    for (i, d) in downloads.into_iter().enumerate() {
        check_download(d.join().unwrap(), bytes, &format!("download {i}"));
    }
    let out = lab.stop_xvs();
    assert!(out.contains("flows_live="), "{out}");
}
