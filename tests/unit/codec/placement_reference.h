#pragma once
// The reference a placement's mapping is compared against in tests: the buffers an engine holds of
// a set of canonical tensors, built element by element from multi-indices (independently of
// codec/placement.cpp's mapping).
#include <cstring>
#include <string>
#include <vector>

#include "codec/placement.h"

namespace deltacast::codec::testing {

// One layer of a Llama-like model, tiny (vocabulary 100, hidden 8): what the TP helper's tests
// shard.
inline Manifest tiny_llama_manifest() {
  const std::string l = "model.layers.0.";
  return Manifest({{"model.embed_tokens.weight", DType::bf16, {100, 8}},
                   {l + "input_layernorm.weight", DType::bf16, {8}},
                   {l + "self_attn.q_proj.weight", DType::bf16, {8, 8}},
                   {l + "self_attn.k_proj.weight", DType::bf16, {8, 8}},
                   {l + "self_attn.v_proj.weight", DType::bf16, {8, 8}},
                   {l + "self_attn.o_proj.weight", DType::bf16, {8, 8}},
                   {l + "mlp.gate_proj.weight", DType::bf16, {16, 8}},
                   {l + "mlp.up_proj.weight", DType::bf16, {16, 8}},
                   {l + "mlp.down_proj.weight", DType::bf16, {8, 16}},
                   {"model.norm.weight", DType::bf16, {8}},
                   {"lm_head.weight", DType::bf16, {100, 8}}});
}

inline std::vector<uint64_t> unravel(uint64_t flat, const std::vector<uint64_t>& shape) {
  std::vector<uint64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = flat % shape[i];
    flat /= shape[i];
  }
  return idx;
}
inline uint64_t ravel(const std::vector<uint64_t>& idx, const std::vector<uint64_t>& shape) {
  uint64_t flat = 0;
  for (size_t i = 0; i < shape.size(); ++i) flat = flat * shape[i] + idx[i];
  return flat;
}

// The buffers a placement's engine holds of `weights` (padding: 0xEE), built element by element
// from multi-indices: the reference the placement's mapping is compared against.
inline std::vector<std::vector<std::byte>> slices_of(const Placement& p, const Manifest& m,
                                                     const std::vector<std::vector<std::byte>>& weights) {
  std::vector<std::vector<std::byte>> out;
  for (uint32_t b = 0; b < p.buffers().size(); ++b) {
    const BufferPlacement& spec = p.buffers()[b];
    const size_t esize = dtype_size(p.dtype(b));
    std::vector<std::byte> buf(p.buffer_units(b) / dtype_units_per_element(p.dtype(b)) * esize, std::byte{0xEE});
    uint64_t next = 0;
    for (const auto& part : spec.parts) {
      const TensorInfo& t = m.at(*m.find(part.tensor));
      std::vector<uint64_t> slice = t.shape;
      slice[part.dim] = part.stop - part.start;
      const uint64_t at = part.at.value_or(next);
      next = at + (spec.stack ? 1 : slice[part.dim]);
      uint64_t n = 1;
      for (uint64_t d : slice) n *= d;
      for (uint64_t e = 0; e < n; ++e) {
        std::vector<uint64_t> idx = unravel(e, slice);
        std::vector<uint64_t> canonical = idx;
        canonical[part.dim] += part.start;
        std::vector<uint64_t> in_buffer = idx;
        if (spec.stack)
          in_buffer.insert(in_buffer.begin(), at);
        else
          in_buffer[part.dim] += at;
        std::memcpy(buf.data() + ravel(in_buffer, p.shape(b)) * esize,
                    weights[*m.find(part.tensor)].data() + ravel(canonical, t.shape) * esize, esize);
      }
    }
    out.push_back(std::move(buf));
  }
  return out;
}

}  // namespace deltacast::codec::testing
