//! A SYN flood against the lab's fullnat web service (netns, root): 200,000 SYNs from spoofed
//! sources in 198.18.0.0/16, sent from the client namespace through an AF_PACKET socket at
//! 150 kpps (bounded in count and time), while a real client keeps opening HTTP
//! connections through xvs, during the flood and after it, and downloads opened before it
//! keep running. At least 99 % of the new connections must succeed, every download must
//! complete intact, and the counters must say which defence acted: with the SYN proxy off,
//! pressure handling (half-open flows give way); with it on, cookies (the flood makes no
//! flow).
//!
//! Before pressure handling, the flood's half-open flows held every SNAT port for
//! `tcp_syn` (60 s): every new connection failed for a minute.

mod common;

use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use fastpath::wire::checksum;

const FLOOD: u32 = 200_000;
/// Legitimate connections tried during and after the flood, at least.
const MIN_TRIES: u32 = 100;
const FLOOD_MAX_TIME: Duration = Duration::from_secs(20);
/// The rate: the issue's flood ran at about 140 kpps; unpaced, an AF_PACKET socket sends
/// ~900 kpps here, of which copy-mode AF_XDP on a veth takes in about a quarter, so pacing
/// makes more of the flood reach xvs.
const FLOOD_PPS: f64 = 150_000.0;

/// The MAC of interface `dev` in namespace `ns`.
fn mac_of(lab: &Lab, which: &str, dev: &str) -> [u8; 6] {
    let o = lab.exec(which, &["cat", &format!("/sys/class/net/{dev}/address")]);
    let s = String::from_utf8(o.stdout).unwrap();
    let mut mac = [0u8; 6];
    for (b, x) in mac.iter_mut().zip(s.trim().split(':')) {
        *b = u8::from_str_radix(x, 16).unwrap();
    }
    mac
}

/// A SYN frame from `src`:`sport` to the web VIP, with valid checksums.
fn syn_frame(dst_mac: [u8; 6], src: [u8; 4], sport: u16, seq: u32) -> Vec<u8> {
    let vip = [198, 18, 100, 1];
    let mut f = Vec::with_capacity(54);
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&vip);
    let c = checksum::checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02;
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let c = checksum::l4_checksum_v4(&src, &vip, 6, &tcp);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&tcp);
    f
}

/// Sends the flood from the client namespace's `c0` on a thread that joined that namespace;
/// returns (frames sent, seconds taken).
fn flood(lab: &Lab, dst_mac: [u8; 6]) -> std::thread::JoinHandle<(u32, f64)> {
    let ns = format!("/var/run/netns/{}", lab.ns("c"));
    std::thread::spawn(move || {
        let nsf = std::fs::File::open(&ns).unwrap();
        // SAFETY: setns on this thread only; the fd is valid.
        assert_eq!(
            unsafe { libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET) },
            0,
            "setns {ns}"
        );
        // SAFETY: plain socket/ioctl/bind calls with valid arguments.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                i32::from((libc::ETH_P_ALL as u16).to_be()),
            )
        };
        assert!(fd >= 0, "AF_PACKET socket");
        let ifindex = unsafe { libc::if_nametoindex(c"c0".as_ptr()) };
        assert!(ifindex > 0);
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        let r = unsafe {
            libc::bind(
                fd,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(r, 0, "bind c0");
        // Spoofed sources 198.18.2.0-198.18.99.255: inside 198.18.0.0/16, clear of the
        // client (198.18.0.2), the node's and the backends' subnets and the VIPs.
        let frames: Vec<Vec<u8>> = (0..FLOOD)
            .map(|i| {
                let h = i.wrapping_mul(0x9e37_79b9);
                let src = [198, 18, 2 + (h >> 24) as u8 % 98, (h >> 16) as u8];
                syn_frame(dst_mac, src, 1024 + (h % 60_000) as u16, h)
            })
            .collect();
        let start = Instant::now();
        let mut sent = 0;
        for (i, f) in frames.iter().enumerate() {
            if start.elapsed() > FLOOD_MAX_TIME {
                break;
            }
            // Paced to FLOOD_PPS in bursts of 1,000.
            if i % 1000 == 0 {
                let due = start + Duration::from_secs_f64(i as f64 / FLOOD_PPS);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let n = unsafe { libc::send(fd, f.as_ptr().cast(), f.len(), 0) };
            if n == f.len() as isize {
                sent += 1;
            }
        }
        let took = start.elapsed().as_secs_f64();
        unsafe { libc::close(fd) };
        (sent, took)
    })
}

/// A client in the client namespace opening one HTTP connection after another to the web VIP
/// for `secs` seconds, and on until it has tried [`MIN_TRIES`] (for at most 3 × `secs`), each
/// with a 5 s budget, as a user's client would retransmit its SYN; prints `ok failed`.
fn clients(lab: &Lab, secs: f64) -> std::thread::JoinHandle<(u32, u32)> {
    let script = format!(
        r#"
import socket, time
start = time.time()
end = start + {secs}
# At least MIN_TRIES connections, for a failure rate worth its name: a debug build of xvs
# under a flood on a small machine serves fewer in {secs} s (bounded: 3x the time).
hard_end = start + 3 * {secs}
ok = failed = 0
while time.time() < end or (ok + failed < {min_tries} and time.time() < hard_end):
    try:
        s = socket.create_connection(("198.18.100.1", 80), timeout=5)
        s.settimeout(5)
        s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            d = s.recv(4096)
            if not d:
                break
            data += d
        s.close()
        if b"backend-" in data:
            ok += 1
        else:
            failed += 1
    except Exception:
        failed += 1
    time.sleep(0.005)
print(ok, failed)
"#,
        min_tries = MIN_TRIES,
    );
    let ns = lab.ns("c");
    std::thread::spawn(move || {
        let o = Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-c", &script])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let mut it = out.split_whitespace().map(|x| x.parse::<u32>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    })
}

fn stats(lab: &Lab) -> serde_json::Value {
    let (code, body) = admin(lab, "GET", "/v1/stats");
    assert_eq!(code, "200", "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The flood against `config`; returns `/v1/stats` after it.
fn flood_run(config: &str) -> serde_json::Value {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    // The spoofed sources are reached through the client's side (as an edge node's flood
    // arrives from, and is answered through, its upstream router); the client namespace
    // drops what is not for it.
    let o = lab.exec(
        "x",
        &["ip", "route", "add", "198.18.0.0/16", "via", "198.18.0.2"],
    );
    assert!(o.status.success(), "{o:?}");
    lab.start_xvs(config);
    // Warm up: the node knows the client's MAC, every backend answers.
    check_rr(&lab, "http://198.18.100.1/");
    let xvs_mac = mac_of(&lab, "x", "xvs-c0");

    // Downloads open before the flood, running through it (3 MiB at 300 KiB/s: ~10 s).
    let downloads: Vec<_> = (0..3)
        .map(|_| slow_download(&lab, 3 << 20, "300K"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    let client = clients(&lab, 8.0);
    std::thread::sleep(Duration::from_millis(500));
    let (sent, took) = flood(&lab, xvs_mac).join().unwrap();
    eprintln!(
        "flood: {sent} SYNs in {took:.2} s ({:.0} pps)",
        f64::from(sent) / took
    );
    assert!(sent >= FLOOD * 9 / 10, "the flood was sent: {sent}");
    let (ok, failed) = client.join().unwrap();
    let after = stats(&lab);
    eprintln!(
        "clients: {ok} ok, {failed} failed; flowtable {}",
        after["flowtable"]
    );
    assert!(
        ok + failed >= MIN_TRIES,
        "enough connections tried: {ok} + {failed}"
    );
    assert!(
        failed * 100 <= ok + failed,
        "{failed} of {} new connections failed during and after the flood",
        ok + failed
    );
    for d in downloads {
        let o = d.join().unwrap();
        assert!(
            o.status.success(),
            "a download open before the flood failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(o.stdout.len(), 3 << 20, "the download is complete");
    }
    lab.stop_xvs();
    after
}

/// The lab's config with `[synproxy] mode`.
fn with_synproxy(mode: &str) -> String {
    format!("{}\n[synproxy]\nmode = \"{mode}\"\n", lab_config())
}

/// The sum of a per-worker counter of `/v1/stats`.
fn workers_sum(stats: &serde_json::Value, key: &str) -> u64 {
    stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w[key].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn legitimate_clients_get_through_a_syn_flood_by_pressure_handling() {
    let after = flood_run(&with_synproxy("off"));
    let ft = &after["flowtable"];
    assert!(
        ft["gave_way"].as_u64().unwrap() > 0,
        "half-open flows gave way: {ft}"
    );
    assert_eq!(workers_sum(&after, "synproxy_syns"), 0, "no SYN proxy");
}

#[test]
fn legitimate_clients_get_through_a_syn_flood_by_the_syn_proxy() {
    let after = flood_run(&with_synproxy("on"));
    let ft = &after["flowtable"];
    // Every SYN was answered with a cookie: the flood made no flow, took no SNAT port.
    assert!(
        workers_sum(&after, "synproxy_syns") >= u64::from(FLOOD) / 4,
        "{after}"
    );
    assert!(workers_sum(&after, "synproxy_acks") > 0, "{after}");
    assert_eq!(ft["gave_way"].as_u64().unwrap(), 0, "{ft}");
    assert!(ft["inserted"].as_u64().unwrap() < 10_000, "{ft}");
}
