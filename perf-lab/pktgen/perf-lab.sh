#!/bin/sh
# Linux pktgen (/proc/net/pktgen) for the perf-lab scenarios, on a client NIC wired to the
# LB's client-side NIC.
#
# NOT RUN: this machine has no pktgen module (modprobe pktgen fails) and no physical NICs.
# See ../README.md. pktgen cannot carry perf-lab's sequence/timestamp payload, so measure
# loss with counters (pktgen sent vs backend NIC rx) and latency with TRex or perf-lab.
#
# Usage: perf-lab.sh IFACE DST_MAC SCENARIO [SIZE] [RATE_PPS] [SECONDS] [THREADS]
#   SCENARIO: one-service | flows-1m | syn-flood | services-10k | change-under-load
#   SIZE: 64..1500 (frame size incl. FCS, pktgen's convention); RATE_PPS 0 = line rate.
# pktgen sends UDP only: syn-flood is approximated by UDP to the TCP service port (use TRex
# for real SYNs).
set -eu
IF=$1 DMAC=$2 SCEN=$3 SIZE=${4:-64} RATE=${5:-0} SECS=${6:-10} THREADS=${7:-1}
VIP=198.18.100.1 BASE=1000
case "$SCEN" in
  one-service|change-under-load) SERVICES=1 FLOWS=1000 ;;
  flows-1m|syn-flood)            SERVICES=1 FLOWS=1000000 ;;
  services-10k)                  SERVICES=10000 FLOWS=10000 ;;
  *) echo "unknown scenario $SCEN" >&2; exit 2 ;;
esac
SRC_COUNT=224
PORTS=$(( (FLOWS + SRC_COUNT - 1) / SRC_COUNT ))

modprobe pktgen
pg() { echo "$2" > "/proc/net/pktgen/$1"; }
for t in $(seq 0 $((THREADS - 1))); do
  pg "kpktgend_$t" "rem_device_all"
  dev="$IF@$t"
  pg "kpktgend_$t" "add_device $dev"
  pg "$dev" "count 0"
  pg "$dev" "pkt_size $SIZE"
  pg "$dev" "queue_map_min $t"
  pg "$dev" "queue_map_max $t"
  pg "$dev" "dst_mac $DMAC"
  pg "$dev" "dst $VIP"
  pg "$dev" "src_min 198.18.0.16"
  pg "$dev" "src_max 198.18.0.239"
  pg "$dev" "udp_src_min 1024"
  pg "$dev" "udp_src_max $((1024 + PORTS - 1))"
  pg "$dev" "udp_dst_min $BASE"
  pg "$dev" "udp_dst_max $((BASE + SERVICES - 1))"
  pg "$dev" "flag IPSRC_RND"
  pg "$dev" "flag UDPSRC_RND"
  [ "$SERVICES" -gt 1 ] && pg "$dev" "flag UDPDST_RND"
  pg "$dev" "flag UDPCSUM"
  pg "$dev" "flows $FLOWS"
  pg "$dev" "flowlen 1"
  if [ "$RATE" -gt 0 ]; then pg "$dev" "ratep $((RATE / THREADS))"; fi
done
pg pgctrl start &
sleep "$SECS"
pg pgctrl stop
for t in $(seq 0 $((THREADS - 1))); do grep -E "pkts-sofar|pps" "/proc/net/pktgen/$IF@$t"; done
