//! Builds the XDP steering program (`bpf/steer.c`) into `$OUT_DIR/steer.o` and the decap
//! programs (`bpf/decap.c`) into `$OUT_DIR/decap.o` with clang, for `fastpath::steer` and
//! `fastpath::decap` to embed.

#[path = "bpf/build_bpf.rs"]
mod build_bpf;

fn main() {
    println!("cargo:rerun-if-changed=bpf/build_bpf.rs");
    build_bpf::compile("bpf/steer.c", "steer.o", "xvs");
    build_bpf::compile("bpf/decap.c", "decap.o", "xvs");
}
