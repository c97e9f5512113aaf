//! Checks across keys that serde cannot express. Each rule yields `(key path, sentence)`;
//! the loader turns the path into a line and column. All problems are collected, not just
//! the first, so a user fixes a file in one pass.
//!
//! One file per group of sections (`dataplane.rs`; `flowtable.rs` with `[timeouts]` and
//! `[synproxy]`; `services.rs`; `slowpath.rs` for the sections only the slowpath reads;
//! `sync.rs`; `bgp.rs`). This file runs them in a fixed order, so a file's problems always
//! come out in the same order, and holds what several of them share.

use std::net::IpAddr;

use crate::schema::Config;
use crate::span::KeyPath;

mod bgp;
mod dataplane;
mod flowtable;
mod services;
mod slowpath;
mod sync;

pub use bgp::{BFD_INTERVAL_MAX, BFD_INTERVAL_MIN, BFD_MULTIPLIER_MAX, BGP_BACKUP_PREPEND_MAX};
pub use dataplane::{IDLE_BACKOFF_MAX, MH_TABLE_SIZE_MAX, UMEM_FRAMES_MAX};
pub use flowtable::{BACKENDS_MAX, FLOW_BYTES, FLOWS_MAX};
pub use services::WRR_SEQUENCE_MAX;

pub(crate) type Found = Vec<(KeyPath, String)>;

pub fn validate(c: &Config) -> Found {
    let mut out = Found::new();
    out.extend(crate::address::node_addresses(c));
    dataplane::dataplane(c, &mut out);
    flowtable::flowtable(c, &mut out);
    flowtable::timeouts(c, &mut out);
    services::services(c, &mut out);
    slowpath::neighbours(c, &mut out);
    slowpath::health(c, &mut out);
    slowpath::kubernetes(c, &mut out);
    slowpath::admin(c, &mut out);
    slowpath::log(c, &mut out);
    flowtable::synproxy(c, &mut out);
    sync::sync(c, &mut out);
    bgp::bgp(c, &mut out);
    crate::dsr::validate(c, &mut out);
    out
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

fn fmt_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    }
}
