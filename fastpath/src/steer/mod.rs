//! The XDP steering program (`bpf/steer.c`) and its loader.
//!
//! One [`Steering`] per interface. The program redirects to the receiving queue's AF_XDP
//! socket only the frames xvs owns, as described by the maps this type keeps in step with the
//! snapshot (see [`maps`] for layouts): frames to a frontend (VIP:port/proto), to a SNAT
//! address within the port range, from a backend (nat-mode replies), later fragments to a VIP
//! or SNAT address, ICMP errors about xvs traffic, IPv6 with extension headers to a VIP or
//! SNAT address, and TCP/UDP/SCTP to any port of a ClusterIP or to any address inside a
//! Service CIDR (the pipeline rejects or drops those no frontend serves). Everything else,
//! including malformed frames, gets `XDP_PASS`. A matched frame
//! on a queue with no registered socket is passed too (counted `no_socket`), except while a
//! restart hold runs (below): then it is dropped (counted `held`). That is the only frame the
//! program ever drops.
//!
//! Two ways to attach:
//!
//! - [`Steering::attach`] holds the program through a `bpf_link` only the process owns, so
//!   the kernel detaches it when the process dies: a crash leaves nothing behind. It first
//!   removes any xvs program an earlier run left attached the legacy (netlink) way, and
//!   refuses an interface whose program is held by xvs's pinned link (see [`pin_dir`]).
//! - [`Steering::attach_pinned`] pins the link and the maps in bpffs, so the program stays
//!   attached when the process exits or crashes, and the next process adopts the link: its
//!   new program replaces the old one in place (`BPF_LINK_UPDATE`), after the old program's
//!   ownership maps and hold were copied into the new one, so no frame meets an empty map and
//!   none is handed to the kernel in between. While no xvs runs, the **restart hold**
//!   ([`Steering::set_hold`], refreshed by the live daemon) makes the orphaned program drop
//!   what xvs owns instead of letting the kernel answer it with RSTs that would kill the
//!   flows the next xvs adopts; once the hold's deadline passes, it passes everything again,
//!   so a node whose xvs never returns still works. [`remove_pins`] then removes it for good.
//!
//! # Pinned layout
//!
//! bpffs is global while interface names repeat across network namespaces, so pins live in a
//! directory per namespace, [`pin_dir`]: `/sys/fs/bpf/xvs/ns-<inode of the netns>`, and below
//! it one directory per interface:
//!
//! ```text
//! /sys/fs/bpf/xvs/ns-4026532288/eth0/link       the XDP bpf_link (keeps the program attached)
//!                                   /hold       struct hold {deadline_ns, owner_pid}: read by
//!                                               pinned_hold() from any process
//!                                   /frontends  /vips  /backends  /snat  /cidrs   what xvs owns
//!                                   /counters   the program's counters (pinned_counters())
//! ```
//!
//! bpffs refuses names with a dot, so a dot in an interface name (VLANs: `eth0.100`) becomes
//! a colon (`eth0:100`), which no interface name has. An adopting process pins its new maps
//! as `<name>-new` and renames them over the old pins once its program runs on the link. A
//! `link` pin whose interface is gone (or was recreated: another ifindex) is stale;
//! `attach_pinned` removes it and attaches afresh.
//!
//! To remove the pinned state for good without xvs (what [`remove_pins`] does), as root:
//!
//! ```text
//! rm -r /sys/fs/bpf/xvs/ns-$(stat -L -c %i /proc/self/ns/net)      # this namespace
//! rm -r /sys/fs/bpf/xvs/ns-$(ip netns exec NAME stat -L -c %i /proc/self/ns/net)  # NAME's
//! rm -r /sys/fs/bpf/xvs                                             # every namespace
//! ```
//!
//! Removing the `link` pin detaches the program (moments later: the kernel frees the link
//! from a work item) unless a live process still holds the link.
//!
//! # Privileges
//!
//! Pinning needs no capability beyond the daemon's (`CAP_BPF`, `CAP_NET_ADMIN`, ...):
//! pinning and opening pins check only bpffs file permissions, and updating or detaching a
//! link needs only its descriptor. But a non-root user must be able to write the pin root:
//! where `/sys/fs/bpf` is root's (systemd mounts it 0700), create `/sys/fs/bpf/xvs` for it
//! beforehand (`install -d -o xvs -g xvs -m 0700 /sys/fs/bpf/xvs`), or grant
//! `CAP_DAC_OVERRIDE`. Pins belong to the user that made them (mode 0600), so the next xvs
//! must run as the same user (or root).
//!
//! The pins must be on the host's bpffs: a bpffs mounted inside a private mount namespace
//! dies with it, and the program with it. `ip netns exec` mounts a new `/sys` in which
//! `/sys/fs/bpf` is not bpffs, so `attach_pinned` refuses it there ([`SteerError::PinDir`]);
//! enter only the network namespace (`nsenter --net=/run/netns/NAME`), or bind-mount the
//! host's bpffs somewhere `ip netns exec` keeps and pin under it ([`pin_dir_in`]).
//!
//! Map updates are full replaces done as insert-new-then-delete-gone, so an entry present in
//! both the old and the new set is never missing, not even for one packet.

mod counters;
pub mod maps;
mod netlink;
mod pin;
pub(crate) mod sys;

use std::collections::HashSet;
use std::ffi::CString;
use std::hash::Hash;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::path::PathBuf;

use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, XskMap};
use aya::programs::links::FdLink;
use aya::programs::{ProgramError, Xdp};
use aya::{Ebpf, EbpfError, Pod};

pub use counters::SteerCounters;
pub(crate) use counters::per_cpu_sum;
use maps::{AddrKey, Hold, LpmAddr, PortKey, PortRange, VIP_FRONTEND, VIP_REJECT_UNSERVED};
pub use pin::{PIN_ROOT, pin_dir, pin_dir_in, pinned_counters, pinned_hold, remove_pins};
pub(crate) use pin::{STAGED, Staged, on_bpffs};

/// The program's name in the kernel (what `ip link` and `bpftool` show).
pub const PROGRAM_NAME: &str = "xvs_steer";

/// The compiled program, built by `build.rs` from `bpf/steer.c`.
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.o"));

/// Loads [`PROGRAM`] with the kernel's BTF parsed once per process (aya's `Ebpf::load` reads
/// and parses the 5 MB `/sys/kernel/btf/vmlinux` twice per call: tens of milliseconds of a
/// restart's gap per interface).
fn load_program() -> Result<Ebpf, EbpfError> {
    static BTF: std::sync::OnceLock<Option<aya::Btf>> = std::sync::OnceLock::new();
    let btf = BTF.get_or_init(|| aya::Btf::from_sys_fs().ok());
    aya::EbpfLoader::new().btf(btf.as_ref()).load(PROGRAM)
}

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

    pub(crate) fn name(self) -> &'static str {
        match self {
            XdpAttach::Native => "native",
            XdpAttach::Generic => "generic",
        }
    }

    pub(crate) fn flag(self) -> u32 {
        match self {
            XdpAttach::Native => netlink::XDP_FLAGS_DRV_MODE,
            XdpAttach::Generic => netlink::XDP_FLAGS_SKB_MODE,
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
    /// `attach` found the interface's XDP held by xvs's pinned link (a restart hold).
    #[error(
        "XDP on {ifname} is held by xvs's pinned link {} (left for the next xvs to adopt): \
         attach with pinning, or remove the pinned state for good with `rm -r {}`",
        path.display(), path.parent().unwrap_or(path).display()
    )]
    Pinned {
        /// The interface name.
        ifname: String,
        /// The `link` pin.
        path: PathBuf,
    },
    /// Creating or using the pin directory failed.
    #[error(
        "cannot use the pin directory {}: {source} (it must be on a bpffs that outlives xvs, \
         [dataplane] bpf_pin_root, default {PIN_ROOT}: `ip netns exec` mounts a new /sys that \
         hides /sys/fs/bpf; a non-root xvs needs the pin root made for it, e.g. \
         `install -d -o xvs -g xvs -m 0700 {PIN_ROOT}`)",
        path.display()
    )]
    PinDir {
        /// The directory.
        path: PathBuf,
        /// The file system's answer.
        source: io::Error,
    },
    /// Pinning, opening or removing a pinned object failed.
    #[error(
        "pinned object {}: {source} (remove xvs's pinned state with `rm -r {}`)",
        path.display(), path.parent().unwrap_or(path).display()
    )]
    Pin {
        /// The pin.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
    /// A pinned map does not have the layout this xvs expects (an upgrade changed it).
    #[error(
        "the pinned map {} does not fit this xvs: {source} (remove the pinned state with \
         `rm -r {}`; until xvs attaches again the kernel sees its frames)",
        path.display(), path.parent().unwrap_or(path).display()
    )]
    PinnedMap {
        /// The pin.
        path: PathBuf,
        /// What aya found wrong.
        source: MapError,
    },
    /// Creating the pinned link failed.
    #[error(
        "attaching XDP to {ifname} in {mode} mode through a bpf_link failed: {source} (is \
         the interface up, and is no other XDP program attached? try xdp_mode = \"generic\")"
    )]
    Link {
        /// The interface name.
        ifname: String,
        /// "native" or "generic".
        mode: &'static str,
        /// The kernel's answer.
        source: io::Error,
    },
    /// Replacing the program on the pinned link, or detaching it, failed.
    #[error(
        "replacing or detaching the program on the pinned link {} failed: {source} (remove \
         the pinned state with `rm -r {}`)",
        path.display(), path.parent().unwrap_or(path).display()
    )]
    Adopt {
        /// The `link` pin.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
}

/// A BPF hash map mirrored by the entries xvs put in it.
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
        let map = HashMap::try_from(take_map(ebpf, name)?)
            .map_err(|source| SteerError::Map { map: name, source })?;
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

/// The `cidrs` LPM trie, mirrored by the keys xvs put in it.
struct MirroredCidrs {
    map: LpmTrie<MapData, LpmAddr, u32>,
    /// What the map holds: (prefix length, address).
    entries: HashSet<(u32, LpmAddr)>,
}

impl MirroredCidrs {
    /// Makes the trie hold exactly `cidrs` (inserts first, then deletes what is gone).
    fn replace(&mut self, cidrs: &[vocab::Cidr]) -> Result<(), SteerError> {
        let keys: Vec<LpmKey<LpmAddr>> = cidrs.iter().map(|c| maps::lpm_key(*c)).collect();
        let new: HashSet<(u32, LpmAddr)> =
            keys.iter().map(|k| (k.prefix_len(), k.data())).collect();
        if new.len() > maps::CIDRS_MAX {
            return Err(SteerError::Capacity {
                map: "cidrs",
                needed: new.len(),
                max: maps::CIDRS_MAX,
            });
        }
        let err = |source| SteerError::Map {
            map: "cidrs",
            source,
        };
        for k in &keys {
            if self.entries.insert((k.prefix_len(), k.data())) {
                self.map.insert(k, 1, 0).map_err(err)?;
            }
        }
        let gone: Vec<(u32, LpmAddr)> = self.entries.difference(&new).copied().collect();
        for (prefix, addr) in gone {
            self.map.remove(&LpmKey::new(prefix, addr)).map_err(err)?;
            self.entries.remove(&(prefix, addr));
        }
        Ok(())
    }
}

/// The program's maps, taken out of the loaded object.
struct Maps {
    xsks: XskMap<MapData>,
    frontends: Mirrored<PortKey, u32>,
    vips: Mirrored<AddrKey, u32>,
    backends: Mirrored<PortKey, u32>,
    snat: Mirrored<AddrKey, PortRange>,
    cidrs: MirroredCidrs,
    counters: PerCpuArray<MapData, u64>,
    hold: Array<MapData, Hold>,
}

impl Maps {
    fn take(ebpf: &mut Ebpf) -> Result<Maps, SteerError> {
        let typed = |name: &'static str| move |source| SteerError::Map { map: name, source };
        Ok(Maps {
            xsks: XskMap::try_from(take_map(ebpf, "xsks")?).map_err(typed("xsks"))?,
            frontends: Mirrored::new(ebpf, "frontends", maps::FRONTENDS_MAX)?,
            vips: Mirrored::new(ebpf, "vips", maps::VIPS_MAX)?,
            backends: Mirrored::new(ebpf, "backends", maps::BACKENDS_MAX)?,
            snat: Mirrored::new(ebpf, "snat", maps::SNAT_MAX)?,
            cidrs: MirroredCidrs {
                map: LpmTrie::try_from(take_map(ebpf, "cidrs")?).map_err(typed("cidrs"))?,
                entries: HashSet::new(),
            },
            counters: PerCpuArray::try_from(take_map(ebpf, "counters")?)
                .map_err(typed("counters"))?,
            hold: Array::try_from(take_map(ebpf, "hold")?).map_err(typed("hold"))?,
        })
    }

    /// Points `queue`'s entry of the XSK map at the AF_XDP socket `xsk_fd`.
    fn register_socket(&mut self, queue: u32, xsk_fd: RawFd) -> Result<(), SteerError> {
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
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, SteerError> {
    ebpf.take_map(name).ok_or(SteerError::Missing(name))
}

/// What keeps the program attached.
enum Link {
    /// From [`Steering::attach`]: closing it detaches the program.
    Process(FdLink),
    /// From [`Steering::attach_pinned`]: the pin `dir/link` keeps the program attached
    /// after this descriptor closes.
    Pinned {
        /// The link.
        fd: OwnedFd,
        /// The interface's pin directory.
        dir: PathBuf,
    },
}

/// The steering program attached to one interface, and its maps.
///
/// Dropping it detaches a program from [`Steering::attach`]; one from
/// [`Steering::attach_pinned`] stays attached ([`Steering::release`]), since a crash does
/// the same and the restart hold must outlive both.
pub struct Steering {
    ifname: String,
    attached: XdpAttach,
    /// `None` once detached or released.
    link: Option<Link>,
    maps: Maps,
    /// Keeps the program loaded; declared last so the link goes first.
    _ebpf: Ebpf,
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steering")
            .field("ifname", &self.ifname)
            .field("attached", &self.attached)
            .field("linked", &self.link.is_some())
            .field("pinned", &matches!(self.link, Some(Link::Pinned { .. })))
            .finish_non_exhaustive()
    }
}

impl Steering {
    /// Loads the program and attaches it to `ifname` through a link this process alone
    /// holds. `Auto` tries native XDP and falls back to generic. An xvs program left attached
    /// the legacy way by an earlier run is removed first; a program held by a live process's
    /// `bpf_link` is not, and attaching then fails. An interface whose program is held by
    /// xvs's pinned link in [`pin_dir`] (a restart hold) is refused with
    /// [`SteerError::Pinned`], which names the pin and how to remove it: use
    /// [`Steering::attach_pinned`] there.
    pub fn attach(ifname: &str, mode: vocab::XdpMode) -> Result<Steering, SteerError> {
        let ifindex = if_index(ifname)?;
        pin::refuse_pinned(ifname, ifindex)?;
        remove_leftovers(ifname, ifindex)?;

        let mut ebpf = load_program()?;
        let maps = Maps::take(&mut ebpf)?;
        let prog = program(&mut ebpf)?;
        let (link_id, attached) = with_mode(ifname, mode, |how| {
            prog.attach_to_if_index(ifindex, how.aya_mode())
                .map_err(|source| SteerError::Attach {
                    ifname: ifname.to_owned(),
                    mode: how.name(),
                    source,
                })
        })?;
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
            let _ = netlink::detach_legacy(ifindex, attached.flag());
            SteerError::NoLink {
                ifname: ifname.to_owned(),
            }
        })?;
        tracing::info!(interface = %ifname, mode = attached.name(), "XDP steering attached");
        Ok(Steering {
            ifname: ifname.to_owned(),
            attached,
            link: Some(Link::Process(link)),
            maps,
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
        self.maps.register_socket(queue, xsk_fd)
    }

    /// Replaces the frontends: `(VIP, IP protocol, port)`, and the ClusterIPs among their
    /// addresses (`cluster_ips`: every TCP/UDP/SCTP port of theirs is redirected, the
    /// pipeline rejects the ports no frontend serves). Also keeps the `vips` map (for
    /// fragments and IPv6 extension headers, and the ClusterIP flag) in step: new VIPs appear
    /// before their frontends and gone VIPs disappear after theirs.
    pub fn set_frontends(
        &mut self,
        frontends: &[(IpAddr, u8, u16)],
        cluster_ips: &[IpAddr],
    ) -> Result<(), SteerError> {
        let keys: Vec<(PortKey, u32)> = frontends
            .iter()
            .map(|&(ip, proto, port)| (PortKey::new(ip, proto, port), 1))
            .collect();
        let clusters: HashSet<AddrKey> = cluster_ips.iter().map(|ip| AddrKey::new(*ip)).collect();
        let flags = |k: AddrKey| {
            VIP_FRONTEND
                | if clusters.contains(&k) {
                    VIP_REJECT_UNSERVED
                } else {
                    0
                }
        };
        let mut vips: Vec<(AddrKey, u32)> = frontends
            .iter()
            .map(|&(ip, _, _)| AddrKey::new(ip))
            .chain(clusters.iter().copied())
            .map(|k| (k, flags(k)))
            .collect();
        vips.sort_unstable_by_key(|(k, _)| k.ip);
        vips.dedup_by_key(|(k, _)| k.ip);

        let m = &mut self.maps;
        // Check both capacities before touching either map.
        m.frontends.check(&keys)?;
        m.vips.check(&vips)?;
        // Union first (old ∪ new VIPs, the new flags where both have one), then the
        // frontends, then shrink the VIPs.
        let new: HashSet<AddrKey> = vips.iter().map(|(k, _)| *k).collect();
        let union: Vec<(AddrKey, u32)> = m
            .vips
            .entries
            .iter()
            .filter(|(k, _)| !new.contains(*k))
            .map(|(k, v)| (*k, *v))
            .chain(vips.iter().copied())
            .collect();
        m.vips.replace(&union)?;
        m.frontends.replace(&keys)?;
        m.vips.replace(&vips)
    }

    /// Replaces the Service CIDRs: TCP/UDP/SCTP to an address inside one is redirected (the
    /// pipeline drops those no Service has). The caller leaves out every CIDR that holds one
    /// of the node's own addresses (the Kubernetes source refuses them), so the node's own
    /// traffic is never taken.
    pub fn set_service_cidrs(&mut self, cidrs: &[vocab::Cidr]) -> Result<(), SteerError> {
        self.maps.cidrs.replace(cidrs)
    }

    /// Replaces the backends whose replies come back through xvs (nat mode):
    /// `(address, IP protocol, port)`.
    pub fn set_backends(&mut self, backends: &[(IpAddr, u8, u16)]) -> Result<(), SteerError> {
        let keys: Vec<(PortKey, u32)> = backends
            .iter()
            .map(|&(ip, proto, port)| (PortKey::new(ip, proto, port), 1))
            .collect();
        self.maps.backends.replace(&keys)
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
        self.maps.snat.replace(&keys)
    }

    /// Sets the restart hold: until `CLOCK_MONOTONIC` (the clock of `bpf_ktime_get_ns`, see
    /// [`monotonic_ns`]) reaches `deadline_ns`, frames xvs owns that find no AF_XDP socket on
    /// their queue are dropped (counted `held`) instead of passed (`no_socket`); 0, or any
    /// deadline already past, holds nothing. The live daemon refreshes it (now +
    /// `restart_hold`) about every second, so the hold runs out `restart_hold` after the
    /// process stops refreshing it; `owner_pid` records who set it ([`pinned_hold`] reads
    /// both back from the pinned state).
    pub fn set_hold(&mut self, deadline_ns: u64, owner_pid: u32) -> Result<(), SteerError> {
        let hold = Hold {
            deadline_ns,
            owner_pid,
            pad: 0,
        };
        self.maps
            .hold
            .set(0, hold, 0)
            .map_err(|source| SteerError::Map {
                map: "hold",
                source,
            })
    }

    /// The program's counters, summed over CPUs.
    pub fn counters(&self) -> Result<SteerCounters, SteerError> {
        counters::read(&self.maps.counters)
    }

    /// Stops using the program without detaching it: a pinned program stays attached, its
    /// pins in place, for the next process to adopt; the hold runs out on its own. (A
    /// program from [`Steering::attach`] is detached: only a pin outlives the process.)
    /// Dropping a `Steering` does the same.
    pub fn release(mut self) {
        if let Some(Link::Pinned { dir, .. }) = &self.link {
            tracing::info!(
                interface = %self.ifname,
                pins = %dir.display(),
                "XDP steering released: it stays attached and pinned for the next xvs"
            );
        }
        drop(self.link.take());
    }

    /// Detaches the program now. For a pinned program, also removes this interface's pins
    /// (the node is left for good): the link is detached even if another process still
    /// holds it.
    pub fn detach(mut self) -> Result<(), SteerError> {
        match self.link.take() {
            // Closing the last link fd detaches the program synchronously.
            Some(Link::Process(link)) => drop(link),
            Some(Link::Pinned { fd, dir }) => pin::detach(&self.ifname, fd.as_fd(), &dir)?,
            None => {}
        }
        Ok(())
    }
}

impl Drop for Steering {
    fn drop(&mut self) {
        drop(self.link.take());
    }
}

/// CLOCK_MONOTONIC now, in ns: what the program's `bpf_ktime_get_ns` reads.
pub use shm::monotonic_ns;

/// The loaded (verified) steering program of `ebpf`.
fn program(ebpf: &mut Ebpf) -> Result<&mut Xdp, SteerError> {
    let prog: &mut Xdp = ebpf
        .program_mut(PROGRAM_NAME)
        .ok_or(SteerError::Missing(PROGRAM_NAME))?
        .try_into()
        .map_err(SteerError::Verify)?;
    prog.load().map_err(SteerError::Verify)?;
    Ok(prog)
}

/// Runs `attach` in the mode `mode` asks for: `Auto` tries native, then generic.
fn with_mode<T>(
    ifname: &str,
    mode: vocab::XdpMode,
    mut attach: impl FnMut(XdpAttach) -> Result<T, SteerError>,
) -> Result<(T, XdpAttach), SteerError> {
    match mode {
        vocab::XdpMode::Native => Ok((attach(XdpAttach::Native)?, XdpAttach::Native)),
        vocab::XdpMode::Generic => Ok((attach(XdpAttach::Generic)?, XdpAttach::Generic)),
        vocab::XdpMode::Auto => match attach(XdpAttach::Native) {
            Ok(t) => Ok((t, XdpAttach::Native)),
            Err(native) => {
                tracing::warn!(interface = %ifname, error = %native, "native XDP failed; falling back to generic XDP");
                Ok((attach(XdpAttach::Generic)?, XdpAttach::Generic))
            }
        },
    }
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
