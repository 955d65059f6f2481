#pragma once
// Former home of the codec's little-endian helpers, now util/bytes.h (one byte reader/writer for
// the whole code base). The codec's own sources use util/bytes.h directly; these names remain so
// that code written against them (the codec tests) keeps compiling. New code: include util/bytes.h.
#include <cstdint>
#include <vector>

#include "util/bytes.h"

namespace deltacast::codec {

using deltacast::load_le;
using deltacast::store_le;
using WireReader = deltacast::ByteReader;

template <std::unsigned_integral T>
inline void put_le(std::vector<std::byte>& out, T value) {
  ByteWriter(out).put(value);
}
inline void put_u8(std::vector<std::byte>& out, uint8_t v) { ByteWriter(out).u8(v); }
inline void put_u16(std::vector<std::byte>& out, uint16_t v) { ByteWriter(out).u16(v); }
inline void put_u32(std::vector<std::byte>& out, uint32_t v) { ByteWriter(out).u32(v); }
inline void put_u64(std::vector<std::byte>& out, uint64_t v) { ByteWriter(out).u64(v); }

}  // namespace deltacast::codec
