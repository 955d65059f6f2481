#!/usr/bin/env bash
# Runs every test: installs what is missing, builds, then ctest. Tests that need Open MPI, Slurm,
# libfabric, UCX or network namespaces start those themselves (pinned to loopback).
# Extra arguments go to ctest (e.g. -L codec, -R Golden).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh" --test
bash "$root/scripts/build.sh"
build="${DELTACAST_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
