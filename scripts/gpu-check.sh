#!/usr/bin/env bash
# GPU check for the CUDA buffers (docs/embedding.md, "CUDA buffers"): every GPU test, then the
# device benchmark, with results printed as markdown rows for docs/performance.md (section "GPU (codec/cuda)").
#
#   scripts/gpu-check.sh --build   # here (nvcc, build deps): builds for sm_90 into build-cuda and
#                                  # packs dist/gpu-check/ (binaries + the shared libraries they need,
#                                  # not libcuda, which comes with the GPU machine's driver)
#   scripts/gpu-check.sh           # on the GPU machine, offline: runs dist/gpu-check/ (builds it
#                                  # first when it is missing and nvcc + the build deps exist)
#
# dist/ is not committed (build output; .gitignore): carry dist/gpu-check to the GPU machine.
# Options: --gib N (benchmark tensor size, default 1), --repeats N (default 5).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dist="$root/dist/gpu-check"
build="$root/build-cuda"
gib=1
repeats=5
do_build=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) do_build=1 ;;
    --gib) gib="$2"; shift ;;
    --repeats) repeats="$2"; shift ;;
    *) echo "gpu-check.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

pack() {
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDELTACAST_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  nice -n 5 cmake --build "$build" -j"${JOBS:-2}" --target test_gpu bench_gpu test_codec
  rm -rf "$dist"
  mkdir -p "$dist/lib"
  cp "$build/tests/gpu/test_gpu" "$build/tests/gpu/bench_gpu" "$build/tests/unit/codec/test_codec" "$dist/"
  # Shared libraries outside glibc and the driver (the GPU machine may lack the -dev packages).
  for bin in "$dist"/test_gpu "$dist"/bench_gpu "$dist"/test_codec; do
    ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libgcc_s.so*|libstdc++.so*) ;;
        *) cp -nL "$lib" "$dist/lib/" ;;
      esac
    done
  done
  strip --strip-debug "$dist"/test_gpu "$dist"/bench_gpu "$dist"/test_codec "$dist"/lib/* 2>/dev/null || true
  git -C "$root" rev-parse HEAD > "$dist/COMMIT" 2>/dev/null || true
  du -sh "$dist"
}

if [[ $do_build == 1 ]]; then pack; exit 0; fi
if [[ ! -x "$dist/test_gpu" ]]; then
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then pack; else
    echo "gpu-check.sh: $dist is missing and there is no nvcc here; run scripts/gpu-check.sh --build on a machine with the toolchain" >&2
    exit 2
  fi
fi
export LD_LIBRARY_PATH="$dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
echo "built from: $(cat "$dist/COMMIT" 2>/dev/null || echo unknown)"
status=0
echo "== GPU tests (test_gpu: every test; test_codec: the CUDA diff tests)"
timeout 180 "$dist/test_gpu" --gtest_brief=1 || status=1
timeout 60 "$dist/test_codec" --gtest_filter='Cuda*' --gtest_brief=1 || status=1
# Only the no-device test may skip on a GPU machine.
skipped=$("$dist/test_gpu" --gtest_filter='-*WithoutADevice*' 2>/dev/null | grep -c '^\[  SKIPPED \] .*(' || true)
if [[ "$skipped" != 0 ]]; then echo "gpu-check.sh: $skipped GPU tests skipped (no usable device?)"; status=1; fi
echo "== benchmark (paste into docs/performance.md, section GPU; $(date -u +%F), ${gib} GiB BF16 tensor, medians of $repeats)"
timeout 120 "$dist/bench_gpu" "$gib" "$repeats" || status=1
exit $status
