// AVX-512BW block primitives for the scan kernels. This file is compiled with -mavx512f -mavx512bw
// -mbmi2 and only called after a run-time CPU check (scan.cpp). scan_avx512_vbmi2.cpp compiles it
// again with DC_SCAN_VECTOR_CHANGES and -mavx512vbmi2 -mavx512vpopcntdq -mavx512vl: the classed
// scan of 16-bit elements then writes a block's changes with vector compression (VectorChanges).
// GCC 12's AVX-512 conversions start from _mm*_undefined_*, which -Wmaybe-uninitialized reports
// at -O3 once they are inlined (GCC bug 105593, fixed in GCC 13): a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <type_traits>
#include <utility>

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

#ifdef DC_SCAN_VECTOR_CHANGES
// The classed scan's per-change work for 16-bit elements in blocks with several changes, without
// a branch per change: the block's changed lanes are compressed (VBMI2) and their positions, bits,
// classes and ranks written 16 lanes at a time (the cursor has room for 64; entries past the
// block's changes are overwritten by the next block or trimmed). A rank is the class's members
// before the block plus a popcount of the class's mask below the position (VPOPCNTDQ).
// Blocks with fewer than kMinChanges changes or more than 16 are left to the scalar loop: the
// compressions and permutes cost ~35 cycles per block on Zen 4, more than the scalar loop spends
// on one or two changes. Measured against the scalar loop (dc_bench_scan; commits 92665a8, 44db1c8),
// arrays from memory: 1.4% of the elements changed ~5% faster, 3% ~8%, 10% ~30%; in the caches
// ~3 cycles per block slower with under 1% changed (the popcount and test), the same at 1.4-3%,
// ~10% faster at 10%. Writing every block this way (no branch) cost ~35 cycles per block with no
// change; starting at 1 or 2 changes cost more in the caches at 1.4-3%.
template <class T, unsigned K>
struct VectorChanges {
  static constexpr bool kUsable = std::is_same_v<T, uint16_t> && K != 0 && K <= 8;
  static constexpr unsigned kMinChanges = 3;
  // Writes the block's changes (positions start + lane) and returns true when it has kMinChanges
  // to 16, else writes nothing and returns false. ge, members: the block's class masks as the
  // classed scan computes them; members_before[c]: the members of class c in the earlier blocks.
  template <class Cursor>
  [[gnu::always_inline]] static bool emit(const T* a, const T* b, uint64_t chg, const uint64_t* ge,
                                          const uint64_t* members, const uint64_t* members_before, uint64_t start,
                                          Cursor& cur, size_t& count) {
    const unsigned n = static_cast<unsigned>(__builtin_popcountll(chg));
    if (n - kMinChanges > 16 - kMinChanges) return false;
    alignas(64) uint64_t lanes[16] = {};
    for (unsigned c = 0; c < K; ++c) {  // K: a constant, unrolled
      lanes[c] = members[c];
      lanes[8 + c] = members_before[c];
    }
    const __m512i mem = _mm512_load_si512(lanes);
    const __m512i before = _mm512_load_si512(lanes + 8);
    const __m512i iota =
        _mm512_set_epi8(63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40,
                        39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                        15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_maskz_compress_epi8(chg, iota);
    const __m128i p16 = _mm512_castsi512_si128(idx);
    _mm512_storeu_si512(cur.pos + count,
                        _mm512_add_epi32(_mm512_cvtepu8_epi32(p16), _mm512_set1_epi32(static_cast<int>(start))));
    const __m512i w = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(idx));
    const __m512i ov = _mm512_permutex2var_epi16(_mm512_loadu_si512(a), w, _mm512_loadu_si512(a + 32));
    const __m512i nv = _mm512_permutex2var_epi16(_mm512_loadu_si512(b), w, _mm512_loadu_si512(b + 32));
    _mm512_storeu_si512(cur.old_bits + count, _mm512_cvtepu16_epi32(_mm512_castsi512_si256(ov)));
    _mm512_storeu_si512(cur.new_bits + count, _mm512_cvtepu16_epi32(_mm512_castsi512_si256(nv)));
    __m512i cls = _mm512_setzero_si512();
    const __m512i one = _mm512_set1_epi8(1);
    for (unsigned j = 1; j < K; ++j) cls = _mm512_mask_add_epi8(cls, ge[j], cls, one);
    const __m128i c16 = _mm512_castsi512_si128(_mm512_maskz_compress_epi8(chg, cls));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(cur.cls + count), c16);
    const __m512i ones = _mm512_set1_epi64(1);
    auto ranks8 = [&](__m128i p8, __m128i c8) {
      const __m512i p = _mm512_cvtepu8_epi64(p8), c = _mm512_cvtepu8_epi64(c8);
      const __m512i below = _mm512_sub_epi64(_mm512_sllv_epi64(ones, p), ones);
      const __m512i in_block = _mm512_popcnt_epi64(_mm512_and_si512(_mm512_permutexvar_epi64(c, mem), below));
      return _mm512_cvtepi64_epi32(_mm512_add_epi64(_mm512_permutexvar_epi64(c, before), in_block));
    };
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cur.rank + count), ranks8(p16, c16));
    if (n > 8)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(cur.rank + count + 8),
                          ranks8(_mm_srli_si128(p16, 8), _mm_srli_si128(c16, 8)));
    count += n;
    return true;
  }
};
#endif

}  // namespace

#ifdef DC_SCAN_VECTOR_CHANGES
#define DC_SCAN_SUFFIX avx512_vbmi2
#else
#define DC_SCAN_SUFFIX avx512
#endif
#include "codec/scan_kernels.inc"

}  // namespace deltacast::codec
