#!/usr/bin/env bash
# A producer group's memory and work per rank (issue 32; docs/performance.md, "A producer rank's
# memory and work"): for M = 1, 2, 4, 8 every rank runs as its own process (dc_bench_group_part:
# its part's baseline filled with pread, its part diffed and encoded against the new checkpoint),
# in interleaved rounds. Per M it prints the ranges over ranks and rounds of
#   (peak RSS - the process's RSS before the baseline) / the part's bytes
# and of the rank's encode time, with the M = 1 encode time of the same rounds; then a line fitted
# to peak RSS against the part (goal: <= 1.1 x the part plus a fixed overhead).
#   bench/tree/group_part.sh [PARAMS (500M)] [ROUNDS (3)] [THREADS (2)]
# $GROUP_PART_PAIR: a directory to keep the synthesized pair in and reuse; by default a temporary one.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dc="${DELTACAST:-$root/build/tools/deltacast}"
bench="${DC_BENCH_GROUP_PART:-$root/build/bench/tree/dc_bench_group_part}"
params="${1:-500M}"; rounds="${2:-3}"; threads="${3:-2}"
out="$(mktemp -d /tmp/dc-grouppart.XXXXXX)"
trap 'rm -rf "$out"' EXIT
work="${GROUP_PART_PAIR:-$out}"
[ -f "$work/file/step-0001.safetensors" ] ||
  "$dc" synth --out "$work/file" --params "$params" --steps 1 --seed 3 >/dev/null
base="$work/file/step-0000.safetensors"; new="$work/file/step-0001.safetensors"
for round in $(seq 1 "$rounds"); do
  for m in 1 2 4 8; do
    for rank in $(seq 0 $((m - 1))); do
      echo "$round $("$bench" "$base" "$new" "$m" "$rank" "$threads")"
    done
  done
done | tee "$out/lines" >&2
python3 - "$out/lines" <<'PY'
import json, sys, collections
by_m = collections.defaultdict(list)
for line in open(sys.argv[1]):
    round_, rest = line.split(' ', 1)
    j = json.loads(rest)
    by_m[j['ranks']].append(j)
one = [j['encode_s'] for j in by_m[1]]
print('M  part GB (min-max)  (peak RSS - fixed) / part  fixed MB  encode s per rank  M=1 encode s  frames MB (sum over ranks, one round)')
for m in sorted(by_m):
    js = by_m[m]
    parts = [j['part_bytes'] / 1e9 for j in js]
    ratio = [(j['rss_peak'] - j['rss_fixed']) / j['part_bytes'] for j in js]
    fixed = [j['rss_fixed'] / 1e6 for j in js]
    enc = [j['encode_s'] for j in js]
    frames = sum(j['frame_bytes'] for j in js) / len(js) * m / 1e6
    print('%-2d %5.3f-%5.3f         %5.3f-%5.3f                %4.1f-%4.1f  %6.3f-%6.3f      %5.3f-%5.3f   %.2f' % (
        m, min(parts), max(parts), min(ratio), max(ratio), min(fixed), max(fixed), min(enc), max(enc), min(one), max(one), frames))
# Peak RSS against the part over every rank of every M: a line, slope (bytes kept per byte of the
# part) and intercept (the fixed overhead: the process, the encoder's buffers).
xs = [j['part_bytes'] / 1e6 for m in by_m for j in by_m[m]]
ys = [j['rss_peak'] / 1e6 for m in by_m for j in by_m[m]]
n = len(xs); mx = sum(xs) / n; my = sum(ys) / n
slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
worst = max(abs(y - (my + slope * (x - mx))) for x, y in zip(xs, ys))
print('peak RSS = %.4f x part + %.1f MB (least squares over %d rank runs; largest residual %.1f MB)' % (
    slope, my - slope * mx, n, worst))
PY
