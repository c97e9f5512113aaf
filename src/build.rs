//! The build script of the `xvs` binary (here rather than at the root so that the image's
//! `COPY src` brings it): records the git revision xvs is built from, for `xvs --version`.
//! `XVS_GIT_REVISION` comes first (an image build has no `.git`: it passes the revision),
//! then `git rev-parse --short HEAD`, else `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=XVS_GIT_REVISION");
    let rev = from_env()
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=XVS_REVISION={rev}");
}

/// `XVS_GIT_REVISION`, when it looks like a revision (it is printed as given).
fn from_env() -> Option<String> {
    let v = std::env::var("XVS_GIT_REVISION").ok()?;
    match revision(&v) {
        Ok(r) => r,
        Err(why) => {
            println!("cargo:warning={why}");
            None
        }
    }
}

/// The revision `v` names: none when empty, refused unless it is up to 64 letters,
/// digits, `.`, `-`, `_` and `+` (it is printed by `xvs --version`).
pub(crate) fn revision(v: &str) -> Result<Option<String>, String> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let ok = v.len() <= 64
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'));
    if !ok {
        return Err(format!(
            "XVS_GIT_REVISION={v:?} is not a revision (up to 64 letters, digits, '.', '-', '_', '+'): ignored"
        ));
    }
    Ok(Some(v.to_owned()))
}

/// The short hash of HEAD, and the files whose change means a new one.
fn from_git() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()?;
        let s = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !s.trim().is_empty()).then(|| s.trim().to_owned())
    };
    let rev = git(&["rev-parse", "--short", "HEAD"])?;
    // HEAD, the branch it names and packed refs (worktrees included: --git-path knows
    // where each lives). A missing file would make cargo run this script every build.
    let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(r) = git(&["rev-parse", "--symbolic-full-name", "HEAD"]) {
        watch.push(git(&["rev-parse", "--git-path", &r]));
    }
    watch.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for p in watch.into_iter().flatten() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(p);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    Some(rev)
}
