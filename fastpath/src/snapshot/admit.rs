//! Which flows read from a state file (adopted with the flow table, or imported from an
//! older state or an export) the running config can own: [`StateCheck`], the
//! [`FlowCheck`] the daemon gives the flow table. The table already refuses what no table
//! may hold (see `flowtable`'s persist module); this is the config's part:
//!
//! - the flags byte holds only bits the pipeline sets (full-NAT, peer, SYN proxy, DSR and
//!   its encapsulation), in combinations it makes (a DSR flow is neither full-NAT nor the
//!   SYN proxy's, and names a known encapsulation);
//! - the service id is below [`SERVICE_IDS_MAX`] and the backend id below
//!   `[flowtable] backends_max` (the builder never hands out more, and adopting an id
//!   reserves every id below it);
//! - a full-NAT flow's SNAT address is one of `[dataplane] snat_addresses` (or a peer's,
//!   with `[sync]` on); a NAT flow's is its client;
//! - with static services (no `[kubernetes]`): the VIP, protocol and port are a frontend of
//!   a configured service and the backend one of that service's backends (a TCP or SCTP
//!   flow to a backend no longer listed stays when `removed_backend_tcp = "keep"`, as the
//!   removal policy would keep it); an ICMP flow's VIP is a configured VIP with that
//!   backend address. With Kubernetes the services are not known when the table is
//!   opened: the builder and the removal pass deal with ids the first snapshot lacks
//!   (`adopt.rs`).

use std::net::{IpAddr, SocketAddr};

use config::{Config, RemovedBackendPolicy};
use flowtable::{FlowCheck, FlowData, FlowState, Protocol, Refusal};

use super::Frontend;
use super::spec::ServiceSpec;
use crate::pipeline::dsr::{DSR_FLAGS, encap_of};
use crate::pipeline::{FLAG_DSR, FLAG_FULLNAT, FLAG_PEER, FLAG_SYNPROXY};

// One lookup or three per adopted flow: SipHash would cost more than the rest of the check.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
type HashSet<K> = std::collections::HashSet<K, ahash::RandomState>;

/// Service ids a flow may hold: the builder hands out ids from 0, one per service at a
/// time, so a real table stays far below; adopting an id makes the builder keep a slot for
/// every id below it, which bounds what a damaged file can make it allocate.
pub const SERVICE_IDS_MAX: u32 = 1 << 18;

/// The flow bits the pipeline sets.
const FLAGS_KNOWN: u8 = FLAG_FULLNAT | FLAG_PEER | FLAG_SYNPROXY | DSR_FLAGS;

/// The config's view of flows read from a state file (see the module doc).
#[derive(Debug)]
pub struct StateCheck {
    backends_max: u32,
    snat: HashSet<IpAddr>,
    /// Static services: each frontend's backends. `None` with Kubernetes.
    frontends: Option<HashMap<Frontend, HashSet<SocketAddr>>>,
    /// Static services: each VIP's backend addresses (ICMP flows).
    vips: HashMap<IpAddr, HashSet<IpAddr>>,
    keep_removed: bool,
}

impl StateCheck {
    /// The check of `cfg`.
    pub fn from_config(cfg: &Config) -> StateCheck {
        let mut snat: HashSet<IpAddr> = cfg.dataplane.snat_addresses.iter().copied().collect();
        snat.extend(cfg.sync.peer_snat_addresses());
        let mut vips: HashMap<IpAddr, HashSet<IpAddr>> = HashMap::default();
        let frontends = cfg.kubernetes.is_none().then(|| {
            let mut map: HashMap<Frontend, HashSet<SocketAddr>> = HashMap::default();
            for s in ServiceSpec::from_config(cfg) {
                let backends: HashSet<SocketAddr> = s.backends.iter().map(|b| b.addr).collect();
                for f in &s.frontends {
                    map.entry(*f).or_default().extend(&backends);
                    vips.entry(f.vip)
                        .or_default()
                        .extend(backends.iter().map(SocketAddr::ip));
                }
            }
            map
        });
        StateCheck {
            backends_max: cfg.flowtable.backends_max,
            snat,
            frontends,
            vips,
            keep_removed: cfg.flowtable.removed_backend_tcp == RemovedBackendPolicy::Keep,
        }
    }

    fn services(
        &self,
        d: &FlowData,
        frontends: &HashMap<Frontend, HashSet<SocketAddr>>,
    ) -> Result<(), Refusal> {
        let listed = match Frontend::of_flow(d) {
            Some(f) => {
                let Some(backends) = frontends.get(&f) else {
                    return Err(Refusal::new(
                        "vip",
                        format!(
                            "{}/{} (no configured service has it)",
                            d.vip,
                            d.proto.name()
                        ),
                    ));
                };
                backends.contains(&d.backend)
            }
            None => {
                let Some(backends) = self.vips.get(&d.vip.ip()) else {
                    return Err(Refusal::new(
                        "vip",
                        format!("{} (no configured service has it)", d.vip.ip()),
                    ));
                };
                backends.contains(&d.backend.ip())
            }
        };
        let kept = self.keep_removed && matches!(d.proto, Protocol::Tcp | Protocol::Sctp);
        if !listed && !kept {
            return Err(Refusal::new(
                "backend",
                format!("{} (no backend of the service of {})", d.backend, d.vip),
            ));
        }
        Ok(())
    }
}

impl FlowCheck for StateCheck {
    fn check(&self, d: &FlowData, _: FlowState) -> Result<(), Refusal> {
        if d.flags & !FLAGS_KNOWN != 0 {
            return Err(Refusal::new(
                "flags",
                format!("{:#04x} (unknown bits)", d.flags),
            ));
        }
        if d.flags & DSR_FLAGS != 0
            && (encap_of(d.flags).is_none() || d.flags & (FLAG_FULLNAT | FLAG_SYNPROXY) != 0)
        {
            return Err(Refusal::new(
                "flags",
                format!(
                    "{:#04x} (no DSR flow the pipeline makes: DSR bit {}, encapsulation code {}, full-NAT or SYN proxy)",
                    d.flags,
                    d.flags & FLAG_DSR != 0,
                    (d.flags & DSR_FLAGS & !FLAG_DSR) >> 3
                ),
            ));
        }
        if d.service_id >= SERVICE_IDS_MAX {
            return Err(Refusal::new(
                "service_id",
                format!("{} (at most {})", d.service_id, SERVICE_IDS_MAX - 1),
            ));
        }
        if d.backend_id.0 >= self.backends_max {
            return Err(Refusal::new(
                "backend_id",
                format!("{} (backends_max {})", d.backend_id.0, self.backends_max),
            ));
        }
        if d.flags & FLAG_FULLNAT != 0 {
            if !self.snat.contains(&d.snat.ip()) {
                return Err(Refusal::new(
                    "snat",
                    format!("{} (not a configured SNAT address)", d.snat),
                ));
            }
        } else if d.snat != d.client {
            return Err(Refusal::new(
                "snat",
                format!("{} (a NAT flow's is its client, {})", d.snat, d.client),
            ));
        }
        match &self.frontends {
            Some(frontends) => self.services(d, frontends),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use flowtable::{BackendId, TcpState};

    use super::*;

    const CFG: &str = r#"
[dataplane]
snat_addresses = ["198.18.1.254"]
[[services]]
name = "web"
vip = "198.18.100.1"
port = 80
protocol = "tcp"
backends = [{ addr = "198.18.1.1:8080" }, { addr = "198.18.1.2:8080" }]
[[services]]
name = "dns"
vip = "198.18.100.1"
port = 53
protocol = "udp"
backends = [{ addr = "198.18.1.3:53" }]
"#;

    fn flow() -> FlowData {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        FlowData {
            proto: Protocol::Tcp,
            client: sa("198.18.0.9:40000"),
            vip: sa("198.18.100.1:80"),
            backend: sa("198.18.1.2:8080"),
            snat: sa("198.18.1.254:2000"),
            service_id: 0,
            backend_id: BackendId(1),
            snapshot_gen: 1,
            flags: FLAG_FULLNAT,
        }
    }

    fn field(c: &StateCheck, d: FlowData) -> Option<&'static str> {
        c.check(&d, FlowState::Tcp(TcpState::Established))
            .err()
            .map(|r| r.field)
    }

    #[test]
    fn static_services_own_their_frontends_backends_and_snat() {
        let cfg = config::parse(CFG, "t.toml").unwrap();
        let c = StateCheck::from_config(&cfg);
        assert_eq!(field(&c, flow()), None);
        let mut d = flow();
        d.vip.set_port(81);
        assert_eq!(field(&c, d), Some("vip"));
        let mut d = flow();
        d.backend = "198.18.1.3:53".parse().unwrap(); // dns's backend, not web's
        assert_eq!(field(&c, d), Some("backend"));
        let mut d = flow();
        d.snat = "198.18.1.253:2000".parse().unwrap();
        assert_eq!(field(&c, d), Some("snat"));
        let mut d = flow();
        d.flags = 0; // NAT: the backend sees the client
        assert_eq!(field(&c, d), Some("snat"));
        d.snat = d.client;
        assert_eq!(field(&c, d), None);
        let mut d = flow();
        d.flags |= 0x10;
        assert_eq!(field(&c, d), Some("flags"));
        // DSR flows: a nat flow with the DSR bit and a known encapsulation.
        let mut d = flow();
        d.snat = d.client;
        for e in vocab::Encap::ALL {
            d.flags = crate::pipeline::dsr::flags(e);
            assert_eq!(field(&c, d), None, "{e:?}");
            d.flags |= FLAG_PEER;
            assert_eq!(field(&c, d), None, "{e:?} from a peer");
        }
        for bad in [
            FLAG_DSR | 0x18, // encapsulation code 3
            0x08,            // an encapsulation without the DSR bit
            crate::pipeline::dsr::flags(vocab::Encap::Gue) | FLAG_SYNPROXY,
        ] {
            d.flags = bad;
            assert_eq!(field(&c, d), Some("flags"), "{bad:#x}");
        }
        let mut d = flow();
        d.service_id = SERVICE_IDS_MAX;
        assert_eq!(field(&c, d), Some("service_id"));
        let mut d = flow();
        d.backend_id = BackendId(cfg.flowtable.backends_max);
        assert_eq!(field(&c, d), Some("backend_id"));
        // A removed backend's TCP flow stays with "keep", not its UDP one.
        let keep = config::parse(
            &CFG.replace(
                "[dataplane]",
                "[flowtable]\nremoved_backend_tcp = \"keep\"\n[dataplane]",
            ),
            "t.toml",
        )
        .unwrap();
        let k = StateCheck::from_config(&keep);
        let mut d = flow();
        d.backend = "198.18.1.9:8080".parse().unwrap();
        assert_eq!(field(&k, d), None);
        assert_eq!(field(&c, d), Some("backend"));
        let mut u = d;
        (u.proto, u.vip) = (Protocol::Udp, "198.18.100.1:53".parse().unwrap());
        assert_eq!(field(&k, u), Some("backend"));
    }

    #[test]
    fn with_kubernetes_only_what_the_config_knows_is_checked() {
        let cfg = config::parse(
            "[kubernetes]\n[dataplane]\nsnat_addresses = [\"198.18.1.254\"]\n",
            "t.toml",
        )
        .unwrap();
        let c = StateCheck::from_config(&cfg);
        let mut d = flow();
        d.vip = "198.18.200.7:443".parse().unwrap();
        d.service_id = 4000;
        assert_eq!(field(&c, d), None);
        d.snat = "198.18.9.9:2000".parse().unwrap();
        assert_eq!(field(&c, d), Some("snat"));
    }
}
