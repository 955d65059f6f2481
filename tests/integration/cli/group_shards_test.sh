#!/usr/bin/env bash
# group_shards_test.sh DELTACAST: a producer group that sends the trainer's own shard files
# (config `group_parts: shards`, docs/producer-group.md "Parts"), with real processes on 127.0.0.1:
# 2 producer ranks following a checkpoint directory (trainer.kind watch) + 3 receivers.
#   1. `deltacast synth --shards 3` writes 3 checkpoints of a 2M-parameter model; the first is in
#      the directory at start, the next two land (as a trainer writes them: .tmp, then a rename)
#      while the job runs. Rank 0's part is the tensors of shard files 1 and 2, rank 1's of file 3
#      (the coordinator's log names each rank's tensor count, checked against the index; a balance
#      by bytes would split them about in half); steps 1 and 2 commit, and every
#      receiver ends with the coordinator's SHA-256, which is that of the last checkpoint's tensors
#      computed here from its shard files.
#   2. Refused before anything is sent, naming the problem: group_parts: shards with the
#      synthetic trainer (no shard files) and with one unsharded model file; a checkpoint of 1
#      shard file for 2 ranks; group_parts with producers: 1; JSON parts naming a tensor twice.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../recovery/processes.sh
source "$here/../recovery/processes.sh"
DC=${1:?usage: group_shards_test.sh PATH/TO/deltacast}
WORK=$(mktemp -d /tmp/dc-group-shards.XXXXXX)
PIDS=()
trap cleanup EXIT
cd "$WORK"

fail() {
  echo "FAIL: $*" >&2
  tail_logs p0.out p0.log p1.out p1.log rank-*.log
  exit 1
}
drop() {  # drop SRC DST: a checkpoint written as a trainer does (into DST.tmp, then a rename)
  cp -r "$1" "$2.tmp"
  mv "$2.tmp" "$2"
}

"$DC" synth --out made --params 2M --steps 2 --seed 9 --shards 3 >/dev/null
mkdir watch
drop made/step-0000 watch/step-0000

# Ports: the producer ranks' (BASE, BASE+1), the receivers' after them.
BASE=$(free_ports 5)
write_secret secret
write_config() {  # write_config FILE TRAINER_YAML [EXTRA_YAML]
  cat >"$1" <<YAML
producer: tcp://127.0.0.1:$BASE
producers: 2
transport: tcp
chunk_bytes: 256KiB
members: {count: 3, host: 127.0.0.1, base_port: $((BASE + 2)), cluster: local}
timeouts: {connect: 5s, heartbeat: 500ms, peer: 5s, refit: 60s, join: 60s, producer_loss: 30s}
secret_file: $WORK/secret
trainer: $2
output: {dir: $WORK/out, log_file: ""}
log_level: info
${3:-group_parts: shards}
YAML
}
write_config cluster.yaml "{kind: watch, dir: $WORK/watch, steps: 2}"

# --- 1. two ranks, each sending its shard file ----------------------------------------------------
for j in 2 3 4; do
  "$DC" run --config cluster.yaml --rank "$j" --size 5 --summary "rank-$((j - 1)).json" >"rank-$((j - 1)).out" \
    2>"rank-$((j - 1)).log" &
  PIDS+=("$!")
done
"$DC" run --config cluster.yaml --rank 1 --size 5 >p1.out 2>p1.log &
P1=$!
PIDS+=("$P1")
"$DC" run --config cluster.yaml --rank 0 --size 5 --report report.json >p0.out 2>p0.log &
P0=$!
PIDS+=("$P0")
wait_for 60 grep -q "full checkpoint (version 1)" p0.out || fail "version 1 did not commit"
drop made/step-0001 watch/step-0001
wait_for 60 grep -q "^step 1: version 2 .* verified 3/3" p0.out || fail "step 1 did not commit on every receiver"
drop made/step-0002 watch/step-0002
for pid in "$P0" "$P1"; do
  status=0
  wait_exit "$pid" 90 || status=$?
  [ "$status" = 0 ] || fail "producer rank (pid $pid) exited with $status"
done
for pid in "${PIDS[@]:0:3}"; do wait_exit "$pid" 30 || fail "a receiver did not exit 0"; done
grep -q "^step 2: version 3 .* verified 3/3" p0.out || fail "step 2 did not commit on every receiver"
python3 - "$here" made/step-0002 p0.log report.json rank-1.json rank-2.json rank-3.json <<'PY' || fail "the results are not as expected"
import json, re, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from watch_test import tensors_sha256  # noqa: E402
last, log, report = Path(sys.argv[2]), Path(sys.argv[3]).read_text(), json.load(open(sys.argv[4]))
index = json.load(open(last / "model.safetensors.index.json"))["weight_map"]
per_file = {}
for name, file in index.items():
    per_file[file] = per_file.get(file, 0) + 1
files = sorted(per_file)
assert len(files) == 3, files
# 3 files to 2 ranks in consecutive blocks (file i to rank i * 2 / 3): rank 0 the first two, rank
# 1 the last; a balance by bytes would split the tensors about in half.
want = {0: per_file[files[0]] + per_file[files[1]], 1: per_file[files[2]]}
# The coordinator's partition line: "rank 0: N whole tensors, 0 ranges, ...; rank 1: ...".
line = next((l for l in log.splitlines() if "producer group: 2 ranks in" in l), None)
assert line, "no 'producer group: 2 ranks in' line in the coordinator's log"
for rank in (0, 1):
    m = re.search(rf"rank {rank}: (\d+) whole tensors, 0 ranges", line)
    assert m and int(m.group(1)) == want[rank], (rank, want, line)
assert report["ok"] is True and report["version"] == 3, report
want = tensors_sha256(last)
assert report["sha256"] == want, (report["sha256"], want)
for path in sys.argv[5:]:
    s = json.load(open(path))
    assert s["version"] == 3 and s["sha256"] == want, (path, s)
print("ok: rank 0 sent", files[0], "and", files[1], "and rank 1", files[2], "; every receiver holds the last checkpoint's sha256", want[:16])
PY
echo "ok: a group of 2 ranks sent the trainer's shard files, each its own (at ${SECONDS} s)"

# --- 2. refused, naming the problem --------------------------------------------------------------
refused() {  # refused NAME WANT_TEXT: rank 0 with config NAME.yaml exits non-zero saying WANT_TEXT
  local status=0
  timeout 60 "$DC" run --config "$1.yaml" --rank 0 --size 5 >"$1.out" 2>&1 || status=$?
  [ "$status" != 0 ] || fail "$1: rank 0 exited 0"
  grep -qF "$2" "$1.out" || { cat "$1.out" >&2; fail "$1: no '$2' in its error"; }
  echo "ok: $1 refused: $(grep -F "$2" "$1.out" | head -1 | cut -c1-160)"
}
write_config synth.yaml "{kind: synth, params: 1M, steps: 1}"
refused synth "group_parts: shards needs a sharded checkpoint"
mkdir one one-file
"$DC" synth --out one-made --params 1M --steps 0 --seed 9 >/dev/null  # one model file, not sharded
cp one-made/step-0000.safetensors one/
write_config onefile.yaml "{kind: watch, dir: $WORK/one, steps: 1}"
refused onefile "group_parts: shards needs a sharded checkpoint"
"$DC" synth --out one-shard --params 1M --steps 0 --seed 9 --shards 1 >/dev/null
drop one-shard/step-0000 one-file/step-0000
write_config fewer.yaml "{kind: watch, dir: $WORK/one-file, steps: 1}"
refused fewer "group_parts: shards deals 1 shard files to 2 producer ranks"
write_config single.yaml "{kind: synth, params: 1M, steps: 1}"
sed -i 's/^producers: 2$/producers: 1/' single.yaml
refused single "needs producers: 2 or more"
write_config twice.yaml "{kind: synth, params: 1M, steps: 1}" \
  "group_parts: '[[\"model.embed_tokens.weight\"], [\"model.embed_tokens.weight\"]]'"
refused twice "model.embed_tokens.weight"
PASSED=1
echo "ok: group_parts refusals name the problem"
