//! Builds the XDP reflector program (`bpf/reflect.c`) into `$OUT_DIR/reflect.o` with clang,
//! for `perf_lab::reflect` to embed (the build helper is fastpath's, shared).

#[path = "../fastpath/bpf/build_bpf.rs"]
mod build_bpf;

fn main() {
    println!("cargo:rerun-if-changed=../fastpath/bpf/build_bpf.rs");
    build_bpf::compile("bpf/reflect.c", "reflect.o", "perf-lab");
}
