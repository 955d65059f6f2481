#pragma once
// A producer group's parts (docs/protocol.md, "Producer group"): which of M producer ranks sends
// which units of the manifest. Every unit belongs to exactly one rank; a rank diffs, encodes and
// keeps the baseline of its part only. Pure and deterministic: every rank computes the same
// partition from the same (manifest, M), and the group checks that they agree (fingerprint).
#include <cstdint>
#include <string>
#include <vector>

#include "codec/manifest.h"

namespace deltacast::codec {

// Units [begin, end) of one tensor (codec units: an 8-byte element is two, manifest.h).
struct PartRange {
  uint32_t tensor = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t units() const noexcept { return end - begin; }
  bool operator==(const PartRange&) const = default;
};

// Cuts inside a tensor fall on multiples of this many units (a 64-unit block is the scan's and
// the location coding's granule; 4096 keeps every cut on a page of any dtype).
inline constexpr uint64_t kPartAlignUnits = 4096;

class Partition {
 public:
  // Balanced by bytes. Whole tensors by default, largest first, each onto the rank with the fewest
  // bytes so far (ties: the lower rank). A tensor larger than the fair share (total bytes / ranks)
  // is cut first into ceil(bytes / fair) ranges of about equal size (cuts on kPartAlignUnits),
  // placed as pieces the same way. Empty tensors have no units and belong to no part. Each part
  // lists its ranges in manifest order, adjacent ranges of one tensor merged. Throws
  // Error(invalid_argument) when ranks is 0.
  static Partition balanced(const Manifest& manifest, uint32_t ranks);
  // The trainer's own layout: parts[r] are the ranges rank r sends (any order; whole tensors are
  // {t, 0, units}; empty ranges are dropped). Throws Error(invalid_argument) naming the tensor, the
  // units and the ranks when a unit is claimed twice or by nobody, a range lies outside its
  // tensor, or it splits an element (an odd unit of an 8-byte dtype).
  static Partition from_parts(const Manifest& manifest, std::vector<std::vector<PartRange>> parts);

  uint32_t ranks() const noexcept { return static_cast<uint32_t>(parts_.size()); }
  const std::vector<PartRange>& part(uint32_t rank) const { return parts_.at(rank); }
  uint64_t part_bytes(uint32_t rank) const { return bytes_.at(rank); }
  // Names the partition: xxh3-64 over the manifest's digest and every rank's ranges in order.
  // Ranks whose fingerprints differ would send overlapping or missing parts: the group refuses.
  uint64_t fingerprint() const noexcept { return fingerprint_; }
  // "rank 0: 3 tensors (1.2 GB), rank 1: ..." for logs and errors.
  std::string describe(const Manifest& manifest) const;

 private:
  Partition(const Manifest& manifest, std::vector<std::vector<PartRange>> parts);
  std::vector<std::vector<PartRange>> parts_;
  std::vector<uint64_t> bytes_;
  uint64_t fingerprint_ = 0;
};

}  // namespace deltacast::codec
