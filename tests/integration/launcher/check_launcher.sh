#!/usr/bin/env bash
# check_launcher.sh slurm|mpi PRINT_LAUNCH_ENV REPO_ROOT
# Launches 9 copies of print_launch_env through real srun (single-node Slurm from
# scripts/slurm-local.sh) or mpirun (scripts/mpirun-local.sh) and checks that launch_env parsing
# yields ranks 0..8 exactly once, all with size 9, the right launcher, and one producer.
# Exits 77 (ctest SKIP) when the launcher is not installed or we are not root (Slurm's daemons).
set -euo pipefail
mode=$1 prog=$2 root=$3
n=9
out=$(mktemp)
trap 'rm -f "$out"' EXIT

case "$mode" in
  slurm)
    command -v srun >/dev/null && command -v slurmctld >/dev/null || { echo "no Slurm installed"; exit 77; }
    [ "$(id -u)" -eq 0 ] || { echo "single-node Slurm needs root"; exit 77; }
    started=0
    "$root/scripts/slurm-local.sh" status >/dev/null 2>&1 || { "$root/scripts/slurm-local.sh" start >/dev/null; started=1; }
    eval "$("$root/scripts/slurm-local.sh" env)"
    rc=0
    timeout 60 srun -n $n "$prog" >"$out" || rc=$?
    [ "$rc" -eq 0 ] || { echo "FAIL: srun failed ($rc)"; cat "$out"; "$root/scripts/slurm-local.sh" diagnose; }
    [ "$started" -eq 1 ] && "$root/scripts/slurm-local.sh" stop
    [ "$rc" -eq 0 ] || exit 1
    want=slurm ;;
  mpi)
    command -v mpirun >/dev/null || { echo "no mpirun installed"; exit 77; }
    timeout 60 "$root/scripts/mpirun-local.sh" -np $n "$prog" >"$out"
    want=mpi ;;
  *) echo "usage: $0 slurm|mpi PROG ROOT" >&2; exit 2 ;;
esac

cat "$out"
fail() { echo "FAIL: $*"; exit 1; }
[ "$(wc -l <"$out")" -eq $n ] || fail "expected $n lines"
[ "$(grep -c "^launcher=$want rank=[0-9]* size=$n " "$out")" -eq $n ] || fail "every line must say launcher=$want size=$n"
ranks=$(sed -E 's/.* rank=([0-9]+) .*/\1/' "$out" | sort -n | tr '\n' ' ')
[ "$ranks" = "$(seq 0 $((n - 1)) | tr '\n' ' ')" ] || fail "ranks are '$ranks', want 0..$((n - 1)) once each"
[ "$(grep -c 'role=producer member=-1$' "$out")" -eq 1 ] || fail "exactly one producer (rank 0)"
grep -q '^launcher=[a-z]* rank=0 .*role=producer' "$out" || fail "rank 0 must be the producer"
echo "OK: $n distinct ranks via $mode"
