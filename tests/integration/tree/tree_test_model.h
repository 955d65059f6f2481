#pragma once
// A small model for relay-tree tests: a few BF16 tensors and an F32 one, whose versions differ in
// ~1% of elements by one ulp, plus a memcmp check of a member's buffers.
#include <cstring>
#include <span>

#include <gtest/gtest.h>
#include <random>
#include <vector>

#include "codec/manifest.h"
#include "codec/placement.h"
#include "tests/unit/codec/placement_reference.h"
#include "tree/receiver.h"

namespace deltacast::tree {

using Bytes = std::vector<std::byte>;

// A small BF16 model whose versions differ in ~1% of elements by one or two ulps.
struct Model {
  codec::Manifest manifest;
  std::vector<Bytes> tensors;

  static Model make(uint64_t seed) {
    std::vector<codec::TensorInfo> infos = {{"embed", codec::DType::bf16, {256, 1024}},
                                            {"layer.0.w", codec::DType::bf16, {512, 512}},
                                            {"layer.0.norm", codec::DType::bf16, {512}},
                                            {"layer.1.w", codec::DType::bf16, {512, 768}},
                                            {"head.bias", codec::DType::f32, {333}}};
    Model m{codec::Manifest(infos), {}};
    std::mt19937_64 rng(seed);
    for (const auto& t : m.manifest.tensors()) {
      Bytes bytes(t.nbytes());
      for (auto& b : bytes) b = static_cast<std::byte>(rng());
      m.tensors.push_back(std::move(bytes));
    }
    return m;
  }
  // Moves ~1% of the low bytes by +-1 (a one-ulp step for most values).
  void step(uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (auto& bytes : tensors)
      for (size_t i = 0; i < bytes.size(); i += 2)
        if (rng() % 100 == 0) bytes[i] = static_cast<std::byte>(std::to_integer<uint8_t>(bytes[i]) + ((rng() & 1) ? 1 : 255));
  }
  codec::ConstWeights weights() const {
    codec::ConstWeights w{&manifest, {}};
    for (const auto& t : tensors) w.tensors.emplace_back(t.data(), t.size());
    return w;
  }
};

// True when `tensors` equal `expected` byte for byte.
inline bool same_bits(const std::vector<Bytes>& tensors, const codec::ConstWeights& expected) {
  if (tensors.size() != expected.tensors.size()) return false;
  for (size_t t = 0; t < tensors.size(); ++t)
    if (tensors[t].size() != expected.tensors[t].size() ||
        std::memcmp(tensors[t].data(), expected.tensors[t].data(), tensors[t].size()) != 0)
      return false;
  return true;
}

// A member's life in a test: joins, attaches one buffer per manifest tensor (kept in `buffers`:
// zeros, the all-zero version 0; or, attaching at `held_version` > 0, 0x5A bytes that are not that
// version's) and serves until the receiver ends. Throws what join, attach and run throw.
inline RunSummary join_and_serve(Receiver& receiver, std::vector<Bytes>& buffers, uint64_t held_version = 0) {
  const auto& manifest = receiver.join();
  codec::MutableWeights weights{&manifest, {}};
  for (const auto& t : manifest.tensors())
    buffers.emplace_back(t.nbytes(), held_version ? std::byte{0x5A} : std::byte{0});
  for (auto& b : buffers) weights.tensors.emplace_back(b.data(), b.size());
  receiver.attach(weights, held_version);
  return receiver.run();
}

// A placed member's life (docs/placement.md): joins, attaches buffers filled with 0xEE for `specs`
// (version 0: every held unit is written by the bootstrap or a snapshot, padding never; stated at
// HELLO when the receiver's options hold them, else by PLACED) and serves. Throws what join,
// attach and run throw.
inline RunSummary join_and_serve_placed(Receiver& receiver, const std::vector<codec::BufferPlacement>& specs,
                                        std::vector<Bytes>& buffers) {
  const auto& manifest = receiver.join();
  const auto placement = codec::Placement::compile(manifest, specs);
  for (uint32_t b = 0; b < placement.buffers().size(); ++b) {
    const auto dtype = placement.dtype(b);
    buffers.emplace_back(placement.buffer_units(b) / codec::dtype_units_per_element(dtype) * codec::dtype_size(dtype),
                         std::byte{0xEE});
  }
  std::vector<std::span<std::byte>> spans;
  spans.reserve(buffers.size());
  for (auto& b : buffers) spans.emplace_back(b.data(), b.size());
  receiver.attach_placed(specs, std::move(spans), 0);
  return receiver.run();
}

// True when `buffers` equal the slices `specs` names of `tensors` (canonical, in `manifest`'s
// order), byte for byte; padding must still be 0xEE. The reference is built element by element
// (tests/unit/codec/placement_reference.h), independently of the placement's mapping.
inline ::testing::AssertionResult holds_shard(const std::vector<Bytes>& buffers,
                                              const std::vector<codec::BufferPlacement>& specs,
                                              const codec::Manifest& manifest, const std::vector<Bytes>& tensors) {
  const auto placement = codec::Placement::compile(manifest, specs);
  const auto want = codec::testing::slices_of(placement, manifest, tensors);
  if (buffers.size() != want.size())
    return ::testing::AssertionFailure() << buffers.size() << " buffers, expected " << want.size();
  for (size_t b = 0; b < want.size(); ++b)
    if (buffers[b].size() != want[b].size() || std::memcmp(buffers[b].data(), want[b].data(), want[b].size()) != 0)
      return ::testing::AssertionFailure() << "buffer '" << specs[b].name << "' differs";
  return ::testing::AssertionSuccess();
}

}  // namespace deltacast::tree
