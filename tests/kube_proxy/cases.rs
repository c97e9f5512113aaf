//! The cases, as data: kube-proxy's `runPacketFlowTests` tables of
//! `pkg/proxy/nftables/proxier_test.go` in kubernetes/kubernetes at commit
//! 81810de635aa13aa0a32992f6def3aa9d6025ebc ([`UPSTREAM`]). Each [`Case`] names its upstream
//! test function (with its subtest) and case, the client, the destination and kube-proxy's
//! expected output; each [`Scenario`] names the dump of the objects that test builds (under
//! `tests/assets/kube-proxy/`, headed by the same citation) and the config standing for
//! `NewFakeProxier`'s settings. Clients are upstream's: `testExternalClient` 203.0.113.2,
//! `testExternalClientBlocked` 203.0.113.130, and the IPv6 external client 2600:5200::1 of
//! TestNodePorts.

/// Where every case comes from.
pub const UPSTREAM: &str = "kubernetes/kubernetes@81810de635aa13aa0a32992f6def3aa9d6025ebc \
                            pkg/proxy/nftables/proxier_test.go";

/// `testExternalClient`.
const EXT: &str = "203.0.113.2";
/// `testExternalClientBlocked` (outside TestLoadBalancer's source ranges).
const BLOCKED: &str = "203.0.113.130";
/// TestNodePorts' IPv6 `externalClientIP`.
const EXT6: &str = "2600:5200::1";

/// kube-proxy's expected `output`, with the reason xvs gives for the rule that decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// DNAT to one of these endpoints (upstream's list of every endpoint the packet may take).
    Forward(&'static [&'static str]),
    /// `REJECT`.
    Reject(&'static str),
    /// `DROP`.
    Drop(&'static str),
    /// `""`: no kube-proxy rule matched; the packet goes on to the host.
    Pass,
}

use Want::{Forward, Pass};

/// `REJECT` by `no-endpoint-services` / `no-endpoint-nodeports`: no usable endpoint anywhere.
const NO_ENDPOINTS: Want = Want::Reject("no_endpoints");
/// `REJECT` by `cluster-ips-check`: a port or protocol the ClusterIP does not serve.
const UNSERVED_PORT: Want = Want::Reject("unserved_port");
/// `DROP` by a `firewall` chain: a client outside `loadBalancerSourceRanges`.
const SOURCE_RANGE: Want = Want::Drop("source_range");
/// `DROP` by `no-endpoint-services`: a `Local` traffic policy without endpoints on this node
/// while the Service has some elsewhere.
const NO_LOCAL: Want = Want::Drop("no_backend");
/// `DROP` by `cluster-ips-check`: an address of the Service CIDR no Service has.
const UNALLOCATED: Want = Want::Drop("service_cidr");

/// One packet-flow case.
#[derive(Clone, Debug)]
pub struct Case {
    /// Upstream test function, with its subtest when it has one (`TestNodePorts/ipv6`).
    pub test: String,
    /// Upstream case name.
    pub name: &'static str,
    /// `tcp`, `udp` or `sctp` (upstream's default is TCP).
    pub proto: &'static str,
    pub src: &'static str,
    /// `ip:port`, `[ip6]:port`.
    pub dst: &'static str,
    pub want: Want,
    /// Upstream's `masq`: recorded, not asserted (xvs masquerades by forwarding mode, not by
    /// source: this is the forwarding decision only).
    pub masq: bool,
}

/// One dump, one config, and the cases run on them in one `xvs sim`.
pub struct Scenario {
    /// Under `tests/assets/kube-proxy/`.
    pub dump: String,
    /// Under `tests/assets/kube-proxy/`.
    pub config: &'static str,
    pub cases: Vec<Case>,
}

fn case(
    test: &str,
    name: &'static str,
    src: &'static str,
    dst: &'static str,
    want: Want,
    masq: bool,
) -> Case {
    Case {
        test: test.to_owned(),
        name,
        proto: "tcp",
        src,
        dst,
        want,
        masq,
    }
}

fn scenario(dump: impl Into<String>, cases: Vec<Case>) -> Scenario {
    Scenario {
        dump: dump.into(),
        config: "xvs.toml",
        cases,
    }
}

const EP_10_180_0_1: &[&str] = &["10.180.0.1:80"];
const EPS_NODE_PORTS: &[&str] = &["10.180.0.1:80", "10.180.2.1:80"];
const EPS_NODE_PORTS_V6: &[&str] = &["[fd00:10:180::1]:80", "[fd00:10:180::2:1]:80"];

/// TestTerminatingEndpointsTrafficPolicy{Local,Cluster}'s subtests: the dump's file name and
/// the subtest's name.
const TERMINATING: [(&str, &str); 4] = [
    ("ready-endpoints-exist", "ready endpoints exist"),
    (
        "only-terminating-endpoints-exist",
        "only terminating endpoints exist",
    ),
    (
        "terminating-endpoints-on-remote-node",
        "terminating endpoints on remote node",
    ),
    (
        "no-usable-endpoints-on-any-node",
        "no usable endpoints on any node",
    ),
];

/// TestInternalExternalMasquerade's subtests. Their overrides of the external cases change
/// `masq` only ("no LocalTrafficDetector": the three "external to ClusterIP" cases are not
/// masqueraded), so every subtest makes the same forwarding decisions.
const IEM_SUBTESTS: [&str; 4] = [
    "base",
    "no LocalTrafficDetector",
    "masqueradeAll",
    "masqueradeAll, no LocalTrafficDetector",
];

/// Every upstream case whose client is outside the cluster: 75.
#[rustfmt::skip]
pub fn external() -> Vec<Scenario> {
    let mut s = Vec::new();
    let t = "TestNoEndpointsReject";
    s.push(scenario(
        "no-endpoints-reject.yaml",
        vec![
            case(t, "external to external IP with no endpoints", EXT, "192.168.99.11:80", NO_ENDPOINTS, false),
            case(t, "external to NodePort with no endpoints", EXT, "192.168.0.2:3001", NO_ENDPOINTS, false),
            case(t, "external to LoadBalancer IP with no endpoints", EXT, "1.2.3.4:80", NO_ENDPOINTS, false),
        ],
    ));
    let t = "TestLoadBalancer";
    let ep = Forward(EP_10_180_0_1);
    s.push(scenario(
        "load-balancer.yaml",
        vec![
            case(t, "external to nodePort", EXT, "192.168.0.2:3001", ep, true),
            case(t, "nodePort bypasses LoadBalancerSourceRanges", BLOCKED, "192.168.0.2:3001", ep, true),
            case(t, "accepted external to LB1", EXT, "1.2.3.4:80", ep, true),
            case(t, "accepted external to LB2", EXT, "5.6.7.8:80", ep, true),
            case(t, "blocked external to LB1", BLOCKED, "1.2.3.4:80", SOURCE_RANGE, false),
            case(t, "blocked external to LB2", BLOCKED, "5.6.7.8:80", SOURCE_RANGE, false),
        ],
    ));
    s.extend(node_ports());
    let t = "TestExternalTrafficPolicyLocal";
    let local = Forward(&["10.180.2.1:80"]);
    s.push(scenario(
        "external-traffic-policy-local.yaml",
        vec![
            case(t, "external to external IP hits only local endpoint, unmasqueraded", EXT, "192.168.99.11:80", local, false),
            case(t, "external to LB IP hits only local endpoint, unmasqueraded", EXT, "1.2.3.4:80", local, false),
            case(t, "external to NodePort hits only local endpoint, unmasqueraded", EXT, "192.168.0.2:3001", local, false),
        ],
    ));
    let t = "TestExternalTrafficPolicyCluster";
    let both = Forward(&["10.180.0.1:80", "10.180.2.1:80"]);
    s.push(scenario(
        "external-traffic-policy-cluster.yaml",
        vec![
            case(t, "external to external IP hits both endpoints, masqueraded", EXT, "192.168.99.11:80", both, true),
            case(t, "external to LB IP hits both endpoints, masqueraded", EXT, "1.2.3.4:80", both, true),
            case(t, "external to NodePort hits both endpoints, masqueraded", EXT, "192.168.0.2:3001", both, true),
        ],
    ));
    s.extend(terminating_external());
    s.push(scenario("internal-external-masquerade.yaml", iem_external()));
    s
}

/// TestNodePorts: each subtest's external cases.
#[rustfmt::skip]
fn node_ports() -> Vec<Scenario> {
    let mut s = Vec::new();
    for (family, dump, node_ip, alt_ip, client, eps) in [
        ("ipv4", "node-ports-ipv4.yaml", "192.168.0.2:3001", "192.168.1.2:3001", EXT, EPS_NODE_PORTS),
        ("ipv6", "node-ports-ipv6.yaml", "[2001:db8::1]:3001", "[2001:db8:1::2]:3001", EXT6, EPS_NODE_PORTS_V6),
    ] {
        let t = format!("TestNodePorts/{family}");
        s.push(scenario(
            dump,
            vec![
                case(&t, "external to nodePort", client, node_ip, Forward(eps), true),
                case(&t, "secondary nodeIP ignores NodePorts", client, alt_ip, Pass, false),
            ],
        ));
        let t = format!("TestNodePorts/{family}, multiple nodeport-addresses");
        s.push(Scenario {
            dump: dump.into(),
            config: if family == "ipv4" {
                "node-ports-ipv4-multiple.toml"
            } else {
                "node-ports-ipv6-multiple.toml"
            },
            cases: vec![
                case(&t, "external to nodePort", client, node_ip, Forward(eps), true),
                case(&t, "external to nodePort on secondary IP", client, alt_ip, Forward(eps), true),
            ],
        });
    }
    s
}

/// TestTerminatingEndpointsTrafficPolicy{Local,Cluster}: "external to LB" in each subtest,
/// then "external to LB after endpoints deleted" after each.
#[rustfmt::skip]
fn terminating_external() -> Vec<Scenario> {
    let local: [(&str, Want); 4] = [
        ("external to LB", Forward(&["10.0.1.1:80", "10.0.1.2:80"])),
        ("external to LB", Forward(&["10.0.1.2:80", "10.0.1.3:80"])),
        ("external to LB, no locally-usable endpoints", NO_LOCAL),
        ("external to LB, no usable endpoints", NO_ENDPOINTS),
    ];
    let cluster: [(&str, Want); 4] = [
        ("external to LB", Forward(&["10.0.1.1:80", "10.0.1.2:80", "10.0.1.5:80"])),
        ("external to LB", Forward(&["10.0.1.2:80", "10.0.1.3:80", "10.0.1.5:80"])),
        ("external to LB", Forward(&["10.0.1.5:80"])),
        ("external to LB", NO_ENDPOINTS),
    ];
    let mut s = Vec::new();
    for (policy, dir, wants, masq) in [
        ("Local", "terminating-local", local, false),
        ("Cluster", "terminating-cluster", cluster, true),
    ] {
        let mut deleted = Vec::new();
        for ((file, sub), (name, want)) in TERMINATING.iter().zip(wants) {
            let t = format!("TestTerminatingEndpointsTrafficPolicy{policy}/{sub}");
            let masq = masq && matches!(want, Forward(_));
            let dump = format!("{dir}/{file}.yaml");
            s.push(scenario(dump, vec![case(&t, name, EXT, "1.2.3.4:80", want, masq)]));
            let after = "external to LB after endpoints deleted";
            deleted.push(case(&t, after, EXT, "1.2.3.4:80", NO_ENDPOINTS, false));
        }
        s.push(scenario(format!("{dir}/endpoints-deleted.yaml"), deleted));
    }
    s
}

/// TestInternalExternalMasquerade: the external cases of its shared flowTests, per subtest.
#[rustfmt::skip]
fn iem_external() -> Vec<Case> {
    let svc1 = Forward(&["10.180.0.1:80", "10.180.1.1:80"]);
    let svc2 = Forward(&["10.180.0.2:80", "10.180.1.2:80"]);
    let svc2_local = Forward(&["10.180.0.2:80"]);
    let svc3 = Forward(&["10.180.0.3:80", "10.180.1.3:80"]);
    let svc3_local = Forward(&["10.180.0.3:80"]);
    let base = [
        ("external to ClusterIP", "172.30.0.41:80", svc1, true),
        ("external to NodePort", "192.168.0.2:3001", svc1, true),
        ("external to LB", "1.2.3.4:80", svc1, true),
        ("external to ClusterIP with eTP:Local", "172.30.0.42:80", svc2, true),
        ("external to NodePort with eTP:Local", "192.168.0.2:3002", svc2_local, false),
        ("external to LB with eTP:Local", "5.6.7.8:80", svc2_local, false),
        ("external to ClusterIP with iTP:Local", "172.30.0.43:80", svc3_local, true),
        ("external to NodePort with iTP:Local", "192.168.0.2:3003", svc3, true),
        ("external to LB with iTP:Local", "9.10.11.12:80", svc3, true),
    ];
    let mut cases = Vec::new();
    for sub in IEM_SUBTESTS {
        let t = format!("TestInternalExternalMasquerade/{sub}");
        for (name, dst, want, masq) in base {
            let no_detector = sub.ends_with("no LocalTrafficDetector");
            let masq = masq && !(no_detector && name.starts_with("external to ClusterIP"));
            cases.push(case(&t, name, EXT, dst, want, masq));
        }
    }
    cases
}

/// The cases upstream runs from a pod (not the node, not a hairpin) to a ClusterIP, run
/// from `testExternalClient` instead: 53. kube-proxy's rules for a ClusterIP destination
/// (`service-ips`, `no-endpoint-services`, `cluster-ips-check`, the service and endpoint
/// chains) match no source except to decide masquerading, so its verdict for them is the
/// same from outside the cluster (TestInternalExternalMasquerade's "external to ClusterIP"
/// cases show it). They are not upstream's external cases; they cover what those do not:
/// unserved ports of a live ClusterIP, unallocated addresses of the Service CIDR,
/// `internalTrafficPolicy`, UDP and SCTP.
#[rustfmt::skip]
pub fn derived() -> Vec<Scenario> {
    let mut s = Vec::new();
    let pod = "pod to cluster IP with no endpoints";
    let cip = "172.30.0.41:80";
    s.push(scenario("no-endpoints-reject.yaml", vec![case("TestNoEndpointsReject", pod, EXT, cip, NO_ENDPOINTS, false)]));
    let ep = Forward(EP_10_180_0_1);
    s.push(scenario("load-balancer.yaml", vec![case("TestLoadBalancer", "pod to cluster IP", EXT, cip, ep, false)]));
    for (family, dump, ip, client, eps) in [
        ("ipv4", "node-ports-ipv4.yaml", cip, EXT, EPS_NODE_PORTS),
        ("ipv6", "node-ports-ipv6.yaml", "[fd00:172:30::41]:80", EXT6, EPS_NODE_PORTS_V6),
    ] {
        for (sub, config) in [
            ("", "xvs.toml"),
            (", multiple nodeport-addresses", if family == "ipv4" { "node-ports-ipv4-multiple.toml" } else { "node-ports-ipv6-multiple.toml" }),
        ] {
            let t = format!("TestNodePorts/{family}{sub}");
            let cases = vec![case(&t, "pod to cluster IP", client, ip, Forward(eps), false)];
            s.push(Scenario { dump: dump.into(), config, cases });
        }
    }
    let both = Forward(&["10.180.0.1:80", "10.180.2.1:80"]);
    for policy in ["Local", "Cluster"] {
        let t = format!("TestExternalTrafficPolicy{policy}");
        let name = "pod to cluster IP hits both endpoints, unmasqueraded";
        let dump = format!("external-traffic-policy-{}.yaml", policy.to_lowercase());
        s.push(scenario(dump, vec![case(&t, name, EXT, cip, both, false)]));
    }
    s.extend(terminating_derived());
    s.push(scenario("internal-external-masquerade.yaml", iem_derived()));
    s.push(scenario("cluster-ip-general.yaml", cluster_ip_general()));
    s.extend(internal_traffic_policy());
    s
}

/// TestTerminatingEndpointsTrafficPolicy{Local,Cluster}: "pod to clusterIP" (the ClusterIP
/// follows internalTrafficPolicy Cluster in both), then "... after endpoints deleted".
#[rustfmt::skip]
fn terminating_derived() -> Vec<Scenario> {
    let local: [Want; 4] = [
        Forward(&["10.0.1.1:80", "10.0.1.2:80", "10.0.1.5:80"]),
        Forward(&["10.0.1.5:80"]),
        Forward(&["10.0.1.5:80"]),
        NO_ENDPOINTS,
    ];
    let cluster: [Want; 4] = [
        Forward(&["10.0.1.1:80", "10.0.1.2:80", "10.0.1.5:80"]),
        Forward(&["10.0.1.2:80", "10.0.1.3:80", "10.0.1.5:80"]),
        Forward(&["10.0.1.5:80"]),
        NO_ENDPOINTS,
    ];
    let cip = "172.30.1.1:80";
    let mut s = Vec::new();
    for (policy, dir, wants) in [("Local", "terminating-local", local), ("Cluster", "terminating-cluster", cluster)] {
        let mut deleted = Vec::new();
        for ((file, sub), want) in TERMINATING.iter().zip(wants) {
            let t = format!("TestTerminatingEndpointsTrafficPolicy{policy}/{sub}");
            // Upstream names this case "pod to clusterIP, no usable endpoints" in the Local
            // test's last subtest only.
            let name = if policy == "Local" && want == NO_ENDPOINTS {
                "pod to clusterIP, no usable endpoints"
            } else {
                "pod to clusterIP"
            };
            let dump = format!("{dir}/{file}.yaml");
            s.push(scenario(dump, vec![case(&t, name, EXT, cip, want, false)]));
            let after = "pod to clusterIP after endpoints deleted";
            deleted.push(case(&t, after, EXT, cip, NO_ENDPOINTS, false));
        }
        s.push(scenario(format!("{dir}/endpoints-deleted.yaml"), deleted));
    }
    s
}

/// TestInternalExternalMasquerade: its "pod to ClusterIP" cases, per subtest (the
/// masqueradeAll subtests masquerade them).
#[rustfmt::skip]
fn iem_derived() -> Vec<Case> {
    let base = [
        ("pod to ClusterIP", "172.30.0.41:80", Forward(&["10.180.0.1:80", "10.180.1.1:80"])),
        ("pod to ClusterIP with eTP:Local", "172.30.0.42:80", Forward(&["10.180.0.2:80", "10.180.1.2:80"])),
        ("pod to ClusterIP with iTP:Local", "172.30.0.43:80", Forward(&["10.180.0.3:80"])),
    ];
    let mut cases = Vec::new();
    for sub in IEM_SUBTESTS {
        let t = format!("TestInternalExternalMasquerade/{sub}");
        for (name, dst, want) in base {
            cases.push(case(&t, name, EXT, dst, want, sub.starts_with("masqueradeAll")));
        }
    }
    cases
}

/// TestClusterIPGeneral, but "hairpin to cluster IP" (its client is the endpoint itself).
#[rustfmt::skip]
fn cluster_ip_general() -> Vec<Case> {
    let t = "TestClusterIPGeneral";
    let both = |port: u16| -> Want {
        Forward(match port {
            80 => &["10.180.0.1:80", "10.180.2.1:80"],
            8443 => &["10.180.0.1:8443", "10.180.2.1:8443"],
            5353 => &["10.180.0.1:5353", "10.180.2.1:5353"],
            _ => &["10.180.0.1:53", "10.180.2.1:53"],
        })
    };
    let proto = |proto: &'static str, c: Case| Case { proto, ..c };
    // Upstream names the UDP case "(TCP)" too.
    let same_port = "clusterIP with TCP, UDP, and SCTP on same port (TCP)";
    vec![
        case(t, "simple clusterIP", EXT, "172.30.0.41:80", Forward(EP_10_180_0_1), false),
        case(t, "clusterIP with multiple endpoints", EXT, "172.30.0.42:80", both(80), false),
        case(t, "clusterIP with TargetPort", EXT, "172.30.0.42:443", both(8443), false),
        case(t, same_port, EXT, "172.30.0.42:53", both(5353), false),
        proto("udp", case(t, same_port, EXT, "172.30.0.42:53", both(53), false)),
        proto("sctp", case(t, "clusterIP with TCP, UDP, and SCTP on same port (SCTP)", EXT, "172.30.0.42:53", both(53), false)),
        proto("udp", case(t, "TCP-only port does not match UDP traffic", EXT, "172.30.0.42:80", UNSERVED_PORT, false)),
        case(t, "svc1 does not accept svc2's ports", EXT, "172.30.0.41:443", UNSERVED_PORT, false),
        case(t, "packet to unallocated cluster ip", EXT, "172.30.0.50:80", UNALLOCATED, false),
    ]
}

/// TestInternalTrafficPolicy: each subtest's case, then "endpoints deleted" after each.
#[rustfmt::skip]
fn internal_traffic_policy() -> Vec<Scenario> {
    let cip = "172.30.1.1:80";
    let subtests: [(&str, &str, &str, Want); 4] = [
        ("cluster.yaml", "internalTrafficPolicy is cluster", "pod to ClusterIP hits all endpoints", Forward(&["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"])),
        ("local-one-local-endpoint.yaml", "internalTrafficPolicy is local and there is one local endpoint", "pod to ClusterIP hits only local endpoint", Forward(&["10.0.1.1:80"])),
        ("local-multiple-local-endpoints.yaml", "internalTrafficPolicy is local and there are multiple local endpoints", "pod to ClusterIP hits all local endpoints", Forward(&["10.0.1.1:80", "10.0.1.2:80"])),
        ("local-no-local-endpoints.yaml", "internalTrafficPolicy is local and there are no local endpoints", "no endpoints", NO_LOCAL),
    ];
    let mut s = Vec::new();
    let mut local_deleted = Vec::new();
    for (file, sub, name, want) in subtests {
        let t = format!("TestInternalTrafficPolicy/{sub}");
        s.push(scenario(format!("internal-traffic-policy/{file}"), vec![case(&t, name, EXT, cip, want, false)]));
        let deleted = case(&t, "endpoints deleted", EXT, cip, NO_ENDPOINTS, false);
        if file == "cluster.yaml" {
            let dump = "internal-traffic-policy/cluster-endpoints-deleted.yaml";
            s.push(scenario(dump, vec![deleted]));
        } else {
            local_deleted.push(deleted);
        }
    }
    s.push(scenario("internal-traffic-policy/local-endpoints-deleted.yaml", local_deleted));
    s
}
