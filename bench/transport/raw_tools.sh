#!/usr/bin/env bash
# Raw fabric baselines on loopback, for comparison with `deltacast bench link`:
#   fi_pingpong over libfabric tcp (msg endpoint), tcp;ofi_rxm (rdm: what ofi+tcp uses) and shm
#   (rdm), and ucx_perftest tag_bw over UCX_TLS=tcp. All pinned to lo / 127.0.0.1.
# Usage:
#   bench/transport/raw_tools.sh [SIZE_BYTES=8388608] [ITERATIONS=100]   all tools, a table
#   bench/transport/raw_tools.sh --one TOOL [SIZE_BYTES] [ITERATIONS]     just "GB/s" for one
#     TOOL: fi-tcp-msg | fi-tcp-rdm | fi-shm | ucx-tag   (prints n/a when the tool fails)
# GB = 1e9 bytes. fi_pingpong prints "bytes #sent #ack total time MB/sec ...", MB/sec = 1e6 B/s; ucx_perftest's bandwidth is MiB/s.
set -uo pipefail
ONE=""
if [ "${1:-}" = "--one" ]; then ONE=$2; shift 2; fi
SIZE=${1:-8388608}
ITERS=${2:-100}
PORT=${RAW_TOOLS_PORT:-$((30000 + RANDOM % 20000))}

fi_pingpong_gbps() {  # provider endpoint-type -> GB/s
  local prov=$1 ep=$2 out
  timeout 120 fi_pingpong -p "$prov" -e "$ep" -d lo -S "$SIZE" -I "$ITERS" -B "$PORT" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  out=$(timeout 120 fi_pingpong -p "$prov" -e "$ep" -d lo -S "$SIZE" -I "$ITERS" -P "$PORT" 127.0.0.1 2>/dev/null | tail -1)
  wait "$server" 2>/dev/null
  PORT=$((PORT + 1))
  awk '$6 ~ /^[0-9.]+$/ { printf "%.3f\n", $6 / 1000; ok = 1 } END { if (!ok) print "n/a" }' <<<"$out"
}

ucx_perftest_gbps() {
  local out
  UCX_TLS=tcp,self UCX_NET_DEVICES=lo timeout 120 ucx_perftest -p "$PORT" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  out=$(UCX_TLS=tcp,self UCX_NET_DEVICES=lo timeout 120 ucx_perftest -p "$PORT" 127.0.0.1 -t tag_bw -s "$SIZE" -n "$ITERS" 2>/dev/null |
        grep -E '^ *Final:' | tail -1)
  wait "$server" 2>/dev/null
  PORT=$((PORT + 1))
  # "Final: iters latency(50%ile avg overall) bandwidth(avg overall) msgrate(avg overall)":
  # the overall bandwidth (MiB/s) is $(NF-2).
  awk 'NF >= 4 { printf "%.3f\n", $(NF-2) * 1048576 / 1e9; ok = 1 } END { if (!ok) print "n/a" }' <<<"$out"
}

measure() {
  case $1 in
    fi-tcp-msg) fi_pingpong_gbps tcp msg ;;
    fi-tcp-rdm) fi_pingpong_gbps tcp rdm ;;
    fi-shm) fi_pingpong_gbps shm rdm ;;
    ucx-tag) ucx_perftest_gbps ;;
    *) echo "raw_tools: unknown tool '$1'" >&2; return 2 ;;
  esac
}

if [ -n "$ONE" ]; then
  measure "$ONE"
  exit $?
fi
echo "# raw tools, ${SIZE}-byte messages, ${ITERS} iterations, loopback"
for tool in fi-tcp-msg fi-tcp-rdm fi-shm ucx-tag; do
  printf '%-12s %s GB/s\n' "$tool" "$(measure "$tool")"
done
