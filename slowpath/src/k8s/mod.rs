//! The Kubernetes source: watches Services, EndpointSlices (discovery.k8s.io/v1), the
//! ServiceCIDRs (networking.k8s.io/v1) and this node's Node object, and translates them into
//! the source-agnostic model
//! ([`fastpath::snapshot::ServiceSpec`]) that the static source produces too.
//!
//! Three parts:
//! - [`build_model`] / [`build_specs`]: a pure function from API objects to a [`K8sModel`]. It
//!   does no I/O and reads no clock. Objects it cannot use (or parts of them: an address no
//!   Service may take, a frontend another Service has) are skipped and reported as a
//!   [`Problem`] of a [`ProblemKind`], never fatal: one bad Service must not take the others
//!   down. What it checks before use is in `validate`.
//! - [`IncrementalModel`]: the same translation kept up to date object by object: a changed
//!   EndpointSlice retranslates its Service only and patches the sorted spec list (10k
//!   Services: tens of microseconds; see `benches/src/bin/scale.rs`). Its result always
//!   equals [`build_model`] of the same objects, except that a Service refused as a whole
//!   (one the API server would refuse) keeps its previous translation, which a full
//!   translation does not have.
//! - [`connect`] and [`watch`]: kube-rs watchers (on the daemon's slowpath runtime; [`spawn`]
//!   runs them on a thread of their own for tests) that feed an [`IncrementalModel`], batching changes by `[kubernetes] min_sync_period`, retranslating
//!   everything every `sync_period`, and handing each whole model to a callback. Nothing is
//!   published until every watcher has finished its initial list, and an API server outage
//!   never publishes an empty model: the model keeps the last state while the watchers
//!   reconnect with backoff (and relist on 410 Gone).
//!
//! Semantics follow kube-proxy (see `shared/seeds/virtual-ips-and-service-proxies.md`); the
//! rules are listed on [`build_model`].

mod addresses;
mod cidrs;
pub mod dump;
mod endpoints;
pub mod hcnp;
mod incremental;
mod merge;
mod settings;
mod source;
mod translate;
mod validate;

#[cfg(test)]
mod refusal_tests;
#[cfg(test)]
mod reject_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod topology_cases;

use std::collections::HashMap;
use std::fmt;

use fastpath::snapshot::ServiceSpec;

pub use incremental::{IncrementalModel, last_change_trigger_time};
/// The API client [`connect`] builds and [`WatchService`] takes.
pub use kube::Client;
pub use merge::{build_model, build_model_with, build_specs};
pub use source::{SourceHandle, SourceStats, WatchService, connect, node_name, spawn, watch};
pub use translate::NodeInfo;

/// Label on Services (and mirrored on their EndpointSlices) naming the proxy that owns them.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label on EndpointSlices naming their Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label on the Endpoints/EndpointSlices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Node label holding the node's zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Annotation: the scheduler of every spec of the Service (`rr`, `wrr`, `mh`...).
pub const ANN_SCHEDULER: &str = "xvs.io/scheduler";
/// Annotation: scheduler flags, comma-separated (`mh-port,mh-fallback`).
pub const ANN_SCHEDULER_FLAGS: &str = "xvs.io/scheduler-flags";
/// Annotation: forwarding mode, `nat`, `fullnat` or `dsr` (direct server return).
pub const ANN_MODE: &str = "xvs.io/mode";
/// Annotation: a DSR Service's encapsulation, `ipip` (default), `gue` or `l2`; only with
/// `xvs.io/mode: dsr`.
pub const ANN_DSR_ENCAP: &str = "xvs.io/dsr-encap";
/// Annotation: per-endpoint weights, `IP=WEIGHT` comma-separated (`10.0.0.5=3,fd00::7=2`);
/// endpoints not listed weigh 1, weight 0 drains.
pub const ANN_WEIGHTS: &str = "xvs.io/weights";
/// Annotation: new connections per second admitted to each spec of the Service (token
/// bucket shared by every worker); excess new flows are dropped as `rate_limited`.
pub const ANN_NEW_CONN_RATE: &str = "xvs.io/new-conn-rate";
/// Annotation: the token bucket's size (default: the rate, one second's worth).
pub const ANN_NEW_CONN_BURST: &str = "xvs.io/new-conn-burst";
/// Annotation: the SYN proxy of every TCP spec of the Service, `off`, `on` or `auto`
/// (default: `[synproxy] mode`).
pub const ANN_SYNPROXY: &str = "xvs.io/synproxy";
/// Annotation: the Service's health check probe, `tcp`, `http` or `https` (or `none`).
/// Without it the Service's endpoints are not probed (their readiness is the
/// EndpointSlice's); the other `xvs.io/health-check-*` annotations say how, `[health]` fills
/// in what they leave out. They are taken together: one bad value and the endpoints are not
/// probed, with a problem naming it.
pub const ANN_HEALTH_PROBE: &str = "xvs.io/health-check-probe";
/// Annotation: the port probed instead of each endpoint's own.
pub const ANN_HEALTH_PORT: &str = "xvs.io/health-check-port";
/// Annotation: the path of HTTP(S) probes (`/ready`).
pub const ANN_HEALTH_PATH: &str = "xvs.io/health-check-path";
/// Annotation: the statuses HTTP(S) probes take as healthy, comma-separated (`200,204`).
pub const ANN_HEALTH_STATUS: &str = "xvs.io/health-check-status";
/// Annotation: consecutive successes before a down endpoint is up.
pub const ANN_HEALTH_RISE: &str = "xvs.io/health-check-rise";
/// Annotation: consecutive failures before an endpoint is down.
pub const ANN_HEALTH_FALL: &str = "xvs.io/health-check-fall";
/// Annotation on EndpointSlices: when the change that made the endpoints controller write
/// the slice happened (the start of network programming latency).
pub const ANN_LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// Legacy annotation carrying load-balancer source ranges when the field is empty.
pub const ANN_LB_SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// An object (or part of one) that was ignored, and why.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Problem {
    /// The object: `Service ns/name` or `EndpointSlice ns/name`.
    pub object: String,
    /// What kind of refusal: the `kind` label of its metric.
    pub kind: ProblemKind,
    /// What was wrong and what was done about it, as a phrase.
    pub reason: String,
}

impl fmt::Display for Problem {
    /// `object: reason`, with control characters of the object's name escaped (`xvs sim`
    /// prints it: a name must not break the line).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.object.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        write!(f, ": {}", self.reason)
    }
}

impl Problem {
    /// Logs the problem as the source does, one line (the object's strings quoted).
    pub fn log(&self) {
        tracing::warn!(
            object = self.object.as_str(),
            kind = self.kind.label(),
            reason = self.reason.as_str(),
            "ignored"
        );
    }
}

/// What kind of thing a [`Problem`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProblemKind {
    /// A field that cannot be used: ignored, or replaced by its default.
    Invalid,
    /// A whole Service the API server would have refused (names that are no DNS labels, two
    /// ports with one name...): not translated; its previous translation, if any, stays.
    ServiceRefused,
    /// A frontend another Service has.
    FrontendInUse,
    /// An externalIP outside `[kubernetes] external_ip_cidrs`.
    FrontendNotAllowed,
    /// A frontend on a special address (loopback, multicast, broadcast, unspecified,
    /// link-local).
    FrontendSpecial,
    /// A frontend (other than a NodePort) on one of this node's own addresses.
    FrontendNodeAddress,
    /// An endpoint on a special address.
    EndpointSpecial,
    /// An endpoint on one of this node's own addresses.
    EndpointNodeAddress,
    /// An endpoint on a Service's VIP.
    EndpointVip,
    /// A ServiceCIDR object the API server would refuse, or a Service CIDR (an object's or
    /// `[kubernetes] service_cidrs`) that holds one of this node's own addresses or is one
    /// too many.
    ServiceCidr,
}

impl ProblemKind {
    /// Every kind.
    pub const ALL: [ProblemKind; 10] = [
        ProblemKind::Invalid,
        ProblemKind::ServiceRefused,
        ProblemKind::FrontendInUse,
        ProblemKind::FrontendNotAllowed,
        ProblemKind::FrontendSpecial,
        ProblemKind::FrontendNodeAddress,
        ProblemKind::EndpointSpecial,
        ProblemKind::EndpointNodeAddress,
        ProblemKind::EndpointVip,
        ProblemKind::ServiceCidr,
    ];

    /// The label: `invalid`, `service_refused`, `frontend_in_use`...
    pub fn label(self) -> &'static str {
        match self {
            ProblemKind::Invalid => "invalid",
            ProblemKind::ServiceRefused => "service_refused",
            ProblemKind::FrontendInUse => "frontend_in_use",
            ProblemKind::FrontendNotAllowed => "frontend_not_allowed",
            ProblemKind::FrontendSpecial => "frontend_special",
            ProblemKind::FrontendNodeAddress => "frontend_node_address",
            ProblemKind::EndpointSpecial => "endpoint_special",
            ProblemKind::EndpointNodeAddress => "endpoint_node_address",
            ProblemKind::EndpointVip => "endpoint_vip",
            ProblemKind::ServiceCidr => "service_cidr",
        }
    }
}

/// A `healthCheckNodePort` of an `externalTrafficPolicy: Local` LoadBalancer Service: load
/// balancers probe it to learn whether this node has local endpoints (see [`hcnp`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheckNodePort {
    /// The port to listen on.
    pub port: u16,
    /// The Service, `ns/name`.
    pub service: String,
    /// Distinct ready endpoint addresses on this node (0 → the probe answers 503).
    pub local_endpoints: u32,
}

/// Everything one translation produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct K8sModel {
    /// The services, sorted by name.
    pub specs: Vec<ServiceSpec>,
    /// `loadBalancerSourceRanges` by spec name. Only the `/lb` specs appear here: a Service
    /// that restricts sources gets its load-balancer ingress frontends in a spec of their
    /// own, because kube-proxy applies the ranges to those frontends only (not to NodePorts
    /// or externalIPs). Enforcement is the caller's.
    pub source_ranges: HashMap<String, Vec<config::Cidr>>,
    /// Health-check node ports to serve, sorted by port.
    pub health_check_node_ports: Vec<HealthCheckNodePort>,
    /// The Service CIDRs: `[kubernetes] service_cidrs` and those of the ServiceCIDR objects,
    /// sorted, without duplicates, without any holding one of this node's own addresses (a
    /// [`Problem`]), at most `config::SERVICE_CIDRS_MAX`.
    pub service_cidrs: Vec<config::Cidr>,
    /// What was ignored.
    pub problems: Vec<Problem>,
    /// The `last-change-trigger-time`s of the EndpointSlice changes this model is the first
    /// to carry (see [`IncrementalModel::take_trigger_times`]): network programming latency
    /// is measured from them to the publish of the model. Empty from [`build_model`].
    pub trigger_times: Vec<std::time::SystemTime>,
}

/// Why the Kubernetes source could not start.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// The configuration has no `[kubernetes]` table.
    #[error("the configuration has no [kubernetes] table")]
    NotConfigured,
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// kube's error.
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig is not a file to read: not a regular file, or too large.
    #[error("kubeconfig {path}: {why}")]
    KubeconfigFile {
        /// The file.
        path: String,
        /// What it is instead.
        why: String,
    },
    /// No kubeconfig was given and the in-cluster configuration is missing.
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    /// The client could not be built from the configuration.
    #[error("kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// The runtime or its thread could not be started.
    #[error("cannot start the kubernetes source thread: {0}")]
    Runtime(#[from] std::io::Error),
}
