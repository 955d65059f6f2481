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

// Writes changes one at a time (element width sizeof(T), value mode M), batching what it reports
// to the log. The caller calls flush() once after the last write, also when it is about to throw.
template <class T, ValueMode M>
class SegmentWriter {
 public:
  explicit SegmentWriter(const SegmentWrite& w)
      : elements_(static_cast<T*>(w.elements)), tokens_(w.tokens), log_(w.log), is_float_(w.is_float) {}
  SegmentWriter(const SegmentWriter&) = delete;
  SegmentWriter& operator=(const SegmentWriter&) = delete;

  const T* elements() const noexcept { return elements_; }
  // Element p, holding old_bits, takes the value of the token at coding index `index`.
  [[gnu::always_inline]] void write(uint32_t p, uint32_t old_bits, uint32_t index) noexcept {
    const uint32_t new_bits = apply_value_token(M, sizeof(T), is_float_, old_bits, tokens_[index]);
    elements_[p] = static_cast<T>(new_bits);
    positions_[count_] = p;
    old_[count_] = old_bits;
    new_[count_] = new_bits;
    if (++count_ == kChangeBatch) [[unlikely]] flush();
  }
  void flush() noexcept {
    if (count_ > 0) log_.flush(log_.ctx, positions_, old_, new_, count_);
    count_ = 0;
  }

 private:
  T* elements_;
  const uint32_t* tokens_;
  ChangeLog log_;
  bool is_float_;
  size_t count_ = 0;
  uint32_t positions_[kChangeBatch], old_[kChangeBatch], new_[kChangeBatch];
};

}  // namespace deltacast::codec
