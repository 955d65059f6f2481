#!/usr/bin/env bash
# ThreadSanitizer over the concurrency tests: the applier (in place, staged, concurrent chunks),
# the session and relay (cut-through, repairs), and every transport's conformance suite.
#   scripts/tsan.sh [GTEST ARGUMENTS]       (build in build-tsan/, DELTACAST_TSAN=ON)
# Not in CI (docs/sanitizers.md records how long it takes). TSan needs a kernel whose mmap
# randomness it can handle: on kernels with vm.mmap_rnd_bits above 28 it dies at start with
# "unexpected memory mapping"; this script then re-runs each test under `setarch -R` (no ASLR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DELTACAST_BUILD_DIR:-$root/build-tsan}"
bash "$root/scripts/install-deps.sh" --test
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDELTACAST_TSAN=ON -DDELTACAST_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target test_codec test_session test_relay_link test_frame_store \
  test_snapshot_patches test_relay_tree test_failover transport_conformance_test transport_unit_test
# TSan slows threads 5-15x: tests stretch the bounds they give a healthy peer (tests/common/time_scale.h).
export DELTACAST_TEST_TIME_SCALE="${DELTACAST_TEST_TIME_SCALE:-5}"
# UCX's libucm hooks madvise(); glibc calls it as a thread exits, after TSan tore that thread's
# state down: a segfault in every binary that links UCX. Memory events off (UCX, not our code).
export UCX_MEM_EVENTS="${UCX_MEM_EVENTS:-no}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/sanitizers/tsan.supp}"
launcher=()
if ! "$build/tests/unit/codec/test_codec" --gtest_list_tests >/dev/null 2>&1; then
  echo "tsan.sh: ThreadSanitizer cannot start on this kernel (vm.mmap_rnd_bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null)); running under setarch -R" >&2
  launcher=(setarch "$(uname -m)" -R)
fi
# Each test binary runs whole (gtest), one after the other; any TSan report fails it.
status=0
for bin in tests/unit/codec/test_codec tests/unit/tree/test_session tests/unit/tree/test_relay_link \
           tests/unit/tree/test_frame_store tests/unit/tree/test_snapshot_patches \
           tests/integration/tree/test_relay_tree tests/integration/tree/test_failover \
           tests/transport/transport_conformance_test tests/transport/transport_unit_test; do
  start=$(date +%s)
  if (cd "$build/$(dirname "$bin")" && "${launcher[@]}" "./$(basename "$bin")" --gtest_brief=1 "$@" > "$build/tsan-$(basename "$bin").log" 2>&1); then
    echo "tsan: $(basename "$bin") clean ($(( $(date +%s) - start )) s)"
  else
    echo "tsan: $(basename "$bin") FAILED ($(( $(date +%s) - start )) s): $build/tsan-$(basename "$bin").log"
    grep -m3 -A12 "WARNING: ThreadSanitizer" "$build/tsan-$(basename "$bin").log" || tail -20 "$build/tsan-$(basename "$bin").log"
    status=1
  fi
done
exit $status
