#!/usr/bin/env bash
# WAN emulation in network namespaces: a trainer side and a rollout side joined by shaped
# inter-cluster links with a real round-trip delay (docs/wan.md). Two layouts:
#
#   scripts/wan.sh create N [UPLINK] [INNER] [DELAY_MS]   producer dw0, receivers dw1..dwN
#   scripts/wan.sh destroy                                 stops the shims, removes every namespace
#   scripts/wan.sh exec IDX CMD...                         runs CMD inside dwIDX (IDX: 0..N, rt, sw, ts, rtK, swK)
#   scripts/wan.sh addr IDX                                prints dwIDX's address (10.201.0.(IDX+1))
#   scripts/wan.sh check [SECONDS]                         measures RTT and throughput of every link (iperf3 -t SECONDS)
#   scripts/wan.sh rtt FROM TO                             one RTT measurement as a JSON line
#   scripts/wan.sh list | shim-log
#
# Defaults: UPLINK 100mbit, INNER 1gbit ("none": unshaped), DELAY_MS 25 (one way, so 50 ms RTT).
#
# SHARED (the default, DELTACAST_WAN_CLUSTERS unset or 1): ONE rollout cluster behind ONE link.
#
#   dw0 (producer)           dwrt (router)                           dwsw (rollout switch)       dw1..dwN
#   eth0 ==veth== ta  <-- dc_delay_shim: DELAY_MS each way -->  rb ==veth== wan [br0] vK ==veth== eth0
#   tbf UPLINK                                                       tbf UPLINK (towards dw0)   tbf INNER
#
# SPLIT (DELTACAST_WAN_CLUSTERS=C, C >= 2): C rollout clusters, each with its OWN link to the
# trainer side (a rented fleet: one site per cluster). Members are split evenly in rank order:
# cluster k (1..C) holds receivers (k-1)*N/C+1 .. k*N/C (integer division; C=2: 1..N/2 and
# N/2+1..N). The clusters reach each other only through the trainer side's switch, so traffic
# between two clusters crosses both of their links (2 x DELAY_MS each way).
#
#   dw0 (producer)      dwts (trainer switch)        dwrtK (router K)               dwswK (cluster K)     members of K
#   eth0 ==veth== p0 [br0] tK ==veth== ta <-- dc_delay_shim K --> rb ==veth== wan [br0] vR ==veth== eth0
#   tbf INNER               tbf UPLINK_K (towards K)                          tbf UPLINK_K (towards dwts) tbf INNER
#
# DELTACAST_WAN_CLUSTER_DELAYS ("25,40": one-way ms per cluster) and DELTACAST_WAN_CLUSTER_UPLINKS
# ("100mbit,50mbit") give the links different settings; each defaults to DELAY_MS / UPLINK.
#
# Everything is one subnet, 10.201.0.0/24: the router namespaces have no address and no IP
# forwarding; dc_delay_shim (bench/netns/delay_shim.cpp) copies every frame between ta and rb after
# DELAY_MS, so ARP crosses it too and the inter-cluster paths are the only ones with a delay. An
# inter-cluster link is shaped in both directions, before its shim: towards the cluster (SHARED:
# tbf on dw0's eth0; SPLIT: tbf on the trainer switch's port tK) and towards the trainer (tbf on
# the cluster's bridge port "wan"). Inside a cluster each receiver's egress is INNER (SPLIT: the
# producer's too). tbf: burst 128kb, latency 2 x DELAY_MS + 50 ms (SPLIT: 2 x (this link's delay
# + the longest link's delay) + 50 ms, the round trip of a flow between two clusters): its queue
# must hold a round trip of data or a long-RTT TCP flow loses packets in it. Offloads are off on
# every veth end (the shim must see MTU-sized frames; TSO/GSO super-packets would also let tbf
# burst past its rate). IPv6 is off in every namespace (no neighbour discovery noise through the
# shim). TCP buffers may grow to 32 MiB in the nodes (a namespace's default 4 MiB caps one flow at
# ~450 Mbit/s at 50 ms RTT).
#
# Environment: DELTACAST_WAN_PREFIX (default "dw"; namespaces PREFIX0..N, PREFIXrt, PREFIXsw;
# SPLIT: PREFIXts, PREFIXrt1..C, PREFIXsw1..C), DELTACAST_WAN_CLUSTERS (create only: 1 = SHARED,
# the default), DELTACAST_WAN_SHIM (the dc_delay_shim binary; default: the first of build-wan/,
# build/, build-release/ .../bench/netns/dc_delay_shim), DELTACAST_WAN_STATE (default
# /tmp/deltacast-wan-PREFIX: the shims' logs and the create parameters), DELTACAST_WAN_RT
# (SCHED_FIFO priority of the shims' threads, default 10; 0: normal scheduling. Real-time so that
# builds sharing the cores do not add their time slices to the delay).
# create is idempotent (an existing set of either layout is destroyed first) and cleans up after
# itself on failure; destroy never fails on missing parts and removes either layout. destroy ends
# every process left inside these namespaces (the shims, a forgotten iperf3 -D), so no namespace
# outlives it. Needs root; exit 77 when `ip netns add` is not permitted here.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${DELTACAST_WAN_PREFIX:-dw}"
STATE="${DELTACAST_WAN_STATE:-/tmp/deltacast-wan-${PREFIX}}"
ROUTER_NS="${PREFIX}rt"
BRIDGE_NS="${PREFIX}sw"
SUBNET="10.201.0"

usage() {
  sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

node_ns() { echo "${PREFIX}$1"; }
node_addr() { echo "${SUBNET}.$(($1 + 1))"; }

our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}([0-9]+|rt[0-9]*|sw[0-9]*|ts)\$" || true
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
  # The routers first (SHARED: PREFIXrt; SPLIT: PREFIXrt1..C): a shim prints its counters on
  # SIGTERM into its log.
  for ns in $(our_namespaces | grep -E "^${ROUTER_NS}[0-9]*\$" || true); do
    end_processes_in "$ns"
  done
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
  local n="$1" clusters="${DELTACAST_WAN_CLUSTERS:-1}"
  [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || { echo "wan.sh: N must be 1..250, got '$n'" >&2; exit 2; }
  if ! [[ "$clusters" =~ ^[0-9]+$ ]] || ((clusters < 1 || clusters > n || clusters > 32)); then
    echo "wan.sh: DELTACAST_WAN_CLUSTERS must be 1..min(N, 32), got '$clusters'" >&2
    exit 2
  fi
  if ((clusters == 1)); then create_shared "$@"; else create_split "$clusters" "$@"; fi
}

check_delay() {  # value
  [[ "$1" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "wan.sh: a delay must be a number of ms >= 0, got '$1'" >&2; exit 2; }
}

# Root check, shim lookup, the old set (either layout) destroyed, the state directory emptied.
create_prepare() {
  if ! ip netns add "${PREFIX}probe" 2>/dev/null; then
    echo "wan.sh: 'ip netns add' is not permitted here" >&2
    exit 77
  fi
  ip netns del "${PREFIX}probe"
  SHIM="$(find_shim)"
  destroy
  mkdir -p "$STATE"
  rm -f "$STATE"/shim*.log "$STATE/params"
}

# Starts dc_delay_shim in a router namespace, detached (its own session, no inherited descriptors),
# so that neither the caller's terminal nor a pipe reading this script's output waits for it;
# destroy ends it. Fails (after printing its log) unless it says "ready" within 5 s.
start_shim() {  # router_ns delay_ms log
  local i
  ip netns exec "$1" setsid "$SHIM" --delay-ms "$2" --rt-priority "${DELTACAST_WAN_RT:-10}" ta rb \
    </dev/null >"$3" 2>&1 &
  for ((i = 0; i < 50; i++)); do
    grep -q "ready" "$3" 2>/dev/null && break
    if [ -z "$(ip netns pids "$1" 2>/dev/null)" ] && ((i > 2)); then break; fi
    sleep 0.1
  done
  if ! grep -q "ready" "$3" 2>/dev/null; then
    echo "wan.sh: dc_delay_shim in $1 did not start:" >&2
    cat "$3" >&2 || true
    return 1
  fi
}

# A node namespace: loopback up, IPv6 off, WAN-sized TCP buffers.
add_node_ns() {  # ns
  ip netns add "$1"
  no_ipv6 "$1"
  wan_tcp_buffers "$1"
  ip -n "$1" link set lo up
}

# A switch namespace with bridge br0.
add_switch_ns() {  # ns
  ip netns add "$1"
  no_ipv6 "$1"
  ip -n "$1" link set lo up
  ip -n "$1" link add br0 type bridge
  ip -n "$1" link set br0 up
}

# A veth pair from a bridge port (in switch namespace sw, enslaved to br0) to dev in namespace ns.
bridge_port() {  # sw port ns dev
  ip link add "$2" netns "$1" type veth peer name "$4" netns "$3"
  ip -n "$1" link set "$2" master br0
  ip -n "$1" link set "$2" up
  offloads_off "$1" "$2"
}

# Node k's address on its eth0, up, offloads off.
node_up() {  # k
  local ns
  ns="$(node_ns "$1")"
  ip -n "$ns" addr add "$(node_addr "$1")/24" dev eth0
  ip -n "$ns" link set eth0 up
  offloads_off "$ns" eth0
}

# The cluster (1..C) of receiver r (1..N): cluster k holds (k-1)*N/C+1 .. k*N/C.
cluster_first() { echo $((($1 - 1) * $2 / $3 + 1)); }  # k n c
cluster_last() { echo $(($1 * $2 / $3)); }              # k n c

# The k-th (1-based) element of a comma list, or the default when the list is empty.
nth_or() {  # list k default
  local -a a
  [ -n "$1" ] || { echo "$3"; return; }
  IFS=, read -r -a a <<<"$1"
  echo "${a[$(($2 - 1))]:-$3}"
}

create_split() {
  local c="$1" n="$2" uplink="${3:-100mbit}" inner="${4:-1gbit}" delay="${5:-25}" k r ns lat dk uk first last
  local dmax=0 delays=() uplinks=() firsts=() lasts=()
  check_delay "$delay"
  for ((k = 1; k <= c; k++)); do
    dk="$(nth_or "${DELTACAST_WAN_CLUSTER_DELAYS:-}" "$k" "$delay")"
    uk="$(nth_or "${DELTACAST_WAN_CLUSTER_UPLINKS:-}" "$k" "$uplink")"
    check_delay "$dk"
    delays+=("$dk") uplinks+=("$uk")
    firsts+=("$(cluster_first "$k" "$n" "$c")") lasts+=("$(cluster_last "$k" "$n" "$c")")
    dmax=$(awk -v a="$dmax" -v b="$dk" 'BEGIN { print (b > a ? b : a) }')
  done
  create_prepare
  trap 'echo "wan.sh: create failed, cleaning up" >&2; destroy' ERR

  # The trainer side: its switch and the producer on it.
  add_switch_ns "${PREFIX}ts"
  add_node_ns "$(node_ns 0)"
  bridge_port "${PREFIX}ts" p0 "$(node_ns 0)" eth0
  node_up 0
  shape "$(node_ns 0)" eth0 "$inner" 50

  for ((k = 1; k <= c; k++)); do
    dk="${delays[k - 1]}" uk="${uplinks[k - 1]}" first="${firsts[k - 1]}" last="${lasts[k - 1]}"
    lat="$(awk -v d="$dk" -v m="$dmax" 'BEGIN { printf "%d", 2 * (d + m) + 50 + 0.5 }')"
    # Router k: ta towards the trainer switch, rb towards cluster k's switch, the shim between.
    ip netns add "${ROUTER_NS}$k"
    no_ipv6 "${ROUTER_NS}$k"
    ip -n "${ROUTER_NS}$k" link set lo up
    bridge_port "${PREFIX}ts" "t$k" "${ROUTER_NS}$k" ta
    shape "${PREFIX}ts" "t$k" "$uk" "$lat"  # link k towards cluster k
    add_switch_ns "${BRIDGE_NS}$k"
    bridge_port "${BRIDGE_NS}$k" wan "${ROUTER_NS}$k" rb
    shape "${BRIDGE_NS}$k" wan "$uk" "$lat"  # link k towards the trainer side
    ip -n "${ROUTER_NS}$k" link set ta up
    ip -n "${ROUTER_NS}$k" link set rb up
    offloads_off "${ROUTER_NS}$k" ta
    offloads_off "${ROUTER_NS}$k" rb
    for ((r = first; r <= last; r++)); do
      ns="$(node_ns "$r")"
      add_node_ns "$ns"
      bridge_port "${BRIDGE_NS}$k" "v$r" "$ns" eth0
      node_up "$r"
      shape "$ns" eth0 "$inner" 50
    done
    start_shim "${ROUTER_NS}$k" "$dk" "$STATE/shim$k.log"
  done
  trap - ERR
  printf 'N=%s\nUPLINK=%s\nINNER=%s\nDELAY_MS=%s\nCLUSTERS=%s\nDELAYS="%s"\nUPLINKS="%s"\nFIRSTS="%s"\nLASTS="%s"\n' \
    "$n" "$uplink" "$inner" "$delay" "$c" "${delays[*]}" "${uplinks[*]}" "${firsts[*]}" "${lasts[*]}" >"$STATE/params"
  echo "wan.sh: producer ${PREFIX}0 ($(node_addr 0)) on the trainer switch ${PREFIX}ts; $c rollout clusters on" \
    "${SUBNET}.0/24, each behind its own link (shim in ${ROUTER_NS}K, switch ${BRIDGE_NS}K), inner $inner:"
  for ((k = 1; k <= c; k++)); do
    echo "wan.sh:   cluster $k: receivers ${PREFIX}${firsts[k - 1]}..${PREFIX}${lasts[k - 1]}, link ${uplinks[k - 1]}" \
      "each way with ${delays[k - 1]} ms one-way delay"
  done
}

create_shared() {
  local n="$1" uplink="${2:-100mbit}" inner="${3:-1gbit}" delay="${4:-25}" k ns shim lat i
  [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "wan.sh: DELAY_MS must be a number >= 0, got '$delay'" >&2; exit 2; }
  create_prepare
  shim="$SHIM"
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

# Several flows at once, from node FROM to each node TO (so that links that share nothing show it):
# one bits-per-second figure per line, in the order of the TOs.
throughput_parallel() {  # from seconds to...
  local from=$1 t=$2 to dir i
  shift 2
  local -a servers=() clients=()
  dir=$(mktemp -d)
  for to in "$@"; do
    ip netns exec "$(node_ns "$to")" timeout $((t + 30)) iperf3 -s -1 -B "$(node_addr "$to")" -p 5398 >/dev/null 2>&1 &
    servers+=($!)
  done
  sleep 0.5
  for to in "$@"; do
    ip netns exec "$(node_ns "$from")" timeout $((t + 20)) iperf3 -c "$(node_addr "$to")" -p 5398 -t "$t" -O 1 -J \
      >"$dir/$to.json" 2>/dev/null &
    clients+=($!)
  done
  for i in "${clients[@]}"; do wait "$i" || true; done
  for i in "${servers[@]}"; do kill "$i" 2>/dev/null || true; wait "$i" 2>/dev/null || true; done
  for to in "$@"; do
    python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"])
except Exception: print(0)' "$dir/$to.json"
  done
  rm -rf "$dir"
}

# SPLIT: per link k (its cluster's first receiver f): RTT producer <-> f, iperf3 producer -> f
# (towards the cluster) and f -> producer (towards the trainer); then every link's downstream at
# once; between clusters 1 and 2 (their first receivers): RTT (asked: 2 x (d1 + d2)) and iperf3;
# inside cluster 1: RTT and iperf3 between its first two receivers.
# shellcheck disable=SC2153  # CLUSTERS, DELAYS, UPLINKS, FIRSTS, LASTS, INNER: from $STATE/params
check_split() {  # seconds
  local seconds=$1 dir k f rc=0
  local -a delays uplinks firsts
  read -r -a delays <<<"$DELAYS"
  read -r -a uplinks <<<"$UPLINKS"
  read -r -a firsts <<<"$FIRSTS"
  dir=$(mktemp -d)
  for ((k = 1; k <= CLUSTERS; k++)); do
    f=${firsts[k - 1]}
    rtt 0 "$f" | tail -1 >"$dir/rtt$k"
    throughput 0 "$f" "$seconds" >"$dir/down$k"
    throughput "$f" 0 "$seconds" >"$dir/up$k"
    rate_bits "${uplinks[k - 1]}" >"$dir/rate$k"
  done
  throughput_parallel 0 "$seconds" "${firsts[@]}" >"$dir/parallel"
  rtt "${firsts[0]}" "${firsts[1]}" | tail -1 >"$dir/rtt_cross"
  throughput "${firsts[0]}" "${firsts[1]}" "$seconds" >"$dir/cross"
  if ((firsts[1] - firsts[0] >= 2)); then
    rtt "${firsts[0]}" $((firsts[0] + 1)) | tail -1 >"$dir/rtt_inner"
    throughput "${firsts[0]}" $((firsts[0] + 1)) "$seconds" >"$dir/inner"
  else
    echo '{}' >"$dir/rtt_inner"
    echo 0 >"$dir/inner"
  fi
  rate_bits "$INNER" >"$dir/inner_rate"
  python3 - "$dir" "$CLUSTERS" "$DELAYS" "$UPLINKS" "$FIRSTS" "$LASTS" "$INNER" "${CHECK_JSON:-}" <<'PY' || rc=$?
import json, sys
d, c = sys.argv[1], int(sys.argv[2])
delays = [float(x) for x in sys.argv[3].split()]
uplinks, firsts, lasts = sys.argv[4].split(), [int(x) for x in sys.argv[5].split()], [int(x) for x in sys.argv[6].split()]
inner = sys.argv[7]
rd = lambda name: open(f"{d}/{name}").read().strip()
def fmt(r):
    if "median_ms" not in r: return r.get("error", "not measured")
    return f"min {r['min_ms']:.2f} / median {r['median_ms']:.2f} / max {r['max_ms']:.2f} ms ({r['tool']}, {r['count']} probes, {r['lost']} lost)"
def rate(bps, ref):
    s = f"{bps / 1e6:.1f} Mbit/s"
    return s + (f" ({bps / ref:.2f}x the shaped rate)" if ref > 0 else " (unshaped)")
def near(r, want):
    return "median_ms" in r and abs(r["median_ms"] - want) <= 2 + 0.1 * want
parallel = [float(x) for x in rd("parallel").split()]
links, ok = [], True
for k in range(1, c + 1):
    r, ref = json.loads(rd(f"rtt{k}")), float(rd(f"rate{k}"))
    down, up = float(rd(f"down{k}")), float(rd(f"up{k}"))
    want = 2 * delays[k - 1]
    good = near(r, want)
    ok = ok and good
    print(f"link {k} (receivers {firsts[k - 1]}..{lasts[k - 1]}, {uplinks[k - 1]}, {delays[k - 1]:g} ms one way): "
          f"RTT producer <-> receiver {firsts[k - 1]}: {fmt(r)}; asked {want:g} ms +- {2 + 0.1 * want:.1f} ms"
          f"{'' if good else ' FAIL'}")
    print(f"  iperf3 producer -> receiver {firsts[k - 1]}: {rate(down, ref)}; receiver {firsts[k - 1]} -> producer: "
          f"{rate(up, ref)}; with every link's downstream at once: {rate(parallel[k - 1], ref)}")
    links.append({"cluster": k, "receivers": [firsts[k - 1], lasts[k - 1]], "delay_ms": delays[k - 1],
                  "uplink_bps": ref, "rtt": r, "rtt_asked_ms": want, "rtt_ok": good, "iperf_down_bps": down,
                  "iperf_up_bps": up, "iperf_down_parallel_bps": parallel[k - 1]})
cross = json.loads(rd("rtt_cross"))
want_cross = 2 * (delays[0] + delays[1])
cross_ok = near(cross, want_cross)
ok = ok and cross_ok
cross_bps = float(rd("cross"))
print(f"between clusters 1 and 2 (receiver {firsts[0]} <-> receiver {firsts[1]}, through the trainer switch): "
      f"RTT {fmt(cross)}; asked {want_cross:g} ms +- {2 + 0.1 * want_cross:.1f} ms{'' if cross_ok else ' FAIL'}; "
      f"iperf3 {rate(cross_bps, min(float(rd('rate1')), float(rd('rate2'))))}")
ri, inner_bps, inner_ref = json.loads(rd("rtt_inner")), float(rd("inner")), float(rd("inner_rate"))
print(f"inside cluster 1 (receiver {firsts[0]} <-> receiver {firsts[0] + 1}): RTT {fmt(ri)}; iperf3 "
      f"{rate(inner_bps, inner_ref) if inner_bps else 'not measured'}")
summary = {"clusters": c, "links": links, "rtt_cross": cross, "rtt_cross_asked_ms": want_cross,
           "rtt_cross_ok": cross_ok, "iperf_cross_bps": cross_bps, "rtt_inner": ri, "iperf_inner_bps": inner_bps,
           "inner_bps": inner_ref, "rtt_ok": ok}
print("wan-check: " + json.dumps(summary))
if len(sys.argv) > 8 and sys.argv[8]:
    with open(sys.argv[8], "a") as f: f.write(json.dumps(summary) + "\n")
if not ok:
    print("FAIL: a measured RTT is not within 2 ms + 10% of what was asked"); sys.exit(1)
print("OK: every RTT as asked")
PY
  rm -rf "$dir"
  return $rc
}

check() {
  local seconds="${1:-5}" n uplink inner delay a b c d
  [ -f "$STATE/params" ] || { echo "wan.sh: no emulation to check (run create first)" >&2; exit 1; }
  command -v iperf3 >/dev/null || { echo "wan.sh: iperf3 is not installed" >&2; exit 1; }
  CLUSTERS=1
  # shellcheck disable=SC1091
  . "$STATE/params"
  if ((CLUSTERS > 1)); then
    check_split "$seconds"
    return
  fi
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
  shim-log)
    for f in "$STATE"/shim*.log; do
      [ -f "$f" ] || continue
      [ "$f" = "$STATE/shim.log" ] || echo "== $(basename "$f")"
      cat "$f"
    done ;;
  *) usage ;;
esac
