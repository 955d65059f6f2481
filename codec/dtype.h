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
  bool_ = 8,
  u16 = 9,
  i16 = 10,
  u32 = 11,
  i32 = 12,
  u64 = 13,
  i64 = 14,
  f64 = 15,
};

// Bytes per element: 1, 2, 4 or 8.
size_t dtype_size(DType dtype) noexcept;
// Bytes per code unit: what the codec codes, locates and digests. Elements of 8 bytes are coded as
// two 4-byte little-endian units (element i is units 2i and 2i+1); every other dtype's unit is
// its element. docs/frame-format.md.
size_t dtype_unit_size(DType dtype) noexcept;
// Code units per element: 2 for 8-byte dtypes, else 1 (element i is units [i * n, (i + 1) * n)).
size_t dtype_units_per_element(DType dtype) noexcept;
// Safetensors spelling ("BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2", "BOOL", "I8", "U8",
// "I16", "U16", "I32", "U32", "I64", "U64").
std::string_view dtype_name(DType dtype) noexcept;
// Parses the safetensors spelling; nullopt for anything unknown.
std::optional<DType> dtype_from_name(std::string_view name) noexcept;
// Parses the wire byte; nullopt for anything unknown.
std::optional<DType> dtype_from_wire(uint8_t value) noexcept;
// True for sign-magnitude floating-point formats (F64 included).
bool dtype_is_float(DType dtype) noexcept;
// True when the codec's value and location coding treat units as floats (ulp distance, exponent
// classes): the float dtypes of at most 4 bytes. F64 is coded as bits, like the integers and BOOL.
bool dtype_codes_as_float(DType dtype) noexcept;
// Number of mantissa bits of a float dtype (exponent = abs_bits >> mantissa_bits); 0 for integers.
unsigned dtype_mantissa_bits(DType dtype) noexcept;

}  // namespace deltacast::codec
