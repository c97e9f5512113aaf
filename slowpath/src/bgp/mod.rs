//! VIP announcement through BIRD 2 (`[bgp]`).
//!
//! xvs does not speak BGP itself: the node's BIRD does, and xvs tells it what to announce.
//! - [`announce`]: what a node announces, a pure function of the published snapshot and the
//!   config (VIPs with a usable backend that health checks have verified, this node's SNAT
//!   addresses, the peers' as backups; nothing while draining).
//! - [`render`]: the include file for bird.conf (static protocols `xvs4`/`xvs6`, the export
//!   filter `xvs_export`, and the BGP sessions when `[bgp] neighbors` lists them).
//! - [`control`]: BIRD's control socket protocol (`configure`), spoken directly.
//! - [`live`]: the liveness device every route points at: it exists only while xvs does, so
//!   a killed xvs's routes are withdrawn by BIRD at once.
//! - [`speaker`]: the task that writes the file, reconfigures BIRD (retrying while BIRD is
//!   down or refuses), and opens the device once the process is ready.

pub mod announce;
pub mod control;
pub mod live;
pub mod render;
pub mod speaker;

pub use announce::{Announcement, Inputs, RouteKind, announcement};
pub use render::render;
pub use speaker::{BgpStats, Include, Speaker, SpeakerService};

/// Every address of this host's interfaces in this network namespace (`getifaddrs`).
pub fn interface_addresses() -> std::io::Result<Vec<std::net::IpAddr>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs returned; its address, when present, is a
        // sockaddr of the family it names.
        unsafe {
            let a = (*p).ifa_addr;
            if !a.is_null() {
                match i32::from((*a).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(a as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(a as *const libc::sockaddr_in6);
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            p = (*p).ifa_next;
        }
    }
    // SAFETY: the list getifaddrs allocated, freed once.
    unsafe { libc::freeifaddrs(head) };
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_is_among_the_interface_addresses() {
        let v = super::interface_addresses().unwrap();
        assert!(v.contains(&std::net::IpAddr::from([127, 0, 0, 1])), "{v:?}");
    }
}
