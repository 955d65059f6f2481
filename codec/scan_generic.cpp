// Portable block primitives for the scan kernels.
#include "codec/scan.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

template <class T>
inline uint64_t neq_mask(const T* a, const T* b) {
  uint64_t m = 0;
  for (unsigned l = 0; l < 64; ++l) m |= static_cast<uint64_t>(a[l] != b[l]) << l;
  return m;
}
template <class T>
inline uint64_t ge_mask(const T* a, T abs_mask, T threshold) {
  uint64_t m = 0;
  for (unsigned l = 0; l < 64; ++l) m |= static_cast<uint64_t>(static_cast<T>(a[l] & abs_mask) >= threshold) << l;
  return m;
}
}  // namespace

#include "codec/scan_select.inc"
#define DC_SCAN_SUFFIX generic
#include "codec/scan_kernels.inc"

}  // namespace deltacast::codec

namespace deltacast::codec {
// Exposed for the unit test of the broadword select.
uint64_t select_bit_for_test(uint64_t mask, unsigned r) { return select_bit(mask, r); }
}  // namespace deltacast::codec
