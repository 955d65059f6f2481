#pragma once
// The small models the codec fuzz targets apply frames to, and their seed corpora are made for
// (make_corpus.cpp). Deterministic: the same bits on every compiler and standard library.
//   model 0: the golden files' model (tests/golden/v2-*.dcx apply to it at version 41).
//   model 1: one small tensor of every dtype, an empty tensor included.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/manifest.h"

namespace deltacast::fuzz {

inline constexpr unsigned kModelCount = 2;
inline constexpr uint64_t kBaseVersion = 41;  // the version the base bits hold (the golden frames' base)

struct FuzzModel {
  codec::Manifest manifest;
  std::vector<std::vector<std::byte>> base;  // per tensor, manifest order
  codec::ConstWeights view() const;
};

// Built once, on first use; thread-safe.
const FuzzModel& fuzz_model(unsigned index);

}  // namespace deltacast::fuzz
