//! `xvs run`: start the daemon. Refuses clearly when it cannot work: a bad config (exit 2),
//! not root, or a configured interface that does not exist (exit 1).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub fn main(path: Option<&PathBuf>) -> ExitCode {
    let Some(cfg) = crate::load_config(path) else {
        return ExitCode::from(crate::EXIT_BAD_CONFIG);
    };
    if let Err(why) = preflight(&cfg) {
        eprintln!("xvs run: {why}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "xvs run: configuration valid ({} services, {} workers); the AF_XDP fastpath is not built yet, so nothing is forwarded",
        cfg.services.len(),
        cfg.dataplane.workers()
    );
    ExitCode::FAILURE
}

/// Checks that need the machine: root, and every configured interface present.
fn preflight(cfg: &config::Config) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(format!(
            "must run as root (or with CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF, CAP_SYS_ADMIN, CAP_IPC_LOCK); running as uid {euid}"
        ));
    }
    if cfg.dataplane.interfaces.is_empty() {
        return Err("no [dataplane] interfaces configured: nothing to forward on".into());
    }
    for ifc in &cfg.dataplane.interfaces {
        let dev = Path::new("/sys/class/net").join(&ifc.name);
        if !dev.exists() {
            return Err(format!(
                "interface {} (dataplane.interfaces) does not exist in this network namespace",
                ifc.name
            ));
        }
    }
    Ok(())
}
