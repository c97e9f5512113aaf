//! Builds the XDP steering program (`bpf/steer.c`) into `$OUT_DIR/steer.o` with clang, for
//! `fastpath::steer` to embed.

#[path = "bpf/build_bpf.rs"]
mod build_bpf;

fn main() {
    println!("cargo:rerun-if-changed=bpf/build_bpf.rs");
    build_bpf::compile("bpf/steer.c", "steer.o", "xvs");
}
