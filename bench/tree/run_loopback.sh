#!/usr/bin/env bash
# Deliverable 1: S bytes to 8 receivers on loopback TCP, MPI_Bcast (Open MPI, btl self,tcp on lo)
# vs the relay tree (dc_bench_tree broadcast), interleaved in the same run, REPEATS times each.
#   bench/tree/run_loopback.sh [BUILD_DIR] [REPEATS] [BYTES]
# Appends JSON lines to bench/tree/results/loopback.jsonl; bench/tree/summarize.py reads them.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build-f}"
REPEATS="${2:-3}"
BYTES="${3:-256MiB}"
OUT="$ROOT/bench/tree/results"
mkdir -p "$OUT"
RESULT="${RESULT:-$OUT/loopback.jsonl}"
for ((i = 1; i <= REPEATS; i++)); do
  timeout 300 "$ROOT/scripts/mpirun-local.sh" -np 9 "$BUILD/bench/tree/dc_bench_mpi_bcast" "$BYTES" 1 \
    | grep '^{' | sed 's/}$/,"label":"loopback"}/' | tee -a "$RESULT"
  for topo in binary double_binary chain; do
    timeout 300 "$BUILD/bench/tree/dc_bench_tree" broadcast --receivers 8 --bytes "$BYTES" \
      --topology "$topo" --label loopback --json "$RESULT" >/dev/null
    tail -1 "$RESULT"
  done
done
