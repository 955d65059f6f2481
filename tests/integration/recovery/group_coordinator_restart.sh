#!/usr/bin/env bash
# A producer group's coordinator (rank 0) killed mid-version and resumed (`deltacast run --resume`
# on rank 0 and on the part rank; docs/producer-group.md, "Failure"), with real processes on
# 127.0.0.1: 2 producer ranks + 3 receivers, 5M parameters, 5 steps.
#   1. Rank 0 kills itself (--fault kill@4:1) at its first data message of version 4 (step 3):
#      nothing of version 4 was decided. Rank 1 loses its coordinator and exits non-zero saying
#      so; every receiver says it keeps version 3 and waits for a producer
#      (timeouts.producer_loss).
#   2. `deltacast run --resume` on rank 0 and rank 1: each resumes at version 3 from its own state
#      file, the receivers rejoin holding version 3 (no snapshot, nothing resent), steps 3..5
#      commit, and every receiver ends at version 6 with the coordinator's SHA-256.
set -euo pipefail
# shellcheck source=processes.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/processes.sh"
DC=${1:?usage: group_coordinator_restart.sh PATH/TO/deltacast}
WORK=$(mktemp -d /tmp/dc-group-coordinator.XXXXXX)
PIDS=()
trap cleanup EXIT
cd "$WORK"

fail() {
  echo "FAIL: $*" >&2
  tail_logs p0.out p0.log p1.out p1.log p0b.out p0b.log p1b.out p1b.log rank-*.log
  exit 1
}

# 5 free loopback ports: the producer ranks' (BASE, BASE+1) and the receivers'.
BASE=$(free_ports 5)
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >secret
chmod 600 secret
cat >cluster.yaml <<YAML
producer: tcp://127.0.0.1:$BASE
producers: 2
transport: tcp
topology: binary
chunk_bytes: 256KiB
members: {count: 3, host: 127.0.0.1, base_port: $((BASE + 2)), cluster: local}
timeouts: {connect: 5s, heartbeat: 500ms, peer: 5s, refit: 60s, join: 60s, producer_loss: 60s}
secret_file: $WORK/secret
trainer: {kind: synth, params: 5M, steps: 5, lr: 1e-5, seed: 7}
output: {dir: $WORK/out, log_file: ""}
log_level: info
YAML

for j in 2 3 4; do
  r=$((j - 1))
  "$DC" run --config cluster.yaml --rank "$j" --size 5 --summary "rank-$r.json" >"rank-$r.out" 2>"rank-$r.log" &
  PIDS+=("$!")
done
"$DC" run --config cluster.yaml --rank 1 --size 5 >p1.out 2>p1.log &
P1=$!
PIDS+=("$P1")
"$DC" run --config cluster.yaml --rank 0 --size 5 --fault kill@4:1 --report report.json >p0.out 2>p0.log &
P0=$!
PIDS+=("$P0")

# --- 1. the coordinator dies in version 4; its part rank stops, the receivers keep version 3 -------
status=0
wait_exit "$P0" 60 || status=$?
[ "$status" = 137 ] || fail "rank 0 did not kill itself (exit $status)"
grep -q "fault kill@4:1: killing" p0.out || fail "rank 0's fault did not say so"
status=0
wait_exit "$P1" 60 || status=$?
[ "$status" != 0 ] && [ "$status" != 124 ] || fail "rank 1 did not stop after losing its coordinator (exit $status)"
grep -q "lost the coordinator" p1.log || fail "rank 1 did not say it lost the coordinator"
python3 - out/producer-state.json out/producer-state-rank1.json <<'PY' || fail "the ranks' states are not at version 3"
import json, sys
for path in sys.argv[1:]:
    s = json.load(open(path))
    assert s["version"] == 3 and s["trainer_step"] == 2, (path, s)
PY
for r in 1 2 3; do
  wait_for 30 grep -q "lost the producer; keeping version 3" "rank-$r.log" ||
    fail "receiver $r did not say it keeps version 3"
done
echo "ok: rank 0 died in version 4, rank 1 stopped, the receivers keep version 3 (at ${SECONDS} s)"

# --- 2. both ranks resumed --------------------------------------------------------------------------
"$DC" run --resume --config cluster.yaml --rank 1 --size 5 >p1b.out 2>p1b.log &
P1B=$!
PIDS+=("$P1B")
"$DC" run --resume --config cluster.yaml --rank 0 --size 5 --report report.json >p0b.out 2>p0b.log &
P0B=$!
PIDS+=("$P0B")
for pid in "$P0B" "$P1B"; do
  status=0
  wait_exit "$pid" 120 || status=$?
  [ "$status" = 0 ] || fail "producer rank (pid $pid) exited with $status"
done
grep -q "resumed at version 3 (step 2)" p0b.out || fail "rank 0 did not say it resumed at version 3"
grep -q "resumed at version 3 (step 2)" p1b.out || fail "rank 1 did not say it resumed at version 3"
for s in 3 4 5; do
  grep -q "^step $s: version $((s + 1)) .* verified 3/3" p0b.out || fail "no committed 'step $s:' line"
done
! grep -q "served a snapshot" p0b.out p0b.log p1b.out p1b.log || fail "a receiver needed a snapshot: it held version 3"
for j in 2 3 4; do wait_exit "${PIDS[$((j - 2))]}" 30 || fail "receiver $((j - 1)) did not exit 0"; done
python3 - report.json rank-1.json rank-2.json rank-3.json <<'PY' || fail "the results are not as expected"
import json, sys
report = json.load(open(sys.argv[1]))
assert report["ok"] is True, report
assert report["version"] == 6, report["version"]
for path in sys.argv[2:]:
    summary = json.load(open(path))
    assert summary["version"] == 6, (path, summary)
    assert summary["sha256"] == report["sha256"], (path, summary["sha256"], report["sha256"])
PY
PASSED=1
echo "ok: both ranks resumed at version 3, steps 3..5 committed, every receiver bit-exact (at ${SECONDS} s)"
