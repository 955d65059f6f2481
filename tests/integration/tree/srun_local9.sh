#!/usr/bin/env bash
# Launcher test: `srun -n 9 deltacast run --config examples/local-9.yaml` under a real single-node
# Slurm (scripts/slurm-local.sh). Starts Slurm if it is not running and stops it again only if
# this script started it. Usage: srun_local9.sh REPO_ROOT DELTACAST_BINARY
set -euo pipefail
repo=$1
binary=$2
slurm=$repo/scripts/slurm-local.sh
started=0
if ! "$slurm" status >/dev/null 2>&1; then
  "$slurm" start >/dev/null
  started=1
fi
cleanup() { if [ "$started" = 1 ]; then "$slurm" stop >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
eval "$("$slurm" env)"
# A bound well inside ctest's TIMEOUT, so a job that never gets its CPUs says why.
rc=0
timeout 240 srun -n 9 --kill-on-bad-exit=1 "$binary" run --config "$repo/examples/local-9.yaml" || rc=$?
if [ "$rc" != 0 ]; then
  echo "FAIL: srun exited $rc"
  "$slurm" diagnose
  exit 1
fi
