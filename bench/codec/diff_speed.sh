#!/usr/bin/env bash
# `deltacast diff` against the memory-bound floor (issue 12: <= 2.2x a plain read of both
# checkpoints). Each round runs, in one process each, `diff --baseline` (a timed plain read of both
# checkpoints, then the one-pass diff) and `diff --baseline --two-pass` (the base digested in its
# own pass first, as before), interleaved, on a file pair and on the same pair stored as shards.
#   bench/codec/diff_speed.sh [PARAMS (500M)] [ROUNDS (5)] [THREADS (2)]
# Prints one line per run and the range of diff/read per mode. The frames of both modes are
# compared byte for byte.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dc="${DELTACAST:-$root/build/tools/deltacast}"
params="${1:-500M}"; rounds="${2:-5}"; threads="${3:-2}"
work="$(mktemp -d /tmp/dc-diffspeed.XXXXXX)"
trap 'rm -rf "$work"' EXIT
"$dc" synth --out "$work/file" --params "$params" --steps 1 --seed 3 >/dev/null
"$dc" synth --out "$work/shards" --params "$params" --steps 1 --seed 3 --shards 4 >/dev/null
for r in $(seq 1 "$rounds"); do
  for layout in file shards; do
    if [ "$layout" = file ]; then a="$work/file/step-0000.safetensors"; b="$work/file/step-0001.safetensors"
    else a="$work/shards/step-0000"; b="$work/shards/step-0001"; fi
    for mode in one-pass two-pass; do
      extra=(); [ "$mode" = two-pass ] && extra=(--two-pass)
      "$dc" diff --base "$a" --new "$b" --out "$work/$mode.dcx" --baseline --json --threads "$threads" "${extra[@]}" |
        python3 -c "import json,sys; j=json.load(sys.stdin); print('$r $layout $mode', '%.3f %.3f %.2f' % (j['read_seconds'], j['encode_seconds'], j['diff_over_read']))"
    done
    cmp -s "$work/one-pass.dcx" "$work/two-pass.dcx" || { echo "diff_speed: the two modes' frames differ" >&2; exit 1; }
  done
done | tee "$work/lines"
echo "round layout mode read_s diff_s diff/read" >&2
python3 - "$work/lines" <<'PY'
import sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, layout, mode, read, diff, ratio = line.split()
    runs[(layout, mode)].append((float(read), float(diff), float(ratio)))
for (layout, mode), v in sorted(runs.items()):
    ratios = sorted(x[2] for x in v)
    reads = sorted(x[0] for x in v)
    diffs = sorted(x[1] for x in v)
    print(f"{layout:6} {mode:8} diff/read {ratios[0]:.2f}-{ratios[-1]:.2f} (median {ratios[len(ratios)//2]:.2f}); "
          f"read {reads[0]:.3f}-{reads[-1]:.3f} s; diff {diffs[0]:.3f}-{diffs[-1]:.3f} s")
PY
