#!/usr/bin/env bash
# Object storage across an emulated WAN (issue 34, docs/performance.md "Object storage across a
# WAN (issue 34)"): a producer and a real S3 store (Ceph RGW, scripts/s3-server.sh) in the trainer's
# namespace, and 2 rollout clusters of RECEIVERS/2 members each (members 1-4 `east`, 5-8 `west`)
# behind shaped inter-cluster links with a real RTT (scripts/wan.sh). LINKS=shared (the default):
# both clusters behind ONE link; LINKS=split: each cluster behind its own link (UPLINK each way,
# DELAY one way, each), east and west reaching each other only through the trainer's side (RTT
# between them 4 x DELAY). Three modes, interleaved round by round:
#   tree    no store, producer_cluster `trainer` (no member has it): every tree crosses the link
#   store   every member its own cluster, all in store.clusters: each member downloads every version
#   hybrid  store.clusters [east, west]: one gateway per cluster downloads, then roots its cluster's tree
# Each run appends one JSON line to RESULT (bench/store/store_wan.py); bench/store/summarize.py
# makes the tables.
#
#   bench/store/run_store_wan.sh [ROUNDS]     (default 3; ~9 min with the defaults, most of it the
#                                             store mode's version 1: 8 x 100 MB across the link)
#
# Environment: BUILD (default build), RESULT (default bench/store/results/store_wan.jsonl), PARAMS
# (50M), LR (1.3e-6: ~1% of the BF16 elements change per step), STEPS (3), RECEIVERS (8), UPLINK
# (100mbit), INNER (1gbit), DELAY (25 ms one way), LINKS (shared | split), TOPOLOGY (tree mode:
# double_binary), POLL (store.poll, 25ms: the default), MODES ("tree store hybrid"), RGW_NODELAY (1: radosgw
# with tcp_nodelay, see below; 0: as scripts/s3-server.sh starts it), RUN_TIMEOUT (s per run, 400),
# CACHE (where the synthetic checkpoints are kept, /tmp/deltacast-store-wan-cache), KEEP (non-empty:
# keep the work directory: every run's logs and radosgw's access log), CHECK_RESULT (scripts/wan.sh
# check's JSON line; default RESULT's name with -check). DELTACAST_WAN_PREFIX defaults to dws. Every
# process runs under timeout; radosgw is stopped and the namespaces are removed on exit, whatever
# happens. Needs root. A failed run's logs are copied to /tmp/deltacast-store-wan-failed-*/ (never
# into the tree).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
ROUNDS="${1:-3}"
WAN="$ROOT/scripts/wan.sh"
S3="$ROOT/scripts/s3-server.sh"
BIN="$BUILD/tools/deltacast"
PY=/usr/bin/python3
export DELTACAST_WAN_SHIM="${DELTACAST_WAN_SHIM:-$BUILD/bench/netns/dc_delay_shim}"
export DELTACAST_WAN_PREFIX="${DELTACAST_WAN_PREFIX:-dws}"
PARAMS="${PARAMS:-50M}" LR="${LR:-1.3e-6}" STEPS="${STEPS:-3}" RECEIVERS="${RECEIVERS:-8}"
UPLINK="${UPLINK:-100mbit}" INNER="${INNER:-1gbit}" DELAY="${DELAY:-25}" TOPOLOGY="${TOPOLOGY:-double_binary}"
POLL="${POLL:-25ms}" MODES="${MODES:-tree store hybrid}" RUN_TIMEOUT="${RUN_TIMEOUT:-400}" LINKS="${LINKS:-shared}"
CACHE="${CACHE:-/tmp/deltacast-store-wan-cache}"
OUT="$ROOT/bench/store/results"
RESULT="${RESULT:-$OUT/store_wan.jsonl}"
CHECK_RESULT="${CHECK_RESULT:-${RESULT%.jsonl}-check.jsonl}"
case "$LINKS" in
  shared) export DELTACAST_WAN_CLUSTERS=1 ;;
  split) export DELTACAST_WAN_CLUSTERS=2 ;;
  *) echo "LINKS must be shared or split, got '$LINKS'" >&2; exit 2 ;;
esac
mkdir -p "$OUT" "$(dirname "$RESULT")"
[ -x "$BIN" ] || { echo "no $BIN: build it (cmake --build $BUILD --target deltacast dc_delay_shim)" >&2; exit 1; }
[ -x "$DELTACAST_WAN_SHIM" ] || { echo "no $DELTACAST_WAN_SHIM: build dc_delay_shim" >&2; exit 1; }
work=$(mktemp -d /tmp/dc-store-wan.XXXXXX)
s3dir="$work/s3"
cleanup() {
  if [ -f "$s3dir/ceph.conf" ]; then
    ip netns exec "${DELTACAST_WAN_PREFIX}0" timeout 60 "$S3" stop "$s3dir" >/dev/null 2>&1 || true
  fi
  "$WAN" destroy || true
  if [ -n "${KEEP:-}" ]; then echo "kept $work (KEEP)"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The synthetic trainer's checkpoints, made once per setting (~4 s for 50M).
ckpts="$CACHE/p$PARAMS-lr$LR-s$STEPS-seed7"
if [ ! -f "$ckpts/step-$(printf %04d "$STEPS").safetensors" ]; then
  rm -rf "$ckpts"
  mkdir -p "$CACHE"
  timeout 600 "$BIN" synth --out "$ckpts.tmp" --params "$PARAMS" --steps "$STEPS" --lr "$LR" --seed 7 >/dev/null
  mv "$ckpts.tmp" "$ckpts"
fi

"$WAN" create "$RECEIVERS" "$UPLINK" "$INNER" "$DELAY"
CHECK_JSON="$CHECK_RESULT" timeout 180 "$WAN" check 5
# The store in the trainer's namespace, on its address (the gateways reach it across the link).
ip -n "${DELTACAST_WAN_PREFIX}0" link show lo | grep -q 'UP' ||
  { echo "loopback is down in ${DELTACAST_WAN_PREFIX}0" >&2; exit 1; }
mkdir -p "$s3dir"
ip netns exec "${DELTACAST_WAN_PREFIX}0" env S3_BIND="$("$WAN" addr 0)" S3_MEMSTORE_BYTES=$((6 << 30)) \
  S3_START_TIMEOUT=120 timeout 300 "$S3" start "$s3dir"
# scripts/s3-server.sh starts radosgw with tcp_nodelay=1: beast's default leaves Nagle on, and each
# response's body waits for the ACK of its headers, one more round trip per request (measured: a
# GET across the link takes 3 RTTs, 2 with tcp_nodelay). RGW_NODELAY=0 measures that default.
RGW_NODELAY="${RGW_NODELAY:-1}"
if [ "$RGW_NODELAY" = 0 ]; then
  sed -i 's/ tcp_nodelay=1$//' "$s3dir/ceph.conf"
  ip netns exec "${DELTACAST_WAN_PREFIX}0" timeout 120 "$S3" restart-rgw "$s3dir"
fi

failed=0
for ((round = 1; round <= ROUNDS; round++)); do
  rtt=$("$WAN" rtt 0 1 | tail -1)
  rtt_ms=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1]).get("median_ms", 0))' "$rtt")
  echo "round $round: RTT $rtt"
  rtt_cross_ms=0
  if [ "$LINKS" = split ]; then  # east <-> west: both links
    rtt=$("$WAN" rtt 1 $((RECEIVERS / 2 + 1)) | tail -1)
    rtt_cross_ms=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1]).get("median_ms", 0))' "$rtt")
    echo "round $round: RTT east <-> west $rtt"
  fi
  for mode in $MODES; do
    runwork="$work/$mode-$round"
    if ! timeout $((RUN_TIMEOUT + 60)) "$PY" "$ROOT/bench/store/store_wan.py" --mode "$mode" --round "$round" \
      --work "$runwork" --result "$RESULT" --deltacast "$BIN" --checkpoints "$ckpts" --s3-env "$s3dir/s3.env" \
      --prefix "$DELTACAST_WAN_PREFIX" --receivers "$RECEIVERS" --steps "$STEPS" --topology "$TOPOLOGY" \
      --poll "$POLL" --params "$PARAMS" --uplink "$UPLINK" --inner "$INNER" --delay-ms "$DELAY" \
      --rtt-ms "$rtt_ms" --links "$LINKS" --rtt-cross-ms "$rtt_cross_ms" --rgw-nodelay "$RGW_NODELAY" --timeout "$RUN_TIMEOUT"; then
      failed=$((failed + 1))
      keep="/tmp/deltacast-store-wan-failed-$(date +%H%M%S)-$mode-$round"
      cp -r "$runwork" "$keep" 2>/dev/null || true
      cp "$s3dir/log/client.rgw.deltacast.log" "$keep/" 2>/dev/null || true
      echo "run failed: $mode round $round; logs in $keep" >&2
    fi
  done
done
"$PY" "$ROOT/bench/store/summarize.py" "$RESULT" || true
[ "$failed" -eq 0 ] || { echo "$failed runs failed" >&2; exit 1; }
