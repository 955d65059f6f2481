#!/usr/bin/env bash
# Configures and builds deltacast into ./build, in Release (a unity build of the libraries and the
# CLI). Installs missing Debian packages first.
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
  configure+=(-DDELTACAST_BUILD_TESTS=ON -DDELTACAST_BUILD_BENCH=ON -DDELTACAST_WITH_CUDA=AUTO)
else
  bash "$root/scripts/install-deps.sh"
  if [ ! -f "$build/CMakeCache.txt" ]; then
    # The CLI alone: no tests, no benchmarks, no CUDA kernels (the CLI holds weights in host
    # memory; the C API and Python use them). The test build adds them to this folder later
    # without compiling anything of the CLI again.
    configure+=(-DDELTACAST_BUILD_TESTS=OFF -DDELTACAST_BUILD_BENCH=OFF -DDELTACAST_WITH_CUDA=OFF)
  fi
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  # Release, a unity build of the libraries and the CLI (up to 32 .cpp per compiler run, so the
  # heavy headers, CLI11 4 s, nlohmann/json 3.4 s, spdlog 2 s per file here, are parsed once per
  # batch), with Ninja (a library's files compile while the libraries it links still build). The
  # CLI alone, cold, on this 2-core machine: 137 s instead of ~390 s file by file with make
  # (docs/performance.md, "Build and CI"). Tests are compiled file by file (tests/CMakeLists.txt).
  configure+=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=32)
fi
cmake -S "$root" -B "$build" "${configure[@]}" "$@" >/dev/null
targets=()
if [ -n "${DELTACAST_BUILD_TARGETS:-}" ]; then
  read -r -a names <<< "$DELTACAST_BUILD_TARGETS"
  for t in "${names[@]}"; do targets+=(--target "$t"); done
fi
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
