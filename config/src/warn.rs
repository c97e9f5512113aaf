//! Settings that are valid but dangerous: `xvs check` prints them as `warning:` lines (exit
//! 0; `--strict` refuses them) and `xvs run` logs them at start-up. Each names the key and
//! says what goes wrong and what to write instead. The rules are what an operator coming
//! from kube-proxy, IPVS/keepalived or Cilium would want pointed out:
//!
//! - `[kubernetes] external_ip_cidrs` with a `/0` prefix: the CVE-2020-8554 guard opened wide;
//! - listed `[dataplane] cores` that do not match the workers (one per queue): workers that
//!   share a core, or cores that run none;
//! - `[dataplane] restart_hold = "0s"`: every connection is reset on a restart
//!   (`drain_timeout = "0s"` is not warned about: with a restart hold, a restart in place
//!   loses no connection, and the shipped DaemonSet uses it so that a rollout is quick);
//! - `[bgp]` announcing static services' VIPs that no health probe checks;
//! - `[log] level = "off"`: not even refusals are logged.
//!
//! What needs the machine (a key file others can read) is the daemon's (`daemon`'s
//! start-up checks).

use crate::schema::{Config, ProbeKind};
use crate::span::KeyPath;

/// Every warning for `c`, as (key, sentence), in the order of the file's tables.
pub fn warnings(c: &Config) -> Vec<(KeyPath, String)> {
    let mut out = Vec::new();
    cores(c, &mut out);
    restart_hold(c, &mut out);
    external_ips(c, &mut out);
    services(c, &mut out);
    if c.log.level.trim().eq_ignore_ascii_case("off") {
        out.push((
            KeyPath::of(&["log", "level"]),
            "\"off\": xvs logs nothing, not even what it refuses or why it stops; use \"warn\" for quiet logs".to_owned(),
        ));
    }
    out
}

fn cores(c: &Config, out: &mut Vec<(KeyPath, String)>) {
    let dp = &c.dataplane;
    let (workers, listed) = (dp.workers(), dp.cores.listed());
    if workers == 0 || listed.is_empty() {
        return;
    }
    let at = KeyPath::of(&["dataplane", "cores"]);
    let n = listed.len();
    if n < workers {
        let cores = if n == 1 {
            "1 core"
        } else {
            &format!("{n} cores")
        };
        out.push((
            at,
            format!(
                "{workers} workers (the most queues of any interface) on {cores}: worker i runs on cores[i % {n}], so busy-polling workers share a core and each gets a fraction of it; list one core per worker"
            ),
        ));
    } else if n > workers {
        let idle: Vec<String> = listed[workers..].iter().map(usize::to_string).collect();
        let (which, run) = if idle.len() == 1 {
            ("core", "runs")
        } else {
            ("cores", "run")
        };
        out.push((
            at,
            format!(
                "{which} {} {run} no worker: there are {workers} workers (the most queues of any interface); give the interfaces more queues or list fewer cores",
                idle.join(", ")
            ),
        ));
    }
}

fn restart_hold(c: &Config, out: &mut Vec<(KeyPath, String)>) {
    let dp = &c.dataplane;
    if dp.restart_hold.get().is_zero() {
        out.push((
            KeyPath::of(&["dataplane", "restart_hold"]),
            "\"0s\": while xvs restarts the kernel answers its connections' packets with resets, so every connection breaks on a restart (the default is \"30s\")".to_owned(),
        ));
    }
}

fn external_ips(c: &Config, out: &mut Vec<(KeyPath, String)>) {
    let Some(k) = &c.kubernetes else { return };
    for (i, cidr) in k.external_ip_cidrs.iter().enumerate() {
        if cidr.prefix == 0 {
            out.push((
                KeyPath::of(&["kubernetes", "external_ip_cidrs"]).index(i),
                format!(
                    "{cidr} admits every externalIP: anyone who may create a Service can take any address, another cluster's or the Internet's (CVE-2020-8554); list the prefixes your externalIPs come from"
                ),
            ));
        }
    }
}

fn services(c: &Config, out: &mut Vec<(KeyPath, String)>) {
    if c.bgp.enable && c.health.probe == ProbeKind::None && !c.services.is_empty() {
        out.push((
            KeyPath::of(&["health", "probe"]),
            "\"none\" with [bgp] and [[services]]: the VIPs are announced whether or not their backends answer, so a VIP whose backends are all dead stays announced; set probe = \"tcp\" or \"http\"".to_owned(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::warnings;

    fn keys(text: &str) -> Vec<(String, String)> {
        let c = crate::parse(text, "t.toml").unwrap();
        warnings(&c)
            .into_iter()
            .map(|(k, m)| (k.to_string(), m))
            .collect()
    }

    const IFACES: &str =
        "[dataplane]\nmode = \"nat\"\ninterfaces = [{ name = \"eth0\", queues = 2 }]\n";

    #[test]
    fn a_plain_config_has_no_warning() {
        assert_eq!(keys(&format!("{IFACES}cores = [1, 2]\n")), vec![]);
        assert_eq!(keys(&format!("{IFACES}cores = \"auto\"\n")), vec![]);
        for example in ["lab.toml", "static-services.toml", "edge-node.toml"] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples")
                .join(example);
            let c = crate::load(&path).unwrap();
            assert_eq!(warnings(&c), vec![], "{example}");
        }
    }

    #[test]
    fn dangerous_settings_are_named() {
        let one = |text: &str, key: &str, word: &str| {
            let w = keys(text);
            assert_eq!(w.len(), 1, "{text}: {w:?}");
            assert_eq!(w[0].0, key, "{text}");
            assert!(w[0].1.contains(word), "{text}: {}", w[0].1);
        };
        one(
            &format!("{IFACES}cores = [1]\n"),
            "dataplane.cores",
            "2 workers (the most queues of any interface) on 1 core:",
        );
        one(
            &format!("{IFACES}cores = [1, 2, 3, 4]\n"),
            "dataplane.cores",
            "cores 3, 4 run no worker",
        );
        one(
            &format!("{IFACES}cores = [1, 2]\nrestart_hold = \"0s\"\n"),
            "dataplane.restart_hold",
            "every connection breaks",
        );
        for wide in ["0.0.0.0/0", "::/0"] {
            one(
                &format!(
                    "{IFACES}cores = [1, 2]\n[kubernetes]\nexternal_ip_cidrs = [\"198.18.0.0/15\", \"{wide}\"]\n"
                ),
                "kubernetes.external_ip_cidrs[1]",
                "CVE-2020-8554",
            );
        }
        let svc =
            "[[services]]\nname = \"w\"\nvip = \"198.18.100.1\"\nport = 80\nprotocol = \"tcp\"\n";
        one(
            &format!(
                "{IFACES}cores = [1, 2]\n[bgp]\nenable = true\n{svc}backends = [{{ addr = \"198.18.1.1:80\" }}]\n"
            ),
            "health.probe",
            "a VIP whose backends are all dead stays announced",
        );
        one(
            &format!("{IFACES}cores = [1, 2]\n[log]\nlevel = \"OFF\"\n"),
            "log.level",
            "not even what it refuses",
        );
    }
}
