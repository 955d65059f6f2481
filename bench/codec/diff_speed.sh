#!/usr/bin/env bash
# `deltacast diff` against plain reads of both checkpoints (issue 12: <= 2.2x a memory-bound read of
# both). Each run is one `diff --baseline --rounds R` process: per round it times a read of both
# checkpoints and the diff, each first on a fresh mapping of the files (what a process that maps
# them and reads them once pays, first touch of every page included; the issue's baseline) and then
# again on the now-mapped pages, plus a read of the files with pread; odd rounds diff first. Runs
# alternate between the diff's modes, on a file pair and on the same pair stored as 4 shards:
# pread (the default: one pass over pieces read with pread), map (one pass through the mappings,
# `--read map`), two-pass (`--two-pass`: the base digested in its own pass first, through the
# mappings, as before); $DIFF_SPEED_MODES picks some (default "pread map two-pass").
#   bench/codec/diff_speed.sh [PARAMS (500M)] [RUNS (3)] [ROUNDS per run (3)] [THREADS (2)]
# $DELTACAST: the binary, or several separated by ':' (an A/B: each run alternates between them,
# lines and ranges are labelled 0, 1, ... in that order). $DIFF_SPEED_PAIR: a directory to keep the
# synthesized pair in and reuse (synth takes ~1 min at 500M); by default a temporary one.
# Prints one line per round and, per layout, binary and mode, the ranges of the per-round ratios
# over every round of every run. The frames of both modes are compared byte for byte.
# Mapped reads depend on the folio sizes the page cache holds the files in (docs/performance.md,
# "deltacast diff against a read"):
# `echo 1 > /proc/sys/vm/drop_caches` and a `cat` of the files before a run make that state known.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=bench/codec/lib_pair.sh
source "$root/bench/codec/lib_pair.sh"
IFS=: read -r -a dcs <<< "${DELTACAST:-$root/build/tools/deltacast}"
params="${1:-500M}"; runs="${2:-3}"; rounds="${3:-3}"; threads="${4:-2}"
modes="${DIFF_SPEED_MODES:-pread map two-pass}"
first_mode="${modes%% *}"
out="$(mktemp -d /tmp/dc-diffspeed.XXXXXX)"
trap 'rm -rf "$out"' EXIT
work="${DIFF_SPEED_PAIR:-$out}"
synth_pair "$work" "$params"
echo "run layout binary mode round: read_fresh diff_fresh read_mapped diff_mapped read_pread (s)" >&2
for r in $(seq 1 "$runs"); do
  for layout in file shards; do
    pair_paths "$work" "$layout"
    for i in "${!dcs[@]}"; do
      for mode in $modes; do
        mode_args "$mode"
        "${dcs[$i]}" diff --base "$a" --new "$b" --out "$out/$mode.dcx" --baseline --rounds "$rounds" --json \
          --threads "$threads" "${extra[@]}" |
          python3 -c "
import json, sys
j = json.load(sys.stdin)
for k, x in enumerate(j['rounds']):
    print('$r $layout $i $mode', k + 1, ' '.join('%.3f' % x[f] for f in ('read_fresh', 'diff_fresh', 'read_mapped', 'diff_mapped', 'read_pread')))"
      done
      for mode in $modes; do
        cmp -s "$out/$first_mode.dcx" "$out/$mode.dcx" || { echo "diff_speed: modes $first_mode and $mode gave different frames" >&2; exit 1; }
      done
    done
  done
done | tee "$out/lines"
python3 - "$out/lines" <<'PY'
import sys, collections, statistics
rounds = collections.defaultdict(list)
for line in open(sys.argv[1]):
    run, layout, binary, mode, k, rf, df, rm, dm, rp = line.split()
    rounds[(layout, binary, mode)].append(tuple(map(float, (rf, df, rm, dm, rp))))
def span(v, fmt='%.2f'):
    v = sorted(v)
    return (fmt + '-' + fmt + ' (median ' + fmt + ')') % (v[0], v[-1], statistics.median(v))
for (layout, binary, mode), v in sorted(rounds.items()):
    print(f"{layout:6} binary {binary} {mode:8} {len(v)} rounds")
    print(f"  diff/read, fresh mappings   {span([d / r for r, d, *_ in v])}; read {span([x[0] for x in v], '%.3f')} s; diff {span([x[1] for x in v], '%.3f')} s")
    print(f"  diff/read, pages mapped     {span([x[3] / x[2] for x in v])}; read {span([x[2] for x in v], '%.3f')} s; diff {span([x[3] for x in v], '%.3f')} s")
    print(f"  diff (fresh)/read (pread)   {span([x[1] / x[4] for x in v])}; read {span([x[4] for x in v], '%.3f')} s")
PY
