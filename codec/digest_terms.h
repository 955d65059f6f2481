#pragma once
// The per-element digest term (codec/digest.h), in a header with no dependencies so that the host
// and the CUDA digest (codec/cuda/device_apply.cu) compile the very same functions.
//
// The term is built from 32-bit operations so that full scans vectorise (8 lanes of 32-bit
// multiplies with AVX2): u = an odd multiple of the element index plus the seed's low half (a
// bijection of the index within each 2^32 block), v = (bits + 1) times an odd constant; the high
// half is the murmur3 finaliser of u ^ v (a bijection of the bits for a given index, so a single
// changed element always changes the term) and the low half a keyed bijection of the high half.
// Format v2; see docs/frame-format.md.
#include <cstdint>

#if defined(__CUDACC__)
#define DC_DIGEST_HD __host__ __device__
#else
#define DC_DIGEST_HD
#endif

namespace deltacast::codec {
namespace detail {
inline constexpr uint32_t kDigestIndexMul = 0x9E3779B1u;    // per element index (low 32 bits)
inline constexpr uint32_t kDigestIndexHiMul = 0x85EBCA77u;  // per 2^32 block of indexes
inline constexpr uint32_t kDigestBitsMul = 0xC2B2AE3Du;
inline constexpr uint32_t kDigestLaneMul = 0x27D4EB2Fu;
inline DC_DIGEST_HD uint32_t digest_fmix32(uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}
inline DC_DIGEST_HD uint32_t digest_index_word(uint64_t seed, uint64_t element_index) noexcept {
  return static_cast<uint32_t>(element_index) * kDigestIndexMul +
         static_cast<uint32_t>(element_index >> 32) * kDigestIndexHiMul + static_cast<uint32_t>(seed);
}
// High and low halves of the term for index word u and element bits.
inline DC_DIGEST_HD uint32_t digest_term_hi(uint32_t u, uint32_t bits) noexcept {
  return digest_fmix32(u ^ ((bits + 1) * kDigestBitsMul));
}
// The low half is a keyed bijection of the high half: one element's change always changes both.
inline DC_DIGEST_HD uint32_t digest_term_lo(uint32_t hi, uint32_t seed_hi) noexcept {
  const uint32_t x = (hi ^ seed_hi) * kDigestLaneMul;
  return x ^ (x >> 15);
}
}  // namespace detail

inline DC_DIGEST_HD uint64_t element_hash_seeded(uint64_t seed, uint64_t element_index, uint32_t bits) noexcept {
  const uint32_t hi = detail::digest_term_hi(detail::digest_index_word(seed, element_index), bits);
  return (uint64_t{hi} << 32) | detail::digest_term_lo(hi, static_cast<uint32_t>(seed >> 32));
}

}  // namespace deltacast::codec
