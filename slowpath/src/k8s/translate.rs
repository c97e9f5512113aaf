//! The pure translation of one Service (with its EndpointSlices) into [`ServiceSpec`]s:
//! [`translate_service`]. Merging the Services of a cluster into one model is
//! [`merge`](super::merge)'s job; the rules are listed on [`build_model`](super::build_model).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use config::{Cidr, Config, Protocol};
use fastpath::snapshot::{BackendSpec, Frontend, NoEndpoints, ServiceSpec};
use k8s_openapi::api::core::v1::{Node, Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::endpoints::{self, Ep, Uses};
use super::settings::{common, source_ranges};
use super::validate::{endpoint_refusal, frontend_refusal, refuse_service};
use super::{
    HealthCheckNodePort, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, LABEL_ZONE, Problem,
    ProblemKind,
};

/// This node, as the translation needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// Node name, matched against endpoints' `nodeName` (`Local` policies, PreferSameNode).
    pub name: String,
    /// Zone, matched against `hints.forZones` (PreferSameZone); None disables zone hints.
    pub zone: Option<String>,
    /// Addresses NodePort frontends listen on.
    pub addresses: Vec<IpAddr>,
    /// The node's other addresses: no frontend and no endpoint may be on them, nor on
    /// `addresses` (except NodePorts there).
    pub own: Vec<IpAddr>,
}

impl NodeInfo {
    /// Resolves this node from the configuration and, when it exists, the Node object:
    /// `[node] zone` else the Node's `topology.kubernetes.io/zone` label; `[node] addresses`
    /// else the Node's InternalIP and ExternalIP addresses (for NodePorts); its own
    /// addresses are all of those, every address of the Node, and `[dataplane]
    /// snat_addresses`.
    pub fn resolve(cfg: &Config, name: &str, node: Option<&Node>) -> NodeInfo {
        let zone = cfg.node.zone.clone().or_else(|| {
            node.and_then(|n| n.metadata.labels.as_ref())
                .and_then(|l| l.get(LABEL_ZONE))
                .cloned()
        });
        let mut addresses = cfg.node.addresses.clone();
        if addresses.is_empty() {
            let status = node.and_then(|n| n.status.as_ref());
            for a in status
                .and_then(|s| s.addresses.as_ref())
                .into_iter()
                .flatten()
            {
                if matches!(a.type_.as_str(), "InternalIP" | "ExternalIP")
                    && let Ok(ip) = a.address.parse::<IpAddr>()
                    && !addresses.contains(&ip)
                {
                    addresses.push(ip);
                }
            }
        }
        let node_ips = node
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|a| a.address.parse::<IpAddr>().ok());
        let mut own: Vec<IpAddr> = Vec::new();
        for ip in cfg
            .node
            .addresses
            .iter()
            .copied()
            .chain(node_ips)
            .chain(cfg.dataplane.snat_addresses.iter().copied())
        {
            if !addresses.contains(&ip) && !own.contains(&ip) {
                own.push(ip);
            }
        }
        NodeInfo {
            name: name.to_owned(),
            zone,
            addresses,
            own,
        }
    }

    /// Whether `ip` is one of this node's own addresses.
    pub fn is_own(&self, ip: IpAddr) -> bool {
        self.addresses.contains(&ip) || self.own.contains(&ip)
    }
}

/// The namespace (defaulted) and name of a Service, as its specs are named.
pub(crate) fn service_key(svc: &Service) -> (&str, &str) {
    (
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or(""),
    )
}

/// The Service (namespace, name) an EndpointSlice belongs to, or None when the slice is not
/// used (no `kubernetes.io/service-name` label, or an address type other than IPv4/IPv6).
pub(crate) fn slice_service(s: &EndpointSlice) -> Option<(&str, &str)> {
    let svc = s.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
    if s.address_type != "IPv4" && s.address_type != "IPv6" {
        return None;
    }
    let ns = s.metadata.namespace.as_deref().unwrap_or("default");
    Some((ns, svc.as_str()))
}

/// Which Service wins a frontend claimed twice: the older one (creation time, then
/// namespace and name).
pub(crate) fn order_key(svc: &Service) -> OrderKey {
    (
        svc.metadata.creation_timestamp.clone(),
        svc.metadata.namespace.clone(),
        svc.metadata.name.clone(),
    )
}

/// See [`order_key`].
pub(crate) type OrderKey = (
    Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    Option<String>,
    Option<String>,
);

/// A spec as one Service translates to it, before frontends claimed by older Services are
/// taken away.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RawSpec {
    /// Frontends sorted and deduplicated, never empty.
    pub spec: ServiceSpec,
    /// The `/lb` spec of a Service with source ranges (listed in `K8sModel::source_ranges`).
    pub lb: bool,
    /// Its claim on a frontend several Services list (the lowest wins, then the older
    /// Service): [`RANK_CLUSTER_IP`], [`RANK_LB_RANGES`] or [`RANK_EXTERNAL`].
    pub rank: u8,
}

/// A ClusterIP frontend: allocated to its Service by the API server, so no externalIP or
/// load-balancer IP of another Service takes it.
pub(crate) const RANK_CLUSTER_IP: u8 = 0;
/// A load-balancer IP of a Service with source ranges: a frontend without them would let
/// through the traffic kube-proxy drops.
pub(crate) const RANK_LB_RANGES: u8 = 1;
/// Every other frontend: externalIPs, NodePorts, load-balancer IPs without source ranges.
pub(crate) const RANK_EXTERNAL: u8 = 2;

/// Everything one Service translates to, on its own.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Translated {
    /// Specs in the order they were made (the order frontend claims are settled in).
    pub specs: Vec<RawSpec>,
    /// What was ignored.
    pub problems: Vec<Problem>,
    /// Its health-check node port.
    pub hcnp: Option<HealthCheckNodePort>,
    /// The Service was refused as a whole (no specs, one [`ProblemKind::ServiceRefused`]):
    /// the merge keeps its previous translation.
    pub refused: bool,
}

pub(super) struct Out {
    t: Translated,
}

impl Out {
    pub(super) fn problem(&mut self, object: &str, kind: ProblemKind, reason: String) {
        self.t.problems.push(Problem {
            object: object.to_owned(),
            kind,
            reason,
        });
    }

    /// Adds a spec (frontends sorted and deduplicated); one without frontends is dropped.
    fn push(&mut self, mut spec: ServiceSpec, lb: bool, rank: u8) {
        spec.frontends.sort_unstable();
        spec.frontends.dedup();
        if !spec.frontends.is_empty() {
            self.t.specs.push(RawSpec { spec, lb, rank });
        }
    }
}

pub(crate) fn fmt_ip_port(ip: IpAddr, port: u16) -> String {
    SocketAddr::new(ip, port).to_string()
}

/// Translates one Service with its EndpointSlices (sorted by name). Pure.
pub(crate) fn translate_service(
    svc: &Service,
    slices: &[&EndpointSlice],
    node: &NodeInfo,
    cfg: &Config,
) -> Translated {
    let mut out = Out {
        t: Translated::default(),
    };
    translate_into(svc, slices, node, cfg, &mut out);
    // One problem once: an endpoint is read once per port of its slice.
    let mut seen = HashSet::new();
    out.t.problems.retain(|p| seen.insert(p.clone()));
    out.t
}

fn translate_into(
    svc: &Service,
    slices: &[&EndpointSlice],
    node: &NodeInfo,
    cfg: &Config,
    out: &mut Out,
) {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let Some(name) = svc.metadata.name.as_deref() else {
        out.problem(
            "Service ?",
            ProblemKind::Invalid,
            "no metadata.name; ignored".to_owned(),
        );
        return;
    };
    let id = format!("{ns}/{name}");
    let object = format!("Service {id}");
    let k8s = cfg.kubernetes.as_ref();
    let proxy_label = svc
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME));
    if proxy_label != k8s.and_then(|k| k.service_proxy_name.as_ref()) {
        return;
    }
    let Some(spec) = svc.spec.as_ref() else {
        out.problem(&object, ProblemKind::Invalid, "no spec; ignored".to_owned());
        return;
    };
    if spec.type_.as_deref() == Some("ExternalName") || spec.cluster_ip.as_deref() == Some("None") {
        return;
    }
    if let Some(why) = refuse_service(ns, name, spec) {
        out.t.refused = true;
        out.problem(
            &object,
            ProblemKind::ServiceRefused,
            format!("{why}: the API server refuses such a Service; ignored (its previous translation, if any, stays)"),
        );
        return;
    }
    let common = common(svc, spec, cfg, &object, out);

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
                    out.problem(&object, kind, format!("clusterIP {ip}: {why}; ignored"));
                }
            },
            Err(_) if s.is_empty() => {}
            Err(_) => out.problem(
                &object,
                ProblemKind::Invalid,
                format!("clusterIP {s:?} is not an IP; ignored"),
            ),
        }
    }
    let mut families: Vec<bool> = cluster_ips.iter().map(IpAddr::is_ipv6).collect();
    for f in spec.ip_families.iter().flatten() {
        families.push(f == "IPv6");
    }

    let mut lb_ips = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref());
    for ing in ingress.into_iter().flatten() {
        // ipMode Proxy: the load balancer delivers to the node itself, not to the VIP.
        if ing.ip_mode.as_deref() == Some("Proxy") {
            continue;
        }
        match ing.ip.as_deref().map(str::parse::<IpAddr>) {
            Some(Ok(ip)) => match frontend_refusal(ip, node) {
                None => lb_ips.push(ip),
                Some((kind, why)) => out.problem(
                    &object,
                    kind,
                    format!("load-balancer ingress IP {ip}: {why}; ignored"),
                ),
            },
            Some(Err(_)) => out.problem(
                &object,
                ProblemKind::Invalid,
                "a load-balancer ingress ip is not an IP; ignored".to_owned(),
            ),
            None => {}
        }
    }
    let allowed: &[Cidr] = k8s.map(|k| k.external_ip_cidrs.as_slice()).unwrap_or(&[]);
    let mut external_ips = Vec::new();
    for s in spec.external_ips.iter().flatten() {
        match s.parse::<IpAddr>() {
            Ok(ip) => match frontend_refusal(ip, node) {
                Some((kind, why)) => {
                    out.problem(&object, kind, format!("externalIP {ip}: {why}; ignored"));
                }
                None if allowed.iter().any(|c| c.contains(ip)) => external_ips.push(ip),
                None => out.problem(
                    &object,
                    ProblemKind::FrontendNotAllowed,
                    format!("externalIP {s} is outside [kubernetes] external_ip_cidrs; ignored"),
                ),
            },
            Err(_) => out.problem(
                &object,
                ProblemKind::Invalid,
                format!("externalIP {s:?} is not an IP; ignored"),
            ),
        }
    }
    let source_ranges = source_ranges(svc, spec, &object, out);

    let local = |p: Option<&String>| p.map(String::as_str) == Some("Local");
    let itp_local = local(spec.internal_traffic_policy.as_ref());
    let etp_local = local(spec.external_traffic_policy.as_ref());
    let node_ports_apply = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));

    let mut local_ips: HashSet<IpAddr> = HashSet::new();
    for port in spec.ports.iter().flatten() {
        let Some((protocol, port_no, node_port)) = check_port(port, &object, out) else {
            continue;
        };
        let port_name = port.name.as_deref().unwrap_or("");
        let mut eps = collect_endpoints(slices, port_name, protocol, ns, node, out);
        endpoints::dedup(&mut eps);
        for e in &eps {
            if e.ready && e.node == Some(node.name.as_str()) {
                local_ips.insert(e.addr.ip());
            }
        }
        let label = if port_name.is_empty() {
            port_no.to_string()
        } else {
            port_name.to_owned()
        };
        for v6 in [false, true] {
            // kube-proxy serves a Service in a family only if it has a ClusterIP of that
            // family: its externalIPs, load-balancer IPs and NodePorts of another family are
            // left to the host, not taken and dropped.
            if !families.contains(&v6) {
                continue;
            }
            let fam = |ip: &&IpAddr| ip.is_ipv6() == v6;
            let suffix = if v6 { "/v6" } else { "" };
            let fe = |ip: &IpAddr, port: u16| Frontend {
                vip: *ip,
                protocol,
                port,
            };
            let internal: Vec<Frontend> = cluster_ips
                .iter()
                .filter(fam)
                .map(|ip| fe(ip, port_no))
                .collect();
            let mut external: Vec<Frontend> = external_ips
                .iter()
                .filter(fam)
                .map(|ip| fe(ip, port_no))
                .collect();
            if node_ports_apply && let Some(np) = node_port {
                external.extend(node.addresses.iter().filter(fam).map(|ip| fe(ip, np)));
            }
            let lb: Vec<Frontend> = lb_ips
                .iter()
                .filter(fam)
                .map(|ip| fe(ip, port_no))
                .collect();
            let ranges: Vec<Cidr> = source_ranges
                .iter()
                .filter(|c| c.addr.is_ipv6() == v6)
                .copied()
                .collect();
            let base = format!("{id}:{label}");
            let family_eps: Vec<Ep<'_>> = eps
                .iter()
                .filter(|e| e.addr.is_ipv6() == v6)
                .copied()
                .collect();
            let externally_accessible =
                (node_ports_apply && node_port.is_some()) || !external.is_empty() || !lb.is_empty();
            let cat = endpoints::categorize(
                &family_eps,
                Uses::of(itp_local, etp_local, externally_accessible),
                node,
            );
            // kube-proxy rejects a new flow of a Service without endpoints anywhere, and drops
            // one whose traffic policy is Local while the endpoints are on other nodes.
            let empty = |local: bool| {
                if local && cat.has_any {
                    NoEndpoints::Drop
                } else {
                    NoEndpoints::Reject
                }
            };
            let (int_empty, ext_empty) = (empty(itp_local), empty(etp_local));
            let (cluster, local_eps) = (
                cat.cluster.unwrap_or_default(),
                cat.local.unwrap_or_default(),
            );
            let itp = if itp_local { &local_eps } else { &cluster };
            let etp = if etp_local { &local_eps } else { &cluster };
            let mut group = |name: String,
                             frontends: Vec<Frontend>,
                             (chosen, no_endpoints): (&[&Ep<'_>], NoEndpoints),
                             ranges: Vec<Cidr>,
                             lb,
                             rank| {
                if frontends.is_empty() {
                    return;
                }
                let backends = endpoints::backends(&family_eps, chosen)
                    .into_iter()
                    .map(|(addr, usable)| BackendSpec {
                        addr,
                        weight: common.weights.get(&addr.ip()).copied().unwrap_or(1),
                        usable,
                    })
                    .collect();
                let spec = ServiceSpec {
                    name,
                    frontends,
                    scheduler: common.scheduler,
                    flags: common.flags.clone(),
                    mode: common.mode,
                    affinity_timeout: common.affinity_timeout,
                    backends,
                    source_ranges: ranges,
                    rate_limit: common.rate_limit,
                    frozen: false,
                    synproxy: common.synproxy,
                    health: common.health.clone(),
                    no_endpoints,
                    cluster_ip: rank == RANK_CLUSTER_IP,
                };
                out.push(spec, lb, rank);
            };
            let (cluster_ip, ext) = (RANK_CLUSTER_IP, RANK_EXTERNAL);
            group(
                format!("{base}{suffix}"),
                internal,
                (itp, int_empty),
                Vec::new(),
                false,
                cluster_ip,
            );
            if source_ranges.is_empty() {
                external.extend(lb);
                let name = format!("{base}/ext{suffix}");
                group(name, external, (etp, ext_empty), Vec::new(), false, ext);
            } else {
                // An address that is both an externalIP and a load-balancer IP is served with
                // the source ranges (kube-proxy checks them for the load-balancer IP, whatever
                // else the address is).
                external.retain(|f| !lb.contains(f));
                let name = format!("{base}/ext{suffix}");
                group(name, external, (etp, ext_empty), Vec::new(), false, ext);
                let name = format!("{base}/lb{suffix}");
                group(name, lb, (etp, ext_empty), ranges, true, RANK_LB_RANGES);
            }
        }
    }

    if etp_local && let Some(hc) = spec.health_check_node_port.filter(|p| *p != 0) {
        match u16::try_from(hc) {
            Ok(port) if port != 0 => {
                out.t.hcnp = Some(HealthCheckNodePort {
                    port,
                    service: id.clone(),
                    local_endpoints: u32::try_from(local_ips.len()).unwrap_or(u32::MAX),
                });
            }
            _ => out.problem(
                &object,
                ProblemKind::Invalid,
                format!("healthCheckNodePort {hc} is not a port; ignored"),
            ),
        }
    }
}

/// Protocol, port and node port of a Service port, or None (with a problem) when malformed.
fn check_port(
    p: &ServicePort,
    object: &str,
    out: &mut Out,
) -> Option<(Protocol, u16, Option<u16>)> {
    let name = p.name.as_deref().unwrap_or("");
    let protocol = match parse_protocol(p.protocol.as_deref()) {
        Some(proto) => proto,
        None => {
            out.problem(
                object,
                ProblemKind::Invalid,
                format!(
                    "port {name:?}: unsupported protocol {:?}; port ignored",
                    p.protocol.as_deref().unwrap_or("")
                ),
            );
            return None;
        }
    };
    let Some(port) = u16::try_from(p.port).ok().filter(|p| *p != 0) else {
        out.problem(
            object,
            ProblemKind::Invalid,
            format!(
                "port {name:?}: {} is not a port number; port ignored",
                p.port
            ),
        );
        return None;
    };
    let node_port = match p.node_port {
        None | Some(0) => None,
        Some(n) => match u16::try_from(n) {
            Ok(n) => Some(n),
            Err(_) => {
                out.problem(
                    object,
                    ProblemKind::Invalid,
                    format!("port {name:?}: nodePort {n} is not a port number; port ignored"),
                );
                return None;
            }
        },
    };
    Some((protocol, port, node_port))
}

fn parse_protocol(p: Option<&str>) -> Option<Protocol> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        "SCTP" => Some(Protocol::Sctp),
        _ => None,
    }
}

/// The endpoints of one Service port across its slices: the number comes from each slice's
/// port of the same name and protocol (so named targetPorts may differ between slices).
fn collect_endpoints<'a>(
    slices: &[&'a EndpointSlice],
    port_name: &str,
    protocol: Protocol,
    ns: &str,
    node: &NodeInfo,
    out: &mut Out,
) -> Vec<Ep<'a>> {
    let mut eps = Vec::new();
    for s in slices {
        let Some(sp) = s.ports.iter().flatten().find(|sp| {
            sp.name.as_deref().unwrap_or("") == port_name
                && parse_protocol(sp.protocol.as_deref()) == Some(protocol)
        }) else {
            continue;
        };
        let Some(port) = sp
            .port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
        else {
            let sname = s.metadata.name.as_deref().unwrap_or("?");
            out.problem(
                &format!("EndpointSlice {ns}/{sname}"),
                ProblemKind::Invalid,
                format!("port {port_name:?} has no valid number; slice ignored for it"),
            );
            continue;
        };
        let v6 = s.address_type == "IPv6";
        for e in s.endpoints.iter().flatten() {
            // kube-proxy uses the first address only: the others are the same Pod.
            let Some(ip) = e.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                let sname = s.metadata.name.as_deref().unwrap_or("?");
                out.problem(
                    &format!("EndpointSlice {ns}/{sname}"),
                    ProblemKind::Invalid,
                    format!(
                        "endpoint address {:?} is not an IP; endpoint ignored",
                        e.addresses.first()
                    ),
                );
                continue;
            };
            if ip.is_ipv6() != v6 {
                continue;
            }
            if let Some((kind, why)) = endpoint_refusal(ip, node) {
                let sname = s.metadata.name.as_deref().unwrap_or("?");
                out.problem(
                    &format!("EndpointSlice {ns}/{sname}"),
                    kind,
                    format!("endpoint {ip}: {why}; endpoint ignored"),
                );
                continue;
            }
            let c = e.conditions.as_ref();
            let hints = e.hints.as_ref();
            eps.push(Ep {
                addr: SocketAddr::new(ip, port),
                ready: c.and_then(|c| c.ready).unwrap_or(true),
                serving: c.and_then(|c| c.serving).unwrap_or(true),
                terminating: c.and_then(|c| c.terminating).unwrap_or(false),
                node: e.node_name.as_deref(),
                zone_hints: hints.and_then(|h| h.for_zones.as_deref()).unwrap_or(&[]),
                node_hints: hints.and_then(|h| h.for_nodes.as_deref()).unwrap_or(&[]),
            });
        }
    }
    eps
}
