#!/usr/bin/env bash
# probe_netns_test.sh DELTACAST REPO_ROOT
# Five network namespaces (scripts/netns.sh, unshaped) in two groups, {0,1,2} and {3,4}: every
# node's eth0 egress is an htb whose default class is 1gbit, with a 50mbit class for destinations
# in the OTHER group (u32 filters on the destination address). `deltacast probe`, one process per
# namespace (--rank/--size), must find exactly these two clusters, and its figures for one
# inter-group pair (0 -> 3) and one intra-group pair (1 -> 2) must agree with iperf3 (-t 3) on the
# same links within +-25%. Then `run` with clusters: auto and no probe_file must find the same two
# groups with its quick probe at start. Exit 77 (ctest SKIP) when namespaces are not permitted here.
set -euo pipefail
bin=$1 root=$2
export DELTACAST_NETNS_PREFIX=dcprb DELTACAST_NETNS_RATE=none
netns="$root/scripts/netns.sh"
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$netns" destroy || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v iperf3 >/dev/null || { echo "no iperf3 installed"; exit 77; }
command -v tc >/dev/null || { echo "no tc installed"; exit 77; }
[ "$(id -u)" -eq 0 ] || { echo "network namespaces need root"; exit 77; }
rc=0
"$netns" create 4 || rc=$?
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || fail "netns.sh create failed ($rc)"

group() { [ "$1" -le 2 ] && echo a || echo b; }
for k in 0 1 2 3 4; do
  ns="${DELTACAST_NETNS_PREFIX}$k"
  ip netns exec "$ns" tc qdisc replace dev eth0 root handle 1: htb default 10
  ip netns exec "$ns" tc class add dev eth0 parent 1: classid 1:10 htb rate 1gbit ceil 1gbit quantum 60000
  ip netns exec "$ns" tc class add dev eth0 parent 1: classid 1:20 htb rate 50mbit ceil 50mbit quantum 60000
  for j in 0 1 2 3 4; do
    [ "$(group "$j")" = "$(group "$k")" ] && continue
    ip netns exec "$ns" tc filter add dev eth0 protocol ip parent 1: prio 1 u32 \
      match ip dst "$("$netns" addr "$j")/32" flowid 1:20
  done
done

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
chmod 600 "$dir/secret"
{
  echo "producer: tcp://$("$netns" addr 0):29700"
  echo "transport: tcp"
  echo "secret_file: $dir/secret"
  echo "timeouts: {connect: 5s, heartbeat: 1s, peer: 10s}"
  echo "members:"
  for r in 1 2 3 4; do
    echo "  - {rank: $((r - 1)), host: $("$netns" addr "$r"), port: 29700, cluster: c$(group "$r")}"
  done
} >"$dir/cluster.yaml"

for r in 1 2 3 4; do
  ip netns exec "${DELTACAST_NETNS_PREFIX}$r" timeout 170 "$bin" probe --config "$dir/cluster.yaml" --rank $r \
    --size 5 >"$dir/member$r.txt" 2>&1 &
  pids+=($!)
done
start=$(date +%s)
ip netns exec "${DELTACAST_NETNS_PREFIX}0" timeout 160 "$bin" probe --config "$dir/cluster.yaml" --rank 0 --size 5 \
  --out "$dir/probe.json" >"$dir/rank0.txt" 2>&1 || { cat "$dir/rank0.txt"; fail "rank 0 exited non-zero"; }
cat "$dir/rank0.txt"
echo "probe took $(( $(date +%s) - start )) s"
for k in 0 1 2 3; do
  wait "${pids[$k]}" || { cat "$dir/member$((k + 1)).txt"; fail "member $((k + 1)) exited non-zero"; }
done
pids=()

iperf() {  # iperf FROM TO -> bits per second received
  local from=$1 to=$2
  ip netns exec "${DELTACAST_NETNS_PREFIX}$to" iperf3 -s -1 -D -B "$("$netns" addr "$to")" -p 5299
  sleep 0.5
  ip netns exec "${DELTACAST_NETNS_PREFIX}$from" timeout 30 iperf3 -c "$("$netns" addr "$to")" -p 5299 -t 3 -J \
    >"$dir/iperf-$from-$to.json"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"])' \
    "$dir/iperf-$from-$to.json"
}
inter=$(iperf 0 3)
intra=$(iperf 1 2)
python3 - "$dir/probe.json" "$inter" "$intra" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
inter_iperf, intra_iperf = float(sys.argv[2]) / 1e9, float(sys.argv[3]) / 1e9
bw = p["bandwidth_gbit"]
inter_probe, intra_probe = bw[0][3], bw[1][2]
print(f"inter-group 0->3: probe {inter_probe:.4f} Gbit/s, iperf3 {inter_iperf:.4f} Gbit/s, ratio {inter_probe / inter_iperf:.3f}")
print(f"intra-group 1->2: probe {intra_probe:.4f} Gbit/s, iperf3 {intra_iperf:.4f} Gbit/s, ratio {intra_probe / intra_iperf:.3f}")
ok = True
if p["clusters"] != [[0, 1, 2], [3, 4]]:
    print("FAIL: clusters", p["clusters"]); ok = False
for name, a, b in (("inter", inter_probe, inter_iperf), ("intra", intra_probe, intra_iperf)):
    if not 0.75 <= a / b <= 1.25:
        print(f"FAIL: {name}-group figure off by more than 25%"); ok = False
group = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b"}
crossings = p["recommended"]["crossings"]
print("recommended", p["recommended"]["topology"], "chunk", p["recommended"]["chunk_bytes"], "crossings", crossings)
for t in crossings:  # the boundary once per tree (+ producer -> root when the root is in group b)
    edges = t["crossings"]
    if not 1 <= len(edges) <= 2 or any(group[a] == group[b] for a, b in edges):
        print("FAIL: crossing plan", crossings); ok = False
sys.exit(0 if ok else 1)
PY
echo "OK: two clusters, probe within 25% of iperf3"

# clusters: auto with no probe_file: `run` probes quickly at start (O(N) flows), finds the same two
# groups, roots every tree in the producer's, and commits every step on every member.
for r in 1 2 3 4; do
  ip netns exec "${DELTACAST_NETNS_PREFIX}$r" timeout 170 "$bin" run --config "$dir/cluster.yaml" --rank $r \
    --size 5 --set clusters=auto --set trainer.params=2M --set trainer.steps=2 >"$dir/run$r.txt" 2>&1 &
  pids+=($!)
done
ip netns exec "${DELTACAST_NETNS_PREFIX}0" timeout 160 "$bin" run --config "$dir/cluster.yaml" --rank 0 --size 5 \
  --set clusters=auto --set trainer.params=2M --set trainer.steps=2 --set output.dir="$dir/out" \
  --set output.metrics_file="$dir/report.json" >"$dir/run0.txt" 2>&1 || {
  cat "$dir/run0.txt"
  for r in 1 2 3 4; do wait "${pids[$((r - 1))]}" || true; echo "--- rank $r:"; cat "$dir/run$r.txt"; done
  pids=()
  fail "run rank 0 exited non-zero"
}
for k in 0 1 2 3; do
  wait "${pids[$k]}" || { cat "$dir/run$((k + 1)).txt"; fail "run rank $((k + 1)) exited non-zero"; }
done
pids=()
grep "clusters from a quick probe (.* 5 of 5 ranks reached): {0,1,2} {3,4}" "$dir/run0.txt" \
  || { cat "$dir/run0.txt"; fail "the quick probe did not find {0,1,2} {3,4}"; }
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["ok"] is True and all(s["verified_receivers"] == 4 for s in r["steps"]), r' \
  "$dir/report.json" || fail "the run after a quick probe is not as expected"
echo "OK: run with clusters: auto probed quickly and found the two groups"
