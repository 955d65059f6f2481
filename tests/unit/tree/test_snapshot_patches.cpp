// SnapshotPatches: a reader that copies bits which are overwritten, layer after layer, while it
// reads forward still gets the bits of the version it began with, exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "codec/encoder.h"
#include "tests/common/memory_reader.h"
#include "tree/snapshot_serve.h"
#include "util/error.h"

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
// overwrite_with, the producer's baseline update: from spans or read in pieces (with or without
// old bits collected), the bits become the new version's, and the old bits handed to open
// snapshot readers are exactly those of the units that changed, at their indexes past
// the first piece too. A read that fails midway leaves old bits for everything it overwrote: a
// reader restoring them still reads the old version.
TEST(OverwriteWith, TheBitsBecomeTheNewVersionAndReadersKeepTheOld) {
  using codec::DType;
  const uint64_t piece = codec::kReadPieceBytes;
  const codec::Manifest m({{"w", DType::bf16, {3 * piece / 2 + 7}},
                           {"b", DType::f32, {1000}},
                           {"e", DType::f32, {0}},
                           {"i", DType::i64, {piece / 8 + 5}}});
  std::mt19937_64 rng(3);
  std::vector<std::vector<std::byte>> old_version, new_version;
  for (const auto& t : m.tensors()) {
    std::vector<std::byte> bytes(t.nbytes());
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
    old_version.push_back(bytes);
    for (size_t i = 0; i < bytes.size(); ++i)
      if (rng() % 50 == 0) bytes[i] ^= std::byte{0x10};
    new_version.push_back(std::move(bytes));
  }
  auto weights = [&m](const std::vector<std::vector<std::byte>>& v) {
    codec::ConstWeights w{&m, {}};
    for (const auto& t : v) w.tensors.emplace_back(t.data(), t.size());
    return w;
  };
  // The old bits of every unit that differs, by a plain loop over units.
  std::vector<SnapshotPatches::Patch> expected;
  for (uint32_t t = 0; t < m.size(); ++t) {
    const unsigned width = static_cast<unsigned>(codec::dtype_unit_size(m.at(t).dtype));
    for (size_t b = 0; b < old_version[t].size(); b += width) {
      if (std::memcmp(old_version[t].data() + b, new_version[t].data() + b, width) == 0) continue;
      uint32_t unit = 0;
      std::memcpy(&unit, old_version[t].data() + b, width);
      expected.push_back({t, b / width, unit});
    }
  }
  ASSERT_GT(expected.size(), 1000u);
  ASSERT_TRUE(
      std::any_of(expected.begin(), expected.end(), [&](auto& p) { return p.tensor == 0 && p.element * 2 >= piece; }));
  auto same = [](std::vector<SnapshotPatches::Patch> a, const std::vector<SnapshotPatches::Patch>& b) {
    std::sort(a.begin(), a.end());
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](auto& x, auto& y) {
             return x.tensor == y.tensor && x.element == y.element && x.bits == y.bits;
           });
  };
  const codec::testing::MemoryReader reader(weights(new_version));
  for (int mode = 0; mode < 3; ++mode) {  // 0: read; 1: read, with old bits; 2: from spans, with old bits
    auto bits = old_version;
    std::vector<SnapshotPatches::Patch> old_bits;
    if (mode == 2)
      overwrite_with(bits, weights(new_version), &old_bits);
    else
      overwrite_with(bits, reader, mode == 1 ? &old_bits : nullptr);
    ASSERT_TRUE(bits == new_version) << "mode " << mode;
    if (mode > 0) {
      EXPECT_TRUE(same(old_bits, expected)) << "mode " << mode << ": " << old_bits.size() << " old bits";
    }
  }
  for (uint64_t fail_at : {1, 2, 3, 5}) {
    codec::testing::MemoryReader failing(weights(new_version));
    failing.fail_at = fail_at;
    auto bits = old_version;
    std::vector<SnapshotPatches::Patch> old_bits;
    try {
      overwrite_with(bits, failing, &old_bits);
      FAIL() << "read " << fail_at << " failed, overwrite_with did not";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::io);
      EXPECT_NE(std::string(e.what()).find("test.safetensors"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tensor '"), std::string::npos) << e.what();
    }
    if (fail_at > 1) {
      EXPECT_TRUE(bits != old_version) << "read " << fail_at << ": nothing was overwritten before it";
    }
    SnapshotPatches patches;
    patches.record(old_bits);
    for (uint32_t t = 0; t < m.size(); ++t) {
      const unsigned width = static_cast<unsigned>(codec::dtype_unit_size(m.at(t).dtype));
      std::vector<std::byte> out = bits[t];
      patches.restore_and_advance(t, 0, out.size() / width, width, out);
      ASSERT_TRUE(out == old_version[t]) << "read " << fail_at << ", tensor " << t;
    }
  }
}

}  // namespace deltacast::tree
