#!/usr/bin/env bash
# A producer group rank's memory in a real run (issue 32; docs/performance.md, "A producer rank's
# memory in a real run"): `deltacast demo --producers M` (8 receivers, 100 Mbit/s per rank, ~3%
# change, version 1 as RAW pieces, then STEPS deltas) for each PARAMS and M = 1, 2, 4, interleaved
# over ROUNDS. Every rank reports its peak RSS (VmHWM: the kernel's high-water mark, anonymous and
# file pages), its simulated trainer's bytes (the part it simulates, 14 bytes a parameter: the
# trainer's memory, not deltacast's) and its part's bytes. Prints per (PARAMS, M) the range over
# ranks and rounds of (peak - trainer) / part and of (peak - trainer - part), then the line fitted
# to peak - trainer against the part over every rank of every run (goal: <= 1.1 x the part plus
# a fixed overhead).
#   bench/tree/group_rank_memory.sh [ROUNDS (2)] [STEPS (3)] [PARAMS ... (100M 500M)]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dc="${DELTACAST:-$root/build/tools/deltacast}"
rounds="${1:-2}"; steps="${2:-3}"
sizes=("${@:3}")
[ ${#sizes[@]} -gt 0 ] || sizes=(100M 500M)
out="$(mktemp -d /tmp/dc-rankmem.XXXXXX)"
trap 'rm -rf "$out"' EXIT
for round in $(seq 1 "$rounds"); do
  for params in "${sizes[@]}"; do
    for m in $( [ $((round % 2)) = 1 ] && echo 1 2 4 || echo 4 2 1); do
      "$dc" demo --producers "$m" --params "$params" --receivers 8 --steps "$steps" --uplink 100Mbit/s \
        --lr 5e-6 >"$out/demo.txt" 2>&1 || { cat "$out/demo.txt" >&2; exit 1; }
      dir=$(sed -n 's/.*(logs in \(.*\))$/\1/p' "$out/demo.txt" | head -n 1)
      grep -q "8/8 receivers bit-exact" "$out/demo.txt" || { cat "$out/demo.txt" >&2; exit 1; }
      python3 - "$dir" "$round" "$params" "$m" >>"$out/lines" <<'PY'
import glob, json, sys
d, rnd, params, m = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
for f in sorted(glob.glob(d + "/report*.json")):
    r = json.load(open(f))
    print(json.dumps(dict(round=rnd, params=params, m=m, rank=r.get("producer_rank", 0), peak=r["peak_rss_bytes"],
                          trainer=r["trainer_bytes"], part=r["part_bytes"])))
PY
      rm -rf "$dir"
      echo "round $round: $params M=$m done" >&2
    done
  done
done
python3 - "$out/lines" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[(r["params"], r["m"])].append(r)
print("| params | M | part MB | (peak - trainer) / part | peak - trainer - part, MB |")
print("| --- | --- | --- | --- | --- |")
for (params, m), rs in sorted(by.items(), key=lambda kv: (float(kv[0][0][:-1]), kv[0][1])):
    ratio = [(r["peak"] - r["trainer"]) / r["part"] for r in rs]
    extra = [(r["peak"] - r["trainer"] - r["part"]) / 1e6 for r in rs]
    part = sorted({round(r["part"] / 1e6, 1) for r in rs})
    print(f"| {params} | {m} | {part[0]:.1f}-{part[-1]:.1f} | {min(ratio):.3f}-{max(ratio):.3f} | "
          f"{min(extra):.1f}-{max(extra):.1f} |")
xs = [r["part"] / 1e6 for r in rows]
ys = [(r["peak"] - r["trainer"]) / 1e6 for r in rows]
n = len(xs); mx = sum(xs) / n; my = sum(ys) / n
slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
fixed = my - slope * mx
worst = max(abs(y - (slope * x + fixed)) for x, y in zip(xs, ys))
print(f"fitted over {n} rank runs: peak RSS - trainer = {slope:.3f} x the part + {fixed:.1f} MB "
      f"(largest residual {worst:.1f} MB)")
PY
