#!/usr/bin/env bash
# Configures and builds deltacast into ./build (Release with debug info). Installs missing Debian
# packages first. Extra arguments go to cmake's configure step. $DELTACAST_BUILD_DIR: another build
# directory; $DELTACAST_BUILD_TARGETS (space-separated): build only these targets.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
build="${DELTACAST_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
targets=()
if [ -n "${DELTACAST_BUILD_TARGETS:-}" ]; then
  read -r -a names <<< "$DELTACAST_BUILD_TARGETS"
  for t in "${names[@]}"; do targets+=(--target "$t"); done
fi
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
