//! The fastpath's settings, built from the config in this one place: the AF_XDP sockets'
//! ([`XskSettings`]), the workers' ([`WorkerSpec`], [`worker_specs`]), a pipeline's
//! ([`PipelineConfig`]) and the shared flow table's ([`flow_table_config`]).
//!
//! The rest of the fastpath takes these types (and `vocab`'s), never the TOML schema's: the
//! config's keys and defaults can change without touching the sockets, workers, steering or
//! pipeline. The other readers of [`config::Config`] translate it by design: the snapshot
//! builder (`SnapshotBuilder::from_config`) and the static source (`ServiceSpec::from_config`,
//! `L2Table::from_config`) in [`crate::snapshot`].

use std::net::IpAddr;

use config::{Config, Dataplane};

use crate::pipeline::{CookieKey, DEFAULT_MAC, DsrSettings, PipelineConfig, snat};
use crate::worker::{BATCH_MAX, SWEEP_BUDGET, SWEEP_ROUND, WorkerSpec};
use crate::xsk::XskSettings;

impl XskSettings {
    /// The AF_XDP keys of `[dataplane]`.
    pub fn from_config(dp: &Dataplane) -> XskSettings {
        XskSettings {
            interfaces: dp
                .interfaces
                .iter()
                .map(|i| (i.name.clone(), i.queues))
                .collect(),
            umem_frames: dp.umem_frames,
            frame_size: dp.frame_size,
            rx_ring_size: dp.rx_ring_size,
            tx_ring_size: dp.tx_ring_size,
            batch_size: dp.batch_size,
            xdp_mode: dp.xdp_mode,
            zero_copy: dp.zero_copy,
            napi_busy_poll: dp.napi_busy_poll,
        }
    }
}

impl WorkerSpec {
    /// Worker `index` of `dp`: queue `index`, core `cores[index % len]` (`cores`: the
    /// workers' cores of `dp.cores` resolved against the process's cpuset,
    /// [`config::Cores::resolve`]; empty: not pinned).
    pub fn from_config(dp: &Dataplane, cores: &[usize], index: usize) -> WorkerSpec {
        WorkerSpec {
            index,
            core: (!cores.is_empty()).then(|| cores[index % cores.len()]),
            queue: index as u32,
            interfaces: dp.interfaces.iter().map(|i| i.name.clone()).collect(),
            batch_size: (dp.batch_size as usize).clamp(1, BATCH_MAX),
            idle_backoff: dp.idle_backoff.map(|d| d.get()),
            napi_busy_poll: dp.napi_busy_poll,
            sweep_budget: SWEEP_BUDGET,
            sweep_round: SWEEP_ROUND,
        }
    }
}

/// Every worker of `dp` ([`crate::xsk::worker_count`] of them: the most queues of any
/// interface), on `cores` in turn.
pub fn worker_specs(dp: &Dataplane, cores: &[usize]) -> Vec<WorkerSpec> {
    (0..dp.workers())
        .map(|i| WorkerSpec::from_config(dp, cores, i))
        .collect()
}

impl PipelineConfig {
    /// Settings of worker `worker` of `workers` from a config: the first SNAT address of each
    /// family, an even split of `snat_port_range`, port 0 and [`DEFAULT_MAC`] (the AF_XDP
    /// driver sets the real interface index and MAC).
    pub fn from_config(c: &Config, worker: usize, workers: usize) -> Self {
        let snat_v4 = c.dataplane.snat_addresses.iter().find_map(|a| match a {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        });
        let snat_v6 = c.dataplane.snat_addresses.iter().find_map(|a| match a {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        });
        let r = c.dataplane.snat_port_range;
        PipelineConfig {
            port: 0,
            mac: DEFAULT_MAC,
            snat_v4,
            snat_v6,
            snat_ports: snat::slice(r.first, r.last, worker, workers),
            snat_start: 0,
            fragments_max: 1024,
            fragment_timeout: c.timeouts.fragment.get(),
            synproxy_key: process_cookie_key(),
            reject_limit: crate::limit::RateLimit {
                rate: c.dataplane.reject_rate,
                burst: c.dataplane.reject_burst,
            },
            dsr: DsrSettings::from_config(c),
        }
    }
}

/// The DSR MTU when `[dataplane] dsr_mtu` is absent: the smallest of the interfaces' MTUs
/// (`mtus`: each interface's name and its sysfs `mtu` text, or the read's error). A text that
/// is no MTU (68-65535) or cannot be read is left out, with one warning naming the interface
/// and the value; none left: 1500.
pub fn dsr_mtu_of(mtus: &[(String, std::io::Result<String>)]) -> u16 {
    let mut least: Option<u16> = None;
    for (name, text) in mtus {
        match text.as_ref().map(|t| t.trim().parse::<u16>()) {
            Ok(Ok(m)) if m >= 68 => least = Some(least.map_or(m, |l| l.min(m))),
            Ok(_) => tracing::warn!(
                interface = %name,
                value = ?text.as_ref().ok(),
                "refused the interface's MTU for DSR (not 68-65535); left out"
            ),
            Err(e) => tracing::warn!(
                interface = %name,
                error = %e,
                "could not read the interface's MTU for DSR; left out"
            ),
        }
    }
    least.unwrap_or(1500)
}

impl DsrSettings {
    /// The DSR keys of `[dataplane]` and the node's outer source addresses
    /// ([`Config::dsr_outer_source`]); the MTU is `dsr_mtu`, else 1500 (the daemon sets the
    /// interfaces' when `dsr_mtu` is absent).
    pub fn from_config(c: &Config) -> Self {
        let dp = &c.dataplane;
        let source = |v6: bool| c.dsr_outer_source(v6);
        let prefix = dp.ipip_source_prefix.map(|p| (p.addr, p.prefix));
        DsrSettings {
            gue_port: dp.gue_port,
            mtu: dp
                .dsr_mtu
                .map_or(1500, |m| m.min(u32::from(u16::MAX)) as u16),
            mss_clamp: dp.dsr_mss_clamp,
            source_v4: match source(false) {
                Some(IpAddr::V4(a)) => Some(a),
                _ => None,
            },
            source_v6: match source(true) {
                Some(IpAddr::V6(a)) => Some(a),
                _ => None,
            },
            prefix_v4: match prefix {
                Some((IpAddr::V4(a), len)) => Some((a, len)),
                _ => None,
            },
            prefix_v6: match prefix {
                Some((IpAddr::V6(a), len)) => Some((a, len)),
                _ => None,
            },
        }
    }
}

/// This process's SYN cookie key when none is configured: random, one for all workers. The
/// daemon sets the one kept in `state_dir` instead.
fn process_cookie_key() -> CookieKey {
    static KEY: std::sync::OnceLock<CookieKey> = std::sync::OnceLock::new();
    *KEY.get_or_init(CookieKey::random)
}

/// The flow table's settings from a config (capacity, backends, timeouts).
pub fn flow_table_config(c: &Config) -> flowtable::FlowTableConfig {
    let t = &c.timeouts;
    let mut f = flowtable::FlowTableConfig::new(
        c.flowtable.capacity as usize,
        c.flowtable.backends_max as usize,
    );
    f.timeouts = flowtable::Timeouts {
        tcp_established: t.tcp_established.get(),
        tcp_syn_sent: t.tcp_syn.get(),
        tcp_syn_recv: t.tcp_syn.get(),
        tcp_syn_pressure: t.tcp_syn_pressure.get(),
        tcp_fin_wait: t.tcp_fin_wait.get(),
        tcp_close_wait: t.tcp_close_wait.get(),
        tcp_last_ack: t.tcp_last_ack.get(),
        tcp_time_wait: t.tcp_time_wait.get(),
        tcp_close: t.tcp_close.get(),
        udp: t.udp.get(),
        icmp: t.icmp.get(),
        sctp_established: t.sctp.get(),
        sctp_closing: t.tcp_close.get(),
    };
    f
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_dsr_mtu_is_the_smallest_readable_one() {
        let ok = |n: &str, t: &str| (n.to_owned(), Ok(t.to_owned()));
        let bad = (
            "gone".to_owned(),
            Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        );
        assert_eq!(
            super::dsr_mtu_of(&[ok("a", "9000\n"), ok("b", "1500\n")]),
            1500
        );
        // Garbage, 0, a value past u16 and an unreadable interface are left out.
        let mtus = [
            ok("a", "9000\n"),
            ok("b", "lots"),
            ok("c", "0"),
            ok("d", "70000"),
            bad,
        ];
        assert_eq!(super::dsr_mtu_of(&mtus), 9000);
        assert_eq!(super::dsr_mtu_of(&[]), 1500);
    }

    use super::*;
    use crate::xsk::worker_count;

    #[test]
    fn workers_are_the_most_queues_of_any_interface() {
        let mut c = Config::default();
        assert_eq!(worker_count(&XskSettings::from_config(&c.dataplane)), 0);
        for (name, queues) in [("a", 2), ("b", 4), ("c", 1)] {
            c.dataplane.interfaces.push(config::Interface {
                name: name.into(),
                queues,
            });
        }
        let xsk = XskSettings::from_config(&c.dataplane);
        assert_eq!(worker_count(&xsk), 4);
        assert_eq!(worker_count(&xsk), c.dataplane.workers());
        let specs = worker_specs(&c.dataplane, &[3, 5]);
        assert_eq!(specs.len(), 4);
        assert_eq!(
            specs.iter().map(|s| s.core).collect::<Vec<_>>(),
            [Some(3), Some(5), Some(3), Some(5)]
        );
        assert_eq!(specs[0].interfaces, ["a", "b", "c"]);
    }
}
