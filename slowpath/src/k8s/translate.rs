//! The pure translation of one Service (with its EndpointSlices) into [`ServiceSpec`]s:
//! [`translate_service`]. Merging the Services of a cluster into one model is
//! [`merge`](super::merge)'s job; the rules are listed on [`build_model`](super::build_model).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use config::{Cidr, Config, Protocol};
use fastpath::snapshot::{BackendSpec, Frontend, NoEndpoints, ServiceSpec};
use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec as K8sServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::addresses::Addresses;
use super::endpoints::{self, Ep, Uses};
use super::settings::{Common, common};
use super::validate::{endpoint_refusal, refuse_service};
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

/// The translation of one Service, rule by rule: each step below is a function that names
/// the kube-proxy code it mirrors (`kubernetes/pkg/proxy/`), in the order kube-proxy applies
/// them. Problems are reported in that order too.
fn translate_into(
    svc: &Service,
    slices: &[&EndpointSlice],
    node: &NodeInfo,
    cfg: &Config,
    out: &mut Out,
) {
    let Some(s) = accepted(svc, cfg, out) else {
        return;
    };
    let common = common(svc, s.spec, cfg, &s.object, out);
    let addrs = Addresses::of(svc, s.spec, node, cfg, &s.object, out);
    let local = |p: Option<&String>| p.map(String::as_str) == Some("Local");
    let itp_local = local(s.spec.internal_traffic_policy.as_ref());
    let etp_local = local(s.spec.external_traffic_policy.as_ref());
    let node_ports_apply = matches!(s.spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
    let svc_ctx = ServiceCtx {
        s: &s,
        node,
        common: &common,
        addrs: &addrs,
        itp_local,
        etp_local,
        node_ports_apply,
    };
    let mut local_ips: HashSet<IpAddr> = HashSet::new();
    for port in s.spec.ports.iter().flatten() {
        translate_port(&svc_ctx, port, slices, &mut local_ips, out);
    }
    health_check_node_port(&s, etp_local, local_ips.len(), out);
}

/// A Service the translation takes.
struct Accepted<'a> {
    ns: &'a str,
    /// `namespace/name`.
    id: String,
    /// `Service namespace/name`, for problems.
    object: String,
    spec: &'a K8sServiceSpec,
}

/// Which Services are proxied at all: `pkg/proxy/util/utils.go` `ShouldSkipService` (the
/// `service.kubernetes.io/service-proxy-name` label selector, ExternalName and headless
/// Services skipped), plus what the API server itself would refuse (a Service it could not
/// have stored is refused as a whole, its previous translation kept).
fn accepted<'a>(svc: &'a Service, cfg: &Config, out: &mut Out) -> Option<Accepted<'a>> {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let Some(name) = svc.metadata.name.as_deref() else {
        out.problem(
            "Service ?",
            ProblemKind::Invalid,
            "no metadata.name; ignored".to_owned(),
        );
        return None;
    };
    let id = format!("{ns}/{name}");
    let object = format!("Service {id}");
    let proxy_label = svc
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME));
    let k8s = cfg.kubernetes.as_ref();
    if proxy_label != k8s.and_then(|k| k.service_proxy_name.as_ref()) {
        return None;
    }
    let Some(spec) = svc.spec.as_ref() else {
        out.problem(&object, ProblemKind::Invalid, "no spec; ignored".to_owned());
        return None;
    };
    if spec.type_.as_deref() == Some("ExternalName") || spec.cluster_ip.as_deref() == Some("None") {
        return None;
    }
    if let Some(why) = refuse_service(ns, name, spec) {
        out.t.refused = true;
        out.problem(
            &object,
            ProblemKind::ServiceRefused,
            format!("{why}: the API server refuses such a Service; ignored (its previous translation, if any, stays)"),
        );
        return None;
    }
    Some(Accepted {
        ns,
        id,
        object,
        spec,
    })
}

/// What every port of one Service shares.
struct ServiceCtx<'s> {
    s: &'s Accepted<'s>,
    node: &'s NodeInfo,
    common: &'s Common,
    addrs: &'s Addresses,
    itp_local: bool,
    etp_local: bool,
    node_ports_apply: bool,
}

/// One Service port: `pkg/proxy/nftables/proxier.go` `syncProxyRules`'s loop over the
/// service ports, its endpoints those of the EndpointSlices' port of the same name and
/// protocol (`pkg/proxy/endpointslicecache.go`), deduplicated; its local ready endpoints
/// are counted for the healthCheckNodePort.
fn translate_port(
    c: &ServiceCtx<'_>,
    port: &ServicePort,
    slices: &[&EndpointSlice],
    local_ips: &mut HashSet<IpAddr>,
    out: &mut Out,
) {
    let Some((protocol, port_no, node_port)) = check_port(port, &c.s.object, out) else {
        return;
    };
    let port_name = port.name.as_deref().unwrap_or("");
    let mut eps = collect_endpoints(slices, port_name, protocol, c.s.ns, c.node, out);
    endpoints::dedup(&mut eps);
    for e in &eps {
        if e.ready && e.node == Some(c.node.name.as_str()) {
            local_ips.insert(e.addr.ip());
        }
    }
    let label = if port_name.is_empty() {
        port_no.to_string()
    } else {
        port_name.to_owned()
    };
    let p = PortCtx {
        base: format!("{}:{label}", c.s.id),
        protocol,
        port_no,
        node_port,
        eps: &eps,
    };
    for v6 in [false, true] {
        // kube-proxy serves a Service in a family only if it has a ClusterIP of that
        // family: its externalIPs, load-balancer IPs and NodePorts of another family are
        // left to the host, not taken and dropped.
        if c.addrs.families.contains(&v6) {
            translate_family(c, &p, v6, out);
        }
    }
}

/// One Service port, as [`translate_port`] read it.
struct PortCtx<'e, 'a> {
    /// `namespace/name:port`.
    base: String,
    protocol: Protocol,
    port_no: u16,
    node_port: Option<u16>,
    eps: &'e [Ep<'a>],
}

/// One port in one IP family: `pkg/proxy/servicechangetracker.go`'s per-family service
/// map (a kube-proxy per family, `GetClusterIPByFamily`), the frontends `syncProxyRules`
/// writes rules for (ClusterIPs; externalIPs and NodePorts; load-balancer IPs), the
/// endpoints each traffic policy uses (`pkg/proxy/topology.go` `CategorizeEndpoints`), and
/// what a flow gets when there are none ([`no_endpoints`]).
fn translate_family(c: &ServiceCtx<'_>, p: &PortCtx<'_, '_>, v6: bool, out: &mut Out) {
    let fam = |ip: &&IpAddr| ip.is_ipv6() == v6;
    let fe = |ip: &IpAddr, port: u16| Frontend {
        vip: *ip,
        protocol: p.protocol,
        port,
    };
    let of = |ips: &[IpAddr]| -> Vec<Frontend> {
        ips.iter().filter(fam).map(|ip| fe(ip, p.port_no)).collect()
    };
    let internal = of(&c.addrs.cluster_ips);
    let mut external = of(&c.addrs.external_ips);
    if c.node_ports_apply
        && let Some(np) = p.node_port
    {
        external.extend(c.node.addresses.iter().filter(fam).map(|ip| fe(ip, np)));
    }
    let lb = of(&c.addrs.lb_ips);
    let family_eps: Vec<Ep<'_>> = p
        .eps
        .iter()
        .filter(|e| e.addr.is_ipv6() == v6)
        .copied()
        .collect();
    let externally_accessible =
        (c.node_ports_apply && p.node_port.is_some()) || !external.is_empty() || !lb.is_empty();
    let cat = endpoints::categorize(
        &family_eps,
        Uses::of(c.itp_local, c.etp_local, externally_accessible),
        c.node,
    );
    let (cluster, local_eps) = (
        cat.cluster.unwrap_or_default(),
        cat.local.unwrap_or_default(),
    );
    let itp = if c.itp_local { &local_eps } else { &cluster };
    let etp = if c.etp_local { &local_eps } else { &cluster };
    let g = Groups {
        c,
        family_eps: &family_eps,
        suffix: if v6 { "/v6" } else { "" },
        base: &p.base,
    };
    let int_empty = no_endpoints(c.itp_local, cat.has_any);
    g.push(
        out,
        "",
        internal,
        (itp, int_empty),
        Vec::new(),
        (false, RANK_CLUSTER_IP),
    );
    let ext_empty = no_endpoints(c.etp_local, cat.has_any);
    let ranges: Vec<Cidr> = c
        .addrs
        .source_ranges
        .iter()
        .filter(|r| r.addr.is_ipv6() == v6)
        .copied()
        .collect();
    g.external(out, external, lb, (etp, ext_empty), ranges);
}

/// What a new flow of a Service without usable endpoints gets: `pkg/proxy/nftables/
/// proxier.go` `syncProxyRules`'s `internalTrafficFilterVerdict` and
/// `externalTrafficFilterVerdict`: rejected when the Service has no endpoints at all,
/// dropped when its traffic policy is Local while its endpoints are on other nodes.
fn no_endpoints(local: bool, has_any: bool) -> NoEndpoints {
    if local && has_any {
        NoEndpoints::Drop
    } else {
        NoEndpoints::Reject
    }
}

/// Makes the specs of one port in one family.
struct Groups<'g, 'c, 'e> {
    c: &'g ServiceCtx<'c>,
    family_eps: &'g [Ep<'e>],
    suffix: &'static str,
    base: &'g str,
}

impl Groups<'_, '_, '_> {
    /// The external frontends: without source ranges, externalIPs, NodePorts and
    /// load-balancer IPs together; with them, the load-balancer IPs apart, behind the ranges
    /// (`pkg/proxy/nftables/proxier.go` `syncProxyRules`'s firewall check of
    /// `loadBalancerSourceRanges`, which applies to the load-balancer IPs only). An address
    /// that is both an externalIP and a load-balancer IP is served with the source ranges
    /// (kube-proxy checks them for the load-balancer IP, whatever else the address is).
    fn external(
        &self,
        out: &mut Out,
        mut external: Vec<Frontend>,
        lb: Vec<Frontend>,
        etp: (&[&Ep<'_>], NoEndpoints),
        ranges: Vec<Cidr>,
    ) {
        let ext = (false, RANK_EXTERNAL);
        if ranges.is_empty() {
            external.extend(lb);
            self.push(out, "/ext", external, etp, Vec::new(), ext);
        } else {
            external.retain(|f| !lb.contains(f));
            self.push(out, "/ext", external, etp, Vec::new(), ext);
            self.push(out, "/lb", lb, etp, ranges, (true, RANK_LB_RANGES));
        }
    }

    /// One spec `base{kind}{suffix}` for `frontends`, its backends the `chosen` endpoints
    /// (weighted by the Service's annotations); none when there are no frontends.
    fn push(
        &self,
        out: &mut Out,
        kind: &str,
        frontends: Vec<Frontend>,
        (chosen, no_endpoints): (&[&Ep<'_>], NoEndpoints),
        ranges: Vec<Cidr>,
        (lb, rank): (bool, u8),
    ) {
        if frontends.is_empty() {
            return;
        }
        let common = self.c.common;
        let backends = endpoints::backends(self.family_eps, chosen)
            .into_iter()
            .map(|(addr, usable)| BackendSpec {
                addr,
                weight: common.weights.get(&addr.ip()).copied().unwrap_or(1),
                usable,
            })
            .collect();
        let spec = ServiceSpec {
            name: format!("{}{kind}{}", self.base, self.suffix),
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
    }
}

/// The healthCheckNodePort of an `externalTrafficPolicy: Local` Service:
/// `pkg/proxy/service.go` `newBaseServiceInfo` (`healthCheckNodePort` when the external
/// policy is Local) served as `pkg/proxy/healthcheck/service_health.go` does, with the
/// number of local ready endpoints (`SyncEndpoints`).
fn health_check_node_port(s: &Accepted<'_>, etp_local: bool, local: usize, out: &mut Out) {
    let Some(hc) = s.spec.health_check_node_port.filter(|p| *p != 0) else {
        return;
    };
    if !etp_local {
        return;
    }
    match u16::try_from(hc) {
        Ok(port) if port != 0 => {
            out.t.hcnp = Some(HealthCheckNodePort {
                port,
                service: s.id.clone(),
                local_endpoints: u32::try_from(local).unwrap_or(u32::MAX),
            });
        }
        _ => out.problem(
            &s.object,
            ProblemKind::Invalid,
            format!("healthCheckNodePort {hc} is not a port; ignored"),
        ),
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
