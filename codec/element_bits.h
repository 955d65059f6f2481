#pragma once
// Bit-level helpers on one element of width 1, 2 or 4 bytes (internal header): the order-preserving
// key of ulp_delta values and how a value token turns old bits into new.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codec/frame.h"

namespace deltacast::codec {

// Unit `position` of an array of T-sized units at any address: a tensor mapped from a safetensors
// file need not start at a multiple of its element size (memcpy: one unaligned load or store, no
// undefined behaviour; loops over it still vectorise).
template <class T>
inline T load_unit(const std::byte* base, size_t position) noexcept {
  T bits;
  std::memcpy(&bits, base + position * sizeof(T), sizeof(T));
  return bits;
}
template <class T>
inline void store_unit(std::byte* base, size_t position, T bits) noexcept {
  std::memcpy(base + position * sizeof(T), &bits, sizeof(T));
}

inline uint32_t width_mask(unsigned width) noexcept { return width == 4 ? 0xFFFFFFFFu : (1u << (8 * width)) - 1; }

// Order-preserving bijection from bits to an unsigned key (identity for integer dtypes): negative
// floats have every bit flipped, non-negative ones only the sign bit. Branch-free (the sign of a
// changed weight is a coin toss).
inline uint32_t order_key(uint32_t bits, unsigned width, bool is_float) noexcept {
  if (!is_float) return bits;
  const unsigned top = 8 * width - 1;
  const uint32_t negative = (bits >> top) & 1;
  return bits ^ ((1u << top) | ((0u - negative) & ((1u << top) - 1)));
}
inline uint32_t order_unkey(uint32_t key, unsigned width, bool is_float) noexcept {
  if (!is_float) return key;
  const unsigned top = 8 * width - 1;
  const uint32_t was_non_negative = (key >> top) & 1;
  return key ^ ((1u << top) | ((was_non_negative - 1) & ((1u << top) - 1)));
}

// The new bits of a change from its old bits and its value token (ValueDecoder::next_tokens): the
// ulp distance mod 2^w (ulp_delta), the XOR mask (xor_bits) or the bits themselves (overwrite).
inline uint32_t apply_value_token(ValueMode mode, unsigned width, bool is_float, uint32_t old_bits,
                                  uint32_t token) noexcept {
  switch (mode) {
    case ValueMode::ulp_delta:
      return order_unkey((order_key(old_bits, width, is_float) + token) & width_mask(width), width, is_float);
    case ValueMode::xor_bits: return old_bits ^ token;
    case ValueMode::overwrite: return token;
  }
  return token;
}

}  // namespace deltacast::codec
