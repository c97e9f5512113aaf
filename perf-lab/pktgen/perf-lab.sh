#!/bin/sh
# Linux pktgen (/proc/net/pktgen) for the perf-lab scenarios, on a client NIC wired to the
# LB's client-side NIC (perf-lab/trex/xvs.toml is the LB's config for that topology).
#
# Not run here: this machine has no pktgen module and no physical NICs. `--dry-run` prints
# the commands it would write to /proc/net/pktgen (as `echo "CMD" > /proc/net/pktgen/FILE`
# lines, plus `# ...` notes) and touches nothing; perf-lab/tests/pktgen.rs checks them.
# pktgen cannot carry perf-lab's sequence/timestamp payload: measure loss with counters
# (pktgen's pkts-sofar vs the backend NIC's rx) and latency with TRex or perf-lab.
#
# Usage: perf-lab.sh [--dry-run] IFACE DST_MAC SCENARIO [SIZE] [RATE_PPS] [SECONDS] [THREADS]
#   SCENARIO: one-service | flows-1m | syn-flood | services-10k | change-under-load
#   SIZE: Ethernet frame bytes including the 4-byte FCS, 64..1518 (RFC 2544's sizes; pktgen's
#         pkt_size is the frame without the FCS, so 64 is written as pkt_size 60).
#   RATE_PPS: total over the threads, 0 = as fast as they go. THREADS: kpktgend_0.. (one per
#   CPU), each on its own tx queue.
#   FLOWS=N in the environment overrides the scenario's flow count.
# pktgen sends UDP only: syn-flood is approximated by UDP to the service port (use TRex
# for real SYNs).
#
# Flows are exact. pktgen's own `flows` setting (at most 65,536 per device, MAX_CFLOWS) only
# pins a destination address per flow; what makes a load balancer's flows is the source
# address and ports. Without the *_RND flags pktgen steps every range by one per packet
# (source address inclusive of src_max, ports exclusive of udp_*_max), so a thread whose
# ranges have coprime lengths A (addresses) and B (source ports) sends exactly A x B
# distinct flows, every one from its own address and port. Each thread gets FLOWS/THREADS
# flows in its own block of source addresses (or, when they do not fit, of source ports), and
# services/THREADS services: flow k of a thread goes to service k mod services.
set -eu
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
if [ $# -lt 3 ]; then sed -n '2,/^set -eu/p' "$0" | sed '$d'; exit 2; fi
IF=$1 DMAC=$2 SCEN=$3 SIZE=${4:-64} RATE=${5:-0} SECS=${6:-10} THREADS=${7:-1}
VIP=198.18.100.1 BASE=1000
SRC_NET=198.18.0 SRC_FIRST=16 SRC_COUNT=224 SPORT_FIRST=1024 SPORT_COUNT=64512
case "$SCEN" in
  one-service|change-under-load) SERVICES=1 FLOWS=${FLOWS:-1000} ;;
  flows-1m|syn-flood)            SERVICES=1 FLOWS=${FLOWS:-1000000} ;;
  services-10k)                  SERVICES=10000 FLOWS=${FLOWS:-10000} ;;
  *) echo "unknown scenario $SCEN" >&2; exit 2 ;;
esac
die() { echo "perf-lab.sh: $*" >&2; exit 2; }
[ "$SIZE" -ge 64 ] && [ "$SIZE" -le 1518 ] || die "size $SIZE: want 64..1518 (frame bytes with FCS)"
[ "$THREADS" -ge 1 ] || die "threads $THREADS: want at least 1"
PKT_SIZE=$((SIZE - 4))
[ $((FLOWS % THREADS)) -eq 0 ] || die "$FLOWS flows do not split evenly over $THREADS threads"
FT=$((FLOWS / THREADS))
ST=1
if [ "$SERVICES" -gt 1 ]; then
  [ $((SERVICES % THREADS)) -eq 0 ] || die "$SERVICES services do not split evenly over $THREADS threads"
  ST=$((SERVICES / THREADS))
  [ $((FT % ST)) -eq 0 ] || die "$FT flows per thread are not a multiple of its $ST services"
fi

gcd() { a=$1 b=$2; while [ "$b" -ne 0 ]; do t=$((a % b)); a=$b; b=$t; done; echo "$a"; }
# A x B = FT with gcd(A, B) = 1, the most addresses first: threads in their own blocks of
# addresses (THREADS x A addresses, B ports each) or else of ports (A addresses, THREADS x B).
A=0 SPLIT=
for split in src port; do
  a=$SRC_COUNT
  [ "$split" = src ] && a=$((SRC_COUNT / THREADS))
  [ "$a" -gt "$FT" ] && a=$FT
  while [ "$a" -ge 1 ]; do
    if [ $((FT % a)) -eq 0 ] && [ "$(gcd "$a" $((FT / a)))" -eq 1 ]; then
      b=$((FT / a))
      if { [ "$split" = src ] && [ "$b" -le "$SPORT_COUNT" ]; } ||
         { [ "$split" = port ] && [ $((b * THREADS)) -le "$SPORT_COUNT" ]; }; then
        A=$a SPLIT=$split; break 2
      fi
    fi
    a=$((a - 1))
  done
done
[ "$A" -gt 0 ] || die "$FT flows per thread do not split into coprime address (<= $SRC_COUNT) and port (<= $SPORT_COUNT) counts: try another FLOWS or THREADS"
B=$((FT / A))

if [ "$DRY" -eq 1 ]; then
  pg() { echo "echo \"$2\" > /proc/net/pktgen/$1"; }
else
  modprobe pktgen
  pg() { echo "$2" > "/proc/net/pktgen/$1"; }
fi
echo "# $FLOWS flows, $SERVICES services, $THREADS threads: $FT flows each ($A addresses x $B source ports, $ST services, $SPLIT blocks), pkt_size $PKT_SIZE"
for t in $(seq 0 $((THREADS - 1))); do
  src=$SRC_FIRST sport=$SPORT_FIRST
  if [ "$SPLIT" = src ]; then src=$((SRC_FIRST + t * A)); else sport=$((SPORT_FIRST + t * B)); fi
  dport=$BASE
  [ "$SERVICES" -gt 1 ] && dport=$((BASE + t * ST))
  dev="$IF@$t"
  pg "kpktgend_$t" "rem_device_all"
  pg "kpktgend_$t" "add_device $dev"
  pg "$dev" "count 0"
  pg "$dev" "clone_skb 0"
  pg "$dev" "pkt_size $PKT_SIZE"
  pg "$dev" "queue_map_min $t"
  pg "$dev" "queue_map_max $t"
  pg "$dev" "dst_mac $DMAC"
  pg "$dev" "dst $VIP"
  pg "$dev" "src_min $SRC_NET.$src"
  pg "$dev" "src_max $SRC_NET.$((src + A - 1))"
  pg "$dev" "udp_src_min $sport"
  pg "$dev" "udp_src_max $((sport + B))"
  pg "$dev" "udp_dst_min $dport"
  pg "$dev" "udp_dst_max $((dport + ST))"
  pg "$dev" "flag UDPCSUM"
  if [ "$RATE" -gt 0 ]; then pg "$dev" "ratep $((RATE / THREADS))"; fi
done
if [ "$DRY" -eq 1 ]; then
  pg pgctrl start
  echo "sleep $SECS"
  pg pgctrl stop
  exit 0
fi
pg pgctrl start &
sleep "$SECS"
pg pgctrl stop
for t in $(seq 0 $((THREADS - 1))); do grep -E "pkts-sofar|pps" "/proc/net/pktgen/$IF@$t"; done
