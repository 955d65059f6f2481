#!/usr/bin/env bash
# Emulated cluster of network namespaces for relay-tree benchmarks and tests.
#
#   scripts/netns.sh create N        namespaces dc0..dcN (dc0: producer, dc1..dcN: receivers)
#   scripts/netns.sh destroy         removes every namespace this script made (same prefix)
#   scripts/netns.sh exec IDX CMD... runs CMD inside namespace dcIDX
#   scripts/netns.sh addr IDX        prints dcIDX's address (10.200.0.(IDX+1))
#   scripts/netns.sh list            prints the namespaces of this prefix
#
# Layout: a bridge "br0" lives in its own namespace (dcbr), so nothing is added to the host's
# namespace: no address, no route, no path to the host's eth0. Each node dcK has one veth "eth0"
# with 10.200.0.(K+1)/24 plus lo, and nothing else (no default route). Its peer "vK" sits on the
# bridge. Offloads are off on both ends (TSO/GSO super-packets would let tbf burst past its rate),
# and every node's egress is shaped by `tbf rate RATE burst 128kb latency 50ms`, so each node has
# a RATE uplink; its downlink is limited only by the senders' uplinks.
#
# Environment: DELTACAST_NETNS_PREFIX (default "dc": lets a test use its own set alongside a
# benchmark), DELTACAST_NETNS_RATE (default 1gbit; "none" leaves links unshaped),
# DELTACAST_NETNS_RATE_K (node K's egress instead, e.g. a 1gbit producer uplink among 10gbit nodes).
# create is idempotent (an existing set is destroyed first); destroy never fails on missing parts.
# Needs root (CAP_NET_ADMIN). Exit 77 when `ip netns add` is not permitted here.
set -euo pipefail

PREFIX="${DELTACAST_NETNS_PREFIX:-dc}"
RATE="${DELTACAST_NETNS_RATE:-1gbit}"
BRIDGE_NS="${PREFIX}br"
SUBNET="10.200.0"

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

node_ns() { echo "${PREFIX}$1"; }
node_addr() { echo "${SUBNET}.$(($1 + 1))"; }

# Namespaces that belong to this prefix: PREFIX followed by digits, and the bridge namespace.
our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}([0-9]+|br)\$" || true
}

offloads_off() {  # ns ifname
  ip netns exec "$1" ethtool -K "$2" tx off tso off gso off gro off sg off >/dev/null 2>&1 || true
}

destroy() {
  local ns
  for ns in $(our_namespaces); do
    ip netns del "$ns" 2>/dev/null || true
  done
}

create() {
  local n="$1" k ns veth rate_var rate
  [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || { echo "netns.sh: N must be 1..250, got '$n'" >&2; exit 2; }
  if ! ip netns add "${PREFIX}probe" 2>/dev/null; then
    echo "netns.sh: 'ip netns add' is not permitted here" >&2
    exit 77
  fi
  ip netns del "${PREFIX}probe"
  destroy
  # Any failure below leaves a half-built set: remove it rather than leave namespaces behind.
  trap 'echo "netns.sh: create failed, cleaning up" >&2; destroy' ERR
  ip netns add "$BRIDGE_NS"
  ip -n "$BRIDGE_NS" link add br0 type bridge
  ip -n "$BRIDGE_NS" link set br0 up
  ip -n "$BRIDGE_NS" link set lo up
  for ((k = 0; k <= n; k++)); do
    ns="$(node_ns "$k")"
    veth="v$k"
    ip netns add "$ns"
    ip link add "$veth" netns "$BRIDGE_NS" type veth peer name eth0 netns "$ns"
    ip -n "$BRIDGE_NS" link set "$veth" master br0
    ip -n "$BRIDGE_NS" link set "$veth" up
    offloads_off "$BRIDGE_NS" "$veth"
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(node_addr "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
    offloads_off "$ns" eth0
    rate_var="DELTACAST_NETNS_RATE_$k"
    rate="${!rate_var:-$RATE}"
    if [ "$rate" != "none" ]; then
      ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst 128kb latency 50ms
    fi
  done
  # Without STP (the default) bridge ports forward as soon as they are up: no settling wait.
  trap - ERR
  echo "netns.sh: ${PREFIX}0..${PREFIX}$n on ${SUBNET}.0/24 (bridge in $BRIDGE_NS, egress $RATE)"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  create) [ $# -eq 1 ] || usage; create "$1" ;;
  destroy) destroy ;;
  exec)
    [ $# -ge 2 ] || usage
    idx="$1"; shift
    exec ip netns exec "$(node_ns "$idx")" "$@" ;;
  addr) [ $# -eq 1 ] || usage; node_addr "$1" ;;
  list) our_namespaces ;;
  *) usage ;;
esac
