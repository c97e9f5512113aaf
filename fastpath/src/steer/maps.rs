//! The BPF map layouts shared with `bpf/steer.c`, and their encoding.
//!
//! Addresses are 16 bytes, IPv4 stored v4-mapped (`::ffff:a.b.c.d`) so one map serves both
//! families. Ports inside keys are in network byte order (the program compares them straight
//! from the packet); the SNAT port range value is in host byte order (the program converts the
//! packet's port once). Each struct is `#[repr(C)]` with the C layout, padding spelled out.

use std::net::IpAddr;

/// Capacity of the `xsks` XSKMAP: the highest queue id plus one.
pub const XSKS_MAX: u32 = 256;
/// Capacity of the `frontends` hash map.
pub const FRONTENDS_MAX: usize = 65536;
/// Capacity of the `backends` hash map.
pub const BACKENDS_MAX: usize = 65536;
/// Capacity of the `vips` hash map.
pub const VIPS_MAX: usize = 65536;
/// Capacity of the `snat` hash map.
pub const SNAT_MAX: usize = 256;
/// Capacity of the `hold` array: one entry, at index 0.
pub const HOLD_MAX: u32 = 1;
/// Capacity of the `cidrs` LPM trie: the Service CIDRs.
pub const CIDRS_MAX: usize = 64;
const _: () = assert!(CIDRS_MAX == config::SERVICE_CIDRS_MAX);

/// Bit of a `vips` value: the address of a frontend.
pub const VIP_FRONTEND: u32 = 1;
/// Bit of a `vips` value: a ClusterIP, whose every TCP/UDP/SCTP port is steered to xvs (it
/// rejects those no frontend serves).
pub const VIP_REJECT_UNSERVED: u32 = 2;

/// Key of `vips` and `snat`: `struct addr_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddrKey {
    /// The address, IPv4 v4-mapped.
    pub ip: [u8; 16],
}

/// The address part of a `cidrs` key (`struct lpm_key` after its prefix length): 16 bytes,
/// IPv4 v4-mapped, with its prefix length plus 96 (see [`lpm_key`]).
pub type LpmAddr = [u8; 16];

/// The `cidrs` key of `cidr`.
pub fn lpm_key(cidr: vocab::Cidr) -> aya::maps::lpm_trie::Key<LpmAddr> {
    let prefix = u32::from(cidr.prefix) + if cidr.addr.is_ipv4() { 96 } else { 0 };
    aya::maps::lpm_trie::Key::new(prefix, mapped(cidr.addr))
}

/// Key of `frontends` and `backends`: `struct port_key`, 20 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortKey {
    /// The address, IPv4 v4-mapped.
    pub ip: [u8; 16],
    /// The port, network byte order in memory.
    pub port_be: u16,
    /// IP protocol number (6 TCP, 17 UDP, 132 SCTP).
    pub proto: u8,
    /// Always zero: the hash covers every key byte.
    pub pad: u8,
}

/// Value of `snat`: `struct port_range`, host byte order, both ends inclusive.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    /// Lowest SNAT port.
    pub lo: u16,
    /// Highest SNAT port.
    pub hi: u16,
}

/// Value of `hold`: `struct hold`, 16 bytes. Until `CLOCK_MONOTONIC` (the clock of
/// `bpf_ktime_get_ns`) reaches `deadline_ns`, frames xvs owns that find no AF_XDP socket are
/// dropped instead of passed; 0 means no hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hold {
    /// `CLOCK_MONOTONIC` nanoseconds; 0: no hold.
    pub deadline_ns: u64,
    /// The process that set the hold.
    pub owner_pid: u32,
    /// Always zero.
    pub pad: u32,
}

// SAFETY: plain `#[repr(C)]` integers and byte arrays; no padding the compiler could leave
// uninitialised (padding is an explicit field), every bit pattern is valid.
unsafe impl aya::Pod for AddrKey {}
// SAFETY: as above.
unsafe impl aya::Pod for PortKey {}
// SAFETY: as above.
unsafe impl aya::Pod for PortRange {}
// SAFETY: as above.
unsafe impl aya::Pod for Hold {}

const _: () = assert!(size_of::<AddrKey>() == 16);
const _: () = assert!(size_of::<PortKey>() == 20);
const _: () = assert!(size_of::<PortRange>() == 4);
const _: () = assert!(size_of::<Hold>() == 16);

impl AddrKey {
    /// The key for `ip`.
    pub fn new(ip: IpAddr) -> AddrKey {
        AddrKey { ip: mapped(ip) }
    }
}

impl PortKey {
    /// The key for `ip`, IP protocol `proto`, port `port` (host order).
    pub fn new(ip: IpAddr, proto: u8, port: u16) -> PortKey {
        PortKey {
            ip: mapped(ip),
            port_be: port.to_be(),
            proto,
            pad: 0,
        }
    }
}

/// 16 bytes: IPv6 as is, IPv4 v4-mapped.
fn mapped(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn bytes<T: aya::Pod>(v: &T) -> &[u8] {
        // SAFETY: `T: Pod` has no uninitialised bytes.
        unsafe { std::slice::from_raw_parts((v as *const T).cast(), size_of::<T>()) }
    }

    #[test]
    fn ipv4_is_v4_mapped_and_port_is_network_order() {
        let k = PortKey::new(IpAddr::V4(Ipv4Addr::new(198, 18, 100, 1)), 17, 0x1f90);
        let want: [u8; 20] = [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 100, 1, // ::ffff:198.18.100.1
            0x1f, 0x90, // port 8080, big-endian
            17, 0, // proto, pad
        ];
        assert_eq!(bytes(&k), &want);
    }

    #[test]
    fn ipv6_is_verbatim() {
        let ip: Ipv6Addr = "2001:2::1".parse().unwrap();
        let k = AddrKey::new(IpAddr::V6(ip));
        assert_eq!(bytes(&k), &ip.octets());
        let p = PortKey::new(IpAddr::V6(ip), 6, 443);
        assert_eq!(&bytes(&p)[16..], &[0x01, 0xbb, 6, 0]);
    }

    #[test]
    fn lpm_keys_map_ipv4_below_96_bits() {
        let k = lpm_key("198.18.96.0/20".parse().unwrap());
        assert_eq!(k.prefix_len(), 116);
        assert_eq!(
            k.data(),
            Ipv4Addr::new(198, 18, 96, 0).to_ipv6_mapped().octets()
        );
        let k = lpm_key("2001:2:0:96::/64".parse().unwrap());
        assert_eq!(k.prefix_len(), 64);
    }

    #[test]
    fn port_range_is_host_order() {
        let r = PortRange {
            lo: 1024,
            hi: 65535,
        };
        assert_eq!(
            bytes(&r),
            [1024u16.to_ne_bytes(), 65535u16.to_ne_bytes()].concat()
        );
    }

    /// The C program spells the same capacities: a mismatch would make the loader's
    /// capacity checks lie.
    #[test]
    fn capacities_match_the_c_source() {
        let c = include_str!("../../bpf/steer.c");
        for (name, value) in [
            ("XSKS_MAX", XSKS_MAX as usize),
            ("FRONTENDS_MAX", FRONTENDS_MAX),
            ("BACKENDS_MAX", BACKENDS_MAX),
            ("VIPS_MAX", VIPS_MAX),
            ("SNAT_MAX", SNAT_MAX),
            ("HOLD_MAX", HOLD_MAX as usize),
            ("CIDRS_MAX", CIDRS_MAX),
            ("VIP_FRONTEND", VIP_FRONTEND as usize),
            ("VIP_REJECT_UNSERVED", VIP_REJECT_UNSERVED as usize),
        ] {
            let line = format!("#define {name} {value}\n");
            assert!(c.contains(&line), "steer.c lacks `{}`", line.trim());
        }
    }
}
