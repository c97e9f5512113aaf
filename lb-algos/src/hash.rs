//! Fixed, seedless-by-construction hashes. Every node and every restart must compute the same
//! values (Maglev tables, sh/dh buckets, table placement), so nothing here is randomised:
//! no `RandomState`, no `ahash`. The mixer is MurmurHash3's 64-bit finaliser.

use std::net::{IpAddr, SocketAddr};

/// MurmurHash3 `fmix64`: a bijection on `u64` with full avalanche.
#[inline]
pub(crate) const fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Hash of an address and, when given, a port. One `fmix64` for IPv4, two or three for IPv6.
#[inline]
pub(crate) fn ip_port(seed: u64, ip: IpAddr, port: Option<u16>) -> u64 {
    // Bit 48 marks "port present" so that port 0 differs from no port.
    let port_word = port.map_or(0, |p| (1 << 16) | u64::from(p));
    match ip {
        IpAddr::V4(a) => fmix64(seed ^ u64::from(u32::from(a)) ^ (port_word << 32)),
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let h = fmix64(seed ^ (bits >> 64) as u64 ^ (1 << 63));
            let h = fmix64(h ^ bits as u64);
            if port.is_some() {
                fmix64(h ^ port_word)
            } else {
                h
            }
        }
    }
}

/// Hash of a backend address (build time only, so it hashes every field that makes two
/// `SocketAddr`s differ).
pub(crate) fn socket_addr(seed: u64, addr: SocketAddr) -> u64 {
    let (family, bits, scope) = match addr {
        SocketAddr::V4(a) => (4u64, u128::from(u32::from(*a.ip())), 0u64),
        SocketAddr::V6(a) => (6u64, u128::from(*a.ip()), u64::from(a.scope_id())),
    };
    let words = [
        family,
        (bits >> 64) as u64,
        bits as u64,
        u64::from(addr.port()),
        scope,
    ];
    words.iter().fold(fmix64(seed), |h, &w| {
        fmix64(h ^ fmix64(w ^ 0x9e37_79b9_7f4a_7c15))
    })
}

/// Maps a 64-bit hash onto `0..n` without division (Lemire's multiply-shift on the high half).
#[inline]
pub(crate) fn reduce(h: u64, n: u32) -> usize {
    (((h >> 32) * u64::from(n)) >> 32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_fixed_across_processes() {
        // Golden values: a change here changes every Maglev table in a running cluster.
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
        let a: IpAddr = "198.18.0.1".parse().unwrap();
        assert_eq!(ip_port(7, a, None), ip_port(7, a, None));
        assert_ne!(ip_port(7, a, None), ip_port(7, a, Some(0)));
        assert_ne!(ip_port(7, a, Some(1)), ip_port(7, a, Some(2)));
        assert_ne!(ip_port(7, a, None), ip_port(8, a, None));
    }

    #[test]
    fn reduce_stays_in_range() {
        for h in [0, 1, u64::MAX, 0x8000_0000_0000_0000] {
            assert!(reduce(h, 65537) < 65537);
            assert_eq!(reduce(h, 1), 0);
        }
    }
}
