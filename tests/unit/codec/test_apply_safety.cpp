// Bad input never changes the receiver's bits; replay is refused; rollback restores the base exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "codec/frame_writer.h"
#include "codec/wire.h"
#include <xxhash.h>
#include <functional>
#include "codec_test_util.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

using testing::OwnedWeights;

struct Fixture : ::testing::Test {
  Manifest m{{{"emb", DType::bf16, {300, 257}}, {"norm", DType::bf16, {257}}, {"head", DType::f32, {64, 33}}}};
  OwnedWeights base{m}, next{m};
  EncodedDelta delta;
  void SetUp() override {
    std::mt19937_64 rng(99);
    testing::fill_random(base, rng);
    next = base;
    testing::mutate(next, 0.02, rng);
    EncodeOptions opts;
    opts.chunk_bytes = 32 * 1024;
    delta = encode_delta(base.view(), next.view(), StateDigest::full_scan(base.view()), {5, 6}, opts);
    ASSERT_GT(delta.frames.size(), 3u);
  }
  DeltaApplier make_applier(OwnedWeights& target, uint64_t version = 5) {
    return DeltaApplier(m, target.mut(), version, StateDigest::full_scan(target.view()));
  }
  static Errc errc_of(const std::function<void()>& fn) { return testing::errc_of(fn); }
};

TEST_F(Fixture, ReplayedChunkIsRefusedAndNotAppliedTwice) {
  OwnedWeights target = base;
  auto applier = make_applier(target);
  applier.apply(delta.frames[0]);
  const OwnedWeights after_one = target;
  EXPECT_EQ(errc_of([&] { applier.apply(delta.frames[0]); }), Errc::replayed);
  EXPECT_TRUE(target == after_one);
  for (size_t i = 1; i < delta.frames.size(); ++i) applier.apply(delta.frames[i]);
  applier.verify();
  applier.commit();
  EXPECT_TRUE(target == next);
  // After commit the old version's frames no longer match the base: refused, bits unchanged.
  EXPECT_EQ(errc_of([&] { applier.apply(delta.frames[1]); }), Errc::version_mismatch);
  EXPECT_TRUE(target == next);
}

TEST_F(Fixture, FramesApplyInAnyOrder) {
  OwnedWeights target = base;
  auto applier = make_applier(target);
  std::vector<size_t> order(delta.frames.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  for (size_t i : order) applier.apply(delta.frames[i]);
  EXPECT_TRUE(applier.complete());
  applier.verify();
  applier.commit();
  EXPECT_TRUE(target == next);
  EXPECT_EQ(applier.version(), 6u);
}

TEST_F(Fixture, RollbackRestoresBaseBitExactly) {
  OwnedWeights target = base;
  auto applier = make_applier(target);
  for (size_t i = 0; i + 2 < delta.frames.size(); ++i) applier.apply(delta.frames[i]);
  EXPECT_FALSE(target == base);
  EXPECT_FALSE(applier.complete());
  EXPECT_EQ(errc_of([&] { applier.verify(); }), Errc::state);
  EXPECT_EQ(errc_of([&] { applier.commit(); }), Errc::state);
  applier.rollback();
  EXPECT_TRUE(target == base);
  EXPECT_EQ(applier.digest(), StateDigest::full_scan(base.view()));
  // The same version can be applied again after a rollback.
  for (const auto& f : delta.frames) applier.apply(f);
  applier.verify();
  applier.commit();
  EXPECT_TRUE(target == next);
}

TEST_F(Fixture, WrongBaseVersionOrDigestIsRefused) {
  OwnedWeights target = base;
  auto wrong_version = make_applier(target, 4);
  EXPECT_EQ(errc_of([&] { wrong_version.apply(delta.frames[0]); }), Errc::version_mismatch);
  OwnedWeights other = base;
  testing::store_bits(other.bytes[1].data(), 2, 3, 0x1234);  // receiver holds different bits
  const OwnedWeights other_before = other;
  auto wrong_bits = make_applier(other);
  EXPECT_EQ(errc_of([&] { wrong_bits.apply(delta.frames[0]); }), Errc::version_mismatch);
  EXPECT_TRUE(other == other_before);
  EXPECT_TRUE(target == base);
}

TEST_F(Fixture, ManifestMismatchIsRefused) {
  Manifest other({{"emb", DType::bf16, {300, 257}}, {"norm", DType::bf16, {257}}, {"head", DType::f32, {33, 64}}});
  OwnedWeights target(other);
  std::copy(base.bytes.begin(), base.bytes.end(), target.bytes.begin());
  DeltaApplier applier(other, target.mut(), 5, StateDigest::full_scan(target.view()));
  EXPECT_EQ(errc_of([&] { applier.apply(delta.frames[0]); }), Errc::version_mismatch);
}

TEST_F(Fixture, EveryTruncationAndSingleByteCorruptionIsRefusedWithoutWrites) {
  OwnedWeights target = base;
  auto applier = make_applier(target);
  const auto& frame = delta.frames[1];
  for (size_t cut = 0; cut < frame.size(); cut += std::max<size_t>(1, frame.size() / 97)) {
    std::span<const std::byte> t(frame.data(), cut);
    EXPECT_EQ(errc_of([&] { applier.apply(t); }), Errc::corrupt_frame) << "cut at " << cut;
  }
  for (size_t at = 0; at < frame.size(); at += std::max<size_t>(1, frame.size() / 211)) {
    auto bad = frame;
    bad[at] ^= std::byte{0x5A};
    const Errc e = errc_of([&] { applier.apply(bad); });
    EXPECT_TRUE(e == Errc::corrupt_frame || e == Errc::version_mismatch) << "flip at " << at;
  }
  EXPECT_TRUE(target == base);
  EXPECT_FALSE(applier.pending_version().has_value());
}

// A frame that passes the checksum (re-sealed after tampering) but carries wrong values is caught
// by verify(), and rollback restores the base.
TEST_F(Fixture, TamperedValuesAreCaughtByVerify) {
  auto view = parse_frame(delta.frames[0]);
  ASSERT_FALSE(view.sections.empty());
  // Find a raw section and flip one bit inside it, then re-checksum.
  auto bad = delta.frames[0];
  bool tampered = false;
  for (const auto& s : view.sections)
    if (s.codec == SectionCodec::raw && s.stream == StreamId::sign_bits) {
      bad[s.offset] ^= std::byte{1};
      tampered = true;
      break;
    }
  ASSERT_TRUE(tampered) << "expected a raw sign-bit section";
  store_le<uint64_t>(bad.data() + bad.size() - 8, XXH3_64bits(bad.data(), bad.size() - 8));
  OwnedWeights target = base;
  auto applier = make_applier(target);
  applier.apply(bad);
  for (size_t i = 1; i < delta.frames.size(); ++i) applier.apply(delta.frames[i]);
  EXPECT_EQ(errc_of([&] { applier.verify(); }), Errc::verify_failed);
  applier.rollback();
  EXPECT_TRUE(target == base);
}

TEST_F(Fixture, AuditDetectsBitsChangedBehindTheAppliersBack) {
  OwnedWeights target = base;
  auto applier = make_applier(target);
  for (const auto& f : delta.frames) applier.apply(f);
  applier.verify();
  applier.audit();
  target.bytes[0][10] ^= std::byte{1};
  EXPECT_EQ(errc_of([&] { applier.audit(); }), Errc::verify_failed);
}

TEST_F(Fixture, SplitFramesRejectsTruncatedFiles) {
  std::vector<std::byte> file;
  for (const auto& f : delta.frames) file.insert(file.end(), f.begin(), f.end());
  EXPECT_EQ(split_frames(file).size(), delta.frames.size());
  file.resize(file.size() - 3);
  EXPECT_EQ(errc_of([&] { split_frames(file); }), Errc::corrupt_frame);
  std::vector<std::byte> junk(100, std::byte{'x'});
  EXPECT_EQ(errc_of([&] { split_frames(junk); }), Errc::corrupt_frame);
}

TEST_F(Fixture, UnknownTensorIndexIsRefused) {
  FrameHeader h;
  h.manifest_digest = m.digest();
  h.base_version = 5;
  h.base_digest = StateDigest::full_scan(base.view()).combined();
  h.new_version = 6;
  h.chunk_count = 1;
  std::vector<SegmentInfo> segs{{7, DType::bf16, ValueMode::ulp_delta, LocationCoding::none, 0, 10, 0}};
  const auto frame = build_chunk_frame(h, segs, {}, 1);
  OwnedWeights target = base;
  auto applier = make_applier(target);
  EXPECT_EQ(errc_of([&] { applier.apply(frame); }), Errc::not_found);
  segs[0] = {0, DType::f32, ValueMode::ulp_delta, LocationCoding::none, 0, 10, 0};
  EXPECT_EQ(errc_of([&] { applier.apply(build_chunk_frame(h, segs, {}, 1)); }), Errc::corrupt_frame);
  segs[0] = {1, DType::bf16, ValueMode::ulp_delta, LocationCoding::range, 250, 10, 10};
  EXPECT_EQ(errc_of([&] { applier.apply(build_chunk_frame(h, segs, {}, 1)); }), Errc::corrupt_frame);
  EXPECT_TRUE(target == base);
}

// A chunk that covers elements another chunk of the same version covers (a producer bug: here
// chunk 0 re-sent under another chunk's index, re-checksummed) is refused before it writes:
// applied twice, an XOR or ulp delta would land on bits it was not computed from.
TEST_F(Fixture, ChunkOverlappingAnotherChunkOfItsVersionIsRefused) {
  const uint32_t other = parse_frame(delta.frames[1]).header.chunk_index;
  auto copy = delta.frames[0];
  ASSERT_NE(parse_frame(copy).header.chunk_index, other);
  store_le<uint32_t>(copy.data() + 48, other);
  store_le<uint64_t>(copy.data() + copy.size() - 8, XXH3_64bits(copy.data(), copy.size() - 8));
  OwnedWeights target = base;
  auto applier = make_applier(target);
  applier.apply(delta.frames[0]);
  const OwnedWeights after_first = target;
  EXPECT_EQ(errc_of([&] { applier.apply(copy); }), Errc::corrupt_frame);
  EXPECT_TRUE(target == after_first);
  // The refused copy did not take chunk `other`'s place: the genuine one completes the version.
  for (size_t i = 1; i < delta.frames.size(); ++i) applier.apply(delta.frames[i]);
  applier.verify();
  applier.commit();
  EXPECT_TRUE(target == next);
}

// Weights whose small magnitudes change far more often than large ones, so the encoder codes
// their locations by class (classed_gaps): the coding whose errors show only while writing.
struct ClassedFixture : Fixture {
  Manifest cm{{{"w", DType::bf16, {512, 512}}}};
  OwnedWeights cbase{cm}, cnext{cm};
  EncodedDelta cdelta;
  void SetUp() override {
    std::mt19937_64 rng(7);
    const size_t n = 512 * 512;
    auto* a = reinterpret_cast<uint16_t*>(cbase.bytes[0].data());
    for (size_t i = 0; i < n; ++i) a[i] = static_cast<uint16_t>((rng() % 8 == 0 ? 0x3800 : 0x3C00) | (rng() & 0x7F));
    cnext = cbase;
    auto* b = reinterpret_cast<uint16_t*>(cnext.bytes[0].data());
    for (size_t i = 0; i < n; ++i)
      if (rng() % 1000 < ((a[i] & 0x7F80) == 0x3800 ? 150u : 5u)) b[i] = static_cast<uint16_t>(a[i] + 1);
    EncodeOptions opts;
    opts.chunk_bytes = 256 * 1024;  // two chunks of one segment each
    cdelta = encode_delta(cbase.view(), cnext.view(), StateDigest::full_scan(cbase.view()), {5, 6}, opts);
  }
  // Frame i with its class thresholds raised to the top of the magnitude range (re-checksummed):
  // every element falls into class 0, so class 0's ranks select (and write) wrong elements and the
  // higher classes' ranks lie beyond their now empty classes, which shows at the segment's end.
  std::vector<std::byte> with_thresholds_at_the_top(size_t i) const {
    auto bad = cdelta.frames[i];
    const auto view = parse_frame(bad);
    EXPECT_EQ(view.segments.size(), 1u);
    EXPECT_EQ(view.segments[0].location_coding, LocationCoding::classed_gaps);
    for (const auto& s : view.sections)
      if (s.stream == StreamId::locations) {
        EXPECT_EQ(s.codec, SectionCodec::raw);
        const auto k = static_cast<unsigned>(bad[s.offset]);
        for (unsigned j = 0; j + 1 < k; ++j)
          store_le<uint32_t>(bad.data() + s.offset + 1 + 4 * j, 0x7FFFu - (k - 2 - j));
      }
    store_le<uint64_t>(bad.data() + bad.size() - 8, XXH3_64bits(bad.data(), bad.size() - 8));
    return bad;
  }
};

// A member that holds rows 0:300 of w (a placement): the encoder keeps classed locations for the
// chunk wholly inside that slice (rows 0..255) and cuts the one that straddles its edge at row 300,
// into two segments held wholly or not at all, both classed. With a column slice (every row held
// partly) no segment is classed: they are coded by positions, which that member can decode
// without the elements it lacks. A whole-model receiver applies the frames to exactly the new
// bits.
TEST_F(ClassedFixture, SegmentsAMemberHoldsPartlyAreNotCodedByClass) {
  auto coding_of = [](const std::vector<std::byte>& frame) {
    return parse_frame(frame).segments.at(0).location_coding;
  };
  for (const bool by_rows : {true, false}) {
    auto held = std::make_shared<HeldSlices>();
    held->add(Placement::compile(
        cm, {BufferPlacement{"w_shard", {PlacementPart{"w", by_rows ? 0u : 1u, 0, 300, std::nullopt}}, false, {}, 0}}));
    EncodeOptions opts;
    opts.chunk_bytes = uint64_t{256} << 10;
    opts.held_slices = held;
    const EncodedDelta placed =
        encode_delta(cbase.view(), cnext.view(), StateDigest::full_scan(cbase.view()), {5, 6}, opts);
    ASSERT_EQ(placed.frames.size(), 3u);
    EXPECT_EQ(coding_of(cdelta.frames[0]), LocationCoding::classed_gaps);
    EXPECT_EQ(coding_of(cdelta.frames[1]), LocationCoding::classed_gaps);
    const auto straddling = parse_frame(placed.frames[1]).segments;
    if (by_rows) {
      EXPECT_EQ(coding_of(placed.frames[0]), LocationCoding::classed_gaps) << "rows 0..255 are held whole";
      ASSERT_EQ(straddling.size(), 2u);
      EXPECT_EQ(straddling[1].element_begin, 300u * 512) << "cut at the slice's edge";
      for (const auto& seg : straddling) EXPECT_EQ(seg.location_coding, LocationCoding::classed_gaps);
    } else {
      EXPECT_NE(coding_of(placed.frames[0]), LocationCoding::classed_gaps) << "every row is held partly";
      ASSERT_EQ(straddling.size(), 1u) << "a column slice's short runs cut nothing";
      EXPECT_NE(straddling[0].location_coding, LocationCoding::classed_gaps);
    }
    OwnedWeights target = cbase;
    DeltaApplier applier(cm, target.mut(), 5, StateDigest::full_scan(target.view()));
    for (const auto& frame : placed.frames) applier.apply(frame);
    applier.verify();
    applier.commit();
    EXPECT_TRUE(target == cnext);
  }
}

// A frame whose class ranks turn out impossible only once its writes have started is refused,
// and the elements it wrote are restored: bit-exact base as the first frame of a version (the
// applier is idle again), and the first chunk untouched as the second (the version goes on).
TEST_F(ClassedFixture, ClassRankBeyondItsClassIsRefusedAfterUndoingItsWrites) {
  ASSERT_EQ(cdelta.frames.size(), 3u);  // two chunks and the seal
  {
    OwnedWeights target = cbase;
    DeltaApplier applier(cm, target.mut(), 5, StateDigest::full_scan(target.view()));
    EXPECT_EQ(errc_of([&] { applier.apply(with_thresholds_at_the_top(0)); }), Errc::corrupt_frame);
    EXPECT_TRUE(target == cbase);
    EXPECT_FALSE(applier.pending_version().has_value());
    EXPECT_EQ(applier.digest().combined(), StateDigest::full_scan(cbase.view()).combined());
  }
  OwnedWeights target = cbase;
  DeltaApplier applier(cm, target.mut(), 5, StateDigest::full_scan(target.view()));
  applier.apply(cdelta.frames[0]);
  const OwnedWeights after_first = target;
  EXPECT_EQ(errc_of([&] { applier.apply(with_thresholds_at_the_top(1)); }), Errc::corrupt_frame);
  EXPECT_TRUE(target == after_first);
  EXPECT_EQ(applier.pending_version(), std::optional<uint64_t>(6));
  // The genuine chunk is not a replay of the refused one: the version completes bit-exactly.
  applier.apply(cdelta.frames[1]);
  applier.apply(cdelta.frames[2]);
  applier.verify();
  applier.commit();
  EXPECT_TRUE(target == cnext);
  // And a rollback of a version with a refused chunk in it restores the base.
  OwnedWeights again = cbase;
  DeltaApplier second(cm, again.mut(), 5, StateDigest::full_scan(again.view()));
  second.apply(cdelta.frames[0]);
  EXPECT_EQ(errc_of([&] { second.apply(with_thresholds_at_the_top(1)); }), Errc::corrupt_frame);
  second.rollback();
  EXPECT_TRUE(again == cbase);
}

// Calls f(i) for every i in [0, total) from `threads` threads, each taking the next index.
template <class F>
void on_threads(unsigned threads, size_t total, F f) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < total;) f(i);
    });
  for (auto& th : pool) th.join();
}

// Several threads apply the chunks of one version at once, each chunk delivered twice (by two
// different threads): every chunk is applied exactly once, the rest refused as replays, and the
// result is bit-exact after verify; a rollback in the same setting restores the base exactly.
TEST_F(Fixture, ConcurrentApplyOfChunksIsExactlyOnceAndBitExact) {
  for (bool roll_back : {false, true}) {
    OwnedWeights target = base;
    auto applier = make_applier(target);
    std::atomic<int> applied{0}, replays{0}, other{0};
    on_threads(4, delta.frames.size() * 2, [&](size_t i) {  // every frame twice
      try {
        applier.apply(delta.frames[(i / 2 + (i % 2) * 3) % delta.frames.size()]);
        ++applied;
      } catch (const Error& e) {
        (e.code() == Errc::replayed ? replays : other)++;
      }
    });
    EXPECT_EQ(applied.load(), static_cast<int>(delta.frames.size()));
    EXPECT_EQ(replays.load(), static_cast<int>(delta.frames.size()));
    EXPECT_EQ(other.load(), 0);
    ASSERT_TRUE(applier.complete());
    applier.verify();
    if (roll_back) {
      applier.rollback();
      EXPECT_TRUE(target == base);
    } else {
      applier.commit();
      EXPECT_TRUE(target == next);
    }
  }
}

// rollback() racing with threads that apply chunks: it waits for writes in flight, and a final
// rollback always restores the base bit-exactly, whatever interleaving happened.
TEST_F(Fixture, RollbackDuringConcurrentApplyRestoresTheBase) {
  for (int round = 0; round < 20; ++round) {
    OwnedWeights target = base;
    auto applier = make_applier(target);
    std::thread appliers([&] {
      on_threads(3, delta.frames.size(), [&](size_t i) {
        try {
          applier.apply(delta.frames[i]);
        } catch (const Error& e) {
          ADD_FAILURE() << e.what();
        }
      });
    });
    std::this_thread::sleep_for(std::chrono::microseconds(50 * round));
    applier.rollback();
    appliers.join();
    applier.rollback();
    EXPECT_TRUE(target == base) << "round " << round;
    EXPECT_FALSE(applier.pending_version().has_value());
  }
}

}  // namespace
}  // namespace deltacast::codec
