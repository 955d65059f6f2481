// The apply gate's codec half (DeltaApplier::Mode::staged): versions are verified and committed
// without a single write into the buffers, queue in order, and are written bit-exactly, oldest
// first, when the host asks. Every check compares bits.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "codec_test_util.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

using testing::OwnedWeights;

constexpr auto kStaged = DeltaApplier::Mode::staged;

using testing::errc_of;

// A chain base = v[0] -> v[1] -> ... of random ~2% changes (all dtypes, odd sizes).
struct Chain : ::testing::Test {
  Manifest m{{{"emb", DType::bf16, {301, 257}}, {"norm", DType::f16, {257}}, {"head", DType::f32, {63, 33}},
              {"q8", DType::f8_e4m3, {1001}}, {"q5", DType::f8_e5m2, {999}}, {"i", DType::i8, {77}},
              {"u", DType::u8, {3}}, {"none", DType::bf16, {0}}}};
  std::vector<OwnedWeights> v;
  std::vector<EncodedDelta> deltas;  // deltas[k]: v[k] -> v[k+1], versions 10+k -> 11+k
  void build(size_t versions, double density = 0.02, bool wild = false) {
    std::mt19937_64 rng(7);
    v.emplace_back(m);
    testing::fill_random(v[0], rng);
    EncodeOptions opts;
    opts.chunk_bytes = 24 * 1024;
    for (size_t k = 0; k < versions; ++k) {
      OwnedWeights next = v.back();
      testing::mutate(next, density, rng, wild);
      deltas.push_back(encode_delta(v.back().view(), next.view(), StateDigest::full_scan(v.back().view()),
                                    {10 + k, 11 + k}, opts));
      v.push_back(std::move(next));
    }
  }
  static void stage(DeltaApplier& a, const EncodedDelta& d) {
    for (const auto& f : d.frames) a.apply(f);
    a.verify();
    a.commit();
  }
};

TEST_F(Chain, StagedVersionsCommitWithoutWritingAndApplyInOrderBitExactly) {
  build(3);
  OwnedWeights target = v[0];
  DeltaApplier a(m, target.mut(), 10, StateDigest::full_scan(target.view()), kStaged);
  for (const auto& d : deltas) stage(a, d);  // each version's base is the previous staged one
  EXPECT_TRUE(target == v[0]) << "a staged version wrote into the buffers";
  EXPECT_EQ(a.version(), 13u);
  EXPECT_EQ(a.digest().combined(), StateDigest::full_scan(v[3].view()).combined());
  EXPECT_EQ(a.buffers_version(), 10u);
  EXPECT_EQ(a.staged_versions(), (std::vector<uint64_t>{11, 12, 13}));
  for (uint64_t k = 1; k <= 3; ++k) {
    EXPECT_EQ(a.apply_next_staged(), std::optional<uint64_t>(10 + k));
    EXPECT_TRUE(target == v[k]) << "after writing version " << 10 + k;
    EXPECT_EQ(a.buffers_version(), 10 + k);
    EXPECT_EQ(a.buffers_digest().combined(), StateDigest::full_scan(target.view()).combined());
    a.audit();
  }
  EXPECT_EQ(a.apply_next_staged(), std::nullopt);
  EXPECT_TRUE(a.staged_versions().empty());
}

TEST_F(Chain, AllChangedAndNoneChangedVersionsStageExactly) {
  build(2, 1.0, true);  // every element to arbitrary bits
  OwnedWeights target = v[0];
  DeltaApplier a(m, target.mut(), 10, StateDigest::full_scan(target.view()), kStaged);
  stage(a, deltas[0]);
  // A version that changes nothing, staged on top.
  auto same = encode_delta(v[1].view(), v[1].view(), StateDigest::full_scan(v[1].view()), {11, 12}, {});
  stage(a, same);
  stage(a, encode_delta(v[1].view(), v[2].view(), StateDigest::full_scan(v[1].view()), {12, 13}, {}));
  EXPECT_TRUE(target == v[0]);
  while (a.apply_next_staged()) {
  }
  EXPECT_TRUE(target == v[2]);
}

TEST(StagedSpecials, NanInfNegativeZeroSubnormalsStageAndApplyExactly) {
  const uint32_t specials16[] = {0x7FC0, 0x7FC1, 0xFFC0, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001,
                                 0x807F, 0x7F7F, 0xFF7F, 0x0080, 0x7FFF, 0xFFFF, 0x3F80, 0xBF80};
  const size_t n = std::size(specials16);
  Manifest m({{"a", DType::bf16, {n * n}}, {"b", DType::f16, {n * n}}});
  OwnedWeights base(m), mid(m), next(m);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      testing::store_bits(base.bytes[0].data(), 2, i * n + j, specials16[i]);
      testing::store_bits(mid.bytes[0].data(), 2, i * n + j, specials16[j]);
      testing::store_bits(next.bytes[0].data(), 2, i * n + j, specials16[(i + j) % n]);
      testing::store_bits(base.bytes[1].data(), 2, i * n + j, specials16[j]);
      testing::store_bits(mid.bytes[1].data(), 2, i * n + j, specials16[i]);
      testing::store_bits(next.bytes[1].data(), 2, i * n + j, specials16[(i * j) % n]);
    }
  for (auto mode : {ValueMode::ulp_delta, ValueMode::xor_bits}) {
    EncodeOptions opts;
    opts.xor_safe_mode = mode;
    OwnedWeights target = base;
    DeltaApplier a(m, target.mut(), 1, StateDigest::full_scan(base.view()), DeltaApplier::Mode::staged);
    for (const auto& f : encode_delta(base.view(), mid.view(), StateDigest::full_scan(base.view()), {1, 2}, opts).frames)
      a.apply(f);
    a.verify();
    a.commit();
    for (const auto& f : encode_delta(mid.view(), next.view(), StateDigest::full_scan(mid.view()), {2, 3}, opts).frames)
      a.apply(f);
    a.verify();
    a.commit();
    EXPECT_TRUE(target == base);
    a.apply_next_staged();
    EXPECT_TRUE(target == mid);
    a.apply_next_staged();
    EXPECT_TRUE(target == next) << "mode " << static_cast<int>(mode);
  }
}

TEST_F(Chain, RefusedAndRolledBackStagedVersionsLeaveBuffersAndQueueAlone) {
  build(2);
  OwnedWeights target = v[0];
  DeltaApplier a(m, target.mut(), 10, StateDigest::full_scan(target.view()), kStaged);
  stage(a, deltas[0]);
  // Corrupt a byte in the middle of a chunk of version 12: refused, nothing changes.
  auto bad = deltas[1].frames[0];
  bad[bad.size() / 2] ^= std::byte{0x5A};
  EXPECT_NE(errc_of([&] { a.apply(bad); }), Errc::ok);
  EXPECT_EQ(errc_of([&] { a.apply(deltas[0].frames[0]); }), Errc::version_mismatch);  // already committed
  // A partly staged version 12, then an abort.
  a.apply(deltas[1].frames[1]);
  a.rollback();
  EXPECT_TRUE(target == v[0]);
  EXPECT_EQ(a.staged_versions(), (std::vector<uint64_t>{11}));
  EXPECT_EQ(a.version(), 11u);
  // The same version again, whole: it stages on top of 11 and everything lands exactly.
  stage(a, deltas[1]);
  a.apply_next_staged();
  EXPECT_TRUE(target == v[1]);
  a.apply_next_staged();
  EXPECT_TRUE(target == v[2]);
}

TEST_F(Chain, TamperedStagedVersionFailsVerifyWithoutWriting) {
  build(1);
  // A seal announcing other digests: every chunk stages, verify refuses, the buffers are intact.
  OwnedWeights other = v[1];
  testing::store_bits(other.bytes[0].data(), 2, 5, testing::load_bits(other.bytes[0].data(), 2, 5) ^ 1);
  EncodeOptions opts;
  opts.chunk_bytes = 24 * 1024;  // as build(): the same chunk count
  auto forged = encode_delta(v[0].view(), other.view(), StateDigest::full_scan(v[0].view()), {10, 11}, opts);
  OwnedWeights target = v[0];
  DeltaApplier a(m, target.mut(), 10, StateDigest::full_scan(target.view()), kStaged);
  for (size_t i = 0; i + 1 < deltas[0].frames.size(); ++i) a.apply(deltas[0].frames[i]);
  a.apply(forged.frames.back());  // the seal of the forged version
  EXPECT_EQ(errc_of([&] { a.verify(); }), Errc::verify_failed);
  a.rollback();
  EXPECT_TRUE(target == v[0]);
  EXPECT_TRUE(a.staged_versions().empty());
}

TEST_F(Chain, NextVersionStagesConcurrentlyWithWritingTheQueue) {
  build(6);
  for (int round = 0; round < 5; ++round) {
    OwnedWeights target = v[0];
    DeltaApplier a(m, target.mut(), 10, StateDigest::full_scan(target.view()), kStaged);
    std::atomic<bool> done{false};
    std::thread server([&] {  // writes whatever is queued, as a server at its safe points
      while (!done.load()) a.apply_next_staged();
    });
    for (const auto& d : deltas) {
      std::vector<std::thread> threads;
      std::atomic<size_t> next{0};
      for (int t = 0; t < 3; ++t)
        threads.emplace_back([&] {
          for (size_t i; (i = next.fetch_add(1)) < d.frames.size();) a.apply(d.frames[i]);
        });
      for (auto& t : threads) t.join();
      a.verify();
      a.commit();
    }
    done = true;
    server.join();
    while (a.apply_next_staged()) {
    }
    EXPECT_TRUE(target == v.back()) << "round " << round;
  }
}

TEST_F(Chain, WritingAVersionShowsEachElementsPreviousBits) {
  build(2);
  OwnedWeights target = v[0];
  DeltaApplier a(m, target.mut(), 10, StateDigest::full_scan(target.view()), kStaged);
  stage(a, deltas[0]);
  stage(a, deltas[1]);
  OwnedWeights seen = v[1];  // rebuilt from v[2]'s bits and the visits of the second write
  a.apply_next_staged();
  std::map<std::pair<uint32_t, uint64_t>, uint32_t> before;
  a.apply_next_staged([&](uint32_t t, uint64_t e, uint32_t bits) { before[{t, e}] = bits; });
  ASSERT_TRUE(target == v[2]);
  OwnedWeights rebuilt = target;
  for (const auto& [key, bits] : before) {
    const unsigned w = static_cast<unsigned>(dtype_size(m.at(key.first).dtype));
    testing::store_bits(rebuilt.bytes[key.first].data(), w, key.second, bits);
  }
  EXPECT_TRUE(rebuilt == seen);
}

TEST_F(Chain, RebindMovesATensorToMemoryHoldingTheSameBits) {
  build(2);
  for (auto mode : {DeltaApplier::Mode::in_place, kStaged}) {
    OwnedWeights target = v[0];
    DeltaApplier a(m, target.mut(), 10, StateDigest::full_scan(target.view()), mode);
    stage(a, deltas[0]);
    if (mode == kStaged) a.apply_next_staged();
    ASSERT_TRUE(target == v[1]);
    std::vector<std::byte> moved = target.bytes[0];
    std::vector<std::byte> wrong = moved;
    wrong[7] ^= std::byte{1};
    EXPECT_EQ(errc_of([&] { a.rebind(0, wrong); }), Errc::invalid_argument);
    EXPECT_EQ(errc_of([&] { a.rebind(0, std::span(moved).first(moved.size() - 2)); }), Errc::invalid_argument);
    a.rebind(0, moved);
    const std::vector<std::byte> old = target.bytes[0];
    stage(a, deltas[1]);
    if (mode == kStaged) a.apply_next_staged();
    EXPECT_EQ(target.bytes[0], old) << "the old buffer was written after rebind";
    target.bytes[0] = moved;
    EXPECT_TRUE(target == v[2]);
  }
}

TEST_F(Chain, RebindIsRefusedWhileAVersionIsWrittenInPlace) {
  build(1);
  OwnedWeights target = v[0];
  DeltaApplier a(m, target.mut(), 10, StateDigest::full_scan(target.view()));
  a.apply(deltas[0].frames[0]);
  std::vector<std::byte> copy = target.bytes[0];
  EXPECT_EQ(errc_of([&] { a.rebind(0, copy); }), Errc::state);
}

}  // namespace
}  // namespace deltacast::codec
