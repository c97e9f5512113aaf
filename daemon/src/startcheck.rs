//! What `xvs run` refuses in a valid config before it touches the machine, through the
//! functions the driver itself calls at start-up, and what it warns about in the files the
//! config names. `xvs check` runs [`check`] too, and `xvs run` runs it before
//! [`crate::preflight`], so both report every problem here at once and `check` refuses what
//! `run` would. What depends on the host itself (capabilities, interfaces, cpuset, bpffs,
//! memory) is [`crate::preflight`]'s.
//!
//! Refused:
//! - no `[dataplane] interfaces`: nothing to forward on;
//! - a `[log] level` the logger does not take ([`crate::logging::filter`], which `xvs run`
//!   calls; validation checks the same words, this is the logger's own verdict);
//! - `[sync]` whose key file cannot be read or is too short
//!   ([`slowpath::flowsync::FlowSyncConfig::from_config`], which the driver calls);
//! - `[kubernetes] kubeconfig` that cannot be read or used, its certificate files included
//!   ([`slowpath::k8s::connect`], which the driver calls; it does not contact the API
//!   server). Without a kubeconfig the in-cluster configuration is checked only where it can
//!   exist, inside a pod (`KUBERNETES_SERVICE_HOST` set).
//!
//! Warned: a sync key or kubeconfig file that users other than its owner may read or write
//! (whoever reads the key can forge flow sync datagrams; a kubeconfig holds credentials).
//! The config's own warnings are `config::warnings`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use config::{Config, KeyPath};

/// What [`check`] found: problems `xvs run` refuses, and warnings.
#[derive(Debug, Default)]
pub struct Findings {
    /// What `xvs run` refuses, by key.
    pub refused: Vec<(KeyPath, String)>,
    /// What is dangerous but allowed, by key.
    pub warnings: Vec<(KeyPath, String)>,
}

/// Every start-up refusal and file warning of `cfg` (see the module doc).
pub fn check(cfg: &Config) -> Findings {
    let mut f = Findings::default();
    if cfg.dataplane.interfaces.is_empty() {
        f.refused.push((
            KeyPath::of(&["dataplane", "interfaces"]),
            "no interfaces: xvs run has nothing to forward on; list at least one (interfaces = [{ name = \"eth0\", queues = 1 }])".to_owned(),
        ));
    }
    if let Err(why) = crate::logging::filter(&cfg.log, None) {
        f.refused.push((KeyPath::of(&["log", "level"]), why));
    }
    if cfg.sync.enable {
        let key = KeyPath::of(&["sync", "key_file"]);
        match slowpath::flowsync::FlowSyncConfig::from_config(cfg) {
            Err(why) => f.refused.push((key, why)),
            Ok(_) => {
                if let Some(p) = &cfg.sync.key_file {
                    f.warnings.extend(
                        open_to_others(p, "can forge flow sync datagrams").map(|w| (key, w)),
                    );
                }
            }
        }
    }
    if let Some(k) = &cfg.kubernetes {
        let key = KeyPath::of(&["kubernetes", "kubeconfig"]);
        let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        if (k.kubeconfig.is_some() || in_pod)
            && let Err(why) = kubernetes_client(cfg)
        {
            f.refused.push((key.clone(), why));
        } else if let Some(p) = &k.kubeconfig {
            f.warnings
                .extend(open_to_others(p, "holds the API server's credentials").map(|w| (key, w)));
        }
    }
    f
}

/// The Kubernetes client the driver builds ([`slowpath::k8s::connect`]), built and dropped.
fn kubernetes_client(cfg: &Config) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting a runtime to build the Kubernetes client: {e}"))?;
    rt.block_on(async { slowpath::k8s::connect(cfg).await.map(drop) })
        .map_err(|e| e.to_string())
}

/// A warning when users other than `path`'s owner may read or write it (`why`: what such a
/// reader could do).
fn open_to_others(path: &Path, why: &str) -> Option<String> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "{} is open to other users (mode {mode:04o}): whoever reads it {why}; chmod 600 it (a Kubernetes Secret volume: defaultMode: 0400)",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn cfg(text: &str) -> Config {
        config::parse(text, "t.toml").unwrap()
    }

    fn keys(v: &[(KeyPath, String)]) -> Vec<String> {
        v.iter().map(|(k, _)| k.to_string()).collect()
    }

    const IFACE: &str =
        "[dataplane]\nmode = \"nat\"\ninterfaces = [{ name = \"eth0\" }]\ncores = [1]\n";

    #[test]
    fn no_interfaces_is_refused() {
        let f = check(&cfg(""));
        assert_eq!(keys(&f.refused), ["dataplane.interfaces"]);
        assert!(check(&cfg(IFACE)).refused.is_empty());
    }

    /// Validation takes only filters the logger takes; were they to differ, the logger's
    /// verdict is the one `run` meets.
    #[test]
    fn the_log_filter_is_the_loggers() {
        let mut c = cfg(IFACE);
        c.log.level = "xvs=[".to_owned();
        let f = check(&c);
        assert_eq!(keys(&f.refused), ["log.level"], "{f:?}");
    }

    #[test]
    fn the_sync_key_is_read_as_the_driver_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        let text = format!(
            "{IFACE}[sync]\nenable = true\nlisten = \"198.18.0.1:7946\"\nkey_file = \"{}\"\npeers = [{{ address = \"198.18.0.2:7946\" }}]\n",
            key.display()
        );
        let f = check(&cfg(&text));
        assert_eq!(keys(&f.refused), ["sync.key_file"]);
        assert!(f.refused[0].1.contains("No such file"), "{:?}", f.refused);
        std::fs::write(&key, [7u8; 8]).unwrap();
        let f = check(&cfg(&text));
        assert_eq!(keys(&f.refused), ["sync.key_file"], "too short");
        // Not a key: a device (read for ever before), a large file.
        for (not_a_key, why) in [
            (Path::new("/dev/zero").to_owned(), "not a regular file"),
            (dir.path().to_owned(), "not a regular file"),
        ] {
            let f = check(&cfg(&text.replace(
                &key.display().to_string(),
                &not_a_key.display().to_string(),
            )));
            assert!(f.refused[0].1.ends_with(why), "{:?}", f.refused);
        }
        std::fs::File::create(&key)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let f = check(&cfg(&text));
        assert!(
            f.refused[0].1.contains("larger than 4096 bytes"),
            "{:?}",
            f.refused
        );
        std::fs::write(&key, [7u8; 32]).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let f = check(&cfg(&text));
        assert!(f.refused.is_empty(), "{:?}", f.refused);
        assert_eq!(keys(&f.warnings), ["sync.key_file"]);
        assert!(f.warnings[0].1.contains("(mode 0644)"), "{:?}", f.warnings);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let f = check(&cfg(&text));
        assert!(f.refused.is_empty() && f.warnings.is_empty(), "{f:?}");
    }

    #[test]
    fn a_kubeconfig_is_loaded_as_the_driver_loads_it() {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        let text = format!("{IFACE}[kubernetes]\nkubeconfig = \"{}\"\n", kc.display());
        let f = check(&cfg(&text));
        assert_eq!(keys(&f.refused), ["kubernetes.kubeconfig"]);
        let f = check(&cfg(&text.replace(&kc.display().to_string(), "/dev/zero")));
        assert!(f.refused[0].1.ends_with("not a regular file"), "{f:?}");
        // A certificate file it names must exist too.
        let with_ca = |ca: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://198.18.0.10:6443\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
            )
        };
        std::fs::write(
            &kc,
            with_ca(&dir.path().join("ca.pem").display().to_string()),
        )
        .unwrap();
        std::fs::set_permissions(&kc, std::fs::Permissions::from_mode(0o600)).unwrap();
        let f = check(&cfg(&text));
        assert_eq!(keys(&f.refused), ["kubernetes.kubeconfig"], "{f:?}");
        let plain = with_ca("x").replace("    certificate-authority: x\n", "");
        std::fs::write(&kc, plain).unwrap();
        let f = check(&cfg(&text));
        assert!(f.refused.is_empty() && f.warnings.is_empty(), "{f:?}");
        std::fs::set_permissions(&kc, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(
            keys(&check(&cfg(&text)).warnings),
            ["kubernetes.kubeconfig"]
        );
    }
}
