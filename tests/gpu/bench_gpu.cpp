// GPU benchmark for scripts/gpu-check.sh (rows for docs/performance.md, "GPU (codec/cuda)"):
//  * receiver apply into device memory: scatter of a version's (position, bits) lists with the undo
//    log on the device, then the device digest of the tensor (what a CUDA receiver does per
//    version), against cudaMemcpy device-to-device of the tensor's bytes;
//  * producer device diff (DeviceDiffMirror::pull: change bitmap, compaction, bitmap + values to
//    the pinned host mirror, host patch) against a kernel that reads both buffers once.
// Usage: bench_gpu [GiB (default 1)] [repeats (default 5)]. Prints markdown rows; medians.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "codec/cuda/device_apply.h"
#include "codec/cuda/device_diff.h"
#include "codec/cuda/device_mirror.h"
#include "codec/digest.h"

using namespace deltacast::codec;
using Clock = std::chrono::steady_clock;

namespace {
template <class F>
double median_seconds(int repeats, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto a = Clock::now();
    f();
    cuda::device_synchronize();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  if (!cuda::cuda_device_available()) {
    std::printf("bench_gpu: no CUDA device; nothing measured\n");
    return 2;
  }
  const double gib = argc > 1 ? std::atof(argv[1]) : 1.0;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const uint64_t units = static_cast<uint64_t>(gib * (1ull << 30)) / 2 / 64 * 64;  // BF16
  const uint64_t bytes = units * 2;
  cuda::DeviceBuffer a(bytes), b(bytes), c(bytes);
  std::vector<uint16_t> host(units);
  std::mt19937_64 rng(1);
  for (auto& x : host) x = static_cast<uint16_t>(rng());
  cuda::copy_to_device(a.data(), host.data(), bytes);
  cuda::copy_to_device(b.data(), host.data(), bytes);
  const double memcpy_s = median_seconds(repeats, [&] { cuda::copy_device_to_device(c.data(), a.data(), bytes); });
  const double read_both_s = median_seconds(repeats, [&] { (void)cuda::device_read_both(a.data(), b.data(), bytes); });
  std::printf("| what | fraction changed | GiB | median s | GB/s of tensor | vs baseline |\n|---|---|---|---|---|---|\n");
  std::printf("| cudaMemcpy D2D (baseline: apply) | - | %.2f | %.5f | %.1f | 1.00 |\n", gib, memcpy_s, bytes / memcpy_s / 1e9);
  std::printf("| read both buffers (baseline: diff) | - | %.2f | %.5f | %.1f | 1.00 |\n", gib, read_both_s,
              bytes / read_both_s / 1e9);
  const cuda::DeviceTensor ta{a.data(), units, 2}, tb{b.data(), units, 2};
  const uint64_t seed = tensor_digest_seed(0);
  for (double frac : {0.01, 0.03}) {
    // The version's changes, as the host mirror gives them (sorted positions, new bits).
    std::vector<uint64_t> pos;
    std::vector<uint32_t> bits;
    const uint64_t step = static_cast<uint64_t>(1 / frac);
    for (uint64_t i = rng() % step; i < units; i += 1 + rng() % (2 * step - 1)) {
      pos.push_back(i);
      bits.push_back(static_cast<uint16_t>(host[i] + 1));
    }
    cuda::DeviceScatter s;
    const double scatter_s = median_seconds(repeats, [&] {
      s.scatter(ta, pos.data(), bits.data(), pos.size());
      s.rollback();  // leaves the tensor as it was for the next repeat
    });
    // Device-side lists only (what crossing PCIe adds is the difference to the row above).
    cuda::DeviceBuffer dpos(pos.size() * 8), dbits(pos.size() * 4), dundo(pos.size() * 4);
    cuda::copy_to_device(dpos.data(), pos.data(), pos.size() * 8);
    cuda::copy_to_device(dbits.data(), bits.data(), pos.size() * 4);
    const double kernel_s = median_seconds(repeats, [&] {
      cuda::device_scatter_raw(ta, static_cast<uint64_t*>(dpos.data()), static_cast<uint32_t*>(dbits.data()),
                               static_cast<uint32_t*>(dundo.data()), pos.size());
      cuda::device_restore_raw(ta, static_cast<uint64_t*>(dpos.data()), static_cast<uint32_t*>(dundo.data()), pos.size());
    });
    const double digest_s = median_seconds(repeats, [&] { (void)cuda::device_tensor_digest(ta, seed); });
    std::printf("| apply: scatter + undo + rollback, lists from host | %.0f%% | %.2f | %.5f | %.1f | %.2f |\n", frac * 100,
                gib, scatter_s, bytes / scatter_s / 1e9, scatter_s / memcpy_s);
    std::printf("| apply: scatter + restore kernels only | %.0f%% | %.2f | %.5f | %.1f | %.2f |\n", frac * 100, gib,
                kernel_s, bytes / kernel_s / 1e9, kernel_s / memcpy_s);
    std::printf("| apply: device digest of the tensor | - | %.2f | %.5f | %.1f | %.2f |\n", gib, digest_s,
                bytes / digest_s / 1e9, digest_s / memcpy_s);
    std::printf("| apply: scatter + digest (per version) | %.0f%% | %.2f | %.5f | %.1f | %.2f |\n", frac * 100, gib,
                scatter_s / 2 + digest_s, bytes / (scatter_s / 2 + digest_s) / 1e9, (scatter_s / 2 + digest_s) / memcpy_s);
    // Producer: b = a + this version's changes; the mirror pulls it (baseline = a).
    cuda::copy_device_to_device(b.data(), a.data(), bytes);
    cuda::DeviceDiffMirror mirror({tb});
    mirror.pull();  // whole copy: the mirror and its baseline hold a
    // Time the pull alone.
    std::vector<double> pulls;
    for (int r = 0; r < repeats; ++r) {
      cuda::DeviceScatter w;  // b = a + the version's changes (untimed)
      w.scatter(tb, pos.data(), bits.data(), pos.size());
      cuda::device_synchronize();
      const auto t0 = Clock::now();
      const auto st = mirror.pull();
      pulls.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      if (r == 0)
        std::printf("| producer pull: changed %llu, bitmap %llu B, values %llu B over PCIe | %.0f%% | %.2f | | | |\n",
                    static_cast<unsigned long long>(st.changed), static_cast<unsigned long long>(st.bitmap_bytes),
                    static_cast<unsigned long long>(st.value_bytes), frac * 100, gib);
      w.rollback();  // b = a again; the next pull brings the mirror back (untimed)
      mirror.pull();
    }
    std::sort(pulls.begin(), pulls.end());
    const double pull_s = pulls[pulls.size() / 2];
    std::printf("| producer device diff (bitmap + compaction + D2H + host patch) | %.0f%% | %.2f | %.5f | %.1f | %.2f |\n",
                frac * 100, gib, pull_s, bytes / pull_s / 1e9, pull_s / read_both_s);
    const double bitmap_s = median_seconds(repeats, [&] {
      static cuda::DeviceBuffer map;
      map.reserve((units + 63) / 64 * 8);
      (void)cuda::device_change_bitmap(a.data(), b.data(), units, 2, static_cast<uint64_t*>(map.data()));
    });
    std::printf("| producer: change-bitmap kernel alone | %.0f%% | %.2f | %.5f | %.1f | %.2f |\n", frac * 100, gib,
                bitmap_s, bytes / bitmap_s / 1e9, bitmap_s / read_both_s);
  }
  return 0;
}
