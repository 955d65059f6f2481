#!/usr/bin/env bash
# Deliverable 2: broadcast of S bytes from a producer namespace to 2..16 receivers, each in its
# own namespace with a tbf egress of LINK_GBIT Gbit/s (default 1; scripts/netns.sh), for binary,
# double_binary and chain; time vs S/B. Also an iperf3 check of one shaped link. Namespaces are
# removed on exit.
#   [LINK_GBIT=1] [CHUNK=4MiB] [TOPOLOGIES="binary double_binary chain"] [RESULT=file.jsonl]
#   bench/tree/run_netns.sh [BUILD_DIR] [REPEATS] [BYTES] [RECEIVER COUNTS...]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build-f}"
REPEATS="${2:-3}"
BYTES="${3:-64MiB}"
shift $(( $# < 3 ? $# : 3 ))
COUNTS=("$@")
[ ${#COUNTS[@]} -gt 0 ] || COUNTS=(2 4 8 16)
NETNS="$ROOT/scripts/netns.sh"
OUT="$ROOT/bench/tree/results"
mkdir -p "$OUT"
RESULT="${RESULT:-$OUT/netns.jsonl}"
LINK_GBIT="${LINK_GBIT:-1}"
CHUNK="${CHUNK:-4MiB}"
TOPOLOGIES=(${TOPOLOGIES:-binary double_binary chain})
export DELTACAST_NETNS_RATE="$(awk -v g="$LINK_GBIT" 'BEGIN { printf "%dmbit", g * 1000 + 0.5 }')"
trap '"$NETNS" destroy' EXIT
max=0
for n in "${COUNTS[@]}"; do ((n > max)) && max=$n; done
"$NETNS" create "$max"
# One shaped link, measured: dc1 -> dc0.
"$NETNS" exec 0 iperf3 -s -1 -B 10.200.0.1 -D
sleep 0.5
"$NETNS" exec 1 timeout 20 iperf3 -c 10.200.0.1 -t 5 -J \
  | python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"bench":"iperf3","label":"netns","bits_per_second":r["end"]["sum_received"]["bits_per_second"]}))' \
  | tee -a "$RESULT"
for ((i = 1; i <= REPEATS; i++)); do
  for n in "${COUNTS[@]}"; do
    for topo in "${TOPOLOGIES[@]}"; do
      timeout 300 "$NETNS" exec 0 "$BUILD/bench/tree/dc_bench_tree" broadcast --netns --receivers "$n" \
        --bytes "$BYTES" --stage 16MiB --chunk "$CHUNK" --topology "$topo" --link-gbit "$LINK_GBIT" \
        --label "netns-${LINK_GBIT}gbit-chunk${CHUNK}" \
        --json "$RESULT" >/dev/null
      tail -1 "$RESULT"
    done
  done
done
