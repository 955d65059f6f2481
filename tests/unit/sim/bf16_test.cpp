// FP32 -> BF16 round-to-nearest-even on special values, checked against exact expectations.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "sim/bf16.h"

namespace deltacast::sim {
namespace {

TEST(Bf16, ExactValuesAreUnchanged) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
}

TEST(Bf16, Infinities) {
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
}

TEST(Bf16, LargestFloatRoundsToInfinityButLargestBf16Survives) {
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(fp32_bits_to_bf16(0x7F7F0000u), 0x7F7F);
  EXPECT_EQ(fp32_bits_to_bf16(0x7F7F7FFFu), 0x7F7F);  // just below the halfway point
  EXPECT_EQ(fp32_bits_to_bf16(0x7F7F8000u), 0x7F80);  // tie, odd mantissa -> rounds up to inf
}

TEST(Bf16, NaNStaysNaNWithSignAndIsQuiet) {
  // Signalling NaN whose payload lives only in the low 16 bits: truncation would give infinity.
  EXPECT_EQ(fp32_bits_to_bf16(0x7F800001u), 0x7FC0);
  EXPECT_EQ(fp32_bits_to_bf16(0xFF800001u), 0xFFC0);
  EXPECT_EQ(fp32_bits_to_bf16(0x7FC00000u), 0x7FC0);
  EXPECT_EQ(fp32_bits_to_bf16(0x7FFFFFFFu), 0x7FFF);  // rounding must not carry into the sign
  EXPECT_EQ(fp32_bits_to_bf16(0xFFFFFFFFu), 0xFFFF);
  EXPECT_EQ(fp32_bits_to_bf16(0x7FA12345u), 0x7FE1);  // top payload bits kept, quiet bit set
  const float back = bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_TRUE(std::isnan(back));
}

TEST(Bf16, TiesRoundToEven) {
  EXPECT_EQ(fp32_bits_to_bf16(0x3F808000u), 0x3F80);  // tie, even -> stays
  EXPECT_EQ(fp32_bits_to_bf16(0x3F818000u), 0x3F82);  // tie, odd -> up to even
  EXPECT_EQ(fp32_bits_to_bf16(0x3F808001u), 0x3F81);  // above the tie -> up
  EXPECT_EQ(fp32_bits_to_bf16(0x3F807FFFu), 0x3F80);  // below the tie -> down
  EXPECT_EQ(fp32_bits_to_bf16(0xBF818000u), 0xBF82);  // negative values mirror
  EXPECT_EQ(fp32_bits_to_bf16(0x3FFF8000u), 0x4000);  // carry into the exponent
}

TEST(Bf16, Subnormals) {
  EXPECT_EQ(fp32_bits_to_bf16(0x00000001u), 0x0000);  // smallest subnormal rounds to +0
  EXPECT_EQ(fp32_bits_to_bf16(0x80000001u), 0x8000);  // ... and to -0 when negative
  EXPECT_EQ(fp32_bits_to_bf16(0x00010000u), 0x0001);  // smallest BF16 subnormal is exact
  EXPECT_EQ(fp32_bits_to_bf16(0x00008000u), 0x0000);  // half of it: tie to even (0)
  EXPECT_EQ(fp32_bits_to_bf16(0x00018000u), 0x0002);  // 1.5 of it: tie to even (2)
  EXPECT_EQ(fp32_bits_to_bf16(0x007FFFFFu), 0x0080);  // largest subnormal rounds to smallest normal
}

TEST(Bf16, MatchesRoundingByExactArithmeticOnASweep) {
  // Reference: pick the nearer of the two BF16 neighbours by exact double arithmetic.
  for (uint32_t hi = 0x0000; hi < 0x7F7F; hi += 37) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x3FFFu, 0x7FFFu, 0x8000u, 0x8001u, 0xC000u, 0xFFFFu}) {
      const uint32_t bits = (hi << 16) | lo;
      const double x = std::bit_cast<float>(bits);
      const double down = std::bit_cast<float>(hi << 16);
      const double up = std::bit_cast<float>((hi + 1) << 16);
      uint16_t expected = static_cast<uint16_t>(hi);
      if (x - down > up - x || (x - down == up - x && (hi & 1))) expected = static_cast<uint16_t>(hi + 1);
      ASSERT_EQ(fp32_bits_to_bf16(bits), expected) << std::hex << bits;
      ASSERT_EQ(fp32_bits_to_bf16(bits | 0x80000000u), expected | 0x8000) << std::hex << bits;
    }
  }
}

}  // namespace
}  // namespace deltacast::sim
