#!/usr/bin/env bash
# bench_tree_test.sh MODE DELTACAST REPO_ROOT: `deltacast bench tree` (docs/benchmarks.md) as real
# processes on loopback tcp, 4 ranks (producer + 3 receivers).
#   mpirun:  broadcast sweep 1..16 MiB x 3 topologies, --iters 2, under mpirun: exit 0, a JSON row
#            per topology x size with every column and positive times, the SVG parses as XML.
#   refit:   --mode refit --params 4M --change-rates 0.01,0.05 under mpirun, the producer's uplink
#            capped at 200 Mbit/s: speedup > 1 for every topology and rate, payload grows with the
#            rate, changed fractions near the rates, the full checkpoint near its wire time.
#   group:   the same with `producers: 2` (5 ranks: 2 producer ranks + 3 receivers, each rank's
#            uplink capped at 100 Mbit/s), 2 topologies: every version committed by all 3
#            receivers, the changes counted over both parts, payload grows with the rate.
#   srun:    a small broadcast sweep (1..4 MiB) under srun on the single-node Slurm
#            (scripts/slurm-local.sh; started here if it is not running, stopped again if so).
#   missing: --rank/--size launches where rank 3 never starts: rank 0 exits non-zero within
#            timeouts.join plus a margin, naming rank 3; the other receivers exit too.
#   killed:  rank 2 kills itself in session 2 (--fault kill@2): the tree repairs, rank 0 marks the
#            row with the failed rank, stops with an error naming it, and leaves the JSON rows.
# Exit 77 (ctest SKIP) when the launcher is missing.
set -euo pipefail
mode=$1 bin=$2 root=$3
dir=$(mktemp -d)
pids=()
slurm_started=0
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if [ "$slurm_started" = 1 ]; then "$root/scripts/slurm-local.sh" stop >/dev/null 2>&1 || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=../ports.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/ports.sh"
base=$(free_ports 5)  # ports base..base+4 on 127.0.0.1
join=${JOIN:-20s}
write_config() {
  cat >"$dir/cluster.yaml" <<YAML
producer: tcp://127.0.0.1:$base
transport: tcp
chunk_bytes: 1MiB
members: {count: 3, host: 127.0.0.1, base_port: ${member_base:-$((base + 1))}, cluster: local}
timeouts: {connect: 5s, heartbeat: 500ms, peer: 5s, refit: 60s, join: $join, producer_loss: 5s}
${extra_config:-}
YAML
}
mpirun_local() {
  timeout 170 mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo \
    --mca oob_tcp_if_include lo "$@"
}

check_broadcast() {  # check_broadcast JSON SVG SIZES(comma list, bytes)
  python3 - "$@" <<'PY'
import json, sys, xml.etree.ElementTree as ET
path, svg, sizes = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
d = json.load(open(path))
assert d["complete"] is True and d["mode"] == "broadcast", (d.get("complete"), d.get("error"))
assert d["ranks"] == 4 and d["receivers"] == 3 and d["transport"] == "tcp", d
assert d["memory"]["size_cap_bytes"] > 0 and d["memory"]["local_processes"] >= 4, d["memory"]
topologies = ["binary", "double_binary", "chain"]
rows = d["rows"]
assert sorted((r["topology"], r["size_bytes"]) for r in rows) == sorted((t, s) for t in topologies for s in sizes), rows
columns = ["topology", "size_bytes", "time_s", "time_min_s", "time_max_s", "algbw_gbyte_s", "busbw_gbyte_s",
           "over_lower_bound"]
for r in rows:
    for c in columns:
        assert c in r, (c, r)
    assert 0 < r["time_min_s"] <= r["time_s"] <= r["time_max_s"], r
    assert r["iters"] == 2 and r["verified_receivers"] == 3 and r["failed_members"] == [], r
    assert abs(r["algbw_gbyte_s"] - r["size_bytes"] / r["time_s"] / 1e9) < 1e-6 * r["algbw_gbyte_s"], r
    assert r["busbw_gbyte_s"] == r["algbw_gbyte_s"], r
    assert r["over_lower_bound"] is None or r["over_lower_bound"] > 0, r
ET.parse(svg)  # well-formed XML
print("OK:", len(rows), "rows;", ", ".join(f'{r["topology"]} {r["size_bytes"] >> 20}MiB {r["busbw_gbyte_s"]:.3f} GB/s'
                                           for r in rows))
PY
}

case "$mode" in
  mpirun)
    command -v mpirun >/dev/null || { echo "no mpirun installed"; exit 77; }
    write_config
    mpirun_local -np 4 "$bin" bench tree --config "$dir/cluster.yaml" --min-size 1MiB --max-size 16MiB --iters 2 \
      --link-gbit 10 --json "$dir/bench.json" --svg "$dir/bench.svg" >"$dir/out.txt" 2>&1 ||
      { cat "$dir/out.txt"; fail "mpirun bench tree exited non-zero"; }
    cat "$dir/out.txt"
    check_broadcast "$dir/bench.json" "$dir/bench.svg" $((1 << 20)),$((4 << 20)),$((16 << 20))
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert all(r['over_lower_bound'] > 0 for r in d['rows'])" \
      "$dir/bench.json" || fail "--link-gbit 10 must give over_lower_bound"
    ;;
  refit)
    command -v mpirun >/dev/null || { echo "no mpirun installed"; exit 77; }
    # The producer's uplink capped at 200 Mbit/s, as between a trainer's cluster and a rollout
    # cluster (the demo's --uplink): on loopback the wire is otherwise free, and a 4M-parameter
    # refit's CPU (diff, apply, commit round trips on 2 shared cores) can outlast its full send.
    extra_config="egress: {producer: 200Mbit/s}" write_config
    mpirun_local -np 4 "$bin" bench tree --config "$dir/cluster.yaml" --mode refit --params 4M \
      --change-rates 0.01,0.05 --iters 2 --link-gbit 0.2 --json "$dir/refit.json" --svg "$dir/refit.svg" \
      >"$dir/out.txt" 2>&1 ||
      { cat "$dir/out.txt"; fail "mpirun bench tree --mode refit exited non-zero"; }
    cat "$dir/out.txt"
    python3 - "$dir/refit.json" "$dir/refit.svg" <<'PY'
import json, sys, xml.etree.ElementTree as ET
d = json.load(open(sys.argv[1]))
assert d["complete"] is True and d["mode"] == "refit", d.get("error")
rows = d["rows"]
assert len(rows) == 6, rows
for t in ["binary", "double_binary", "chain"]:
    mine = sorted((r for r in rows if r["topology"] == t), key=lambda r: r["change_rate"])
    assert [r["change_rate"] for r in mine] == [0.01, 0.05], mine
    for r in mine:
        for c in ["change_rate", "changed_fraction", "payload_bytes", "full_s", "refit_s", "speedup"]:
            assert c in r, (c, r)
        assert r["full_s"] > 0 and r["refit_s"] > 0 and r["speedup"] > 1, r
        assert abs(r["changed_fraction"] - r["change_rate"]) < 0.2 * r["change_rate"], r
        # B = the 200 Mbit/s cap: the full checkpoint runs at about its wire time.
        assert 0.9 < r["full_over_lower_bound"] < 3 and r["refit_over_lower_bound"] > 0, r
        assert r["verified_receivers"] == 3 and r["failed_members"] == [], r
    assert mine[1]["payload_bytes"] > mine[0]["payload_bytes"], mine
ET.parse(sys.argv[2])
print("OK:", ", ".join(f'{r["topology"]} {r["change_rate"]}: {r["payload_bytes"]} B, {r["speedup"]:.1f}x' for r in rows))
PY
    ;;
  group)
    command -v mpirun >/dev/null || { echo "no mpirun installed"; exit 77; }
    # A producer group of 2 ranks (rank 1 listens at the rendezvous port + 1, so the members start
    # at + 2), each rank's uplink capped at 100 Mbit/s; 3 receivers.
    member_base=$((base + 2)) extra_config="producers: 2
egress: {producer: 100Mbit/s}" write_config
    mpirun_local -np 5 "$bin" bench tree --config "$dir/cluster.yaml" --mode refit --params 4M \
      --change-rates 0.01,0.05 --iters 2 --topologies binary,double_binary --json "$dir/group.json" \
      >"$dir/out.txt" 2>&1 ||
      { cat "$dir/out.txt"; fail "mpirun bench tree --mode refit with producers: 2 exited non-zero"; }
    cat "$dir/out.txt"
    grep -q "5 ranks (2 producer ranks + 3 receivers" "$dir/out.txt" || fail "the header does not name the group"
    python3 - "$dir/group.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["complete"] is True and d["mode"] == "refit", d.get("error")
assert d["producers"] == 2 and d["ranks"] == 5 and d["receivers"] == 3, d
rows = d["rows"]
assert sorted((r["topology"], r["change_rate"]) for r in rows) == [
    ("binary", 0.01), ("binary", 0.05), ("double_binary", 0.01), ("double_binary", 0.05)], rows
for r in rows:
    # Every version committed and acked by all 3 receivers (the joint commit's digests), 2 timed
    # iterations each; the changes counted over both ranks' parts.
    assert r["verified_receivers"] == 3 and r["failed_members"] == [] and r["iters"] == 2, r
    assert r["full_s"] > 0 and r["refit_s"] > 0, r
    assert abs(r["changed_fraction"] - r["change_rate"]) < 0.2 * r["change_rate"], r
for t in ["binary", "double_binary"]:
    low, high = sorted((r for r in rows if r["topology"] == t), key=lambda r: r["change_rate"])
    assert high["payload_bytes"] > low["payload_bytes"], (low, high)
print("OK: producer group of 2:", ", ".join(f'{r["topology"]} {r["change_rate"]}: {r["payload_bytes"]} B in {r["refit_s"]:.3f} s' for r in rows))
PY
    ;;
  srun)
    command -v srun >/dev/null && command -v slurmctld >/dev/null || { echo "no Slurm installed"; exit 77; }
    [ "$(id -u)" -eq 0 ] || { echo "single-node Slurm needs root"; exit 77; }
    "$root/scripts/slurm-local.sh" status >/dev/null 2>&1 || { "$root/scripts/slurm-local.sh" start >/dev/null; slurm_started=1; }
    eval "$("$root/scripts/slurm-local.sh" env)"
    write_config
    timeout 150 srun -n 4 --kill-on-bad-exit=1 "$bin" bench tree --config "$dir/cluster.yaml" --min-size 1MiB \
      --max-size 4MiB --iters 2 --json "$dir/bench.json" --svg "$dir/bench.svg" >"$dir/out.txt" 2>&1 ||
      { cat "$dir/out.txt"; fail "srun bench tree exited non-zero"; }
    cat "$dir/out.txt"
    grep -q "launcher slurm" "$dir/out.txt" || fail "rank 0 did not see the Slurm launcher"
    check_broadcast "$dir/bench.json" "$dir/bench.svg" $((1 << 20)),$((4 << 20))
    ;;
  missing)
    join=3s write_config
    for r in 1 2; do
      timeout 60 "$bin" bench tree --config "$dir/cluster.yaml" --rank $r --size 4 --max-size 1MiB >"$dir/r$r.txt" 2>&1 &
      pids+=($!)
    done
    start=$(date +%s)
    rc=0
    timeout 60 "$bin" bench tree --config "$dir/cluster.yaml" --rank 0 --size 4 --max-size 1MiB --json "$dir/b.json" \
      >"$dir/r0.txt" 2>&1 || rc=$?
    elapsed=$(($(date +%s) - start))
    cat "$dir/r0.txt"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "rank 0 exited $rc (want a failure, not a timeout)"
    [ "$elapsed" -le 20 ] || fail "rank 0 took $elapsed s to give up (timeouts.join is 3 s)"
    grep -q "rank 3 did not report within timeouts.join" "$dir/r0.txt" || fail "the error does not name rank 3"
    for k in 0 1; do
      rc=0
      wait "${pids[$k]}" || rc=$?
      [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$dir/r$((k + 1)).txt"; fail "receiver $((k + 1)) exited $rc"; }
    done
    pids=()
    echo "OK: rank 0 gave up after $elapsed s naming rank 3"
    ;;
  killed)
    write_config
    common=(--config "$dir/cluster.yaml" --size 4 --min-size 4MiB --max-size 4MiB --iters 2 --warmup 1
            --topologies binary)
    for r in 1 2 3; do
      extra=()
      [ "$r" = 2 ] && extra=(--fault kill@2:2)
      timeout 120 "$bin" bench tree "${common[@]}" --rank $r "${extra[@]}" >"$dir/r$r.txt" 2>&1 &
      pids+=($!)
    done
    start=$(date +%s)
    rc=0
    timeout 120 "$bin" bench tree "${common[@]}" --rank 0 --json "$dir/b.json" >"$dir/r0.txt" 2>&1 || rc=$?
    elapsed=$(($(date +%s) - start))
    cat "$dir/r0.txt"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "rank 0 exited $rc (want a failure, not a timeout)"
    grep -q "receiver rank 2 (" "$dir/r0.txt" || fail "the error does not name rank 2"
    python3 - "$dir/b.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["complete"] is False and "rank 2" in d["error"], d
rows = d["rows"]
assert len(rows) == 1 and [f["rank"] for f in rows[0]["failed_members"]] == [2], rows
assert rows[0]["verified_receivers"] == 2 and rows[0]["time_s"] > 0, rows
print("OK: row marked", rows[0]["failed_members"], "error:", d["error"][:160])
PY
    for k in 0 1 2; do wait "${pids[$k]}" || true; done
    pids=()
    echo "rank 0 stopped after $elapsed s"
    ;;
  *) echo "usage: $0 mpirun|refit|group|srun|missing|killed DELTACAST ROOT" >&2; exit 2 ;;
esac
