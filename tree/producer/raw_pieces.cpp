#include "tree/producer/raw_pieces.h"

#include <algorithm>
#include <limits>
#include <string>

#include "util/error.h"

namespace deltacast::tree {

std::vector<RawPiece> raw_pieces(const codec::Manifest& manifest, const std::vector<codec::PartRange>& ranges,
                                 uint64_t chunk_bytes) {
  std::vector<RawPiece> pieces;
  for (const auto& r : ranges) {
    if (r.tensor >= manifest.size() || r.begin > r.end || r.end > manifest.at(r.tensor).units())
      throw Error(Errc::invalid_argument, "raw pieces: a range outside its tensor");
    const auto dtype = manifest.at(r.tensor).dtype;
    const uint64_t unit = codec::dtype_unit_size(dtype), w = codec::dtype_size(dtype);
    const uint64_t begin = r.begin * unit, end = r.end * unit;
    // Receivers refuse a piece that splits an element.
    if (begin % w != 0 || end % w != 0)
      throw Error(Errc::invalid_argument, "raw pieces: units [" + std::to_string(r.begin) + ", " +
                                              std::to_string(r.end) + ") of tensor '" + manifest.at(r.tensor).name +
                                              "' split an element");
    const uint64_t piece_bytes = std::max(w, chunk_bytes / w * w);
    for (uint64_t off = begin; off < end; off += piece_bytes)
      pieces.push_back({r.tensor, off, std::min(piece_bytes, end - off)});
  }
  return pieces;
}

std::vector<codec::PartRange> whole_tensors(const codec::Manifest& manifest) {
  std::vector<codec::PartRange> ranges;
  for (uint32_t t = 0; t < manifest.size(); ++t)
    if (manifest.at(t).units() > 0) ranges.push_back({t, 0, manifest.at(t).units()});
  return ranges;
}

std::vector<uint32_t> raw_group_first(const codec::Manifest& manifest, const codec::Partition& partition,
                                      uint64_t chunk_bytes) {
  std::vector<uint32_t> first{0};
  uint64_t total = 0;
  for (uint32_t r = 0; r < partition.ranks(); ++r) {
    total += raw_pieces(manifest, partition.part(r), chunk_bytes).size();
    if (total > std::numeric_limits<uint32_t>::max())
      throw Error(Errc::invalid_argument, "raw pieces: more than 2^32 pieces (raise encode.chunk_bytes)");
    first.push_back(static_cast<uint32_t>(total));
  }
  return first;
}

}  // namespace deltacast::tree
