// BytePool: copies are exact, released buffers come back (pages kept) and are reused for
// similar sizes, the cap bounds what is kept, prewarm adds touched buffers, and buffers may
// outlive their pool.
#include "tree/byte_pool.h"

#include <gtest/gtest.h>

#include <numeric>

namespace deltacast::tree {
namespace {

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed + i * 31);
  return v;
}

TEST(BytePool, CopiesAreExactAndReleasedBuffersAreReused) {
  BytePool pool(1 << 20);
  const auto a = pattern(20'000, 1);
  const std::byte* first_data;
  {
    auto copy = pool.copy(a);
    ASSERT_EQ(*copy, a);
    first_data = copy->data();
    EXPECT_EQ(pool.pooled_bytes(), 0u);
  }
  EXPECT_GE(pool.pooled_bytes(), 20'000u);  // back in the pool
  const auto b = pattern(18'000, 7);        // fits (capacity within 2x + 4 KiB)
  auto again = pool.copy(b);
  EXPECT_EQ(*again, b);
  EXPECT_EQ(again->data(), first_data);  // the same buffer, no new allocation
  EXPECT_EQ(pool.pooled_bytes(), 0u);
  // A much smaller message does not take a big buffer.
  again.reset();
  auto small = pool.copy(pattern(100, 3));
  EXPECT_EQ(small->size(), 100u);
  EXPECT_NE(small->data(), first_data);
  EXPECT_GE(pool.pooled_bytes(), 20'000u);
}

TEST(BytePool, TheCapBoundsWhatIsKeptAndPrewarmRespectsIt) {
  BytePool pool(64 << 10);
  pool.prewarm({10'000, 10'000, 30'000, 30'000});  // 12 + 12 + 32 KiB fit, the last 32 does not
  EXPECT_EQ(pool.pooled_bytes(), (12u + 12u + 32u) << 10);
  auto big = pool.copy(pattern(30'000, 5));
  auto mid1 = pool.copy(pattern(9'000, 6));
  auto mid2 = pool.copy(pattern(9'000, 7));
  EXPECT_EQ(pool.pooled_bytes(), 0u);
  EXPECT_EQ(*big, pattern(30'000, 5));
  auto extra = pool.copy(pattern(60'000, 8));  // nothing fits: a fresh buffer
  big.reset();
  mid1.reset();
  mid2.reset();
  extra.reset();  // would exceed the cap: freed, not kept
  EXPECT_LE(pool.pooled_bytes(), size_t{64} << 10);
}

TEST(BytePool, BuffersMayOutliveThePool) {
  std::shared_ptr<const std::vector<std::byte>> kept;
  {
    BytePool pool(1 << 20);
    kept = pool.copy(pattern(5'000, 9));
  }
  EXPECT_EQ(*kept, pattern(5'000, 9));
  kept.reset();  // freed normally
}

}  // namespace
}  // namespace deltacast::tree
