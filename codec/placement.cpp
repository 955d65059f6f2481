#include "codec/placement.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <set>

#include "codec/digest.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

uint64_t product(const std::vector<uint64_t>& dims, size_t from, size_t to) {
  uint64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= dims[i];
  return n;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Throws for buffer `b`, part `k` (k < 0: the buffer itself).
[[noreturn]] void refuse(const BufferPlacement& b, long k, const std::string& why) {
  std::string where = "placement: buffer '" + b.name + "'";
  if (k >= 0)
    where += " part " + std::to_string(k) + " (" + b.parts[static_cast<size_t>(k)].tensor + " " +
             std::to_string(b.parts[static_cast<size_t>(k)].start) + ":" +
             std::to_string(b.parts[static_cast<size_t>(k)].stop) + " along dim " +
             std::to_string(b.parts[static_cast<size_t>(k)].dim) + ")";
  throw Error(Errc::invalid_argument, where + ": " + why);
}

// A part's slice: the tensor's shape with `dim` cut to stop - start.
std::vector<uint64_t> slice_shape(const TensorInfo& t, const PlacementPart& p) {
  std::vector<uint64_t> s = t.shape;
  s[p.dim] = p.stop - p.start;
  return s;
}

}  // namespace

uint64_t Placement::buffer_units(uint32_t buffer) const {
  return product(shapes_.at(buffer), 0, shapes_.at(buffer).size()) * dtype_units_per_element(dtypes_.at(buffer));
}

Placement Placement::compile(const Manifest& manifest, std::vector<BufferPlacement> buffers) {
  Placement out;
  out.manifest_digest_ = manifest.digest();
  out.by_tensor_.resize(manifest.size());
  std::set<std::string> names;
  for (uint32_t bi = 0; bi < buffers.size(); ++bi) {
    const BufferPlacement& b = buffers[bi];
    if (b.name.empty()) throw Error(Errc::invalid_argument, "placement: buffer " + std::to_string(bi) + " has no name");
    if (!names.insert(b.name).second) refuse(b, -1, "named twice");
    if (b.parts.empty()) refuse(b, -1, "has no parts");
    // Each part against its tensor; then the parts against each other.
    std::vector<const TensorInfo*> infos;
    std::vector<uint32_t> indexes;
    for (size_t k = 0; k < b.parts.size(); ++k) {
      const PlacementPart& p = b.parts[k];
      const auto index = manifest.find(p.tensor);
      if (!index) refuse(b, static_cast<long>(k), "the checkpoint has no tensor of that name");
      const TensorInfo& t = manifest.at(*index);
      if (p.dim >= t.shape.size())
        refuse(b, static_cast<long>(k),
               "the tensor has " + std::to_string(t.shape.size()) + " dimensions " + shape_text(t.shape) + ": no dim " +
                   std::to_string(p.dim));
      if (p.start >= p.stop || p.stop > t.shape[p.dim])
        refuse(b, static_cast<long>(k),
               "slice out of range: the tensor's dim " + std::to_string(p.dim) + " has " +
                   std::to_string(t.shape[p.dim]) + " (shape " + shape_text(t.shape) + ")");
      if (k > 0 && t.dtype != infos[0]->dtype)
        refuse(b, static_cast<long>(k),
               "dtype mismatch: the tensor is " + std::string(dtype_name(t.dtype)) + ", part 0's " +
                   std::string(dtype_name(infos[0]->dtype)));
      if (k > 0 && p.dim != b.parts[0].dim)
        refuse(b, static_cast<long>(k),
               "parts do not concatenate: it slices dim " + std::to_string(p.dim) + ", part 0 dim " +
                   std::to_string(b.parts[0].dim));
      infos.push_back(&t);
      indexes.push_back(*index);
    }
    const uint32_t dim = b.parts[0].dim;
    const std::vector<uint64_t> first = slice_shape(*infos[0], b.parts[0]);
    // Where each part lies along the buffer's dimension: [begin, end).
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    uint64_t next = 0;
    for (size_t k = 0; k < b.parts.size(); ++k) {
      const PlacementPart& p = b.parts[k];
      const std::vector<uint64_t> s = slice_shape(*infos[k], p);
      const uint64_t width = b.stack ? 1 : s[dim];
      bool fits = s.size() == first.size();
      for (size_t i = 0; fits && i < s.size(); ++i) fits = b.stack ? s[i] == first[i] : (i == dim || s[i] == first[i]);
      if (!fits)
        refuse(
            b, static_cast<long>(k),
            "parts do not " + std::string(b.stack ? "stack" : "concatenate") + ": its slice is " + shape_text(s) +
                ", part 0's " + shape_text(first) +
                (b.stack ? " (stacked parts have one shape)" : " (only dim " + std::to_string(dim) + " may differ)"));
      const uint64_t at = p.at.value_or(next);
      spans.emplace_back(at, at + width);
      next = at + width;
    }
    // Overlaps: sorted by where they begin.
    std::vector<size_t> order(spans.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return spans[x] < spans[y]; });
    for (size_t i = 1; i < order.size(); ++i)
      if (spans[order[i]].first < spans[order[i - 1]].second)
        refuse(b, static_cast<long>(std::max(order[i], order[i - 1])),
               "overlaps part " + std::to_string(std::min(order[i], order[i - 1])) + " at " +
                   std::to_string(spans[order[i]].first) + " along the buffer's " +
                   (b.stack ? "stacking dimension" : "dim " + std::to_string(dim)));
    uint64_t extent = 0;
    for (const auto& s : spans) extent = std::max(extent, s.second);
    // The buffer's shape: the parts' (stacked: a new leading dimension), or the given one.
    std::vector<uint64_t> shape = first;
    if (b.stack)
      shape.insert(shape.begin(), extent);
    else
      shape[dim] = extent;
    const size_t along = b.stack ? 0 : dim;
    if (!b.shape.empty()) {
      bool same = b.shape.size() == shape.size();
      for (size_t i = 0; same && i < shape.size(); ++i) same = i == along || b.shape[i] == shape[i];
      if (!same)
        refuse(b, -1,
               "its shape " + shape_text(b.shape) + " does not hold its parts " + shape_text(shape) + " (only dim " +
                   std::to_string(along) + " may be larger: padding)");
      if (b.shape[along] < extent)
        refuse(b, -1,
               "its parts reach " + std::to_string(extent) + " along dim " + std::to_string(along) +
                   ", past its shape " + shape_text(b.shape));
      shape = b.shape;
    }
    const DType dtype = infos[0]->dtype;
    const uint64_t want = product(shape, 0, shape.size()) * dtype_size(dtype);
    if (b.bytes != 0 && b.bytes != want)
      refuse(b, -1,
             "wrong size: " + std::to_string(b.bytes) + " bytes, its shape " + shape_text(shape) + " of " +
                 std::string(dtype_name(dtype)) + " is " + std::to_string(want));
    // Compile each part.
    const uint64_t upe = dtype_units_per_element(dtype);
    for (size_t k = 0; k < b.parts.size(); ++k) {
      const PlacementPart& p = b.parts[k];
      const TensorInfo& t = *infos[k];
      const uint64_t inner = product(t.shape, p.dim + 1, t.shape.size()) * upe;
      PartMap m;
      m.buffer = bi;
      m.block = t.shape[p.dim] * inner;
      m.lo = p.start * inner;
      m.hi = p.stop * inner;
      m.outer = product(t.shape, 0, p.dim);
      m.part = static_cast<uint32_t>(out.slices_.size());
      out.slices_.push_back(SliceDigest{indexes[k], p.dim, p.start, p.stop, 0});
      if (b.stack) {
        m.stride = (p.stop - p.start) * inner;
        m.base = spans[k].first * product(first, 0, first.size()) * upe;
      } else {
        m.stride = shape[dim] * inner;
        m.base = spans[k].first * inner;
      }
      out.by_tensor_[indexes[k]].push_back(m);
    }
    out.shapes_.push_back(std::move(shape));
    out.dtypes_.push_back(dtype);
  }
  out.buffers_ = std::move(buffers);
  return out;
}

std::vector<PlacedUnit> Placement::locate(uint32_t tensor, uint64_t unit) const {
  std::vector<PlacedUnit> out;
  for_each_place(tensor, unit, [&](const PlacedUnit& at) { out.push_back(at); });
  return out;
}

void Placement::for_each_run(uint32_t tensor, uint64_t first, uint64_t last,
                             const std::function<void(const PlacedRun&)>& f) const {
  if (tensor >= by_tensor_.size() || first >= last) return;
  for (const PartMap& m : by_tensor_[tensor]) {
    const uint64_t end = std::min(m.outer, (last - 1) / m.block + 1);
    for (uint64_t o = first / m.block; o < end; ++o) {
      const uint64_t from = std::max(first, o * m.block + m.lo);
      const uint64_t to = std::min(last, o * m.block + m.hi);
      if (from >= to) continue;
      f({from, m.buffer, m.base + o * m.stride + (from - o * m.block - m.lo), to - from, m.part});
    }
  }
}

bool Placement::holds_any(uint32_t tensor, uint64_t first, uint64_t last) const {
  if (tensor >= by_tensor_.size() || first >= last) return false;
  for (const PartMap& m : by_tensor_[tensor]) {
    const uint64_t o0 = first / m.block;
    const uint64_t o1 = std::min(m.outer - 1, (last - 1) / m.block);
    if (o0 > o1) continue;
    if (o1 - o0 >= 2) return true;  // a whole step of the outer dimensions lies between
    for (const uint64_t o : {o0, o1})
      if (std::max(first, o * m.block + m.lo) < std::min(last, o * m.block + m.hi)) return true;
  }
  return false;
}

std::vector<SliceDigest> HeldSlices::slices() const {
  std::vector<SliceDigest> out;
  for (const Placement& p : placements_)
    for (uint32_t q = 0; q < p.part_count(); ++q)
      if (std::none_of(out.begin(), out.end(), [&](const SliceDigest& s) { return s.same_slice(p.slice(q)); }))
        out.push_back(p.slice(q));
  return out;
}

std::vector<uint64_t> HeldSlices::cuts(uint32_t tensor, uint64_t begin, uint64_t end, uint64_t min_run) const {
  std::vector<uint64_t> out;
  for (const Placement& p : placements_)
    p.for_each_run(tensor, begin, end, [&](const PlacedRun& r) {
      if (r.count < min_run) return;
      if (r.unit > begin) out.push_back(r.unit);
      if (r.unit + r.count < end) out.push_back(r.unit + r.count);
    });
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool HeldSlices::splits(uint32_t tensor, uint64_t begin, uint64_t end) const {
  if (begin >= end) return false;
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (const Placement& p : placements_) {
    if (!p.needs(tensor)) continue;
    runs.clear();
    p.for_each_run(tensor, begin, end, [&](const PlacedRun& r) { runs.emplace_back(r.unit, r.unit + r.count); });
    // The units held (a tensor in two buffers: its runs may overlap): the union's length.
    std::sort(runs.begin(), runs.end());
    uint64_t held = 0, reach = begin;
    for (const auto& [from, to] : runs) {
      if (to <= reach) continue;
      held += to - std::max(from, reach);
      reach = to;
    }
    if (held > 0 && held < end - begin) return true;
  }
  return false;
}

SliceStripes slice_stripes(const Manifest& manifest, const SliceDigest& slice) {
  if (slice.tensor >= manifest.size())
    throw Error(Errc::invalid_argument, "slice: tensor index " + std::to_string(slice.tensor) + " is not in the model");
  const TensorInfo& t = manifest.at(slice.tensor);
  if (slice.dim >= t.shape.size() || slice.start >= slice.stop || slice.stop > t.shape[slice.dim])
    throw Error(Errc::invalid_argument, "slice: " + std::to_string(slice.start) + ":" + std::to_string(slice.stop) +
                                            " along dim " + std::to_string(slice.dim) + " is not a slice of tensor '" +
                                            t.name + "' " + shape_text(t.shape));
  const uint64_t inner = product(t.shape, slice.dim + 1, t.shape.size()) * dtype_units_per_element(t.dtype);
  return SliceStripes{t.shape[slice.dim] * inner, slice.start * inner, slice.stop * inner,
                      product(t.shape, 0, slice.dim)};
}

uint64_t canonical_slice_digest(const Manifest& manifest, const SliceDigest& slice,
                                std::span<const std::byte> tensor_bytes) {
  const SliceStripes st = slice_stripes(manifest, slice);
  const TensorInfo& t = manifest.at(slice.tensor);
  if (tensor_bytes.size() != t.nbytes())
    throw Error(Errc::invalid_argument, "slice digest: tensor '" + t.name + "' needs " + std::to_string(t.nbytes()) +
                                            " bytes, got " + std::to_string(tensor_bytes.size()));
  const uint64_t width = dtype_unit_size(t.dtype);
  uint64_t sum = 0;
  for (uint64_t o = 0; o < st.outer; ++o) {
    const uint64_t first = o * st.block + st.lo;
    sum += slice_digest(slice.tensor, t.dtype, first, tensor_bytes.subspan(first * width, (st.hi - st.lo) * width));
  }
  return sum;
}

void zero_placed(const Placement& placement, const Manifest& manifest, std::span<const std::span<std::byte>> buffers) {
  for (uint32_t t = 0; t < manifest.size(); ++t) {
    if (!placement.needs(t)) continue;
    const uint64_t width = dtype_unit_size(manifest.at(t).dtype);
    placement.for_each_run(t, 0, manifest.at(t).units(), [&](const PlacedRun& run) {
      std::memset(buffers[run.buffer].data() + run.buffer_unit * width, 0, run.count * width);
    });
  }
}

uint64_t part_slice_digest(const WeightsReader& reader, const SliceDigest& slice, std::span<const PartRange> ranges) {
  const Manifest& manifest = reader.manifest();
  const SliceStripes st = slice_stripes(manifest, slice);
  const TensorInfo& t = manifest.at(slice.tensor);
  const uint64_t width = dtype_unit_size(t.dtype);
  uint64_t sum = 0;
  std::vector<std::byte> bytes;
  for (const PartRange& r : ranges) {
    if (r.tensor != slice.tensor) continue;
    // The stripes that meet [r.begin, r.end), each clipped to it.
    const uint64_t first_stripe = r.begin / st.block;
    for (uint64_t o = first_stripe; o < st.outer && o * st.block + st.lo < r.end; ++o) {
      const uint64_t lo = std::max(o * st.block + st.lo, r.begin);
      const uint64_t hi = std::min(o * st.block + st.hi, r.end);
      if (lo >= hi) continue;
      bytes.resize((hi - lo) * width);
      reader.read(slice.tensor, lo * width, bytes);
      sum += slice_digest(slice.tensor, t.dtype, lo, bytes);
    }
  }
  return sum;
}

void check_placed_buffers(const Placement& placement, std::span<const std::span<std::byte>> buffers) {
  if (buffers.size() != placement.buffers().size())
    throw Error(Errc::invalid_argument, "placement: " + std::to_string(placement.buffers().size()) +
                                            " buffers placed, " + std::to_string(buffers.size()) + " given");
  for (uint32_t b = 0; b < buffers.size(); ++b) {
    const uint64_t want = placement.buffer_units(b) * dtype_unit_size(placement.dtype(b));
    if (buffers[b].size() != want)
      throw Error(Errc::invalid_argument, "placement: buffer '" + placement.buffers()[b].name + "' has " +
                                              std::to_string(buffers[b].size()) + " bytes, its shape " +
                                              shape_text(placement.shape(b)) + " needs " + std::to_string(want));
    if (reinterpret_cast<uintptr_t>(buffers[b].data()) % dtype_unit_size(placement.dtype(b)) != 0)
      throw Error(Errc::invalid_argument,
                  "placement: buffer '" + placement.buffers()[b].name + "' is not aligned to its element size");
  }
}

std::vector<uint64_t> placed_part_digests(const Manifest& manifest, const Placement& placement,
                                          std::span<const std::span<std::byte>> buffers) {
  check_placed_buffers(placement, buffers);
  std::vector<uint64_t> out(placement.part_count(), 0);
  for (uint32_t tensor = 0; tensor < manifest.size(); ++tensor) {
    if (!placement.needs(tensor)) continue;
    const TensorInfo& t = manifest.at(tensor);
    const uint64_t width = dtype_unit_size(t.dtype);
    placement.for_each_run(tensor, 0, t.units(), [&](const PlacedRun& r) {
      out[r.part] +=
          slice_digest(tensor, t.dtype, r.unit,
                       std::span<const std::byte>(buffers[r.buffer]).subspan(r.buffer_unit * width, r.count * width));
    });
  }
  return out;
}

uint64_t scatter_placed(const Placement& placement, const Manifest& manifest, uint32_t tensor, uint64_t byte_offset,
                        std::span<const std::byte> bytes, std::span<const std::span<std::byte>> buffers) {
  if (manifest.digest() != placement.manifest_digest())
    throw Error(Errc::invalid_argument, "placement: compiled against another manifest");
  if (tensor >= manifest.size())
    throw Error(Errc::invalid_argument, "placement: tensor index " + std::to_string(tensor) + " is not in the model");
  const TensorInfo& t = manifest.at(tensor);
  const uint64_t width = dtype_unit_size(t.dtype);
  if (byte_offset % width != 0 || bytes.size() % width != 0 || byte_offset > t.nbytes() ||
      bytes.size() > t.nbytes() - byte_offset)
    throw Error(Errc::invalid_argument, "placement: bytes " + std::to_string(byte_offset) + "+" +
                                            std::to_string(bytes.size()) + " are not whole units of tensor '" + t.name +
                                            "'");
  if (!placement.needs(tensor) || bytes.empty()) return 0;
  const uint64_t first = byte_offset / width;
  uint64_t written = 0;
  placement.for_each_run(tensor, first, first + bytes.size() / width, [&](const PlacedRun& r) {
    std::memcpy(buffers[r.buffer].data() + r.buffer_unit * width, bytes.data() + (r.unit - first) * width,
                r.count * width);
    written += r.count;
  });
  return written;
}

void gather_placed(const Placement& placement, const ConstWeights& weights,
                   std::span<const std::span<std::byte>> buffers) {
  check_placed_buffers(placement, buffers);
  check_weights(weights);
  for (uint32_t tensor = 0; tensor < weights.manifest->size(); ++tensor)
    scatter_placed(placement, *weights.manifest, tensor, 0, weights.tensors[tensor], buffers);
}

}  // namespace deltacast::codec
