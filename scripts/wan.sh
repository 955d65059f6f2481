#!/usr/bin/env bash
# Two-cluster WAN emulation in network namespaces: a trainer side and a rollout cluster joined by
# ONE shaped inter-cluster link with a real round-trip delay (docs/wan.md).
#
#   scripts/wan.sh create N [UPLINK] [INNER] [DELAY_MS]   producer dw0, receivers dw1..dwN
#   scripts/wan.sh destroy                                 stops the shim, removes every namespace
#   scripts/wan.sh exec IDX CMD...                         runs CMD inside dwIDX (IDX: 0..N, rt, sw)
#   scripts/wan.sh addr IDX                                prints dwIDX's address (10.201.0.(IDX+1))
#   scripts/wan.sh check [SECONDS]                         measures RTT and throughput (iperf3 -t SECONDS)
#   scripts/wan.sh rtt FROM TO                             one RTT measurement as a JSON line
#   scripts/wan.sh list | shim-log
#
# Defaults: UPLINK 100mbit, INNER 1gbit ("none": unshaped), DELAY_MS 25 (one way, so 50 ms RTT).
#
#   dw0 (producer)           dwrt (router)                           dwsw (rollout switch)       dw1..dwN
#   eth0 ==veth== ta  <-- dc_delay_shim: DELAY_MS each way -->  rb ==veth== wan [br0] vK ==veth== eth0
#   tbf UPLINK                                                       tbf UPLINK (towards dw0)   tbf INNER
#
# Everything is one subnet, 10.201.0.0/24: the router namespace has no address and no IP
# forwarding; dc_delay_shim (bench/netns/delay_shim.cpp) copies every frame between ta and rb after
# DELAY_MS, so ARP crosses it too and the inter-cluster path is the only one with a delay. The
# inter-cluster link is shaped in both directions: the producer's egress (tbf on dw0's eth0) and
# the rollout cluster's frames towards the producer (tbf on the bridge port "wan", before the
# shim). Inside the rollout cluster each receiver's egress is INNER. tbf: burst 128kb, latency
# 2 x DELAY_MS + 50 ms (its queue must hold a round trip of data or a long-RTT TCP flow loses
# packets in it). Offloads are off on every veth end (the shim must see MTU-sized frames; TSO/GSO
# super-packets would also let tbf burst past its rate). IPv6 is off in every namespace (no
# neighbour discovery noise through the shim). TCP buffers may grow to 32 MiB in the nodes
# (a namespace's default 4 MiB caps one flow at ~450 Mbit/s at 50 ms RTT).
#
# Environment: DELTACAST_WAN_PREFIX (default "dw"; namespaces PREFIX0..N, PREFIXrt, PREFIXsw),
# DELTACAST_WAN_SHIM (the dc_delay_shim binary; default: the first of build-wan/, build/,
# build-release/ .../bench/netns/dc_delay_shim), DELTACAST_WAN_STATE (default
# /tmp/deltacast-wan-PREFIX: the shim's log and the create parameters), DELTACAST_WAN_RT
# (SCHED_FIFO priority of the shim's threads, default 10; 0: normal scheduling. Real-time so that
# builds sharing the cores do not add their time slices to the delay).
# create is idempotent (an existing set is destroyed first) and cleans up after itself on failure;
# destroy never fails on missing parts. destroy ends every process left inside these namespaces
# (the shim, a forgotten iperf3 -D), so no namespace outlives it. Needs root; exit 77 when
# `ip netns add` is not permitted here.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${DELTACAST_WAN_PREFIX:-dw}"
STATE="${DELTACAST_WAN_STATE:-/tmp/deltacast-wan-${PREFIX}}"
ROUTER_NS="${PREFIX}rt"
BRIDGE_NS="${PREFIX}sw"
SUBNET="10.201.0"

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

node_ns() { echo "${PREFIX}$1"; }
node_addr() { echo "${SUBNET}.$(($1 + 1))"; }

our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}([0-9]+|rt|sw)\$" || true
}

offloads_off() {  # ns ifname
  ip netns exec "$1" ethtool -K "$2" tx off tso off gso off gro off sg off >/dev/null 2>&1 || true
}

find_shim() {
  local c
  for c in "${DELTACAST_WAN_SHIM:-}" "$ROOT/build-wan/bench/netns/dc_delay_shim" "$ROOT/build/bench/netns/dc_delay_shim" \
    "$ROOT/build-release/bench/netns/dc_delay_shim"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  echo "wan.sh: no dc_delay_shim binary: build it (cmake --build build-wan --target dc_delay_shim) or set DELTACAST_WAN_SHIM" >&2
  return 1
}

# Ends the processes inside one of our namespaces: TERM, up to 3 s, then KILL.
end_processes_in() {  # ns
  local pids p i
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  [ -n "$pids" ] || return 0
  for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
  for ((i = 0; i < 30; i++)); do
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    sleep 0.1
  done
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
}

destroy() {
  local ns
  # The router first: the shim prints its counters on SIGTERM into the log.
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ROUTER_NS"; then
    end_processes_in "$ROUTER_NS"
  fi
  for ns in $(our_namespaces); do
    end_processes_in "$ns"
    ip netns del "$ns" 2>/dev/null || true
  done
}

tbf_latency_ms() {  # delay_ms -> 2 x delay + 50
  awk -v d="$1" 'BEGIN { printf "%d", 2 * d + 50 + 0.5 }'
}

shape() {  # ns dev rate latency_ms
  [ "$3" = "none" ] && return 0
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst 128kb latency "$4ms"
}

no_ipv6() {  # ns
  ip netns exec "$1" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
    >/dev/null 2>&1 || true
}

# TCP buffers as on a WAN-tuned host (32 MiB max): a namespace starts with tcp_wmem's 4 MiB,
# which caps one flow at ~4 MiB per RTT (~450 Mbit/s at 50 ms RTT, measured).
wan_tcp_buffers() {  # ns
  ip netns exec "$1" sysctl -q -w net.ipv4.tcp_wmem="4096 16384 33554432" \
    net.ipv4.tcp_rmem="4096 131072 33554432" >/dev/null 2>&1 || true
}

create() {
  local n="$1" uplink="${2:-100mbit}" inner="${3:-1gbit}" delay="${4:-25}" k ns shim lat i
  [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || { echo "wan.sh: N must be 1..250, got '$n'" >&2; exit 2; }
  [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "wan.sh: DELAY_MS must be a number >= 0, got '$delay'" >&2; exit 2; }
  if ! ip netns add "${PREFIX}probe" 2>/dev/null; then
    echo "wan.sh: 'ip netns add' is not permitted here" >&2
    exit 77
  fi
  ip netns del "${PREFIX}probe"
  shim="$(find_shim)"
  destroy
  mkdir -p "$STATE"
  rm -f "$STATE/shim.log" "$STATE/params"
  trap 'echo "wan.sh: create failed, cleaning up" >&2; destroy' ERR
  lat="$(tbf_latency_ms "$delay")"

  # The router: two veth ends, no address, the shim between them.
  ip netns add "$ROUTER_NS"
  no_ipv6 "$ROUTER_NS"
  ip -n "$ROUTER_NS" link set lo up
  # The rollout cluster's bridge.
  ip netns add "$BRIDGE_NS"
  no_ipv6 "$BRIDGE_NS"
  ip -n "$BRIDGE_NS" link set lo up
  ip -n "$BRIDGE_NS" link add br0 type bridge
  ip -n "$BRIDGE_NS" link set br0 up
  ip link add rb netns "$ROUTER_NS" type veth peer name wan netns "$BRIDGE_NS"
  ip -n "$BRIDGE_NS" link set wan master br0
  ip -n "$BRIDGE_NS" link set wan up
  offloads_off "$BRIDGE_NS" wan
  shape "$BRIDGE_NS" wan "$uplink" "$lat"  # the return direction of the inter-cluster link
  ip -n "$ROUTER_NS" link set rb up
  offloads_off "$ROUTER_NS" rb

  for ((k = 0; k <= n; k++)); do
    ns="$(node_ns "$k")"
    ip netns add "$ns"
    no_ipv6 "$ns"
    wan_tcp_buffers "$ns"
    ip -n "$ns" link set lo up
    if ((k == 0)); then  # the producer: its veth reaches the router's ta directly
      ip link add ta netns "$ROUTER_NS" type veth peer name eth0 netns "$ns"
      ip -n "$ROUTER_NS" link set ta up
      offloads_off "$ROUTER_NS" ta
    else
      ip link add "v$k" netns "$BRIDGE_NS" type veth peer name eth0 netns "$ns"
      ip -n "$BRIDGE_NS" link set "v$k" master br0
      ip -n "$BRIDGE_NS" link set "v$k" up
      offloads_off "$BRIDGE_NS" "v$k"
    fi
    ip -n "$ns" addr add "$(node_addr "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
    offloads_off "$ns" eth0
    if ((k == 0)); then
      shape "$ns" eth0 "$uplink" "$lat"
    else
      shape "$ns" eth0 "$inner" 50
    fi
  done

  # The shim: detached (its own session, no inherited descriptors), so that neither the caller's
  # terminal nor a pipe reading this script's output waits for it; destroy ends it.
  ip netns exec "$ROUTER_NS" setsid "$shim" --delay-ms "$delay" --rt-priority "${DELTACAST_WAN_RT:-10}" ta rb \
    </dev/null >"$STATE/shim.log" 2>&1 &
  for ((i = 0; i < 50; i++)); do
    grep -q "ready" "$STATE/shim.log" 2>/dev/null && break
    if [ -z "$(ip netns pids "$ROUTER_NS" 2>/dev/null)" ] && ((i > 2)); then break; fi
    sleep 0.1
  done
  if ! grep -q "ready" "$STATE/shim.log" 2>/dev/null; then
    echo "wan.sh: dc_delay_shim did not start:" >&2
    cat "$STATE/shim.log" >&2 || true
    false
  fi
  trap - ERR
  printf 'N=%s\nUPLINK=%s\nINNER=%s\nDELAY_MS=%s\n' "$n" "$uplink" "$inner" "$delay" >"$STATE/params"
  echo "wan.sh: producer ${PREFIX}0 ($(node_addr 0)), receivers ${PREFIX}1..${PREFIX}$n on ${SUBNET}.0/24;" \
    "inter-cluster link $uplink each way with $delay ms one-way delay (dc_delay_shim in $ROUTER_NS), inner $inner"
}

# A UDP echo in Python (iputils-ping is often missing): `server ADDR PORT` answers until 10 s of
# silence; `client ADDR PORT COUNT` warms the path up (ARP crosses the shim too), then prints
# {"min_ms", "median_ms", "max_ms", "lost", "count"} for COUNT probes 20 ms apart.
ECHO_PY='
import json, socket, statistics, struct, sys, time
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if mode == "server":
    s.bind((addr, port)); s.settimeout(10)
    try:
        while True:
            data, peer = s.recvfrom(2048)
            s.sendto(data, peer)
    except socket.timeout:
        sys.exit(0)
count = int(sys.argv[4]); s.settimeout(2)
def probe(seq):
    t0 = time.monotonic(); s.sendto(struct.pack("!Id", seq, t0), (addr, port))
    while True:
        try:
            data, _ = s.recvfrom(2048)
        except socket.timeout:
            return None
        if struct.unpack("!Id", data[:12])[0] == seq:
            return (time.monotonic() - t0) * 1e3
warm = None
for i in range(10):
    warm = probe(1000000 + i)
    if warm is not None: break
if warm is None:
    print(json.dumps({"error": "no echo"})); sys.exit(1)
rtts = []
for i in range(count):
    r = probe(i)
    if r is not None: rtts.append(r)
    time.sleep(0.02)
print(json.dumps({"min_ms": min(rtts), "median_ms": statistics.median(rtts), "max_ms": max(rtts),
                  "lost": count - len(rtts), "count": count, "tool": "udp-echo"}))
'

rtt() {  # from to -> one JSON line
  local from=$1 to=$2 out
  if command -v ping >/dev/null 2>&1; then
    out=$(ip netns exec "$(node_ns "$from")" timeout 20 ping -c 3 -i 0.2 -q "$(node_addr "$to")" >/dev/null 2>&1 || true
      ip netns exec "$(node_ns "$from")" timeout 30 ping -c 20 -i 0.05 "$(node_addr "$to")" 2>&1 || true)
    python3 -c '
import json, re, statistics, sys
r = [float(x) for x in re.findall(r"time=([0-9.]+) ms", sys.stdin.read())]
print(json.dumps({"min_ms": min(r), "median_ms": statistics.median(r), "max_ms": max(r), "lost": 20 - len(r),
                  "count": 20, "tool": "ping"}) if r else json.dumps({"error": "no ping reply"}))' <<<"$out"
    return
  fi
  ip netns exec "$(node_ns "$to")" timeout 60 python3 -c "$ECHO_PY" server "$(node_addr "$to")" 5399 &
  local server=$!
  sleep 0.5
  ip netns exec "$(node_ns "$from")" timeout 40 python3 -c "$ECHO_PY" client "$(node_addr "$to")" 5399 30 \
    || echo '{"error": "udp echo client failed"}'
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}

throughput() {  # from to seconds -> bits per second (received), or 0
  local from=$1 to=$2 t=$3 json
  ip netns exec "$(node_ns "$to")" timeout $((t + 30)) iperf3 -s -1 -B "$(node_addr "$to")" -p 5398 >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  json=$(ip netns exec "$(node_ns "$from")" timeout $((t + 20)) iperf3 -c "$(node_addr "$to")" -p 5398 -t "$t" -O 1 -J \
    2>/dev/null || true)
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  python3 -c 'import json,sys
try: print(json.loads(sys.stdin.read())["end"]["sum_received"]["bits_per_second"])
except Exception: print(0)' <<<"$json"
}

rate_bits() {  # tc rate -> bits per second (0 for none)
  python3 -c '
import re, sys
m = re.fullmatch(r"([0-9.]+)([kmg]?)(bit|bps)?", sys.argv[1].lower())
if not m: print(0); sys.exit()
v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
print(v * 8 if m.group(3) == "bps" else v)' "$1"
}

check() {
  local seconds="${1:-5}" n uplink inner delay a b c d
  [ -f "$STATE/params" ] || { echo "wan.sh: no emulation to check (run create first)" >&2; exit 1; }
  command -v iperf3 >/dev/null || { echo "wan.sh: iperf3 is not installed" >&2; exit 1; }
  # shellcheck disable=SC1091
  . "$STATE/params"
  n=$N uplink=$UPLINK inner=$INNER delay=$DELAY_MS
  a=$(rtt 0 1)
  b='{}'
  ((n >= 2)) && b=$(rtt 1 2)
  c=$(throughput 0 1 "$seconds")
  d=0
  ((n >= 2)) && d=$(throughput 1 2 "$seconds")
  python3 - "$delay" "$a" "$b" "$c" "$d" "$(rate_bits "$uplink")" "$(rate_bits "$inner")" "$uplink" "$inner" \
    "${CHECK_JSON:-}" <<'PY'
import json, sys
delay, a, b = float(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
up_bps, in_bps = float(sys.argv[4]), float(sys.argv[5])
uplink, inner = float(sys.argv[6]), float(sys.argv[7])
want = 2 * delay
tol = 2 + 0.1 * want
def fmt(r):
    if "median_ms" not in r: return r.get("error", "not measured")
    return f"min {r['min_ms']:.2f} / median {r['median_ms']:.2f} / max {r['max_ms']:.2f} ms ({r['tool']}, {r['count']} probes, {r['lost']} lost)"
def rate(bps, ref):
    s = f"{bps / 1e6:.1f} Mbit/s"
    return s + (f" ({bps / ref:.2f}x the shaped rate)" if ref > 0 else " (unshaped)")
print(f"RTT producer <-> receiver 1 (inter-cluster): {fmt(a)}; asked {want:g} ms +- {tol:.1f} ms")
print(f"RTT receiver 1 <-> receiver 2 (rollout cluster): {fmt(b)}")
print(f"iperf3 producer -> receiver 1: {rate(up_bps, uplink)}")
print(f"iperf3 receiver 1 -> receiver 2: {rate(in_bps, inner)}")
ok = "median_ms" in a and abs(a["median_ms"] - want) <= tol
summary = {"delay_ms": delay, "rtt_asked_ms": want, "rtt_tolerance_ms": tol, "rtt_inter": a, "rtt_inner": b,
           "iperf_inter_bps": up_bps, "iperf_inner_bps": in_bps, "uplink_bps": uplink, "inner_bps": inner,
           "rtt_ok": ok}
print("wan-check: " + json.dumps(summary))
if len(sys.argv) > 10 and sys.argv[10]:
    with open(sys.argv[10], "a") as f: f.write(json.dumps(summary) + "\n")
if not ok:
    print("FAIL: the measured RTT is not within 2 ms + 10% of 2 x DELAY_MS"); sys.exit(1)
print("OK: RTT as asked")
PY
}

cmd="${1:-}"
shift || true
case "$cmd" in
  create) [ $# -ge 1 ] && [ $# -le 4 ] || usage; create "$@" ;;
  destroy) destroy ;;
  exec)
    [ $# -ge 2 ] || usage
    idx="$1"; shift
    exec ip netns exec "$(node_ns "$idx")" "$@" ;;
  addr) [ $# -eq 1 ] || usage; node_addr "$1" ;;
  list) our_namespaces ;;
  check) [ $# -le 1 ] || usage; check "$@" ;;
  rtt) [ $# -eq 2 ] || usage; rtt "$1" "$2" ;;
  shim-log) cat "$STATE/shim.log" ;;
  *) usage ;;
esac
