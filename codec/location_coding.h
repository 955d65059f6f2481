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

// One segment's locations as its stream states them, before the receiver resolves class ranks
// against its own bits.
struct DecodedLocations {
  LocationCoding coding = LocationCoding::none;
  ScanVector<uint32_t> positions;           // every coding but classed_gaps: ascending, in range
  ClassSpec classes;                        // classed_gaps: the class thresholds
  std::vector<ScanVector<uint32_t>> ranks;  // classed_gaps: per class, ascending ranks
};

// Decodes one segment's locations from `in` (advancing it) into `out` (its buffers reused).
// abs_mask: the dtype's magnitude mask (class thresholds must lie within it). Throws
// Error(corrupt_frame) on anything the stream alone shows inconsistent (counts, bounds, duplicate or
// out-of-range positions); that a class rank lies within its class is checked by the select.
void decode_locations(LocationCoding coding, uint64_t element_count, uint64_t change_count, uint32_t abs_mask,
                      std::span<const std::byte>& in, DecodedLocations& out);

// Chooses up to kMaxClasses-2 class thresholds from sampled exponent histograms, or count == 1 when
// classes would not pay.
ClassSpec choose_classes(const std::vector<uint64_t>& hist_all, const std::vector<uint64_t>& hist_changed,
                         unsigned mantissa_bits);

}  // namespace deltacast::codec
