// The device diff agrees with the CPU scan bit for bit; skips at run time without a CUDA device.
#include <gtest/gtest.h>

#include <random>

#include "codec/cuda/device_diff.h"
#include "codec/scan.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

TEST(CudaDiff, UnavailableIsReportedAsUnsupported) {
  if (cuda::cuda_device_available()) GTEST_SKIP() << "a CUDA device is present";
  std::vector<uint16_t> a(10), b(10);
  uint64_t map[1];
  try {
    cuda::change_bitmap_via_device(a.data(), b.data(), a.size(), 2, map);
    FAIL() << "expected Error(unsupported)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
  }
}

TEST(CudaDiff, BitmapMatchesCpuScan) {
  if (!cuda::cuda_device_available()) GTEST_SKIP() << "no CUDA device (driver or GPU absent)";
  std::mt19937_64 rng(11);
  for (uint64_t n : {1ull, 63ull, 64ull, 1000ull, 1ull << 20}) {
    std::vector<uint16_t> a(n), b(n);
    for (auto& x : a) x = static_cast<uint16_t>(rng());
    b = a;
    for (auto& x : b)
      if (rng() % 100 == 0) ++x;
    std::vector<uint64_t> map((n + 63) / 64);
    const uint64_t changed = cuda::change_bitmap_via_device(a.data(), b.data(), n, 2, map.data());
    ScanOutput scan;
    scan_changes(2, 0x7FFF, a.data(), b.data(), n, nullptr, scan);
    ASSERT_EQ(changed, scan.positions.size());
    for (uint32_t p : scan.positions) ASSERT_TRUE((map[p / 64] >> (p % 64)) & 1);
  }
}

}  // namespace
}  // namespace deltacast::codec
