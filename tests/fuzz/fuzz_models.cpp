#include "fuzz_models.h"

#include <cstring>
#include <random>

namespace deltacast::fuzz {
namespace {

using codec::DType;

void store(std::vector<std::byte>& t, size_t width, uint64_t i, uint64_t bits) {
  std::memcpy(t.data() + i * width, &bits, width);  // little-endian hosts (x86-64, aarch64)
}

// tests/unit/codec/test_frame.cpp's GoldenInput base, with each draw sequenced.
FuzzModel golden_model() {
  FuzzModel m{codec::Manifest{{{"layer.weight", DType::bf16, {64, 96}},
                               {"layer.norm", DType::f32, {96}},
                               {"codes", DType::u8, {50}}}},
              {}};
  for (const auto& t : m.manifest.tensors()) m.base.emplace_back(t.nbytes());
  std::mt19937_64 rng(2024);
  for (uint64_t i = 0; i < 64 * 96; ++i) {
    const uint64_t mantissa = rng() & 0x3FF;
    const uint64_t sign = rng() & 1;
    store(m.base[0], 2, i, 0x3C00u | mantissa | (sign << 15));
  }
  for (uint64_t i = 0; i < 96; ++i) store(m.base[1], 4, i, 0x3F800000u + rng() % 4096);
  for (uint64_t i = 0; i < 50; ++i) store(m.base[2], 1, i, rng() & 0xFF);
  return m;
}

// Float bits of roughly N(0, 0.02) magnitude spread over many exponents (so the encoder's exponent
// classes pay), built from raw generator output only.
uint64_t float_bits(DType dt, std::mt19937_64& rng) {
  const uint64_t r = rng();
  const uint64_t sign = r & 1, mant = r >> 11;
  const unsigned spread = static_cast<unsigned>((r >> 1) % 8);  // exponent below 0.02's
  switch (dt) {
    case DType::bf16: return (sign << 15) | (uint64_t{120 - spread} << 7) | (mant & 0x7F);
    case DType::f16: return (sign << 15) | (uint64_t{10 - spread} << 10) | (mant & 0x3FF);
    case DType::f32: return (sign << 31) | (uint64_t{120 - spread} << 23) | (mant & 0x7FFFFF);
    case DType::f8_e4m3: return (sign << 7) | (uint64_t{4 - spread / 2} << 3) | (mant & 0x7);
    case DType::f8_e5m2: return (sign << 7) | (uint64_t{10 - spread} << 2) | (mant & 0x3);
    case DType::f64: return (sign << 63) | (uint64_t{1016 - spread} << 52) | (mant & 0xFFFFFFFFFFFFF);
    default: return r;
  }
}

FuzzModel every_dtype_model() {
  FuzzModel m{codec::Manifest{{{"a.bf16", DType::bf16, {64, 80}},  // >= 4096 elements: the encoder considers classes
                               {"b.f16", DType::f16, {200}},
                               {"c.f32", DType::f32, {5, 30}},
                               {"d.f8_e4m3", DType::f8_e4m3, {64}},
                               {"e.f8_e5m2", DType::f8_e5m2, {64}},
                               {"f.i8", DType::i8, {30}},
                               {"g.u8", DType::u8, {30}},
                               {"h.bool", DType::bool_, {17}},
                               {"i.u16", DType::u16, {20}},
                               {"j.i16", DType::i16, {20}},
                               {"k.u32", DType::u32, {20}},
                               {"l.i32", DType::i32, {20}},
                               {"m.u64", DType::u64, {10}},
                               {"n.i64", DType::i64, {10}},
                               {"o.f64", DType::f64, {12}},
                               {"p.empty", DType::bf16, {0, 4}},
                               {"q.scalar", DType::f32, {}}}},
              {}};
  std::mt19937_64 rng(77);
  for (const auto& t : m.manifest.tensors()) {
    auto& bytes = m.base.emplace_back(t.nbytes());
    const size_t width = codec::dtype_size(t.dtype);
    for (uint64_t i = 0; i < t.numel(); ++i) {
      uint64_t bits = float_bits(t.dtype, rng);
      if (t.dtype == DType::bool_) bits &= 1;
      store(bytes, width, i, bits);
    }
  }
  return m;
}

}  // namespace

codec::ConstWeights FuzzModel::view() const {
  codec::ConstWeights w{&manifest, {}};
  for (const auto& t : base) w.tensors.emplace_back(t.data(), t.size());
  return w;
}

const FuzzModel& fuzz_model(unsigned index) {
  static const FuzzModel models[kModelCount] = {golden_model(), every_dtype_model()};
  return models[index % kModelCount];
}

}  // namespace deltacast::fuzz
