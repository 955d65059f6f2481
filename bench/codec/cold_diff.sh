#!/usr/bin/env bash
# `deltacast diff` of a pair that is not in the page cache (each round first drops the caches:
# needs root), then a read(2) of its files (`cat`: the first read after pages were read in through
# a mapping advised MADV_HUGEPAGE is slow once: docs/performance.md, "deltacast diff against a
# read"), then the diff again on the pages the first one read in: the second diff (`--baseline`:
# its fresh-mapping and pread reads in the same process) shows in which folio sizes the first one
# left the files (4 KiB folios make later mapped reads slow). FileHugePages (/proc/meminfo) after
# the cold diff says the same directly.
#   bench/codec/cold_diff.sh [ROUNDS (3)] [THREADS (2)]
# $DELTACAST: the binary, or several separated by ':' (interleaved in each round, labelled 0, 1, ...).
# $COLD_DIFF_MODES: the diff's modes, interleaved for each binary (default "pread": the default
# diff; "map": `--read map`, through the mappings).
# $DIFF_SPEED_PAIR: the pair's directory as bench/codec/diff_speed.sh leaves it (file/, shards/);
# by default a temporary 500M pair.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=bench/codec/lib_pair.sh
source "$root/bench/codec/lib_pair.sh"
IFS=: read -r -a dcs <<< "${DELTACAST:-$root/build/tools/deltacast}"
rounds="${1:-3}"; threads="${2:-2}"
modes="${COLD_DIFF_MODES:-pread}"
[ -w /proc/sys/vm/drop_caches ] || { echo "cold_diff: needs root (writes /proc/sys/vm/drop_caches)" >&2; exit 2; }
out="$(mktemp -d /tmp/dc-colddiff.XXXXXX)"
trap 'rm -rf "$out"' EXIT
work="${DIFF_SPEED_PAIR:-$out}"
synth_pair "$work" 500M
echo "round layout binary/mode: cold_diff_s file_huge_MB first_cat_s | then warm: read_fresh diff_fresh read_pread (s)"
for r in $(seq 1 "$rounds"); do
  for layout in file shards; do
    pair_paths "$work" "$layout"
    for i in "${!dcs[@]}"; do
      for mode in $modes; do
        mode_args "$mode"
        sync
        echo 1 > /proc/sys/vm/drop_caches
        start=$(date +%s.%N)
        "${dcs[$i]}" diff --base "$a" --new "$b" --out "$out/d.dcx" --threads "$threads" "${extra[@]}" >/dev/null
        end=$(date +%s.%N)
        huge=$(awk '/^FileHugePages/ {print int($2 / 1024)}' /proc/meminfo)
        cat_start=$(date +%s.%N)
        if [ -d "$a" ]; then cat "$a"/* "$b"/* >/dev/null; else cat "$a" "$b" >/dev/null; fi
        cat_end=$(date +%s.%N)
        warm=$("${dcs[$i]}" diff --base "$a" --new "$b" --out "$out/d.dcx" --baseline --rounds 1 --threads "$threads" "${extra[@]}" --json |
          python3 -c "import json, sys; x = json.load(sys.stdin)['rounds'][0]; print('%.3f %.3f %.3f' % (x['read_fresh'], x['diff_fresh'], x['read_pread']))")
        echo "$r $layout $i/$mode: $(python3 -c "print('%.3f %s %.3f' % ($end - $start, $huge, $cat_end - $cat_start))") | $warm"
      done
    done
  done
done
