// AVX2 block primitives for the scan kernels. Compiled with -mavx2 -mbmi -mpopcnt and only called
// after a run-time CPU check (scan.cpp). scan_avx2_bmi2.cpp compiles this file again with
// DC_SCAN_AVX2_PDEP and -mbmi2: select through PDEP, for CPUs where PDEP is fast (not AMD before
// Zen 3, where it is microcoded). AVX2 has no unsigned compares: the class thresholds compare
// sign-cleared values, which are non-negative as signed integers, so a signed compare is exact.
#include <immintrin.h>

#include "codec/scan.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16-bit lane masks of two vectors -> 32 mask bits in element order.
inline uint32_t movemask16(__m256i m0, __m256i m1) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi16(m0, m1), 0xD8);
  return static_cast<uint32_t>(_mm256_movemask_epi8(packed));
}

template <class T>
inline uint64_t neq_mask(const T* a, const T* b);
template <>
inline uint64_t neq_mask<uint8_t>(const uint8_t* a, const uint8_t* b) {
  const uint64_t lo = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(load(a), load(b))));
  const uint64_t hi = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(load(a + 32), load(b + 32))));
  return ~(lo | (hi << 32));
}
template <>
inline uint64_t neq_mask<uint16_t>(const uint16_t* a, const uint16_t* b) {
  const uint64_t lo = movemask16(_mm256_cmpeq_epi16(load(a), load(b)), _mm256_cmpeq_epi16(load(a + 16), load(b + 16)));
  const uint64_t hi =
      movemask16(_mm256_cmpeq_epi16(load(a + 32), load(b + 32)), _mm256_cmpeq_epi16(load(a + 48), load(b + 48)));
  return ~(lo | (hi << 32));
}
template <>
inline uint64_t neq_mask<uint32_t>(const uint32_t* a, const uint32_t* b) {
  uint64_t eq = 0;
  for (unsigned q = 0; q < 8; ++q)
    eq |= uint64_t{static_cast<uint32_t>(
              _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(load(a + 8 * q), load(b + 8 * q)))))}
          << (8 * q);
  return ~eq;
}

template <class T>
inline uint64_t ge_mask(const T* a, T abs_mask, T threshold);
template <>
inline uint64_t ge_mask<uint8_t>(const uint8_t* a, uint8_t abs_mask, uint8_t threshold) {
  if (threshold == 0) return ~uint64_t{0};
  const __m256i m = _mm256_set1_epi8(static_cast<char>(abs_mask));
  const __m256i t = _mm256_set1_epi8(static_cast<char>(threshold - 1));
  const uint64_t lo = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(_mm256_and_si256(load(a), m), t)));
  const uint64_t hi = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(_mm256_and_si256(load(a + 32), m), t)));
  return lo | (hi << 32);
}
// 16-bit elements: see ClassMasker<uint16_t> below (all thresholds from one pass).
template <>
inline uint64_t ge_mask<uint32_t>(const uint32_t* a, uint32_t abs_mask, uint32_t threshold) {
  if (threshold == 0) return ~uint64_t{0};
  const __m256i m = _mm256_set1_epi32(static_cast<int>(abs_mask));
  const __m256i t = _mm256_set1_epi32(static_cast<int>(threshold - 1));
  uint64_t r = 0;
  for (unsigned q = 0; q < 8; ++q)
    r |= uint64_t{static_cast<uint32_t>(_mm256_movemask_ps(
             _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_and_si256(load(a + 8 * q), m), t))))}
         << (8 * q);
  return r;
}

// All class thresholds at once. For 16-bit elements each input vector is loaded and masked once,
// the threshold vectors are built once per scan, and the lanes are regrouped up front (128-bit
// halves) so that packs_epi16 yields element order without a per-threshold permute. Masked values
// are non-negative as signed 16-bit integers, so threshold 0 (t - 1 = -1) needs no special case.
template <class T>
struct ClassMasker;  // the portable version (scan_kernels.inc) for the other element widths
template <>
struct ClassMasker<uint16_t> {
  ClassMasker(uint16_t abs_mask, const uint32_t* thresholds, unsigned count)
      : mask_(_mm256_set1_epi16(static_cast<short>(abs_mask))), count_(count) {
    DC_ASSERT(abs_mask <= 0x7FFF && count < kMaxClasses);
    for (unsigned j = 0; j < count; ++j) t_[j] = _mm256_set1_epi16(static_cast<short>(thresholds[j] - 1));
  }
  void operator()(const uint16_t* a, uint64_t* ge) const {
    const __m256i v0 = load(a), v1 = load(a + 16), v2 = load(a + 32), v3 = load(a + 48);
    // x = [elements 0-7 | 16-23], y = [8-15 | 24-31]: packs(x, y) = elements 0..31 in order.
    const __m256i x0 = _mm256_and_si256(_mm256_permute2x128_si256(v0, v1, 0x20), mask_);
    const __m256i y0 = _mm256_and_si256(_mm256_permute2x128_si256(v0, v1, 0x31), mask_);
    const __m256i x1 = _mm256_and_si256(_mm256_permute2x128_si256(v2, v3, 0x20), mask_);
    const __m256i y1 = _mm256_and_si256(_mm256_permute2x128_si256(v2, v3, 0x31), mask_);
    for (unsigned j = 0; j < count_; ++j) {
      const __m256i t = t_[j];
      const uint64_t lo = static_cast<uint32_t>(
          _mm256_movemask_epi8(_mm256_packs_epi16(_mm256_cmpgt_epi16(x0, t), _mm256_cmpgt_epi16(y0, t))));
      const uint64_t hi = static_cast<uint32_t>(
          _mm256_movemask_epi8(_mm256_packs_epi16(_mm256_cmpgt_epi16(x1, t), _mm256_cmpgt_epi16(y1, t))));
      ge[j] = lo | (hi << 32);
    }
  }
  __m256i mask_;
  __m256i t_[kMaxClasses - 1];
  unsigned count_;
};

}  // namespace

#ifdef DC_SCAN_AVX2_PDEP
namespace {
inline uint64_t select_bit(uint64_t mask, unsigned r) {
  return static_cast<uint64_t>(__builtin_ctzll(_pdep_u64(uint64_t{1} << r, mask)));
}
}  // namespace
#define DC_SCAN_SUFFIX avx2_bmi2
#else
#include "codec/scan_select.inc"
#define DC_SCAN_SUFFIX avx2
#endif
#include "codec/scan_kernels.inc"

}  // namespace deltacast::codec
