//! Checks across keys that serde cannot express. Each rule yields `(key path, sentence)`;
//! the loader turns the path into a line and column. All problems are collected, not just
//! the first, so a user fixes a file in one pass.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use vocab::{Mode, SchedulerKind};

use crate::schema::{Config, Dataplane, SchedFlag, Service};
use crate::span::KeyPath;

pub(crate) type Found = Vec<(KeyPath, String)>;

/// Largest batch the workers handle per poll; bounds per-batch stack arrays.
pub const BATCH_SIZE_MAX: u32 = 1024;
/// Largest AF_XDP ring the kernel accepts here.
const RING_SIZE_MAX: u32 = 1 << 16;
/// Largest UMEM per socket, in frames: 4 GiB of 4096-byte frames, pinned memory.
pub const UMEM_FRAMES_MAX: u32 = 1 << 20;
/// Largest flow table `xvs` accepts: 2^30 flows (about 90 GiB). Below the flow table's own
/// limit (2^31, entry numbers in 31 bits), which the daemon checks at compile time; the memory
/// a machine has is checked by `xvs run`.
pub const FLOWS_MAX: u32 = 1 << 30;
/// Bytes a flow costs in the flow table (a 64-byte entry, an IPv6 flow two; 3.2 index words
/// of 8 bytes), to say what a capacity needs; the daemon's tests keep it honest.
pub const FLOW_BYTES: u64 = 90;
/// Largest `[flowtable] backends_max`: lb-algos' limit of backends per scheduler. Each one
/// has a connection counter and a SYN-watch word allocated at start-up.
pub const BACKENDS_MAX: u32 = 1 << 20;
/// Largest Maglev table the snapshot builder builds (lb-algos' `mh::TABLE_SIZE_MAX`).
pub const MH_TABLE_SIZE_MAX: u32 = 1 << 24;
/// Longest wrr sequence (sum of weights / their gcd) the snapshot builder builds
/// (lb-algos' `wrr::SEQUENCE_MAX`).
pub const WRR_SEQUENCE_MAX: u64 = 1 << 20;
/// Longest `idle_backoff`: a sleeping worker neither receives (a 2048-frame ring fills in
/// 20 ms at 100 kpps) nor sees the stop flag.
pub const IDLE_BACKOFF_MAX: Duration = Duration::from_millis(10);
/// Kubernetes caps sessionAffinityConfig.clientIP.timeoutSeconds at one day.
const AFFINITY_TIMEOUT_MAX_S: u64 = 86400;

pub fn validate(c: &Config) -> Found {
    let mut out = Found::new();
    out.extend(crate::address::node_addresses(c));
    dataplane(c, &mut out);
    flowtable(c, &mut out);
    timeouts(c, &mut out);
    services(c, &mut out);
    neighbours(c, &mut out);
    health(c, &mut out);
    kubernetes(c, &mut out);
    admin(c, &mut out);
    log(c, &mut out);
    synproxy(c, &mut out);
    sync(c, &mut out);
    bgp(c, &mut out);
    crate::dsr::validate(c, &mut out);
    out
}

/// Most times `[bgp] backup_prepend` may prepend the local AS: three already lose to any
/// owner's path that is not itself padded.
pub const BGP_BACKUP_PREPEND_MAX: u32 = 16;
/// AS_TRANS (RFC 6793): a placeholder in 2-byte AS fields, never a real AS.
const AS_TRANS: u32 = 23456;
/// Shortest BFD interval: BIRD runs BFD in userspace, and its documentation puts the
/// practical minimum in the tens of milliseconds.
pub const BFD_INTERVAL_MIN: Duration = Duration::from_millis(10);
/// Longest BFD interval: slower than this, BGP's own hold timer does the job.
pub const BFD_INTERVAL_MAX: Duration = Duration::from_secs(60);
/// Largest BFD multiplier: the Detect Mult field is one byte (RFC 5880).
pub const BFD_MULTIPLIER_MAX: u32 = 255;

fn bgp(c: &Config, out: &mut Found) {
    let b = &c.bgp;
    let at = |k: &str| KeyPath::of(&["bgp", k]);
    if !b.enable {
        return;
    }
    let bad_as = |n: u32| n == 0 || n == AS_TRANS;
    match b.local_as {
        Some(n) if bad_as(n) => err(
            out,
            at("local_as"),
            format!("{n} is not an AS number (0 and 23456, AS_TRANS, are reserved)"),
        ),
        Some(_) => {}
        None if !b.neighbors.is_empty() => err(
            out,
            at("local_as"),
            "required with bgp.neighbors: this node's AS number in the sessions xvs writes",
        ),
        None if b.backup_prepend > 0 && !c.bgp_backups().is_empty() => err(
            out,
            at("local_as"),
            format!(
                "required to announce the peers' SNAT addresses as backups (sync.peers[].snat_addresses): the export filter prepends it {} times (or set bgp.backup_prepend = 0)",
                b.backup_prepend
            ),
        ),
        None => {}
    }
    if b.backup_prepend > BGP_BACKUP_PREPEND_MAX {
        err(
            out,
            at("backup_prepend"),
            format!(
                "{}: at most {BGP_BACKUP_PREPEND_MAX} (3 already lose to the owner's path)",
                b.backup_prepend
            ),
        );
    }
    liveness_device(c, out);
    bfd(c, out);
    let mut seen = std::collections::BTreeSet::new();
    for (i, n) in b.neighbors.iter().enumerate() {
        let here = KeyPath::of(&["bgp", "neighbors"]).index(i);
        let a = n.address;
        if a.is_unspecified() || a.is_multicast() || a.is_loopback() {
            err(
                out,
                here.clone().key("address"),
                format!("{a}: a neighbor needs a unicast address"),
            );
        } else if !seen.insert(a) {
            err(
                out,
                here.clone().key("address"),
                format!("{a} is listed twice"),
            );
        }
        if bad_as(n.asn) {
            err(
                out,
                here.key("as"),
                format!(
                    "{} is not an AS number (0 and 23456, AS_TRANS, are reserved)",
                    n.asn
                ),
            );
        }
    }
}

/// `[bgp] liveness_device`: a device name xvs creates, safe in BIRD's config.
fn liveness_device(c: &Config, out: &mut Found) {
    let at = |k: &str| KeyPath::of(&["bgp", k]);
    let name = &c.bgp.liveness_device;
    if let Some(why) = bad_ifname(name) {
        err(
            out,
            at("liveness_device"),
            format!("{name:?} cannot be a device name: {why}"),
        );
    } else if name.contains(['"', '\\']) {
        err(
            out,
            at("liveness_device"),
            format!("{name:?}: no '\"' or '\\', it is written into BIRD's config as a string"),
        );
    } else if c.dataplane.interfaces.iter().any(|i| &i.name == name) {
        err(
            out,
            at("liveness_device"),
            format!("{name:?} is an interface of dataplane.interfaces: xvs creates this device"),
        );
    }
}

/// `[bgp] bfd_*`: what BIRD's `protocol bfd` can take.
fn bfd(c: &Config, out: &mut Found) {
    let b = &c.bgp;
    let at = |k: &str| KeyPath::of(&["bgp", k]);
    for (key, d) in [
        ("bfd_interval", b.bfd_interval),
        ("bfd_idle_tx_interval", b.bfd_idle_tx_interval),
    ] {
        let v = d.get();
        if v < BFD_INTERVAL_MIN || v > BFD_INTERVAL_MAX {
            err(
                out,
                at(key),
                format!(
                    "{d} is outside {}..={} (BIRD's practical minimum is tens of milliseconds; beyond a minute BGP's hold timer is as quick)",
                    crate::Dur(BFD_INTERVAL_MIN),
                    crate::Dur(BFD_INTERVAL_MAX)
                ),
            );
        }
    }
    if !(1..=BFD_MULTIPLIER_MAX).contains(&b.bfd_multiplier) {
        err(
            out,
            at("bfd_multiplier"),
            format!(
                "{} is outside 1..={BFD_MULTIPLIER_MAX} (BFD's Detect Mult is one byte, and 0 is invalid)",
                b.bfd_multiplier
            ),
        );
    }
}

fn sync(c: &Config, out: &mut Found) {
    let s = &c.sync;
    let at = |k: &str| KeyPath::of(&["sync", k]);
    if !s.enable {
        return;
    }
    if s.listen.is_none() {
        err(
            out,
            at("listen"),
            "required when sync.enable = true: this node's sync address (UDP), e.g. \"198.18.2.11:7946\"",
        );
    }
    if let Some(l) = s.listen
        && (l.ip().is_unspecified() || l.port() == 0)
    {
        err(
            out,
            at("listen"),
            format!(
                "{l}: flow sync needs this node's own address and a port (it is the node's id: its peers list it as theirs, and every datagram names it)"
            ),
        );
    }
    if s.key_file.is_none() {
        err(
            out,
            at("key_file"),
            "required when sync.enable = true: a file of at least 32 bytes shared by every peer",
        );
    }
    if s.peers.is_empty() {
        err(
            out,
            at("peers"),
            "empty: name the other nodes of the tier ({ address = \"IP:PORT\", snat_addresses = [...] })",
        );
    }
    sync_peers(c, out);
    let interval = s.interval.get();
    if interval < std::time::Duration::from_millis(1)
        || interval > std::time::Duration::from_secs(1)
    {
        err(
            out,
            at("interval"),
            format!("{interval:?}: must be between 1ms and 1s"),
        );
    }
    if s.refresh.get() < std::time::Duration::from_secs(1) {
        err(
            out,
            at("refresh"),
            format!("{:?}: must be at least 1s", s.refresh.get()),
        );
    }
    if s.max_messages_per_second == 0 {
        err(
            out,
            at("max_messages_per_second"),
            "0: sync could send nothing",
        );
    }
}

/// `[sync] peers`: unicast, not this node, listed once, with SNAT addresses of their own.
fn sync_peers(c: &Config, out: &mut Found) {
    let s = &c.sync;
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in s.peers.iter().enumerate() {
        let here = KeyPath::of(&["sync", "peers"]).index(i).key("address");
        if Some(p.address) == s.listen {
            err(
                out,
                here.clone(),
                format!("{} is this node's sync.listen", p.address),
            );
        }
        if p.address.ip().is_unspecified() || p.address.port() == 0 {
            err(
                out,
                here.clone(),
                format!("{}: a peer needs a unicast address and a port", p.address),
            );
        }
        if !seen.insert(p.address) {
            err(out, here, format!("{} is listed twice", p.address));
        }
        for a in &p.snat_addresses {
            if c.dataplane.snat_addresses.contains(a) {
                err(
                    out,
                    KeyPath::of(&["sync", "peers"])
                        .index(i)
                        .key("snat_addresses"),
                    format!(
                        "{a} is this node's own dataplane.snat_addresses: every node of a tier needs its own"
                    ),
                );
            }
        }
    }
}

fn synproxy(c: &Config, out: &mut Found) {
    let Some(t) = c.synproxy.auto_threshold else {
        return synproxy_services(c, out);
    };
    if t == 0 || t >= c.flowtable.capacity {
        err(
            out,
            KeyPath::of(&["synproxy", "auto_threshold"]),
            format!(
                "{t} embryonic flows: must be between 1 and flowtable.capacity - 1 ({}); use mode = \"on\" or \"off\" instead",
                c.flowtable.capacity.saturating_sub(1)
            ),
        );
    }
    synproxy_services(c, out);
}

fn synproxy_services(c: &Config, out: &mut Found) {
    for (i, s) in c.services.iter().enumerate() {
        if s.synproxy == Some(crate::schema::SynproxyMode::On) && s.protocol != vocab::Protocol::Tcp
        {
            err(
                out,
                KeyPath::of(&["services"]).index(i).key("synproxy"),
                format!(
                    "the SYN proxy is for TCP services, not {}",
                    s.protocol.name()
                ),
            );
        }
    }
}

fn err(out: &mut Found, path: KeyPath, msg: impl Into<String>) {
    out.push((path, msg.into()));
}

fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    let n = u64::from(n);
    let mut d = 2u64;
    while d * d <= n {
        if n % d == 0 {
            return false;
        }
        d += 1;
    }
    true
}

fn dataplane(c: &Config, out: &mut Found) {
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

/// Why `name` cannot be a Linux network device (the kernel's `dev_valid_name`): 1 to 15
/// bytes, not `.` or `..`, no `/`, no whitespace, no `:` (`eth0:1` is an address label, not
/// a device AF_XDP can bind), no control characters.
fn bad_ifname(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("it is empty")
    } else if name.len() > 15 {
        Some("longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("\".\" and \"..\" are not device names")
    } else if name.contains('/') {
        Some("it contains '/'")
    } else if name.contains(':') {
        Some("it contains ':' (an address label, not a device)")
    } else if name.chars().any(|ch| ch.is_whitespace() || ch.is_control()) {
        Some("it contains whitespace or a control character")
    } else {
        None
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

fn flowtable(c: &Config, out: &mut Found) {
    let ft = &c.flowtable;
    if ft.capacity == 0 || ft.capacity > FLOWS_MAX {
        let gib = |flows: u64| (flows * FLOW_BYTES) as f64 / f64::from(1u32 << 30);
        err(
            out,
            KeyPath::of(&["flowtable", "capacity"]),
            format!(
                "{} flows is outside 1..={FLOWS_MAX}: the table is allocated at start-up, {FLOW_BYTES} bytes a flow ({:.1} GiB here, {:.0} GiB at most)",
                ft.capacity,
                gib(u64::from(ft.capacity)),
                gib(u64::from(FLOWS_MAX))
            ),
        );
    }
    if ft.backends_max == 0 || ft.backends_max > BACKENDS_MAX {
        err(
            out,
            KeyPath::of(&["flowtable", "backends_max"]),
            format!(
                "{} is outside 1..={BACKENDS_MAX} (counters for every backend are allocated at start-up)",
                ft.backends_max
            ),
        );
    }
    if let Some(g) = ft.removal_grace {
        let min_sync = c
            .kubernetes
            .as_ref()
            .map_or(std::time::Duration::from_secs(1), |k| {
                k.min_sync_period.get()
            });
        if g.get() <= 2 * min_sync {
            err(
                out,
                KeyPath::of(&["flowtable", "removal_grace"]),
                format!(
                    "{g} is not longer than two min_sync_periods ({:?}): an endpoint that moves between EndpointSlices would lose its flows",
                    2 * min_sync
                ),
            );
        }
    }
    let backends: usize = c.services.iter().map(|s| s.backends.len()).sum();
    if backends > ft.backends_max as usize {
        err(
            out,
            KeyPath::of(&["flowtable", "backends_max"]),
            format!(
                "{backends} static backends exceed backends_max = {}",
                ft.backends_max
            ),
        );
    }
}

fn timeouts(c: &Config, out: &mut Found) {
    let t = &c.timeouts;
    for (key, d) in [
        ("tcp_established", t.tcp_established),
        ("tcp_syn", t.tcp_syn),
        ("tcp_syn_pressure", t.tcp_syn_pressure),
        ("tcp_fin_wait", t.tcp_fin_wait),
        ("tcp_close_wait", t.tcp_close_wait),
        ("tcp_last_ack", t.tcp_last_ack),
        ("tcp_time_wait", t.tcp_time_wait),
        ("tcp_close", t.tcp_close),
        ("udp", t.udp),
        ("icmp", t.icmp),
        ("sctp", t.sctp),
        ("fragment", t.fragment),
    ] {
        if d.get().as_secs() == 0 && d.get().subsec_millis() == 0 {
            err(
                out,
                KeyPath::of(&["timeouts", key]),
                "a timeout must be at least 1ms",
            );
        } else if d.get().as_secs() > u64::from(u32::MAX) / 1000 {
            err(
                out,
                KeyPath::of(&["timeouts", key]),
                "a timeout must be under 49 days",
            );
        }
    }
}

fn services(c: &Config, out: &mut Found) {
    let mut names = HashMap::new();
    let mut frontends = HashMap::new();
    for (i, s) in c.services.iter().enumerate() {
        let p = KeyPath::of(&["services"]).index(i);
        if s.name.is_empty() {
            err(out, p.key("name"), "a service needs a name");
        } else if let Some(first) = names.insert(s.name.as_str(), i) {
            err(
                out,
                p.key("name"),
                format!("name {:?} is already used by services[{first}]", s.name),
            );
        }
        if let Some(first) = frontends.insert((s.vip, s.port, s.protocol), i) {
            err(
                out,
                p.key("vip"),
                format!(
                    "duplicate frontend {}:{}/{}: services[{first}] already uses it",
                    fmt_ip(s.vip),
                    s.port,
                    s.protocol.name()
                ),
            );
        }
        service_settings(c, s, &p, out);
        service_backends(c, s, &p, out);
    }
}

/// One service's frontend and scheduler flags, then its policies.
fn service_settings(c: &Config, s: &Service, p: &KeyPath, out: &mut Found) {
    if s.port == 0 {
        err(out, p.key("port"), "port 0 is not a valid frontend port");
    }
    if let Some(why) = crate::special_address(s.vip) {
        err(
            out,
            p.key("vip"),
            format!("{} cannot be a virtual IP: it is {why}", s.vip),
        );
    } else if c.node.addresses.contains(&s.vip) {
        err(
            out,
            p.key("vip"),
            format!(
                "{} is this node's own address (node.addresses): a service may not take it",
                s.vip
            ),
        );
    }
    for (j, f) in s.flags.iter().enumerate() {
        if s.scheduler != SchedulerKind::Mh {
            let name = match f {
                SchedFlag::MhPort => "mh-port",
                SchedFlag::MhFallback => "mh-fallback",
            };
            err(
                out,
                p.key("flags").index(j),
                format!(
                    "flag {name} only applies to scheduler mh, not {}",
                    s.scheduler.name()
                ),
            );
        }
    }
    service_policies(c, s, p, out);
}

/// One service's affinity timeout, rate limit and forwarding mode.
fn service_policies(c: &Config, s: &Service, p: &KeyPath, out: &mut Found) {
    let default_mode = c.dataplane.mode;
    let has_snat = |v4: bool| c.dataplane.snat_addresses.iter().any(|a| a.is_ipv4() == v4);
    if let Some(t) = s.session_affinity_timeout {
        let secs = t.get().as_secs();
        if secs == 0 || secs > AFFINITY_TIMEOUT_MAX_S {
            err(
                out,
                p.key("session_affinity_timeout"),
                format!("must be between 1s and {AFFINITY_TIMEOUT_MAX_S}s (Kubernetes' limit)"),
            );
        }
    }
    match (s.new_conn_rate, s.new_conn_burst) {
        (Some(0), _) => err(
            out,
            p.key("new_conn_rate"),
            "must be at least 1 (new connections per second); remove it for no limit".to_owned(),
        ),
        (_, Some(0)) => err(
            out,
            p.key("new_conn_burst"),
            "must be at least 1".to_owned(),
        ),
        (None, Some(_)) => err(
            out,
            p.key("new_conn_burst"),
            "needs new_conn_rate (the burst of which rate?)".to_owned(),
        ),
        _ => {}
    }
    if s.mode_or(default_mode) == Mode::Fullnat && !has_snat(s.vip.is_ipv4()) {
        let family = if s.vip.is_ipv4() { "IPv4" } else { "IPv6" };
        err(
            out,
            p.key("mode"),
            format!(
                "full-NAT needs an {family} address in dataplane.snat_addresses (or mode = \"nat\")"
            ),
        );
    }
}

/// One service's backends: in the VIP's family, usable, listed once, weighted within
/// bounds, and as many as its scheduler takes.
fn service_backends(c: &Config, s: &Service, p: &KeyPath, out: &mut Found) {
    let mut backends = HashSet::new();
    for (j, b) in s.backends.iter().enumerate() {
        let bp = p.key("backends").index(j);
        if b.addr.is_ipv4() != s.vip.is_ipv4() {
            err(
                out,
                bp.key("addr"),
                format!("{} is not in the VIP's address family", b.addr),
            );
        } else if b.addr.port() == 0 {
            err(
                out,
                bp.key("addr"),
                format!("{}: port 0 is not a valid backend port", b.addr),
            );
        } else if let Some(why) = bad_backend(c, b.addr.ip()) {
            err(
                out,
                bp.key("addr"),
                format!("{} cannot be a backend: {why}", b.addr),
            );
        } else if !backends.insert(b.addr) {
            err(out, bp.key("addr"), format!("{} is listed twice", b.addr));
        }
        if b.weight > 65535 {
            err(
                out,
                bp.key("weight"),
                format!("{} is above the maximum weight 65535", b.weight),
            );
        }
    }
    if let Some(msg) = scheduler_limit(s, c.dataplane.mh_table_size) {
        err(out, p.key("backends"), msg);
    }
}

/// Why `ip` cannot be a backend's address: a special address, the node's own, or a VIP (the
/// rules the Kubernetes source applies to endpoints).
fn bad_backend(c: &Config, ip: IpAddr) -> Option<String> {
    if let Some(why) = crate::special_address(ip) {
        return Some(format!("it is {why}"));
    }
    if c.node.addresses.contains(&ip) {
        return Some("it is this node's own address (node.addresses)".to_owned());
    }
    let (i, s) = c.services.iter().enumerate().find(|(_, s)| s.vip == ip)?;
    Some(format!("it is the VIP of services[{i}] ({})", s.name))
}

/// What the snapshot builder (lb-algos) would refuse in a scheduler for these weights: a
/// wrr sequence longer than [`WRR_SEQUENCE_MAX`], or more Maglev turns per round than table
/// slots. The arithmetic is lb-algos' (`wrr::sequence`, `Maglev::build`); `xvs check` also
/// runs the builder itself.
fn scheduler_limit(s: &crate::schema::Service, mh_table_size: u32) -> Option<String> {
    fn gcd(mut a: u64, mut b: u64) -> u64 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
    let weights = || s.backends.iter().map(|b| u64::from(b.weight.min(65535)));
    match s.scheduler {
        SchedulerKind::Wrr => {
            let g = weights().filter(|&w| w > 0).fold(0, gcd);
            let len: u64 = if g == 0 {
                0
            } else {
                weights().map(|w| w / g).sum()
            };
            (len > WRR_SEQUENCE_MAX).then(|| {
                format!(
                    "the wrr sequence (sum of weights / their gcd) has {len} entries, above {WRR_SEQUENCE_MAX}: reduce the weights or their spread"
                )
            })
        }
        SchedulerKind::Mh if is_prime(mh_table_size) && mh_table_size <= MH_TABLE_SIZE_MAX => {
            let fallback = s.has_flag(SchedFlag::MhFallback);
            let members: Vec<u64> = weights().filter(|&w| fallback || w > 0).collect();
            if !weights().any(|w| w > 0) {
                return None;
            }
            let g = members.iter().fold(0, |g, &w| gcd(g, w)).max(1);
            let max_reduced = members.iter().max().copied().unwrap_or(0) / g;
            let shift =
                (64 - max_reduced.leading_zeros()).saturating_sub(mh_table_size.ilog2() / 2);
            let round: u64 = members.iter().map(|&w| ((w / g) >> shift).max(1)).sum();
            (round > u64::from(mh_table_size)).then(|| {
                format!(
                    "{round} Maglev turns per round (backends x reduced weights) exceed dataplane.mh_table_size {mh_table_size}: some backends would get no slot; raise mh_table_size (about 100 x backends)"
                )
            })
        }
        _ => None,
    }
}

fn fmt_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    }
}

fn neighbours(c: &Config, out: &mut Found) {
    let mut seen = HashMap::new();
    for (i, n) in c.neighbours.iter().enumerate() {
        let p = KeyPath::of(&["neighbours"]).index(i);
        if let Some(first) = seen.insert(n.ip, i) {
            err(
                out,
                p.key("ip"),
                format!("{} already has neighbours[{first}]", n.ip),
            );
        }
        if n.mac.0[0] & 1 == 1 || n.mac.0 == [0; 6] {
            err(out, p.key("mac"), format!("{} is not a unicast MAC", n.mac));
        }
    }
}

fn health(c: &Config, out: &mut Found) {
    let h = &c.health;
    let at = |k: &str| KeyPath::of(&["health", k]);
    if h.interval.get().is_zero() {
        err(out, at("interval"), "must be positive");
    }
    if h.timeout.get().is_zero() || h.timeout > h.interval {
        err(
            out,
            at("timeout"),
            "must be positive and no longer than interval",
        );
    }
    if h.rise == 0 {
        err(out, at("rise"), "must be at least 1");
    }
    if h.fall == 0 {
        err(out, at("fall"), "must be at least 1");
    }
    if let Err(e) = crate::health::check_path(&h.http_path) {
        err(out, at("http_path"), e);
    }
    if let Err(e) = crate::health::check_statuses(&h.http_status) {
        err(out, at("http_status"), e);
    }
    for (i, s) in c.services.iter().enumerate() {
        let at = |k: &str| KeyPath::of(&["services"]).index(i).key("health").key(k);
        let own = &s.health;
        if own.port == Some(0) {
            err(out, at("port"), "port 0 cannot be probed");
        }
        if let Some(p) = &own.http_path
            && let Err(e) = crate::health::check_path(p)
        {
            err(out, at("http_path"), e);
        }
        if let Some(st) = &own.http_status
            && let Err(e) = crate::health::check_statuses(st)
        {
            err(out, at("http_status"), e);
        }
        if own.http_status.as_ref().is_some_and(Vec::is_empty) {
            err(
                out,
                at("http_status"),
                "an empty list takes no status; leave the key out for any 2xx or 3xx",
            );
        }
        for (key, v) in [("rise", own.rise), ("fall", own.fall)] {
            if v == Some(0) {
                err(out, at(key), "must be at least 1");
            }
        }
    }
}

fn kubernetes(c: &Config, out: &mut Found) {
    let Some(k) = &c.kubernetes else { return };
    let at = |key: &str| KeyPath::of(&["kubernetes", key]);
    if k.min_sync_period > k.sync_period {
        err(
            out,
            at("min_sync_period"),
            "must not be longer than sync_period",
        );
    }
    if k.sync_period.get().is_zero() {
        err(out, at("sync_period"), "must be positive");
    }
    if k.service_cidrs.len() > crate::SERVICE_CIDRS_MAX {
        err(
            out,
            at("service_cidrs"),
            format!(
                "{} CIDRs: at most {} (with the ServiceCIDR objects' together)",
                k.service_cidrs.len(),
                crate::SERVICE_CIDRS_MAX
            ),
        );
    }
    for (i, cidr) in k.service_cidrs.iter().enumerate() {
        let own = c
            .node
            .addresses
            .iter()
            .chain(&c.dataplane.snat_addresses)
            .find(|a| cidr.contains(**a));
        if let Some(a) = own {
            err(
                out,
                at("service_cidrs").index(i),
                format!(
                    "{cidr} contains {} (one of this node's own addresses: [node] addresses, [dataplane] snat_addresses): packets to it would be dropped",
                    fmt_ip(*a)
                ),
            );
        }
    }
    if !c.services.is_empty() {
        err(
            out,
            KeyPath::of(&["services"]),
            "[[services]] is the static source; remove it or remove [kubernetes]",
        );
    }
}

fn admin(c: &Config, out: &mut Found) {
    let a = &c.admin;
    let at = |k: &str| KeyPath::of(&["admin", k]);
    let (listen, healthz) = (a.listen, a.healthz_listen());
    // Identical addresses mean one listener serves both.
    if listen != healthz && overlap(listen, healthz) {
        err(
            out,
            at("healthz_listen"),
            format!(
                "{healthz} overlaps admin.listen {listen}: both cannot be bound; give them different ports, or the same address to serve both on one listener"
            ),
        );
    }
    if let Some(metrics) = a.metrics_listen {
        // A listener of its own: even the same address as another would serve that one's
        // endpoints, which is what it exists to keep apart.
        for (key, other) in [("listen", listen), ("healthz_listen", healthz)] {
            if metrics == other || overlap(metrics, other) {
                err(
                    out,
                    at("metrics_listen"),
                    format!(
                        "{metrics} overlaps admin.{key} {other}: both cannot be bound; give metrics_listen a port of its own"
                    ),
                );
            }
        }
    }
    if let Some(socket) = &a.socket
        && (!socket.is_absolute() || socket.file_name().is_none())
    {
        err(
            out,
            at("socket"),
            format!("{} is not an absolute path to a file", socket.display()),
        );
    }
}

/// Whether binding `a` and `b` collides: the same port on the same address, or on an address
/// and the wildcard of its family (port 0 asks for a fresh port each time).
fn overlap(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Levels a `[log] level` filter may name.
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

fn log(c: &Config, out: &mut Found) {
    let level = c.log.level.trim();
    let bad = |item: &str| -> Option<String> {
        let (target, lvl) = match item.split_once('=') {
            Some((t, l)) => (Some(t.trim()), l.trim()),
            None => (None, item.trim()),
        };
        let target_ok = target.is_none_or(|t| {
            !t.is_empty()
                && t.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | ':' | '-'))
        });
        let level_ok = LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(lvl));
        (!(target_ok && level_ok)).then(|| item.to_owned())
    };
    let problems: Vec<String> = if level.is_empty() {
        vec![String::new()]
    } else {
        level.split(',').filter_map(bad).collect()
    };
    if let Some(first) = problems.first() {
        err(
            out,
            KeyPath::of(&["log", "level"]),
            format!(
                "{first:?} is not a log filter item: use a level ({}) or target=level, separated by commas",
                LOG_LEVELS.join(", ")
            ),
        );
    }
}
