//! Rejects end to end (root, the netns lab of `scripts/lab`): a client of a service without
//! endpoints is refused at once, as kube-proxy refuses it: curl's TCP connect fails with
//! "connection refused" (exit 7, the time it took printed, not asserted), a UDP socket gets
//! the ICMP port unreachable as `ConnectionRefusedError`, IPv4 and IPv6; a burst over the
//! worker's reject rate limit is dropped, and both are counted in `/metrics`.

mod common;

use std::time::Instant;

use common::*;

/// The lab with a TCP, a UDP and an IPv6 TCP service without backends, and a reject rate
/// limit a test can exceed (10 a second, bursts of 5).
fn config() -> String {
    let base = lab_config();
    assert!(base.contains("\nbatch_size = 64\n"), "the lab config moved");
    base.replacen(
        "\nbatch_size = 64\n",
        "\nbatch_size = 64\nreject_rate = 10\nreject_burst = 5\n",
        1,
    ) + r#"
[[services]]
name = "empty"
vip = "198.18.100.99"
port = 80
protocol = "tcp"

[[services]]
name = "emptyudp"
vip = "198.18.100.99"
port = 53
protocol = "udp"

[[services]]
name = "empty6"
vip = "2001:2:0:100::99"
port = 80
protocol = "tcp"
"#
}

/// The samples of `family` in this lab's `/metrics`, by their `reason` label.
fn reasons(lab: &Lab, family: &str) -> std::collections::BTreeMap<String, u64> {
    let (code, body) = admin(lab, "GET", "/metrics");
    assert_eq!(code, "200", "{body}");
    body.lines()
        .filter_map(|l| l.strip_prefix(&format!("{family}{{reason=\"")))
        .filter_map(|rest| {
            let (reason, value) = rest.split_once("\"} ")?;
            Some((reason.to_owned(), value.trim().parse::<f64>().ok()? as u64))
        })
        .collect()
}

/// UDP from the client to `addr:port`, connected so the ICMP error reaches the socket:
/// "refused" when it raised `ConnectionRefusedError`, "timeout" when nothing came.
fn udp_refused(lab: &Lab, addr: &str, port: u16) -> String {
    let script = format!(
        "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.settimeout(3)\n\
         s.connect(('{addr}',{port}))\ns.send(b'hello')\n\
         try:\n  s.recv(100)\n  print('answered')\n\
         except ConnectionRefusedError:\n  print('refused')\n\
         except socket.timeout:\n  print('timeout')\n"
    );
    let o = lab.exec("c", &["python3", "-c", &script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap().trim().to_owned()
}

#[test]
fn a_service_without_endpoints_refuses_at_once_and_rejects_are_rate_limited() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    lab.start_xvs(&config());
    // A served VIP still works (and the client's and node's neighbours are warm).
    assert!(!lab.udp("198.18.100.1", 9000, 41000, "ping").is_empty());

    for url in ["http://198.18.100.99/", "http://[2001:2:0:100::99]/"] {
        let t0 = Instant::now();
        let o = lab.exec(
            "c",
            &["curl", "-v", "--max-time", "10", "--retry", "0", url],
        );
        let took = t0.elapsed();
        let err = String::from_utf8_lossy(&o.stderr);
        let why = err.lines().find(|l| l.contains("failed")).unwrap_or("");
        eprintln!(
            "curl {url}: exit {:?} after {took:?}: {why}",
            o.status.code()
        );
        assert_eq!(o.status.code(), Some(7), "not a timeout: {err}");
        // (curl -v names the errno: ECONNREFUSED, not an unreachable network.)
        assert!(err.contains("Connection refused"), "{err}");
    }
    let t0 = Instant::now();
    assert_eq!(udp_refused(&lab, "198.18.100.99", 53), "refused");
    eprintln!("UDP refused after {:?}", t0.elapsed());
    let rejects = reasons(&lab, "xvs_rejects_total");
    assert!(rejects["no_endpoints"] >= 3, "{rejects:?}");
    assert_eq!(rejects["unserved_port"], 0, "{rejects:?}");

    // A burst of 40 datagrams over the limit (5 at once, 10 a second): most are dropped,
    // every one counted as a reject or a limited one.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let before = (
        reasons(&lab, "xvs_rejects_total")["no_endpoints"],
        reasons(&lab, "xvs_drops_total")["reject_rate_limited"],
    );
    let burst = "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
                 for i in range(40): s.sendto(b'x',('198.18.100.99',53))\n";
    let o = lab.exec("c", &["python3", "-c", burst]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let delta = loop {
        let d = (
            reasons(&lab, "xvs_rejects_total")["no_endpoints"] - before.0,
            reasons(&lab, "xvs_drops_total")["reject_rate_limited"] - before.1,
        );
        if d.0 + d.1 >= 40 || Instant::now() > deadline {
            break d;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    eprintln!(
        "burst of 40: {} rejected, {} over the limit",
        delta.0, delta.1
    );
    assert_eq!(
        delta.0 + delta.1,
        40,
        "every datagram counted once: {delta:?}"
    );
    assert!(delta.0 >= 1 && delta.1 >= 20, "{delta:?}");
    let out = lab.stop_xvs();
    assert!(out.contains("reject_no_endpoints="), "{out}");
    assert!(out.contains("drop_reject_rate_limited="), "{out}");
}

/// A ClusterIP (from the Kubernetes source, the lab's fake API server) rejects the ports
/// and protocols its Service does not serve, through the real steering program: a TCP
/// connect is refused, a UDP datagram gets the port unreachable; its own ports still work.
#[test]
fn a_clusterip_refuses_the_ports_its_service_does_not_serve() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up();
    let kubeconfig = lab.dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:16443\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\nusers:\n- name: fake\n  user: {}\ncurrent-context: fake\n",
    )
    .unwrap();
    let lab_toml = lab_config();
    let dataplane_and_rest =
        &lab_toml[lab_toml.find("[dataplane]").unwrap()..lab_toml.find("[[services]]").unwrap()];
    let config = format!(
        "[node]\nname = \"xvs-lab\"\naddresses = [\"198.18.0.1\"]\n{dataplane_and_rest}\n[kubernetes]\nkubeconfig = \"{}\"\nmin_sync_period = \"100ms\"\n{}",
        kubeconfig.display(),
        &lab_toml[lab_toml.find("[[neighbours]]").unwrap()..]
    );
    let mut api = std::process::Command::new("ip")
        .args(["netns", "exec", &lab.ns("x"), "python3"])
        .arg(root().join("tests/assets/fake-kube-api.py"))
        .arg("16443")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    lab.start_xvs(&config);
    // Served: the Service's own port (once the first model is in).
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    while !lab
        .exec(
            "c",
            &["curl", "-sS", "--max-time", "1", "http://198.18.100.1/"],
        )
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "the ClusterIP never served");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let t0 = Instant::now();
    let o = lab.exec(
        "c",
        &["curl", "-v", "--max-time", "10", "http://198.18.100.1:81/"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!(
        "curl to an unserved port: exit {:?} after {:?}",
        o.status.code(),
        t0.elapsed()
    );
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert!(err.contains("Connection refused"), "{err}");
    assert_eq!(udp_refused(&lab, "198.18.100.1", 53), "refused");
    let rejects = reasons(&lab, "xvs_rejects_total");
    assert_eq!(rejects["unserved_port"], 2, "{rejects:?}");
    let _ = api.kill();
    let _ = api.wait();
    lab.stop_xvs();
}
