//! The XDP steering program (`bpf/steer.c`) and its loader.
//!
//! One [`Steering`] per interface. It loads the program, removes any xvs program an earlier
//! run left attached the legacy (netlink) way, and attaches through a `bpf_link`, so the kernel
//! detaches the program when the process dies: a crash leaves nothing behind and the kernel
//! goes on forwarding non-VIP traffic.
//!
//! The program redirects to the receiving queue's AF_XDP socket only the frames xvs owns, as
//! described by the maps this type keeps in step with the snapshot (see [`maps`] for layouts):
//! frames to a frontend (VIP:port/proto), to a SNAT address within the port range, from a
//! backend (nat-mode replies), later fragments to a VIP or SNAT address, ICMP errors about
//! xvs traffic, and IPv6 with extension headers to a VIP or SNAT address. Everything else,
//! including malformed frames, gets `XDP_PASS`. A matched frame on a queue with no registered
//! socket is passed too (counted `no_socket`), except while a restart hold runs
//! ([`Steering::set_hold`]): then it is dropped (counted `held`), so that while no xvs runs
//! the kernel does not answer xvs's frames with RSTs that would kill the flows the next xvs
//! adopts. That is the only frame the program ever drops.
//!
//! Map updates are full replaces done as insert-new-then-delete-gone, so an entry present in
//! both the old and the new set is never missing, not even for one packet.

mod counters;
pub mod maps;
mod netlink;

use std::collections::HashSet;
use std::ffi::CString;
use std::hash::Hash;
use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;

use aya::maps::{Array, HashMap, MapData, MapError, PerCpuArray, XskMap};
use aya::programs::links::FdLink;
use aya::programs::{ProgramError, Xdp};
use aya::{Ebpf, EbpfError, Pod};

use counters::Counter;
pub use counters::SteerCounters;
use maps::{AddrKey, Hold, PortKey, PortRange};

/// The program's name in the kernel (what `ip link` and `bpftool` show).
pub const PROGRAM_NAME: &str = "xvs_steer";

/// The compiled program, built by `build.rs` from `bpf/steer.c`.
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.o"));

/// How the steering program got attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttach {
    /// In the driver (`XDP_FLAGS_DRV_MODE`).
    Native,
    /// In the generic network stack (`XDP_FLAGS_SKB_MODE`).
    Generic,
}

impl XdpAttach {
    fn aya_mode(self) -> aya::programs::XdpMode {
        match self {
            XdpAttach::Native => aya::programs::XdpMode::Driver,
            XdpAttach::Generic => aya::programs::XdpMode::Skb,
        }
    }

    fn name(self) -> &'static str {
        match self {
            XdpAttach::Native => "native",
            XdpAttach::Generic => "generic",
        }
    }
}

/// What went wrong while loading, attaching or updating the steering program.
#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    /// The interface name does not resolve to an index.
    #[error("interface {ifname} not found: {source} (check [dataplane] interfaces)")]
    NoInterface {
        /// The interface name.
        ifname: String,
        /// The lookup error.
        source: io::Error,
    },
    /// Querying or clearing a leftover XDP program over netlink failed.
    #[error(
        "removing a leftover xvs XDP program from {ifname} failed: {source} (is another xvs \
         running on it? `ip link set dev {ifname} xdp off` removes it by hand)"
    )]
    Leftover {
        /// The interface name.
        ifname: String,
        /// The netlink error.
        source: io::Error,
    },
    /// Parsing the embedded object or creating its maps failed.
    #[error(
        "loading the XDP steering program failed: {0} (xvs needs root, or CAP_BPF, \
         CAP_NET_ADMIN and CAP_PERFMON)"
    )]
    Load(#[from] EbpfError),
    /// The embedded object lacks a program or map the loader expects.
    #[error(
        "the embedded XDP object lacks `{0}`: fastpath was built from a mismatched bpf/steer.c"
    )]
    Missing(&'static str),
    /// The kernel refused the program (verifier or permissions).
    #[error(
        "the kernel refused the XDP steering program: {0} (kernel too old, or missing CAP_BPF?)"
    )]
    Verify(#[source] ProgramError),
    /// Attaching the program to the interface failed.
    #[error(
        "attaching XDP to {ifname} in {mode} mode failed: {source} (is the interface up, and \
         is no other XDP program attached? try xdp_mode = \"generic\")"
    )]
    Attach {
        /// The interface name.
        ifname: String,
        /// "native" or "generic".
        mode: &'static str,
        /// The kernel's answer.
        source: ProgramError,
    },
    /// The kernel attached through netlink instead of a `bpf_link`.
    #[error(
        "the kernel attached XDP to {ifname} without a bpf_link, so a crash would leave it \
         behind; xvs needs Linux 5.9 or later"
    )]
    NoLink {
        /// The interface name.
        ifname: String,
    },
    /// An AF_XDP socket was registered for a queue beyond the XSKMAP.
    #[error(
        "queue {queue} is beyond the {max} queues the steering program serves; use fewer queues"
    )]
    Queue {
        /// The queue id.
        queue: u32,
        /// The XSKMAP size.
        max: u32,
    },
    /// A SNAT port range with `lo > hi`.
    #[error("SNAT port range {lo}-{hi} is empty; give the lower port first")]
    PortRange {
        /// Lower end.
        lo: u16,
        /// Upper end.
        hi: u16,
    },
    /// More entries than a map holds.
    #[error(
        "BPF map `{map}` holds at most {max} entries but the update needs {needed}; \
         reduce the number of services or backends"
    )]
    Capacity {
        /// The map.
        map: &'static str,
        /// Entries needed while replacing (old ∪ new).
        needed: usize,
        /// The map's capacity.
        max: usize,
    },
    /// A BPF map update or read failed.
    #[error("updating BPF map `{map}` failed: {source}")]
    Map {
        /// The map.
        map: &'static str,
        /// The kernel's answer.
        source: MapError,
    },
}

/// A BPF hash map mirrored by the entries xvs put in it.
struct Mirrored<K, V: Pod> {
    name: &'static str,
    max: usize,
    map: HashMap<MapData, K, V>,
    /// What the map holds.
    entries: std::collections::HashMap<K, V>,
}

impl<K: Pod + Eq + Hash, V: Pod + PartialEq> Mirrored<K, V> {
    fn new(ebpf: &mut Ebpf, name: &'static str, max: usize) -> Result<Self, SteerError> {
        let map = ebpf.take_map(name).ok_or(SteerError::Missing(name))?;
        let map = HashMap::try_from(map).map_err(|source| SteerError::Map { map: name, source })?;
        Ok(Mirrored {
            name,
            max,
            map,
            entries: std::collections::HashMap::new(),
        })
    }

    /// Makes the map hold exactly `entries`: inserts (or overwrites) first, then deletes
    /// what is gone, so a key in both sets is present throughout. Entries already there with
    /// the same value cost no syscall, so a publish that changes one Service among 10,000
    /// touches only its keys.
    fn replace(&mut self, entries: &[(K, V)]) -> Result<(), SteerError> {
        self.check(entries)?;
        let new: HashSet<K> = entries.iter().map(|(k, _)| *k).collect();
        for (k, v) in entries {
            if self.entries.get(k) == Some(v) {
                continue;
            }
            self.map.insert(k, v, 0).map_err(|source| SteerError::Map {
                map: self.name,
                source,
            })?;
            self.entries.insert(*k, *v);
        }
        let gone: Vec<K> = self
            .entries
            .keys()
            .filter(|k| !new.contains(k))
            .copied()
            .collect();
        for k in gone {
            self.map.remove(&k).map_err(|source| SteerError::Map {
                map: self.name,
                source,
            })?;
            self.entries.remove(&k);
        }
        Ok(())
    }
}

/// The steering program attached to one interface, and its maps.
pub struct Steering {
    ifname: String,
    attached: XdpAttach,
    /// Dropping the link detaches the program. `None` once detached.
    link: Option<FdLink>,
    xsks: XskMap<MapData>,
    frontends: Mirrored<PortKey, u32>,
    vips: Mirrored<AddrKey, u32>,
    backends: Mirrored<PortKey, u32>,
    snat: Mirrored<AddrKey, PortRange>,
    counters: PerCpuArray<MapData, u64>,
    hold: Array<MapData, Hold>,
    /// Keeps the program loaded; declared last so the link goes first.
    _ebpf: Ebpf,
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steering")
            .field("ifname", &self.ifname)
            .field("attached", &self.attached)
            .field("linked", &self.link.is_some())
            .finish_non_exhaustive()
    }
}

impl Steering {
    /// Loads the program and attaches it to `ifname`. `Auto` tries native XDP and falls back
    /// to generic. An xvs program left attached the legacy way by an earlier run is removed
    /// first; a program held by a live process's `bpf_link` is not, and attaching then fails.
    pub fn attach(ifname: &str, mode: config::XdpMode) -> Result<Steering, SteerError> {
        let ifindex = if_index(ifname)?;
        remove_leftovers(ifname, ifindex)?;

        let mut ebpf = Ebpf::load(PROGRAM)?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(SteerError::Missing(PROGRAM_NAME))?
            .try_into()
            .map_err(SteerError::Verify)?;
        prog.load().map_err(SteerError::Verify)?;

        let try_attach = |prog: &mut Xdp, how: XdpAttach| {
            prog.attach_to_if_index(ifindex, how.aya_mode())
                .map_err(|source| SteerError::Attach {
                    ifname: ifname.to_owned(),
                    mode: how.name(),
                    source,
                })
        };
        let (link_id, attached) = match mode {
            config::XdpMode::Native => (try_attach(prog, XdpAttach::Native)?, XdpAttach::Native),
            config::XdpMode::Generic => (try_attach(prog, XdpAttach::Generic)?, XdpAttach::Generic),
            config::XdpMode::Auto => match try_attach(prog, XdpAttach::Native) {
                Ok(id) => (id, XdpAttach::Native),
                Err(native) => {
                    tracing::warn!(interface = %ifname, error = %native, "native XDP failed; falling back to generic XDP");
                    (try_attach(prog, XdpAttach::Generic)?, XdpAttach::Generic)
                }
            },
        };
        let link = prog
            .take_link(link_id)
            .map_err(|source| SteerError::Attach {
                ifname: ifname.to_owned(),
                mode: attached.name(),
                source,
            })?;
        // aya falls back to netlink on kernels without XDP links; such an attachment would
        // survive a crash, which this type promises never happens.
        let link = FdLink::try_from(link).map_err(|_| {
            let _ = netlink::detach_legacy(ifindex, mode_flag(attached));
            SteerError::NoLink {
                ifname: ifname.to_owned(),
            }
        })?;
        tracing::info!(interface = %ifname, mode = attached.name(), "XDP steering attached");

        let xsks = ebpf.take_map("xsks").ok_or(SteerError::Missing("xsks"))?;
        let xsks = XskMap::try_from(xsks).map_err(|source| SteerError::Map {
            map: "xsks",
            source,
        })?;
        let counters = ebpf
            .take_map("counters")
            .ok_or(SteerError::Missing("counters"))?;
        let counters = PerCpuArray::try_from(counters).map_err(|source| SteerError::Map {
            map: "counters",
            source,
        })?;
        let hold = ebpf.take_map("hold").ok_or(SteerError::Missing("hold"))?;
        let hold = Array::try_from(hold).map_err(|source| SteerError::Map {
            map: "hold",
            source,
        })?;
        Ok(Steering {
            ifname: ifname.to_owned(),
            attached,
            link: Some(link),
            xsks,
            frontends: Mirrored::new(&mut ebpf, "frontends", maps::FRONTENDS_MAX)?,
            vips: Mirrored::new(&mut ebpf, "vips", maps::VIPS_MAX)?,
            backends: Mirrored::new(&mut ebpf, "backends", maps::BACKENDS_MAX)?,
            snat: Mirrored::new(&mut ebpf, "snat", maps::SNAT_MAX)?,
            counters,
            hold,
            _ebpf: ebpf,
        })
    }

    /// How the program is attached.
    pub fn attached(&self) -> XdpAttach {
        self.attached
    }

    /// The interface the program is attached to.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Sends frames xvs owns that arrive on `queue` to the AF_XDP socket `xsk_fd`.
    pub fn register_socket(&mut self, queue: u32, xsk_fd: RawFd) -> Result<(), SteerError> {
        if queue >= maps::XSKS_MAX {
            return Err(SteerError::Queue {
                queue,
                max: maps::XSKS_MAX,
            });
        }
        self.xsks
            .set(queue, xsk_fd, 0)
            .map_err(|source| SteerError::Map {
                map: "xsks",
                source,
            })
    }

    /// Replaces the frontends: `(VIP, IP protocol, port)`. Also keeps the `vips` map (for
    /// fragments and IPv6 extension headers) in step: new VIPs appear before their frontends
    /// and gone VIPs disappear after theirs.
    pub fn set_frontends(&mut self, frontends: &[(IpAddr, u8, u16)]) -> Result<(), SteerError> {
        let keys: Vec<(PortKey, u32)> = frontends
            .iter()
            .map(|&(ip, proto, port)| (PortKey::new(ip, proto, port), 1))
            .collect();
        let mut vips: Vec<(AddrKey, u32)> = frontends
            .iter()
            .map(|&(ip, _, _)| (AddrKey::new(ip), 1))
            .collect();
        vips.sort_unstable_by_key(|(k, _)| k.ip);
        vips.dedup_by_key(|(k, _)| k.ip);

        // Check both capacities before touching either map.
        self.frontends.check(&keys)?;
        self.vips.check(&vips)?;
        // Union first (old ∪ new VIPs), then the frontends, then shrink the VIPs.
        let union: Vec<(AddrKey, u32)> = self
            .vips
            .entries
            .keys()
            .map(|k| (*k, 1))
            .chain(vips.iter().copied())
            .collect();
        self.vips.replace(&union)?;
        self.frontends.replace(&keys)?;
        self.vips.replace(&vips)
    }

    /// Replaces the backends whose replies come back through xvs (nat mode):
    /// `(address, IP protocol, port)`.
    pub fn set_backends(&mut self, backends: &[(IpAddr, u8, u16)]) -> Result<(), SteerError> {
        let keys: Vec<(PortKey, u32)> = backends
            .iter()
            .map(|&(ip, proto, port)| (PortKey::new(ip, proto, port), 1))
            .collect();
        self.backends.replace(&keys)
    }

    /// Replaces the SNAT addresses and the port range `(lo, hi)`, both inclusive, that
    /// full-NAT uses on them.
    pub fn set_snat(&mut self, addrs: &[IpAddr], ports: (u16, u16)) -> Result<(), SteerError> {
        let (lo, hi) = ports;
        if lo > hi {
            return Err(SteerError::PortRange { lo, hi });
        }
        let range = PortRange { lo, hi };
        let keys: Vec<(AddrKey, PortRange)> =
            addrs.iter().map(|&ip| (AddrKey::new(ip), range)).collect();
        self.snat.replace(&keys)
    }

    /// Sets the restart hold: until `CLOCK_MONOTONIC` (the clock of `bpf_ktime_get_ns`, see
    /// [`monotonic_ns`]) reaches `deadline_ns`, frames xvs owns that find no AF_XDP socket on
    /// their queue are dropped (counted `held`) instead of passed (`no_socket`); 0, or any
    /// deadline already past, holds nothing. The live daemon refreshes it (now +
    /// `restart_hold`) about every second, so the hold runs out `restart_hold` after the
    /// process stops refreshing it; `owner_pid` records who set it.
    pub fn set_hold(&mut self, deadline_ns: u64, owner_pid: u32) -> Result<(), SteerError> {
        let hold = Hold {
            deadline_ns,
            owner_pid,
            pad: 0,
        };
        self.hold.set(0, hold, 0).map_err(|source| SteerError::Map {
            map: "hold",
            source,
        })
    }

    /// The program's counters, summed over CPUs.
    pub fn counters(&self) -> Result<SteerCounters, SteerError> {
        let mut sum = SteerCounters::default();
        for counter in Counter::ALL {
            let per_cpu =
                self.counters
                    .get(&(counter as u32), 0)
                    .map_err(|source| SteerError::Map {
                        map: "counters",
                        source,
                    })?;
            sum.add(counter, per_cpu.iter().sum());
        }
        Ok(sum)
    }

    /// Detaches the program. Dropping a `Steering` does the same.
    pub fn detach(mut self) -> Result<(), SteerError> {
        // Closing the last link fd detaches the program synchronously.
        drop(self.link.take());
        Ok(())
    }
}

impl<K: Pod + Eq + Hash, V: Pod + PartialEq> Mirrored<K, V> {
    /// Fails when replacing with `entries` would overflow the map.
    fn check(&self, entries: &[(K, V)]) -> Result<(), SteerError> {
        let new: HashSet<K> = entries.iter().map(|(k, _)| *k).collect();
        let needed = new.len() + self.entries.keys().filter(|k| !new.contains(k)).count();
        if needed > self.max {
            return Err(SteerError::Capacity {
                map: self.name,
                needed,
                max: self.max,
            });
        }
        Ok(())
    }
}

impl Drop for Steering {
    fn drop(&mut self) {
        drop(self.link.take());
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock `bpf_ktime_get_ns` reads, which
/// [`Steering::set_hold`]'s deadline is compared with.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn if_index(ifname: &str) -> Result<u32, SteerError> {
    let no_interface = |source| SteerError::NoInterface {
        ifname: ifname.to_owned(),
        source,
    };
    let name = CString::new(ifname)
        .map_err(|_| no_interface(io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: `name` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(no_interface(io::Error::last_os_error()));
    }
    Ok(index)
}

fn mode_flag(attach: XdpAttach) -> u32 {
    match attach {
        XdpAttach::Native => netlink::XDP_FLAGS_DRV_MODE,
        XdpAttach::Generic => netlink::XDP_FLAGS_SKB_MODE,
    }
}

/// Removes programs named [`PROGRAM_NAME`] attached to `ifindex` the legacy way. One held by
/// a live `bpf_link` makes the kernel answer `EBUSY`, reported as [`SteerError::Leftover`].
fn remove_leftovers(ifname: &str, ifindex: u32) -> Result<(), SteerError> {
    let leftover = |source| SteerError::Leftover {
        ifname: ifname.to_owned(),
        source,
    };
    let attached = netlink::attached(ifindex).map_err(leftover)?;
    if attached.is_empty() {
        return Ok(());
    }
    let ours: HashSet<u32> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|info| info.name_as_str() == Some(PROGRAM_NAME))
        .map(|info| info.id())
        .collect();
    for a in attached.into_iter().filter(|a| ours.contains(&a.prog_id)) {
        tracing::warn!(
            interface = %ifname,
            program = PROGRAM_NAME,
            id = a.prog_id,
            "removing a leftover XDP program"
        );
        netlink::detach_legacy(ifindex, a.mode_flag).map_err(leftover)?;
    }
    Ok(())
}
