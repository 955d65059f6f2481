#!/usr/bin/env bash
# A restarted producer continues the version chain (`deltacast run --resume`; docs/protocol.md,
# "Producer loss"), with real processes on 127.0.0.1: 1 producer + 3 receivers, 5M parameters,
# 6 steps.
#   1. The producer freezes itself (--fault stop@4:1) right after sending the first chunk of
#      version 4 (step 3), once "step 2:" (version 3) was printed, i.e. with version 3 committed
#      and its state file written. The test SIGKILLs it: the receivers roll back what they had of
#      version 4, keep version 3 and retry the producer's address (timeouts.producer_loss).
#   2. `deltacast run --resume --rank 0` on the same address: it must say it resumed at version 3
#      (step 2) with all 3 receivers holding it, run steps 3..6 only, exit 0, and every receiver's
#      SHA-256 must equal the producer's report.
#   3. --resume fails with a clear error, before listening, for a state file whose digest is wrong,
#      a corrupt or missing one, one written under another config, one that ended (BYE) before its
#      last step, and on a receiver.
#   4. --resume of the finished run (its state says BYE went out: "ended") says so and exits 0 at
#      once, its report naming the same version and SHA-256, instead of waiting timeouts.join for
#      receivers that left (chaos seed 31 trial 212).
#   5. A producer killed after deciding the last version, before its COMMIT and BYE
#      (--fault kill@7:commit): the receivers wait; the resumed producer commits version 7 with
#      them, says BYE, and every receiver ends bit-exact.
# The freeze makes the moment of the kill exact: a kill from outside at "step 2:" could land after
# version 4 committed (resuming there) or after the run ended.
set -euo pipefail
# shellcheck source=processes.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/processes.sh"
DC=${1:?usage: producer_restart.sh PATH/TO/deltacast}
WORK=$(mktemp -d /tmp/dc-producer-restart.XXXXXX)
PIDS=()
trap cleanup EXIT
cd "$WORK"

fail() {
  echo "FAIL: $*" >&2
  tail_logs producer-1.out producer-1.log producer-2.out producer-2.log rank-*.log
  exit 1
}

# A run of 4 free loopback ports: the producer's address must stay the same across its restart.
BASE=$(free_ports 4)
write_secret secret
cat >cluster.yaml <<YAML
producer: tcp://127.0.0.1:$BASE
transport: tcp
topology: binary
chunk_bytes: 1MiB
retain_versions: 4
members: {count: 3, host: 127.0.0.1, base_port: $((BASE + 1)), cluster: local}
timeouts: {connect: 5s, heartbeat: 500ms, peer: 10s, refit: 60s, join: 60s, producer_loss: 60s}
secret_file: $WORK/secret
trainer: {kind: synth, params: 5M, steps: 6, lr: 1e-5, seed: 7}
output: {dir: $WORK/out, log_file: ""}
log_level: info
YAML
STATE=$WORK/out/producer-state.json

# --- 1. the first producer, frozen at version 4 and killed -------------------------------------
declare -A RECEIVER
for r in 1 2 3; do
  "$DC" run --config cluster.yaml --rank "$r" --size 4 --summary "rank-$r.json" >"rank-$r.out" 2>"rank-$r.log" &
  RECEIVER[$r]=$!
  PIDS+=("$!")
done
"$DC" run --config cluster.yaml --rank 0 --size 4 --report report-1.json --fault stop@4:1 \
  >producer-1.out 2>producer-1.log &
P1=$!
PIDS+=("$P1")
wait_for 40 grep -q "^step 2:" producer-1.out || fail "the first producer did not print 'step 2:'"
wait_for 20 stopped "$P1" || fail "the first producer did not freeze itself at version 4"
grep -q "fault stop@4:1: stopping" producer-1.out || fail "the first producer's fault did not say so"
kill -KILL "$P1"
wait "$P1" 2>/dev/null || true
echo "ok: the producer was killed during version 4 (step 3) (at ${SECONDS} s)"

python3 - "$STATE" <<'PY' || fail "the state file after version 3 is not as expected"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["version"] == 3 and s["trainer_step"] == 2, s
assert s["topology"] == "binary" and s["params"] == 5000000 and s["seed"] == 7, s
assert len(s["digest"]) == 16 and s["attempt"] >= 3, s
assert [h["version"] for h in s["history"]] == [1, 2, 3], s["history"]
assert s["history"][-1]["digest"] == s["digest"], s
PY
ls "$WORK/out" | grep -q tmp && fail "a temporary state file was left behind"
cp "$STATE" state-v3.json

# The receivers are still there, waiting for a producer.
for r in 1 2 3; do kill -0 "${RECEIVER[$r]}" 2>/dev/null || fail "rank $r exited after the producer's loss"; done

# --- 2. the resumed producer ---------------------------------------------------------------------
# job_ends PID WHAT: the (resumed) producer PID exits 0 within 45 s, then every receiver within 15 s.
job_ends() {
  local pid=$1 what=$2 status=0 r
  wait_exit "$pid" 45 || status=$?
  [ "$status" = 0 ] || fail "$what exited with $status"
  for r in 1 2 3; do
    status=0
    wait_exit "${RECEIVER[$r]}" 15 || status=$?
    [ "$status" = 0 ] || fail "rank $r exited with $status after $what"
  done
}
"$DC" run --resume --config cluster.yaml --rank 0 --size 4 --report report.json >producer-2.out 2>producer-2.log &
P2=$!
PIDS+=("$P2")
job_ends "$P2" "the resumed producer"
want="producer: resumed at version 3 (step 2) from $STATE; 3 receivers hold it"
grep -qF "$want" producer-2.out || fail "the resumed producer did not say: $want"
grep -q "^full checkpoint" producer-2.out && fail "the resumed producer sent a full checkpoint"
grep -q "^step [12]:" producer-2.out && fail "the resumed producer ran steps before step 3"
for s in 3 4 5 6; do
  grep -q "^step $s: version $((s + 1)) .* verified 3/3" producer-2.out || fail "no committed 'step $s:' line"
done
grep -q "lost the producer" rank-1.log || fail "rank 1 does not say it lost the producer"

python3 - report.json "$STATE" rank-1.json rank-2.json rank-3.json <<'PY' || fail "the results are not as expected"
import json, sys
report = json.load(open(sys.argv[1]))
state = json.load(open(sys.argv[2]))
assert report["ok"] is True, report
assert [s["step"] for s in report["steps"]] == [3, 4, 5, 6], [s["step"] for s in report["steps"]]
assert all(s["committed"] and s["verified_receivers"] == 3 for s in report["steps"]), report["steps"]
assert report["version"] == 7, report["version"]
assert report["resumed"]["version"] == 3 and report["resumed"]["live"] == 3, report["resumed"]
assert state["version"] == 7 and state["trainer_step"] == 6 and state["ended"] is True, state
for path in sys.argv[3:]:
    summary = json.load(open(path))
    assert summary["version"] == 7, (path, summary)
    assert summary["sha256"] == report["sha256"], (path, summary["sha256"], report["sha256"])
    assert summary["versions_aborted"] == 0, (path, summary)
PY
echo "ok: resumed at version 3, steps 3..6 committed, every receiver bit-exact (at ${SECONDS} s)"

# --- 3. --resume refuses what it cannot continue -------------------------------------------------
# expect_failure NAME TEXT [--set key=value ...]: `run --resume` on rank 0 (state in bad/) exits
# non-zero within seconds, before listening, naming TEXT.
expect_failure() {
  local name=$1 text=$2; shift 2
  local status=0
  timeout 60 "$DC" run --resume --config cluster.yaml --rank 0 --size 4 --set "output.dir=$WORK/bad" "$@" \
    >bad.out 2>bad.err || status=$?
  [ "$status" != 0 ] || fail "$name: --resume succeeded"
  [ "$status" != 124 ] || fail "$name: --resume hung"
  grep -qF "$text" bad.err || fail "$name: expected '$text' in: $(cat bad.err)"
  echo "ok: --resume with $name fails: $(tail -n 1 bad.err)"
}
mkdir -p bad
expect_failure "no state file" "no producer state at $WORK/bad/producer-state.json"
# A wrong digest (consistent within the file): the trainer's bits do not match it.
python3 - state-v3.json bad/producer-state.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
wrong = "%016x" % (int(s["digest"], 16) ^ 0x5a5a)
s["digest"] = wrong
s["history"][-1]["digest"] = wrong
json.dump(s, open(sys.argv[2], "w"))
PY
expect_failure "a wrong digest" "the trainer did not re-simulate to the same bits"
python3 - state-v3.json bad/producer-state.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["digest"] = "not-a-digest"
json.dump(s, open(sys.argv[2], "w"))
PY
expect_failure "a corrupt digest" "is corrupt: digest 'not-a-digest' is not 16 hex digits"
head -c 100 state-v3.json >bad/producer-state.json
expect_failure "a truncated file" "is corrupt"
cp state-v3.json bad/producer-state.json
expect_failure "another seed" "was written by a run with another config (trainer.seed 7 there, 8 here)" \
  --set trainer.seed=8
python3 - state-v3.json bad/producer-state.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["ended"] = True
json.dump(s, open(sys.argv[2], "w"))
PY
expect_failure "a run that ended at step 2 of 6" \
  "ended at version 3 (trainer step 2 of 6): BYE went out and the receivers left; nothing can continue it"
status=0
timeout 20 "$DC" run --resume --config cluster.yaml --rank 2 --size 4 >bad.out 2>bad.err || status=$?
[ "$status" != 0 ] && [ "$status" != 124 ] || fail "--resume on a receiver did not fail (status $status)"
grep -qF -- "--resume applies to a producer (rank 0" bad.err || fail "--resume on a receiver: $(cat bad.err)"
echo "ok: --resume on a receiver fails: $(tail -n 1 bad.err) (at ${SECONDS} s)"

# --- 4. --resume of the finished run -------------------------------------------------------------
cp "$STATE" state-ended.json
start=$SECONDS
status=0
timeout 30 "$DC" run --resume --config cluster.yaml --rank 0 --size 4 --report report-again.json \
  >again.out 2>again.err || status=$?
[ "$status" = 0 ] || fail "--resume of the finished run exited with $status: $(tail -n 3 again.err)"
[ $((SECONDS - start)) -lt 20 ] || fail "--resume of the finished run took $((SECONDS - start)) s (it waited)"
want="producer: the run in $STATE had ended at version 7 (step 6): BYE went out and the receivers left"
grep -qF "$want" again.out || fail "--resume of the finished run did not say: $want"
cmp -s state-ended.json "$STATE" || fail "--resume of the finished run changed the state file"
python3 - report-again.json report.json <<'PY' || fail "the finished run's resumed report is not as expected"
import json, sys
again, first = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert again["ok"] is True and again["steps"] == [], again
assert again["version"] == 7 and again["resumed"]["ended"] is True, again
assert again["sha256"] == first["sha256"] and again["digest"] == first["digest"], (again, first)
PY
echo "ok: --resume of the finished run exits 0 in $((SECONDS - start)) s saying it ended (at ${SECONDS} s)"

# --- 5. killed after deciding the last version, before BYE ---------------------------------------
for r in 1 2 3; do
  "$DC" run --config cluster.yaml --rank "$r" --size 4 --set "output.dir=$WORK/out5" --summary "rank5-$r.json" \
    >"rank5-$r.out" 2>"rank5-$r.log" &
  RECEIVER[$r]=$!
  PIDS+=("$!")
done
"$DC" run --config cluster.yaml --rank 0 --size 4 --set "output.dir=$WORK/out5" --fault kill@7:commit \
  >producer-5.out 2>producer-5.log &
P5=$!
PIDS+=("$P5")
status=0
wait_exit "$P5" 60 || status=$?
[ "$status" = 137 ] || fail "the producer with --fault kill@7:commit exited with $status (not killed)"
python3 - "$WORK/out5/producer-state.json" <<'PY' || fail "the state after deciding version 7 is not as expected"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["version"] == 7 and s["trainer_step"] == 6 and s["ended"] is False, s
PY
for r in 1 2 3; do kill -0 "${RECEIVER[$r]}" 2>/dev/null || fail "rank $r exited before BYE"; done
"$DC" run --resume --config cluster.yaml --rank 0 --size 4 --set "output.dir=$WORK/out5" --report report-5.json \
  >producer-5b.out 2>producer-5b.log &
P5=$!
PIDS+=("$P5")
job_ends "$P5" "the producer resumed after deciding the last version"
python3 - report-5.json "$WORK/out5/producer-state.json" rank5-1.json rank5-2.json rank5-3.json <<'PY' \
  || fail "the last version's resume: the results are not as expected"
import json, sys
report, state = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert report["ok"] is True and report["version"] == 7 and report["steps"] == [], report
assert state["version"] == 7 and state["ended"] is True, state
for path in sys.argv[3:]:
    summary = json.load(open(path))
    assert summary["version"] == 7 and summary["sha256"] == report["sha256"], (path, summary)
PY
echo "ok: killed after deciding version 7 (the last), resumed: committed with every receiver, BYE, bit-exact (at ${SECONDS} s)"
PASSED=1
echo "ok: producer restart (at ${SECONDS} s)"
