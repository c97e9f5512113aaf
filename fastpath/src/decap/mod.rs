//! The backend side of direct server return: the decap programs (`bpf/decap.c`) and their
//! loader, for `xvs decap`.
//!
//! A backend behind an xvs node in DSR mode receives the client's packets encapsulated
//! (IPIP or GUE) or, in L2 mode, as they are (only the destination MAC changed), and
//! answers the client directly. Two programs, sharing one set of maps ([`maps`]):
//!
//! - `xvs_decap`, XDP on the interfaces the packets arrive on: decapsulates IPIP (IPv4 or
//!   IPv6 inside IPv4 or IPv6) and GUE (variant 1, the inner IP packet right after the UDP
//!   header, on [`Tables::gue_port`]) whose inner destination is one of [`Tables::vips`],
//!   and passes everything else untouched (other destinations, outer fragments, malformed
//!   packets: counted, see [`DecapCounters`]). Then, on the decapsulated packet and on a
//!   plain one alike, a TCP/UDP destination port with a [`PortMap`] is rewritten to its
//!   target port (checksums updated incrementally).
//! - `xvs_decap_egress`, tc (tcx, Linux 6.6) on the egress of the same interfaces, attached
//!   only when there are port translations: rewrites the source port of what leaves from
//!   VIP:target back to the service port, so the client sees the port it connected to.
//!
//! The kernel then delivers the inner packet, addressed to the VIP, to a local socket only if
//! the VIP is local (on `lo`, or a `local` route): `xvs decap` can add it (`docs/decap.md`).
//!
//! # Lifecycle and pinned layout
//!
//! [`apply`] loads the programs with fresh maps filled from [`Tables`] and attaches them to
//! every interface given, through links pinned in bpffs, so they stay attached after the
//! process exits (`xvs decap` pins and exits, or waits for a signal and detaches). Run again,
//! it replaces the programs on the links in place (`BPF_LINK_UPDATE`: no packet meets no
//! program), detaches the interfaces no longer given, and replaces the map pins: applying
//! the same tables twice changes nothing a packet sees. [`detach`] removes everything.
//! Pins live in a directory per network namespace ([`pin_dir_in`]):
//!
//! ```text
//! /sys/fs/bpf/xvs-decap/ns-<inode of the netns>/vips /ports /rports /settings /counters
//!                                               /eth0/xdp      the XDP link
//!                                               /eth0/egress   the tcx egress link
//! ```
//!
//! (A dot in an interface name becomes a colon: bpffs refuses dots.) Removing the directory
//! (`rm -r`) detaches the programs too, moments later.

mod counters;
pub mod maps;
mod pin;

use std::collections::HashSet;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;

use aya::maps::{Array, HashMap, IterableMap, MapData, MapError, PerCpuArray};
use aya::programs::{ProgramError, SchedClassifier, Xdp};
use aya::{Ebpf, EbpfError};

pub use counters::DecapCounters;
pub use maps::PortMap;
use maps::{AddrKey, PortKey, PortValue, Settings};
pub use pin::{Applied, AttachedIface, PIN_ROOT, Pinned, apply, detach, pin_dir_in, pinned};

/// The XDP program's name in the kernel (what `ip link` shows).
pub const XDP_PROGRAM: &str = "xvs_decap";
/// The tc egress program's name in the kernel.
pub const EGRESS_PROGRAM: &str = "xvs_decap_egress";

/// The compiled programs, built by `build.rs` from `bpf/decap.c`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/decap.o"));

/// What the programs decapsulate and translate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables {
    /// The UDP port of GUE (host order; Katran's and xvs's default is 6080).
    pub gue_port: u16,
    /// Inner destinations to decapsulate.
    pub vips: Vec<IpAddr>,
    /// Port translations (their VIPs are decapsulated too).
    pub ports: Vec<PortMap>,
}

impl Tables {
    /// Whether the egress program is needed.
    pub fn translates(&self) -> bool {
        !self.ports.is_empty()
    }
}

/// What went wrong while loading, attaching or detaching the decap programs.
#[derive(Debug, thiserror::Error)]
pub enum DecapError {
    /// Parsing the embedded object or creating its maps failed.
    #[error(
        "loading the decap programs failed: {0} (xvs decap needs root, or CAP_BPF, \
         CAP_NET_ADMIN and CAP_PERFMON)"
    )]
    Load(#[from] EbpfError),
    /// The embedded object lacks a program or map the loader expects.
    #[error(
        "the embedded decap object lacks `{0}`: fastpath was built from a mismatched bpf/decap.c"
    )]
    Missing(&'static str),
    /// The kernel refused a program (verifier or permissions).
    #[error("the kernel refused the decap program `{name}`: {source}")]
    Verify {
        /// The program.
        name: &'static str,
        /// The kernel's answer.
        source: ProgramError,
    },
    /// More entries than a map holds.
    #[error("BPF map `{map}` holds at most {max} entries, the tables need {needed}")]
    Capacity {
        /// The map.
        map: &'static str,
        /// Entries needed.
        needed: usize,
        /// The map's capacity.
        max: usize,
    },
    /// A BPF map update or read failed.
    #[error("BPF map `{map}`: {source}")]
    Map {
        /// The map.
        map: &'static str,
        /// The kernel's answer.
        source: MapError,
    },
    /// The interface name does not resolve to an index.
    #[error("interface {ifname} not found: {source}")]
    NoInterface {
        /// The interface name.
        ifname: String,
        /// The lookup error.
        source: io::Error,
    },
    /// The pin directory cannot be used.
    #[error(
        "cannot use the pin directory {}: {source} (it must be on a bpffs: `ip netns exec` \
         mounts a new /sys that hides /sys/fs/bpf; give --pin-root on a bpffs it keeps)",
        path.display()
    )]
    PinDir {
        /// The directory.
        path: PathBuf,
        /// The file system's answer.
        source: io::Error,
    },
    /// Pinning, opening or removing a pinned object failed.
    #[error("pinned object {}: {source}", path.display())]
    Pin {
        /// The pin.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
    /// Attaching the XDP program failed.
    #[error(
        "attaching XDP to {ifname} in {mode} mode failed: {source} (is another XDP program \
         attached? xvs decap cannot share an interface with xvs run's steering)"
    )]
    Attach {
        /// The interface name.
        ifname: String,
        /// "native" or "generic".
        mode: &'static str,
        /// The kernel's answer.
        source: io::Error,
    },
    /// Attaching the egress program failed.
    #[error(
        "attaching the egress port translation to {ifname} failed: {source} (it needs tcx, \
         Linux 6.6 or later; without port translations no egress program is attached)"
    )]
    Egress {
        /// The interface name.
        ifname: String,
        /// The kernel's answer.
        source: io::Error,
    },
    /// Replacing or detaching a program on a pinned link failed.
    #[error("replacing or detaching the program on the pinned link {}: {source}", path.display())]
    Link {
        /// The link's pin.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
    /// `BPF_PROG_TEST_RUN` failed.
    #[error("running the decap program `{name}` on a test packet failed: {source}")]
    TestRun {
        /// The program.
        name: &'static str,
        /// The kernel's answer.
        source: io::Error,
    },
}

/// The programs loaded (verified) with their maps filled, not attached to anything.
pub struct Loaded {
    vips: HashMap<MapData, AddrKey, u32>,
    ports: HashMap<MapData, PortKey, PortValue>,
    rports: HashMap<MapData, PortKey, PortValue>,
    settings: Array<MapData, Settings>,
    counters: PerCpuArray<MapData, u64>,
    /// Owns the programs; declared last.
    ebpf: Ebpf,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").finish_non_exhaustive()
    }
}

/// The maps pinned beside the links, by pin name.
const MAP_PINS: [&str; 5] = ["vips", "ports", "rports", "settings", "counters"];

impl Loaded {
    /// Loads both programs with maps holding `tables`. Duplicate entries are merged; a
    /// translation's VIP is decapsulated even when `tables.vips` lacks it.
    pub fn load(tables: &Tables) -> Result<Loaded, DecapError> {
        static BTF: std::sync::OnceLock<Option<aya::Btf>> = std::sync::OnceLock::new();
        let btf = BTF.get_or_init(|| aya::Btf::from_sys_fs().ok());
        let mut ebpf = aya::EbpfLoader::new().btf(btf.as_ref()).load(OBJECT)?;
        let typed = |name: &'static str| move |source| DecapError::Map { map: name, source };
        let mut take = |name: &'static str| ebpf.take_map(name).ok_or(DecapError::Missing(name));
        let mut loaded = Loaded {
            vips: HashMap::try_from(take("vips")?).map_err(typed("vips"))?,
            ports: HashMap::try_from(take("ports")?).map_err(typed("ports"))?,
            rports: HashMap::try_from(take("rports")?).map_err(typed("rports"))?,
            settings: Array::try_from(take("settings")?).map_err(typed("settings"))?,
            counters: PerCpuArray::try_from(take("counters")?).map_err(typed("counters"))?,
            ebpf,
        };
        loaded.fill(tables)?;
        let xdp: &mut Xdp = program(&mut loaded.ebpf, XDP_PROGRAM)?;
        xdp.load().map_err(verify(XDP_PROGRAM))?;
        let tc: &mut SchedClassifier = program(&mut loaded.ebpf, EGRESS_PROGRAM)?;
        tc.load().map_err(verify(EGRESS_PROGRAM))?;
        Ok(loaded)
    }

    fn fill(&mut self, tables: &Tables) -> Result<(), DecapError> {
        let vips: HashSet<AddrKey> = tables
            .vips
            .iter()
            .chain(tables.ports.iter().map(|p| &p.vip))
            .map(|ip| AddrKey::new(*ip))
            .collect();
        let ingress: std::collections::HashMap<PortKey, PortValue> =
            tables.ports.iter().map(PortMap::ingress).collect();
        let egress: std::collections::HashMap<PortKey, PortValue> =
            tables.ports.iter().map(PortMap::egress).collect();
        capacity("vips", vips.len(), maps::VIPS_MAX)?;
        capacity("ports", ingress.len(), maps::PORTS_MAX)?;
        capacity("rports", egress.len(), maps::PORTS_MAX)?;
        let err = |map: &'static str| move |source| DecapError::Map { map, source };
        for k in &vips {
            self.vips.insert(k, 1, 0).map_err(err("vips"))?;
        }
        for (k, v) in &ingress {
            self.ports.insert(k, v, 0).map_err(err("ports"))?;
        }
        for (k, v) in &egress {
            self.rports.insert(k, v, 0).map_err(err("rports"))?;
        }
        self.settings
            .set(0, Settings::new(tables.gue_port), 0)
            .map_err(err("settings"))
    }

    /// What the programs counted, summed over CPUs.
    pub fn counters(&self) -> Result<DecapCounters, DecapError> {
        counters::read(&self.counters)
    }

    /// Runs the XDP program on `frame` (an Ethernet frame) without attaching it: its action
    /// (`XDP_PASS` 2, `XDP_DROP` 1) and the frame as it left it.
    pub fn run_xdp(&self, frame: &[u8]) -> Result<(u32, Vec<u8>), DecapError> {
        self.run(XDP_PROGRAM, frame)
    }

    /// Runs the egress program on `frame` (an Ethernet frame, as the interface would send
    /// it, checksums complete) without attaching it: its action (`TC_ACT_OK` 0) and the frame
    /// as it left it.
    pub fn run_egress(&self, frame: &[u8]) -> Result<(u32, Vec<u8>), DecapError> {
        self.run(EGRESS_PROGRAM, frame)
    }

    fn run(&self, name: &'static str, frame: &[u8]) -> Result<(u32, Vec<u8>), DecapError> {
        let fd = self.program_fd(name)?;
        crate::steer::sys::prog_test_run(fd, frame)
            .map_err(|source| DecapError::TestRun { name, source })
    }

    fn program_fd(&self, name: &'static str) -> Result<BorrowedFd<'_>, DecapError> {
        let prog = self.ebpf.program(name).ok_or(DecapError::Missing(name))?;
        Ok(prog.fd().map_err(verify(name))?.as_fd())
    }

    /// The maps to pin, by pin name (in [`MAP_PINS`] order).
    fn map_fds(&self) -> [(&'static str, BorrowedFd<'_>); 5] {
        fn fd<K: aya::Pod, V>(m: &impl IterableMap<K, V>) -> BorrowedFd<'_> {
            m.map().fd().as_fd()
        }
        [
            ("vips", fd(&self.vips)),
            ("ports", fd(&self.ports)),
            ("rports", fd(&self.rports)),
            ("settings", fd(&self.settings)),
            ("counters", fd(&self.counters)),
        ]
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, DecapError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(DecapError::Missing(name))?
        .try_into()
        .map_err(verify(name))
}

fn verify(name: &'static str) -> impl Fn(ProgramError) -> DecapError {
    move |source| DecapError::Verify { name, source }
}

fn capacity(map: &'static str, needed: usize, max: usize) -> Result<(), DecapError> {
    if needed > max {
        return Err(DecapError::Capacity { map, needed, max });
    }
    Ok(())
}
