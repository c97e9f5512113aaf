//! The cluster's Service CIDRs: those of the `networking.k8s.io/v1` ServiceCIDR objects
//! (GA in v1.33) and `[kubernetes] service_cidrs`, checked before use ([`service_cidrs`]).
//! kube-proxy drops packets to an address inside one that no Service has, and so does xvs
//! (`service_cidr`).
//!
//! The objects are untrusted input: each is checked as the API server would (at most two
//! CIDRs, one per family, each a canonical CIDR); one that fails is skipped whole, with a
//! [`Problem`], and the others are used. A CIDR, an object's or the config's, that holds one
//! of this node's own addresses is refused alone (the node's own traffic would be dropped).
//! At most [`config::SERVICE_CIDRS_MAX`] are kept (the config's first, then the objects' by
//! name), the rest refused.

use std::collections::BTreeSet;
use std::net::IpAddr;

use config::Cidr;
use k8s_openapi::api::networking::v1::ServiceCIDR;

use super::translate::NodeInfo;
use super::{Problem, ProblemKind};

/// The Service CIDRs of `objects` and `configured` for `node`, sorted, without duplicates,
/// and the problems of what was refused.
pub(crate) fn service_cidrs(
    objects: &[&ServiceCIDR],
    configured: &[Cidr],
    node: &NodeInfo,
) -> (Vec<Cidr>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut refuse = |object: String, reason: String| {
        problems.push(Problem {
            object,
            kind: ProblemKind::ServiceCidr,
            reason,
        });
    };
    let mut candidates: Vec<(String, Cidr)> = configured
        .iter()
        .map(|c| ("config [kubernetes] service_cidrs".to_owned(), *c))
        .collect();
    let mut objects: Vec<&ServiceCIDR> = objects.to_vec();
    objects.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for o in objects {
        let object = format!("ServiceCIDR {}", o.metadata.name.as_deref().unwrap_or("?"));
        match object_cidrs(o) {
            Ok(cidrs) => candidates.extend(cidrs.into_iter().map(|c| (object.clone(), c))),
            Err(why) => refuse(object, format!("{why}; ignored")),
        }
    }
    let mut kept: BTreeSet<Cidr> = BTreeSet::new();
    for (object, cidr) in candidates {
        if let Some(own) = own_address_in(cidr, node) {
            refuse(
                object,
                format!(
                    "{cidr} holds {own}, one of this node's own addresses (its traffic would be dropped); CIDR ignored"
                ),
            );
        } else if kept.len() >= config::SERVICE_CIDRS_MAX && !kept.contains(&cidr) {
            refuse(
                object,
                format!(
                    "{cidr}: more than {} Service CIDRs in all; CIDR ignored",
                    config::SERVICE_CIDRS_MAX
                ),
            );
        } else {
            kept.insert(cidr);
        }
    }
    (kept.into_iter().collect(), problems)
}

/// The CIDRs of one object, or why the API server would refuse it.
fn object_cidrs(o: &ServiceCIDR) -> Result<Vec<Cidr>, String> {
    let list = o
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.as_deref())
        .unwrap_or(&[]);
    if list.len() > 2 {
        return Err(format!(
            "spec.cidrs has {} entries (at most 2, one per family)",
            list.len()
        ));
    }
    let mut out: Vec<Cidr> = Vec::with_capacity(list.len());
    for s in list {
        let c: Cidr = s
            .parse()
            .map_err(|e: String| format!("spec.cidrs: {}", e.escape_debug()))?;
        if out.iter().any(|o| o.addr.is_ipv4() == c.addr.is_ipv4()) {
            return Err(format!(
                "spec.cidrs has two CIDRs of one family ({} and {c})",
                out[0]
            ));
        }
        out.push(c);
    }
    Ok(out)
}

/// One of this node's own addresses inside `cidr`.
fn own_address_in(cidr: Cidr, node: &NodeInfo) -> Option<IpAddr> {
    node.addresses
        .iter()
        .chain(&node.own)
        .copied()
        .find(|a| cidr.contains(*a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::ServiceCIDRSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn obj(name: &str, cidrs: &[&str]) -> ServiceCIDR {
        ServiceCIDR {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceCIDRSpec {
                cidrs: Some(cidrs.iter().map(|s| (*s).to_owned()).collect()),
            }),
            status: None,
        }
    }

    fn node() -> NodeInfo {
        NodeInfo {
            name: "n1".into(),
            zone: None,
            addresses: vec!["198.18.0.10".parse().unwrap()],
            own: vec!["198.18.1.254".parse().unwrap()],
        }
    }

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn objects_and_config_are_merged_sorted_and_deduplicated() {
        let a = obj("kubernetes", &["198.18.96.0/20", "2001:2:0:96::/112"]);
        let b = obj("extra", &["198.18.112.0/24"]);
        let (cidrs, problems) = service_cidrs(&[&a, &b], &[c("198.18.96.0/20")], &node());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            cidrs,
            [
                c("198.18.96.0/20"),
                c("198.18.112.0/24"),
                c("2001:2:0:96::/112")
            ]
        );
    }

    #[test]
    fn a_bad_object_is_skipped_alone_with_one_problem() {
        let good = obj("good", &["198.18.96.0/20"]);
        let host_bits = obj("hostbits", &["198.18.96.1/20"]);
        let three = obj(
            "three",
            &["198.18.97.0/24", "198.18.98.0/24", "2001:2::/64"],
        );
        let same_family = obj("twice", &["198.18.97.0/24", "198.18.98.0/24"]);
        let garbage = obj("garbage", &["not a cidr\n"]);
        let (cidrs, problems) = service_cidrs(
            &[&good, &host_bits, &three, &same_family, &garbage],
            &[],
            &node(),
        );
        assert_eq!(cidrs, [c("198.18.96.0/20")]);
        let objects: Vec<&str> = problems.iter().map(|p| p.object.as_str()).collect();
        assert_eq!(
            objects,
            [
                "ServiceCIDR garbage",
                "ServiceCIDR hostbits",
                "ServiceCIDR three",
                "ServiceCIDR twice"
            ]
        );
        assert!(problems.iter().all(|p| p.kind == ProblemKind::ServiceCidr));
        assert!(!problems[0].reason.contains('\n'), "{:?}", problems[0]);
        assert!(
            problems[1].reason.contains("198.18.96.1/20"),
            "{:?}",
            problems[1]
        );
    }

    #[test]
    fn a_cidr_holding_the_nodes_own_address_is_refused() {
        let all = obj("all", &["0.0.0.0/0"]);
        let snat = obj("snat", &["198.18.1.0/24", "2001:2:0:96::/112"]);
        let (cidrs, problems) = service_cidrs(&[&all, &snat], &[c("198.18.0.0/24")], &node());
        assert_eq!(cidrs, [c("2001:2:0:96::/112")]);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].object.starts_with("config"), "{problems:?}");
        assert!(problems[0].reason.contains("198.18.0.10"), "{problems:?}");
        assert!(problems[2].reason.contains("198.18.1.254"), "{problems:?}");
    }

    #[test]
    fn more_than_the_maximum_are_refused() {
        let many: Vec<ServiceCIDR> = (0..config::SERVICE_CIDRS_MAX + 3)
            .map(|i| obj(&format!("c{i:03}"), &[&format!("10.{}.0.0/16", i)]))
            .collect();
        let refs: Vec<&ServiceCIDR> = many.iter().collect();
        let (cidrs, problems) = service_cidrs(&refs, &[], &node());
        assert_eq!(cidrs.len(), config::SERVICE_CIDRS_MAX);
        assert_eq!(problems.len(), 3);
        assert!(problems[0].reason.contains("more than"), "{problems:?}");
    }
}
