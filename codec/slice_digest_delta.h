#pragma once
// Keeping a seal's slice table (frame.h, SliceDigest; docs/placement.md) up to date from a
// version's changes instead of a scan of every slice of the new version: digest terms are keyed by
// the canonical coordinate and add, so a slice's new digest is its base digest plus, for each
// change inside it, element_hash(new) - element_hash(old). The encoder feeds it each segment's
// changes (the positions, old and new bits its scan found) and adds the deltas at the seal. Pure.
#include <cstdint>
#include <utility>
#include <vector>

#include "codec/frame.h"
#include "codec/manifest.h"
#include "codec/placement.h"

namespace deltacast::codec {

class SliceDigestDeltas {
 public:
  // (slice index, digest delta) pairs, as add_segment appends them.
  using Deltas = std::vector<std::pair<uint32_t, uint64_t>>;

  SliceDigestDeltas() = default;
  // `base`: the slice table of the base version (digests included). Throws Error(invalid_argument)
  // for a slice outside the manifest's tensors.
  SliceDigestDeltas(const Manifest& manifest, std::vector<SliceDigest> base);

  bool empty() const noexcept { return base_.empty(); }
  // Appends to `out`, for each slice of `tensor` that holds some of the changes, the digest delta
  // of those changes: units first + positions[k] (ascending) going from old_bits[k] to new_bits[k].
  // Cost: per slice of the tensor, a binary search per stripe the changes span.
  void add_segment(uint32_t tensor, uint64_t first, const uint32_t* positions, const uint32_t* old_bits,
                   const uint32_t* new_bits, size_t count, Deltas& out) const;
  // Per slice of the base table, the sum of its deltas in `chunks` (a group part's share).
  std::vector<uint64_t> totals(const std::vector<Deltas>& chunks) const;
  // The base table with every delta of `chunks` added: the new version's slice table.
  std::vector<SliceDigest> advance(const std::vector<Deltas>& chunks) const;

 private:
  struct Compiled {
    uint32_t slice = 0;  // index in base_
    SliceStripes stripes;
  };
  std::vector<SliceDigest> base_;
  std::vector<std::vector<Compiled>> by_tensor_;  // [tensor]: its slices
};

}  // namespace deltacast::codec
