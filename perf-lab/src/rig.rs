//! The netns rig, the shape of `scripts/lab`:
//!
//! ```text
//!   P-c   client     c0      198.18.0.2/24    02:00:00:00:00:02   (generator; sources 198.18.0.16-239)
//!     | veth
//!   P-x   LB node    xvs-c0  198.18.0.1/24    02:00:00:00:00:01
//!                    xvs-b0  198.18.1.254/24  02:00:00:00:01:fe
//!     | veth  up0 ── br0 (P-s) ── p1..pN
//!   P-bI  backend I  b0      198.18.1.I/24    02:00:00:00:01:<I>   (sink or reflector)
//! ```
//!
//! Every veth has `queues` tx and rx queues. Checksum offload is off on every sender, neighbours
//! are static (the sinks' AF_XDP sockets take every frame, ARP included, so nothing would
//! answer ARP), and the LB node forwards nothing until a target enables it.
//! [`Rig::down`] removes every namespace (killing what still runs inside) and is idempotent;
//! [`RigGuard`] calls it on drop, so every exit path tears the rig down.

use std::net::Ipv4Addr;

use anyhow::{Context, bail};

use crate::sys::{ip_batch, run, sh_in};

/// Most backends the addressing plan allows (198.18.1.1..=200).
pub const BACKENDS_MAX: u16 = 200;
/// The service VIP.
pub const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 1);
/// The client's own address (the generator varies sources around it).
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The LB node's client-side address.
pub const LB_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The LB node's backend-side address (the full-NAT / masquerade source).
pub const LB_BACKEND_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 254);
/// Client MAC.
pub const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
/// LB client-side MAC.
pub const LB_CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
/// LB backend-side MAC.
pub const LB_BACKEND_MAC: [u8; 6] = [2, 0, 0, 0, 1, 0xfe];
/// Interface names inside the namespaces.
pub const IF_CLIENT: &str = "c0";
/// LB client side.
pub const IF_LB_CLIENT: &str = "xvs-c0";
/// LB backend side.
pub const IF_LB_BACKEND: &str = "xvs-b0";
/// Backend side.
pub const IF_BACKEND: &str = "b0";
/// The port every backend listens on.
pub const BACKEND_PORT: u16 = 9000;

/// Backend `i`'s (1-based) address.
pub fn backend_ip(i: u16) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 1, i as u8)
}

/// Backend `i`'s (1-based) MAC.
pub fn backend_mac(i: u16) -> [u8; 6] {
    [2, 0, 0, 0, 1, i as u8]
}

/// `aa:bb:..` text of a MAC.
pub fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A bpffs outside /sys (which `ip netns exec` remounts), where xvs pins its steering.
pub const LAB_BPFFS: &str = "/run/xvs-bpf";

/// A rig's shape and names.
#[derive(Clone, Debug)]
pub struct Rig {
    /// Namespace name prefix.
    pub prefix: String,
    /// Backends.
    pub backends: u16,
    /// Queues per veth.
    pub queues: u16,
}

impl Rig {
    /// A rig description; checks the sizes.
    pub fn new(prefix: &str, backends: u16, queues: u16) -> anyhow::Result<Rig> {
        if backends == 0 || backends > BACKENDS_MAX {
            bail!("--backends must be 1..={BACKENDS_MAX}");
        }
        if queues == 0 || queues > 64 {
            bail!("--queues must be 1..=64");
        }
        if prefix.is_empty()
            || prefix.len() > 10
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            bail!("--prefix must be 1-10 characters of [A-Za-z0-9-]");
        }
        Ok(Rig {
            prefix: prefix.to_owned(),
            backends,
            queues,
        })
    }

    /// Client namespace.
    pub fn ns_client(&self) -> String {
        format!("{}-c", self.prefix)
    }
    /// LB namespace.
    pub fn ns_lb(&self) -> String {
        format!("{}-x", self.prefix)
    }
    /// Switch namespace.
    pub fn ns_switch(&self) -> String {
        format!("{}-s", self.prefix)
    }
    /// Backend `i` (1-based) namespace.
    pub fn ns_backend(&self, i: u16) -> String {
        format!("{}-b{i}", self.prefix)
    }

    /// Every namespace of the rig.
    pub fn namespaces(&self) -> Vec<String> {
        let mut v = vec![self.ns_client(), self.ns_lb(), self.ns_switch()];
        v.extend((1..=self.backends).map(|i| self.ns_backend(i)));
        v
    }

    /// Removes every namespace of the rig that exists (also any backend beyond
    /// `self.backends` left by a bigger rig of the same prefix), killing what runs inside.
    pub fn down(&self) -> anyhow::Result<()> {
        let list = run(&["ip", "netns", "list"])?;
        let ours: Vec<String> = list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| self.is_ours(n))
            .map(str::to_owned)
            .collect();
        for ns in &ours {
            if let Ok(pids) = run(&["ip", "netns", "pids", ns]) {
                for pid in pids.split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: kill has no memory preconditions.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
        }
        for ns in &ours {
            // xvs's pinned steering, kept per network namespace (by its inode).
            if let Ok(meta) = std::fs::metadata(format!("/var/run/netns/{ns}")) {
                use std::os::unix::fs::MetadataExt;
                let pins = format!("{LAB_BPFFS}/xvs/ns-{}", meta.ino());
                let _ = std::fs::remove_dir_all(pins);
            }
            let _ = run(&["ip", "netns", "del", ns]);
        }
        Ok(())
    }

    fn is_ours(&self, name: &str) -> bool {
        let Some(rest) = name
            .strip_prefix(&self.prefix)
            .and_then(|r| r.strip_prefix('-'))
        else {
            return false;
        };
        matches!(rest, "c" | "x" | "s")
            || rest
                .strip_prefix('b')
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    }

    /// Creates the rig (after removing any leftover of the same prefix). On failure the
    /// partial rig is removed.
    pub fn up(&self) -> anyhow::Result<()> {
        self.down()?;
        let r = self.try_up();
        if r.is_err() {
            let _ = self.down();
        }
        r
    }

    fn try_up(&self) -> anyhow::Result<()> {
        // xvs pins its steering on a bpffs; `ip netns exec` hides /sys/fs/bpf.
        if run(&["mountpoint", "-q", LAB_BPFFS]).is_err() {
            std::fs::create_dir_all(LAB_BPFFS)?;
            run(&["mount", "-t", "bpf", "bpf", LAB_BPFFS])?;
        }
        let (c, x, s) = (self.ns_client(), self.ns_lb(), self.ns_switch());
        let q = self.queues.to_string();
        let qs = ["numtxqueues", &q, "numrxqueues", &q];
        for ns in self.namespaces() {
            run(&["ip", "netns", "add", &ns])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        let veth = |a: &str, ans: &str, b: &str, bns: &str| -> anyhow::Result<()> {
            let mut argv = vec!["ip", "link", "add", a, "netns", ans];
            argv.extend(qs);
            argv.extend(["type", "veth", "peer", "name", b, "netns", bns]);
            argv.extend(qs);
            run(&argv).map(|_| ())
        };
        veth(IF_LB_CLIENT, &x, IF_CLIENT, &c)?;
        veth(IF_LB_BACKEND, &x, "up0", &s)?;
        run(&["ip", "-n", &s, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &s, "link", "set", "up0", "master", "br0", "up"])?;
        for i in 1..=self.backends {
            let b = self.ns_backend(i);
            let port = format!("p{i}");
            veth(IF_BACKEND, &b, &port, &s)?;
            run(&["ip", "-n", &s, "link", "set", &port, "master", "br0", "up"])?;
            run(&[
                "ip",
                "-n",
                &b,
                "link",
                "set",
                IF_BACKEND,
                "address",
                &mac_str(backend_mac(i)),
            ])?;
            run(&[
                "ip",
                "-n",
                &b,
                "addr",
                "add",
                &format!("{}/24", backend_ip(i)),
                "dev",
                IF_BACKEND,
            ])?;
            run(&["ip", "-n", &b, "link", "set", IF_BACKEND, "up"])?;
            run(&[
                "ip",
                "-n",
                &b,
                "route",
                "add",
                "default",
                "via",
                &LB_BACKEND_IP.to_string(),
            ])?;
            sh_in(&b, &format!("ethtool -K {IF_BACKEND} tx off >/dev/null"))?;
        }
        run(&["ip", "-n", &s, "link", "set", "br0", "up"])?;

        run(&[
            "ip",
            "-n",
            &c,
            "link",
            "set",
            IF_CLIENT,
            "address",
            &mac_str(CLIENT_MAC),
        ])?;
        run(&[
            "ip",
            "-n",
            &c,
            "addr",
            "add",
            &format!("{CLIENT_IP}/24"),
            "dev",
            IF_CLIENT,
        ])?;
        run(&["ip", "-n", &c, "link", "set", IF_CLIENT, "up"])?;
        run(&[
            "ip",
            "-n",
            &c,
            "route",
            "add",
            "198.18.100.0/24",
            "via",
            &LB_CLIENT_IP.to_string(),
        ])?;
        run(&[
            "ip",
            "-n",
            &c,
            "neigh",
            "replace",
            &LB_CLIENT_IP.to_string(),
            "lladdr",
            &mac_str(LB_CLIENT_MAC),
            "dev",
            IF_CLIENT,
            "nud",
            "permanent",
        ])?;
        sh_in(&c, &format!("ethtool -K {IF_CLIENT} tx off >/dev/null"))?;

        run(&[
            "ip",
            "-n",
            &x,
            "link",
            "set",
            IF_LB_CLIENT,
            "address",
            &mac_str(LB_CLIENT_MAC),
        ])?;
        run(&[
            "ip",
            "-n",
            &x,
            "link",
            "set",
            IF_LB_BACKEND,
            "address",
            &mac_str(LB_BACKEND_MAC),
        ])?;
        run(&[
            "ip",
            "-n",
            &x,
            "addr",
            "add",
            &format!("{LB_CLIENT_IP}/24"),
            "dev",
            IF_LB_CLIENT,
        ])?;
        run(&[
            "ip",
            "-n",
            &x,
            "addr",
            "add",
            &format!("{LB_BACKEND_IP}/24"),
            "dev",
            IF_LB_BACKEND,
        ])?;
        for ifname in [IF_LB_CLIENT, IF_LB_BACKEND] {
            run(&["ip", "-n", &x, "link", "set", ifname, "up"])?;
            sh_in(&x, &format!("ethtool -K {ifname} tx off >/dev/null"))?;
        }
        for i in 1..=self.backends {
            run(&[
                "ip",
                "-n",
                &x,
                "neigh",
                "replace",
                &backend_ip(i).to_string(),
                "lladdr",
                &mac_str(backend_mac(i)),
                "dev",
                IF_LB_BACKEND,
                "nud",
                "permanent",
            ])?;
        }
        // Generator sources 198.18.0.16-239 all live behind the client's MAC.
        let lines: String = (2..=254u8)
            .map(|h| {
                format!(
                    "neigh replace 198.18.0.{h} lladdr {} dev {IF_LB_CLIENT} nud permanent\n",
                    mac_str(CLIENT_MAC)
                )
            })
            .collect();
        ip_batch(&x, &lines).context("static client neighbours")?;
        // Forwarding stays off until a kernel target turns it on; the saturation loop sends
        // client-sourced packets in on the backend side, so no reverse-path filter, and no
        // redirects for packets that leave by the interface they came in on.
        sh_in(
            &x,
            "sysctl -qw net.ipv4.ip_forward=0 net.ipv4.conf.all.rp_filter=0 \
             net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.all.send_redirects=0 && \
             for i in xvs-c0 xvs-b0; do sysctl -qw net.ipv4.conf.$i.rp_filter=0 \
             net.ipv4.conf.$i.send_redirects=0; done",
        )?;
        Ok(())
    }

    /// Writes `mask` (hex CPU mask) to every rx queue's rps_cpus of the LB node's veths.
    pub fn set_lb_rps(&self, mask: &str) -> anyhow::Result<()> {
        sh_in(
            &self.ns_lb(),
            &format!(
                "for f in /sys/class/net/{IF_LB_CLIENT}/queues/rx-*/rps_cpus \
                 /sys/class/net/{IF_LB_BACKEND}/queues/rx-*/rps_cpus; do echo {mask} > $f; done"
            ),
        )
        .map(|_| ())
    }
}

/// Tears a rig down when dropped (every exit path, panics included).
pub struct RigGuard(pub Rig);

impl Drop for RigGuard {
    fn drop(&mut self) {
        if let Err(e) = self.0.down() {
            eprintln!("perf-lab: tearing down rig {}: {e:#}", self.0.prefix);
        }
    }
}
