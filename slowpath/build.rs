//! Build metadata for `xvs_build_info`: the git revision (`XVS_REVISION` overrides it, for
//! builds without `.git`, e.g. an image build) and the compiler's version.

use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=XVS_REVISION");
    let revision = std::env::var("XVS_REVISION")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| output("git", &["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    // Rebuild when HEAD moves (a commit, a checkout): the files git keeps it in.
    for path in ["HEAD", "logs/HEAD"] {
        if let Some(p) = output("git", &["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = output(&rustc, &["--version"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=XVS_REVISION={revision}");
    println!("cargo:rustc-env=XVS_RUSTC={version}");
}
