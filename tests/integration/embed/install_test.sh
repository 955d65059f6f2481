#!/usr/bin/env bash
# cmake --install into a temporary prefix, then what an embedder does with it:
#   - libdeltacast.so exports only dc_* symbols (nm -D), with a versioned SONAME;
#   - examples/consumer builds out of tree with pkg-config and with find_package(deltacast) and runs;
#   - examples/embed (the C receiver) builds out of tree with find_package;
#   - the Python package under P/lib/python3/dist-packages finds the installed library by itself;
#   - libdeltacast.so (a shim) and its core, P/lib/deltacast/libdeltacast_core.so.X.Y.Z, export the
#     same dc_* functions, and the shim needs no transport library;
#   - a C host and a Python host keep their signal handlers through loading deltacast and opening a
#     producer on tcp, ucx and ofi+tcp (signal_host.c, signal_host.py).
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2"
work="$(mktemp -d /tmp/deltacast-install.XXXXXX)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
for f in include/deltacast/deltacast.h lib/pkgconfig/deltacast.pc lib/cmake/deltacast/deltacastConfig.cmake \
         lib/cmake/deltacast/deltacastConfigVersion.cmake bin/deltacast lib/python3/dist-packages/deltacast/__init__.py \
         share/deltacast/cost_model_fit.json; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
# The installed CLI's data is the fit of the source tree (the probe reads it next to bin/).
cmp -s "$prefix/share/deltacast/cost_model_fit.json" "$src/tools/probe/cost_model_fit.json" ||
  fail "share/deltacast/cost_model_fit.json is not tools/probe/cost_model_fit.json"
lib="$(ls "$prefix"/lib/libdeltacast.so.*.*.* | head -1)"
[ -n "$lib" ] || fail "no libdeltacast.so.X.Y.Z under $prefix/lib"
[ -L "$prefix/lib/libdeltacast.so" ] || fail "no libdeltacast.so development link"
soname="$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')"
[[ "$soname" == libdeltacast.so.0.* ]] || fail "SONAME is '$soname'"
[ -e "$prefix/lib/$soname" ] || fail "no $soname link"

# Only the C API is exported: no fmt, spdlog, Boost, yaml-cpp or libstdc++ instantiations.
nm -D --defined-only "$lib" | awk '{print $NF}' > "$work/exports.txt"
others="$(grep -v '^dc_' "$work/exports.txt" || true)"
[ -z "$others" ] || fail "libdeltacast.so exports non-dc_ symbols: $(echo "$others" | head -5 | tr '\n' ' ')"
for f in dc_version_number dc_status_name dc_receiver_create dc_receiver_attach dc_producer_refit; do
  grep -qx "$f" "$work/exports.txt" || fail "$f is not exported"
done
echo "install_test: $(wc -l < "$work/exports.txt") exported symbols, all dc_*; SONAME $soname"
# The shim forwards every function of its core, and loads no transport library itself.
core="$(ls "$prefix"/lib/deltacast/libdeltacast_core.so.*.*.* | head -1)"
[ -n "$core" ] || fail "no deltacast/libdeltacast_core.so.X.Y.Z under $prefix/lib"
nm -D --defined-only "$core" | awk '{print $NF}' > "$work/core-exports.txt"
diff <(sort "$work/exports.txt") <(sort "$work/core-exports.txt") > "$work/exports.diff" ||
  fail "libdeltacast.so and its core export different symbols: $(cat "$work/exports.diff")"
needed="$(readelf -d "$lib" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
[[ "$needed" != *fabric* && "$needed" != *uc[ps]* && "$needed" != *spdlog* ]] ||
  fail "the shim libdeltacast.so needs more than libc and libstdc++: $needed"
echo "install_test: the shim forwards $(wc -l < "$work/core-exports.txt") functions to $(basename "$core"); it needs: $needed"

export LD_LIBRARY_PATH="$prefix/lib"
# pkg-config
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cc -std=c11 -Wall -Werror "$src/examples/consumer/consumer.c" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs deltacast) -o "$work/consumer-pc"
out="$("$work/consumer-pc")" || fail "the pkg-config consumer exited non-zero: $out"
[[ "$out" == "deltacast 0."*", DC_OK" ]] || fail "pkg-config consumer printed '$out'"
echo "install_test: pkg-config consumer: $out"
# find_package
cmake -S "$src/examples/consumer" -B "$work/consumer-cmake" -DCMAKE_PREFIX_PATH="$prefix" > "$work/cmake1.log" 2>&1 ||
  { cat "$work/cmake1.log"; fail "configuring examples/consumer with find_package"; }
cmake --build "$work/consumer-cmake" > "$work/build1.log" 2>&1 || { cat "$work/build1.log"; fail "building examples/consumer"; }
out="$("$work/consumer-cmake/consumer")" || fail "the find_package consumer exited non-zero: $out"
echo "install_test: find_package consumer: $out"
cmake -S "$src/examples/embed" -B "$work/embed-cmake" -DCMAKE_PREFIX_PATH="$prefix" > "$work/cmake2.log" 2>&1 ||
  { cat "$work/cmake2.log"; fail "configuring examples/embed with find_package"; }
cmake --build "$work/embed-cmake" > "$work/build2.log" 2>&1 || { cat "$work/build2.log"; fail "building examples/embed"; }
"$work/embed-cmake/embed_receiver" 2> "$work/usage.txt" && fail "embed_receiver without arguments succeeded"
grep -q usage "$work/usage.txt" || fail "embed_receiver printed no usage"
echo "install_test: examples/embed built out of tree"

# Python: the installed package finds the installed library without DELTACAST_LIB or LD_LIBRARY_PATH.
if /usr/bin/python3 -c 'import ctypes' 2> /dev/null; then
  out="$(env -u LD_LIBRARY_PATH -u DELTACAST_LIB PYTHONPATH="$prefix/lib/python3/dist-packages" /usr/bin/python3 -c '
import deltacast
getattr(deltacast, "library_version", lambda: None)()
loaded = [l.split()[-1] for l in open("/proc/self/maps") if "libdeltacast.so" in l]
print(deltacast.__file__, loaded[0] if loaded else "(libdeltacast not loaded)")
' )" || fail "import deltacast from the prefix failed"
  [[ "$out" == "$prefix"/lib/python3/dist-packages/deltacast/__init__.py*"$prefix"/lib/* ]] ||
    fail "the installed Python package did not use the installed library: $out"
  echo "install_test: python: $out"
fi
# Signal handlers: a C host and a Python host keep theirs through deltacast and its providers.
export UCX_TLS="${UCX_TLS:-tcp,self}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" FI_TCP_IFACE="${FI_TCP_IFACE:-lo}"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cc -std=c11 -Wall -Werror "$src/tests/integration/embed/signal_host.c" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs deltacast) -o "$work/signal_host"
out="$("$work/signal_host" tcp ucx ofi+tcp 2>&1)" || fail "a C host's signal handlers were replaced: $out"
echo "install_test: C host: $out"
if /usr/bin/python3 -c 'import numpy' 2> /dev/null; then
  out="$(env -u LD_LIBRARY_PATH -u DELTACAST_LIB PYTHONPATH="$prefix/lib/python3/dist-packages" \
    /usr/bin/python3 "$src/tests/integration/embed/signal_host.py" tcp ucx ofi+tcp 2>&1)" ||
    fail "a Python host's signal handlers were replaced: $out"
  echo "install_test: Python host: $out"
else
  fail "python3-numpy is missing (scripts/install-deps.sh --test installs it)"
fi
echo "install_test: OK"
