#pragma once
// Helpers for codec tests: owned weights for a manifest, random change generation, round trips.
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "codec/applier.h"
#include "codec/encoder.h"
#include "codec/value_coding.h"
#include "util/error.h"

namespace deltacast::codec::testing {

// The Errc `fn` throws (Errc::ok when it returns).
inline Errc errc_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::ok;
}

// Element i of a buffer of elements of `width` bytes (unaligned access).
inline uint32_t load_bits(const std::byte* base, unsigned width, uint64_t index) noexcept {
  const std::byte* p = base + index * width;
  switch (width) {
    case 1: return static_cast<uint8_t>(*p);
    case 2: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    default: { uint32_t v; std::memcpy(&v, p, 4); return v; }
  }
}
inline void store_bits(std::byte* base, unsigned width, uint64_t index, uint32_t bits) noexcept {
  std::byte* p = base + index * width;
  switch (width) {
    case 1: *p = static_cast<std::byte>(bits); break;
    case 2: { const uint16_t v = static_cast<uint16_t>(bits); std::memcpy(p, &v, 2); break; }
    default: std::memcpy(p, &bits, 4); break;
  }
}


struct OwnedWeights {
  const Manifest* manifest;
  std::vector<std::vector<std::byte>> bytes;
  explicit OwnedWeights(const Manifest& m) : manifest(&m) {
    for (const auto& t : m.tensors()) bytes.emplace_back(t.nbytes());
  }
  ConstWeights view() const {
    ConstWeights w{manifest, {}};
    for (const auto& b : bytes) w.tensors.emplace_back(b.data(), b.size());
    return w;
  }
  MutableWeights mut() {
    MutableWeights w{manifest, {}};
    for (auto& b : bytes) w.tensors.emplace_back(b.data(), b.size());
    return w;
  }
  bool operator==(const OwnedWeights& o) const {
    if (bytes.size() != o.bytes.size()) return false;
    for (size_t i = 0; i < bytes.size(); ++i)
      if (bytes[i].size() != o.bytes[i].size() ||
          (!bytes[i].empty() && std::memcmp(bytes[i].data(), o.bytes[i].data(), bytes[i].size()) != 0))
        return false;
    return true;
  }
};

// Realistic-ish float bits: N(0, 0.02) weights in the dtype (integers: uniform).
inline uint32_t random_bits(DType dt, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 0.02f);
  const float f = nd(rng);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  switch (dt) {
    case DType::f32: return u;
    case DType::bf16: return u >> 16;
    case DType::f16: {
      // crude: reuse bf16-like exponent remap into f16 range
      const uint32_t sign = (u >> 16) & 0x8000;
      int e = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
      if (e <= 0) return sign;
      return sign | (static_cast<uint32_t>(e) << 10) | ((u >> 13) & 0x3FF);
    }
    case DType::f8_e4m3: case DType::f8_e5m2: case DType::i8: case DType::u8:
      return static_cast<uint32_t>(rng() & 0xFF);
    case DType::bool_:
      return static_cast<uint32_t>(rng() & 1);
    default:  // the other integers, and the 4-byte units of F64/I64/U64: any bits
      return static_cast<uint32_t>(rng()) & width_mask(static_cast<unsigned>(dtype_unit_size(dt)));
  }
}

// Moves ~density of the elements: by a few ulps (ulp-like), or to arbitrary bits when `wild`.
inline void mutate(OwnedWeights& w, double density, std::mt19937_64& rng, bool wild = false) {
  std::uniform_real_distribution<double> u(0, 1);
  for (uint32_t t = 0; t < w.manifest->size(); ++t) {
    const auto& info = w.manifest->at(t);
    const unsigned width = static_cast<unsigned>(dtype_unit_size(info.dtype));  // code units (8-byte: 2 each)
    const bool is_float = dtype_codes_as_float(info.dtype);
    for (uint64_t i = 0; i < info.units(); ++i) {
      if (density < 1.0 && u(rng) >= density) continue;
      const uint32_t old = load_bits(w.bytes[t].data(), width, i);
      uint32_t nb;
      if (wild) {
        do nb = static_cast<uint32_t>(rng()) & width_mask(width); while (nb == old);
      } else {
        const int step = static_cast<int>(rng() % 3) + 1;
        const uint32_t key = order_key(old, width, is_float);
        nb = order_unkey((rng() & 1 ? key + step : key - step) & width_mask(width), width, is_float);
      }
      store_bits(w.bytes[t].data(), width, i, nb);
    }
  }
}

inline void fill_random(OwnedWeights& w, std::mt19937_64& rng) {
  for (uint32_t t = 0; t < w.manifest->size(); ++t) {
    const auto& info = w.manifest->at(t);
    const unsigned width = static_cast<unsigned>(dtype_unit_size(info.dtype));
    for (uint64_t i = 0; i < info.units(); ++i) store_bits(w.bytes[t].data(), width, i, random_bits(info.dtype, rng));
  }
}

// Encodes base->next, applies into a copy of base, verifies and commits. Returns the delta.
inline EncodedDelta round_trip(const OwnedWeights& base, const OwnedWeights& next, OwnedWeights& receiver,
                               const EncodeOptions& opts = {}, uint64_t version = 0) {
  const auto base_digest = StateDigest::full_scan(base.view());
  auto delta = encode_delta(base.view(), next.view(), base_digest, {version, version + 1}, opts);
  DeltaApplier applier(*base.manifest, receiver.mut(), version, StateDigest::full_scan(receiver.view()));
  for (const auto& f : delta.frames) applier.apply(f);
  applier.verify();
  applier.commit();
  return delta;
}

}  // namespace deltacast::codec::testing
