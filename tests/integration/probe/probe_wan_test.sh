#!/usr/bin/env bash
# probe_wan_test.sh DELTACAST DELAY_SHIM REPO_ROOT
# `deltacast probe` against links that differ in latency AND bandwidth: scripts/wan.sh's SPLIT
# layout (real delay from dc_delay_shim), the producer dwp0 on the trainer side, and two rollout
# clusters of two members, each behind its own link: cluster 1 (dwp1, dwp2) 10 ms one way at
# 100 Mbit/s, cluster 2 (dwp3, dwp4) 20 ms at 50 Mbit/s, 200 Mbit/s inside each cluster.
# The probe's figures must agree with the tools measured on the same links afterwards:
#   - round trips (`wan.sh rtt`: ping, or a UDP echo without it; median) within +-25% for the four kinds of path: producer ->
#     cluster 1 (20 ms), producer -> cluster 2 (40 ms), cluster 1 -> cluster 2 (60 ms: both links),
#     and inside a cluster (< 2 ms, both);
#   - bandwidth (iperf3 -t 3) within +-25% in six cells: producer -> each cluster, each cluster ->
#     the producer, cluster 1 -> cluster 2, and inside each cluster;
#   - the clusters it finds: {1,2} and {3,4} apart (by round trip: the bandwidth gaps are 2x only).
# Exit 77 (ctest SKIP) when namespaces, iperf3 or tc are not available here.
set -euo pipefail
bin=$1 shim=$2 root=$3
export DELTACAST_WAN_PREFIX=dwp DELTACAST_WAN_SHIM="$shim" DELTACAST_WAN_CLUSTERS=2
export DELTACAST_WAN_CLUSTER_DELAYS=10,20 DELTACAST_WAN_CLUSTER_UPLINKS=100mbit,50mbit
dir=$(mktemp -d)
export DELTACAST_WAN_STATE="$dir/wan"
wan="$root/scripts/wan.sh"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$wan" destroy || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
for tool in iperf3 tc; do command -v $tool >/dev/null || { echo "no $tool installed"; exit 77; }; done
[ "$(id -u)" -eq 0 ] || { echo "network namespaces need root"; exit 77; }

rc=0
"$wan" create 4 100mbit 200mbit 10 || rc=$?
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || fail "wan.sh create failed ($rc)"

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
chmod 600 "$dir/secret"
{
  echo "producer: tcp://$("$wan" addr 0):29720"
  echo "transport: tcp"
  echo "secret_file: $dir/secret"
  echo "timeouts: {connect: 10s, heartbeat: 1s, peer: 20s}"
  echo "members:"
  for r in 1 2 3 4; do
    echo "  - {rank: $((r - 1)), host: $("$wan" addr "$r"), port: 29720, cluster: c$(((r + 1) / 2))}"
  done
} >"$dir/cluster.yaml"

for r in 1 2 3 4; do
  "$wan" exec "$r" timeout 280 "$bin" probe --config "$dir/cluster.yaml" --rank $r --size 5 >"$dir/member$r.txt" 2>&1 &
  pids+=($!)
done
start=$(date +%s)
"$wan" exec 0 timeout 270 "$bin" probe --config "$dir/cluster.yaml" --rank 0 --size 5 --out "$dir/probe.json" \
  >"$dir/rank0.txt" 2>&1 || { cat "$dir/rank0.txt"; fail "rank 0 exited non-zero"; }
cat "$dir/rank0.txt"
echo "probe took $(($(date +%s) - start)) s"
for k in 0 1 2 3; do
  wait "${pids[$k]}" || { cat "$dir/member$((k + 1)).txt"; fail "member $((k + 1)) exited non-zero"; }
done
pids=()

# The same links measured by ping and iperf3, after the probe (nothing else runs then).
for pair in "0 1" "0 3" "1 3" "1 2" "3 4"; do
  set -- $pair
  "$wan" rtt "$1" "$2" >"$dir/rtt-$1-$2.json"
done
for pair in "0 1" "0 3" "1 0" "3 0" "1 3" "1 2" "3 4"; do
  set -- $pair
  ip netns exec dwp"$2" timeout 40 iperf3 -s -1 -B "$("$wan" addr "$2")" -p 5297 >/dev/null 2>&1 &
  server=$!
  sleep 0.5
  ip netns exec dwp"$1" timeout 30 iperf3 -c "$("$wan" addr "$2")" -p 5297 -t 3 -O 1 -J >"$dir/iperf-$1-$2.json" ||
    fail "iperf3 $1 -> $2"
  wait "$server" || true
done

python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
p = json.load(open(f"{d}/probe.json"))
ok = True
def check(name, probe, tool, low=0.75, high=1.25):
    global ok
    ratio = probe / tool if tool else float("inf")
    good = low <= ratio <= high
    ok = ok and good
    print(f"{name:34s} probe {probe:10.3f}  tool {tool:10.3f}  ratio {ratio:5.2f}  {'ok' if good else 'FAIL'}")
print("round trips, ms (wan.sh rtt median):")
for a, b, what in ((0, 1, "producer -> cluster 1"), (0, 3, "producer -> cluster 2"), (1, 3, "cluster 1 -> cluster 2")):
    check(f"  {what} ({a}-{b})", p["latency_us"][a][b] / 1000, json.load(open(f"{d}/rtt-{a}-{b}.json"))["median_ms"])
for a, b in ((1, 2), (3, 4)):
    probe_ms = p["latency_us"][a][b] / 1000
    good = probe_ms < 2
    ok = ok and good
    print(f"  inside a cluster ({a}-{b})              probe {probe_ms:10.3f}  (want < 2 ms)  {'ok' if good else 'FAIL'}")
print("bandwidth, Mbit/s (iperf3 -t 3):")
for a, b, what in ((0, 1, "producer -> cluster 1"), (0, 3, "producer -> cluster 2"), (1, 0, "cluster 1 -> producer"),
                   (3, 0, "cluster 2 -> producer"), (1, 3, "cluster 1 -> cluster 2"), (1, 2, "inside cluster 1"),
                   (3, 4, "inside cluster 2")):
    tool = json.load(open(f"{d}/iperf-{a}-{b}.json"))["end"]["sum_received"]["bits_per_second"] / 1e6
    check(f"  {what} ({a}->{b})", p["bandwidth_gbit"][a][b] * 1000, tool)
clusters = [sorted(c) for c in p["clusters"]]
apart = [1, 2] in clusters and [3, 4] in clusters
print("clusters", p["clusters"], "ok" if apart else "FAIL: want {1,2} and {3,4} apart")
sys.exit(0 if ok and apart else 1)
PY
echo "OK: probe within 25% of ping and iperf3 on links of 20-60 ms and 50-200 Mbit/s"
