#!/usr/bin/env bash
# probe_test.sh mpirun|group|unreachable DELTACAST REPO_ROOT
#   mpirun:      `deltacast probe` as 5 ranks under mpirun on loopback (tcp): the 5x5 bandwidth and
#                latency matrices are filled off the diagonal with positive figures, the SVG parses
#                as XML, clusters, recommendation and predictions are present; then `run` with
#                clusters: auto, first from that probe file, then with no file (a quick probe at
#                start), each committing every step on every member.
#   group:       the same config with producers: 2 (6 ranks; the receivers from base + 2): probe
#                under mpirun (rank 1 takes no part; the matrices of rank 0 and the receivers), then
#                `run` with clusters: auto and no file (a quick probe at start), every step
#                committed on every receiver.
#   unreachable: a config of 4 members, ranks 0..3 started with --rank/--size 5 (rank 4 never
#                starts), --join-timeout 3s: rank 0 exits 0 within a bound, lists rank 4 as
#                unreachable, fills the other cells; the members exit 0.
# Exit 77 (ctest SKIP) when mpirun is missing (mpirun mode).
set -euo pipefail
mode=$1 bin=$2 root=$3
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=../ports.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/ports.sh"
base=$(free_ports 6)  # ports base..base+5 on 127.0.0.1
cat >"$dir/cluster.yaml" <<YAML
producer: tcp://127.0.0.1:$base
transport: tcp
members: {count: 4, host: 127.0.0.1, base_port: $((base + 1)), cluster: local}
timeouts: {connect: 5s, heartbeat: 500ms, peer: 5s}
YAML

check() {  # check JSON SVG UNREACHABLE(comma list or empty)
  python3 - "$@" <<'PY'
import json, sys, xml.etree.ElementTree as ET
path, svg, unreachable = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",") if x]
p = json.load(open(path))
n = p["ranks"]
assert n == 5, n
assert p["unreachable"] == unreachable, p["unreachable"]
assert p["transport"] == "tcp"
for key in ("bandwidth_gbit", "latency_us"):
    m = p[key]
    assert len(m) == n and all(len(row) == n for row in m), key
    for i in range(n):
        for j in range(n):
            v = m[i][j]
            if i == j or i in unreachable or j in unreachable:
                assert v is None, (key, i, j, v)
            else:
                assert isinstance(v, (int, float)) and v > 0, (key, i, j, v)
present = [r for r in range(n) if r not in unreachable]
assert sorted(r for c in p["clusters"] for r in c) == present, p["clusters"]
assert p["recommended"]["topology"] in ("binary", "double_binary", "chain"), p["recommended"]
c = p["recommended"]["chunk_bytes"]
assert 256 << 10 <= c <= 16 << 20 and c & (c - 1) == 0, c
assert len(p["predicted"]) == 3 and all(x["seconds"] > 0 for x in p["predicted"]), p["predicted"]
# No producer_cluster and one member label: `run` would have the producer commit, and so does the model.
assert all(x["commit"] == "producer" for x in p["predicted"]), p["predicted"]
assert p["failed"] == [], p["failed"]
assert p["flow_seconds"] > 0
if not unreachable:
    assert p["shared_links"], "expected concurrent-flow entries"
ET.parse(svg)  # well-formed XML
print("OK:", path, "clusters", p["clusters"], "bandwidth row 0", p["bandwidth_gbit"][0])
PY
}

mpirun_lo() {  # mpirun_lo NP ARGS...: mpirun on loopback (tcp), bounded
  local np=$1; shift
  timeout 150 mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo \
    --mca oob_tcp_if_include lo -np "$np" "$@"
}

quick_probe_run() {  # quick_probe_run NP TAG: `run` with clusters: auto and no probe file (a quick
  # probe at start; the probe's 5 ranks: the producer or coordinator and the 4 receivers), 2 steps
  # committed on every receiver
  local out="$dir/run-$2.txt" report="$dir/report-$2.json"
  mpirun_lo "$1" "$bin" run --config "$dir/cluster.yaml" --set clusters=auto --set trainer.params=2M \
    --set trainer.steps=2 --set output.dir="$dir/run-$2" --set output.metrics_file="$report" >"$out" 2>&1 ||
    { cat "$out"; fail "$2: mpirun run with a quick probe exited non-zero"; }
  grep "clusters from a quick probe (.* 5 of 5 ranks reached): {" "$out" || { cat "$out"; fail "$2: run did not probe at start"; }
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["ok"] is True and all(s["verified_receivers"] == 4 for s in r["steps"]), r' \
    "$report" || fail "$2: the run after a quick probe is not as expected"
}

case "$mode" in
  mpirun)
    command -v mpirun >/dev/null || { echo "no mpirun installed"; exit 77; }
    start=$(date +%s)
    mpirun_lo 5 "$bin" probe --config "$dir/cluster.yaml" --out "$dir/probe.json" \
      >"$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; fail "mpirun probe exited non-zero"; }
    cat "$dir/out.txt"
    echo "probe took $(( $(date +%s) - start )) s"
    check "$dir/probe.json" "$dir/probe.svg" ""
    # clusters: auto: the same job runs with the probe's clusters (the producer's included).
    mpirun_lo 5 "$bin" run --config "$dir/cluster.yaml" --set clusters=auto \
      --set probe_file="$dir/probe.json" --set trainer.params=2M --set trainer.steps=2 \
      --set output.dir="$dir/run" --set output.metrics_file="$dir/report.json" \
      >"$dir/run.txt" 2>&1 || { cat "$dir/run.txt"; fail "mpirun run with clusters: auto exited non-zero"; }
    grep "clusters from $dir/probe.json: producer in probe-" "$dir/run.txt" || { cat "$dir/run.txt"; fail "run did not take the probe's clusters"; }
    python3 - "$dir/report.json" "$dir/probe.json" "$dir/run.txt" <<'PY' || fail "the run with the probe's clusters is not as expected"
import json, sys
report, probe, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), open(sys.argv[3]).read()
assert report["ok"] is True, report
assert all(s["verified_receivers"] == 4 for s in report["steps"]), report["steps"]
home = next(k for k, c in enumerate(probe["clusters"]) if 0 in c)
assert f"producer in probe-{home};" in out, out
for k, c in enumerate(probe["clusters"]):
    for r in c:
        if r: assert f" {r}:probe-{k}" in out, (r, k, out)
print("OK: run with clusters: auto", probe["clusters"])
PY
    # clusters: auto without probe_file: the job probes quickly at start, then runs.
    quick_probe_run 5 quick
    echo "OK: run with clusters: auto and a quick probe"
    ;;
  group)
    # clusters: auto with a producer group of 2 (6 ranks: 2 producer ranks, 4 receivers from
    # base + 2): `probe` measures rank 0 and the receivers (rank 1, a part rank, says it takes no
    # part), then `run` probes quickly at start and commits every step on every receiver.
    command -v mpirun >/dev/null || { echo "no mpirun installed"; exit 77; }
    sed -i -e "s/^transport: tcp$/transport: tcp\nproducers: 2/" -e "s/base_port: $((base + 1))/base_port: $((base + 2))/" \
      "$dir/cluster.yaml"
    mpirun_lo 6 "$bin" probe --config "$dir/cluster.yaml" --out "$dir/probe.json" \
      >"$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; fail "mpirun probe with producers: 2 exited non-zero"; }
    grep -q "producer rank 1: a group's part rank takes no part in the probe" "$dir/out.txt" ||
      { cat "$dir/out.txt"; fail "rank 1 did not say it takes no part"; }
    check "$dir/probe.json" "$dir/probe.svg" ""
    quick_probe_run 6 group
    echo "OK: a producer group of 2 with clusters: auto (probe and a quick probe at start)"
    ;;
  unreachable)
    for r in 1 2 3; do
      timeout 120 "$bin" probe --config "$dir/cluster.yaml" --rank $r --size 5 --join-timeout 20s \
        >"$dir/member$r.txt" 2>&1 &
      pids+=($!)
    done
    start=$(date +%s)
    rc=0
    timeout 100 "$bin" probe --config "$dir/cluster.yaml" --rank 0 --size 5 --join-timeout 3s \
      --out "$dir/probe.json" --svg "$dir/heat.svg" >"$dir/rank0.txt" 2>&1 || rc=$?
    elapsed=$(( $(date +%s) - start ))
    cat "$dir/rank0.txt"
    [ "$rc" -eq 0 ] || fail "rank 0 exited $rc"
    [ "$elapsed" -le 90 ] || fail "rank 0 took $elapsed s"
    grep -q "warning: unreachable.*4" "$dir/rank0.txt" || fail "no warning naming rank 4"
    for k in 0 1 2; do
      wait "${pids[$k]}" || { cat "$dir/member$((k + 1)).txt"; fail "member $((k + 1)) exited non-zero"; }
    done
    pids=()
    check "$dir/probe.json" "$dir/heat.svg" "4"
    echo "rank 0 finished in $elapsed s"
    ;;
  *) echo "usage: $0 mpirun|group|unreachable DELTACAST ROOT" >&2; exit 2 ;;
esac
