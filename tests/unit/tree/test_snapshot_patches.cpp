// SnapshotPatches: a reader that copies bits which are overwritten, layer after layer, while it
// reads forward still gets the bits of the version it began with, exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "tree/snapshot_serve.h"

namespace deltacast::tree {
namespace {

TEST(SnapshotPatches, ReadsSeeTheFirstVersionAcrossOverwritesInAnyOrder) {
  constexpr size_t kElements = 4096;
  std::mt19937 rng(5);
  for (int round = 0; round < 20; ++round) {
    std::vector<uint16_t> live(kElements);
    for (auto& x : live) x = static_cast<uint16_t>(rng());
    const std::vector<uint16_t> first = live;  // the version the reader began with
    SnapshotPatches patches;
    std::vector<uint16_t> read(kElements);
    size_t cursor = 0;
    while (cursor < kElements) {
      // Overwrite a random set of elements (before and after the cursor), as a commit would,
      // handing the reader their bits before the write, in a random order.
      std::vector<SnapshotPatches::Patch> written;
      for (int k = 0; k < 300; ++k) {
        const size_t e = rng() % kElements;
        if (std::find_if(written.begin(), written.end(), [&](auto& p) { return p.element == e; }) != written.end())
          continue;
        written.push_back({0, e, live[e]});
        live[e] = static_cast<uint16_t>(rng());
      }
      std::shuffle(written.begin(), written.end(), rng);
      patches.record(written);
      // Read the next piece.
      const size_t n = std::min<size_t>(1 + rng() % 700, kElements - cursor);
      std::span<std::byte> out(reinterpret_cast<std::byte*>(read.data() + cursor), n * 2);
      std::memcpy(out.data(), live.data() + cursor, n * 2);
      patches.restore_and_advance(0, cursor, cursor + n, 2, out);
      cursor += n;
    }
    ASSERT_EQ(read, first) << "round " << round;
  }
}

TEST(SnapshotPatches, LayersOfOtherTensorsAndPastTheCursorAreKeptApart) {
  SnapshotPatches patches;
  patches.record({{1, 0, 0xAAAA}, {0, 3, 0x1111}});
  std::vector<uint32_t> t0 = {9, 9, 9, 9};
  patches.restore_and_advance(0, 0, 4, 4, std::span(reinterpret_cast<std::byte*>(t0.data()), 16));
  EXPECT_EQ(t0, (std::vector<uint32_t>{9, 9, 9, 0x1111}));
  patches.record({{0, 1, 0x2222}});  // before the cursor: already read, dropped
  std::vector<uint32_t> t1 = {7};
  patches.restore_and_advance(1, 0, 1, 4, std::span(reinterpret_cast<std::byte*>(t1.data()), 4));
  EXPECT_EQ(t1, (std::vector<uint32_t>{0xAAAA}));
}

}  // namespace
}  // namespace deltacast::tree
