//! Builds the XDP steering program (`bpf/steer.c`) into `$OUT_DIR/steer.o` and the decap
//! programs (`bpf/decap.c`) into `$OUT_DIR/decap.o` with clang, for `fastpath::steer` and
//! `fastpath::decap` to embed.

fn main() {
    bpf_build::compile("bpf/steer.c", "steer.o", "xvs");
    bpf_build::compile("bpf/decap.c", "decap.o", "xvs");
}
