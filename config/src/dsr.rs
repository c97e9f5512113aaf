//! The checks of direct server return (`mode = "dsr"`) across keys: where DSR may be chosen,
//! what its services need (an outer source address per family for `ipip` and `gue`, the
//! backends' ports for `l2`, no SYN proxy), and the `[dataplane]` keys it reads.

use vocab::{Encap, Mode};

use crate::schema::{Config, SynproxyMode};
use crate::span::KeyPath;
use crate::validate::Found;

/// Smallest `[dataplane] dsr_mtu`: IPv6's minimum link MTU (RFC 8200), which leaves room for
/// the 48 bytes of the largest encapsulation.
pub const DSR_MTU_MIN: u32 = 1280;
/// Largest `[dataplane] dsr_mtu`: a jumbo frame's.
pub const DSR_MTU_MAX: u32 = 9216;

/// The widest IPv4 `[dataplane] ipip_source_prefix` (65536 outer sources, plenty for any
/// NIC's RSS).
pub const SOURCE_PREFIX_MIN_V4: u8 = 16;
/// The widest IPv6 `[dataplane] ipip_source_prefix`.
pub const SOURCE_PREFIX_MIN_V6: u8 = 48;

pub(crate) fn validate(c: &Config, out: &mut Found) {
    let dp = &c.dataplane;
    let at = |k: &str| KeyPath::of(&["dataplane", k]);
    if let Mode::Dsr(_) = dp.mode {
        out.push((
            at("mode"),
            "\"dsr\" is chosen per service (services[].mode, the xvs.io/mode annotation): its backends must decapsulate".to_owned(),
        ));
    }
    if dp.gue_port == 0 {
        out.push((at("gue_port"), "port 0 is not a valid UDP port".to_owned()));
    }
    if let Some(p) = dp.ipip_source_prefix
        && let Some(why) = crate::special_address(p.addr)
    {
        out.push((
            at("ipip_source_prefix"),
            format!(
                "{}/{} cannot hold source addresses: it starts at {why}",
                p.addr, p.prefix
            ),
        ));
    }
    if let Some(p) = dp.ipip_source_prefix
        && crate::special_address(p.addr).is_none()
    {
        let least = if p.addr.is_ipv6() {
            SOURCE_PREFIX_MIN_V6
        } else {
            SOURCE_PREFIX_MIN_V4
        };
        if p.prefix < least {
            out.push((
                at("ipip_source_prefix"),
                format!(
                    "{}/{}: too wide to be the node's own (at least /{least}): its outer sources would claim addresses of others",
                    p.addr, p.prefix
                ),
            ));
        }
    }
    if let Some(mtu) = dp.dsr_mtu
        && !(DSR_MTU_MIN..=DSR_MTU_MAX).contains(&mtu)
    {
        out.push((
            at("dsr_mtu"),
            format!("{mtu} is not between {DSR_MTU_MIN} and {DSR_MTU_MAX}"),
        ));
    }
    services(c, out);
}

/// The DSR checks of each service: `encap` only with DSR, no SYN proxy, an outer source of
/// the VIP's family for `ipip`/`gue`, no port translation for `l2`.
fn services(c: &Config, out: &mut Found) {
    let dp = &c.dataplane;
    for (i, s) in c.services.iter().enumerate() {
        let p = KeyPath::of(&["services"]).index(i);
        let Mode::Dsr(encap) = s.mode_or(dp.mode) else {
            if s.encap.is_some() {
                out.push((
                    p.key("encap"),
                    "encap applies to mode = \"dsr\" only".to_owned(),
                ));
            }
            continue;
        };
        if matches!(s.synproxy, Some(SynproxyMode::On | SynproxyMode::Auto)) {
            out.push((
                p.key("synproxy"),
                "the SYN proxy needs the backend's replies, which a DSR service never sees (its DSR services are left out of [synproxy] mode)".to_owned(),
            ));
        }
        let v6 = s.vip.is_ipv6();
        if encap != Encap::L2 && !c.has_dsr_source(v6) {
            let family = if v6 { "IPv6" } else { "IPv4" };
            out.push((
                p.key("mode"),
                format!(
                    "DSR with encap = \"{}\" needs an {family} outer source address: in node.addresses, dataplane.snat_addresses or dataplane.ipip_source_prefix",
                    encap.name()
                ),
            ));
        }
        if encap == Encap::L2 {
            for (j, b) in s.backends.iter().enumerate() {
                if b.addr.port() != s.port {
                    out.push((
                        p.key("backends").index(j).key("addr"),
                        format!(
                            "{}: encap = \"l2\" cannot translate ports (the backend receives the client's packet as sent, to port {}); use ipip or gue with a decapsulating backend",
                            b.addr, s.port
                        ),
                    ));
                }
            }
        }
    }
}
