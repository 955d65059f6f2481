#!/usr/bin/env bash
# ctest "tree_netns_smoke" (label netns): scripts/netns.sh create/destroy plus one small relay-tree
# broadcast (8 MiB, chain) from a producer namespace to 2 receivers, each in its own namespace
# behind a 1 Gbit/s tbf link; passes only when every receiver ends bit-exact. Exit 77 (skip) when
# `ip netns add` is not permitted. Namespaces use a per-run prefix and are removed on any exit.
#   bench/tree/netns_smoke.sh DC_BENCH_TREE NETNS_SH
set -euo pipefail
BENCH="$1"
NETNS="$2"
export DELTACAST_NETNS_PREFIX="dt$$n"
rc=0
"$NETNS" create 2 || rc=$?
if [ "$rc" -eq 77 ]; then echo "skip: network namespaces are not permitted here"; exit 77; fi
trap '"$NETNS" destroy; [ -z "$("$NETNS" list)" ] || { echo "namespaces left behind" >&2; exit 1; }' EXIT
[ "$rc" -eq 0 ] || exit "$rc"
[ "$("$NETNS" list | wc -l)" -eq 4 ] || { echo "expected 3 node namespaces + bridge" >&2; exit 1; }
line="$("$NETNS" exec 0 timeout 60 "$BENCH" broadcast --netns --receivers 2 --bytes 8MiB \
  --stage 4MiB --chunk 1MiB --topology chain --link-gbit 1 | grep '^{')"
echo "$line"
python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if r["committed"] and r["bit_exact_receivers"]==r["receivers"]==2 and r["verified_receivers"]==2 else 1)' "$line"
