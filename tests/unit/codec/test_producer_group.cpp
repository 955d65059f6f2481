// A producer group at the codec level (codec/partition.h, EncodePart): the partition gives every
// unit to exactly one rank, deterministically and balanced; M ranks that each read and encode only
// their part produce frames that, with the coordinator's seal, take a receiver to the new
// version's exact bits, for M = 1..8, every dtype and the special values; one rank's frames
// missing leave a version that never completes and rolls back to the base bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "codec/applier.h"
#include "codec/digest.h"
#include "codec/encoder.h"
#include "codec/frame.h"
#include "codec/partition.h"
#include "tests/unit/codec/codec_test_util.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

using testing::OwnedWeights;

// A WeightsReader over weights in memory that serves one rank's part only: a read outside the
// part's ranges fails the test (a rank holds nothing else).
struct PartReader final : WeightsReader {
  const OwnedWeights& w;
  std::vector<PartRange> ranges;
  PartReader(const OwnedWeights& weights, std::vector<PartRange> part) : w(weights), ranges(std::move(part)) {}
  const Manifest& manifest() const noexcept override { return *w.manifest; }
  void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const override {
    const uint64_t width = dtype_unit_size(w.manifest->at(tensor).dtype);
    const uint64_t first = offset / width, end = (offset + out.size()) / width;
    const bool inside = std::any_of(ranges.begin(), ranges.end(), [&](const PartRange& r) {
      return r.tensor == tensor && r.begin <= first && end <= r.end;
    });
    if (!inside || offset % width != 0 || out.size() % width != 0)
      throw std::logic_error("read of units [" + std::to_string(first) + ", " + std::to_string(end) + ") of tensor " +
                             std::to_string(tensor) + ": outside the rank's part");
    if (!out.empty()) std::memcpy(out.data(), w.bytes[tensor].data() + offset, out.size());
  }
};

// Random manifests: every dtype, odd and empty shapes, sometimes one tensor far above the others.
Manifest random_manifest(std::mt19937_64& rng, int tensors) {
  static const DType kTypes[] = {DType::bf16, DType::f16, DType::f32,   DType::f8_e4m3, DType::f8_e5m2,
                                 DType::i8,   DType::u8,  DType::bool_, DType::u16,     DType::i16,
                                 DType::u32,  DType::i32, DType::u64,   DType::i64,     DType::f64};
  std::vector<TensorInfo> list;
  for (int i = 0; i < tensors; ++i) {
    const DType dt = kTypes[rng() % std::size(kTypes)];
    uint64_t n = rng() % 5 == 0 ? 0 : 1 + rng() % 20000;
    if (rng() % 7 == 0) n = 100000 + rng() % 300000;
    list.push_back({"t" + std::to_string(i), dt, {n}});
  }
  return Manifest(std::move(list));
}

// Checks that every unit of every tensor is in exactly one part, and that parts are in manifest
// order; returns each part's bytes.
void expect_exact_cover(const Manifest& m, const Partition& p) {
  std::vector<std::vector<PartRange>> by_tensor(m.size());
  uint64_t bytes = 0;
  for (uint32_t r = 0; r < p.ranks(); ++r) {
    const auto& part = p.part(r);
    uint64_t part_bytes = 0;
    for (size_t i = 0; i < part.size(); ++i) {
      ASSERT_LT(part[i].begin, part[i].end) << "an empty range in rank " << r;
      if (i > 0) {
        ASSERT_TRUE(part[i - 1].tensor < part[i].tensor ||
                    (part[i - 1].tensor == part[i].tensor && part[i - 1].end < part[i].begin))
            << "rank " << r << ": ranges out of manifest order or not merged";
      }
      by_tensor[part[i].tensor].push_back(part[i]);
      part_bytes += part[i].units() * dtype_unit_size(m.at(part[i].tensor).dtype);
    }
    EXPECT_EQ(part_bytes, p.part_bytes(r));
    bytes += part_bytes;
  }
  EXPECT_EQ(bytes, m.total_bytes());
  for (uint32_t t = 0; t < m.size(); ++t) {
    auto& ranges = by_tensor[t];
    std::sort(ranges.begin(), ranges.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
    uint64_t covered = 0;
    for (const auto& r : ranges) {
      ASSERT_EQ(r.begin, covered) << "tensor " << t << ": a gap or an overlap at unit " << covered;
      covered = r.end;
    }
    ASSERT_EQ(covered, m.at(t).units()) << "tensor " << t;
  }
}

TEST(Partition, EveryUnitBelongsToExactlyOneRankDeterministicallyAndBalanced) {
  std::mt19937_64 rng(21);
  for (int round = 0; round < 30; ++round) {
    const Manifest m = random_manifest(rng, 1 + static_cast<int>(rng() % 60));
    uint64_t largest_unit = 1;
    for (const auto& t : m.tensors()) largest_unit = std::max<uint64_t>(largest_unit, dtype_unit_size(t.dtype));
    for (uint32_t ranks = 1; ranks <= 8; ++ranks) {
      SCOPED_TRACE("round " + std::to_string(round) + ", " + std::to_string(ranks) + " ranks");
      const Partition p = Partition::balanced(m, ranks);
      ASSERT_EQ(p.ranks(), ranks);
      expect_exact_cover(m, p);
      // Deterministic, and the same partition when its parts are given back as a layout.
      const Partition again = Partition::balanced(m, ranks);
      EXPECT_EQ(again.fingerprint(), p.fingerprint());
      std::vector<std::vector<PartRange>> parts;
      for (uint32_t r = 0; r < ranks; ++r) {
        EXPECT_EQ(again.part(r), p.part(r));
        parts.push_back(p.part(r));
      }
      std::shuffle(parts[0].begin(), parts[0].end(), rng);
      EXPECT_EQ(Partition::from_parts(m, parts).fingerprint(), p.fingerprint());
      // Largest first onto the least loaded: no rank exceeds the fair share by more than one
      // piece, and a piece is at most a fair share (plus the alignment of a cut).
      const uint64_t fair = (m.total_bytes() + ranks - 1) / ranks;
      for (uint32_t r = 0; r < ranks; ++r)
        EXPECT_LE(p.part_bytes(r), 2 * fair + kPartAlignUnits * largest_unit) << "rank " << r;
      if (ranks > 1) {
        EXPECT_NE(p.fingerprint(), Partition::balanced(m, ranks - 1).fingerprint());
      }
    }
  }
}

TEST(Partition, ThePartsDigestsAddUpToTheFullScanReadingOnlyTheirOwnTensors) {
  std::mt19937_64 rng(22);
  for (int round = 0; round < 6; ++round) {
    const Manifest m = random_manifest(rng, 1 + static_cast<int>(rng() % 30));
    OwnedWeights w(m);
    for (auto& b : w.bytes)
      for (auto& x : b) x = static_cast<std::byte>(rng());
    const StateDigest full = StateDigest::full_scan(w.view(), 2);
    for (uint32_t ranks : {1u, 3u, 8u}) {
      const Partition p = Partition::balanced(m, ranks);
      std::vector<uint64_t> sum(m.size(), 0);
      for (uint32_t r = 0; r < ranks; ++r) {
        // A rank's weights hold its part's tensors only: the others are empty spans.
        ConstWeights mine{&m, std::vector<std::span<const std::byte>>(m.size())};
        for (const auto& x : p.part(r)) mine.tensors[x.tensor] = w.view().tensors[x.tensor];
        const auto part = StateDigest::part_scan(mine, p.part(r), 1 + r % 3).per_tensor();
        for (size_t t = 0; t < m.size(); ++t) sum[t] += part[t];
      }
      EXPECT_EQ(StateDigest(sum), full) << "round " << round << ", " << ranks << " ranks";
    }
  }
  // A tensor of the part that is not whole is refused.
  const Manifest m({{"a", DType::bf16, {100}}});
  ConstWeights short_weights{&m, {std::span<const std::byte>()}};
  EXPECT_THROW(StateDigest::part_scan(short_weights, std::vector<PartRange>{{0, 0, 100}}), Error);
}

TEST(Partition, ATensorLargerThanAFairShareIsCutOnAlignedUnitsAndTheRanksEvenOut) {
  std::vector<TensorInfo> list{{"embed", DType::bf16, {50000, 1024}}};  // 100 MB: most of the model
  for (int i = 0; i < 40; ++i) list.push_back({"layer" + std::to_string(i), DType::bf16, {1000, 257}});
  const Manifest m(std::move(list));
  for (uint32_t ranks : {2u, 4u, 7u}) {
    const Partition p = Partition::balanced(m, ranks);
    expect_exact_cover(m, p);
    int embed_ranges = 0;
    for (uint32_t r = 0; r < ranks; ++r)
      for (const auto& x : p.part(r))
        if (x.tensor == 0) {
          ++embed_ranges;
          EXPECT_EQ(x.begin % kPartAlignUnits, 0u);
          EXPECT_TRUE(x.end % kPartAlignUnits == 0 || x.end == m.at(0).units());
        }
    EXPECT_GE(embed_ranges, static_cast<int>(ranks) - 1) << ranks << " ranks";
    const double fair = static_cast<double>(m.total_bytes()) / ranks;
    for (uint32_t r = 0; r < ranks; ++r)
      EXPECT_NEAR(static_cast<double>(p.part_bytes(r)) / fair, 1.0, 0.1) << p.describe(m);
  }
}

TEST(Partition, ALayoutThatClaimsAUnitTwiceOrNeverIsRefusedNamingTheTensorAndRanks) {
  const Manifest m({{"a", DType::bf16, {100}}, {"b", DType::f32, {10}}, {"c", DType::i64, {4}}});
  auto refusal = [&](std::vector<std::vector<PartRange>> parts) -> std::string {
    try {
      Partition::from_parts(m, std::move(parts));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      return e.what();
    }
    ADD_FAILURE() << "accepted";
    return "";
  };
  // c has 8 units (two per i64 element).
  EXPECT_EQ(refusal({{{0, 0, 100}, {1, 0, 10}}, {{1, 5, 10}, {2, 0, 8}}}),
            "units [5, 10) of tensor 'b' are claimed by ranks 0 and 1");
  EXPECT_EQ(refusal({{{0, 0, 60}, {1, 0, 10}}, {{0, 70, 100}, {2, 0, 8}}}),
            "units [60, 70) of tensor 'a' are claimed by no rank");
  EXPECT_EQ(refusal({{{0, 0, 100}, {1, 0, 10}}, {{2, 0, 4}}}), "units [4, 8) of tensor 'c' are claimed by no rank");
  EXPECT_EQ(refusal({{{0, 0, 100}, {1, 0, 10}, {1, 0, 3}, {2, 0, 8}}}),
            "units [0, 3) of tensor 'b' are claimed twice by rank 0");
  EXPECT_EQ(refusal({{{0, 0, 101}, {1, 0, 10}, {2, 0, 8}}}),
            "rank 0 claims units [0, 101) of tensor 'a', which has 100 units");
  EXPECT_NE(refusal({{{0, 0, 100}, {1, 0, 10}, {3, 0, 1}}}).find("tensor index 3"), std::string::npos);
  EXPECT_EQ(refusal({{{0, 0, 100}, {1, 0, 10}, {2, 0, 3}}, {{2, 3, 8}}}),
            "rank 0 claims units [0, 3) of tensor 'c', which splits an element (2 units each)");
  EXPECT_EQ(refusal({}), "a producer group needs at least one rank");
  EXPECT_THROW(Partition::balanced(m, 0), Error);
  // A layout that covers everything is taken as given, empty ranges dropped.
  const Partition p = Partition::from_parts(m, {{{2, 0, 8}, {0, 50, 100}, {1, 3, 3}}, {{1, 0, 10}, {0, 0, 50}}});
  EXPECT_EQ(p.part(0), (std::vector<PartRange>{{0, 50, 100}, {2, 0, 8}}));
  EXPECT_EQ(p.part_bytes(0), 50u * 2 + 8u * 4);
}

// Base and new weights covering every dtype with NaN, ±inf, -0.0 and subnormals planted; one
// tensor all changed, one unchanged, one empty, odd sizes, one tensor a rank must cut.
struct Versions {
  Manifest m;
  OwnedWeights base, next;
  explicit Versions(uint64_t seed)
      : m({{"embed", DType::bf16, {300001}},
           {"f16", DType::f16, {4099}},
           {"f32", DType::f32, {7001}},
           {"f64", DType::f64, {1003}},
           {"i64", DType::i64, {517}},
           {"e4m3", DType::f8_e4m3, {2049}},
           {"e5m2", DType::f8_e5m2, {333}},
           {"flags", DType::bool_, {65}},
           {"u8", DType::u8, {4097}},
           {"i32", DType::i32, {129}},
           {"empty", DType::bf16, {0}},
           {"all_changed", DType::bf16, {20011}},
           {"unchanged", DType::f32, {3001}}}),
        base(m),
        next(m) {
    std::mt19937_64 rng(seed);
    testing::fill_random(base, rng);
    const uint32_t f32_special[] = {0x7FC00001, 0xFFC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x807FFFFF};
    for (size_t i = 0; i < std::size(f32_special); ++i)
      testing::store_bits(base.bytes[2].data(), 4, i * 97, f32_special[i]);
    const uint32_t bf16_special[] = {0x7FC1, 0xFF80, 0x7F80, 0x8000, 0x0001, 0x807F};
    for (size_t i = 0; i < std::size(bf16_special); ++i)
      testing::store_bits(base.bytes[0].data(), 2, i * 4001, bf16_special[i]);
    next = base;
    testing::mutate(next, 0.01, rng);
    // Special values as new bits too.
    for (size_t i = 0; i < std::size(f32_special); ++i)
      testing::store_bits(next.bytes[2].data(), 4, 5 + i * 89, f32_special[std::size(f32_special) - 1 - i]);
    for (uint64_t i = 0; i < m.at(11).units(); ++i) {
      const uint32_t old = testing::load_bits(base.bytes[11].data(), 2, i);
      testing::store_bits(next.bytes[11].data(), 2, i, old ^ (1 + (rng() & 0x7FFF)));
    }
    next.bytes[12] = base.bytes[12];
  }
};

struct GroupVersion {
  std::vector<std::vector<std::byte>> frames;  // every rank's chunk frames
  std::vector<std::byte> seal;                 // the coordinator's
  std::vector<uint32_t> rank_of_frame;
  StateDigest base_sum, next_sum;
  std::vector<SliceDigest> slices;  // options.base_slice_digests with every part's deltas added
};

// Rank `part`'s digest of `w`: per tensor, the sums over its ranges (what its BaselineStore keeps).
std::vector<uint64_t> part_digest(const OwnedWeights& w, const std::vector<PartRange>& part) {
  std::vector<uint64_t> sums(w.manifest->size(), 0);
  for (const auto& r : part) {
    const auto& info = w.manifest->at(r.tensor);
    const uint64_t width = dtype_unit_size(info.dtype);
    sums[r.tensor] += slice_digest(r.tensor, info.dtype, r.begin,
                                   std::span(w.bytes[r.tensor]).subspan(r.begin * width, r.units() * width));
  }
  return sums;
}

// Encodes base -> next as `ranks` producer ranks, each reading only its part; with `known_base`
// each rank gives its part's base digest instead of letting the scan take it.
GroupVersion encode_group(const Versions& v, uint32_t ranks, const EncodeOptions& options, bool known_base = false) {
  const Partition partition = Partition::balanced(v.m, ranks);
  const GroupChunks numbering = group_chunks(v.m, partition, options.chunk_bytes);
  const uint64_t base_combined = StateDigest::full_scan(v.base.view()).combined();
  GroupVersion out;
  std::vector<uint64_t> base_sum(v.m.size(), 0), next_sum(v.m.size(), 0);
  for (uint32_t r = 0; r < ranks; ++r) {
    const PartReader base(v.base, partition.part(r)), next(v.next, partition.part(r));
    EncodePart part = numbering.part(partition, r, base_combined);
    if (known_base) part.base_digest = part_digest(v.base, partition.part(r));
    DeltaEncoder encoder(base, next, part, {4, 5}, options);
    EXPECT_EQ(encoder.chunk_count(), numbering.first[r + 1] - numbering.first[r]);
    for (uint32_t c = 0; c < encoder.chunk_count(); ++c) {
      out.frames.push_back(encoder.encode_chunk(c));
      out.rank_of_frame.push_back(r);
    }
    const auto digests = encoder.part_digests();
    for (uint32_t t = 0; t < v.m.size(); ++t) {
      base_sum[t] += digests.base.per_tensor()[t];
      next_sum[t] += digests.next.per_tensor()[t];
    }
    EXPECT_EQ(digests.slice_deltas.size(), options.base_slice_digests.size());
    if (out.slices.empty()) out.slices = options.base_slice_digests;
    for (size_t k = 0; k < digests.slice_deltas.size(); ++k) out.slices[k].digest += digests.slice_deltas[k];
  }
  out.base_sum = StateDigest(base_sum);
  out.next_sum = StateDigest(next_sum);
  out.seal = seal_frame(v.m, {4, 5}, base_combined, numbering.total(), out.next_sum, out.slices);
  return out;
}

TEST(ProducerGroup, ThePartsSliceDeltasAddUpToTheNewVersionsSliceTable) {
  const Versions v(33);
  EncodeOptions options;
  options.chunk_bytes = 16 << 10;  // parts and chunks cut the slices anywhere
  const std::vector<SliceDigest> slices = {
      {0, 0, 1000, 250000, 0}, {3, 0, 0, 1003, 0}, {4, 0, 1, 2, 0}, {8, 0, 4000, 4097, 0}, {11, 0, 5, 20011, 0}};
  options.base_slice_digests = slice_digests(v.base.view(), slices);
  const auto want = slice_digests(v.next.view(), slices);
  ASSERT_NE(want, options.base_slice_digests);
  for (uint32_t ranks = 1; ranks <= 8; ++ranks) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const GroupVersion g = encode_group(v, ranks, options);
    EXPECT_EQ(g.slices, want);
    EXPECT_EQ(parse_frame(g.seal).slice_digests, want);
  }
}

TEST(ProducerGroup, ForOneToEightRanksTheReceiverEndsWithTheNewVersionsBitsExactly) {
  const Versions v(31);
  EncodeOptions options;
  options.chunk_bytes = 64 << 10;
  const StateDigest base_digest = StateDigest::full_scan(v.base.view());
  const StateDigest next_digest = StateDigest::full_scan(v.next.view());
  std::mt19937_64 rng(32);
  for (uint32_t ranks = 1; ranks <= 8; ++ranks) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    GroupVersion g = encode_group(v, ranks, options);
    // A rank that knows its part's base digest gives the same frames and digests without the scan.
    const GroupVersion known = encode_group(v, ranks, options, true);
    EXPECT_TRUE(known.frames == g.frames);
    EXPECT_TRUE(known.seal == g.seal);
    EXPECT_EQ(known.base_sum, g.base_sum);
    EXPECT_EQ(g.base_sum, base_digest) << "the parts' base digests add up to the whole base's";
    EXPECT_EQ(g.next_sum, next_digest) << "the parts' new digests add up to the whole new version's";
    if (ranks == 1) {
      // One rank is a single producer: the same frames, byte for byte.
      const auto single = encode_delta(v.base.view(), v.next.view(), base_digest, {4, 5}, options);
      ASSERT_EQ(single.frames.size(), g.frames.size() + 1);
      for (size_t i = 0; i < g.frames.size(); ++i) EXPECT_TRUE(single.frames[i] == g.frames[i]) << "frame " << i;
      EXPECT_TRUE(single.frames.back() == g.seal);
    }
    // The ranks' frames arrive interleaved, in any order, the seal among them.
    std::vector<std::vector<std::byte>> arrivals = g.frames;
    arrivals.push_back(g.seal);
    std::shuffle(arrivals.begin(), arrivals.end(), rng);
    OwnedWeights receiver = v.base;
    DeltaApplier applier(v.m, receiver.mut(), 4, base_digest);
    for (const auto& f : arrivals) applier.apply(f);
    ASSERT_TRUE(applier.complete());
    applier.verify();
    applier.commit();
    EXPECT_TRUE(receiver == v.next) << "the receiver's bits differ from the new version's";
    EXPECT_EQ(StateDigest::full_scan(receiver.view()), next_digest);
  }
}

TEST(ProducerGroup, WithoutOneRanksFramesTheVersionNeverCompletesAndRollsBackExactly) {
  const Versions v(41);
  EncodeOptions options;
  options.chunk_bytes = 32 << 10;
  const StateDigest base_digest = StateDigest::full_scan(v.base.view());
  const uint32_t ranks = 3;
  const GroupVersion g = encode_group(v, ranks, options);
  for (uint32_t missing = 0; missing < ranks; ++missing) {
    OwnedWeights receiver = v.base;
    DeltaApplier applier(v.m, receiver.mut(), 4, base_digest);
    applier.apply(g.seal);
    for (size_t i = 0; i < g.frames.size(); ++i)
      if (g.rank_of_frame[i] != missing) applier.apply(g.frames[i]);
    EXPECT_FALSE(applier.complete()) << "rank " << missing << "'s chunks are missing";
    EXPECT_EQ(testing::errc_of([&] { applier.verify(); }), Errc::state);
    EXPECT_FALSE(receiver == v.base) << "the other ranks' chunks wrote";
    applier.rollback();
    EXPECT_TRUE(receiver == v.base) << "rank " << missing << " missing: the rollback is not exact";
    EXPECT_EQ(applier.version(), 4u);
  }
}

TEST(ProducerGroup, APartEncoderDoesNotSealAndRefusesANumberingItDoesNotFit) {
  const Versions v(51);
  const Partition partition = Partition::balanced(v.m, 2);
  const GroupChunks numbering = group_chunks(v.m, partition, 64 << 10);
  const PartReader base(v.base, partition.part(1)), next(v.next, partition.part(1));
  EncodeOptions options;
  options.chunk_bytes = 64 << 10;
  DeltaEncoder encoder(base, next, numbering.part(partition, 1, 7), {4, 5}, options);
  EXPECT_EQ(testing::errc_of([&] { encoder.seal(); }), Errc::state);
  EXPECT_EQ(testing::errc_of([&] { encoder.part_digests(); }), Errc::state) << "no chunk was encoded yet";
  const auto frame = parse_frame(encoder.encode_chunk(0));
  EXPECT_EQ(frame.header.chunk_index, numbering.first[1]);
  EXPECT_EQ(frame.header.chunk_count, numbering.total());
  EXPECT_EQ(frame.header.base_digest, 7u);
  EncodePart too_far = numbering.part(partition, 1, 7);
  too_far.first_chunk = numbering.total() - 1;
  EXPECT_EQ(testing::errc_of([&] { DeltaEncoder(base, next, too_far, {4, 5}, options); }), Errc::invalid_argument);
  EXPECT_EQ(testing::errc_of([&] { numbering.part(partition, 2, 7); }), Errc::invalid_argument);
  // A given base digest is the part's, not scanned again: a (deliberately) different one is what the
  // part reports, and the new digest moves with it; one of the wrong length is refused.
  EncodePart given = numbering.part(partition, 1, 7);
  const auto scanned_base = part_digest(v.base, partition.part(1));
  given.base_digest = scanned_base;
  for (auto& d : given.base_digest) d += 1000;
  DeltaEncoder trusting(base, next, given, {4, 5}, options);
  DeltaEncoder scanning(base, next, numbering.part(partition, 1, 7), {4, 5}, options);
  for (uint32_t c = 0; c < trusting.chunk_count(); ++c) {
    EXPECT_TRUE(trusting.encode_chunk(c) == scanning.encode_chunk(c)) << "chunk " << c;
  }
  const auto t = trusting.part_digests(), s = scanning.part_digests();
  EXPECT_EQ(t.base.per_tensor(), given.base_digest);
  EXPECT_EQ(s.base.per_tensor(), scanned_base);
  for (size_t i = 0; i < v.m.size(); ++i) EXPECT_EQ(t.next.per_tensor()[i], s.next.per_tensor()[i] + 1000);
  EncodePart short_digest = numbering.part(partition, 1, 7);
  short_digest.base_digest = {1, 2};
  EXPECT_EQ(testing::errc_of([&] { DeltaEncoder(base, next, short_digest, {4, 5}, options); }), Errc::invalid_argument);
}

}  // namespace
}  // namespace deltacast::codec
