//! The include file xvs writes for BIRD 2: a pure function of `[bgp]`, the liveness device
//! and the [`Announcement`].
//!
//! What it defines (names bird.conf may rely on):
//! - `protocol static xvs4` and `protocol static xvs6`: one host route per announced address
//!   (`/32`, `/128`), `via "<liveness device>"`. Both always exist, empty when nothing is
//!   announced, so bird.conf can name them.
//! - `filter xvs_export`: accepts the routes of `xvs4` and `xvs6`, rejects everything else;
//!   backups (peers' SNAT addresses) get the local AS prepended `backup_prepend` times.
//! - With `[bgp] neighbors`: `protocol bfd xvs_bfd` (when a neighbour wants BFD), whose
//!   sessions, direct (`interface "*"`) or multihop, take `[bgp] bfd_interval`,
//!   `bfd_idle_tx_interval` and `bfd_multiplier`; and one `protocol bgp xvs_<address>` per
//!   neighbour, exporting with `xvs_export`, importing nothing; an IPv4 neighbour carries the
//!   IPv4 routes, an IPv6 one the IPv6 routes.
//! - `router id`, when `[bgp] router_id` is set (the last one BIRD reads wins).
//!
//! It needs `protocol device` in bird.conf (BIRD learns the liveness device through it).
//! BIRD refuses an IPv4 and an IPv6 prefix in one set, so the filter tests each family
//! against its own set.

use std::fmt::Write as _;
use std::net::IpAddr;

use super::announce::{Announcement, RouteKind};

/// The first line of every file xvs writes.
pub const HEADER: &str = "# Written by xvs for BIRD 2: do not edit.";

/// The include file for `bgp`, announcing `a` through device `device`.
pub fn render(bgp: &config::Bgp, a: &Announcement) -> String {
    let device = &bgp.liveness_device;
    let mut s = String::new();
    let _ = writeln!(s, "{HEADER}");
    s.push_str(
        "# xvs rewrites this file (aside, then renamed over it) and asks BIRD to reconfigure\n\
         # whenever what it announces changes. Every route points at the liveness device, which\n\
         # exists only while xvs runs and is ready to serve: when xvs exits, the kernel removes\n\
         # the device and BIRD withdraws the routes. bird.conf must have `protocol device`.\n",
    );
    let _ = writeln!(
        s,
        "# Announced: {} VIP(s), {} SNAT address(es), {} backup(s).",
        a.count(RouteKind::Vip),
        a.count(RouteKind::Snat),
        a.count(RouteKind::Backup)
    );
    if let Some(id) = bgp.router_id {
        let _ = writeln!(s, "\nrouter id {id};");
    }
    for (name, v6) in [("xvs4", false), ("xvs6", true)] {
        let _ = writeln!(
            s,
            "\nprotocol static {name} {{\n  {};",
            if v6 { "ipv6" } else { "ipv4" }
        );
        for (ip, kind) in a.family(v6) {
            let _ = writeln!(
                s,
                "  route {ip}/{} via \"{device}\"; # {}",
                if v6 { 128 } else { 32 },
                kind.name()
            );
        }
        s.push_str("}\n");
    }
    export_filter(&mut s, bgp, a);
    neighbors(&mut s, bgp);
    s
}

fn export_filter(s: &mut String, bgp: &config::Bgp, a: &Announcement) {
    let prepend = match bgp.local_as {
        Some(asn) if bgp.backup_prepend > 0 => Some(asn),
        _ => None,
    };
    s.push_str("\n# xvs's routes; backups (peers' SNAT addresses) made worse");
    match prepend {
        Some(asn) => {
            let _ = writeln!(s, ": AS {asn} prepended {} times.", bgp.backup_prepend);
        }
        None => s.push_str(": not (no local_as, or backup_prepend = 0).\n"),
    }
    s.push_str("filter xvs_export {\n  if proto != \"xvs4\" && proto != \"xvs6\" then reject;\n");
    if let Some(asn) = prepend {
        for (v6, net_type) in [(false, "NET_IP4"), (true, "NET_IP6")] {
            let set: Vec<String> = a
                .family(v6)
                .filter(|(_, k)| *k == RouteKind::Backup)
                .map(|(ip, _)| host_prefix(ip))
                .collect();
            if set.is_empty() {
                continue;
            }
            let _ = writeln!(
                s,
                "  if (net.type = {net_type}) && (net ~ [ {} ]) then {{",
                set.join(", ")
            );
            for _ in 0..bgp.backup_prepend {
                let _ = writeln!(s, "    bgp_path.prepend({asn});");
            }
            s.push_str("  }\n");
        }
    }
    s.push_str("  accept;\n}\n");
}

fn neighbors(s: &mut String, bgp: &config::Bgp) {
    if bgp.neighbors.is_empty() {
        return;
    }
    let Some(local_as) = bgp.local_as else {
        // Validation requires local_as with neighbours; without it there is no session.
        return;
    };
    if bgp.neighbors.iter().any(|n| n.bfd) {
        bfd(s, bgp);
    }
    for n in &bgp.neighbors {
        let channel = if n.address.is_ipv6() { "ipv6" } else { "ipv4" };
        let _ = writeln!(
            s,
            "\nprotocol bgp {} {{\n  description \"xvs: {}\";\n  local as {local_as};\n  neighbor {} as {};",
            protocol_name(n.address),
            n.address,
            n.address,
            n.asn
        );
        if n.bfd {
            s.push_str("  bfd on;\n");
        }
        // Back within seconds once a failed link or router returns (BIRD's default waits
        // 60 s after an error before it tries again).
        s.push_str("  error wait time 1, 5;\n  connect delay time 1;\n  connect retry time 5;\n");
        let _ = writeln!(
            s,
            "  {channel} {{\n    import none;\n    export filter xvs_export;\n    next hop self;\n  }};\n}}"
        );
    }
}

/// `protocol bfd xvs_bfd`: the same session options for direct and multihop sessions.
fn bfd(s: &mut String, bgp: &config::Bgp) {
    let ms = |d: config::Dur| d.get().as_millis();
    let options = format!(
        "interval {} ms;\n    idle tx interval {} ms;\n    multiplier {};",
        ms(bgp.bfd_interval),
        ms(bgp.bfd_idle_tx_interval),
        bgp.bfd_multiplier
    );
    let _ = writeln!(
        s,
        "\n# BFD for the sessions below: detection after {} x {} without a packet.\nprotocol bfd xvs_bfd {{\n  interface \"*\" {{\n    {options}\n  }};\n  multihop {{\n    {options}\n  }};\n}}",
        bgp.bfd_multiplier, bgp.bfd_interval
    );
}

/// `ip` as a host prefix.
fn host_prefix(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

/// The BGP protocol's name for a neighbour: `xvs_` and its address with `.` and `:` as `_`.
pub fn protocol_name(ip: IpAddr) -> String {
    let mut n = String::from("xvs_");
    n.extend(ip.to_string().chars().map(|c| match c {
        '.' | ':' => '_',
        c => c,
    }));
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn announcement() -> Announcement {
        let mut a = Announcement::default();
        for (addr, kind) in [
            ("198.18.100.1", RouteKind::Vip),
            ("198.18.3.1", RouteKind::Snat),
            ("198.18.3.2", RouteKind::Backup),
            ("2001:2:0:100::1", RouteKind::Vip),
            ("2001:2:0:3::2", RouteKind::Backup),
        ] {
            a.routes.insert(ip(addr), kind);
        }
        a
    }

    #[test]
    fn routes_filter_and_sessions() {
        let bgp = config::Bgp {
            enable: true,
            local_as: Some(65001),
            router_id: Some("198.18.2.11".parse().unwrap()),
            neighbors: vec![
                config::BgpNeighbor {
                    address: ip("198.18.2.1"),
                    asn: 65000,
                    bfd: true,
                },
                config::BgpNeighbor {
                    address: ip("2001:2:0:2::1"),
                    asn: 65000,
                    bfd: false,
                },
            ],
            backup_prepend: 2,
            ..config::Bgp::default()
        };
        let text = render(&bgp, &announcement());
        let body: String = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(text.starts_with(HEADER));
        assert!(text.contains("# Announced: 2 VIP(s), 1 SNAT address(es), 2 backup(s)."));
        let want = r#"
router id 198.18.2.11;

protocol static xvs4 {
  ipv4;
  route 198.18.3.1/32 via "xvs-live"; # snat
  route 198.18.3.2/32 via "xvs-live"; # backup
  route 198.18.100.1/32 via "xvs-live"; # vip
}

protocol static xvs6 {
  ipv6;
  route 2001:2:0:3::2/128 via "xvs-live"; # backup
  route 2001:2:0:100::1/128 via "xvs-live"; # vip
}

filter xvs_export {
  if proto != "xvs4" && proto != "xvs6" then reject;
  if (net.type = NET_IP4) && (net ~ [ 198.18.3.2/32 ]) then {
    bgp_path.prepend(65001);
    bgp_path.prepend(65001);
  }
  if (net.type = NET_IP6) && (net ~ [ 2001:2:0:3::2/128 ]) then {
    bgp_path.prepend(65001);
    bgp_path.prepend(65001);
  }
  accept;
}

protocol bfd xvs_bfd {
  interface "*" {
    interval 100 ms;
    idle tx interval 1000 ms;
    multiplier 5;
  };
  multihop {
    interval 100 ms;
    idle tx interval 1000 ms;
    multiplier 5;
  };
}

protocol bgp xvs_198_18_2_1 {
  description "xvs: 198.18.2.1";
  local as 65001;
  neighbor 198.18.2.1 as 65000;
  bfd on;
  error wait time 1, 5;
  connect delay time 1;
  connect retry time 5;
  ipv4 {
    import none;
    export filter xvs_export;
    next hop self;
  };
}

protocol bgp xvs_2001_2_0_2__1 {
  description "xvs: 2001:2:0:2::1";
  local as 65001;
  neighbor 2001:2:0:2::1 as 65000;
  error wait time 1, 5;
  connect delay time 1;
  connect retry time 5;
  ipv6 {
    import none;
    export filter xvs_export;
    next hop self;
  };
}
"#;
        assert_eq!(body, want);
    }

    #[test]
    fn bfd_keys_set_every_session_of_the_bfd_protocol() {
        let neighbor = |bfd| config::BgpNeighbor {
            address: ip("198.18.2.1"),
            asn: 65000,
            bfd,
        };
        let bgp = config::Bgp {
            enable: true,
            local_as: Some(65001),
            neighbors: vec![neighbor(true)],
            bfd_interval: config::Dur::from_millis(50),
            bfd_idle_tx_interval: config::Dur::from_millis(2500),
            bfd_multiplier: 3,
            ..config::Bgp::default()
        };
        let text = render(&bgp, &Announcement::default());
        let want = "protocol bfd xvs_bfd {\n  interface \"*\" {\n    interval 50 ms;\n    idle tx interval 2500 ms;\n    multiplier 3;\n  };\n  multihop {\n    interval 50 ms;\n    idle tx interval 2500 ms;\n    multiplier 3;\n  };\n}\n";
        assert!(text.contains(want), "{text}");
        assert!(text.contains("detection after 3 x 50ms"), "{text}");
        assert!(text.contains("  bfd on;\n"), "{text}");
        // No neighbour wants BFD: no BFD protocol, whatever the keys say.
        let bgp = config::Bgp {
            neighbors: vec![neighbor(false)],
            ..bgp
        };
        let text = render(&bgp, &Announcement::default());
        assert!(!text.contains("bfd"), "{text}");
    }

    #[test]
    fn operator_owned_sessions_and_nothing_announced() {
        let bgp = config::Bgp {
            enable: true,
            liveness_device: "live0".to_owned(),
            ..config::Bgp::default()
        };
        let text = render(&bgp, &Announcement::default());
        assert!(
            text.contains("protocol static xvs4 {\n  ipv4;\n}\n"),
            "{text}"
        );
        assert!(
            text.contains("protocol static xvs6 {\n  ipv6;\n}\n"),
            "{text}"
        );
        assert!(text.contains("filter xvs_export {"), "{text}");
        assert!(!text.contains("protocol bgp") && !text.contains("router id"));
        assert!(!text.contains("bgp_path.prepend"));
        // No local AS: backups are announced unprepended (validation allows this only with
        // backup_prepend = 0).
        let text = render(&bgp, &announcement());
        assert!(text.contains("via \"live0\"") && !text.contains("bgp_path.prepend"));
    }
}
