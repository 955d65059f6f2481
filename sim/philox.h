#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. The simulator keys it by (seed) and counts by (element, tensor, step,
// stream), so every random number depends only on its coordinate: results are the same for any
// thread count or block size, and any element can be generated without generating the others.
#include <array>
#include <cstddef>
#include <cstdint>

namespace deltacast::sim {

using PhiloxBlock = std::array<uint32_t, 4>;

constexpr PhiloxBlock philox4x32_10(PhiloxBlock counter, uint64_t key) noexcept {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * counter[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * counter[2];
    counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ k0, static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return counter;
}

// Philox for `kPhiloxLanes` consecutive counters {q0 + j, tensor, stream} (64-bit q split over
// the first two words), written lane-major: out[k * kPhiloxLanes + j] = word k of counter q0 + j.
// Structure-of-arrays so the compiler vectorises the rounds; bit-identical to philox4x32_10.
inline constexpr size_t kPhiloxLanes = 256;
inline void philox4x32_10_lanes(uint64_t q0, uint32_t c2, uint32_t c3, uint64_t key, uint32_t* out) noexcept {
  uint32_t* x0 = out;
  uint32_t* x1 = out + kPhiloxLanes;
  uint32_t* x2 = out + 2 * kPhiloxLanes;
  uint32_t* x3 = out + 3 * kPhiloxLanes;
  for (size_t j = 0; j < kPhiloxLanes; ++j) {
    x0[j] = static_cast<uint32_t>(q0 + j);
    x1[j] = static_cast<uint32_t>((q0 + j) >> 32);
    x2[j] = c2;
    x3[j] = c3;
  }
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    for (size_t j = 0; j < kPhiloxLanes; ++j) {
      const uint64_t p0 = uint64_t{0xD2511F53u} * x0[j];
      const uint64_t p1 = uint64_t{0xCD9E8D57u} * x2[j];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ x1[j] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ x3[j] ^ k1;
      x1[j] = static_cast<uint32_t>(p1);
      x3[j] = static_cast<uint32_t>(p0);
      x0[j] = n0;
      x2[j] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// Maps 32 random bits to a float uniform on the open interval (0, 1): never 0, never 1.
constexpr float uniform_open01(uint32_t bits) noexcept {
  return (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace deltacast::sim
