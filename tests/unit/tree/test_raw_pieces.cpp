// A full checkpoint as RAW pieces (tree/producer/raw_pieces.h): one producer's pieces and a
// group's, whose ranks' pieces together cover every byte of every tensor exactly once, in whole
// elements of at most chunk_bytes, numbered without overlap; receivers' limit holds.
#include <gtest/gtest.h>

#include <random>

#include "codec/partition.h"
#include "tree/producer/raw_pieces.h"
#include "tree/protocol.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

using codec::DType;
using codec::Manifest;
using codec::Partition;

Manifest random_manifest(std::mt19937_64& rng) {
  static const DType kTypes[] = {DType::bf16, DType::f32, DType::f64, DType::i64, DType::u8, DType::f8_e4m3};
  std::vector<codec::TensorInfo> list;
  const int n = 1 + static_cast<int>(rng() % 25);
  for (int i = 0; i < n; ++i) {
    uint64_t elements = rng() % 6 == 0 ? 0 : 1 + rng() % 30000;
    if (rng() % 8 == 0) elements = 200000 + rng() % 100000;
    list.push_back({"t" + std::to_string(i), kTypes[rng() % std::size(kTypes)], {elements}});
  }
  return Manifest(std::move(list));
}

// Every byte of every tensor covered exactly once by `pieces`, each whole elements within `limit`.
void expect_exact_cover(const Manifest& m, const std::vector<RawPiece>& pieces, uint64_t limit) {
  std::vector<std::vector<uint8_t>> seen(m.size());
  for (uint32_t t = 0; t < m.size(); ++t) seen[t].assign(m.at(t).nbytes(), 0);
  for (const auto& p : pieces) {
    ASSERT_LT(p.tensor, m.size());
    const uint64_t w = codec::dtype_size(m.at(p.tensor).dtype);
    EXPECT_GT(p.size, 0u);
    EXPECT_EQ(p.offset % w, 0u);
    EXPECT_EQ(p.size % w, 0u);
    EXPECT_LE(p.size, std::max(limit, w));
    ASSERT_LE(p.offset + p.size, m.at(p.tensor).nbytes());
    for (uint64_t b = p.offset; b < p.offset + p.size; ++b) ++seen[p.tensor][b];
  }
  for (uint32_t t = 0; t < m.size(); ++t)
    for (uint64_t b = 0; b < seen[t].size(); ++b) ASSERT_EQ(seen[t][b], 1) << "tensor " << t << " byte " << b;
}

TEST(RawPieces, OneProducersPiecesCoverEveryTensorInWholeElementsInOrder) {
  const Manifest m(
      {{"a", DType::bf16, {10}}, {"empty", DType::f32, {0}}, {"b", DType::f64, {5}}, {"c", DType::u8, {3}}});
  const auto pieces = raw_pieces(m, whole_tensors(m), 12);
  // a: 20 bytes in 12 + 8; b: 40 bytes in pieces of 8 (12 rounded down to whole f64); c: 3.
  EXPECT_EQ(pieces, (std::vector<RawPiece>{
                        {0, 0, 12}, {0, 12, 8}, {2, 0, 8}, {2, 8, 8}, {2, 16, 8}, {2, 24, 8}, {2, 32, 8}, {3, 0, 3}}));
  // A limit below one element still sends whole elements.
  EXPECT_EQ(raw_pieces(m, {{2, 0, 4}}, 1), (std::vector<RawPiece>{{2, 0, 8}, {2, 8, 8}}));
  EXPECT_THROW(raw_pieces(m, {{2, 1, 4}}, 64), Error) << "units 1..4 of an f64 split an element";
  EXPECT_THROW(raw_pieces(m, {{0, 0, 11}}, 64), Error) << "beyond the tensor";
}

TEST(RawPieces, AGroupsRanksTogetherSendEveryByteOnceNumberedWithoutOverlap) {
  std::mt19937_64 rng(32);
  for (int round = 0; round < 20; ++round) {
    const Manifest m = random_manifest(rng);
    const uint64_t limit = uint64_t{1} << (6 + rng() % 12);
    const auto single = raw_pieces(m, whole_tensors(m), limit);
    expect_exact_cover(m, single, limit);
    for (uint32_t ranks = 1; ranks <= 8; ++ranks) {
      SCOPED_TRACE("round " + std::to_string(round) + ", " + std::to_string(ranks) + " ranks");
      const Partition p = Partition::balanced(m, ranks);
      const auto first = raw_group_first(m, p, limit);
      ASSERT_EQ(first.size(), ranks + 1);
      std::vector<RawPiece> all;
      for (uint32_t r = 0; r < ranks; ++r) {
        const auto mine = raw_pieces(m, p.part(r), limit);
        EXPECT_EQ(first[r + 1] - first[r], mine.size()) << "rank " << r;
        all.insert(all.end(), mine.begin(), mine.end());
      }
      expect_exact_cover(m, all, limit);
      EXPECT_LE(first.back(), max_raw_chunk_count(m)) << "receivers would refuse the count";
      if (ranks == 1) {
        EXPECT_EQ(all, single) << "one rank sends what one producer sends";
      }
    }
  }
}

}  // namespace
}  // namespace deltacast::tree
