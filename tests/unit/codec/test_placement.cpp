// A receiver's placement (codec/placement.h): which canonical units each of its buffers holds, for
// row, column, 3-D, fused and expert-stacked slices, padding and edge slices; every validation
// error; and a property test: random placements and random changes applied through the placement
// equal a dense apply followed by slicing (computed here from multi-indices, not by the code under
// test).
#include "codec/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codec/tp_placement.h"
#include "placement_reference.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

using testing::slices_of;

Manifest manifest_of(std::vector<TensorInfo> tensors) { return Manifest(std::move(tensors)); }

PlacementPart part(std::string tensor, uint32_t dim, uint64_t start, uint64_t stop,
                   std::optional<uint64_t> at = std::nullopt) {
  return PlacementPart{std::move(tensor), dim, start, stop, at};
}
BufferPlacement buf(std::string name, std::vector<PlacementPart> parts, bool stack = false,
                    std::vector<uint64_t> shape = {}, uint64_t bytes = 0) {
  return BufferPlacement{std::move(name), std::move(parts), stack, std::move(shape), bytes};
}

// Every canonical unit of `tensor` the placement holds, with where: from locate().
std::vector<std::pair<uint64_t, PlacedUnit>> held_units(const Placement& p, const Manifest& m, uint32_t tensor) {
  std::vector<std::pair<uint64_t, PlacedUnit>> out;
  for (uint64_t u = 0; u < m.at(tensor).units(); ++u)
    for (const auto& at : p.locate(tensor, u)) out.emplace_back(u, at);
  return out;
}

// The same from for_each_run over [first, last).
std::vector<std::pair<uint64_t, PlacedUnit>> run_units(const Placement& p, uint32_t tensor, uint64_t first,
                                                       uint64_t last) {
  std::vector<std::pair<uint64_t, PlacedUnit>> out;
  p.for_each_run(tensor, first, last, [&](const PlacedRun& r) {
    for (uint64_t i = 0; i < r.count; ++i) out.emplace_back(r.unit + i, PlacedUnit{r.buffer, r.buffer_unit + i});
  });
  return out;
}

std::string error_of(const Manifest& m, std::vector<BufferPlacement> buffers) {
  try {
    Placement::compile(m, std::move(buffers));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    return e.what();
  }
  return "";
}

TEST(Placement, RowSliceIsOneContiguousRun) {
  const Manifest m = manifest_of({{"w", DType::bf16, {6, 4}}});
  const Placement p = Placement::compile(m, {buf("w_shard", {part("w", 0, 2, 5)})});
  EXPECT_EQ(p.shape(0), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(p.buffer_units(0), 12u);
  EXPECT_TRUE(p.needs(0));
  EXPECT_TRUE(p.locate(0, 7).empty()) << "row 1 is not held";
  ASSERT_EQ(p.locate(0, 8).size(), 1u);
  EXPECT_EQ(p.locate(0, 8)[0], (PlacedUnit{0, 0}));    // first element of the slice
  EXPECT_EQ(p.locate(0, 19)[0], (PlacedUnit{0, 11}));  // last
  EXPECT_TRUE(p.locate(0, 20).empty());
  std::vector<PlacedRun> runs;
  p.for_each_run(0, 0, 24, [&](const PlacedRun& r) { runs.push_back(r); });
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].unit, 8u);
  EXPECT_EQ(runs[0].buffer_unit, 0u);
  EXPECT_EQ(runs[0].count, 12u);
}

TEST(Placement, ColumnSliceIsOneRunPerRow) {
  const Manifest m = manifest_of({{"w", DType::bf16, {4, 6}}});
  const Placement p = Placement::compile(m, {buf("w_shard", {part("w", 1, 2, 4)})});
  EXPECT_EQ(p.shape(0), (std::vector<uint64_t>{4, 2}));
  std::vector<PlacedRun> runs;
  p.for_each_run(0, 0, 24, [&](const PlacedRun& r) { runs.push_back(r); });
  ASSERT_EQ(runs.size(), 4u);
  for (uint64_t row = 0; row < 4; ++row) {
    EXPECT_EQ(runs[row].unit, row * 6 + 2);
    EXPECT_EQ(runs[row].buffer_unit, row * 2);
    EXPECT_EQ(runs[row].count, 2u);
  }
  // A range that starts and ends inside runs.
  std::vector<PlacedRun> inside;
  p.for_each_run(0, 9, 15, [&](const PlacedRun& r) { inside.push_back(r); });
  ASSERT_EQ(inside.size(), 2u);  // row 1's columns 2..3 are units 8..9: only 9; row 2's 14..15: 14
  EXPECT_EQ(inside[0].unit, 9u);
  EXPECT_EQ(inside[0].buffer_unit, 3u);
  EXPECT_EQ(inside[0].count, 1u);
  EXPECT_EQ(inside[1].unit, 14u);
  EXPECT_EQ(inside[1].buffer_unit, 4u);
  EXPECT_EQ(inside[1].count, 1u);
  EXPECT_EQ(p.locate(0, 14)[0], (PlacedUnit{0, 4}));
  // A single column, a single row.
  const Placement column = Placement::compile(m, {buf("c", {part("w", 1, 5, 6)})});
  EXPECT_EQ(column.shape(0), (std::vector<uint64_t>{4, 1}));
  EXPECT_EQ(column.locate(0, 23)[0], (PlacedUnit{0, 3}));
  const Placement row = Placement::compile(m, {buf("r", {part("w", 0, 3, 4)})});
  EXPECT_EQ(row.locate(0, 18)[0], (PlacedUnit{0, 0}));
  EXPECT_TRUE(row.locate(0, 17).empty());
}

TEST(Placement, FusedQkvRowsSideBySide) {
  const Manifest m = manifest_of(
      {{"q", DType::bf16, {8, 4}}, {"k", DType::bf16, {4, 4}}, {"v", DType::bf16, {4, 4}}, {"o", DType::bf16, {4, 8}}});
  // Rank 1 of 2: q rows 4:8, k rows 2:4, v rows 2:4 -> qkv [8, 4]; o not needed.
  const Placement p = Placement::compile(m, {buf("qkv", {part("q", 0, 4, 8), part("k", 0, 2, 4), part("v", 0, 2, 4)})});
  EXPECT_EQ(p.shape(0), (std::vector<uint64_t>{8, 4}));
  EXPECT_FALSE(p.needs(3));
  EXPECT_EQ(p.locate(0, 16)[0], (PlacedUnit{0, 0}));   // q row 4
  EXPECT_EQ(p.locate(1, 8)[0], (PlacedUnit{0, 16}));   // k row 2 after q's 4 rows
  EXPECT_EQ(p.locate(2, 15)[0], (PlacedUnit{0, 31}));  // v's last unit is the buffer's last
}

TEST(Placement, ThreeDimensionalSliceAndEightByteUnits) {
  const Manifest m = manifest_of({{"t", DType::f64, {2, 3, 4}}});
  const Placement p = Placement::compile(m, {buf("b", {part("t", 1, 1, 3)})});
  EXPECT_EQ(p.shape(0), (std::vector<uint64_t>{2, 2, 4}));
  EXPECT_EQ(p.buffer_units(0), 32u);  // 16 elements of two units
  // Element (1, 2, 3) is unit 2 * (1*12 + 2*4 + 3) = 46; in the buffer (1, 1, 3): 2 * 15 = 30, +1.
  EXPECT_EQ(p.locate(0, 46)[0], (PlacedUnit{0, 30}));
  EXPECT_EQ(p.locate(0, 47)[0], (PlacedUnit{0, 31}));
  EXPECT_TRUE(p.locate(0, 7).empty()) << "(0, 0, 3) is outside dim 1's 1:3";
  EXPECT_EQ(p.locate(0, 8)[0], (PlacedUnit{0, 0})) << "(0, 1, 0) is the buffer's first element";
}

TEST(Placement, ExpertsStackAlongANewLeadingDimension) {
  const Manifest m =
      manifest_of({{"e0", DType::bf16, {4, 3}}, {"e1", DType::bf16, {4, 3}}, {"e2", DType::bf16, {4, 3}}});
  // Each expert's rows 2:4, stacked; e2 first (at 0), then e0, e1 after it in order.
  BufferPlacement b = buf("experts", {part("e2", 0, 2, 4, 0), part("e0", 0, 2, 4, 1), part("e1", 0, 2, 4, 2)}, true);
  const Placement p = Placement::compile(m, {b});
  EXPECT_EQ(p.shape(0), (std::vector<uint64_t>{3, 2, 3}));
  EXPECT_EQ(p.locate(2, 6)[0], (PlacedUnit{0, 0}));
  EXPECT_EQ(p.locate(0, 6)[0], (PlacedUnit{0, 6}));
  EXPECT_EQ(p.locate(1, 11)[0], (PlacedUnit{0, 17}));
  EXPECT_TRUE(p.locate(1, 5).empty());
}

TEST(Placement, PaddedVocabularyRowsAreNeverWritten) {
  const Manifest m = manifest_of({{"embed", DType::bf16, {10, 4}}});
  // The last rank's vocabulary rows 6:10 in a buffer padded to 8 rows.
  BufferPlacement b = buf("embed_shard", {part("embed", 0, 6, 10)}, false, {8, 4}, 64);
  const Placement p = Placement::compile(m, {b});
  EXPECT_EQ(p.shape(0), (std::vector<uint64_t>{8, 4}));
  std::set<uint64_t> written;
  for (const auto& [u, at] : held_units(p, m, 0)) written.insert(at.unit);
  EXPECT_EQ(written.size(), 16u);
  EXPECT_EQ(*written.rbegin(), 15u) << "rows 4..7 are padding";
  // Leading padding with an explicit offset.
  BufferPlacement lead = buf("lead", {part("embed", 0, 0, 2, 3)}, false, {5, 4});
  EXPECT_EQ(Placement::compile(m, {lead}).locate(0, 0)[0], (PlacedUnit{0, 12}));
}

TEST(Placement, ATensorInTwoBuffersIsHeldInBoth) {
  const Manifest m = manifest_of({{"tied", DType::bf16, {4, 2}}});
  const Placement p =
      Placement::compile(m, {buf("embed", {part("tied", 0, 0, 4)}), buf("head", {part("tied", 0, 2, 4)})});
  const auto at = p.locate(0, 5);
  ASSERT_EQ(at.size(), 2u);
  EXPECT_EQ(at[0], (PlacedUnit{0, 5}));
  EXPECT_EQ(at[1], (PlacedUnit{1, 1}));
}

TEST(Placement, GatherAndScatterRefuseWhatDoesNotFitAndScatterLandsRawPieces) {
  const Manifest m = manifest_of({{"w", DType::bf16, {6, 4}}});
  const Manifest other = manifest_of({{"w", DType::bf16, {4, 6}}});
  const Placement p = Placement::compile(m, {buf("w_shard", {part("w", 1, 0, 2)})});
  std::vector<std::byte> whole(48), shard(24);
  std::vector<std::span<std::byte>> buffers{shard};
  EXPECT_NO_THROW(gather_placed(p, ConstWeights{&m, {whole}}, buffers));
  EXPECT_THROW(gather_placed(p, ConstWeights{&other, {whole}}, buffers), Error);
  // A RAW piece that splits a unit, lies past the tensor or names no tensor: refused, nothing written.
  std::fill(shard.begin(), shard.end(), std::byte{0x5A});
  const std::vector<std::byte> before = shard;
  EXPECT_THROW(scatter_placed(p, m, 0, 1, std::span(whole).first(4), buffers), Error);
  EXPECT_THROW(scatter_placed(p, m, 0, 46, std::span(whole).first(4), buffers), Error);
  EXPECT_THROW(scatter_placed(p, m, 1, 0, std::span(whole).first(4), buffers), Error);
  EXPECT_THROW(scatter_placed(p, other, 0, 0, std::span(whole).first(4), buffers), Error);
  EXPECT_EQ(shard, before);
  // Row 1 of w (bytes 8..16): its columns 0:2 land at shard row 1.
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<std::byte>(i);
  EXPECT_EQ(scatter_placed(p, m, 0, 8, std::span(whole).subspan(8, 8), buffers), 2u);
  EXPECT_EQ(shard[4], std::byte{8});
  EXPECT_EQ(shard[7], std::byte{11});
  EXPECT_EQ(shard[8], std::byte{0x5A}) << "row 2 untouched";
  std::vector<std::byte> short_shard(22);
  std::vector<std::span<std::byte>> short_buffers{short_shard};
  EXPECT_THROW(gather_placed(p, ConstWeights{&m, {whole}}, short_buffers), Error);
}

TEST(Placement, EveryValidationErrorNamesTheBufferAndPart) {
  const Manifest m = manifest_of(
      {{"a", DType::bf16, {4, 6}}, {"b", DType::bf16, {2, 6}}, {"f", DType::f32, {4, 6}}, {"s", DType::bf16, {}}});
  auto has = [](const std::string& error, const std::string& what) {
    EXPECT_NE(error.find(what), std::string::npos) << error;
  };
  std::string e = error_of(m, {buf("x", {part("a", 0, 0, 4), part("nope", 0, 0, 1)})});
  has(e, "buffer 'x' part 1 (nope 0:1 along dim 0)");
  has(e, "no tensor of that name");
  has(error_of(m, {buf("x", {part("a", 0, 2, 5)})}), "slice out of range: the tensor's dim 0 has 4");
  has(error_of(m, {buf("x", {part("a", 0, 3, 3)})}), "slice out of range");
  has(error_of(m, {buf("x", {part("a", 2, 0, 1)})}), "the tensor has 2 dimensions [4, 6]: no dim 2");
  has(error_of(m, {buf("x", {part("s", 0, 0, 1)})}), "the tensor has 0 dimensions");
  has(error_of(m, {buf("x", {part("a", 0, 0, 4), part("f", 0, 0, 4)})}),
      "part 1 (f 0:4 along dim 0): dtype mismatch: the tensor is F32, part 0's BF16");
  has(error_of(m, {buf("x", {part("a", 0, 0, 4), part("b", 1, 0, 6)})}),
      "parts do not concatenate: it slices dim 1, part 0 dim 0");
  has(error_of(m, {buf("x", {part("a", 1, 0, 3), part("b", 1, 0, 3)})}),
      "parts do not concatenate: its slice is [2, 3], part 0's [4, 3]");
  BufferPlacement stacked = buf("x", {part("a", 0, 0, 2), part("b", 0, 0, 1)}, true);
  has(error_of(m, {stacked}), "parts do not stack");
  BufferPlacement overlap = buf("x", {part("a", 0, 0, 2), part("b", 0, 0, 2, 1)});
  has(error_of(m, {overlap}), "part 1 (b 0:2 along dim 0): overlaps part 0 at 1");
  BufferPlacement same_slot = buf("x", {part("a", 0, 0, 2, 0), part("b", 0, 0, 2, 0)}, true);
  has(error_of(m, {same_slot}), "overlaps part 0 at 0 along the buffer's stacking dimension");
  BufferPlacement small = buf("x", {part("a", 0, 0, 4)}, false, {3, 6});
  has(error_of(m, {small}), "its parts reach 4 along dim 0, past its shape [3, 6]");
  BufferPlacement other_dims = buf("x", {part("a", 0, 0, 4)}, false, {4, 5});
  has(error_of(m, {other_dims}), "its shape [4, 5] does not hold its parts [4, 6]");
  BufferPlacement wrong_bytes = buf("x", {part("a", 0, 0, 2)}, false, {}, 25);
  has(error_of(m, {wrong_bytes}), "buffer 'x': wrong size: 25 bytes, its shape [2, 6] of BF16 is 24");
  has(error_of(m, {buf("x", {})}), "buffer 'x': has no parts");
  has(error_of(m, {buf("x", {part("a", 0, 0, 1)}), buf("x", {part("b", 0, 0, 1)})}), "buffer 'x': named twice");
  EXPECT_EQ(error_of(m, {buf("x", {part("a", 0, 0, 2), part("b", 0, 0, 2)})}), "") << "a valid placement";
}

// Where some member holds a range only partly: row slices split only the ranges that straddle
// their edges, column slices every range of more than one row's worth; whole tensors, unheld
// tensors and tied copies (the union counts) split nothing.
TEST(HeldSlices, SplitsOnlyRangesAMemberHoldsPartly) {
  const Manifest m = manifest_of({{"w", DType::bf16, {8, 4}}, {"v", DType::bf16, {8, 4}}});
  HeldSlices none;
  EXPECT_TRUE(none.empty());
  EXPECT_FALSE(none.splits(0, 0, 32));
  HeldSlices rows;
  rows.add(Placement::compile(m, {buf("w_shard", {part("w", 0, 2, 6)})}));  // units 8..23
  EXPECT_FALSE(rows.empty());
  EXPECT_TRUE(rows.splits(0, 0, 32));
  EXPECT_TRUE(rows.splits(0, 4, 12)) << "straddles the slice's first row";
  EXPECT_TRUE(rows.splits(0, 20, 28)) << "straddles its end";
  EXPECT_FALSE(rows.splits(0, 8, 24)) << "wholly held";
  EXPECT_FALSE(rows.splits(0, 10, 12));
  EXPECT_FALSE(rows.splits(0, 0, 8)) << "wholly outside";
  EXPECT_FALSE(rows.splits(0, 24, 32));
  EXPECT_FALSE(rows.splits(1, 0, 32)) << "a tensor this member does not need";
  HeldSlices columns;
  columns.add(Placement::compile(m, {buf("w_cols", {part("w", 1, 0, 2)})}));
  EXPECT_TRUE(columns.splits(0, 0, 32));
  EXPECT_TRUE(columns.splits(0, 1, 3));
  EXPECT_FALSE(columns.splits(0, 4, 6)) << "one row's held columns";
  EXPECT_FALSE(columns.splits(0, 6, 8)) << "one row's other columns";
  HeldSlices whole;
  whole.add(Placement::compile(m, {buf("w", {part("w", 0, 0, 8)})}));
  EXPECT_FALSE(whole.splits(0, 0, 32));
  // Two buffers holding rows 0:4 and 2:8 of v hold all of it: nothing split.
  HeldSlices tied;
  tied.add(Placement::compile(m, {buf("a", {part("v", 0, 0, 4)}), buf("b", {part("v", 0, 2, 8)})}));
  EXPECT_FALSE(tied.splits(1, 0, 32));
  // Several members: any one that holds a range partly splits it.
  rows.add(Placement::compile(m, {buf("w_rest", {part("w", 0, 6, 8)})}));
  EXPECT_TRUE(rows.splits(0, 20, 32)) << "the first member holds 20..23 only";
}

// The vLLM-style helper: fused and split as the engine shards, the vocabulary padded to 64.
TEST(LlamaTpPlacement, FusesAndSplitsAsVllmAndPadsTheVocabulary) {
  const std::string l = "model.layers.0.";
  const Manifest m = testing::tiny_llama_manifest();
  auto find = [](const std::vector<BufferPlacement>& b, const std::string& name) {
    const auto it = std::find_if(b.begin(), b.end(), [&](const BufferPlacement& x) { return x.name == name; });
    return it == b.end() ? nullptr : &*it;
  };
  auto same = [](const PlacementPart& p, const std::string& t, uint32_t dim, uint64_t start, uint64_t stop) {
    return p.tensor == t && p.dim == dim && p.start == start && p.stop == stop;
  };
  const auto r1 = llama_tp_placement(m, 1, 2);
  const Placement compiled = Placement::compile(m, r1);  // valid as given
  const auto* qkv = find(r1, l + "self_attn.qkv_proj.weight");
  ASSERT_NE(qkv, nullptr);
  ASSERT_EQ(qkv->parts.size(), 3u);
  EXPECT_TRUE(same(qkv->parts[0], l + "self_attn.q_proj.weight", 0, 4, 8));
  EXPECT_TRUE(same(qkv->parts[1], l + "self_attn.k_proj.weight", 0, 4, 8));
  EXPECT_TRUE(same(qkv->parts[2], l + "self_attn.v_proj.weight", 0, 4, 8));
  const auto* gate_up = find(r1, l + "mlp.gate_up_proj.weight");
  ASSERT_NE(gate_up, nullptr);
  EXPECT_TRUE(same(gate_up->parts[0], l + "mlp.gate_proj.weight", 0, 8, 16));
  EXPECT_TRUE(same(gate_up->parts[1], l + "mlp.up_proj.weight", 0, 8, 16));
  EXPECT_TRUE(same(find(r1, l + "self_attn.o_proj.weight")->parts[0], l + "self_attn.o_proj.weight", 1, 4, 8));
  EXPECT_TRUE(same(find(r1, l + "mlp.down_proj.weight")->parts[0], l + "mlp.down_proj.weight", 1, 8, 16));
  EXPECT_TRUE(same(find(r1, l + "input_layernorm.weight")->parts[0], l + "input_layernorm.weight", 0, 0, 8));
  EXPECT_EQ(find(r1, l + "self_attn.k_proj.weight"), nullptr);  // fused, not a buffer of its own
  // Vocabulary 100 padded to 128: rank 1 of 2 holds rows 64:100 of a 64-row buffer.
  const auto* embed = find(r1, "model.embed_tokens.weight");
  EXPECT_TRUE(same(embed->parts[0], "model.embed_tokens.weight", 0, 64, 100));
  EXPECT_EQ(embed->shape, (std::vector<uint64_t>{64, 8}));
  for (uint32_t b = 0; b < compiled.buffers().size(); ++b)
    if (compiled.buffers()[b].name == "lm_head.weight") {
      EXPECT_EQ(compiled.buffer_units(b), 64u * 8);
    }
  // Rank 7 of 8: rows 112:128 are all padding, so it has no buffer for the vocabulary.
  const auto r7 = llama_tp_placement(m, 7, 8);
  EXPECT_EQ(find(r7, "lm_head.weight"), nullptr);
  EXPECT_TRUE(same(find(r7, l + "self_attn.qkv_proj.weight")->parts[1], l + "self_attn.k_proj.weight", 0, 7, 8));
  // A split the engine would refuse names the tensor.
  try {
    llama_tp_placement(m, 0, 3);
    FAIL() << "3 ways";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_proj.weight' dim 0 does not split 3 ways"), std::string::npos) << e.what();
  }
  EXPECT_THROW(llama_tp_placement(m, 2, 2), Error);
}

// --- Property: random manifests and placements, random changes ---------------------------------

TEST(PlacementProperty, ApplyingThroughThePlacementEqualsADenseApplyThenSlicing) {
  std::mt19937_64 rng(20261206);
  auto pick = [&](uint64_t n) { return static_cast<uint64_t>(rng() % n); };
  const DType dtypes[] = {DType::bf16, DType::f32, DType::f64, DType::u8};
  int fused = 0, stacked = 0, padded = 0;  // buffers of each kind the trials made
  for (int trial = 0; trial < 300; ++trial) {
    // Tensors of one dtype (so buffers may fuse any of them), ranks 1..3, dims 1..5.
    const DType dtype = dtypes[pick(4)];
    std::vector<TensorInfo> infos;
    const uint64_t count = 1 + pick(4);
    for (uint64_t t = 0; t < count; ++t) {
      std::vector<uint64_t> shape(1 + pick(3));
      for (auto& d : shape) d = 1 + pick(t == 0 ? 5 : 3);  // small dims: tensors that fuse
      infos.push_back({"t" + std::to_string(t), dtype, shape});
    }
    const Manifest m(infos);
    // Buffers: 1..3, each of parts that share a dim; fused parts take tensors with the same other
    // dims (tried: parts that do not fit are dropped), some stacked, some padded.
    std::vector<BufferPlacement> buffers;
    for (uint64_t b = 0, n = 1 + pick(3); b < n; ++b) {
      BufferPlacement spec = buf("b" + std::to_string(b), {}, pick(4) == 0);
      const TensorInfo& lead = infos[pick(count)];
      const uint32_t dim = static_cast<uint32_t>(pick(lead.shape.size()));
      for (uint64_t k = 0, parts = 1 + pick(3); k < parts; ++k) {
        const TensorInfo& t = k == 0 ? lead : infos[pick(count)];
        if (t.shape.size() != lead.shape.size()) continue;
        const uint64_t start = pick(t.shape[dim]);
        PlacementPart part = codec::part(t.name, dim, start, start + 1 + pick(t.shape[dim] - start));
        if (spec.stack)
          part.stop =
              k == 0 || spec.parts.empty() ? part.stop : part.start + (spec.parts[0].stop - spec.parts[0].start);
        spec.parts.push_back(part);
        if (!error_of(m, {spec}).empty()) spec.parts.pop_back();
      }
      fused += !spec.stack && spec.parts.size() > 1;
      stacked += spec.stack && spec.parts.size() > 1;
      if (pick(3) == 0) {
        padded += 1;
        // Pad along the parts' dimension.
        const Placement alone = Placement::compile(m, {spec});
        spec.shape = alone.shape(0);
        spec.shape[spec.stack ? 0 : dim] += 1 + pick(3);
      }
      buffers.push_back(spec);
    }
    const Placement p = Placement::compile(m, buffers);
    // Versions: random old bits; new = old with random elements changed (none, some, all).
    std::vector<std::vector<std::byte>> old_w, new_w;
    for (const auto& t : infos) {
      std::vector<std::byte> bytes(t.nbytes());
      for (auto& x : bytes) x = static_cast<std::byte>(rng());
      old_w.push_back(bytes);
      const uint64_t mode = pick(3);
      for (uint64_t e = 0; e < t.numel(); ++e)
        if (mode == 2 || (mode == 1 && pick(3) == 0))
          for (size_t i = 0; i < dtype_size(dtype); ++i)
            bytes[e * dtype_size(dtype) + i] ^= static_cast<std::byte>(1 + pick(255));
      new_w.push_back(bytes);
    }
    // Through the placement: the engine's buffers at the old version, each changed unit written
    // where locate() says.
    auto buffers_now = slices_of(p, m, old_w);
    const size_t unit = dtype_unit_size(dtype);
    for (uint32_t t = 0; t < infos.size(); ++t)
      for (uint64_t u = 0; u < infos[t].units(); ++u) {
        if (std::memcmp(old_w[t].data() + u * unit, new_w[t].data() + u * unit, unit) == 0) continue;
        for (const auto& at : p.locate(t, u))
          std::memcpy(buffers_now[at.buffer].data() + at.unit * unit, new_w[t].data() + u * unit, unit);
      }
    ASSERT_EQ(buffers_now, slices_of(p, m, new_w)) << "trial " << trial;
    // gather_placed copies the same out of the whole tensors (padding untouched: 0xEE as the reference's).
    {
      std::vector<std::vector<std::byte>> gathered;
      gathered.reserve(p.buffers().size());
      for (uint32_t b = 0; b < p.buffers().size(); ++b)
        gathered.emplace_back(p.buffer_units(b) * dtype_unit_size(p.dtype(b)), std::byte{0xEE});
      const std::vector<std::span<std::byte>> spans(gathered.begin(), gathered.end());
      ConstWeights whole{&m, {}};
      for (const auto& t : new_w) whole.tensors.emplace_back(t);
      gather_placed(p, whole, spans);
      ASSERT_EQ(gathered, slices_of(p, m, new_w)) << "trial " << trial;
      // scatter_placed lands the same from RAW pieces: each tensor cut at random units, the
      // pieces in random order.
      for (auto& g : gathered) std::fill(g.begin(), g.end(), std::byte{0xEE});
      struct Piece {
        uint32_t tensor;
        uint64_t offset, size;
      };
      std::vector<Piece> pieces;
      const uint64_t unit_bytes = dtype_unit_size(dtype);
      for (uint32_t t = 0; t < infos.size(); ++t)
        for (uint64_t u = 0, units = infos[t].units(); u < units;) {
          const uint64_t n = 1 + pick(units - u);
          pieces.push_back({t, u * unit_bytes, n * unit_bytes});
          u += n;
        }
      std::shuffle(pieces.begin(), pieces.end(), rng);
      for (const Piece& piece : pieces)
        scatter_placed(p, m, piece.tensor, piece.offset,
                       std::span<const std::byte>(new_w[piece.tensor]).subspan(piece.offset, piece.size), spans);
      ASSERT_EQ(gathered, slices_of(p, m, new_w)) << "trial " << trial << ": scattered pieces";
    }
    // for_each_run over random ranges gives exactly what locate() gives.
    for (uint32_t t = 0; t < infos.size(); ++t) {
      const uint64_t units = infos[t].units();
      const uint64_t first = pick(units + 1), last = first + pick(units - first + 1);
      auto from_runs = run_units(p, t, first, last);
      std::vector<std::pair<uint64_t, PlacedUnit>> from_locate;
      for (const auto& [u, at] : held_units(p, m, t))
        if (u >= first && u < last) from_locate.emplace_back(u, at);
      std::sort(from_runs.begin(), from_runs.end());
      std::sort(from_locate.begin(), from_locate.end());
      ASSERT_EQ(from_runs, from_locate) << "trial " << trial << " tensor " << t;
    }
  }
  // The trials covered every kind of buffer, many times.
  EXPECT_GT(fused, 50);
  EXPECT_GT(stacked, 20);
  EXPECT_GT(padded, 50);
}

}  // namespace
}  // namespace deltacast::codec
