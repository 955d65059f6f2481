#pragma once
// Additive state digest. The digest of a tensor is the sum (mod 2^64) over its elements of
// h(tensor index, element index, element bits), h a 64-bit mixer of the three. Because it is a sum, a
// delta updates it in time proportional to the number of changes: digest += h(new) - h(old).
// The producer sends the per-tensor digests of the new version in the seal frame; a receiver that
// maintains its own digests while applying proves bit equality per refit without a full scan, and
// full_scan() recomputes everything from the bytes as an audit.
// This detects corruption and coding bugs; it is not a cryptographic commitment.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/digest_terms.h"
#include "codec/manifest.h"
#include "codec/partition.h"

namespace deltacast::codec {

// h(t, i, bits): the per-element term (element_hash_seeded in codec/digest_terms.h, whose 32-bit
// math the CUDA digest shares, with the tensor's seed).
uint64_t element_hash(uint32_t tensor_index, uint64_t element_index, uint32_t bits) noexcept;

// The seed of tensor `tensor_index` (element_hash(t, i, b) == element_hash_seeded(seed(t), i, b)).
uint64_t tensor_digest_seed(uint32_t tensor_index) noexcept;

// Digest change when the elements first + positions[k] of tensor `tensor_index` go from old_bits[k]
// to new_bits[k] (k < count): the sum of element_hash(new) - element_hash(old), mod 2^64. Runs
// vectorised (the same value as the scalar sum). Each element appears at most once.
uint64_t changes_digest_delta(uint32_t tensor_index, uint64_t first, const uint32_t* positions,
                              const uint32_t* old_bits, const uint32_t* new_bits, size_t count) noexcept;

// Digest of one tensor's bytes (full scan).
uint64_t tensor_digest(uint32_t tensor_index, DType dtype, std::span<const std::byte> bytes);
// Digest contribution of a contiguous slice of a tensor whose first element has index
// `first_element` (bytes holds whole elements). Contributions of disjoint slices add up (mod 2^64)
// to tensor_digest, which is how full scans split large tensors over threads. Thread-safe.
uint64_t slice_digest(uint32_t tensor_index, DType dtype, uint64_t first_element, std::span<const std::byte> bytes);

class StateDigest {
 public:
  StateDigest() = default;
  explicit StateDigest(std::vector<uint64_t> per_tensor) : per_tensor_(std::move(per_tensor)) {}
  // Full scan of every tensor (the audit). Uses `threads` threads (0 = hardware concurrency).
  static StateDigest full_scan(const ConstWeights& weights, unsigned threads = 1);
  // The digest of the all-zero version 0 of `manifest`, with no buffers (a placed member, which
  // holds only slices, still names the whole version). Cost: a full scan's hashing.
  static StateDigest zeros(const Manifest& manifest);
  // A producer group rank's share (codec/partition.h): per tensor, the digest sums over `ranges`
  // only (disjoint units; the tensors they name must be whole in `weights`, the others may be
  // empty). A partition's parts add up (per tensor, mod 2^64) to full_scan. Throws
  // Error(invalid_argument) for a range outside its tensor or a named tensor that is not whole.
  static StateDigest part_scan(const ConstWeights& weights, std::span<const PartRange> ranges, unsigned threads = 1);

  const std::vector<uint64_t>& per_tensor() const noexcept { return per_tensor_; }
  std::vector<uint64_t>& per_tensor() noexcept { return per_tensor_; }
  // xxh3-64 over the per-tensor digests in order: names a whole state in one number.
  uint64_t combined() const noexcept;
  bool operator==(const StateDigest& other) const = default;

 private:
  std::vector<uint64_t> per_tensor_;
};

}  // namespace deltacast::codec
