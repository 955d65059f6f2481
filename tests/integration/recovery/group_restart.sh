#!/usr/bin/env bash
# A producer group's rank killed mid-version and resumed (`deltacast run --resume`;
# docs/producer-group.md, "Failure"), with real processes on 127.0.0.1: 2 producer ranks + 3
# receivers, 5M parameters, 5 steps. group_restart.sh part|coordinator|decided PATH/TO/deltacast
#   part:        1. Rank 1 kills itself (--fault kill@4:1) at its first data message of version 4
#                   (step 3). The coordinator aborts version 4 on every member (each rolls back to
#                   version 3), says so naming rank 1, and waits for it (timeouts.producer_loss).
#                2. `run --resume --rank 1`: it resumes at version 3 from its own state file
#                   (producer-state-rank1.json) and the coordinator sends version 4 again.
#   coordinator: 1. Rank 0 kills itself (--fault kill@4:1) at its first data message of version 4:
#                   nothing of version 4 was decided. Rank 1 says it lost the coordinator and
#                   exits non-zero; every receiver says it keeps version 3 and waits for a
#                   producer (timeouts.producer_loss).
#                2. `run --resume` on both ranks: each resumes at version 3 from its own state
#                   file; the receivers rejoin holding version 3 (no snapshot).
#   decided:     1. Rank 0 kills itself (--fault kill@4:commit) right after deciding version 4 and
#                   writing its state (version 4, knowing version 3), before any COMMIT or
#                   GROUP_DECIDED went out. Rank 1 (its state: version 3) says it lost the
#                   coordinator; every receiver rolls version 4 back and keeps version 3.
#                2. `run --resume` on both ranks: the coordinator finds every rank and every
#                   receiver at version 3, steps back to it (re-simulating step 2) and sends
#                   version 4 again.
#   All: steps 3..5 commit, both ranks exit 0, and every receiver ends at version 6 with the
#   coordinator's SHA-256, having aborted at most version 4's first attempt (coordinator: none,
#   and every receiver exits 0).
set -euo pipefail
# shellcheck source=processes.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/processes.sh"
USAGE="usage: group_restart.sh part|coordinator|decided PATH/TO/deltacast"
CASE=${1:?$USAGE}
DC=${2:?$USAGE}
FAULT=kill@4:1
case "$CASE" in
  part) VICTIM=1 ;;
  coordinator) VICTIM=0 ;;
  decided) VICTIM=0 FAULT=kill@4:commit ;;
  *) echo "$USAGE" >&2; exit 2 ;;
esac
WORK=$(mktemp -d "/tmp/dc-group-$CASE.XXXXXX")
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
write_secret secret
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

fault() { [ "$1" = "$VICTIM" ] && echo "--fault $FAULT" || true; }
for j in 2 3 4; do
  r=$((j - 1))
  "$DC" run --config cluster.yaml --rank "$j" --size 5 --summary "rank-$r.json" >"rank-$r.out" 2>"rank-$r.log" &
  PIDS+=("$!")
done
# shellcheck disable=SC2046  # fault prints two words or nothing
"$DC" run --config cluster.yaml --rank 1 --size 5 $(fault 1) >p1.out 2>p1.log &
P1=$!
PIDS+=("$P1")
# shellcheck disable=SC2046
"$DC" run --config cluster.yaml --rank 0 --size 5 $(fault 0) --report report.json >p0.out 2>p0.log &
P0=$!
PIDS+=("$P0")

# --- 1. the victim dies in version 4 ---------------------------------------------------------------
victim_pid=$P1
[ "$VICTIM" = 0 ] && victim_pid=$P0
status=0
wait_exit "$victim_pid" 60 || status=$?
[ "$status" = 137 ] || fail "rank $VICTIM did not kill itself (exit $status)"
grep -q "fault $FAULT: killing" "p$VICTIM.out" || fail "rank $VICTIM's fault did not say so"
if [ "$CASE" = part ]; then
  wait_for 30 grep -q "version 4 aborted on every member: producer rank 1" p0.out ||
    fail "the coordinator did not abort version 4 naming rank 1"
  states=(out/producer-state-rank1.json)
else
  status=0
  wait_exit "$P1" 60 || status=$?
  [ "$status" != 0 ] && [ "$status" != 124 ] || fail "rank 1 did not stop after losing its coordinator (exit $status)"
  grep -q "lost the coordinator" p1.log || fail "rank 1 did not say it lost the coordinator"
  for r in 1 2 3; do
    wait_for 30 grep -q "lost the producer; keeping version 3" "rank-$r.log" ||
      fail "receiver $r did not say it keeps version 3"
  done
  states=(out/producer-state.json out/producer-state-rank1.json)
fi
python3 - "$CASE" "${states[@]}" <<'PY' || fail "a state file is not where it should be"
import json, sys
case, paths = sys.argv[1], sys.argv[2:]
for path in paths:
    s = json.load(open(path))
    if case == "decided" and path.endswith("producer-state.json"):
        # The coordinator decided version 4 (step 3) and knows the version before it.
        assert s["version"] == 4 and s["trainer_step"] == 3, (path, s)
        assert s["previous"]["version"] == 3 and s["previous"]["trainer_step"] == 2, (path, s)
    else:
        assert s["version"] == 3 and s["trainer_step"] == 2, (path, s)
PY
echo "ok: rank $VICTIM died in version 4 (at ${SECONDS} s)"

# --- 2. resumed ----------------------------------------------------------------------------------
"$DC" run --resume --config cluster.yaml --rank 1 --size 5 >p1b.out 2>p1b.log &
PRODUCERS=("$!")
PIDS+=("$!")
coordinator_out=p0.out
if [ "$VICTIM" = 0 ]; then
  "$DC" run --resume --config cluster.yaml --rank 0 --size 5 --report report.json >p0b.out 2>p0b.log &
  PRODUCERS+=("$!")
  PIDS+=("$!")
  coordinator_out=p0b.out
  grep_resumed=(p0b.out p1b.out)
else
  PRODUCERS+=("$P0")
  grep_resumed=(p1b.out)
fi
for pid in "${PRODUCERS[@]}"; do
  status=0
  wait_exit "$pid" 120 || status=$?
  [ "$status" = 0 ] || fail "producer rank (pid $pid) exited with $status"
done
for f in "${grep_resumed[@]}"; do
  grep -q "resumed at version 3 (step 2)" "$f" || fail "$f: no 'resumed at version 3'"
done
if [ "$CASE" = decided ]; then
  grep -q "stepped back from version 4 to version 3 (step 2)" p0b.out || fail "the coordinator did not step back"
fi
for s in 3 4 5; do
  grep -q "^step $s: version $((s + 1)) .* verified 3/3" "$coordinator_out" || fail "no committed 'step $s:' line"
done
! grep -q "served a snapshot" p0.out p0.log p1b.out p1b.log p0b.out p0b.log 2>/dev/null ||
  fail "a receiver needed a snapshot: it held version 3"
# A receiver whose run saw a version abort exits non-zero saying so (part: version 4's first
# attempt); the summaries below check what each holds.
for j in 2 3 4; do
  wait_exit "${PIDS[$((j - 2))]}" 30 || [ "$CASE" != coordinator ] || fail "receiver $((j - 1)) did not exit 0"
done
python3 - report.json rank-1.json rank-2.json rank-3.json <<'PY' || fail "the results are not as expected"
import json, sys
report = json.load(open(sys.argv[1]))
assert report["ok"] is True, report
assert report["version"] == 6, report["version"]
assert report["producer_rank"] == 0, report
# The group's ranks each hold their part only: every receiver's digest (taken again from its bits)
# is the sum of the ranks' part digests, and every receiver holds the same bits.
assert "sha256" not in report, "a group rank reported the SHA-256 of a model it should not hold whole"
shas = set()
for path in sys.argv[2:]:
    summary = json.load(open(path))
    assert summary["version"] == 6, (path, summary)
    assert summary["digest"] == report["digest"], (path, summary["digest"], report["digest"])
    shas.add(summary["sha256"])
    # At most version 4's first attempt was aborted (ABORT) and rolled back; nothing else.
    assert summary["versions_aborted"] <= 1, (path, summary)
assert len(shas) == 1, shas
PY
PASSED=1
echo "ok: resumed, steps 3..5 committed, every receiver bit-exact (at ${SECONDS} s)"
