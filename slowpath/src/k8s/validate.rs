//! What the translation refuses before using it: a Service the API server would have
//! refused as a whole, and addresses no Service may take. kube-proxy can rely on the API
//! server's validation; xvs also reads fakes, old servers and objects written around it.
//!
//! - **A whole Service** ([`refuse_service`]) whose namespace, name or port names are not
//!   DNS labels (RFC 1123: 1 to 63 lowercase letters, digits and `-`, a letter or digit at
//!   each end), or whose ports share a name (unnamed ports are named by their number). Its
//!   specs are named `namespace/name:port` and those names must be unique: the merge and the
//!   snapshot builder key everything by them. Nothing of such a Service is translated; the
//!   merge keeps its previous translation, if it had one.
//! - **Frontends** ([`frontend_refusal`]): a ClusterIP, externalIP or load-balancer IP that is
//!   a special address ([`config::special_address`]: loopback, multicast, broadcast,
//!   unspecified, link-local) or one of this node's own addresses ([`NodeInfo::is_own`]).
//!   Only NodePorts listen on the node's (configured) addresses. The address is skipped for
//!   every port of the Service, the rest of the Service stays.
//! - **Endpoints** ([`endpoint_refusal`]): a special address or one of the node's own. An
//!   endpoint on a Service's VIP needs every Service to tell: the merge checks that.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec as K8sServiceSpec};

use super::{NodeInfo, ProblemKind};

/// Whether `s` is a DNS label (RFC 1123), as the API server requires of namespaces, Service
/// names and Service port names.
pub(crate) fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let end = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (1..=63).contains(&b.len()) && b.iter().all(inner) && end(b.first()) && end(b.last())
}

/// Why the API server would have refused this Service as a whole, if it would have (see
/// the module doc). Names are shown escaped (`{:?}`): they may carry anything.
pub(crate) fn refuse_service(ns: &str, name: &str, spec: &K8sServiceSpec) -> Option<String> {
    if !dns_label(ns) {
        return Some(format!("namespace {ns:?} is not a DNS label"));
    }
    if !dns_label(name) {
        return Some(format!("name {name:?} is not a DNS label"));
    }
    let ports = spec.ports.as_deref().unwrap_or(&[]);
    for (i, p) in ports.iter().enumerate() {
        if let Some(n) = name_of(p)
            && !dns_label(n)
        {
            return Some(format!("ports[{i}]: name {n:?} is not a DNS label"));
        }
        if let Some(first) = ports[..i].iter().position(|q| same_label(p, q)) {
            let label = name_of(p).map_or_else(|| p.port.to_string(), str::to_owned);
            return Some(format!(
                "ports[{i}] and ports[{first}] are both named {label:?} (a port's name, or its number when it has none)"
            ));
        }
    }
    None
}

fn name_of(p: &ServicePort) -> Option<&str> {
    p.name.as_deref().filter(|n| !n.is_empty())
}

/// Whether two ports get one spec name: their names, or their numbers when unnamed.
fn same_label(a: &ServicePort, b: &ServicePort) -> bool {
    match (name_of(a), name_of(b)) {
        (Some(x), Some(y)) => x == y,
        (None, None) => a.port == b.port,
        (Some(n), None) => n == b.port.to_string(),
        (None, Some(n)) => n == a.port.to_string(),
    }
}

/// Why `ip` cannot be a frontend of a Service on this node (other than a NodePort), if it
/// cannot: `(kind, "it is ...")`.
pub(crate) fn frontend_refusal(ip: IpAddr, node: &NodeInfo) -> Option<(ProblemKind, String)> {
    if let Some(why) = config::special_address(ip) {
        return Some((ProblemKind::FrontendSpecial, format!("it is {why}")));
    }
    node.is_own(ip).then(|| {
        (
            ProblemKind::FrontendNodeAddress,
            "it is this node's own address".to_owned(),
        )
    })
}

/// Why `ip` cannot be an endpoint (a backend), if it cannot, except for VIPs (the merge's):
/// `(kind, "it is ...")`.
pub(crate) fn endpoint_refusal(ip: IpAddr, node: &NodeInfo) -> Option<(ProblemKind, String)> {
    if let Some(why) = config::special_address(ip) {
        return Some((ProblemKind::EndpointSpecial, format!("it is {why}")));
    }
    node.is_own(ip).then(|| {
        (
            ProblemKind::EndpointNodeAddress,
            "it is this node's own address".to_owned(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for ok in ["a", "web", "web-1", "0", "80", &"a".repeat(63)] {
            assert!(dns_label(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Web",
            "a_b",
            "a.b",
            "a/b",
            "a:b",
            "web\nINFO",
            &"a".repeat(64),
        ] {
            assert!(!dns_label(bad), "{bad:?}");
        }
    }
}
