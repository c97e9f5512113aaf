//! The addresses a Service is reached at, as kube-proxy reads them from the Service (each
//! function names the kube-proxy code it mirrors), each checked against this node
//! ([`frontend_refusal`]): what [`super::translate`] makes frontends of.

use std::net::IpAddr;

use config::{Cidr, Config};
use k8s_openapi::api::core::v1::{Service, ServiceSpec as K8sServiceSpec};

use super::ProblemKind;
use super::settings::source_ranges;
use super::translate::{NodeInfo, Out};
use super::validate::frontend_refusal;

/// The addresses a Service is reached at, each checked against this node.
pub(super) struct Addresses {
    pub(super) cluster_ips: Vec<IpAddr>,
    /// The families the Service is served in (`true`: IPv6).
    pub(super) families: Vec<bool>,
    pub(super) lb_ips: Vec<IpAddr>,
    pub(super) external_ips: Vec<IpAddr>,
    pub(super) source_ranges: Vec<Cidr>,
}

impl Addresses {
    /// Every address of `svc`, in the order kube-proxy reads them (problems in that order).
    pub(super) fn of(
        svc: &Service,
        spec: &K8sServiceSpec,
        node: &NodeInfo,
        cfg: &Config,
        object: &str,
        out: &mut Out,
    ) -> Addresses {
        let cluster_ips = cluster_ips(spec, node, object, out);
        let mut families: Vec<bool> = cluster_ips.iter().map(IpAddr::is_ipv6).collect();
        for f in spec.ip_families.iter().flatten() {
            families.push(f == "IPv6");
        }
        Addresses {
            cluster_ips,
            families,
            lb_ips: load_balancer_ips(svc, node, object, out),
            external_ips: external_ips(spec, node, cfg, object, out),
            source_ranges: source_ranges(svc, spec, object, out),
        }
    }
}

/// The ClusterIPs: `pkg/proxy/util/utils.go` `GetClusterIPByFamily` (`spec.clusterIPs`,
/// else the older `spec.clusterIP`), each one refused that is this node's or not routable.
fn cluster_ips(spec: &K8sServiceSpec, node: &NodeInfo, object: &str, out: &mut Out) -> Vec<IpAddr> {
    let mut cluster_ips = Vec::new();
    let ips = match spec.cluster_ips.as_deref() {
        Some(ips) if !ips.is_empty() => ips,
        _ => spec.cluster_ip.as_slice(),
    };
    for s in ips {
        match s.parse::<IpAddr>() {
            Ok(ip) => match frontend_refusal(ip, node) {
                None => cluster_ips.push(ip),
                Some((kind, why)) => {
                    out.problem(object, kind, format!("clusterIP {ip}: {why}; ignored"));
                }
            },
            Err(_) if s.is_empty() => {}
            Err(_) => out.problem(
                object,
                ProblemKind::Invalid,
                format!("clusterIP {s:?} is not an IP; ignored"),
            ),
        }
    }
    cluster_ips
}

/// The load-balancer IPs: `pkg/proxy/service.go` `newBaseServiceInfo`'s `loadBalancerVIPs`
/// from `status.loadBalancer.ingress`, leaving out `ipMode: Proxy` ingresses
/// (`pkg/proxy/util/utils.go` `IsVIPMode`: the load balancer delivers to the node itself).
fn load_balancer_ips(svc: &Service, node: &NodeInfo, object: &str, out: &mut Out) -> Vec<IpAddr> {
    let mut lb_ips = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref());
    for ing in ingress.into_iter().flatten() {
        if ing.ip_mode.as_deref() == Some("Proxy") {
            continue;
        }
        match ing.ip.as_deref().map(str::parse::<IpAddr>) {
            Some(Ok(ip)) => match frontend_refusal(ip, node) {
                None => lb_ips.push(ip),
                Some((kind, why)) => out.problem(
                    object,
                    kind,
                    format!("load-balancer ingress IP {ip}: {why}; ignored"),
                ),
            },
            Some(Err(_)) => out.problem(
                object,
                ProblemKind::Invalid,
                "a load-balancer ingress ip is not an IP; ignored".to_owned(),
            ),
            None => {}
        }
    }
    lb_ips
}

/// The externalIPs: `pkg/proxy/service.go` `newBaseServiceInfo`'s `externalIPs`; unlike
/// kube-proxy, only those inside `[kubernetes] external_ip_cidrs` (what the
/// `DenyServiceExternalIPs` admission plugin leaves to the cluster, xvs decides per node).
fn external_ips(
    spec: &K8sServiceSpec,
    node: &NodeInfo,
    cfg: &Config,
    object: &str,
    out: &mut Out,
) -> Vec<IpAddr> {
    let k8s = cfg.kubernetes.as_ref();
    let allowed: &[Cidr] = k8s.map(|k| k.external_ip_cidrs.as_slice()).unwrap_or(&[]);
    let mut external_ips = Vec::new();
    for s in spec.external_ips.iter().flatten() {
        match s.parse::<IpAddr>() {
            Ok(ip) => match frontend_refusal(ip, node) {
                Some((kind, why)) => {
                    out.problem(object, kind, format!("externalIP {ip}: {why}; ignored"));
                }
                None if allowed.iter().any(|c| c.contains(ip)) => external_ips.push(ip),
                None => out.problem(
                    object,
                    ProblemKind::FrontendNotAllowed,
                    format!("externalIP {s} is outside [kubernetes] external_ip_cidrs; ignored"),
                ),
            },
            Err(_) => out.problem(
                object,
                ProblemKind::Invalid,
                format!("externalIP {s:?} is not an IP; ignored"),
            ),
        }
    }
    external_ips
}
