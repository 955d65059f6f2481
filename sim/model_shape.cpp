#include "sim/model_shape.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "util/error.h"

namespace deltacast::sim {
namespace {

uint64_t round_to(double value, uint64_t multiple) {
  const auto n = static_cast<uint64_t>(std::llround(value / static_cast<double>(multiple)));
  return std::max<uint64_t>(1, n) * multiple;
}

uint64_t layer_params(const ModelShape& s) {
  const uint64_t h = s.hidden;
  return 2 * h * h + 2 * h * s.kv_dim + 3 * h * s.intermediate + 2 * h;
}

}  // namespace

uint64_t parse_param_count(std::string_view text) {
  const std::string original(text);
  double multiplier = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K': case 'k': multiplier = 1e3; break;
      case 'M': case 'm': multiplier = 1e6; break;
      case 'B': case 'b': case 'G': case 'g': multiplier = 1e9; break;
      default: break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  double value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || !(value > 0) ||
      value * multiplier > 1e13) {
    throw Error(Errc::invalid_argument, "bad parameter count '" + original + "' (expected e.g. 200M, 1.5B)");
  }
  return static_cast<uint64_t>(std::llround(value * multiplier));
}

ModelShape model_shape_for(uint64_t target_params) {
  if (target_params < 10'000) {
    throw Error(Errc::invalid_argument, "parameter count " + std::to_string(target_params) + " is too small (minimum 10K)");
  }
  const double target = static_cast<double>(target_params);
  ModelShape s;
  // With depth ~ hidden/48 and a 11/3 MLP ratio, the layers hold ~0.28 * hidden^3 parameters;
  // give them four fifths of the budget.
  const uint64_t align = target >= 5e7 ? 64 : 16;
  s.hidden = round_to(std::cbrt(0.8 * target / 0.28), align);
  s.kv_dim = std::max<uint64_t>(align, s.hidden / 4);
  s.intermediate = round_to(static_cast<double>(s.hidden) * 11.0 / 3.0, align);
  const double per_layer = static_cast<double>(layer_params(s));
  s.layers = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(0.8 * target / per_layer)));
  // The vocabulary absorbs the remainder (embed_tokens + lm_head = 2 * vocab * hidden).
  const double rest = target - static_cast<double>(s.layers * layer_params(s) + s.hidden);
  s.vocab = std::clamp<uint64_t>(round_to(std::max(rest, 0.0) / (2.0 * static_cast<double>(s.hidden)), 64), 64, 151'936);
  return s;
}

uint64_t parameter_count(const ModelShape& s) {
  return s.layers * layer_params(s) + 2 * s.vocab * s.hidden + s.hidden;
}

std::vector<codec::TensorInfo> model_tensors(const ModelShape& s) {
  using codec::DType;
  std::vector<codec::TensorInfo> out;
  auto add = [&](std::string name, std::vector<uint64_t> shape) {
    out.push_back(codec::TensorInfo{std::move(name), DType::bf16, std::move(shape)});
  };
  const uint64_t h = s.hidden;
  add("model.embed_tokens.weight", {s.vocab, h});
  for (uint64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {h, h});
    add(p + "self_attn.k_proj.weight", {s.kv_dim, h});
    add(p + "self_attn.v_proj.weight", {s.kv_dim, h});
    add(p + "self_attn.o_proj.weight", {h, h});
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "mlp.gate_proj.weight", {s.intermediate, h});
    add(p + "mlp.up_proj.weight", {s.intermediate, h});
    add(p + "mlp.down_proj.weight", {h, s.intermediate});
  }
  add("model.norm.weight", {h});
  add("lm_head.weight", {s.vocab, h});
  return out;
}

bool is_norm_tensor(std::string_view name) {
  return name.ends_with("layernorm.weight") || name == "model.norm.weight";
}

}  // namespace deltacast::sim
