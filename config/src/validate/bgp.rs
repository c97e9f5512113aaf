//! `[bgp]`: the AS numbers, the backups' prepending, the liveness device, BFD and the
//! neighbors.

use std::time::Duration;

use super::{Found, bad_ifname, err};
use crate::schema::Config;
use crate::span::KeyPath;

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

pub(super) fn bgp(c: &Config, out: &mut Found) {
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
