#include "codec/manifest.h"

#include <cstring>

#include <xxhash.h>

#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::codec {

uint64_t TensorInfo::numel() const noexcept {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}
uint64_t TensorInfo::nbytes() const noexcept { return numel() * dtype_size(dtype); }
uint64_t TensorInfo::units() const noexcept { return numel() * dtype_units_per_element(dtype); }

Manifest::Manifest(std::vector<TensorInfo> tensors) : tensors_(std::move(tensors)) {
  std::vector<std::byte> canonical;
  ByteWriter w(canonical);
  w.u64(tensors_.size());
  for (uint32_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    if (t.name.empty()) throw Error(Errc::invalid_argument, "manifest: tensor " + std::to_string(i) + " has an empty name");
    if (dtype_size(t.dtype) == 0) throw Error(Errc::invalid_argument, "manifest: tensor '" + t.name + "' has an unknown dtype");
    if (!index_.emplace(t.name, i).second)
      throw Error(Errc::invalid_argument, "manifest: duplicate tensor name '" + t.name + "'");
    w.u64(t.name.size());
    w.bytes(std::as_bytes(std::span(t.name)));
    w.u8(static_cast<uint8_t>(t.dtype));
    w.u64(t.shape.size());
    for (uint64_t d : t.shape) w.u64(d);
  }
  digest_ = XXH3_64bits(canonical.data(), canonical.size());
}

const TensorInfo& Manifest::at(uint32_t index) const {
  if (index >= tensors_.size())
    throw Error(Errc::not_found, "manifest: no tensor with index " + std::to_string(index) + " (manifest has " +
                                     std::to_string(tensors_.size()) + ")");
  return tensors_[index];
}

std::optional<uint32_t> Manifest::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

uint64_t Manifest::total_bytes() const noexcept {
  uint64_t total = 0;
  for (const auto& t : tensors_) total += t.nbytes();
  return total;
}
uint64_t Manifest::total_elements() const noexcept {
  uint64_t total = 0;
  for (const auto& t : tensors_) total += t.numel();
  return total;
}

ConstWeights MutableWeights::as_const() const {
  ConstWeights out{manifest, {}};
  out.tensors.reserve(tensors.size());
  for (auto s : tensors) out.tensors.emplace_back(s.data(), s.size());
  return out;
}

void check_weights(const ConstWeights& weights) {
  if (weights.manifest == nullptr) throw Error(Errc::invalid_argument, "weights: no manifest");
  const auto& m = *weights.manifest;
  if (weights.tensors.size() != m.size())
    throw Error(Errc::invalid_argument, "weights: " + std::to_string(weights.tensors.size()) +
                                            " buffers for a manifest of " + std::to_string(m.size()) + " tensors");
  for (uint32_t i = 0; i < m.size(); ++i)
    if (weights.tensors[i].size() != m.at(i).nbytes())
      throw Error(Errc::invalid_argument, "weights: tensor '" + m.at(i).name + "' buffer holds " +
                                              std::to_string(weights.tensors[i].size()) + " bytes, expected " +
                                              std::to_string(m.at(i).nbytes()));
}

SpanReader::SpanReader(ConstWeights weights) : weights_(std::move(weights)) {
  if (weights_.manifest == nullptr) throw Error(Errc::invalid_argument, "weights: no manifest");
  if (weights_.tensors.size() != weights_.manifest->size())
    throw Error(Errc::invalid_argument, "weights: " + std::to_string(weights_.tensors.size()) +
                                            " buffers for a manifest of " + std::to_string(weights_.manifest->size()) +
                                            " tensors");
}

void SpanReader::read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const {
  const auto& t = weights_.tensors.at(tensor);
  if (offset > t.size() || out.size() > t.size() - offset)
    throw Error(Errc::invalid_argument, "weights: bytes [" + std::to_string(offset) + ", " +
                                            std::to_string(offset + out.size()) + ") of tensor '" +
                                            weights_.manifest->at(tensor).name + "' are not in its buffer of " +
                                            std::to_string(t.size()) + " bytes");
  if (!out.empty()) std::memcpy(out.data(), t.data() + offset, out.size());
}

}  // namespace deltacast::codec
