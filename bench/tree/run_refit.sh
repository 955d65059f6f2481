#!/usr/bin/env bash
# Deliverables 3 and 4: full checkpoint vs delta refit across a shaped cross-cluster link. The
# producer (dc0) has a 1 Gbit/s tbf uplink; the receivers (dc1..dcN, cluster "rollout") have
# 10 Gbit/s egress among themselves. Synthetic model (trainer simulator), lr 2e-6 (~1% change)
# and 6e-6 (~3%). speedup = full_seconds / refit_seconds, and refit time over payload/B.
#   [UPLINK_GBIT=1] [LRS="2e-6 6e-6"] [RESULT=file.jsonl] bench/tree/run_refit.sh [BUILD_DIR] [REPEATS] [PARAMS] [RECEIVERS] [TOPOLOGY]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build-f}"
REPEATS="${2:-3}"
PARAMS="${3:-200M}"
RECEIVERS="${4:-4}"
TOPOLOGY="${5:-chain}"
NETNS="$ROOT/scripts/netns.sh"
OUT="$ROOT/bench/tree/results"
mkdir -p "$OUT"
RESULT="${RESULT:-$OUT/refit.jsonl}"
UPLINK_GBIT="${UPLINK_GBIT:-1}"
UPLINK_RATE="$(awk -v g="$UPLINK_GBIT" 'BEGIN { printf "%dmbit", g * 1000 + 0.5 }')"
trap '"$NETNS" destroy' EXIT
DELTACAST_NETNS_RATE=10gbit DELTACAST_NETNS_RATE_0="$UPLINK_RATE" "$NETNS" create "$RECEIVERS"
for ((i = 1; i <= REPEATS; i++)); do
  for lr in ${LRS:-2e-6 6e-6}; do
    timeout 600 "$NETNS" exec 0 "$BUILD/bench/tree/dc_bench_tree" refit --netns --receivers "$RECEIVERS" \
      --params "$PARAMS" --lr "$lr" --steps 3 --topology "$TOPOLOGY" --link-gbit "$UPLINK_GBIT" --label "cross-cluster-${UPLINK_GBIT}gbit" \
      --json "$RESULT" >/dev/null
    tail -1 "$RESULT"
  done
done
