#include "codec/scan.h"

#include <cstdint>
#include <cstring>
#include <vector>

#ifdef DELTACAST_HAVE_X86_KERNELS
#include <cpuid.h>
#endif

#include "util/error.h"

namespace deltacast::codec {

// Per-ISA entry points (scan_kernels.inc), declared through the function types of the dispatchers.
using ScanFn = void(unsigned, uint32_t, const void*, const void*, uint64_t, const ClassSpec*, ScanOutput&,
                    const ScanTap&);
using SelectFn = decltype(select_positions);
using SelectWriteFn = decltype(select_and_write);
ScanFn scan_changes_generic;
SelectFn select_positions_generic;
SelectWriteFn select_and_write_generic;
#ifdef DELTACAST_HAVE_X86_KERNELS
ScanFn scan_changes_avx2, scan_changes_avx2_bmi2, scan_changes_avx512, scan_changes_avx512_vbmi2;
SelectFn select_positions_avx2, select_positions_avx2_bmi2, select_positions_avx512;
SelectWriteFn select_and_write_avx2, select_and_write_avx2_bmi2, select_and_write_avx512;
#endif

namespace {
// Ordered: avx512_vbmi2 has every avx512 kernel's instructions (select_* use avx512's for both).
enum class Isa { generic, avx2, avx2_bmi2, avx512, avx512_vbmi2 };
#ifdef DELTACAST_HAVE_X86_KERNELS
// PDEP is one fast instruction on Intel since Haswell and on AMD since Zen 3 (family 19h); AMD's
// earlier cores microcode it (tens to hundreds of cycles).
bool pdep_is_fast() {
  if (!__builtin_cpu_supports("bmi2")) return false;
  if (!__builtin_cpu_is("amd")) return true;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  unsigned family = (eax >> 8) & 0xF;
  if (family == 0xF) family += (eax >> 20) & 0xFF;
  return family >= 0x19;
}
#endif
Isa detect_isa() {
#ifdef DELTACAST_HAVE_X86_KERNELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("bmi2"))
    return __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("avx512vpopcntdq") &&
                   __builtin_cpu_supports("avx512vl")
               ? Isa::avx512_vbmi2
               : Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt"))
    return pdep_is_fast() ? Isa::avx2_bmi2 : Isa::avx2;
#endif
  return Isa::generic;
}
Isa isa() {
  static const Isa chosen = detect_isa();
  return chosen;
}
// The kernels read elements through pointers to the width's unsigned type, so an array must be
// aligned to its element width. A tensor mapped from a safetensors file can start at any byte
// offset (the safetensors library aligns its tensors, other writers need not): such an array is
// scanned from an aligned copy (rare; it costs the array's size while the call runs).
class AlignedCopy {
 public:
  // `p` itself when it is aligned to `width`, else an aligned copy of its n elements.
  const void* of(const void* p, unsigned width, uint64_t n) {
    if (p == nullptr || reinterpret_cast<uintptr_t>(p) % width == 0) return p;
    storage_.resize((n * width + 7) / 8);
    std::memcpy(storage_.data(), p, n * width);
    return storage_.data();
  }

 private:
  std::vector<uint64_t> storage_;
};
void check_args(unsigned width, uint64_t n, const ClassSpec* cs) {
  DC_ASSERT(width == 1 || width == 2 || width == 4);
  DC_ASSERT(n < (uint64_t{1} << 32));
  DC_ASSERT(cs == nullptr || (cs->count >= 1 && cs->count <= kMaxClasses));
}
}  // namespace

void scan_changes(unsigned width, uint32_t abs_mask, const void* old_bits, const void* new_bits, uint64_t n,
                  const ClassSpec* classes, ScanOutput& out, const ScanTap& tap) {
  check_args(width, n, classes);
  if (classes && classes->count == 1) classes = nullptr;
  AlignedCopy old_copy, new_copy;
  old_bits = old_copy.of(old_bits, width, n);
  new_bits = new_copy.of(new_bits, width, n);
#ifdef DELTACAST_HAVE_X86_KERNELS
  if (isa() == Isa::avx512_vbmi2)
    return scan_changes_avx512_vbmi2(width, abs_mask, old_bits, new_bits, n, classes, out, tap);
  if (isa() == Isa::avx512) return scan_changes_avx512(width, abs_mask, old_bits, new_bits, n, classes, out, tap);
  if (isa() == Isa::avx2_bmi2) return scan_changes_avx2_bmi2(width, abs_mask, old_bits, new_bits, n, classes, out, tap);
  if (isa() == Isa::avx2) return scan_changes_avx2(width, abs_mask, old_bits, new_bits, n, classes, out, tap);
#endif
  scan_changes_generic(width, abs_mask, old_bits, new_bits, n, classes, out, tap);
}

void select_positions(unsigned width, uint32_t abs_mask, const void* old_bits, uint64_t n, const ClassSpec& classes,
                      const std::vector<ScanVector<uint32_t>>& ranks, ScanVector<uint32_t>& positions,
                      ScanVector<uint32_t>& coding_index, ScanVector<uint32_t>& old_values) {
  check_args(width, n, &classes);
  DC_ASSERT(ranks.size() >= classes.count);
  AlignedCopy old_copy;
  old_bits = old_copy.of(old_bits, width, n);
#ifdef DELTACAST_HAVE_X86_KERNELS
  if (isa() >= Isa::avx512)
    return select_positions_avx512(width, abs_mask, old_bits, n, classes, ranks, positions, coding_index, old_values);
  if (isa() == Isa::avx2_bmi2)
    return select_positions_avx2_bmi2(width, abs_mask, old_bits, n, classes, ranks, positions, coding_index, old_values);
  if (isa() == Isa::avx2) return select_positions_avx2(width, abs_mask, old_bits, n, classes, ranks, positions, coding_index, old_values);
#endif
  select_positions_generic(width, abs_mask, old_bits, n, classes, ranks, positions, coding_index, old_values);
}

void select_and_write(unsigned width, uint32_t abs_mask, uint64_t n, const ClassSpec& classes,
                      const std::vector<ScanVector<uint32_t>>& ranks, const SegmentWrite& write) {
  check_args(width, n, &classes);
  DC_ASSERT(reinterpret_cast<uintptr_t>(write.elements) % width == 0);  // the applier aligns (write_segment)
  DC_ASSERT(ranks.size() >= classes.count);
#ifdef DELTACAST_HAVE_X86_KERNELS
  if (isa() >= Isa::avx512) return select_and_write_avx512(width, abs_mask, n, classes, ranks, write);
  if (isa() == Isa::avx2_bmi2) return select_and_write_avx2_bmi2(width, abs_mask, n, classes, ranks, write);
  if (isa() == Isa::avx2) return select_and_write_avx2(width, abs_mask, n, classes, ranks, write);
#endif
  select_and_write_generic(width, abs_mask, n, classes, ranks, write);
}

namespace {
// Four interleaved histogram copies, summed at the end: consecutive elements mostly share an
// exponent, and a single copy would serialise every increment on the previous one. Elements are
// read in place (load_unit): the arrays need not be aligned to T, and this reads only a sample of
// them, so an aligned copy (what the scan kernels take) would cost far more than the reads.
template <class T>
void sample_impl(uint32_t abs_mask, unsigned mant, const std::byte* o, const std::byte* nw, uint64_t n, unsigned stride,
                 std::vector<uint64_t>& all, std::vector<uint64_t>& changed) {
  const size_t buckets = all.size();
  thread_local std::vector<uint32_t> lanes;  // [4][buckets] counts of all, then [4][buckets] of changed
  lanes.assign(8 * buckets, 0);
  uint32_t* lane_all = lanes.data();
  uint32_t* lane_chg = lanes.data() + 4 * buckets;
  // Runs of 16 consecutive blocks, one run every 16 * stride blocks: the same fraction as every
  // stride-th block, but in stretches the hardware prefetcher can follow (isolated blocks far
  // apart cost a DRAM round trip each).
  const uint64_t step = kSampleRun * stride;
  for (uint64_t start = 0; start < n; start += step) {
    const uint64_t end = std::min(n, start + kSampleRun);
    for (uint64_t i = start; i < end; ++i) {
      const T old = load_unit<T>(o, i);
      const size_t at = (i & 3) * buckets + ((static_cast<uint32_t>(old) & abs_mask) >> mant);
      ++lane_all[at];
      lane_chg[at] += old != load_unit<T>(nw, i);
    }
  }
  for (unsigned l = 0; l < 4; ++l)
    for (size_t e = 0; e < buckets; ++e) {
      all[e] += lane_all[l * buckets + e];
      changed[e] += lane_chg[l * buckets + e];
    }
}
}  // namespace

void sample_exponents(unsigned width, uint32_t abs_mask, unsigned mantissa_bits, const void* old_bits,
                      const void* new_bits, uint64_t n, unsigned stride, std::vector<uint64_t>& hist_all,
                      std::vector<uint64_t>& hist_changed) {
  const size_t buckets = (size_t{abs_mask} >> mantissa_bits) + 1;
  hist_all.assign(buckets, 0);
  hist_changed.assign(buckets, 0);
  const auto* o = static_cast<const std::byte*>(old_bits);
  const auto* nw = static_cast<const std::byte*>(new_bits);
  switch (width) {
    case 1:
      return sample_impl<uint8_t>(abs_mask, mantissa_bits, o, nw, n, stride, hist_all, hist_changed);
    case 2:
      return sample_impl<uint16_t>(abs_mask, mantissa_bits, o, nw, n, stride, hist_all, hist_changed);
    case 4:
      return sample_impl<uint32_t>(abs_mask, mantissa_bits, o, nw, n, stride, hist_all, hist_changed);
  }
  DC_ASSERT(false && "bad element width");
}

}  // namespace deltacast::codec
