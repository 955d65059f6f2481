#include "codec/slice_digest_delta.h"

#include <algorithm>

#include "codec/digest.h"
#include "util/error.h"

namespace deltacast::codec {

SliceDigestDeltas::SliceDigestDeltas(const Manifest& manifest, std::vector<SliceDigest> base)
    : base_(std::move(base)), by_tensor_(manifest.size()) {
  if (base_.size() >= UINT32_MAX) throw Error(Errc::invalid_argument, "slice table: too many slices");
  for (uint32_t i = 0; i < base_.size(); ++i)
    by_tensor_[base_[i].tensor].push_back(Compiled{i, slice_stripes(manifest, base_[i])});
}

void SliceDigestDeltas::add_segment(uint32_t tensor, uint64_t first, const uint32_t* positions,
                                    const uint32_t* old_bits, const uint32_t* new_bits, size_t count,
                                    Deltas& out) const {
  if (count == 0 || tensor >= by_tensor_.size()) return;
  const uint64_t highest = first + positions[count - 1];
  for (const Compiled& c : by_tensor_[tensor]) {
    const SliceStripes& st = c.stripes;
    uint64_t sum = 0;
    bool any = false;
    // Stripe by stripe, jumping to the stripe of the next change not yet placed (a column slice
    // has a stripe per row: the changes, not the rows, bound the work).
    const uint64_t last_stripe = std::min(highest / st.block, st.outer - 1);
    const uint32_t* cursor = positions;
    const uint32_t* const end = positions + count;
    for (uint64_t o = (first + positions[0]) / st.block; cursor != end; ++o) {
      o = std::max(o, (first + *cursor) / st.block);
      if (o > last_stripe) break;
      const uint64_t lo = o * st.block + st.lo, hi = o * st.block + st.hi;
      if (hi <= first) continue;
      // Positions are relative to `first`; clamp the stripe to the segment's side of it.
      const uint64_t rel_lo = lo > first ? lo - first : 0, rel_hi = hi - first;
      const uint32_t* from = std::lower_bound(cursor, end, rel_lo, [](uint32_t p, uint64_t v) { return p < v; });
      const uint32_t* to = std::lower_bound(from, end, rel_hi, [](uint32_t p, uint64_t v) { return p < v; });
      cursor = to;
      if (from == to) continue;
      const size_t k = static_cast<size_t>(from - positions);
      sum += changes_digest_delta(tensor, first, from, old_bits + k, new_bits + k, static_cast<size_t>(to - from));
      any = true;
    }
    if (any) out.emplace_back(c.slice, sum);
  }
}

std::vector<uint64_t> SliceDigestDeltas::totals(const std::vector<Deltas>& chunks) const {
  std::vector<uint64_t> out(base_.size(), 0);
  for (const auto& chunk : chunks)
    for (const auto& [slice, delta] : chunk) out.at(slice) += delta;
  return out;
}

std::vector<SliceDigest> SliceDigestDeltas::advance(const std::vector<Deltas>& chunks) const {
  std::vector<SliceDigest> out = base_;
  const auto sums = totals(chunks);
  for (size_t i = 0; i < out.size(); ++i) out[i].digest += sums[i];
  return out;
}

}  // namespace deltacast::codec
