#pragma once
// Shared by the fuzz targets (tests/fuzz/fuzz_*.cpp, docs/fuzzing.md).
//  * FUZZ_CHECK(cond, what): an oracle. A violated one prints and aborts, which libFuzzer reports
//    as a crash and the corpus replay (replay_main.cpp) as a failed ctest.
//  * GuardedBytes: a buffer with guard bytes either side, so a write outside the weights is seen
//    even where ASan is absent (the GCC replay build).
//  * FuzzInput: a cursor over the fuzzer's bytes that never reads past them.
// Everything that is not a deltacast::Error and escapes a target reaches std::terminate: a crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#define FUZZ_CHECK(cond, what)                                                                      \
  do {                                                                                              \
    if (!(cond)) ::deltacast::fuzz::oracle_failed(#cond, std::string(what), __FILE__, __LINE__); \
  } while (0)

namespace deltacast::fuzz {

[[noreturn]] inline void oracle_failed(const char* cond, const std::string& what, const char* file, int line) {
  std::fprintf(stderr, "fuzz oracle failed at %s:%d: %s (%s)\n", file, line, what.c_str(), cond);
  std::abort();
}

// Targets call this first: the library's loggers stay quiet (a refused input is the normal case).
inline void quiet_logs() {
  static const bool once = [] { return setenv("DELTACAST_LOG_LEVEL", "off", 1) == 0; }();
  (void)once;
}

// Whether `message` starts "SOURCE:LINE:COL: " with LINE and COL numbers from 1 (where config's
// YAML readers say a problem lies).
inline bool has_source_location(std::string_view message, std::string_view source) {
  const std::string prefix = std::string(source) + ":";
  if (message.substr(0, prefix.size()) != prefix) return false;
  size_t at = prefix.size();
  for (int field = 0; field < 2; ++field) {
    const size_t start = at;
    while (at < message.size() && message[at] >= '0' && message[at] <= '9') ++at;
    if (at == start || at >= message.size() || message[at] != ':') return false;
    if (std::stoul(std::string(message.substr(start, at - start))) == 0) return false;
    ++at;
  }
  return message.substr(at, 1) == " ";
}

// `size` bytes between two guard zones of a fixed pattern.
class GuardedBytes {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr std::byte kPattern{0xA5};
  explicit GuardedBytes(size_t size) : storage_(size + 2 * kGuard, kPattern), size_(size) {
    std::memset(storage_.data() + kGuard, 0, size_);
  }
  std::span<std::byte> bytes() noexcept { return {storage_.data() + kGuard, size_}; }
  std::span<const std::byte> bytes() const noexcept { return {storage_.data() + kGuard, size_}; }
  bool guards_intact() const noexcept {
    for (size_t i = 0; i < kGuard; ++i)
      if (storage_[i] != kPattern || storage_[kGuard + size_ + i] != kPattern) return false;
    return true;
  }

 private:
  std::vector<std::byte> storage_;
  size_t size_;
};

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : bytes_(reinterpret_cast<const std::byte*>(data), size) {}
  size_t remaining() const noexcept { return bytes_.size(); }
  // Up to `n` bytes (fewer at the end).
  std::span<const std::byte> take(size_t n) noexcept {
    const auto out = bytes_.first(std::min(n, bytes_.size()));
    bytes_ = bytes_.subspan(out.size());
    return out;
  }
  std::span<const std::byte> rest() noexcept { return take(bytes_.size()); }
  // A little-endian integer from the next bytes (missing bytes read as zero).
  template <class T>
  T get() noexcept {
    T v = 0;
    const auto b = take(sizeof(T));
    for (size_t i = 0; i < b.size(); ++i) v |= static_cast<T>(std::to_integer<uint64_t>(b[i]) << (8 * i));
    return v;
  }

 private:
  std::span<const std::byte> bytes_;
};

inline bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

}  // namespace deltacast::fuzz
