#include "codec/tp_placement.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace deltacast::codec {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
std::string stem(const std::string& s, const std::string& tail) { return s.substr(0, s.size() - tail.size()); }

}  // namespace

std::vector<BufferPlacement> llama_tp_placement(const Manifest& manifest, uint32_t rank, uint32_t size,
                                                uint64_t vocab_pad) {
  if (size == 0 || rank >= size || vocab_pad == 0)
    throw Error(Errc::invalid_argument, "tp placement: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                            " (vocab pad " + std::to_string(vocab_pad) + ") is not a worker");
  auto info_of = [&](const std::string& name) -> const TensorInfo& {
    const auto index = manifest.find(name);
    if (!index) throw Error(Errc::invalid_argument, "tp placement: the checkpoint has no tensor '" + name + "'");
    return manifest.at(*index);
  };
  // Rank's even share of `name` along `dim`.
  auto even = [&](const std::string& name, uint32_t dim) {
    const TensorInfo& t = info_of(name);
    if (dim >= t.shape.size() || t.shape[dim] % size != 0)
      throw Error(Errc::invalid_argument, "tp placement: tensor '" + name + "' dim " + std::to_string(dim) +
                                              " does not split " + std::to_string(size) + " ways");
    const uint64_t per = t.shape[dim] / size;
    return PlacementPart{name, dim, rank * per, (rank + 1) * per, std::nullopt};
  };
  std::vector<BufferPlacement> out;
  for (const TensorInfo& t : manifest.tensors()) {
    const std::string& n = t.name;
    if (ends_with(n, "self_attn.q_proj.weight")) {
      const std::string p = stem(n, "q_proj.weight");
      out.push_back({p + "qkv_proj.weight",
                     {even(n, 0), even(p + "k_proj.weight", 0), even(p + "v_proj.weight", 0)},
                     false,
                     {},
                     0});
    } else if (ends_with(n, "mlp.gate_proj.weight")) {
      const std::string p = stem(n, "gate_proj.weight");
      out.push_back({p + "gate_up_proj.weight", {even(n, 0), even(p + "up_proj.weight", 0)}, false, {}, 0});
    } else if (ends_with(n, "self_attn.o_proj.weight") || ends_with(n, "mlp.down_proj.weight")) {
      out.push_back({n, {even(n, 1)}, false, {}, 0});
    } else if (n == "model.embed_tokens.weight" || n == "lm_head.weight") {
      if (t.shape.size() != 2) throw Error(Errc::invalid_argument, "tp placement: '" + n + "' is not a matrix");
      const uint64_t padded = (t.shape[0] + vocab_pad - 1) / vocab_pad * vocab_pad;
      const uint64_t per = (padded + size - 1) / size;
      const uint64_t begin = rank * per;
      if (begin >= t.shape[0]) continue;  // all padding
      out.push_back({n,
                     {PlacementPart{n, 0, begin, std::min(t.shape[0], begin + per), std::nullopt}},
                     false,
                     {per, t.shape[1]},
                     0});
    } else if (ends_with(n, "self_attn.k_proj.weight") || ends_with(n, "self_attn.v_proj.weight") ||
               ends_with(n, "mlp.up_proj.weight")) {
      continue;                     // fused above
    } else if (!t.shape.empty()) {  // (a 0-d tensor has no slice to name: not held)
      out.push_back({n, {PlacementPart{n, 0, 0, t.shape[0], std::nullopt}}, false, {}, 0});
    }
  }
  return out;
}

}  // namespace deltacast::codec
