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

#include "codec/manifest.h"

namespace deltacast::codec {

// h(t, i, bits): the per-element term (element_hash_seeded below, with the tensor's seed).
uint64_t element_hash(uint32_t tensor_index, uint64_t element_index, uint32_t bits) noexcept;

// The term is built from 32-bit operations so that full scans vectorise (8 lanes of 32-bit
// multiplies with AVX2): u = an odd multiple of the element index plus the seed's low half (a
// bijection of the index within each 2^32 block), v = (bits + 1) times an odd constant; the high
// half is the murmur3 finaliser of u ^ v (a bijection of the bits for a given index, so a single
// changed element always changes the term) and the low half a keyed bijection of the high half.
// Format v2; see docs/frame-format.md.
namespace detail {
inline constexpr uint32_t kDigestIndexMul = 0x9E3779B1u;    // per element index (low 32 bits)
inline constexpr uint32_t kDigestIndexHiMul = 0x85EBCA77u;  // per 2^32 block of indexes
inline constexpr uint32_t kDigestBitsMul = 0xC2B2AE3Du;
inline constexpr uint32_t kDigestLaneMul = 0x27D4EB2Fu;
inline uint32_t digest_fmix32(uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}
inline uint32_t digest_index_word(uint64_t seed, uint64_t element_index) noexcept {
  return static_cast<uint32_t>(element_index) * kDigestIndexMul +
         static_cast<uint32_t>(element_index >> 32) * kDigestIndexHiMul + static_cast<uint32_t>(seed);
}
// High and low halves of the term for index word u and element bits.
inline uint32_t digest_term_hi(uint32_t u, uint32_t bits) noexcept {
  return digest_fmix32(u ^ ((bits + 1) * kDigestBitsMul));
}
// The low half is a keyed bijection of the high half: one element's change always changes both.
inline uint32_t digest_term_lo(uint32_t hi, uint32_t seed_hi) noexcept {
  const uint32_t x = (hi ^ seed_hi) * kDigestLaneMul;
  return x ^ (x >> 15);
}
}  // namespace detail

inline uint64_t element_hash_seeded(uint64_t seed, uint64_t element_index, uint32_t bits) noexcept {
  const uint32_t hi = detail::digest_term_hi(detail::digest_index_word(seed, element_index), bits);
  return (uint64_t{hi} << 32) | detail::digest_term_lo(hi, static_cast<uint32_t>(seed >> 32));
}

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

  const std::vector<uint64_t>& per_tensor() const noexcept { return per_tensor_; }
  std::vector<uint64_t>& per_tensor() noexcept { return per_tensor_; }
  // xxh3-64 over the per-tensor digests in order: names a whole state in one number.
  uint64_t combined() const noexcept;
  bool operator==(const StateDigest& other) const = default;

 private:
  std::vector<uint64_t> per_tensor_;
};

}  // namespace deltacast::codec
