#!/usr/bin/env bash
# Link throughput: `deltacast bench link` against the native tool of each wire, all on 127.0.0.1,
# interleaved run by run (this machine is shared and noisy; medians of REPS runs are reported).
#   usage: bench/transport/run_link_bench.sh [SIZE=1GiB] [REPS=5]
#   env:   DELTACAST=path/to/deltacast (default: build/tools/deltacast), MSG=8MiB, WINDOW=4
# Prints a markdown table: transport | deltacast GB/s | native GB/s | ratio.
set -euo pipefail
SIZE=${1:-1GiB}
REPS=${2:-5}
MSG=${MSG:-8MiB}
WINDOW=${WINDOW:-4}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export UCX_TLS="${UCX_TLS:-tcp,self}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" FI_TCP_IFACE="${FI_TCP_IFACE:-lo}"  # pin to loopback
DELTACAST=${DELTACAST:-$ROOT/build/tools/deltacast}
[ -x "$DELTACAST" ] || { echo "run_link_bench: no deltacast binary at $DELTACAST (set DELTACAST=)" >&2; exit 1; }

bytes_of() {  # 1GiB -> 1073741824
  python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([KMG]i?B?)?', sys.argv[1]); u={'':1,None:1,'KiB':2**10,'MiB':2**20,'GiB':2**30,'KB':1e3,'MB':1e6,'GB':1e9}[m.group(2)]; print(int(float(m.group(1))*u))" "$1"
}
median() { python3 -c "import statistics,sys; v=[float(x) for x in sys.argv[1:] if x!='n/a']; print(f'{statistics.median(v):.3f}' if v else 'n/a')" "$@"; }
ratio() { python3 -c "import sys; a,b=sys.argv[1:]; print('n/a' if 'n/a' in (a,b) else f'{float(a)/float(b):.2f}x')" "$1" "$2"; }

# deltacast bench link -> GB/s, or n/a when the transport is not built.
measure_deltacast() {
  local out
  if out=$("$DELTACAST" bench link --transport "$1" --size "$SIZE" --message-size "$MSG" --window "$WINDOW" --json 2>/dev/null); then
    python3 -c "import json,sys; print(f\"{json.loads(sys.argv[1])['gbytes_per_s']:.3f}\")" "$out"
  else
    echo n/a
  fi
}

# iperf3 single stream on 127.0.0.1 -> GB/s (receiver side).
measure_iperf3() {
  local port=$((20000 + RANDOM % 20000))
  iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.3
  iperf3 -c 127.0.0.1 -p "$port" -n "$(bytes_of "$SIZE")" -J 2>/dev/null |
    python3 -c "import json,sys; print(f\"{json.load(sys.stdin)['end']['sum_received']['bits_per_second']/8e9:.3f}\")" || echo n/a
  wait "$server" 2>/dev/null || true
}

# --- Native tools of the other wires: owned by the ofi/ucx engineer. Each prints GB/s or n/a. ---
measure_fi_pingpong_tcp() { "$ROOT/bench/transport/raw_tools.sh" --one fi-tcp-msg; }
measure_fi_pingpong_shm() { "$ROOT/bench/transport/raw_tools.sh" --one fi-shm; }
measure_ucx_perftest() { UCX_NET_DEVICES=lo "$ROOT/bench/transport/raw_tools.sh" --one ucx-tag; }

declare -A DC NATIVE
SCHEMES=(tcp ofi+tcp ofi+shm ucx)
declare -A NATIVE_FN=([tcp]=measure_iperf3 [ofi+tcp]=measure_fi_pingpong_tcp [ofi+shm]=measure_fi_pingpong_shm [ucx]=measure_ucx_perftest)
declare -A NATIVE_NAME=([tcp]=iperf3 [ofi+tcp]="fi_pingpong tcp" [ofi+shm]="fi_pingpong shm" [ucx]="ucx_perftest tag_bw")
for ((r = 0; r < REPS; r++)); do
  for s in "${SCHEMES[@]}"; do
    DC[$s]+="$(measure_deltacast "$s") "
    NATIVE[$s]+="$(${NATIVE_FN[$s]}) "
  done
done

echo "link bench: size $SIZE, message $MSG, window $WINDOW, median of $REPS interleaved runs, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| transport | deltacast GB/s | native tool | native GB/s | ratio | deltacast runs | native runs |"
echo "|---|---|---|---|---|---|---|"
for s in "${SCHEMES[@]}"; do
  d=$(median ${DC[$s]}); n=$(median ${NATIVE[$s]})
  echo "| $s | $d | ${NATIVE_NAME[$s]} | $n | $(ratio "$d" "$n") | ${DC[$s]% } | ${NATIVE[$s]% } |"
done
