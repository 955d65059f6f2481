#pragma once
// Element types the codec handles. Every dtype is handled bitwise: the codec never does float
// arithmetic on values, so NaN payloads, -0.0, infinities and subnormals survive exactly.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace deltacast::codec {

enum class DType : uint8_t {
  bf16 = 1,
  f16 = 2,
  f32 = 3,
  f8_e4m3 = 4,
  f8_e5m2 = 5,
  i8 = 6,
  u8 = 7,
};

// Bytes per element: 1, 2 or 4.
size_t dtype_size(DType dtype) noexcept;
// Safetensors spelling ("BF16", "F16", "F32", "F8_E4M3", "F8_E5M2", "I8", "U8").
std::string_view dtype_name(DType dtype) noexcept;
// Parses the safetensors spelling; nullopt for anything unknown.
std::optional<DType> dtype_from_name(std::string_view name) noexcept;
// Parses the wire byte; nullopt for anything unknown.
std::optional<DType> dtype_from_wire(uint8_t value) noexcept;
// True for sign-magnitude floating-point formats.
bool dtype_is_float(DType dtype) noexcept;
// Number of mantissa bits of a float dtype (exponent = abs_bits >> mantissa_bits); 0 for integers.
unsigned dtype_mantissa_bits(DType dtype) noexcept;

}  // namespace deltacast::codec
