#!/usr/bin/env bash
# `deltacast demo` through the relay tree (1 producer + receivers as local processes), small:
#   demo_test.sh DELTACAST transport T        3 receivers over transport T, 2 steps: exit 0, every
#                                             receiver bit-exact, the report's repair keys present
#   demo_test.sh DELTACAST uplink RATE        3 receivers, the producer's egress capped at RATE:
#                                             the bootstrap takes at least its payload over RATE,
#                                             the table shows each time's wire floor
#   demo_test.sh DELTACAST producers M        a producer group of M ranks (4 receivers, each rank's
#                                             egress capped at 20 Mbit/s): every receiver bit-exact,
#                                             every version committed, no version faster than its
#                                             payload over M x the cap; each rank simulated only
#                                             its part, and the receivers hold one producer's bits.
#                                             M = 2 takes the trainer's layout (group_parts JSON,
#                                             the embedding cut at an element off every batch)
#   demo_test.sh DELTACAST group-kill R@S     --kill with a producer group of 2 ranks: as kill
#   demo_test.sh DELTACAST kill RANK@STEP     --kill (4 receivers, binary tree: rank 2 relays for
#   demo_test.sh DELTACAST freeze RANK@STEP   rank 4): exit 0, the victim reported failed at its
#                                             step, every survivor bit-exact, every step committed
# In every mode no process of the demo may be left behind.
set -euo pipefail
DC=${1:?usage: demo_test.sh PATH/TO/deltacast MODE ARG}
MODE=${2:?mode: transport | uplink | producers | kill | group-kill | freeze}
ARG=${3:?argument: a transport, or RANK@STEP}
WORK=$(mktemp -d /tmp/dc-demo-test.XXXXXX)
DEMO_DIR=""
cleanup() {
  # The demo's own work directory (logs, config) goes too, unless the test failed.
  if [ "${PASSED:-0}" = 1 ] && [ -n "$DEMO_DIR" ]; then rm -rf "$DEMO_DIR"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
cd "$WORK"

fail() {
  echo "FAIL: $*" >&2
  echo "--- demo output:" >&2; cat out.txt >&2 || true
  echo "--- demo stderr:" >&2; cat err.txt >&2 || true
  if [ -n "$DEMO_DIR" ]; then
    for log in "$DEMO_DIR"/rank-*.log; do echo "--- $log (last lines):" >&2; tail -n 8 "$log" >&2 || true; done
  fi
  exit 1
}

# M = 2: the trainer's own layout instead of the balanced one: the embedding split between the
# ranks at element 100003, the other tensors dealt alternately (names from a 2M checkpoint).
RANK0_ELEMENTS=""
if [ "$MODE" = producers ] && [ "$ARG" = 2 ]; then
  "$DC" synth --out shape --params 2M --steps 0 >/dev/null
  read -r RANK0_ELEMENTS DELTACAST_GROUP_PARTS < <(python3 - shape/step-0000.safetensors <<'PY'
import json, math, struct, sys
raw = open(sys.argv[1], "rb").read()
header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
numel = {k: math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__"}
embed = "model.embed_tokens.weight"
rest = sorted(k for k in numel if k != embed)
parts = [[[embed, 0, 100003]] + rest[0::2], [[embed, 100003, numel[embed]]] + rest[1::2]]
print(100003 + sum(numel[k] for k in rest[0::2]), json.dumps(parts, separators=(",", ":")))
PY
  )
  export DELTACAST_GROUP_PARTS
fi

case "$MODE" in
  transport) ARGS=(--transport "$ARG" --receivers 3 --steps 2); SURVIVORS=3 ;;
  uplink) ARGS=(--uplink "$ARG" --receivers 3 --steps 2); SURVIVORS=3 ;;
  producers) ARGS=(--producers "$ARG" --uplink 20Mbit/s --receivers 4 --steps 2); SURVIVORS=4 ;;
  kill) ARGS=(--receivers 4 --steps 3 --kill "$ARG"); SURVIVORS=3 ;;
  group-kill) ARGS=(--producers 2 --receivers 4 --steps 3 --kill "$ARG"); SURVIVORS=3 ;;
  freeze) ARGS=(--receivers 4 --steps 3 --freeze "$ARG"); SURVIVORS=3 ;;
  *) echo "unknown mode $MODE" >&2; exit 2 ;;
esac

# timeout signals its whole process group, so the demo's children go too if the demo hangs; the
# demo's own --timeout should come first and clean up by itself.
status=0
timeout -k 5 100 "$DC" demo --params 2M --timeout 80s --json demo.json "${ARGS[@]}" \
  >out.txt 2>err.txt || status=$?
DEMO_DIR=$(sed -n 's/.*(logs in \(.*\))$/\1/p' out.txt | head -n 1)
[ "$status" = 0 ] || fail "demo ${ARGS[*]} exited with $status"

# Nothing left running: no process still names this demo's config.
if [ -n "$DEMO_DIR" ] && pgrep -f "$DEMO_DIR/cluster.yaml" >/dev/null; then
  left=$(pgrep -f "$DEMO_DIR/cluster.yaml" || true)
  ps -o pid,stat,args -p "$(echo $left | tr ' ' ,)" >&2 || true
  for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
  fail "processes of the demo are still running"
fi

grep -q "${SURVIVORS}/${SURVIVORS} receivers bit-exact" out.txt || fail "not every (surviving) receiver is bit-exact"

python3 - demo.json "$MODE" "$ARG" "$SURVIVORS" <<'PY' || fail "the JSON report is not as expected"
import json, sys
report = json.load(open(sys.argv[1]))
mode, arg, survivors = sys.argv[2], sys.argv[3], int(sys.argv[4])
assert report["ok"] is True, report["ok"]
assert report["bit_exact_receivers"] == survivors, report["bit_exact_receivers"]
entries = [report["full"]] + report["steps"]
for e in entries:
    for key in ("failed_members", "epoch", "repair_seconds", "resent_chunks"):
        assert key in e, (key, e)
for s in report["steps"]:
    assert s["committed"] is True, s
if mode in ("transport", "uplink", "producers"):
    assert all(not e["failed_members"] for e in entries), entries
    assert report["full"]["committed"] is True, report["full"]
if mode == "transport":
    assert report["transport"] == arg, report["transport"]
    if arg == "s3":
        # Two store clusters, each crossed once: the gateways' downloads are the published bytes
        # (version 1 whole and every delta) twice, plus the requests' overhead.
        ratio = report["store_downloaded_bytes"] / (2 * report["store_published_bytes"])
        assert 1.0 <= ratio <= 1.05, ratio
elif mode == "uplink":
    rate = report["uplink_bytes_per_second"]
    assert rate > 0, rate
    full = report["full"]
    floor = full["payload_bytes"] / rate
    # The cap holds: the bootstrap's bytes left the producer no faster than the rate (the burst,
    # at most 64 KiB here, is within the 2% allowance of 4 MB).
    assert full["seconds"] >= 0.98 * floor, (full["seconds"], floor)
    for s in report["steps"]:
        assert s["refit_seconds"] >= 0.98 * s["payload_bytes"] / rate - 0.07, s
elif mode == "producers":
    m = int(arg)
    assert report["producer_ranks"] == m, report["producer_ranks"]
    rate = report["uplink_bytes_per_second"]
    # Each rank's cap holds: no version went faster than its payload over m capped links.
    for e in [report["full"]] + report["steps"]:
        seconds = e.get("seconds", e.get("refit_seconds"))
        assert seconds >= 0.98 * e["payload_bytes"] / (m * rate) - 0.07, (e, m, rate)
else:
    rank, step = (int(x) for x in arg.split(":")[0].split("@"))
    version = step + 1
    where = [e for e in entries if any(m["rank"] == rank for m in e["failed_members"])]
    assert where, f"rank {rank} is reported failed nowhere"
    # Reported with the version it died in (or, if noticed between versions, with the next).
    first = where[0]
    got = first.get("version", first.get("versions"))
    assert got in (version, version + 1), (got, version)
    for m in first["failed_members"]:
        assert {"rank", "cause", "detected_at_s", "detection_seconds"} <= set(m), m
    if mode in ("kill", "group-kill"):
        assert any(m["rank"] == rank and m["cause"] == "link_closed" for m in first["failed_members"]), first
    else:  # found by its own silence, or reported by its parent as draining nothing
        assert any(m["rank"] == rank and m["cause"] in ("silent", "stalled") for m in first["failed_members"]), first
    assert [i["rank"] for i in report["injected_failures"]] == [rank], report["injected_failures"]
PY

if [ "$MODE" = producers ]; then
  grep -q "$ARG producer ranks + 4 receivers" out.txt || fail "the demo does not say it runs $ARG producer ranks"
  grep -q "floor s = payload / $ARG x the" out.txt || fail "the floor is not the aggregate of $ARG uplinks"
  # Each rank simulated only its part of the trainer (no process held the whole model), and the
  # receivers hold exactly what one producer simulating the whole model sends.
  grep -q "producer rank 1: building its part of a synthetic model" "$DEMO_DIR"/rank-1.out ||
    fail "rank 1 did not simulate its part only"
  if [ -n "$RANK0_ELEMENTS" ]; then
    grep -q "producer rank 0: building its part of a synthetic model of [0-9]* parameters ($RANK0_ELEMENTS of them)" \
      out.txt || fail "rank 0 did not simulate the part group_parts gave it ($RANK0_ELEMENTS elements)"
  fi
  timeout -k 5 100 env -u DELTACAST_GROUP_PARTS "$DC" demo --params 2M --timeout 80s --json one.json --receivers 2 --steps 2 --uplink 0 \
    >one.txt 2>&1 || fail "the one-producer demo failed"
  python3 -c 'import json, sys; a, b = (json.load(open(p))["receivers_sha256"] for p in sys.argv[1:]); assert a == b, (a, b)' \
    demo.json one.json || fail "the group's receivers do not hold the one producer's bits"
  rm -rf "$(sed -n 's/.*(logs in \(.*\))$/\1/p' one.txt | head -n 1)"
fi
if [ "$MODE" = uplink ]; then
  grep -q "floor s" out.txt || fail "the table has no wire-floor column"
  grep -q "uplink is capped at" out.txt || fail "the demo does not say its uplink is capped"
fi
if [ "$MODE" = kill ] || [ "$MODE" = group-kill ] || [ "$MODE" = freeze ]; then
  rank=${ARG%%@*}
  verb=$([ "$MODE" = freeze ] && echo frozen || echo killed)
  grep -q "rank $rank $verb (" out.txt || fail "the demo does not name rank $rank as $verb"
fi
PASSED=1
echo "ok: demo $MODE $ARG"
