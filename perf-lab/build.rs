//! Builds the XDP reflector program (`bpf/reflect.c`) into `$OUT_DIR/reflect.o` with clang,
//! for `perf_lab::reflect` to embed (the build step is the `bpf-build` crate's, shared with
//! fastpath).

fn main() {
    bpf_build::compile("bpf/reflect.c", "reflect.o", "perf-lab");
}
