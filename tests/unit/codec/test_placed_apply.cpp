// A placed receiver (codec/applier.h, PlacedWeights): deltas applied straight into buffers that
// hold only slices of the canonical tensors, verified against the seal's slice table. Every
// result is compared bit for bit with the reference slices of the producer's version
// (placement_reference.h builds them from multi-indices, not through the code under test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <xxhash.h>
#include <zstd.h>
#include "codec/frame_writer.h"
#include "codec/wire.h"
#include "codec_test_util.h"
#include "placement_reference.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

using testing::errc_of;
using testing::OwnedWeights;
using testing::slices_of;

std::vector<std::span<std::byte>> spans_of(std::vector<std::vector<std::byte>>& buffers) {
  std::vector<std::span<std::byte>> out;
  for (auto& b : buffers) out.emplace_back(b.data(), b.size());
  return out;
}

// One member: its placement, its buffers (the reference slices of the version it starts at) and
// its applier.
struct PlacedMember {
  std::shared_ptr<const Placement> placement;
  std::vector<std::vector<std::byte>> buffers;
  std::unique_ptr<DeltaApplier> applier;
  // `version` names the whole state `named` holds (what the producer says it is); the buffers take
  // their slices of `at` (the same, unless a test corrupts them).
  PlacedMember(const Manifest& m, std::shared_ptr<const Placement> p, const OwnedWeights& at, uint64_t version,
               const OwnedWeights* named = nullptr, DeltaApplier::Mode mode = DeltaApplier::Mode::in_place)
      : placement(std::move(p)), buffers(slices_of(*placement, m, at.bytes)) {
    auto spans = spans_of(buffers);
    auto digests = placed_part_digests(m, *placement, spans);
    applier = std::make_unique<DeltaApplier>(m, PlacedWeights{placement, spans}, version,
                                             StateDigest::full_scan((named ? *named : at).view()).combined(),
                                             std::move(digests), mode);
  }
  bool holds(const Manifest& m, const OwnedWeights& version) const {
    return buffers == slices_of(*placement, m, version.bytes);
  }
};

// base -> next for members whose placements `held` lists: chunk frames, then the seal with the
// slice table of every distinct slice they hold, which the encoder keeps up to date from the
// changes (two threads): checked here against a scan of the new version's slices.
EncodedDelta encode_for(const OwnedWeights& base, const OwnedWeights& next, std::shared_ptr<const HeldSlices> held,
                        VersionIds ids, uint64_t chunk_bytes) {
  EncodeOptions o;
  o.chunk_bytes = chunk_bytes;
  o.held_slices = held;
  o.base_slice_digests = slice_digests(base.view(), held->slices());
  o.threads = 2;
  EncodedDelta d = encode_delta(base.view(), next.view(), StateDigest::full_scan(base.view()), ids, o);
  EXPECT_EQ(parse_frame(d.frames.back()).slice_digests, slice_digests(next.view(), held->slices()))
      << "the slice table kept from the changes differs from a scan of the new version";
  return d;
}

std::shared_ptr<const HeldSlices> held_of(std::initializer_list<std::shared_ptr<const Placement>> placements) {
  auto held = std::make_shared<HeldSlices>();
  for (const auto& p : placements) held->add(*p);
  return held;
}

PlacementPart part(std::string tensor, uint32_t dim, uint64_t start, uint64_t stop) {
  return PlacementPart{std::move(tensor), dim, start, stop, std::nullopt};
}
std::shared_ptr<const Placement> compile(const Manifest& m, std::vector<BufferPlacement> buffers) {
  return std::make_shared<const Placement>(Placement::compile(m, std::move(buffers)));
}

// Special float bits a refit meets: NaN, +-inf, -0.0, subnormals.
void sprinkle_specials(OwnedWeights& w, std::mt19937_64& rng) {
  for (uint32_t t = 0; t < w.manifest->size(); ++t) {
    const auto& info = w.manifest->at(t);
    std::vector<uint32_t> specials;
    if (info.dtype == DType::bf16) specials = {0x7FC0, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x807F};
    if (info.dtype == DType::f32) specials = {0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x807FFFFF};
    if (specials.empty() || info.units() == 0) continue;
    const unsigned width = static_cast<unsigned>(dtype_unit_size(info.dtype));
    for (int k = 0; k < 6; ++k)
      testing::store_bits(w.bytes[t].data(), width, rng() % info.units(), specials[rng() % specials.size()]);
  }
}

// --- The property: random models, placements and versions -----------------------------------

// Staged (the apply gate): a committed version waits in the queue, the buffers untouched, until
// apply_next_staged writes it; versions may queue up. In place: each commit is in the buffers.
void placed_property(DeltaApplier::Mode mode, uint64_t seed) {
  const bool staged = mode == DeltaApplier::Mode::staged;
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t n) { return static_cast<uint64_t>(rng() % n); };
  const DType dtypes[] = {DType::bf16, DType::f32, DType::f64, DType::u8, DType::f16, DType::i32};
  const uint64_t dims[] = {1, 2, 3, 5, 8, 17, 40};
  int rolled_back = 0, tied = 0, partial_segments = 0, stacked = 0;  // stacked: a version staged on a queued one
  for (int trial = 0; trial < 120; ++trial) {
    const DType dtype = dtypes[pick(std::size(dtypes))];
    std::vector<TensorInfo> infos;
    for (uint64_t t = 0, count = 1 + pick(3); t < count; ++t) {
      std::vector<uint64_t> shape(1 + pick(3));
      for (auto& d : shape) d = dims[pick(std::size(dims))];
      infos.push_back({"t" + std::to_string(t), dtype, shape});
    }
    const Manifest m(infos);
    // Two members' placements: buffers of one to three parts sharing a dim (parts that do not fit
    // are dropped), some padded; a tensor may be placed twice.
    auto random_placement = [&] {
      std::vector<BufferPlacement> buffers;
      for (uint64_t b = 0, n = 1 + pick(3); b < n; ++b) {
        BufferPlacement spec{"b" + std::to_string(b), {}, false, {}, 0};
        const TensorInfo& lead = infos[pick(infos.size())];
        const uint32_t dim = static_cast<uint32_t>(pick(lead.shape.size()));
        for (uint64_t k = 0, parts = 1 + pick(3); k < parts; ++k) {
          const TensorInfo& t = k == 0 ? lead : infos[pick(infos.size())];
          if (t.shape.size() != lead.shape.size()) continue;
          const uint64_t start = pick(t.shape[dim]);
          spec.parts.push_back(part(t.name, dim, start, start + 1 + pick(t.shape[dim] - start)));
          try {
            Placement::compile(m, {spec});
          } catch (const Error&) {
            spec.parts.pop_back();
          }
        }
        if (pick(3) == 0) {
          spec.shape = Placement::compile(m, {spec}).shape(0);
          spec.shape[dim] += 1 + pick(3);
        }
        buffers.push_back(spec);
      }
      return compile(m, buffers);
    };
    const auto mine = random_placement();
    const auto other = random_placement();
    for (uint32_t t = 0; t < m.size(); ++t) tied += mine->parts_of(t) > 1;
    const auto held = held_of({mine, other});
    const uint64_t chunk_bytes = uint64_t{64} << pick(6);  // 64 B to 2 KiB: segments cut anywhere

    OwnedWeights base(m);
    testing::fill_random(base, rng);
    sprinkle_specials(base, rng);
    PlacedMember member(m, mine, base, 0, nullptr, mode);
    std::vector<OwnedWeights> queued;  // staged: committed versions not in the buffers yet, oldest first
    OwnedWeights in_buffers = base;
    auto drain_one = [&] {
      const uint64_t want = member.applier->buffers_version() + 1;  // versions stage one after another
      ASSERT_EQ(member.applier->apply_next_staged(), std::optional<uint64_t>(want));
      in_buffers = queued.front();
      queued.erase(queued.begin());
      ASSERT_TRUE(member.holds(m, in_buffers)) << "trial " << trial << ": a staged version written";
      ASSERT_NO_THROW(member.applier->audit());
    };
    for (uint64_t v = 0; v < 3; ++v) {
      OwnedWeights next = base;
      const double densities[] = {0.0, 0.01, 0.3, 1.0};
      testing::mutate(next, densities[pick(4)], rng, pick(4) == 0);
      const EncodedDelta d = encode_for(base, next, held, {v, v + 1}, chunk_bytes);
      std::vector<size_t> order(d.frames.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      for (const auto& f : d.frames)
        for (const auto& s : parse_frame(f).segments) {
          bool touched = false, whole = false;
          mine->for_each_run(s.tensor_index, s.element_begin, s.element_begin + s.element_count,
                             [&](const PlacedRun& r) {
                               touched = true;
                               whole = whole || r.count == s.element_count;
                             });
          partial_segments += touched && !whole && s.change_count > 0;
        }
      if (pick(3) == 0) {  // half of the frames, then a rollback: the base's slices again
        for (size_t i = 0; i < order.size() / 2; ++i) member.applier->apply(d.frames[order[i]]);
        member.applier->rollback();
        ASSERT_TRUE(member.holds(m, staged ? in_buffers : base))
            << "trial " << trial << " version " << v << ": rollback";
        ++rolled_back;
      }
      for (size_t i : order) member.applier->apply(d.frames[i]);
      ASSERT_NO_THROW(member.applier->verify()) << "trial " << trial << " version " << v;
      member.applier->commit();
      if (staged) {
        ASSERT_TRUE(member.holds(m, in_buffers)) << "trial " << trial << " version " << v << ": staged, not written";
        stacked += !queued.empty();
        queued.push_back(next);
        if (pick(2) == 0) drain_one();  // else it waits, and the next version stages on top of it
      } else {
        ASSERT_TRUE(member.holds(m, next)) << "trial " << trial << " version " << v;
        ASSERT_NO_THROW(member.applier->audit());
      }
      base.bytes = next.bytes;
    }
    while (!queued.empty()) drain_one();
    ASSERT_TRUE(member.holds(m, base)) << "trial " << trial;
  }
  EXPECT_GT(rolled_back, 30);
  EXPECT_GT(tied, 10);
  EXPECT_GT(partial_segments, 100);
  if (staged) {
    EXPECT_GT(stacked, 50);
  }
}

TEST(PlacedApplyProperty, EveryVersionLeavesExactlyTheProducersSlices) {
  placed_property(DeltaApplier::Mode::in_place, 20261206);
}

TEST(PlacedApplyProperty, StagedVersionsQueueAndEachWriteLeavesExactlyItsSlices) {
  placed_property(DeltaApplier::Mode::staged, 20261207);
}

// --- Class-coded segments: the common BF16 case --------------------------------------------------

struct ClassedModel : ::testing::Test {
  Manifest m{{{"w", DType::bf16, {512, 512}}, {"norm", DType::bf16, {512}}}};
  OwnedWeights base{m}, next{m};
  void SetUp() override {
    std::mt19937_64 rng(7);
    testing::fill_random(base, rng);  // norm; w is rewritten below
    // w: two exponents (two classes), the smaller one changing far more often, by one ulp.
    auto* w = reinterpret_cast<uint16_t*>(base.bytes[0].data());
    for (size_t i = 0; i < 512 * 512; ++i)
      w[i] = static_cast<uint16_t>((rng() % 8 == 0 ? 0x3800 : 0x3C00) | (rng() & 0x7F));
    next = base;
    auto* b = reinterpret_cast<uint16_t*>(next.bytes[0].data());
    for (size_t i = 0; i < 512 * 512; ++i)
      if (rng() % 1000 < ((w[i] & 0x7F80) == 0x3800 ? 150u : 5u)) b[i] = static_cast<uint16_t>(w[i] + 1);
  }
  // Rows 0:300 of w (and norm whole): a slice whose edge cuts the second 256 KiB chunk.
  std::shared_ptr<const Placement> rows() const {
    return compile(
        m, {{"w_rows", {part("w", 0, 0, 300)}, false, {}, 0}, {"norm", {part("norm", 0, 0, 512)}, false, {}, 0}});
  }
  // Columns 128:256 of w.
  std::shared_ptr<const Placement> columns() const {
    return compile(m, {{"w_cols", {part("w", 1, 128, 256)}, false, {}, 0}});
  }
  static size_t classed_segments(const EncodedDelta& d) {
    return d.stats.segments_by_coding[static_cast<int>(LocationCoding::classed_gaps)];
  }
};

TEST_F(ClassedModel, RowAndColumnMembersTheProducerKnowsApplyExactly) {
  const auto r = rows(), c = columns();
  const EncodedDelta d = encode_for(base, next, held_of({r, c}), {0, 1}, uint64_t{256} << 10);
  PlacedMember row_member(m, r, base, 0), column_member(m, c, base, 0);
  for (auto* member : {&row_member, &column_member}) {
    for (const auto& f : d.frames) member->applier->apply(f);
    member->applier->verify();
    member->applier->commit();
    EXPECT_TRUE(member->holds(m, next));
  }
  // The chunk wholly inside the row slice stayed classed (the member wrote it with the classed
  // writer, based in its buffer); the column slice's segments are not classed.
  const EncodedDelta rows_only = encode_for(base, next, held_of({r}), {0, 1}, uint64_t{256} << 10);
  EXPECT_GE(classed_segments(rows_only), 1u);
  EXPECT_EQ(classed_segments(d), 0u);
}

TEST_F(ClassedModel, AMemberTheProducerDoesNotKnowRefusesAPartlyHeldClassedSegmentWritingNothing) {
  const auto r = rows();
  // The producer knows another member only (a column slice of norm's size): it codes w by class.
  const auto stranger = compile(m, {{"n", {part("norm", 0, 0, 100)}, false, {}, 0}});
  const EncodedDelta d = encode_for(base, next, held_of({stranger}), {0, 1}, uint64_t{256} << 10);
  ASSERT_GE(classed_segments(d), 2u);
  PlacedMember member(m, r, base, 0);
  const auto before = member.buffers;
  bool refused = false;
  for (size_t i = 0; i + 1 < d.frames.size(); ++i) {
    const Errc e = errc_of([&] { member.applier->apply(d.frames[i]); });
    if (e == Errc::unsupported)
      refused = true;
    else
      EXPECT_EQ(e, Errc::ok);
  }
  EXPECT_TRUE(refused);
  member.applier->rollback();
  EXPECT_EQ(member.buffers, before);
}

TEST_F(ClassedModel, ATensorHeldTwiceIsWrittenAndRolledBackInBothCopies) {
  // w whole in one buffer and rows 100:400 in another (classed segments: the whole copy is written
  // by the classed writer and the slice mirrors it; partly held segments by positions).
  const auto twice =
      compile(m, {{"w", {part("w", 0, 0, 512)}, false, {}, 0}, {"w_part", {part("w", 0, 100, 400)}, false, {}, 0}});
  const EncodedDelta d = encode_for(base, next, held_of({twice}), {0, 1}, 64 * 1024);
  PlacedMember member(m, twice, base, 0);
  const auto before = member.buffers;
  for (size_t i = 0; i + 2 < d.frames.size(); ++i) member.applier->apply(d.frames[i]);
  EXPECT_NE(member.buffers, before);
  member.applier->rollback();
  EXPECT_EQ(member.buffers, before);
  for (const auto& f : d.frames) member.applier->apply(f);
  member.applier->verify();
  member.applier->commit();
  EXPECT_TRUE(member.holds(m, next));
  member.applier->audit();
}

// --- Verification of a slice ------------------------------------------------------------------------

TEST_F(ClassedModel, AWrongBitInTheMembersShardFailsVerifyNamingTheSlice) {
  const auto r = rows();
  const EncodedDelta d = encode_for(base, next, held_of({r}), {0, 1}, uint64_t{256} << 10);
  OwnedWeights corrupt = base;
  corrupt.bytes[0][2 * 512 * 299 + 7] ^= std::byte{0x01};  // row 299: the slice's last row
  PlacedMember member(m, r, corrupt, 0, &base);
  for (const auto& f : d.frames) member.applier->apply(f);
  try {
    member.applier->verify();
    FAIL() << "verify passed over a wrong bit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::verify_failed);
    EXPECT_NE(std::string(e.what()).find("slice 0:300 along dim 0 of tensor 'w'"), std::string::npos) << e.what();
  }
  member.applier->rollback();
  EXPECT_TRUE(member.holds(m, corrupt));
}

TEST_F(ClassedModel, ASealWithoutTheMembersSliceFailsVerify) {
  const auto r = rows();
  EncodedDelta d = encode_for(base, next, held_of({r}), {0, 1}, uint64_t{256} << 10);
  d.frames.back() =
      seal_frame(m, {0, 1}, d.base_digest.combined(), static_cast<uint32_t>(d.frames.size() - 1), d.new_digest);
  PlacedMember member(m, r, base, 0);
  for (const auto& f : d.frames) member.applier->apply(f);
  try {
    member.applier->verify();
    FAIL() << "verify passed without a slice digest";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::verify_failed);
    EXPECT_NE(std::string(e.what()).find("carries no digest"), std::string::npos) << e.what();
  }
}

TEST_F(ClassedModel, AVersionChangingNothingInTheSliceCommitsAndTheNextAppliesOnIt) {
  // v1 changes only rows 400.. of w: nothing the row member holds.
  OwnedWeights v1 = base;
  auto* w1 = reinterpret_cast<uint16_t*>(v1.bytes[0].data());
  for (size_t i = 400 * 512; i < 512 * 512; i += 7) w1[i] = static_cast<uint16_t>(w1[i] + 1);
  const auto r = rows();
  const auto held = held_of({r});
  PlacedMember member(m, r, base, 0);
  const auto before = member.buffers;
  const EncodedDelta d1 = encode_for(base, v1, held, {0, 1}, uint64_t{256} << 10);
  for (const auto& f : d1.frames) member.applier->apply(f);
  member.applier->verify();
  member.applier->commit();
  EXPECT_EQ(member.buffers, before);
  EXPECT_TRUE(member.holds(m, v1));
  // v2 on top of v1 (its frames name v1's whole state as their base).
  const EncodedDelta d2 = encode_for(v1, next, held, {1, 2}, uint64_t{256} << 10);
  for (const auto& f : d2.frames) member.applier->apply(f);
  member.applier->verify();
  member.applier->commit();
  EXPECT_TRUE(member.holds(m, next));
}

TEST_F(ClassedModel, ReplaysAndWrongBasesAreRefusedWritingNothing) {
  const auto r = rows();
  const EncodedDelta d = encode_for(base, next, held_of({r}), {0, 1}, uint64_t{256} << 10);
  PlacedMember member(m, r, base, 0);
  member.applier->apply(d.frames[0]);
  const auto after_one = member.buffers;
  EXPECT_EQ(errc_of([&] { member.applier->apply(d.frames[0]); }), Errc::replayed);
  EXPECT_EQ(member.buffers, after_one);
  OwnedWeights other = base;
  other.bytes[1][0] ^= std::byte{1};
  const EncodedDelta wrong = encode_for(other, next, held_of({r}), {0, 1}, uint64_t{256} << 10);
  member.applier->rollback();
  EXPECT_EQ(errc_of([&] { member.applier->apply(wrong.frames[0]); }), Errc::version_mismatch);
  EXPECT_TRUE(member.holds(m, base));
}

TEST_F(ClassedModel, BuffersThatDoNotMatchThePlacementAreRefused) {
  const auto r = rows();
  auto buffers = slices_of(*r, m, base.bytes);
  auto spans = spans_of(buffers);
  const auto digests = placed_part_digests(m, *r, spans);
  auto make = [&](std::vector<std::span<std::byte>> s, std::vector<uint64_t> dg, DeltaApplier::Mode mode) {
    return errc_of([&] { DeltaApplier a(m, PlacedWeights{r, std::move(s)}, 0, 0, std::move(dg), mode); });
  };
  EXPECT_EQ(make(spans, digests, DeltaApplier::Mode::in_place), Errc::ok);
  EXPECT_EQ(make({spans[0]}, digests, DeltaApplier::Mode::in_place), Errc::invalid_argument);
  EXPECT_EQ(make({spans[0].first(spans[0].size() - 2), spans[1]}, digests, DeltaApplier::Mode::in_place),
            Errc::invalid_argument);
  EXPECT_EQ(make({spans[0].subspan(1, spans[0].size() - 2), spans[1]}, digests, DeltaApplier::Mode::in_place),
            Errc::invalid_argument);  // odd-aligned
  EXPECT_EQ(make(spans, {digests[0]}, DeltaApplier::Mode::in_place), Errc::invalid_argument);
  EXPECT_EQ(make(spans, digests, DeltaApplier::Mode::staged), Errc::ok);
  // Re-pointing a placed buffer is not built: refused, nothing changed.
  DeltaApplier a(m, PlacedWeights{r, spans}, 0, 0, digests);
  EXPECT_EQ(errc_of([&] { a.rebind(0, spans[0]); }), Errc::unsupported);
}

// --- The location index ---------------------------------------------------------------------------

// A chunk frame rebuilt with its location index replaced by `index` (other streams as they were).
std::vector<std::byte> with_location_index(const std::vector<std::byte>& frame, const std::vector<std::byte>& index) {
  const FrameView v = parse_frame(frame);
  std::vector<std::pair<StreamId, std::vector<std::byte>>> streams;
  for (const auto& sec : v.sections) {
    if (sec.stream == StreamId::location_index) continue;
    std::vector<std::byte> raw(sec.raw_size);
    const auto stored = v.bytes.subspan(sec.offset, sec.stored_size);
    if (sec.codec == SectionCodec::raw)
      std::memcpy(raw.data(), stored.data(), stored.size());
    else
      EXPECT_EQ(ZSTD_decompress(raw.data(), raw.size(), stored.data(), stored.size()), raw.size());
    streams.emplace_back(sec.stream, std::move(raw));
  }
  streams.emplace_back(StreamId::location_index, index);
  std::sort(streams.begin(), streams.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  return build_chunk_frame(v.header, v.segments, std::move(streams), 1);
}
// The index entries of a frame (decoded from its section).
std::vector<uint64_t> index_of(const std::vector<std::byte>& frame) {
  const FrameView v = parse_frame(frame);
  for (const auto& sec : v.sections)
    if (sec.stream == StreamId::location_index) {
      std::vector<std::byte> raw(sec.raw_size);
      const auto stored = v.bytes.subspan(sec.offset, sec.stored_size);
      if (sec.codec == SectionCodec::raw)
        std::memcpy(raw.data(), stored.data(), stored.size());
      else
        ZSTD_decompress(raw.data(), raw.size(), stored.data(), stored.size());
      ByteReader r(raw, "index");
      std::vector<uint64_t> out;
      while (!r.at_end()) out.push_back(r.leb128());
      return out;
    }
  return {};
}
std::vector<std::byte> index_bytes(const std::vector<uint64_t>& entries) {
  std::vector<std::byte> out;
  for (uint64_t e : entries) ByteWriter(out).leb128(e);
  return out;
}

TEST_F(ClassedModel, TheLocationIndexIsWrittenForSlicedFleetsAndEveryReceiverChecksIt) {
  const auto r = rows();
  EncodeOptions plain;
  plain.chunk_bytes = uint64_t{256} << 10;
  const EncodedDelta whole_fleet =
      encode_delta(base.view(), next.view(), StateDigest::full_scan(base.view()), {0, 1}, plain);
  EXPECT_TRUE(index_of(whole_fleet.frames[0]).empty()) << "no sliced member: today's frames";
  const EncodedDelta d = encode_for(base, next, held_of({r}), {0, 1}, uint64_t{256} << 10);
  const auto entries = index_of(d.frames[1]);
  ASSERT_EQ(entries.size(), parse_frame(d.frames[1]).segments.size());
  // The frame rebuilt with its own index applies; a wrong length, an entry too many or too few is
  // refused by a whole receiver and by a placed one, neither writing anything.
  ASSERT_EQ(with_location_index(d.frames[1], index_bytes(entries)), d.frames[1]);
  auto off = entries;
  off[0] += 1;
  auto more = entries;
  more.push_back(0);
  auto fewer = entries;
  fewer.pop_back();
  for (const auto& bad : {off, more, fewer}) {
    const auto frame = with_location_index(d.frames[1], index_bytes(bad));
    OwnedWeights target = base;
    DeltaApplier whole(m, target.mut(), 0, StateDigest::full_scan(base.view()));
    EXPECT_EQ(errc_of([&] { whole.apply(frame); }), Errc::corrupt_frame);
    EXPECT_TRUE(target == base);
    PlacedMember member(m, r, base, 0);
    EXPECT_EQ(errc_of([&] { member.applier->apply(frame); }), Errc::corrupt_frame);
    EXPECT_TRUE(member.holds(m, base));
  }
}

// --- The seal's slice table on the wire ------------------------------------------------------------

TEST_F(ClassedModel, ASliceTableNamingNoSliceOfTheModelIsRefusedBeforeEncoding) {
  for (const SliceDigest& bad : {SliceDigest{2, 0, 0, 1, 0}, SliceDigest{0, 1, 0, 513, 0}, SliceDigest{0, 2, 0, 1, 0},
                                 SliceDigest{1, 0, 7, 7, 0}}) {
    EncodeOptions o;
    o.base_slice_digests = {bad};
    EXPECT_EQ(errc_of([&] {
                DeltaEncoder(base.view(), next.view(), StateDigest::full_scan(base.view()), {0, 1}, o);
              }),
              Errc::invalid_argument)
        << bad.tensor << " " << bad.dim << " " << bad.start << ":" << bad.stop;
  }
  // A column slice whose stripes the changes skip: the deltas of the rows that change only.
  EncodeOptions o;
  const std::vector<SliceDigest> slices = {{0, 1, 500, 512, 0}, {0, 0, 511, 512, 0}, {1, 0, 0, 512, 0}};
  o.base_slice_digests = slice_digests(base.view(), slices);
  const EncodedDelta d = encode_delta(base.view(), next.view(), StateDigest::full_scan(base.view()), {0, 1}, o);
  EXPECT_EQ(parse_frame(d.frames.back()).slice_digests, slice_digests(next.view(), slices));
  EXPECT_NE(slice_digests(next.view(), slices)[0], o.base_slice_digests[0]) << "the column slice changed";
}

TEST(SealSliceTable, RoundTripsAndMalformedTablesAreRefused) {
  FrameHeader h;
  h.new_version = 1;
  h.chunk_count = 3;
  const std::vector<uint64_t> tensors = {11, 22};
  EXPECT_EQ(build_seal_frame(h, tensors), build_seal_frame(h, tensors, {}));  // no table: today's bytes
  const std::vector<SliceDigest> slices = {{0, 1, 4, 8, 0xABCD}, {1, 0, 0, 3, 0x1234}};
  auto frame = build_seal_frame(h, tensors, slices);
  const FrameView v = parse_frame(frame);
  EXPECT_EQ(v.tensor_digests, tensors);
  EXPECT_EQ(v.slice_digests, slices);
  // Each entry field changed to something no slice of this model is: refused.
  auto refused = [&](std::vector<SliceDigest> bad) {
    return errc_of([&] { parse_frame(build_seal_frame(h, tensors, bad)); });
  };
  EXPECT_EQ(refused({{2, 0, 0, 1, 0}}), Errc::corrupt_frame);  // tensor 2 of 2
  EXPECT_EQ(refused({{0, 0, 5, 5, 0}}), Errc::corrupt_frame);  // empty
  // A count that does not match the table's size (checksum re-sealed).
  auto bad = frame;
  bad[kFrameHeaderSize + 16] = std::byte{3};
  store_le<uint64_t>(bad.data() + bad.size() - 8, XXH3_64bits(bad.data(), bad.size() - 8));
  EXPECT_EQ(errc_of([&] { parse_frame(bad); }), Errc::corrupt_frame);
}

}  // namespace
}  // namespace deltacast::codec
