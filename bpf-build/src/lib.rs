//! The build scripts' BPF step: compiles an XDP/tc program with clang for the BPF target
//! (fastpath's steering and decap programs, perf-lab's reflector). A build-dependency of
//! both, with no dependencies of its own.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The shared prelude every program includes (`#include "xvs_bpf.h"`).
const PRELUDE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/include");

/// Compiles `source` (relative to the crate) into `$OUT_DIR/object` with clang for the BPF
/// target, with [`PRELUDE_DIR`] on the include path; `who` names the crate in error
/// messages. Reruns only when the source, the prelude or `XVS_BPF_CLANG` changes.
pub fn compile(source: &str, object: &str, who: &str) {
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-changed={PRELUDE_DIR}/xvs_bpf.h");
    println!("cargo:rerun-if-env-changed=XVS_BPF_CLANG");

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out.join(object);
    let clang = env::var("XVS_BPF_CLANG").unwrap_or_else(|_| "clang".to_owned());

    let mut cmd = Command::new(&clang);
    cmd.args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"]);
    cmd.arg(format!("-I{PRELUDE_DIR}"));
    // linux/types.h includes <asm/types.h>, which Debian keeps in the multiarch directory.
    if let Some(dir) = multiarch_include() {
        cmd.arg(format!("-I{}", dir.display()));
    }
    cmd.args(["-c", source, "-o"]).arg(&object);

    let status = match cmd.status() {
        Ok(status) => status,
        Err(e) => panic!(
            "{who}: cannot run `{clang}` to build the XDP program {source}: {e}. \
             Install clang (Debian: `apt-get install -y clang libc6-dev linux-libc-dev`) \
             or point XVS_BPF_CLANG at a clang binary."
        ),
    };
    if !status.success() {
        panic!(
            "{who}: `{clang}` failed to build the XDP program {source} ({status}); the kernel UAPI \
             headers come from linux-libc-dev (Debian: `apt-get install -y linux-libc-dev`)"
        );
    }
}

/// `/usr/include/<arch>-linux-gnu`, when it holds `asm/types.h`.
fn multiarch_include() -> Option<PathBuf> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").ok()?;
    let triple = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "riscv64" => "riscv64-linux-gnu",
        "powerpc64" => "powerpc64le-linux-gnu",
        "s390x" => "s390x-linux-gnu",
        _ => return None,
    };
    let dir = Path::new("/usr/include").join(triple);
    dir.join("asm/types.h").exists().then_some(dir)
}
