#pragma once
// A codec::WeightsReader over weights in memory (what Checkpoint::reader() does with pread), for
// tests: it counts the bytes it copies, and throws Error(io) at read number `fail_at` (0: never),
// as a file truncated under a reader would.
#include <atomic>
#include <cstring>
#include <stdexcept>

#include "codec/manifest.h"
#include "util/error.h"

namespace deltacast::codec::testing {

struct MemoryReader final : WeightsReader {
  ConstWeights weights;
  std::atomic<uint64_t> fail_at{0};
  mutable std::atomic<uint64_t> reads{0}, bytes{0};
  explicit MemoryReader(ConstWeights w) : weights(std::move(w)) {}
  const Manifest& manifest() const noexcept override { return *weights.manifest; }
  void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const override {
    const auto& t = weights.tensors.at(tensor);
    if (offset > t.size() || out.size() > t.size() - offset) throw std::logic_error("read past the tensor");
    if (++reads == fail_at) throw Error(Errc::io, "cannot read test.safetensors: injected");
    if (!out.empty()) std::memcpy(out.data(), t.data() + offset, out.size());
    bytes += out.size();
  }
};

}  // namespace deltacast::codec::testing
