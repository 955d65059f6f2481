#!/usr/bin/env bash
# Deliverable 2: broadcast of S bytes from a producer namespace to 2..16 receivers, each in its
# own namespace with a 1 Gbit/s tbf egress (scripts/netns.sh), for binary, double_binary and
# chain; time vs S/B. Also an iperf3 check of one shaped link. Namespaces are removed on exit.
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
RESULT="$OUT/netns.jsonl"
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
    for topo in binary double_binary chain; do
      timeout 300 "$NETNS" exec 0 "$BUILD/bench/tree/dc_bench_tree" broadcast --netns --receivers "$n" \
        --bytes "$BYTES" --stage 16MiB --topology "$topo" --link-gbit 1 --label netns \
        --json "$RESULT" >/dev/null
      tail -1 "$RESULT"
    done
  done
done
