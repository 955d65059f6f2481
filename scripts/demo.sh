#!/usr/bin/env bash
# The main job: builds the deltacast CLI (installing what is missing; nothing else is compiled) and
# runs the local refit demo on its embedded default (a producer and 8 receivers on loopback TCP,
# 5 simulated RL steps, the producer's uplink capped at 100 Mbit/s).
# Extra arguments go to `deltacast demo` (e.g. --params 100M --steps 3, or --offline).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DELTACAST_BUILD_TARGETS=deltacast bash "$root/scripts/build.sh" >&2
exec "${DELTACAST_BUILD_DIR:-$root/build}/tools/deltacast" demo "$@"
