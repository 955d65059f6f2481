#!/usr/bin/env bash
# The tensor-parallel engine demo on 127.0.0.1: a trainer (trainer.py, a deltacast.Producer over
# the full checkpoint) and T workers (worker.py, each a gated deltacast.Receiver writing refits
# into only its own vLLM-style shard). Exit status 0 when every worker held every version bit for
# bit (compared with torch against the checkpoint's slices).
#
#   examples/tp_engine/run_demo.sh [--tp T] [--steps K]
#
# Overridable: PYTHON (default /usr/bin/python3: Debian's, with torch), DELTACAST_LIB (default
# <repo>/build/capi/libdeltacast.so), DELTACAST_PYTHON_DIR (default <repo>/python), DEMO_TIMEOUT
# (seconds for the whole demo, default 90).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-/usr/bin/python3}"
export DELTACAST_LIB="${DELTACAST_LIB:-$repo/build/capi/libdeltacast.so}"
export PYTHONPATH="${DELTACAST_PYTHON_DIR:-$repo/python}${PYTHONPATH:+:$PYTHONPATH}"
[ -e "$DELTACAST_LIB" ] || { echo "run_demo: no $DELTACAST_LIB (cmake --build build --target deltacast_shared, or set DELTACAST_LIB)" >&2; exit 2; }
"$PYTHON" -c 'import torch' 2> /dev/null || { echo "run_demo: $PYTHON has no torch (apt-get install python3-torch, or set PYTHON)" >&2; exit 2; }
exec timeout "${DEMO_TIMEOUT:-90}" "$PYTHON" "$here/trainer.py" "$@"
