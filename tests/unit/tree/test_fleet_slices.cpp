// FleetSlices (tree/producer/fleet_slices.h): the placed members' slices as the producer checks
// them at HELLO, the cuts the encoder gets, and the slice table kept from version to version,
// compared with scans of the slices.
#include "tree/producer/fleet_slices.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "codec/encoder.h"
#include "codec/partition.h"
#include "codec/placement.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

codec::Manifest manifest() {
  return codec::Manifest({{"embed", codec::DType::bf16, {64, 16}},
                          {"w", codec::DType::bf16, {32, 32}},
                          {"norm", codec::DType::f32, {16}}});
}

struct Version {
  std::vector<std::vector<std::byte>> tensors;
  explicit Version(const codec::Manifest& m, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (const auto& t : m.tensors()) {
      std::vector<std::byte> b(t.nbytes());
      for (auto& x : b) x = static_cast<std::byte>(rng());
      tensors.push_back(std::move(b));
    }
  }
  codec::ConstWeights weights(const codec::Manifest& m) const {
    codec::ConstWeights w{&m, {}};
    for (const auto& t : tensors) w.tensors.emplace_back(t.data(), t.size());
    return w;
  }
};

std::string refusal(FleetSlices& f, const std::vector<HeldSlice>& slices) {
  try {
    f.state(1, slices);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    return e.what();
  }
  return "";
}

TEST(FleetSlices, RefusesWhatTheManifestDoesNotHaveNamingTheSlice) {
  const auto m = manifest();
  FleetSlices f(m);
  EXPECT_NE(refusal(f, {{"nope", 0, 0, 1}}).find("nope"), std::string::npos);
  EXPECT_NE(refusal(f, {{"w", 2, 0, 1}}).find("slice 0 (w dim 2 0:1)"), std::string::npos);
  EXPECT_NE(refusal(f, {{"w", 0, 0, 33}}).find("0:33"), std::string::npos);
  EXPECT_NE(refusal(f, {{"w", 1, 5, 5}}).find("empty"), std::string::npos);
  EXPECT_NE(refusal(f, {{"w", 0, 0, 16}, {"w", 0, 0, 16}}).find("slice 1"), std::string::npos);
  EXPECT_FALSE(f.placed(1));  // nothing recorded by a refusal
  EXPECT_TRUE(f.empty());
  f.state(1, {{"w", 1, 0, 16}});
  EXPECT_TRUE(f.placed(1));
  EXPECT_EQ(refusal(f, {{"w", 0, 0, 99}}).empty(), false);
  EXPECT_TRUE(f.placed(1));  // the earlier record stands
  f.state(1, {});            // restarted whole
  EXPECT_FALSE(f.placed(1));
}

TEST(FleetSlices, PrepareGivesTheCutsAndTheTableOfTheCommittedVersion) {
  const auto m = manifest();
  FleetSlices f(m);
  codec::EncodeOptions none;
  const Version v0(m, 1);
  f.prepare(none, 0, v0.weights(m));
  EXPECT_EQ(none.held_slices, nullptr);  // no placed member: nothing
  EXPECT_TRUE(none.base_slice_digests.empty());

  f.state(1, {{"w", 1, 0, 16}, {"embed", 0, 0, 32}});
  f.state(2, {{"w", 1, 16, 32}, {"embed", 0, 32, 64}});
  f.state(3, {{"w", 1, 0, 16}, {"embed", 0, 0, 32}});  // rank 1's set again
  codec::EncodeOptions o;
  f.prepare(o, 0, v0.weights(m));
  ASSERT_NE(o.held_slices, nullptr);
  EXPECT_TRUE(o.held_slices->splits(1, 0, uint64_t{32} * 32));
  EXPECT_FALSE(o.held_slices->splits(2, 0, 16));  // norm: whole everywhere
  ASSERT_EQ(o.base_slice_digests.size(), 4u);
  const auto scanned = codec::slice_digests(v0.weights(m), o.base_slice_digests);
  EXPECT_EQ(o.base_slice_digests, scanned);

  // A version encoded with them: its seal's table is the next base, without a scan.
  Version v1 = v0;
  v1.tensors[1][10] ^= std::byte{1};
  v1.tensors[0][700] ^= std::byte{4};
  codec::DeltaEncoder encoder(v0.weights(m), v1.weights(m), codec::StateDigest::full_scan(v0.weights(m)), {0, 1}, o);
  for (uint32_t c = 0; c < encoder.chunk_count(); ++c) encoder.encode_chunk(c);
  encoder.seal();
  f.committed(1, encoder.new_slice_digests());
  codec::EncodeOptions next;
  // A base whose bits differ from version 1 everywhere: a table entry taken from it would show.
  const Version junk(m, 99);
  f.prepare(next, 1, junk.weights(m));
  EXPECT_EQ(next.base_slice_digests, codec::slice_digests(v1.weights(m), next.base_slice_digests));

  // A slice stated later is scanned once from the base given; the others keep the table's.
  f.state(4, {{"norm", 0, 0, 8}});
  codec::EncodeOptions later;
  f.prepare(later, 1, v1.weights(m));
  ASSERT_EQ(later.base_slice_digests.size(), 5u);
  EXPECT_EQ(later.base_slice_digests, codec::slice_digests(v1.weights(m), later.base_slice_digests));
  // A table of another version is not used: rescanned.
  codec::EncodeOptions stale;
  f.prepare(stale, 7, junk.weights(m));
  EXPECT_EQ(stale.base_slice_digests, codec::slice_digests(junk.weights(m), stale.base_slice_digests));
}

}  // namespace
}  // namespace deltacast::tree

namespace deltacast::tree {
namespace {

// A producer group's ranks each scan their part of a slice (codec::part_slice_digest): the parts
// add up to the slice's digest, for every partition size.
TEST(FleetSlices, PartsOfASliceScanAddUpToItsDigest) {
  const auto m = manifest();
  const Version v(m, 5);
  const codec::SpanReader reader(v.weights(m));
  for (const codec::SliceDigest s : {codec::SliceDigest{0, 0, 3, 50, 0}, codec::SliceDigest{1, 1, 5, 27, 0},
                                     codec::SliceDigest{2, 0, 0, 16, 0}, codec::SliceDigest{1, 0, 31, 32, 0}}) {
    const uint64_t whole = codec::canonical_slice_digest(m, s, v.weights(m).tensors[s.tensor]);
    for (uint32_t ranks = 1; ranks <= 4; ++ranks) {
      const auto partition = codec::Partition::balanced(m, ranks);
      uint64_t sum = 0;
      for (uint32_t r = 0; r < ranks; ++r) sum += codec::part_slice_digest(reader, s, partition.part(r));
      EXPECT_EQ(sum, whole) << "tensor " << s.tensor << " dim " << s.dim << ", " << ranks << " ranks";
    }
  }
}

}  // namespace
}  // namespace deltacast::tree
