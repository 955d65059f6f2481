#!/usr/bin/env bash
# The Python embedding demo on 127.0.0.1: one trainer (trainer.py, a deltacast.Producer over its
# torch model) and two servers (server.py, each a deltacast.Receiver writing refits into its own
# model's parameters). By default the servers are gated: they apply committed versions at safe
# points between generation steps and the trainer never waits for them; --pause runs them ungated
# with the trainer's pause handshake instead. Exit status 0 only when every server verified what it
# applied (ungated: every committed version), and the dry run's rollback, bit-exactly (SHA-256 of
# the raw bits against the trainer's).
#
#   examples/embed/run_demo.sh [--servers N] [--steps K] [--pause]
#
# Overridable: PYTHON (default /usr/bin/python3: Debian's, with torch), DELTACAST_LIB (default
# <repo>/build/capi/libdeltacast.so), DELTACAST_PYTHON_DIR (where the deltacast package is;
# default <repo>/python), DEMO_TIMEOUT (seconds for the whole demo, default 90), KEEP=1 (keep the
# work directory with the logs, url, hashes.json and acks).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
servers=2
steps=4
mode=gated
while [ $# -gt 0 ]; do
  case "$1" in
    --servers) servers="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --pause) mode=pause; shift ;;
    *) echo "usage: $0 [--servers N] [--steps K] [--pause]" >&2; exit 2 ;;
  esac
done

PYTHON="${PYTHON:-/usr/bin/python3}"
export DELTACAST_LIB="${DELTACAST_LIB:-$repo/build/capi/libdeltacast.so}"
export PYTHONPATH="${DELTACAST_PYTHON_DIR:-$repo/python}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
limit="${DEMO_TIMEOUT:-90}"

[ -e "$DELTACAST_LIB" ] || { echo "run_demo: no $DELTACAST_LIB (cmake --build build --target deltacast_shared, or set DELTACAST_LIB)" >&2; exit 2; }
"$PYTHON" -c 'import torch' 2> /dev/null || { echo "run_demo: $PYTHON has no torch (apt-get install python3-torch, or set PYTHON)" >&2; exit 2; }

work="$(mktemp -d /tmp/deltacast-embed-demo.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null || true; done
  if [ "${KEEP:-0}" = 1 ]; then echo "run_demo: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

started=$SECONDS
trainer_flags=() server_flags=(--gated)
[ "$mode" = pause ] && trainer_flags=(--pause) server_flags=()
timeout "$limit" "$PYTHON" "$here/trainer.py" --workdir "$work" --servers "$servers" --steps "$steps" \
  "${trainer_flags[@]}" > "$work/trainer.log" 2>&1 &
pids+=($!)
for rank in $(seq 1 "$servers"); do
  timeout "$limit" "$PYTHON" "$here/server.py" --workdir "$work" --rank "$rank" "${server_flags[@]}" \
    > "$work/server$rank.log" 2>&1 &
  pids+=($!)
done

failed=0
names=(trainer $(for rank in $(seq 1 "$servers"); do echo "server$rank"; done))
for i in "${!pids[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  [ "$rc" -eq 0 ] || { echo "run_demo: ${names[$i]} exited with status $rc$([ "$rc" -eq 124 ] && echo " (timed out after $limit s)")" >&2; failed=1; }
done
pids=()

for name in "${names[@]}"; do sed "s/^/[$name] /" "$work/$name.log"; done
if [ "$failed" -ne 0 ]; then
  echo "run_demo: FAILED after $((SECONDS - started)) s"
  exit 1
fi
versions="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["final"])' "$work/hashes.json")"
echo "run_demo: OK in $((SECONDS - started)) s ($mode): $servers servers verified versions 1..$versions and the dry run's rollback bit-exactly"
