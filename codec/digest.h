#pragma once
// Additive state digest. The digest of a tensor is the sum (mod 2^64) over its elements of
// h(tensor index, element index, element bits), h a strong 64-bit mixer. Because it is a sum, a
// delta updates it in time proportional to the number of changes: digest += h(new) - h(old).
// The producer sends the per-tensor digests of the new version in the seal frame; a receiver that
// maintains its own digests while applying proves bit equality per refit without a full scan, and
// full_scan() recomputes everything from the bytes as an audit.
// This detects corruption and coding bugs; it is not a cryptographic commitment.
#include <cstdint>
#include <span>
#include <vector>

#include "codec/manifest.h"

namespace deltacast::codec {

// h(t, i, bits): the per-element term. element_hash_seeded(tensor_hash_seed(t), i, bits) is the
// same value with the per-tensor part hoisted out of a loop.
uint64_t element_hash(uint32_t tensor_index, uint64_t element_index, uint32_t bits) noexcept;
uint64_t tensor_hash_seed(uint32_t tensor_index) noexcept;

namespace detail {
inline uint64_t digest_mix64(uint64_t x) noexcept {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ULL;
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ULL;
  x ^= x >> 32;
  return x;
}
}  // namespace detail

inline uint64_t element_hash_seeded(uint64_t seed, uint64_t element_index, uint32_t bits) noexcept {
  return detail::digest_mix64(((element_index + seed) * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t{bits} + 1) * 0xC2B2AE3D27D4EB4FULL));
}

// Digest of one tensor's bytes (full scan).
uint64_t tensor_digest(uint32_t tensor_index, DType dtype, std::span<const std::byte> bytes);
// Digest contribution of a contiguous slice of a tensor whose first element has index
// `first_element` (bytes holds whole elements). Contributions of disjoint slices add up (mod 2^64)
// to tensor_digest: a receiver can digest pieces as they arrive. Thread-safe.
uint64_t slice_digest(uint32_t tensor_index, DType dtype, uint64_t first_element, std::span<const std::byte> bytes);

class StateDigest {
 public:
  StateDigest() = default;
  explicit StateDigest(std::vector<uint64_t> per_tensor) : per_tensor_(std::move(per_tensor)) {}
  // Full scan of every tensor (the audit). Uses `threads` threads (0 = hardware concurrency).
  static StateDigest full_scan(const ConstWeights& weights, unsigned threads = 1);

  const std::vector<uint64_t>& per_tensor() const noexcept { return per_tensor_; }
  std::vector<uint64_t>& per_tensor() noexcept { return per_tensor_; }
  // xxh3-64 over the per-tensor digests in order: names a whole state in one number.
  uint64_t combined() const noexcept;
  bool operator==(const StateDigest& other) const = default;

 private:
  std::vector<uint64_t> per_tensor_;
};

}  // namespace deltacast::codec
