#pragma once
// Writing one segment's changes into the receiver's weights (internal header). Shared by the fused
// select-and-write kernels (scan_kernels.inc), which write each change while its block of old bits
// is in cache, and by the applier's write of the codings that carry positions.
#include <cstddef>
#include <cstdint>

#include "codec/element_bits.h"

namespace deltacast::codec {

inline constexpr size_t kChangeBatch = 256;

// Where a writer reports what it wrote (the applier's undo log and digest): flush(ctx, positions,
// old_bits, new_bits, count) with count <= kChangeBatch, positions relative to the segment's first
// element. Every written element is reported before the writer returns or throws.
struct ChangeLog {
  using Flush = void (*)(void* ctx, const uint32_t* positions, const uint32_t* old_bits, const uint32_t* new_bits,
                         size_t count) noexcept;
  Flush flush = nullptr;
  void* ctx = nullptr;
};

// One segment to write: its first element (mutable), how a token turns old bits into new
// (apply_value_token), one token per change in coding order, and the log.
struct SegmentWrite {
  void* elements = nullptr;
  ValueMode mode = ValueMode::ulp_delta;
  bool is_float = false;
  const uint32_t* tokens = nullptr;
  ChangeLog log;
};

// The changes a writer reports in one ChangeLog call.
struct ChangeBatch {
  uint32_t positions[kChangeBatch], old_bits[kChangeBatch], new_bits[kChangeBatch];
};

// Writes changes one at a time (element width sizeof(T), value mode M, float order keys when
// kFloat), batching what it reports to the log in `batch`. A small value type, so that the loops
// using it keep its fields in registers (the batch lives apart and is the only thing the log's
// call can see). The caller calls flush() once after the last write, also when about to throw.
template <class T, ValueMode M, bool kFloat>
struct SegmentWriter {
  T* elements;
  const uint32_t* tokens;
  ChangeBatch* batch;
  ChangeLog log;
  size_t count = 0;

  SegmentWriter(const SegmentWrite& w, ChangeBatch& b)
      : elements(static_cast<T*>(w.elements)), tokens(w.tokens), batch(&b), log(w.log) {}
  // Element p, holding old_bits, takes the value of the token at coding index `index`.
  [[gnu::always_inline]] void write(uint32_t p, uint32_t old_bits, uint32_t index) noexcept {
    const uint32_t new_bits = apply_value_token(M, sizeof(T), kFloat, old_bits, tokens[index]);
    elements[p] = static_cast<T>(new_bits);
    batch->positions[count] = p;
    batch->old_bits[count] = old_bits;
    batch->new_bits[count] = new_bits;
    if (++count == kChangeBatch) [[unlikely]] flush();
  }
  [[gnu::always_inline]] void flush() noexcept {
    if (count > 0) log.flush(log.ctx, batch->positions, batch->old_bits, batch->new_bits, count);
    count = 0;
  }
};

// Calls f.template operator()<M, kFloat>() for the segment's value mode and float-ness.
template <class F>
decltype(auto) with_value_mode(ValueMode mode, bool is_float, F&& f) {
  switch (mode) {
    case ValueMode::ulp_delta:
      return is_float ? f.template operator()<ValueMode::ulp_delta, true>()
                      : f.template operator()<ValueMode::ulp_delta, false>();
    case ValueMode::xor_bits: return f.template operator()<ValueMode::xor_bits, false>();
    case ValueMode::overwrite: break;
  }
  return f.template operator()<ValueMode::overwrite, false>();
}

}  // namespace deltacast::codec
