#pragma once
// Qwen-like decoder shapes for the trainer simulator: embed_tokens, per layer q/k/v/o projections
// (grouped-query attention: k and v are a quarter of the hidden size), gate/up/down MLP
// projections, input and post-attention RMSNorm weights, the final norm and an untied lm_head.
// Weight matrices use PyTorch's [out_features, in_features] layout and Hugging Face names.
#include <cstdint>
#include <string_view>
#include <vector>

#include "codec/manifest.h"

namespace deltacast::sim {

struct ModelShape {
  uint64_t hidden = 0;
  uint64_t kv_dim = 0;        // width of k_proj / v_proj outputs
  uint64_t intermediate = 0;  // MLP width
  uint64_t layers = 0;
  uint64_t vocab = 0;
};

// Parses a parameter count such as "200M", "1.5B", "750K" or "123456".
// Throws Error(invalid_argument) naming the text when it is not a positive count.
uint64_t parse_param_count(std::string_view text);

// A shape whose parameter count is close to `target_params` (within a few percent for targets of
// 1M and up). Depth grows with width roughly as in released models; about a fifth of the
// parameters sit in the embedding and lm_head. Throws Error(invalid_argument) for targets below
// 10K parameters. Pure function.
ModelShape model_shape_for(uint64_t target_params);

// Total elements of all tensors of the shape.
uint64_t parameter_count(const ModelShape& shape);

// The tensors (all BF16) in checkpoint order: embed_tokens, layers 0..L-1, final norm, lm_head.
std::vector<codec::TensorInfo> model_tensors(const ModelShape& shape);

// True for RMSNorm weights (initialised near 1.0 instead of around 0).
bool is_norm_tensor(std::string_view name);

}  // namespace deltacast::sim
