#!/usr/bin/env bash
# layering_test.sh SOURCE_ROOT CXX CODEC_INCLUDE_DIRS TREE_INCLUDE_DIRS (ctest layering_check)
#  1. scripts/check-layers.py passes on the tree as it is;
#  2. on a copy of the layers' folders with wrong-way includes planted (codec -> tree, tree -> a
#     backend, through a relative path, transport core -> tcp), it fails and names each of them, and
#     a right-way include planted beside them is not reported;
#  3. the compiler, given dc_codec's include directories, cannot open a tree/ header (while it can
#     open util/ and codec/ ones), and with dc_tree's it cannot open a backend's header.
set -euo pipefail
root="$1" cxx="$2"
IFS=';' read -r -a codec_dirs <<< "$3"
IFS=';' read -r -a tree_dirs <<< "$4"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "layering_test: FAIL: $*" >&2; exit 1; }

python3 "$root/scripts/check-layers.py" --root "$root" || fail "the tree as it is does not pass"

copy="$work/tree"
mkdir -p "$copy/cmake"
cp "$root/cmake/layers.txt" "$copy/cmake/"
for folder in util codec checkpoint sim config transport tree capi include tools; do
  cp -r "$root/$folder" "$copy/$folder"
done
python3 "$root/scripts/check-layers.py" --root "$copy" >/dev/null || fail "the copy does not pass before planting"
echo '#include "tree/protocol.h"' >> "$copy/codec/frame.cpp"
echo '#include "../transport/tcp/tcp_transport.h"' >> "$copy/tree/receiver.cpp"
echo '#include "transport/tcp/tcp_connection.h"' >> "$copy/transport/url.cpp"
echo '#include "util/error.h"' >> "$copy/codec/digest.cpp"   # allowed: not reported
set +e
out="$(python3 "$root/scripts/check-layers.py" --root "$copy")"
rc=$?
set -e
echo "$out"
[ "$rc" = 1 ] || fail "planted includes: exit $rc, not 1"
grep -q "^codec/frame.cpp:[0-9]*: includes tree/protocol.h: layer codec may not use layer tree" <<<"$out" ||
  fail "codec -> tree not reported"
grep -q "^tree/receiver.cpp:[0-9]*: includes transport/tcp/tcp_transport.h: layer tree may not use layer tcp" <<<"$out" ||
  fail "tree -> tcp (relative path) not reported"
grep -q "^transport/url.cpp:[0-9]*: includes transport/tcp/tcp_connection.h: layer transport may not use layer tcp" <<<"$out" ||
  fail "transport core -> tcp not reported"
! grep -q "codec/digest.cpp" <<<"$out" || fail "an allowed include was reported"
[ "$(grep -c . <<<"$out")" = 3 ] || fail "expected exactly the 3 planted offences"

compiles() {  # HEADER DIR...: whether a file including HEADER compiles with -I DIR...
  local header="$1"; shift
  local flags=()
  for d in "$@"; do flags+=(-I "$d"); done
  printf '#include "%s"\n' "$header" > "$work/probe.cpp"
  "$cxx" -std=c++20 -fsyntax-only "${flags[@]}" "$work/probe.cpp" 2>"$work/probe.err"
}
compiles "codec/frame.h" "${codec_dirs[@]}" || { cat "$work/probe.err"; fail "codec's own header does not compile with codec's includes"; }
compiles "util/error.h" "${codec_dirs[@]}" || fail "util's header does not compile with codec's includes"
if compiles "tree/protocol.h" "${codec_dirs[@]}"; then fail "a tree header compiles with codec's include path"; fi
grep -q "tree/protocol.h: No such file" "$work/probe.err" || { cat "$work/probe.err"; fail "not refused for the header's absence"; }
compiles "transport/transport.h" "${tree_dirs[@]}" || fail "the transport interface does not compile with tree's includes"
if compiles "transport/tcp/tcp_transport.h" "${tree_dirs[@]}"; then fail "a backend's header compiles with tree's include path"; fi
echo "layering_test: ok"
