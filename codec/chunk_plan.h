#pragma once
// Chunk planning (internal header): cuts the canonical coordinate space into chunks of about
// `chunk_bytes` of checkpoint: large tensors are sliced, small consecutive tensors share a chunk.
// Deterministic in (manifest, chunk_bytes). Empty tensors get no slice.
#include <cstdint>
#include <vector>

#include "codec/manifest.h"
#include "codec/partition.h"

namespace deltacast::codec {

struct Slice {
  uint32_t tensor = 0;
  uint64_t begin = 0;
  uint64_t count = 0;
};

std::vector<std::vector<Slice>> plan_chunks(const Manifest& manifest, uint64_t chunk_bytes);
// The same over `ranges` (a producer rank's part, in order): each range is planned as a whole
// tensor is above, its slices starting at the range's begin. plan_chunks(m, c) is this over every
// tensor whole.
std::vector<std::vector<Slice>> plan_chunks(const Manifest& manifest, std::span<const PartRange> ranges,
                                            uint64_t chunk_bytes);

// Sign-clearing mask for units coded as floats, all bits otherwise (integers, BOOL, F64 units).
inline uint32_t abs_mask_of(DType dtype) noexcept {
  const unsigned w = static_cast<unsigned>(dtype_unit_size(dtype));
  const uint32_t all = w == 4 ? 0xFFFFFFFFu : (1u << (8 * w)) - 1;
  return dtype_codes_as_float(dtype) ? (all >> 1) : all;
}

}  // namespace deltacast::codec
