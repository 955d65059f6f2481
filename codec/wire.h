#pragma once
// Little-endian helpers for building and reading frames. Readers are bounds-checked and throw
// Error(corrupt_frame) instead of reading past the end.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "util/error.h"

namespace deltacast::codec {

template <typename T>
inline void put_le(std::vector<std::byte>& out, T value) {
  static_assert(std::is_unsigned_v<T>);
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<std::byte>(value >> (8 * i)));
}
inline void put_u8(std::vector<std::byte>& out, uint8_t v) { put_le(out, v); }
inline void put_u16(std::vector<std::byte>& out, uint16_t v) { put_le(out, v); }
inline void put_u32(std::vector<std::byte>& out, uint32_t v) { put_le(out, v); }
inline void put_u64(std::vector<std::byte>& out, uint64_t v) { put_le(out, v); }

template <typename T>
inline T load_le(const std::byte* p) noexcept {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<uint8_t>(p[i])) << (8 * i);
  return value;
}
template <typename T>
inline void store_le(std::byte* p, T value) noexcept {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>(value >> (8 * i));
}

// Sequential bounds-checked reader over a byte span. `what` names the structure in errors.
class WireReader {
 public:
  WireReader(std::span<const std::byte> bytes, const char* what) : bytes_(bytes), what_(what) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v = load_le<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }
  std::span<const std::byte> take(uint64_t n) {
    need(n);
    auto s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  size_t position() const noexcept { return pos_; }
  size_t remaining() const noexcept { return bytes_.size() - pos_; }

 private:
  void need(uint64_t n) const {
    if (n > bytes_.size() - pos_)
      throw Error(Errc::corrupt_frame, std::string(what_) + ": truncated (needs " + std::to_string(n) +
                                           " more bytes at offset " + std::to_string(pos_) + ", has " +
                                           std::to_string(bytes_.size() - pos_) + ")");
  }
  std::span<const std::byte> bytes_;
  const char* what_;
  size_t pos_ = 0;
};

}  // namespace deltacast::codec
