// The classed scan's cost per block of 64 elements against the density of changes
// (codec/scan.h), to tell the per-block cost (class masks, counts, the loads) from the per-change
// cost (position, bits, class, rank). One BF16 segment of 16 Mi elements (normal(0, 0.02) bits,
// so the four classes are all populated), changed at each density; densities interleaved over
// rounds with a plain read of both arrays (the baseline); the median per density. The cycles assume 3.5 GHz (a scale,
// not a measurement).
// --elements sets the segment's size: the default's arrays (32 MiB each) come from memory; at 256Ki
// (512 KiB each) they stay in the caches and the scan's own work shows. --width 1: one-byte
// elements instead (FP8-like: the sign, the low four exponent bits and the top three mantissa bits
// of the same BF16 values; the class thresholds at the quartiles of their magnitudes).
//        dc_bench_scan [--rounds 9] [--reps 10] [--elements 16777216] [--width 2|1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/scan.h"

using namespace deltacast::codec;

namespace {

template <class T>
int run(int rounds, int reps, size_t n) {
  const std::vector<double> densities = {0.0, 0.001, 0.005, 0.014, 0.03, 0.1};
  std::vector<T> base(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 0.02f);
  for (auto& x : base) {
    const float f = normal(rng);
    uint32_t u = 0;
    std::memcpy(&u, &f, 4);
    const auto bf16 = static_cast<uint16_t>(u >> 16);
    if constexpr (sizeof(T) == 2)
      x = bf16;
    else
      x = static_cast<T>(((bf16 >> 8) & 0x80) | ((bf16 >> 4) & 0x7F));
  }
  const uint32_t mask = sizeof(T) == 2 ? 0x7fff : 0x7f;
  ClassSpec classes;
  classes.count = 4;
  if constexpr (sizeof(T) == 2) {
    classes.thresholds = {0x3a00, 0x3c00, 0x3c80};
  } else {
    std::vector<T> magnitudes(base);
    for (auto& x : magnitudes) x = static_cast<T>(x & mask);
    std::sort(magnitudes.begin(), magnitudes.end());
    for (unsigned j = 0; j < 3; ++j) classes.thresholds[j] = magnitudes[n * (j + 1) / 4];
  }
  std::vector<std::vector<T>> next;
  std::vector<size_t> changes;
  for (double d : densities) {
    next.push_back(base);
    std::bernoulli_distribution flip(d);
    for (auto& x : next.back())
      if (flip(rng)) x = static_cast<T>(x ^ (1 + (rng() & 3)));
    size_t c = 0;
    for (size_t i = 0; i < n; ++i) c += base[i] != next.back()[i];
    changes.push_back(c);
  }
  ScanOutput out;
  std::vector<std::vector<double>> seconds(densities.size());
  std::vector<double> read_seconds;  // the baseline: a plain read of both arrays (4 independent sums)
  uint64_t sink = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto r0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i)
      for (const auto* v : {&base, &next[3]}) {
        uint64_t sum[4] = {0, 0, 0, 0};
        const size_t words = n * sizeof(T) / 8;
        for (size_t w = 0; w + 4 <= words; w += 4)
          for (size_t l = 0; l < 4; ++l) {
            uint64_t x = 0;
            std::memcpy(&x, reinterpret_cast<const char*>(v->data()) + 8 * (w + l), 8);
            sum[l] += x;
          }
        sink += sum[0] + sum[1] + sum[2] + sum[3];
      }
    read_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count() / reps);
    for (size_t k = 0; k < densities.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) scan_changes(sizeof(T), mask, base.data(), next[k].data(), n, &classes, out);
      seconds[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
      if (out.positions.size() != changes[k]) {
        std::fprintf(stderr, "scan found %zu changes, not %zu\n", out.positions.size(), changes[k]);
        return 1;
      }
    }
  }
  std::sort(read_seconds.begin(), read_seconds.end());
  const double read = read_seconds[read_seconds.size() / 2];
  std::printf("read of both (the baseline): median %.3f ms (%.3f-%.3f)%s\n\n", read * 1e3, read_seconds.front() * 1e3,
              read_seconds.back() * 1e3, sink == 42 ? " " : "");
  std::printf(
      "| density | changes | scan (median ms, range) | scan / read | cycles per block @3.5 GHz "
      "|\n|---|---|---|---|---|\n");
  for (size_t k = 0; k < densities.size(); ++k) {
    auto v = seconds[k];
    std::sort(v.begin(), v.end());
    const double median = v[v.size() / 2];
    std::printf("| %.3f | %zu | %.3f (%.3f-%.3f) | %.2f | %.1f |\n", densities[k], changes[k], median * 1e3,
                v.front() * 1e3, v.back() * 1e3, median / read, median * 3.5e9 * 64.0 / static_cast<double>(n));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 9, reps = 10, width = 2;
  size_t n = size_t{16} << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--reps") reps = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--elements") n = std::stoull(argv[i + 1]);
    if (std::string(argv[i]) == "--width") width = std::stoi(argv[i + 1]);
  }
  if (width == 1) return run<uint8_t>(rounds, reps, n);
  if (width == 2) return run<uint16_t>(rounds, reps, n);
  std::fprintf(stderr, "--width must be 1 or 2\n");
  return 2;
}
