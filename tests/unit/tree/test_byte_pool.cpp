// BytePool: copies are exact, released buffers come back (pages kept) and are reused for
// similar sizes, the cap bounds what is kept, prewarm adds touched buffers (only those the free
// ones do not already serve: a relay's pool stays at about one version), and buffers may outlive
// their pool.
#include "tree/byte_pool.h"

#include <gtest/gtest.h>

#include <deque>
#include <numeric>
#include <random>

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

TEST(BytePool, PrewarmMakesTheFreeBuffersTheGivenSizes) {
  BytePool pool(1 << 20);
  pool.prewarm({10'000, 30'000});
  EXPECT_EQ(pool.pooled_bytes(), (12u + 32u) << 10);
  pool.prewarm({10'000, 30'000});  // both served already: nothing added
  EXPECT_EQ(pool.pooled_bytes(), (12u + 32u) << 10);
  pool.prewarm({10'000, 10'000, 30'000});  // one more of 10,000 (each free buffer serves one size)
  EXPECT_EQ(pool.pooled_bytes(), (12u + 12u + 32u) << 10);
  pool.prewarm({40'000, 9'000});  // the 32 KiB one is too small, one 12 KiB serves 9,000, the rest go
  EXPECT_EQ(pool.pooled_bytes(), (40u + 12u) << 10);
  pool.prewarm({100});  // 12 KiB is over 2x + 4 KiB of it: copy() would not take it
  EXPECT_EQ(pool.pooled_bytes(), 4u << 10);
  pool.prewarm({});
  EXPECT_EQ(pool.pooled_bytes(), 0u);
}

// A relay's cycle (tree/relay_edges.cpp): each version's frames are copied from the pool, kept
// while the archive retains the version (4 here), released when it drops out, and the next
// version is prewarmed with this one's sizes. The pool must stay at about one version's frames.
// Before prewarm topped up instead of adding, it grew by a version's frames per version up to its
// cap: 64 MiB of idle buffers in every relay (the soak, docs/reliability.md).
// `growth`: how much every frame grows per version (a model whose deltas grow as training goes on).
size_t most_pooled_over_versions(int versions, size_t growth, size_t* largest_version) {
  constexpr size_t kRetain = 4;
  BytePool pool(size_t{64} << 20);
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> size_of(90'000, 110'000);  // a delta chunk's frame
  std::deque<std::vector<std::shared_ptr<const std::vector<std::byte>>>> archive;
  size_t most_pooled = 0;
  *largest_version = 0;
  for (int version = 0; version < versions; ++version) {
    std::vector<size_t> sizes;
    sizes.reserve(9);
    std::vector<std::shared_ptr<const std::vector<std::byte>>> frames;
    for (int chunk = 0; chunk < 8; ++chunk) sizes.push_back(size_of(rng) + version * growth);
    sizes.push_back(200);  // the seal
    size_t bytes = 0;
    for (size_t size : sizes) {
      frames.push_back(pool.copy(std::vector<std::byte>(size)));
      bytes += (size + 4095) / 4096 * 4096;
    }
    *largest_version = std::max(*largest_version, bytes);
    archive.push_back(std::move(frames));
    if (archive.size() > kRetain) archive.pop_front();  // the oldest version's buffers come back
    most_pooled = std::max(most_pooled, pool.pooled_bytes());
    pool.prewarm(sizes);
    most_pooled = std::max(most_pooled, pool.pooled_bytes());
  }
  return most_pooled;
}

// A relay's cycle (tree/relay_edges.cpp): each version's frames are copied from the pool, kept
// while the archive retains the version (4 here), released when it drops out, and the next
// version is prewarmed with this one's sizes. The pool must stay at about one version's frames.
// When prewarm added a version's buffers each time, it grew by a version's frames per version up
// to its cap: 64 MiB of idle buffers in every relay (the soak, docs/reliability.md).
TEST(BytePool, ARelaysPoolStaysAtAboutOneVersionOverManyVersions) {
  size_t largest = 0;
  const size_t steady = most_pooled_over_versions(300, 0, &largest);
  EXPECT_LE(steady, 2 * largest) << "the pool grows with the versions";
  size_t largest_growing = 0;
  const size_t growing = most_pooled_over_versions(300, 40, &largest_growing);
  EXPECT_LE(growing, 2 * largest_growing) << "frames that grow, a pool that grows";
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
