#!/usr/bin/env bash
# Full checkpoint vs delta refit across an emulated cross-region link (scripts/wan.sh, docs/wan.md):
# a producer behind ONE shaped inter-cluster link with a real round-trip delay (dc_delay_shim),
# receivers in a rollout cluster with faster links among them; one `deltacast run` process per
# namespace, as a user would run it. Each run appends one JSON line (the producer's report plus the
# setup and the RTT measured right before it) to RESULT; bench/wan/summarize.py makes the tables.
#
#   bench/wan/run_cross_region.sh rtt [ROUNDS]          (a) 4 receivers, chain, 100M params, lr 2e-6,
#                                                           100mbit uplink; one-way delay 0, 25, 50 ms;
#                                                           commit: producer and delegated (COMMITS)
#   bench/wan/run_cross_region.sh table [ROUNDS] [PARAMS] (b) 8 receivers, 100mbit uplink + 25 ms, inner
#                                                           1gbit; lr for 1/3/5%; chain, double_binary
#
# Environment: BUILD (default build-wan), RESULT (default bench/wan/results/<mode>.jsonl), STEPS
# (refits per run, default 3), DELAYS and COMMITS (a), LRS and TOPOLOGIES (b), UPLINK, INNER,
# RECEIVERS, COMMIT (b: the config's `commit`, default auto = delegated here), PARAMS (a: default
# 100M; a smaller model with a slower UPLINK keeps the wire, not this machine's CPU, the bottleneck).
# Rounds are interleaved (round 1 of every setting, then round 2...). Every process runs under
# timeout; the namespaces are removed on exit, whatever happens.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build-wan}"
MODE="${1:-}"
ROUNDS="${2:-3}"
WAN="$ROOT/scripts/wan.sh"
BIN="$BUILD/tools/deltacast"
export DELTACAST_WAN_SHIM="${DELTACAST_WAN_SHIM:-$BUILD/bench/netns/dc_delay_shim}"
export DELTACAST_WAN_PREFIX="${DELTACAST_WAN_PREFIX:-dwx}"
STEPS="${STEPS:-3}"
OUT="$ROOT/bench/wan/results"
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "no $BIN: build it (docs/wan.md)" >&2; exit 1; }
[ -x "$DELTACAST_WAN_SHIM" ] || { echo "no $DELTACAST_WAN_SHIM: build dc_delay_shim (docs/wan.md)" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$WAN" destroy || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
chmod 600 "$work/secret"

# run_once LABEL RECEIVERS TOPOLOGY PARAMS LR UPLINK INNER DELAY_MS ROUND RTT_JSON COMMIT: one deltacast
# run, one JSON line appended to $RESULT.
run_once() {
  local label=$1 n=$2 topo=$3 params=$4 lr=$5 uplink=$6 inner=$7 delay=$8 round=$9 rtt=${10} commit=${11} r rc=0 load
  {
    echo "producer: tcp://$("$WAN" addr 0):29850"
    echo "transport: tcp"
    echo "secret_file: $work/secret"
    echo "topology: $topo"
    echo "producer_cluster: trainer"
    echo "commit: $commit"
    echo "timeouts: {connect: 10s, heartbeat: 1s, peer: 30s, refit: 5m, join: 180s}"
    echo "trainer: {kind: synth, params: $params, steps: $STEPS, lr: $lr}"
    echo "output: {dir: $work/out}"
    echo "members:"
    for ((r = 1; r <= n; r++)); do
      echo "  - {rank: $((r - 1)), host: $("$WAN" addr "$r"), port: 29850, cluster: rollout}"
    done
  } >"$work/cluster.yaml"
  rm -f "$work/report.json"
  pids=()
  for ((r = 1; r <= n; r++)); do
    "$WAN" exec "$r" timeout 900 "$BIN" run --config "$work/cluster.yaml" --rank "$r" --size $((n + 1)) \
      >"$work/rank$r.log" 2>&1 &
    pids+=($!)
  done
  load=$(cut -d' ' -f1 /proc/loadavg)
  "$WAN" exec 0 timeout 880 "$BIN" run --config "$work/cluster.yaml" --rank 0 --size $((n + 1)) \
    --report "$work/report.json" >"$work/rank0.log" 2>&1 || rc=$?
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || rc=$((rc ? rc : 99)); done
  pids=()
  if [ "$rc" -ne 0 ] || [ ! -f "$work/report.json" ]; then
    echo "run failed (rc $rc): $label $topo lr $lr delay $delay round $round; producer log tail:" >&2
    tail -5 "$work/rank0.log" >&2
    cp "$work/rank0.log" "$OUT/failed-$(date +%H%M%S)-rank0.log" 2>/dev/null || true
  fi
  python3 - "$RESULT" "$work/report.json" "$label" "$n" "$topo" "$params" "$lr" "$uplink" "$inner" "$delay" \
    "$round" "$rtt" "$load" "$(cut -d' ' -f1 /proc/loadavg)" "$rc" "$commit" <<'PY'
import json, os, sys, time
(result, report, label, n, topo, params, lr, uplink, inner, delay, rnd, rtt, load0, load1, rc, commit) = sys.argv[1:]
rep = json.load(open(report)) if os.path.exists(report) else None
line = {"bench": "wan", "label": label, "receivers": int(n), "topology": topo, "params": params, "lr": float(lr),
        "uplink": uplink, "inner": inner, "delay_ms": float(delay), "round": int(rnd), "rtt": json.loads(rtt),
        "load_before": float(load0), "load_after": float(load1), "rc": int(rc), "time": time.strftime("%H:%M:%S"),
        "commit": commit, "report": rep}
open(result, "a").write(json.dumps(line) + "\n")
if rep:
    steps = ", ".join(f"{s['refit_seconds']:.3f}" for s in rep["steps"])
    print(f"{label} round {rnd} {topo} commit {commit} lr {lr} delay {delay} ms (RTT {json.loads(rtt).get('median_ms', 0):.1f}): "
          f"full {rep['full']['seconds']:.2f} s, refits {steps} s, ok {rep['ok']}, load {load0}->{load1}")
PY
}

case "$MODE" in
  rtt)
    RESULT="${RESULT:-$OUT/rtt.jsonl}"
    UPLINK="${UPLINK:-100mbit}" INNER="${INNER:-1gbit}" RECEIVERS="${RECEIVERS:-4}"
    for ((round = 1; round <= ROUNDS; round++)); do
      for delay in ${DELAYS:-0 25 50}; do
        "$WAN" create "$RECEIVERS" "$UPLINK" "$INNER" "$delay" >/dev/null
        for commit in ${COMMITS:-producer delegated}; do
          rtt=$("$WAN" rtt 0 1 | tail -1)
          run_once rtt "$RECEIVERS" chain "${PARAMS:-100M}" "${LR:-2e-6}" "$UPLINK" "$INNER" "$delay" "$round" "$rtt" "$commit"
        done
        "$WAN" destroy
      done
    done ;;
  table)
    RESULT="${RESULT:-$OUT/table.jsonl}"
    PARAMS="${3:-200M}"
    UPLINK="${UPLINK:-100mbit}" INNER="${INNER:-1gbit}" RECEIVERS="${RECEIVERS:-8}" DELAY="${DELAY:-25}"
    "$WAN" create "$RECEIVERS" "$UPLINK" "$INNER" "$DELAY" >/dev/null
    CHECK_JSON="$OUT/table-check.jsonl" timeout 120 "$WAN" check 5
    for ((round = 1; round <= ROUNDS; round++)); do
      for lr in ${LRS:-1.3e-6 5e-6 9e-6}; do
        for topo in ${TOPOLOGIES:-chain double_binary}; do
          rtt=$("$WAN" rtt 0 1 | tail -1)
          run_once table "$RECEIVERS" "$topo" "$PARAMS" "$lr" "$UPLINK" "$INNER" "$DELAY" "$round" "$rtt" "${COMMIT:-auto}"
        done
      done
    done ;;
  *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
