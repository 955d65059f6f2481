#pragma once
// Little-endian byte packing: the one writer and the one reader every wire format in deltacast
// uses (codec frames, tree protocol messages, transport frame headers).
// Rules:
//  * Every multi-byte integer on any wire is little-endian, whatever the host.
//  * ByteWriter appends to a vector it does not own, so callers can mix it with their own
//    resize/insert on the same vector; patch() rewrites bytes already written (a size field) and
//    asserts (a caller bug, not bad input) when they are not there.
//  * ByteReader never reads past its span: a read that does not fit throws
//    Error(Errc::corrupt_frame, "<what>: truncated (...)") and leaves the position unchanged.
//  * load_le / store_le are the unchecked primitives, for hot loops that checked the bounds once.
// Everything here is inline and allocation-free except ByteWriter's appends and the error path.
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "util/error.h"

namespace deltacast {

// Reads a T stored little-endian at p (unaligned is fine). No bounds check.
template <std::integral T>
inline T load_le(const std::byte* p) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    T value;
    std::memcpy(&value, p, sizeof(T));
    return value;
  } else {
    std::make_unsigned_t<T> value = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      value |= static_cast<std::make_unsigned_t<T>>(std::to_integer<uint8_t>(p[i])) << (8 * i);
    return static_cast<T>(value);
  }
}

// Stores value little-endian at p (unaligned is fine). No bounds check.
template <std::integral T>
inline void store_le(std::byte* p, T value) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &value, sizeof(T));
  } else {
    const auto bits = static_cast<std::make_unsigned_t<T>>(value);
    for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>(bits >> (8 * i));
  }
}

// Appends little-endian values and raw bytes to a vector owned by the caller.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::byte>& out) noexcept : out_(&out) {}

  template <std::integral T>
  void put(T value) {
    const size_t at = out_->size();
    out_->resize(at + sizeof(T));
    store_le(out_->data() + at, value);
  }
  void u8(uint8_t value) { out_->push_back(static_cast<std::byte>(value)); }
  void u16(uint16_t value) { put(value); }
  void u32(uint32_t value) { put(value); }
  void u64(uint64_t value) { put(value); }
  void bytes(std::span<const std::byte> data) { out_->insert(out_->end(), data.begin(), data.end()); }
  void zeros(size_t count) { out_->resize(out_->size() + count); }
  // An unsigned LEB128 varint: 7 bits a byte, low first, the top bit set on all but the last.
  void leb128(uint64_t value) {
    while (value >= 0x80) {
      out_->push_back(static_cast<std::byte>((value & 0x7F) | 0x80));
      value >>= 7;
    }
    out_->push_back(static_cast<std::byte>(value));
  }

  // Rewrites the sizeof(T) bytes at `offset`, which must already have been written.
  template <std::integral T>
  void patch(size_t offset, T value) noexcept {
    DC_ASSERT(offset <= out_->size() && sizeof(T) <= out_->size() - offset);
    store_le(out_->data() + offset, value);
  }

  size_t size() const noexcept { return out_->size(); }
  std::vector<std::byte>& buffer() noexcept { return *out_; }

 private:
  std::vector<std::byte>* out_;
};

// Throws Error(corrupt_frame, "<what>: truncated (needs <n> more bytes at offset <at>, has <has>)").
// Out of line so that the inline read paths stay small.
[[noreturn]] void throw_truncated(const char* what, uint64_t needed, size_t at, size_t has);
// Throws Error(corrupt_frame, "<what>: varint longer than 64 bits").
[[noreturn]] void throw_overlong(const char* what);

// Sequential, bounds-checked reader over a byte span. `what` names the structure in errors and
// must outlive the reader (a string literal).
class ByteReader {
 public:
  ByteReader(std::span<const std::byte> bytes, const char* what) noexcept : bytes_(bytes), what_(what) {}

  template <std::integral T>
  T get() {
    need(sizeof(T));
    const T value = load_le<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return value;
  }
  uint8_t u8() { return get<uint8_t>(); }
  uint16_t u16() { return get<uint16_t>(); }
  uint32_t u32() { return get<uint32_t>(); }
  uint64_t u64() { return get<uint64_t>(); }
  // The next n bytes, as a view into the reader's span.
  std::span<const std::byte> take(uint64_t n) {
    need(n);
    const auto out = bytes_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }
  void skip(uint64_t n) { (void)take(n); }
  // An unsigned LEB128 varint (ByteWriter::leb128). Throws corrupt_frame when truncated or longer
  // than a 64-bit value takes.
  uint64_t leb128() {
    uint64_t value = 0;
    for (unsigned shift = 0;; shift += 7) {
      if (shift > 63) throw_overlong(what_);
      const uint8_t b = u8();
      value |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return value;
    }
  }

  size_t position() const noexcept { return pos_; }
  size_t remaining() const noexcept { return bytes_.size() - pos_; }
  bool at_end() const noexcept { return pos_ == bytes_.size(); }
  const char* what() const noexcept { return what_; }

 private:
  void need(uint64_t n) const {
    if (n > bytes_.size() - pos_) [[unlikely]]
      throw_truncated(what_, n, pos_, bytes_.size() - pos_);
  }
  std::span<const std::byte> bytes_;
  const char* what_;
  size_t pos_ = 0;
};

// A 64-bit value (a digest, a fingerprint) as 16 lower-case hex digits, for messages.
std::string hex64(uint64_t value);

}  // namespace deltacast
