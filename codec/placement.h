#pragma once
// A receiver's placement (docs/placement.md): which slices of which canonical tensors each of its
// own buffers holds, as an inference engine shards and fuses them (tensor-parallel row or column
// slices, a vocabulary range, fused q/k/v or gate/up, experts stacked into one tensor). Pure: no
// I/O, no threads.
//
// A buffer holds its parts side by side along one dimension `dim` of the canonical tensors'
// shapes: part k is the slice start:stop along `dim` of tensor `tensor`, and lies at offset `at`
// along that dimension of the buffer (default: right after the previous part; the first at 0).
// Every other dimension of a part equals the buffer's. Rows of the buffer that no part fills (a
// padded vocabulary: `shape` larger than the parts) are never written. A `stack` buffer instead
// puts its parts one after another along a new leading dimension (MoE experts: [E, ...] from E
// expert tensors, each sliced alike), `at` then being the index along that dimension.
//
// Placement::compile validates everything before anything is written, throwing
// Error(invalid_argument) that names the buffer and the part: an unknown tensor, a slice out of
// range, parts whose shapes do not fit side by side (or, stacked, differ), parts of another dtype
// than the buffer's, two parts overlapping within one buffer, a part outside the buffer's shape,
// or a buffer whose byte size is not its shape's.
//
// Coordinates are codec units (TensorInfo::units: an 8-byte element is two), as in frames and
// digests: a canonical unit index maps to (buffer, unit index in the buffer) by locate(), and a
// range of canonical units to the runs the receiver holds by for_each_run(). Unit tests and a
// property test against a dense apply followed by slicing: tests/unit/codec/test_placement.cpp.
#include <compare>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <span>

#include "codec/frame.h"
#include "codec/manifest.h"
#include "codec/partition.h"

namespace deltacast::codec {

// One part of a buffer: the slice start:stop along `dim` of canonical tensor `tensor`.
struct PlacementPart {
  std::string tensor;
  uint32_t dim = 0;
  uint64_t start = 0;
  uint64_t stop = 0;
  // Where along the buffer's dimension the part lies (stack: its index along the new leading
  // dimension); absent: right after the previous part (0 for the first).
  std::optional<uint64_t> at;
};

// One of the receiver's buffers.
struct BufferPlacement {
  std::string name;                  // the buffer's name (the engine's parameter name)
  std::vector<PlacementPart> parts;  // at least one; every part of one buffer has the same dtype and dim
  bool stack = false;                // parts along a new leading dimension
  // The buffer's shape in elements; empty: exactly what the parts fill (the last part's end along
  // the dimension). Larger than the parts only along their dimension (padding, never written).
  std::vector<uint64_t> shape;
  uint64_t bytes = 0;  // the buffer's size, checked against its shape (0: not checked)
};

// Where one canonical unit lies in the receiver's buffers.
struct PlacedUnit {
  uint32_t buffer = 0;  // index in the placement's buffers
  uint64_t unit = 0;    // unit index within that buffer (row-major)
  auto operator<=>(const PlacedUnit&) const = default;
};

// A run of canonical units [unit, unit + count) of one tensor, held contiguously in a buffer from
// `buffer_unit` on.
struct PlacedRun {
  uint64_t unit = 0;
  uint32_t buffer = 0;
  uint64_t buffer_unit = 0;
  uint64_t count = 0;
  uint32_t part = 0;  // the part holding it (flat index: every buffer's parts in order)
};

class Placement {
 public:
  // Validates `buffers` against `manifest` (see above). Throws Error(invalid_argument) naming the
  // buffer and the part.
  static Placement compile(const Manifest& manifest, std::vector<BufferPlacement> buffers);

  const std::vector<BufferPlacement>& buffers() const noexcept { return buffers_; }
  // The buffer's shape (as given, or what its parts fill) and its dtype.
  const std::vector<uint64_t>& shape(uint32_t buffer) const { return shapes_.at(buffer); }
  DType dtype(uint32_t buffer) const { return dtypes_.at(buffer); }
  uint64_t buffer_units(uint32_t buffer) const;
  // Whether any part names canonical tensor `tensor` (a tensor no part names is not needed here).
  bool needs(uint32_t tensor) const { return tensor < by_tensor_.size() && !by_tensor_[tensor].empty(); }
  // Every place canonical unit `unit` of tensor `tensor` is held (a tensor placed in two buffers:
  // both; none: an element this receiver does not hold). Ascending by buffer.
  std::vector<PlacedUnit> locate(uint32_t tensor, uint64_t unit) const;
  // The same places, each passed to f(PlacedUnit) in the same order, without building a vector
  // (for per-element loops: rollback, writing a staged version).
  template <class F>
  void for_each_place(uint32_t tensor, uint64_t unit, F&& f) const {
    if (tensor >= by_tensor_.size()) return;
    for (const PartMap& m : by_tensor_[tensor]) {
      const uint64_t o = unit / m.block;
      const uint64_t r = unit - o * m.block;
      if (o < m.outer && r >= m.lo && r < m.hi) f(PlacedUnit{m.buffer, m.base + o * m.stride + (r - m.lo)});
    }
  }
  // Calls f for each run of canonical units of `tensor` within [first, last) that a buffer holds,
  // in ascending canonical order per part (parts in buffer order). Cost: proportional to the runs
  // in the range, not to its units.
  void for_each_run(uint32_t tensor, uint64_t first, uint64_t last,
                    const std::function<void(const PlacedRun&)>& f) const;
  // Whether any buffer holds any unit of `tensor` in [first, last). Cost: O(parts of the tensor).
  bool holds_any(uint32_t tensor, uint64_t first, uint64_t last) const;
  // Parts, numbered flat (buffer 0's parts in order, then buffer 1's, ...): how many, and the
  // canonical slice part `part` holds (digest 0), as a seal's slice table names it.
  uint32_t part_count() const noexcept { return static_cast<uint32_t>(slices_.size()); }
  const SliceDigest& slice(uint32_t part) const { return slices_.at(part); }
  // How many parts name canonical tensor `tensor` (almost always 0 or 1; 2 for a tied copy).
  size_t parts_of(uint32_t tensor) const { return tensor < by_tensor_.size() ? by_tensor_[tensor].size() : 0; }
  // Manifest::digest() of the manifest it was compiled against.
  uint64_t manifest_digest() const noexcept { return manifest_digest_; }

 private:
  // One part, compiled: canonical unit u of its tensor, with o = u / block and r = u - o * block,
  // is held iff lo <= r < hi, at buffer unit base + o * stride + (r - lo).
  struct PartMap {
    uint32_t buffer = 0;
    uint64_t block = 0;       // units of one step of the dimensions before `dim` (shape[dim] * inner)
    uint64_t lo = 0, hi = 0;  // start * inner, stop * inner
    uint64_t base = 0;        // the buffer unit of the part's first unit
    uint64_t stride = 0;      // buffer units of one step of the dimensions before `dim`
    uint64_t outer = 0;       // steps of the dimensions before `dim`
    uint32_t part = 0;        // flat part index
  };

  std::vector<BufferPlacement> buffers_;
  uint64_t manifest_digest_ = 0;
  std::vector<std::vector<uint64_t>> shapes_;
  std::vector<DType> dtypes_;
  std::vector<std::vector<PartMap>> by_tensor_;  // [canonical tensor]
  std::vector<SliceDigest> slices_;              // [flat part]: its canonical slice
};

// Where slice `slice` (its digest field ignored) lies among its tensor's canonical units: `outer`
// stripes, stripe o being units [o * block + lo, o * block + hi) (a slice along dim 0: one stripe).
// Throws Error(invalid_argument) for a tensor not in the manifest or a slice outside its tensor.
struct SliceStripes {
  uint64_t block = 0, lo = 0, hi = 0, outer = 0;
};
SliceStripes slice_stripes(const Manifest& manifest, const SliceDigest& slice);

// The digest of slice `slice` (its digest field ignored) of canonical tensor slice.tensor, whose
// whole bytes are `tensor_bytes` (what a producer that holds the tensor sends in a seal). Cost: a
// scan of the slice's bytes. Throws Error(invalid_argument) for a slice outside the tensor or
// bytes of the wrong size.
uint64_t canonical_slice_digest(const Manifest& manifest, const SliceDigest& slice,
                                std::span<const std::byte> tensor_bytes);

// The share of slice `slice`'s digest that lies in `ranges` (a producer group rank's part,
// codec/partition.h: disjoint unit ranges), read through `reader` (which holds at least those
// ranges). The parts of a partition add up (mod 2^64) to canonical_slice_digest. Cost: a read and
// a scan of the slice's units inside the ranges. Throws what slice_stripes and the reader throw.
uint64_t part_slice_digest(const WeightsReader& reader, const SliceDigest& slice, std::span<const PartRange> ranges);

// Throws Error(invalid_argument) unless buffers[k] is a buffer of placement buffer k's byte size,
// aligned to its element width, for every k (and no more).
void check_placed_buffers(const Placement& placement, std::span<const std::span<std::byte>> buffers);

// The digest of what each part of `placement` holds, read from the receiver's buffers
// (buffers[k]: placement buffer k, its byte size checked): per flat part, the same value as
// canonical_slice_digest of its slice over the canonical tensor. Throws Error(invalid_argument)
// for a buffer count or size that does not match.
std::vector<uint64_t> placed_part_digests(const Manifest& manifest, const Placement& placement,
                                          std::span<const std::span<std::byte>> buffers);

// Copies what the buffers hold of canonical bytes [byte_offset, byte_offset + bytes.size()) of
// tensor `tensor` (a RAW piece of a bootstrap or a snapshot: whole units) into them; units outside
// every part are dropped. Returns the units written (a tensor held twice: counted in each copy).
// The buffers must have passed check_placed_buffers. Throws Error(invalid_argument) for a tensor
// outside the manifest the placement was compiled against, a range outside the tensor or one
// that splits a unit; nothing is written then.
uint64_t scatter_placed(const Placement& placement, const Manifest& manifest, uint32_t tensor, uint64_t byte_offset,
                        std::span<const std::byte> bytes, std::span<const std::span<std::byte>> buffers);

// Zeroes every unit the buffers hold (the all-zero version 0 of what they hold); padding is left
// as it is. The buffers must have passed check_placed_buffers.
void zero_placed(const Placement& placement, const Manifest& manifest, std::span<const std::span<std::byte>> buffers);

// Copies what each buffer of `placement` holds out of the whole canonical tensors `weights` (the
// placement's manifest): buffers[k] is placement buffer k (byte size checked). Units no part covers
// (padding) are left as they are. Cost: one copy of the held bytes, a run at a time. Throws
// Error(invalid_argument) for a buffer count or size that does not match, or `weights` that are
// not one span of the right size per tensor of the manifest the placement was compiled against.
void gather_placed(const Placement& placement, const ConstWeights& weights,
                   std::span<const std::span<std::byte>> buffers);

// What the producer knows of its members' placements (each distinct one added once): where some
// member holds a range of canonical units only partly. The encoder must not code such a segment's
// locations by class (classed_gaps: the classes come from the old bits of the whole segment,
// which that member lacks; docs/placement.md, "Apply through the placement").
class HeldSlices {
 public:
  void add(Placement placement) { placements_.push_back(std::move(placement)); }
  bool empty() const noexcept { return placements_.empty(); }
  // Where, strictly inside [begin, end) of `tensor`, a run of at least `min_run` units that some
  // placement holds begins or ends: ascending, each once.
  std::vector<uint64_t> cuts(uint32_t tensor, uint64_t begin, uint64_t end, uint64_t min_run) const;
  // Every distinct slice the placements hold (digest 0): what the seal's slice table covers.
  std::vector<SliceDigest> slices() const;
  // True when some placement holds some but not all of units [begin, end) of `tensor`. Cost: the
  // runs the placements hold in the range.
  bool splits(uint32_t tensor, uint64_t begin, uint64_t end) const;

 private:
  std::vector<Placement> placements_;
};

}  // namespace deltacast::codec
