#!/usr/bin/env bash
# Runs every test: installs what is missing, builds (./build, Release: the folder and flags the demo
# uses, so nothing the demo built is compiled again), then ctest. Tests that need Open MPI, Slurm,
# libfabric, UCX or network namespaces start those themselves (pinned to loopback).
#   scripts/test.sh [--sanitize] [--build-only] [--cmake OPTION]... [CTEST ARGUMENTS]
# --cmake OPTION (repeatable) goes to cmake's configure step, e.g. --cmake -DDELTACAST_WERROR=ON;
# so does each word of $DELTACAST_CMAKE_ARGS. Everything else goes to ctest (e.g. -L codec, -R Golden).
# --sanitize: the same tests built with AddressSanitizer + UndefinedBehaviorSanitizer
# (DELTACAST_SANITIZE=ON) in build-asan/ ($DELTACAST_BUILD_DIR wins); any report fails the test.
# $DELTACAST_BUILD_TARGETS (space-separated) builds only those targets (CI: the codec and tree
# tests under ASan).
# --build-only: install and build as above, run no test (CI builds the ASan tests beside the suite).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmake_args=()
if [ -n "${DELTACAST_CMAKE_ARGS:-}" ]; then
  read -r -a cmake_args <<< "$DELTACAST_CMAKE_ARGS"
fi
sanitize=0
build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=1; shift ;;
    --build-only) build_only=1; shift ;;
    --cmake)
      [ $# -ge 2 ] || { echo "test.sh: --cmake needs an option (e.g. --cmake -DDELTACAST_WERROR=ON)" >&2; exit 2; }
      cmake_args+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
if [ "$sanitize" = 1 ]; then
  export DELTACAST_BUILD_DIR="${DELTACAST_BUILD_DIR:-$root/build-asan}"
  # The host code under the sanitizers; CUDA kernels (nvcc) are not instrumented: built without.
  cmake_args+=(-DDELTACAST_SANITIZE=ON -DDELTACAST_BUILD_BENCH=OFF -DDELTACAST_WITH_CUDA=OFF)
  # -O1 -g1, as the ASan documentation advises: line tables are all a report's stack needs, and
  # the build takes 9 min instead of 21 (-O2 -g) for CI's targets here; the tests run ~8% longer.
  cmake_args+=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
              "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
  # Any report ends the process with a failure; leaks are reported at exit. Suppressions for
  # reports inside libraries we do not own: tests/sanitizers/ (each with the reason).
  export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=0:detect_leaks=1:detect_stack_use_after_return=0:suppressions=$root/tests/sanitizers/asan.supp}"
  export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:suppressions=$root/tests/sanitizers/ubsan.supp}"
  # Instrumented threads run ~3x slower: tests stretch the bounds they give a healthy peer
  # (tests/common/time_scale.h).
  export DELTACAST_TEST_TIME_SCALE="${DELTACAST_TEST_TIME_SCALE:-3}"
  # Tests whose bounds measure memory (peak RSS) read it: ASan's shadow and quarantine (up to 256
  # MiB of freed memory held back) are not ours to bound.
  export DELTACAST_SANITIZER=address
fi
bash "$root/scripts/build.sh" --test "${cmake_args[@]}"
build="${DELTACAST_BUILD_DIR:-$root/build}"
[ "$build_only" = 1 ] && exit 0
cd "$build"
# A fresh build directory has no record of how long each test takes, so ctest would start them in
# declaration order and the longest (the netns and multi-process ones) could start last, leaving a
# tail on one core. tests/ctest-cost-seed.txt (seconds per test, measured here) makes them start
# first; ctest replaces it with its own measurements after the first run.
if [ ! -f Testing/Temporary/CTestCostData.txt ]; then
  mkdir -p Testing/Temporary
  cp "$root/tests/ctest-cost-seed.txt" Testing/Temporary/CTestCostData.txt
fi
status=0
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@" || status=$?
# The reasons of the failures last, where a CI that keeps only its log's tail shows them.
[ "$status" = 0 ] || python3 "$root/scripts/failed-tests-recap.py" "$build" 40
exit "$status"
