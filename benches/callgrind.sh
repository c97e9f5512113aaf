#!/usr/bin/env bash
# Instructions per packet of `Pipeline::process`, the stable per-packet cost (wall-clock numbers
# on shared machines are noisy and `perf stat` has no counters here).
#
# Runs the `pipeline` bench binary under callgrind, collecting only inside `send_timed` (the
# measured packets; set-up traffic is excluded), and divides by the bench's packet count.
# Includes the bench's per-frame copy into the work buffer (about 10 instructions).
#
# Counts `Pipeline::process_at` (`process` with the clock read once, as a worker reads it once a
# batch), one frame at a time (`--batch 1`), unless the arguments say
# `--batch N`: the packet's own work. `process_batch` (the workers' path, the bench's default
# batch) executes about 110 more instructions per packet, its staging (three passes over the
# batch, a second index probe to prefetch the entry), and buys with them the overlapped cache
# misses that make it 4-5x faster in wall-clock time; `--batch 64` counts those.
#
#   benches/callgrind.sh                          # --flows 100000 --mix established --rounds 2
#   benches/callgrind.sh --flows 1000000 --mix established
#   benches/callgrind.sh --flows 1000000 --mix established --batch 64
#
# Prints the bench's key=value lines plus `instructions=` and `instructions_per_packet=`.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--flows 100000 --mix established --rounds 2)
[[ " ${args[*]} " == *" --batch "* ]] || args+=(--batch 1)
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
