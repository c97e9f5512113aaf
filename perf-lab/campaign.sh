#!/usr/bin/env bash
# Every scenario against every target, in generator mode (with the NDR search) and in
# saturation mode, then the report. Run it on a quiet machine: anything else running on the
# two cores shows up in every number.
#
#   sudo [REPEATS=N] perf-lab/campaign.sh OUT_DIR [DURATION_S] [SCENARIOS...]
#
# Writes OUT_DIR/SCENARIO-TARGET-MODE.json (with REPEATS > 1: ...-MODE-rI.json, the whole
# campaign run I times over, so slow drift on the machine spreads over every target),
# OUT_DIR/campaign.log (one line per run, with the failures) and OUT_DIR/report/ (report.md
# and the SVG plots; repeated runs become one row of medians).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: campaign.sh OUT_DIR [DURATION_S] [SCENARIOS...]}
dur=${2:-5}
repeats=${REPEATS:-1}
shift $(( $# >= 2 ? 2 : $# ))
scenarios=("$@")
[ ${#scenarios[@]} -eq 0 ] && scenarios=(one-service flows-1m syn-flood services-10k change-under-load)
mkdir -p "$out"
cargo build --release -q -p perf-lab -p xvs || exit 1
pl=target/release/perf-lab
log="$out/campaign.log"
: >"$log"
for ((i = 1; i <= repeats; i++)); do
  for s in "${scenarios[@]}"; do
    for t in xvs nft iptables l2fwd; do
      for m in generator saturation; do
        extra=()
        [ "$m" = generator ] && extra=(--ndr)
        f="$out/$s-$t-$m.json"
        [ "$repeats" -gt 1 ] && f="$out/$s-$t-$m-r$i.json"
        if "$pl" run --scenario "$s" --target "$t" --mode "$m" --duration "$dur" \
          --xvs target/release/xvs --json "$f" "${extra[@]}" >"$f.stdout" 2>"$f.stderr"; then
          echo "ok $s $t $m run $i" | tee -a "$log"
        else
          echo "FAILED $s $t $m run $i: $(tail -1 "$f.stderr")" | tee -a "$log"
          rm -f "$f"
        fi
      done
    done
  done
done
"$pl" report "$out"/*.json --out "$out/report" && echo "report: $out/report/report.md"
