#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz, docs/fuzzing.md) with clang, libFuzzer, ASan and UBSan in
# build-fuzz/ and runs each for SECONDS, one after the other. Prints one line per target:
#   fuzz_<name>: N runs, C crashes
# and exits 1 when any target crashed. A crashing input is also copied into
# tests/fuzz/corpus/<name>/, so the corpus replay (ctest -L fuzz, normal build) fails on it until
# the bug is fixed. New coverage goes to build-fuzz/fuzz-corpus/<name>/ (not checked in); logs to
# build-fuzz/fuzz-logs/<name>.log (libFuzzer's cov/ft lines and final stats).
#   scripts/fuzz.sh SECONDS [NAME...]     NAME: frame_apply, locations, ... (default: every target)
# The main build is unaffected: build-fuzz is its own directory, configured with DELTACAST_FUZZ=ON.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh SECONDS [NAME...]" >&2; exit 2; }
seconds="$1"
shift
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(frame_apply locations tree_message raw_header safetensors_header config placement)
fi
bash "$root/scripts/install-deps.sh" --test --fuzz

build="${DELTACAST_FUZZ_BUILD_DIR:-$root/build-fuzz}"
# clang 14 cannot emit -fsanitize=function's prologue data for coroutines ("Cannot represent a
# difference across sections" in transport/tcp), so that one UBSan check is off.
sanitize="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize=function -fno-omit-frame-pointer"
# Boost 1.74's Asio enables coroutines on clang only with libc++; clang 14 with libstdc++ 12 has
# them too (dc_tree links the transports).
asio="-DBOOST_ASIO_HAS_CO_AWAIT=1 -DBOOST_ASIO_HAS_STD_COROUTINE=1"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ "-DCMAKE_C_FLAGS=$sanitize" "-DCMAKE_CXX_FLAGS=$sanitize $asio" \
  -DDELTACAST_FUZZ=ON -DDELTACAST_BUILD_BENCH=OFF -DDELTACAST_WITH_OFI=OFF -DDELTACAST_WITH_UCX=OFF \
  -DDELTACAST_WITH_CUDA=OFF >/dev/null
cmake --build "$build" -j "${DELTACAST_FUZZ_JOBS:-$(nproc)}" --target "${names[@]/#/fuzz_}" >/dev/null

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
failed=0
for name in "${names[@]}"; do
  seeds="$root/tests/fuzz/corpus/$name"
  work="$build/fuzz-corpus/$name"
  artifacts="$build/fuzz-artifacts/$name"
  log="$build/fuzz-logs/$name.log"
  mkdir -p "$work" "$artifacts" "$(dirname "$log")" "$seeds"
  rm -f "$artifacts"/*
  dict=()
  [ -f "$root/tests/fuzz/$name.dict" ] && dict=("-dict=$root/tests/fuzz/$name.dict")
  # New inputs go to the first corpus directory (work); the checked-in seeds are only read. Every
  # target's model is tiny, so one allocation above 256 MiB is sized by a forged count: a finding.
  "$build/tests/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=256 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" "$work" "$seeds" >"$log" 2>&1 || true
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  crashes=0
  for input in "$artifacts"/*; do
    [ -f "$input" ] || continue
    cp "$input" "$seeds/"
    crashes=$((crashes + 1))
  done
  if [ -z "$runs" ]; then  # died before its final stats: count what ran (libFuzzer's #N lines)
    runs="$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')"
    [ "$crashes" -gt 0 ] || crashes=1
  fi
  echo "fuzz_$name: ${runs:-0} runs, $crashes crashes"
  [ "$crashes" -eq 0 ] || failed=1
done
exit "$failed"
