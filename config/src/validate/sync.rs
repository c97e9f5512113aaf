//! `[sync]`: flow sync's own address, key, peers and pace.

use super::{Found, err};
use crate::schema::Config;
use crate::span::KeyPath;

pub(super) fn sync(c: &Config, out: &mut Found) {
    let s = &c.sync;
    let at = |k: &str| KeyPath::of(&["sync", k]);
    if !s.enable {
        return;
    }
    if s.listen.is_none() {
        err(
            out,
            at("listen"),
            "required when sync.enable = true: this node's sync address (UDP), e.g. \"198.18.2.11:7946\"",
        );
    }
    if let Some(l) = s.listen
        && (l.ip().is_unspecified() || l.port() == 0)
    {
        err(
            out,
            at("listen"),
            format!(
                "{l}: flow sync needs this node's own address and a port (it is the node's id: its peers list it as theirs, and every datagram names it)"
            ),
        );
    }
    if s.key_file.is_none() {
        err(
            out,
            at("key_file"),
            "required when sync.enable = true: a file of at least 32 bytes shared by every peer",
        );
    }
    if s.peers.is_empty() {
        err(
            out,
            at("peers"),
            "empty: name the other nodes of the tier ({ address = \"IP:PORT\", snat_addresses = [...] })",
        );
    }
    sync_peers(c, out);
    let interval = s.interval.get();
    if interval < std::time::Duration::from_millis(1)
        || interval > std::time::Duration::from_secs(1)
    {
        err(
            out,
            at("interval"),
            format!("{interval:?}: must be between 1ms and 1s"),
        );
    }
    if s.refresh.get() < std::time::Duration::from_secs(1) {
        err(
            out,
            at("refresh"),
            format!("{:?}: must be at least 1s", s.refresh.get()),
        );
    }
    if s.max_messages_per_second == 0 {
        err(
            out,
            at("max_messages_per_second"),
            "0: sync could send nothing",
        );
    }
}

/// `[sync] peers`: unicast, not this node, listed once, with SNAT addresses of their own.
fn sync_peers(c: &Config, out: &mut Found) {
    let s = &c.sync;
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in s.peers.iter().enumerate() {
        let here = KeyPath::of(&["sync", "peers"]).index(i).key("address");
        if Some(p.address) == s.listen {
            err(
                out,
                here.clone(),
                format!("{} is this node's sync.listen", p.address),
            );
        }
        if p.address.ip().is_unspecified() || p.address.port() == 0 {
            err(
                out,
                here.clone(),
                format!("{}: a peer needs a unicast address and a port", p.address),
            );
        }
        if !seen.insert(p.address) {
            err(out, here, format!("{} is listed twice", p.address));
        }
        for a in &p.snat_addresses {
            if c.dataplane.snat_addresses.contains(a) {
                err(
                    out,
                    KeyPath::of(&["sync", "peers"])
                        .index(i)
                        .key("snat_addresses"),
                    format!(
                        "{a} is this node's own dataplane.snat_addresses: every node of a tier needs its own"
                    ),
                );
            }
        }
    }
}
