#!/usr/bin/env bash
# Every scenario against every target, in generator mode (with the NDR search) and in
# saturation mode, then the report. Run it on a quiet machine: anything else running on the
# two cores shows up in every number.
#
#   sudo [REPEATS=N] perf-lab/campaign.sh OUT_DIR [DURATION_S] [SCENARIOS...]
#
# Writes OUT_DIR/SCENARIO-TARGET-MODE.json (with REPEATS > 1: ...-MODE-rI.json, the whole
# campaign run I times over, so slow drift on the machine spreads over every target), with
# each generator-mode packet run's latency distributions beside it (.hgrm),
# OUT_DIR/campaign.log (one line per run, with the failures) and OUT_DIR/report/ (report.md
# and the SVG plots; repeated runs become one row of medians). The real-client scenarios
# (bulk-tcp, conn-rate) run in generator mode against xvs, nft and iptables only. Each run
# prints its place in the campaign and an estimate of the time left (from the runs so far).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: campaign.sh OUT_DIR [DURATION_S] [SCENARIOS...]}
dur=${2:-5}
repeats=${REPEATS:-1}
shift $(( $# >= 2 ? 2 : $# ))
scenarios=("$@")
[ ${#scenarios[@]} -eq 0 ] && scenarios=(one-service flows-1m syn-flood services-10k
  change-under-load bulk-tcp conn-rate)
mkdir -p "$out"
cargo build --release -q -p perf-lab -p xvs || exit 1
pl=target/release/perf-lab
log="$out/campaign.log"
: >"$log"

# The runs, in order: "repeat scenario target mode".
runs=()
for ((i = 1; i <= repeats; i++)); do
  for s in "${scenarios[@]}"; do
    for t in xvs nft iptables l2fwd; do
      for m in generator saturation; do
        case "$s" in
          bulk-tcp | conn-rate) [ "$t" = l2fwd ] || [ "$m" = saturation ] && continue ;;
        esac
        runs+=("$i $s $t $m")
      done
    done
  done
done
total=${#runs[@]}

# Seconds as h:mm:ss or m:ss.
hms() {
  local s=$1
  if ((s >= 3600)); then
    printf '%d:%02d:%02d' $((s / 3600)) $((s % 3600 / 60)) $((s % 60))
  else
    printf '%d:%02d' $((s / 60)) $((s % 60))
  fi
}

start=$(date +%s)
n=0
for run in "${runs[@]}"; do
  read -r i s t m <<<"$run"
  n=$((n + 1))
  now=$(date +%s)
  if ((n > 1)); then
    eta=$(hms $(((now - start) * (total - n + 1) / (n - 1))))
  else
    eta="unknown"
  fi
  echo "[$n/$total] $s $t $m run $i (elapsed $(hms $((now - start))), ETA $eta)"
  extra=()
  [ "$m" = generator ] && case "$s" in bulk-tcp | conn-rate) ;; *) extra=(--ndr) ;; esac
  f="$out/$s-$t-$m.json"
  [ "$repeats" -gt 1 ] && f="$out/$s-$t-$m-r$i.json"
  if "$pl" run --scenario "$s" --target "$t" --mode "$m" --duration "$dur" \
    --xvs target/release/xvs --json "$f" "${extra[@]}" >"$f.stdout" 2>"$f.stderr"; then
    echo "ok [$n/$total] $s $t $m run $i: $(grep '^perf-lab: .* pps' "$f.stderr" | tail -1 | cut -d: -f3- | cut -c2-)" | tee -a "$log"
  else
    echo "FAILED [$n/$total] $s $t $m run $i: $(tail -1 "$f.stderr")" | tee -a "$log"
    rm -f "$f"
  fi
done
echo "campaign: $total runs in $(hms $(($(date +%s) - start)))" | tee -a "$log"
"$pl" report "$out"/*.json --out "$out/report" && echo "report: $out/report/report.md"
