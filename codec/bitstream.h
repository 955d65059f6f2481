#pragma once
// LSB-first bit streams and Golomb-Rice codes for gaps between changed positions.
// Rice(k) of g: q = g >> k in unary (q one-bits, then a zero), then the k low bits of g. When q would
// reach kRiceEscape, the code is kRiceEscape one-bits, 6 bits holding (bit length of g) - 1, then
// those bits of g: long gaps (a quiet tensor) cost at most ~100 bits instead of a long unary run.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "util/error.h"

namespace deltacast::codec {

inline constexpr unsigned kRiceEscape = 32;

class BitWriter {
 public:
  explicit BitWriter(std::vector<std::byte>& out) : out_(out) {}
  // Appends the `count` low bits of `bits` (count <= 64). Whole 32-bit words are flushed at once;
  // between calls fewer than 32 bits are pending, so a put of <= 32 bits never overflows acc_.
  [[gnu::always_inline]] void put(uint64_t bits, unsigned count) {
    if (count > 32) [[unlikely]] {
      put_word(bits & 0xFFFFFFFFu, 32);
      put_word(bits >> 32, count - 32);
      return;
    }
    put_word(bits, count);
  }
  // put() of at most 32 bits.
  [[gnu::always_inline]] void put_word(uint64_t bits, unsigned count) {
    acc_ |= (bits & ((uint64_t{1} << count) - 1)) << n_;
    n_ += count;
    if (n_ >= 32) {
      std::byte word[4];  // LSB-first bytes
      for (unsigned b = 0; b < 4; ++b) word[b] = static_cast<std::byte>(acc_ >> (8 * b));
      out_.insert(out_.end(), word, word + 4);
      acc_ >>= 32;
      n_ -= 32;
    }
  }
  void put_ones(unsigned count) {
    while (count > 32) {
      put(0xFFFFFFFFu, 32);
      count -= 32;
    }
    put((uint64_t{1} << count) - 1, count);
  }
  void put_rice(uint64_t gap, unsigned k);
  // Pads the last byte with zero bits.
  void flush() {
    while (n_ > 0) {
      out_.push_back(static_cast<std::byte>(acc_ & 0xFF));
      acc_ >>= 8;
      n_ = n_ > 8 ? n_ - 8 : 0;
    }
    acc_ = 0;
  }

 private:
  std::vector<std::byte>& out_;
  uint64_t acc_ = 0;
  unsigned n_ = 0;
};

// Appends Rice(k) of `gap` to a writer with put(bits, count <= 64) and put_ones(count).
template <class Writer>
[[gnu::always_inline]] inline void put_rice_code(Writer& w, uint64_t gap, unsigned k) {
  const uint64_t q = gap >> k;
  if (q + 1 + k <= 32) [[likely]] {  // the common case: unary part, stop bit and low bits in one put
    const uint64_t low = gap & ((uint64_t{1} << k) - 1);
    w.put(((uint64_t{1} << q) - 1) | (low << (q + 1)), static_cast<unsigned>(q + 1 + k));
    return;
  }
  if (q < kRiceEscape) {
    w.put_ones(static_cast<unsigned>(q));
    w.put(0, 1);
    if (k) w.put(gap, k);
    return;
  }
  w.put_ones(kRiceEscape);
  const unsigned len = 64 - static_cast<unsigned>(std::countl_zero(gap));  // gap > 0 here
  w.put(len - 1, 6);
  if (len > 32) {
    w.put(gap & 0xFFFFFFFFu, 32);
    w.put(gap >> 32, len - 32);
  } else {
    w.put(gap, len);
  }
}

[[gnu::always_inline]] inline void BitWriter::put_rice(uint64_t gap, unsigned k) { put_rice_code(*this, gap, k); }

// BitWriter's bit stream written into memory sized ahead of time (no capacity checks): for codes
// whose exact size is known (Rice codes costed by rice_cost_bits). The caller provides
// ceil(bits / 8) bytes at `out`; nothing past them is written.
class SpanBitWriter {
 public:
  explicit SpanBitWriter(std::byte* out) : p_(out) {}
  [[gnu::always_inline]] void put(uint64_t bits, unsigned count) {  // count <= 64
    if (count > 32) [[unlikely]] {
      put_word(bits & 0xFFFFFFFFu, 32);
      put_word(bits >> 32, count - 32);
      return;
    }
    put_word(bits, count);
  }
  void put_ones(unsigned count) {
    while (count > 32) {
      put_word(0xFFFFFFFFu, 32);
      count -= 32;
    }
    put_word((uint64_t{1} << count) - 1, count);
  }
  [[gnu::always_inline]] void put_rice(uint64_t gap, unsigned k) { put_rice_code(*this, gap, k); }
  // Writes the pending bits, the last byte zero-padded; returns the end of the written bytes.
  std::byte* flush() {
    for (; n_ > 0; n_ = n_ > 8 ? n_ - 8 : 0, acc_ >>= 8) *p_++ = static_cast<std::byte>(acc_ & 0xFF);
    acc_ = 0;
    return p_;
  }

 private:
  [[gnu::always_inline]] void put_word(uint64_t bits, unsigned count) {  // count <= 32
    acc_ |= (bits & ((uint64_t{1} << count) - 1)) << n_;
    n_ += count;
    if (n_ >= 32) {
      for (unsigned b = 0; b < 4; ++b) p_[b] = static_cast<std::byte>(acc_ >> (8 * b));  // LSB-first
      p_ += 4;
      acc_ >>= 32;
      n_ -= 32;
    }
  }
  std::byte* p_;
  uint64_t acc_ = 0;
  unsigned n_ = 0;
};

// Size in bits of Rice(k) codes for the given gaps (exact, matches BitWriter::put_rice).
inline uint64_t rice_cost_bits(uint64_t gap, unsigned k) {
  const uint64_t q = gap >> k;
  if (q < kRiceEscape) return q + 1 + k;
  return kRiceEscape + 6 + (64 - std::countl_zero(gap));
}

class BitReader {
 public:
  explicit BitReader(std::span<const std::byte> in) : p_(in.data()), end_(in.data() + in.size()) {}
  uint64_t get(unsigned count) {  // count <= 56
    refill();
    if (n_ < count) throw Error(Errc::corrupt_frame, "bitstream: truncated");
    const uint64_t v = count == 0 ? 0 : (acc_ & ((uint64_t{1} << count) - 1));
    acc_ >>= count;
    n_ -= count;
    return v;
  }
  uint64_t get_rice(unsigned k) {
    refill();
    const unsigned ones = static_cast<unsigned>(std::countr_one(acc_));
    if (ones < kRiceEscape) {
      if (ones + 1 > n_) throw Error(Errc::corrupt_frame, "bitstream: truncated Rice code");
      acc_ >>= ones + 1;
      n_ -= ones + 1;
      return (uint64_t{ones} << k) | get(k);
    }
    if (n_ < kRiceEscape) throw Error(Errc::corrupt_frame, "bitstream: truncated Rice code");
    acc_ >>= kRiceEscape;
    n_ -= kRiceEscape;
    const unsigned len = static_cast<unsigned>(get(6)) + 1;
    if (len > 32) {
      const uint64_t lo = get(32);
      return lo | (get(len - 32) << 32);
    }
    return get(len);
  }
  // Decodes `count` Rice(k) gaps as strictly ascending positions below `limit` into out[0..count)
  // (position = previous position + 1 + gap, the first = gap). The reader's state lives in locals
  // for the loop (the output stores would otherwise force it back to memory on every code).
  // Throws Error(corrupt_frame) with `past_end` when a position reaches `limit`.
  [[gnu::always_inline]] void get_rice_positions(unsigned k, uint64_t count, uint64_t limit, uint32_t* out,
                                                 const char* past_end) {
    uint64_t acc = acc_;
    unsigned n = n_;
    const std::byte* p = p_;
    uint64_t next = 0;
    const uint64_t low_mask = (uint64_t{1} << k) - 1;
    for (uint64_t i = 0; i < count; ++i) {
      // Topping up before every code, whatever n is, costs a load but no branch on n (whose
      // outcome the predictor cannot know); it only needs 8 readable bytes. Near the end the
      // general path below refills byte by byte.
      if (end_ - p >= 8) [[likely]] top_up(acc, n, p);
      const unsigned ones = static_cast<unsigned>(std::countr_one(acc));
      uint64_t g;
      if (ones < kRiceEscape && ones + 1 + k <= n) [[likely]] {
        g = (uint64_t{ones} << k) | ((acc >> (ones + 1)) & low_mask);
        const unsigned used = ones + 1 + k;
        acc = used == 64 ? 0 : acc >> used;
        n -= used;
      } else {  // escape codes, or near the end of the input: the general path
        acc_ = acc;
        n_ = n;
        p_ = p;
        g = get_rice(k);
        acc = acc_;
        n = n_;
        p = p_;
      }
      if (g >= limit) throw Error(Errc::corrupt_frame, past_end);
      out[i] = static_cast<uint32_t>(next + g);
      next += g + 1;
    }
    // Positions ascend, so the last one alone is checked against the limit (every gap is below
    // the limit, < 2^32, so `next` cannot wrap).
    if (next > limit) throw Error(Errc::corrupt_frame, past_end);
    acc_ = acc;
    n_ = n;
    p_ = p;
  }
  // Bytes consumed so far (including a partially read byte).
  size_t bytes_consumed(const std::byte* start) const {
    return (static_cast<size_t>(p_ - start) * 8 - n_ + 7) / 8;
  }

 private:
  // Tops (acc, n, p) up to n >= 56 with one unaligned load from p, for any n <= 63: the byte at p
  // starts at bit n of acc, and acc's bits from n up are zero or already equal to the stream's,
  // so OR-ing the next 8 bytes in at bit n rewrites nothing. Needs 8 readable bytes at p (n
  // reaches 64 only through the byte-wise refill, once fewer than 8 remain); little-endian hosts
  // only (else does nothing).
  static void top_up(uint64_t& acc, unsigned& n, const std::byte*& p) {
    if constexpr (std::endian::native == std::endian::little) {
      uint64_t word;
      std::memcpy(&word, p, 8);
      acc |= word << n;
      p += (63 - n) >> 3;
      n |= 56;
    }
  }
  // Tops the accumulator up to >= 57 bits (fewer at the end of the input).
  void refill() {
    if (n_ > 56) return;
    if (std::endian::native == std::endian::little && end_ - p_ >= 8) return top_up(acc_, n_, p_);
    while (n_ <= 56 && p_ < end_) {
      acc_ |= uint64_t{static_cast<uint8_t>(*p_++)} << n_;
      n_ += 8;
    }
  }
  const std::byte* p_;
  const std::byte* end_;
  uint64_t acc_ = 0;
  unsigned n_ = 0;
};

}  // namespace deltacast::codec
