// BaselineStore, what the producer keeps of the committed version: adopts from spans and from a
// reader, the digest it keeps, and snapshots that read the version they opened at, bit for bit,
// while adopts (from this thread or another) overwrite the bits under them, and after a read that
// failed midway lost the baseline.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "codec/digest.h"
#include "codec/encoder.h"
#include "codec/partition.h"
#include "tests/common/memory_reader.h"
#include "tree/producer/baseline_store.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

using codec::DType;
using Version = std::vector<std::vector<std::byte>>;

const codec::Manifest& manifest() {
  static const codec::Manifest m({{"w", DType::bf16, {3 * codec::kReadPieceBytes / 4 + 7}},
                                  {"b", DType::f32, {1001}},
                                  {"e", DType::f32, {0}},
                                  {"i", DType::i64, {codec::kReadPieceBytes / 16 + 5}}});
  return m;
}

codec::ConstWeights weights(const Version& v) {
  codec::ConstWeights w{&manifest(), {}};
  for (const auto& t : v) w.tensors.emplace_back(t.data(), t.size());
  return w;
}

// A version `rate` of whose bytes differ from `base` (all of them for a fresh random one).
Version next_version(const Version& base, std::mt19937_64& rng, unsigned rate) {
  Version v = base;
  for (auto& t : v)
    for (auto& b : t)
      if (rng() % rate == 0) b = static_cast<std::byte>(rng());
  return v;
}

Version zeros() {
  Version v;
  for (const auto& t : manifest().tensors()) v.emplace_back(t.nbytes());
  return v;
}

bool holds(const BaselineStore& store, const Version& v) {
  const auto w = store.weights();
  for (size_t t = 0; t < v.size(); ++t)
    if (w.tensors[t].size() != v[t].size() ||
        (!v[t].empty() && std::memcmp(w.tensors[t].data(), v[t].data(), v[t].size()) != 0))
      return false;
  return true;
}

// Reads the whole snapshot in pieces of `piece` bytes (whole elements), calling `between` after each.
Version read_all(BaselineStore::Snapshot& s, uint64_t piece, const std::function<void()>& between = {}) {
  Version out = zeros();
  for (uint32_t t = 0; t < manifest().size(); ++t) {
    const uint64_t width = codec::dtype_unit_size(manifest().at(t).dtype);
    const uint64_t step = std::max<uint64_t>(width, piece / width * width);
    for (uint64_t at = 0; at < out[t].size(); at += step) {
      s.read(t, at, std::span(out[t]).subspan(at, std::min(step, out[t].size() - at)));
      if (between) between();
    }
  }
  return out;
}

uint64_t scan(const Version& v) { return codec::StateDigest::full_scan(weights(v)).combined(); }

TEST(BaselineStore, StartsAtVersionZeroAllZerosWithNothingToSnapshot) {
  BaselineStore store(manifest(), 2);
  EXPECT_EQ(store.version(), 0u);
  EXPECT_TRUE(holds(store, zeros()));
  EXPECT_EQ(store.digest().combined(), scan(zeros()));
  EXPECT_TRUE(store.lost().empty());
  try {
    store.open_snapshot();
    FAIL() << "version 0 has no snapshot";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::state);
    EXPECT_NE(std::string(e.what()).find("committed no version"), std::string::npos) << e.what();
  }
}

TEST(BaselineStore, AdoptsFromSpansAndFromAReaderWithTheGivenOrAScannedDigest) {
  std::mt19937_64 rng(11);
  BaselineStore store(manifest(), 2);
  const Version v1 = next_version(zeros(), rng, 1);  // all changed
  store.adopt(weights(v1), 1, std::nullopt);
  EXPECT_EQ(store.version(), 1u);
  EXPECT_TRUE(holds(store, v1));
  EXPECT_EQ(store.digest().combined(), scan(v1));
  const Version v2 = next_version(v1, rng, 100);
  const codec::testing::MemoryReader reader(weights(v2));
  store.adopt(reader, 2, codec::StateDigest::full_scan(weights(v2)));
  EXPECT_EQ(store.version(), 2u);
  EXPECT_TRUE(holds(store, v2));
  EXPECT_EQ(store.digest().combined(), scan(v2));
  store.adopt(weights(v2), 3, std::nullopt);  // none changed
  EXPECT_EQ(store.version(), 3u);
  EXPECT_TRUE(holds(store, v2));
}

TEST(BaselineStore, ASnapshotReadsItsVersionAcrossAdoptsFromSpansAndReaders) {
  std::mt19937_64 rng(12);
  BaselineStore store(manifest(), 1);
  Version current = next_version(zeros(), rng, 1);
  store.adopt(weights(current), 1, std::nullopt);
  const Version v1 = current;
  auto first = store.open_snapshot();
  EXPECT_EQ(first->version(), 1u);
  EXPECT_EQ(first->digest(), scan(v1));
  uint64_t version = 1;
  std::unique_ptr<BaselineStore::Snapshot> second;
  Version v3;
  int reads = 0;
  const Version got = read_all(*first, 4096, [&] {
    if (++reads % 7 != 0 || version >= 12) return;
    current = next_version(current, rng, 20);
    ++version;
    if (version % 2 == 0) {
      store.adopt(weights(current), version, std::nullopt);
    } else {
      const codec::testing::MemoryReader reader(weights(current));
      store.adopt(reader, version, codec::StateDigest::full_scan(weights(current)));
    }
    if (version == 3) {
      second = store.open_snapshot();
      v3 = current;
    }
  });
  ASSERT_GE(version, 12u) << "the adopts did not all happen while the first snapshot was read";
  EXPECT_TRUE(got == v1);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->version(), 3u);
  EXPECT_TRUE(read_all(*second, 1 << 20) == v3);
  first.reset();
  second.reset();
  auto last = store.open_snapshot();
  EXPECT_EQ(last->version(), 12u);
  EXPECT_TRUE(read_all(*last, 999) == current);
}

TEST(BaselineStore, AFailedReadLosesTheBaselineButOpenSnapshotsKeepTheirVersion) {
  for (uint64_t fail_at : {1, 2, 3}) {
    std::mt19937_64 rng(13 + fail_at);
    BaselineStore store(manifest(), 1);
    const Version v1 = next_version(zeros(), rng, 1);
    store.adopt(weights(v1), 1, std::nullopt);
    auto snapshot = store.open_snapshot();
    const Version v2 = next_version(v1, rng, 3);
    codec::testing::MemoryReader failing(weights(v2));
    failing.fail_at = fail_at;
    try {
      store.adopt(failing, 2, codec::StateDigest::full_scan(weights(v2)));
      FAIL() << "read " << fail_at << " failed, adopt did not";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::io);
      EXPECT_NE(std::string(e.what()).find("reading version 2"), std::string::npos) << e.what();
    }
    EXPECT_NE(store.lost().find("test.safetensors"), std::string::npos) << store.lost();
    EXPECT_EQ(store.version(), 1u) << "the version stays the last one adopted";
    EXPECT_TRUE(read_all(*snapshot, 3000) == v1) << "read " << fail_at;
    try {
      store.open_snapshot();
      FAIL() << "a lost baseline has no snapshot";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::state);
      EXPECT_NE(std::string(e.what()).find("holds no committed version"), std::string::npos) << e.what();
    }
  }
}

// Snapshots are read on serving threads while the driving thread adopts: every reader still gets
// its version's bits exactly.
TEST(BaselineStore, ReadersOnOtherThreadsGetTheirVersionWhileAdoptsGoOn) {
  std::mt19937_64 rng(14);
  BaselineStore store(manifest(), 1);
  Version current = next_version(zeros(), rng, 1);
  store.adopt(weights(current), 1, std::nullopt);
  std::vector<Version> expected;
  std::vector<std::unique_ptr<BaselineStore::Snapshot>> snapshots;
  for (uint64_t v = 2; v <= 4; ++v) {
    snapshots.push_back(store.open_snapshot());
    expected.push_back(current);
    current = next_version(current, rng, 10);
    store.adopt(weights(current), v, std::nullopt);
  }
  std::vector<Version> got(snapshots.size());
  std::vector<std::thread> readers;
  for (size_t i = 0; i < snapshots.size(); ++i)
    readers.emplace_back(
        [&, i] { got[i] = read_all(*snapshots[i], 512 + 256 * i, [] { std::this_thread::yield(); }); });
  for (uint64_t v = 5; v <= 40; ++v) {
    current = next_version(current, rng, 50);
    store.adopt(weights(current), v, std::nullopt);
  }
  for (auto& t : readers) t.join();
  for (size_t i = 0; i < snapshots.size(); ++i) EXPECT_TRUE(got[i] == expected[i]) << "snapshot " << i;
  EXPECT_TRUE(holds(store, current));
}

// A producer group's rank keeps only its part: the bytes of its ranges, the digest sums over them.
// Reads (by an encoder, a snapshot or an adopt) stay inside the part.
struct CheckedReader final : codec::WeightsReader {
  const codec::testing::MemoryReader& inner;
  std::vector<codec::PartRange> part;
  mutable uint64_t outside = 0;
  CheckedReader(const codec::testing::MemoryReader& r, std::vector<codec::PartRange> p)
      : inner(r), part(std::move(p)) {}
  const codec::Manifest& manifest() const noexcept override { return inner.manifest(); }
  void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const override {
    const uint64_t w = codec::dtype_unit_size(manifest().at(tensor).dtype);
    const bool inside = std::any_of(part.begin(), part.end(), [&](const codec::PartRange& r) {
      return r.tensor == tensor && r.begin * w <= offset && offset + out.size() <= r.end * w;
    });
    if (!inside) ++outside;
    inner.read(tensor, offset, out);
  }
};

uint64_t part_sum(const Version& v, const std::vector<codec::PartRange>& part, uint32_t tensor) {
  uint64_t sum = 0;
  for (const auto& r : part) {
    if (r.tensor != tensor) continue;
    const uint64_t w = codec::dtype_unit_size(manifest().at(tensor).dtype);
    sum += codec::slice_digest(tensor, manifest().at(tensor).dtype, r.begin,
                               std::span(v[tensor]).subspan(r.begin * w, r.units() * w));
  }
  return sum;
}

codec::StateDigest part_digest(const Version& v, const std::vector<codec::PartRange>& part) {
  std::vector<uint64_t> sums;
  for (uint32_t t = 0; t < manifest().size(); ++t) sums.push_back(part_sum(v, part, t));
  return codec::StateDigest(std::move(sums));
}

TEST(BaselineStore, ARanksPartHoldsOnlyItsRangesAndTheirDigestSums) {
  std::mt19937_64 rng(15);
  const uint32_t ranks = 3;
  const auto partition = codec::Partition::balanced(manifest(), ranks);
  const Version v1 = next_version(zeros(), rng, 1);
  const codec::testing::MemoryReader full(weights(v1));
  std::vector<uint64_t> zero_sum(manifest().size(), 0), v1_sum(manifest().size(), 0);
  for (uint32_t r = 0; r < ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& part = partition.part(r);
    BaselineStore store(manifest(), part, 1);
    EXPECT_FALSE(store.whole());
    EXPECT_EQ(store.bytes(), partition.part_bytes(r)) << "a rank keeps exactly its part";
    EXPECT_EQ(store.digest(), part_digest(zeros(), part));
    for (uint32_t t = 0; t < manifest().size(); ++t) zero_sum[t] += store.digest().per_tensor()[t];
    EXPECT_THROW(store.weights(), Error);
    EXPECT_THROW(store.adopt(weights(v1), 1, std::nullopt), Error);
    const CheckedReader checked(full, part);
    store.adopt(checked, 1, part_digest(v1, part));
    EXPECT_EQ(checked.outside, 0u) << "the adopt read outside the part";
    EXPECT_EQ(store.version(), 1u);
    for (uint32_t t = 0; t < manifest().size(); ++t) {
      v1_sum[t] += store.digest().per_tensor()[t];
    }
    // The store's reader gives the part's bits and refuses the rest.
    for (const auto& range : part) {
      const uint64_t w = codec::dtype_unit_size(manifest().at(range.tensor).dtype);
      std::vector<std::byte> got(range.units() * w);
      store.reader().read(range.tensor, range.begin * w, got);
      EXPECT_EQ(0, std::memcmp(got.data(), v1[range.tensor].data() + range.begin * w, got.size()));
      auto snapshot = store.open_snapshot();
      std::vector<std::byte> snap(got.size());
      snapshot->read(range.tensor, range.begin * w, snap);
      EXPECT_TRUE(snap == got);
    }
    std::vector<std::byte> one(8);
    for (uint32_t t = 0; t < manifest().size(); ++t) {
      if (manifest().at(t).units() == 0) continue;
      const bool mine = std::any_of(part.begin(), part.end(),
                                    [&](const codec::PartRange& x) { return x.tensor == t && x.begin == 0; });
      if (mine) continue;
      const uint64_t w = codec::dtype_unit_size(manifest().at(t).dtype);
      try {
        store.reader().read(t, 0, std::span(one).first(w));
        ADD_FAILURE() << "tensor " << t << " is not this rank's";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
      }
    }
  }
  // The parts' digests add up to the whole version's.
  EXPECT_EQ(codec::StateDigest(zero_sum), codec::StateDigest::full_scan(weights(zeros())));
  EXPECT_EQ(codec::StateDigest(v1_sum), codec::StateDigest::full_scan(weights(v1)));
  EXPECT_THROW(BaselineStore(manifest(), std::vector<codec::PartRange>{{0, 0, 10}, {0, 5, 20}}, 1), Error);
  EXPECT_THROW(BaselineStore(manifest(), std::vector<codec::PartRange>{{9, 0, 1}}, 1), Error);
}

}  // namespace
}  // namespace deltacast::tree
