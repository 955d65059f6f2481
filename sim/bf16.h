#pragma once
// FP32 -> BF16 conversion with IEEE round-to-nearest-even, written out bit by bit so the result
// is exact and identical on every machine (no reliance on compiler intrinsics or FP environment).
// Defined inline because it sits in the simulator's innermost loop and must vectorise there.
#include <bit>
#include <cstdint>

namespace deltacast::sim {

// Rounds an FP32 bit pattern to the nearest BF16 (ties to even). Infinities stay infinities,
// values beyond the largest BF16 round to infinity, subnormals round like any other value
// (BF16 shares FP32's exponent range), -0 stays -0. NaN stays NaN with its sign and the top 7
// payload bits, and is forced quiet so that truncating the payload can never produce an infinity.
constexpr uint16_t fp32_bits_to_bf16(uint32_t bits) noexcept {
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

inline uint16_t fp32_to_bf16(float value) noexcept {
  return fp32_bits_to_bf16(std::bit_cast<uint32_t>(value));
}

// Exact widening: every BF16 value is an FP32 value.
inline float bf16_to_fp32(uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace deltacast::sim
