#pragma once
// Value coding (internal header). A changed element's new bits are carried per ValueMode:
//  xor_bits:  v = old ^ new, split into byte planes (plane j = byte j of each value)
//  overwrite: v = new,       split into byte planes (any bit pattern, NaN included)
//  ulp_delta: d = key(new) - key(old) mod 2^w, read as a signed w-bit integer, where key maps a float's
//             bits to an unsigned integer with the same order (bijective on all 2^w patterns, so -0.0
//             and NaN payloads survive). Stored as a sign bit plane, a "|d| > 1" bit plane, and for the
//             flagged ones |d|-2 as a byte (255 = escape: |d| as u32 in the wide stream).
// Streams are concatenated over every segment of a chunk in segment order, changes in coding order.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "codec/bitstream.h"
#include "codec/dtype.h"
#include "codec/element_bits.h"
#include "codec/frame.h"
#include "util/bytes.h"

namespace deltacast::codec {

// The ulp distance of a change old -> new: d = key(new) - key(old) mod 2^w, read as a signed w-bit
// integer; its sign bit (1 = negative); its magnitude |d| in 1 .. 2^(w-1).
inline uint32_t ulp_difference(unsigned width, bool is_float, uint32_t old_bits, uint32_t new_bits) noexcept {
  return (order_key(new_bits, width, is_float) - order_key(old_bits, width, is_float)) & width_mask(width);
}
inline uint32_t ulp_negative(unsigned width, uint32_t d) noexcept { return (d >> (8 * width - 1)) & 1; }
// -x mod 2^w when negative is 1, x when it is 0 (branch-free: the sign is a coin toss).
inline uint32_t negate_if(unsigned width, uint32_t x, uint32_t negative) noexcept {
  return ((x ^ (0u - negative)) + negative) & width_mask(width);
}
inline uint32_t ulp_abs(unsigned width, uint32_t d) noexcept { return negate_if(width, d, ulp_negative(width, d)); }
inline uint32_t ulp_magnitude(unsigned width, bool is_float, uint32_t old_bits, uint32_t new_bits) noexcept {
  return ulp_abs(width, ulp_difference(width, is_float, old_bits, new_bits));
}

// A change's ulp_delta value token, as ValueEncoder lays out its streams: bits 0-7 the magnitude
// byte (magnitude - 2, or 255 = escape when that is >= 255; meaningful only when flagged), then
// the sign bit, the "magnitude > 1" flag, and whether the magnitude goes to the wide stream.
inline constexpr unsigned kUlpNegativeBit = 8, kUlpFlaggedBit = 9, kUlpWideBit = 10;
// tokens[i] for the change old_bits[i] -> new_bits[i], i < count (value_coding.cpp; vectorised).
void ulp_tokens(unsigned width, bool is_float, const uint32_t* old_bits, const uint32_t* new_bits, size_t count,
                uint32_t* tokens);

// Collects the value streams of one chunk.
class ValueEncoder {
 public:
  ValueEncoder() : signs_(sign_bytes_), flags_(flag_bytes_) {}
  // Adds the values of `count` changes in coding order: the k-th goes from old_bits[i] to
  // new_bits[i], i = order ? order[k] : k.
  void add(ValueMode mode, unsigned width, bool is_float, const uint32_t* old_bits, const uint32_t* new_bits,
           const uint32_t* order, size_t count) {
    if (mode != ValueMode::ulp_delta) return add_planes(mode, width, old_bits, new_bits, order, count);
    switch (width) {
      case 1: return add_ulp<1>(is_float, old_bits, new_bits, order, count);
      case 2: return add_ulp<2>(is_float, old_bits, new_bits, order, count);
      default: return add_ulp<4>(is_float, old_bits, new_bits, order, count);
    }
  }
  // Flushes bit planes and returns (stream, bytes) pairs for the non-empty streams.
  std::vector<std::pair<StreamId, std::vector<std::byte>>> finish() {
    signs_.flush();
    flags_.flush();
    mag_bytes_.resize(mag_used_);
    std::vector<std::pair<StreamId, std::vector<std::byte>>> out;
    auto emit = [&](StreamId id, std::vector<std::byte>& v) {
      if (!v.empty()) out.emplace_back(id, std::move(v));
    };
    emit(StreamId::sign_bits, sign_bytes_);
    emit(StreamId::mag_flags, flag_bytes_);
    emit(StreamId::mag_bytes, mag_bytes_);
    emit(StreamId::mag_wide, mag_wide_);
    for (unsigned j = 0; j < 4; ++j) emit(static_cast<StreamId>(static_cast<uint8_t>(StreamId::plane0) + j), planes_[j]);
    return out;
  }

 private:
  // ulp_delta: the changes' value tokens (ulp_tokens) are computed in one vectorised pass in
  // position order; the coding-order pass gathers sign and "more than one ulp" bits 32 changes at
  // a time (one put each) and stores every change's magnitude byte (branch-free) in spare room,
  // kept only when flagged.
  template <unsigned W>
  void add_ulp(bool is_float, const uint32_t* old_bits, const uint32_t* new_bits, const uint32_t* order, size_t count) {
    thread_local std::vector<uint32_t> tokens;
    if (tokens.size() < count) tokens.resize(count);
    ulp_tokens(W, is_float, old_bits, new_bits, count, tokens.data());
    const uint32_t* tok = tokens.data();
    if (mag_bytes_.size() - mag_used_ < count) mag_bytes_.resize(2 * mag_bytes_.size() + count);
    std::byte* mag = mag_bytes_.data();
    size_t used = mag_used_;
    for (size_t k = 0; k < count;) {
      const unsigned m = static_cast<unsigned>(std::min<size_t>(32, count - k));
      uint32_t sign_word = 0, flag_word = 0;
      for (unsigned b = 0; b < m; ++b, ++k) {
        const size_t i = order ? order[k] : k;
        const uint32_t t = tok[i];
        const uint32_t flagged = (t >> kUlpFlaggedBit) & 1;
        sign_word |= ((t >> kUlpNegativeBit) & 1) << b;
        flag_word |= flagged << b;
        mag[used] = static_cast<std::byte>(t);
        used += flagged;
        if (t & (1u << kUlpWideBit)) [[unlikely]]
          ByteWriter(mag_wide_).u32(ulp_magnitude(W, is_float, old_bits[i], new_bits[i]));
      }
      signs_.put(sign_word, m);
      flags_.put(flag_word, m);
    }
    mag_used_ = used;
  }
  void add_planes(ValueMode mode, unsigned width, const uint32_t* old_bits, const uint32_t* new_bits,
                  const uint32_t* order, size_t count) {
    std::byte* plane[4] = {};
    for (unsigned j = 0; j < width; ++j) {
      planes_[j].resize(planes_[j].size() + count);
      plane[j] = planes_[j].data() + planes_[j].size() - count;
    }
    for (size_t k = 0; k < count; ++k) {
      const size_t i = order ? order[k] : k;
      const uint32_t v = mode == ValueMode::xor_bits ? (old_bits[i] ^ new_bits[i]) : new_bits[i];
      for (unsigned j = 0; j < width; ++j) plane[j][k] = static_cast<std::byte>(v >> (8 * j));
    }
  }

  std::vector<std::byte> sign_bytes_, flag_bytes_, mag_bytes_, mag_wide_;
  size_t mag_used_ = 0;  // bytes of mag_bytes_ in use (the rest is spare room)
  std::vector<std::byte> planes_[4];
  BitWriter signs_, flags_;
};

// Reads the value streams of one chunk back, in the same order. Every read is bounds-checked.
class ValueDecoder {
 public:
  ValueDecoder(std::span<const std::byte> sign_bits, std::span<const std::byte> mag_flags,
               std::span<const std::byte> mag_bytes, std::span<const std::byte> mag_wide,
               const std::span<const std::byte> (&planes)[4])
      : signs_(sign_bits), flags_(mag_flags), mag_bytes_(mag_bytes, "mag_bytes stream"),
        mag_wide_(mag_wide, "mag_wide stream"),
        planes_{ByteReader(planes[0], "plane0 stream"), ByteReader(planes[1], "plane1 stream"),
                ByteReader(planes[2], "plane2 stream"), ByteReader(planes[3], "plane3 stream")} {}

  // Reads the value tokens of the next `count` changes into out[0..count): the signed ulp distance
  // mod 2^w (ulp_delta), or the plane value (xor / overwrite); apply_value_token (element_bits.h) turns a token into the
  // new bits given the old bits. Bit planes are read 32 bits at a time, byte planes bounds-checked
  // once. Throws Error(corrupt_frame) on a truncated stream or an out-of-range magnitude.
  void next_tokens(ValueMode mode, unsigned width, uint32_t* out, size_t count) {
    if (mode == ValueMode::ulp_delta) {
      const uint32_t wmask = width_mask(width);
      const uint32_t max_magnitude = 1u << (8 * width - 1);
      for (size_t i = 0; i < count;) {
        const unsigned m = static_cast<unsigned>(std::min<size_t>(32, count - i));
        const uint64_t sign_word = signs_.get(m);
        uint64_t flag_word = flags_.get(m);
        for (unsigned b = 0; b < m; ++b)  // -1 or +1, branch-free (the sign is a coin toss)
          out[i + b] = 1u ^ ((0u - static_cast<uint32_t>((sign_word >> b) & 1)) & (wmask ^ 1u));
        while (flag_word) {  // the rarer changes of more than one ulp
          const unsigned b = static_cast<unsigned>(std::countr_zero(flag_word));
          flag_word &= flag_word - 1;
          const uint8_t byte = mag_bytes_.get<uint8_t>();
          const uint32_t magnitude = byte < 255 ? uint32_t{byte} + 2 : mag_wide_.get<uint32_t>();
          if (byte == 255 && magnitude < 257)
            throw Error(Errc::corrupt_frame, "values: escaped magnitude below the escape threshold");
          if (magnitude > max_magnitude)
            throw Error(Errc::corrupt_frame, "values: ulp distance out of range for the element width");
          const uint32_t negative = static_cast<uint32_t>((sign_word >> b) & 1);
          out[i + b] = negate_if(width, magnitude, negative);
        }
        i += m;
      }
      return;
    }
    std::span<const std::byte> plane[4];
    for (unsigned j = 0; j < width; ++j) plane[j] = planes_[j].take(count);
    for (size_t i = 0; i < count; ++i) {
      uint32_t v = 0;
      for (unsigned j = 0; j < width; ++j) v |= uint32_t{static_cast<uint8_t>(plane[j][i])} << (8 * j);
      out[i] = v;
    }
  }
  // Throws unless every stream was consumed exactly (trailing bytes mean a corrupt frame).
  void expect_consumed() const {
    if (mag_bytes_.remaining() || mag_wide_.remaining() || planes_[0].remaining() || planes_[1].remaining() ||
        planes_[2].remaining() || planes_[3].remaining())
      throw Error(Errc::corrupt_frame, "values: streams hold more values than the segments announce");
  }

 private:
  BitReader signs_, flags_;
  ByteReader mag_bytes_, mag_wide_;
  ByteReader planes_[4];
};

}  // namespace deltacast::codec
