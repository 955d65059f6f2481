#!/usr/bin/env bash
# Configures and builds deltacast into ./build, in Release. Installs missing Debian packages first.
#   scripts/build.sh [--test] [CMAKE OPTION]...
# --test: the test build (tests and benchmarks on, their packages installed); without it the cache's
# choice stands, and a new build folder builds the library and the CLI only. The demo and the test
# command share ./build and the same flags, so whatever one compiled the other reuses; ccache
# (base_dir = the source root) also serves other clones and build folders.
# $DELTACAST_BUILD_DIR: another build folder; $DELTACAST_BUILD_TARGETS (space-separated): build
# only these targets. Other arguments go to cmake's configure step.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DELTACAST_BUILD_DIR:-$root/build}"
configure=()
if [ "${1:-}" = "--test" ]; then
  shift
  bash "$root/scripts/install-deps.sh" --test
  configure+=(-DDELTACAST_BUILD_TESTS=ON -DDELTACAST_BUILD_BENCH=ON)
else
  bash "$root/scripts/install-deps.sh"
  if [ ! -f "$build/CMakeCache.txt" ]; then
    configure+=(-DDELTACAST_BUILD_TESTS=OFF -DDELTACAST_BUILD_BENCH=OFF)
  fi
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  configure+=(-DCMAKE_BUILD_TYPE=Release)
fi
cmake -S "$root" -B "$build" "${configure[@]}" "$@" >/dev/null
targets=()
if [ -n "${DELTACAST_BUILD_TARGETS:-}" ]; then
  read -r -a names <<< "$DELTACAST_BUILD_TARGETS"
  for t in "${names[@]}"; do targets+=(--target "$t"); done
fi
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
