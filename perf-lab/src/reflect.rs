//! Saturation mode: the XDP reflector (`bpf/reflect.c`) on the switch's uplink `up0`.
//!
//! Loaded with aya in a thread that entered the backend's namespace (an ifindex is relative
//! to the namespace); the program stays attached while the [`Reflector`] lives.

use std::net::Ipv4Addr;

use anyhow::{Context, anyhow};
use aya::Ebpf;
use aya::maps::{Array, PerCpuArray};
use aya::programs::{Xdp, XdpMode};

use crate::sys::enter_netns;

static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/reflect.o"));

/// One attached reflector.
pub struct Reflector {
    ebpf: Ebpf,
}

impl Reflector {
    /// Attaches the reflector to `ifname` in namespace `ns` (native XDP, generic as a
    /// fallback), reflecting towards `vip`.
    pub fn attach(ns: &str, ifname: &str, vip: Ipv4Addr) -> anyhow::Result<Reflector> {
        Reflector::attach_prog(ns, ifname, "reflect", vip)
    }

    /// Attaches `xdp_pass` to `ifname` in `ns`: a veth only takes XDP_TX frames from its peer
    /// when it runs an XDP program itself (its NAPI).
    pub fn attach_pass(ns: &str, ifname: &str) -> anyhow::Result<Reflector> {
        Reflector::attach_prog(ns, ifname, "xdp_pass", Ipv4Addr::UNSPECIFIED)
    }

    fn attach_prog(ns: &str, ifname: &str, name: &str, vip: Ipv4Addr) -> anyhow::Result<Reflector> {
        let ns = ns.to_owned();
        let ifname = ifname.to_owned();
        let name = name.to_owned();
        std::thread::scope(|s| {
            s.spawn(move || {
                enter_netns(&ns)?;
                let mut ebpf = Ebpf::load(PROGRAM).context("loading reflect.o")?;
                let mut cfg: Array<_, u32> =
                    Array::try_from(ebpf.map_mut("cfg").ok_or_else(|| anyhow!("no cfg map"))?)?;
                cfg.set(0, u32::from_ne_bytes(vip.octets()), 0)?;
                let prog: &mut Xdp = ebpf
                    .program_mut(&name)
                    .ok_or_else(|| anyhow!("no {name} program"))?
                    .try_into()?;
                prog.load()
                    .with_context(|| format!("verifier refused {name}"))?;
                let ifindex = nix_ifindex(&ifname)?;
                if prog.attach_to_if_index(ifindex, XdpMode::Driver).is_err() {
                    prog.attach_to_if_index(ifindex, XdpMode::Skb)
                        .with_context(|| format!("attaching {name} to {ifname} in {ns}"))?;
                }
                Ok(Reflector { ebpf })
            })
            .join()
            .map_err(|_| anyhow!("reflector thread panicked"))?
        })
    }

    /// Frames reflected so far (all CPUs).
    pub fn reflected(&self) -> u64 {
        self.counter(0)
    }

    /// Frames passed to the kernel (not perf-lab packets).
    pub fn passed(&self) -> u64 {
        self.counter(1)
    }

    /// Stops the loop: from now on perf-lab packets are dropped and counted in
    /// [`Reflector::drained`] instead of reflected.
    pub fn drain(&mut self) -> anyhow::Result<()> {
        let mut cfg: Array<_, u32> = Array::try_from(
            self.ebpf
                .map_mut("cfg")
                .ok_or_else(|| anyhow!("no cfg map"))?,
        )?;
        cfg.set(1, 1, 0)?;
        Ok(())
    }

    /// Packets dropped since [`Reflector::drain`]: what was still circulating.
    pub fn drained(&self) -> u64 {
        self.counter(2)
    }

    /// Frames reflected per backend, for backends `1..=n` (by destination MAC: backend I is
    /// 02:00:00:00:01:I).
    pub fn per_backend(&self, n: u16) -> Vec<u64> {
        (1..=u32::from(n))
            .map(|i| self.counter_in("per_backend", i))
            .collect()
    }

    fn counter(&self, idx: u32) -> u64 {
        self.counter_in("counters", idx)
    }

    fn counter_in(&self, map: &str, idx: u32) -> u64 {
        let Some(map) = self.ebpf.map(map) else {
            return 0;
        };
        let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else {
            return 0;
        };
        arr.get(&idx, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }
}

fn nix_ifindex(name: &str) -> anyhow::Result<u32> {
    let c = std::ffi::CString::new(name)?;
    // SAFETY: valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(anyhow!(
            "interface {name}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(i)
}
