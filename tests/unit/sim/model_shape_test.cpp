#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "sim/model_shape.h"
#include "util/error.h"

namespace deltacast::sim {
namespace {

TEST(ModelShape, ParsesParameterCounts) {
  EXPECT_EQ(parse_param_count("200M"), 200'000'000u);
  EXPECT_EQ(parse_param_count("1.5B"), 1'500'000'000u);
  EXPECT_EQ(parse_param_count("750k"), 750'000u);
  EXPECT_EQ(parse_param_count("12345"), 12'345u);
  for (const char* bad : {"", "M", "abc", "-5M", "0", "1.5X", "2MM"}) {
    EXPECT_THROW((void)parse_param_count(bad), Error) << bad;
  }
}

TEST(ModelShape, TotalIsCloseToTheTarget) {
  for (uint64_t target : {1'000'000ull, 20'000'000ull, 200'000'000ull, 500'000'000ull, 1'500'000'000ull, 3'000'000'000ull}) {
    const auto shape = model_shape_for(target);
    const double total = static_cast<double>(parameter_count(shape));
    EXPECT_LT(std::abs(total / static_cast<double>(target) - 1.0), 0.05) << target << " -> " << total;
    uint64_t summed = 0;
    for (const auto& t : model_tensors(shape)) summed += t.numel();
    EXPECT_EQ(summed, parameter_count(shape));
  }
}

TEST(ModelShape, QwenLikeTensorNamesAndOrder) {
  const auto shape = model_shape_for(2'000'000);
  const auto tensors = model_tensors(shape);
  ASSERT_EQ(tensors.size(), 3 + 9 * shape.layers);
  EXPECT_EQ(tensors.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(tensors.back().name, "lm_head.weight");
  EXPECT_EQ(tensors[tensors.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(tensors[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(tensors[2].shape, (std::vector<uint64_t>{shape.hidden, shape.hidden}));
  std::set<std::string> names;
  for (const auto& t : tensors) {
    names.insert(t.name);
    EXPECT_EQ(t.dtype, codec::DType::bf16);
  }
  EXPECT_EQ(names.size(), tensors.size());
  EXPECT_TRUE(is_norm_tensor("model.layers.3.input_layernorm.weight"));
  EXPECT_FALSE(is_norm_tensor("model.layers.3.mlp.up_proj.weight"));
  EXPECT_THROW((void)model_shape_for(100), Error);
}

}  // namespace
}  // namespace deltacast::sim
