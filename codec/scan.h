#pragma once
// The memory-bound kernels of the codec (internal header).
//  - scan_changes: one pass over (old, new) finding changed positions and, when classes are given,
//    each change's class (by the OLD element's magnitude bits) and its rank among the segment's
//    elements of that class. The receiver can recompute classes from its own bits, so locations can
//    be coded per class (a context model conditioned on what the receiver already holds).
//  - select_positions: the receiver's inverse: from per-class ranks back to positions, scanning old
//    bits only as far as the last rank.
// Dispatches at run time to an AVX-512 version when the CPU has AVX-512BW (scan_changes: one with
// vector compression where it also has VBMI2 and VPOPCNTDQ), else AVX2, else portable code.
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "codec/dtype.h"
#include "codec/segment_write.h"

namespace deltacast::codec {

inline constexpr unsigned kMaxClasses = 8;

// Elements are split into `count` classes: class(x) = #{ j < count-1 : (bits(x) & abs_mask) >= thresholds[j] },
// thresholds ascending. abs_mask clears the sign bit of a float dtype.
struct ClassSpec {
  unsigned count = 1;
  std::array<uint32_t, kMaxClasses - 1> thresholds{};
};

// std::allocator whose value-less construct() default-initialises: resize() of a vector of
// integers leaves the new elements uninitialised, so the scan kernels can size their outputs ahead
// of the writes (and truncate them after) without zero-filling memory they then overwrite.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <class T>
using ScanVector = std::vector<T, UninitAllocator<T>>;

struct ScanOutput {
  ScanVector<uint32_t> positions;    // ascending, relative to the segment start
  ScanVector<uint8_t> change_class;  // per change (classed scans only)
  ScanVector<uint32_t> change_rank;  // per change: rank among the segment's elements of its class
  ScanVector<uint32_t> old_bits;     // per change: the base bits (saves random reads later)
  ScanVector<uint32_t> new_bits;     // per change: the new bits
  std::array<uint64_t, kMaxClasses> class_sizes{};  // elements per class (classed scans only)
  void clear() {
    positions.clear();
    change_class.clear();
    change_rank.clear();
    old_bits.clear();
    new_bits.clear();
    class_sizes.fill(0);
  }
};

// A callback of scan_changes: fn(context, first, count) after the elements [first, first + count)
// of the segment were scanned, in order, in stretches of kScanTapSpan elements (the last may be
// shorter), so that another pass over them (the encoder's base digest) finds them in the cache
// instead of reading the segment from memory a second time. fn must not throw.
// 65536 elements: a stretch of both arrays (256 KiB for 16-bit elements) stays in a core's L2. A
// shorter one costs more than it saves: each call stops the scan's streams long enough for the
// hardware prefetchers to fall behind, and restarting them is paid per call (4096 elements: the
// one-pass encoder 11% slower than at 65536; measured in commit 92665a8).
inline constexpr uint64_t kScanTapSpan = 65536;
struct ScanTap {
  void (*fn)(void* context, uint64_t first, uint64_t count) noexcept = nullptr;
  void* context = nullptr;
};

// Element width in bytes must be 1, 2 or 4; n < 2^32. `classes` may be null (no classes). Replaces
// out's per-change arrays (class_sizes is written by classed scans only). `tap` (optional) sees
// every element's range once, in order.
void scan_changes(unsigned width, uint32_t abs_mask, const void* old_bits, const void* new_bits, uint64_t n,
                  const ClassSpec* classes, ScanOutput& out, const ScanTap& tap);
inline void scan_changes(unsigned width, uint32_t abs_mask, const void* old_bits, const void* new_bits, uint64_t n,
                         const ClassSpec* classes, ScanOutput& out) {
  scan_changes(width, abs_mask, old_bits, new_bits, n, classes, out, ScanTap{});
}

// ranks[c] ascending per class. Appends every selected position to `positions` in block order
// (nearly ascending: memory-friendly for the writes that follow), at the same index of
// `coding_index` its index in coding order (class 0's changes first, then class 1's, ...), and at
// the same index of `old_values` the element's bits (read while the block is in cache, so the
// writes that follow need not read the weights again).
// Throws Error(corrupt_frame) when a rank is not smaller than its class's size.
void select_positions(unsigned width, uint32_t abs_mask, const void* old_bits, uint64_t n, const ClassSpec& classes,
                      const std::vector<ScanVector<uint32_t>>& ranks, ScanVector<uint32_t>& positions,
                      ScanVector<uint32_t>& coding_index, ScanVector<uint32_t>& old_values);

// The same selection, writing each selected element in place while its block is in cache (the
// receiver's apply): write.elements holds the segment's n elements, their base bits on entry;
// ranks[c][i] takes write.tokens[coding index] (write.mode ulp_delta or xor_bits), and every
// element written is reported to write.log. Throws Error(corrupt_frame) when a rank is not smaller
// than its class's size, after reporting every element it wrote (the caller restores them).
void select_and_write(unsigned width, uint32_t abs_mask, uint64_t n, const ClassSpec& classes,
                      const std::vector<ScanVector<uint32_t>>& ranks, const SegmentWrite& write);

// Sampled exponent statistics of a segment for choosing class thresholds: 1 in `stride` blocks of
// 64 elements is examined, in runs of 16 consecutive blocks (kSampleRun elements) starting at
// elements 0, kSampleRun * stride, 2 * kSampleRun * stride, ... (a caller that reads the segment
// piece by piece reads just those runs). hist_all[e] / hist_changed[e] count elements by exponent
// e = abs >> mantissa.
inline constexpr uint64_t kSampleRun = 16 * 64;
void sample_exponents(unsigned width, uint32_t abs_mask, unsigned mantissa_bits, const void* old_bits,
                      const void* new_bits, uint64_t n, unsigned stride, std::vector<uint64_t>& hist_all,
                      std::vector<uint64_t>& hist_changed);

}  // namespace deltacast::codec
