#!/usr/bin/env bash
# Runs every test: installs what is missing, builds, then ctest. Tests that need Open MPI, Slurm,
# libfabric, UCX or network namespaces start those themselves (pinned to loopback).
#   scripts/test.sh [--cmake OPTION]... [CTEST ARGUMENTS]
# --cmake OPTION (repeatable) goes to cmake's configure step, e.g. --cmake -DDELTACAST_WERROR=ON;
# so does each word of $DELTACAST_CMAKE_ARGS. Everything else goes to ctest (e.g. -L codec, -R Golden).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmake_args=()
if [ -n "${DELTACAST_CMAKE_ARGS:-}" ]; then
  read -r -a cmake_args <<< "$DELTACAST_CMAKE_ARGS"
fi
while [ $# -gt 0 ] && [ "$1" = --cmake ]; do
  [ $# -ge 2 ] || { echo "test.sh: --cmake needs an option (e.g. --cmake -DDELTACAST_WERROR=ON)" >&2; exit 2; }
  cmake_args+=("$2")
  shift 2
done
bash "$root/scripts/install-deps.sh" --test
bash "$root/scripts/build.sh" "${cmake_args[@]}"
build="${DELTACAST_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
