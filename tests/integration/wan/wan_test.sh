#!/usr/bin/env bash
# wan_test.sh DELTACAST DELAY_SHIM REPO_ROOT
# scripts/wan.sh with a producer and 2 receivers, a 50 Mbit/s inter-cluster link and 20 ms one-way
# delay (dc_delay_shim): the measured RTT producer <-> receiver must be 40 ms +- (2 ms + 10%), the
# producer -> receiver iperf3 throughput within +-25% of 50 Mbit/s, and a real `deltacast run`
# (one process per namespace, secret file, chain, 4M params, 2 steps) must end with every receiver
# verified. Exit 77 (ctest SKIP) when namespaces, iperf3 or tc are not available here.
set -euo pipefail
bin=$1 shim=$2 root=$3
export DELTACAST_WAN_PREFIX=dwt DELTACAST_WAN_SHIM="$shim"
dir=$(mktemp -d)
export DELTACAST_WAN_STATE="$dir/wan"
wan="$root/scripts/wan.sh"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$wan" destroy || true
  [ -f "$dir/wan/shim.log" ] && { echo "--- shim log"; cat "$dir/wan/shim.log"; }
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v iperf3 >/dev/null || { echo "no iperf3 installed"; exit 77; }
command -v tc >/dev/null || { echo "no tc installed"; exit 77; }
[ "$(id -u)" -eq 0 ] || { echo "network namespaces need root"; exit 77; }

rc=0
"$wan" create 2 50mbit 1gbit 20 || rc=$?
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || fail "wan.sh create failed ($rc)"

# 1. The link as asked: RTT (wan.sh check fails on its own when it is off) and throughput.
CHECK_JSON="$dir/check.json" timeout 90 "$wan" check 3 || fail "wan.sh check failed"
python3 - "$dir/check.json" <<'PY' || fail "the emulated link is not the one asked for"
import json, sys
c = json.loads(open(sys.argv[1]).read().splitlines()[-1])
rtt = c["rtt_inter"]["median_ms"]
ok = abs(rtt - 40) <= 2 + 0.1 * 40
print(f"RTT {rtt:.2f} ms (want 40 +- 6): {'ok' if ok else 'FAIL'}")
ratio = c["iperf_inter_bps"] / 50e6
print(f"producer -> receiver 1: {c['iperf_inter_bps'] / 1e6:.1f} Mbit/s = {ratio:.2f} x 50 Mbit/s (want 0.75..1.25): "
      f"{'ok' if 0.75 <= ratio <= 1.25 else 'FAIL'}")
inner = c["rtt_inner"].get("median_ms", 99)
print(f"RTT inside the rollout cluster {inner:.2f} ms (want < 5)")
sys.exit(0 if ok and 0.75 <= ratio <= 1.25 and inner < 5 else 1)
PY

# 2. A real run across it: producer in dwt0, receivers in dwt1 and dwt2, non-loopback addresses,
#    so the secure default requires the secret file.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
chmod 600 "$dir/secret"
cat >"$dir/cluster.yaml" <<YAML
producer: tcp://$("$wan" addr 0):29810
transport: tcp
secret_file: $dir/secret
topology: chain
producer_cluster: trainer
timeouts: {connect: 5s, heartbeat: 1s, peer: 20s, refit: 2m, join: 90s}
trainer: {kind: synth, params: 4M, steps: 2}
output: {dir: $dir/out}
members:
  - {rank: 0, host: $("$wan" addr 1), port: 29810, cluster: rollout}
  - {rank: 1, host: $("$wan" addr 2), port: 29810, cluster: rollout}
YAML
for r in 1 2; do
  "$wan" exec "$r" timeout 150 "$bin" run --config "$dir/cluster.yaml" --rank "$r" --size 3 >"$dir/rank$r.txt" 2>&1 &
  pids+=($!)
done
start=$(date +%s)
"$wan" exec 0 timeout 140 "$bin" run --config "$dir/cluster.yaml" --rank 0 --size 3 --report "$dir/report.json" \
  >"$dir/rank0.txt" 2>&1 || { cat "$dir/rank0.txt"; fail "the producer exited non-zero"; }
cat "$dir/rank0.txt" | grep -v '^\[' || true
echo "run took $(($(date +%s) - start)) s"
for k in 0 1; do
  wait "${pids[$k]}" || { cat "$dir/rank$((k + 1)).txt"; fail "receiver $((k + 1)) exited non-zero"; }
done
pids=()
python3 - "$dir/report.json" <<'PY' || fail "report.json"
import json, sys
r = json.load(open(sys.argv[1]))
ok = r["ok"] and r["receivers"] == 2 and r["full"]["verified_receivers"] == 2 and len(r["steps"]) == 2
ok = ok and all(s["committed"] and s["verified_receivers"] == 2 for s in r["steps"])
print(f"report: ok {r['ok']}, full {r['full']['seconds']:.3f} s, refits "
      + ", ".join(f"{s['refit_seconds']:.3f} s ({s['verified_receivers']}/{s['receivers']})" for s in r["steps"]))
sys.exit(0 if ok else 1)
PY
echo "OK: 40 ms RTT and 50 Mbit/s as asked; deltacast run verified on every receiver across the shaped, delayed link"
