#!/usr/bin/env bash
# Instructions per packet of `Pipeline::process`, the stable per-packet cost (wall-clock numbers
# on shared machines are noisy and `perf stat` has no counters here).
#
# Runs the `pipeline` bench binary under callgrind, collecting only inside `send_timed` (the
# measured packets; set-up traffic is excluded), and divides by the bench's packet count.
# Includes the bench's per-frame copy into the work buffer (about 10 instructions).
#
#   benches/callgrind.sh                          # --flows 100000 --mix established --rounds 2
#   benches/callgrind.sh --flows 100000 --mix syn
#
# Prints the bench's key=value lines plus `instructions=` and `instructions_per_packet=`.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--flows 100000 --mix established --rounds 2)
cargo build --release -q -p benches --bin pipeline
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out/cg.out" \
  --toggle-collect='*send_timed*' target/release/pipeline "${args[@]}" >"$out/stdout" 2>"$out/stderr" || {
  cat "$out/stderr" >&2
  exit 1
}
cat "$out/stdout"
ir=$(grep -E '^(summary|totals):' "$out/cg.out" | head -1 | awk '{print $2}')
packets=$(grep -E '^packets=' "$out/stdout" | cut -d= -f2)
echo "instructions=$ir"
awk -v i="$ir" -v p="$packets" 'BEGIN { printf "instructions_per_packet=%.1f\n", i / p }'
