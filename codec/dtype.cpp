#include "codec/dtype.h"

namespace deltacast::codec {

namespace {
struct DTypeRow {
  DType dtype;
  std::string_view name;
  size_t size;
  bool is_float;
  unsigned mantissa_bits;
};
constexpr DTypeRow kRows[] = {
    {DType::bf16, "BF16", 2, true, 7},       {DType::f16, "F16", 2, true, 10},
    {DType::f32, "F32", 4, true, 23},        {DType::f8_e4m3, "F8_E4M3", 1, true, 3},
    {DType::f8_e5m2, "F8_E5M2", 1, true, 2}, {DType::i8, "I8", 1, false, 0},
    {DType::u8, "U8", 1, false, 0},          {DType::bool_, "BOOL", 1, false, 0},
    {DType::u16, "U16", 2, false, 0},        {DType::i16, "I16", 2, false, 0},
    {DType::u32, "U32", 4, false, 0},        {DType::i32, "I32", 4, false, 0},
    {DType::u64, "U64", 8, false, 0},        {DType::i64, "I64", 8, false, 0},
    {DType::f64, "F64", 8, true, 52},
};
const DTypeRow* row(DType dtype) noexcept {
  for (const auto& r : kRows)
    if (r.dtype == dtype) return &r;
  return nullptr;
}
}  // namespace

size_t dtype_size(DType dtype) noexcept {
  const auto* r = row(dtype);
  return r ? r->size : 0;
}
size_t dtype_unit_size(DType dtype) noexcept {
  const size_t size = dtype_size(dtype);
  return size > 4 ? 4 : size;
}
size_t dtype_units_per_element(DType dtype) noexcept { return dtype_size(dtype) / dtype_unit_size(dtype); }
bool dtype_codes_as_float(DType dtype) noexcept { return dtype_is_float(dtype) && dtype_size(dtype) <= 4; }
std::string_view dtype_name(DType dtype) noexcept {
  const auto* r = row(dtype);
  return r ? r->name : "unknown";
}
std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  for (const auto& r : kRows)
    if (r.name == name) return r.dtype;
  return std::nullopt;
}
std::optional<DType> dtype_from_wire(uint8_t value) noexcept {
  for (const auto& r : kRows)
    if (static_cast<uint8_t>(r.dtype) == value) return r.dtype;
  return std::nullopt;
}
bool dtype_is_float(DType dtype) noexcept {
  const auto* r = row(dtype);
  return r && r->is_float;
}
unsigned dtype_mantissa_bits(DType dtype) noexcept {
  const auto* r = row(dtype);
  return r ? r->mantissa_bits : 0;
}

}  // namespace deltacast::codec
