// Round trips over every dtype, change densities, special values and odd sizes. Every check is
// bitwise (memcmp of the receiver against the producer's new weights).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "codec/chunk_plan.h"
#include "codec/scan.h"
#include "codec_test_util.h"
#include "tests/common/memory_reader.h"

namespace deltacast::codec {
namespace {

using testing::OwnedWeights;

// Every safetensors dtype: 8-byte ones travel as pairs of 4-byte units, F64 coded as bits.
const DType kAllDTypes[] = {DType::bf16, DType::f16, DType::f32,  DType::f8_e4m3, DType::f8_e5m2,
                            DType::i8,   DType::u8,  DType::bool_, DType::u16,    DType::i16,
                            DType::u32,  DType::i32, DType::u64,  DType::i64,     DType::f64};

struct Case {
  DType dtype;
  double density;
  ValueMode mode;
};

class RoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTrip, ReceiverBitsEqualProducerBits) {
  const auto [dtype, density, mode] = GetParam();
  // Odd sizes: a large tensor split across chunks, a prime-sized one, a scalar-ish one, an empty one.
  Manifest m({{"big", dtype, {257, 1031}}, {"prime", dtype, {7919}}, {"one", dtype, {1}},
              {"empty", dtype, {0, 5}}, {"small", dtype, {3, 5}}});
  std::mt19937_64 rng(static_cast<uint64_t>(density * 1e6) + static_cast<uint64_t>(dtype) * 31 + static_cast<uint64_t>(mode));
  OwnedWeights base(m);
  testing::fill_random(base, rng);
  OwnedWeights next = base;
  testing::mutate(next, density, rng, mode == ValueMode::overwrite);
  OwnedWeights receiver = base;
  EncodeOptions opts;
  opts.chunk_bytes = 64 * 1024;
  opts.xor_safe_mode = mode == ValueMode::overwrite ? ValueMode::ulp_delta : mode;
  if (mode == ValueMode::overwrite) opts.overwrite_tensors.assign(m.size(), true);
  const auto delta = testing::round_trip(base, next, receiver, opts);
  EXPECT_TRUE(receiver == next);
  EXPECT_GT(delta.frames.size(), 2u);
  if (density == 0.0) {
    EXPECT_EQ(delta.stats.changes, 0u);
  }
  if (density == 1.0) {
    uint64_t units = 0;  // every code unit changed (an 8-byte element is two)
    for (const auto& t : m.tensors()) units += t.units();
    EXPECT_EQ(delta.stats.changes, units);
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (DType dt : kAllDTypes)
    for (double d : {0.0, 0.0001, 0.01, 0.03, 0.5, 1.0})
      for (ValueMode mode : {ValueMode::ulp_delta, ValueMode::xor_bits, ValueMode::overwrite})
        cases.push_back({dt, d, mode});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllDTypesDensitiesModes, RoundTrip, ::testing::ValuesIn(all_cases()),
                         [](const auto& p) {
                           return std::string(dtype_name(p.param.dtype)) + "_d" +
                                  std::to_string(static_cast<int>(p.param.density * 10000)) + "_m" +
                                  std::to_string(static_cast<int>(p.param.mode));
                         });

// Tensors that start at an odd byte offset (a safetensors file need not align its tensors): the
// digests and frames are those of aligned copies, the delta applies bit-exactly in place, and a
// rollback there restores the bits. In a normal build x86 forgives a misaligned typed access; under
// UBSan (CI runs the codec unit tests with ASan + UBSan) one is reported and fails this test.
TEST(RoundTripMisaligned, TensorsAtOddOffsetsCodeAndApplyLikeAlignedOnes) {
  Manifest m(
      {{"bf", DType::bf16, {3, 1031}}, {"d", DType::f64, {513}}, {"f", DType::f32, {2, 4099}}, {"u", DType::u8, {77}}});
  std::mt19937_64 rng(5);
  OwnedWeights base(m);
  testing::fill_random(base, rng);
  OwnedWeights next = base;
  testing::mutate(next, 0.03, rng);
  using Storage = std::vector<std::vector<std::byte>>;
  auto at_offset_1 = [](const OwnedWeights& w) {  // the same bytes, one byte into larger buffers
    Storage s;
    for (const auto& b : w.bytes) {
      std::vector<std::byte> v(b.size() + 1);
      std::copy(b.begin(), b.end(), v.begin() + 1);
      s.push_back(std::move(v));
    }
    return s;
  };
  auto view = [&](const Storage& s) {
    ConstWeights c{&m, {}};
    for (const auto& v : s) c.tensors.emplace_back(v.data() + 1, v.size() - 1);
    return c;
  };
  auto mut = [&](Storage& s) {
    MutableWeights c{&m, {}};
    for (auto& v : s) c.tensors.emplace_back(v.data() + 1, v.size() - 1);
    return c;
  };
  auto holds = [&](const Storage& s, const OwnedWeights& want) {
    for (size_t i = 0; i < s.size(); ++i)
      if (!std::equal(want.bytes[i].begin(), want.bytes[i].end(), s[i].begin() + 1)) return false;
    return true;
  };
  const Storage base_s = at_offset_1(base), next_s = at_offset_1(next);
  Storage receiver = at_offset_1(base);
  const auto base_digest = StateDigest::full_scan(view(base_s));
  ASSERT_TRUE(base_digest == StateDigest::full_scan(base.view()));
  ASSERT_TRUE(StateDigest::full_scan(view(next_s)) == StateDigest::full_scan(next.view()));
  EncodeOptions opts;
  opts.chunk_bytes = uint64_t{16} << 10;
  const auto shifted = encode_delta(view(base_s), view(next_s), base_digest, {0, 1}, opts);
  const auto aligned = encode_delta(base.view(), next.view(), base_digest, {0, 1}, opts);
  EXPECT_TRUE(shifted.frames == aligned.frames) << "the frames depend on where the tensors lie";
  {
    DeltaApplier applier(m, mut(receiver), 0, base_digest);
    for (const auto& f : shifted.frames) applier.apply(f);
    applier.verify();
    applier.commit();
  }
  EXPECT_TRUE(holds(receiver, next));
  // Back towards the base, applied in place and rolled back: the receiver holds `next` again.
  const auto back = encode_delta(view(next_s), view(base_s), StateDigest::full_scan(view(next_s)), {1, 2}, opts);
  DeltaApplier second(m, mut(receiver), 1, StateDigest::full_scan(view(receiver)));
  for (const auto& f : back.frames) second.apply(f);
  EXPECT_TRUE(holds(receiver, base)) << "the frames were not written";
  second.rollback();
  EXPECT_TRUE(holds(receiver, next)) << "the rollback did not restore the bits";
}

// Every bit pattern of a 16-bit float changed into every kind of special value survives.
TEST(RoundTripSpecials, NanInfNegativeZeroSubnormalsBf16AndF32) {
  const uint32_t specials16[] = {0x7FC0, 0x7FC1, 0xFFC0, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001, 0x807F,
                                 0x7F7F, 0xFF7F, 0x0080, 0x7FFF, 0xFFFF, 0x3F80, 0xBF80};
  const uint32_t specials32[] = {0x7FC00000u, 0x7FC00001u, 0xFFC00000u, 0x7F800000u, 0xFF800000u, 0x80000000u,
                                 0x00000000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0x7FFFFFFFu, 0xFFFFFFFFu};
  for (auto mode : {ValueMode::ulp_delta, ValueMode::xor_bits}) {
    for (bool overwrite : {false, true}) {
      const size_t n16 = std::size(specials16), n32 = std::size(specials32);
      Manifest m({{"a", DType::bf16, {n16 * n16}}, {"b", DType::f32, {n32 * n32}}, {"c", DType::f16, {n16 * n16}}});
      OwnedWeights base(m), next(m);
      for (size_t i = 0; i < n16; ++i)
        for (size_t j = 0; j < n16; ++j) {
          testing::store_bits(base.bytes[0].data(), 2, i * n16 + j, specials16[i]);
          testing::store_bits(next.bytes[0].data(), 2, i * n16 + j, specials16[j]);
          testing::store_bits(base.bytes[2].data(), 2, i * n16 + j, specials16[j]);
          testing::store_bits(next.bytes[2].data(), 2, i * n16 + j, specials16[i]);
        }
      for (size_t i = 0; i < n32; ++i)
        for (size_t j = 0; j < n32; ++j) {
          testing::store_bits(base.bytes[1].data(), 4, i * n32 + j, specials32[i]);
          testing::store_bits(next.bytes[1].data(), 4, i * n32 + j, specials32[j]);
        }
      OwnedWeights receiver = base;
      EncodeOptions opts;
      opts.xor_safe_mode = mode;
      if (overwrite) opts.overwrite_tensors.assign(m.size(), true);
      testing::round_trip(base, next, receiver, opts);
      EXPECT_TRUE(receiver == next) << "mode " << int(mode) << " overwrite " << overwrite;
    }
  }
}

// Exhaustive ulp bijection: every 16-bit pattern to every pattern at distance 1, 2 and 2^15.
TEST(UlpDelta, OrderKeyIsABijectionOnAllSixteenBitPatterns) {
  std::vector<bool> seen(65536, false);
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t k = order_key(b, 2, true);
    ASSERT_LT(k, 65536u);
    ASSERT_FALSE(seen[k]);
    seen[k] = true;
    ASSERT_EQ(order_unkey(k, 2, true), b);
  }
  // Order: -inf < -1 < -0 < +0 < 1 < +inf in key space.
  EXPECT_LT(order_key(0xFF80, 2, true), order_key(0xBF80, 2, true));
  EXPECT_LT(order_key(0xBF80, 2, true), order_key(0x8000, 2, true));
  EXPECT_EQ(order_key(0x8000, 2, true) + 1, order_key(0x0000, 2, true));
  EXPECT_LT(order_key(0x3F80, 2, true), order_key(0x7F80, 2, true));
}

TEST(UlpDelta, ExtremeDistancesRoundTrip) {
  Manifest m({{"x", DType::u8, {256 * 256}}, {"y", DType::bf16, {4096}}, {"z", DType::f32, {8}}});
  OwnedWeights base(m), next(m);
  for (uint32_t i = 0; i < 256; ++i)
    for (uint32_t j = 0; j < 256; ++j) {
      testing::store_bits(base.bytes[0].data(), 1, i * 256 + j, i);
      testing::store_bits(next.bytes[0].data(), 1, i * 256 + j, j);
    }
  for (uint32_t i = 0; i < 4096; ++i) {
    testing::store_bits(base.bytes[1].data(), 2, i, i * 16);
    testing::store_bits(next.bytes[1].data(), 2, i, (i * 16 + 0x8000 + i) & 0xFFFF);
  }
  const uint32_t z_old[] = {0, 0x80000000u, 0x7FFFFFFFu, 0xFFFFFFFFu, 1, 2, 3, 4};
  const uint32_t z_new[] = {0xFFFFFFFFu, 0x7FFFFFFFu, 0x80000000u, 0, 0x80000001u, 0xFFFFFFFEu, 3 + 300, 4 - 1};
  for (int i = 0; i < 8; ++i) {
    testing::store_bits(base.bytes[2].data(), 4, i, z_old[i]);
    testing::store_bits(next.bytes[2].data(), 4, i, z_new[i]);
  }
  OwnedWeights receiver = base;
  testing::round_trip(base, next, receiver);
  EXPECT_TRUE(receiver == next);
}

// Random property test: random manifests, dtypes, densities, chunk sizes, modes; also checks that
// encoding is deterministic (same input -> same bytes).
TEST(RoundTripProperty, RandomManifestsAndDeltas) {
  std::mt19937_64 rng(12345);
  for (int iter = 0; iter < 40; ++iter) {
    std::vector<TensorInfo> tensors;
    const int nt = 1 + static_cast<int>(rng() % 6);
    for (int t = 0; t < nt; ++t)
      tensors.push_back({"t" + std::to_string(t), kAllDTypes[rng() % 7], {1 + rng() % 300, 1 + rng() % 300}});
    Manifest m(tensors);
    OwnedWeights base(m);
    testing::fill_random(base, rng);
    OwnedWeights next = base;
    const double densities[] = {0.0005, 0.01, 0.05, 0.3, 0.9};
    testing::mutate(next, densities[rng() % 5], rng, rng() % 4 == 0);
    EncodeOptions opts;
    opts.chunk_bytes = 256 + rng() % 100000;
    opts.xor_safe_mode = rng() % 2 ? ValueMode::ulp_delta : ValueMode::xor_bits;
    for (size_t t = 0; t < m.size(); ++t) opts.overwrite_tensors.push_back(rng() % 3 == 0);
    opts.threads = 1 + rng() % 2;
    OwnedWeights receiver = base;
    const auto d1 = testing::round_trip(base, next, receiver, opts);
    ASSERT_TRUE(receiver == next) << "iteration " << iter;
    const auto d2 = encode_delta(base.view(), next.view(), StateDigest::full_scan(base.view()), {0, 1}, opts);
    ASSERT_EQ(d1.frames, d2.frames) << "encoding is not deterministic, iteration " << iter;
    // The one-pass form (the base digest computed during the scan) gives the same bytes.
    const auto d3 = encode_delta(base.view(), next.view(), {0, 1}, opts);
    ASSERT_EQ(d3.base_digest, StateDigest::full_scan(base.view())) << "iteration " << iter;
    ASSERT_EQ(d1.frames, d3.frames) << "one-pass frames differ, iteration " << iter;
    ASSERT_EQ(d1.new_digest, d3.new_digest);
  }
}

// The one-pass encoder digests the base in stretches of kScanTapSpan elements behind the scan;
// slices of several stretches (chunks larger than the random test's) give the base digest of a
// full scan and the two-pass encoder's bytes, for every element width.
TEST(RoundTripProperty, OnePassDigestOverSeveralTapStretches) {
  std::mt19937_64 rng(99);
  const uint64_t n = 2 * kScanTapSpan + 77;
  Manifest m({{"b", DType::bf16, {n}}, {"f", DType::f32, {n}}, {"e", DType::f8_e4m3, {n}}, {"s", DType::bf16, {5}}});
  OwnedWeights base(m);
  testing::fill_random(base, rng);
  OwnedWeights next = base;
  testing::mutate(next, 0.01, rng);
  for (uint64_t chunk_bytes : {uint64_t{4} << 20, 3 * kScanTapSpan + 1000}) {
    EncodeOptions opts;
    opts.chunk_bytes = chunk_bytes;
    const auto two_pass = encode_delta(base.view(), next.view(), StateDigest::full_scan(base.view()), {0, 1}, opts);
    const auto one_pass = encode_delta(base.view(), next.view(), {0, 1}, opts);
    ASSERT_EQ(one_pass.base_digest, StateDigest::full_scan(base.view())) << chunk_bytes;
    ASSERT_EQ(one_pass.frames, two_pass.frames) << chunk_bytes;
    ASSERT_EQ(one_pass.new_digest, StateDigest::full_scan(next.view())) << chunk_bytes;
  }
}

using testing::MemoryReader;

// The encoder over readers (pieces of kReadPieceBytes, sampled runs read alone) gives the frames
// and digests of the encoder over spans, for every dtype, with slices of several pieces that do
// not start on a piece boundary, classed and unclassed, overwrite tensors, none and all changed;
// it reads each byte of both versions about once; and the delta applies bit-exactly.
TEST(RoundTripProperty, ReaderEncoderGivesTheSpanEncodersFrames) {
  const uint64_t n = 2 * kReadPieceBytes + 77;  // elements: >= 2 pieces at every width
  std::vector<TensorInfo> tensors;
  for (DType dt : kAllDTypes) tensors.push_back({"t_" + std::string(dtype_name(dt)), dt, {n}});
  tensors.push_back({"small", DType::bf16, {3, 5}});
  tensors.push_back({"empty", DType::f32, {0}});
  const Manifest m(std::move(tensors));
  std::mt19937_64 rng(4242);
  OwnedWeights base(m);
  testing::fill_random(base, rng);
  // Densities 0, 1% and all; -1: changes that follow the magnitude (1 in 5 of the elements above
  // a tensor's median magnitude, 1 in 500 below: how training moves weights), so that classed
  // locations pay off and slices' class ranks continue across pieces.
  for (double density : {0.0, 0.01, 1.0, -1.0}) {
    OwnedWeights next = base;
    if (density >= 0) testing::mutate(next, density, rng);
    for (uint32_t t = 0; density < 0 && t < m.size(); ++t) {
      const unsigned w = static_cast<unsigned>(dtype_unit_size(m.at(t).dtype));
      const uint32_t abs_mask = abs_mask_of(m.at(t).dtype);
      std::vector<uint32_t> magnitudes;
      for (uint64_t i = 0; i < m.at(t).units(); i += 97)
        magnitudes.push_back(testing::load_bits(base.bytes[t].data(), w, i) & abs_mask);
      if (magnitudes.empty()) continue;
      std::nth_element(magnitudes.begin(), magnitudes.begin() + magnitudes.size() / 2, magnitudes.end());
      const uint32_t median = magnitudes[magnitudes.size() / 2];
      for (uint64_t i = 0; i < m.at(t).units(); ++i) {
        const uint32_t bits = testing::load_bits(next.bytes[t].data(), w, i);
        if (rng() % ((bits & abs_mask) > median ? 5 : 500) == 0)
          testing::store_bits(next.bytes[t].data(), w, i, bits ^ 1);
      }
    }
    // NaN, +-inf, -0.0 and a subnormal (for BF16 and F32; other bits elsewhere) written around the
    // first piece boundary of each tensor, on both sides of it.
    for (uint32_t t = 0; t < m.size(); ++t) {
      const unsigned w = static_cast<unsigned>(dtype_unit_size(m.at(t).dtype));
      if (m.at(t).units() < n) continue;
      const std::vector<uint32_t> special =
          w == 2 ? std::vector<uint32_t>{0x7FC0, 0x7F80, 0xFF80, 0x8000, 0x0001}
                 : std::vector<uint32_t>{0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001};
      const uint64_t boundary = kReadPieceBytes / w;
      for (size_t k = 0; k < special.size(); ++k) {
        testing::store_bits(next.bytes[t].data(), w, boundary - 3 + k, special[k]);
        testing::store_bits(base.bytes[t].data(), w, boundary + 3 + k, special[k]);
      }
    }
    for (uint64_t chunk_bytes : {uint64_t{8} << 20, 3 * kReadPieceBytes + 1000}) {
      EncodeOptions opts;
      opts.chunk_bytes = chunk_bytes;
      opts.threads = 2;
      opts.overwrite_tensors.assign(m.size(), false);
      opts.overwrite_tensors[2] = true;  // F32, overwrite: no classes
      const auto spans = encode_delta(base.view(), next.view(), {3, 4}, opts);
      const MemoryReader base_reader(base.view()), next_reader(next.view());
      const auto read = encode_delta(base_reader, next_reader, {3, 4}, opts);
      const std::string where = "density " + std::to_string(density) + ", chunk bytes " + std::to_string(chunk_bytes);
      ASSERT_EQ(read.frames, spans.frames) << where;
      ASSERT_EQ(read.base_digest, StateDigest::full_scan(base.view())) << where;
      ASSERT_EQ(read.new_digest, StateDigest::full_scan(next.view())) << where;
      EXPECT_EQ(read.stats.changes, spans.stats.changes) << where;
      if (density < 0) {  // the case for classed locations: chosen, so ranks across pieces are checked
        EXPECT_GT(read.stats.segments_by_coding[static_cast<int>(LocationCoding::classed_gaps)], 3u) << where;
      }
      // Each byte once, plus the sampled runs (at most 8192 elements of a slice, read twice).
      const uint64_t total = m.total_bytes();
      EXPECT_GE(base_reader.bytes.load(), total) << where;
      EXPECT_LE(base_reader.bytes.load(), total + total / 16) << where;
      EXPECT_EQ(next_reader.bytes.load(), base_reader.bytes.load()) << where;
      // A producer's form: the base in memory with its digest, the new version read. The same
      // frames (with the given digest written in), and the new version read about once.
      const MemoryReader next_only(next.view());
      const auto mixed = encode_delta(base.view(), next_only, read.base_digest, {3, 4}, opts);
      ASSERT_EQ(mixed.frames, spans.frames) << where;
      ASSERT_EQ(mixed.new_digest, read.new_digest) << where;
      EXPECT_EQ(next_only.bytes.load(), next_reader.bytes.load()) << where;
      OwnedWeights receiver = base;
      DeltaApplier applier(m, receiver.mut(), 3, read.base_digest);
      for (const auto& f : read.frames) applier.apply(f);
      applier.verify();
      applier.commit();
      ASSERT_TRUE(receiver == next) << where;
    }
  }
}

// A reader that fails (a file truncated under the diff) fails the encode with its Error(io).
TEST(RoundTripProperty, ReaderEncoderPassesAReadErrorOn) {
  Manifest m({{"w", DType::bf16, {3 * kReadPieceBytes}}, {"v", DType::i64, {1000}}});
  std::mt19937_64 rng(5);
  OwnedWeights base(m);
  testing::fill_random(base, rng);
  OwnedWeights next = base;
  testing::mutate(next, 0.01, rng);
  for (uint64_t fail_at : {1, 2, 7}) {
    MemoryReader base_reader(base.view());
    const MemoryReader next_reader(next.view());
    base_reader.fail_at = fail_at;
    EncodeOptions opts;
    opts.threads = 2;
    try {
      (void)encode_delta(base_reader, next_reader, {0, 1}, opts);
      FAIL() << "read " << fail_at << " failed, the encode did not";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::io);
      EXPECT_NE(std::string(e.what()).find("test.safetensors"), std::string::npos) << e.what();
    }
    MemoryReader failing_next(next.view());
    failing_next.fail_at = fail_at;
    try {
      (void)encode_delta(base.view(), failing_next, StateDigest::full_scan(base.view()), {0, 1}, opts);
      FAIL() << "read " << fail_at << " of the new version failed, the encode did not";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::io) << e.what();
    }
  }
}

TEST(Digest, IncrementalDigestMatchesFullScanAfterApply) {
  Manifest m({{"w", DType::bf16, {100000}}, {"v", DType::f32, {1000}}});
  std::mt19937_64 rng(7);
  OwnedWeights base(m);
  testing::fill_random(base, rng);
  OwnedWeights next = base;
  testing::mutate(next, 0.02, rng);
  OwnedWeights receiver = base;
  const auto delta = testing::round_trip(base, next, receiver);
  EXPECT_EQ(delta.new_digest, StateDigest::full_scan(next.view()));
  EXPECT_EQ(StateDigest::full_scan(receiver.view()), StateDigest::full_scan(next.view(), 2));
}

}  // namespace
}  // namespace deltacast::codec

namespace deltacast::codec {
namespace {
// Slice digests across a 2^32 index boundary (where the format v2 index word changes its high
// part) add up and equal the per-element terms.
TEST(Digest, SliceAcrossA2To32IndexBoundary) {
  std::mt19937_64 rng(77);
  // A slice across the 2^32 index boundary digests like its two halves.
  std::vector<std::byte> bytes(2 * 3000);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  const uint64_t start = (uint64_t{1} << 32) - 1000;
  const std::span<const std::byte> all(bytes);
  EXPECT_EQ(slice_digest(2, DType::bf16, start, all),
            slice_digest(2, DType::bf16, start, all.first(2000)) + slice_digest(2, DType::bf16, start + 1000, all.subspan(2000)));
  uint64_t scalar = 0;
  for (size_t k = 0; k < 3000; ++k)
    scalar += element_hash(2, start + k, static_cast<uint32_t>(testing::load_bits(bytes.data(), 2, k)));
  EXPECT_EQ(slice_digest(2, DType::bf16, start, all), scalar);
}

TEST(Digest, SliceDigestsAddUpToTheTensorDigest) {
  std::vector<uint16_t> v(10007);
  std::mt19937_64 rng(4);
  for (auto& x : v) x = static_cast<uint16_t>(rng());
  std::span<const std::byte> all(reinterpret_cast<const std::byte*>(v.data()), v.size() * 2);
  const uint64_t whole = tensor_digest(3, DType::bf16, all);
  uint64_t sum = 0;
  for (uint64_t first = 0; first < v.size(); first += 1000) {
    const uint64_t n = std::min<uint64_t>(1000, v.size() - first);
    sum += slice_digest(3, DType::bf16, first, all.subspan(first * 2, n * 2));
  }
  EXPECT_EQ(sum, whole);
  EXPECT_NE(slice_digest(4, DType::bf16, 0, all), whole);
}
}  // namespace
}  // namespace deltacast::codec
