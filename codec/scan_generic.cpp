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
#include "codec/scan_kernels.inc"

void scan_changes_generic(unsigned width, uint32_t abs_mask, const void* o, const void* nw, uint64_t n,
                          const ClassSpec* cs, ScanOutput& out) {
  switch (width) {
    case 1: return scan_impl(abs_mask, static_cast<const uint8_t*>(o), static_cast<const uint8_t*>(nw), n, cs, out);
    case 2: return scan_impl(abs_mask, static_cast<const uint16_t*>(o), static_cast<const uint16_t*>(nw), n, cs, out);
    case 4: return scan_impl(abs_mask, static_cast<const uint32_t*>(o), static_cast<const uint32_t*>(nw), n, cs, out);
  }
  DC_ASSERT(false && "bad element width");
}
void select_positions_generic(unsigned width, uint32_t abs_mask, const void* o, uint64_t n, const ClassSpec& cs,
                              const std::vector<std::vector<uint32_t>>& ranks,
                              std::vector<uint32_t>& positions, std::vector<uint32_t>& coding_index) {
  switch (width) {
    case 1: return select_impl(abs_mask, static_cast<const uint8_t*>(o), n, cs, ranks, positions, coding_index);
    case 2: return select_impl(abs_mask, static_cast<const uint16_t*>(o), n, cs, ranks, positions, coding_index);
    case 4: return select_impl(abs_mask, static_cast<const uint32_t*>(o), n, cs, ranks, positions, coding_index);
  }
  DC_ASSERT(false && "bad element width");
}

}  // namespace deltacast::codec

namespace deltacast::codec {
// Exposed for the unit test of the broadword select.
uint64_t select_bit_for_test(uint64_t mask, unsigned r) { return select_bit(mask, r); }
}  // namespace deltacast::codec
