#!/usr/bin/env bash
# Accuracy of deltacast's egress cap (egress.* / `bench link --egress`) against the same rate
# enforced by the kernel: iperf3 through a `tc tbf` link of that rate, between two network
# namespaces (scripts/netns.sh), measured in interleaved rounds.
#   bench/transport/pacing.sh [ROUNDS] [RATE...]      (default: 5 rounds of 50mbit 200mbit 1gbit)
# Per round and rate: iperf3 -t 4 through tbf (receiver-side bits/s), then `deltacast bench link
# --transport tcp --egress RATE` on unshaped loopback moving 4 s worth at that rate in 1 MiB
# messages (the server's acknowledgement of the last byte stops the clock). Prints one JSON line
# per measurement, then per rate: paced/nominal and paced/iperf3 as min-median-max over rounds,
# and iperf3's own spread. Needs root (netns); exit 77 where namespaces are not permitted.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
NETNS="$ROOT/scripts/netns.sh"
DC="${DELTACAST_BIN:-$ROOT/build/tools/deltacast}"
ROUNDS="${1:-5}"
shift || true
RATES=("$@")
[ ${#RATES[@]} -gt 0 ] || RATES=(50mbit 200mbit 1gbit)
export DELTACAST_NETNS_PREFIX=dcpace
OUT="$(mktemp -d)"
trap 'DELTACAST_NETNS_PREFIX=dcpace "$NETNS" destroy; rm -rf "$OUT"' EXIT

bits_of() {  # 50mbit -> 50000000
  python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)(k|m|g)?bit', sys.argv[1]); print(int(float(m.group(1))*{None:1,'k':1e3,'m':1e6,'g':1e9}[m.group(2)]))" "$1"
}

for ((round = 1; round <= ROUNDS; round++)); do
  for rate in "${RATES[@]}"; do
    bits=$(bits_of "$rate")
    DELTACAST_NETNS_RATE="$rate" "$NETNS" create 1 >/dev/null
    "$NETNS" exec 1 iperf3 -s -1 -D -B "$("$NETNS" addr 1)" -p 5201
    sleep 0.3
    "$NETNS" exec 0 timeout 30 iperf3 -c "$("$NETNS" addr 1)" -p 5201 -t 4 -J >"$OUT/iperf.json" 2>/dev/null || true
    iperf_bps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['end']['sum_received']['bits_per_second'])" "$OUT/iperf.json" 2>/dev/null || echo 0)
    "$NETNS" destroy
    size=$((bits / 8 * 4))
    paced=$("$DC" bench link --transport tcp --egress "${bits}bit/s" --size "$size" --message-size 1MiB --window 4 --json)
    paced_bps=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['gbits_per_s']*1e9)" "$paced")
    echo "{\"round\": $round, \"rate\": \"$rate\", \"nominal_bps\": $bits, \"iperf3_tbf_bps\": $iperf_bps, \"deltacast_paced_bps\": $paced_bps}" | tee -a "$OUT/all.jsonl"
  done
done
python3 - "$OUT/all.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def span(xs):
    xs = sorted(xs)
    return f"{xs[0]:.3f}-{statistics.median(xs):.3f}-{xs[-1]:.3f}"
print("rate      paced/nominal (min-med-max)  paced/iperf3 (min-med-max)  iperf3/nominal (min-med-max)")
for rate in dict.fromkeys(r["rate"] for r in rows):
    rs = [r for r in rows if r["rate"] == rate]
    ok = [r for r in rs if r["iperf3_tbf_bps"] > 0]
    print(f"{rate:9s} {span([r['deltacast_paced_bps'] / r['nominal_bps'] for r in rs]):28s} "
          f"{span([r['deltacast_paced_bps'] / r['iperf3_tbf_bps'] for r in ok]) if ok else '-':27s} "
          f"{span([r['iperf3_tbf_bps'] / r['nominal_bps'] for r in ok]) if ok else '-'}")
PY
