//! The BPF map layouts shared with `bpf/decap.c`, and their encoding.
//!
//! Addresses are 16 bytes, IPv4 v4-mapped, as in the steering program's maps (the same
//! [`AddrKey`] and [`PortKey`]); every port, in keys and values alike, is in network byte
//! order, since the program compares and writes them straight from and into the packet.

use std::net::IpAddr;

pub use crate::steer::maps::{AddrKey, PortKey};

/// Capacity of the `vips` hash map.
pub const VIPS_MAX: usize = 4096;
/// Capacity of the `ports` and `rports` hash maps (translations).
pub const PORTS_MAX: usize = 16384;
const _: () = assert!(VIPS_MAX == config::DECAP_VIPS_MAX);
const _: () = assert!(PORTS_MAX == config::DECAP_PORTS_MAX);

/// Value of `ports` and `rports`: `struct port_value`, the port to write.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortValue {
    /// The port, network byte order in memory.
    pub port_be: u16,
    /// Always zero.
    pub pad: u16,
}

/// Value of `settings` (one entry, index 0): `struct settings`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// The GUE UDP port, network byte order in memory.
    pub gue_port_be: u16,
    /// Always zero.
    pub pad: u16,
    /// Always zero.
    pub pad2: u32,
}

// SAFETY: plain `#[repr(C)]` integers; no padding the compiler could leave uninitialised
// (padding is an explicit field), every bit pattern is valid.
unsafe impl aya::Pod for PortValue {}
// SAFETY: as above.
unsafe impl aya::Pod for Settings {}

const _: () = assert!(size_of::<PortValue>() == 4);
const _: () = assert!(size_of::<Settings>() == 8);

impl PortValue {
    /// The value for `port` (host order).
    pub fn new(port: u16) -> PortValue {
        PortValue {
            port_be: port.to_be(),
            pad: 0,
        }
    }
}

impl Settings {
    /// The settings for GUE on UDP port `gue_port` (host order).
    pub fn new(gue_port: u16) -> Settings {
        Settings {
            gue_port_be: gue_port.to_be(),
            ..Settings::default()
        }
    }
}

/// One port translation: TCP or UDP to `vip`:`port` is delivered to `target` (ingress), and
/// what leaves from `vip`:`target` leaves from `port` (egress).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortMap {
    /// The VIP.
    pub vip: IpAddr,
    /// IP protocol number: 6 (TCP) or 17 (UDP).
    pub proto: u8,
    /// The service port clients connect to.
    pub port: u16,
    /// The port the backend listens on.
    pub target: u16,
}

impl PortMap {
    /// The `ports` entry (ingress).
    pub fn ingress(&self) -> (PortKey, PortValue) {
        (
            PortKey::new(self.vip, self.proto, self.port),
            PortValue::new(self.target),
        )
    }

    /// The `rports` entry (egress).
    pub fn egress(&self) -> (PortKey, PortValue) {
        (
            PortKey::new(self.vip, self.proto, self.target),
            PortValue::new(self.port),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: aya::Pod>(v: &T) -> Vec<u8> {
        // SAFETY: `T: Pod` has no uninitialised bytes.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    #[test]
    fn translations_are_network_order_both_ways() {
        let m = PortMap {
            vip: "198.18.100.1".parse().unwrap(),
            proto: 6,
            port: 80,
            target: 8080,
        };
        let (k, v) = m.ingress();
        assert_eq!(&bytes(&k)[16..], &[0, 80, 6, 0]);
        assert_eq!(bytes(&v), [0x1f, 0x90, 0, 0]);
        let (k, v) = m.egress();
        assert_eq!(&bytes(&k)[16..], &[0x1f, 0x90, 6, 0]);
        assert_eq!(bytes(&v), [0, 80, 0, 0]);
        assert_eq!(bytes(&Settings::new(6080)), [0x17, 0xc0, 0, 0, 0, 0, 0, 0]);
    }

    /// The C program spells the same capacities: a mismatch would make the loader's
    /// capacity checks lie.
    #[test]
    fn capacities_match_the_c_source() {
        let c = include_str!("../../bpf/decap.c");
        for (name, value) in [("VIPS_MAX", VIPS_MAX), ("PORTS_MAX", PORTS_MAX)] {
            let line = format!("#define {name} {value}\n");
            assert!(c.contains(&line), "decap.c lacks `{}`", line.trim());
        }
    }
}
