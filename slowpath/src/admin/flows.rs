//! `/v1/flows` filters: `?service=&backend=&client=&vip=`, parsed from the query and applied
//! to each flow of the table before the limit, so the limit counts matching flows and the
//! response can say how many matched in all.

use std::net::{IpAddr, SocketAddr};

use super::{percent_decode, query_param};

/// An address, with a port or not (`IP` or `IP:PORT`, `[v6]:PORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrMatch {
    /// The address.
    pub ip: IpAddr,
    /// The port, when given.
    pub port: Option<u16>,
}

impl AddrMatch {
    fn parse(param: &str, v: &str) -> Result<AddrMatch, String> {
        if let Ok(sa) = v.parse::<SocketAddr>() {
            return Ok(AddrMatch {
                ip: sa.ip(),
                port: Some(sa.port()),
            });
        }
        v.parse::<IpAddr>()
            .map(|ip| AddrMatch { ip, port: None })
            .map_err(|_| format!("{param}: {v:?} is not an IP address or IP:PORT"))
    }

    /// Whether `a` is this address (and port, when given).
    pub fn matches(&self, a: SocketAddr) -> bool {
        a.ip() == self.ip && self.port.is_none_or(|p| p == a.port())
    }
}

/// A network: `IP` (a host) or `IP/PREFIX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetMatch {
    /// The network's address, its host bits cleared.
    pub ip: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl NetMatch {
    fn parse(param: &str, v: &str) -> Result<NetMatch, String> {
        let (ip, prefix) = match v.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (v, None),
        };
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("{param}: {v:?} is not an IP address or IP/PREFIX"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{param}: prefix {p:?} is not 0 to {max}")),
            },
        };
        Ok(NetMatch {
            ip: mask(ip, prefix),
            prefix,
        })
    }

    /// Whether `ip` lies in this network (an IPv4 address never in an IPv6 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.ip.is_ipv4() && mask(ip, self.prefix) == self.ip
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// Which flows `/v1/flows` returns; every filter given must match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowFilter {
    /// `service=NAME`: the service's name as `/v1/services` shows it; a name without a port
    /// (`namespace/name`) takes every port of the Kubernetes Service.
    pub service: Option<String>,
    /// `backend=IP[:PORT]`.
    pub backend: Option<AddrMatch>,
    /// `client=IP[/PREFIX]`.
    pub client: Option<NetMatch>,
    /// `vip=IP[:PORT]`: the frontend the client addressed.
    pub vip: Option<AddrMatch>,
}

impl FlowFilter {
    /// The filters of a `/v1/flows` query (values percent-decoded); an error names the
    /// parameter and what is wrong with its value. An empty value is no filter.
    pub fn from_query(query: &str) -> Result<FlowFilter, String> {
        let value = |k: &str| {
            query_param(query, k)
                .map(percent_decode)
                .filter(|v| !v.is_empty())
        };
        Ok(FlowFilter {
            service: value("service"),
            backend: value("backend")
                .map(|v| AddrMatch::parse("backend", &v))
                .transpose()?,
            client: value("client")
                .map(|v| NetMatch::parse("client", &v))
                .transpose()?,
            vip: value("vip")
                .map(|v| AddrMatch::parse("vip", &v))
                .transpose()?,
        })
    }

    /// Whether no filter is set.
    pub fn is_empty(&self) -> bool {
        *self == FlowFilter::default()
    }

    /// Whether a flow matches; `service` is its service's name, when known.
    pub fn matches(
        &self,
        client: SocketAddr,
        vip: SocketAddr,
        backend: SocketAddr,
        service: Option<&str>,
    ) -> bool {
        self.client.is_none_or(|n| n.contains(client.ip()))
            && self.backend.is_none_or(|b| b.matches(backend))
            && self.vip.is_none_or(|v| v.matches(vip))
            && self.service.as_deref().is_none_or(|want| {
                service.is_some_and(|name| {
                    name == want
                        || name
                            .strip_prefix(want)
                            .is_some_and(|rest| rest.starts_with(':'))
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_each_filter_and_names_bad_ones() {
        let f = FlowFilter::from_query(
            "limit=5&service=default%2Fweb&backend=198.18.1.1:8080&client=198.18.0.7/16&vip=%5B2001:2::1%5D:80",
        )
        .unwrap();
        assert_eq!(f.service.as_deref(), Some("default/web"));
        assert_eq!(
            f.backend,
            Some(AddrMatch {
                ip: "198.18.1.1".parse().unwrap(),
                port: Some(8080)
            })
        );
        assert_eq!(
            f.client,
            Some(NetMatch {
                ip: "198.18.0.0".parse().unwrap(),
                prefix: 16
            })
        );
        assert_eq!(f.vip.unwrap().port, Some(80));
        assert!(
            FlowFilter::from_query("limit=5&service=")
                .unwrap()
                .is_empty()
        );
        for (q, want) in [
            (
                "backend=198.18.1",
                "backend: \"198.18.1\" is not an IP address or IP:PORT",
            ),
            ("backend=198.18.1.1:99999", "backend:"),
            (
                "client=198.18.0.0/33",
                "client: prefix \"33\" is not 0 to 32",
            ),
            (
                "client=2001:2::/129",
                "client: prefix \"129\" is not 0 to 128",
            ),
            (
                "client=web",
                "client: \"web\" is not an IP address or IP/PREFIX",
            ),
            ("vip=x:80", "vip:"),
        ] {
            let e = FlowFilter::from_query(q).unwrap_err();
            assert!(e.starts_with(want), "{q}: {e}");
        }
    }

    #[test]
    fn matches_every_filter_given() {
        let m = |q: &str, client: &str, backend: &str, service: Option<&str>| {
            FlowFilter::from_query(q).unwrap().matches(
                sa(client),
                sa("198.18.100.1:80"),
                sa(backend),
                service,
            )
        };
        let (c, b) = ("198.18.0.7:40000", "198.18.1.1:8080");
        assert!(m("", c, b, None));
        assert!(m("client=198.18.0.0/24", c, b, None));
        assert!(!m("client=198.18.1.0/24", c, b, None));
        assert!(m("client=198.18.0.7", c, b, None));
        assert!(m("client=0.0.0.0/0", c, b, None));
        assert!(!m("client=::/0", c, b, None), "families differ");
        assert!(m(
            "client=2001:2::/48",
            "[2001:2::9]:1",
            "[2001:2:0:1::1]:80",
            None
        ));
        assert!(m("backend=198.18.1.1", c, b, None));
        assert!(m("backend=198.18.1.1:8080", c, b, None));
        assert!(!m("backend=198.18.1.1:8081", c, b, None));
        assert!(!m("backend=198.18.1.2", c, b, None));
        assert!(m("vip=198.18.100.1:80", c, b, None));
        assert!(!m("vip=198.18.100.1:443", c, b, None));
        assert!(m(
            "service=default/web:http",
            c,
            b,
            Some("default/web:http")
        ));
        assert!(m("service=default/web", c, b, Some("default/web:http")));
        assert!(!m("service=default/we", c, b, Some("default/web:http")));
        assert!(
            !m("service=default/web", c, b, None),
            "a flow of a removed service"
        );
        assert!(m("service=dns", c, b, Some("dns")));
        assert!(!m("service=dns&backend=198.18.1.1", c, b, Some("web")));
        assert!(m(
            "service=web&backend=198.18.1.1&client=198.18.0.0/16",
            c,
            b,
            Some("web")
        ));
    }

    /// The real table and snapshot: filters apply before the limit, and the count covers
    /// every chunk of the table.
    #[test]
    fn collect_filters_a_real_table_before_the_limit() {
        use fastpath::settings::flow_table_config;
        use fastpath::snapshot::SnapshotBuilder;
        use flowtable::{FlowData, FlowTable, Protocol, TcpFlags};
        use std::time::Instant;

        let text = "[dataplane]\nsnat_addresses = [\"198.18.3.1\"]\n[flowtable]\ncapacity = 16384\n\
            [[services]]\nname = \"web\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\n\
            backends = [{ addr = \"198.18.1.1:8080\" }, { addr = \"198.18.1.2:8080\" }]\n\
            [[services]]\nname = \"dns\"\nvip = \"198.18.100.2\"\nport = 53\nprotocol = \"udp\"\n\
            backends = [{ addr = \"198.18.1.9:53\" }]\n";
        let cfg = config::parse(text, "t.toml").unwrap();
        let snap = SnapshotBuilder::from_config(&cfg)
            .build_config(&cfg)
            .unwrap();
        let now = Instant::now();
        let table = FlowTable::new(flow_table_config(&cfg), now).unwrap();
        let svc = |name: &str| snap.services.iter().find(|s| s.name == name).unwrap();
        // 3,000 web flows (clients 198.18.0.x and 198.18.4.x, both backends), 40 dns flows.
        for i in 0..3040u32 {
            let (s, proto, vip) = if i < 3000 {
                (svc("web"), Protocol::Tcp, "198.18.100.1:80")
            } else {
                (svc("dns"), Protocol::Udp, "198.18.100.2:53")
            };
            let b = &s.backends[i as usize % s.backends.len()];
            let net = if i % 3 == 0 { 4 } else { 0 };
            let d = FlowData {
                proto,
                client: SocketAddr::from(([198, 18, net, (i % 200) as u8 + 1], 10_000 + i as u16)),
                vip: vip.parse().unwrap(),
                backend: b.addr,
                snat: SocketAddr::from(([198, 18, 3, 1], 20_000 + i as u16)),
                service_id: s.id,
                backend_id: b.id,
                snapshot_gen: 1,
                flags: 0,
            };
            table.insert(&d, TcpFlags::SYN, table.tick(now)).unwrap();
        }
        let collect = |q: &str, limit: usize| {
            let f = FlowFilter::from_query(q).unwrap();
            crate::admin::FlowViewJson::collect(&table, &snap, &f, limit, now)
        };
        let all = collect("", 10);
        assert_eq!((all.flows.len(), all.total_matched), (10, 3040));
        let dns = collect("service=dns", 100);
        assert_eq!((dns.flows.len(), dns.total_matched), (40, 40));
        assert!(
            dns.flows
                .iter()
                .all(|f| f.service == "dns" && f.protocol == "udp")
        );
        let b2 = collect("service=web&backend=198.18.1.2:8080", 7);
        assert_eq!((b2.flows.len(), b2.total_matched), (7, 1500));
        assert!(
            b2.flows
                .iter()
                .all(|f| f.backend.to_string() == "198.18.1.2:8080")
        );
        let net4 = collect("client=198.18.4.0/24", 5000);
        assert_eq!(net4.total_matched, 1014); // i % 3 == 0 below 3040
        assert!(
            net4.flows
                .iter()
                .all(|f| f.client.ip().to_string().starts_with("198.18.4."))
        );
        assert_eq!(collect("vip=198.18.100.2", 1).total_matched, 40);
        assert_eq!(collect("client=2001:2::/48", 1).total_matched, 0);
    }
}
