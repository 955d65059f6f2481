#include "codec/chunk_plan.h"

#include <algorithm>

#include "util/error.h"

namespace deltacast::codec {

std::vector<std::vector<Slice>> plan_chunks(const Manifest& manifest, std::span<const PartRange> ranges,
                                            uint64_t chunk_bytes) {
  if (chunk_bytes < 64) throw Error(Errc::invalid_argument, "chunk size must be at least 64 bytes");
  std::vector<std::vector<Slice>> chunks;
  std::vector<Slice> open;
  uint64_t open_bytes = 0;
  auto close = [&] {
    if (!open.empty()) chunks.push_back(std::move(open));
    open.clear();
    open_bytes = 0;
  };
  for (const PartRange& r : ranges) {
    const auto& info = manifest.at(r.tensor);
    const uint64_t n = r.units();  // code units: 8-byte elements are two
    if (n == 0) continue;
    const uint64_t w = dtype_unit_size(info.dtype);
    // Segments index units with 32-bit positions.
    const uint64_t max_elems = std::min<uint64_t>(std::max<uint64_t>(chunk_bytes / w, 1), uint64_t{1} << 31);
    if (n * w >= chunk_bytes || n > max_elems) {
      close();
      const uint64_t pieces = (n + max_elems - 1) / max_elems;
      const uint64_t per = (n + pieces - 1) / pieces;
      for (uint64_t b = 0; b < n; b += per) chunks.push_back({Slice{r.tensor, r.begin + b, std::min(per, n - b)}});
      continue;
    }
    if (open_bytes + n * w > chunk_bytes) close();
    open.push_back(Slice{r.tensor, r.begin, n});
    open_bytes += n * w;
  }
  close();
  return chunks;
}

std::vector<std::vector<Slice>> plan_chunks(const Manifest& manifest, uint64_t chunk_bytes) {
  std::vector<PartRange> whole;
  whole.reserve(manifest.size());
  for (uint32_t t = 0; t < manifest.size(); ++t) whole.push_back({t, 0, manifest.at(t).units()});
  return plan_chunks(manifest, whole, chunk_bytes);
}

}  // namespace deltacast::codec
