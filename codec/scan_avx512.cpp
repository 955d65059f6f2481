// AVX-512BW block primitives for the scan kernels. This file is compiled with -mavx512f -mavx512bw
// -mbmi2 and only called after a run-time CPU check (scan.cpp).
#include <immintrin.h>

#include "codec/scan.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

template <class T>
inline uint64_t neq_mask(const T* a, const T* b);
template <>
inline uint64_t neq_mask<uint8_t>(const uint8_t* a, const uint8_t* b) {
  return _mm512_cmpneq_epu8_mask(_mm512_loadu_si512(a), _mm512_loadu_si512(b));
}
template <>
inline uint64_t neq_mask<uint16_t>(const uint16_t* a, const uint16_t* b) {
  const uint64_t lo = _mm512_cmpneq_epu16_mask(_mm512_loadu_si512(a), _mm512_loadu_si512(b));
  const uint64_t hi = _mm512_cmpneq_epu16_mask(_mm512_loadu_si512(a + 32), _mm512_loadu_si512(b + 32));
  return lo | (hi << 32);
}
template <>
inline uint64_t neq_mask<uint32_t>(const uint32_t* a, const uint32_t* b) {
  uint64_t m = 0;
  for (unsigned q = 0; q < 4; ++q)
    m |= uint64_t{_mm512_cmpneq_epu32_mask(_mm512_loadu_si512(a + 16 * q), _mm512_loadu_si512(b + 16 * q))} << (16 * q);
  return m;
}

template <class T>
inline uint64_t ge_mask(const T* a, T abs_mask, T threshold);
template <>
inline uint64_t ge_mask<uint8_t>(const uint8_t* a, uint8_t abs_mask, uint8_t threshold) {
  const __m512i v = _mm512_and_si512(_mm512_loadu_si512(a), _mm512_set1_epi8(static_cast<char>(abs_mask)));
  return _mm512_cmpge_epu8_mask(v, _mm512_set1_epi8(static_cast<char>(threshold)));
}
template <>
inline uint64_t ge_mask<uint16_t>(const uint16_t* a, uint16_t abs_mask, uint16_t threshold) {
  const __m512i m = _mm512_set1_epi16(static_cast<short>(abs_mask));
  const __m512i t = _mm512_set1_epi16(static_cast<short>(threshold));
  const uint64_t lo = _mm512_cmpge_epu16_mask(_mm512_and_si512(_mm512_loadu_si512(a), m), t);
  const uint64_t hi = _mm512_cmpge_epu16_mask(_mm512_and_si512(_mm512_loadu_si512(a + 32), m), t);
  return lo | (hi << 32);
}
template <>
inline uint64_t ge_mask<uint32_t>(const uint32_t* a, uint32_t abs_mask, uint32_t threshold) {
  const __m512i m = _mm512_set1_epi32(static_cast<int>(abs_mask));
  const __m512i t = _mm512_set1_epi32(static_cast<int>(threshold));
  uint64_t r = 0;
  for (unsigned q = 0; q < 4; ++q)
    r |= uint64_t{_mm512_cmpge_epu32_mask(_mm512_and_si512(_mm512_loadu_si512(a + 16 * q), m), t)} << (16 * q);
  return r;
}
inline uint64_t select_bit(uint64_t mask, unsigned r) {
  return static_cast<uint64_t>(__builtin_ctzll(_pdep_u64(uint64_t{1} << r, mask)));
}

}  // namespace

#define DC_SCAN_SUFFIX avx512
#include "codec/scan_kernels.inc"

}  // namespace deltacast::codec
