# xvs's container image: the `xvs` binary on Debian 12 slim, for deploy/daemonset.yaml.
# Build it with scripts/image (docker, podman or buildah, whichever is installed).
#
# Stage `build`: the Rust toolchain the workspace asks for (rust-version 1.90, edition 2024)
# on Debian 12, plus what the build needs beyond it: clang and the kernel UAPI headers for
# the XDP steering program (fastpath/build.rs), libelf and zlib for xsk-rs's libxdp/libbpf,
# m4, pkg-config and make for their builds. Stage `runtime`: Debian 12 slim (the same
# release, so the sonames match) with only the shared libraries `xvs` links beyond glibc
# (`ldd`: libelf.so.1, libz.so.1, libgcc_s.so.1); tests/deploy_manifests.rs checks that
# list against `ldd` of the built binary.
#
# XVS_GIT_REVISION (a build argument; scripts/image passes `git rev-parse HEAD`, with
# `-dirty` when the tree has changes) is the revision the binary reports: the build context
# has no .git, so the build scripts read it from the environment, `xvs --version` as
# XVS_GIT_REVISION and `xvs_build_info` (slowpath/build.rs) as XVS_REVISION. It is also the
# image's `org.opencontainers.image.revision` label, and XVS_VERSION its version label.
ARG RUST_IMAGE=docker.io/library/rust:1.90-bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:12-slim

FROM ${RUST_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends clang llvm libelf-dev zlib1g-dev m4 \
       pkg-config make gcc libc6-dev linux-libc-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The whole workspace (cargo reads every member's manifest), no target/ or .git.
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY bpf-build bpf-build
COPY vocab vocab
COPY config config
COPY shm shm
COPY lb-algos lb-algos
COPY flowtable flowtable
COPY fastpath fastpath
COPY pcap pcap
COPY slowpath slowpath
COPY daemon daemon
COPY benches benches
COPY perf-lab perf-lab
ARG XVS_GIT_REVISION=unknown
RUN XVS_GIT_REVISION="${XVS_GIT_REVISION}" XVS_REVISION="${XVS_GIT_REVISION}" \
    cargo build --release --locked -p xvs --bin xvs \
    && install -D -m 0755 target/release/xvs /out/xvs

FROM ${RUNTIME_IMAGE} AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends libelf1 zlib1g libgcc-s1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/xvs /usr/local/bin/xvs
ARG XVS_GIT_REVISION=unknown
ARG XVS_VERSION=unknown
LABEL org.opencontainers.image.title="xvs" \
      org.opencontainers.image.description="Userspace L4 load balancer for Kubernetes Services on AF_XDP" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${XVS_VERSION}" \
      org.opencontainers.image.revision="${XVS_GIT_REVISION}"
# Runs as root in the image; the DaemonSet drops every capability but the ones `xvs run`
# checks for (README, Privileges).
ENTRYPOINT ["/usr/local/bin/xvs"]
CMD ["run", "--config", "/etc/xvs/xvs.toml"]
