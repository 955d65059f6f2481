#pragma once
// Location coding (internal header): positions of a segment's changed elements, written into the
// chunk's locations stream (each segment's part byte-aligned). See docs/frame-format.md.
#include <cstdint>
#include <span>
#include <vector>

#include "codec/frame.h"
#include "codec/scan.h"

namespace deltacast::codec {

// What the encoder knows about one segment's changes (from scan_changes).
struct SegmentChanges {
  uint64_t element_count = 0;
  const ScanOutput* scan = nullptr;  // positions ascending; class/rank when classes.count > 1
  ClassSpec classes;                 // count == 1: unclassed
};

struct LocationPlan {
  LocationCoding coding = LocationCoding::none;
  // Order in which the changes are coded (indexes into scan->positions); values follow this order.
  ScanVector<uint32_t> order;  // empty = ascending position order
};

// Picks the smallest coding for the segment, appends its bytes to `out` and returns the plan.
LocationPlan encode_locations(const SegmentChanges& changes, std::vector<std::byte>& out);

// Decodes one segment's locations from `in` (advancing it). `positions` come out in (nearly)
// ascending order; coding_index[k] is the coding-order index of positions[k] (the order values are
// stored in), left empty when the two orders are the same (every coding but classed_gaps).
// old_bits: the receiver's base bits of the segment (needed for classed_gaps). old_values[k] holds
// the base bits at positions[k] when the coding read them anyway (classed_gaps); it is left empty
// otherwise. Throws Error(corrupt_frame) on anything inconsistent (counts, bounds, duplicate or
// out-of-range positions).
void decode_locations(LocationCoding coding, uint64_t element_count, uint64_t change_count, unsigned width,
                      uint32_t abs_mask, const void* old_bits, std::span<const std::byte>& in,
                      ScanVector<uint32_t>& positions, ScanVector<uint32_t>& coding_index,
                      ScanVector<uint32_t>& old_values);

// Chooses up to kMaxClasses-2 class thresholds from sampled exponent histograms, or count == 1 when
// classes would not pay.
ClassSpec choose_classes(const std::vector<uint64_t>& hist_all, const std::vector<uint64_t>& hist_changed,
                         unsigned mantissa_bits);

}  // namespace deltacast::codec
