//! `[dataplane]`: paths and limits, rings and UMEM, the Maglev table and idle back-off, the
//! interfaces and their cores, the SNAT addresses and ports.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use super::{Found, bad_ifname, err, is_prime};
use crate::schema::{Config, Dataplane};
use crate::span::KeyPath;

/// Largest batch the workers handle per poll; bounds per-batch stack arrays.
pub const BATCH_SIZE_MAX: u32 = 1024;
/// Largest AF_XDP ring the kernel accepts here.
const RING_SIZE_MAX: u32 = 1 << 16;
/// Largest UMEM per socket, in frames: 4 GiB of 4096-byte frames, pinned memory.
pub const UMEM_FRAMES_MAX: u32 = 1 << 20;
/// Largest Maglev table the snapshot builder builds (lb-algos' `mh::TABLE_SIZE_MAX`).
pub const MH_TABLE_SIZE_MAX: u32 = 1 << 24;
/// Longest `idle_backoff`: a sleeping worker neither receives (a 2048-frame ring fills in
/// 20 ms at 100 kpps) nor sees the stop flag.
pub const IDLE_BACKOFF_MAX: Duration = Duration::from_millis(10);

pub(super) fn dataplane(c: &Config, out: &mut Found) {
    let dp = &c.dataplane;
    dataplane_paths_and_limits(dp, out);
    dataplane_memory(dp, out);
    dataplane_tables(dp, out);
    dataplane_interfaces_and_cores(dp, out);
    dataplane_snat(c, out);
}

/// `[dataplane]`'s paths, reject burst and restart hold.
fn dataplane_paths_and_limits(dp: &Dataplane, out: &mut Found) {
    let at = |k: &str| KeyPath::of(&["dataplane", k]);
    if !dp.state_dir.is_absolute() {
        err(
            out,
            at("state_dir"),
            format!("{} is not an absolute path", dp.state_dir.display()),
        );
    }
    if !dp.bpf_pin_root.is_absolute() {
        err(
            out,
            at("bpf_pin_root"),
            format!("{} is not an absolute path", dp.bpf_pin_root.display()),
        );
    }
    if dp.reject_burst == 0 {
        err(
            out,
            at("reject_burst"),
            "must be at least 1 (reject_rate = 0 turns rejects off)",
        );
    }
    if dp.restart_hold.get() > std::time::Duration::from_secs(3600) {
        err(
            out,
            at("restart_hold"),
            "at most 1h: a node whose xvs does not come back drops VIP traffic that long",
        );
    }
}

/// `[dataplane]`'s rings, batch, UMEM and frames.
fn dataplane_memory(dp: &Dataplane, out: &mut Found) {
    let at = |k: &str| KeyPath::of(&["dataplane", k]);
    for (key, v) in [
        ("rx_ring_size", dp.rx_ring_size),
        ("tx_ring_size", dp.tx_ring_size),
    ] {
        if !v.is_power_of_two() || v > RING_SIZE_MAX {
            err(
                out,
                at(key),
                format!("{v} is not a power of two between 1 and {RING_SIZE_MAX}"),
            );
        }
    }
    if !dp.batch_size.is_power_of_two() || dp.batch_size > BATCH_SIZE_MAX {
        err(
            out,
            at("batch_size"),
            format!(
                "batch size {} is not a power of two between 1 and {BATCH_SIZE_MAX}",
                dp.batch_size
            ),
        );
    } else if dp.batch_size > dp.rx_ring_size.min(dp.tx_ring_size) {
        err(
            out,
            at("batch_size"),
            "batch size is larger than the rx or tx ring",
        );
    }
    if !dp.umem_frames.is_power_of_two() {
        err(
            out,
            at("umem_frames"),
            format!("{} is not a power of two", dp.umem_frames),
        );
    } else if u64::from(dp.umem_frames) < u64::from(dp.rx_ring_size) + u64::from(dp.tx_ring_size) {
        err(
            out,
            at("umem_frames"),
            format!(
                "{} frames cannot fill the rx ring ({}) and the tx ring ({}) at once",
                dp.umem_frames, dp.rx_ring_size, dp.tx_ring_size
            ),
        );
    }
    if dp.frame_size != 2048 && dp.frame_size != 4096 {
        err(
            out,
            at("frame_size"),
            format!("{} is not 2048 or 4096", dp.frame_size),
        );
    }
    if dp.umem_frames > UMEM_FRAMES_MAX {
        err(
            out,
            at("umem_frames"),
            format!(
                "{} frames are above the maximum {UMEM_FRAMES_MAX} ({} GiB of pinned memory per socket)",
                dp.umem_frames,
                (u64::from(dp.umem_frames) * u64::from(dp.frame_size)) >> 30
            ),
        );
    }
}

/// `[dataplane]`'s Maglev table and idle back-off.
fn dataplane_tables(dp: &Dataplane, out: &mut Found) {
    let at = |k: &str| KeyPath::of(&["dataplane", k]);
    if dp.mh_table_size > MH_TABLE_SIZE_MAX {
        err(
            out,
            at("mh_table_size"),
            format!(
                "{} is above the largest Maglev table, {MH_TABLE_SIZE_MAX} slots (try 65537)",
                dp.mh_table_size
            ),
        );
    } else if !is_prime(dp.mh_table_size) {
        err(
            out,
            at("mh_table_size"),
            format!("{} is not prime (try 65537)", dp.mh_table_size),
        );
    }
    if let Some(d) = dp.idle_backoff
        && d.get() > IDLE_BACKOFF_MAX
    {
        err(
            out,
            at("idle_backoff"),
            format!(
                "{d} is above the maximum {IDLE_BACKOFF_MAX:?}: a sleeping worker neither receives (its ring overflows) nor sees a stop signal"
            ),
        );
    }
}

/// `[dataplane]`'s interfaces, their workers' cores and the slowpath's core.
fn dataplane_interfaces_and_cores(dp: &Dataplane, out: &mut Found) {
    let at = |k: &str| KeyPath::of(&["dataplane", k]);
    let mut names = HashSet::new();
    for (i, ifc) in dp.interfaces.iter().enumerate() {
        let p = at("interfaces").index(i);
        if let Some(why) = bad_ifname(&ifc.name) {
            err(
                out,
                p.key("name"),
                format!("{:?} is not a valid interface name: {why}", ifc.name),
            );
        } else if !names.insert(&ifc.name) {
            err(
                out,
                p.key("name"),
                format!("interface {} is listed twice", ifc.name),
            );
        }
        if ifc.queues == 0 {
            err(
                out,
                p.key("queues"),
                "an interface needs at least one queue",
            );
        }
    }
    if !dp.interfaces.is_empty() && !dp.cores.is_set() {
        err(
            out,
            at("cores"),
            "interfaces are listed but no cores to run their workers on",
        );
    }
    let mut seen = HashSet::new();
    for (i, core) in dp.cores.listed().iter().enumerate() {
        if !seen.insert(core) {
            err(
                out,
                at("cores").index(i),
                format!("core {core} is listed twice"),
            );
        }
    }
    if let Some(sc) = dp.slowpath_core
        && dp.cores.listed().contains(&sc)
    {
        err(
            out,
            at("slowpath_core"),
            format!("core {sc} also runs a fastpath worker"),
        );
    }
}

/// `[dataplane]`'s SNAT addresses and ports.
fn dataplane_snat(c: &Config, out: &mut Found) {
    let dp = &c.dataplane;
    let at = |k: &str| KeyPath::of(&["dataplane", k]);
    let mut snat = HashSet::new();
    for (i, a) in dp.snat_addresses.iter().enumerate() {
        if let Some(why) = bad_snat(c, *a) {
            err(
                out,
                at("snat_addresses").index(i),
                format!("{a} cannot be a full-NAT source address: {why}"),
            );
        } else if !snat.insert(a) {
            err(
                out,
                at("snat_addresses").index(i),
                format!("{a} is listed twice"),
            );
        }
    }
    let workers = dp.workers().max(1) as u32;
    if dp.snat_port_range.len() / workers < 64 {
        err(
            out,
            at("snat_port_range"),
            format!(
                "{} ports leave fewer than 64 per worker for {workers} workers",
                dp.snat_port_range.len()
            ),
        );
    }
}

/// Why `a` cannot be a full-NAT source: backends answer to it, so it must be a unicast
/// address they can route to, and not an address xvs already forwards to or for.
fn bad_snat(c: &Config, a: IpAddr) -> Option<String> {
    let why = match a {
        _ if a.is_unspecified() => "it is the unspecified address",
        _ if a.is_loopback() => "it is a loopback address",
        _ if a.is_multicast() => "it is a multicast address",
        IpAddr::V4(v4) if v4.is_broadcast() => "it is the broadcast address",
        IpAddr::V4(v4) if v4.is_link_local() => {
            "it is link-local (169.254.0.0/16): backends off the link cannot answer it"
        }
        IpAddr::V6(v6) if v6.is_unicast_link_local() => {
            "it is link-local (fe80::/10): backends off the link cannot answer it"
        }
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
            "it is an IPv4-mapped IPv6 address; list the IPv4 address"
        }
        _ => {
            for (i, s) in c.services.iter().enumerate() {
                if s.vip == a {
                    return Some(format!("it is the VIP of services[{i}] ({})", s.name));
                }
                if let Some(j) = s.backends.iter().position(|b| b.addr.ip() == a) {
                    return Some(format!(
                        "it is the address of services[{i}].backends[{j}] ({})",
                        s.name
                    ));
                }
            }
            return None;
        }
    };
    Some(why.to_owned())
}
