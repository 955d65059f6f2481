// A producer group's parts as a user writes them (tree/group_parts.h): a sharded checkpoint's
// files dealt to the ranks in consecutive blocks (each rank's part the whole tensors of its
// files, so the partition holds every element once), and the JSON parts of the C API and the
// config, with their refusals naming the problem.
#include "tree/group_parts.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/error.h"

namespace deltacast::tree {
namespace {

// Six tensors, one of them FP64 (two codec units an element), in `files` shard files: tensor t
// in file t % files.
struct Sharded {
  codec::Manifest manifest{std::vector<codec::TensorInfo>{{"a", codec::DType::bf16, {10}},
                                                          {"b", codec::DType::f32, {3, 4}},
                                                          {"c", codec::DType::f64, {5}},
                                                          {"d", codec::DType::bf16, {7}},
                                                          {"e", codec::DType::bf16, {1}},
                                                          {"f", codec::DType::bf16, {2}}}};
  CheckpointLayout layout;
  explicit Sharded(uint32_t files) {
    layout.sharded = true;
    for (uint32_t i = 0; i < files; ++i)
      layout.shards.push_back(
          {"model-0000" + std::to_string(i + 1) + "-of-0000" + std::to_string(files) + ".safetensors", {}, {}});
    for (uint32_t t = 0; t < manifest.size(); ++t) layout.shards[t % files].tensors.push_back(t);
  }
};

// The ranks' tensors, in order.
std::vector<std::vector<uint32_t>> tensors_of(const std::vector<std::vector<codec::PartRange>>& parts,
                                              const codec::Manifest& m) {
  std::vector<std::vector<uint32_t>> out;
  for (const auto& part : parts) {
    out.emplace_back();
    for (const auto& r : part) {
      EXPECT_EQ(r.begin, 0u);
      EXPECT_EQ(r.end, m.at(r.tensor).units()) << "a whole tensor, in codec units";
      out.back().push_back(r.tensor);
    }
  }
  return out;
}

TEST(ShardParts, OneFileARankSendsTheFileItWrote) {
  Sharded s(3);
  const auto parts = shard_parts(s.layout, s.manifest, 3);
  EXPECT_EQ(tensors_of(parts, s.manifest), (std::vector<std::vector<uint32_t>>{{0, 3}, {1, 4}, {2, 5}}));
  // The FP64 tensor's range counts two units an element.
  EXPECT_EQ(parts[2][0].end, 10u);
  // A partition the group accepts: every unit exactly once.
  const auto p = codec::Partition::from_parts(s.manifest, parts);
  EXPECT_EQ(p.part_bytes(0) + p.part_bytes(1) + p.part_bytes(2), s.manifest.total_bytes());
}

TEST(ShardParts, MoreFilesThanRanksGoInConsecutiveBlocks) {
  Sharded s(5);  // files 0..4 to 2 ranks: file i to rank i * 2 / 5 = 0, 0, 0, 1, 1
  EXPECT_EQ(tensors_of(shard_parts(s.layout, s.manifest, 2), s.manifest),
            (std::vector<std::vector<uint32_t>>{{0, 5, 1, 2}, {3, 4}}));
  Sharded six(6);  // 6 files to 4 ranks: 0, 0, 1, 2, 2, 3
  EXPECT_EQ(tensors_of(shard_parts(six.layout, six.manifest, 4), six.manifest),
            (std::vector<std::vector<uint32_t>>{{0, 1}, {2}, {3, 4}, {5}}));
}

TEST(ShardParts, RefusedWithoutShardsOrWithFewerFilesThanRanks) {
  Sharded s(2);
  try {
    shard_parts(s.layout, s.manifest, 3);
    FAIL() << "2 files for 3 ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config);
    EXPECT_NE(std::string(e.what()).find("deals 2 shard files to 3 producer ranks"), std::string::npos) << e.what();
  }
  CheckpointLayout none;  // the synthetic trainer
  try {
    shard_parts(none, s.manifest, 2);
    FAIL() << "no files";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a sharded checkpoint"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("synthetic trainer"), std::string::npos) << e.what();
  }
  CheckpointLayout one = s.layout;  // one model.safetensors
  one.sharded = false;
  EXPECT_THROW(shard_parts(one, s.manifest, 2), Error);
  CheckpointLayout lost = s.layout;  // a tensor in no file
  lost.shards[1].tensors.pop_back();
  EXPECT_THROW(shard_parts(lost, s.manifest, 2), Error);
}

TEST(GroupPartsJson, NamesAndElementRangesInCodecUnits) {
  Sharded s(1);
  const auto parts = parse_group_parts(R"([["a", ["c", 0, 2]], [["c", 2, 5], "b", "d", "e", "f"]])", s.manifest, 2);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0][0], (codec::PartRange{0, 0, 10}));
  EXPECT_EQ(parts[0][1], (codec::PartRange{2, 0, 4}));   // FP64 elements 0..2: units 0..4
  EXPECT_EQ(parts[1][0], (codec::PartRange{2, 4, 10}));  // elements 2..5: units 4..10
  codec::Partition::from_parts(s.manifest, parts);       // every unit once: accepted
}

TEST(GroupPartsJson, RefusalsNameTheProblem) {
  Sharded s(1);
  const auto refused = [&](const std::string& text, uint32_t ranks, const std::string& want) {
    try {
      parse_group_parts(text, s.manifest, ranks);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::config) << text;
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << text << ": " << e.what();
    }
  };
  refused("[[\"a\"]", 2, "not JSON");
  refused("[[\"a\"]]", 2, "one entry per rank (2)");
  refused("[[\"a\"], \"b\"]", 2, "rank 1's entry is not an array");
  refused("[[\"a\"], [\"zz\"]]", 2, "names tensor 'zz'");
  refused("[[\"a\"], [[\"d\", 3, 8]]]", 2, "elements [3, 8) of tensor 'd', which has 7");
  refused("[[\"a\"], [7]]", 2, "neither a tensor name nor [name, first, end]");
}

}  // namespace
}  // namespace deltacast::tree
