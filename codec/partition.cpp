#include "codec/partition.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <queue>

#include "util/error.h"

namespace deltacast::codec {
namespace {

uint64_t range_bytes(const Manifest& m, const PartRange& r) {
  return r.units() * dtype_unit_size(m.at(r.tensor).dtype);
}

std::string units_text(const Manifest& m, uint32_t tensor, uint64_t begin, uint64_t end) {
  return "units [" + std::to_string(begin) + ", " + std::to_string(end) + ") of tensor '" + m.at(tensor).name + "'";
}

// Sorts by (tensor, begin) and merges ranges that continue each other.
void normalise(std::vector<PartRange>& part) {
  std::sort(part.begin(), part.end(), [](const PartRange& a, const PartRange& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.begin < b.begin;
  });
  std::vector<PartRange> merged;
  for (const auto& r : part) {
    if (!merged.empty() && merged.back().tensor == r.tensor && merged.back().end == r.begin)
      merged.back().end = r.end;
    else
      merged.push_back(r);
  }
  part = std::move(merged);
}

}  // namespace

Partition::Partition(const Manifest& manifest, std::vector<std::vector<PartRange>> parts) : parts_(std::move(parts)) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  const uint64_t head[2] = {manifest.digest(), parts_.size()};
  XXH3_64bits_update(state, head, sizeof head);
  for (auto& part : parts_) {
    normalise(part);
    uint64_t bytes = 0;
    const uint64_t count = part.size();
    XXH3_64bits_update(state, &count, sizeof count);
    for (const auto& r : part) {
      bytes += range_bytes(manifest, r);
      const uint64_t fields[3] = {r.tensor, r.begin, r.end};
      XXH3_64bits_update(state, fields, sizeof fields);
    }
    bytes_.push_back(bytes);
  }
  fingerprint_ = XXH3_64bits_digest(state);
  XXH3_freeState(state);
}

Partition Partition::balanced(const Manifest& manifest, uint32_t ranks) {
  if (ranks == 0) throw Error(Errc::invalid_argument, "a producer group needs at least one rank");
  const uint64_t total = manifest.total_bytes();
  const uint64_t fair = std::max<uint64_t>(1, (total + ranks - 1) / ranks);
  struct Piece {
    PartRange range;
    uint64_t bytes;
  };
  std::vector<Piece> pieces;
  for (uint32_t t = 0; t < manifest.size(); ++t) {
    const uint64_t n = manifest.at(t).units();
    if (n == 0) continue;
    const uint64_t w = dtype_unit_size(manifest.at(t).dtype);
    if (ranks == 1 || n * w <= fair) {
      pieces.push_back({{t, 0, n}, n * w});
      continue;
    }
    const uint64_t cuts = (n * w + fair - 1) / fair;
    uint64_t per = (n + cuts - 1) / cuts;
    per = (per + kPartAlignUnits - 1) / kPartAlignUnits * kPartAlignUnits;
    for (uint64_t b = 0; b < n; b += per) {
      const uint64_t e = std::min(n, b + per);
      pieces.push_back({{t, b, e}, (e - b) * w});
    }
  }
  // Largest first; equal sizes in manifest order.
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.bytes > b.bytes; });
  using Load = std::pair<uint64_t, uint32_t>;  // (bytes so far, rank): the least first, then the lower rank
  std::priority_queue<Load, std::vector<Load>, std::greater<>> loads;
  for (uint32_t r = 0; r < ranks; ++r) loads.push({0, r});
  std::vector<std::vector<PartRange>> parts(ranks);
  for (const auto& p : pieces) {
    auto [bytes, rank] = loads.top();
    loads.pop();
    parts[rank].push_back(p.range);
    loads.push({bytes + p.bytes, rank});
  }
  return Partition(manifest, std::move(parts));
}

Partition Partition::from_parts(const Manifest& manifest, std::vector<std::vector<PartRange>> parts) {
  if (parts.empty()) throw Error(Errc::invalid_argument, "a producer group needs at least one rank");
  struct Claim {
    uint64_t begin, end;
    uint32_t rank;
  };
  std::vector<std::vector<Claim>> claims(manifest.size());
  for (uint32_t r = 0; r < parts.size(); ++r) {
    std::erase_if(parts[r], [](const PartRange& x) { return x.begin == x.end; });
    for (const auto& x : parts[r]) {
      if (x.tensor >= manifest.size())
        throw Error(Errc::invalid_argument, "rank " + std::to_string(r) + " claims tensor index " +
                                                std::to_string(x.tensor) + ", beyond the manifest's " +
                                                std::to_string(manifest.size()) + " tensors");
      if (x.begin > x.end || x.end > manifest.at(x.tensor).units())
        throw Error(Errc::invalid_argument, "rank " + std::to_string(r) + " claims " +
                                                units_text(manifest, x.tensor, x.begin, x.end) + ", which has " +
                                                std::to_string(manifest.at(x.tensor).units()) + " units");
      // A cut inside an element (an odd unit of an 8-byte dtype) cannot be sent raw or read whole.
      const uint64_t per_element = dtype_units_per_element(manifest.at(x.tensor).dtype);
      if (x.begin % per_element != 0 || x.end % per_element != 0)
        throw Error(Errc::invalid_argument,
                    "rank " + std::to_string(r) + " claims " + units_text(manifest, x.tensor, x.begin, x.end) +
                        ", which splits an element (" + std::to_string(per_element) + " units each)");
      claims[x.tensor].push_back({x.begin, x.end, r});
    }
  }
  for (uint32_t t = 0; t < manifest.size(); ++t) {
    auto& c = claims[t];
    std::sort(c.begin(), c.end(), [](const Claim& a, const Claim& b) { return a.begin < b.begin; });
    uint64_t covered = 0;
    uint32_t last_rank = 0;
    for (const auto& x : c) {
      if (x.begin > covered)
        throw Error(Errc::invalid_argument, units_text(manifest, t, covered, x.begin) + " are claimed by no rank");
      if (x.begin < covered)
        throw Error(Errc::invalid_argument,
                    units_text(manifest, t, x.begin, std::min(covered, x.end)) +
                        (last_rank == x.rank ? " are claimed twice by rank " + std::to_string(x.rank)
                                             : " are claimed by ranks " + std::to_string(last_rank) + " and " +
                                                   std::to_string(x.rank)));
      covered = x.end;
      last_rank = x.rank;
    }
    if (covered < manifest.at(t).units())
      throw Error(Errc::invalid_argument,
                  units_text(manifest, t, covered, manifest.at(t).units()) + " are claimed by no rank");
  }
  return Partition(manifest, std::move(parts));
}

std::string Partition::describe(const Manifest& manifest) const {
  std::string out;
  for (uint32_t r = 0; r < ranks(); ++r) {
    uint32_t tensors = 0, cut = 0;
    for (const auto& x : parts_[r]) (x.units() == manifest.at(x.tensor).units() ? tensors : cut)++;
    char text[128];
    std::snprintf(text, sizeof text, "%srank %u: %u whole tensors, %u ranges, %.3f GB", out.empty() ? "" : "; ", r,
                  tensors, cut, static_cast<double>(bytes_[r]) / 1e9);
    out += text;
  }
  return out;
}

}  // namespace deltacast::codec
