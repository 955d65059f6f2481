#include "codec/value_coding.h"

#include "codec/simd.h"

namespace deltacast::codec {

namespace {

template <unsigned W>
DC_INLINE void ulp_tokens_impl(bool is_float, const uint32_t* old_bits, const uint32_t* new_bits, size_t count,
                               uint32_t* tokens) {
  for (size_t i = 0; i < count; ++i) {
    const uint32_t d = ulp_difference(W, is_float, old_bits[i], new_bits[i]);
    const uint32_t negative = ulp_negative(W, d);
    const uint32_t magnitude = ulp_abs(W, d);
    const uint32_t flagged = magnitude > 1 ? 1 : 0;
    const uint32_t escaped = magnitude - 2 >= 255 ? 1 : 0;
    tokens[i] = (escaped ? 255 : (magnitude - 2) & 0xFF) | (negative << kUlpNegativeBit) |
                (flagged << kUlpFlaggedBit) | ((flagged & escaped) << kUlpWideBit);
  }
}
DC_HOT_CLONES void ulp_tokens_w1(bool f, const uint32_t* o, const uint32_t* n, size_t c, uint32_t* t) {
  ulp_tokens_impl<1>(f, o, n, c, t);
}
DC_HOT_CLONES void ulp_tokens_w2(bool f, const uint32_t* o, const uint32_t* n, size_t c, uint32_t* t) {
  ulp_tokens_impl<2>(f, o, n, c, t);
}
DC_HOT_CLONES void ulp_tokens_w4(bool f, const uint32_t* o, const uint32_t* n, size_t c, uint32_t* t) {
  ulp_tokens_impl<4>(f, o, n, c, t);
}

}  // namespace

void ulp_tokens(unsigned width, bool is_float, const uint32_t* old_bits, const uint32_t* new_bits, size_t count,
                uint32_t* tokens) {
  switch (width) {
    case 1: return ulp_tokens_w1(is_float, old_bits, new_bits, count, tokens);
    case 2: return ulp_tokens_w2(is_float, old_bits, new_bits, count, tokens);
    default: return ulp_tokens_w4(is_float, old_bits, new_bits, count, tokens);
  }
}

}  // namespace deltacast::codec
