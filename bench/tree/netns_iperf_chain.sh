#!/usr/bin/env bash
# Baseline for the namespace broadcast: the chain's traffic pattern without deltacast. N iperf3
# flows at once, dc(i-1) -> dci for i = 1..N, each over its sender's shaped egress, for SECONDS.
# Prints one JSON line: per-flow median and the aggregate, which bounds what any N-receiver
# broadcast can reach on this machine (every receiver must take in S bytes: N*S over the
# aggregate). Needs the namespaces of scripts/netns.sh create N (or more).
#   bench/tree/netns_iperf_chain.sh N [SECONDS]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
NETNS="$ROOT/scripts/netns.sh"
N="$1"
SECONDS_RUN="${2:-4}"
DIR="$(mktemp -d)"
trap 'rm -rf "$DIR"' EXIT
for ((i = 1; i <= N; i++)); do
  "$NETNS" exec "$i" iperf3 -s -1 -D -B "$("$NETNS" addr "$i")" -p 5201
done
sleep 0.5
pids=()
for ((i = 1; i <= N; i++)); do
  "$NETNS" exec $((i - 1)) timeout $((SECONDS_RUN + 15)) iperf3 -c "$("$NETNS" addr "$i")" -p 5201 \
    -t "$SECONDS_RUN" -J >"$DIR/flow-$i.json" 2>/dev/null &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done
python3 - "$DIR" "$N" <<'PY'
import json, statistics, sys
from pathlib import Path
rates = []
for f in sorted(Path(sys.argv[1]).glob("flow-*.json")):
    try:
        rates.append(json.loads(f.read_text())["end"]["sum_received"]["bits_per_second"])
    except (KeyError, ValueError):
        rates.append(0.0)
print(json.dumps({"bench": "iperf3_chain", "label": "netns", "flows": int(sys.argv[2]),
                  "flow_median_bps": statistics.median(rates), "aggregate_bps": sum(rates)}))
PY
